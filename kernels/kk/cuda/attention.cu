/* kernels/kk/cuda/attention.cu — fused attention on the CUDA backend: prefill
 * forward over packed variable-length sequences and decode
 * over a paged KV cache.  Scores are formed tile by tile with an online
 * softmax, so the T x T matrix never exists.
 *
 * Prefill forward, BF16/F16 (kc_attn_fwd_tc_kernel): FlashAttention-2 on the
 * tensor cores (mma.sync m16n8k16, f32 accumulators; kc_mma.cuh), 4 warps
 * per block, 16 or 32 query rows per warp, K/V tiles of 64 keys
 * double-buffered in swizzled shared memory by cp.async, online softmax on
 * the accumulator fragments in the log2 domain.  See the kernel's comment.
 *
 * Prefill forward, F32 (kc_attn_fwd_kernel): f32 FMA.  Grid (ceil(max_seqlen
 * / 32), n_heads, n_seqs), 128 threads.  A block owns 32 query rows of one
 * head of one sequence (8 rows per warp) and walks the key tiles (32 keys,
 * stopping at the diagonal when causal) through shared memory, widened to
 * f32; K rows are padded to D + 1 floats so that the lane-per-key dot
 * products hit 32 different banks.  Per row and tile: lane j scores key j, a
 * warp max/sum updates the running max m and sum l, and each lane
 * accumulates its D/32 output columns with the probabilities broadcast by
 * __shfl_sync.  Output o = acc / l and lse = m + log l (scaled scores).
 * GQA everywhere: head h reads kv head h / (n_heads / n_kv_heads).
 *
 * The backward (kk_attention_bwd) is in attention-bwd.cu.
 *
 * Decode, BF16/F16 (flash-decoding): each sequence's pages are split over
 * blocks in whole waves of the GPU (kc_plan.h), a block reading one kv
 * head's K/V once for the query heads of its GQA group: through mma.sync
 * (the group's heads as the rows of an m16 tile, kc_attn_decode_mma_kernel)
 * for groups of 4 or more, with 16-byte loads and FMA for groups of 1 and 2
 * (kc_attn_decode_split_kernel); kc_attn_combine_kernel merges the splits'
 * (m, l, acc) from a workspace cached in the backend (kc_ctx.attn_ws).
 *
 * Decode, F32, and paged prefill (kc_attn_decode_kernel): grid (query rows, n_heads), 4 warps;
 * warp w takes pages w, w + 4, ... of the sequence's block table; each lane
 * holds D/32 contiguous elements of q (pre-scaled); the 4 warps' (m, l, acc)
 * are merged through shared memory at the end.
 *
 * Head dims 64 and 128 (template parameter D), dtypes F32/BF16/F16.
 * Checked on the CPU emulation (tests/gpu/emu); UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_mma.cuh"
#include "kc_plan.h"
#include "kc_vec.cuh"

#define KC_BR	32 /* query rows per block (forward, dq) and per tile (dkdv) */
#define KC_BC	32 /* keys per tile (forward, dq) and per block (dkdv) */
#define KC_AW	4  /* warps per block */
#include "kc_attn.cuh" /* needs KC_AW */
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

/* ---- paged decode -------------------------------------------------------- */

template <typename T, int D>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_decode_kernel(const T *q, const T *kcache, const T *vcache, const int32_t *bt,
			      int maxb, const int32_t *lens, const int32_t *cu_q, int nseq, T *o,
			      int hq, int hkv, float scale)
{
	constexpr int E = D / 32;
	__shared__ float s_m[KC_AW], s_l[KC_AW], s_acc[KC_AW][D];
	int row = blockIdx.x, h = blockIdx.y, hk = h / (hq / hkv);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int seq = row, len;
	if (cu_q) {
		/* Paged prefill: the sequence whose rows hold this one (the last
		 * s with cu_q[s] <= row), and the context up to its position. */
		int lo = 0, hi = nseq - 1;
		while (lo < hi) {
			int mid = (lo + hi + 1) / 2;
			if (cu_q[mid] <= row)
				lo = mid;
			else
				hi = mid - 1;
		}
		seq = lo;
		len = lens[seq] - (cu_q[seq + 1] - row) + 1;
	} else {
		len = lens[seq];
	}
	float qv[E], acc[E];
	size_t qoff = ((size_t) row * hq + h) * D + lane * E;
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
			/* Slots past the context hold what earlier requests left
			 * (the cache is never cleared): p is 0 there but 0 x NaN
			 * is NaN, so V itself is masked. */
			bool valid = pg * KK_KV_BLOCK_SIZE + t < len;
			size_t off = ((blk * KK_KV_BLOCK_SIZE + t) * hkv + hk) * D + lane * E;
#pragma unroll
			for (int e = 0; e < E; e++)
				acc[e] += valid ? p * kc_ld(vcache, off + e) : 0.0f;
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
		kc_st(o, ((size_t) row * hq + h) * D + d, den > 0.0f ? num / den : 0.0f);
	}
}

/* ---- prefill forward on tensor cores (BF16/F16) ------------------------- */

#define KC_TC_BC 64 /* keys per K/V tile */
#define KC_LN2	 0.6931471805599453f

/* kc_sw and kc_stage: the swizzled tiles (kc_attn.cuh, included above). */

/* FlashAttention-2 forward.  Grid (ceil(max_seqlen / BR), n_heads, n_seqs),
 * 4 warps; the block owns BR = 64 MT query rows of one head of one sequence,
 * warp w rows [16 MT w, 16 MT (w + 1)) (MT row groups of 16).  With MT = 1
 * the warp's Q fragments stay in registers; with MT = 2 (head dim 128, as
 * FlashAttention-2 tiles it) they are re-read from shared memory each tile,
 * which leaves the registers to the accumulators, and every K/V fragment read
 * from shared memory feeds twice the mma work.  K/V tiles of 64 keys are
 * double-buffered in shared memory by cp.async (tile j + 1 loads while tile j
 * is used).  Per tile: S = Q K^T (mma, K through ldmatrix), masking only on
 * tiles that cross the causal diagonal or the sequence end, online softmax
 * on the S fragments in the log2 domain (the row max needs two quad
 * shuffles; the row sum stays per lane until the end), P rounded to the input
 * type in registers becomes the A operand of O += P V (V through
 * ldmatrix.trans).  Out = O / l, lse = (m + log2 l) ln 2 (scaled scores,
 * natural log).  Query tiles run heaviest first (causal). */
