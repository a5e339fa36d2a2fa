/* kernels/kk/cpu/simd.c — the cpu backend's inner loops: dot/axpy/sums, the
 * int8/int4 dot products of the quantized GEMV, and bf16/f16 <-> f32 row
 * conversion.
 *
 * Each is compiled several times (target_clones: x86-64-v4 = AVX-512,
 * x86-64-v3 = AVX2+FMA+F16C, baseline) and the loader picks the best for
 * the CPU it runs on, so one binary is both portable and fast.  The loops
 * carry `omp simd` reductions (built with -fopenmp-simd; no OpenMP runtime)
 * so the compiler may reorder the float sums into vector lanes: results
 * differ from a sequential sum only by rounding. */
#define KK__SIMD_IMPL
#include "cpu.h"

/* clang (14) names the dispatcher "f.ifunc", which callers in other files
 * cannot see: clang builds get the baseline loop only. */
#if defined(__x86_64__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

CLONES float kk__dot(const float *a, const float *b, size_t n)
{
	float s = 0;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

CLONES void kk__axpy(float *y, float a, const float *x, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

CLONES void kk__scal(float *y, float a, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++)
		y[i] *= a;
}

CLONES double kk__sum(const float *x, size_t n)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += x[i];
	return s;
}

CLONES double kk__sumsq(const float *x, float mean, size_t n)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += (double) (x[i] - mean) * (x[i] - mean);
	return s;
}

/* The quantized dot products are written with GNU vector types of 16
 * lanes (one AVX-512 register; two AVX2 ones, four SSE ones: each clone
 * lowers them to its own width) instead of `omp simd`: the compiler's own
 * vectorization of the int8/int4 widening left the Q4 row at 2.7 G
 * weights/s.  The loops keep several accumulators and sum them once at the
 * end, in a fixed order (results do not depend on threads). */
/* The helpers below are always inlined, so no vector crosses a call: the
 * AVX-512 calling convention gcc warns about does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int8_t v16s8 __attribute__((vector_size(16)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));

/* Sums the lanes of *v (by pointer: a vector argument draws gcc's note on
 * the AVX-512 calling convention). */
static inline __attribute__((always_inline)) float hsum16(const v16f *v)
{
	float s = 0;
	for (int i = 0; i < 16; i++)
		s += (*v)[i];
	return s;
}

static inline __attribute__((always_inline)) v16f ld16f(const float *p)
{
	v16f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* The GEMV's register tile: up to 4 x rows against 1 or 2 weight rows,
 * one 16-lane accumulator per (x row, w row) pair, so a pass loads each w
 * and x vector once for up to 8 products.  Every accumulator sees the same
 * sequence of operations whatever the tile's shape, so s[r][c] does not
 * depend on which rows shared a tile (nor, then, on the thread split). */
/* The tile's weight rows are prefetched this many floats (8 KiB) ahead.
 * Each W row is a short stream (3 KiB at k = 768) the hardware prefetcher
 * restarts on, and the tile does more work per W byte than kk__dot, so W
 * came in at a third of the bandwidth m = 1 reaches: 8 x rows against the
 * 110M classifier (32000 x 768, from memory) ran at 41 GFLOP/s per CPU
 * second; 1, 2, 4, 8 KiB ahead gave 61, 52, 61, 95 (12 KiB: 93-97). */
#define GEMV_PF_FLOATS 2048
static inline __attribute__((always_inline)) void gemv_tile(float *s, const float *x, size_t ldx,
							    const int nx, const float *w0,
							    const float *w1, const int nw, size_t n)
{
	const float *w[2] = { w0, w1 };
	v16f a[4][2] = {};
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		v16f wv[2];
		for (int c = 0; c < nw; c++) {
			__builtin_prefetch(w[c] + i + GEMV_PF_FLOATS);
			wv[c] = ld16f(w[c] + i);
		}
		for (int r = 0; r < nx; r++) {
			v16f xv = ld16f(x + r * ldx + i);
			for (int c = 0; c < nw; c++)
				a[r][c] += xv * wv[c];
		}
	}
	for (int r = 0; r < nx; r++)
		for (int c = 0; c < nw; c++) {
			float t = hsum16(&a[r][c]);
			for (size_t l = i; l < n; l++)
				t += x[r * ldx + l] * w[c][l];
			s[r * 2 + c] = t;
		}
}

