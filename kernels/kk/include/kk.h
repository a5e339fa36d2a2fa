/* kk.h — the kiln kernel library: one C API over several compute backends.
 *
 * kiln-train, kiln-inferd and kiln-healthd's active GPU checks all call these
 * functions.  A backend ("cpu": OpenBLAS + threads, always built; "cuda":
 * cuBLASLt, custom kernels, NCCL, built when nvcc exists) is chosen at run
 * time by name; the environment variable KILN_BACKEND overrides the name the
 * program asked for.  Every op has the same signature on every backend; a
 * backend that lacks an op makes the call return -EOPNOTSUPP (never a crash).
 *
 * Conventions (docs/kernels.md has the long form):
 *  - Every tensor is a row-major kk_buffer living on one backend's device.
 *    Shapes are given in elements; "[a, b, c]" means c varies fastest.
 *  - Every op takes (backend, stream) first.  stream NULL = the backend's
 *    default stream.  Ops are asynchronous with respect to the host on
 *    backends that can be (cuda); kk_stream_sync()/kk_backend_sync() wait.
 *    The cpu backend runs everything synchronously.
 *  - Arithmetic is in f32 whatever the storage dtype (bf16/f16 inputs are
 *    widened, results rounded to nearest-even on store).
 *  - Activation gradients (dx, dq ...) are OVERWRITTEN; parameter gradients
 *    (dweight, dbias, dtable) are ACCUMULATED (+=) and are always f32, so a
 *    trainer can accumulate micro-batches and must zero them per step.
 *  - Integer index tensors (token ids, positions, cu_seqlens, block tables,
 *    context lengths, sampled ids) are KK_I32.
 *  - Return values: 0 on success or a negative errno.  Errors every op can
 *    return, in addition to those listed per function:
 *      -EINVAL      a NULL required argument, a non-positive size, a dtype
 *                   the op does not accept, a buffer smaller than the shape
 *                   needs, or buffers/streams from different backends;
 *      -EOPNOTSUPP  this backend does not implement the op, or not for this
 *                   dtype combination / head dim;
 *      -ENOMEM      scratch memory could not be allocated;
 *      -EIO         the device reported an error (cuda).
 *
 * Thread safety: a backend handle may be used from several threads as long
 * as each thread uses its own stream; buffers are not locked. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Handles and dtypes                                                        */

typedef struct kk_backend kk_backend; /* one opened backend (device + library handles) */
typedef struct kk_buffer kk_buffer;   /* a device allocation or a view into one */
typedef struct kk_stream kk_stream;   /* an ordered queue of work on one backend */
typedef struct kk_comm kk_comm;	      /* a communicator for collectives */

typedef enum kk_dtype {
	KK_F32 = 0,
	KK_BF16 = 1,
	KK_F16 = 2,
	KK_I8 = 3,  /* int8 weights; scales per output channel live in a kk_qmatrix */
	KK_Q4 = 4,  /* int4 weights, two per byte; per-group scales in a kk_qmatrix */
	KK_I32 = 5, /* indices: token ids, positions, offsets, block tables */
	KK_DTYPE_MAX
} kk_dtype;

/* Name ("f32", "bf16", "f16", "i8", "q4", "i32") or NULL for an invalid dtype. */
const char *kk_dtype_name(kk_dtype dt);
/* Bytes needed for `count` elements of dt (KK_Q4: (count + 1) / 2); 0 for an
 * invalid dtype or on overflow. */
size_t kk_dtype_size(kk_dtype dt, size_t count);

/* ------------------------------------------------------------------------ */
/* Backends                                                                  */

/* Longest backend name, with its NUL. */
#define KK_BACKEND_NAME_MAX 16

/* Opens a backend.  name: "cpu", "cuda", or NULL/"auto" for the best
 * available (cuda if the CUDA module loads and a GPU is usable, else cpu).
 * A non-empty KILN_BACKEND environment variable replaces `name`.
 *
 * "cpu" is built in.  "cuda" is the CUDA module kk-cuda.so, loaded on first
 * use (once per process) from, in order: $KILN_KK_CUDA (an explicit path,
 * the only one tried when set); ../lib/kiln/kk-cuda.so next to the running
 * binary (build/bin -> build/lib/kiln; PREFIX/bin -> PREFIX/lib/kiln); the
 * install dir of the build, $(PREFIX)/lib/kiln.  The module must be of this
 * kiln version and kk ABI, and the driver must support its CUDA major
 * version.
 *
 * Errors: -EINVAL unknown name; -EOPNOTSUPP the CUDA module is not
 * installed; -ELIBACC it cannot be loaded (a library it needs, libcudart,
 * libcublasLt or libnccl, is missing); -ELIBBAD it is not a module of this
 * build; -ENODEV no NVIDIA driver, a driver too old, or no usable device;
 * -ENOMEM; -EIO device/library initialisation failed.  "auto" fails only
 * when the cpu backend does. */
