/* kernels/kk/kk_convert.h — inline f32 <-> bf16/f16 and typed element
 * loads/stores, for kk_dtype.c (the public kk_*_to_* and kk_convert_host)
 * and the cpu backend's loops (cpu/cpu.h): one definition of each
 * rounding, inlined where it runs per element. */
#pragma once

#include <stdint.h>
#include <string.h>

#include "kk.h"

/* A float's bits and back (memcpy: no aliasing; compiles to a move). */
static inline uint32_t kk__f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float kk__u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Inline f16/bf16 <-> f32 for the element-wise loops (rope, SwiGLU, the
 * norms' rounding): bit-identical to kk_f16_to_f32 and friends, which
 * they call only off the common path (f16 subnormals, overflow, NaN); the
 * out-of-line calls were 16 % of an f16 prefill's CPU time. */
static inline float kk__h2f(uint16_t h)
{
	uint32_t em = h & 0x7fffu;
	if (em >= 0x7c00u) /* inf, NaN */
		return kk_f16_to_f32(h);
	/* normals and subnormals: exponent rebias by a power-of-two product */
	float f = kk__u2f(em << 13) * 0x1p112f;
	return kk__u2f(kk__f2u(f) | (uint32_t) (h & 0x8000u) << 16);
}

static inline uint16_t kk__f2h(float f)
{
	uint32_t u = kk__f2u(f), a = u & 0x7fffffffu;
	if (a < 0x38800000u || a >= 0x477ff000u) /* below 2^-14, at or above 65520, NaN */
		return kk_f32_to_f16(f);
	uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
	h += rem > 0x1000u || (rem == 0x1000u && (h & 1));
	return (uint16_t) (((u >> 16) & 0x8000u) | h);
}

static inline float kk__b2f(uint16_t h)
{
	return kk__u2f((uint32_t) h << 16);
}

static inline uint16_t kk__f2b(float f)
{
	uint32_t u = kk__f2u(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t) ((u >> 16) | 0x40); /* quiet NaN */
	return (uint16_t) ((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float kk__ld(const void *p, kk_dtype dt, size_t i)
{
	switch (dt) {
	case KK_F32:
		return ((const float *) p)[i];
	case KK_BF16:
		return kk__b2f(((const uint16_t *) p)[i]);
	default:
		return kk__h2f(((const uint16_t *) p)[i]);
	}
}

static inline void kk__st(void *p, kk_dtype dt, size_t i, float v)
{
	switch (dt) {
	case KK_F32:
		((float *) p)[i] = v;
		break;
	case KK_BF16:
		((uint16_t *) p)[i] = kk__f2b(v);
		break;
	default:
		((uint16_t *) p)[i] = kk__f2h(v);
		break;
	}
}