CLONES void kk__gemv_tile(float s[8], const float *x, size_t ldx, int nx, const float *w0,
			  const float *w1, size_t n)
{
	/* One inlined copy of gemv_tile per shape: nx (1..4) and the W rows
	 * (1 or 2) are constants in each. */
#define GEMV_SHAPE(NX) \
	(w1 ? gemv_tile(s, x, ldx, NX, w0, w1, 2, n) : gemv_tile(s, x, ldx, NX, w0, w1, 1, n))
	nx <= 1 ? GEMV_SHAPE(1) : nx == 2 ? GEMV_SHAPE(2) : nx == 3 ? GEMV_SHAPE(3) : GEMV_SHAPE(4);
#undef GEMV_SHAPE
}

/* kk__dot for the one-row GEMV of single-stream decode: b, a weight row,
 * is prefetched GEMV_PF_FLOATS (8 KiB) ahead, into the rows after it (a
 * linear layer's rows follow each other), and four accumulators keep the
 * FMAs independent.  110M f32 decode, 1 thread, six interleaved pairs of
 * runs, per CPU second: 61.5-71.7 -> 65.6-82.8 tok/s (means 66.8 -> 75.7),
 * every pair faster. */
CLONES float kk__dot_pf(const float *a, const float *b, size_t n)
{
	v16f s0 = {}, s1 = {}, s2 = {}, s3 = {};
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		__builtin_prefetch(b + i + GEMV_PF_FLOATS);
		__builtin_prefetch(b + i + GEMV_PF_FLOATS + 16);
		__builtin_prefetch(b + i + GEMV_PF_FLOATS + 32);
		__builtin_prefetch(b + i + GEMV_PF_FLOATS + 48);
		s0 += ld16f(a + i) * ld16f(b + i);
		s1 += ld16f(a + i + 16) * ld16f(b + i + 16);
		s2 += ld16f(a + i + 32) * ld16f(b + i + 32);
		s3 += ld16f(a + i + 48) * ld16f(b + i + 48);
	}
	for (; i + 16 <= n; i += 16)
		s0 += ld16f(a + i) * ld16f(b + i);
	s0 += s1 + s2 + s3;
	float s = hsum16(&s0);
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* int8 lanes widen as unsigned bytes (b ^ 0x80) - 128: gcc 12 turns a
 * signed byte vector conversion into scalar code, an unsigned one into
 * vpmovzxbd. */
static inline __attribute__((always_inline)) v16f i8x16_f(const int8_t *q)
{
	const v16i off = { 128, 128, 128, 128, 128, 128, 128, 128,
			   128, 128, 128, 128, 128, 128, 128, 128 };
	v16u8 b;
	memcpy(&b, q, 16);
	return __builtin_convertvector(__builtin_convertvector(b ^ 0x80, v16i) - off, v16f);
}

/* out[0..n) = q * s: one int8 row of per-channel scale s. */
CLONES void kk__deq_i8(float *out, const int8_t *q, float s, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		v16f v = i8x16_f(q + i) * s;
		memcpy(out + i, &v, sizeof(v));
	}
	for (; i < n; i++)
		out[i] = q[i] * s;
}

/* out[0..n) = (nibble - 8) * scales[j / group]: one int4 row (n and group
 * multiples of 32), 16 bytes per step, unpacked to even/odd elements. */
