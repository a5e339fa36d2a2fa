/* kernels/kk/cpu/qdot.c — integer dot products of the quantized product
 * (kk_qgemm): activations quantized per 32-element block to int8 with an
 * f32 scale (llama.cpp's Q8_0 scheme), multiplied against int8 or int4
 * weight rows in integer arithmetic, one float multiply-add per block.
 *
 * Why: widening every weight to f32 (the earlier dot products) cost more
 * than reading it; an int8 x int8 block of 32 is one vpdpbusd (VNNI) or a
 * maddubs + madd pair (AVX2).  Three variants, chosen once at run time by
 * what the CPU has (KK_CPU_QDOT=vnni|avx2|scalar asks for one; a name the
 * CPU cannot run is ignored): AVX-512 VNNI on 256-bit registers (Zen 4
 * and Ice Lake run them at full rate without AVX-512's clock penalty),
 * AVX2, and a portable scalar loop.  The integer block sums are exact in
 * every variant; only the order of the float accumulation differs. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ---- activations -------------------------------------------------------- */

int kk__qact_init(kk__qact *a, int64_t m, int64_t k)
{
	a->m = m;
	a->k = k;
	a->nb = (k + KK_QBLOCK - 1) / KK_QBLOCK;
	a->ldq = a->nb * KK_QBLOCK;
	/* 64-byte aligned: the 32-byte loads never straddle a cache line.
	 * (aligned_alloc wants a size that is a multiple of the alignment.) */
	size_t nq = (size_t) (m * a->ldq), nblk = (size_t) (m * a->nb);
	a->q = aligned_alloc(64, (nq + 63) & ~(size_t) 63);
	a->d = malloc(nblk * sizeof(float));
	a->corr = aligned_alloc(64, (nblk * 8 * sizeof(int32_t) + 63) & ~(size_t) 63);
	a->dx = aligned_alloc(64, (nblk * 8 * sizeof(float) + 63) & ~(size_t) 63);
	a->xs = malloc(nblk * sizeof(int32_t));
	a->xoff = 0;
	if (!a->q || !a->d || !a->corr || !a->dx || !a->xs) {
		kk__qact_free(a);
		return -ENOMEM;
	}
	return 0;
}

void kk__qact_free(kk__qact *a)
{
	free(a->q);
	free(a->d);
	free(a->corr);
	free(a->dx);
	free(a->xs);
	a->xs = NULL;
	a->q = NULL;
	a->d = NULL;
	a->corr = NULL;
	a->dx = NULL;
}

int kk__qact_q4_off(int64_t nb, int64_t b, int e)
{
	if ((b | 1) < nb) /* one of a pair */
		return (int) ((b & ~(int64_t) 1) * KK_QBLOCK + (e & 1) * KK_QBLOCK +
			      (b & 1) * (KK_QBLOCK / 2) + e / 2);
	return (int) (b * KK_QBLOCK + (e & 1) * (KK_QBLOCK / 2) + e / 2);
}

/* Row r of x (k floats) into blocks of 32: d = max|x_block| / 127,
 * q = round(x / d) in -127..127 (0 past k).  q4 lays the codes out in the
 * order an int4 row's bytes unpack (kk__qact_q4_off) and adds the
 * offset-8 lane sums (corr) and the pairs' spread scales (dx). */
/* max |x[0..n)| (a plain comparison: fmaxf is a libm call here). */
static inline float absmax(const float *x, int64_t n)
{
	float m = 0;
	for (int64_t j = 0; j < n; j++) {
		float v = fabsf(x[j]);
		m = v > m ? v : m;
	}
	return m;
}

