/* kernels/kk/cuda/kc_vec.cuh — 16-byte vector access for the memory-bound
 * kernels of the CUDA backend (elementwise.cu, rope.cu, softmax.cu, embedding.cu, norm.cu, optim.cu,
 * quant.cu), and the launch geometry they share.
 *
 * Why: HBM3 reaches its bandwidth only when every thread moves 16 bytes per
 * load/store instruction (LDG.E.128 / STG.E.128) and a warp's accesses are
 * contiguous.  An access of W elements of type T (W = KC_VN<T> = 4 f32 or
 * 8 bf16/f16, or any multiple) is done here as W * sizeof(T) / 16 such
 * instructions and converted to/from f32 registers; W == 1 is the scalar
 * path.  The caller guarantees 16-byte alignment for W > 1: host helpers
 * (kc_vec_head, kc_aligned16) decide per launch whether a tensor qualifies
 * (cudaMalloc'ed buffers are 256-byte aligned; views at odd offsets and odd
 * row lengths are not) and the kernels keep a scalar path for the rest.
 *
 * Row kernels (norms, softmax, cross-entropy) walk a row in segments of
 * blockDim * W elements: in the vector layout thread t owns elements
 * t*W .. t*W+W-1 of a segment, in the scalar layout elements t, t+blockDim,
 * ... (coalesced either way); kc_seg_* implement both, with 32-bit offsets
 * inside a row (callers keep rows under 2^31 elements).
 *
 * Grid sizes come from the SM count (cached per device), not from the
 * element count alone: a grid-stride loop needs one resident wave.
 * Device code is CUDA C++; tests/gpu/emu compiles it as host C++
 * (KC_EMU, defined by the emulator's headers, switches the raw 16-byte
 * access to memcpy there, which keeps g++'s aliasing rules out of it). */
#pragma once

#include <stdint.h>
#include <string.h>

#include "kc.h"

/* Elements of T in one 16-byte access. */
template <typename T> struct kc_vn_s {
	static const int v = 16 / (int) sizeof(T);
};
#define KC_VN(T) (kc_vn_s<T>::v)

/* ---- raw 16-byte global access ------------------------------------------
 * NC: through the read-only (non-coherent) path, for data no thread of the
 * kernel writes (weights, scales).  Inputs an output may alias (y may be x)
 * use plain loads. */

template <bool NC> static __device__ __forceinline__ uint4 kc_ld128(const void *p)
{
#ifdef KC_EMU
	uint4 u;
	kc_emu_ld16(&u, p);
	return u;
#else
	if (NC)
		return __ldg(reinterpret_cast<const uint4 *>(p));
	return *reinterpret_cast<const uint4 *>(p);
#endif
}
static __device__ __forceinline__ void kc_st128(void *p, uint4 u)
{
#ifdef KC_EMU
	kc_emu_st16(p, &u);
#else
	*reinterpret_cast<uint4 *>(p) = u;
#endif
}

/* ---- 32-bit word <-> two f32 -------------------------------------------- */

/* bf16 -> f32 is exact: the bf16 bits are the high half of the f32. */
static __device__ __forceinline__ void kc_unpack2(uint32_t w, float *f, __nv_bfloat16)
{
	f[0] = __uint_as_float(w << 16);
	f[1] = __uint_as_float(w & 0xffff0000u);
}
static __device__ __forceinline__ void kc_unpack2(uint32_t w, float *f, __half)
{
	f[0] = __half2float(__ushort_as_half((unsigned short) (w & 0xffffu)));
	f[1] = __half2float(__ushort_as_half((unsigned short) (w >> 16)));
}
static __device__ __forceinline__ uint32_t kc_pack2(float a, float b, __nv_bfloat16)
{
	__nv_bfloat162 h = __floats2bfloat162_rn(a, b);
	uint32_t w;
	memcpy(&w, &h, 4);
	return w;
}
static __device__ __forceinline__ uint32_t kc_pack2(float a, float b, __half)
{
	__half2 h = __floats2half2_rn(a, b);
	uint32_t w;
	memcpy(&w, &h, 4);
	return w;
}

