/* kernels/kk/cuda/norm.cu — RMSNorm and LayerNorm, forward and backward, with
 * the residual add fused in.
 *
 * Rows up to KC_NORM_REG_MAX elements (8192: every hidden size from 768 to
 * 8192) are held in registers, so each input is read from memory exactly
 * once:
 *  - forward: one block per row (grid-stride over rows, a grid of one
 *    resident wave), each thread owning NS segments of W elements (W = 4 f32
 *    or 8 bf16/f16: one 16-byte access; kc_vec.cuh's segment layout, scalar
 *    but still coalesced when the row length or a pointer rules vectors out).
 *    h = x + residual is formed in registers (rounded to the storage dtype
 *    when residual_out is written, as the cpu backend does), the statistics
 *    reduced with warp shuffles (LayerNorm: mean, then mean((h - mean)^2)
 *    from the same registers, no cancellation), and y written from them.
 *  - backward: the same layout computes dx and, in the same pass, each
 *    block's partial dweight/dbias in registers (a thread owns the same
 *    columns in every row); the partials go to a stream-ordered scratch
 *    [grid, dim] and a column kernel adds them into dweight/dbias in a fixed
 *    order: deterministic, no float atomics, dy and h read once.
 * Every thread re-reads only elements it loaded itself, so y may alias x and
 * residual_out may alias residual.
 *
 * Longer rows take the multi-pass kernels below (re-reading the row; one
 * block per row; the parameter gradients with atomics).
 * UNVERIFIED on a GPU. */
#include <errno.h>

#include "kc.h"
#include "kc_vec.cuh"

/* Row slices per column block in the long-row parameter-gradient kernel:
 * enough blocks to fill the GPU for dims of a few thousand. */
#define KC_NORM_ROW_SLICES 64

/* Longest row held in registers: KC_NORM_THREADS threads x KC_NORM_EPT f32
 * values each (at 32 per thread the backward's scalar layout spilled under
 * ptxas; 16 keeps every variant spill-free within 128 registers). */
#define KC_NORM_THREADS 512
#define KC_NORM_EPT	16
/* The scalar layout (odd row lengths, misaligned views) computes an address
 * per element and needs more registers: at most 256 threads, so ptxas may
 * use up to 255 registers without spilling; longer such rows take the
 * multi-pass kernels. */
#define KC_NORM_THREADS_SCALAR 256
#define KC_NORM_REG_MAX	       (KC_NORM_THREADS * KC_NORM_EPT)

/* ---- kernels: rows too long for registers (dim > KC_NORM_REG_MAX) ------- */

template <typename T>
__global__ void kc_norm_fwd_big(int layer, T *y, T *res_out, float *mean_out, float *rstd_out,
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
__global__ void kc_norm_dparam_big(int layer, float *dw, float *db, const T *dy, const T *h,
				   const float *mean, const float *rstd, int64_t rows, int64_t dim)
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
__global__ void kc_norm_dx_big(int layer, T *dx, const T *dy, const T *dres, const T *h, const T *w,
			       const float *mean, const float *rstd, int64_t dim)
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

/* ---- kernels: rows in registers ----------------------------------------- */

/* (a, b) += (a2, b2): kc_block_reduce2's merge for two sums. */
struct kc_add2 {
	__device__ __forceinline__ void operator()(float &a, float &b, float a2, float b2) const
	{
		a += a2;
		b += b2;
	}
};

/* Sum of a and b over the block; sh holds 66 floats. */
static __device__ __forceinline__ void kc_block_sum2(float &a, float &b, float *sh)
{
	kc_block_reduce2(a, b, sh, 0.0f, 0.0f, kc_add2());
}

template <typename T, int NS, bool VEC, bool LAYER>
__global__ void __launch_bounds__(VEC ? KC_NORM_THREADS : KC_NORM_THREADS_SCALAR, 1)
	kc_norm_fwd_reg(T *y, T *res_out, float *mean_out, float *rstd_out, const T *x,
			const T *res, const T *w, const T *b, int64_t rows, int64_t dim, float eps)
{
	const int W = KC_VN(T);
	const int n = (int) dim; /* <= KC_NORM_REG_MAX */
	__shared__ float sh[33];
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		size_t base = (size_t) r * dim;
		float h[NS][W];
#pragma unroll
		for (int k = 0; k < NS; k++)
			kc_seg_ld<VEC, W>(x + base, n, k, h[k], 0.0f);
		if (res) {
			float a[NS][W];
#pragma unroll
			for (int k = 0; k < NS; k++)
				kc_seg_ld<VEC, W>(res + base, n, k, a[k], 0.0f);
#pragma unroll
			for (int k = 0; k < NS; k++)
#pragma unroll
				for (int j = 0; j < W; j++)
					h[k][j] += a[k][j];
		}
		if (res_out) {
#pragma unroll
			for (int k = 0; k < NS; k++) {
#pragma unroll
				for (int j = 0; j < W; j++)
					h[k][j] = kc_round(h[k][j], T()); /* the stored h */
				kc_seg_st<VEC, W>(res_out + base, n, k, h[k]);
			}
		}
		float sum = 0.0f;
#pragma unroll
		for (int k = 0; k < NS; k++)
#pragma unroll
			for (int j = 0; j < W; j++)
				sum += LAYER ? h[k][j] : h[k][j] * h[k][j];
		float mean = 0.0f, rstd;
		if (LAYER) {
			mean = kc_block_sum(sum, sh) / (float) dim;
			float var = 0.0f;
#pragma unroll
			for (int k = 0; k < NS; k++)
#pragma unroll
				for (int j = 0; j < W; j++) {
					float d = h[k][j] - mean;
					var += kc_seg_off<VEC, W>(k, j) < n ? d * d : 0.0f;
				}
			rstd = rsqrtf(kc_block_sum(var, sh) / (float) dim + eps);
		} else {
			rstd = rsqrtf(kc_block_sum(sum, sh) / (float) dim + eps);
		}
#pragma unroll
		for (int k = 0; k < NS; k++) {
			float wv[W], bv[W];
			kc_seg_ld<VEC, W, true>(w, n, k, wv, 0.0f);
			if (b)
				kc_seg_ld<VEC, W, true>(b, n, k, bv, 0.0f);
#pragma unroll
			for (int j = 0; j < W; j++)
				h[k][j] = (h[k][j] - mean) * rstd * wv[j] + (b ? bv[j] : 0.0f);
			kc_seg_st<VEC, W>(y + base, n, k, h[k]);
		}
		if (threadIdx.x == 0) {
			if (rstd_out)
				rstd_out[r] = rstd;
			if (mean_out)
				mean_out[r] = mean;
		}
	}
}

