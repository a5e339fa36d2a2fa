/* kernels/kk/cpu/cpu.h — shared helpers of the cpu backend: element load/store
 * for every float dtype, row conversion to f32 scratch, and a tiny
 * fork-join parallel-for over pthreads.
 *
 * The cpu backend is the reference and no-GPU path: buffers are host
 * memory, streams are no-ops (everything runs synchronously on the calling
 * thread plus helpers), and every op widens to f32 for arithmetic. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kk_convert.h"
#include "../kk_internal.h"

/* Work items (roughly: inner-loop element operations, ~0.5 ns each) below
 * which an op stays single-threaded.  Handing a job to spinning workers
 * costs ~1-2 us on an idle machine, but on an oversubscribed one a worker
 * may wait a scheduler slice for a core: stories260K's engine on the
 * loaded 2-core build machine served more tok/s with 1 << 16 than with
 * 1 << 13 (docs/kernels.md). */
#define KK_CPU_PAR_MIN_WORK (1u << 16)
/* Upper bound on threads, whatever is asked (KK_THREADS_MAX of kk.h). */
#define KK_CPU_THREADS_MAX KK_THREADS_MAX
/* Chunks per thread of a parallel loop: a worker the kernel schedules late
 * (a busy machine) then finds chunks left to take, and the caller waits for
 * at most the one chunk it is running instead of a whole share. */
#define KK_CPU_CHUNKS_PER_THREAD 4
#define KK_CPU_CHUNKS_MAX	 (KK_CPU_THREADS_MAX * KK_CPU_CHUNKS_PER_THREAD)
/* How long an idle pool worker spins for the next job before it sleeps on
 * a futex: a forward pass issues its ops well within this. */
#define KK_CPU_SPIN_NS 200000
/* How long the thread that published a job spins for the chunks workers
 * still run before it sleeps on a futex (cpu.c pool_wait).  As long as the
 * workers' spin: every chunk of a forward pass but the 32000-row
 * classifier's ends within it on an idle machine, so sleeping (and a
 * wake-up's latency) is left to the busy one it is for. */
#define KK_CPU_JOIN_SPIN_NS 200000

/* v rounded to dtype dt and widened back. */
static inline float kk__round(kk_dtype dt, float v)
{
	switch (dt) {
	case KK_BF16:
		return kk__b2f(kk__f2b(v));
	case KK_F16:
		return kk__h2f(kk__f2h(v));
	default:
		return v;
	}
}

/* Element i of buffer b as f32 / store f32 into it. */
#define LD(b, i)    kk__ld((b)->ptr, (b)->dtype, (i))
#define ST(b, i, v) kk__st((b)->ptr, (b)->dtype, (i), (v))

/* Vectorized inner loops (simd.c, one clone per x86-64 level). */
float kk__dot(const float *a, const float *b, size_t n);
/* kk__dot with b (a weight row) prefetched 8 KiB ahead: the one-row GEMV. */
float kk__dot_pf(const float *a, const float *b, size_t n);
/* s[r * 2 + c] = dot(x + r * ldx, w_c) for r < nx (1..4), c < 1 or 2
 * (w1 NULL: one weight row). */
void kk__gemv_tile(float s[8], const float *x, size_t ldx, int nx, const float *w0, const float *w1,
		   size_t n);
void kk__deq_i8(float *out, const int8_t *q, float s, size_t n);
void kk__deq_q4(float *out, const uint8_t *q, const float *scales, size_t n, size_t group);
void kk__axpy(float *y, float a, const float *x, size_t n); /* y += a x */
void kk__scal(float *y, float a, size_t n);
double kk__sum(const float *x, size_t n);
double kk__sumsq(const float *x, float mean, size_t n); /* sum (x - mean)^2 */
void kk__widen_bf16(float *dst, const uint16_t *src, size_t n);
/* The sampler's float64 sums (sample.c): e^((x[i] - shift) * scale) over
 * n floats (each exponent <= 0), every term within 1e-15 of exp()'s, terms
 * below e^-700 as 0; and the same with the terms stored in out[n] and
 * mass[k] = the part of the sum whose exponent is >= th[k]. */
