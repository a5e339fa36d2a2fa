/* kernels/bench/cuda-bench.c — benchmark of the kk cuda backend.
 *
 * Prints one table row per op and shape: time per call, the achieved rate
 * (TFLOP/s for matrix work, GB/s of compulsory DRAM traffic for
 * memory-bound ops), that rate as a percentage of a ceiling measured in the
 * same run on the same GPU, and, when a torch timing file is given (written
 * by kernels/bench/cuda_torch.py), PyTorch's time for the same op and shape.
 *
 * Ceilings: compute = a large bf16 GEMM through kk_gemm (cuBLASLt);
 * bandwidth = a large device-to-device copy (kk_buffer_copy), counting read
 * plus write bytes.  Memory-bound rows count the bytes each op must move
 * (every input read once, every output written once; small vectors such as
 * norm weights left out), so %ceil is the fraction of the copy bandwidth
 * achieved; the target for them is 85%.  Times are host wall-clock over a synchronized loop
 * (warm-up first, then at least KB_MIN_ITERS calls and KB_MIN_SECONDS), so
 * launch overhead is included, which matters only for the smallest ops.
 *
 *   cuda-bench [--torch FILE] [--quick] [--only WORD]
 * --only WORD: only the groups whose name holds WORD (gemm, norm, adamw,
 * qgemv, attn prefill, attn decode, sample; the ceilings are always
 * measured), e.g. --only attn.
 * Exit: 0 (also when there is no CUDA device: it prints
 * "skipped: no CUDA device"), 1 when an op fails. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/macro.h"
#include "kk.h"
#include "bench-clock.h"
#include "kk-desc.h"

#define KB_MIN_ITERS   10
#define KB_MIN_SECONDS 0.3
#define KB_WARMUP      3
#define KB_TORCH_MAX   64

static kk_backend *be;
static int quick, failed;
static const char *only; /* --only WORD */
static double ceil_tflops, ceil_gbs;

static struct {
	char key[64];
	double ms;
} torch_tab[KB_TORCH_MAX];
static int n_torch;

static double now(void)
{
	return kiln_clock_seconds(CLOCK_MONOTONIC);
}

static kk_buffer *buf(kk_dtype dt, size_t n, int fill)
{
	kk_buffer *b = NULL;
	if (kk_buffer_alloc(be, dt, n, &b) < 0) {
		fprintf(stderr, "cuda-bench: cannot allocate %zu x %s on the GPU\n", n,
			kk_dtype_name(dt));
		exit(1);
	}
	/* 0x3c3c...: a small positive value in every float dtype (no NaN/Inf
	 * that could take a slow path). */
	kk_buffer_memset(be, NULL, b, fill ? 0x3c : 0, 0, kk_buffer_bytes(b));
	return b;
}

typedef int (*kb_fn)(void *arg);

/* Seconds per call of fn(arg). */
static double timeit(kb_fn fn, void *arg)
{
	for (int i = 0; i < KB_WARMUP; i++)
		if (fn(arg) < 0)
			return -1;
	if (kk_backend_sync(be) < 0)
		return -1;
	int iters = 0;
	double t0 = now(), t;
	do {
		if (fn(arg) < 0)
			return -1;
		iters++;
		if (iters % KB_MIN_ITERS == 0 && kk_backend_sync(be) < 0)
			return -1;
		t = now();
	} while (iters < KB_MIN_ITERS || (iters % KB_MIN_ITERS) || t - t0 < KB_MIN_SECONDS);
	if (kk_backend_sync(be) < 0)
		return -1;
	return (now() - t0) / iters;
}

static double torch_ms(const char *key)
{
	for (int i = 0; i < n_torch; i++)
		if (streq(torch_tab[i].key, key))
			return torch_tab[i].ms;
	return -1;
}

