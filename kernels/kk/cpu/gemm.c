/* kernels/kk/cpu/gemm.c — the cpu backend's GEMM: OpenBLAS sgemm split over
 * kk's threads, and a GEMV for the few-row products of decoding.
 *
 * A linear layer's x W^T with bf16/f16 W reads W in place through
 * half.c's kk__half_gemm; other bf16/f16 products are widened to f32
 * scratch and multiplied with sgemm.  Accumulation is f32 as the API
 * promises; bias and the GELU/SiLU
 * epilogues run on the f32 result before one rounding on store.  The
 * threads are kk's pool, each calling a one-thread sgemm on its share of
 * the columns (or rows): OpenBLAS's own threads would compete with the
 * pool for the same cores (cpu.c holds OpenBLAS to one thread). */
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kiln/macro.h"

static size_t gspan(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld)
{
	return (size_t) ((batch - 1) * stride + (rows - 1) * ld + cols);
}

/* A product with m at or below this many rows and B transposed (y = x W^T,
 * a linear layer's decode step) runs the GEMV below: each thread reads its
 * share of W's rows once, straight from storage, against every x row.  At
 * m = 1 it reads W at memory speed where sgemm's packing costs more than
 * the product (110M-shape decode: 21.7 -> 54.2 tok/s per CPU second); at
 * m = 8 it matches sgemm (batch-8 decode 155 vs 154).  And it is
 * deterministic: y[i, j] is one dot product, whatever the thread count. */
#define KK_CPU_GEMV_MAX_M 8
/* f32 weights keep the GEMV up to this many rows: with its weight
 * prefetch (simd.c) the tile beat one-thread sgemm per CPU second on every
 * 110M layer shape at m = 12, 16, 24 and 32 (32000 x 768: 79 vs 55
 * GFLOP/s at m = 16; 768 x 2048: 86 vs 80), where sgemm packs W for a
 * handful of rows.  16 keeps the x rows of a 768-wide tile pass in L1. */
#define KK_CPU_GEMV_MAX_M_F32 16

/* An f32 product split by columns gives each chunk whole blocks of this
 * many columns: OpenBLAS's sgemm kernel runs 16 columns of row-major C
 * at a time (its M unroll here) and the edge kernel left by a chunk of,
 * say, 36 columns (the 15M shape's 288 over 8 chunks) runs slower. */
#ifndef GEMM_COL_BLOCK
#define GEMM_COL_BLOCK 16
#endif

/* A linear layer's product (x W^T) with bf16/f16 W runs kk__half_gemm
 * (half.c) at every m: W's rows converted in registers, read from memory
 * once per call; m = 1 one W row at a time, m >= 2 in tiles of 4 x rows
 * by 4 W rows.  It won at every m over what it replaced: the GEMV's dots
 * one x row at a time (m < 4) and rows widened into L1 (m 4..8): f16
 * 2048 x 768, one thread, CPU time, m = 2 89 -> 45 us, 3 97 -> 50, 8 244
 * -> 119; panels widened for sgemm (m > 8): 110M f16 prefill 420-460 ->
 * 810-840 tok/s (docs/kernels.md, "f16/bf16 products in registers"). */

