/* kernels/kk/cuda/attention-bwd.cu — the backward of the fused prefill
 * attention (kk_attention_bwd) on the CUDA backend, over packed
 * variable-length sequences; the forward and decode are in attention.cu.
 *
 * FlashAttention-2's structure without atomics, so the result is
 * deterministic: a pre-pass computes delta_i = dO_i . O_i (one warp per row
 * and head); a dq kernel owns a query tile and re-forms P from lse tile by
 * tile; a dk/dv kernel owns a key tile of one kv head and loops over every
 * query head of its GQA group and every query tile at or after the keys,
 * accumulating dk and dv in registers, so each output element is written
 * once (the GQA sum needs no atomics).
 *
 * BF16/F16 (kc_attn_dq_tc_kernel, kc_attn_dkdv_tc_kernel): tensor cores
 * through mma.sync m16n8k16 with f32 accumulation (kc_mma.cuh), 4 warps of
 * 16 rows, 64 x 64 tiles in swizzled shared memory double-buffered by
 * cp.async, P and dS rounded to the input type as mma operands, exp2 on the
 * SFU.  See the kernels' comments and docs/kernels-cuda.md.
 *
 * F32, and 16-bit views not 16-byte aligned (kc_attn_dq_kernel,
 * kc_attn_dkdv_kernel): f32 FMA, 32 x 32 tiles widened to f32 in shared
 * memory.
 *
 * Head dims 64 and 128 (template parameter D).
 * Checked on the CPU emulation (tests/gpu/emu); UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_mma.cuh"
#include "kc_vec.cuh"

#define KC_BR 32       /* query rows per block (dq) and per tile (dkdv) */
#define KC_BC 32       /* keys per tile (dq) and per block (dkdv) */
#define KC_AW 4	       /* warps per block */
#include "kc_attn.cuh" /* needs KC_AW */
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
	kc_zero2<KC_RPW, E>(adk, adv);

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

/* ---- backward on tensor cores (BF16/F16) --------------------------------- */

#define KC_TB 64 /* query rows per tile and keys per tile (both kernels) */

/* kc_sw and kc_stage: the swizzled tiles (kc_attn.cuh, included above). */

/* The A operand (16 x 16 per k-step) of a 16-row product from the C
 * fragments of 16 x 64 scores: C fragments of n-tiles 2kk and 2kk + 1 are
 * exactly A's registers for k-step kk, rounded to 16 bits. */
template <bool BF>
static __device__ __forceinline__ void kc_c2a(uint32_t a[KC_TB / 16][4],
					      const float c[KC_TB / 8][4])
{
#pragma unroll
	for (int kk = 0; kk < KC_TB / 16; kk++) {
		a[kk][0] = kc_pack2<BF>(c[2 * kk][0], c[2 * kk][1]);
		a[kk][1] = kc_pack2<BF>(c[2 * kk][2], c[2 * kk][3]);
		a[kk][2] = kc_pack2<BF>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
		a[kk][3] = kc_pack2<BF>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
	}
}

/* acc[16 x D] += A[16 x 64] B[64 x D], B a swizzled [64][D] tile read
 * through ldmatrix.trans (row = the k index: keys or queries). */
template <int D, bool BF>
static __device__ __forceinline__ void kc_mma_av(float acc[D / 8][4],
						 const uint32_t a[KC_TB / 16][4],
						 const uint16_t *tile, int mi, int mr)
{
#pragma unroll
	for (int kk = 0; kk < KC_TB / 16; kk++)
#pragma unroll
		for (int n = 0; n < D / 8; n += 2) {
			uint32_t b[4];
			kc_ldsm_x4_t(
				b, tile + kc_sw<D>(kk * 16 + (mi & 1) * 8 + mr, n + (mi >> 1)) * 8);
			kc_mma16816<BF>(acc[n], a[kk], b);
			kc_mma16816<BF>(acc[n + 1], a[kk], b + 2);
		}
}

