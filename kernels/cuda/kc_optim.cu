/* kernels/cuda/kc_optim.cu — AdamW with fp32 master weights, and the global
 * gradient norm.
 *
 * AdamW is one grid-stride elementwise kernel that reads grad, m, v and the
 * master weight once and writes m, v, master and (optionally) the rounded
 * bf16/f16/f32 working copy: 4 f32 reads + 4 writes per parameter, no
 * intermediate buffers.  The bias corrections are computed on the host in
 * f64 and passed in.
 *
 * The gradient norm sums squares per thread in f64, reduces each block with
 * warp shuffles, and adds the block's partial into one f64 accumulator with
 * atomicAdd (stream-ordered scratch from cudaMallocAsync, so concurrent
 * calls on different streams do not share it); a one-thread kernel writes
 * sqrt into the F32 output.  f64 keeps the sum of millions of squares exact
 * enough that the result does not depend on the order of the atomics.
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"

#define KC_OPT_THREADS 256

template <typename TG, typename TP>
__global__ void kc_adamw_kernel(float *master, TP *params, const TG *g, float *m, float *v,
				size_t n, float gs, float lr, float b1, float b2, float eps,
				float wd, float bc1, float bc2)
{
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
	     i += (size_t) gridDim.x * blockDim.x) {
		float gr = kc_ld(g, i) * gs;
		float mi = b1 * m[i] + (1.0f - b1) * gr;
		float vi = b2 * v[i] + (1.0f - b2) * gr * gr;
		float p = master[i];
		p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
		m[i] = mi;
		v[i] = vi;
		master[i] = p;
		if (params)
			kc_st(params, i, p);
	}
}

template <typename TG>
static int kc_adamw_g(cudaStream_t s, float *master, void *params, kc_dtype pdt, const void *g,
		      float *m, float *v, size_t n, float gs, const kk_adamw_params *p, float bc1,
		      float bc2)
{
	unsigned grid = kc_grid(n, KC_OPT_THREADS);
#define KC_ADAMW_LAUNCH(TP)                                                                    \
	kc_adamw_kernel<TG, TP><<<grid, KC_OPT_THREADS, 0, s>>>(                               \
		master, (TP *) params, (const TG *) g, m, v, n, gs, p->lr, p->beta1, p->beta2, \
		p->eps, p->weight_decay, bc1, bc2)
	switch (pdt) {
	case KC_F32:
		KC_ADAMW_LAUNCH(float);
		break;
	case KC_BF16:
		KC_ADAMW_LAUNCH(__nv_bfloat16);
		break;
	case KC_F16:
		KC_ADAMW_LAUNCH(__half);
		break;
	default:
		return -EOPNOTSUPP;
	}
#undef KC_ADAMW_LAUNCH
	return kc_check_launch();
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

template <typename T> __global__ void kc_sumsq_kernel(double *acc, const T *x, size_t n)
{
	__shared__ double sh[32];
	double s = 0.0;
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
	     i += (size_t) gridDim.x * blockDim.x) {
		double e = kc_ld(x, i);
		s += e * e;
	}
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	if (lane == 0)
		sh[wid] = s;
	__syncthreads();
	if (threadIdx.x == 0) {
		double t = 0.0;
		for (int w = 0; w < (int) (blockDim.x >> 5); w++)
			t += sh[w];
		atomicAdd(acc, t);
	}
}

__global__ void kc_sqrt_kernel(float *out, const double *acc)
{
	out[0] = (float) sqrt(acc[0]);
}

template <typename T> static int kc_sumsq_t(cudaStream_t s, double *acc, const void *x, size_t n)
{
	if (n == 0)
		return 0;
	kc_sumsq_kernel<T>
		<<<kc_grid(n, KC_OPT_THREADS), KC_OPT_THREADS, 0, s>>>(acc, (const T *) x, n);
	return kc_check_launch();
}

extern "C" int kc_op_grad_norm(kk_backend *be, kk_stream *st, kk_buffer *out,
			       kk_buffer *const *grads, size_t n_bufs)
{
	cudaStream_t s = kc_stream(be, st);
	double *acc = NULL;
	int r = kc_errno_cuda(cudaMallocAsync((void **) &acc, sizeof(double), s));
	if (r < 0)
		return r;
	r = kc_errno_cuda(cudaMemsetAsync(acc, 0, sizeof(double), s));
	for (size_t i = 0; r >= 0 && i < n_bufs; i++)
		r = KC_DISPATCH(kc_dt(grads[i]->dtype), kc_sumsq_t, s, acc, grads[i]->ptr,
				grads[i]->count);
	if (r >= 0) {
		kc_sqrt_kernel<<<1, 1, 0, s>>>((float *) out->ptr, acc);
		r = kc_check_launch();
	}
	int r2 = kc_errno_cuda(cudaFreeAsync(acc, s));
	return r < 0 ? r : r2;
}