int kk_backend_open(const char *name, kk_backend **ret);
/* Room for kk_backend_open_why()'s message. */
#define KK_WHY_MAX 1024
/* kk_backend_open(), saying why in `why` (len bytes, KK_WHY_MAX is enough;
 * NULL allowed): on failure, what is missing and what to do (one line, for
 * the program to print); on success "", or when "auto" fell back to the cpu,
 * why cuda was not used (for the program to log once). */
int kk_backend_open_why(const char *name, kk_backend **ret, char *why, size_t len);
/* Frees the backend; every buffer, stream and comm of it must be freed
 * first.  Accepts NULL.  Returns NULL. */
kk_backend *kk_backend_free(kk_backend *be);
/* "cpu" or "cuda", for messages: code that must choose a path asks
 * kk_supports() or kk_backend_has(), never the name. */
const char *kk_backend_name(const kk_backend *be);
/* Whether `name` could be opened right now: 1 yes, 0 no, -EINVAL unknown name. */
int kk_backend_available(const char *name);
/* Waits until all work queued on every stream of the backend has finished.
 * Errors: -EINVAL, -EIO. */
int kk_backend_sync(kk_backend *be);

/* Most compute threads kk_backend_set_threads accepts. */
#define KK_THREADS_MAX 256
/* Sets how many threads the backend computes with on the host, the
 * caller's included: n in 1..KK_THREADS_MAX, or 0 for the default (cpu:
 * $KK_CPU_THREADS when set, else the CPUs of the process's affinity mask,
 * capped by its cgroup v2 cpu.max quota).  On cpu the setting and the
 * worker pool are process-wide (the last call wins) and OpenBLAS is held
 * to one thread, because kk's own threads split every GEMM; backends that
 * compute on a device accept and ignore it.
 * Errors: -EINVAL (NULL be, n outside 0..KK_THREADS_MAX). */
int kk_backend_set_threads(kk_backend *be, int n);
/* The compute threads the backend uses now (1 for device backends). */
int kk_backend_threads(const kk_backend *be);

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

/* Errors: -EINVAL, -ENOMEM, -EOPNOTSUPP, -EIO. */
int kk_stream_create(kk_backend *be, kk_stream **ret);
/* Waits for the stream's work, then frees it.  Accepts NULL.  Returns NULL. */
kk_stream *kk_stream_free(kk_stream *st);
/* Waits until the stream's queued work is done.  st NULL: the default
 * stream of be.  Errors: -EINVAL, -EIO. */
int kk_stream_sync(kk_backend *be, kk_stream *st);

/* ------------------------------------------------------------------------ */
/* Buffers                                                                   */

/* Largest single allocation accepted (64 GiB), so a bad size computation
 * fails with -EINVAL instead of swapping the host or exhausting the device. */
#define KK_BUFFER_MAX_BYTES (UINT64_C(64) << 30)

/* Allocates `count` elements of dt on be; contents are undefined.
 * Errors: -EINVAL (count 0, bad dtype, over KK_BUFFER_MAX_BYTES), -ENOMEM. */
int kk_buffer_alloc(kk_backend *be, kk_dtype dt, size_t count, kk_buffer **ret);
/* A non-owning view of `count` elements of parent starting at element
 * `offset`, with the parent's dtype.  The view must be freed (it owns only
 * its handle) before the parent.  For KK_Q4 offset must be even.
 * Errors: -EINVAL (out of range, odd Q4 offset), -ENOMEM. */
int kk_buffer_view(kk_buffer *parent, size_t offset, size_t count, kk_buffer **ret);
/* A non-owning buffer over `count` elements of dt in the caller's host
 * memory, for backends whose buffers are host memory (cpu): the ops read
 * it in place, nothing is copied.  The memory must stay valid (and, when
 * it is a weight, unwritten) until the buffer is freed; kk never frees it.
 * Used to compute on a model file's read-only mapping (an op writing to
 * such a buffer faults instead of corrupting the file's pages).
 * Errors: -EINVAL (count 0, bad dtype, ptr not aligned to the element
 * size), -EOPNOTSUPP (a backend without KK_CAP_HOST_MEMORY: a device
 * backend), -ENOMEM. */
int kk_buffer_wrap_host(kk_backend *be, kk_dtype dt, const void *ptr, size_t count,
			kk_buffer **ret);
/* Frees a buffer or view.  Accepts NULL.  Returns NULL. */
kk_buffer *kk_buffer_free(kk_buffer *buf);

kk_dtype kk_buffer_dtype(const kk_buffer *buf);
size_t kk_buffer_count(const kk_buffer *buf); /* elements */
size_t kk_buffer_bytes(const kk_buffer *buf);
kk_backend *kk_buffer_backend(const kk_buffer *buf);

/* Copies host memory into buf at byte offset `offset`.  Blocking: returns
 * once the data is on the device (after earlier work on st).
 * Errors: -EINVAL (range outside buf), -EIO. */
int kk_buffer_upload(kk_backend *be, kk_stream *st, kk_buffer *dst, size_t offset, const void *src,
		     size_t bytes);
/* Copies buf bytes [offset, offset+bytes) to host memory.  Blocking: waits
 * for earlier work on st first.  Errors: -EINVAL, -EIO. */
