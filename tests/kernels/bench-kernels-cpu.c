/* tests/kernels/bench-kernels-cpu.c — the cpu backend's benchmark table.
 *
 * Prints, for each op and shape, the time per call and GFLOP/s or GB/s,
 * against two ceilings measured in the same run on this machine: OpenBLAS's
 * own sgemm on a large square problem (compute) and a large memcpy (memory
 * bandwidth).  `make bench` runs it through bench-kernels-cpu.sh.
 * --quick shrinks the shapes; --cpu-time times with the process CPU clock
 * (rates per CPU-second: use it on a shared, busy machine); --quant runs
 * only the quantized product's rows (plain and packed); --f32mm compares
 * sgemm with half.c's f32 tiles on the models' f32 x W^T shapes
 * (--f32mm-train: on bench-train's forward shapes); --half
 * VARIANT forces one of half.c's variants (avx512, f16c, portable ...).
 * Exit 0, 1 when an op fails, 2 on a bad argument. */
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kk.h"
#include "../../kernels/bench/bench-clock.h"
#include "../../kernels/bench/kk-desc.h"

/* Seconds each measurement runs (after one warm-up call). */
#define BENCH_MIN_SEC	    0.25
#define BENCH_MIN_SEC_QUICK 0.01

static kk_backend *be;
static double min_sec = BENCH_MIN_SEC;
static double peak_gflops, copy_gbs;
static int failures;

/* CLOCK_MONOTONIC (wall time), or with --cpu-time the process CPU time:
 * rates per CPU-second, which a busy machine disturbs far less. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now(void)
{
	return kiln_clock_seconds(bench_clock);
}

typedef int (*bench_fn)(void *ctx);

/* Seconds per call: best of three rounds of at least min_sec/3 each. */
static double time_it(bench_fn fn, void *ctx)
{
	double best = 1e30;
	if (fn(ctx) < 0)
		return -1;
	for (int round = 0; round < 3; round++) {
		double t0 = now(), t;
		int n = 0;
		do {
			if (fn(ctx) < 0)
				return -1;
			n++;
			t = now() - t0;
		} while (t < min_sec / 3);
		best = MIN(best, t / n);
	}
	return best;
}

static kk_buffer *rand_buf(kk_dtype dt, size_t n, float lo, float hi)
{
	kk_buffer *b = NULL;
	float *f = malloc(n * sizeof(float));
	void *raw = malloc(kk_dtype_size(dt, n));
	if (!f || !raw || kk_buffer_alloc(be, dt, n, &b) < 0) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		f[i] = lo + (hi - lo) * (float) ((i * 2654435761u) % 1000003) / 1000003.0f;
	kk_convert_host(dt, raw, KK_F32, f, n);
	kk_buffer_upload(be, NULL, b, 0, raw, kk_dtype_size(dt, n));
	free(f);
	free(raw);
	return b;
}

/* Rows are kept and printed at the end, against the best ceilings seen
 * (measured before and after the ops, so a busy machine at the start does
 * not inflate the percentages). */
#define BENCH_ROWS_MAX 64
static struct {
	char op[16], shape[48];
	double sec, amount;
	bool flops;
} table[BENCH_ROWS_MAX];
static int n_rows;

static void row(const char *op, const char *shape, double sec, double amount, bool flops)
{
	if (n_rows == BENCH_ROWS_MAX)
		return;
	snprintf(table[n_rows].op, sizeof(table[n_rows].op), "%s", op);
	snprintf(table[n_rows].shape, sizeof(table[n_rows].shape), "%s", shape);
	table[n_rows].sec = sec;
	table[n_rows].amount = amount;
	table[n_rows++].flops = flops;
	if (sec < 0)
		failures++;
}