CLONES void kk__deq_q4(float *out, const uint8_t *q, const float *scales, size_t n, size_t group)
{
	const v16i eight = { 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8 };
	for (size_t p = 0; p < n / 2; p += 16) {
		v16u8 b;
		memcpy(&b, q + p, 16);
		float s = scales[2 * p / group];
		v16f lo = __builtin_convertvector(__builtin_convertvector(b & 15, v16i) - eight,
						  v16f) *
			  s;
		v16f hi = __builtin_convertvector(__builtin_convertvector(b >> 4, v16i) - eight,
						  v16f) *
			  s;
		for (int l = 0; l < 16; l++) {
			out[2 * (p + l)] = lo[l];
			out[2 * (p + l) + 1] = hi[l];
		}
	}
}

CLONES void kk__widen_bf16(float *dst, const uint16_t *src, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t) src[i] << 16;
		memcpy(&dst[i], &u, 4);
	}
}

CLONES void kk__narrow_bf16(uint16_t *dst, const float *src, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &src[i], 4);
		/* NaN stays a quiet NaN; everything else rounds to nearest even. */
		dst[i] = (u & 0x7fffffffu) > 0x7f800000u
				 ? (uint16_t) ((u >> 16) | 0x40)
				 : (uint16_t) ((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
	}
}

/* ---- exp and the training ops' loops (issue 15: kiln-train's step) ----
 *
 * exp16 is exp on 16 lanes (Cephes' expf: x = n ln2 + r with |r| <=
 * ln2 / 2 and a degree-6 polynomial for e^r, then 2^n from the exponent
 * bits): within 2 ulp of expf over the range where the result is a normal
 * float, 0 below -87.5 (so exp(-inf) = 0: masked scores), 88 clamps
 * larger arguments (e^88 = 1.7e38), NaN stays NaN.  It replaces libm's
 * scalar expf in softmax-like loops, where the call was the cost. */
/* Lanes of a where the mask m is set, else of b (C has no vector ?:). */
#define sel16(m, a, b) ((v16f) (((m) & (v16i) (a)) | (~(m) & (v16i) (b))))

static inline __attribute__((always_inline)) v16f splat16(float f)
{
	v16f v = {};
	return v + f;
}

static inline __attribute__((always_inline)) v16f exp16(const v16f *xp)
{
	const float magic = 0x1.8p23f; /* adding it rounds to an integer */
	v16f x = *xp;
	v16i under = x < -87.5f;
	x = sel16(x > 88.0f, splat16(88.0f), x);
	x = sel16(x < -87.5f, splat16(-87.5f), x);
	v16f z = x * 1.44269504088896341f + magic;
	v16i n = (v16i) z - (v16i) splat16(magic);
	v16f nf = z - magic;
	v16f r = x - nf * 0.693359375f;
	r = r - nf * -2.12194440e-4f;
	v16f p = splat16(1.9875691500e-4f);
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	p *= (v16f) ((n + 127) << 23);
	return sel16(under, splat16(0), p);
}

/* The n < 16 elements at p as a vector, the rest of the lanes fill. */
static inline __attribute__((always_inline)) v16f ld16f_tail(const float *p, size_t n, float fill)
{
	v16f v = splat16(fill);
	memcpy(&v, p, n * sizeof(float));
	return v;
}

/* (GNU vectors: clang does not vectorize an `omp simd` max reduction.) */
CLONES float kk__max(const float *x, size_t n)
{
	v16f mv = splat16(-INFINITY);
	float m = -INFINITY;
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		v16f v = ld16f(x + i);
		mv = sel16(v > mv, v, mv);
	}
	for (int l = 0; l < 16; l++)
		m = mv[l] > m ? mv[l] : m;
	for (; i < n; i++)
		m = x[i] > m ? x[i] : m;
	return m;
}

/* x[i] = exp(x[i] - sub) for i < n; returns their sum (lane sums added in
 * a fixed order). */
CLONES float kk__exp_sum(float *x, float sub, size_t n)
{
	v16f acc = {};
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		v16f t = ld16f(x + i) - sub, e = exp16(&t);
		memcpy(x + i, &e, sizeof(e));
		acc += e;
	}
	if (i < n) {
		v16f t = ld16f_tail(x + i, n - i, -INFINITY) - sub, e = exp16(&t);
		memcpy(x + i, &e, (n - i) * sizeof(float));
		acc += e; /* the fill lanes are exp(-inf) = 0 */
	}
	return hsum16(&acc);
}