void kk__qact_quantize(kk__qact *a, int64_t r, const float *x, bool q4)
{
	int8_t *q = a->q + r * a->ldq;
	float *d = a->d + r * a->nb;
	if (q4) {
		/* k is a multiple of 32 for int4 (its groups are). */
		for (int64_t b = 0; b < a->nb; b++) {
			const float *xb = x + b * KK_QBLOCK;
			float amax = absmax(xb, KK_QBLOCK), inv;
			d[b] = amax / 127.0f;
			inv = amax > 0 ? 127.0f / amax : 0.0f;
			/* Even elements, then odd ones, at this block's places
			 * (kk__qact_q4_off: 16 apart, or 32 within a pair). */
			int8_t *qe = q + kk__qact_q4_off(a->nb, b, 0),
			       *qo = q + kk__qact_q4_off(a->nb, b, 1);
			for (int j = 0; j < KK_QBLOCK / 2; j++) {
				qe[j] = (int8_t) rintf(xb[2 * j] * inv);
				qo[j] = (int8_t) rintf(xb[2 * j + 1] * inv);
			}
			for (int l = 0; l < 4; l++)
				a->dx[(r * a->nb + b) * 4 + l] = d[b];
		}
		/* Lane l of a pair's product sums bytes 4l..4l+3 of its two
		 * 32-byte halves (low nibbles x the first, high x the second);
		 * a lone last block's, bytes 4l..4l+3 of its 32. */
		for (int64_t b = 0; b < a->nb; b += 2) {
			const int8_t *c = q + b * KK_QBLOCK;
			int32_t *corr = a->corr + (r * a->nb + b) * 8;
			bool pair = b + 1 < a->nb;
			for (int l = 0; l < 8; l++) {
				int32_t s = 0;
				for (int i = 0; i < 4; i++)
					s += c[4 * l + i] + (pair ? c[KK_QBLOCK + 4 * l + i] : 0);
				corr[l] = -8 * s;
			}
		}
		return;
	}
	for (int64_t b = 0; b < a->nb; b++) {
		int64_t j0 = b * KK_QBLOCK, n = MIN(a->k - j0, (int64_t) KK_QBLOCK);
		const float *xb = x + j0;
		float amax = absmax(xb, n), inv;
		d[b] = amax / 127.0f;
		for (int l = 0; l < 8; l++)
			a->dx[(r * a->nb + b) * 8 + l] = d[b];
		inv = amax > 0 ? 127.0f / amax : 0.0f;
		int8_t *qb = q + j0;
		for (int64_t j = 0; j < n; j++)
			qb[j] = (int8_t) rintf(xb[j] * inv);
		for (int64_t j = n; j < KK_QBLOCK; j++)
			qb[j] = 0;
	}
}

void kk__qact_quantize_p(kk__qact *a, int64_t r, const float *x)
{
	int8_t *q = a->q + r * a->ldq;
	float *d = a->d + r * a->nb;
	int32_t *xs = a->xs + r * a->nb;
	for (int64_t b = 0; b < a->nb; b++) {
		const float *xb = x + b * KK_QBLOCK;
		float amax = absmax(xb, KK_QBLOCK);
		float inv = amax > 0 ? 127.0f / amax : 0.0f;
		int8_t *qb = q + b * KK_QBLOCK;
		int32_t sum = 0;
		d[b] = amax / 127.0f;
		for (int j = 0; j < KK_QBLOCK; j++) {
			qb[j] = (int8_t) rintf(xb[j] * inv);
			sum += qb[j];
		}
		xs[b] = -a->xoff * sum;
	}
}

/* The partial last block of an int8 row (k not a multiple of 32): exact
 * integer sum, the same in every variant.  0 for k % 32 == 0 (always so
 * for int4: its groups are 32, 64 or 128). */
static inline float kk__qtail(const kk__qact *a, int64_t r, const int8_t *w, const float *ws,
			      int64_t k)
{
	int64_t b = k / KK_QBLOCK, j0 = b * KK_QBLOCK;
	if (j0 == k)
		return 0.0f;
	const int8_t *xq = a->q + r * a->ldq + j0;
	int32_t s = 0;
	for (int64_t j = 0; j < k - j0; j++)
		s += (int32_t) w[j0 + j] * xq[j];
	return (float) s * (ws ? a->d[r * a->nb + b] * ws[b] : a->d[r * a->nb + b]);
}

/* ---- the portable variant ----------------------------------------------- */

