/* kernels/cuda/kc_quant.cu — weight-only int8 (per channel) and int4
 * (grouped) quantization on the CUDA backend: quantize, dequantize, and
 * Y = X W^T.
 *
 * Formats are kk.h's (struct kk_qmatrix): symmetric, I8 q in -127..127 with
 * scale[row] = max|w| / 127; Q4 stored as q + 8 in a nibble (even element
 * in the low nibble), q in -8..7, scale[row, group] = max|w| / 7.  q is
 * computed against the STORED scale (rounded to f16 when scales are F16), so
 * dequantize(quantize(w)) is as close as the stored scale allows.
 *
 * Launch shapes:
 *  - quantize I8: one block per row (max reduction, then the row);
 *    quantize Q4: one thread per (row, group), a serial loop of <= 128;
 *  - dequantize: one thread per stored byte (1 or 2 elements);
 *  - qgemm with m <= KC_QGEMV_MAX_M (decode): one warp per output channel,
 *    lanes striding over k, m accumulators per lane, a warp-shuffle sum;
 *    8 warps (channels) per block.  Larger m: dequantize W into a
 *    stream-ordered scratch buffer of X's dtype and run the cuBLASLt GEMM
 *    (with the bias epilogue).
 * UNVERIFIED on a GPU. */
#include <errno.h>

#include "kc.h"

/* Rows of X handled by the warp-per-channel GEMV kernel (accumulators held in
 * registers, indexed with compile-time constants). */
#define KC_QGEMV_MAX_M 8
#define KC_QGEMV_WARPS 8

static __device__ __forceinline__ float kc_ld_scale(const void *s, int half, size_t i)
{
	return half ? __half2float(((const __half *) s)[i]) : ((const float *) s)[i];
}

static __device__ __forceinline__ float kc_st_scale(void *s, int half, size_t i, float v)
{
	if (half) {
		((__half *) s)[i] = __float2half(v);
		return __half2float(((__half *) s)[i]);
	}
	((float *) s)[i] = v;
	return v;
}

/* Weight element (row, j) as a float. */
static __device__ __forceinline__ float kc_qw(const void *data, const void *scales, int half,
					      int q4, int group, int64_t k, int64_t row, int64_t j)
{
	if (!q4) {
		int8_t q = ((const int8_t *) data)[(size_t) row * k + j];
		return (float) q * kc_ld_scale(scales, half, (size_t) row);
	}
	uint8_t byte = ((const uint8_t *) data)[((size_t) row * k + j) >> 1];
	int q = ((j & 1) ? (byte >> 4) : (byte & 15)) - 8;
	return (float) q * kc_ld_scale(scales, half, (size_t) row * (k / group) + j / group);
}

/* ---- quantize ----------------------------------------------------------- */

template <typename T>
__global__ void kc_quant_i8_kernel(int8_t *q, void *scales, int half, const T *w, int64_t k)
{
	__shared__ float sh[33];
	__shared__ float s_scale;
	size_t base = (size_t) blockIdx.x * k;
	float mx = 0.0f;
	for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
		mx = fmaxf(mx, fabsf(kc_ld(w, base + j)));
	mx = kc_block_max(mx, sh);
	if (threadIdx.x == 0)
		s_scale = kc_st_scale(scales, half, blockIdx.x, mx / 127.0f);
	__syncthreads();
	float sc = s_scale, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
	for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
		float v = rintf(kc_ld(w, base + j) * inv); /* as the cpu backend */
		q[base + j] = (int8_t) fminf(fmaxf(v, -127.0f), 127.0f);
	}
}

