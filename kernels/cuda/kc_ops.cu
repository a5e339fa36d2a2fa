/* kernels/cuda/kc_ops.cu — the small ops of the CUDA backend: cast, scale,
 * RoPE, SiLU/GELU/SwiGLU forward and backward, row softmax, embedding
 * forward/backward, fused softmax cross-entropy, and the paged KV-cache
 * write.
 *
 * Elementwise ops are grid-stride loops, 256 threads per block, one element
 * per thread per step (kc_grid caps the grid at 32 blocks per SM).  Row ops
 * (softmax, cross-entropy) use one block per row with warp-shuffle block
 * reductions (kc_block_max / kc_block_sum); every thread re-reads only
 * elements it owns, so outputs may alias inputs as kk.h allows.
 * All arithmetic is f32; RoPE angles are computed in f64 (pos * freq reaches
 * 1e4 radians, where an f32 angle is off by ~1e-3).
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"

#define KC_EW_THREADS 256

#define GRID_STRIDE(i, n)                                                        \
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t) gridDim.x * blockDim.x)

static __device__ __forceinline__ float kc_sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

/* ---- cast / scale ------------------------------------------------------- */

template <typename TD, typename TS> __global__ void kc_cast_kernel(TD *dst, const TS *src, size_t n)
{
	GRID_STRIDE(i, n)
	kc_st(dst, i, kc_ld(src, i));
}

template <typename TD>
static int kc_cast_to(cudaStream_t s, void *dst, kc_dtype src_dt, const void *src, size_t n)
{
	unsigned g = kc_grid(n, KC_EW_THREADS);
	switch (src_dt) {
	case KC_F32:
		kc_cast_kernel<TD, float>
			<<<g, KC_EW_THREADS, 0, s>>>((TD *) dst, (const float *) src, n);
		break;
	case KC_BF16:
		kc_cast_kernel<TD, __nv_bfloat16>
			<<<g, KC_EW_THREADS, 0, s>>>((TD *) dst, (const __nv_bfloat16 *) src, n);
		break;
	case KC_F16:
		kc_cast_kernel<TD, __half>
			<<<g, KC_EW_THREADS, 0, s>>>((TD *) dst, (const __half *) src, n);
		break;
	default:
		return -EOPNOTSUPP;
	}
	return kc_check_launch();
}

extern "C" int kc_cast(cudaStream_t s, kc_dtype dst_dt, void *dst, kc_dtype src_dt, const void *src,
		       size_t n)
{
	if (n == 0)
		return 0;
	return KC_DISPATCH(dst_dt, kc_cast_to, s, dst, src_dt, src, n);
}

template <typename T> __global__ void kc_scale_kernel(T *x, float scale, size_t n)
{
	GRID_STRIDE(i, n)
	kc_st(x, i, kc_ld(x, i) * scale);
}

template <typename T> static int kc_scale_t(cudaStream_t s, void *x, float scale, size_t n)
{
	kc_scale_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>((T *) x, scale, n);
	return kc_check_launch();
}

extern "C" int kc_scale(cudaStream_t s, kc_dtype dt, size_t n, void *x, float scale)
{
	if (n == 0)
		return 0;
	return KC_DISPATCH(dt, kc_scale_t, s, x, scale, n);
}

extern "C" int kc_op_cast(kk_backend *be, kk_stream *st, kk_buffer *dst, const kk_buffer *src,
			  size_t count)
{
	return kc_cast(kc_stream(be, st), kc_dt(dst->dtype), dst->ptr, kc_dt(src->dtype), src->ptr,
		       count);
}

extern "C" int kc_op_scale(kk_backend *be, kk_stream *st, kk_buffer *x, float scale, size_t count)
{
	return kc_scale(kc_stream(be, st), kc_dt(x->dtype), count, x->ptr, scale);
}

/* ---- RoPE --------------------------------------------------------------- */

/* One thread per (token, head, pair). */
template <typename T>
__global__ void kc_rope_kernel(T *x, const int32_t *pos, int64_t tokens, int n_heads, int head_dim,
			       int rot, double theta, int half, float sign)
{
	size_t pairs = (size_t) tokens * n_heads * (rot / 2);
	GRID_STRIDE(idx, pairs)
	{
		int i = (int) (idx % (rot / 2));
		size_t th = idx / (rot / 2); /* token * n_heads + head */
		size_t t = th / n_heads;
		size_t base = th * head_dim;
		double freq = pow(theta, -2.0 * i / rot);
		double ang = (double) pos[t] * freq;
		float c = (float) cos(ang), sn = sign * (float) sin(ang);
		size_t i0 = half ? base + i : base + 2 * i;
		size_t i1 = half ? base + i + rot / 2 : base + 2 * i + 1;
		float a = kc_ld(x, i0), b = kc_ld(x, i1);
		kc_st(x, i0, a * c - b * sn);
		kc_st(x, i1, a * sn + b * c);
	}
}

