/* kernels/kk/cpu/half.c — f16/bf16 inner loops of the cpu backend: row
 * conversion to and from f32, the dot product of an f32 row with a
 * half-precision weight row, and the linear layer's product x W^T with
 * half-precision W (kk__half_gemm: decode, batched decode, prefill), W
 * converted in registers so it is read in place, once per call; and the
 * same product with f32 W (kk__half_gemm_f32: prefill with f32 weights,
 * independent of which sgemm kernel OpenBLAS picks).
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
	void (*gemm)(bool bf16, const kk__half_mm *p, int64_t j0, int64_t j1);
	void (*gemm_f32)(const kk__half_mm *p, int64_t j0, int64_t j1); /* p->wf */
};

/* The multi-row product (kk__half_gemm) walks W in blocks of about this
 * many bytes of 16-bit rows, and runs every X tile against one block
 * before the next: the block stays in L2 (1 MiB a core on the build
 * machine) while the X tile (4 rows of f32, 12 KiB at k = 768) stays in
 * L1, so W is read from memory once whatever m is. */
#define HALF_GEMM_WBLOCK (256 << 10)
/* The f32 product (kk__half_gemm_f32) keeps blocks of this many bytes of
 * f32 rows: as many bytes as the 16-bit blocks, half as many rows. */
#define HALF_GEMM_WBLOCK_F32 (256 << 10)
/* ... and sums k in blocks of at most this many elements: 4 x rows of
 * 2048 floats (32 KiB) and the W rows streaming past them overflowed L1
 * (48 KiB), and the X rows came from L2 too. */
#define HALF_F32_KBLOCK 1024

/* The first x tile of a W block reads the block from memory, its W rows
 * side by side: a pattern the hardware prefetcher follows badly (m = 8
 * against DRAM-resident W: 12 GB/s with AVX-512 tiles, 7 with f16c ones).
 * That tile prefetches each row's current offset this many rows ahead (4
 * AVX-512 tiles; 4, 8 and 32 rows were within the noise of 16); later x
 * tiles find the block in L2. */
#define HALF_PF_ROWS 16

/* Tiles of up to rm X rows x rn W rows over W rows [j0, j1) in blocks:
 * tiles[r - 1] takes r X rows (the last tile of X rows takes the rows
 * left); an edge tile of W rows repeats its last valid W row and stores
 * only valid outputs.  Every output is the same sum wherever its tile
 * lies (the thread split does not change a result). */
typedef void (*half_tile_fn)(const kk__half_mm *p, int64_t i, int64_t j, int64_t je);

static void half_blocked(const half_tile_fn *tiles, int rm, int rn, const kk__half_mm *p,
			 int64_t j0, int64_t j1)
{
	if (p->wf && p->k > HALF_F32_KBLOCK) {
		/* f32 rows longer than a k block: one pass per block, the
		 * later ones adding to C (alpha s + C) */
		kk__half_mm q = *p;
		for (size_t k0 = 0; k0 < p->k; k0 += HALF_F32_KBLOCK) {
			q.x = p->x + k0, q.wf = p->wf + k0;
			q.k = p->k - k0 < HALF_F32_KBLOCK ? p->k - k0 : HALF_F32_KBLOCK;
			q.beta = k0 ? 1.0f : p->beta;
			half_blocked(tiles, rm, rn, &q, j0, j1);
		}
		return;
	}
	int64_t nb = (int64_t) (p->wf ? HALF_GEMM_WBLOCK_F32 / (4 * p->k + 1)
				      : HALF_GEMM_WBLOCK / (2 * p->k + 1)) /
		     rn * rn;
	if (nb < rn)
		nb = rn;
	for (int64_t jb = j0; jb < j1; jb += nb) {
		int64_t je = jb + nb < j1 ? jb + nb : j1;
		for (int64_t i = 0; i < p->m; i += rm) {
			half_tile_fn tile = tiles[(p->m - i < rm ? p->m - i : rm) - 1];
			for (int64_t j = jb; j < je; j += rn)
				tile(p, i, j, je);
		}
	}
}

/* One X row (decode): one W row at a time, each a dot product read
 * straight through (tiles of 4 adjacent W rows read DRAM-resident weights
 * at 23 GB/s where this does 34, and software prefetching only slowed it).
 * The portable variant's loop, and the odd row of half_rows2. */
