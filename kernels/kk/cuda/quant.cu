/* kernels/kk/cuda/quant.cu — weight-only int8 (per channel) and int4
 * (grouped) quantization on the CUDA backend: quantize, dequantize, and
 * Y = X W^T.
 *
 * Formats are kk.h's (struct kk_qmatrix): symmetric, I8 q in -127..127 with
 * scale[row] = max|w| / 127; Q4 stored as q + 8 in a nibble (even element
 * in the low nibble), q in -8..7, scale[row, group] = max|w| / 7.  q is
 * computed against the STORED scale (rounded to f16 when scales are F16), so
 * dequantize(quantize(w)) is as close as the stored scale allows.
 *
 * The decode-time GEMV (m <= KC_QGEMV_MAX_M) is the hot path; it is
 * bandwidth-bound on the weights, so:
 *  - weights are read with 16-byte loads (16 int8 or 32 int4 per load, a
 *    "chunk"), each warp owning KC_QGEMV_ROWS rows so that many loads are in
 *    flight per lane; a warp's 32 lanes read 512 contiguous bytes per row;
 *  - X is staged once per block in shared memory as f32, laid out per chunk
 *    with 4 floats of padding (16-byte LDS without bank conflicts), and
 *    reused by every row of the block; when it does not fit (m * k large)
 *    it is read from global memory (L1/L2) instead;
 *  - weights become f32 without I2F: a byte/nibble is spliced into the
 *    mantissa of 2^23 (PRMT) and 2^23 + offset subtracted, exactly;
 *  - scales are applied once per row (int8) or once per 32-weight chunk,
 *    which never straddles a group (int4; groups are 32, 64 or 128);
 *  - per-lane sums are reduced with warp shuffles, bias added once.
 * Shapes the vector path cannot take (k not a multiple of the chunk, data
 * or X not 16-byte aligned) use the scalar kernel kept below.
 * Larger m: dequantize W (vectorized: one chunk per thread) into a
 * stream-ordered scratch buffer of X's dtype and run the cuBLASLt GEMM
 * (with the bias epilogue).  Quantize is a load-time op: one block per row
 * (I8) or one thread per group (Q4).
 * UNVERIFIED on a GPU. */
#include <errno.h>

#include "kc.h"
#include "kc_vec.cuh"

/* Rows of X handled by the warp-per-channel GEMV kernel (accumulators held in
 * registers, indexed with compile-time constants). */
#define KC_QGEMV_MAX_M 8
#define KC_QGEMV_WARPS 8
/* Rows per warp in the vector GEMV: 4 independent 16-byte weight loads in
 * flight per lane per step. */
#define KC_QGEMV_ROWS 4
/* Padding, in floats, after each chunk's activations in shared memory. */
#define KC_QGEMV_PAD 4

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

/* The kk_qmatrix forms these kernels take: int8 per channel and q4 in
 * groups.  int8 per 32-block (GGUF Q8_0) is not one of them: the backend
 * has no KK_CAP_I8_GROUP32 (backend.cu), and kk_backend_has says so. */
static bool kc_qmatrix_ok(const kk_qmatrix *q)
{
	return q->qtype == KK_Q4 || (q->qtype == KK_I8 && !q->group);
}

extern "C" int kc_op_quantize(kk_backend *be, kk_stream *st, kk_qmatrix *q, const kk_buffer *w)
{
	if (!kc_qmatrix_ok(q))
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

/* 16 int8 -> f32, exact: byte + 128 spliced into the mantissa of 2^23. */
static __device__ __forceinline__ void kc_i8x16(uint4 u, float *f)
{
	uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t b = w[i] ^ 0x80808080u; /* q + 128, per byte */
#pragma unroll
		for (int j = 0; j < 4; j++)
			f[4 * i + j] = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7440u + j)) -
				       8388736.0f; /* 2^23 + 128 */
	}
}
/* 32 int4 (stored q + 8, even element in the low nibble) -> f32, exact. */
static __device__ __forceinline__ void kc_q4x32(uint4 u, float *f)
{
	uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t lo = w[i] & 0x0F0F0F0Fu, hi = (w[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			f[8 * i + 2 * j] =
				__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7440u + j)) -
				8388616.0f; /* 2^23 + 8 */
			f[8 * i + 2 * j + 1] =
				__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7440u + j)) -
				8388616.0f;
		}
	}
}

