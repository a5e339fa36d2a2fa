/* kernels/kk/cuda/embedding.cu — token embedding on the CUDA backend: the
 * forward is a vector gather of rows, the backward adds rows into the f32
 * table gradient with float4 atomics (sm_90 red.global.add.v4.f32) when
 * aligned, scalar atomics otherwise.  Memory-bound (see kc_vec.cuh).
 * All arithmetic is f32.  UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include <type_traits>

#include "kc.h"
#include "kc_vec.cuh"

/* ---- embedding ---------------------------------------------------------- */

/* Forward, one chunk: out row t = table row id (zeros for an id outside
 * the table, kk.h). */
template <int W, typename T>
static __device__ __forceinline__ void kc_embed_get(T *out, const T *table, int32_t id, size_t t,
						    size_t j, int64_t vocab, int64_t dim)
{
	float f[W];
	if (id >= 0 && id < vocab) {
		kc_ldv<W, true>(table + (size_t) id * dim + j, f);
	} else {
#pragma unroll
		for (int e = 0; e < W; e++)
			f[e] = 0.0f;
	}
	kc_stv<W>(out + t * dim + j, f);
}

/* Backward, one chunk: dtable row id += dout row t (nothing for an id
 * outside the table). */
template <int W, typename T>
static __device__ __forceinline__ void kc_embed_add(float *dtable, const T *dout, int32_t id,
						    size_t t, size_t j, int64_t vocab, int64_t dim)
{
	if (id < 0 || id >= vocab)
		return;
	float f[W];
	kc_ldv<W>(dout + t * dim + j, f);
	float *d = dtable + (size_t) id * dim + j;
	if constexpr (W == 1) {
		atomicAdd(d, f[0]);
	} else {
#if defined(__clang__) && !defined(__NVCC__)
		/* clang's CUDA wrapper (16) does not include CUDA 12's
		 * sm_90_rt.h, so no float4 atomicAdd: scalar adds, same
		 * result (the clang build is a compile check only). */
#pragma unroll
		for (int c = 0; c < W; c++)
			atomicAdd(d + c, f[c]);
#else
#pragma unroll
		for (int c = 0; c < W; c += 4)
			atomicAdd((float4 *) (d + c),
				  make_float4(f[c], f[c + 1], f[c + 2], f[c + 3]));
#endif
	}
}

/* What the kernel writes: the output rows (T), or the f32 table gradient. */
template <typename T, bool BWD> using kc_embed_dst = typename std::conditional<BWD, float, T>::type;

/* One thread per (token, W-element chunk of the row).  Forward: row t of
 * out (T) is row ids[t] of the table src, a zero row for an id outside the
 * table (kk.h).  Backward (BWD): row t of dout (src) is added to row ids[t]
 * of dst (the f32 table gradient); an id outside adds nothing. */
template <typename T, int W, bool BWD>
__global__ void __launch_bounds__(KC_EW_THREADS)
	kc_embed_kernel(kc_embed_dst<T, BWD> *dst, const T *src, const int32_t *ids, int64_t tokens,
			int64_t vocab, int64_t dim)
{
	int64_t chunks = dim / W;
	size_t n = (size_t) tokens * chunks;
	GRID_STRIDE(i, n)
	{
		size_t t = i / chunks, j = (i % chunks) * W;
		int32_t id = ids[t];
		if constexpr (BWD)
			kc_embed_add<W>(dst, src, id, t, j, vocab, dim);
		else
			kc_embed_get<W>(dst, src, id, t, j, vocab, dim);
	}
}

template <typename T, int W, bool BWD>
static void kc_embed_launch(cudaStream_t s, void *dst, const void *src, const int32_t *ids,
			    int64_t tokens, int64_t vocab, int64_t dim)
{
	size_t n = (size_t) tokens * dim;
	kc_embed_kernel<T, W, BWD><<<kc_grid_sm(n / W, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		(kc_embed_dst<T, BWD> *) dst, (const T *) src, ids, tokens, vocab, dim);
}

template <typename T>
static int kc_embed_t(cudaStream_t s, int bwd, void *out, const void *in, const int32_t *ids,
		      int64_t tokens, int64_t vocab, int64_t dim)
{
	if ((size_t) tokens * dim == 0)
		return 0;
	const int W = KC_VN(T);
	/* 16-byte rows, W | dim; the backward's float4 atomics also need
	 * dout's rows 16-byte aligned. */
	bool vec = dim % W == 0 && kc_aligned16(out) && kc_aligned16(in) &&
		   (!bwd || (dim * sizeof(T)) % 16 == 0);
	if (bwd)
		(vec ? kc_embed_launch<T, W, true>
		     : kc_embed_launch<T, 1, true>) (s, out, in, ids, tokens, vocab, dim);
	else
		(vec ? kc_embed_launch<T, W, false>
		     : kc_embed_launch<T, 1, false>) (s, out, in, ids, tokens, vocab, dim);
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
