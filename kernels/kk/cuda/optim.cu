/* kernels/kk/cuda/optim.cu — AdamW with fp32 master weights, and the global
 * gradient norm.
 *
 * AdamW is one elementwise functor (kc_vec.cuh's kc_ew_kernel) that reads
 * grad, m, v and the master weight once and writes m, v, master and
 * (optionally) the rounded bf16/f16/f32 working copy: 16-byte accesses
 * (8 parameters per step when a 2-byte dtype is involved, else 4), no
 * intermediate buffers; the clipping factor (grad_scale, e.g. from
 * kk_grad_clip's global norm) is applied to the gradient inside the same
 * pass instead of a separate scaling pass over the gradients.  The bias
 * corrections are computed on the host in f64 and passed in.
 *
 * The gradient norm is deterministic: every buffer is summed (squares in
 * f64) by a grid of at most KC_GN_BLOCKS blocks, block b adding its partial
 * into slot b of a stream-ordered scratch array (no atomics: the launches
 * are ordered on the stream, so slot b sees the buffers in order); one block
 * then sums the slots in a fixed tree order and writes sqrt into the F32
 * output.  The same inputs give the same bits on every run.
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_vec.cuh"

/* Vector width: 16 bytes of the smaller of the gradient and the rounded
 * copy (HAS_P false: no copy). */
template <typename TG, typename TP, bool HAS_P> struct kc_adamw_op {
	static const int VW = HAS_P ? kc_vw_s<TG, TP>::v : kc_vw_s<TG>::v;
	float *master;
	TP *params;
	const TG *g;
	float *m, *v;
	float gs, lr, b1, b2, eps, wd, bc1, bc2;
	template <int W> __device__ __forceinline__ void run(size_t i) const
	{
		float gr[W], mi[W], vi[W], p[W];
		kc_ldv<W>(g + i, gr);
		kc_ldv<W>(m + i, mi);
		kc_ldv<W>(v + i, vi);
		kc_ldv<W>(master + i, p);
#pragma unroll
		for (int j = 0; j < W; j++) {
			float x = gr[j] * gs;
			mi[j] = b1 * mi[j] + (1.0f - b1) * x;
			vi[j] = b2 * vi[j] + (1.0f - b2) * x * x;
			p[j] -= lr * ((mi[j] / bc1) / (sqrtf(vi[j] / bc2) + eps) + wd * p[j]);
		}
		kc_stv<W>(m + i, mi);
		kc_stv<W>(v + i, vi);
		kc_stv<W>(master + i, p);
		if constexpr (HAS_P)
			kc_stv<W>(params + i, p);
	}
};

template <typename TG, typename TP>
static int kc_adamw_go(cudaStream_t s, float *master, void *params, const void *g, float *m,
		       float *v, size_t n, float gs, const kk_adamw_params *p, float bc1, float bc2)
{
	const void *ptr[5] = { master, params, g, m, v };
	int sz[5] = { 4, (int) sizeof(TP), (int) sizeof(TG), 4, 4 };
	if (params)
		return kc_ew_launch(s,
				    kc_adamw_op<TG, TP, true>{
					    master, (TP *) params, (const TG *) g, m, v, gs, p->lr,
					    p->beta1, p->beta2, p->eps, p->weight_decay, bc1, bc2 },
				    n, ptr, sz, 5);
	return kc_ew_launch(s,
			    kc_adamw_op<TG, float, false>{ master, NULL, (const TG *) g, m, v, gs,
							   p->lr, p->beta1, p->beta2, p->eps,
							   p->weight_decay, bc1, bc2 },
			    n, ptr, sz, 5);
}

template <typename TG>
static int kc_adamw_g(cudaStream_t s, float *master, void *params, kc_dtype pdt, const void *g,
		      float *m, float *v, size_t n, float gs, const kk_adamw_params *p, float bc1,
		      float bc2)
{
	switch (pdt) {
	case KC_F32:
		return kc_adamw_go<TG, float>(s, master, params, g, m, v, n, gs, p, bc1, bc2);
	case KC_BF16:
		return kc_adamw_go<TG, __nv_bfloat16>(s, master, params, g, m, v, n, gs, p, bc1,
						      bc2);
	case KC_F16:
		return kc_adamw_go<TG, __half>(s, master, params, g, m, v, n, gs, p, bc1, bc2);
	default:
		return -EOPNOTSUPP;
	}
}

extern "C" int kc_op_adamw(kk_backend *be, kk_stream *st, kk_buffer *master, kk_buffer *params,
			   const kk_buffer *grads, kk_buffer *m, kk_buffer *v, size_t n,
			   const kk_adamw_params *p)
{
	if (n == 0)
		return 0;
	float gs = p->grad_scale == 0.0f ? 1.0f : p->grad_scale;
	float bc1 = (float) (1.0 - pow((double) p->beta1, (double) p->step));
	float bc2 = (float) (1.0 - pow((double) p->beta2, (double) p->step));
	if (bc1 <= 0.0f || bc2 <= 0.0f)
		return -EINVAL; /* step < 1 */
	return KC_DISPATCH(kc_dt(grads->dtype), kc_adamw_g, kc_stream(be, st),
			   (float *) master->ptr, params ? params->ptr : NULL,
			   params ? kc_dt(params->dtype) : KC_F32, grads->ptr, (float *) m->ptr,
			   (float *) v->ptr, n, gs, p, bc1, bc2);
}