static void tile_scalar(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			const float *const *ws, int nw, int64_t k, bool q4)
{
	const int64_t nbf = k / KK_QBLOCK;
	for (int r = 0; r < nx; r++)
		for (int c = 0; c < nw; c++) {
			const int8_t *xq = a->q + (r0 + r) * a->ldq;
			const float *xd = a->d + (r0 + r) * a->nb;
			float acc = 0;
			for (int64_t b = 0; b < nbf; b++) {
				const int8_t *xb = xq + b * KK_QBLOCK;
				int32_t t = 0;
				if (q4) {
					const uint8_t *p =
						(const uint8_t *) w[c] + b * (KK_QBLOCK / 2);
					for (int j = 0; j < KK_QBLOCK / 2; j++)
						t += ((p[j] & 15) - 8) *
							     xq[kk__qact_q4_off(a->nb, b, 2 * j)] +
						     ((p[j] >> 4) -
						      8) * xq[kk__qact_q4_off(a->nb, b, 2 * j + 1)];
				} else {
					const int8_t *p = (const int8_t *) w[c] + b * KK_QBLOCK;
					for (int j = 0; j < KK_QBLOCK; j++)
						t += p[j] * xb[j];
				}
				acc += (float) t * (ws[c] ? xd[b] * ws[c][b] : xd[b]);
			}
			s[r * 2 + c] = acc + kk__qtail(a, r0 + r, w[c], ws[c], k);
		}
}

static void tile_i8_scalar(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			   const float *const *ws, int nw, int64_t k)
{
	tile_scalar(s, a, r0, nx, w, ws, nw, k, false);
}

static void tile_q4_scalar(float s[8], const kk__qact *a, int64_t r0, int nx, const void *const *w,
			   const float *const *ws, int nw, int64_t k)
{
	tile_scalar(s, a, r0, nx, w, ws, nw, k, true);
}

/* Packed groups (quant.c's layout): code t (0..3) of chunk v (0..7) of
 * row i in block b, as a signed value.  int8: chunk v holds elements 4v..
 * 4v+3 stored + 128; int4: chunk v & 3's low nibbles hold elements 4v..
 * 4v+3 (v < 4), its high nibbles 16 + 4(v - 4).. (v >= 4), stored + 8. */
static inline int pcode(const uint8_t *blk, bool q4, int v, int i, int t)
{
	if (!q4)
		return (int) blk[v * 32 + 4 * i + t] - 128;
	uint8_t byte = blk[(v & 3) * 32 + 4 * i + t];
	return (int) (v < 4 ? byte & 15 : byte >> 4) - 8;
}

static inline float pscale(const void *ws, int sdt, int64_t idx)
{
	if (sdt == KK_QS_F16)
		return kk__h2f(((const uint16_t *) ws)[idx]);
	return sdt == KK_QS_F32 ? ((const float *) ws)[idx] : 1.0f;
}

static void ptile_scalar(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx,
			 const uint8_t *w, const void *ws, int sdt, int sshift, int64_t nb, bool q4)
{
	const int64_t bb = q4 ? 128 : 256; /* bytes of a group's block */
	for (int r = 0; r < nx; r++)
		for (int i = 0; i < KK_QPACK; i++) {
			const int8_t *xq = a->q + (r0 + r) * a->ldq;
			const float *xd = a->d + (r0 + r) * a->nb;
			float acc = 0;
			for (int64_t b = 0; b < nb; b++) {
				int32_t t = 0;
				for (int v = 0; v < 8; v++)
					for (int j = 0; j < 4; j++)
						t += pcode(w + b * bb, q4, v, i, j) *
						     xq[b * KK_QBLOCK + 4 * v + j];
				acc = fmaf((float) t,
					   xd[b] * pscale(ws, sdt, (b >> sshift) * KK_QPACK + i),
					   acc);
			}
			s[r * 8 + i] = acc;
		}
}

static void ptile_i8_scalar(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx,
			    const uint8_t *w, const void *ws, int sdt, int sshift, int64_t nb)
{
	ptile_scalar(s, a, r0, nx, w, ws, sdt, sshift, nb, false);
}

static void ptile_q4_scalar(float s[KK_QPTILE_MAX * 8], const kk__qact *a, int64_t r0, int nx,
			    const uint8_t *w, const void *ws, int sdt, int sshift, int64_t nb)
{
	ptile_scalar(s, a, r0, nx, w, ws, sdt, sshift, nb, true);
}

/* ---- the x86 variants ---------------------------------------------------- */

#if defined(__x86_64__)
/* Every function from QDOT_TARGET(t) to QDOT_TARGET_END is compiled for
 * target t (a GCC push_options/target region, clang's attribute push). */
#define QDOT_PRAGMA(x) _Pragma(#x)
#ifdef __clang__
#define QDOT_TARGET(t) \
	QDOT_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define QDOT_TARGET_END QDOT_PRAGMA(clang attribute pop)
