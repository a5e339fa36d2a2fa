/* tests/kernels/gpu/emu/include/kc_emu_mma.h — warp-level matrix
 * instructions (mma.sync, ldmatrix) for the CPU emulation of kernels/cuda/
 * (included by cuda_runtime.h here). */
#pragma once
