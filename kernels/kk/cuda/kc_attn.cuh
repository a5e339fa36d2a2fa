/* kernels/kk/cuda/kc_attn.cuh — what attention.cu (forward, decode) and
 * attention-bwd.cu (backward) share: the swizzled shared-memory tiles of
 * the tensor-core kernels (one layout, so that ldmatrix rows and cp.async
 * waves spread over the 8 bank groups the same way everywhere), the fast
 * 2^x of their softmax, and the launchers' grid and scale rules.
 *
 * The including file defines KC_AW (warps per block) before it includes
 * this header: kc_stage's copy waves are sized by it. */
#ifndef KILN_KC_ATTN_CUH
#define KILN_KC_ATTN_CUH

#ifndef KC_AW
#error "kc_attn.cuh: define KC_AW (warps per block) first"
#endif

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kc.h"
#include "kc_mma.cuh"

#define KC_LOG2E 1.4426950408889634f

/* 16-byte chunk index of (row r, chunk c) in a swizzled tile whose rows hold
 * D 16-bit elements (D / 8 chunks).  Chunk c of row r is stored at c ^ (r & 7):
 * the 8 rows one ldmatrix reads at the same logical chunk (and the 8 rows of
 * a cp.async wave) then fall on 8 different 16-byte bank groups instead of
 * one (a row is 128 or 256 bytes, a multiple of the 128-byte bank width). */
template <int D> static __device__ __forceinline__ int kc_sw(int r, int c)
{
	return r * (D / 8) + (c ^ (r & 7));
}

/* Stages `ROWS` rows of D elements (global row stride `stride` elements)
 * into a swizzled shared tile with cp.async; rows >= valid are zero-filled
 * (never read from global memory). */
template <int D, int ROWS>
static __device__ __forceinline__ void kc_stage(uint16_t *s, const uint16_t *g, size_t stride,
						int valid)
{
	constexpr int CPR = D / 8, RSTEP = KC_AW * 32 / CPR; /* rows per wave of copies */
	static_assert(ROWS % RSTEP == 0 && RSTEP % 8 == 0, "whole waves of 8-row swizzle groups");
	/* Thread t copies chunk t % CPR of rows t / CPR + RSTEP i: its swizzle
	 * (r & 7) is the same for every i, so all its addresses are one base
	 * plus constants (nothing for the compiler to keep per copy). */
	int r0 = threadIdx.x / CPR, c = threadIdx.x % CPR;
	uint16_t *sd = s + kc_sw<D>(r0, c) * 8;
	const uint16_t *gs = g + (size_t) r0 * stride + c * 8;
#pragma unroll
	for (int i = 0; i < ROWS / RSTEP; i++) {
		bool ok = r0 + i * RSTEP < valid;
		kc_cp_async16(sd + i * RSTEP * D, ok ? gs + (size_t) i * RSTEP * stride : g, ok);
	}
}

/* 2^x as one MUFU.EX2 (ex2.approx.ftz: about 2 ulp, subnormal results
 * flushed to 0; exp2f adds range fixups around it).  -inf gives +0, which
 * the online softmax relies on; the probabilities are rounded to 16 bits
 * or summed in f32 right after, so exp2f's denormal handling buys nothing. */
static __device__ __forceinline__ float kc_exp2_fast(float x)
{
#if defined(__CUDA_ARCH__) && !defined(KC_EMU)
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
#else /* host pass and the CPU emulation */
	return exp2f(x);
#endif
}

/* The prefill launchers' grid: (row blocks of the longest sequence, heads,
 * sequences). */
static inline int kc_attn_grid(const kk_attn_desc *d, int rows_per_block, int heads, dim3 *g)
{
	if (d->n_seqs > 65535 || heads > 65535 || d->max_seqlen <= 0)
		return d->max_seqlen <= 0 ? -EINVAL : -EOPNOTSUPP;
	*g = dim3((unsigned) ((d->max_seqlen + rows_per_block - 1) / rows_per_block),
		  (unsigned) heads, (unsigned) d->n_seqs);
	return 0;
}

/* The softmax scale: the descriptor's, or 1/sqrt(head_dim) when 0. */
static inline float kc_scale_of(float scale, int head_dim)
{
	return scale != 0.0f ? scale : 1.0f / sqrtf((float) head_dim);
}

#endif
