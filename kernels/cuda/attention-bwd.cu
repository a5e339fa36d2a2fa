/* kernels/cuda/attention-bwd.cu — the backward of the fused prefill
 * attention (kk_attention_bwd) on the CUDA backend, over packed
 * variable-length sequences; the forward and decode are in attention.cu.
 *
 * FlashAttention-2 structure, no atomics: a pre-pass computes
 * delta_i = dO_i . O_i (one warp per row and head); kc_attn_dq_kernel
 * re-forms P from lse per query tile and accumulates dq; kc_attn_dkdv_kernel
 * owns 32 keys of one kv head and loops over every query head of its group
 * and every query tile at or after the keys, accumulating dk and dv in
 * registers, so each output element is written once.
 *
 * Head dims 64 and 128 (template parameter D), dtypes F32/BF16/F16.
 * Checked on the CPU emulation (tests/kernels/gpu/emu); UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_vec.cuh"

#define KC_BR	32 /* query rows per block (dq) and per tile (dkdv) */
#define KC_BC	32 /* keys per tile (dq) and per block (dkdv) */
#define KC_AW	4  /* warps per block */
#define KC_RPW	(KC_BR / KC_AW)
#define KC_FULL 0xffffffffu

/* ---- backward ------------------------------------------------------------ */

/* delta[t, h] = sum_d dO[t, h, d] * O[t, h, d]; one warp per (t, h). */
template <typename T, int D>
__global__ void kc_attn_delta_kernel(float *delta, const T *dout, const T *o, size_t rows)
{
	size_t w = (blockIdx.x * (size_t) blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	for (; w < rows; w += ((size_t) gridDim.x * blockDim.x) >> 5) {
		float s = 0.0f;
#pragma unroll
		for (int c = 0; c < D / 32; c++)
			s += kc_ld(dout, w * D + lane + 32 * c) * kc_ld(o, w * D + lane + 32 * c);
		s = kc_warp_sum(s);
		if (lane == 0)
			delta[w] = s;
	}
}

template <typename T, int D>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_dq_kernel(const T *q, const T *k, const T *v, const T *dout, const float *lse,
			  const float *delta, T *dq, const int32_t *cu, int hq, int hkv,
			  float scale, int causal)
{
	constexpr int E = D / 32;
	extern __shared__ float smem[];
	float *sq = smem;		  /* [BR][D] */
	float *sdo = sq + KC_BR * D;	  /* [BR][D] */
	float *sk = sdo + KC_BR * D;	  /* [BC][D + 1] */
	float *sv = sk + KC_BC * (D + 1); /* [BC][D + 1] */
	int seq = blockIdx.z, h = blockIdx.y;
	int start = cu[seq], L = cu[seq + 1] - start;
	int q0 = blockIdx.x * KC_BR;
	if (q0 >= L)
		return;
	int hk = h / (hq / hkv);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int i = threadIdx.x; i < KC_BR * D; i += blockDim.x) {
		int r = i / D, d = i % D;
		bool ok = q0 + r < L;
		size_t off = ((size_t) (start + q0 + r) * hq + h) * D + d;
		sq[i] = ok ? kc_ld(q, off) : 0.0f;
		sdo[i] = ok ? kc_ld(dout, off) : 0.0f;
	}
	float rl[KC_RPW], rd[KC_RPW], acc[KC_RPW][E];
#pragma unroll
	for (int rr = 0; rr < KC_RPW; rr++) {
		int qpos = q0 + warp * KC_RPW + rr;
		size_t row = (size_t) (start + qpos) * hq + h;
		rl[rr] = qpos < L ? lse[row] : 0.0f;
		rd[rr] = qpos < L ? delta[row] : 0.0f;
#pragma unroll
		for (int c = 0; c < E; c++)
			acc[rr][c] = 0.0f;
	}
	int kend = causal ? min(L, q0 + KC_BR) : L;
	for (int k0 = 0; k0 < kend; k0 += KC_BC) {
		__syncthreads();
		for (int i = threadIdx.x; i < KC_BC * D; i += blockDim.x) {
			int r = i / D, d = i % D;
			bool ok = k0 + r < L;
			size_t off = ((size_t) (start + k0 + r) * hkv + hk) * D + d;
			sk[r * (D + 1) + d] = ok ? kc_ld(k, off) : 0.0f;
			sv[r * (D + 1) + d] = ok ? kc_ld(v, off) : 0.0f;
		}
		__syncthreads();
		int kpos = k0 + lane;
#pragma unroll
		for (int rr = 0; rr < KC_RPW; rr++) {
			int r = warp * KC_RPW + rr, qpos = q0 + r;
			const float *qr = sq + r * D, *dr = sdo + r * D;
			const float *kr = sk + lane * (D + 1), *vr = sv + lane * (D + 1);
			float s = 0.0f, dp = 0.0f;
#pragma unroll 8
			for (int d = 0; d < D; d++) {
				s += qr[d] * kr[d];
				dp += dr[d] * vr[d];
			}
			bool valid = qpos < L && kpos < L && (!causal || kpos <= qpos);
			float p = valid ? expf(s * scale - rl[rr]) : 0.0f;
			float ds = p * (dp - rd[rr]);
			for (int j = 0; j < KC_BC; j++) {
				float dsj = __shfl_sync(KC_FULL, ds, j);
				const float *kj = sk + j * (D + 1) + lane;
#pragma unroll
				for (int c = 0; c < E; c++)
					acc[rr][c] += dsj * kj[32 * c];
			}
		}
	}
#pragma unroll
	for (int rr = 0; rr < KC_RPW; rr++) {
		int qpos = q0 + warp * KC_RPW + rr;
		if (qpos >= L)
			continue;
		size_t row = (size_t) (start + qpos) * hq + h;
#pragma unroll
		for (int c = 0; c < E; c++)
			kc_st(dq, row * D + lane + 32 * c, acc[rr][c] * scale);
	}
}

