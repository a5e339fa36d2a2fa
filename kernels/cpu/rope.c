/* kernels/cpu/rope.c — the cpu backend's rotary position embedding
 * (interleaved or half-split pairs, partial rotary dims, forward and
 * backward), in place, one token per work item. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

/* ---- RoPE -------------------------------------------------------------- */

struct rope_ctx {
	kk_buffer *x;
	const int32_t *pos;
	int n_heads, head_dim, rot;
	double theta;
	kk_rope_mode mode;
	bool backward;
};

static int rope_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct rope_ctx *c = p;
	int half = c->rot / 2;
	for (int64_t t = b; t < e; t++) {
		for (int i = 0; i < half; i++) {
			double ang = c->pos[t] * pow(c->theta, -2.0 * i / c->rot);
			float cs = (float) cos(ang), sn = (float) sin(ang);
			if (c->backward)
				sn = -sn;
			for (int h = 0; h < c->n_heads; h++) {
				size_t base = ((size_t) t * c->n_heads + h) * c->head_dim;
				size_t ia =
					c->mode == KK_ROPE_INTERLEAVED ? base + 2 * i : base + i;
				size_t ib = c->mode == KK_ROPE_INTERLEAVED ? ia + 1 : ia + half;
				float a = LD(c->x, ia), bb = LD(c->x, ib);
				ST(c->x, ia, a * cs - bb * sn);
				ST(c->x, ib, a * sn + bb * cs);
			}
		}
	}
	return 0;
}

int kk__cpu_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions,
		 int64_t tokens, int n_heads, int head_dim, int rotary_dim, float theta,
		 kk_rope_mode mode, bool backward)
{
	struct rope_ctx c = { x,	  positions->ptr, n_heads, head_dim,
			      rotary_dim, theta,	  mode,	   backward };
	return kk__parallel_for(tokens, (double) n_heads * head_dim * 4, rope_range, &c);
}