/* One thread per 16-byte chunk of data: CW = 16 (I8) or 32 (Q4) weights. */
template <typename T, bool Q4>
__global__ void __launch_bounds__(KC_EW_THREADS)
	kc_dequant_vec(T *w, const uint8_t *data, const void *scales, int half, int group,
		       int64_t n, int64_t k)
{
	const int CW = Q4 ? 32 : 16;
	size_t chunks = (size_t) n * k / CW;
	int64_t cpr = k / CW; /* chunks per row */
	for (size_t c = blockIdx.x * (size_t) blockDim.x + threadIdx.x; c < chunks;
	     c += (size_t) gridDim.x * blockDim.x) {
		int64_t row = (int64_t) (c / cpr), j = (int64_t) (c % cpr) * CW;
		float f[CW];
		uint4 u = kc_ld128<true>(data + c * 16);
		float sc;
		if (Q4) {
			kc_q4x32(u, f);
			sc = kc_ld_scale(scales, half, (size_t) row * (k / group) + j / group);
		} else {
			kc_i8x16(u, f);
			sc = kc_ld_scale(scales, half, (size_t) row);
		}
#pragma unroll
		for (int e = 0; e < CW; e++)
			f[e] *= sc;
		kc_stv<CW>(w + c * CW, f);
	}
}

template <typename T> static int kc_dequant_t(cudaStream_t s, void *w, const kk_qmatrix *qm)
{
	int q4 = qm->qtype == KK_Q4, half = qm->scales->dtype == KK_F16;
	int cw = q4 ? 32 : 16;
	if (qm->k % cw == 0 && kc_aligned16(qm->data->ptr) && kc_aligned16(w)) {
		size_t chunks = (size_t) qm->n * qm->k / cw;
		if (q4)
			kc_dequant_vec<T, true>
				<<<kc_grid_sm(chunks, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
					(T *) w, (const uint8_t *) qm->data->ptr, qm->scales->ptr,
					half, qm->group, qm->n, qm->k);
		else
			kc_dequant_vec<T, false>
				<<<kc_grid_sm(chunks, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
					(T *) w, (const uint8_t *) qm->data->ptr, qm->scales->ptr,
					half, qm->group, qm->n, qm->k);
		return kc_check_launch();
	}
	size_t units = (size_t) qm->n * qm->k / (q4 ? 2 : 1);
	kc_dequant_kernel<T><<<kc_grid(units, 256), 256, 0, s>>>(
		(T *) w, qm->data->ptr, qm->scales->ptr, qm->scales->dtype == KK_F16, q4, qm->group,
		qm->n, qm->k);
	return kc_check_launch();
}