int kk_buffer_download(kk_backend *be, kk_stream *st, const kk_buffer *src, size_t offset,
		       void *dst, size_t bytes);
/* Sets every byte of [offset, offset+bytes) to `byte`.  Asynchronous.
 * Errors: -EINVAL, -EIO. */
int kk_buffer_memset(kk_backend *be, kk_stream *st, kk_buffer *buf, int byte, size_t offset,
		     size_t bytes);
/* Device-to-device copy of `bytes` bytes; the ranges must not overlap.
 * Asynchronous.  Errors: -EINVAL (range, overlap, other backend), -EIO. */
int kk_buffer_copy(kk_backend *be, kk_stream *st, kk_buffer *dst, size_t dst_offset,
		   const kk_buffer *src, size_t src_offset, size_t bytes);

/* Host-side dtype conversion (round to nearest even), for loading weights
 * and checking results.  src_dt/dst_dt in {F32, BF16, F16}.
 * Errors: -EINVAL. */
int kk_convert_host(kk_dtype dst_dt, void *dst, kk_dtype src_dt, const void *src, size_t count);
float kk_bf16_to_f32(uint16_t h);
uint16_t kk_f32_to_bf16(float f);
float kk_f16_to_f32(uint16_t h);
uint16_t kk_f32_to_f16(float f);

/* Device-side conversion: dst[i] = src[i] for count elements, both in
 * {F32, BF16, F16} (e.g. fp32 master weights -> bf16 compute copy). */
int kk_cast(kk_backend *be, kk_stream *st, kk_buffer *dst, const kk_buffer *src, size_t count);
/* x[i] *= scale for count elements of an F32/BF16/F16 buffer (in place). */
int kk_scale(kk_backend *be, kk_stream *st, kk_buffer *x, float scale, size_t count);

/* ------------------------------------------------------------------------ */
/* GEMM                                                                      */

typedef enum kk_epilogue {
	KK_EPI_NONE = 0,
	KK_EPI_GELU = 1, /* tanh approximation, as cuBLASLt's GELU epilogue */
	KK_EPI_SILU = 2,
} kk_epilogue;

/* C = epilogue(alpha * op(A) op(B) + beta * C + bias), for `batch` matrices.
 *
 * Row-major.  op(A) is [m, k]: A is stored [m, k] (trans_a false) or [k, m]
 * (trans_a true) with leading dimension lda (elements between rows of the
 * STORED matrix, >= its column count).  Likewise op(B) [k, n] and C [m, n]
 * with ldc >= n.  Batch i uses A + i*stride_a, B + i*stride_b, C + i*stride_c
 * (elements; 0 broadcasts A or B across the batch).
 * Dtypes: A and B the same, in {F32, BF16, F16}; C is F32 or A's dtype;
 * accumulation in f32.  beta == 0: C is not read (may hold NaN).
 * bias: NULL or F32/C-dtype [n], added to every row.
 * Errors: the common ones. */
typedef struct kk_gemm_desc {
	bool trans_a, trans_b;
	int64_t m, n, k;
	int64_t batch; /* 0 or 1: a single GEMM */
	float alpha, beta;
	const kk_buffer *a;
	int64_t lda, stride_a;
	const kk_buffer *b;
	int64_t ldb, stride_b;
	kk_buffer *c;
	int64_t ldc, stride_c;
	const kk_buffer *bias;
	kk_epilogue epilogue;
} kk_gemm_desc;

int kk_gemm(kk_backend *be, kk_stream *st, const kk_gemm_desc *d);

/* ------------------------------------------------------------------------ */
/* Weight-only quantization                                                  */

/* A quantized weight matrix W [n, k] (n output channels, k inputs: the
 * nn.Linear layout), symmetric (no zero point):
 *  - KK_I8: data is I8 [n, k]; group 0: scales [n]; w = q * scale[row],
 *    q in -127..127, scale = max|w_row| / 127.  group 32 (GGUF's Q8_0
 *    blocks; k a multiple of 32): scales [n, k / 32], w = q * scale[row,
 *    j / 32], scale = max|w_group| / 127; only on a backend with
 *    KK_CAP_I8_GROUP32 (cpu; others return -EOPNOTSUPP).
 *  - KK_Q4: data is Q4 [n, k] (n * k / 2 bytes, element j of a row in byte
 *    j/2, even j in the low nibble), stored as q + 8 with q in -8..7;
 *    scales [n, k / group]; w = q * scale[row, j / group];
 *    scale = max|w_group| / 7.  group is 32, 64 or 128 and divides k.
 * scales are F32 or F16.  All-zero rows/groups get scale 0. */
typedef struct kk_qmatrix {
	kk_dtype qtype; /* KK_I8 or KK_Q4 */
	int64_t n, k;
	int group; /* KK_Q4: 32, 64 or 128; KK_I8: 0 (per channel) or 32 */
	kk_buffer *data;
	kk_buffer *scales;
	/* 0: rows one after another (the layout above).  KK_QPACK: the cpu
	 * backend's interleaved layout (kk_qmatrix_pack): only its own
	 * kk_qgemm and kk_dequantize read it. */
	int pack;
} kk_qmatrix;