template <int D, bool BF, int MT>
__global__ void __launch_bounds__(KC_AW * 32, 2)
	kc_attn_fwd_tc_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *o,
			      float *lse, const int32_t *cu, int hq, int hkv, float sl2, int causal)
{
	constexpr int BR = 16 * MT * KC_AW; /* query rows per block */
	constexpr int KD = D / 16;	    /* k-steps over the head dim (S = Q K^T) */
	constexpr int NS = KC_TC_BC / 8;    /* n-tiles of S */
	constexpr int NO = D / 8;	    /* n-tiles of O */
	constexpr int TILE = KC_TC_BC * D;  /* elements of one K or V tile */
	extern __shared__ float smem[];
	uint16_t *sq = (uint16_t *) smem; /* [BR][D] swizzled */
	uint16_t *sk = sq + BR * D;	  /* 2 x [64][D] */
	uint16_t *sv = sk + 2 * TILE;	  /* 2 x [64][D] */
	int seq = blockIdx.z, h = blockIdx.y;
	int start = cu[seq], L = cu[seq + 1] - start;
	int q0 = (int) (gridDim.x - 1 - blockIdx.x) * BR;
	if (q0 >= L)
		return;
	int hk = h / (hq / hkv);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int mi = lane >> 3, mr = lane & 7; /* ldmatrix: matrix and row this lane addresses */
	size_t kvs = (size_t) hkv * D;
	const uint16_t *kb = k + ((size_t) start * hkv + hk) * D;
	const uint16_t *vb = v + ((size_t) start * hkv + hk) * D;

	kc_stage<D, BR>(sq, q + ((size_t) (start + q0) * hq + h) * D, (size_t) hq * D, L - q0);
	int kend = causal ? min(L, q0 + BR) : L;
	int ntiles = (kend + KC_TC_BC - 1) / KC_TC_BC;
	kc_stage<D, KC_TC_BC>(sk, kb, kvs, L);
	kc_stage<D, KC_TC_BC>(sv, vb, kvs, L);
	kc_cp_commit();

	uint32_t qf[MT == 1 ? KD : 1][4]; /* MT == 1: the warp's Q, kept */
	float acc[MT][NO][4], m[MT][2], l[MT][2];
#pragma unroll
	for (int t = 0; t < MT; t++) {
		m[t][0] = m[t][1] = -INFINITY;
		l[t][0] = l[t][1] = 0.0f;
#pragma unroll
		for (int n = 0; n < NO; n++)
			acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.0f;
	}
	int wrow = warp * 16 * MT;	    /* the warp's first row in the tile */
	int row0 = q0 + wrow + (lane >> 2); /* this lane's rows: row0 + 16 t + {0, 8} */

	for (int j = 0; j < ntiles; j++) {
		if (j + 1 < ntiles) {
			int k1 = (j + 1) * KC_TC_BC;
			kc_stage<D, KC_TC_BC>(sk + ((j + 1) & 1) * TILE, kb + k1 * kvs, kvs,
					      L - k1);
			kc_stage<D, KC_TC_BC>(sv + ((j + 1) & 1) * TILE, vb + k1 * kvs, kvs,
					      L - k1);
		}
		kc_cp_commit();
		kc_cp_wait<1>(); /* everything but the newest group: tile j (and Q) */
		__syncthreads();
		if (MT == 1 && j == 0) {
#pragma unroll
			for (int kk = 0; kk < KD; kk++)
				kc_ldsm_x4(qf[MT == 1 ? kk : 0],
					   sq + kc_sw<D>(wrow + (mi & 1) * 8 + mr,
							 2 * kk + (mi >> 1)) *
							   8);
		}
		const uint16_t *ck = sk + (j & 1) * TILE, *cv = sv + (j & 1) * TILE;

		float s[MT][NS][4];
#pragma unroll
		for (int t = 0; t < MT; t++)
#pragma unroll
			for (int n = 0; n < NS; n++)
				s[t][n][0] = s[t][n][1] = s[t][n][2] = s[t][n][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < KD; kk++) {
			uint32_t qa[MT][4];
#pragma unroll
			for (int t = 0; t < MT; t++) {
				if (MT == 1) {
#pragma unroll
					for (int i = 0; i < 4; i++)
						qa[t][i] = qf[MT == 1 ? kk : 0][i];
				} else {
					kc_ldsm_x4(qa[t],
						   sq + kc_sw<D>(wrow + 16 * t + (mi & 1) * 8 + mr,
								 2 * kk + (mi >> 1)) *
								   8);
				}
			}
#pragma unroll
			for (int n = 0; n < NS; n += 2) {
				uint32_t b[4];
				kc_ldsm_x4(b, ck + kc_sw<D>(n * 8 + (mi >> 1) * 8 + mr,
							    2 * kk + (mi & 1)) *
							      8);
#pragma unroll
				for (int t = 0; t < MT; t++) {
					kc_mma16816<BF>(s[t][n], qa[t], b);
					kc_mma16816<BF>(s[t][n + 1], qa[t], b + 2);
				}
			}
		}

		int k0 = j * KC_TC_BC;
		if (k0 + KC_TC_BC > L || (causal && k0 + KC_TC_BC - 1 > q0)) { /* block-uniform */
#pragma unroll
			for (int t = 0; t < MT; t++)
#pragma unroll
				for (int n = 0; n < NS; n++)
#pragma unroll
					for (int i = 0; i < 4; i++) {
						int kpos = k0 + n * 8 + (lane & 3) * 2 + (i & 1);
						int qpos = row0 + 16 * t + (i >> 1) * 8;
						if (kpos >= L || (causal && kpos > qpos))
							s[t][n][i] = -INFINITY;
					}
		}
		uint32_t pa[MT][KC_TC_BC / 16][4]; /* P as the A operand of P V */
#pragma unroll
		for (int t = 0; t < MT; t++) {
#pragma unroll
			for (int hr = 0; hr < 2; hr++) {
				float mx = m[t][hr];
#pragma unroll
				for (int n = 0; n < NS; n++)
					mx = fmaxf(mx, fmaxf(s[t][n][2 * hr], s[t][n][2 * hr + 1]) *
							       sl2);
				mx = fmaxf(mx, __shfl_xor_sync(KC_FULL, mx, 1));
				mx = fmaxf(mx, __shfl_xor_sync(KC_FULL, mx, 2));
				/* A row with nothing visible yet keeps m = -inf: use 0 as
				 * the base so that exp2 sees -inf, not NaN. */
				float base = mx == -INFINITY ? 0.0f : mx;
				float corr = exp2f(m[t][hr] - base);
				m[t][hr] = mx;
				l[t][hr] *= corr;
#pragma unroll
				for (int n = 0; n < NO; n++) {
					acc[t][n][2 * hr] *= corr;
					acc[t][n][2 * hr + 1] *= corr;
				}
#pragma unroll
				for (int n = 0; n < NS; n++)
#pragma unroll
					for (int e = 0; e < 2; e++) {
						float p = exp2f(
							fmaf(s[t][n][2 * hr + e], sl2, -base));
						s[t][n][2 * hr + e] = p;
						l[t][hr] += p;
					}
			}
			/* Packed right away, so the f32 scores of row group t die here. */
#pragma unroll
			for (int kk = 0; kk < KC_TC_BC / 16; kk++) {
				pa[t][kk][0] = kc_pack2<BF>(s[t][2 * kk][0], s[t][2 * kk][1]);
				pa[t][kk][1] = kc_pack2<BF>(s[t][2 * kk][2], s[t][2 * kk][3]);
				pa[t][kk][2] =
					kc_pack2<BF>(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
				pa[t][kk][3] =
					kc_pack2<BF>(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
			}
		}
#pragma unroll
		for (int kk = 0; kk < KC_TC_BC / 16; kk++) {
#pragma unroll
			for (int n = 0; n < NO; n += 2) {
				uint32_t b[4];
				kc_ldsm_x4_t(b, cv + kc_sw<D>(kk * 16 + (mi & 1) * 8 + mr,
							      n + (mi >> 1)) *
								8);
#pragma unroll
				for (int t = 0; t < MT; t++) {
					kc_mma16816<BF>(acc[t][n], pa[t][kk], b);
					kc_mma16816<BF>(acc[t][n + 1], pa[t][kk], b + 2);
				}
			}
		}
		__syncthreads(); /* buffer j & 1 is free for tile j + 2 */
	}

#pragma unroll
	for (int t = 0; t < MT; t++)
#pragma unroll
		for (int hr = 0; hr < 2; hr++) {
			float ls = l[t][hr];
			ls += __shfl_xor_sync(KC_FULL, ls, 1);
			ls += __shfl_xor_sync(KC_FULL, ls, 2);
			int qpos = row0 + 16 * t + hr * 8;
			if (qpos >= L)
				continue;
			size_t row = (size_t) (start + qpos) * hq + h;
			float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
			uint32_t *orow = (uint32_t *) (o + row * D) + (lane & 3);
#pragma unroll
			for (int n = 0; n < NO; n++)
				orow[n * 4] = kc_pack2<BF>(acc[t][n][2 * hr] * inv,
							   acc[t][n][2 * hr + 1] * inv);
			if (lse && (lane & 3) == 0)
				lse[row] = ls > 0.0f ? (m[t][hr] + log2f(ls)) * KC_LN2 : -INFINITY;
		}
}

/* The 16-bit element type of a kernel instantiated for bf16 (BF) or f16. */
template <bool BF> struct kc_t16 {
	typedef __nv_bfloat16 t;
};
template <> struct kc_t16<false> {
	typedef __half t;
};
template <bool BF> using T16 = typename kc_t16<BF>::t;

/* ---- paged decode, split over the context (flash-decoding) --------------- */

#define KC_DEC_CHUNK 8	/* tokens a warp scores per step (half a KV block) */
#define KC_DEC_MROWS 16 /* query heads per block of the mma kernel: one m16 tile */
/* GQA groups of at least this many query heads go through mma (the rows of
 * an m16 tile: 4 of 16 rows used is still far below the tensor cores'
 * ceiling, and it takes the per-head FMA work off the CUDA cores);
 * -DKC_DEC_MMA_MIN=1000 keeps every group on the CUDA-core kernel, to
 * compare the two on a GPU. */
#ifndef KC_DEC_MMA_MIN
#define KC_DEC_MMA_MIN 4
#endif
/* Query heads per block of the CUDA-core kernel: groups of 1 and 2; in a
 * build with KC_DEC_MMA_MIN raised, also 4 and 8 (the group rounded up,
 * larger groups in 8-head slices), as before the mma kernel existed. */
#if KC_DEC_MMA_MIN > 4
#define KC_DEC_GMAX 8
#else
#define KC_DEC_GMAX 2
#endif

/* 16 bytes, so that a plain load is one 128-bit access. */
struct alignas(16) kc_u4 {
	uint32_t w[4];
};

template <bool BF> static __device__ __forceinline__ void kc_unpack8(const kc_u4 &u, float f[8])
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t x = u.w[i];
		if (BF) {
			f[2 * i] = __uint_as_float(x << 16);
			f[2 * i + 1] = __uint_as_float(x & 0xffff0000u);
		} else {
			f[2 * i] = kc_f16_bits(x & 0xffffu);
			f[2 * i + 1] = kc_f16_bits(x >> 16);
		}
	}
}