#else
#define QDOT_TARGET(t)	QDOT_PRAGMA(GCC push_options) QDOT_PRAGMA(GCC target(t))
#define QDOT_TARGET_END QDOT_PRAGMA(GCC pop_options)
#endif

QDOT_TARGET("avx2,fma,f16c")
static inline __attribute__((always_inline)) __m256i dot32_avx2(__m256i wa, __m256i xs)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), _mm256_set1_epi16(1));
}
static inline __attribute__((always_inline)) __m256i dot32a_avx2(__m256i acc, __m256i wa,
								 __m256i xs)
{
	return _mm256_add_epi32(acc, dot32_avx2(wa, xs));
}
#define QV(name)  name##_avx2
#define QV_DOT32  dot32_avx2
#define QV_DOT32A dot32a_avx2
#define QV_VNNI	  0
#define QV_PNX	  4
#include "qdot-body.h"
QDOT_TARGET_END

QDOT_TARGET("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
static inline __attribute__((always_inline)) __m256i dot32_vnni(__m256i wa, __m256i xs)
{
	return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, xs);
}
static inline __attribute__((always_inline)) __m256i dot32a_vnni(__m256i acc, __m256i wa,
								 __m256i xs)
{
	return _mm256_dpbusd_epi32(acc, wa, xs);
}
#define QV(name)  name##_vnni
#define QV_DOT32  dot32_vnni
#define QV_DOT32A dot32a_vnni
#define QV_VNNI	  1
#define QV_PNX	  8
#include "qdot-body.h"
QDOT_TARGET_END
#endif

/* ---- dispatch ------------------------------------------------------------ */

static const kk__qdot_impl impls[] = {
#if defined(__x86_64__)
	{ "vnni", tile_i8_vnni, tile_q4_vnni, ptile_i8_vnni, ptile_q4_vnni, qact_p_vnni, 8 },
	{ "avx2", tile_i8_avx2, tile_q4_avx2, ptile_i8_avx2, ptile_q4_avx2, qact_p_avx2, 4 },
#endif
	{ "scalar", tile_i8_scalar, tile_q4_scalar, ptile_i8_scalar, ptile_q4_scalar,
	  kk__qact_quantize_p, 4 },
};

#if defined(__x86_64__)
/* F16C (the packed tiles widen f16 scales with vcvtph2ps) from CPUID leaf
 * 1, ECX bit 29: clang 14's __builtin_cpu_supports has no name for it
 * (half.c does the same). */
static bool has_f16c(void)
{
	unsigned a, b, c, d;
	return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static bool impl_runs(const kk__qdot_impl *v)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (streq(v->name, "vnni"))
		return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
		       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") &&
		       __builtin_cpu_supports("fma") && has_f16c();
	if (streq(v->name, "avx2"))
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		       has_f16c();
#endif
	return true;
}

static _Atomic(const kk__qdot_impl *) chosen;

static const kk__qdot_impl *pick(void)
{
	const char *want = getenv("KK_CPU_QDOT");
	for (size_t i = 0; want && i < ARRAY_SIZE(impls); i++)
		if (streq(want, impls[i].name) && impl_runs(&impls[i]))
			return &impls[i];
	for (size_t i = 0; i < ARRAY_SIZE(impls); i++)
		if (impl_runs(&impls[i]))
			return &impls[i];
	return &impls[ARRAY_SIZE(impls) - 1];
}

const kk__qdot_impl *kk__qdot(void)
{
	const kk__qdot_impl *v = atomic_load_explicit(&chosen, memory_order_acquire);
	if (!v) {
		v = pick();
		atomic_store_explicit(&chosen, v, memory_order_release);
	}
	return v;
}

int kk__qdot_force(const char *name)
{
	if (!name) {
		atomic_store(&chosen, NULL);
		return 0;
	}
	for (size_t i = 0; i < ARRAY_SIZE(impls); i++)
		if (streq(name, impls[i].name)) {
			if (!impl_runs(&impls[i]))
				return -EOPNOTSUPP;
			atomic_store(&chosen, &impls[i]);
			return 0;
		}
	return -EINVAL;
}

const char *const *kk__qdot_names(void)
{
	static const char *names[ARRAY_SIZE(impls) + 1];
	for (size_t i = 0; i < ARRAY_SIZE(impls); i++)
		names[i] = impls[i].name;
	return names;
}