/* dx for the rows of this block, and the block's partial parameter
 * gradients: pw[blockIdx.x * dim + j] = sum over its rows of dy * xhat,
 * pb likewise of dy (NULL: RMSNorm). */
template <typename T, int NS, bool VEC, bool LAYER>
__global__ void __launch_bounds__(VEC ? KC_NORM_THREADS : KC_NORM_THREADS_SCALAR, 1)
	kc_norm_bwd_reg(T *dx, float *pw, float *pb, const T *dy, const T *dres, const T *h,
			const T *w, const float *mean, const float *rstd, int64_t rows, int64_t dim)
{
	const int W = KC_VN(T);
	const int n = (int) dim; /* <= KC_NORM_REG_MAX */
	__shared__ float sh[66];
	float aw[NS][W], ab[NS][W];
	kc_zero2<NS, W>(aw, ab);
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		size_t base = (size_t) r * dim;
		float mu = LAYER ? mean[r] : 0.0f, rs = rstd[r];
		float g[NS][W], xh[NS][W];
#pragma unroll
		for (int k = 0; k < NS; k++) {
			kc_seg_ld<VEC, W>(dy + base, n, k, g[k], 0.0f);
			kc_seg_ld<VEC, W>(h + base, n, k, xh[k], 0.0f);
		}
		float s_g = 0.0f, s_gx = 0.0f;
#pragma unroll
		for (int k = 0; k < NS; k++) {
			float wv[W];
			kc_seg_ld<VEC, W, true>(w, n, k, wv, 0.0f);
#pragma unroll
			for (int j = 0; j < W; j++) {
				xh[k][j] = (xh[k][j] - mu) * rs;
				aw[k][j] += g[k][j] * xh[k][j];
				ab[k][j] += g[k][j];
				g[k][j] *= wv[j];
				s_g += g[k][j];
				s_gx += g[k][j] * xh[k][j];
			}
		}
		kc_block_sum2(s_g, s_gx, sh);
		float m_g = LAYER ? s_g / (float) dim : 0.0f, m_gx = s_gx / (float) dim;
#pragma unroll
		for (int k = 0; k < NS; k++) {
			float d[W];
			if (dres)
				kc_seg_ld<VEC, W>(dres + base, n, k, d, 0.0f);
#pragma unroll
			for (int j = 0; j < W; j++)
				g[k][j] = rs * (g[k][j] - m_g - xh[k][j] * m_gx) +
					  (dres ? d[j] : 0.0f);
			kc_seg_st<VEC, W>(dx + base, n, k, g[k]);
		}
	}