template <typename T>
__global__ void kc_quant_q4_kernel(uint8_t *q, void *scales, int half, const T *w, int64_t n,
				   int64_t k, int group)
{
	size_t groups = (size_t) n * (k / group);
	for (size_t gi = blockIdx.x * (size_t) blockDim.x + threadIdx.x; gi < groups;
	     gi += (size_t) gridDim.x * blockDim.x) {
		size_t base = gi * group; /* groups of a row are contiguous */
		float mx = 0.0f;
		for (int j = 0; j < group; j++)
			mx = fmaxf(mx, fabsf(kc_ld(w, base + j)));
		float sc = kc_st_scale(scales, half, gi, mx / 7.0f);
		float inv = sc > 0.0f ? 1.0f / sc : 0.0f;
		for (int j = 0; j < group; j += 2) {
			int qv[2];
			for (int e = 0; e < 2; e++) {
				float v = rintf(kc_ld(w, base + j + e) * inv);
				qv[e] = (int) fminf(fmaxf(v, -8.0f), 7.0f) + 8;
			}
			q[(base + j) >> 1] = (uint8_t) (qv[0] | (qv[1] << 4));
		}
	}
}

template <typename T> static int kc_quantize_t(cudaStream_t s, kk_qmatrix *qm, const void *w)
{
	int half = qm->scales->dtype == KK_F16;
	if (qm->qtype == KK_I8) {
		if (qm->n > INT32_MAX)
			return -EOPNOTSUPP;
		kc_quant_i8_kernel<T>
			<<<(unsigned) qm->n, kc_row_threads((int) (qm->k > 4096 ? 4096 : qm->k)), 0,
			   s>>>((int8_t *) qm->data->ptr, qm->scales->ptr, half, (const T *) w,
				qm->k);
	} else {
		size_t groups = (size_t) qm->n * (qm->k / qm->group);
		kc_quant_q4_kernel<T><<<kc_grid(groups, 128), 128, 0, s>>>(
			(uint8_t *) qm->data->ptr, qm->scales->ptr, half, (const T *) w, qm->n,
			qm->k, qm->group);
	}
	return kc_check_launch();
}

extern "C" int kc_op_quantize(kk_backend *be, kk_stream *st, kk_qmatrix *q, const kk_buffer *w)
{
	if (q->qtype != KK_I8 && q->qtype != KK_Q4)
		return -EOPNOTSUPP;
	return KC_DISPATCH(kc_dt(w->dtype), kc_quantize_t, kc_stream(be, st), q, w->ptr);
}

/* ---- dequantize --------------------------------------------------------- */

template <typename T>
__global__ void kc_dequant_kernel(T *w, const void *data, const void *scales, int half, int q4,
				  int group, int64_t n, int64_t k)
{
	size_t total = (size_t) n * k;
	size_t per = q4 ? 2 : 1;
	for (size_t b = blockIdx.x * (size_t) blockDim.x + threadIdx.x; b * per < total;
	     b += (size_t) gridDim.x * blockDim.x) {
		for (size_t e = 0; e < per; e++) {
			size_t i = b * per + e;
			int64_t row = (int64_t) (i / k), j = (int64_t) (i % k);
			kc_st(w, i, kc_qw(data, scales, half, q4, group, k, row, j));
		}
	}
}

template <typename T> static int kc_dequant_t(cudaStream_t s, void *w, const kk_qmatrix *qm)
{
	int q4 = qm->qtype == KK_Q4;
	size_t units = (size_t) qm->n * qm->k / (q4 ? 2 : 1);
	kc_dequant_kernel<T><<<kc_grid(units, 256), 256, 0, s>>>(
		(T *) w, qm->data->ptr, qm->scales->ptr, qm->scales->dtype == KK_F16, q4, qm->group,
		qm->n, qm->k);
	return kc_check_launch();
}

extern "C" int kc_op_dequantize(kk_backend *be, kk_stream *st, kk_buffer *w, const kk_qmatrix *q)
{
	if (q->qtype != KK_I8 && q->qtype != KK_Q4)
		return -EOPNOTSUPP;
	return KC_DISPATCH(kc_dt(w->dtype), kc_dequant_t, kc_stream(be, st), w->ptr, q);
}