template <typename T>
static int kc_rope_t(cudaStream_t s, void *x, const int32_t *pos, int64_t tokens, int n_heads,
		     int head_dim, int rot, float theta, int half, int backward)
{
	size_t pairs = (size_t) tokens * n_heads * (rot / 2);
	if (pairs == 0)
		return 0;
	kc_rope_kernel<T><<<kc_grid(pairs, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		(T *) x, pos, tokens, n_heads, head_dim, rot, (double) theta, half,
		backward ? -1.0f : 1.0f);
	return kc_check_launch();
}

extern "C" int kc_op_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions,
			  int64_t tokens, int n_heads, int head_dim, int rotary_dim, float theta,
			  kk_rope_mode mode, bool backward)
{
	int rot = rotary_dim > 0 ? rotary_dim : head_dim;
	return KC_DISPATCH(kc_dt(x->dtype), kc_rope_t, kc_stream(be, st), x->ptr,
			   (const int32_t *) positions->ptr, tokens, n_heads, head_dim, rot, theta,
			   mode == KK_ROPE_HALF, backward);
}

/* ---- activations -------------------------------------------------------- */

static __device__ __forceinline__ float kc_act_f(int gelu, float x)
{
	if (!gelu)
		return x * kc_sigmoid(x);
	const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
	return 0.5f * x * (1.0f + tanhf(k0 * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float kc_act_df(int gelu, float x)
{
	if (!gelu) {
		float sg = kc_sigmoid(x);
		return sg * (1.0f + x * (1.0f - sg));
	}
	const float k0 = 0.7978845608028654f;
	float u = k0 * (x + 0.044715f * x * x * x);
	float t = tanhf(u);
	return 0.5f * (1.0f + t) +
	       0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename T>
__global__ void kc_act_kernel(int gelu, int bwd, T *out, const T *x, const T *dy, size_t n)
{
	GRID_STRIDE(i, n)
	{
		float v = kc_ld(x, i);
		kc_st(out, i, bwd ? kc_act_df(gelu, v) * kc_ld(dy, i) : kc_act_f(gelu, v));
	}
}

template <typename T>
static int kc_act_t(cudaStream_t s, int gelu, int bwd, void *out, const void *x, const void *dy,
		    size_t n)
{
	if (n == 0)
		return 0;
	kc_act_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		gelu, bwd, (T *) out, (const T *) x, (const T *) dy, n);
	return kc_check_launch();
}

extern "C" int kc_op_act_fwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *y,
			     const kk_buffer *x, size_t n)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_act_t, kc_stream(be, st), act == KK_ACT_GELU, 0,
			   y->ptr, x->ptr, (const void *) NULL, n);
}

extern "C" int kc_op_act_bwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *dx,
			     const kk_buffer *dy, const kk_buffer *x, size_t n)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_act_t, kc_stream(be, st), act == KK_ACT_GELU, 1,
			   dx->ptr, x->ptr, dy->ptr, n);
}

template <typename T>
__global__ void kc_swiglu_kernel(T *y_or_dg, T *du, const T *g, const T *u, const T *dy, size_t n)
{
	GRID_STRIDE(i, n)
	{
		float gv = kc_ld(g, i), uv = kc_ld(u, i), sg = kc_sigmoid(gv);
		if (!dy) {
			kc_st(y_or_dg, i, gv * sg * uv);
		} else {
			float d = kc_ld(dy, i);
			kc_st(y_or_dg, i, d * uv * sg * (1.0f + gv * (1.0f - sg)));
			kc_st(du, i, d * gv * sg);
		}
	}
}

template <typename T>
static int kc_swiglu_t(cudaStream_t s, void *y_or_dg, void *du, const void *g, const void *u,
		       const void *dy, size_t n)
{
	if (n == 0)
		return 0;
	kc_swiglu_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		(T *) y_or_dg, (T *) du, (const T *) g, (const T *) u, (const T *) dy, n);
	return kc_check_launch();
}