static void print_rows(void)
{
	printf("%-14s %-34s %13s %17s\n", "op", "shape", "time", "rate");
	for (int i = 0; i < n_rows; i++) {
		double sec = table[i].sec, rate = table[i].amount / sec * 1e-9;
		if (sec < 0)
			printf("%-14s %-34s %10s\n", table[i].op, table[i].shape, "FAILED");
		else if (table[i].flops)
			printf("%-14s %-34s %10.3f ms %9.1f GFLOP/s %6.1f%% of sgemm peak\n",
			       table[i].op, table[i].shape, sec * 1e3, rate,
			       100 * rate / peak_gflops);
		else
			printf("%-14s %-34s %10.3f ms %9.2f GB/s    %6.1f%% of memcpy\n",
			       table[i].op, table[i].shape, sec * 1e3, rate, 100 * rate / copy_gbs);
	}
}

/* ---- ceilings ---------------------------------------------------------- */

struct sgemm_ctx {
	int n;
	float *a, *b, *c;
};

static int raw_sgemm(void *p)
{
	struct sgemm_ctx *c = p;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->n, c->n, c->n, 1.0f, c->a, c->n,
		    c->b, c->n, 0.0f, c->c, c->n);
	return 0;
}

struct copy_ctx {
	size_t n;
	char *a, *b;
};

static int raw_copy(void *p)
{
	struct copy_ctx *c = p;
	memcpy(c->b, c->a, c->n);
	return 0;
}

static void ceilings(int n, size_t copy_bytes)
{
	struct sgemm_ctx g = { n, calloc((size_t) n * n, 4), calloc((size_t) n * n, 4),
			       calloc((size_t) n * n, 4) };
	struct copy_ctx cp = { copy_bytes, malloc(copy_bytes), malloc(copy_bytes) };
	double t;

	for (size_t i = 0; i < (size_t) n * n; i++)
		g.a[i] = g.b[i] = (float) (i % 17) * 0.01f;
	memset(cp.a, 1, copy_bytes);
	memset(cp.b, 2, copy_bytes);
	/* OpenBLAS with its own threads, as many as kk's: the ceiling kk's
	 * split of sgemm over its pool is measured against. */
	openblas_set_num_threads(kk_backend_threads(be));
	t = time_it(raw_sgemm, &g);
	openblas_set_num_threads(1);
	peak_gflops = MAX(peak_gflops, 2.0 * n * n * n / t * 1e-9);
	t = time_it(raw_copy, &cp);
	copy_gbs = MAX(copy_gbs, 2.0 * copy_bytes / t * 1e-9); /* read + write */
	free(g.a), free(g.b), free(g.c), free(cp.a), free(cp.b);
}

/* ---- ops --------------------------------------------------------------- */

static int do_gemm(void *p)
{
	return kk_gemm(be, NULL, p);
}

static void bench_gemm(kk_dtype dt, int64_t m, int64_t n, int64_t k, int64_t batch, bool epi)
{
	int64_t bt = batch ? batch : 1;
	kk_buffer *a = rand_buf(dt, bt * m * k, -1, 1), *b = rand_buf(dt, bt * k * n, -1, 1);
	kk_buffer *c = rand_buf(KK_F32, bt * m * n, 0, 1), *bias = rand_buf(KK_F32, n, -1, 1);
	kk_gemm_desc d = kiln_test_gemm(false, false, m, n, k, a, b, c);
	d.batch = batch, d.stride_a = m * k, d.stride_b = k * n, d.stride_c = m * n;
	d.bias = epi ? bias : NULL, d.epilogue = epi ? KK_EPI_GELU : KK_EPI_NONE;
	char shape[64];
	snprintf(shape, sizeof(shape), "%s %ldx%ldx%ld%s%s", kk_dtype_name(dt), (long) m, (long) n,
		 (long) k, batch ? " batch" : "", epi ? " +bias+gelu" : "");
	if (batch)
		snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), " %ld",
			 (long) batch);
	row("gemm", shape, time_it(do_gemm, &d), 2.0 * bt * m * n * k, true);
	kk_buffer_free(a), kk_buffer_free(b), kk_buffer_free(c), kk_buffer_free(bias);
}