/* KC_KEEP_A(D): the warp's A fragments of S and dP (its 16 rows of Q and dO
 * in the dq kernel, of K and V in the dk/dv kernel) stay in registers for
 * the whole block instead of being re-read by ldmatrix every tile: 32
 * registers at D = 64, saving 8 of the 56 (dq) and 72 (dk/dv) ldmatrix per
 * tile; at D = 128 the 64 registers they need are not there (the
 * accumulators take them). */
#define KC_KEEP_A(D) ((D) == 64)

/* The warp's A fragments (rows [wrow, wrow + 16) of swizzled [*][D] tiles
 * a1 and a2) for every k-step over the head dim. */
template <int D>
static __device__ __forceinline__ void kc_load_a2(uint32_t af[D / 16][2][4], const uint16_t *a1,
						  const uint16_t *a2, int wrow, int mi, int mr)
{
#pragma unroll
	for (int kk = 0; kk < D / 16; kk++) {
		int ao = kc_sw<D>(wrow + (mi & 1) * 8 + mr, 2 * kk + (mi >> 1)) * 8;
		kc_ldsm_x4(af[kk][0], a1 + ao);
		kc_ldsm_x4(af[kk][1], a2 + ao);
	}
}

/* s[16 x 64] = A1 B1^T and dp[16 x 64] = A2 B2^T over the head dim: A1/A2
 * rows [wrow, wrow + 16) of swizzled [*][D] tiles (ldmatrix; from af when
 * KEEP, as kc_load_a2 left them), B1/B2 the 64 rows of [64][D] tiles
 * (ldmatrix, [n][k] as the mma's column-major B). */
template <int D, bool BF, bool KEEP>
static __device__ __forceinline__ void
kc_mma_2qk(float s[KC_TB / 8][4], float dp[KC_TB / 8][4],
	   const uint32_t af[KEEP ? D / 16 : 1][2][4], const uint16_t *a1, const uint16_t *a2,
	   const uint16_t *b1, const uint16_t *b2, int wrow, int mi, int mr)
{
	kc_zero2<KC_TB / 8, 4>(s, dp);
#pragma unroll
	for (int kk = 0; kk < D / 16; kk++) {
		uint32_t x[4], y[4];
		if (KEEP) {
#pragma unroll
			for (int i = 0; i < 4; i++) {
				x[i] = af[KEEP ? kk : 0][0][i];
				y[i] = af[KEEP ? kk : 0][1][i];
			}
		} else {
			int ao = kc_sw<D>(wrow + (mi & 1) * 8 + mr, 2 * kk + (mi >> 1)) * 8;
			kc_ldsm_x4(x, a1 + ao);
			kc_ldsm_x4(y, a2 + ao);
		}
#pragma unroll
		for (int n = 0; n < KC_TB / 8; n += 2) {
			int bo = kc_sw<D>(n * 8 + (mi >> 1) * 8 + mr, 2 * kk + (mi & 1)) * 8;
			uint32_t b[4];
			kc_ldsm_x4(b, b1 + bo);
			kc_mma16816<BF>(s[n], x, b);
			kc_mma16816<BF>(s[n + 1], x, b + 2);
			kc_ldsm_x4(b, b2 + bo);
			kc_mma16816<BF>(dp[n], y, b);
			kc_mma16816<BF>(dp[n + 1], y, b + 2);
		}
	}
}

/* dQ, one query tile per block: grid (ceil(max_seqlen / 64), n_heads,
 * n_seqs), 4 warps, warp w rows [16 w, 16 w + 16) of the tile.  Q and dO
 * are staged once; K/V tiles of 64 keys are double-buffered by cp.async
 * (up to the diagonal when causal).  Per tile: S = Q K^T and dP = dO V^T
 * (mma), P = 2^(S scale log2e - lse log2e), dS = P (dP - delta), rounded to
 * 16 bits as the A operand of dQ += dS K (K through ldmatrix.trans).  Out
 * dq = scale dQ.  Query tiles run heaviest first (causal). */