/* The paged decode attention's block loops (attention.c decode_range): a
 * cache block's scores and its P V update in one call each, where a call of
 * kk__dot / kk__axpy per cached token cost more than the work at small
 * head dims (stories260K's 8, stories15M's 48). */
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* Sum of 16 lanes as a tree (hsum16 adds them one by one: 15 dependent
 * adds, the cost of a score at small head dims). */
static inline __attribute__((always_inline)) float hsum16_tree(v16f v)
{
	v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
		__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
	v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) +
		__builtin_shufflevector(a, a, 4, 5, 6, 7);
	return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline __attribute__((always_inline)) v8f ld8f(const float *p)
{
	v8f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* Head dims that are multiples of 16, and 8, run whole vectors: one tree
 * sum per score, and P V's accumulator stays in a register across the
 * block's tokens; other dims take the plain loops. */
CLONES void kk__dot_rows(float *s, const float *q, const float *const *k, int nt, size_t n,
			 float scale)
{
	if (n % 16 == 0) {
		for (int j = 0; j < nt; j++) {
			v16f acc = {};
			for (size_t i = 0; i < n; i += 16)
				acc += ld16f(q + i) * ld16f(k[j] + i);
			s[j] = hsum16_tree(acc) * scale;
		}
		return;
	}
	if (n == 8) {
		v8f qv = ld8f(q);
		for (int j = 0; j < nt; j++) {
			v8f p = qv * ld8f(k[j]);
			v4f b = __builtin_shufflevector(p, p, 0, 1, 2, 3) +
				__builtin_shufflevector(p, p, 4, 5, 6, 7);
			s[j] = ((b[0] + b[2]) + (b[1] + b[3])) * scale;
		}
		return;
	}
	for (int j = 0; j < nt; j++) {
		const float *kj = k[j];
		float t = 0;
#pragma omp simd reduction(+ : t)
		for (size_t i = 0; i < n; i++)
			t += q[i] * kj[i];
		s[j] = t * scale;
	}
}

CLONES void kk__axpy_rows(float *y, const float *p, const float *const *v, int nt, size_t n)
{
	if (n % 16 == 0) {
		for (size_t i = 0; i < n; i += 16) {
			v16f acc = ld16f(y + i);
			for (int j = 0; j < nt; j++)
				acc += p[j] * ld16f(v[j] + i);
			memcpy(y + i, &acc, sizeof(acc));
		}
		return;
	}
	if (n == 8) {
		v8f acc = ld8f(y);
		for (int j = 0; j < nt; j++)
			acc += p[j] * ld8f(v[j]);
		memcpy(y, &acc, sizeof(acc));
		return;
	}
	for (int j = 0; j < nt; j++) {
		const float *vj = v[j];
		float pj = p[j];
#pragma omp simd
		for (size_t i = 0; i < n; i++)
			y[i] += pj * vj[i];
	}
}

/* y = silu(g) * u = g u / (1 + e^-g). */
static inline __attribute__((always_inline)) void swiglu16(float *y, const float *g, const float *u,
							   size_t n)
{
	v16f gv = ld16f_tail(g, n, 0), uv = ld16f_tail(u, n, 0), ng = -gv;
	v16f v = gv * uv / (1.0f + exp16(&ng));
	memcpy(y, &v, n * sizeof(float));
}

CLONES void kk__swiglu_f32(float *y, const float *g, const float *u, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		swiglu16(y + i, g + i, u + i, 16);
	if (i < n)
		swiglu16(y + i, g + i, u + i, n - i);
}

/* With s = sigmoid(g): dg = dy u s (1 + g (1 - s)), du = dy g s.  Every
 * input lane is read before any output is written (in place is fine). */
static inline __attribute__((always_inline)) void
swiglu_bwd16(float *dg, float *du, const float *dy, const float *g, const float *u, size_t n)
{
	v16f gv = ld16f_tail(g, n, 0), uv = ld16f_tail(u, n, 0), dyv = ld16f_tail(dy, n, 0);
	v16f ng = -gv, s = 1.0f / (1.0f + exp16(&ng));
	v16f a = dyv * uv * s * (1.0f + gv * (1.0f - s)), b = dyv * gv * s;
	memcpy(dg, &a, n * sizeof(float));
	memcpy(du, &b, n * sizeof(float));
}

CLONES void kk__swiglu_bwd_f32(float *dg, float *du, const float *dy, const float *g,
			       const float *u, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		swiglu_bwd16(dg + i, du + i, dy + i, g + i, u + i, 16);
	if (i < n)
		swiglu_bwd16(dg + i, du + i, dy + i, g + i, u + i, n - i);
}

/* One AdamW step on f32 arrays (kk_adamw's formula; k: grad_scale, beta1,
 * beta2, lr, 1 - beta1^t, 1 - beta2^t, eps, weight_decay).  Vectorized
 * because simd.o is built with -fno-math-errno: sqrtf may not set errno, so
 * it becomes one vector instruction instead of a libm call per element. */
CLONES void kk__adamw_f32(float *w, float *m, float *v, const float *g, size_t n, const float k[8])
{
	const float gs = k[0], b1 = k[1], b2 = k[2], lr = k[3], bc1 = k[4], bc2 = k[5], eps = k[6],
		    wd = k[7];
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		float gi = g[i] * gs;
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
		m[i] = mi;
		v[i] = vi;
		w[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * w[i]);
	}
}

