/* kernels/kk/cuda/kc.h — internal interface of the CUDA backend.
 *
 * Each op family of kernels/kk/include/kk_ops.def lives in its own file
 * (elementwise.cu, gemm.cu, quant.cu, attention.cu, norm.cu, rope.cu,
 * softmax.cu, embedding.cu, optim.cu, sample.cu, nccl.cu), llm.c style: a "kernels" section, then
 * the vtable slots (kc_op_*) that launch them on the caller's stream, check the launch and return 0
 * or -errno (never abort, never log).  backend.cu assembles the slots into the kk_backend_ops table
 * that kernels/kk/kk.c dispatches to.
 *
 * Element types: F32, BF16, F16 activations; kernels load every element into
 * f32, compute in f32 and round once on store.
 *
 * Everything here is UNVERIFIED on a GPU (written on a machine without one);
 * see docs/kernels-cuda.md. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "../kk_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kc_dtype {
	KC_F32 = 0,
	KC_BF16 = 1,
	KC_F16 = 2,
} kc_dtype;

size_t kc_dtype_size(kc_dtype t);

/* Error mapping: CUDA runtime / cuBLAS / NCCL status codes -> -errno.
 * Out of memory -> -ENOMEM, bad argument -> -EINVAL, no device or driver ->
 * -ENODEV, unsupported configuration -> -EOPNOTSUPP, anything else -> -EIO. */
int kc_errno_cuda(cudaError_t e);
int kc_errno_cublas(int status);
int kc_errno_nccl(int result);
/* Returns kc_errno_cuda(cudaGetLastError()) — call right after a launch. */
int kc_check_launch(void);

/* Number of usable CUDA devices, 0 when there is no device or driver (never
 * an error: "no GPU" is a normal state for kiln). */
int kc_device_count(void);

/* ---- GEMM (gemm.cu), cuBLASLt ---------------------------------------
 * Row-major:  C[b] = act(alpha * op(A[b]) op(B[b]) + beta * C[b] + bias)
 * op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are row strides of
 * the STORED matrices in elements; stride_* are batch strides in elements
 * (0 = shared operand).  A and B share ab_dt; C is c_dt (F32 or ab_dt);
 * bias (length n, NULL allowed) is bias_dt (F32 or c_dt).  Accumulation and
 * alpha/beta are f32.  act: KC_ACT_GELU (tanh approximation, cuBLASLt's
 * epilogue) or KC_ACT_SILU (a small fused kernel after the GEMM; cuBLASLt
 * has no SiLU epilogue). */
enum { KC_ACT_NONE = 0, KC_ACT_GELU = 1, KC_ACT_SILU = 2 };

typedef struct kc_blas kc_blas; /* a cuBLASLt handle plus its workspace */
int kc_blas_new(kc_blas **ret);
void kc_blas_free(kc_blas *b);

int kc_gemm(kc_blas *h, cudaStream_t s, kc_dtype ab_dt, kc_dtype c_dt, int trans_a, int trans_b,
	    int64_t m, int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
	    int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b, float beta, void *c,
	    int64_t ldc, int64_t stride_c, int64_t batch, const void *bias, kc_dtype bias_dt,
	    int act);

/* x[i] *= scale; dst[i] = src[i] across dtypes (elementwise.cu). */
int kc_scale(cudaStream_t s, kc_dtype dt, size_t n, void *x, float scale);
int kc_cast(cudaStream_t s, kc_dtype dst_dt, void *dst, kc_dtype src_dt, const void *src, size_t n);

/* ---- the backend (backend.cu) -------------------------------------------
 * be->ctx of an opened cuda backend. */
typedef struct kc_ctx {
	int device;
	cudaStream_t stream; /* the default stream (st == NULL), non-blocking */
	kc_blas *blas;
	void *attn_ws; /* split-decode workspace (attention.cu), default stream only */
	size_t attn_ws_bytes;
} kc_ctx;