/* Grid (n_splits, n_kv_heads * head slices, n_seqs), 4 warps.  The block
 * reads the K/V of one kv head once for the GM (1 or 2: the GQA group; larger
 * groups take kc_attn_decode_mma_kernel) query heads sharing it, over pages [split * pps, (split +
 * 1) * pps) of its sequence.  Warps take 8-token chunks in turn; lanes hold 8 contiguous elements
 * of a token (16-byte loads; D / 8 lanes per token, 32 / (D / 8) tokens per load), so a chunk is 4
 * loads of K and 4 of V per lane at either head dim, all issued before use.  Scores in the log2
 * domain (q pre-scaled in shared memory); each warp keeps (m, l, acc) per head; the 4 warps merge
 * through shared memory, then the block writes o directly (one split) or its partial (m, l, acc) to
 * the workspace for kc_attn_combine_kernel. */
template <int D, bool BF, int GM>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_decode_split_kernel(const uint16_t *q, const uint16_t *kcache,
				    const uint16_t *vcache, const int32_t *bt, int maxb,
				    const int32_t *lens, uint16_t *o, float *ws_acc, float *ws_ml,
				    int hq, int hkv, float sl2, int pps)
{
	constexpr int LPR = D / 8;	       /* lanes per token row */
	constexpr int TPL = 32 / LPR;	       /* tokens per load */
	constexpr int NL = KC_DEC_CHUNK / TPL; /* loads per chunk, per tensor */
	__shared__ float sq[GM][D];
	__shared__ float s_m[KC_AW][GM], s_l[KC_AW][GM];
	__shared__ float s_acc[KC_AW][GM][D];
	int split = blockIdx.x, seq = blockIdx.z, nsplit = gridDim.x;
	int group = hq / hkv, slices = (group + GM - 1) / GM;
	int hk = blockIdx.y / slices, h0 = hk * group + (blockIdx.y % slices) * GM;
	int G = min(GM, hk * group + group - h0);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int c8 = (lane % LPR) * 8, ts = lane / LPR; /* this lane's columns and token */
	int len = lens[seq];

	for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
		int g = i / D, d = i % D;
		sq[g][d] = kc_ld((const T16<BF> *) q, ((size_t) seq * hq + h0 + g) * D + d) * sl2;
	}
	__syncthreads();

	float m[GM], l[GM], acc[GM][8];