/* A linear layer y = x W^T with W [n, k] as stored in a model: m = 1..8
 * is the decode GEMV (rate: GB/s of weights), larger m sgemm. */
static void bench_linear(kk_dtype dt, int64_t m, int64_t n, int64_t k)
{
	kk_buffer *x = rand_buf(dt, m * k, -1, 1), *w = rand_buf(dt, n * k, -1, 1);
	kk_buffer *y = rand_buf(KK_F32, m * n, 0, 1);
	kk_gemm_desc d = kiln_test_linear(m, n, k, x, w, y);
	char shape[64];
	snprintf(shape, sizeof(shape), "%s m=%ld %ldx%ld", kk_dtype_name(dt), (long) m, (long) n,
		 (long) k);
	if (m <= 8)
		row("linear x W^T", shape, time_it(do_gemm, &d), (double) kk_buffer_bytes(w),
		    false);
	else
		row("linear x W^T", shape, time_it(do_gemm, &d), 2.0 * m * n * k, true);
	kk_buffer_free(x), kk_buffer_free(w), kk_buffer_free(y);
}

int kk__gemm_f32_route(int route);    /* kernels/kk/cpu/gemm.c, for --f32mm */
int kk__half_force(const char *name); /* kernels/kk/cpu/half.c, for --half */

/* --f32mm: an f32 x W^T through sgemm and through half.c's f32 register
 * tiles, alternating (sgemm, tiles, sgemm, tiles: a busy machine disturbs
 * both alike), best of each; the shapes of the 15M and 110M models'
 * layers, at prefill-sized m.  Prints GFLOP/s of each and tiles/sgemm. */
static void f32mm_row(int64_t m, int64_t n, int64_t k, bool ta, bool tb)
{
	kk_buffer *x = rand_buf(KK_F32, m * k, -1, 1), *w = rand_buf(KK_F32, n * k, -1, 1);
	kk_buffer *y = rand_buf(KK_F32, m * n, 0, 1);
	kk_gemm_desc d = kiln_test_gemm(ta, tb, m, n, k, x, w, y);
	double best[2] = { 1e30, 1e30 };
	for (int rep = 0; rep < 4; rep++) {
		kk__gemm_f32_route(rep % 2 ? 1 : -1);
		double t = time_it(do_gemm, &d);
		if (t < 0)
			failures++;
		best[rep % 2] = MIN(best[rep % 2], t);
	}
	kk__gemm_f32_route(0);
	double f = 2.0 * m * n * k * 1e-9;
	printf("%-8ld %5ldx%-6ld %12.1f %12.1f %7.2fx%s\n", (long) m, (long) n, (long) k,
	       f / best[0], f / best[1], best[0] / best[1],
	       ta   ? "  A^T B"
	       : tb ? ""
		    : "  A B");
	fflush(stdout);
	kk_buffer_free(x), kk_buffer_free(w), kk_buffer_free(y);
}

static void bench_f32mm(bool train)
{
	/* n x k of the 15M and 110M models' layers, at prefill-sized m */
	static const int64_t shapes[][2] = { { 768, 768 },   { 2048, 768 }, { 768, 2048 },
					     { 32000, 768 }, { 288, 288 },  { 768, 288 },
					     { 288, 768 },   { 32000, 288 } };
	static const int64_t ms[] = { 17, 24, 32, 64, 96, 128 };
	/* bench-train's model (dim 128, FFN 352, 2 kv heads of 32, vocab
	 * 512): its forward's x W^T at batch 4 x 128 tokens */
	static const int64_t tshapes[][2] = {
		{ 128, 128 }, { 64, 128 }, { 352, 128 }, { 128, 352 }, { 512, 128 }
	};
	printf("%-8s %-12s %12s %12s %8s\n", "m", "n x k", "sgemm GF/s", "tiles GF/s", "ratio");
	if (train) {
		/* forward x W^T; backward dX = dY W and dW = dY^T X */
		for (size_t si = 0; si < ARRAY_SIZE(tshapes); si++)
			f32mm_row(512, tshapes[si][0], tshapes[si][1], false, true);
		for (size_t si = 0; si < ARRAY_SIZE(tshapes); si++)
			f32mm_row(512, tshapes[si][1], tshapes[si][0], false, false);
		for (size_t si = 0; si < ARRAY_SIZE(tshapes); si++)
			f32mm_row(tshapes[si][0], tshapes[si][1], 512, true, false);
		return;
	}
	for (size_t si = 0; si < ARRAY_SIZE(shapes); si++)
		for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++)
			f32mm_row(ms[mi], shapes[si][0], shapes[si][1], false, true);
}

