/* tests/kernels/gpu/emu/include/kc_emu_vec.h — CUDA's vector types
 * (float2/float4, uint2/uint4 ...) and packed bf16/f16 intrinsics for the CPU
 * emulation of kernels/cuda/ (included by cuda_runtime.h here). */
#pragma once