/* One RMSNorm backward row on f32 (xhat = h rstd, g = dy w):
 * dw += dy xhat (dw may be NULL); dx = rstd (g - xhat mean(g xhat)) (+ dres
 * when not NULL).  Elementwise, so dx may be any of the inputs. */
CLONES void kk__rms_bwd_row(float *dx, float *dw, const float *dy, const float *h, const float *w,
			    const float *dres, float rstd, size_t n)
{
	float s = 0, k;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += dy[i] * w[i] * h[i];
	if (dw) {
#pragma omp simd
		for (size_t i = 0; i < n; i++)
			dw[i] += dy[i] * (h[i] * rstd);
	}
	k = s * rstd * rstd / (float) n;
	if (dres) {
#pragma omp simd
		for (size_t i = 0; i < n; i++)
			dx[i] = rstd * (dy[i] * w[i] - h[i] * k) + dres[i];
	} else {
#pragma omp simd
		for (size_t i = 0; i < n; i++)
			dx[i] = rstd * (dy[i] * w[i] - h[i] * k);
	}
}

/* Attention backward's dS row: dp[i] = p[i] (dp[i] - di) scale. */
CLONES void kk__attn_ds(float *dp, const float *p, float di, float scale, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++)
		dp[i] = p[i] * (dp[i] - di) * scale;
}

/* ---- the sampler's float64 exp sums (sample.c) --------------------------- */

/* e^a for a <= 0, to within 1e-15 of it (Cody-Waite reduction by ln 2, a
 * degree-13 Taylor polynomial on |r| <= ln 2 / 2, the power of two built in
 * the exponent bits); a below -700 (e^a < 1e-304) gives 0.  No libm call,
 * so the loops below vectorize; sample.c's error bound (exp_sum_slack)
 * rests on the 1e-15. */