extern "C" int kc_op_dequantize(kk_backend *be, kk_stream *st, kk_buffer *w, const kk_qmatrix *q)
{
	if (!kc_qmatrix_ok(q))
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

/* The vector GEMV.  Block: KC_QGEMV_WARPS warps, warp w owning rows
 * (blockIdx.x * WARPS + w) * ROWS + [0, ROWS); lane l reads chunks l, l+32,
 * ... of each row.  XS: X staged in shared memory (dynamic, f32, per chunk
 * CW floats + KC_QGEMV_PAD); else read from global (16-byte aligned). */
template <typename T, typename TB, int M, bool Q4, bool XS>
__global__ void __launch_bounds__(32 * KC_QGEMV_WARPS)
	kc_qgemv_vec(T *y, const T *x, const uint8_t *data, const void *scales, int half, int group,
		     const TB *bias, int64_t n, int64_t k, int m)
{
	const int CW = Q4 ? 32 : 16, CS = CW + KC_QGEMV_PAD, R = KC_QGEMV_ROWS;
	extern __shared__ float kc_xs[];
	const int64_t cpr = k / CW; /* chunks per row */
	if (XS) {
		for (int64_t i = threadIdx.x; i < (int64_t) m * k; i += blockDim.x) {
			int64_t r = i / k, j = i % k;
			kc_xs[(r * cpr + j / CW) * CS + j % CW] = kc_ld(x, (size_t) i);
		}
		__syncthreads();
	}
	int lane = threadIdx.x & 31;
	int64_t row0 = ((int64_t) blockIdx.x * KC_QGEMV_WARPS + (threadIdx.x >> 5)) * R;
	if (row0 >= n)
		return;
	float acc[R][M];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int i = 0; i < M; i++)
			acc[r][i] = 0.0f;
	const size_t rb = (size_t) k / (Q4 ? 2 : 1); /* bytes per row */
	for (int64_t c = lane; c < cpr; c += 32) {
		uint4 wq[R];
#pragma unroll
		for (int r = 0; r < R; r++)
			wq[r] = row0 + r < n
					? kc_ld128<true>(data + (size_t) (row0 + r) * rb + c * 16)
					: make_uint4(0, 0, 0, 0);
		float sc[R];
#pragma unroll
		for (int r = 0; r < R; r++)
			sc[r] = Q4 && row0 + r < n ? kc_ld_scale(scales, half,
								 (size_t) (row0 + r) * (k / group) +
									 c * CW / group)
						   : 1.0f;
#pragma unroll
		for (int i = 0; i < M; i++) {
			if (i >= m)
				break;
			float xv[CW];
			if (XS) {
#pragma unroll
				for (int q = 0; q < CW; q += 4)
					kc_lds4(kc_xs + (i * cpr + c) * CS + q, xv + q);
			} else {
				kc_ldv<CW>(x + (size_t) i * k + c * CW, xv);
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				float wf[CW];
				if (Q4)
					kc_q4x32(wq[r], wf);
				else
					kc_i8x16(wq[r], wf);
				float d = 0.0f;
#pragma unroll
				for (int e = 0; e < CW; e++)
					d += wf[e] * xv[e];
				acc[r][i] += Q4 ? d * sc[r] : d;
			}
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++) {
		int64_t row = row0 + r;
		float rs = !Q4 && row < n ? kc_ld_scale(scales, half, (size_t) row) : 1.0f;
#pragma unroll
		for (int i = 0; i < M; i++) {
			float v = kc_warp_sum(acc[r][i]);
			if (lane == 0 && i < m && row < n)
				kc_st(y, (size_t) i * n + row,
				      v * rs + (bias ? kc_ld(bias, row) : 0.0f));
		}
	}
}

/* Shared memory the vector GEMV needs to stage X, in bytes. */
static size_t kc_qgemv_smem(int q4, int64_t m, int64_t k)
{
	int cw = q4 ? 32 : 16;
	return (size_t) m * (size_t) (k / cw) * (cw + KC_QGEMV_PAD) * sizeof(float);
}

/* Largest dynamic shared memory a block may opt into, cached. */
static size_t kc_smem_optin(void)
{
	static int v;
	if (v <= 0) {
		int dev = 0, n = 0;
		if (cudaGetDevice(&dev) == cudaSuccess &&
		    cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ==
			    cudaSuccess &&
		    n > 0)
			v = n;
		else
			(void) cudaGetLastError();
	}
	return v > 0 ? (size_t) v : 48 * 1024;
}

/* Staged X above this many bytes costs more occupancy than it saves: read X
 * from global (L1/L2) instead. */
#define KC_QGEMV_SMEM_MAX (96 * 1024)

template <typename T, typename TB, int M, bool Q4>
static int kc_qgemv_vec_m(cudaStream_t s, void *y, const void *x, const kk_qmatrix *qm,
			  const void *bias, int64_t m)
{
	int half = qm->scales->dtype == KK_F16;
	unsigned grid = (unsigned) ((qm->n + KC_QGEMV_WARPS * KC_QGEMV_ROWS - 1) /
				    (KC_QGEMV_WARPS * KC_QGEMV_ROWS));
	size_t smem = kc_qgemv_smem(Q4, m, qm->k);
	if (smem <= KC_QGEMV_SMEM_MAX && smem <= kc_smem_optin()) {
		auto kern = kc_qgemv_vec<T, TB, M, Q4, true>;
		if (smem > 48 * 1024) {
			int r = kc_errno_cuda(cudaFuncSetAttribute(
				kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
			if (r < 0)
				return r;
		}
		kern<<<grid, 32 * KC_QGEMV_WARPS, smem, s>>>(
			(T *) y, (const T *) x, (const uint8_t *) qm->data->ptr, qm->scales->ptr,
			half, qm->group, (const TB *) bias, qm->n, qm->k, (int) m);
	} else {
		kc_qgemv_vec<T, TB, M, Q4, false><<<grid, 32 * KC_QGEMV_WARPS, 0, s>>>(
			(T *) y, (const T *) x, (const uint8_t *) qm->data->ptr, qm->scales->ptr,
			half, qm->group, (const TB *) bias, qm->n, qm->k, (int) m);
	}
	return kc_check_launch();
}

/* Accumulators per lane are KC_QGEMV_ROWS x M: M is m rounded up to a
 * power of two, so m == 1 (decode) keeps 4 instead of 32. */
template <typename T, typename TB, bool Q4>
static int kc_qgemv_vec_go(cudaStream_t s, void *y, const void *x, const kk_qmatrix *qm,
			   const void *bias, int64_t m)
{
	if (m <= 1)
		return kc_qgemv_vec_m<T, TB, 1, Q4>(s, y, x, qm, bias, m);
	if (m <= 2)
		return kc_qgemv_vec_m<T, TB, 2, Q4>(s, y, x, qm, bias, m);
	if (m <= 4)
		return kc_qgemv_vec_m<T, TB, 4, Q4>(s, y, x, qm, bias, m);
	return kc_qgemv_vec_m<T, TB, KC_QGEMV_MAX_M, Q4>(s, y, x, qm, bias, m);
}

template <typename T>
static int kc_qgemm_t(kk_backend *be, cudaStream_t s, void *y, const void *x, const kk_qmatrix *qm,
		      const kk_buffer *bias, int64_t m)
{
	int half = qm->scales->dtype == KK_F16, q4 = qm->qtype == KK_Q4;
	if (m <= KC_QGEMV_MAX_M) {
		int cw = q4 ? 32 : 16;
		size_t smem = kc_qgemv_smem(q4, m, qm->k);
		bool xs = smem <= KC_QGEMV_SMEM_MAX && smem <= kc_smem_optin();
		if (qm->k % cw == 0 && kc_aligned16(qm->data->ptr) && (xs || kc_aligned16(x))) {
			bool bf32 = bias && bias->dtype == KK_F32;
			const void *bp = bias ? bias->ptr : NULL;
			if (q4)
				return bf32 ? kc_qgemv_vec_go<T, float, true>(s, y, x, qm, bp, m)
					    : kc_qgemv_vec_go<T, T, true>(s, y, x, qm, bp, m);
			return bf32 ? kc_qgemv_vec_go<T, float, false>(s, y, x, qm, bp, m)
				    : kc_qgemv_vec_go<T, T, false>(s, y, x, qm, bp, m);
		}
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
	if (!kc_qmatrix_ok(w))
		return -EOPNOTSUPP;
	return KC_DISPATCH(kc_dt(x->dtype), kc_qgemm_t, be, kc_stream(be, st), y->ptr, x->ptr, w,
			   bias, m);
}