#define KK__EXP_TH 8
double kk__exp_sum_d(const float *x, size_t n, double shift, double scale);
/* mass[k] = the sum of the e[i] whose exponent (x[i] - shift) * scale is
 * >= th[k] (e: kk__exp_sum_d_th's terms). */
void kk__mass_th(const double *e, const float *x, size_t n, double shift, double scale,
		 const double th[KK__EXP_TH], double mass[KK__EXP_TH]);
/* kk__exp_sum_d over the x[i] > cx, or x[i] == cx and i <= cid. */
double kk__exp_sum_d_kept(const float *x, size_t n, double shift, double scale, float cx,
			  int64_t cid);
/* The sum of the e[i] with x[i] > cx, or x[i] == cx and i <= cid. */
double kk__sum_kept(const double *e, const float *x, size_t n, float cx, int64_t cid);
double kk__exp_sum_d_th(double *out, const float *x, size_t n, double shift, double scale,
		      const double th[KK__EXP_TH], double mass[KK__EXP_TH]);
void kk__narrow_bf16(uint16_t *dst, const float *src, size_t n);
/* half.c: f16 row conversion and f32 x f16/bf16 dot products, written per
 * ISA level (avx512, f16c, portable) and dispatched at run time. */
void kk__half_widen_f16(float *dst, const uint16_t *src, size_t n);
void kk__half_narrow_f16(uint16_t *dst, const float *src, size_t n);
float kk__half_dot(kk_dtype dt, const float *x, const uint16_t *w, size_t n); /* f16 or bf16 w */
/* The variant in use; kk__half_force(name) picks another ("avx512bf16",
 * "avx512", "f16c", "portable"; NULL: the best this CPU has) for tests: -ENOENT for
 * an unknown name, -EOPNOTSUPP when the CPU lacks it. */
const char *kk__half_variant(void);
int kk__half_force(const char *name);
/* The multi-row product with f16/bf16 weights read in place:
 * c[i * ldc + j] = alpha * sum_l x[i * ldx + l] w[j * ldw + l]
 *                  (+ beta * c[i * ldc + j] when beta != 0)
 * for i < m and W rows j in [j0, j1), W converted in registers inside a
 * tile of X rows x W rows.  Each output is one sum in an order fixed by
 * the variant and k alone (not by j0, j1 or the tile it falls in). */
typedef struct kk__half_mm {
	const float *x; /* m rows of k f32, ldx apart */
	size_t ldx;
	const uint16_t *xh; /* NULL, or x as bf16 (same rows): avx512bf16 uses it */
	int64_t m;
	const uint16_t *w; /* f16/bf16 rows of k, ldw apart */
	const float *wf;   /* kk__half_gemm_f32: f32 rows of k, ldw apart (w unused) */
	size_t ldw, k;
	float alpha, beta;
	float *c;
	size_t ldc;
} kk__half_mm;
void kk__half_gemm(kk_dtype dt, const kk__half_mm *p, int64_t j0, int64_t j1); /* f16 or bf16 w */
/* The same product with f32 W (p->wf), in the same tiles, blocks and
 * order of sums as the variant's f16 product, W loaded as it is. */
void kk__half_gemm_f32(const kk__half_mm *p, int64_t j0, int64_t j1);
/* gemm.c: which path an f32 x W^T past the GEMV's rows takes: 0 the
 * measured choice (KK_CPU_F32MM_*), 1 kk__half_gemm_f32 always, -1 sgemm
 * always (tests and benchmarks compare the two); returns the previous. */
int kk__gemm_f32_route(int route);

/* simd.c defines the clones above and must not see them used first
 * (clang refuses to multiversion a function after a use). */