/* An f32 x W^T with more rows than the GEMV takes (prefill, training's
 * forward) runs half.c's register tiles on f32 W (kk__half_gemm_f32)
 * where they beat one-thread sgemm per CPU second, so that prefill does
 * not depend on which kernel OpenBLAS picks (OPENBLAS_CORETYPE).
 * Measured on the 15M/110M layer shapes (768x768, 2048x768, 768x2048,
 * 32000x768 and the 288-wide ones), m = 17..128, bench-kernels-cpu
 * --f32mm --cpu-time (docs/kernels.md, "f32 products in register tiles"):
 * - AVX-512 tiles (~200 GFLOP/s on k = 768) against OpenBLAS's AVX2
 *   kernels (Haswell, Zen: 64-118): 1.3-2.6x at every shape and m;
 * - against its AVX-512 kernels (SkylakeX, Cooperlake, SapphireRapids:
 *   90-210, rising with m): 1.24-2.1x at m = 17, 24 and 32; at m = 64 and
 *   96 1.03-1.28 for k = 768 and 2048 (k blocks of 1024 in half.c),
 *   0.87-1.03 for k = 288; at m = 128 par for k = 768 and 2048
 *   (0.96-1.00), 0.88-0.90 for k = 288 -- sgemm keeps those;
 * - AVX2 tiles (4 x 2, ~90 GFLOP/s) against OpenBLAS Haswell: 1.2-1.7x
 *   at m = 17, 0.92-1.34 at 24 (k = 768 wins, 288 and 2048 lose),
 *   0.87-1.21 at 32, 0.72-0.99 beyond: tiles up to 20 rows;
 * - the portable 1 x 1 tiles never win. */
/* The most rows the tiles take (inclusive; between the m measured). */
#define KK_CPU_F32MM_MAX_M_AVX2	     20
#define KK_CPU_F32MM_MAX_M_AVX512    32
#define KK_CPU_F32MM_MAX_M_AVX512_KM 96 /* 512 <= k <= 2048 */

/* 1 when OpenBLAS runs an AVX-512 sgemm kernel, 0 when not (or another
 * BLAS: openblas_get_corename is looked up, as cpu.c's shutdown hook). */
static int blas_avx512(void)
{
	static _Atomic int known = -1;
	int v = atomic_load_explicit(&known, memory_order_relaxed);
	if (v >= 0)
		return v;
	char *(*corename)(void) = (char *(*) (void) ) dlsym(RTLD_DEFAULT, "openblas_get_corename");
	const char *c = corename ? corename() : NULL;
	v = c && (strcasestr(c, "skylakex") || strcasestr(c, "cooperlake") ||
		  strcasestr(c, "sapphirerapids"));
	atomic_store_explicit(&known, v, memory_order_relaxed);
	return v;
}

static bool f32mm_wins(int64_t m, int64_t n, int64_t k)
{
	const char *v = kk__half_variant();
	(void) n;
	if (strncmp(v, "avx512", 6) == 0)
		return !blas_avx512() || m <= KK_CPU_F32MM_MAX_M_AVX512 ||
		       (m <= KK_CPU_F32MM_MAX_M_AVX512_KM && k >= 512 && k <= 2048);
	if (strcmp(v, "f16c") == 0)
		return m <= KK_CPU_F32MM_MAX_M_AVX2;
	return false;
}

static _Atomic int f32_route;

/* The other f32 products (training's backward: dX = dY W, B not
 * transposed; dW = dY^T X, A transposed) can run the same tiles on copies
 * of the operands transposed into x W^T's layout: m x k and n x k floats
 * copied for 2 m n k flops.  Only against OpenBLAS's AVX2 kernels and
 * m and n at least KK_CPU_F32MM_T_MIN (the copies are then under 1/64 of
 * the flops) and k at least KK_CPU_F32MM_T_MIN_K: bench-train's backward
 * shapes, one thread, CPU time, against OpenBLAS Haswell: 1.06-1.59x at
 * k >= 128 alone (bench-kernels-cpu --f32mm-train), 0.72x at k = 64 (the
 * tile's horizontal sums then cost more than 4 vectors of FMAs); inside
 * the training step (KMT_PROFILE) the k = 128 ones came out even or
 * slower, k >= 352 (w1/w3 backward) 65.8 -> 57 ms per 20 steps: 256. */
#define KK_CPU_F32MM_T_MIN   64
#define KK_CPU_F32MM_T_MIN_K 256

static bool f32mm_t_wins(int64_t m, int64_t n, int64_t k)
{
	return strncmp(kk__half_variant(), "avx512", 6) == 0 && !blas_avx512() &&
	       m >= KK_CPU_F32MM_T_MIN && n >= KK_CPU_F32MM_T_MIN && k >= KK_CPU_F32MM_T_MIN_K;
}