#pragma unroll
	for (int k = 0; k < NS; k++) {
		kc_seg_st<VEC, W>(pw + (size_t) blockIdx.x * dim, n, k, aw[k]);
		if (pb)
			kc_seg_st<VEC, W>(pb + (size_t) blockIdx.x * dim, n, k, ab[k]);
	}
}

/* Columns per block of the partial-sum reduction, and slices of the
 * partials each column's sum is split into (one warp each). */
#define KC_DP_COLS   32
#define KC_DP_SLICES 8

/* dst[j] += sum over g < nparts of part[g * dim + j], in a fixed order. */
__global__ void __launch_bounds__(KC_DP_COLS *KC_DP_SLICES)
	kc_norm_dparam_reduce(float *dst, const float *part, int nparts, int64_t dim)
{
	__shared__ float sh[KC_DP_SLICES][KC_DP_COLS];
	int c = threadIdx.x % KC_DP_COLS, sl = threadIdx.x / KC_DP_COLS;
	int64_t j = (int64_t) blockIdx.x * KC_DP_COLS + c;
	float acc = 0.0f;
	if (j < dim)
		for (int g = sl; g < nparts; g += KC_DP_SLICES)
			acc += part[(size_t) g * dim + j];
	sh[sl][c] = acc;
	__syncthreads();
	if (sl == 0 && j < dim) {
		float t = 0.0f;
		for (int i = 0; i < KC_DP_SLICES; i++)
			t += sh[i][c];
		dst[j] += t;
	}
}

/* ---- launchers ---------------------------------------------------------- */

/* Register-path shape for a row of dim elements of T: segments per thread
 * (0: the row does not fit, use the long-row kernels) and threads. */
template <typename T> static int kc_norm_shape(int64_t dim, bool vec, int *threads)
{
	const int W = KC_VN(T), tmax = vec ? KC_NORM_THREADS : KC_NORM_THREADS_SCALAR;
	if (dim > (int64_t) tmax * KC_NORM_EPT)
		return 0;
	int64_t nvec = (dim + W - 1) / W;
	for (int ns = 1; ns * W <= KC_NORM_EPT; ns *= 2)
		if ((nvec + ns - 1) / ns <= tmax) {
			*threads = (int) (((nvec + ns - 1) / ns + 31) / 32 * 32);
			return ns;
		}
	return 0;
}

/* Blocks of one resident wave of kernel k at `threads` threads. */
template <typename K> static unsigned kc_wave(K k, int threads, int64_t rows)
{
	int per = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, threads, 0) != cudaSuccess ||
	    per <= 0) {
		(void) cudaGetLastError();
		per = 1;
	}
	int64_t g = (int64_t) kc_sm_count() * per;
	if (g > rows)
		g = rows;
	if (g > (int64_t) KC_GRID_CAP)
		g = KC_GRID_CAP;
	return g > 0 ? (unsigned) g : 1u;
}

template <typename T, int NS, bool VEC, bool LAYER> struct kc_norm_fwd_go {
	static int run(cudaStream_t s, int threads, void *y, void *res_out, float *mean,
		       float *rstd, const void *x, const void *res, const void *w, const void *b,
		       int64_t rows, int64_t dim, float eps)
	{
		auto k = kc_norm_fwd_reg<T, NS, VEC, LAYER>;
		k<<<kc_wave(k, threads, rows), threads, 0, s>>>(
			(T *) y, (T *) res_out, mean, rstd, (const T *) x, (const T *) res,
			(const T *) w, (const T *) b, rows, dim, eps);
		return kc_check_launch();
	}
};

/* GO<T, NS, VEC, LAYER>::run(args...) with the values a thread holds per
 * vector lane (ns: 1, 2, else the most, KC_NORM_EPT / KC_VN(T)), the
 * vector layout and LayerNorm-or-RMSNorm as template constants: the one
 * dispatch of the register-resident forward and backward kernels. */
template <typename T, template <typename, int, bool, bool> class GO, bool VEC, bool LAYER,
	  typename... A>
static int kc_norm_ns(int ns, A... args)
{
	return ns == 1	 ? GO<T, 1, VEC, LAYER>::run(args...)
	       : ns == 2 ? GO<T, 2, VEC, LAYER>::run(args...)
			 : GO<T, KC_NORM_EPT / KC_VN(T), VEC, LAYER>::run(args...);
}

template <typename T, template <typename, int, bool, bool> class GO, typename... A>
static int kc_norm_reg(int ns, bool vec, bool layer, A... args)
{
	if (vec)
		return layer ? kc_norm_ns<T, GO, true, true>(ns, args...)
			     : kc_norm_ns<T, GO, true, false>(ns, args...);
	return layer ? kc_norm_ns<T, GO, false, true>(ns, args...)
		     : kc_norm_ns<T, GO, false, false>(ns, args...);
}

