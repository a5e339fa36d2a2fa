/* kernels/cpu/half.c — f16/bf16 inner loops of the cpu backend: row
 * conversion to and from f32, and the dot product of an f32 row with a
 * half-precision weight row (the decode GEMV), widened in registers so the
 * weights are read once.
 *
 * gcc 12 has no vector _Float16 arithmetic without AVX512-FP16: the
 * `omp simd` loop over _Float16 in simd.c compiled to one scalar vcvtph2ps
 * per element, and the 110M f16 model decoded at 23 tok/s (bf16, widened
 * with integer shifts, at 96).  Here each ISA level has its own
 * intrinsics-written variant (AVX-512F: 16 halves per vcvtph2ps; AVX2 +
 * F16C + FMA: 8), plus a portable scalar one; the best the CPU has is
 * picked on first use.  kk__half_force() lets the tests run every variant
 * the machine supports against the same float64 reference.
 *
 * Each variant sums a dot product in a fixed order of its own (lanes, then
 * accumulators), so results do not depend on the thread split, only on the
 * variant.  Conversions are exact (widening) or round to nearest even
 * (narrowing), like kk_f32_to_f16; a NaN stays a NaN (the hardware keeps
 * its payload's top bits where the scalar helper writes 0x7e00). */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KK_HALF_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

struct half_impl {
	const char *name;
	bool (*usable)(void);
	void (*widen_f16)(float *dst, const uint16_t *src, size_t n);
	void (*narrow_f16)(uint16_t *dst, const float *src, size_t n);
	float (*dot_f16)(const float *x, const uint16_t *w, size_t n);
	float (*dot_bf16)(const float *x, const uint16_t *w, size_t n);
};

/* ---- portable ---- */

static bool usable_always(void)
{
	return true;
}

static void widen_f16_c(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = kk_f16_to_f32(src[i]);
}

static void narrow_f16_c(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = kk_f32_to_f16(src[i]);
}

/* Eight partial sums, as an 8-lane vector would keep them. */
static float dot_f16_c(const float *x, const uint16_t *w, size_t n)
{
	float a[8] = { 0 }, s = 0;
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			a[l] += x[i + l] * kk_f16_to_f32(w[i + l]);
	for (int l = 0; l < 8; l++)
		s += a[l];
	for (; i < n; i++)
		s += x[i] * kk_f16_to_f32(w[i]);
	return s;
}

static float dot_bf16_c(const float *x, const uint16_t *w, size_t n)
{
	float a[8] = { 0 }, s = 0;
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			a[l] += x[i + l] * kk_bf16_to_f32(w[i + l]);
	for (int l = 0; l < 8; l++)
		s += a[l];
	for (; i < n; i++)
		s += x[i] * kk_bf16_to_f32(w[i]);
	return s;
}

#ifdef KK_HALF_X86
/* ---- AVX2 + F16C + FMA (x86-64-v3) ---- */
#define V3 __attribute__((target("avx2,fma,f16c")))

/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * has no name for it.  AVX2's check covers the OS saving ymm state. */
static bool usable_v3(void)
{
	unsigned a, b, c, d;
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	       __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

V3 static void widen_f16_v3(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i,
				 _mm256_cvtph_ps(_mm_loadu_si128((const void *) (src + i))));
	for (; i < n; i++)
		dst[i] = _cvtsh_ss(src[i]);
}

V3 static void narrow_f16_v3(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((void *) (dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
								     _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

V3 static inline __m256 ld8_f16(const uint16_t *w)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const void *) w));
}

V3 static inline __m256 ld8_bf16(const uint16_t *w)
{
	__m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const void *) w));
	return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

V3 static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* Four 8-lane accumulators (32 weights a step: two loads in flight per
 * FMA port), summed in a fixed order at the end. */
#define DOT_V3(NAME, LD, SCALAR)                                                               \
	V3 static float NAME(const float *x, const uint16_t *w, size_t n)                      \
	{                                                                                      \
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                    \
		size_t i = 0;                                                                  \
		float s;                                                                       \
		for (; i + 32 <= n; i += 32) {                                                 \
			a0 = _mm256_fmadd_ps(LD(w + i), _mm256_loadu_ps(x + i), a0);           \
			a1 = _mm256_fmadd_ps(LD(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);   \
			a2 = _mm256_fmadd_ps(LD(w + i + 16), _mm256_loadu_ps(x + i + 16), a2); \
			a3 = _mm256_fmadd_ps(LD(w + i + 24), _mm256_loadu_ps(x + i + 24), a3); \
		}                                                                              \
		for (; i + 8 <= n; i += 8)                                                     \
			a0 = _mm256_fmadd_ps(LD(w + i), _mm256_loadu_ps(x + i), a0);           \
		s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));        \
		for (; i < n; i++)                                                             \
			s += x[i] * SCALAR(w[i]);                                              \
		return s;                                                                      \
	}
