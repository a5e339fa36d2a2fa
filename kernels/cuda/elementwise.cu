/* kernels/cuda/kc_ops.cu — the small ops of the CUDA backend: cast, scale,
 * RoPE, SiLU/GELU/SwiGLU forward and backward, row softmax, embedding
 * forward/backward, fused softmax cross-entropy, and the paged KV-cache
 * write.
 *
 * All of them are memory-bound, so they are written for bandwidth (see
 * kc_vec.cuh): 16-byte loads and stores (4 f32 or 8 bf16/f16 per access)
 * whenever the arrays allow it, a scalar path for views at odd offsets and
 * odd lengths, grids sized from the SM count.
 *  - Elementwise ops (cast, scale, activations, SwiGLU) are functors run by
 *    kc_ew_kernel: one 16-byte vector per thread per grid-stride step.
 *  - RoPE: one thread per (token, group of KC_ROPE_HEADS heads, vector of
 *    pairs); the angle is formed and reduced mod 2 pi in f64 (pos * freq
 *    reaches 1e4 radians, where an f32 angle is off by ~1e-3), its sin/cos
 *    taken in f32 once and reused across the heads of the group.
 *  - Softmax and cross-entropy: one block per row (grid-stride over rows),
 *    ONE pass over the row for the statistics with an online max/sum
 *    (m, s) per thread, merged across the block; cross-entropy forward
 *    reads the row exactly once; softmax and the cross-entropy backward
 *    read it a second time to write (a row of 32k bf16 is 64 KiB, still in
 *    L2 for that second read).  Every thread re-reads only elements it owns,
 *    so outputs may alias inputs as kk.h allows.
 *  - Embedding forward is a vector gather of rows; the backward adds rows
 *    with float4 atomics (sm_90 red.global.add.v4.f32) when aligned.
 * All arithmetic is f32.  UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_vec.cuh"

#define GRID_STRIDE(i, n)                                                        \
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t) gridDim.x * blockDim.x)

static __device__ __forceinline__ float kc_sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

/* ---- cast / scale ------------------------------------------------------- */

template <typename TD, typename TS> struct kc_cast_op {
	static const int VW = kc_vw_s<TD, TS>::v;
	TD *dst;
	const TS *src;
	template <int W> __device__ __forceinline__ void run(size_t i) const
	{
		float f[W];
		kc_ldv<W>(src + i, f);
		kc_stv<W>(dst + i, f);
	}
};

template <typename TD>
static int kc_cast_to(cudaStream_t s, void *dst, kc_dtype src_dt, const void *src, size_t n)
{
	const void *p[2] = { dst, src };
	int sz[2] = { (int) sizeof(TD), (int) kc_dtype_size(src_dt) };
	switch (src_dt) {
	case KC_F32:
		return kc_ew_launch(s, kc_cast_op<TD, float>{ (TD *) dst, (const float *) src }, n,
				    p, sz, 2);
	case KC_BF16:
		return kc_ew_launch(
			s, kc_cast_op<TD, __nv_bfloat16>{ (TD *) dst, (const __nv_bfloat16 *) src },
			n, p, sz, 2);
	case KC_F16:
		return kc_ew_launch(s, kc_cast_op<TD, __half>{ (TD *) dst, (const __half *) src },
				    n, p, sz, 2);
	default:
		return -EOPNOTSUPP;
	}
}

extern "C" int kc_cast(cudaStream_t s, kc_dtype dst_dt, void *dst, kc_dtype src_dt, const void *src,
		       size_t n)
{
	if (n == 0)
		return 0;
	return KC_DISPATCH(dst_dt, kc_cast_to, s, dst, src_dt, src, n);
}

template <typename T> struct kc_scale_op {
	static const int VW = KC_VN(T);
	T *x;
	float scale;
	template <int W> __device__ __forceinline__ void run(size_t i) const
	{
		float f[W];
		kc_ldv<W>(x + i, f);
#pragma unroll
		for (int j = 0; j < W; j++)
			f[j] *= scale;
		kc_stv<W>(x + i, f);
	}
};

