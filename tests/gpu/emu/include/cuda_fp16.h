/* tests/gpu/emu/include/cuda_fp16.h — the packed f16 pair __half2
 * for the CPU emulation of kernels/kk/cuda/ (the scalar __half and the bf16
 * types are in cuda_bf16.h, which this includes). */
#pragma once
#include "cuda_bf16.h"

struct __half2 {
	__half x, y;
};
static_assert(sizeof(__half2) == 4, "an f16 pair is one 32-bit word");
static inline __half2 __floats2half2_rn(float a, float b)
{
	return __half2{ __float2half(a), __float2half(b) };
}
static inline __half2 __halves2half2(__half a, __half b)
{
	return __half2{ a, b };
}