template <typename T, int D>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_dkdv_kernel(const T *q, const T *k, const T *v, const T *dout, const float *lse,
			    const float *delta, T *dk, T *dv, const int32_t *cu, int hq, int hkv,
			    float scale, int causal)
{
	constexpr int E = D / 32;
	extern __shared__ float smem[];
	float *sk = smem;		   /* [BC][D] */
	float *sv = sk + KC_BC * D;	   /* [BC][D] */
	float *sq = sv + KC_BC * D;	   /* [BR][D + 1] */
	float *sdo = sq + KC_BR * (D + 1); /* [BR][D + 1] */
	float *sl = sdo + KC_BR * (D + 1); /* [BR] */
	float *sd = sl + KC_BR;		   /* [BR] */
	int seq = blockIdx.z, hk = blockIdx.y;
	int start = cu[seq], L = cu[seq + 1] - start;
	int k0 = blockIdx.x * KC_BC;
	if (k0 >= L)
		return;
	int group = hq / hkv;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int i = threadIdx.x; i < KC_BC * D; i += blockDim.x) {
		int r = i / D, d = i % D;
		bool ok = k0 + r < L;
		size_t off = ((size_t) (start + k0 + r) * hkv + hk) * D + d;
		sk[i] = ok ? kc_ld(k, off) : 0.0f;
		sv[i] = ok ? kc_ld(v, off) : 0.0f;
	}
	float adk[KC_RPW][E], adv[KC_RPW][E];
#pragma unroll
	for (int rr = 0; rr < KC_RPW; rr++)
#pragma unroll
		for (int c = 0; c < E; c++)
			adk[rr][c] = adv[rr][c] = 0.0f;

	for (int g = 0; g < group; g++) {
		int h = hk * group + g;
		for (int i0 = causal ? k0 : 0; i0 < L; i0 += KC_BR) {
			__syncthreads();
			for (int i = threadIdx.x; i < KC_BR * D; i += blockDim.x) {
				int r = i / D, d = i % D;
				bool ok = i0 + r < L;
				size_t off = ((size_t) (start + i0 + r) * hq + h) * D + d;
				sq[r * (D + 1) + d] = ok ? kc_ld(q, off) : 0.0f;
				sdo[r * (D + 1) + d] = ok ? kc_ld(dout, off) : 0.0f;
			}
			if (threadIdx.x < KC_BR) {
				int r = threadIdx.x;
				bool ok = i0 + r < L;
				size_t row = (size_t) (start + i0 + r) * hq + h;
				sl[r] = ok ? lse[row] : 0.0f;
				sd[r] = ok ? delta[row] : 0.0f;
			}
			__syncthreads();
			int qpos = i0 + lane;
			const float *qr = sq + lane * (D + 1), *dr = sdo + lane * (D + 1);
#pragma unroll
			for (int rr = 0; rr < KC_RPW; rr++) {
				int j = warp * KC_RPW + rr, kpos = k0 + j;
				const float *kr = sk + j * D, *vr = sv + j * D;
				float s = 0.0f, dp = 0.0f;
#pragma unroll 8
				for (int d = 0; d < D; d++) {
					s += qr[d] * kr[d];
					dp += dr[d] * vr[d];
				}
				bool valid = qpos < L && kpos < L && (!causal || kpos <= qpos);
				float p = valid ? expf(s * scale - sl[lane]) : 0.0f;
				float ds = p * (dp - sd[lane]);
				for (int i = 0; i < KC_BR; i++) {
					float pi = __shfl_sync(KC_FULL, p, i);
					float dsi = __shfl_sync(KC_FULL, ds, i);
					const float *qi = sq + i * (D + 1) + lane;
					const float *di = sdo + i * (D + 1) + lane;
#pragma unroll
					for (int c = 0; c < E; c++) {
						adv[rr][c] += pi * di[32 * c];
						adk[rr][c] += dsi * qi[32 * c];
					}
				}
			}
		}
	}
#pragma unroll
	for (int rr = 0; rr < KC_RPW; rr++) {
		int kpos = k0 + warp * KC_RPW + rr;
		if (kpos >= L)
			continue;
		size_t row = (size_t) (start + kpos) * hkv + hk;
#pragma unroll
		for (int c = 0; c < E; c++) {
			kc_st(dk, row * D + lane + 32 * c, adk[rr][c] * scale);
			kc_st(dv, row * D + lane + 32 * c, adv[rr][c]);
		}
	}
}