extern "C" int kc_op_swiglu_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *gate,
				const kk_buffer *up, size_t n)
{
	return KC_DISPATCH(kc_dt(gate->dtype), kc_swiglu_t, kc_stream(be, st), y->ptr,
			   (void *) NULL, gate->ptr, up->ptr, (const void *) NULL, n);
}

extern "C" int kc_op_swiglu_bwd(kk_backend *be, kk_stream *st, kk_buffer *dgate, kk_buffer *dup,
				const kk_buffer *dy, const kk_buffer *gate, const kk_buffer *up,
				size_t n)
{
	return KC_DISPATCH(kc_dt(gate->dtype), kc_swiglu_t, kc_stream(be, st), dgate->ptr, dup->ptr,
			   gate->ptr, up->ptr, dy->ptr, n);
}

/* ---- softmax and cross-entropy (one block per row) ---------------------- */

/* mode 0: y = softmax(x).  mode 1: loss[r] (cross-entropy forward).
 * mode 2: dlogits = (softmax - onehot) * scale (backward). */
template <typename T>
__global__ void kc_rowsoft_kernel(int mode, T *y, float *loss, const T *x, const int32_t *tgt,
				  int64_t cols, float scale)
{
	__shared__ float sh[33];
	size_t base = (size_t) blockIdx.x * cols;
	int t = tgt ? tgt[blockIdx.x] : 0;
	if (mode == 2 && t < 0) {
		for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
			kc_st(y, base + i, 0.0f);
		return;
	}
	if (mode == 1 && (t < 0 || t >= cols)) {
		/* Ignored target: loss 0.  Out of range: NaN, so it cannot pass
		 * unnoticed (the cpu backend returns -ERANGE). */
		if (threadIdx.x == 0)
			loss[blockIdx.x] = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
		return;
	}
	float mx = -INFINITY;
	for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
		mx = fmaxf(mx, kc_ld(x, base + i));
	mx = kc_block_max(mx, sh);
	float sum = 0.0f;
	for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
		sum += expf(kc_ld(x, base + i) - mx);
	sum = kc_block_sum(sum, sh);
	if (mode == 1) {
		if (threadIdx.x == 0)
			loss[blockIdx.x] = mx + logf(sum) - kc_ld(x, base + t);
		return;
	}
	float inv = 1.0f / sum;
	for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
		float p = expf(kc_ld(x, base + i) - mx) * inv;
		if (mode == 2)
			p = (p - (i == t ? 1.0f : 0.0f)) * scale;
		kc_st(y, base + i, p);
	}
}

template <typename T>
static int kc_rowsoft_t(cudaStream_t s, int mode, void *y, float *loss, const void *x,
			const int32_t *tgt, int64_t rows, int64_t cols, float scale)
{
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	kc_rowsoft_kernel<T>
		<<<(unsigned) rows, kc_row_threads((int) (cols > 4096 ? 4096 : cols)), 0, s>>>(
			mode, (T *) y, loss, (const T *) x, tgt, cols, scale);
	return kc_check_launch();
}

extern "C" int kc_op_softmax(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x,
			     int64_t rows, int64_t cols)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_rowsoft_t, kc_stream(be, st), 0, y->ptr,
			   (float *) NULL, x->ptr, (const int32_t *) NULL, rows, cols, 1.0f);
}

extern "C" int kc_op_cross_entropy_fwd(kk_backend *be, kk_stream *st, kk_buffer *losses,
				       const kk_buffer *logits, const kk_buffer *targets,
				       int64_t tokens, int64_t vocab)
{
	return KC_DISPATCH(kc_dt(logits->dtype), kc_rowsoft_t, kc_stream(be, st), 1, (void *) NULL,
			   (float *) losses->ptr, logits->ptr, (const int32_t *) targets->ptr,
			   tokens, vocab, 1.0f);
}

extern "C" int kc_op_cross_entropy_bwd(kk_backend *be, kk_stream *st, kk_buffer *dlogits,
				       const kk_buffer *logits, const kk_buffer *targets,
				       int64_t tokens, int64_t vocab, float grad_scale)
{
	return KC_DISPATCH(kc_dt(logits->dtype), kc_rowsoft_t, kc_stream(be, st), 2, dlogits->ptr,
			   (float *) NULL, logits->ptr, (const int32_t *) targets->ptr, tokens,
			   vocab, grad_scale);
}

/* ---- embedding ---------------------------------------------------------- */

