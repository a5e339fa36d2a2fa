/* kernels/kk/cpu/optim.c — the cpu backend's optimizer ops: AdamW (f32
 * master weights and moments, optional low-precision copy of the params)
 * and the global gradient norm (sums of squares in double, per chunk, added
 * in chunk order so the result does not depend on thread timing). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

/* ---- AdamW and gradient norm ------------------------------------------- */

struct adamw_ctx {
	float *master, *m, *v;
	kk_buffer *params;
	const kk_buffer *grads;
	const kk_adamw_params *p;
	float bc1, bc2, gscale;
};

static int adamw_range(void *ptr, int64_t b, int64_t e, int chunk)
{
	struct adamw_ctx *c = ptr;
	const kk_adamw_params *p = c->p;
	if (c->grads->dtype == KK_F32) { /* the vector loop of simd.c */
		const float k[8] = { c->gscale, p->beta1, p->beta2, p->lr,
				     c->bc1,	c->bc2,	  p->eps,   p->weight_decay };
		kk__adamw_f32(c->master + b, c->m + b, c->v + b, (const float *) c->grads->ptr + b,
			      (size_t) (e - b), k);
		if (c->params)
			kk__row_store(c->params->ptr, c->params->dtype, (size_t) b, c->master + b,
				      (size_t) (e - b));
		return 0;
	}
	for (int64_t i = b; i < e; i++) {
		float g = LD(c->grads, i) * c->gscale;
		float m = p->beta1 * c->m[i] + (1.0f - p->beta1) * g;
		float v = p->beta2 * c->v[i] + (1.0f - p->beta2) * g * g;
		float w = c->master[i];
		c->m[i] = m;
		c->v[i] = v;
		w -= p->lr * ((m / c->bc1) / (sqrtf(v / c->bc2) + p->eps) + p->weight_decay * w);
		c->master[i] = w;
		if (c->params)
			ST(c->params, i, w);
	}
	return 0;
}

int kk__cpu_adamw(kk_backend *be, kk_stream *st, kk_buffer *master, kk_buffer *params,
		  const kk_buffer *grads, kk_buffer *m, kk_buffer *v, size_t n,
		  const kk_adamw_params *p)
{
	struct adamw_ctx c = {
		.master = master->ptr,
		.m = m->ptr,
		.v = v->ptr,
		.params = params,
		.grads = grads,
		.p = p,
		.bc1 = (float) (1.0 - pow(p->beta1, (double) p->step)),
		.bc2 = (float) (1.0 - pow(p->beta2, (double) p->step)),
		.gscale = p->grad_scale != 0 ? p->grad_scale : 1.0f,
	};
	return kk__parallel_for((int64_t) n, 20, adamw_range, &c);
}

struct sumsq_ctx {
	const kk_buffer *x;
	double part[KK_CPU_CHUNKS_MAX];
};

static int sumsq_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct sumsq_ctx *c = p;
	double s = 0;
	if (c->x->dtype == KK_F32) {
		c->part[chunk] = kk__sumsq((const float *) c->x->ptr + b, 0, (size_t) (e - b));
		return 0;
	}
	for (int64_t i = b; i < e; i++) {
		float v = LD(c->x, i);
		s += (double) v * v;
	}
	c->part[chunk] = s;
	return 0;
}

int kk__cpu_grad_norm(kk_backend *be, kk_stream *st, kk_buffer *out, kk_buffer *const *grads,
		      size_t n_bufs)
{
	double total = 0;
	for (size_t b = 0; b < n_bufs; b++) {
		struct sumsq_ctx c = { .x = grads[b] };
		int64_t n = (int64_t) grads[b]->count;
		int chunks = kk__parallel_chunks(n, 4), r;
		r = kk__parallel_for(n, 4, sumsq_range, &c);
		if (r < 0)
			return r;
		for (int i = 0; i < chunks; i++)
			total += c.part[i];
	}
	((float *) out->ptr)[0] = (float) sqrt(total);
	return 0;
}
