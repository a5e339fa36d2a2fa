/* kernels/cuda/kc_attn.cu — fused attention on the CUDA backend: prefill
 * forward over packed variable-length sequences, its backward, and decode
 * over a paged KV cache.
 *
 * All three are straightforward FlashAttention-style kernels in f32 FMA
 * arithmetic (no tensor cores yet): scores are formed tile by tile in
 * registers with an online softmax, so the T x T matrix never exists.
 *
 * Prefill forward (kc_attn_fwd_kernel): grid (ceil(max_seqlen / 32), n_heads,
 * n_seqs), 128 threads.  A block owns 32 query rows of one head of one
 * sequence (8 rows per warp) and walks the key tiles (32 keys, stopping at
 * the diagonal when causal) through shared memory, widened to f32; K rows are
 * padded to D + 1 floats so that the lane-per-key dot products hit 32
 * different banks.  Per row and tile: lane j scores key j, a warp max/sum
 * updates the running max m and sum l, and each lane accumulates its D/32
 * output columns with the probabilities broadcast by __shfl_sync.  Output
 * o = acc / l and lse = m + log l (scaled scores).  GQA: head h reads kv head
 * h / (n_heads / n_kv_heads).
 *
 * Backward (FlashAttention-2 style, no atomics): a pre-pass computes
 * delta_i = dO_i . O_i (one warp per row and head); kc_attn_dq_kernel
 * re-forms P from lse per query tile and accumulates dq; kc_attn_dkdv_kernel
 * owns 32 keys of one kv head and loops over every query head of its group
 * and every query tile at or after the keys, accumulating dk and dv in
 * registers, so each output element is written once.
 *
 * Decode (kc_attn_decode_kernel): grid (n_heads, n_seqs), 4 warps; warp w
 * takes pages w, w + 4, ... of the sequence's block table; each lane holds
 * D/32 contiguous elements of q (pre-scaled), so a page's 16 keys cost 16
 * coalesced row loads and 16 warp sums; the 4 warps' (m, l, acc) are merged
 * through shared memory at the end.
 *
 * Head dims 64 and 128 (template parameter D), dtypes F32/BF16/F16.
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"

#define KC_BR	32 /* query rows per block (forward, dq) and per tile (dkdv) */
#define KC_BC	32 /* keys per tile (forward, dq) and per block (dkdv) */
#define KC_AW	4  /* warps per block */
#define KC_RPW	(KC_BR / KC_AW)
#define KC_FULL 0xffffffffu

/* ---- prefill forward ---------------------------------------------------- */

template <typename T, int D>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_fwd_kernel(const T *q, const T *k, const T *v, T *o, float *lse, const int32_t *cu,
			   int hq, int hkv, float scale, int causal)
{
	constexpr int E = D / 32;
	extern __shared__ float smem[];
	float *sq = smem;		  /* [BR][D] */
	float *sk = sq + KC_BR * D;	  /* [BC][D + 1] */
	float *sv = sk + KC_BC * (D + 1); /* [BC][D] */
	int seq = blockIdx.z, h = blockIdx.y;
	int start = cu[seq], L = cu[seq + 1] - start;
	int q0 = blockIdx.x * KC_BR;
	if (q0 >= L)
		return;
	int hk = h / (hq / hkv);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	for (int i = threadIdx.x; i < KC_BR * D; i += blockDim.x) {
		int r = i / D, d = i % D;
		sq[i] = q0 + r < L ? kc_ld(q, ((size_t) (start + q0 + r) * hq + h) * D + d) : 0.0f;
	}
	float m[KC_RPW], l[KC_RPW], acc[KC_RPW][E];
#pragma unroll
	for (int rr = 0; rr < KC_RPW; rr++) {
		m[rr] = -INFINITY;
		l[rr] = 0.0f;
#pragma unroll
		for (int c = 0; c < E; c++)
			acc[rr][c] = 0.0f;
	}
	int kend = causal ? min(L, q0 + KC_BR) : L;
	for (int k0 = 0; k0 < kend; k0 += KC_BC) {
		__syncthreads(); /* the previous tile is consumed (and Q is loaded) */
		for (int i = threadIdx.x; i < KC_BC * D; i += blockDim.x) {
			int r = i / D, d = i % D;
			bool ok = k0 + r < L;
			size_t off = ((size_t) (start + k0 + r) * hkv + hk) * D + d;
			sk[r * (D + 1) + d] = ok ? kc_ld(k, off) : 0.0f;
			sv[r * D + d] = ok ? kc_ld(v, off) : 0.0f;
		}
		__syncthreads();
		int kpos = k0 + lane;
#pragma unroll
		for (int rr = 0; rr < KC_RPW; rr++) {
			int r = warp * KC_RPW + rr, qpos = q0 + r;
			const float *qr = sq + r * D, *kr = sk + lane * (D + 1);
			float s = 0.0f;
#pragma unroll 8
			for (int d = 0; d < D; d++)
				s += qr[d] * kr[d];
			bool valid = kpos < L && (!causal || kpos <= qpos);
			s = valid ? s * scale : -INFINITY;
			float mn = fmaxf(m[rr], kc_warp_max(s));
			if (mn == -INFINITY)
				continue; /* warp-uniform: nothing visible yet */
			float p = expf(s - mn);
			float corr = expf(m[rr] - mn);
			l[rr] = l[rr] * corr + kc_warp_sum(p);
			m[rr] = mn;
#pragma unroll
			for (int c = 0; c < E; c++)
				acc[rr][c] *= corr;
			for (int j = 0; j < KC_BC; j++) {
				float pj = __shfl_sync(KC_FULL, p, j);
				const float *vr = sv + j * D + lane;
#pragma unroll
				for (int c = 0; c < E; c++)
					acc[rr][c] += pj * vr[32 * c];
			}
		}
	}
#pragma unroll
	for (int rr = 0; rr < KC_RPW; rr++) {
		int qpos = q0 + warp * KC_RPW + rr;
		if (qpos >= L)
			continue;
		size_t row = (size_t) (start + qpos) * hq + h;
		float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
		for (int c = 0; c < E; c++)
			kc_st(o, row * D + lane + 32 * c, acc[rr][c] * inv);
		if (lse && lane == 0)
			lse[row] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
	}
}

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