/* ---- Y = X W^T ----------------------------------------------------------- */

template <typename T, typename TB, int M>
__global__ void kc_qgemv_kernel(T *y, const T *x, const void *data, const void *scales, int half,
				int q4, int group, const TB *bias, int64_t n, int64_t k, int m)
{
	int lane = threadIdx.x & 31;
	int64_t row = (int64_t) blockIdx.x * KC_QGEMV_WARPS + (threadIdx.x >> 5);
	if (row >= n)
		return;
	float acc[M];
#pragma unroll
	for (int r = 0; r < M; r++)
		acc[r] = 0.0f;
	for (int64_t j = lane; j < k; j += 32) {
		float wv = kc_qw(data, scales, half, q4, group, k, row, j);
#pragma unroll
		for (int r = 0; r < M; r++)
			if (r < m)
				acc[r] += wv * kc_ld(x, (size_t) r * k + j);
	}
#pragma unroll
	for (int r = 0; r < M; r++) {
		float v = kc_warp_sum(acc[r]);
		if (lane == 0 && r < m)
			kc_st(y, (size_t) r * n + row, v + (bias ? kc_ld(bias, row) : 0.0f));
	}
}

template <typename T>
static int kc_qgemm_t(kk_backend *be, cudaStream_t s, void *y, const void *x, const kk_qmatrix *qm,
		      const kk_buffer *bias, int64_t m)
{
	int half = qm->scales->dtype == KK_F16, q4 = qm->qtype == KK_Q4;
	if (m <= KC_QGEMV_MAX_M) {
		unsigned grid = (unsigned) ((qm->n + KC_QGEMV_WARPS - 1) / KC_QGEMV_WARPS);
		if (bias && bias->dtype == KK_F32)
			kc_qgemv_kernel<T, float, KC_QGEMV_MAX_M>
				<<<grid, 32 * KC_QGEMV_WARPS, 0, s>>>(
					(T *) y, (const T *) x, qm->data->ptr, qm->scales->ptr,
					half, q4, qm->group, (const float *) bias->ptr, qm->n,
					qm->k, (int) m);
		else
			kc_qgemv_kernel<T, T, KC_QGEMV_MAX_M><<<grid, 32 * KC_QGEMV_WARPS, 0, s>>>(
				(T *) y, (const T *) x, qm->data->ptr, qm->scales->ptr, half, q4,
				qm->group, bias ? (const T *) bias->ptr : NULL, qm->n, qm->k,
				(int) m);
		return kc_check_launch();
	}
	/* Prefill-sized m: dequantize once, then a tensor-core GEMM. */
	kc_ctx *ctx = (kc_ctx *) be->ctx;
	void *w = NULL;
	int r = kc_errno_cuda(cudaMallocAsync(&w, (size_t) qm->n * qm->k * sizeof(T), s));
	if (r < 0)
		return r;
	r = kc_dequant_t<T>(s, w, qm);
	if (r >= 0)
		r = kc_gemm(ctx->blas, s, kc_dtype_of<T>(), kc_dtype_of<T>(), 0, 1, m, qm->n, qm->k,
			    1.0f, x, qm->k, 0, w, qm->k, 0, 0.0f, y, qm->n, 0, 1,
			    bias ? bias->ptr : NULL, bias ? kc_dt(bias->dtype) : KC_F32,
			    KC_ACT_NONE);
	int r2 = kc_errno_cuda(cudaFreeAsync(w, s));
	return r < 0 ? r : r2;
}

extern "C" int kc_op_qgemm(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x,
			   const kk_qmatrix *w, const kk_buffer *bias, int64_t m)
{
	if (w->qtype != KK_I8 && w->qtype != KK_Q4)
		return -EOPNOTSUPP;
	return KC_DISPATCH(kc_dt(x->dtype), kc_qgemm_t, be, kc_stream(be, st), y->ptr, x->ptr, w,
			   bias, m);
}