template <int D, bool BF>
__global__ void __launch_bounds__(KC_AW * 32, 2)
	kc_attn_dq_tc_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v,
			     const uint16_t *dout, const float *lse, const float *delta,
			     uint16_t *dq, const int32_t *cu, int hq, int hkv, float scale,
			     float sl2, int causal)
{
	constexpr int NS = KC_TB / 8, NO = D / 8, TILE = KC_TB * D;
	extern __shared__ float smem[];
	uint16_t *sq = (uint16_t *) smem; /* [64][D] swizzled */
	uint16_t *sdo = sq + TILE;	  /* [64][D] */
	uint16_t *sk = sdo + TILE;	  /* 2 x [64][D] */
	uint16_t *sv = sk + 2 * TILE;	  /* 2 x [64][D] */
	int seq = blockIdx.z, h = blockIdx.y;
	int start = cu[seq], L = cu[seq + 1] - start;
	int q0 = (int) (gridDim.x - 1 - blockIdx.x) * KC_TB;
	if (q0 >= L)
		return;
	int hk = h / (hq / hkv);
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int mi = lane >> 3, mr = lane & 7;
	size_t kvs = (size_t) hkv * D, qs = (size_t) hq * D;
	const uint16_t *kb = k + ((size_t) start * hkv + hk) * D;
	const uint16_t *vb = v + ((size_t) start * hkv + hk) * D;
	size_t qoff = ((size_t) (start + q0) * hq + h) * D;

	kc_stage<D, KC_TB>(sq, q + qoff, qs, L - q0);
	kc_stage<D, KC_TB>(sdo, dout + qoff, qs, L - q0);
	kc_stage<D, KC_TB>(sk, kb, kvs, L);
	kc_stage<D, KC_TB>(sv, vb, kvs, L);
	kc_cp_commit();

	int wrow = warp * 16, row0 = q0 + wrow + (lane >> 2); /* rows row0, row0 + 8 */
	float l2[2], dl[2];
#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		int qpos = row0 + 8 * hr;
		size_t row = (size_t) (start + qpos) * hq + h;
		l2[hr] = qpos < L ? lse[row] * KC_LOG2E : 0.0f;
		dl[hr] = qpos < L ? delta[row] : 0.0f;
	}
	float acc[NO][4];
#pragma unroll
	for (int n = 0; n < NO; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
	int kend = causal ? min(L, q0 + KC_TB) : L;
	int ntiles = (kend + KC_TB - 1) / KC_TB;
	constexpr bool KEEP = KC_KEEP_A(D);
	uint32_t af[KEEP ? D / 16 : 1][2][4]; /* KEEP: the warp's Q and dO fragments */

	for (int j = 0; j < ntiles; j++) {
		if (j + 1 < ntiles) {
			int k1 = (j + 1) * KC_TB;
			kc_stage<D, KC_TB>(sk + ((j + 1) & 1) * TILE, kb + k1 * kvs, kvs, L - k1);
			kc_stage<D, KC_TB>(sv + ((j + 1) & 1) * TILE, vb + k1 * kvs, kvs, L - k1);
		}
		kc_cp_commit();
		kc_cp_wait<1>(); /* all but the newest group: tile j (and Q, dO) */
		__syncthreads();
		if (KEEP && j == 0)
			kc_load_a2<D>(af, sq, sdo, wrow, mi, mr);
		const uint16_t *ck = sk + (j & 1) * TILE, *cv = sv + (j & 1) * TILE;
		float s[NS][4], dp[NS][4];
		kc_mma_2qk<D, BF, KEEP>(s, dp, af, sq, sdo, ck, cv, wrow, mi, mr);

		int k0 = j * KC_TB;
		bool edge = k0 + KC_TB > L || (causal && k0 + KC_TB - 1 > q0); /* block-uniform */
#pragma unroll
		for (int n = 0; n < NS; n++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				int hr = i >> 1;
				float p = kc_exp2_fast(fmaf(s[n][i], sl2, -l2[hr]));
				if (edge) {
					int kpos = k0 + n * 8 + (lane & 3) * 2 + (i & 1);
					if (kpos >= L || (causal && kpos > row0 + 8 * hr))
						p = 0.0f;
				}
				s[n][i] = p * (dp[n][i] - dl[hr]); /* dS */
			}
		uint32_t da[KC_TB / 16][4];
		kc_c2a<BF>(da, s);
		kc_mma_av<D, BF>(acc, da, ck, mi, mr);
		__syncthreads(); /* buffer j & 1 is free for tile j + 2 */
	}

#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		int qpos = row0 + 8 * hr;
		if (qpos >= L)
			continue;
		uint32_t *orow =
			(uint32_t *) (dq + ((size_t) (start + qpos) * hq + h) * D) + (lane & 3);
#pragma unroll
		for (int n = 0; n < NO; n++)
			orow[n * 4] =
				kc_pack2<BF>(acc[n][2 * hr] * scale, acc[n][2 * hr + 1] * scale);
	}
}