struct qg_ctx {
	kk_buffer *y, *x;
	kk_qmatrix *w;
	int64_t m;
};

static int do_qgemm(void *p)
{
	struct qg_ctx *c = p;
	return kk_qgemm(be, NULL, c->y, c->x, c->w, NULL, c->m);
}

/* The quantized product, m = 1 (decode GEMV: GB/s of weights) or a
 * prefill-sized m (GFLOP/s, comparable with the linear x W^T rows). */
static void bench_qgemv(kk_dtype qt, int group, int64_t m, int64_t n, int64_t k)
{
	struct qg_ctx c = { rand_buf(KK_F32, m * n, 0, 1), rand_buf(KK_F32, m * k, -1, 1), NULL,
			    m };
	kk_buffer *w = rand_buf(KK_F32, n * k, -1, 1);
	char shape[64], g[16] = "";
	if (kk_qmatrix_alloc(be, qt, n, k, group, KK_F16, &c.w) < 0 ||
	    kk_quantize(be, NULL, c.w, w) < 0) {
		row("qgemv", "alloc/quantize", -1, 0, false);
		return;
	}
	if (group)
		snprintf(g, sizeof(g), " g%d", group);
	snprintf(shape, sizeof(shape), "%s%s m=%ld %ldx%ld", kk_dtype_name(qt), g, (long) m,
		 (long) n, (long) k);
	/* Rows one after another, then packed (kk_qmatrix_pack). */
	for (int packed = 0; packed < 2; packed++) {
		if (packed && kk_qmatrix_pack(be, c.w) != 1)
			break;
		if (m == 1)
			row(packed ? "qgemv packed" : "qgemv", shape, time_it(do_qgemm, &c),
			    (double) kk_buffer_bytes(c.w->data) + kk_buffer_bytes(c.w->scales),
			    false);
		else
			row(packed ? "qgemm packed" : "qgemm", shape, time_it(do_qgemm, &c),
			    2.0 * m * n * k, true);
	}
	kk_qmatrix_free(c.w), kk_buffer_free(w), kk_buffer_free(c.x), kk_buffer_free(c.y);
}

struct attn_ctx {
	kk_attn_desc d;
	kk_buffer *o, *lse, *q, *k, *v;
	kk_buffer *dq, *dk, *dv, *dout;
};

static int do_attn_bwd(void *p)
{
	struct attn_ctx *c = p;
	return kk_attention_bwd(be, NULL, &c->d, c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v,
				c->o, c->lse);
}

static int do_attn(void *p)
{
	struct attn_ctx *c = p;
	return kk_attention_fwd(be, NULL, &c->d, c->o, c->lse, c->q, c->k, c->v);
}

