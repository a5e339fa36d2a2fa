/* kernels/cuda/kc_tile.cuh — the swizzled shared-memory tiles of the
 * tensor-core attention kernels (attention.cu's forward and decode,
 * attention-bwd.cu's backward): one layout, so that ldmatrix rows and
 * cp.async waves spread over the 8 bank groups the same way everywhere.
 *
 * The including file defines KC_AW (warps per block) before it includes
 * this header: kc_stage's copy waves are sized by it. */
#ifndef KILN_KC_TILE_CUH
#define KILN_KC_TILE_CUH

#ifndef KC_AW
#error "kc_tile.cuh: define KC_AW (warps per block) first"
#endif

#include <stddef.h>
#include <stdint.h>

#include "kc_mma.cuh"

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

#endif