#ifndef KK__SIMD_IMPL
/* dst[0..n) = src (elements off..off+n of p) widened to f32. */
static inline void kk__row_f32(float *dst, const void *p, kk_dtype dt, size_t off, size_t n)
{
	switch (dt) {
	case KK_F32:
		memcpy(dst, (const float *) p + off, n * sizeof(float));
		break;
	case KK_BF16:
		kk__widen_bf16(dst, (const uint16_t *) p + off, n);
		break;
	default:
		kk__half_widen_f16(dst, (const uint16_t *) p + off, n);
		break;
	}
}

static inline void kk__row_store(void *p, kk_dtype dt, size_t off, const float *src, size_t n)
{
	switch (dt) {
	case KK_F32:
		memcpy((float *) p + off, src, n * sizeof(float));
		break;
	case KK_BF16:
		kk__narrow_bf16((uint16_t *) p + off, src, n);
		break;
	default:
		kk__half_narrow_f16((uint16_t *) p + off, src, n);
		break;
	}
}
#endif

/* Calls fn(ctx, begin, end, chunk) over [0, n) split into contiguous
 * chunks 0 .. kk__parallel_chunks(n, cost)-1 on the pool (the caller runs
 * chunks too) when the work (n * cost_per_item) is large enough, else one
 * chunk on the caller's thread.  Chunk i always covers the same range, so
 * per-chunk partial results can be combined in chunk order whatever thread
 * ran them.  Returns the first negative value fn returned, or 0 (when
 * workers cannot start, the caller runs their chunks). */
typedef int (*kk__range_fn)(void *ctx, int64_t begin, int64_t end, int chunk);
int kk__parallel_chunks(int64_t n, double cost_per_item);
int kk__parallel_for(int64_t n, double cost_per_item, kk__range_fn fn, void *ctx);
/* The same, but where it runs on the pool, in chunks of about chunk_work
 * (n * cost_per_item / chunk_work of them, never fewer than
 * kk__parallel_for's, at most n and KK_CPU_FINE_CHUNKS_MAX): for ops made of
 * a few dozen items of microseconds each (a prefill's products on small
 * matrices), where 4 chunks a thread can leave one thread idle while the
 * other runs its last chunk (an eighth of the op at 2 threads). */
#define KK_CPU_FINE_CHUNKS_MAX 4096
int kk__parallel_for_fine(int64_t n, double cost_per_item, double chunk_work, kk__range_fn fn,
			  void *ctx);
int kk__cpu_threads(void);
/* KK_CPU_THREADS, else the CPUs of the affinity mask / cgroup quota. */
int kk__cpu_default_threads(void);
/* CPUs the cgroup v2 cpu.max quotas allow ("QUOTA PERIOD", rounded up):
 * the tightest of the group named by proc_cgroup's "0::/group" line under
 * root and of its ancestors below root; 0 for no quota ("max"), cgroup v1,
 * or anything unreadable. */
int kk__cpu_cgroup_cpus(const char *proc_cgroup, const char *root);