template <typename T>
__global__ void kc_embed_fwd_kernel(T *out, const T *table, const int32_t *ids, int64_t tokens,
				    int64_t vocab, int64_t dim)
{
	size_t n = (size_t) tokens * dim;
	GRID_STRIDE(i, n)
	{
		size_t t = i / dim, j = i % dim;
		int32_t id = ids[t];
		/* An id outside the table gives a zero row (kk.h). */
		kc_st(out, i, id >= 0 && id < vocab ? kc_ld(table, (size_t) id * dim + j) : 0.0f);
	}
}

template <typename T>
__global__ void kc_embed_bwd_kernel(float *dtable, const T *dout, const int32_t *ids,
				    int64_t tokens, int64_t vocab, int64_t dim)
{
	size_t n = (size_t) tokens * dim;
	GRID_STRIDE(i, n)
	{
		size_t t = i / dim, j = i % dim;
		int32_t id = ids[t];
		if (id >= 0 && id < vocab)
			atomicAdd(&dtable[(size_t) id * dim + j], kc_ld(dout, i));
	}
}

template <typename T>
static int kc_embed_t(cudaStream_t s, int bwd, void *out, const void *in, const int32_t *ids,
		      int64_t tokens, int64_t vocab, int64_t dim)
{
	size_t n = (size_t) tokens * dim;
	if (n == 0)
		return 0;
	if (bwd)
		kc_embed_bwd_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
			(float *) out, (const T *) in, ids, tokens, vocab, dim);
	else
		kc_embed_fwd_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
			(T *) out, (const T *) in, ids, tokens, vocab, dim);
	return kc_check_launch();
}

extern "C" int kc_op_embedding_fwd(kk_backend *be, kk_stream *st, kk_buffer *out,
				   const kk_buffer *table, const kk_buffer *ids, int64_t tokens,
				   int64_t vocab, int64_t dim)
{
	return KC_DISPATCH(kc_dt(table->dtype), kc_embed_t, kc_stream(be, st), 0, out->ptr,
			   table->ptr, (const int32_t *) ids->ptr, tokens, vocab, dim);
}

extern "C" int kc_op_embedding_bwd(kk_backend *be, kk_stream *st, kk_buffer *dtable,
				   const kk_buffer *dout, const kk_buffer *ids, int64_t tokens,
				   int64_t vocab, int64_t dim)
{
	return KC_DISPATCH(kc_dt(dout->dtype), kc_embed_t, kc_stream(be, st), 1, dtable->ptr,
			   dout->ptr, (const int32_t *) ids->ptr, tokens, vocab, dim);
}

/* ---- paged KV-cache write ----------------------------------------------- */

template <typename T>
__global__ void kc_kv_write_kernel(T *kc, T *vc, const T *k, const T *v, const int32_t *slots,
				   int64_t n_tokens, int64_t row, int64_t n_slots)
{
	size_t n = (size_t) n_tokens * row;
	GRID_STRIDE(i, n)
	{
		size_t t = i / row, j = i % row;
		int32_t sl = slots[t];
		if (sl < 0 || sl >= n_slots)
			continue; /* padding, or out of range (skipped, see kk.h) */
		kc[(size_t) sl * row + j] = k[i];
		vc[(size_t) sl * row + j] = v[i];
	}
}

template <typename T>
static int kc_kv_write_t(cudaStream_t s, void *kc, void *vc, const void *k, const void *v,
			 const int32_t *slots, int64_t n_tokens, int64_t row, int64_t n_slots)
{
	size_t n = (size_t) n_tokens * row;
	if (n == 0)
		return 0;
	kc_kv_write_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		(T *) kc, (T *) vc, (const T *) k, (const T *) v, slots, n_tokens, row, n_slots);
	return kc_check_launch();
}

extern "C" int kc_op_kv_cache_write(kk_backend *be, kk_stream *st, kk_buffer *k_cache,
				    kk_buffer *v_cache, const kk_buffer *k, const kk_buffer *v,
				    const kk_buffer *slot_mapping, int64_t n_tokens, int n_kv_heads,
				    int head_dim, int num_blocks)
{
	return KC_DISPATCH(kc_dt(k->dtype), kc_kv_write_t, kc_stream(be, st), k_cache->ptr,
			   v_cache->ptr, k->ptr, v->ptr, (const int32_t *) slot_mapping->ptr,
			   n_tokens, (int64_t) n_kv_heads * head_dim,
			   (int64_t) num_blocks * KK_KV_BLOCK_SIZE);
}