/* Rows per interleaved group of a packed kk_qmatrix. */
#define KK_QPACK 8

/* Allocates data and scales for an n x k matrix.  Errors: -EINVAL (qtype,
 * group, scale dtype, k % group, odd k for Q4), -ENOMEM. */
int kk_qmatrix_alloc(kk_backend *be, kk_dtype qtype, int64_t n, int64_t k, int group,
		     kk_dtype scale_dt, kk_qmatrix **ret);
/* Frees data, scales and the struct.  Accepts NULL.  Returns NULL. */
kk_qmatrix *kk_qmatrix_free(kk_qmatrix *q);

/* Reorders q in place into the backend's fastest layout for kk_qgemm
 * (same bytes, no copy kept; q's buffers must be writable: not a wrapped
 * read-only mapping).  The cpu backend interleaves rows in groups
 * of KK_QPACK per 32-block so one vector load feeds 8 rows, and the
 * scales with them (docs/kernels.md, "Packed quantized rows"); rows past
 * the last whole group stay as they were.  kk_qgemm, kk_dequantize and
 * kk_quantize (which writes the plain layout again) accept either layout;
 * a one-row view of a packed matrix is not a row.  Returns 1 when q is
 * packed, 0 when it was left as it is (k not a multiple of 32, fewer than
 * KK_QPACK rows, $KK_CPU_QPACK=0).  Errors: -EINVAL, -ENOMEM,
 * -EOPNOTSUPP (a backend without KK_CAP_QPACK: one layout, nothing to do). */
int kk_qmatrix_pack(kk_backend *be, kk_qmatrix *q);
/* q <- quantize(w), w F32/BF16/F16 [n, k] with q's shape. */
int kk_quantize(kk_backend *be, kk_stream *st, kk_qmatrix *q, const kk_buffer *w);
/* w <- dequantize(q), w F32/BF16/F16 [n, k]. */
int kk_dequantize(kk_backend *be, kk_stream *st, kk_buffer *w, const kk_qmatrix *q);
/* Y[m, n] = X[m, k] W^T (+ bias[n]), X and Y the same dtype in
 * {F32, BF16, F16}, bias NULL or F32/X-dtype [n].  m == 1 is the GEMV case
 * (decode); backends pick a GEMV path for small m.  A backend may quantize
 * X to int8 per block of 32 along k (scale max|x_block| / 127, round to
 * nearest; the cpu backend does, as llama.cpp's Q8_0): Y is then within
 * sum over blocks of max|x_block| / 254 * sum |w| over the block of the
 * product with the dequantized W, plus f32 rounding. */
int kk_qgemm(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x, const kk_qmatrix *w,
	     const kk_buffer *bias, int64_t m);

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */

/* Prefill/training attention over variable-length packed sequences.
 * q [T, n_heads, head_dim], k and v [T, n_kv_heads, head_dim], out like q,
 * all the same dtype (F32, BF16, F16).  Sequence s is tokens
 * cu_seqlens[s] .. cu_seqlens[s+1]-1 (I32 [n_seqs + 1], cu_seqlens[0] = 0,
 * non-decreasing, cu_seqlens[n_seqs] = T); tokens attend only inside their
 * own sequence, and with causal only to positions <= their own.  Query
 * head h uses kv head h / (n_heads / n_kv_heads) (GQA; n_kv_heads divides
 * n_heads).  head_dim: 64 and 128 on every backend; the cpu backend takes
 * any head dim from 1 to 128 (small models: llama2.c's stories260K has 8),
 * and a backend returns -EOPNOTSUPP for a head dim it lacks (the cuda
 * backend has only 64 and 128).  scale 0 means 1/sqrt(head_dim).
 * max_seqlen must be >= every sequence length (the cuda backend sizes its
 * grid with it).  Fused: online softmax, no [T, T] matrix.
 * lse: NULL or F32 [T, n_heads], the log-sum-exp of each row of scaled
 * scores, saved for the backward pass. */
typedef struct kk_attn_desc {
	int n_heads, n_kv_heads, head_dim;
	float scale;
	bool causal;
	int n_seqs;
	int64_t total_tokens; /* T */
	int max_seqlen;
	const kk_buffer *cu_seqlens;
} kk_attn_desc;

/* Head dims every backend must support. */
#define KK_ATTN_HEAD_DIM_SMALL 64
#define KK_ATTN_HEAD_DIM_LARGE 128
/* The largest head dim the API accepts (beyond it: -EINVAL); a backend may
 * support fewer (-EOPNOTSUPP, see kk_attention_fwd). */
#define KK_ATTN_HEAD_DIM_MAX 256

int kk_attention_fwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d, kk_buffer *out,
		     kk_buffer *lse, const kk_buffer *q, const kk_buffer *k, const kk_buffer *v);
