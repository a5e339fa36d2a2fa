/* tests/gpu/emu/include/kc_emu_mma.h — warp-level matrix
 * instructions (mma.sync m16n8k16, ldmatrix .x4) for the CPU emulation of
 * kernels/kk/cuda/ (included by cuda_runtime.h here; kernels/kk/cuda/kc_mma.cuh
 * calls these when KC_EMU is defined).
 *
 * Each is a true warp collective: every lane deposits its operand
 * registers (or its row address) into its warp's exchange buffer, the warp
 * meets at a barrier, each lane assembles the whole operands from everyone's
 * registers with the PTX ISA's fragment layouts and computes its own output
 * registers, and the warp meets again before the buffer is reused.  So a
 * kernel that gets a layout wrong computes wrong numbers here, as it would
 * on a GPU.  Products of bf16/f16 values are exact in f32; the sum runs in
 * f32 in k order (the tensor cores' internal order and precision differ
 * slightly: results agree to f32 rounding, not bit for bit). */
#pragma once
#include <stdint.h>
#include <string.h>

#include "kk.h"

#define KC_EMU 1

/* This warp's exchange buffer: 32 lanes x 8 words (emu.cpp). */
uint32_t *kc_emu_warp_buf(void);
void kc_emu_warp_sync(void);
void kc_emu_warp_enter(unsigned mask, int line, int src);
uint64_t *kc_emu_warp_slots(void);
extern __thread uint3 kc_emu_tid; /* __thread: no TLS wrapper (UBSan misreads it as null) */

static inline float kc_emu_h2f(uint16_t h, bool bf)
{
	return bf ? kk_bf16_to_f32(h) : kk_f16_to_f32(h);
}
/* Element e (0 low, 1 high) of a packed register. */
static inline float kc_emu_half(uint32_t r, int e, bool bf)
{
	return kc_emu_h2f((uint16_t) (e ? r >> 16 : r & 0xffff), bf);
}
static inline uint32_t kc_emu_pack2(float lo, float hi, bool bf)
{
	uint16_t l = bf ? kk_f32_to_bf16(lo) : kk_f32_to_f16(lo);
	uint16_t h = bf ? kk_f32_to_bf16(hi) : kk_f32_to_f16(hi);
	return (uint32_t) l | (uint32_t) h << 16;
}

/* d += A (16 x 16) * B (16 x 8), fragments as in kc_mma.cuh. */
static inline void kc_emu_mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], bool bf)
{
	uint32_t *buf = kc_emu_warp_buf();
	unsigned lane = kc_emu_tid.x & 31;
	for (int i = 0; i < 4; i++)
		buf[lane * 8 + i] = a[i];
	buf[lane * 8 + 4] = b[0];
	buf[lane * 8 + 5] = b[1];
	kc_emu_warp_enter(0xffffffffu, __LINE__, -1);
	/* Whole operands from every lane's registers (PTX ISA layouts). */
	float A[16][16], B[16][8];
	for (int l = 0; l < 32; l++) {
		int g = l >> 2, t = l & 3;
		for (int i = 0; i < 8; i++) { /* element ai of lane l */
			int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
			int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
			A[row][col] = kc_emu_half(buf[l * 8 + i / 2], i & 1, bf);
		}
		for (int i = 0; i < 4; i++) { /* element bi of lane l */
			int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
			B[row][g] = kc_emu_half(buf[l * 8 + 4 + i / 2], i & 1, bf);
		}
	}
	int g = lane >> 2, t = lane & 3;
	float out[4];
	for (int i = 0; i < 4; i++) { /* element ci of this lane */
		int row = i < 2 ? g : g + 8, col = t * 2 + (i & 1);
		float s = d[i];
		for (int k = 0; k < 16; k++)
			s += A[row][k] * B[k][col];
		out[i] = s;
	}
	kc_emu_warp_sync();
	for (int i = 0; i < 4; i++)
		d[i] = out[i];
}

/* ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 r, [p]. */
static inline void kc_emu_ldmatrix_x4(uint32_t r[4], const void *p, bool trans)
{
	uint64_t *slots = kc_emu_warp_slots();
	unsigned lane = kc_emu_tid.x & 31;
	kc_emu_check_align(p, 16, "ldmatrix row address");
	slots[lane] = (uint64_t) (uintptr_t) p;
	kc_emu_warp_enter(0xffffffffu, __LINE__, -1);
	uint32_t out[4];
	for (int m = 0; m < 4; m++) {
		uint16_t e[2];
		for (int j = 0; j < 2; j++) {
			/* Element (row, col) of matrix m sits at row address
			 * slots[8m + row], column col (16-bit elements). */
			int row = trans ? (int) (lane % 4) * 2 + j : (int) lane / 4;
			int col = trans ? (int) lane / 4 : (int) (lane % 4) * 2 + j;
			const uint16_t *rp = (const uint16_t *) (uintptr_t) slots[8 * m + row];
			memcpy(&e[j], rp + col, 2);
		}
		out[m] = (uint32_t) e[0] | (uint32_t) e[1] << 16;
	}
	kc_emu_warp_sync();
	for (int m = 0; m < 4; m++)
		r[m] = out[m];
}