template <typename T> static int kc_scale_t(cudaStream_t s, void *x, float scale, size_t n)
{
	const void *p[1] = { x };
	int sz[1] = { (int) sizeof(T) };
	return kc_ew_launch(s, kc_scale_op<T>{ (T *) x, scale }, n, p, sz, 1);
}

extern "C" int kc_scale(cudaStream_t s, kc_dtype dt, size_t n, void *x, float scale)
{
	if (n == 0)
		return 0;
	return KC_DISPATCH(dt, kc_scale_t, s, x, scale, n);
}

extern "C" int kc_op_cast(kk_backend *be, kk_stream *st, kk_buffer *dst, const kk_buffer *src,
			  size_t count)
{
	return kc_cast(kc_stream(be, st), kc_dt(dst->dtype), dst->ptr, kc_dt(src->dtype), src->ptr,
		       count);
}

extern "C" int kc_op_scale(kk_backend *be, kk_stream *st, kk_buffer *x, float scale, size_t count)
{
	return kc_scale(kc_stream(be, st), kc_dt(x->dtype), count, x->ptr, scale);
}

/* ---- RoPE --------------------------------------------------------------- */

/* Heads that share one sin/cos computation per thread. */
#define KC_ROPE_HEADS 4

/* x [tokens, n_heads, head_dim].  P pairs per thread and head: HALF mode
 * rotates (x[i], x[i + rot/2]) for P consecutive i (two P-element accesses,
 * vectors when VEC), interleaved mode (x[2i], x[2i+1]) for P consecutive i
 * (one 2P-element access).  Scalar paths use P == 1. */
template <typename T, int P, bool HALF, bool VEC>
__global__ void __launch_bounds__(KC_EW_THREADS)
	kc_rope_kernel(T *x, const int32_t *pos, int64_t tokens, int n_heads, int head_dim, int rot,
		       double log2_theta, float sign)
{
	const int half = rot / 2, units = half / P;
	const int hgroups = (n_heads + KC_ROPE_HEADS - 1) / KC_ROPE_HEADS;
	size_t items = (size_t) tokens * hgroups * units;
	GRID_STRIDE(it, items)
	{
		int u = (int) (it % units);
		size_t r = it / units;
		int hg = (int) (r % hgroups);
		size_t t = r / hgroups;
		double p = (double) pos[t];
		float c[P], sn[P];
#pragma unroll
		for (int k = 0; k < P; k++) {
			int i = u * P + k;
			/* theta^(-2i/rot) as exp2 of an f64 product: cheaper than pow. */
			double ang = p * exp2(-2.0 * i / rot * log2_theta);
			/* Reduce to [-pi, pi] in f64, then f32 sin/cos of pi * a with
			 * a in [-1, 1] (sincospif: no slow-path argument reduction,
			 * no local-memory frame). */
			ang -= 6.283185307179586 * rint(ang * 0.15915494309189535);
			float a = (float) (ang * 0.3183098861837907), sa, ca;
			sincospif(a, &sa, &ca);
			c[k] = ca;
			sn[k] = sign * sa;
		}
		int h1 = (hg + 1) * KC_ROPE_HEADS < n_heads ? (hg + 1) * KC_ROPE_HEADS : n_heads;
		for (int h = hg * KC_ROPE_HEADS; h < h1; h++) {
			T *base = x + ((size_t) t * n_heads + h) * head_dim;
			if constexpr (HALF) {
				float a[P], b[P];
				T *pa = base + u * P, *pb = base + u * P + half;
				kc_ldv<P>(pa, a);
				kc_ldv<P>(pb, b);
#pragma unroll
				for (int k = 0; k < P; k++) {
					float a0 = a[k], b0 = b[k];
					a[k] = a0 * c[k] - b0 * sn[k];
					b[k] = a0 * sn[k] + b0 * c[k];
				}
				kc_stv<P>(pa, a);
				kc_stv<P>(pb, b);
			} else {
				float a[2 * P];
				T *pa = base + 2 * u * P;
				if constexpr (VEC) {
					kc_ldv<2 * P>(pa, a);
				} else {
#pragma unroll
					for (int k = 0; k < 2 * P; k++)
						a[k] = kc_ld(pa, k);
				}
#pragma unroll
				for (int k = 0; k < P; k++) {
					float a0 = a[2 * k], b0 = a[2 * k + 1];
					a[2 * k] = a0 * c[k] - b0 * sn[k];
					a[2 * k + 1] = a0 * sn[k] + b0 * c[k];
				}
				if constexpr (VEC) {
					kc_stv<2 * P>(pa, a);
				} else {
#pragma unroll
					for (int k = 0; k < 2 * P; k++)
						kc_st(pa, k, a[k]);
				}
			}
		}
	}
}