/* flops > 0: compute-bound row; else bytes: memory-bound row. */
static void row(const char *op, const char *shape, const char *torch_key, double sec, double flops,
		double bytes)
{
	if (sec < 0) {
		printf("%-22s %-28s %10s\n", op, shape, "FAILED");
		failed = 1;
		return;
	}
	char rate[32], pct[16], tms[16] = "-", vs[16] = "-";
	if (flops > 0) {
		snprintf(rate, sizeof(rate), "%8.1f TFLOP/s", flops / sec * 1e-12);
		snprintf(pct, sizeof(pct), "%5.1f%%", 100 * flops / sec * 1e-12 / ceil_tflops);
	} else {
		snprintf(rate, sizeof(rate), "%8.1f GB/s", bytes / sec * 1e-9);
		snprintf(pct, sizeof(pct), "%5.1f%%", 100 * bytes / sec * 1e-9 / ceil_gbs);
	}
	double t = torch_key ? torch_ms(torch_key) : -1;
	if (t > 0) {
		snprintf(tms, sizeof(tms), "%.3f", t);
		snprintf(vs, sizeof(vs), "%.2fx", t / (sec * 1e3));
	}
	printf("%-22s %-28s %10.3f %-17s %7s %10s %8s\n", op, shape, sec * 1e3, rate, pct, tms, vs);
	fflush(stdout);
}

/* ---- ops ------------------------------------------------------------------ */

struct gemm_arg {
	kk_gemm_desc d;
};
static int run_gemm(void *p)
{
	return kk_gemm(be, NULL, &((struct gemm_arg *) p)->d);
}

/* 1 when the group of rows named `op` is wanted (--only). */
static int want(const char *op)
{
	return !only || strstr(op, only) != NULL;
}

static double bench_gemm(int64_t m, int64_t n, int64_t k, kk_epilogue epi, int bias,
			 const char *label)
{
	kk_buffer *a = buf(KK_BF16, (size_t) (m * k), 1), *b = buf(KK_BF16, (size_t) (k * n), 1),
		  *c = buf(KK_BF16, (size_t) (m * n), 0), *bb = buf(KK_BF16, (size_t) n, 1);
	struct gemm_arg g = { kiln_test_linear(m, n, k, a, b, c) };
	g.d.bias = bias ? bb : NULL;
	g.d.epilogue = epi;
	double s = timeit(run_gemm, &g);
	if (label) {
		char shape[64], key[64];
		snprintf(shape, sizeof(shape), "%lldx%lldx%lld bf16", (long long) m, (long long) n,
			 (long long) k);
		snprintf(key, sizeof(key), "gemm:%lldx%lldx%lld", (long long) m, (long long) n,
			 (long long) k);
		row(label, shape, epi == KK_EPI_NONE && !bias ? key : NULL, s, 2.0 * m * n * k, 0);
	}
	kk_buffer_free(a), kk_buffer_free(b), kk_buffer_free(c), kk_buffer_free(bb);
	return s < 0 ? -1 : 2.0 * m * n * k / s * 1e-12;
}

struct copy_arg {
	kk_buffer *a, *b;
};
static int run_copy(void *p)
{
	struct copy_arg *c = p;
	return kk_buffer_copy(be, NULL, c->b, 0, c->a, 0, kk_buffer_bytes(c->a));
}

struct norm_arg {
	kk_buffer *x, *r, *w, *b, *y, *h, *mean, *rstd, *dy, *dx, *dw, *db;
	int64_t rows, dim;
};
static int run_rms(void *p)
{
	struct norm_arg *a = p;
	return kk_rmsnorm_fwd(be, NULL, a->y, a->h, a->rstd, a->x, a->r, a->w, a->rows, a->dim,
			      1e-5f);
}
static int run_rms_plain(void *p)
{
	struct norm_arg *a = p;
	return kk_rmsnorm_fwd(be, NULL, a->y, NULL, NULL, a->x, NULL, a->w, a->rows, a->dim, 1e-5f);
}
static int run_rms_bwd(void *p)
{
	struct norm_arg *a = p;
	return kk_rmsnorm_bwd(be, NULL, a->dx, a->dw, a->dy, a->r, a->h, a->w, a->rstd, a->rows,
			      a->dim);
}
static int run_ln(void *p)
{
	struct norm_arg *a = p;
	return kk_layernorm_fwd(be, NULL, a->y, a->h, a->mean, a->rstd, a->x, a->r, a->w, a->b,
				a->rows, a->dim, 1e-5f);
}
static int run_ln_plain(void *p)
{
	struct norm_arg *a = p;
	return kk_layernorm_fwd(be, NULL, a->y, NULL, NULL, NULL, a->x, NULL, a->w, a->b, a->rows,
				a->dim, 1e-5f);
}
static int run_ln_bwd(void *p)
{
	struct norm_arg *a = p;
	return kk_layernorm_bwd(be, NULL, a->dx, a->dw, a->db, a->dy, a->r, a->h, a->w, a->mean,
				a->rstd, a->rows, a->dim);
}

