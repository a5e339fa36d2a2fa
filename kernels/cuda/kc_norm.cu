/* kernels/cuda/kc_norm.cu — RMSNorm and LayerNorm, forward and backward, with
 * the residual add fused in.
 *
 * Forward: one block per row (128..512 threads, kc_row_threads), each thread
 * owning the columns tid, tid + blockDim, ...  Pass 1 forms h = x + residual
 * (stored to residual_out when asked) and the row statistics with a
 * warp-shuffle block reduction; the last pass re-reads h and writes y.  A
 * thread only ever re-reads elements it wrote itself, so y may alias x and
 * residual_out may alias residual without a barrier.  LayerNorm computes the
 * variance as mean((h - mean)^2) (two passes, no cancellation).
 *
 * Backward: the parameter gradients first (they read dy, which dx may
 * overwrite): a column kernel, 256 columns per block and a slice of rows per
 * blockIdx.y, summing in registers and adding into the f32 dweight/dbias with
 * one atomicAdd per column per slice.  Then one block per row for dx.
 * UNVERIFIED on a GPU. */
#include <errno.h>

#include "kc.h"

/* Row slices per column block in the parameter-gradient kernels: enough
 * blocks to fill the GPU for dims of a few thousand. */
#define KC_NORM_ROW_SLICES 64

/* ---- kernels ------------------------------------------------------------ */

template <typename T>
__global__ void kc_norm_fwd_kernel(int layer, T *y, T *res_out, float *mean_out, float *rstd_out,
				   const T *x, const T *res, const T *w, const T *b, int64_t dim,
				   float eps)
{
	__shared__ float sh[33];
	size_t base = (size_t) blockIdx.x * dim;
	float sum = 0.0f;
	for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
		float h = kc_ld(x, base + i);
		if (res)
			h += kc_ld(res, base + i);
		if (res_out) {
			kc_st(res_out, base + i, h);
			h = kc_ld(res_out, base + i); /* use the stored (rounded) h */
		}
		sum += layer ? h : h * h;
	}
	float mean = 0.0f, rstd;
	if (layer) {
		mean = kc_block_sum(sum, sh) / (float) dim;
		float var = 0.0f;
		for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
			float h =
				res_out ? kc_ld(res_out, base + i)
					: kc_ld(x, base + i) + (res ? kc_ld(res, base + i) : 0.0f);
			var += (h - mean) * (h - mean);
		}
		var = kc_block_sum(var, sh) / (float) dim;
		rstd = rsqrtf(var + eps);
	} else {
		rstd = rsqrtf(kc_block_sum(sum, sh) / (float) dim + eps);
	}
	for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
		float h = res_out ? kc_ld(res_out, base + i)
				  : kc_ld(x, base + i) + (res ? kc_ld(res, base + i) : 0.0f);
		float v = (h - mean) * rstd * kc_ld(w, i);
		if (b)
			v += kc_ld(b, i);
		kc_st(y, base + i, v);
	}
	if (threadIdx.x == 0) {
		if (rstd_out)
			rstd_out[blockIdx.x] = rstd;
		if (mean_out)
			mean_out[blockIdx.x] = mean;
	}
}

/* dweight[j] += sum_r dy[r,j] * xhat[r,j]; dbias[j] += sum_r dy[r,j]. */
template <typename T>
__global__ void kc_norm_dparam_kernel(int layer, float *dw, float *db, const T *dy, const T *h,
				      const float *mean, const float *rstd, int64_t rows,
				      int64_t dim)
{
	int64_t j = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= dim)
		return;
	int64_t per = (rows + gridDim.y - 1) / gridDim.y;
	int64_t r0 = (int64_t) blockIdx.y * per, r1 = r0 + per < rows ? r0 + per : rows;
	float sw = 0.0f, sb = 0.0f;
	for (int64_t r = r0; r < r1; r++) {
		float g = kc_ld(dy, (size_t) r * dim + j);
		float xh = (kc_ld(h, (size_t) r * dim + j) - (layer ? mean[r] : 0.0f)) * rstd[r];
		sw += g * xh;
		sb += g;
	}
	if (r0 < r1) {
		atomicAdd(&dw[j], sw);
		if (db)
			atomicAdd(&db[j], sb);
	}
}