typedef float (*half_dot_fn)(const float *x, const uint16_t *w, size_t n);

static inline __attribute__((always_inline)) void half_rows(half_dot_fn dot, const kk__half_mm *p,
							    int64_t j0, int64_t j1)
{
	for (int64_t j = j0; j < j1; j++) {
		float v = p->alpha * dot(p->x, p->w + j * p->ldw, p->k);
		p->c[j] = p->beta != 0 ? v + p->beta * p->c[j] : v;
	}
}

/* One X row (AVX-512, f16c): rows j0 + t and j0 + h + t together (h half
 * the range: two streams far apart, 34 -> 37-40 GB/s), a last odd row
 * alone; dot2 sums each row exactly as dot does, so a row's output does
 * not depend on whether (or with which row) it was paired. */
typedef void (*half_dot2_fn)(float s[2], const float *x, const uint16_t *w, const uint16_t *v,
			     size_t n);

static inline __attribute__((always_inline)) void
half_rows2(half_dot_fn dot, half_dot2_fn dot2, const kk__half_mm *p, int64_t j0, int64_t j1)
{
	int64_t h = (j1 - j0) / 2;
	for (int64_t t = j0; t < j0 + h; t++) {
		float s[2];
		dot2(s, p->x, p->w + t * p->ldw, p->w + (t + h) * p->ldw, p->k);
		for (int c = 0; c < 2; c++) {
			float *y = p->c + t + c * h, v = p->alpha * s[c];
			*y = p->beta != 0 ? v + p->beta * *y : v;
		}
	}
	if ((j1 - j0) % 2)
		half_rows(dot, p, j1 - 1, j1);
}

/* Stores sums s[c] of X row i and W rows j + c (c < rn, j + c < je). */
static inline void half_store(const kk__half_mm *p, int64_t i, int64_t j, int64_t je,
			      const float *s, int rn)
{
	if (i >= p->m)
		return;
	float *c = p->c + i * p->ldc + j;
	for (int l = 0; l < rn && j + l < je; l++) {
		float v = p->alpha * s[l];
		c[l] = p->beta != 0 ? v + p->beta * c[l] : v;
	}
}

static inline int64_t half_clamp(int64_t v, int64_t end)
{
	return v < end ? v : end - 1;
}

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

/* The portable product: one dot per output, 1 x 1 tiles. */
static void tile_f16_c(const kk__half_mm *p, int64_t i, int64_t j, int64_t je)
{
	float s = dot_f16_c(p->x + i * p->ldx, p->w + j * p->ldw, p->k);
	half_store(p, i, j, je, &s, 1);
}

static void tile_bf16_c(const kk__half_mm *p, int64_t i, int64_t j, int64_t je)
{
	float s = dot_bf16_c(p->x + i * p->ldx, p->w + j * p->ldw, p->k);
	half_store(p, i, j, je, &s, 1);
}

static void gemm_c(bool bf16, const kk__half_mm *p, int64_t j0, int64_t j1)
{
	static const half_tile_fn f16[] = { tile_f16_c }, bf[] = { tile_bf16_c };
	if (p->m == 1)
		return half_rows(bf16 ? dot_bf16_c : dot_f16_c, p, j0, j1);
	half_blocked(bf16 ? bf : f16, 1, 1, p, j0, j1);
}

/* f32 W: the same eight partial sums, one dot per output. */
static float dot_f32_c(const float *x, const float *w, size_t n)
{
	float a[8] = { 0 }, s = 0;
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			a[l] += x[i + l] * w[i + l];
	for (int l = 0; l < 8; l++)
		s += a[l];
	for (; i < n; i++)
		s += x[i] * w[i];
	return s;
}

static void tile_f32_c(const kk__half_mm *p, int64_t i, int64_t j, int64_t je)
{
	float s = dot_f32_c(p->x + i * p->ldx, p->wf + j * p->ldw, p->k);
	half_store(p, i, j, je, &s, 1);
}