/* dst[c * rows + r] = src[r * ld + c]: a rows x cols matrix transposed,
 * in 32 x 32 blocks (both sides' lines reused from L1). */
static void transpose(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
	for (int64_t r0 = 0; r0 < rows; r0 += 32)
		for (int64_t c0 = 0; c0 < cols; c0 += 32)
			for (int64_t c = c0; c < MIN(c0 + 32, cols); c++)
				for (int64_t r = r0; r < MIN(r0 + 32, rows); r++)
					dst[c * rows + r] = src[r * ld + c];
}

int kk__gemm_f32_route(int route)
{
	return atomic_exchange(&f32_route, route);
}

/* sgemm flops per unit of kk__parallel_for's cost (~0.5 ns each). */
#define GEMM_FLOPS_PER_COST 32.0

/* A bf16/f16 B of a multi-row product (prefill) is widened a panel of
 * columns at a time, each chunk into its own f32 panel of about this many
 * bytes, then multiplied by sgemm: the widened matrix never exists whole
 * (the 110M classifier would be 98 MB, allocated and faulted in on every
 * call).  About one L2 (1 MiB on the build machine's EPYC): sgemm packs A
 * again on every call, so fewer, wider panels won over 256 KiB ones (110M
 * bf16 prefill 507-512 -> 530-560 tok/s per CPU second). */
#define GEMM_PANEL_BYTES (1024 << 10)

struct gemm_ctx {
	const kk_gemm_desc *d;
	const float *a, *b; /* f32 operands (widened when needed), this batch entry */
	float *c;	    /* f32 result of this batch entry */
	int64_t ldc;
	const float *bias;
	bool split_n; /* chunks of columns (else of rows) */
	/* f32 tiles on transposed operands (tmm): x rows and W rows as
	 * kk__half_gemm_f32 reads them, k apart (NULL: A, B as given). */
	const float *xt, *wt;
	int64_t col_block; /* f32 B split by columns: chunks of whole blocks */
	int64_t batch_i;
	/* bf16/f16 B split by columns: one f32 panel of panel_n columns of
	 * op(B) per chunk (b is NULL then). */
	float *panels;
	int64_t panel_n;
};

/* Bias and activation on rows [r0, r1) x columns [c0, c1) of the result. */
static void epilogue(const struct gemm_ctx *g, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
	kk_epilogue epi = g->d->epilogue;
	if (!g->bias && epi == KK_EPI_NONE)
		return;
	for (int64_t row = r0; row < r1; row++) {
		float *cr = g->c + row * g->ldc;
		for (int64_t j = c0; j < c1; j++) {
			float v = cr[j] + (g->bias ? g->bias[j] : 0.0f);
			if (epi == KK_EPI_GELU)
				v = kk__gelu(v);
			else if (epi == KK_EPI_SILU)
				v = kk__silu(v);
			cr[j] = v;
		}
	}
}

/* Columns [c0, c1) of op(B) (bf16/f16) widened into panel, row-major
 * with leading dimension *ld. */
static const float *widen_panel(const struct gemm_ctx *g, float *panel, int64_t c0, int64_t c1,
				int64_t *ld)
{
	const kk_gemm_desc *d = g->d;
	size_t base = (size_t) (g->batch_i * d->stride_b);
	if (d->trans_b) { /* B [n, k]: whole rows c0..c1 */
		for (int64_t j = c0; j < c1; j++)
			kk__row_f32(panel + (j - c0) * d->k, d->b->ptr, d->b->dtype,
				    base + (size_t) (j * d->ldb), d->k);
		*ld = d->k;
	} else { /* B [k, n]: a slice of every row */
		for (int64_t r = 0; r < d->k; r++)
			kk__row_f32(panel + r * (c1 - c0), d->b->ptr, d->b->dtype,
				    base + (size_t) (r * d->ldb + c0), (size_t) (c1 - c0));
		*ld = c1 - c0;
	}
	return panel;
}

