/* kernels/kk/cuda/backend.cu — the "cuda" kk backend: device selection, memory,
 * streams, and the vtable that kernels/kk/kk.c dispatches to.
 *
 * init() picks the device (KILN_CUDA_DEVICE, else LOCAL_RANK modulo the
 * device count as torchrun does, else 0), checks that the binary has code
 * for it (a pre-Hopper GPU reports -ENODEV, so "auto" falls back to cpu),
 * and creates a non-blocking default stream and a cuBLASLt handle with its
 * workspace.  Buffers are plain
 * cudaMalloc allocations; upload/download are cudaMemcpyAsync on the stream
 * followed by a stream sync (kk.h makes them blocking).  The op slots live in
 * the kc_*.cu files (see kc.h).  Every CUDA status is mapped to -errno;
 * nothing aborts or prints.
 * With the other .cu files it makes the CUDA module kk-cuda.so, whose one
 * export, kk_cuda_module_v1 (end of this file), is what kernels/kk/kk_module.c
 * loads: the ABI it checks, CUDART_VERSION, the driver and device probes
 * whose messages the programs print, and kk_cuda_ops().
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc.h"

static int kc_pick_device(int count)
{
	const char *e = getenv("KILN_CUDA_DEVICE");
	if (!e || !*e)
		e = getenv("LOCAL_RANK");
	if (e && *e) {
		char *end = NULL;
		long v = strtol(e, &end, 10);
		if (end && *end == '\0' && v >= 0)
			return (int) (v % count);
	}
	return 0;
}

/* A kernel that exists only so kc_usable() can ask whether this binary
 * holds code the device can run (sm_90 SASS + compute_90 PTX: Hopper or
 * newer); an older GPU would fail every launch. */
__global__ void kc_probe_kernel(int *p)
{
	if (p)
		*p = 1;
}

__thread int kc_thread_device = -1;

/* Bytes of stream-ordered scratch the device's default memory pool keeps
 * across syncs (its release threshold): a few steps' attention/norm scratch;
 * the pool never holds memory the workload did not ask for. */
#define KC_POOL_KEEP ((uint64_t) 1 << 30)

/* 1 when a device is present and can run this binary's kernels. */
static int kc_usable(int *device)
{
	int n = kc_device_count();
	if (n <= 0)
		return 0;
	int dev = kc_pick_device(n);
	cudaFuncAttributes a;
	kc_thread_device = -1; /* this thread's device may change below */
	if (cudaSetDevice(dev) != cudaSuccess ||
	    cudaFuncGetAttributes(&a, kc_probe_kernel) != cudaSuccess) {
		(void) cudaGetLastError();
		return 0;
	}
	kc_thread_device = dev;
	if (device)
		*device = dev;
	return 1;
}

static int kc_available(void)
{
	return kc_usable(NULL);
}

static void kc_fini(kk_backend *be)
{
	kc_ctx *ctx = (kc_ctx *) be->ctx;
	if (!ctx)
		return;
	(void) kc_bind(be);
	if (ctx->stream)
		cudaStreamSynchronize(ctx->stream);
	kc_attn_release(ctx);
	kc_blas_free(ctx->blas);
	if (ctx->stream)
		cudaStreamDestroy(ctx->stream);
	free(ctx);
	be->ctx = NULL;
}

static int kc_init(kk_backend *be)
{
	int dev = 0;
	if (!kc_usable(&dev))
		return -ENODEV; /* no device, or one this build has no code for */
	kc_ctx *ctx = (kc_ctx *) calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	be->ctx = ctx;
	ctx->device = dev;
	int r = kc_bind(be);
	if (r >= 0)
		r = kc_errno_cuda(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
	if (r >= 0)
		r = kc_blas_new(&ctx->blas);
#ifdef CUDART_VERSION /* the real runtime (the emulator has no pools) */
	if (r >= 0) {
		/* Scratch (attention delta, norm partials, dequantized weights)
		 * is cudaMallocAsync from the device's default pool, whose release
		 * threshold is 0: every stream sync hands the memory back to the
		 * driver and the next step maps it again.  Keep up to
		 * KC_POOL_KEEP cached; more is trimmed at syncs as before. */
		cudaMemPool_t pool;
		uint64_t keep = KC_POOL_KEEP;
		if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess)
			(void) cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
						       &keep);
		(void) cudaGetLastError();
	}
#endif
	if (r < 0) {
		kc_fini(be);
		return r;
	}
	return 0;
}

static int kc_sync(kk_backend *be)
{
	int r = kc_bind(be);
	if (r < 0)
		return r;
	/* the default stream through the NCCL-aware wait, then the rest */
	r = kc_wait_stream(be, ((kc_ctx *) be->ctx)->stream);
	if (r < 0)
		return r;
	return kc_errno_cuda(cudaDeviceSynchronize());
}

static int kc_alloc(kk_backend *be, size_t bytes, void **ret)
{
	void *p = NULL;
	int r = kc_bind(be);
	if (r < 0)
		return r;
	r = kc_errno_cuda(cudaMalloc(&p, bytes));
	if (r < 0)
		return r;
	*ret = p;
	return 0;
}

static void kc_free(kk_backend *be, void *ptr)
{
	(void) kc_bind(be); /* cudaFree may synchronize the current device */
	cudaFree(ptr);
}

/* A copy between host and device on st, waited for (upload and download
 * return once the data is there). */