/* Whether the rows of every (non-NULL) tensor start on 16-byte boundaries,
 * so the vector layout applies. */
template <typename T>
static bool kc_norm_vec(int64_t dim, const void *a, const void *b, const void *c, const void *d,
			const void *e, const void *f)
{
	const void *p[6] = { a, b, c, d, e, f };
	if (dim % KC_VN(T))
		return false;
	for (int i = 0; i < 6; i++)
		if (p[i] && !kc_aligned16(p[i]))
			return false;
	return true;
}

template <typename T>
static int kc_norm_fwd(cudaStream_t s, int layer, void *y, void *res_out, float *mean, float *rstd,
		       const void *x, const void *res, const void *w, const void *b, int64_t rows,
		       int64_t dim, float eps)
{
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	bool vec = kc_norm_vec<T>(dim, y, res_out, x, res, w, b);
	int threads = 0, ns = kc_norm_shape<T>(dim, vec, &threads);
	if (ns)
		return kc_norm_reg<T, kc_norm_fwd_go>(ns, vec, layer, s, threads, y, res_out, mean,
						      rstd, x, res, w, b, rows, dim, eps);
	kc_norm_fwd_big<T>
		<<<(unsigned) rows, kc_row_threads((int) (dim > 4096 ? 4096 : dim)), 0, s>>>(
			layer, (T *) y, (T *) res_out, mean, rstd, (const T *) x, (const T *) res,
			(const T *) w, (const T *) b, dim, eps);
	return kc_check_launch();
}

template <typename T, int NS, bool VEC, bool LAYER> struct kc_norm_bwd_go {
	static int run(cudaStream_t s, int threads, void *dx, float *dw, float *db, const void *dy,
		       const void *dres, const void *h, const void *w, const float *mean,
		       const float *rstd, int64_t rows, int64_t dim)
	{
		auto k = kc_norm_bwd_reg<T, NS, VEC, LAYER>;
		unsigned grid = kc_wave(k, threads, rows);
		int nbuf = db ? 2 : 1;
		float *part = NULL;
		int r = kc_errno_cuda(cudaMallocAsync(
			(void **) &part, (size_t) nbuf * grid * dim * sizeof(float), s));
		if (r < 0)
			return r;
		float *pb = db ? part + (size_t) grid * dim : NULL;
		k<<<grid, threads, 0, s>>>((T *) dx, part, pb, (const T *) dy, (const T *) dres,
					   (const T *) h, (const T *) w, mean, rstd, rows, dim);
		r = kc_check_launch();
		unsigned cg = (unsigned) ((dim + KC_DP_COLS - 1) / KC_DP_COLS);
		if (r >= 0) {
			kc_norm_dparam_reduce<<<cg, KC_DP_COLS * KC_DP_SLICES, 0, s>>>(
				dw, part, (int) grid, dim);
			r = kc_check_launch();
		}
		if (r >= 0 && db) {
			kc_norm_dparam_reduce<<<cg, KC_DP_COLS * KC_DP_SLICES, 0, s>>>(
				db, pb, (int) grid, dim);
			r = kc_check_launch();
		}
		int r2 = kc_errno_cuda(cudaFreeAsync(part, s));
		return r < 0 ? r : r2;
	}
};

template <typename T>
static int kc_norm_bwd(cudaStream_t s, int layer, void *dx, float *dw, float *db, const void *dy,
		       const void *dres, const void *h, const void *w, const float *mean,
		       const float *rstd, int64_t rows, int64_t dim)
{
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	/* dweight/dbias are f32: the partial rows need dim % 4 == 0 too, which
	 * dim % W == 0 implies. */
	bool vec = kc_norm_vec<T>(dim, dx, dy, dres, h, w, NULL);
	int threads = 0, ns = kc_norm_shape<T>(dim, vec, &threads);
	if (ns) /* RMSNorm has no bias gradient */
		return kc_norm_reg<T, kc_norm_bwd_go>(ns, vec, layer, s, threads, dx, dw,
						      layer ? db : (float *) NULL, dy, dres, h, w,
						      mean, rstd, rows, dim);
	int64_t slices = rows < KC_NORM_ROW_SLICES ? rows : KC_NORM_ROW_SLICES;
	dim3 g((unsigned) ((dim + 255) / 256), (unsigned) slices);
	kc_norm_dparam_big<T><<<g, 256, 0, s>>>(layer, dw, db, (const T *) dy, (const T *) h, mean,
						rstd, rows, dim);
	int r = kc_check_launch();
	if (r < 0)
		return r;
	kc_norm_dx_big<T>
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