static void gemm_f32_c(const kk__half_mm *p, int64_t j0, int64_t j1)
{
	static const half_tile_fn f32[] = { tile_f32_c };
	half_blocked(f32, 1, 1, p, j0, j1);
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

/* DOT_V3 on two W rows at once (two memory streams, as dot2_f16_v4),
 * each summed exactly as DOT_V3 sums it. */
#define DOT2_V3(NAME, LD, SCALAR)                                                                  \
	V3 static void NAME(float s[2], const float *x, const uint16_t *w, const uint16_t *v,      \
			    size_t n)                                                              \
	{                                                                                          \
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
		__m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                         \
		size_t i = 0;                                                                      \
		for (; i + 32 <= n; i += 32) {                                                     \
			__m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);       \
			__m256 x2 = _mm256_loadu_ps(x + i + 16), x3 = _mm256_loadu_ps(x + i + 24); \
			a0 = _mm256_fmadd_ps(LD(w + i), x0, a0);                                   \
			b0 = _mm256_fmadd_ps(LD(v + i), x0, b0);                                   \
			a1 = _mm256_fmadd_ps(LD(w + i + 8), x1, a1);                               \
			b1 = _mm256_fmadd_ps(LD(v + i + 8), x1, b1);                               \
			a2 = _mm256_fmadd_ps(LD(w + i + 16), x2, a2);                              \
			b2 = _mm256_fmadd_ps(LD(v + i + 16), x2, b2);                              \
			a3 = _mm256_fmadd_ps(LD(w + i + 24), x3, a3);                              \
			b3 = _mm256_fmadd_ps(LD(v + i + 24), x3, b3);                              \
		}                                                                                  \
		for (; i + 8 <= n; i += 8) {                                                       \
			__m256 x0 = _mm256_loadu_ps(x + i);                                        \
			a0 = _mm256_fmadd_ps(LD(w + i), x0, a0);                                   \
			b0 = _mm256_fmadd_ps(LD(v + i), x0, b0);                                   \
		}                                                                                  \
		s[0] = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));         \
		s[1] = hsum8(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));         \
		for (; i < n; i++) {                                                               \
			s[0] += x[i] * SCALAR(w[i]);                                               \
			s[1] += x[i] * SCALAR(v[i]);                                               \
		}                                                                                  \
	}
DOT2_V3(dot2_f16_v3, ld8_f16, kk_f16_to_f32)
DOT2_V3(dot2_bf16_v3, ld8_bf16, kk_bf16_to_f32)

/* 4 X rows x 2 W rows of 8-lane accumulators (8 of the 16 ymm registers):
 * each converted W vector meets four X rows, each X vector two W rows. */