/* ---- paged decode -------------------------------------------------------- */

template <typename T, int D>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_decode_kernel(const T *q, const T *kcache, const T *vcache, const int32_t *bt,
			      int maxb, const int32_t *lens, T *o, int hq, int hkv, float scale)
{
	constexpr int E = D / 32;
	__shared__ float s_m[KC_AW], s_l[KC_AW], s_acc[KC_AW][D];
	int h = blockIdx.x, seq = blockIdx.y, hk = h / (hq / hkv);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int len = lens[seq];
	float qv[E], acc[E];
	size_t qoff = ((size_t) seq * hq + h) * D + lane * E;
#pragma unroll
	for (int e = 0; e < E; e++) {
		qv[e] = kc_ld(q, qoff + e) * scale;
		acc[e] = 0.0f;
	}
	float m = -INFINITY, l = 0.0f;
	int npages = (len + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE;
	for (int pg = warp; pg < npages; pg += KC_AW) {
		size_t blk = (size_t) bt[(size_t) seq * maxb + pg];
		float s[KK_KV_BLOCK_SIZE];
#pragma unroll
		for (int t = 0; t < KK_KV_BLOCK_SIZE; t++) {
			size_t off = ((blk * KK_KV_BLOCK_SIZE + t) * hkv + hk) * D + lane * E;
			float part = 0.0f;
#pragma unroll
			for (int e = 0; e < E; e++)
				part += qv[e] * kc_ld(kcache, off + e);
			s[t] = part;
		}
		float mt = -INFINITY;
#pragma unroll
		for (int t = 0; t < KK_KV_BLOCK_SIZE; t++) {
			s[t] = kc_warp_sum(s[t]);
			if (pg * KK_KV_BLOCK_SIZE + t >= len)
				s[t] = -INFINITY;
			mt = fmaxf(mt, s[t]);
		}
		float mn = fmaxf(m, mt); /* finite: slot 0 of the page is in range */
		float corr = expf(m - mn);
		l *= corr;
#pragma unroll
		for (int e = 0; e < E; e++)
			acc[e] *= corr;
#pragma unroll
		for (int t = 0; t < KK_KV_BLOCK_SIZE; t++) {
			float p = expf(s[t] - mn);
			l += p;
			size_t off = ((blk * KK_KV_BLOCK_SIZE + t) * hkv + hk) * D + lane * E;
#pragma unroll
			for (int e = 0; e < E; e++)
				acc[e] += p * kc_ld(vcache, off + e);
		}
		m = mn;
	}
	if (lane == 0) {
		s_m[warp] = m;
		s_l[warp] = l;
	}
#pragma unroll
	for (int e = 0; e < E; e++)
		s_acc[warp][lane * E + e] = acc[e];
	__syncthreads();
	float M = -INFINITY;
	for (int w = 0; w < KC_AW; w++)
		M = fmaxf(M, s_m[w]);
	for (int d = threadIdx.x; d < D; d += blockDim.x) {
		float num = 0.0f, den = 0.0f;
		for (int w = 0; w < KC_AW; w++) {
			float f = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - M);
			num += s_acc[w][d] * f;
			den += s_l[w] * f;
		}
		kc_st(o, ((size_t) seq * hq + h) * D + d, den > 0.0f ? num / den : 0.0f);
	}
}