template <typename T>
__global__ void kc_norm_dx_kernel(int layer, T *dx, const T *dy, const T *dres, const T *h,
				  const T *w, const float *mean, const float *rstd, int64_t dim)
{
	__shared__ float sh[33];
	size_t base = (size_t) blockIdx.x * dim;
	float mu = layer ? mean[blockIdx.x] : 0.0f, rs = rstd[blockIdx.x];
	float s_g = 0.0f, s_gx = 0.0f;
	for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
		float g = kc_ld(dy, base + i) * kc_ld(w, i);
		float xh = (kc_ld(h, base + i) - mu) * rs;
		s_g += g;
		s_gx += g * xh;
	}
	float m_g = layer ? kc_block_sum(s_g, sh) / (float) dim : 0.0f;
	float m_gx = kc_block_sum(s_gx, sh) / (float) dim;
	for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
		float g = kc_ld(dy, base + i) * kc_ld(w, i);
		float xh = (kc_ld(h, base + i) - mu) * rs;
		float v = rs * (g - m_g - xh * m_gx);
		if (dres)
			v += kc_ld(dres, base + i);
		kc_st(dx, base + i, v);
	}
}

/* ---- launchers ---------------------------------------------------------- */

template <typename T>
static int kc_norm_fwd(cudaStream_t s, int layer, void *y, void *res_out, float *mean, float *rstd,
		       const void *x, const void *res, const void *w, const void *b, int64_t rows,
		       int64_t dim, float eps)
{
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	kc_norm_fwd_kernel<T>
		<<<(unsigned) rows, kc_row_threads((int) (dim > 4096 ? 4096 : dim)), 0, s>>>(
			layer, (T *) y, (T *) res_out, mean, rstd, (const T *) x, (const T *) res,
			(const T *) w, (const T *) b, dim, eps);
	return kc_check_launch();
}

template <typename T>
static int kc_norm_bwd(cudaStream_t s, int layer, void *dx, float *dw, float *db, const void *dy,
		       const void *dres, const void *h, const void *w, const float *mean,
		       const float *rstd, int64_t rows, int64_t dim)
{
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	int64_t slices = rows < KC_NORM_ROW_SLICES ? rows : KC_NORM_ROW_SLICES;
	dim3 g((unsigned) ((dim + 255) / 256), (unsigned) slices);
	kc_norm_dparam_kernel<T><<<g, 256, 0, s>>>(layer, dw, db, (const T *) dy, (const T *) h,
						   mean, rstd, rows, dim);
	int r = kc_check_launch();
	if (r < 0)
		return r;
	kc_norm_dx_kernel<T>
		<<<(unsigned) rows, kc_row_threads((int) (dim > 4096 ? 4096 : dim)), 0, s>>>(
			layer, (T *) dx, (const T *) dy, (const T *) dres, (const T *) h,
			(const T *) w, mean, rstd, dim);
	return kc_check_launch();
}

#define PTR(b) ((b) ? (b)->ptr : NULL)

extern "C" int kc_op_rmsnorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y,
				 kk_buffer *residual_out, kk_buffer *rstd, const kk_buffer *x,
				 const kk_buffer *residual, const kk_buffer *weight, int64_t rows,
				 int64_t dim, float eps)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_norm_fwd, kc_stream(be, st), 0, y->ptr,
			   PTR(residual_out), NULL, (float *) PTR(rstd), x->ptr, PTR(residual),
			   weight->ptr, NULL, rows, dim, eps);
}

extern "C" int kc_op_layernorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y,
				   kk_buffer *residual_out, kk_buffer *mean, kk_buffer *rstd,
				   const kk_buffer *x, const kk_buffer *residual,
				   const kk_buffer *weight, const kk_buffer *bias, int64_t rows,
				   int64_t dim, float eps)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_norm_fwd, kc_stream(be, st), 1, y->ptr,
			   PTR(residual_out), (float *) PTR(mean), (float *) PTR(rstd), x->ptr,
			   PTR(residual), weight->ptr, PTR(bias), rows, dim, eps);
}

extern "C" int kc_op_rmsnorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
				 const kk_buffer *dy, const kk_buffer *dresidual,
				 const kk_buffer *h, const kk_buffer *weight, const kk_buffer *rstd,
				 int64_t rows, int64_t dim)
{
	return KC_DISPATCH(kc_dt(dy->dtype), kc_norm_bwd, kc_stream(be, st), 0, dx->ptr,
			   (float *) dweight->ptr, NULL, dy->ptr, PTR(dresidual), h->ptr,
			   weight->ptr, NULL, (const float *) rstd->ptr, rows, dim);
}

extern "C" int kc_op_layernorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
				   kk_buffer *dbias, const kk_buffer *dy,
				   const kk_buffer *dresidual, const kk_buffer *h,
				   const kk_buffer *weight, const kk_buffer *mean,
				   const kk_buffer *rstd, int64_t rows, int64_t dim)
{
	return KC_DISPATCH(kc_dt(dy->dtype), kc_norm_bwd, kc_stream(be, st), 1, dx->ptr,
			   (float *) dweight->ptr, (float *) PTR(dbias), dy->ptr, PTR(dresidual),
			   h->ptr, weight->ptr, (const float *) mean->ptr,
			   (const float *) rstd->ptr, rows, dim);
}