static inline float kk__gelu(float x)
{
	const float c = 0.7978845608028654f; /* sqrt(2/pi) */
	return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static inline float kk__gelu_grad(float x)
{
	const float c = 0.7978845608028654f;
	float u = c * (x + 0.044715f * x * x * x);
	float t = tanhf(u);
	float du = c * (1.0f + 3.0f * 0.044715f * x * x);
	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

static inline float kk__silu(float x)
{
	return x / (1.0f + expf(-x));
}

static inline float kk__silu_grad(float x)
{
	float s = 1.0f / (1.0f + expf(-x));
	return s * (1.0f + x * (1.0f - s));
}

/* Widens elements [0, n) of b to a fresh f32 array in *ret (or points *ret
 * at b's own storage when it is f32); *owned is what the caller frees (NULL
 * when nothing was allocated).  -ENOMEM. */
int kk__widen(const kk_buffer *b, size_t n, float **ret, float **owned);

/* The ops, one per entry of kernels/kk/include/kk_ops.def, each in
 * kernels/kk/cpu/<family>.c (cpu.c puts them in the ops table). */
#define KK_OP(NAME, name, family, dtypes, params) int kk__cpu_##name params;
#define KK_SLOT(ret, name, family, params)	  ret kk__cpu_##name params;
#include "kk_ops.def"
/* The qmatrix_pack slot (quant.c): kk_qmatrix_pack on this backend. */
int kk__cpu_qpack(kk_backend *be, kk_qmatrix *q);

/* Training-step loops (simd.c; issue 15).  kk__max: the largest of x[0..n)
 * (-inf for n = 0).  kk__exp_sum: x[i] = exp(x[i] - sub), returns the sum
 * (a 16-lane exp within 2 ulp of expf; exp(-inf) = 0).  kk__swiglu_f32 /
 * kk__swiglu_bwd_f32: SwiGLU forward and backward on f32 arrays (in place
 * allowed). */
float kk__max(const float *x, size_t n);
float kk__exp_sum(float *x, float sub, size_t n);
void kk__swiglu_f32(float *y, const float *g, const float *u, size_t n);
void kk__swiglu_bwd_f32(float *dg, float *du, const float *dy, const float *g, const float *u,
			size_t n);
/* AdamW on f32 master weights, moments and gradients: k = { grad_scale,
 * beta1, beta2, lr, 1 - beta1^step, 1 - beta2^step, eps, weight_decay }. */
void kk__adamw_f32(float *w, float *m, float *v, const float *g, size_t n, const float k[8]);
/* One f32 RMSNorm backward row: dw += dy (h rstd) (dw may be NULL), dx =
 * rstd (dy w - h rstd^2 mean(dy w h)) (+ dres unless NULL). */
void kk__rms_bwd_row(float *dx, float *dw, const float *dy, const float *h, const float *w,
		     const float *dres, float rstd, size_t n);
/* Attention backward's dS row: dp[i] = p[i] (dp[i] - di) scale. */
void kk__attn_ds(float *dp, const float *p, float di, float scale, size_t n);
/* Paged decode's block loops: s[j] = dot(q, k[j][0..n)) * scale, and
 * y[0..n) += sum_j p[j] v[j][0..n), for j < nt. */
void kk__dot_rows(float *s, const float *q, const float *const *k, int nt, size_t n, float scale);
void kk__axpy_rows(float *y, const float *p, const float *const *v, int nt, size_t n);
/* ---- int8 dot products of the quantized product (qdot.c) ---------------- */

/* Activations are quantized in blocks of this many elements (llama.cpp's
 * Q8_0 block: one f32 scale per 32 int8 values). */
#define KK_QBLOCK 32

/* m activation rows of k elements quantized per block: row r's block b is
 * q[r * ldq + b * 32 ..] (zero past k) with scale d[r * nb + b].  For int4
 * weights the codes of blocks 2p, 2p+1 are laid out as the 32 bytes of the
 * two blocks' weights unpack: their 64 bytes hold block 2p's even
 * elements, 2p+1's even ones, 2p's odd ones, 2p+1's odd ones (a lone last
 * block: its even, then its odd elements; kk__qact_q4_off); then
 * corr[(r * nb + 2p) * 8 + l] = -8 * (the codes a product's lane l sums),
 * what takes int4's offset 8 off u8 x s8 products, and dx[(r * nb + b) * 4
 * + i] = d (four copies: lanes 0-3 of a pair's product are block 2p's,
 * 4-7 block 2p+1's).  For int8 weights dx[(r * nb + b) * 8 + i] = d (a
 * block's product fills all 8 lanes). */
typedef struct kk__qact {
	int64_t m, k, nb, ldq;
	int8_t *q;
	float *d;
	int32_t *corr;
	float *dx;
	/* packed weights: -xoff * (the sum of block b's codes) at xs[r * nb +
	 * b], xoff the weight codes' offset (128 int8, 8 int4: the u8 x s8
	 * product's correction) */
	int32_t *xs;
	int32_t xoff;
} kk__qact;

/* Where element e (0..31) of block b sits in an int4-ordered row. */
int kk__qact_q4_off(int64_t nb, int64_t b, int e);

/* Allocates a for m x k; -ENOMEM.  kk__qact_free accepts a failed init. */
int kk__qact_init(kk__qact *a, int64_t m, int64_t k);
void kk__qact_free(kk__qact *a);
/* Quantizes row r from x[k]; q4: each block's even elements first, then
 * its odd ones (the order an int4 row's nibbles unpack in). */
void kk__qact_quantize(kk__qact *a, int64_t r, const float *x, bool q4);

/* Quantizes row r from x[k] (k a multiple of 32) for packed weights:
 * the codes in their own order, and xs. */
void kk__qact_quantize_p(kk__qact *a, int64_t r, const float *x);

/* s[r * 2 + c] = sum over blocks b of xd[r][b] * ws[c][b] * (integer dot of
 * block b of activation row r0 + r and weight row w[c]), r < nx (1..4),
 * c < nw (1..2); ws[c] holds one f32 scale per 32-block of its row, or is
 * NULL for all ones (int8 per channel: the caller scales the sum; then
 * every ws[c] is NULL). */
typedef void (*kk__qtile_fn)(float s[8], const kk__qact *a, int64_t r0, int nx,
			     const void *const *w, const float *const *ws, int nw, int64_t k);
/* Packed weights (kk_qmatrix_pack, KK_QPACK rows interleaved; the layout
 * is quant.c's, above kk__cpu_qpack): s[r * 8 + i] = sum over blocks b of
 * xd[r][b] * ws_i[b] * (integer dot of block b of activation row r0 + r,
 * r < nx (1..the variant's pnx), and row i of the group at w), for the nb blocks of a row.
 * ws: the group's interleaved scales (scale group s of row i at
 * ws[s * 8 + i], block b in group b >> sshift), sdt KK_QS_F32 / KK_QS_F16,
 * or KK_QS_NONE (per channel: all ones). */
enum { KK_QS_NONE, KK_QS_F32, KK_QS_F16 };
/* How far ahead (bytes) a packed tile prefetches its weight stream: s110m
 * decode per CPU second, interleaved runs, q4_0 240-260 tok/s at 2 KiB,
 * 255-285 at 4, 285-315 at 8, 275-330 at 16 (q8_0 180-195 / 185-200 /
 * 200-220 / 135-207). */
#define KK_QPF 8192
/* The most activation rows of a packed tile (a variant's pnx). */
#define KK_QPTILE_MAX 8
typedef void (*kk__qptile_fn)(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx,
			      const uint8_t *w, const void *ws, int sdt, int sshift, int64_t nb);
typedef struct kk__qdot_impl {
	const char *name; /* "vnni", "avx2", "scalar" */
	kk__qtile_fn i8;  /* int8 weight rows */
	kk__qtile_fn q4;  /* int4 weight rows (kk_qmatrix layout) */
	kk__qptile_fn p8; /* packed int8 groups */
	kk__qptile_fn p4; /* packed int4 groups */
	/* kk__qact_quantize_p, vectorized where the variant is */
	void (*qact_p)(kk__qact *a, int64_t r, const float *x);
	int pnx; /* activation rows per packed tile, <= KK_QPTILE_MAX */
} kk__qdot_impl;

/* The variant in use: $KK_CPU_QDOT if it names one this CPU runs, else the
 * best the CPU runs. */
const kk__qdot_impl *kk__qdot(void);
/* Test hook: use variant `name` from now on (NULL: back to the automatic
 * choice).  -EINVAL: not a variant of this build; -EOPNOTSUPP: this CPU
 * cannot run it. */
int kk__qdot_force(const char *name);
/* The variants of this build, best first, NULL-terminated. */
const char *const *kk__qdot_names(void);