/* Gradients of kk_attention_fwd: dq like q, dk and dv like k (summed over
 * the query heads sharing a kv head).  out and lse are the forward's
 * results (lse required).  dq, dk, dv are overwritten. */
int kk_attention_bwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d, kk_buffer *dq,
		     kk_buffer *dk, kk_buffer *dv, const kk_buffer *dout, const kk_buffer *q,
		     const kk_buffer *k, const kk_buffer *v, const kk_buffer *out,
		     const kk_buffer *lse);

/* Tokens per KV-cache block. */
#define KK_KV_BLOCK_SIZE 16

/* Decode attention over a paged KV cache: one query token per sequence.
 * k_cache, v_cache [num_blocks, KK_KV_BLOCK_SIZE, n_kv_heads, head_dim];
 * sequence s has context_lens[s] tokens (I32 [n_seqs], >= 1; the current
 * token's k/v are already in the cache), token t of it in block
 * block_tables[s * max_blocks_per_seq + t / 16] (I32 [n_seqs,
 * max_blocks_per_seq]), slot t % 16.  q and out [n_seqs, n_heads, head_dim],
 * same dtype as the cache.  The query attends to all context tokens.
 * max_context_len must be >= every context_lens[s]. */
typedef struct kk_paged_desc {
	int n_heads, n_kv_heads, head_dim;
	float scale; /* 0: 1/sqrt(head_dim) */
	int n_seqs;
	int num_blocks;
	int max_blocks_per_seq;
	int max_context_len;
	const kk_buffer *block_tables;
	const kk_buffer *context_lens;
	/* kk_attention_paged only (NULL and 0 for kk_attention_decode): */
	const kk_buffer *cu_q; /* I32 [n_seqs + 1], see kk_attention_paged */
	int64_t total_q;       /* cu_q[n_seqs], the query rows of q and out */
} kk_paged_desc;

int kk_attention_decode(kk_backend *be, kk_stream *st, const kk_paged_desc *d, kk_buffer *out,
			const kk_buffer *q, const kk_buffer *k_cache, const kk_buffer *v_cache);
/* Paged attention with several query tokens per sequence: prefill that
 * continues a cached context (chunked prefill, a reused prompt prefix,
 * recomputation after preemption).  Sequence s brings the query rows
 * cu_q[s] .. cu_q[s+1]-1 (cu_q[0] = 0, non-decreasing, cu_q[n_seqs] =
 * total_q; a sequence may bring none), which are the LAST q_len =
 * cu_q[s+1] - cu_q[s] of its context_lens[s] tokens, their k/v already in
 * the cache (kk_kv_cache_write).  Query row i of s sits at position
 * context_lens[s] - q_len + i and attends causally to positions <= its
 * own.  q and out [total_q, n_heads, head_dim]; the rest as for
 * kk_attention_decode, which is the case q_len = 1 for every sequence.
 * Errors: -EINVAL (descriptor, buffers, cu_q not fitting the contexts on
 * the cpu backend), -ERANGE (a block id beyond the cache, cpu),
 * -EOPNOTSUPP (head dim). */
int kk_attention_paged(kk_backend *be, kk_stream *st, const kk_paged_desc *d, kk_buffer *out,
		       const kk_buffer *q, const kk_buffer *k_cache, const kk_buffer *v_cache);
/* Writes n_tokens new k/v rows ([n_tokens, n_kv_heads, head_dim]) into the
 * caches at flat slots slot_mapping[i] = block * 16 + offset (I32
 * [n_tokens]; a negative slot skips the token, for padding).
 * Errors: -ERANGE a slot beyond the cache (cpu detects it; others skip it). */
int kk_kv_cache_write(kk_backend *be, kk_stream *st, kk_buffer *k_cache, kk_buffer *v_cache,
		      const kk_buffer *k, const kk_buffer *v, const kk_buffer *slot_mapping,
		      int64_t n_tokens, int n_kv_heads, int head_dim, int num_blocks);

/* ------------------------------------------------------------------------ */
/* Normalization (with fused residual add)                                   */

/* h = x + residual (residual may be NULL: h = x); residual_out (NULL or
 * [rows, dim]) receives h; y = h / sqrt(mean(h^2) + eps) * weight.
 * x, residual, residual_out, y, weight share one dtype (F32/BF16/F16);
 * weight is [dim]; rstd NULL or F32 [rows] (saved for backward).
 * y may alias x; residual_out may alias residual. */
int kk_rmsnorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, kk_buffer *residual_out,
		   kk_buffer *rstd, const kk_buffer *x, const kk_buffer *residual,
		   const kk_buffer *weight, int64_t rows, int64_t dim, float eps);
/* dx = d(y)/d(h) applied to dy, plus dresidual (NULL or [rows, dim]: the
 * gradient arriving on the residual stream, added so the caller gets the
 * full gradient of h).  h is the forward's residual_out (or x without a
 * residual); rstd the forward's.  dweight F32 [dim], accumulated. */
int kk_rmsnorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
		   const kk_buffer *dy, const kk_buffer *dresidual, const kk_buffer *h,
		   const kk_buffer *weight, const kk_buffer *rstd, int64_t rows, int64_t dim);
