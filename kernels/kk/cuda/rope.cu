/* kernels/kk/cuda/rope.cu — rotary position embedding on the CUDA backend, in
 * place: one thread per (token, group of KC_ROPE_HEADS heads, vector of
 * pairs); the angle pos * theta^(-2i/rot) (divided by the pair's divisor
 * when scaled RoPE passes a table) is formed and reduced mod 2 pi in f64
 * (pos * freq reaches 1e4 radians, where an f32 angle is off by ~1e-3),
 * its sin/cos taken in f32 once and reused across the heads of the group.
 * 16-byte accesses where the rows allow (kc_vec.cuh).  UNVERIFIED on a
 * GPU (the divisor path ran on the CUDA emulator, tests/gpu/emu). */
#include <errno.h>
#include <math.h>

#include "kc.h"
#include "kc_vec.cuh"

/* ---- RoPE --------------------------------------------------------------- */

/* Heads that share one sin/cos computation per thread. */
#define KC_ROPE_HEADS 4

/* x [tokens, n_heads, head_dim].  P pairs per thread and head: HALF mode
 * rotates (x[i], x[i + rot/2]) for P consecutive i (two P-element accesses,
 * vectors when VEC), interleaved mode (x[2i], x[2i+1]) for P consecutive i
 * (one 2P-element access).  Scalar paths use P == 1. */
template <typename T, int P, bool HALF, bool VEC, bool DIV>
__global__ void __launch_bounds__(KC_EW_THREADS)
	kc_rope_kernel(T *x, const int32_t *pos, const float *div, int64_t tokens, int n_heads,
		       int head_dim, int rot, double log2_theta, float sign)
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
			if constexpr (DIV)
				ang /= (double) div[i];
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

/* Plain RoPE (div NULL) runs the kernel without the divisor load: the
 * code and registers it had before scaled RoPE existed. */
template <typename T, int P, bool HALF, bool VEC>
static void kc_rope_launch(cudaStream_t s, T *x, const int32_t *pos, const float *div,
			   int64_t tokens, int n_heads, int head_dim, int rot, double log2_theta,
			   float sign)
{
	size_t items =
		(size_t) tokens * ((n_heads + KC_ROPE_HEADS - 1) / KC_ROPE_HEADS) * (rot / 2 / P);
	if (div)
		kc_rope_kernel<T, P, HALF, VEC, true>
			<<<kc_grid_sm(items, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
				x, pos, div, tokens, n_heads, head_dim, rot, log2_theta, sign);
	else
		kc_rope_kernel<T, P, HALF, VEC, false>
			<<<kc_grid_sm(items, KC_EW_THREADS), KC_EW_THREADS, 0, s>>>(
				x, pos, div, tokens, n_heads, head_dim, rot, log2_theta, sign);
}

template <typename T>
static int kc_rope_t(cudaStream_t s, void *xv, const int32_t *pos, const float *div, int64_t tokens,
		     int n_heads, int head_dim, int rot, float theta, int half, int backward)
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
			kc_rope_launch<T, KC_VN(T), true, true>(s, x, pos, div, tokens, n_heads,
								head_dim, rot, l2, sign);
		else
			kc_rope_launch<T, 1, true, false>(s, x, pos, div, tokens, n_heads, head_dim,
							  rot, l2, sign);
	} else {
		if (vec && rot % W == 0)
			kc_rope_launch<T, KC_VN(T) / 2, false, true>(
				s, x, pos, div, tokens, n_heads, head_dim, rot, l2, sign);
		else
			kc_rope_launch<T, 1, false, false>(s, x, pos, div, tokens, n_heads,
							   head_dim, rot, l2, sign);
	}
	return kc_check_launch();
}

extern "C" int kc_op_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions,
			  int64_t tokens, int n_heads, int head_dim, int rotary_dim, float theta,
			  const kk_buffer *freq_div, kk_rope_mode mode, bool backward)
{
	int rot = rotary_dim > 0 ? rotary_dim : head_dim;
	return KC_DISPATCH(kc_dt(x->dtype), kc_rope_t, kc_stream(be, st), x->ptr,
			   (const int32_t *) positions->ptr,
			   freq_div ? (const float *) freq_div->ptr : (const float *) NULL, tokens,
			   n_heads, head_dim, rot, theta, mode == KK_ROPE_HALF, backward);
}
