/* kk_internal.h — what a kk backend implements: the structs behind the
 * opaque handles of kk.h and the per-backend vtable (its op slots come from
 * the op list, kernels/kk/include/kk_ops.def).
 *
 * HOW A BACKEND IMPLEMENTS AN OP
 *
 * The public functions in kk.h (kernels/kk/kk.c) check every argument before a
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
 * The cpu backend is always built into libkk.a (kernels/kk/cpu/, kk_cpu_ops()).
 * The cuda backend (kernels/kk/cuda/, .cu files) is its own shared object, the
 * CUDA module kk-cuda.so, built with CUDA=1 at $(B)/lib/kiln/kk-cuda.so and
 * installed at $(PREFIX)/lib/kiln/kk-cuda.so; it alone links libcudart,
 * libcublasLt and libnccl, so libkk.a and every program have no link-time
 * CUDA dependency.  kernels/kk/kk.c dlopen()s it for "cuda" and "auto" (see
 * kk_backend_open_why() in kk.h for the lookup order) and finds in it one
 * symbol, KK_MODULE_SYMBOL, a struct kk_module: the module's ABI, which the
 * loader compares with its own before it calls anything (a module from
 * another kiln version, or built from other kk headers, is refused), the
 * CUDA version it was built with and its probe (driver, device).
 *
 * A program that links the cuda objects statically (the CPU emulation of
 * tests/gpu/emu/) defines the same symbol; kernels/kk/kk.c refers to
 * it weakly and uses it instead of loading a module. */
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
	const char *name; /* for messages only: nothing chooses a path by it */
	/* What kk_backend_has() answers: bit (1u << KK_CAP_x) for each kk_cap
	 * the backend has, except KK_CAP_QPACK (the qmatrix_pack slot). */
	unsigned caps;

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

	/* kk_qmatrix_pack on a valid q (NULL: one layout, -EOPNOTSUPP). */
	int (*qmatrix_pack)(kk_backend *be, kk_qmatrix *q);

	/* Ops and the communicator: one slot per entry of kk_ops.def, with
	 * the same arguments as the kk.h function, already validated. */
#define KK_OP(NAME, name, family, dtypes, params) int(*name) params;
#define KK_SLOT(ret, name, family, params)	  ret(*name) params;
#include "kk_ops.def"
};

/* The built-in backend. */
const struct kk_backend_ops *kk_cpu_ops(void);

/* ---- the CUDA module's ABI ----------------------------------------------
 * KK_MODULE_ABI is in the symbol's name: bump it when struct kk_module
 * changes.  Everything else a module shares with the program is checked at
 * load through struct kk_module's fields: the kiln version, every slot's
 * name and parameter list as text (KK_MODULE_SLOT_OP/_FN over kk_ops.def,
 * below) and the sizes of the structs the slots take (KK_MODULE_SIZES).  A
 * change to a kk.h struct that keeps its size is not caught: bump
 * KK_MODULE_ABI then. */
#define KK_MODULE_ABI	      1
#define KK_MODULE_SYMBOL      kk_cuda_module_v1
#define KK_MODULE_SYMBOL_NAME "kk_cuda_module_v1"
#define KK_MODULE_FILE	      "kk-cuda.so"

#define KK_MODULE_SLOT_OP(NAME, name, family, dtypes, params) #name #params ";"
#define KK_MODULE_SLOT_FN(ret, name, family, params)	      #ret " " #name #params ";"
#define KK_MODULE_NSIZES				      11
#define KK_MODULE_SIZES                                                                   \
	{                                                                                 \
		sizeof(struct kk_backend_ops), sizeof(struct kk_backend),                 \
			sizeof(struct kk_buffer), sizeof(struct kk_stream),               \
			sizeof(struct kk_comm), sizeof(kk_gemm_desc), sizeof(kk_qmatrix), \
			sizeof(kk_attn_desc), sizeof(kk_paged_desc), sizeof(kk_sampling), \
			sizeof(kk_adamw_params)                                           \
	}

/* Room for a probe's message: what is missing and what to do, one line. */
#define KK_MODULE_MSG_MAX KK_WHY_MAX

struct kk_module {
	unsigned abi;			/* KK_MODULE_ABI */
	const char *kiln_version;	/* KILN_VERSION of the build */
	const char *slots;		/* every slot's text (see below) */
	size_t sizes[KK_MODULE_NSIZES]; /* KK_MODULE_SIZES of the build */
	int cuda_version;		/* CUDART_VERSION built with: 1000 * major + 10 * minor */
	/* What the driver must support, in cudaDriverGetVersion()'s units (0:
	 * no check, the emulator): the major version of cuda_version, X.0,
	 * as CUDA's minor version compatibility lets an X.y runtime run on
	 * any driver for X.0 (the module carries sm_90 SASS). */
	int cuda_needed;
	/* cudaDriverGetVersion(): 0 when no driver (libcuda.so.1) is found. */
	int (*driver_version)(void);
	/* 0 when a device can run the module's kernels; else -ENODEV with msg
	 * (len bytes) saying which device is missing or unusable, why (the CUDA
	 * error) and what to do.  Called after the driver check. */
	int (*probe)(char *msg, size_t len);
	const struct kk_backend_ops *(*ops)(void);
};

/* The text of every slot, in order, for struct kk_module's `slots`:
 *     #define KK_OP KK_MODULE_SLOT_OP
 *     #define KK_SLOT KK_MODULE_SLOT_FN
 *     static const char slots[] = ""
 *     #include "kk_ops.def"
 *     ;                                                                  */

/* kernels/kk/kk_module.c, the loader.  The cuda backend's ops: the module is
 * found, loaded and checked on the first call (once per process, then the
 * result is kept), the device probed on every call.  0 and *ret, or
 * -EOPNOTSUPP (no module file), -ELIBACC (dlopen failed: a library it needs
 * is missing), -ELIBBAD (not a module of this build), -ENODEV (no driver, a
 * driver too old, no usable device), with `why` (len bytes, may be NULL)
 * saying what is missing and what to do. */
int kk__cuda_ops(const struct kk_backend_ops **ret, char *why, size_t len);
/* The driver check: 0 when `driver` (cudaDriverGetVersion) >= `needed`,
 * else -ENODEV and the message (no driver; or too old, with the driver
 * release to install). */
int kk__cuda_driver_check(int driver, int needed, char *why, size_t len);

/* kk_sample_host's body: cpu/sample.c's sampler on host floats. */
int kk__cpu_sample_host(const float *logits, int64_t rows, int64_t vocab, const kk_sampling *p,
			int32_t *ids);
/* kk_logsumexp_host's body (cpu/sample.c). */
double kk__cpu_logsumexp(const float *x, int64_t n);
/* The cpu sampler as it was before its one-pass paths: every row sorted
 * whole, buffers allocated per call; the same tokens as kk__cpu_sample_host
 * (tests check it draw for draw; make bench's sampler table measures it as
 * the baseline).  -EINVAL, -ENOMEM. */
int kk__cpu_sample_host_sorted(const float *logits, int64_t rows, int64_t vocab,
			       const kk_sampling *p, int32_t *ids);

/* Test hook: install a copy of a backend's ops with some slots cleared,
 * so tests can check the -EOPNOTSUPP path.  Not for production use. */
int kk__backend_set_ops(kk_backend *be, const struct kk_backend_ops *ops);

#ifdef __cplusplus
}
#endif
