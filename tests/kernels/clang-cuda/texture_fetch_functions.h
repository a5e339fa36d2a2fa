/* texture_fetch_functions.h — an empty stand-in, for the clang CUDA check
 * only (tests/kernels/test-clang-cuda.sh).  clang 16's CUDA wrapper
 * (__clang_cuda_runtime_wrapper.h) includes this header unconditionally, but
 * CUDA 12 removed it along with texture references; clang 17 stopped
 * including it for CUDA >= 12.  kernels/kk/cuda uses no texture fetches, so an
 * empty header changes nothing the kernels see. */
#pragma once