#pragma unroll
	for (int g = 0; g < GM; g++) {
		m[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int e = 0; e < 8; e++)
			acc[g][e] = 0.0f;
	}
	int c_beg = split * pps * (KK_KV_BLOCK_SIZE / KC_DEC_CHUNK);
	int c_end = min((split + 1) * pps * (KK_KV_BLOCK_SIZE / KC_DEC_CHUNK),
			(len + KC_DEC_CHUNK - 1) / KC_DEC_CHUNK);
	size_t tstride = (size_t) hkv * D; /* between tokens of a block */
	for (int c = c_beg + warp; c < c_end; c += KC_AW) {
		int t0 = c * KC_DEC_CHUNK; /* first token of the chunk */
		size_t blk = (size_t) bt[(size_t) seq * maxb + t0 / KK_KV_BLOCK_SIZE];
		size_t base =
			((blk * KK_KV_BLOCK_SIZE + t0 % KK_KV_BLOCK_SIZE) * hkv + hk) * D + c8;
		kc_u4 kr[NL], vr[NL];
#pragma unroll
		for (int i = 0; i < NL; i++) {
			size_t off = base + (size_t) (i * TPL + ts) * tstride;
			kr[i] = *(const kc_u4 *) (kcache + off);
			vr[i] = *(const kc_u4 *) (vcache + off);
			/* Past the context: stale cache contents, maybe NaN;
			 * p = 0 does not cancel NaN (0 x NaN = NaN), so zero V. */
			if (t0 + i * TPL + ts >= len)
				vr[i] = kc_u4{};
		}
		float s[NL][GM];
#pragma unroll
		for (int i = 0; i < NL; i++) {
			float kf[8];
			kc_unpack8<BF>(kr[i], kf);
			bool valid = t0 + i * TPL + ts < len;
#pragma unroll
			for (int g = 0; g < GM; g++) {
				if (g >= G)
					break;
				float part = 0.0f;
#pragma unroll
				for (int e = 0; e < 8; e++)
					part = fmaf(sq[g][c8 + e], kf[e], part);
#pragma unroll
				for (int x = 1; x < LPR; x <<= 1)
					part += __shfl_xor_sync(KC_FULL, part, x);
				s[i][g] = valid ? part : -INFINITY;
			}
		}
#pragma unroll
		for (int g = 0; g < GM; g++) {
			if (g >= G)
				break;
			float mx = s[0][g];
#pragma unroll
			for (int i = 1; i < NL; i++)
				mx = fmaxf(mx, s[i][g]);
#pragma unroll
			for (int x = LPR; x < 32; x <<= 1)
				mx = fmaxf(mx, __shfl_xor_sync(KC_FULL, mx, x));
			/* finite: the chunk's first token is < len */
			float mn = fmaxf(m[g], mx), corr = kc_exp2_fast(m[g] - mn);
			m[g] = mn;
			l[g] *= corr;
#pragma unroll
			for (int e = 0; e < 8; e++)
				acc[g][e] *= corr;
#pragma unroll
			for (int i = 0; i < NL; i++) {
				float p = kc_exp2_fast(s[i][g] - mn), vf[8];
				kc_unpack8<BF>(vr[i], vf);
				l[g] += p;
#pragma unroll
				for (int e = 0; e < 8; e++)
					acc[g][e] = fmaf(p, vf[e], acc[g][e]);
			}
		}
	}
	/* Sum over the tokens held by the other lanes of the same columns. */
#pragma unroll
	for (int g = 0; g < GM; g++) {
		if (g >= G)
			break;
#pragma unroll
		for (int x = LPR; x < 32; x <<= 1) {
			l[g] += __shfl_xor_sync(KC_FULL, l[g], x);
#pragma unroll
			for (int e = 0; e < 8; e++)
				acc[g][e] += __shfl_xor_sync(KC_FULL, acc[g][e], x);
		}
		if (lane == 0) {
			s_m[warp][g] = m[g];
			s_l[warp][g] = l[g];
		}
		if (ts == 0)
#pragma unroll
			for (int e = 0; e < 8; e++)
				s_acc[warp][g][c8 + e] = acc[g][e];
	}
	__syncthreads();
	for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
		int g = i / D, d = i % D;
		float M = -INFINITY;
		for (int w = 0; w < KC_AW; w++)
			M = fmaxf(M, s_m[w][g]);
		float num = 0.0f, den = 0.0f;
		for (int w = 0; w < KC_AW; w++) {
			float f = s_m[w][g] == -INFINITY ? 0.0f : kc_exp2_fast(s_m[w][g] - M);
			num += s_acc[w][g][d] * f;
			den += s_l[w][g] * f;
		}
		size_t hrow = (size_t) seq * hq + h0 + g;
		if (nsplit == 1) {
			kc_st((T16<BF> *) o, hrow * D + d, den > 0.0f ? num / den : 0.0f);
		} else {
			size_t prow = hrow * nsplit + split;
			ws_acc[prow * D + d] = num;
			if (d == 0) {
				ws_ml[2 * prow] = M;
				ws_ml[2 * prow + 1] = den;
			}
		}
	}
}

#define KC_COMB_SLICES 8 /* split slices of the combine kernel: D x 8 threads at most */

/* o[seq, h] = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M) over the
 * splits' partials.  Grid (n_heads, n_seqs), D x SL threads (SL =
 * blockDim.x / D split slices, 1..KC_COMB_SLICES).  The block forms M, the
 * weights 2^(m_s - M) (in shared memory) and the denominator with the
 * threads reading the splits in parallel; thread (slice j, column d) then
 * adds acc_s w_s over s = j, j + SL, ... (independent loads that overlap)
 * and the slices are summed through shared memory.  One thread walking all
 * of a few hundred splits alone would wait an L2 latency per split. */
template <int D, bool BF>
__global__ void __launch_bounds__((D * KC_COMB_SLICES))
	kc_attn_combine_kernel(const float *ws_acc, const float *ws_ml, uint16_t *o, int hq,
			       int nsplit)
{
	__shared__ float sw[KC_DEC_MAX_SPLITS], sred[33];
	__shared__ float snum[KC_COMB_SLICES][D];
	size_t hrow = (size_t) blockIdx.y * hq + blockIdx.x;
	const float *ml = ws_ml + 2 * hrow * nsplit;
	int sl = blockDim.x / D, j = threadIdx.x / D, d = threadIdx.x % D;
	float M = -INFINITY;
	for (int s = threadIdx.x; s < nsplit; s += blockDim.x)
		M = fmaxf(M, ml[2 * s]);
	M = kc_block_max(M, sred);
	float den = 0.0f;
	for (int s = threadIdx.x; s < nsplit; s += blockDim.x) {
		float f = ml[2 * s] == -INFINITY ? 0.0f : kc_exp2_fast(ml[2 * s] - M);
		sw[s] = f;
		den += ml[2 * s + 1] * f;
	}
	den = kc_block_sum(den, sred); /* its barriers publish sw too */
	const float *acc = ws_acc + hrow * nsplit * D + d;
	float num = 0.0f;
#pragma unroll 4
	for (int s = j; s < nsplit; s += sl)
		num = fmaf(acc[(size_t) s * D], sw[s], num);
	snum[j][d] = num;
	__syncthreads();
	if (j == 0) {
		for (int k = 1; k < sl; k++)
			num += snum[k][d];
		kc_st((T16<BF> *) o, hrow * D + d, den > 0.0f ? num / den : 0.0f);
	}
}

/* Stages one KV page of one kv head (16 token rows of D elements from
 * element `base`, global row stride `tstride`) into this warp's swizzled K
 * and V tiles with cp.async; rows >= valid (past the context: stale cache,
 * maybe NaN) are zero-filled and never read from global memory, so neither
 * S nor P V sees them. */