static void bench_attn(int T, int H, int Hkv, int D)
{
	int32_t cu[2] = { 0, T };
	kk_buffer *cub = NULL;
	struct attn_ctx c;
	char shape[64];

	kk_buffer_alloc(be, KK_I32, 2, &cub);
	kk_buffer_upload(be, NULL, cub, 0, cu, sizeof(cu));
	c = (struct attn_ctx){ kiln_test_attn(H, Hkv, D, true, 1, T, T, cub),
			       rand_buf(KK_F32, (size_t) T * H * D, 0, 1),
			       rand_buf(KK_F32, (size_t) T * H, 0, 1),
			       rand_buf(KK_F32, (size_t) T * H * D, -1, 1),
			       rand_buf(KK_F32, (size_t) T * Hkv * D, -1, 1),
			       rand_buf(KK_F32, (size_t) T * Hkv * D, -1, 1),
			       NULL,
			       NULL,
			       NULL,
			       NULL };
	snprintf(shape, sizeof(shape), "f32 causal T=%d H=%d/%d D=%d", T, H, Hkv, D);
	/* Causal: half of the 4*T*T*H*D flops of QK^T and PV. */
	row("attn prefill", shape, time_it(do_attn, &c), 2.0 * T * (double) T * H * D, true);
	if (T <= 512) {
		c.dq = rand_buf(KK_F32, (size_t) T * H * D, 0, 1);
		c.dout = rand_buf(KK_F32, (size_t) T * H * D, -1, 1);
		c.dk = rand_buf(KK_F32, (size_t) T * Hkv * D, 0, 1);
		c.dv = rand_buf(KK_F32, (size_t) T * Hkv * D, 0, 1);
		/* Backward: 2.5x the forward's flops (recompute S, dP, dS, dQ, dK, dV). */
		row("attn backward", shape, time_it(do_attn_bwd, &c), 5.0 * T * (double) T * H * D,
		    true);
		kk_buffer_free(c.dq), kk_buffer_free(c.dout), kk_buffer_free(c.dk),
			kk_buffer_free(c.dv);
	}
	kk_buffer_free(cub), kk_buffer_free(c.o), kk_buffer_free(c.lse), kk_buffer_free(c.q),
		kk_buffer_free(c.k), kk_buffer_free(c.v);
}

struct dec_ctx {
	kk_paged_desc d;
	kk_buffer *o, *q, *kc, *vc;
};

static int do_decode(void *p)
{
	struct dec_ctx *c = p;
	return kk_attention_decode(be, NULL, &c->d, c->o, c->q, c->kc, c->vc);
}

static void bench_decode(int S, int ctx, int H, int Hkv, int D)
{
	int mbps = DIV_ROUND_UP(ctx, KK_KV_BLOCK_SIZE), nb = S * mbps;
	int32_t *bt = malloc(sizeof(int32_t) * nb), *cl = malloc(sizeof(int32_t) * S);
	kk_buffer *btb = NULL, *clb = NULL;
	size_t cache = (size_t) nb * KK_KV_BLOCK_SIZE * Hkv * D;
	struct dec_ctx c;
	char shape[64];

	for (int i = 0; i < nb; i++)
		bt[i] = (i * 7) % nb; /* scattered blocks */
	for (int s = 0; s < S; s++)
		cl[s] = ctx;
	kk_buffer_alloc(be, KK_I32, nb, &btb);
	kk_buffer_alloc(be, KK_I32, S, &clb);
	kk_buffer_upload(be, NULL, btb, 0, bt, sizeof(int32_t) * nb);
	kk_buffer_upload(be, NULL, clb, 0, cl, sizeof(int32_t) * S);
	c = (struct dec_ctx){ kiln_test_paged(H, Hkv, D, S, nb, mbps, ctx, btb, clb),
			      rand_buf(KK_BF16, (size_t) S * H * D, 0, 1),
			      rand_buf(KK_BF16, (size_t) S * H * D, -1, 1),
			      rand_buf(KK_BF16, cache, -1, 1), rand_buf(KK_BF16, cache, -1, 1) };
	snprintf(shape, sizeof(shape), "bf16 seqs=%d ctx=%d H=%d/%d D=%d", S, ctx, H, Hkv, D);
	row("attn decode", shape, time_it(do_decode, &c), 2.0 * cache * 2, false);
	free(bt), free(cl);
	kk_buffer_free(btb), kk_buffer_free(clb), kk_buffer_free(c.o), kk_buffer_free(c.q),
		kk_buffer_free(c.kc), kk_buffer_free(c.vc);
}

