/* tests/gpu/emu/include/cuda_runtime.h — a CPU emulation of the
 * small part of the CUDA runtime and device language that kernels/kk/cuda/ uses,
 * so its kernels can run (slowly) on a machine without a GPU.
 *
 * Each CUDA thread of a block is an OS thread; blocks run one after another;
 * __syncthreads is a barrier over the block, warp shuffles exchange through a
 * per-warp buffer between two warp barriers.  Memory is host memory, streams
 * are synchronous.  This checks the kernels' indexing, reductions, masking
 * and launch code; it cannot check timing, coalescing or the memory model of
 * a real GPU.  Used only by tests/gpu/emu/test-emu.sh. */
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidDevicePointer = 17,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInsufficientDriver = 35,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorNoKernelImageForDevice = 209,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotSupported = 801,
	cudaErrorInvalidDeviceFunction = 98,
} cudaError_t;

typedef struct kc_emu_stream *cudaStream_t;
enum cudaMemcpyKind {
	cudaMemcpyHostToHost,
	cudaMemcpyHostToDevice,
	cudaMemcpyDeviceToHost,
	cudaMemcpyDeviceToDevice
};
#define cudaStreamNonBlocking 1
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;

struct dim3 {
	unsigned x, y, z;
	dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c)
	{
	}
};
struct uint3 {
	unsigned x, y, z;
};

cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
struct cudaFuncAttributes {
	int maxThreadsPerBlock;
};
template <typename F> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F)
{
	a->maxThreadsPerBlock = 1024;
	return cudaSuccess;
}
template <typename F> cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int v)
{
	return v > 227 * 1024 ? cudaErrorInvalidValue : cudaSuccess;
}

/* ---- the device language ------------------------------------------------ */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__	static
#define __launch_bounds__(...)

extern __thread uint3 kc_emu_tid; /* __thread: no TLS wrapper (UBSan misreads it as null) */
extern uint3 kc_emu_bid;
extern dim3 kc_emu_bdim, kc_emu_gdim;
#define threadIdx kc_emu_tid
#define blockIdx  kc_emu_bid
#define blockDim  kc_emu_bdim
#define gridDim	  kc_emu_gdim

void __syncthreads(void);
void kc_emu_warp_sync(void);
uint64_t *kc_emu_warp_slots(void); /* this warp's 32 exchange slots */
void *kc_emu_dyn_smem(void);
void kc_emu_atomic_lock(void);
void kc_emu_atomic_unlock(void);

/* Reports a bug a GPU would not forgive (prints where, then aborts). */
[[noreturn]] void kc_emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* p must be n-byte aligned (vector loads/stores, ldmatrix rows, cp.async). */
static inline void kc_emu_check_align(const void *p, size_t n, const char *what)
{
	if ((uintptr_t) p % n)
		kc_emu_fail("%s at %p: not %zu-byte aligned", what, p, n);
}
/* Registers a static __shared__ variable so it is poisoned per block
 * (cu2cpp.py puts one beside each declaration). */
struct kc_emu_shreg {
	kc_emu_shreg(void *p, size_t n);
};
/* Enters a warp collective: the warp meets at a barrier and each lane checks
 * that every lane of `mask` is there, at the same call (line) and the same
 * dynamic instance, and that `src` (if >= 0) is in the mask.  The emulator
 * runs every lane of the warp at each collective, so masks that leave lanes
 * out are reported rather than emulated (kernels/kk/cuda uses full masks). */
void kc_emu_warp_enter(unsigned mask, int line, int src);
void kc_emu_cp_async16(void *s, const void *g, bool ok);
void kc_emu_cp_commit(void);
void kc_emu_cp_wait(int n);

template <typename T> static inline T kc_emu_shfl(unsigned mask, T v, int src, int line)
{
	static_assert(sizeof(T) <= 8, "shuffle of a wide type");
	uint64_t *s = kc_emu_warp_slots();
	uint64_t b = 0;
	memcpy(&b, &v, sizeof(T));
	s[kc_emu_tid.x & 31] = b;
	kc_emu_warp_enter(mask, line, src & 31);
	b = s[src & 31];
	kc_emu_warp_sync();
	T r;
	memcpy(&r, &b, sizeof(T));
	return r;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned m, T v, int o, int width = 32, int line = __builtin_LINE())
{
	return kc_emu_shfl(m, v, (int) (kc_emu_tid.x & 31) ^ o, line);
}
template <typename T>
static inline T __shfl_sync(unsigned m, T v, int src, int width = 32, int line = __builtin_LINE())
{
	return kc_emu_shfl(m, v, src, line);
}
/* A barrier over the warp's lanes (and memory ordering between them: the
 * lanes are OS threads meeting at a pthread barrier), checked like the
 * other collectives; the second barrier keeps a lane from entering the next
 * collective before every lane has checked this one. */
static inline void __syncwarp(unsigned m = 0xffffffffu, int line = __builtin_LINE())
{
	kc_emu_warp_enter(m, line, -1);
	kc_emu_warp_sync();
}
template <typename T> static inline T atomicAdd(T *p, T v)
{
	kc_emu_atomic_lock();
	T old = *p;
	*p = old + v;
	kc_emu_atomic_unlock();
	return old;
}

template <typename A, typename B> static inline typename std::common_type<A, B>::type min(A a, B b)
{
	return a < b ? a : b;
}
template <typename A, typename B> static inline typename std::common_type<A, B>::type max(A a, B b)
{
	return a > b ? a : b;
}
static inline float rsqrtf(float x)
{
	return 1.0f / sqrtf(x);
}
static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, 4);
	return u;
}
static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline float __int_as_float(int i)
{
	float f;
	memcpy(&f, &i, 4);
	return f;
}

/* ---- launches: kernel<<<g, b, smem, s>>>(args) is rewritten by
 * test-emu.sh into kc_emu_launch(kc_cfg(g, b, smem, s), kernel, args). */
struct kc_emu_cfg {
	dim3 g, b;
	size_t smem;
};
static inline kc_emu_cfg kc_cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t = 0)
{
	return kc_emu_cfg{ g, b, smem };
}
typedef void (*kc_emu_body)(void *);
void kc_emu_run(kc_emu_cfg c, kc_emu_body body, void *arg);

template <typename F> static void kc_emu_call(void *f)
{
	(*(F *) f)();
}
template <typename... P, typename... A>
static inline void kc_emu_launch(kc_emu_cfg c, void (*k)(P...), A... args)
{
	auto fn = [&]() { k(((P) args)...); };
	kc_emu_run(c, kc_emu_call<decltype(fn)>, &fn);
}

/* Vector types and packed-half intrinsics (kc_emu_vec.h), warp-level matrix
 * instructions (kc_emu_mma.h). */
#include "kc_emu_vec.h"
#include "kc_emu_mma.h"