/* Norms: bytes are the rows of every tensor read or written once (the
 * weight, statistics and dweight are small and not counted). */
static void bench_norms(int64_t rows, int64_t dim)
{
	size_t n = (size_t) (rows * dim);
	struct norm_arg a = { buf(KK_BF16, n, 1),
			      buf(KK_BF16, n, 1),
			      buf(KK_BF16, (size_t) dim, 1),
			      buf(KK_BF16, (size_t) dim, 1),
			      buf(KK_BF16, n, 0),
			      buf(KK_BF16, n, 0),
			      buf(KK_F32, (size_t) rows, 0),
			      buf(KK_F32, (size_t) rows, 0),
			      buf(KK_BF16, n, 1),
			      buf(KK_BF16, n, 0),
			      buf(KK_F32, (size_t) dim, 0),
			      buf(KK_F32, (size_t) dim, 0),
			      rows,
			      dim };
	char shape[64], key[64];
	snprintf(shape, sizeof(shape), "%lldx%lld bf16", (long long) rows, (long long) dim);
	snprintf(key, sizeof(key), "rmsnorm:%lldx%lld", (long long) rows, (long long) dim);
	double e = 2.0 * n; /* bytes per bf16 tensor */
	row("rmsnorm fwd", shape, key, timeit(run_rms_plain, &a), 0, 2 * e);
	snprintf(key, sizeof(key), "rmsnorm_res:%lldx%lld", (long long) rows, (long long) dim);
	row("rmsnorm fwd +residual", shape, key, timeit(run_rms, &a), 0, 4 * e);
	snprintf(key, sizeof(key), "rmsnorm_bwd:%lldx%lld", (long long) rows, (long long) dim);
	row("rmsnorm bwd +dresid", shape, key, timeit(run_rms_bwd, &a), 0, 4 * e);
	snprintf(key, sizeof(key), "layernorm:%lldx%lld", (long long) rows, (long long) dim);
	row("layernorm fwd", shape, key, timeit(run_ln_plain, &a), 0, 2 * e);
	row("layernorm fwd +resid", shape, NULL, timeit(run_ln, &a), 0, 4 * e);
	snprintf(key, sizeof(key), "layernorm_bwd:%lldx%lld", (long long) rows, (long long) dim);
	row("layernorm bwd +dresid", shape, key, timeit(run_ln_bwd, &a), 0, 4 * e);
	kk_buffer *all[] = { a.x, a.r, a.w, a.b, a.y, a.h, a.mean, a.rstd, a.dy, a.dx, a.dw, a.db };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		kk_buffer_free(all[i]);
}