/* ---- gradient norm ------------------------------------------------------ */

#define KC_GN_THREADS 256
/* Most blocks (and partial-sum slots) of one sum-of-squares launch: 8 per
 * SM of a 132-SM H100 fills it; more slots only lengthen the final sum. */
#define KC_GN_BLOCKS 1056

static __device__ __forceinline__ double kc_block_sum_f64(double s, double *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0)
		sh[wid] = s;
	__syncthreads();
	double t = 0.0;
	if (wid == 0) {
		t = lane < nw ? sh[lane] : 0.0;
		for (int o = 16; o > 0; o >>= 1)
			t += __shfl_xor_sync(0xffffffffu, t, o);
	}
	return t; /* valid in thread 0 */
}

/* part[blockIdx.x] += this block's sum of x^2 over x[0..n). */
template <typename T, int W>
__global__ void __launch_bounds__(KC_GN_THREADS)
	kc_sumsq_kernel(double *part, const T *x, size_t n, size_t head)
{
	__shared__ double sh[32];
	size_t tid = blockIdx.x * (size_t) blockDim.x + threadIdx.x;
	size_t nth = (size_t) gridDim.x * blockDim.x;
	size_t h = head < n ? head : n;
	size_t nv = W > 1 ? (n - h) / W : 0;
	double s = 0.0;
	for (size_t v = tid; v < nv; v += nth) {
		float f[W];
		kc_ldv<W, true>(x + h + v * W, f);
		float q = 0.0f; /* W squares in f32 (exact enough for W <= 8), then f64 */
#pragma unroll
		for (int j = 0; j < W; j++)
			q += f[j] * f[j];
		s += (double) q;
	}
	size_t t0 = h + nv * W, ns = h + (n - t0);
	for (size_t e = tid; e < ns; e += nth) {
		double v = kc_ld(x, e < h ? e : t0 + (e - h));
		s += v * v;
	}
	s = kc_block_sum_f64(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] += s;
}

/* out[0] = sqrt(sum of part[0..n)), one block, a fixed order. */
__global__ void __launch_bounds__(KC_GN_THREADS)
	kc_sumsq_final(float *out, const double *part, int n)
{
	__shared__ double sh[32];
	double s = 0.0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += part[i];
	s = kc_block_sum_f64(s, sh);
	if (threadIdx.x == 0)
		out[0] = (float) sqrt(s);
}

template <typename T> static int kc_sumsq_t(cudaStream_t s, double *part, const void *x, size_t n)
{
	if (n == 0)
		return 0;
	const int W = KC_VN(T);
	int sz = (int) sizeof(T), head = kc_vec_head(W, &x, &sz, 1);
	/* Buffers are never misaligned by a non-multiple of the element size,
	 * so a head always exists. */
	if (head < 0 || n < (size_t) head + W) {
		unsigned g = kc_grid_sm(n, KC_GN_THREADS);
		if (g > KC_GN_BLOCKS)
			g = KC_GN_BLOCKS;
		kc_sumsq_kernel<T, 1><<<g, KC_GN_THREADS, 0, s>>>(part, (const T *) x, n, n);
	} else {
		unsigned g = kc_grid_sm((n - head) / W, KC_GN_THREADS);
		if (g > KC_GN_BLOCKS)
			g = KC_GN_BLOCKS;
		kc_sumsq_kernel<T, W>
			<<<g, KC_GN_THREADS, 0, s>>>(part, (const T *) x, n, (size_t) head);
	}
	return kc_check_launch();
}

extern "C" int kc_op_grad_norm(kk_backend *be, kk_stream *st, kk_buffer *out,
			       kk_buffer *const *grads, size_t n_bufs)
{
	cudaStream_t s = kc_stream(be, st);
	double *part = NULL;
	int r = kc_errno_cuda(cudaMallocAsync((void **) &part, KC_GN_BLOCKS * sizeof(double), s));
	if (r < 0)
		return r;
	r = kc_errno_cuda(cudaMemsetAsync(part, 0, KC_GN_BLOCKS * sizeof(double), s));
	for (size_t i = 0; r >= 0 && i < n_bufs; i++)
		r = KC_DISPATCH(kc_dt(grads[i]->dtype), kc_sumsq_t, s, part, grads[i]->ptr,
				grads[i]->count);
	if (r >= 0) {
		kc_sumsq_final<<<1, KC_GN_THREADS, 0, s>>>((float *) out->ptr, part, KC_GN_BLOCKS);
		r = kc_check_launch();
	}
	int r2 = kc_errno_cuda(cudaFreeAsync(part, s));
	return r < 0 ? r : r2;
}