template <typename T, int P, bool HALF, bool VEC>
static void kc_rope_launch(cudaStream_t s, T *x, const int32_t *pos, int64_t tokens, int n_heads,
			   int head_dim, int rot, double log2_theta, float sign)
{
	size_t items =
		(size_t) tokens * ((n_heads + KC_ROPE_HEADS - 1) / KC_ROPE_HEADS) * (rot / 2 / P);
	kc_rope_kernel<T, P, HALF, VEC><<<kc_grid_sm(items, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
		x, pos, tokens, n_heads, head_dim, rot, log2_theta, sign);
}

template <typename T>
static int kc_rope_t(cudaStream_t s, void *xv, const int32_t *pos, int64_t tokens, int n_heads,
		     int head_dim, int rot, float theta, int half, int backward)
{
	size_t pairs = (size_t) tokens * n_heads * (rot / 2);
	if (pairs == 0)
		return 0;
	T *x = (T *) xv;
	const int W = KC_VN(T);
	float sign = backward ? -1.0f : 1.0f;
	double l2 = log2((double) theta);
	/* Vectors need every head (and, half-split, the second half) to start
	 * on a 16-byte boundary. */
	bool vec = kc_aligned16(x) && (head_dim * sizeof(T)) % 16 == 0;
	if (half) {
		if (vec && (rot / 2) % W == 0)
			kc_rope_launch<T, KC_VN(T), true, true>(s, x, pos, tokens, n_heads,
								head_dim, rot, l2, sign);
		else
			kc_rope_launch<T, 1, true, false>(s, x, pos, tokens, n_heads, head_dim, rot,
							  l2, sign);
	} else {
		if (vec && rot % W == 0)
			kc_rope_launch<T, KC_VN(T) / 2, false, true>(s, x, pos, tokens, n_heads,
								     head_dim, rot, l2, sign);
		else
			kc_rope_launch<T, 1, false, false>(s, x, pos, tokens, n_heads, head_dim,
							   rot, l2, sign);
	}
	return kc_check_launch();
}

extern "C" int kc_op_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions,
			  int64_t tokens, int n_heads, int head_dim, int rotary_dim, float theta,
			  kk_rope_mode mode, bool backward)
{
	int rot = rotary_dim > 0 ? rotary_dim : head_dim;
	return KC_DISPATCH(kc_dt(x->dtype), kc_rope_t, kc_stream(be, st), x->ptr,
			   (const int32_t *) positions->ptr, tokens, n_heads, head_dim, rot, theta,
			   mode == KK_ROPE_HALF, backward);
}

/* ---- activations -------------------------------------------------------- */