/* ---- launchers ----------------------------------------------------------- */

/* Dynamic shared memory in bytes of each backward kernel. */
static size_t kc_dq_smem(int d)
{
	return (size_t) (2 * KC_BR * d + 2 * KC_BC * (d + 1)) * sizeof(float);
}
static size_t kc_dkdv_smem(int d)
{
	return (size_t) (2 * KC_BC * d + 2 * KC_BR * (d + 1) + 2 * KC_BR) * sizeof(float);
}

/* The same grid and scale rules as attention.cu's forward. */
static int kc_attn_grid(const kk_attn_desc *d, int rows_per_block, int heads, dim3 *g)
{
	if (d->n_seqs > 65535 || heads > 65535 || d->max_seqlen <= 0)
		return d->max_seqlen <= 0 ? -EINVAL : -EOPNOTSUPP;
	*g = dim3((unsigned) ((d->max_seqlen + rows_per_block - 1) / rows_per_block),
		  (unsigned) heads, (unsigned) d->n_seqs);
	return 0;
}

static float kc_scale_of(float scale, int head_dim)
{
	return scale != 0.0f ? scale : 1.0f / sqrtf((float) head_dim);
}

template <typename T, int D>
static int kc_attn_bwd_t(cudaStream_t s, const kk_attn_desc *d, void *dq, void *dk, void *dv,
			 const void *dout, const void *q, const void *k, const void *v,
			 const void *o, const float *lse)
{
	size_t rows = (size_t) d->total_tokens * d->n_heads;
	float scale = kc_scale_of(d->scale, D);
	const int32_t *cu = (const int32_t *) d->cu_seqlens->ptr;
	float *delta = NULL;
	dim3 gq, gk;
	int r = kc_attn_grid(d, KC_BR, d->n_heads, &gq);
	if (r >= 0)
		r = kc_attn_grid(d, KC_BC, d->n_kv_heads, &gk);
	if (r >= 0)
		r = kc_errno_cuda(cudaFuncSetAttribute(kc_attn_dq_kernel<T, D>,
						       cudaFuncAttributeMaxDynamicSharedMemorySize,
						       (int) kc_dq_smem(D)));
	if (r >= 0)
		r = kc_errno_cuda(cudaFuncSetAttribute(kc_attn_dkdv_kernel<T, D>,
						       cudaFuncAttributeMaxDynamicSharedMemorySize,
						       (int) kc_dkdv_smem(D)));
	if (r < 0)
		return r;
	r = kc_errno_cuda(cudaMallocAsync((void **) &delta, rows * sizeof(float), s));
	if (r < 0)
		return r;
	kc_attn_delta_kernel<T, D><<<kc_grid(rows * 32, 256), 256, 0, s>>>(delta, (const T *) dout,
									   (const T *) o, rows);
	r = kc_check_launch();
	if (r >= 0) {
		kc_attn_dq_kernel<T, D><<<gq, KC_AW * 32, kc_dq_smem(D), s>>>(
			(const T *) q, (const T *) k, (const T *) v, (const T *) dout, lse, delta,
			(T *) dq, cu, d->n_heads, d->n_kv_heads, scale, d->causal);
		r = kc_check_launch();
	}
	if (r >= 0) {
		kc_attn_dkdv_kernel<T, D><<<gk, KC_AW * 32, kc_dkdv_smem(D), s>>>(
			(const T *) q, (const T *) k, (const T *) v, (const T *) dout, lse, delta,
			(T *) dk, (T *) dv, cu, d->n_heads, d->n_kv_heads, scale, d->causal);
		r = kc_check_launch();
	}
	int r2 = kc_errno_cuda(cudaFreeAsync(delta, s));
	return r < 0 ? r : r2;
}

template <typename T>
static int kc_attn_bwd_d(cudaStream_t s, const kk_attn_desc *d, void *dq, void *dk, void *dv,
			 const void *dout, const void *q, const void *k, const void *v,
			 const void *o, const float *lse)
{
	if (d->head_dim == 64)
		return kc_attn_bwd_t<T, 64>(s, d, dq, dk, dv, dout, q, k, v, o, lse);
	if (d->head_dim == 128)
		return kc_attn_bwd_t<T, 128>(s, d, dq, dk, dv, dout, q, k, v, o, lse);
	return -EOPNOTSUPP;
}

extern "C" int kc_op_attention_bwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d,
				   kk_buffer *dq, kk_buffer *dk, kk_buffer *dv,
				   const kk_buffer *dout, const kk_buffer *q, const kk_buffer *k,
				   const kk_buffer *v, const kk_buffer *out, const kk_buffer *lse)
{
	if (d->total_tokens == 0)
		return 0;
	if (!lse)
		return -EINVAL;
	return KC_DISPATCH(kc_dt(q->dtype), kc_attn_bwd_d, kc_stream(be, st), d, dq->ptr, dk->ptr,
			   dv->ptr, dout->ptr, q->ptr, k->ptr, v->ptr, out->ptr,
			   (const float *) lse->ptr);
}