struct norm_ctx {
	kk_buffer *y, *rstd, *x, *w;
	int64_t rows, dim;
};

static int do_rmsnorm(void *p)
{
	struct norm_ctx *c = p;
	return kk_rmsnorm_fwd(be, NULL, c->y, NULL, c->rstd, c->x, NULL, c->w, c->rows, c->dim,
			      1e-5f);
}

static void bench_rmsnorm(kk_dtype dt, int64_t rows, int64_t dim)
{
	struct norm_ctx c = { rand_buf(dt, rows * dim, 0, 1),
			      rand_buf(KK_F32, rows, 0, 1),
			      rand_buf(dt, rows * dim, -1, 1),
			      rand_buf(dt, dim, 0.5f, 1.5f),
			      rows,
			      dim };
	char shape[64];
	snprintf(shape, sizeof(shape), "%s %ldx%ld", kk_dtype_name(dt), (long) rows, (long) dim);
	row("rmsnorm fwd", shape, time_it(do_rmsnorm, &c),
	    2.0 * kk_dtype_size(dt, (size_t) (rows * dim)), false);
	kk_buffer_free(c.y), kk_buffer_free(c.rstd), kk_buffer_free(c.x), kk_buffer_free(c.w);
}

static const char *load_avg(void)
{
	static char buf[64] = "unknown\n";
	FILE *f = fopen("/proc/loadavg", "re");
	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			snprintf(buf, sizeof(buf), "unknown\n");
		fclose(f);
	}
	return buf;
}