static __device__ __forceinline__ float kc_act_f(int gelu, float x)
{
	if (!gelu)
		return x * kc_sigmoid(x);
	const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
	return 0.5f * x * (1.0f + tanhf(k0 * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float kc_act_df(int gelu, float x)
{
	if (!gelu) {
		float sg = kc_sigmoid(x);
		return sg * (1.0f + x * (1.0f - sg));
	}
	const float k0 = 0.7978845608028654f;
	float u = k0 * (x + 0.044715f * x * x * x);
	float t = tanhf(u);
	return 0.5f * (1.0f + t) +
	       0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename T, int GELU, int BWD> struct kc_act_op {
	static const int VW = KC_VN(T);
	T *out;
	const T *x, *dy;
	template <int W> __device__ __forceinline__ void run(size_t i) const
	{
		float a[W], d[W];
		kc_ldv<W>(x + i, a);
		if (BWD)
			kc_ldv<W>(dy + i, d);
#pragma unroll
		for (int j = 0; j < W; j++)
			a[j] = BWD ? kc_act_df(GELU, a[j]) * d[j] : kc_act_f(GELU, a[j]);
		kc_stv<W>(out + i, a);
	}
};

template <typename T, int GELU, int BWD>
static int kc_act_g(cudaStream_t s, void *out, const void *x, const void *dy, size_t n)
{
	const void *p[3] = { out, x, dy };
	int sz[3] = { (int) sizeof(T), (int) sizeof(T), (int) sizeof(T) };
	return kc_ew_launch(s, kc_act_op<T, GELU, BWD>{ (T *) out, (const T *) x, (const T *) dy },
			    n, p, sz, 3);
}

template <typename T>
static int kc_act_t(cudaStream_t s, int gelu, int bwd, void *out, const void *x, const void *dy,
		    size_t n)
{
	if (n == 0)
		return 0;
	if (gelu)
		return bwd ? kc_act_g<T, 1, 1>(s, out, x, dy, n)
			   : kc_act_g<T, 1, 0>(s, out, x, dy, n);
	return bwd ? kc_act_g<T, 0, 1>(s, out, x, dy, n) : kc_act_g<T, 0, 0>(s, out, x, dy, n);
}

extern "C" int kc_op_act_fwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *y,
			     const kk_buffer *x, size_t n)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_act_t, kc_stream(be, st), act == KK_ACT_GELU, 0,
			   y->ptr, x->ptr, (const void *) NULL, n);
}

extern "C" int kc_op_act_bwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *dx,
			     const kk_buffer *dy, const kk_buffer *x, size_t n)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_act_t, kc_stream(be, st), act == KK_ACT_GELU, 1,
			   dx->ptr, x->ptr, dy->ptr, n);
}

/* y = silu(g) * u; or, with dy, dg and du. */
template <typename T, int BWD> struct kc_swiglu_op {
	static const int VW = KC_VN(T);
	T *y_or_dg, *du;
	const T *g, *u, *dy;
	template <int W> __device__ __forceinline__ void run(size_t i) const
	{
		float gv[W], uv[W], d[W];
		kc_ldv<W>(g + i, gv);
		kc_ldv<W>(u + i, uv);
		if (BWD)
			kc_ldv<W>(dy + i, d);
#pragma unroll
		for (int j = 0; j < W; j++) {
			float sg = kc_sigmoid(gv[j]);
			if (BWD) {
				float a = d[j] * uv[j] * sg * (1.0f + gv[j] * (1.0f - sg));
				uv[j] = d[j] * gv[j] * sg;
				gv[j] = a;
			} else {
				gv[j] = gv[j] * sg * uv[j];
			}
		}
		kc_stv<W>(y_or_dg + i, gv);
		if (BWD)
			kc_stv<W>(du + i, uv);
	}
};

template <typename T>
static int kc_swiglu_t(cudaStream_t s, void *y_or_dg, void *du, const void *g, const void *u,
		       const void *dy, size_t n)
{
	if (n == 0)
		return 0;
	const void *p[5] = { y_or_dg, du, g, u, dy };
	int e = (int) sizeof(T), sz[5] = { e, e, e, e, e };
	if (dy)
		return kc_ew_launch(s,
				    kc_swiglu_op<T, 1>{ (T *) y_or_dg, (T *) du, (const T *) g,
							(const T *) u, (const T *) dy },
				    n, p, sz, 5);
	return kc_ew_launch(
		s, kc_swiglu_op<T, 0>{ (T *) y_or_dg, NULL, (const T *) g, (const T *) u, NULL }, n,
		p, sz, 5);
}

extern "C" int kc_op_swiglu_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *gate,
				const kk_buffer *up, size_t n)
{
	return KC_DISPATCH(kc_dt(gate->dtype), kc_swiglu_t, kc_stream(be, st), y->ptr,
			   (void *) NULL, gate->ptr, up->ptr, (const void *) NULL, n);
}

extern "C" int kc_op_swiglu_bwd(kk_backend *be, kk_stream *st, kk_buffer *dgate, kk_buffer *dup,
				const kk_buffer *dy, const kk_buffer *gate, const kk_buffer *up,
				size_t n)
{
	return KC_DISPATCH(kc_dt(gate->dtype), kc_swiglu_t, kc_stream(be, st), dgate->ptr, dup->ptr,
			   gate->ptr, up->ptr, dy->ptr, n);
}

