/* kernels/kk/cpu/elementwise.c — the cpu backend's elementwise ops: cast,
 * scale, SiLU/GELU forward/backward and SwiGLU forward/backward, all run by
 * one range function over kk__parallel_for (widen to f32, compute, round
 * once on store). */
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

/* ---- elementwise ------------------------------------------------------- */

struct ew_ctx {
	int kind;
	kk_act act;
	float scale;
	kk_buffer *o0, *o1;
	const kk_buffer *i0, *i1, *i2;
};

enum { EW_CAST, EW_SCALE, EW_ACT_FWD, EW_ACT_BWD, EW_SWIGLU_FWD, EW_SWIGLU_BWD };

static bool all_f32(const kk_buffer *const *b, int n)
{
	for (int i = 0; i < n; i++)
		if (b[i]->dtype != KK_F32)
			return false;
	return true;
}

static int ew_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct ew_ctx *c = p;
	/* SwiGLU on f32 (training's FFN): the 16-lane loops of simd.c, where
	 * libm's expf per element was most of the cost (issue 15). */
	if (c->kind == EW_SCALE && c->o0->dtype == KK_F32) {
		kk__scal((float *) c->o0->ptr + b, c->scale, (size_t) (e - b));
		return 0;
	}
	if (c->kind == EW_SWIGLU_FWD && all_f32((const kk_buffer *[]){ c->o0, c->i0, c->i1 }, 3)) {
		kk__swiglu_f32((float *) c->o0->ptr + b, (const float *) c->i0->ptr + b,
			       (const float *) c->i1->ptr + b, (size_t) (e - b));
		return 0;
	}
	if (c->kind == EW_SWIGLU_BWD &&
	    all_f32((const kk_buffer *[]){ c->o0, c->o1, c->i0, c->i1, c->i2 }, 5)) {
		kk__swiglu_bwd_f32((float *) c->o0->ptr + b, (float *) c->o1->ptr + b,
				   (const float *) c->i0->ptr + b, (const float *) c->i1->ptr + b,
				   (const float *) c->i2->ptr + b, (size_t) (e - b));
		return 0;
	}
	for (int64_t i = b; i < e; i++) {
		switch (c->kind) {
		case EW_CAST:
			ST(c->o0, i, LD(c->i0, i));
			break;
		case EW_SCALE:
			ST(c->o0, i, LD(c->o0, i) * c->scale);
			break;
		case EW_ACT_FWD: {
			float x = LD(c->i0, i);
			ST(c->o0, i, c->act == KK_ACT_SILU ? kk__silu(x) : kk__gelu(x));
			break;
		}
		case EW_ACT_BWD: {
			float x = LD(c->i1, i), dy = LD(c->i0, i);
			ST(c->o0, i,
			   dy * (c->act == KK_ACT_SILU ? kk__silu_grad(x) : kk__gelu_grad(x)));
			break;
		}
		case EW_SWIGLU_FWD: {
			float g = LD(c->i0, i), u = LD(c->i1, i);
			ST(c->o0, i, kk__silu(g) * u);
			break;
		}
		case EW_SWIGLU_BWD: {
			float dy = LD(c->i0, i), g = LD(c->i1, i), u = LD(c->i2, i);
			ST(c->o0, i, dy * u * kk__silu_grad(g));
			ST(c->o1, i, dy * kk__silu(g));
			break;
		}
		}
	}
	return 0;
}

#define EW_COST 8.0

int kk__cpu_cast(kk_backend *be, kk_stream *st, kk_buffer *dst, const kk_buffer *src, size_t count)
{
	struct ew_ctx c = { .kind = EW_CAST, .o0 = dst, .i0 = src };
	return kk__parallel_for((int64_t) count, EW_COST, ew_range, &c);
}

int kk__cpu_scale(kk_backend *be, kk_stream *st, kk_buffer *x, float scale, size_t count)
{
	struct ew_ctx c = { .kind = EW_SCALE, .o0 = x, .scale = scale };
	return kk__parallel_for((int64_t) count, EW_COST, ew_range, &c);
}

int kk__cpu_act_fwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *y, const kk_buffer *x,
		    size_t n)
{
	struct ew_ctx c = { .kind = EW_ACT_FWD, .act = act, .o0 = y, .i0 = x };
	return kk__parallel_for((int64_t) n, EW_COST * 4, ew_range, &c);
}

int kk__cpu_act_bwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *dx, const kk_buffer *dy,
		    const kk_buffer *x, size_t n)
{
	struct ew_ctx c = { .kind = EW_ACT_BWD, .act = act, .o0 = dx, .i0 = dy, .i1 = x };
	return kk__parallel_for((int64_t) n, EW_COST * 4, ew_range, &c);
}

/* SwiGLU forward over bf16/f16 buffers, a block at a time: the block's
 * gate and up widened by the vector row conversions, the product rounded
 * once on the way back (the same values as ew_range's element-wise loop,
 * whose per-element conversions made this op 16 % of an f16 prefill). */
#define EW_BLOCK 256

static int swiglu_fwd_blocks(void *p, int64_t b, int64_t e, int chunk)
{
	struct ew_ctx *c = p;
	float g[EW_BLOCK], u[EW_BLOCK];
	for (int64_t i = b; i < e; i += EW_BLOCK) {
		size_t n = (size_t) MIN((int64_t) EW_BLOCK, e - i);
		kk__row_f32(g, c->i0->ptr, c->i0->dtype, (size_t) i, n);
		kk__row_f32(u, c->i1->ptr, c->i1->dtype, (size_t) i, n);
		for (size_t j = 0; j < n; j++)
			g[j] = kk__silu(g[j]) * u[j];
		kk__row_store(c->o0->ptr, c->o0->dtype, (size_t) i, g, n);
	}
	return 0;
}

int kk__cpu_swiglu_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *gate,
		       const kk_buffer *up, size_t n)
{
	struct ew_ctx c = { .kind = EW_SWIGLU_FWD, .o0 = y, .i0 = gate, .i1 = up };
	bool half = y->dtype != KK_F32 || gate->dtype != KK_F32 || up->dtype != KK_F32;
	return kk__parallel_for((int64_t) n, EW_COST * 4, half ? swiglu_fwd_blocks : ew_range, &c);
}

int kk__cpu_swiglu_bwd(kk_backend *be, kk_stream *st, kk_buffer *dgate, kk_buffer *dup,
		       const kk_buffer *dy, const kk_buffer *gate, const kk_buffer *up, size_t n)
{
	struct ew_ctx c = {
		.kind = EW_SWIGLU_BWD, .o0 = dgate, .o1 = dup, .i0 = dy, .i1 = gate, .i2 = up
	};
	return kk__parallel_for((int64_t) n, EW_COST * 4, ew_range, &c);
}