/* ---- W elements <-> f32 registers ---------------------------------------- */

/* f[0..W) = p[0..W).  W == 1: one scalar load; otherwise p is 16-byte
 * aligned and W * sizeof(T) a multiple of 16. */
template <int W, bool NC = false>
static __device__ __forceinline__ void kc_ldv(const float *p, float (&f)[W])
{
	if constexpr (W == 1) {
		f[0] = p[0];
	} else {
		static_assert(W % 4 == 0, "f32 vectors are 4 wide");
#pragma unroll
		for (int c = 0; c < W / 4; c++) {
			uint4 u = kc_ld128<NC>(p + 4 * c);
			f[4 * c + 0] = __uint_as_float(u.x);
			f[4 * c + 1] = __uint_as_float(u.y);
			f[4 * c + 2] = __uint_as_float(u.z);
			f[4 * c + 3] = __uint_as_float(u.w);
		}
	}
}
template <int W, bool NC = false, typename T>
static __device__ __forceinline__ void kc_ldv(const T *p, float (&f)[W])
{
	if constexpr (W == 1) {
		f[0] = kc_ld(p, 0);
	} else {
		static_assert(W % 8 == 0, "bf16/f16 vectors are 8 wide");
#pragma unroll
		for (int c = 0; c < W / 8; c++) {
			uint4 u = kc_ld128<NC>(p + 8 * c);
			kc_unpack2(u.x, f + 8 * c + 0, T());
			kc_unpack2(u.y, f + 8 * c + 2, T());
			kc_unpack2(u.z, f + 8 * c + 4, T());
			kc_unpack2(u.w, f + 8 * c + 6, T());
		}
	}
}

/* p[0..W) = f[0..W), rounded to nearest even for bf16/f16. */
template <int W> static __device__ __forceinline__ void kc_stv(float *p, const float (&f)[W])
{
	if constexpr (W == 1) {
		p[0] = f[0];
	} else {
		static_assert(W % 4 == 0, "f32 vectors are 4 wide");
#pragma unroll
		for (int c = 0; c < W / 4; c++) {
			uint4 u;
			u.x = __float_as_uint(f[4 * c + 0]);
			u.y = __float_as_uint(f[4 * c + 1]);
			u.z = __float_as_uint(f[4 * c + 2]);
			u.w = __float_as_uint(f[4 * c + 3]);
			kc_st128(p + 4 * c, u);
		}
	}
}
template <int W, typename T>
static __device__ __forceinline__ void kc_stv(T *p, const float (&f)[W])
{
	if constexpr (W == 1) {
		kc_st(p, 0, f[0]);
	} else {
		static_assert(W % 8 == 0, "bf16/f16 vectors are 8 wide");
#pragma unroll
		for (int c = 0; c < W / 8; c++) {
			uint4 u;
			u.x = kc_pack2(f[8 * c + 0], f[8 * c + 1], T());
			u.y = kc_pack2(f[8 * c + 2], f[8 * c + 3], T());
			u.z = kc_pack2(f[8 * c + 4], f[8 * c + 5], T());
			u.w = kc_pack2(f[8 * c + 6], f[8 * c + 7], T());
			kc_st128(p + 8 * c, u);
		}
	}
}

/* v rounded to T and back (what a store then a load would give). */
static __device__ __forceinline__ float kc_round(float v, float)
{
	return v;
}
static __device__ __forceinline__ float kc_round(float v, __nv_bfloat16)
{
	return __bfloat162float(__float2bfloat16(v));
}
static __device__ __forceinline__ float kc_round(float v, __half)
{
	return __half2float(__float2half(v));
}