/* As kk_rmsnorm_fwd with y = (h - mean) * rstd * weight + bias (bias NULL
 * allowed), mean/rstd NULL or F32 [rows]. */
int kk_layernorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, kk_buffer *residual_out,
		     kk_buffer *mean, kk_buffer *rstd, const kk_buffer *x,
		     const kk_buffer *residual, const kk_buffer *weight, const kk_buffer *bias,
		     int64_t rows, int64_t dim, float eps);
/* dweight, dbias (NULL allowed) F32 [dim], accumulated; mean, rstd required. */
int kk_layernorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
		     kk_buffer *dbias, const kk_buffer *dy, const kk_buffer *dresidual,
		     const kk_buffer *h, const kk_buffer *weight, const kk_buffer *mean,
		     const kk_buffer *rstd, int64_t rows, int64_t dim);

/* ------------------------------------------------------------------------ */
/* Rotary position embedding                                                 */

typedef enum kk_rope_mode {
	/* llama2.c / Meta: pairs (x[2i], x[2i+1]). */
	KK_ROPE_INTERLEAVED = 0,
	/* Hugging Face: pairs (x[i], x[i + d/2]). */
	KK_ROPE_HALF = 1,
} kk_rope_mode;

/* In place on x [tokens, n_heads, head_dim] (F32/BF16/F16), positions I32
 * [tokens]: pair i of the first rotary_dim (even, <= head_dim; 0 =
 * head_dim) elements of each head turns by the angle positions[t] *
 * theta^(-2i/d) / freq_div[i], d = rotary_dim, formed in f64.  freq_div:
 * NULL (plain RoPE), or F32 [d / 2] on be, each finite and > 0: scaled
 * RoPE's per-pair frequency divisors (Llama 3.1's, linear scaling's; the
 * freq_factors of llama.cpp's ggml_rope_ext).  backward: rotate by -angle,
 * which is the gradient (the rotation is orthogonal).  -EINVAL: shapes,
 * dtypes, theta, a divisor table on another backend or too short. */
int kk_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions, int64_t tokens,
	    int n_heads, int head_dim, int rotary_dim, float theta, const kk_buffer *freq_div,
	    kk_rope_mode mode, bool backward);

/* ------------------------------------------------------------------------ */
/* Elementwise activations, softmax                                          */

typedef enum kk_act {
	KK_ACT_SILU = 0, /* x * sigmoid(x) */
	KK_ACT_GELU = 1, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
} kk_act;

/* y = act(x) for n elements; x, y the same dtype; y may alias x. */
int kk_act_fwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *y, const kk_buffer *x,
	       size_t n);
/* dx = act'(x) * dy; dx may alias dy. */
int kk_act_bwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *dx, const kk_buffer *dy,
	       const kk_buffer *x, size_t n);
/* y = silu(gate) * up, n elements, all the same dtype. */
int kk_swiglu_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *gate,
		  const kk_buffer *up, size_t n);
/* dgate, dup from dy (overwritten). */
int kk_swiglu_bwd(kk_backend *be, kk_stream *st, kk_buffer *dgate, kk_buffer *dup,
		  const kk_buffer *dy, const kk_buffer *gate, const kk_buffer *up, size_t n);
/* Row softmax: y[r, :] = softmax(x[r, :]) over cols; y may alias x. */
int kk_softmax(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x, int64_t rows,
	       int64_t cols);

/* ------------------------------------------------------------------------ */
/* Embedding                                                                 */

/* out[t, :] = table[ids[t], :]; table [vocab, dim], out [tokens, dim] the
 * same dtype; ids I32 [tokens].  Errors: -ERANGE an id outside [0, vocab)
 * (cpu detects it; other backends write a zero row). */
int kk_embedding_fwd(kk_backend *be, kk_stream *st, kk_buffer *out, const kk_buffer *table,
		     const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim);
/* dtable[ids[t], :] += dout[t, :]; dtable F32 [vocab, dim].  -ERANGE as above. */
int kk_embedding_bwd(kk_backend *be, kk_stream *st, kk_buffer *dtable, const kk_buffer *dout,
		     const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim);

/* ------------------------------------------------------------------------ */
/* Cross-entropy fused with softmax                                          */

/* losses[t] = logsumexp(logits[t, :]) - logits[t, targets[t]]; losses F32
 * [tokens]; logits [tokens, vocab] F32/BF16/F16; targets I32, a negative
 * target is ignored (loss 0, gradient 0).  -ERANGE: target >= vocab (cpu). */
int kk_cross_entropy_fwd(kk_backend *be, kk_stream *st, kk_buffer *losses, const kk_buffer *logits,
			 const kk_buffer *targets, int64_t tokens, int64_t vocab);
/* dlogits = (softmax(logits) - onehot(target)) * grad_scale (e.g. 1/tokens
 * for a mean loss); dlogits like logits, overwritten, may alias logits. */