struct ew_arg {
	kk_buffer *a, *b, *c, *d, *ids, *loss;
	size_t n;
	int64_t rows, cols;
	kk_act act;
};
static int run_act(void *p)
{
	struct ew_arg *a = p;
	return kk_act_fwd(be, NULL, a->act, a->c, a->a, a->n);
}
static int run_act_bwd(void *p)
{
	struct ew_arg *a = p;
	return kk_act_bwd(be, NULL, a->act, a->c, a->b, a->a, a->n);
}
static int run_swiglu(void *p)
{
	struct ew_arg *a = p;
	return kk_swiglu_fwd(be, NULL, a->c, a->a, a->b, a->n);
}
static int run_swiglu_bwd(void *p)
{
	struct ew_arg *a = p;
	return kk_swiglu_bwd(be, NULL, a->c, a->d, a->c, a->a, a->b, a->n);
}
static int run_cast(void *p)
{
	struct ew_arg *a = p;
	return kk_cast(be, NULL, a->c, a->a, a->n);
}
static int run_softmax(void *p)
{
	struct ew_arg *a = p;
	return kk_softmax(be, NULL, a->c, a->a, a->rows, a->cols);
}
static int run_xent_fwd(void *p)
{
	struct ew_arg *a = p;
	return kk_cross_entropy_fwd(be, NULL, a->loss, a->a, a->ids, a->rows, a->cols);
}
static int run_xent(void *p)
{
	struct ew_arg *a = p;
	return kk_cross_entropy_bwd(be, NULL, a->c, a->a, a->ids, a->rows, a->cols, 1.0f);
}
static int run_rope(void *p)
{
	struct ew_arg *a = p;
	return kk_rope(be, NULL, a->a, a->ids, a->rows, 32, 128, 0, 10000.0f, NULL, KK_ROPE_HALF,
		       false);
}
static int run_rope_il(void *p)
{
	struct ew_arg *a = p;
	return kk_rope(be, NULL, a->a, a->ids, a->rows, 32, 128, 0, 10000.0f, NULL,
		       KK_ROPE_INTERLEAVED, false);
}
static int run_embed(void *p)
{
	struct ew_arg *a = p;
	return kk_embedding_fwd(be, NULL, a->c, a->a, a->ids, a->rows, a->n, a->cols);
}
static int run_embed_bwd(void *p)
{
	struct ew_arg *a = p;
	return kk_embedding_bwd(be, NULL, a->d, a->c, a->ids, a->rows, a->n, a->cols);
}

/* Token ids 0, 7919, 2*7919 ... mod vocab: scattered rows, few repeats. */
static kk_buffer *ids_buf(int64_t tokens, int64_t vocab)
{
	int32_t *h = malloc((size_t) tokens * sizeof(int32_t));
	for (int64_t i = 0; i < tokens; i++)
		h[i] = (int32_t) ((i * 7919) % vocab);
	kk_buffer *b = buf(KK_I32, (size_t) tokens, 0);
	kk_buffer_upload(be, NULL, b, 0, h, (size_t) tokens * sizeof(int32_t));
	free(h);
	return b;
}

static void bench_elementwise(void)
{
	struct ew_arg a = { 0 };
	char shape[64];
	a.n = (size_t) 16384 * 11008;
	a.a = buf(KK_BF16, a.n, 1), a.b = buf(KK_BF16, a.n, 1), a.c = buf(KK_BF16, a.n, 0);
	a.d = buf(KK_BF16, a.n, 0);
	double e = 2.0 * a.n;
	snprintf(shape, sizeof(shape), "16384x11008 bf16");
	a.act = KK_ACT_SILU;
	row("silu fwd", shape, "silu:16384x11008", timeit(run_act, &a), 0, 2 * e);
	row("silu bwd", shape, NULL, timeit(run_act_bwd, &a), 0, 3 * e);
	a.act = KK_ACT_GELU;
	row("gelu fwd (tanh)", shape, "gelu:16384x11008", timeit(run_act, &a), 0, 2 * e);
	row("swiglu fwd", shape, "swiglu:16384x11008", timeit(run_swiglu, &a), 0, 3 * e);
	row("swiglu bwd", shape, NULL, timeit(run_swiglu_bwd, &a), 0, 5 * e);
	kk_buffer_free(a.c);
	a.c = buf(KK_F32, a.n, 0);
	row("cast bf16->f32", shape, "cast:16384x11008", timeit(run_cast, &a), 0, 3 * e);
	kk_buffer_free(a.a), kk_buffer_free(a.b), kk_buffer_free(a.c), kk_buffer_free(a.d);

	a.rows = 4096, a.cols = 32000, a.n = (size_t) (a.rows * a.cols);
	a.a = buf(KK_BF16, a.n, 1), a.c = buf(KK_BF16, a.n, 0), a.ids = ids_buf(a.rows, a.cols);
	a.loss = buf(KK_F32, (size_t) a.rows, 0);
	e = 2.0 * a.n;
	row("softmax", "4096x32000 bf16", "softmax:4096x32000", timeit(run_softmax, &a), 0, 2 * e);
	row("xent fwd (1 pass)", "4096x32000 bf16", "xent:4096x32000", timeit(run_xent_fwd, &a), 0,
	    e);
	row("xent bwd (fused)", "4096x32000 bf16", NULL, timeit(run_xent, &a), 0, 2 * e);
	kk_buffer_free(a.a), kk_buffer_free(a.c), kk_buffer_free(a.ids), kk_buffer_free(a.loss);

	a.rows = 16384, a.n = (size_t) 16384 * 32 * 128;
	a.a = buf(KK_BF16, a.n, 1), a.ids = ids_buf(a.rows, 8192);
	e = 2.0 * a.n;
	row("rope half-split", "16384 tok x32x128 bf16", "rope:16384x32x128", timeit(run_rope, &a),
	    0, 2 * e);
	row("rope interleaved", "16384 tok x32x128 bf16", NULL, timeit(run_rope_il, &a), 0, 2 * e);
	kk_buffer_free(a.a), kk_buffer_free(a.ids);

	/* Embedding: 16384 tokens of a 128256 x 4096 table. */
	a.rows = 16384, a.cols = 4096, a.n = 128256;
	a.a = buf(KK_BF16, (size_t) a.n * a.cols, 1), a.ids = ids_buf(a.rows, (int64_t) a.n);
	a.c = buf(KK_BF16, (size_t) (a.rows * a.cols), 0);
	a.d = buf(KK_F32, (size_t) a.n * a.cols, 0);
	e = 2.0 * a.rows * a.cols;
	row("embedding fwd", "16384 tok x4096 bf16", "embed:16384x4096", timeit(run_embed, &a), 0,
	    2 * e);
	/* dout read, dtable rows read+written in f32. */
	row("embedding bwd", "16384 tok x4096 bf16", NULL, timeit(run_embed_bwd, &a), 0, e + 4 * e);
	kk_buffer_free(a.a), kk_buffer_free(a.ids), kk_buffer_free(a.c), kk_buffer_free(a.d);
}