/* ---- row segments ---------------------------------------------------------
 * Segment s of a row covers elements [s*blockDim*W, (s+1)*blockDim*W).
 * VEC: thread t owns the W consecutive elements at t*W (the row length is a
 * multiple of W and every row pointer 16-byte aligned, checked on the host).
 * !VEC: thread t owns elements t + j*blockDim, j < W.  Elements past `len`
 * read as `fill` and are not stored. */
template <bool VEC, int W> static __device__ __forceinline__ int kc_seg_off(int seg, int j)
{
	int base = seg * (int) blockDim.x * W;
	return VEC ? base + (int) threadIdx.x * W + j
		   : base + j * (int) blockDim.x + (int) threadIdx.x;
}
template <bool VEC, int W, bool NC = false, typename T>
static __device__ __forceinline__ void kc_seg_ld(const T *row, int len, int seg, float (&f)[W],
						 float fill)
{
	if constexpr (VEC) {
		int o = kc_seg_off<VEC, W>(seg, 0);
		if (o < len) {
			kc_ldv<W, NC>(row + o, f);
		} else {
#pragma unroll
			for (int j = 0; j < W; j++)
				f[j] = fill;
		}
	} else {
#pragma unroll
		for (int j = 0; j < W; j++) {
			int o = kc_seg_off<VEC, W>(seg, j);
			f[j] = o < len ? kc_ld(row, o) : fill;
		}
	}
}
template <bool VEC, int W, typename T>
static __device__ __forceinline__ void kc_seg_st(T *row, int len, int seg, const float (&f)[W])
{
	if constexpr (VEC) {
		int o = kc_seg_off<VEC, W>(seg, 0);
		if (o < len)
			kc_stv<W>(row + o, f);
	} else {
#pragma unroll
		for (int j = 0; j < W; j++) {
			int o = kc_seg_off<VEC, W>(seg, j);
			if (o < len)
				kc_st(row, o, f[j]);
		}
	}
}

/* ---- host side ------------------------------------------------------------ */

static inline bool kc_aligned16(const void *p)
{
	return ((uintptr_t) p & 15u) == 0;
}

/* Leading elements to handle one at a time so that element `head` of every
 * array is 16-byte aligned, for arrays with the given base pointers and
 * element sizes (NULL pointers are ignored); w is the vector width in
 * elements (16 / the smallest element size).  -1 when no such head
 * exists (the arrays are misaligned differently): use the scalar path. */
static inline int kc_vec_head(int w, const void *const *ptrs, const int *sizes, int n)
{
	for (int h = 0; h < w; h++) {
		bool ok = true;
		for (int i = 0; ok && i < n; i++)
			if (ptrs[i] && ((uintptr_t) ptrs[i] + (uintptr_t) h * sizes[i]) % 16u)
				ok = false;
		if (ok)
			return h;
	}
	return -1;
}

/* Multiprocessors of the current device, cached (1 if the query fails,
 * which only makes grids smaller). */
#define KC_MAX_DEVICES 64
static inline int kc_sm_count(void)
{
	static int cache[KC_MAX_DEVICES];
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= KC_MAX_DEVICES) {
		(void) cudaGetLastError();
		dev = -1;
	}
	if (dev >= 0 && cache[dev] > 0)
		return cache[dev];
	int n = 0;
	if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev < 0 ? 0 : dev) !=
		    cudaSuccess ||
	    n <= 0) {
		(void) cudaGetLastError();
		return 1;
	}
	if (dev >= 0)
		cache[dev] = n; /* a benign race: every writer stores the same value */
	return n;
}

/* Resident threads per SM on sm_90. */
#define KC_SM_THREADS 2048

/* Grid for a grid-stride loop over `units` work items of `threads`-thread
 * blocks: one full wave of resident blocks at most, and never more than
 * KC_GRID_CAP (kc.h; the CPU emulation lowers it). */