int main(int argc, char **argv)
{
	bool quick = false, qonly = false;
	int f32mm = 0;
	int r, threads = 0;

	for (int i = 1; i < argc; i++) {
		if (streq(argv[i], "--quick"))
			quick = true;
		else if (streq(argv[i], "--cpu-time"))
			bench_clock = CLOCK_PROCESS_CPUTIME_ID;
		else if (streq(argv[i], "--quant"))
			qonly = true;
		else if (streq(argv[i], "--f32mm"))
			f32mm = 1;
		else if (streq(argv[i], "--f32mm-train"))
			f32mm = 2;
		else if (streq(argv[i], "--half") && i + 1 < argc) {
			if (kk__half_force(argv[++i]) < 0) {
				fprintf(stderr, "--half '%s': not a variant this CPU runs\n",
					argv[i]);
				return 2;
			}
		} else if (streq(argv[i], "--threads") && i + 1 < argc) {
			char *end;
			threads = (int) strtol(argv[++i], &end, 10);
			if (*end || threads < 1 || threads > KK_THREADS_MAX) {
				fprintf(stderr, "--threads '%s': want a count 1..%d\n", argv[i],
					KK_THREADS_MAX);
				return 2;
			}
		} else {
			fprintf(stderr,
				"Unknown argument '%s'; usage: %s [--quick] [--cpu-time] "
				"[--threads N] [--quant] [--f32mm] [--f32mm-train] [--half "
				"VARIANT]\n",
				argv[i], argv[0]);
			return 2;
		}
	}

	if (quick)
		min_sec = BENCH_MIN_SEC_QUICK;
	r = kk_backend_open("cpu", &be);
	if (r < 0) {
		fprintf(stderr, "Failed to open the cpu backend: %s\n", strerror(-r));
		return 1;
	}
	kk_backend_set_threads(be, threads);
	if (f32mm) {
		printf("# f32 x W^T, sgemm vs register tiles (%s), %d kk threads\n",
		       bench_clock == CLOCK_MONOTONIC ? "wall time" : "process CPU time",
		       kk_backend_threads(be));
		bench_f32mm(f32mm == 2);
		kk_backend_free(be);
		return failures ? 1 : 0;
	}
	printf("# kk cpu backend benchmark (%s shapes, %s); load average at start: %s",
	       quick ? "quick" : "full",
	       bench_clock == CLOCK_MONOTONIC ? "wall time" : "process CPU time", load_avg());
	ceilings(quick ? 256 : 1536, quick ? (8u << 20) : (256u << 20));

	if (qonly) { /* the quantized product alone: decode and prefill shapes */
		bench_qgemv(KK_I8, 0, 1, 4096, 4096);
		bench_qgemv(KK_I8, 32, 1, 4096, 4096);
		bench_qgemv(KK_Q4, 32, 1, 4096, 4096);
		bench_qgemv(KK_I8, 32, 1, 32000, 768);
		bench_qgemv(KK_Q4, 32, 1, 32000, 768);
		bench_qgemv(KK_I8, 32, 8, 2048, 768);
		bench_qgemv(KK_Q4, 32, 8, 2048, 768);
		bench_qgemv(KK_I8, 32, 128, 2048, 768);
		bench_qgemv(KK_Q4, 32, 128, 2048, 768);
		bench_qgemv(KK_I8, 32, 128, 768, 2048);
		bench_qgemv(KK_Q4, 32, 128, 768, 2048);
	} else if (quick) {
		bench_gemm(KK_F32, 128, 128, 128, 0, false);
		bench_gemm(KK_BF16, 64, 96, 128, 2, true);
		bench_linear(KK_F32, 1, 256, 256);
		bench_linear(KK_F32, 16, 256, 256);
		bench_qgemv(KK_I8, 0, 1, 256, 256);
		bench_qgemv(KK_Q4, 64, 1, 256, 256);
		bench_qgemv(KK_Q4, 32, 16, 256, 256);
		bench_attn(64, 2, 1, 64);
		bench_decode(2, 64, 4, 2, 128);
		bench_rmsnorm(KK_F32, 64, 256);
	} else {
		bench_gemm(KK_F32, 512, 512, 512, 0, false);
		bench_gemm(KK_F32, 1024, 1024, 1024, 0, false);
		bench_gemm(KK_F32, 2048, 2048, 2048, 0, false);
		bench_gemm(KK_F32, 4096, 1024, 1024, 0, false);
		bench_gemm(KK_F32, 1024, 1024, 1024, 0, true);
		bench_gemm(KK_F32, 256, 256, 256, 8, false);
		bench_gemm(KK_BF16, 1024, 1024, 1024, 0, false);
		bench_gemm(KK_F16, 1024, 1024, 1024, 0, false);
		bench_linear(KK_F32, 1, 4096, 4096);
		bench_linear(KK_F32, 8, 4096, 4096);
		bench_linear(KK_BF16, 1, 4096, 4096);
		bench_linear(KK_F32, 16, 4096, 4096);
		bench_linear(KK_F32, 128, 768, 768);
		bench_qgemv(KK_I8, 0, 1, 4096, 4096);
		bench_qgemv(KK_Q4, 32, 1, 4096, 4096);
		bench_qgemv(KK_Q4, 128, 1, 4096, 4096);
		bench_linear(KK_F32, 128, 2048, 768);
		bench_qgemv(KK_I8, 0, 128, 2048, 768);
		bench_qgemv(KK_Q4, 32, 128, 2048, 768);
		bench_attn(512, 8, 8, 64);
		bench_attn(1024, 8, 2, 128);
		bench_decode(8, 1024, 32, 8, 128);
		bench_rmsnorm(KK_F32, 4096, 4096);
		bench_rmsnorm(KK_BF16, 4096, 4096);
	}
	ceilings(quick ? 256 : 1536, quick ? (8u << 20) : (256u << 20));
	printf("# ceilings (best of before and after): OpenBLAS sgemm %dx%dx%d = %.1f GFLOP/s; "
	       "memcpy %u MiB = %.2f GB/s (read+write); %d kk threads\n",
	       quick ? 256 : 1536, quick ? 256 : 1536, quick ? 256 : 1536, peak_gflops,
	       quick ? 8u : 256u, copy_gbs, kk_backend_threads(be));
	print_rows();
	kk_backend_free(be);
	return failures ? 1 : 0;
}