int kk_cross_entropy_bwd(kk_backend *be, kk_stream *st, kk_buffer *dlogits, const kk_buffer *logits,
			 const kk_buffer *targets, int64_t tokens, int64_t vocab, float grad_scale);

/* ------------------------------------------------------------------------ */
/* Optimizer                                                                 */

typedef struct kk_adamw_params {
	float lr, beta1, beta2, eps, weight_decay;
	int64_t step;	  /* 1 for the first update (bias correction) */
	float grad_scale; /* grads are multiplied by this first (clipping); 0 means 1 */
} kk_adamw_params;

/* One AdamW step (decoupled weight decay, as torch.optim.AdamW) on n
 * parameters.  master, m, v F32 [n]; grads F32/BF16/F16 [n]; params NULL or
 * BF16/F16/F32 [n] receives a rounded copy of the updated master weights.
 *   g = grads * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   master -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd * master) */
int kk_adamw(kk_backend *be, kk_stream *st, kk_buffer *master, kk_buffer *params,
	     const kk_buffer *grads, kk_buffer *m, kk_buffer *v, size_t n,
	     const kk_adamw_params *p);

/* out (F32, 1 element) = sqrt(sum over the n_bufs buffers of x^2), each
 * buffer whole (kk_buffer_count elements), F32/BF16/F16. */
int kk_grad_norm(kk_backend *be, kk_stream *st, kk_buffer *out, kk_buffer *const *grads,
		 size_t n_bufs);
/* Global-norm clipping: computes the norm (synchronizes the stream to read
 * it), and when it exceeds max_norm scales every buffer by
 * max_norm / (norm + 1e-6).  ret_norm (NULL allowed) gets the norm before
 * clipping.  Built on kk_grad_norm and kk_scale.  -EINVAL: max_norm <= 0. */
int kk_grad_clip(kk_backend *be, kk_stream *st, kk_buffer *const *grads, size_t n_bufs,
		 float max_norm, float *ret_norm);

/* ------------------------------------------------------------------------ */
/* Sampling                                                                  */

/* temperature 0: greedy (argmax, lowest index on ties), top_k/top_p
 * ignored.  Otherwise p = softmax(logits / temperature), restricted to the
 * top_k most likely tokens (0 = all) and then to the smallest prefix of
 * them, in descending probability (ties: lower id first), whose mass
 * reaches top_p (1 or 0 = all); the kept mass is renormalized and token
 * chosen by inverse CDF with u = kk_sample_uniform(seed, row), walking the
 * kept tokens in ID order: two near-equal logits that swap rank when the
 * logits move by rounding (another batch shape, another backend) then
 * move a CDF boundary by that rounding, instead of trading whole
 * probability masses, so a seeded draw rarely changes.  The same seed
 * gives the same tokens on every run and (up to rounding) backend. */
typedef struct kk_sampling {
	float temperature;
	int top_k;
	float top_p;
	uint64_t seed; /* callers advance it per decode step */
} kk_sampling;

/* Largest top_k a backend must support (cuda keeps the candidates in
 * shared memory). */
#define KK_SAMPLE_TOP_K_MAX 1024

/* ids I32 [rows]; logits [rows, vocab] F32/BF16/F16.
 * -EINVAL: temperature < 0, top_k < 0 or > KK_SAMPLE_TOP_K_MAX, top_p
 * outside [0, 1]. */
int kk_sample(kk_backend *be, kk_stream *st, kk_buffer *ids, const kk_buffer *logits, int64_t rows,
	      int64_t vocab, const kk_sampling *p);

/* kk_sample on host memory, for a caller that changed the logits on the
 * host (penalties, logit_bias): logits float [rows, vocab] in, ids
 * [rows] out, the same algorithm and draws (u = kk_sample_uniform(seed,
 * row)) as kk_sample, so such a row draws what the device would have
 * drawn from the same logits.  Runs on the calling thread, no backend.
 * -EINVAL as kk_sample; -ENOMEM. */
int kk_sample_host(const float *logits, int64_t rows, int64_t vocab, const kk_sampling *p,
		   int32_t *ids);

/* log(sum_i exp(x[i])) of n >= 1 host floats in float64, shifted by their
 * largest (a log-softmax's normalizer, for a caller's logprobs beside
 * kk_sample_host), vectorized: within 1e-14 of the sum of exp()'s, terms
 * below e^-700 of the largest counted as 0.  All -inf: -inf; NaN for
 * bad arguments. */
double kk_logsumexp_host(const float *x, int64_t n);

/* The uniform draw in [0, 1) for one row: SplitMix64 of seed and row, top 24
 * bits.  Inline so every backend (and tests) compute the same number. */
static inline float kk_sample_uniform(uint64_t seed, uint64_t row)
{
	uint64_t z = seed + (row + 1) * UINT64_C(0x9E3779B97F4A7C15);
	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	z ^= z >> 31;
	return (float) (z >> 40) * (1.0f / 16777216.0f);
}

/* ------------------------------------------------------------------------ */
/* Collectives                                                               */

/* Size of a communicator id (NCCL's unique id is 128 bytes; cpu uses a
 * "host:port" string, NUL-padded). */