static void sgemm_call(const kk_gemm_desc *d, int64_t rows, int64_t cols, const float *a,
		       const float *bm, int64_t ldb, float *c, int64_t ldc)
{
	cblas_sgemm(CblasRowMajor, d->trans_a ? CblasTrans : CblasNoTrans,
		    d->trans_b ? CblasTrans : CblasNoTrans, (int) rows, (int) cols, (int) d->k,
		    d->alpha, a, (int) d->lda, bm, (int) ldb, d->beta, c, (int) ldc);
}

/* One chunk of columns or rows through OpenBLAS (held to one thread: the
 * chunks are the parallelism), then its epilogue. */
static int sgemm_range(void *p, int64_t b, int64_t e, int chunk)
{
	const struct gemm_ctx *g = p;
	const kk_gemm_desc *d = g->d;
	int64_t m = d->m, n = d->n, r0 = 0, r1 = m, c0 = 0, c1 = n;
	const float *a = g->a, *bm = g->b;
	float *c = g->c;

	if (g->col_block > 1) { /* ranges of blocks: columns, the last cut at n */
		b = MIN(b * g->col_block, n);
		e = MIN(e * g->col_block, n);
	}
	if (g->split_n) {
		c0 = b, c1 = e;
		if (bm)
			bm += d->trans_b ? b * d->ldb : b;
		c += b;
	} else {
		r0 = b, r1 = e;
		a += d->trans_a ? b : b * d->lda;
		c += b * g->ldc;
	}
	if (d->beta == 0) /* C may hold NaN: never let it leak through 0 * NaN */
		for (int64_t row = 0; row < r1 - r0; row++)
			memset(c + row * g->ldc, 0, (c1 - c0) * sizeof(float));
	if (g->panels) {
		float *panel = g->panels + (size_t) chunk * g->panel_n * d->k;
		for (int64_t j = c0; j < c1; j += g->panel_n) {
			int64_t je = MIN(c1, j + g->panel_n), ldp;
			const float *pb = widen_panel(g, panel, j, je, &ldp);
			sgemm_call(d, m, je - j, a, pb, ldp, c + (j - c0), g->ldc);
		}
	} else {
		sgemm_call(d, r1 - r0, c1 - c0, a, bm, d->ldb, c, g->ldc);
	}
	epilogue(g, r0, r1, c0, c1);
	return 0;
}

/* Stores alpha * s (+ beta * C) for x rows [i, i + nx) of column j. */
static void gemv_store(const struct gemm_ctx *g, int64_t i, int nx, int64_t j, const float *s,
		       int stride)
{
	const kk_gemm_desc *d = g->d;
	for (int r = 0; r < nx; r++) {
		float *ci = g->c + (i + r) * g->ldc + j;
		float v = d->alpha * s[r * stride];
		*ci = d->beta != 0 ? v + d->beta * *ci : v;
	}
}

/* x W^T with W in place (bf16/f16, or f32 past the GEMV's rows): W rows
 * [b, e) against every x row. */
static int half_range(void *p, int64_t b, int64_t e, int chunk)
{
	const struct gemm_ctx *g = p;
	const kk_gemm_desc *d = g->d;
	bool f32 = d->b->dtype == KK_F32;
	kk__half_mm mm = {
		.x = g->xt ? g->xt : g->a,
		.ldx = (size_t) (g->xt ? d->k : d->lda),
		.xh = d->a->dtype == KK_BF16
			      ? (const uint16_t *) d->a->ptr + (size_t) (g->batch_i * d->stride_a)
			      : NULL,
		.m = d->m,
		.w = f32 ? NULL
			 : (const uint16_t *) d->b->ptr + (size_t) (g->batch_i * d->stride_b),
		.wf = g->wt ? g->wt
		      : f32 ? (const float *) d->b->ptr + (size_t) (g->batch_i * d->stride_b)
			    : NULL,
		.ldw = (size_t) (g->wt ? d->k : d->ldb),
		.k = (size_t) d->k,
		.alpha = d->alpha,
		.beta = d->beta,
		.c = g->c,
		.ldc = (size_t) g->ldc,
	};
	(void) chunk;
	if (f32)
		kk__half_gemm_f32(&mm, b, e);
	else
		kk__half_gemm(d->b->dtype, &mm, b, e);
	epilogue(g, 0, d->m, b, e);
	return 0;
}

