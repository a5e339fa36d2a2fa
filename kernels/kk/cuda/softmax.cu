/* kernels/kk/cuda/softmax.cu — row softmax and the fused softmax cross-entropy
 * (forward and backward) on the CUDA backend: one block per row
 * (grid-stride over rows), ONE pass over the row for the statistics with an
 * online max/sum (m, s) per thread, merged across the block; cross-entropy
 * forward reads the row exactly once; softmax and the cross-entropy backward
 * read it a second time to write (a row of 32k bf16 is 64 KiB, still in L2
 * for that second read).  Every thread re-reads only elements it owns, so
 * outputs may alias inputs as kk.h allows.  16-byte accesses where the rows
 * allow (kc_vec.cuh).  All arithmetic is f32.  UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_vec.cuh"

/* ---- softmax and cross-entropy (one block per row) ---------------------- */

/* Segments of a row each thread loads before using any (loads in flight). */
#define KC_SOFT_UNROLL	4
#define KC_SOFT_THREADS 256

/* Merges the online softmax state (m, s) = (max, sum of exp(x - max)) of
 * (m2, s2) into (m, s). */
static __device__ __forceinline__ void kc_ms_merge(float &m, float &s, float m2, float s2)
{
	float mn = fmaxf(m, m2);
	if (mn == -INFINITY)
		return; /* both empty */
	s = s * expf(m - mn) + s2 * expf(m2 - mn);
	m = mn;
}
/* kc_ms_merge as kc_block_reduce2's merge. */
struct kc_ms_merge_f {
	__device__ __forceinline__ void operator()(float &m, float &s, float m2, float s2) const
	{
		kc_ms_merge(m, s, m2, s2);
	}
};

/* Block-wide merge; every thread gets the row's (m, s).  sh holds 66 floats. */
static __device__ __forceinline__ void kc_block_ms(float &m, float &s, float *sh)
{
	kc_block_reduce2(m, s, sh, -INFINITY, 0.0f, kc_ms_merge_f());
}

/* mode 0: y = softmax(x).  mode 1: loss[r] (cross-entropy forward).
 * mode 2: dlogits = (softmax - onehot) * scale (backward). */
template <typename T, bool VEC>
__global__ void __launch_bounds__(KC_SOFT_THREADS)
	kc_rowsoft_kernel(int mode, T *y, float *loss, const T *x, const int32_t *tgt, int64_t rows,
			  int64_t cols, float scale)
{
	const int W = VEC ? KC_VN(T) : 1;
	__shared__ float sh[66];
	const int n = (int) cols; /* < 2^31, checked by the launcher */
	const int segs = (n + (int) blockDim.x * W - 1) / ((int) blockDim.x * W);
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *xr = x + (size_t) r * cols;
		T *yr = y ? y + (size_t) r * cols : NULL;
		int t = tgt ? tgt[r] : 0;
		if (mode == 2 && t < 0) {
			float z[W];
#pragma unroll
			for (int j = 0; j < W; j++)
				z[j] = 0.0f;
			for (int sg = 0; sg < segs; sg++)
				kc_seg_st<VEC, W>(yr, n, sg, z);
			continue;
		}
		if (mode == 1 && (t < 0 || t >= cols)) {
			/* Ignored target: loss 0.  Out of range: NaN, so it cannot
			 * pass unnoticed (the cpu backend returns -ERANGE). */
			if (threadIdx.x == 0)
				loss[r] = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
			continue;
		}
		/* One pass: online (max, sum) over this thread's elements. */
		float m = -INFINITY, s = 0.0f;
		for (int s0 = 0; s0 < segs; s0 += KC_SOFT_UNROLL) {
			float v[KC_SOFT_UNROLL][W];
#pragma unroll
			for (int u = 0; u < KC_SOFT_UNROLL; u++)
				kc_seg_ld<VEC, W>(xr, n, s0 + u, v[u], -INFINITY);
			float cm = m;
#pragma unroll
			for (int u = 0; u < KC_SOFT_UNROLL; u++)
#pragma unroll
				for (int j = 0; j < W; j++)
					cm = fmaxf(cm, v[u][j]);
			if (cm == -INFINITY)
				continue;
			float cs = s * expf(m - cm);
#pragma unroll
			for (int u = 0; u < KC_SOFT_UNROLL; u++)
#pragma unroll
				for (int j = 0; j < W; j++)
					cs += expf(v[u][j] - cm);
			m = cm;
			s = cs;
		}
		kc_block_ms(m, s, sh);
		if (mode == 1) {
			if (threadIdx.x == 0)
				loss[r] = m + logf(s) - kc_ld(xr, (size_t) t);
			continue;
		}
		float inv = 1.0f / s;
		for (int sg = 0; sg < segs; sg++) {
			float v[W];
			kc_seg_ld<VEC, W>(xr, n, sg, v, -INFINITY);
#pragma unroll
			for (int j = 0; j < W; j++) {
				float p = expf(v[j] - m) * inv;
				if (mode == 2)
					p = (p - (kc_seg_off<VEC, W>(sg, j) == t ? 1.0f : 0.0f)) *
					    scale;
				v[j] = p;
			}
			kc_seg_st<VEC, W>(yr, n, sg, v);
		}
	}
}

template <typename T>
static int kc_rowsoft_t(cudaStream_t s, int mode, void *y, float *loss, const void *x,
			const int32_t *tgt, int64_t rows, int64_t cols, float scale)
{
	if (rows <= 0 || cols <= 0)
		return 0;
	if (cols > INT32_MAX / 2)
		return -EOPNOTSUPP; /* rows are indexed with 32-bit offsets */
	const int W = KC_VN(T);
	/* Vectors when every row starts on a 16-byte boundary. */
	bool vec = cols % W == 0 && kc_aligned16(x) && (!y || kc_aligned16(y));
	int64_t per = vec ? (cols / W + KC_SOFT_UNROLL - 1) / KC_SOFT_UNROLL
			  : (cols + KC_SOFT_UNROLL - 1) / KC_SOFT_UNROLL;
	int threads = per >= KC_SOFT_THREADS ? KC_SOFT_THREADS : (int) ((per + 31) / 32 * 32);
	unsigned grid = kc_grid_sm((size_t) rows * threads, threads);
	if (vec)
		kc_rowsoft_kernel<T, true><<<grid, threads, 0, s>>>(
			mode, (T *) y, loss, (const T *) x, tgt, rows, cols, scale);
	else
		kc_rowsoft_kernel<T, false><<<grid, threads, 0, s>>>(
			mode, (T *) y, loss, (const T *) x, tgt, rows, cols, scale);
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