template <int D>
static __device__ __forceinline__ void kc_dec_stage(uint16_t *sk, uint16_t *sv, const uint16_t *kc,
						    const uint16_t *vc, size_t base, size_t tstride,
						    int valid, int lane)
{
	constexpr int CPR = D / 8, RSTEP = 32 / CPR; /* chunks per row, rows per wave */
	int r0 = lane / CPR, c = lane % CPR;
#pragma unroll
	for (int i = 0; i < KK_KV_BLOCK_SIZE / RSTEP; i++) {
		int r = r0 + i * RSTEP;
		bool ok = r < valid;
		size_t off = base + (size_t) r * tstride + c * 8;
		kc_cp_async16(sk + kc_sw<D>(r, c) * 8, ok ? kc + off : kc, ok);
		kc_cp_async16(sv + kc_sw<D>(r, c) * 8, ok ? vc + off : vc, ok);
	}
}

/* Decode for GQA groups of KC_DEC_MMA_MIN or more query heads on the tensor
 * cores.  Grid (n_splits, n_kv_heads * ceil(group / 16), n_seqs), 4 warps.
 * The block owns up to 16 query heads of one kv head's group (the rows of an
 * m16n8k16 tile, zero past the group) and pages [split * pps, (split + 1) *
 * pps) of its sequence; warp w takes pages w, w + 4, ... of them, each
 * double-buffered in its own shared tiles by cp.async (the next page loads
 * while this one is used; only __syncwarp between lanes, no block barrier in
 * the loop).  Per page of 16 keys: S = Q K^T is D / 8 mma (Q fragments in
 * registers for the whole kernel, K through ldmatrix), masking only on the
 * context's last page, the online softmax on the S fragments in the log2
 * domain (scores times scale * log2 e in f32, kc_exp2_fast), and P, rounded
 * to the input type in registers, is the A operand of O += P V: one k-step,
 * D / 8 mma (V through ldmatrix.trans).  The warps merge (m, l, acc) through
 * shared memory (the tiles' space), then the block writes o (one split) or
 * its partial rows for kc_attn_combine_kernel, as the CUDA-core kernel. */