static inline unsigned kc_grid_sm(size_t units, int threads)
{
	size_t need = (units + threads - 1) / threads;
	size_t wave = (size_t) kc_sm_count() * (KC_SM_THREADS / threads);
	size_t b = need < wave ? need : wave;
	if (b > KC_GRID_CAP)
		b = KC_GRID_CAP;
	return b ? (unsigned) b : 1u;
}

/* A kernel launch written in a header: tests/gpu/emu rewrites the
 * <<<>>> syntax of .cu files only, so headers launch through this. */
#ifdef KC_EMU
#define KC_LAUNCH(k, g, b, smem, s, ...) kc_emu_launch(kc_cfg(g, b, smem, s), k, __VA_ARGS__)
#else
#define KC_LAUNCH(k, g, b, smem, s, ...) k<<<g, b, smem, s>>>(__VA_ARGS__)
#endif

/* ---- elementwise driver ----------------------------------------------------
 * F is a functor with `template <int W> __device__ void run(size_t i) const`
 * that handles elements i .. i+W-1 of every array it holds (W > 1: each
 * array is 16-byte aligned at element i).  kc_ew_kernel<W> runs it over n
 * elements: elements [0, head) and the ragged tail one at a time, the body
 * W at a time, grid-stride. */
/* for (size_t i = global thread id; i < n; i += grid size) */
#define GRID_STRIDE(i, n)                                                        \
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t) gridDim.x * blockDim.x)

#define KC_EW_THREADS 256

template <int W, typename F>
__global__ void __launch_bounds__(KC_EW_THREADS) kc_ew_kernel(F f, size_t n, size_t head)
{
	size_t tid = blockIdx.x * (size_t) blockDim.x + threadIdx.x;
	size_t nth = (size_t) gridDim.x * blockDim.x;
	size_t h = head < n ? head : n;
	size_t nv = W > 1 ? (n - h) / W : 0;
	for (size_t v = tid; v < nv; v += nth)
		f.template run<W>(h + v * W);
	size_t t0 = h + nv * W, ns = h + (n - t0);
	for (size_t e = tid; e < ns; e += nth)
		f.template run<1>(e < h ? e : t0 + (e - h));
}

/* Launches f over n elements on s.  F::VW is the vector width (16 / the
 * smallest element size among its arrays); ptrs/sizes: every array's base
 * pointer and element size, so the vector path is taken only when one head
 * count aligns them all. */
template <typename F>
static int kc_ew_launch(cudaStream_t s, const F &f, size_t n, const void *const *ptrs,
			const int *sizes, int np)
{
	const int w = F::VW;
	if (n == 0)
		return 0;
	int head = kc_vec_head(w, ptrs, sizes, np);
	if (head >= 0 && n >= (size_t) head + (size_t) w) {
		unsigned g = kc_grid_sm((n - head) / w, KC_EW_THREADS);
		KC_LAUNCH((kc_ew_kernel<F::VW, F>), g, KC_EW_THREADS, 0, s, f, n, (size_t) head);
	} else {
		KC_LAUNCH((kc_ew_kernel<1, F>), kc_grid_sm(n, KC_EW_THREADS), KC_EW_THREADS, 0, s,
			  f, n, n);
	}
	return kc_check_launch();
}

/* Vector width for arrays of element types A and B: 16 bytes of the
 * smaller. */
template <typename A, typename B = A> struct kc_vw_s {
	static const int v = sizeof(A) < sizeof(B) ? KC_VN(A) : KC_VN(B);
};

/* f[0..4) = p[0..4) from shared memory, p 16-byte aligned (LDS.128). */
static __device__ __forceinline__ void kc_lds4(const float *p, float *f)
{
#ifdef KC_EMU
	kc_emu_ld16(f, p);
#else
	float4 v = *reinterpret_cast<const float4 *>(p);
	f[0] = v.x;
	f[1] = v.y;
	f[2] = v.z;
	f[3] = v.w;
#endif
}