/* ---- softmax and cross-entropy (one block per row) ---------------------- */

/* Segments of a row each thread loads before using any (loads in flight). */
#define KC_SOFT_UNROLL	4
#define KC_SOFT_THREADS 256

/* Merges the online softmax state (m, s) = (max, sum of exp(x - max)) of
 * (m2, s2) into (m, s). */
static __device__ __forceinline__ void kc_ms_merge(float &m, float &s, float m2, float s2)
{
	float mn = fmaxf(m, m2);
	if (mn == -INFINITY)
		return; /* both empty */
	s = s * expf(m - mn) + s2 * expf(m2 - mn);
	m = mn;
}
/* Block-wide merge; every thread gets the row's (m, s).  sh holds 66 floats. */
static __device__ __forceinline__ void kc_block_ms(float &m, float &s, float *sh)
{
	for (int o = 16; o > 0; o >>= 1) {
		float m2 = __shfl_xor_sync(0xffffffffu, m, o);
		float s2 = __shfl_xor_sync(0xffffffffu, s, o);
		kc_ms_merge(m, s, m2, s2);
	}
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) {
		sh[wid] = m;
		sh[32 + wid] = s;
	}
	__syncthreads();
	if (wid == 0) {
		float mm = lane < nw ? sh[lane] : -INFINITY, ss = lane < nw ? sh[32 + lane] : 0.0f;
		for (int o = 16; o > 0; o >>= 1) {
			float m2 = __shfl_xor_sync(0xffffffffu, mm, o);
			float s2 = __shfl_xor_sync(0xffffffffu, ss, o);
			kc_ms_merge(mm, ss, m2, s2);
		}
		if (lane == 0) {
			sh[64] = mm;
			sh[65] = ss;
		}
	}
	__syncthreads();
	m = sh[64];
	s = sh[65];
	__syncthreads();
}

/* mode 0: y = softmax(x).  mode 1: loss[r] (cross-entropy forward).
 * mode 2: dlogits = (softmax - onehot) * scale (backward). */
template <typename T, bool VEC>
__global__ void __launch_bounds__(KC_SOFT_THREADS)
	kc_rowsoft_kernel(int mode, T *y, float *loss, const T *x, const int32_t *tgt, int64_t rows,
			  int64_t cols, float scale)
{
	const int W = VEC ? KC_VN(T) : 1;
	__shared__ float sh[66];
	const int n = (int) cols; /* < 2^31, checked by the launcher */
	const int segs = (n + (int) blockDim.x * W - 1) / ((int) blockDim.x * W);
	for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const T *xr = x + (size_t) r * cols;
		T *yr = y ? y + (size_t) r * cols : NULL;
		int t = tgt ? tgt[r] : 0;
		if (mode == 2 && t < 0) {
			float z[W];
#pragma unroll
			for (int j = 0; j < W; j++)
				z[j] = 0.0f;
			for (int sg = 0; sg < segs; sg++)
				kc_seg_st<VEC, W>(yr, n, sg, z);
			continue;
		}
		if (mode == 1 && (t < 0 || t >= cols)) {
			/* Ignored target: loss 0.  Out of range: NaN, so it cannot
			 * pass unnoticed (the cpu backend returns -ERANGE). */
			if (threadIdx.x == 0)
				loss[r] = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
			continue;
		}
		/* One pass: online (max, sum) over this thread's elements. */
		float m = -INFINITY, s = 0.0f;
		for (int s0 = 0; s0 < segs; s0 += KC_SOFT_UNROLL) {
			float v[KC_SOFT_UNROLL][W];
#pragma unroll
			for (int u = 0; u < KC_SOFT_UNROLL; u++)
				kc_seg_ld<VEC, W>(xr, n, s0 + u, v[u], -INFINITY);
			float cm = m;
#pragma unroll
			for (int u = 0; u < KC_SOFT_UNROLL; u++)
#pragma unroll
				for (int j = 0; j < W; j++)
					cm = fmaxf(cm, v[u][j]);
			if (cm == -INFINITY)
				continue;
			float cs = s * expf(m - cm);
#pragma unroll
			for (int u = 0; u < KC_SOFT_UNROLL; u++)
#pragma unroll
				for (int j = 0; j < W; j++)
					cs += expf(v[u][j] - cm);
			m = cm;
			s = cs;
		}
		kc_block_ms(m, s, sh);
		if (mode == 1) {
			if (threadIdx.x == 0)
				loss[r] = m + logf(s) - kc_ld(xr, (size_t) t);
			continue;
		}
		float inv = 1.0f / s;
		for (int sg = 0; sg < segs; sg++) {
			float v[W];
			kc_seg_ld<VEC, W>(xr, n, sg, v, -INFINITY);
#pragma unroll
			for (int j = 0; j < W; j++) {
				float p = expf(v[j] - m) * inv;
				if (mode == 2)
					p = (p - (kc_seg_off<VEC, W>(sg, j) == t ? 1.0f : 0.0f)) *
					    scale;
				v[j] = p;
			}
			kc_seg_st<VEC, W>(yr, n, sg, v);
		}
	}
}