template <int D, bool BF>
__global__ void __launch_bounds__(KC_AW * 32)
	kc_attn_decode_mma_kernel(const uint16_t *q, const uint16_t *kcache, const uint16_t *vcache,
				  const int32_t *bt, int maxb, const int32_t *lens, uint16_t *o,
				  float *ws_acc, float *ws_ml, int hq, int hkv, float sl2, int pps)
{
	constexpr int KD = D / 16;		   /* k-steps of S = Q K^T */
	constexpr int NO = D / 8;		   /* n-tiles of O */
	constexpr int PAGE = KK_KV_BLOCK_SIZE * D; /* elements of a staged K or V page */
	constexpr int R = KC_DEC_MROWS;		   /* query heads (rows) per block */
	static_assert(KK_KV_BLOCK_SIZE == 16, "a page is one k-step of P V and two n-tiles of S");
	extern __shared__ float smem[];
	__shared__ float s_m[KC_AW][R], s_l[KC_AW][R];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int g = lane >> 2, t = lane & 3;   /* fragment row and column pair */
	int mi = lane >> 3, mr = lane & 7; /* ldmatrix: matrix and row this lane addresses */
	uint16_t *sk = (uint16_t *) smem + warp * 4 * PAGE; /* 2 stages of K, then 2 of V */
	uint16_t *sv = sk + 2 * PAGE;
	int split = blockIdx.x, seq = blockIdx.z, nsplit = gridDim.x;
	int group = hq / hkv, slices = (group + R - 1) / R;
	int hk = blockIdx.y / slices, h0 = hk * group + (blockIdx.y % slices) * R;
	int G = min(R, hk * group + group - h0);
	int len = lens[seq];

	/* Q as the A operand: rows h0 + g and h0 + g + 8, zero past the group. */
	uint32_t qf[KD][4];
	const uint32_t *q32 = (const uint32_t *) (q + ((size_t) seq * hq + h0) * D);
#pragma unroll
	for (int kk = 0; kk < KD; kk++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int row = g + (i & 1) * 8, col = kk * 16 + (i >> 1) * 8 + 2 * t;
			qf[kk][i] = row < G ? q32[(row * D + col) / 2] : 0u;
		}

	float acc[NO][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
	for (int n = 0; n < NO; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
	int p_beg = split * pps,
	    p_end = min(p_beg + pps, (len + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE);
	int mine = warp < p_end - p_beg ? (p_end - p_beg - warp + KC_AW - 1) / KC_AW : 0;
	size_t tstride = (size_t) hkv * D; /* between tokens of a page */
	const int32_t *btr = bt + (size_t) seq * maxb;
	if (mine > 0) {
		int p = p_beg + warp;
		kc_dec_stage<D>(sk, sv, kcache, vcache,
				((size_t) btr[p] * KK_KV_BLOCK_SIZE * hkv + hk) * D, tstride,
				len - p * KK_KV_BLOCK_SIZE, lane);
	}
	kc_cp_commit();
	for (int i = 0; i < mine; i++) {
		int p = p_beg + warp + i * KC_AW;
		if (i + 1 < mine) {
			int pn = p + KC_AW;
			kc_dec_stage<D>(sk + ((i + 1) & 1) * PAGE, sv + ((i + 1) & 1) * PAGE,
					kcache, vcache,
					((size_t) btr[pn] * KK_KV_BLOCK_SIZE * hkv + hk) * D,
					tstride, len - pn * KK_KV_BLOCK_SIZE, lane);
		}
		kc_cp_commit();
		kc_cp_wait<1>(); /* everything but the newest group: page i */
		__syncwarp();	 /* the other lanes' copies too */
		const uint16_t *ck = sk + (i & 1) * PAGE, *cv = sv + (i & 1) * PAGE;

		float s[2][4] = { { 0.0f, 0.0f, 0.0f, 0.0f }, { 0.0f, 0.0f, 0.0f, 0.0f } };
#pragma unroll
		for (int kk = 0; kk < KD; kk++) {
			uint32_t b[4];
			kc_ldsm_x4(b, ck + kc_sw<D>((mi >> 1) * 8 + mr, 2 * kk + (mi & 1)) * 8);
			kc_mma16816<BF>(s[0], qf[kk], b);
			kc_mma16816<BF>(s[1], qf[kk], b + 2);
		}
		int t0 = p * KK_KV_BLOCK_SIZE;
		if (t0 + KK_KV_BLOCK_SIZE > len) /* the context's last page: warp-uniform */
#pragma unroll
			for (int n = 0; n < 2; n++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					if (t0 + n * 8 + 2 * t + (e & 1) >= len)
						s[n][e] = -INFINITY;
		uint32_t pa[4]; /* P as the A operand of P V (16 heads x 16 keys) */
#pragma unroll
		for (int hr = 0; hr < 2; hr++) {
			float mx = m[hr];
#pragma unroll
			for (int n = 0; n < 2; n++)
				mx = fmaxf(mx, fmaxf(s[n][2 * hr], s[n][2 * hr + 1]) * sl2);
			mx = fmaxf(mx, __shfl_xor_sync(KC_FULL, mx, 1));
			mx = fmaxf(mx, __shfl_xor_sync(KC_FULL, mx, 2));
			/* finite: the page's first token is in the context */
			float corr = kc_exp2_fast(m[hr] - mx);
			m[hr] = mx;
			l[hr] *= corr;
#pragma unroll
			for (int n = 0; n < NO; n++) {
				acc[n][2 * hr] *= corr;
				acc[n][2 * hr + 1] *= corr;
			}
#pragma unroll
			for (int n = 0; n < 2; n++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					float pe = kc_exp2_fast(fmaf(s[n][2 * hr + e], sl2, -mx));
					s[n][2 * hr + e] = pe;
					l[hr] += pe;
				}
		}
		pa[0] = kc_pack2<BF>(s[0][0], s[0][1]);
		pa[1] = kc_pack2<BF>(s[0][2], s[0][3]);
		pa[2] = kc_pack2<BF>(s[1][0], s[1][1]);
		pa[3] = kc_pack2<BF>(s[1][2], s[1][3]);
#pragma unroll
		for (int n = 0; n < NO; n += 2) {
			uint32_t b[4];
			kc_ldsm_x4_t(b, cv + kc_sw<D>((mi & 1) * 8 + mr, n + (mi >> 1)) * 8);
			kc_mma16816<BF>(acc[n], pa, b);
			kc_mma16816<BF>(acc[n + 1], pa, b + 2);
		}
		__syncwarp(); /* stage i & 1 is free for page i + 2 */
	}
	kc_cp_wait<0>();

	/* Merge the 4 warps.  The row sums are still per lane. */
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		l[hr] += __shfl_xor_sync(KC_FULL, l[hr], 1);
		l[hr] += __shfl_xor_sync(KC_FULL, l[hr], 2);
	}
	__syncthreads();     /* every warp is done with its tiles: reuse them */
	float *s_acc = smem; /* [KC_AW][R][D] */
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		int row = g + 8 * hr;
		if (t == 0) {
			s_m[warp][row] = m[hr];
			s_l[warp][row] = l[hr];
		}
#pragma unroll
		for (int n = 0; n < NO; n++) {
			float *dst = s_acc + (warp * R + row) * D + n * 8 + 2 * t;
			dst[0] = acc[n][2 * hr];
			dst[1] = acc[n][2 * hr + 1];
		}
	}
	__syncthreads();
	for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
		int r = i / D, d = i % D;
		float M = -INFINITY;
		for (int w = 0; w < KC_AW; w++)
			M = fmaxf(M, s_m[w][r]);
		float num = 0.0f, den = 0.0f;
		for (int w = 0; w < KC_AW; w++) {
			float f = s_m[w][r] == -INFINITY ? 0.0f : kc_exp2_fast(s_m[w][r] - M);
			num += s_acc[(w * R + r) * D + d] * f;
			den += s_l[w][r] * f;
		}
		size_t hrow = (size_t) seq * hq + h0 + r;
		if (nsplit == 1) {
			kc_st((T16<BF> *) o, hrow * D + d, den > 0.0f ? num / den : 0.0f);
		} else {
			size_t prow = hrow * nsplit + split;
			ws_acc[prow * D + d] = num;
			if (d == 0) {
				ws_ml[2 * prow] = M;
				ws_ml[2 * prow + 1] = den;
			}
		}
	}
}

/* ---- launchers ----------------------------------------------------------- */

/* Dynamic shared memory in bytes of each prefill kernel. */
static size_t kc_fwd_smem(int d)
{
	return (size_t) (KC_BR * d + KC_BC * (d + 1) + KC_BC * d) * sizeof(float);
}
/* kc_attn_grid, kc_scale_of: kc_attn.cuh. */

/* F32: the f32 FMA kernel. */
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

/* BF16/F16: the tensor-core kernel, 32 query rows per warp at head dim 128
 * and 16 at 64 (KC_TC_MT); Q tile + two K and two V tiles of shared memory
 * (96 KiB at D = 128: two blocks per SM). */
#ifndef KC_TC_MT128
#define KC_TC_MT128 2
#endif
template <int D, bool BF>
static int kc_attn_fwd_tc(cudaStream_t s, const kk_attn_desc *d, void *o, float *lse, const void *q,
			  const void *k, const void *v)
{
	constexpr int MT = D == 128 ? KC_TC_MT128 : 1, BR = 16 * MT * KC_AW;
	dim3 g;
	int r = kc_attn_grid(d, BR, d->n_heads, &g);
	if (r < 0)
		return r;
	size_t sm = (size_t) (BR + 4 * KC_TC_BC) * D * sizeof(uint16_t);
	r = kc_errno_cuda(cudaFuncSetAttribute(kc_attn_fwd_tc_kernel<D, BF, MT>,
					       cudaFuncAttributeMaxDynamicSharedMemorySize,
					       (int) sm));
	if (r < 0)
		return r;
	kc_attn_fwd_tc_kernel<D, BF, MT><<<g, KC_AW * 32, sm, s>>>(
		(const uint16_t *) q, (const uint16_t *) k, (const uint16_t *) v, (uint16_t *) o,
		lse, (const int32_t *) d->cu_seqlens->ptr, d->n_heads, d->n_kv_heads,
		kc_scale_of(d->scale, D) * KC_LOG2E, d->causal);
	return kc_check_launch();
}

/* 1 when every pointer allows the 16-byte accesses of the 16-bit kernels. */
static bool kc_aligned16(const void *a, const void *b, const void *c, const void *e)
{
	return (((uintptr_t) a | (uintptr_t) b | (uintptr_t) c | (uintptr_t) e) & 15) == 0;
}

template <typename T>
static int kc_attn_fwd_d(cudaStream_t s, const kk_attn_desc *d, void *o, float *lse, const void *q,
			 const void *k, const void *v)
{
	/* 16-bit types on the tensor cores, unless a pointer is misaligned for
	 * their 16-byte copies (a view into a buffer): then the f32 kernel. */
	bool tc = kc_dtype_of<T>() != KC_F32 && kc_aligned16(o, q, k, v);
	bool bf = kc_dtype_of<T>() == KC_BF16;
	if (d->head_dim == 64)
		return !tc  ? kc_attn_fwd_t<T, 64>(s, d, o, lse, q, k, v)
		       : bf ? kc_attn_fwd_tc<64, true>(s, d, o, lse, q, k, v)
			    : kc_attn_fwd_tc<64, false>(s, d, o, lse, q, k, v);
	if (d->head_dim == 128)
		return !tc  ? kc_attn_fwd_t<T, 128>(s, d, o, lse, q, k, v)
		       : bf ? kc_attn_fwd_tc<128, true>(s, d, o, lse, q, k, v)
			    : kc_attn_fwd_tc<128, false>(s, d, o, lse, q, k, v);
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

/* F32 decode, and paged prefill in every dtype: grid (query rows, n_heads),
 * one query row and head per block.  Paged prefill (cu_q set) reads a
 * sequence's K/V once per query row: right for short chunks after a long
 * context; a long prompt from position 0 belongs to kk_attention_fwd. */
template <typename T, int D>
static int kc_decode_t(cudaStream_t s, const kk_paged_desc *d, void *o, const void *q,
		       const void *kc, const void *vc)
{
	int64_t rows = d->cu_q ? d->total_q : d->n_seqs;
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	dim3 g((unsigned) rows, (unsigned) d->n_heads);
	kc_attn_decode_kernel<T, D><<<g, KC_AW * 32, 0, s>>>(
		(const T *) q, (const T *) kc, (const T *) vc,
		(const int32_t *) d->block_tables->ptr, d->max_blocks_per_seq,
		(const int32_t *) d->context_lens->ptr,
		d->cu_q ? (const int32_t *) d->cu_q->ptr : nullptr, d->n_seqs, (T *) o, d->n_heads,
		d->n_kv_heads, kc_scale_of(d->scale, D));
	return kc_check_launch();
}

/* Resident blocks per SM of a decode kernel at 128 threads and `smem` bytes
 * of dynamic shared memory, asked once per kernel (*cache; 0 = not yet: a
 * benign race, every writer stores the same value), 1 if the query fails. */
template <typename K> static int kc_dec_per_sm(K k, size_t smem, int *cache)
{
	if (*cache > 0)
		return *cache;
	int per = 0;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, KC_AW * 32, smem) !=
		    cudaSuccess ||
	    per <= 0) {
		(void) cudaGetLastError();
		return 1;
	}
	*cache = per;
	return per;
}