struct adam_arg {
	kk_buffer *master, *p, *g, *m, *v, *out;
	size_t n;
};
static int run_adamw(void *p)
{
	struct adam_arg *a = p;
	kk_adamw_params ap = kiln_test_adamw(1e-4f, 10, 1);
	return kk_adamw(be, NULL, a->master, a->p, a->g, a->m, a->v, a->n, &ap);
}
static int run_gnorm(void *p)
{
	struct adam_arg *a = p;
	return kk_grad_norm(be, NULL, a->out, &a->g, 1);
}

static void bench_adamw(size_t n)
{
	struct adam_arg a = { buf(KK_F32, n, 1),
			      buf(KK_BF16, n, 0),
			      buf(KK_BF16, n, 1),
			      buf(KK_F32, n, 0),
			      buf(KK_F32, n, 0),
			      buf(KK_F32, 1, 0),
			      n };
	/* grad bf16 read, master/m/v f32 read+write, bf16 copy written. */
	row("adamw", "100M params", "adamw:100M", timeit(run_adamw, &a), 0,
	    (double) n * (2 + 24 + 2));
	row("grad norm", "100M bf16", "gradnorm:100M", timeit(run_gnorm, &a), 0, (double) n * 2);
	kk_buffer_free(a.master), kk_buffer_free(a.p), kk_buffer_free(a.g), kk_buffer_free(a.m);
	kk_buffer_free(a.v), kk_buffer_free(a.out);
}

/* Quantized matrices the GEMV rows rotate through, so their weights (30 to
 * 60 MB each) come from HBM and not from the 50 MB L2 of an H100. */
#define KB_QROT 8

struct q_arg {
	kk_qmatrix *q[KB_QROT];
	kk_buffer *x, *y, *w;
	int64_t m;
	int next;
};
static int run_qgemm(void *p)
{
	struct q_arg *a = p;
	a->next = (a->next + 1) % KB_QROT;
	return kk_qgemm(be, NULL, a->y, a->x, a->q[a->next], NULL, a->m);
}
static int run_dequant(void *p)
{
	struct q_arg *a = p;
	a->next = (a->next + 1) % KB_QROT;
	return kk_dequantize(be, NULL, a->w, a->q[a->next]);
}