template <typename T>
static int kc_rowsoft_t(cudaStream_t s, int mode, void *y, float *loss, const void *x,
			const int32_t *tgt, int64_t rows, int64_t cols, float scale)
{
	if (rows <= 0 || cols <= 0)
		return 0;
	if (cols > INT32_MAX / 2)
		return -EOPNOTSUPP; /* rows are indexed with 32-bit offsets */
	const int W = KC_VN(T);
	/* Vectors when every row starts on a 16-byte boundary. */
	bool vec = cols % W == 0 && kc_aligned16(x) && (!y || kc_aligned16(y));
	int64_t per = vec ? (cols / W + KC_SOFT_UNROLL - 1) / KC_SOFT_UNROLL
			  : (cols + KC_SOFT_UNROLL - 1) / KC_SOFT_UNROLL;
	int threads = per >= KC_SOFT_THREADS ? KC_SOFT_THREADS : (int) ((per + 31) / 32 * 32);
	unsigned grid = kc_grid_sm((size_t) rows * threads, threads);
	if (vec)
		kc_rowsoft_kernel<T, true><<<grid, threads, 0, s>>>(
			mode, (T *) y, loss, (const T *) x, tgt, rows, cols, scale);
	else
		kc_rowsoft_kernel<T, false><<<grid, threads, 0, s>>>(
			mode, (T *) y, loss, (const T *) x, tgt, rows, cols, scale);
	return kc_check_launch();
}

extern "C" int kc_op_softmax(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x,
			     int64_t rows, int64_t cols)
{
	return KC_DISPATCH(kc_dt(x->dtype), kc_rowsoft_t, kc_stream(be, st), 0, y->ptr,
			   (float *) NULL, x->ptr, (const int32_t *) NULL, rows, cols, 1.0f);
}

extern "C" int kc_op_cross_entropy_fwd(kk_backend *be, kk_stream *st, kk_buffer *losses,
				       const kk_buffer *logits, const kk_buffer *targets,
				       int64_t tokens, int64_t vocab)
{
	return KC_DISPATCH(kc_dt(logits->dtype), kc_rowsoft_t, kc_stream(be, st), 1, (void *) NULL,
			   (float *) losses->ptr, logits->ptr, (const int32_t *) targets->ptr,
			   tokens, vocab, 1.0f);
}

extern "C" int kc_op_cross_entropy_bwd(kk_backend *be, kk_stream *st, kk_buffer *dlogits,
				       const kk_buffer *logits, const kk_buffer *targets,
				       int64_t tokens, int64_t vocab, float grad_scale)
{
	return KC_DISPATCH(kc_dt(logits->dtype), kc_rowsoft_t, kc_stream(be, st), 2, dlogits->ptr,
			   (float *) NULL, logits->ptr, (const int32_t *) targets->ptr, tokens,
			   vocab, grad_scale);
}

/* ---- embedding ---------------------------------------------------------- */

