/* tests/kernels/gpu/emu/include/cuda_bf16.h — bf16 and f16 for the CPU
 * emulation of kernels/cuda/ (see cuda_runtime.h here); conversions round
 * to nearest even through kk.h's host converters. */
#pragma once
#include <stdint.h>

#include "kk.h"

struct __nv_bfloat16 {
	uint16_t bits;
};
struct __half {
	uint16_t bits;
};
static inline float __bfloat162float(__nv_bfloat16 h)
{
	return kk_bf16_to_f32(h.bits);
}
static inline __nv_bfloat16 __float2bfloat16(float f)
{
	return __nv_bfloat16{ kk_f32_to_bf16(f) };
}
static inline float __half2float(__half h)
{
	return kk_f16_to_f32(h.bits);
}
static inline __half __float2half(float f)
{
	return __half{ kk_f32_to_f16(f) };
}
