/* kk_internal.h — what a kk backend implements: the structs behind the
 * opaque handles of kk.h and the per-backend vtable (its op slots come from
 * the op list, kernels/include/kk_ops.def).
 *
 * HOW A BACKEND IMPLEMENTS AN OP
 *
 * The public functions in kk.h (kernels/kk.c) check every argument before a
 * backend sees it: non-NULL handles, positive sizes, dtypes the op accepts,
 * every buffer large enough for the shape, every buffer and stream owned by
 * this backend, head dims 64/128, Q4 groups 32/64/128 ...  So a slot may
 * assume valid arguments and only has to return -EOPNOTSUPP for a dtype
 * combination or shape it does not handle (say, f16 attention).  A NULL
 * slot makes the public call return -EOPNOTSUPP.
 *
 *  - A kk_buffer is { backend, ptr, bytes, count, dtype }.  `ptr` is the
 *    backend's device pointer (cuda: from cudaMalloc; cpu: host memory),
 *    already offset for views, so a slot simply uses buf->ptr.  Shapes come
 *    in the arguments/descriptors, never from the buffer.
 *  - A kk_stream is { backend, handle }: cuda stores its cudaStream_t in
 *    `handle`.  st == NULL means the backend's default stream (cuda: a
 *    stream the backend owns, or the legacy stream 0).  Slots queue work on
 *    the stream and return without waiting, EXCEPT upload/download which
 *    return after the copy is done.  Report launch errors (cudaGetLastError)
 *    as -EIO; asynchronous faults surface at the next sync as -EIO.
 *  - Integer index buffers (cu_seqlens, block tables, ids ...) are device
 *    memory too.  The descriptors carry host-side bounds (max_seqlen,
 *    max_context_len) so a GPU backend can size its grid without reading
 *    them back.
 *  - Scratch memory: allocate per call or cache it in be->ctx; never keep
 *    pointers to caller buffers after the call returns.
 *  - Library code never prints; slots return -errno.
 *  - be->ctx is the backend's private state (cuda: device id, cuBLASLt
 *    handle, workspace, default stream); init() sets it, fini() frees it.
 *  - Collectives: comm_init() gets a kk_comm with rank/world/be filled in
 *    and stores its state (cuda: ncclComm_t) in c->impl; comm_get_id()
 *    fills KK_COMM_ID_BYTES bytes (cuda: ncclGetUniqueId's 128 bytes).
 *
 * REGISTERING A BACKEND
 *
 * The cpu backend is always built (kernels/cpu/, kk_cpu_ops()).  The cuda
 * backend lives in kernels/cuda/ (.cu files) and exports
 *     const struct kk_backend_ops *kk_cuda_ops(void);   (extern "C")
 * kernels/kk.c references it (weakly) only when compiled with
 * KILN_HAVE_CUDA=1, so CUDA=0 builds link without it and a CUDA=1 build
 * without the cuda objects reports "cuda" as -EOPNOTSUPP.  kernels/cuda/
 * build.mk adds its objects to libkk.a and its libraries to KK_LDLIBS:
 *     ifeq ($(CUDA),1)
 *     $(B)/lib/libkk.a: $(call kiln_objs,kernels/cuda/x.cu ...)
 *     KK_LDLIBS += -Wl,-u,kk_cuda_ops $(CUDA_LDLIBS) -lcublasLt -lnccl
 *     endif
 * (-u makes the linker pull the cuda object out of the archive.)  Every
 * program linking kk passes $(KK_LDLIBS) as its LDLIBS. */
#pragma once

#include "kk.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kk_backend {
	const struct kk_backend_ops *ops;
	void *ctx; /* backend-private */
};

struct kk_buffer {
	kk_backend *be;
	void *ptr;    /* device pointer, offset applied for views */
	size_t bytes; /* kk_dtype_size(dtype, count) */
	size_t count; /* elements */
	kk_dtype dtype;
	bool is_view; /* true: ptr belongs to another buffer, do not free */
};

struct kk_stream {
	kk_backend *be;
	void *handle; /* backend-private (cudaStream_t) */
};

struct kk_comm {
	kk_backend *be;
	int rank, world;
	void *impl; /* backend-private */
};

struct kk_backend_ops {
	const char *name;

	/* Lifetime.  available(): 1 if init() would succeed (cuda: a device is
	 * present), else 0.  init() may return -ENODEV, -ENOMEM, -EIO. */
	int (*available)(void);
	int (*init)(kk_backend *be);
	void (*fini)(kk_backend *be);
	int (*sync)(kk_backend *be);
	/* Host compute threads (NULL: the backend has none to set). */
	int (*set_threads)(kk_backend *be, int n);
	int (*threads)(const kk_backend *be);

	/* Memory.  alloc returns a device pointer of `bytes` (> 0) bytes. */
	int (*alloc)(kk_backend *be, size_t bytes, void **ret);
	void (*free)(kk_backend *be, void *ptr);
	int (*upload)(kk_backend *be, kk_stream *st, void *dst, const void *host, size_t bytes);
	int (*download)(kk_backend *be, kk_stream *st, void *host, const void *src, size_t bytes);
	int (*memset)(kk_backend *be, kk_stream *st, void *dst, int byte, size_t bytes);
	int (*copy)(kk_backend *be, kk_stream *st, void *dst, const void *src, size_t bytes);

	/* Streams: create fills st->handle. */
	int (*stream_create)(kk_backend *be, kk_stream *st);
	void (*stream_free)(kk_backend *be, kk_stream *st);
	int (*stream_sync)(kk_backend *be, kk_stream *st);

	/* Ops and the communicator: one slot per entry of kk_ops.def, with
	 * the same arguments as the kk.h function, already validated. */
#define KK_OP(NAME, name, family, dtypes, params) int(*name) params;
#define KK_SLOT(ret, name, family, params)	  ret(*name) params;
#include "kk_ops.def"
};

/* The built-in backends. */
const struct kk_backend_ops *kk_cpu_ops(void);
#if defined(KILN_HAVE_CUDA) && KILN_HAVE_CUDA
const struct kk_backend_ops *kk_cuda_ops(void) __attribute__((weak));
#endif

/* Test hook: install a copy of a backend's ops with some slots cleared,
 * so tests can check the -EOPNOTSUPP path.  Not for production use. */
int kk__backend_set_ops(kk_backend *be, const struct kk_backend_ops *ops);

#ifdef __cplusplus
}
#endif
