/* kernels/kk/cuda/elementwise.cu — the elementwise ops of the CUDA backend:
 * cast, scale, SiLU/GELU forward and backward, SwiGLU forward and backward.
 *
 * All of them are memory-bound functors run by kc_ew_kernel (kc_vec.cuh):
 * one 16-byte vector per thread per grid-stride step (4 f32 or 8 bf16/f16
 * per access) whenever the arrays allow it, a scalar path for views at odd
 * offsets and odd lengths, grids sized from the SM count.
 * All arithmetic is f32.  UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_vec.cuh"

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
