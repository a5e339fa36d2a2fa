/* tests/gpu/emu/include/cuda_bf16.h — bf16 and f16 for the CPU
 * emulation of kernels/kk/cuda/ (see cuda_runtime.h here); conversions round
 * to nearest even through kk.h's host converters.  Also the packed pair
 * __nv_bfloat162 and the bit-level conversions kernels/kk/cuda/kc_vec.cuh
 * uses (the f16 pair is in cuda_fp16.h). */
#pragma once
#include <stdint.h>

#include "kk.h"

struct __nv_bfloat16 {
	uint16_t bits;
};
struct __half {
	uint16_t bits;
};
struct __nv_bfloat162 {
	__nv_bfloat16 x, y;
};
static_assert(sizeof(__nv_bfloat162) == 4, "a bf16 pair is one 32-bit word");
static inline float __bfloat162float(__nv_bfloat16 h)
{
	return kk_bf16_to_f32(h.bits);
}
static inline __nv_bfloat16 __float2bfloat16(float f)
{
	return __nv_bfloat16{ kk_f32_to_bf16(f) };
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	return __float2bfloat16(f);
}
static inline float __half2float(__half h)
{
	return kk_f16_to_f32(h.bits);
}
static inline __half __float2half(float f)
{
	return __half{ kk_f32_to_f16(f) };
}
static inline __half __float2half_rn(float f)
{
	return __float2half(f);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h)
{
	return h.bits;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
	return __nv_bfloat16{ u };
}
static inline unsigned short __half_as_ushort(__half h)
{
	return h.bits;
}
static inline __half __ushort_as_half(unsigned short u)
{
	return __half{ u };
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
	return __nv_bfloat162{ __float2bfloat16(a), __float2bfloat16(b) };
}
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b)
{
	return __nv_bfloat162{ a, b };
}