/* W row j (f32, in place). */
static const float *gemv_wrow(const struct gemm_ctx *g, int64_t j)
{
	const kk_gemm_desc *d = g->d;
	return (const float *) d->b->ptr + (size_t) (g->batch_i * d->stride_b + j * d->ldb);
}

/* GEMV (f32 W; bf16/f16 W go to half_range): output columns [b, e)
 * (rows of W) for every x row.  One x row meets W rows in kk__dot_pf
 * (prefetching);
 * otherwise W rows go in pairs (j even, j + 1) through the register tile,
 * four x rows at a time; a chunk edge splitting a pair runs its column
 * alone through the same tile, which sums it the same way. */
static int gemv_range(void *p, int64_t b, int64_t e, int chunk)
{
	const struct gemm_ctx *g = p;
	const kk_gemm_desc *d = g->d;

	if (d->m == 1) { /* one stream: kk__dot_pf's unrolled, prefetching sum */
		for (int64_t j = b; j < e; j++) {
			float s = kk__dot_pf(g->a, gemv_wrow(g, j), d->k);
			gemv_store(g, 0, 1, j, &s, 1);
		}
		/* once for the chunk: a call per column was 0.6 % of a decode */
		epilogue(g, 0, 1, b, e);
		return 0;
	}
	for (int64_t j = b; j < e;) {
		int nw = (j % 2 == 0 && j + 1 < e) ? 2 : 1;
		const float *w0 = gemv_wrow(g, j);
		const float *w1 = nw == 2 ? gemv_wrow(g, j + 1) : NULL;
		for (int64_t i = 0; i < d->m; i += 4) {
			float s[8];
			int nx = (int) MIN(d->m - i, (int64_t) 4);
			kk__gemv_tile(s, g->a + i * d->lda, d->lda, nx, w0, w1, d->k);
			gemv_store(g, i, nx, j, s, 2);
			if (w1)
				gemv_store(g, i, nx, j + 1, s + 1, 2);
		}
		epilogue(g, 0, d->m, j, j + nw);
		j += nw;
	}
	return 0;
}