static inline double exp_neg(double a)
{
	const double lo = -700.0, c = a < lo ? lo : a;
	const double t = c * 1.4426950408889634 + 0x1.8p52, k = t - 0x1.8p52;
	const double r = (c - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
	double p = 1.0 / 6227020800.0; /* 1/13! */
	p = p * r + 1.0 / 479001600.0;
	p = p * r + 1.0 / 39916800.0;
	p = p * r + 1.0 / 3628800.0;
	p = p * r + 1.0 / 362880.0;
	p = p * r + 1.0 / 40320.0;
	p = p * r + 1.0 / 5040.0;
	p = p * r + 1.0 / 720.0;
	p = p * r + 1.0 / 120.0;
	p = p * r + 1.0 / 24.0;
	p = p * r + 1.0 / 6.0;
	p = p * r + 0.5;
	p = p * r + 1.0;
	p = p * r + 1.0;
	int64_t bits;
	double s;
	memcpy(&bits, &t, sizeof(bits));
	bits = (bits - INT64_C(0x4338000000000000) + 1023) << 52;
	memcpy(&s, &bits, sizeof(s));
	return a < lo ? 0.0 : p * s;
}

CLONES double kk__exp_sum_d(const float *x, size_t n, double shift, double scale)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += exp_neg(((double) x[i] - shift) * scale);
	return s;
}

CLONES double kk__exp_sum_d_th(double *out, const float *x, size_t n, double shift, double scale,
			       const double th[KK__EXP_TH], double mass[KK__EXP_TH])
{
	double s = 0, m0 = 0, m1 = 0, m2 = 0, m3 = 0, m4 = 0, m5 = 0, m6 = 0, m7 = 0;
	const double t0 = th[0], t1 = th[1], t2 = th[2], t3 = th[3], t4 = th[4], t5 = th[5],
		     t6 = th[6], t7 = th[7];
#pragma omp simd reduction(+ : s, m0, m1, m2, m3, m4, m5, m6, m7)
	for (size_t i = 0; i < n; i++) {
		const double a = ((double) x[i] - shift) * scale, e = exp_neg(a);
		out[i] = e;
		s += e;
		m0 += a >= t0 ? e : 0;
		m1 += a >= t1 ? e : 0;
		m2 += a >= t2 ? e : 0;
		m3 += a >= t3 ? e : 0;
		m4 += a >= t4 ? e : 0;
		m5 += a >= t5 ? e : 0;
		m6 += a >= t6 ? e : 0;
		m7 += a >= t7 ? e : 0;
	}
	mass[0] = m0, mass[1] = m1, mass[2] = m2, mass[3] = m3;
	mass[4] = m4, mass[5] = m5, mass[6] = m6, mass[7] = m7;
	return s;
}

CLONES double kk__sum_kept(const double *e, const float *x, size_t n, float cx, int64_t cid)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++) {
		const bool in = x[i] > cx || (x[i] == cx && (int64_t) i <= cid);
		s += in ? e[i] : 0;
	}
	return s;
}

CLONES void kk__mass_th(const double *e, const float *x, size_t n, double shift, double scale,
			const double th[KK__EXP_TH], double mass[KK__EXP_TH])
{
	double m0 = 0, m1 = 0, m2 = 0, m3 = 0, m4 = 0, m5 = 0, m6 = 0, m7 = 0;
	const double t0 = th[0], t1 = th[1], t2 = th[2], t3 = th[3], t4 = th[4], t5 = th[5],
		     t6 = th[6], t7 = th[7];
#pragma omp simd reduction(+ : m0, m1, m2, m3, m4, m5, m6, m7)
	for (size_t i = 0; i < n; i++) {
		const double a = ((double) x[i] - shift) * scale, v = e[i];
		m0 += a >= t0 ? v : 0;
		m1 += a >= t1 ? v : 0;
		m2 += a >= t2 ? v : 0;
		m3 += a >= t3 ? v : 0;
		m4 += a >= t4 ? v : 0;
		m5 += a >= t5 ? v : 0;
		m6 += a >= t6 ? v : 0;
		m7 += a >= t7 ? v : 0;
	}
	mass[0] = m0, mass[1] = m1, mass[2] = m2, mass[3] = m3;
	mass[4] = m4, mass[5] = m5, mass[6] = m6, mass[7] = m7;
}

CLONES double kk__exp_sum_d_kept(const float *x, size_t n, double shift, double scale, float cx,
				 int64_t cid)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++) {
		const bool in = x[i] > cx || (x[i] == cx && (int64_t) i <= cid);
		const double e = exp_neg(((double) x[i] - shift) * scale);
		s += in ? e : 0;
	}
	return s;
}