/* Workspace of the split decode.  On the backend's default stream: the
 * buffer cached in kc_ctx (grown on demand, freed by kc_attn_release at
 * backend destroy).  On a caller's stream, which may run beside the default
 * one: a stream-ordered allocation of its own (*owned, free it after use). */
static int kc_attn_ws(kk_backend *be, kk_stream *st, cudaStream_t s, size_t bytes, float **ret,
		      bool *owned)
{
	kc_ctx *ctx = (kc_ctx *) be->ctx;
	*owned = st != NULL;
	if (st)
		return kc_errno_cuda(cudaMallocAsync((void **) ret, bytes, s));
	if (ctx->attn_ws_bytes < bytes) {
		size_t want = bytes > 2 * ctx->attn_ws_bytes ? bytes : 2 * ctx->attn_ws_bytes;
		want = (want + ((size_t) 1 << 20) - 1) & ~(((size_t) 1 << 20) - 1);
		if (ctx->attn_ws) {
			/* launches queued before may still read it */
			int r = kc_errno_cuda(cudaStreamSynchronize(s));
			if (r < 0)
				return r;
			cudaFree(ctx->attn_ws);
			ctx->attn_ws = NULL;
			ctx->attn_ws_bytes = 0;
		}
		int r = kc_errno_cuda(cudaMalloc(&ctx->attn_ws, want));
		if (r < 0)
			return r;
		ctx->attn_ws_bytes = want;
	}
	*ret = (float *) ctx->attn_ws;
	return 0;
}

extern "C" void kc_attn_release(kc_ctx *ctx)
{
	if (ctx->attn_ws)
		cudaFree(ctx->attn_ws);
	ctx->attn_ws = NULL;
	ctx->attn_ws_bytes = 0;
}

/* BF16/F16: the split kernel (mma for GQA groups of KC_DEC_MMA_MIN heads or
 * more, else the CUDA-core one), then the combine kernel when split.  The
 * split count comes from kc_plan.h: whole waves of the resident blocks the
 * chosen kernel allows, planned for max_context_len (the host never reads
 * the context lengths). */