/* ---- launchers ----------------------------------------------------------- */

/* Dynamic shared memory in bytes of each prefill kernel. */
static size_t kc_fwd_smem(int d)
{
	return (size_t) (KC_BR * d + KC_BC * (d + 1) + KC_BC * d) * sizeof(float);
}
static size_t kc_dq_smem(int d)
{
	return (size_t) (2 * KC_BR * d + 2 * KC_BC * (d + 1)) * sizeof(float);
}
static size_t kc_dkdv_smem(int d)
{
	return (size_t) (2 * KC_BC * d + 2 * KC_BR * (d + 1) + 2 * KC_BR) * sizeof(float);
}

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
static int kc_attn_fwd_t(cudaStream_t s, const kk_attn_desc *d, void *o, float *lse, const void *q,
			 const void *k, const void *v)
{
	dim3 g;
	int r = kc_attn_grid(d, KC_BR, d->n_heads, &g);
	if (r < 0)
		return r;
	size_t sm = kc_fwd_smem(D);
	r = kc_errno_cuda(cudaFuncSetAttribute(
		kc_attn_fwd_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) sm));
	if (r < 0)
		return r;
	kc_attn_fwd_kernel<T, D>
		<<<g, KC_AW * 32, sm, s>>>((const T *) q, (const T *) k, (const T *) v, (T *) o,
					   lse, (const int32_t *) d->cu_seqlens->ptr, d->n_heads,
					   d->n_kv_heads, kc_scale_of(d->scale, D), d->causal);
	return kc_check_launch();
}

template <typename T>
static int kc_attn_fwd_d(cudaStream_t s, const kk_attn_desc *d, void *o, float *lse, const void *q,
			 const void *k, const void *v)
{
	if (d->head_dim == 64)
		return kc_attn_fwd_t<T, 64>(s, d, o, lse, q, k, v);
	if (d->head_dim == 128)
		return kc_attn_fwd_t<T, 128>(s, d, o, lse, q, k, v);
	return -EOPNOTSUPP;
}

extern "C" int kc_op_attention_fwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d,
				   kk_buffer *out, kk_buffer *lse, const kk_buffer *q,
				   const kk_buffer *k, const kk_buffer *v)
{
	if (d->total_tokens == 0)
		return 0;
	return KC_DISPATCH(kc_dt(q->dtype), kc_attn_fwd_d, kc_stream(be, st), d, out->ptr,
			   lse ? (float *) lse->ptr : NULL, q->ptr, k->ptr, v->ptr);
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

template <typename T, int D>
static int kc_decode_t(cudaStream_t s, const kk_paged_desc *d, void *o, const void *q,
		       const void *kc, const void *vc)
{
	if (d->n_seqs > 65535)
		return -EOPNOTSUPP;
	dim3 g((unsigned) d->n_heads, (unsigned) d->n_seqs);
	kc_attn_decode_kernel<T, D><<<g, KC_AW * 32, 0, s>>>(
		(const T *) q, (const T *) kc, (const T *) vc,
		(const int32_t *) d->block_tables->ptr, d->max_blocks_per_seq,
		(const int32_t *) d->context_lens->ptr, (T *) o, d->n_heads, d->n_kv_heads,
		kc_scale_of(d->scale, D));
	return kc_check_launch();
}

template <typename T>
static int kc_decode_d(cudaStream_t s, const kk_paged_desc *d, void *o, const void *q,
		       const void *kc, const void *vc)
{
	if (d->head_dim == 64)
		return kc_decode_t<T, 64>(s, d, o, q, kc, vc);
	if (d->head_dim == 128)
		return kc_decode_t<T, 128>(s, d, o, q, kc, vc);
	return -EOPNOTSUPP;
}

extern "C" int kc_op_attention_decode(kk_backend *be, kk_stream *st, const kk_paged_desc *d,
				      kk_buffer *out, const kk_buffer *q, const kk_buffer *k_cache,
				      const kk_buffer *v_cache)
{
	if (d->n_seqs == 0)
		return 0;
	return KC_DISPATCH(kc_dt(q->dtype), kc_decode_d, kc_stream(be, st), d, out->ptr, q->ptr,
			   k_cache->ptr, v_cache->ptr);
}