/* Waits for stream s of be (nccl.cu): cudaStreamSynchronize, or, while a
 * communicator of be is open, a poll that ends with -ECONNRESET/-EIO on an
 * NCCL error or -ETIMEDOUT after KILN_NCCL_TIMEOUT s (the communicators
 * then aborted) instead of hanging on a dead peer. */
int kc_wait_stream(kk_backend *be, cudaStream_t s);

/* Frees the attention workspace of ctx (attention.cu); at backend destroy. */
void kc_attn_release(kc_ctx *ctx);

/* The device the calling thread last bound (backend.cu); -1: none yet. */
extern __thread int kc_thread_device;

/* Makes the backend's device current on the calling thread.  CUDA's current
 * device is per host thread and a thread that never chose one works on
 * device 0, so a worker thread (kiln-inferd's scheduler) would otherwise
 * launch, allocate and create streams on device 0 whatever the backend
 * picked.  Every entry point that touches the device binds first; the
 * thread-local cache makes that one compare when nothing changed.  It
 * assumes no one else calls cudaSetDevice on a thread between kk calls
 * (kiln does not); code that does must bind again (any kk call does). */
static inline int kc_bind(kk_backend *be)
{
	int dev = ((kc_ctx *) be->ctx)->device;
	if (kc_thread_device == dev)
		return 0;
	int r = kc_errno_cuda(cudaSetDevice(dev));
	if (r < 0)
		return r;
	kc_thread_device = dev;
	return 0;
}

/* The stream of a launch, st or the backend's default.  Every launching
 * slot asks for it before it touches the device, so it also binds the
 * backend's device (a failure to bind shows up as the launch's error). */
static inline cudaStream_t kc_stream(kk_backend *be, kk_stream *st)
{
	(void) kc_bind(be);
	return st ? (cudaStream_t) st->handle : ((kc_ctx *) be->ctx)->stream;
}
static inline kc_dtype kc_dt(kk_dtype t)
{
	return (kc_dtype) t; /* KK_F32/BF16/F16 == KC_F32/BF16/F16 */
}

/* Vtable slots, one per entry of kernels/kk/include/kk_ops.def, implemented
 * in kernels/kk/cuda/<family>.cu (comm: nccl.cu); backend.cu puts them in the
 * ops table.  Arguments are already validated by kernels/kk/kk.c (see
 * kk_internal.h). */
#define KK_OP(NAME, name, family, dtypes, params) int kc_op_##name params;
#define KK_SLOT(ret, name, family, params)	  ret kc_op_##name params;
#include "kk_ops.def"

#ifdef __cplusplus
}
#endif

/* ---- device-side helpers shared by the .cu files (C++ only) ------------- */
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

static __device__ __forceinline__ float kc_ld(const float *p, size_t i)
{
	return p[i];
}
static __device__ __forceinline__ float kc_ld(const __nv_bfloat16 *p, size_t i)
{
	return __bfloat162float(p[i]);
}
static __device__ __forceinline__ float kc_ld(const __half *p, size_t i)
{
	return __half2float(p[i]);
}
static __device__ __forceinline__ void kc_st(float *p, size_t i, float v)
{
	p[i] = v;
}
static __device__ __forceinline__ void kc_st(__nv_bfloat16 *p, size_t i, float v)
{
	p[i] = __float2bfloat16(v);
}
static __device__ __forceinline__ void kc_st(__half *p, size_t i, float v)
{
	p[i] = __float2half(v);
}

static __device__ __forceinline__ float kc_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}
static __device__ __forceinline__ float kc_warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}
/* Block-wide sum (MAX false) or max (MAX true); every thread gets the
 * result.  `sh` holds 33 floats; blockDim.x is a multiple of 32.  Ends with
 * a barrier so `sh` may be reused. */