static int kc_memcpy_wait(kk_backend *be, kk_stream *st, void *dst, const void *src, size_t bytes,
			  cudaMemcpyKind kind)
{
	cudaStream_t s = kc_stream(be, st);
	int r = kc_errno_cuda(cudaMemcpyAsync(dst, src, bytes, kind, s));
	if (r < 0)
		return r;
	return kc_wait_stream(be, s);
}

static int kc_upload(kk_backend *be, kk_stream *st, void *dst, const void *host, size_t bytes)
{
	return kc_memcpy_wait(be, st, dst, host, bytes, cudaMemcpyHostToDevice);
}

static int kc_download(kk_backend *be, kk_stream *st, void *host, const void *src, size_t bytes)
{
	return kc_memcpy_wait(be, st, host, src, bytes, cudaMemcpyDeviceToHost);
}

static int kc_memset(kk_backend *be, kk_stream *st, void *dst, int byte, size_t bytes)
{
	return kc_errno_cuda(cudaMemsetAsync(dst, byte, bytes, kc_stream(be, st)));
}

static int kc_copy(kk_backend *be, kk_stream *st, void *dst, const void *src, size_t bytes)
{
	return kc_errno_cuda(
		cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, kc_stream(be, st)));
}

static int kc_stream_create(kk_backend *be, kk_stream *st)
{
	cudaStream_t s = NULL;
	int r = kc_bind(be); /* a stream belongs to the device current at creation */
	if (r < 0)
		return r;
	r = kc_errno_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	if (r < 0)
		return r;
	st->handle = s;
	return 0;
}

static void kc_stream_free(kk_backend *be, kk_stream *st)
{
	if (!st->handle)
		return;
	(void) kc_bind(be);
	cudaStreamSynchronize((cudaStream_t) st->handle);
	cudaStreamDestroy((cudaStream_t) st->handle);
	st->handle = NULL;
}

static int kc_stream_sync(kk_backend *be, kk_stream *st)
{
	return kc_wait_stream(be, kc_stream(be, st));
}

/* Filled once (pthread_once: no C++ runtime needed for a guarded static). */
static struct kk_backend_ops kc_ops;
static pthread_once_t kc_ops_once = PTHREAD_ONCE_INIT;

static void kc_ops_fill(void)
{
	struct kk_backend_ops *o = &kc_ops;
	o->name = "cuda";
	/* No kk_cap: device memory, int8 per channel only (quant.cu), one
	 * kk_qmatrix layout (qmatrix_pack stays NULL). */
	o->caps = 0;
	o->available = kc_available;
	o->init = kc_init;
	o->fini = kc_fini;
	o->sync = kc_sync;
	o->alloc = kc_alloc;
	o->free = kc_free;
	o->upload = kc_upload;
	o->download = kc_download;
	o->memset = kc_memset;
	o->copy = kc_copy;
	o->stream_create = kc_stream_create;
	o->stream_free = kc_stream_free;
	o->stream_sync = kc_stream_sync;
#define KK_OP(NAME, name, family, dtypes, params) o->name = kc_op_##name;
#define KK_SLOT(ret, name, family, params)	  o->name = kc_op_##name;
#include "kk_ops.def"
}

extern "C" const struct kk_backend_ops *kk_cuda_ops(void)
{
	pthread_once(&kc_ops_once, kc_ops_fill);
	return &kc_ops;
}

/* ---- the module (kk-cuda.so) --------------------------------------------
 * What kernels/kk/kk_module.c finds in kk-cuda.so: the ABI it checks, the CUDA
 * version this was built with and the probes it calls before the ops. */

static int kc_driver_version(void)
{
	int v = 0;
#ifdef CUDART_VERSION
	if (cudaDriverGetVersion(&v) != cudaSuccess) {
		(void) cudaGetLastError();
		return 0;
	}
#endif
	return v;
}

static int kc_probe(char *msg, size_t len)
{
	int n = 0, dev;
#ifdef CUDART_VERSION
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void) cudaGetLastError();
		snprintf(msg, len,
			 "no usable CUDA device: cudaGetDeviceCount: %s (%s); check that "
			 "nvidia-smi lists the GPUs and that /dev/nvidia* exist",
			 cudaGetErrorString(e), cudaGetErrorName(e));
		return -ENODEV;
	}
#else
	n = kc_device_count();
#endif
	if (n <= 0) {
		snprintf(msg, len, "no CUDA device: the driver reports 0 GPUs; check nvidia-smi");
		return -ENODEV;
	}
	if (!kc_usable(&dev)) {
		dev = kc_pick_device(n);
#ifdef CUDART_VERSION
		int major = 0, minor = 0;
		(void) cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
		(void) cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
		(void) cudaGetLastError();
		snprintf(msg, len,
			 "CUDA device %d (sm_%d%d) cannot run kiln's CUDA kernels (built for "
			 "sm_90, Hopper, and newer); use the cpu backend on this node",
			 dev, major, minor);
#else
		snprintf(msg, len, "CUDA device %d cannot run kiln's CUDA kernels", dev);
#endif
		return -ENODEV;
	}
	return 0;
}

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif
#define KK_OP	KK_MODULE_SLOT_OP
#define KK_SLOT KK_MODULE_SLOT_FN
static const char kc_slots[] = ""
#include "kk_ops.def"
	;

extern "C" __attribute__((visibility("default"))) const struct kk_module KK_MODULE_SYMBOL = {
	KK_MODULE_ABI,	   KILN_VERSION,
	kc_slots,	   KK_MODULE_SIZES,
#ifdef CUDART_VERSION
	CUDART_VERSION,	   CUDART_VERSION / 1000 * 1000,
#else
	0,
	0,
#endif
	kc_driver_version, kc_probe,
	kk_cuda_ops,
};