/* One thread per (token, W-element chunk of the row). */
template <typename T, int W>
__global__ void __launch_bounds__(KC_EW_THREADS)
	kc_embed_fwd_kernel(T *out, const T *table, const int32_t *ids, int64_t tokens,
			    int64_t vocab, int64_t dim)
{
	int64_t chunks = dim / W;
	size_t n = (size_t) tokens * chunks;
	GRID_STRIDE(i, n)
	{
		size_t t = i / chunks, j = (i % chunks) * W;
		int32_t id = ids[t];
		float f[W];
		/* An id outside the table gives a zero row (kk.h). */
		if (id >= 0 && id < vocab) {
			kc_ldv<W, true>(table + (size_t) id * dim + j, f);
		} else {
#pragma unroll
			for (int e = 0; e < W; e++)
				f[e] = 0.0f;
		}
		kc_stv<W>(out + t * dim + j, f);
	}
}

template <typename T, int W>
__global__ void __launch_bounds__(KC_EW_THREADS)
	kc_embed_bwd_kernel(float *dtable, const T *dout, const int32_t *ids, int64_t tokens,
			    int64_t vocab, int64_t dim)
{
	int64_t chunks = dim / W;
	size_t n = (size_t) tokens * chunks;
	GRID_STRIDE(i, n)
	{
		size_t t = i / chunks, j = (i % chunks) * W;
		int32_t id = ids[t];
		if (id < 0 || id >= vocab)
			continue;
		float f[W];
		kc_ldv<W>(dout + t * dim + j, f);
		float *d = dtable + (size_t) id * dim + j;
		if constexpr (W == 1) {
			atomicAdd(d, f[0]);
		} else {
#pragma unroll
			for (int c = 0; c < W; c += 4)
				atomicAdd((float4 *) (d + c),
					  make_float4(f[c], f[c + 1], f[c + 2], f[c + 3]));
		}
	}
}

template <typename T>
static int kc_embed_t(cudaStream_t s, int bwd, void *out, const void *in, const int32_t *ids,
		      int64_t tokens, int64_t vocab, int64_t dim)
{
	size_t n = (size_t) tokens * dim;
	if (n == 0)
		return 0;
	const int W = KC_VN(T);
	if (bwd) {
		/* float4 atomics: rows of dtable and dout 16-byte aligned, W | dim. */
		bool vec = dim % W == 0 && kc_aligned16(out) && kc_aligned16(in) &&
			   (dim * sizeof(T)) % 16 == 0;
		if (vec)
			kc_embed_bwd_kernel<T, W>
				<<<kc_grid_sm(n / W, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
					(float *) out, (const T *) in, ids, tokens, vocab, dim);
		else
			kc_embed_bwd_kernel<T, 1>
				<<<kc_grid_sm(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
					(float *) out, (const T *) in, ids, tokens, vocab, dim);
	} else {
		bool vec = dim % W == 0 && kc_aligned16(out) && kc_aligned16(in);
		if (vec)
			kc_embed_fwd_kernel<T, W>
				<<<kc_grid_sm(n / W, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
					(T *) out, (const T *) in, ids, tokens, vocab, dim);
		else
			kc_embed_fwd_kernel<T, 1>
				<<<kc_grid_sm(n, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
					(T *) out, (const T *) in, ids, tokens, vocab, dim);
	}
	return kc_check_launch();
}

extern "C" int kc_op_embedding_fwd(kk_backend *be, kk_stream *st, kk_buffer *out,
				   const kk_buffer *table, const kk_buffer *ids, int64_t tokens,
				   int64_t vocab, int64_t dim)
{
	return KC_DISPATCH(kc_dt(table->dtype), kc_embed_t, kc_stream(be, st), 0, out->ptr,
			   table->ptr, (const int32_t *) ids->ptr, tokens, vocab, dim);
}

extern "C" int kc_op_embedding_bwd(kk_backend *be, kk_stream *st, kk_buffer *dtable,
				   const kk_buffer *dout, const kk_buffer *ids, int64_t tokens,
				   int64_t vocab, int64_t dim)
{
	return KC_DISPATCH(kc_dt(dout->dtype), kc_embed_t, kc_stream(be, st), 1, dtable->ptr,
			   dout->ptr, (const int32_t *) ids->ptr, tokens, vocab, dim);
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