template <bool MAX> static __device__ __forceinline__ float kc_block_reduce(float v, float *sh)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = MAX ? kc_warp_max(v) : kc_warp_sum(v);
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	if (wid == 0) {
		float t = lane < nw ? sh[lane] : MAX ? -INFINITY : 0.0f;
		t = MAX ? kc_warp_max(t) : kc_warp_sum(t);
		if (lane == 0)
			sh[32] = t;
	}
	__syncthreads();
	float r = sh[32];
	__syncthreads();
	return r;
}
static __device__ __forceinline__ float kc_block_sum(float v, float *sh)
{
	return kc_block_reduce<false>(v, sh);
}
static __device__ __forceinline__ float kc_block_max(float v, float *sh)
{
	return kc_block_reduce<true>(v, sh);
}

/* Block-wide reduction of a pair (a, b): merge(a, b, a2, b2) folds (a2,
 * b2) into (a, b); (ia, ib) is the identity.  Every thread gets the
 * result.  `sh` holds 66 floats; blockDim.x is a multiple of 32.  Ends
 * with a barrier so `sh` may be reused. */
template <typename M>
static __device__ __forceinline__ void kc_block_reduce2(float &a, float &b, float *sh, float ia,
							float ib, M merge)
{
	for (int o = 16; o > 0; o >>= 1)
		merge(a, b, __shfl_xor_sync(0xffffffffu, a, o), __shfl_xor_sync(0xffffffffu, b, o));
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) {
		sh[wid] = a;
		sh[32 + wid] = b;
	}
	__syncthreads();
	if (wid == 0) {
		float ta = lane < nw ? sh[lane] : ia, tb = lane < nw ? sh[32 + lane] : ib;
		for (int o = 16; o > 0; o >>= 1)
			merge(ta, tb, __shfl_xor_sync(0xffffffffu, ta, o),
			      __shfl_xor_sync(0xffffffffu, tb, o));
		if (lane == 0) {
			sh[64] = ta;
			sh[65] = tb;
		}
	}
	__syncthreads();
	a = sh[64];
	b = sh[65];
	__syncthreads();
}

/* a[R][C] = b[R][C] = 0, unrolled (register accumulators stay in
 * registers). */
template <int R, int C>
static __device__ __forceinline__ void kc_zero2(float (*a)[C], float (*b)[C])
{
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int c = 0; c < C; c++)
			a[r][c] = b[r][c] = 0.0f;
}

/* Calls FN<T>(args...) with T the element type of `dt`; -EOPNOTSUPP for
 * any other dtype. */
#define KC_DISPATCH(dt, FN, ...)                            \
	((dt) == KC_F32	   ? FN<float>(__VA_ARGS__)         \
	 : (dt) == KC_BF16 ? FN<__nv_bfloat16>(__VA_ARGS__) \
	 : (dt) == KC_F16  ? FN<__half>(__VA_ARGS__)        \
			   : -EOPNOTSUPP)

/* The kc_dtype of an element type. */
template <typename T> struct kc_dtype_of_s;
template <> struct kc_dtype_of_s<float> {
	static const kc_dtype v = KC_F32;
};
template <> struct kc_dtype_of_s<__nv_bfloat16> {
	static const kc_dtype v = KC_BF16;
};
template <> struct kc_dtype_of_s<__half> {
	static const kc_dtype v = KC_F16;
};
template <typename T> static inline kc_dtype kc_dtype_of(void)
{
	return kc_dtype_of_s<T>::v;
}

/* Most blocks a grid-stride loop launches: 32 per SM of an H100/H200 fills
 * the GPU.  (The CPU emulation in tests/gpu/emu lowers it.) */
#ifndef KC_GRID_CAP
#define KC_GRID_CAP (132u * 32u)
#endif
/* Grid size for a grid-stride loop over n elements. */
static inline unsigned kc_grid(size_t n, int threads)
{
	size_t b = (n + threads - 1) / threads;
	if (b > KC_GRID_CAP)
		b = KC_GRID_CAP;
	return b ? (unsigned) b : 1u;
}

/* Threads for a one-block-per-row kernel over n columns. */
static inline int kc_row_threads(int n)
{
	int t = 32;
	while (t < n && t < 1024)
		t <<= 1;
	return t < 128 ? 128 : t > 512 ? 512 : t;
}
#endif