#define V3_RM 4
#define V3_RN 2
V3 static inline __attribute__((always_inline)) void
tile_v3(const kk__half_mm *p, int64_t i, int64_t j, int64_t je, bool bf, const int rm)
{
	const float *x[V3_RM];
	const uint16_t *w[V3_RN];
	__m256 a[V3_RM][V3_RN];
	size_t l = 0, k = p->k;
	const bool pf = i == 0; /* HALF_PF_ROWS */
	const size_t pf_ahead = HALF_PF_ROWS * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
		x[r] = p->x + half_clamp(i + r, p->m) * p->ldx;
#pragma GCC unroll 4
	for (int c = 0; c < V3_RN; c++)
		w[c] = p->w + half_clamp(j + c, je) * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
		for (int c = 0; c < V3_RN; c++)
			a[r][c] = _mm256_setzero_ps();
	for (; l + 8 <= k; l += 8) {
		__m256 b[V3_RN];
		if (pf && l % 32 == 0) /* one per 64-byte line */
#pragma GCC unroll 4
			for (int c = 0; c < V3_RN; c++)
				_mm_prefetch((const char *) (w[c] + l + pf_ahead), _MM_HINT_T0);
#pragma GCC unroll 4
		for (int c = 0; c < V3_RN; c++)
			b[c] = bf ? ld8_bf16(w[c] + l) : ld8_f16(w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m256 xv = _mm256_loadu_ps(x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V3_RN; c++)
				a[r][c] = _mm256_fmadd_ps(xv, b[c], a[r][c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++) {
		float s[V3_RN];
#pragma GCC unroll 4
		for (int c = 0; c < V3_RN; c++) {
			s[c] = hsum8(a[r][c]);
			for (size_t t = l; t < k; t++)
				s[c] += x[r][t] *
					(bf ? kk_bf16_to_f32(w[c][t]) : kk_f16_to_f32(w[c][t]));
		}
		half_store(p, i + r, j, je, s, V3_RN);
	}
}

#define TILES(PRE, TILE, ATTR, BF)                                                      \
	ATTR static void PRE##1(const kk__half_mm *p, int64_t i, int64_t j, int64_t je) \
	{                                                                               \
		TILE(p, i, j, je, BF, 1);                                               \
	}                                                                               \
	ATTR static void PRE##2(const kk__half_mm *p, int64_t i, int64_t j, int64_t je) \
	{                                                                               \
		TILE(p, i, j, je, BF, 2);                                               \
	}                                                                               \
	ATTR static void PRE##3(const kk__half_mm *p, int64_t i, int64_t j, int64_t je) \
	{                                                                               \
		TILE(p, i, j, je, BF, 3);                                               \
	}                                                                               \
	ATTR static void PRE##4(const kk__half_mm *p, int64_t i, int64_t j, int64_t je) \
	{                                                                               \
		TILE(p, i, j, je, BF, 4);                                               \
	}                                                                               \
	static const half_tile_fn PRE[] = { PRE##1, PRE##2, PRE##3, PRE##4 };
TILES(tiles_f16_v3, tile_v3, V3, false)
TILES(tiles_bf16_v3, tile_v3, V3, true)

V3 static void gemm_v3(bool bf16, const kk__half_mm *p, int64_t j0, int64_t j1)
{
	if (p->m == 1)
		return bf16 ? half_rows2(dot_bf16_v3, dot2_bf16_v3, p, j0, j1)
			    : half_rows2(dot_f16_v3, dot2_f16_v3, p, j0, j1);
	half_blocked(bf16 ? tiles_bf16_v3 : tiles_f16_v3, V3_RM, V3_RN, p, j0, j1);
}

/* tile_v3 with f32 W: plain loads, the same 4 x 2 accumulators, sums and
 * prefetch (a 64-byte line is 16 floats: one prefetch per two steps). */
V3 static inline __attribute__((always_inline)) void
tile_f32_v3(const kk__half_mm *p, int64_t i, int64_t j, int64_t je, bool unused, const int rm)
{
	const float *x[V3_RM], *w[V3_RN];
	__m256 a[V3_RM][V3_RN];
	size_t l = 0, k = p->k;
	const bool pf = i == 0; /* HALF_PF_ROWS */
	const size_t pf_ahead = HALF_PF_ROWS * p->ldw;
	(void) unused;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
		x[r] = p->x + half_clamp(i + r, p->m) * p->ldx;
#pragma GCC unroll 4
	for (int c = 0; c < V3_RN; c++)
		w[c] = p->wf + half_clamp(j + c, je) * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
		for (int c = 0; c < V3_RN; c++)
			a[r][c] = _mm256_setzero_ps();
	for (; l + 8 <= k; l += 8) {
		__m256 b[V3_RN];
		if (pf && l % 16 == 0) /* one per 64-byte line */
#pragma GCC unroll 4
			for (int c = 0; c < V3_RN; c++)
				_mm_prefetch((const char *) (w[c] + l + pf_ahead), _MM_HINT_T0);
#pragma GCC unroll 4
		for (int c = 0; c < V3_RN; c++)
			b[c] = _mm256_loadu_ps(w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m256 xv = _mm256_loadu_ps(x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V3_RN; c++)
				a[r][c] = _mm256_fmadd_ps(xv, b[c], a[r][c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++) {
		float s[V3_RN];
#pragma GCC unroll 4
		for (int c = 0; c < V3_RN; c++) {
			s[c] = hsum8(a[r][c]);
			for (size_t t = l; t < k; t++)
				s[c] += x[r][t] * w[c][t];
		}
		half_store(p, i + r, j, je, s, V3_RN);
	}
}
TILES(tiles_f32_v3, tile_f32_v3, V3, false)

V3 static void gemm_f32_v3(const kk__half_mm *p, int64_t j0, int64_t j1)
{
	half_blocked(tiles_f32_v3, V3_RM, V3_RN, p, j0, j1);
}

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

/* DOT_V4 on two W rows at once, each summed exactly as DOT_V4 sums it:
 * two streams far apart in memory read faster than one (pure reads on
 * the build machine's EPYC, one thread: 34 GB/s, two streams 37). */
#define DOT2_V4(NAME, LD, LDM)                                                                     \
	V4 static void NAME(float s[2], const float *x, const uint16_t *w, const uint16_t *v,      \
			    size_t n)                                                              \
	{                                                                                          \
		__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
		__m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                         \
		size_t i = 0;                                                                      \
		for (; i + 64 <= n; i += 64) {                                                     \
			__m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);      \
			__m512 x2 = _mm512_loadu_ps(x + i + 32), x3 = _mm512_loadu_ps(x + i + 48); \
			a0 = _mm512_fmadd_ps(LD(w + i), x0, a0);                                   \
			b0 = _mm512_fmadd_ps(LD(v + i), x0, b0);                                   \
			a1 = _mm512_fmadd_ps(LD(w + i + 16), x1, a1);                              \
			b1 = _mm512_fmadd_ps(LD(v + i + 16), x1, b1);                              \
			a2 = _mm512_fmadd_ps(LD(w + i + 32), x2, a2);                              \
			b2 = _mm512_fmadd_ps(LD(v + i + 32), x2, b2);                              \
			a3 = _mm512_fmadd_ps(LD(w + i + 48), x3, a3);                              \
			b3 = _mm512_fmadd_ps(LD(v + i + 48), x3, b3);                              \
		}                                                                                  \
		for (; i + 16 <= n; i += 16) {                                                     \
			__m512 x0 = _mm512_loadu_ps(x + i);                                        \
			a0 = _mm512_fmadd_ps(LD(w + i), x0, a0);                                   \
			b0 = _mm512_fmadd_ps(LD(v + i), x0, b0);                                   \
		}                                                                                  \
		if (i < n) {                                                                       \
			__mmask16 k = (__mmask16) ((1u << (n - i)) - 1);                           \
			__m512 x0 = _mm512_maskz_loadu_ps(k, x + i);                               \
			a1 = _mm512_fmadd_ps(LDM(k, w + i), x0, a1);                               \
			b1 = _mm512_fmadd_ps(LDM(k, v + i), x0, b1);                               \
		}                                                                                  \
		s[0] = _mm512_reduce_add_ps(                                                       \
			_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));              \
		s[1] = _mm512_reduce_add_ps(                                                       \
			_mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));              \
	}
DOT2_V4(dot2_f16_v4, ld16_f16, ldm16_f16)
DOT2_V4(dot2_bf16_v4, ld16_bf16, ldm16_bf16)

/* Four sums of four 16-lane vectors, in a fixed order: halves, then
 * pairwise adds of neighbouring lanes. */
V4 static inline __m128 hsum4_v4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
#define HALVES(v)                                \
	_mm256_add_ps(_mm512_castps512_ps256(v), \
		      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
	__m256 t01 = _mm256_hadd_ps(HALVES(a0), HALVES(a1));
	__m256 t23 = _mm256_hadd_ps(HALVES(a2), HALVES(a3));
#undef HALVES
	__m256 t = _mm256_hadd_ps(t01, t23);
	return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* 4 X rows x 4 W rows of 16-lane accumulators (16 of the 32 zmm
 * registers): per 16 elements, 4 W loads converted in registers
 * (vcvtph2ps) and 4 X loads feed 16 FMAs; the k tail is a masked load. */
#define V4_RM 4
#define V4_RN 4
V4 static inline __attribute__((always_inline)) void
tile_v4(const kk__half_mm *p, int64_t i, int64_t j, int64_t je, bool bf, const int rm)
{
	const float *x[V4_RM];
	const uint16_t *w[V4_RN];
	__m512 a[V4_RM][V4_RN];
	size_t l = 0, k = p->k;
	const bool pf = i == 0; /* HALF_PF_ROWS */
	const size_t pf_ahead = HALF_PF_ROWS * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
		x[r] = p->x + half_clamp(i + r, p->m) * p->ldx;
#pragma GCC unroll 4
	for (int c = 0; c < V4_RN; c++)
		w[c] = p->w + half_clamp(j + c, je) * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			a[r][c] = _mm512_setzero_ps();
	for (; l + 16 <= k; l += 16) {
		__m512 b[V4_RN];
		if (pf)
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				_mm_prefetch((const char *) (w[c] + l + pf_ahead), _MM_HINT_T0);
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			b[c] = bf ? ld16_bf16(w[c] + l) : ld16_f16(w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m512 xv = _mm512_loadu_ps(x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
		}
	}
	if (l < k) {
		__mmask16 m = (__mmask16) ((1u << (k - l)) - 1);
		__m512 b[V4_RN];
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			b[c] = bf ? ldm16_bf16(m, w[c] + l) : ldm16_f16(m, w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m512 xv = _mm512_maskz_loadu_ps(m, x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++) {
		float s[4];
		_mm_storeu_ps(s, hsum4_v4(a[r][0], a[r][1], a[r][2], a[r][3]));
		half_store(p, i + r, j, je, s, V4_RN);
	}
}

TILES(tiles_f16_v4, tile_v4, V4, false)
TILES(tiles_bf16_v4, tile_v4, V4, true)

V4 static void gemm_v4(bool bf16, const kk__half_mm *p, int64_t j0, int64_t j1)
{
	if (p->m == 1)
		return bf16 ? half_rows2(dot_bf16_v4, dot2_bf16_v4, p, j0, j1)
			    : half_rows2(dot_f16_v4, dot2_f16_v4, p, j0, j1);
	half_blocked(bf16 ? tiles_bf16_v4 : tiles_f16_v4, V4_RM, V4_RN, p, j0, j1);
}

/* tile_v4 with f32 W: per 16 elements 4 W loads (no conversion) and 4 X
 * loads feed 16 FMAs; same accumulators, sums, masked tail and prefetch
 * (one 16-float load is one 64-byte line). */
V4 static inline __attribute__((always_inline)) void
tile_f32_v4(const kk__half_mm *p, int64_t i, int64_t j, int64_t je, bool unused, const int rm)
{
	const float *x[V4_RM], *w[V4_RN];
	__m512 a[V4_RM][V4_RN];
	size_t l = 0, k = p->k;
	const bool pf = i == 0; /* HALF_PF_ROWS */
	const size_t pf_ahead = HALF_PF_ROWS * p->ldw;
	(void) unused;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
		x[r] = p->x + half_clamp(i + r, p->m) * p->ldx;
#pragma GCC unroll 4
	for (int c = 0; c < V4_RN; c++)
		w[c] = p->wf + half_clamp(j + c, je) * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			a[r][c] = _mm512_setzero_ps();
	for (; l + 16 <= k; l += 16) {
		__m512 b[V4_RN];
		if (pf)
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				_mm_prefetch((const char *) (w[c] + l + pf_ahead), _MM_HINT_T0);
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			b[c] = _mm512_loadu_ps(w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m512 xv = _mm512_loadu_ps(x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
		}
	}
	if (l < k) {
		__mmask16 m = (__mmask16) ((1u << (k - l)) - 1);
		__m512 b[V4_RN];
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			b[c] = _mm512_maskz_loadu_ps(m, w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m512 xv = _mm512_maskz_loadu_ps(m, x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++) {
		float s[4];
		_mm_storeu_ps(s, hsum4_v4(a[r][0], a[r][1], a[r][2], a[r][3]));
		half_store(p, i + r, j, je, s, V4_RN);
	}
}
TILES(tiles_f32_v4, tile_f32_v4, V4, false)

V4 static void gemm_f32_v4(const kk__half_mm *p, int64_t j0, int64_t j1)
{
	half_blocked(tiles_f32_v4, V4_RM, V4_RN, p, j0, j1);
}

/* ---- AVX-512 BF16 (vdpbf16ps) ---- */
#define V4B __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

/* AVX512_BF16: CPUID leaf 7 subleaf 1, EAX bit 5. */
static bool usable_v4b(void)
{
	unsigned a, b, c, d;
	return usable_v4() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

/* bf16 W against bf16 X (kk_gemm's A has B's dtype: x as given, before
 * widening), m >= 2: vdpbf16ps adds the two products of each pair of
 * lanes to an f32 accumulator, 32 weights per instruction and no
 * conversion, where the FMA tile converts 16.  The same 4 x 4 tiles,
 * blocks and prefetch as tile_v4.  The instruction treats bf16 subnormals
 * as zero and rounds each pair's sum once, so results differ from the FMA
 * tile's in the last bits (within the f32 accumulation contract). */
V4B static inline __attribute__((always_inline)) void tile_dp(const kk__half_mm *p, int64_t i,
							      int64_t j, int64_t je, const int rm)
{
	const uint16_t *x[V4_RM], *w[V4_RN];
	__m512 a[V4_RM][V4_RN];
	size_t l = 0, k = p->k;
	const bool pf = i == 0; /* HALF_PF_ROWS */
	const size_t pf_ahead = HALF_PF_ROWS * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
		x[r] = p->xh + half_clamp(i + r, p->m) * p->ldx;
#pragma GCC unroll 4
	for (int c = 0; c < V4_RN; c++)
		w[c] = p->w + half_clamp(j + c, je) * p->ldw;
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			a[r][c] = _mm512_setzero_ps();
	for (; l + 32 <= k; l += 32) {
		__m512i b[V4_RN];
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++) {
			if (pf)
				_mm_prefetch((const char *) (w[c] + l + pf_ahead), _MM_HINT_T0);
			b[c] = _mm512_loadu_si512(w[c] + l);
		}
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m512i xv = _mm512_loadu_si512(x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh) xv, (__m512bh) b[c]);
		}
	}
	if (l < k) {
		__mmask32 m = (__mmask32) ((1ull << (k - l)) - 1);
		__m512i b[V4_RN];
#pragma GCC unroll 4
		for (int c = 0; c < V4_RN; c++)
			b[c] = _mm512_maskz_loadu_epi16(m, w[c] + l);
#pragma GCC unroll 4
		for (int r = 0; r < rm; r++) {
			__m512i xv = _mm512_maskz_loadu_epi16(m, x[r] + l);
#pragma GCC unroll 4
			for (int c = 0; c < V4_RN; c++)
				a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh) xv, (__m512bh) b[c]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < rm; r++) {
		float s[4];
		_mm_storeu_ps(s, hsum4_v4(a[r][0], a[r][1], a[r][2], a[r][3]));
		half_store(p, i + r, j, je, s, V4_RN);
	}
}

#define TILE_DP(p, i, j, je, unused, rm) tile_dp(p, i, j, je, rm)
TILES(tiles_dp_v4b, TILE_DP, V4B, 0)

static void gemm_v4b(bool bf16, const kk__half_mm *p, int64_t j0, int64_t j1)
{
	if (bf16 && p->xh && p->m >= 2)
		half_blocked(tiles_dp_v4b, V4_RM, V4_RN, p, j0, j1);
	else
		gemm_v4(bf16, p, j0, j1);
}
#endif

/* Best first; the last is always usable. */
static const struct half_impl impls[] = {
#ifdef KK_HALF_X86
	{ "avx512bf16", usable_v4b, widen_f16_v4, narrow_f16_v4, dot_f16_v4, dot_bf16_v4, gemm_v4b,
	  gemm_f32_v4 },
	{ "avx512", usable_v4, widen_f16_v4, narrow_f16_v4, dot_f16_v4, dot_bf16_v4, gemm_v4,
	  gemm_f32_v4 },
	{ "f16c", usable_v3, widen_f16_v3, narrow_f16_v3, dot_f16_v3, dot_bf16_v3, gemm_v3,
	  gemm_f32_v3 },
#endif
	{ "portable", usable_always, widen_f16_c, narrow_f16_c, dot_f16_c, dot_bf16_c, gemm_c,
	  gemm_f32_c },
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

void kk__half_gemm(kk_dtype dt, const kk__half_mm *p, int64_t j0, int64_t j1)
{
	impl()->gemm(dt == KK_BF16, p, j0, j1);
}

void kk__half_gemm_f32(const kk__half_mm *p, int64_t j0, int64_t j1)
{
	impl()->gemm_f32(p, j0, j1);
}