/* dK and dV, one key tile of one kv head per block: grid (ceil(max_seqlen
 * / 64), n_kv_heads, n_seqs), 4 warps, warp w keys [16 w, 16 w + 16).  K
 * and V are staged once; the block walks every query head of the GQA group
 * and, per head, every query tile at or after its keys (causal), with the
 * Q/dO tiles (and their rows' lse and delta) double-buffered.  Per tile,
 * transposed so that the keys are the mma rows: S^T = K Q^T, dP^T = V dO^T,
 * P^T = 2^(S^T scale log2e - lse log2e), dV += P^T dO and
 * dK += dS^T Q with dS^T = P^T (dP^T - delta) (dO and Q through
 * ldmatrix.trans).  dK/dV stay in registers over the whole group (the GQA
 * sum needs no atomics) and are written once: dk = scale dK. */
template <int D, bool BF>
__global__ void __launch_bounds__(KC_AW * 32, 2)
	kc_attn_dkdv_tc_kernel(const uint16_t *q, const uint16_t *k, const uint16_t *v,
			       const uint16_t *dout, const float *lse, const float *delta,
			       uint16_t *dk, uint16_t *dv, const int32_t *cu, int hq, int hkv,
			       float scale, float sl2, int causal)
{
	constexpr int NS = KC_TB / 8, NO = D / 8, TILE = KC_TB * D;
	extern __shared__ float smem[];
	uint16_t *sk = (uint16_t *) smem;	/* [64][D] swizzled */
	uint16_t *sv = sk + TILE;		/* [64][D] */
	uint16_t *sq = sv + TILE;		/* 2 x [64][D] */
	uint16_t *sdo = sq + 2 * TILE;		/* 2 x [64][D] */
	float *sl = (float *) (sdo + 2 * TILE); /* 2 x [64]: lse log2e of the tile's rows */
	float *sd = sl + 2 * KC_TB;		/* 2 x [64]: delta */
	int seq = blockIdx.z, hk = blockIdx.y;
	int start = cu[seq], L = cu[seq + 1] - start;
	int k0 = blockIdx.x * KC_TB; /* lowest keys first: the most query tiles (causal) */
	if (k0 >= L)
		return;
	int group = hq / hkv;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int mi = lane >> 3, mr = lane & 7;
	size_t kvs = (size_t) hkv * D, qs = (size_t) hq * D;
	size_t koff = ((size_t) (start + k0) * hkv + hk) * D;
	kc_stage<D, KC_TB>(sk, k + koff, kvs, L - k0);
	kc_stage<D, KC_TB>(sv, v + koff, kvs, L - k0);

	int qfirst = causal ? k0 : 0; /* a multiple of the 64-row tile */
	int nq = (L - qfirst + KC_TB - 1) / KC_TB, nit = group * nq;
	/* Iteration it: query head hk group + it / nq, rows qfirst + 64 (it % nq). */
	auto load = [&](int it, int b) {
		int h = hk * group + it / nq, i0 = qfirst + (it % nq) * KC_TB;
		size_t off = ((size_t) (start + i0) * hq + h) * D;
		kc_stage<D, KC_TB>(sq + b * TILE, q + off, qs, L - i0);
		kc_stage<D, KC_TB>(sdo + b * TILE, dout + off, qs, L - i0);
		if (threadIdx.x < KC_TB) {
			int r = threadIdx.x;
			size_t row = (size_t) (start + i0 + r) * hq + h;
			bool ok = i0 + r < L;
			sl[b * KC_TB + r] = ok ? lse[row] * KC_LOG2E : 0.0f;
			sd[b * KC_TB + r] = ok ? delta[row] : 0.0f;
		}
	};
	load(0, 0);
	kc_cp_commit();

	float adk[NO][4], adv[NO][4];
	kc_zero2<NO, 4>(adk, adv);
	int wrow = warp * 16, key0 = k0 + wrow + (lane >> 2); /* keys key0, key0 + 8 */
	constexpr bool KEEP = KC_KEEP_A(D);
	uint32_t af[KEEP ? D / 16 : 1][2][4]; /* KEEP: the warp's K and V fragments */

	for (int it = 0; it < nit; it++) {
		if (it + 1 < nit)
			load(it + 1, (it + 1) & 1);
		kc_cp_commit();
		kc_cp_wait<1>(); /* all but the newest group: tile it (and K, V) */
		__syncthreads();
		int b = it & 1, i0 = qfirst + (it % nq) * KC_TB;
		const uint16_t *cq = sq + b * TILE, *cdo = sdo + b * TILE;
		const float *cl = sl + b * KC_TB, *cd = sd + b * KC_TB;
		if (KEEP && it == 0)
			kc_load_a2<D>(af, sk, sv, wrow, mi, mr);
		float st[NS][4], dpt[NS][4];
		kc_mma_2qk<D, BF, KEEP>(st, dpt, af, sk, sv, cq, cdo, wrow, mi, mr);

		/* Keys past the end are zero rows whose dK/dV are never written. */
		bool edge = i0 + KC_TB > L || (causal && i0 < k0 + KC_TB);
#pragma unroll
		for (int n = 0; n < NS; n++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				int c = n * 8 + (lane & 3) * 2 + (i & 1); /* the query column */
				float p = kc_exp2_fast(fmaf(st[n][i], sl2, -cl[c]));
				if (edge) {
					int qpos = i0 + c, kpos = key0 + 8 * (i >> 1);
					if (qpos >= L || (causal && kpos > qpos))
						p = 0.0f;
				}
				st[n][i] = p;
				dpt[n][i] = p * (dpt[n][i] - cd[c]); /* dS^T */
			}
		uint32_t a[KC_TB / 16][4];
		kc_c2a<BF>(a, st);
		kc_mma_av<D, BF>(adv, a, cdo, mi, mr);
		kc_c2a<BF>(a, dpt);
		kc_mma_av<D, BF>(adk, a, cq, mi, mr);
		__syncthreads(); /* buffer it & 1 is free for tile it + 2 */
	}

#pragma unroll
	for (int hr = 0; hr < 2; hr++) {
		int kpos = key0 + 8 * hr;
		if (kpos >= L)
			continue;
		size_t row = ((size_t) (start + kpos) * hkv + hk) * D;
		uint32_t *krow = (uint32_t *) (dk + row) + (lane & 3);
		uint32_t *vrow = (uint32_t *) (dv + row) + (lane & 3);
#pragma unroll
		for (int n = 0; n < NO; n++) {
			krow[n * 4] =
				kc_pack2<BF>(adk[n][2 * hr] * scale, adk[n][2 * hr + 1] * scale);
			vrow[n * 4] = kc_pack2<BF>(adv[n][2 * hr], adv[n][2 * hr + 1]);
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

/* kc_attn_grid, kc_scale_of: kc_attn.cuh. */

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

/* BF16/F16 on the tensor cores: delta, then the dq and the dk/dv kernels
 * (96 KiB of shared memory each at D = 128: two blocks per SM). */
template <typename T, int D, bool BF>
static int kc_attn_bwd_tc(cudaStream_t s, const kk_attn_desc *d, void *dq, void *dk, void *dv,
			  const void *dout, const void *q, const void *k, const void *v,
			  const void *o, const float *lse)
{
	size_t rows = (size_t) d->total_tokens * d->n_heads;
	size_t smq = (size_t) 6 * KC_TB * D * sizeof(uint16_t);
	size_t smk = smq + (size_t) 4 * KC_TB * sizeof(float);
	float scale = kc_scale_of(d->scale, D);
	const int32_t *cu = (const int32_t *) d->cu_seqlens->ptr;
	float *delta = NULL;
	dim3 gq, gk;
	int r = kc_attn_grid(d, KC_TB, d->n_heads, &gq);
	if (r >= 0)
		r = kc_attn_grid(d, KC_TB, d->n_kv_heads, &gk);
	if (r >= 0)
		r = kc_errno_cuda(cudaFuncSetAttribute(kc_attn_dq_tc_kernel<D, BF>,
						       cudaFuncAttributeMaxDynamicSharedMemorySize,
						       (int) smq));
	if (r >= 0)
		r = kc_errno_cuda(cudaFuncSetAttribute(kc_attn_dkdv_tc_kernel<D, BF>,
						       cudaFuncAttributeMaxDynamicSharedMemorySize,
						       (int) smk));
	if (r < 0)
		return r;
	r = kc_errno_cuda(cudaMallocAsync((void **) &delta, rows * sizeof(float), s));
	if (r < 0)
		return r;
	kc_attn_delta_kernel<T, D><<<kc_grid(rows * 32, 256), 256, 0, s>>>(delta, (const T *) dout,
									   (const T *) o, rows);
	r = kc_check_launch();
	const uint16_t *q16 = (const uint16_t *) q, *k16 = (const uint16_t *) k,
		       *v16 = (const uint16_t *) v, *do16 = (const uint16_t *) dout;
	if (r >= 0) {
		kc_attn_dq_tc_kernel<D, BF><<<gq, KC_AW * 32, smq, s>>>(
			q16, k16, v16, do16, lse, delta, (uint16_t *) dq, cu, d->n_heads,
			d->n_kv_heads, scale, scale * KC_LOG2E, d->causal);
		r = kc_check_launch();
	}
	if (r >= 0) {
		kc_attn_dkdv_tc_kernel<D, BF><<<gk, KC_AW * 32, smk, s>>>(
			q16, k16, v16, do16, lse, delta, (uint16_t *) dk, (uint16_t *) dv, cu,
			d->n_heads, d->n_kv_heads, scale, scale * KC_LOG2E, d->causal);
		r = kc_check_launch();
	}
	int r2 = kc_errno_cuda(cudaFreeAsync(delta, s));
	return r < 0 ? r : r2;
}

/* 1 when every pointer allows the 16-byte accesses of the 16-bit kernels. */
static bool kc_bwd_aligned16(const void *const *p, int n)
{
	uintptr_t a = 0;
	for (int i = 0; i < n; i++)
		a |= (uintptr_t) p[i];
	return (a & 15) == 0;
}

template <typename T>
static int kc_attn_bwd_d(cudaStream_t s, const kk_attn_desc *d, void *dq, void *dk, void *dv,
			 const void *dout, const void *q, const void *k, const void *v,
			 const void *o, const float *lse)
{
	/* 16-bit types on the tensor cores, unless a pointer is misaligned for
	 * their 16-byte copies (a view into a buffer): then the f32 kernels. */
	const void *ptrs[] = { dq, dk, dv, dout, q, k, v, o };
	bool tc = kc_dtype_of<T>() != KC_F32 && kc_bwd_aligned16(ptrs, 8);
	bool bf = kc_dtype_of<T>() == KC_BF16;
	if (d->head_dim == 64)
		return !tc  ? kc_attn_bwd_t<T, 64>(s, d, dq, dk, dv, dout, q, k, v, o, lse)
		       : bf ? kc_attn_bwd_tc<T, 64, true>(s, d, dq, dk, dv, dout, q, k, v, o, lse)
			    : kc_attn_bwd_tc<T, 64, false>(s, d, dq, dk, dv, dout, q, k, v, o, lse);
	if (d->head_dim == 128)
		return !tc  ? kc_attn_bwd_t<T, 128>(s, d, dq, dk, dv, dout, q, k, v, o, lse)
		       : bf ? kc_attn_bwd_tc<T, 128, true>(s, d, dq, dk, dv, dout, q, k, v, o, lse)
			    : kc_attn_bwd_tc<T, 128, false>(s, d, dq, dk, dv, dout, q, k, v, o,
							    lse);
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