#define KK_COMM_ID_BYTES 128
/* Largest world size accepted by kk_comm_init. */
#define KK_COMM_WORLD_MAX 4096

typedef enum kk_reduce_op {
	KK_SUM = 0,
	KK_AVG = 1,
	KK_MAX = 2,
} kk_reduce_op;

/* Produces the id on rank 0, to be handed to every rank (kiln-run passes
 * it through its rendezvous store), then used once for kk_comm_init.
 * cpu: rank 0 starts listening on a free TCP port; the address is
 * $KILN_COMM_ADDR, else $MASTER_ADDR, else the host name's first
 * non-loopback address, else the first non-loopback interface's.
 * Errors: -EINVAL (len < KK_COMM_ID_BYTES), -EOPNOTSUPP, -EIO, socket errors. */
int kk_comm_get_id(kk_backend *be, void *id, size_t len);
/* Creates rank `rank` of `world` ranks; blocks until all ranks joined
 * (cpu: up to KK_COMM_TIMEOUT_SEC).  Errors: -EINVAL (rank/world, bad
 * id), -ETIMEDOUT, -ECONNREFUSED and other socket errors, -EOPNOTSUPP. */
#define KK_COMM_TIMEOUT_SEC 120
int kk_comm_init(kk_backend *be, int rank, int world, const void *id, size_t id_len, kk_comm **ret);
/* Frees the communicator.  Accepts NULL.  Returns NULL. */
kk_comm *kk_comm_free(kk_comm *c);
int kk_comm_rank(const kk_comm *c);
int kk_comm_world(const kk_comm *c);

/* Every collective is called by all ranks with the same count and dtype
 * (F32, BF16, F16; reductions in f32 on cpu).  Sums are reduced in rank
 * order on cpu, so results are bitwise identical on every rank.
 * Errors: the common ones, -EIO/-ECONNRESET/-ETIMEDOUT (a peer vanished). */
/* recv = op over ranks of send, count elements; recv may be send. */
int kk_all_reduce(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send, size_t count,
		  kk_reduce_op op);
/* send [world * count]; rank r's recv [count] = op over ranks of send's
 * chunk r. */
int kk_reduce_scatter(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
		      size_t count, kk_reduce_op op);
/* recv [world * count]: chunk r is rank r's send [count]. */
int kk_all_gather(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send, size_t count);
/* buf [count] on every rank becomes root's. */
int kk_broadcast(kk_comm *c, kk_stream *st, kk_buffer *buf, size_t count, int root);

/* ------------------------------------------------------------------------ */
/* What a backend supports                                                   */

/* One value per op of the op list (kk_ops.def, beside this header), in its
 * order: KK_OP_CAST, KK_OP_SCALE, KK_OP_GEMM, ... KK_OP_BROADCAST. */
typedef enum kk_op {
#define KK_OP(NAME, name, family, dtypes, params) KK_OP_##NAME,
#include "kk_ops.def"
	KK_OP_MAX
} kk_op;

/* The op's name as in its function ("gemm" for kk_gemm), or NULL for a
 * value outside [0, KK_OP_MAX). */
const char *kk_op_name(kk_op op);

/* Whether backend be implements op for element type dt: true when be has
 * the op (a backend that lacks it returns -EOPNOTSUPP) and dt is a dtype the
 * op takes for its main data operand (the activations, logits or gradients;
 * for kk_quantize/kk_dequantize/kk_qgemm also KK_I8 and KK_Q4, the
 * kk_qmatrix's type).  False for a NULL be, an op outside [0, KK_OP_MAX) or
 * an invalid dtype.  It answers from the op list and the backend's table,
 * without touching the device, so "true" does not promise every shape: a
 * call may still return -EOPNOTSUPP for a head dim or size the backend does
 * not handle, or -EINVAL for bad arguments. */
bool kk_supports(const kk_backend *be, kk_op op, kk_dtype dt);

/* What a backend can do beyond its ops, for code that must choose a path
 * without asking which backend it runs on. */
typedef enum kk_cap {
	/* Its buffers are host memory: kk_buffer_wrap_host() computes on the
	 * caller's memory in place (cpu). */
	KK_CAP_HOST_MEMORY = 0,
	/* kk_quantize, kk_dequantize and kk_qgemm take a KK_I8 kk_qmatrix in
	 * groups of 32 (GGUF's Q8_0 blocks), not only per channel (cpu). */
	KK_CAP_I8_GROUP32 = 1,
	/* kk_qmatrix_pack() has a faster layout to pack into (cpu). */
	KK_CAP_QPACK = 2,
	KK_CAP_MAX
} kk_cap;

/* Whether backend be has capability cap: true or false, from the backend's
 * table, without touching the device.  A backend without it refuses the
 * call it names with -EOPNOTSUPP (never a wrong result).  False for a NULL
 * be or a cap outside [0, KK_CAP_MAX). */
bool kk_backend_has(const kk_backend *be, kk_cap cap);

#ifdef __cplusplus
}
#endif
