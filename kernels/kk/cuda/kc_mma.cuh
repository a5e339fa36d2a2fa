/* kernels/kk/cuda/kc_mma.cuh — warp-level tensor-core and async-copy primitives
 * for the CUDA backend's hand-written matrix kernels (attention.cu).
 *
 *   kc_mma16816<BF>(d, a, b)  d += A * B, one mma.sync.aligned.m16n8k16
 *                             .row.col.f32.{bf16,f16}.{bf16,f16}.f32
 *   kc_ldsm_x4(r, p)          ldmatrix.sync.aligned.m8n8.x4.shared.b16
 *   kc_ldsm_x4_t(r, p)        the same with .trans
 *   kc_pack2<BF>(lo, hi)      two floats -> one packed bf16x2/f16x2 register
 *   kc_cp_async16(s, g, ok)   cp.async.cg 16 bytes global -> shared, zero-fill
 *                             when !ok; kc_cp_commit(), kc_cp_wait<N>()
 *
 * Register fragments follow the PTX ISA exactly (section "Matrix Fragments
 * for mma.m16n8k16 with floating point type"); with g = lane >> 2 and
 * t = lane & 3:
 *   A (16 x 16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
 *                           a[2] = A[g][2t+8..],   a[3] = A[g+8][2t+8..]
 *   B (16 x 8, K x N):      b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
 *   C/D (16 x 8, f32):      d[0..1] = C[g][2t..2t+1], d[2..3] = C[g+8][2t..]
 * (the lower-numbered element in the low 16 bits of a register).
 * ldmatrix .x4: lanes 8i..8i+7 give the row addresses (16 bytes each) of
 * matrix i; r[i] of lane l = M_i[l / 4][2 (l % 4) .. +1], or with .trans
 * M_i[2 (l % 4) .. +1][l / 4].
 *
 * On the GPU these are inline PTX (sm_80+; built for sm_90).  Under the CPU
 * emulation of tests/gpu/emu (KC_EMU, set by its kc_emu_mma.h) they
 * call warp-collective emulations that exchange every lane's registers and
 * compute each lane's fragment from the same layouts, in f32; cp.async there
 * lands at the cp.async.wait_group that retires its group, as on the GPU.  All callers must be warp-uniform (every lane of the warp
 * calls with the same control flow), as the hardware requires. */
#pragma once

#include <stdint.h>

#include <cuda_fp16.h>

#if defined(KC_EMU)

template <bool BF>
static __device__ __forceinline__ void kc_mma16816(float d[4], const uint32_t a[4],
						   const uint32_t b[2])
{
	kc_emu_mma16816(d, a, b, BF);
}
static __device__ __forceinline__ void kc_ldsm_x4(uint32_t r[4], const void *p)
{
	kc_emu_ldmatrix_x4(r, p, false);
}
static __device__ __forceinline__ void kc_ldsm_x4_t(uint32_t r[4], const void *p)
{
	kc_emu_ldmatrix_x4(r, p, true);
}
template <bool BF> static __device__ __forceinline__ uint32_t kc_pack2(float lo, float hi)
{
	return kc_emu_pack2(lo, hi, BF);
}
static __device__ __forceinline__ void kc_cp_async16(void *s, const void *g, bool ok)
{
	kc_emu_cp_async16(s, g, ok);
}
static __device__ __forceinline__ void kc_cp_commit(void)
{
	kc_emu_cp_commit();
}
template <int N> static __device__ __forceinline__ void kc_cp_wait(void)
{
	kc_emu_cp_wait(N);
}

#else /* the real device */

template <bool BF>
static __device__ __forceinline__ void kc_mma16816(float d[4], const uint32_t a[4],
						   const uint32_t b[2])
{
#if defined(__CUDA_ARCH__)
	if (BF)
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
			     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
	else
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
			     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else /* host pass (no __CUDA_ARCH__): the body is device-only */
	(void) d;
	(void) a;
	(void) b;
#endif
}
/* ldmatrix x4 from shared memory, TRANS: with .trans. */
template <bool TRANS>
static __device__ __forceinline__ void kc_ldsm_x4_of(uint32_t r[4], const void *p)
{
#if defined(__CUDA_ARCH__)
	unsigned s = (unsigned) __cvta_generic_to_shared(p);
	if (TRANS)
		asm volatile(
			"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
			: "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
			: "r"(s));
	else
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
			     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
			     : "r"(s));
#else /* host pass (no __CUDA_ARCH__): the body is device-only */
	(void) r;
	(void) p;
#endif
}
static __device__ __forceinline__ void kc_ldsm_x4(uint32_t r[4], const void *p)
{
	kc_ldsm_x4_of<false>(r, p);
}
static __device__ __forceinline__ void kc_ldsm_x4_t(uint32_t r[4], const void *p)
{
	kc_ldsm_x4_of<true>(r, p);
}
template <bool BF> static __device__ __forceinline__ uint32_t kc_pack2(float lo, float hi)
{
	uint32_t r = 0;
#if defined(__CUDA_ARCH__)
	/* cvt packs its first source into the upper half. */
	if (BF)
		asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
	else
		asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else /* host pass (no __CUDA_ARCH__): the body is device-only */
	(void) lo;
	(void) hi;
#endif
	return r;
}
/* 16 bytes global -> shared without a register round trip (L2 only: .cg);
 * !ok reads nothing and stores zeros (src-size 0), for rows past the end. */
static __device__ __forceinline__ void kc_cp_async16(void *s, const void *g, bool ok)
{
#if defined(__CUDA_ARCH__)
	unsigned sa = (unsigned) __cvta_generic_to_shared(s);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(g),
		     "r"(ok ? 16 : 0));
#else /* host pass (no __CUDA_ARCH__): the body is device-only */
	(void) s;
	(void) g;
	(void) ok;
#endif
}
static __device__ __forceinline__ void kc_cp_commit(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.commit_group;\n" ::);
#endif
}
/* Waits until at most N committed groups of this thread are in flight. */
template <int N> static __device__ __forceinline__ void kc_cp_wait(void)
{
#if defined(__CUDA_ARCH__)
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

#endif

/* An f16 value given as its bit pattern, widened to f32. */
static __device__ __forceinline__ float kc_f16_bits(uint32_t h)
{
#if defined(KC_EMU)
	return kk_f16_to_f32((uint16_t) h);
#else
	return __half2float(__ushort_as_half((unsigned short) h));
#endif
}