/* Quantized GEMV: bytes are the weights and scales (X and Y are noise). */
static void bench_quant(kk_dtype qt, int group, int64_t n, int64_t k)
{
	struct q_arg a = { { NULL },
			   buf(KK_BF16, (size_t) (8 * k), 1),
			   buf(KK_BF16, (size_t) (8 * n), 0),
			   buf(KK_BF16, (size_t) (n * k), 1),
			   1,
			   0 };
	const char *name = qt == KK_I8 ? "int8" : "int4 g128";
	char label[64], shape[64];
	snprintf(shape, sizeof(shape), "%lldx%lld", (long long) n, (long long) k);
	int ok = 1;
	for (int i = 0; ok && i < KB_QROT; i++)
		ok = kk_qmatrix_alloc(be, qt, n, k, group, KK_F16, &a.q[i]) >= 0 &&
		     kk_quantize(be, NULL, a.q[i], a.w) >= 0;
	if (!ok) {
		snprintf(label, sizeof(label), "qgemv %s", name);
		row(label, shape, NULL, -1, 0, 0);
	} else {
		double bytes =
			(double) kk_buffer_bytes(a.q[0]->data) + kk_buffer_bytes(a.q[0]->scales);
		const int64_t ms[] = { 1, 4, 8 };
		for (int i = 0; i < 3; i++) {
			a.m = ms[i];
			snprintf(label, sizeof(label), "qgemv %s m=%lld", name, (long long) a.m);
			char key[64];
			snprintf(key, sizeof(key), "qgemv_%s:%lldx%lldm%lld",
				 qt == KK_I8 ? "i8" : "q4", (long long) n, (long long) k,
				 (long long) a.m);
			row(label, shape, key, timeit(run_qgemm, &a), 0, bytes);
		}
		snprintf(label, sizeof(label), "dequantize %s", name);
		row(label, shape, NULL, timeit(run_dequant, &a), 0, bytes + 2.0 * n * k);
	}
	for (int i = 0; i < KB_QROT; i++)
		kk_qmatrix_free(a.q[i]);
	kk_buffer_free(a.x), kk_buffer_free(a.y), kk_buffer_free(a.w);
}

/* A bf16 buffer of uniform random values in [-1, 1) (attention inputs:
 * constant data would make every softmax row uniform). */