DOT_V3(dot_f16_v3, ld8_f16, kk_f16_to_f32)
DOT_V3(dot_bf16_v3, ld8_bf16, kk_bf16_to_f32)

/* ---- AVX-512 (x86-64-v4) ---- */
#define V4 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

static bool usable_v4(void)
{
	__builtin_cpu_init();
	return usable_v3() && __builtin_cpu_supports("avx512f") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

V4 static void widen_f16_v4(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i,
				 _mm512_cvtph_ps(_mm256_loadu_si256((const void *) (src + i))));
	if (i < n) {
		__mmask16 k = (__mmask16) ((1u << (n - i)) - 1);
		_mm512_mask_storeu_ps(dst + i, k,
				      _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
	}
}

V4 static void narrow_f16_v4(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((void *) (dst + i),
				    _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
						    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	if (i < n) {
		__mmask16 k = (__mmask16) ((1u << (n - i)) - 1);
		__m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i),
					    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm256_mask_storeu_epi16(dst + i, k, h);
	}
}

V4 static inline __m512 ld16_f16(const uint16_t *w)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const void *) w));
}

V4 static inline __m512 ld16_bf16(const uint16_t *w)
{
	__m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *) w));
	return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

V4 static inline __m512 ldm16_f16(__mmask16 k, const uint16_t *w)
{
	return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w));
}

V4 static inline __m512 ldm16_bf16(__mmask16 k, const uint16_t *w)
{
	__m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, w));
	return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* Four 16-lane accumulators, 64 weights a step; the tail is a masked load
 * (zeros beyond n add nothing). */
#define DOT_V4(NAME, LD, LDM)                                                                     \
	V4 static float NAME(const float *x, const uint16_t *w, size_t n)                         \
	{                                                                                         \
		__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                       \
		size_t i = 0;                                                                     \
		for (; i + 64 <= n; i += 64) {                                                    \
			a0 = _mm512_fmadd_ps(LD(w + i), _mm512_loadu_ps(x + i), a0);              \
			a1 = _mm512_fmadd_ps(LD(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);    \
			a2 = _mm512_fmadd_ps(LD(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);    \
			a3 = _mm512_fmadd_ps(LD(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);    \
		}                                                                                 \
		for (; i + 16 <= n; i += 16)                                                      \
			a0 = _mm512_fmadd_ps(LD(w + i), _mm512_loadu_ps(x + i), a0);              \
		if (i < n) {                                                                      \
			__mmask16 k = (__mmask16) ((1u << (n - i)) - 1);                          \
			a1 = _mm512_fmadd_ps(LDM(k, w + i), _mm512_maskz_loadu_ps(k, x + i), a1); \
		}                                                                                 \
		return _mm512_reduce_add_ps(                                                      \
			_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));             \
	}
DOT_V4(dot_f16_v4, ld16_f16, ldm16_f16)
DOT_V4(dot_bf16_v4, ld16_bf16, ldm16_bf16)
#endif

/* Best first; the last is always usable. */
static const struct half_impl impls[] = {
#ifdef KK_HALF_X86
	{ "avx512", usable_v4, widen_f16_v4, narrow_f16_v4, dot_f16_v4, dot_bf16_v4 },
	{ "f16c", usable_v3, widen_f16_v3, narrow_f16_v3, dot_f16_v3, dot_bf16_v3 },
#endif
	{ "portable", usable_always, widen_f16_c, narrow_f16_c, dot_f16_c, dot_bf16_c },
};

static _Atomic(const struct half_impl *) cur;

static const struct half_impl *impl(void)
{
	const struct half_impl *p = atomic_load_explicit(&cur, memory_order_relaxed);
	if (p)
		return p;
	for (p = impls; !p->usable(); p++)
		;
	atomic_store_explicit(&cur, p, memory_order_relaxed);
	return p;
}

const char *kk__half_variant(void)
{
	return impl()->name;
}

int kk__half_force(const char *name)
{
	for (size_t i = 0; i < sizeof(impls) / sizeof(impls[0]); i++) {
		const struct half_impl *p = &impls[i];
		if (name && strcmp(name, p->name) != 0)
			continue;
		if (!p->usable()) {
			if (name)
				return -EOPNOTSUPP;
			continue;
		}
		atomic_store_explicit(&cur, p, memory_order_relaxed);
		return 0;
	}
	return -ENOENT;
}

void kk__half_widen_f16(float *dst, const uint16_t *src, size_t n)
{
	impl()->widen_f16(dst, src, n);
}

void kk__half_narrow_f16(uint16_t *dst, const float *src, size_t n)
{
	impl()->narrow_f16(dst, src, n);
}

float kk__half_dot(kk_dtype dt, const float *x, const uint16_t *w, size_t n)
{
	const struct half_impl *p = impl();
	return dt == KK_BF16 ? p->dot_bf16(x, w, n) : p->dot_f16(x, w, n);
}
