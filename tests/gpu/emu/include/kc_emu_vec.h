/* tests/gpu/emu/include/kc_emu_vec.h — CUDA's vector types
 * (float2/float4, uint2/uint4 ...) and packed bf16/f16 intrinsics for the CPU
 * emulation of kernels/kk/cuda/ (included by cuda_runtime.h here), plus the
 * device queries the kernels size their grids with (an emulated device of
 * KC_EMU_SMS multiprocessors).  The packed bf16/f16 pairs live in
 * cuda_bf16.h / cuda_fp16.h beside this.
 *
 * KC_EMU tells kernels/kk/cuda/kc_vec.cuh that it is compiled for the
 * emulation: its 16-byte accesses then go through memcpy (g++ would
 * otherwise be free to reorder them against typed accesses of the same
 * memory). */
#pragma once

#include <stdint.h>
#include <string.h>

#define KC_EMU 1

/* Multiprocessors of the emulated device: small, so grids sized from the SM
 * count stay cheap to emulate and every grid-stride loop strides. */
#define KC_EMU_SMS 2

struct alignas(2) char2 {
	signed char x, y;
};
struct alignas(4) char4 {
	signed char x, y, z, w;
};
struct alignas(4) uchar4 {
	unsigned char x, y, z, w;
};
struct alignas(4) short2 {
	short x, y;
};
struct alignas(4) ushort2 {
	unsigned short x, y;
};
struct alignas(8) int2 {
	int x, y;
};
struct alignas(16) int4 {
	int x, y, z, w;
};
struct alignas(8) uint2 {
	unsigned x, y;
};
struct alignas(16) uint4 {
	unsigned x, y, z, w;
};
struct alignas(8) float2 {
	float x, y;
};
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(16) double2 {
	double x, y;
};
/* Aligned as CUDA aligns them, so that UBSan (test-emu-asan.sh) reports a
 * vector access through a misaligned pointer, as the GPU would fault. */
static_assert(alignof(uint4) == 16 && alignof(float4) == 16 && alignof(float2) == 8,
	      "CUDA's vector alignments");
static_assert(sizeof(uint4) == 16 && sizeof(float4) == 16 && sizeof(int4) == 16,
	      "vector types must be 16 bytes");

static inline char4 make_char4(signed char x, signed char y, signed char z, signed char w)
{
	return char4{ x, y, z, w };
}
static inline int2 make_int2(int x, int y)
{
	return int2{ x, y };
}
static inline int4 make_int4(int x, int y, int z, int w)
{
	return int4{ x, y, z, w };
}
static inline uint2 make_uint2(unsigned x, unsigned y)
{
	return uint2{ x, y };
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return uint4{ x, y, z, w };
}
static inline float2 make_float2(float x, float y)
{
	return float2{ x, y };
}
static inline float4 make_float4(float x, float y, float z, float w)
{
	return float4{ x, y, z, w };
}
static inline double2 make_double2(double x, double y)
{
	return double2{ x, y };
}

/* 16-byte accesses of kernels/kk/cuda/kc_vec.cuh under KC_EMU: memcpy (g++
 * would otherwise be free to reorder them against typed accesses of the same
 * memory), after checking the alignment the GPU's 128-bit access needs. */
static inline void kc_emu_ld16(void *d, const void *p)
{
	kc_emu_check_align(p, 16, "16-byte vector load");
	memcpy(d, p, 16);
}
static inline void kc_emu_st16(void *p, const void *s)
{
	kc_emu_check_align(p, 16, "16-byte vector store");
	memcpy(p, s, 16);
}

/* Read-only cache loads are ordinary loads here. */
template <typename T> static inline T __ldg(const T *p)
{
	return *p;
}

/* ---- device queries ------------------------------------------------------ */
enum cudaDeviceAttr {
	cudaDevAttrMaxThreadsPerBlock = 1,
	cudaDevAttrMaxSharedMemoryPerBlock = 8,
	cudaDevAttrMultiProcessorCount = 16,
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
static inline cudaError_t cudaGetDevice(int *d)
{
	*d = 0;
	return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev)
{
	if (dev != 0)
		return cudaErrorInvalidDevice;
	switch (a) {
	case cudaDevAttrMaxThreadsPerBlock:
		*v = 1024;
		break;
	case cudaDevAttrMaxSharedMemoryPerBlock:
		*v = 48 * 1024;
		break;
	case cudaDevAttrMultiProcessorCount:
		*v = KC_EMU_SMS;
		break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin:
		*v = 227 * 1024;
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}
/* Resident blocks per SM: the thread limit only (the emulation has no
 * register file). */
template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int threads,
									size_t)
{
	if (threads <= 0 || threads > 1024)
		return cudaErrorInvalidValue;
	*n = 2048 / threads;
	return cudaSuccess;
}

/* ---- integer intrinsics -------------------------------------------------- */
/* Byte n of the result is byte (s >> 4n) & 7 of the 8-byte value y:x. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
	uint64_t v = ((uint64_t) y << 32) | x;
	unsigned r = 0;
	for (int n = 0; n < 4; n++)
		r |= (unsigned) ((v >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
	return r;
}

/* float4 atomics (sm_90: red.global.add.v4.f32), element by element here. */
static inline float4 atomicAdd(float4 *p, float4 v)
{
	float4 old;
	kc_emu_check_align(p, 16, "float4 atomicAdd");
	kc_emu_atomic_lock();
	old = *p;
	p->x += v.x;
	p->y += v.y;
	p->z += v.z;
	p->w += v.w;
	kc_emu_atomic_unlock();
	return old;
}

/* ---- math --------------------------------------------------------------- */
static inline void sincospif(float x, float *s, float *c)
{
	double a = 3.141592653589793 * (double) x;
	*s = (float) sin(a);
	*c = (float) cos(a);
}