static kk_buffer *buf_rand(size_t n)
{
	kk_buffer *b = buf(KK_BF16, n, 0);
	uint16_t *h = malloc(n * sizeof(uint16_t));
	uint64_t x = 0x9E3779B97F4A7C15ull ^ n;
	if (!h) {
		fprintf(stderr, "cuda-bench: out of host memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		h[i] = kk_f32_to_bf16((float) ((x >> 40) & 0xffffff) / 8388608.0f - 1.0f);
	}
	kk_buffer_upload(be, NULL, b, 0, h, n * sizeof(uint16_t));
	free(h);
	return b;
}

struct attn_arg {
	kk_attn_desc d;
	kk_buffer *q, *k, *v, *o, *lse, *dq, *dk, *dv;
};
static int run_attn(void *p)
{
	struct attn_arg *a = p;
	return kk_attention_fwd(be, NULL, &a->d, a->o, a->lse, a->q, a->k, a->v);
}
static int run_attn_bwd(void *p)
{
	struct attn_arg *a = p;
	return kk_attention_bwd(be, NULL, &a->d, a->dq, a->dk, a->dv, a->o, a->q, a->k, a->v, a->o,
				a->lse);
}

static void bench_attention(int T, int bwd)
{
	const int hq = 32, hkv = 8, d = 128;
	int32_t cu[2] = { 0, T };
	struct attn_arg a = { 0 };
	kk_buffer *cus = buf(KK_I32, 2, 0);
	kk_buffer_upload(be, NULL, cus, 0, cu, sizeof(cu));
	size_t nq = (size_t) T * hq * d, nk = (size_t) T * hkv * d;
	a.d = kiln_test_attn(hq, hkv, d, true, 1, T, T, cus);
	a.q = buf_rand(nq), a.k = buf_rand(nk), a.v = buf_rand(nk);
	a.o = buf(KK_BF16, nq, 0), a.lse = buf(KK_F32, (size_t) T * hq, 0);
	/* Causal: half of the 4 T^2 d flops per head (QK^T and PV). */
	double flops = 2.0 * T * (double) T * d * hq;
	char shape[64], key[64];
	snprintf(shape, sizeof(shape), "T=%d h=%d/%d d=%d bf16", T, hq, hkv, d);
	snprintf(key, sizeof(key), "attn:%d", T);
	row("attention fwd causal", shape, key, timeit(run_attn, &a), flops, 0);
	if (bwd) {
		a.dq = buf(KK_BF16, nq, 0), a.dk = buf(KK_BF16, nk, 0), a.dv = buf(KK_BF16, nk, 0);
		snprintf(key, sizeof(key), "attnbwd:%d", T);
		row("attention bwd causal", shape, key, timeit(run_attn_bwd, &a), 2.5 * flops, 0);
		kk_buffer_free(a.dq), kk_buffer_free(a.dk), kk_buffer_free(a.dv);
	}
	kk_buffer_free(a.q), kk_buffer_free(a.k), kk_buffer_free(a.v), kk_buffer_free(a.o);
	kk_buffer_free(a.lse), kk_buffer_free(cus);
}

struct dec_arg {
	kk_paged_desc d;
	kk_buffer *q, *kc, *vc, *o;
};
static int run_decode(void *p)
{
	struct dec_arg *a = p;
	return kk_attention_decode(be, NULL, &a->d, a->o, a->q, a->kc, a->vc);
}

static void bench_decode(int ns, int ctx)
{
	const int hq = 32, hkv = 8, d = 128;
	int maxb = (ctx + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE, nblocks = ns * maxb;
	int32_t *bt = malloc((size_t) ns * maxb * sizeof(int32_t)),
		*lens = malloc(ns * sizeof(int32_t));
	for (int i = 0; i < ns * maxb; i++)
		bt[i] = (int32_t) (((int64_t) i * 7919) % nblocks); /* scattered pages */
	for (int i = 0; i < ns; i++)
		lens[i] = ctx;
	struct dec_arg a = { 0 };
	kk_buffer *bts = buf(KK_I32, (size_t) ns * maxb, 0), *ls = buf(KK_I32, (size_t) ns, 0);
	kk_buffer_upload(be, NULL, bts, 0, bt, (size_t) ns * maxb * sizeof(int32_t));
	kk_buffer_upload(be, NULL, ls, 0, lens, ns * sizeof(int32_t));
	size_t ncache = (size_t) nblocks * KK_KV_BLOCK_SIZE * hkv * d;
	a.d = kiln_test_paged(hq, hkv, d, ns, nblocks, maxb, ctx, bts, ls);
	a.q = buf_rand((size_t) ns * hq * d), a.o = buf(KK_BF16, (size_t) ns * hq * d, 0);
	a.kc = buf_rand(ncache), a.vc = buf_rand(ncache);
	char shape[64], key[64];
	snprintf(shape, sizeof(shape), "%d seqs x %d ctx, h=%d/%d", ns, ctx, hq, hkv);
	snprintf(key, sizeof(key), "decode:%dx%d", ns, ctx);
	/* rate: GB/s of K and V read once (the compulsory traffic) */
	row("paged decode attn", shape, key, timeit(run_decode, &a), 0,
	    2.0 * ns * (double) ctx * hkv * d * 2);
	kk_buffer_free(a.q), kk_buffer_free(a.o), kk_buffer_free(a.kc), kk_buffer_free(a.vc);
	kk_buffer_free(bts), kk_buffer_free(ls);
	free(bt), free(lens);
}

struct samp_arg {
	kk_buffer *ids, *logits;
	kk_sampling s;
};
static int run_sample(void *p)
{
	struct samp_arg *a = p;
	return kk_sample(be, NULL, a->ids, a->logits, 32, 128256, &a->s);
}

static void bench_sample(void)
{
	struct samp_arg a = { buf(KK_I32, 32, 0),
			      buf(KK_BF16, (size_t) 32 * 128256, 1),
			      { .temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .seed = 1 } };
	row("sample top-p 0.9", "32 x 128256 bf16", NULL, timeit(run_sample, &a), 0,
	    32.0 * 128256 * 2);
	kk_buffer_free(a.ids), kk_buffer_free(a.logits);
}

static void load_torch(const char *path)
{
	_cleanup_fclose_ FILE *f = fopen(path, "re");
	char key[64];
	double ms;
	if (!f)
		return;
	while (n_torch < KB_TORCH_MAX && fscanf(f, "%63s %lf", key, &ms) == 2) {
		snprintf(torch_tab[n_torch].key, sizeof(torch_tab[n_torch].key), "%s", key);
		torch_tab[n_torch++].ms = ms;
	}
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (streq(argv[i], "--torch") && i + 1 < argc)
			load_torch(argv[++i]);
		else if (streq(argv[i], "--quick"))
			quick = 1;
		else if (streq(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--torch FILE] [--quick] [--only WORD]\n",
				argv[0]);
			return 2;
		}
	}
	unsetenv("KILN_BACKEND");
	char why[KK_WHY_MAX];
	if (kk_backend_open_why("cuda", &be, why, sizeof(why)) < 0) {
		printf("skipped: no CUDA device (%s)\n", why);
		return 0;
	}

	/* Ceilings, measured first. */
	ceil_tflops = bench_gemm(8192, 8192, 8192, KK_EPI_NONE, 0, NULL);
	struct copy_arg c = { buf(KK_BF16, (size_t) 1 << 30, 1),
			      buf(KK_BF16, (size_t) 1 << 30, 0) };
	double cs = timeit(run_copy, &c);
	ceil_gbs = cs > 0 ? 2.0 * kk_buffer_bytes(c.a) / cs * 1e-9 : -1;
	kk_buffer_free(c.a), kk_buffer_free(c.b);
	if (ceil_tflops <= 0 || ceil_gbs <= 0) {
		fprintf(stderr, "cuda-bench: the ceiling measurements failed\n");
		kk_backend_free(be);
		return 1;
	}
	printf("kk cuda backend benchmark\n");
	printf("ceilings (this run): compute %.1f TFLOP/s (cuBLASLt bf16 GEMM 8192^3), "
	       "bandwidth %.0f GB/s (2 GiB device copy, read+write)\n\n",
	       ceil_tflops, ceil_gbs);
	printf("%-22s %-28s %10s %-17s %7s %10s %8s\n", "op", "shape", "time ms", "rate", "%ceil",
	       "torch ms", "speedup");

	if (want("gemm")) {
		bench_gemm(8192, 8192, 8192, KK_EPI_NONE, 0, "gemm (ceiling)");
		bench_gemm(4096, 4096, 4096, KK_EPI_NONE, 0, "gemm");
		bench_gemm(4096, 11008, 4096, KK_EPI_GELU, 1, "gemm +bias+gelu");
		bench_gemm(4096, 11008, 4096, KK_EPI_SILU, 0, "gemm +silu");
		bench_gemm(16, 4096, 4096, KK_EPI_NONE, 0, "gemm (m=16)");
	}
	if (want("norm"))
		bench_norms(16384, 4096);
	if (!quick && !only)
		bench_elementwise();
	if (want("adamw"))
		bench_adamw((size_t) 100 << 20);
	if (want("qgemv")) {
		bench_quant(KK_I8, 0, 14336, 4096);
		bench_quant(KK_Q4, 128, 14336, 4096);
	}
	if (want("qgemv") && !quick) {
		bench_quant(KK_I8, 0, 4096, 4096);
		bench_quant(KK_Q4, 128, 4096, 14336);
	}
	const int seqs[] = { 1024, 4096, 16384 };
	for (int i = 0; i < (quick ? 1 : 3) && want("attn prefill"); i++)
		bench_attention(seqs[i], seqs[i] == 4096);
	/* decode: a small batch over a long context (split over the keys to
	 * fill the GPU) and a large batch over a short one */
	if (want("attn decode")) {
		bench_decode(1, 32768);
		bench_decode(8, 4096);
		if (!quick) {
			bench_decode(8, 32768);
			bench_decode(32, 4096);
		}
	}
	if (want("sample"))
		bench_sample();

	printf("\nrate: TFLOP/s of useful work, or GB/s of compulsory traffic; %%ceil: of the "
	       "ceiling above;\nspeedup: torch time / kk time (>1: kk faster).\n");
	kk_backend_free(be);
	return failed ? 1 : 0;
}