int kk__cpu_gemm(kk_backend *be, kk_stream *st, const kk_gemm_desc *d)
{
	int64_t batch = d->batch ? d->batch : 1;
	bool xwt = d->trans_b && !d->trans_a;
	bool half_mm = xwt && (d->b->dtype == KK_F16 || d->b->dtype == KK_BF16);
	bool gemv = !half_mm && xwt &&
		    d->m <= (d->b->dtype == KK_F32 ? KK_CPU_GEMV_MAX_M_F32 : KK_CPU_GEMV_MAX_M);
	int route = atomic_load_explicit(&f32_route, memory_order_relaxed);
	if (xwt && !gemv && d->b->dtype == KK_F32 &&
	    (route > 0 || (route == 0 && f32mm_wins(d->m, d->n, d->k))))
		half_mm = true; /* f32 W in the same tiles */
	bool tmm = !xwt && d->a->dtype == KK_F32 && d->b->dtype == KK_F32 &&
		   (route > 0 || (route == 0 && f32mm_t_wins(d->m, d->n, d->k)));
	_cleanup_free_ float *xt = NULL, *wt = NULL;
	if (tmm) {
		half_mm = true;
		if ((d->trans_a && !(xt = malloc((size_t) d->m * d->k * sizeof(float)))) ||
		    (!d->trans_b && !(wt = malloc((size_t) d->n * d->k * sizeof(float)))))
			return -ENOMEM;
	}
	size_t na = gspan(batch, d->stride_a, d->trans_a ? d->k : d->m, d->trans_a ? d->m : d->k,
			  d->lda);
	size_t nb = gspan(batch, d->stride_b, d->trans_b ? d->n : d->k, d->trans_b ? d->k : d->n,
			  d->ldb);
	_cleanup_free_ float *a_own = NULL, *b_own = NULL, *c_tmp = NULL, *bias = NULL;
	bool direct = d->c->dtype == KK_F32;
	float *a, *b = NULL;
	int r;

	r = kk__widen(d->a, na, &a, &a_own);
	if (r < 0)
		return r;
	/* Split the longer side over the threads; a bf16/f16 B split by
	 * columns is widened a panel at a time, else all at once. */
	bool split_n = d->n >= d->m, panels = !gemv && !half_mm && split_n && d->b->dtype != KK_F32;
	double flops = 2.0 * d->m * d->n * d->k;
	int64_t panel_n = 0;
	if (panels) {
		int nchunks = kk__parallel_chunks(d->n, flops / d->n / GEMM_FLOPS_PER_COST);
		panel_n = MAX((int64_t) 16, GEMM_PANEL_BYTES / (int64_t) sizeof(float) / d->k);
		panel_n = MIN(panel_n, d->n);
		if (!(b_own = malloc((size_t) nchunks * panel_n * d->k * sizeof(float))))
			return -ENOMEM;
	} else if (!gemv && !half_mm && (r = kk__widen(d->b, nb, &b, &b_own)) < 0) {
		return r;
	}
	if (d->bias) {
		bias = malloc(d->n * sizeof(float));
		if (!bias)
			return -ENOMEM;
		kk__row_f32(bias, d->bias->ptr, d->bias->dtype, 0, d->n);
	}
	if (!direct) {
		c_tmp = malloc((size_t) d->m * d->n * sizeof(float));
		if (!c_tmp)
			return -ENOMEM;
	}

	for (int64_t i = 0; i < batch; i++) {
		struct gemm_ctx g = {
			.d = d, .a = a + i * d->stride_a, .bias = bias, .batch_i = i
		};

		if (direct) {
			g.c = (float *) d->c->ptr + i * d->stride_c;
			g.ldc = d->ldc;
		} else {
			g.c = c_tmp;
			g.ldc = d->n;
			if (d->beta != 0)
				for (int64_t row = 0; row < d->m; row++)
					kk__row_f32(c_tmp + row * d->n, d->c->ptr, d->c->dtype,
						    i * d->stride_c + row * d->ldc, d->n);
		}
		if (half_mm) {
			if (xt) /* A [k, m] */
				transpose(xt, g.a, d->k, d->m, d->lda);
			if (wt) /* B [k, n] */
				transpose(wt, (const float *) d->b->ptr + i * d->stride_b, d->k,
					  d->n, d->ldb);
			g.xt = xt, g.wt = wt;
			r = kk__parallel_for(d->n, flops / d->n / GEMM_FLOPS_PER_COST, half_range,
					     &g);
		} else if (gemv) {
			r = kk__parallel_for(d->n, (double) d->k * (1 + d->m) / 4, gemv_range, &g);
		} else {
			g.b = panels ? NULL : b + i * d->stride_b;
			g.panels = panels ? b_own : NULL;
			g.panel_n = panel_n;
			g.split_n = split_n;
			g.col_block = split_n && !panels ? GEMM_COL_BLOCK : 1;
			if (g.split_n)
				r = kk__parallel_for(DIV_ROUND_UP(d->n, g.col_block),
						     flops / d->n * g.col_block /
							     GEMM_FLOPS_PER_COST,
						     sgemm_range, &g);
			else
				r = kk__parallel_for(d->m, flops / d->m / GEMM_FLOPS_PER_COST,
						     sgemm_range, &g);
		}
		if (r < 0)
			return r;
		if (!direct)
			for (int64_t row = 0; row < d->m; row++)
				kk__row_store(d->c->ptr, d->c->dtype,
					      i * d->stride_c + row * d->ldc, c_tmp + row * d->n,
					      d->n);
	}
	return 0;
}