template <int D, bool BF>
static int kc_decode_tc(kk_backend *be, kk_stream *st, const kk_paged_desc *d, void *o,
			const void *q, const void *kc, const void *vc)
{
	/* Resident blocks per SM of the mma kernel, GM = 1, 2 (4, 8): asked of
	 * the first device that runs them (a kiln node has one GPU model). */
	static int per_sm[5];
	cudaStream_t s = kc_stream(be, st);
	int group = d->n_heads / d->n_kv_heads;
	bool mma = group >= KC_DEC_MMA_MIN;
	int gm = mma				  ? KC_DEC_MROWS
		 : group <= 1			  ? 1
		 : group <= 2 || KC_DEC_GMAX == 2 ? 2
		 : group <= 4			  ? 4
						  : 8;
	long gy = (long) d->n_kv_heads * ((group + gm - 1) / gm);
	if (d->n_seqs > 65535 || gy > 65535 || (!mma && gm > KC_DEC_GMAX))
		return -EOPNOTSUPP;
	size_t smem = mma ? (size_t) KC_AW * 4 * KK_KV_BLOCK_SIZE * D * sizeof(uint16_t) : 0;
	int per = 1;
	if (mma) {
		int r = kc_errno_cuda(cudaFuncSetAttribute(
			kc_attn_decode_mma_kernel<D, BF>,
			cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
		if (r < 0)
			return r;
		per = kc_dec_per_sm(kc_attn_decode_mma_kernel<D, BF>, smem, &per_sm[0]);
	} else if (gm == 1) {
		per = kc_dec_per_sm(kc_attn_decode_split_kernel<D, BF, 1>, 0, &per_sm[1]);
	} else if (gm == 2) {
		per = kc_dec_per_sm(kc_attn_decode_split_kernel<D, BF, 2>, 0, &per_sm[2]);
	}
#if KC_DEC_GMAX > 2
	else if (gm == 4) {
		per = kc_dec_per_sm(kc_attn_decode_split_kernel<D, BF, 4>, 0, &per_sm[3]);
	} else {
		per = kc_dec_per_sm(kc_attn_decode_split_kernel<D, BF, 8>, 0, &per_sm[4]);
	}
#endif
	long pages = (d->max_context_len + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE;
	kc_dec_plan plan =
		kc_dec_plan_make(pages, (long) d->n_seqs * gy, (long) kc_sm_count() * per);
	int nsplit = plan.splits, pps = plan.pps;
	float *ws = NULL;
	bool owned = false;
	size_t rows = (size_t) d->n_seqs * d->n_heads * nsplit;
	if (nsplit > 1) {
		int r = kc_attn_ws(be, st, s, rows * (D + 2) * sizeof(float), &ws, &owned);
		if (r < 0)
			return r;
	}
	float sl2 = kc_scale_of(d->scale, D) * KC_LOG2E;
	dim3 grid((unsigned) nsplit, (unsigned) gy, (unsigned) d->n_seqs);
	const uint16_t *qq = (const uint16_t *) q, *kk = (const uint16_t *) kc,
		       *vv = (const uint16_t *) vc;
	const int32_t *bt = (const int32_t *) d->block_tables->ptr,
		      *lens = (const int32_t *) d->context_lens->ptr;
	float *ml = ws ? ws + rows * D : NULL;
	int maxb = d->max_blocks_per_seq, hq = d->n_heads, hkv = d->n_kv_heads;
	if (mma)
		kc_attn_decode_mma_kernel<D, BF><<<grid, KC_AW * 32, smem, s>>>(
			qq, kk, vv, bt, maxb, lens, (uint16_t *) o, ws, ml, hq, hkv, sl2, pps);
	else if (gm == 1)
		kc_attn_decode_split_kernel<D, BF, 1><<<grid, KC_AW * 32, 0, s>>>(
			qq, kk, vv, bt, maxb, lens, (uint16_t *) o, ws, ml, hq, hkv, sl2, pps);
	else if (gm == 2)
		kc_attn_decode_split_kernel<D, BF, 2><<<grid, KC_AW * 32, 0, s>>>(
			qq, kk, vv, bt, maxb, lens, (uint16_t *) o, ws, ml, hq, hkv, sl2, pps);
#if KC_DEC_GMAX > 2
	else if (gm == 4)
		kc_attn_decode_split_kernel<D, BF, 4><<<grid, KC_AW * 32, 0, s>>>(
			qq, kk, vv, bt, maxb, lens, (uint16_t *) o, ws, ml, hq, hkv, sl2, pps);
	else
		kc_attn_decode_split_kernel<D, BF, 8><<<grid, KC_AW * 32, 0, s>>>(
			qq, kk, vv, bt, maxb, lens, (uint16_t *) o, ws, ml, hq, hkv, sl2, pps);
#endif
	int r = kc_check_launch();
	if (r >= 0 && nsplit > 1) {
		/* Split slices: 2 splits per thread at least, 8 slices at most. */
		int sl = (nsplit + 1) / 2 < KC_COMB_SLICES ? (nsplit + 1) / 2 : KC_COMB_SLICES;
		kc_attn_combine_kernel<D, BF>
			<<<dim3((unsigned) d->n_heads, (unsigned) d->n_seqs), D * sl, 0, s>>>(
				ws, ws + rows * D, (uint16_t *) o, d->n_heads, nsplit);
		r = kc_check_launch();
	}
	if (owned) {
		int r2 = kc_errno_cuda(cudaFreeAsync(ws, s));
		r = r < 0 ? r : r2;
	}
	return r;
}

template <typename T>
static int kc_decode_d(kk_backend *be, kk_stream *st, const kk_paged_desc *d, void *o,
		       const void *q, const void *kc, const void *vc)
{
	cudaStream_t s = kc_stream(be, st);
	bool tc = kc_dtype_of<T>() != KC_F32 && kc_aligned16(o, q, kc, vc);
	bool bf = kc_dtype_of<T>() == KC_BF16;
	if (d->head_dim == 64)
		return !tc  ? kc_decode_t<T, 64>(s, d, o, q, kc, vc)
		       : bf ? kc_decode_tc<64, true>(be, st, d, o, q, kc, vc)
			    : kc_decode_tc<64, false>(be, st, d, o, q, kc, vc);
	if (d->head_dim == 128)
		return !tc  ? kc_decode_t<T, 128>(s, d, o, q, kc, vc)
		       : bf ? kc_decode_tc<128, true>(be, st, d, o, q, kc, vc)
			    : kc_decode_tc<128, false>(be, st, d, o, q, kc, vc);
	return -EOPNOTSUPP;
}

template <typename T>
static int kc_paged_d(kk_backend *be, kk_stream *st, const kk_paged_desc *d, void *o, const void *q,
		      const void *kc, const void *vc)
{
	cudaStream_t s = kc_stream(be, st);
	if (d->head_dim == 64)
		return kc_decode_t<T, 64>(s, d, o, q, kc, vc);
	if (d->head_dim == 128)
		return kc_decode_t<T, 128>(s, d, o, q, kc, vc);
	return -EOPNOTSUPP;
}

extern "C" int kc_op_attention_paged(kk_backend *be, kk_stream *st, const kk_paged_desc *d,
				     kk_buffer *out, const kk_buffer *q, const kk_buffer *k_cache,
				     const kk_buffer *v_cache)
{
	/* kk_attention_paged returns before here when total_q is 0. */
	return KC_DISPATCH(kc_dt(q->dtype), kc_paged_d, be, st, d, out->ptr, q->ptr, k_cache->ptr,
			   v_cache->ptr);
}

extern "C" int kc_op_attention_decode(kk_backend *be, kk_stream *st, const kk_paged_desc *d,
				      kk_buffer *out, const kk_buffer *q, const kk_buffer *k_cache,
				      const kk_buffer *v_cache)
{
	if (d->n_seqs == 0)
		return 0;
	return KC_DISPATCH(kc_dt(q->dtype), kc_decode_d, be, st, d, out->ptr, q->ptr, k_cache->ptr,
			   v_cache->ptr);
}

/* ---- paged KV-cache write ----------------------------------------------- */

template <typename T>
__global__ void kc_kv_write_kernel(T *kc, T *vc, const T *k, const T *v, const int32_t *slots,
				   int64_t n_tokens, int64_t row, int64_t n_slots)
{
	size_t n = (size_t) n_tokens * row;
	GRID_STRIDE(i, n)
	{
		size_t t = i / row, j = i % row;
		int32_t sl = slots[t];
		if (sl < 0 || sl >= n_slots)
			continue; /* padding, or out of range (skipped, see kk.h) */
		kc[(size_t) sl * row + j] = k[i];
		vc[(size_t) sl * row + j] = v[i];
	}
}

template <typename T>
static int kc_kv_write_t(cudaStream_t s, void *kc, void *vc, const void *k, const void *v,
			 const int32_t *slots, int64_t n_tokens, int64_t row, int64_t n_slots)
{
	size_t n = (size_t) n_tokens * row;
	if (n == 0)
		return 0;
	kc_kv_write_kernel<T><<<kc_grid(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		(T *) kc, (T *) vc, (const T *) k, (const T *) v, slots, n_tokens, row, n_slots);
	return kc_check_launch();
}

extern "C" int kc_op_kv_cache_write(kk_backend *be, kk_stream *st, kk_buffer *k_cache,
				    kk_buffer *v_cache, const kk_buffer *k, const kk_buffer *v,
				    const kk_buffer *slot_mapping, int64_t n_tokens, int n_kv_heads,
				    int head_dim, int num_blocks)
{
	return KC_DISPATCH(kc_dt(k->dtype), kc_kv_write_t, kc_stream(be, st), k_cache->ptr,
			   v_cache->ptr, k->ptr, v->ptr, (const int32_t *) slot_mapping->ptr,
			   n_tokens, (int64_t) n_kv_heads * head_dim,
			   (int64_t) num_blocks * KK_KV_BLOCK_SIZE);
}
