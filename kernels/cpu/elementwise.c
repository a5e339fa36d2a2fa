/* kernels/cpu/ops.c — the cpu backend's row-wise and elementwise ops:
 * cast/scale, RMSNorm and LayerNorm (fused residual) forward/backward, RoPE,
 * SiLU/GELU/SwiGLU, softmax, embedding, fused softmax cross-entropy, AdamW
 * and the global gradient norm.
 *
 * Rows are spread over threads with kk__parallel_for; every row widens to
 * f32 (sums in double where a long reduction would lose digits) and rounds
 * once on store.  Parameter gradients are accumulated per chunk and then
 * summed in chunk order, so results do not depend on thread timing. */
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

static int ew_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct ew_ctx *c = p;
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

int kk__cpu_swiglu_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *gate,
		       const kk_buffer *up, size_t n)
{
	struct ew_ctx c = { .kind = EW_SWIGLU_FWD, .o0 = y, .i0 = gate, .i1 = up };
	return kk__parallel_for((int64_t) n, EW_COST * 4, ew_range, &c);
}

int kk__cpu_swiglu_bwd(kk_backend *be, kk_stream *st, kk_buffer *dgate, kk_buffer *dup,
		       const kk_buffer *dy, const kk_buffer *gate, const kk_buffer *up, size_t n)
{
	struct ew_ctx c = {
		.kind = EW_SWIGLU_BWD, .o0 = dgate, .o1 = dup, .i0 = dy, .i1 = gate, .i2 = up
	};
	return kk__parallel_for((int64_t) n, EW_COST * 4, ew_range, &c);
}

/* ---- normalization ----------------------------------------------------- */

struct norm_ctx {
	bool layer; /* LayerNorm, else RMSNorm */
	int64_t dim;
	float eps;
	kk_buffer *y, *residual_out, *mean, *rstd, *dx;
	const kk_buffer *x, *residual, *weight, *bias, *dy, *dresidual, *h;
	const kk_buffer *mean_in, *rstd_in;
	float *partial; /* [chunks][2][dim]: dweight, dbias partial sums */
};

static int norm_fwd_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct norm_ctx *c = p;
	int64_t dim = c->dim;
	_cleanup_free_ float *h = malloc(dim * sizeof(float)), *w = malloc(dim * sizeof(float));
	if (!h || !w)
		return -ENOMEM;
	kk__row_f32(w, c->weight->ptr, c->weight->dtype, 0, dim);

	for (int64_t r = b; r < e; r++) {
		size_t off = (size_t) r * dim;
		double s = 0, s2 = 0, mean = 0, rstd;
		kk__row_f32(h, c->x->ptr, c->x->dtype, off, dim);
		if (c->residual) {
			for (int64_t i = 0; i < dim; i++)
				h[i] += LD(c->residual, off + i);
			/* Normalize what the backward pass will see: h as stored. */
			if (c->x->dtype != KK_F32)
				for (int64_t i = 0; i < dim; i++)
					h[i] = kk__round(c->x->dtype, h[i]);
			if (c->residual_out)
				kk__row_store(c->residual_out->ptr, c->residual_out->dtype, off, h,
					      dim);
		} else if (c->residual_out)
			kk__row_store(c->residual_out->ptr, c->residual_out->dtype, off, h, dim);

		if (c->layer) {
			s = kk__sum(h, dim);
			mean = s / dim;
		}
		s2 = kk__sumsq(h, (float) mean, dim);
		rstd = 1.0 / sqrt(s2 / dim + c->eps);
		{
			float fm = (float) mean, fr = (float) rstd;
			for (int64_t i = 0; i < dim; i++)
				h[i] = (h[i] - fm) * fr * w[i];
			if (c->layer && c->bias)
				for (int64_t i = 0; i < dim; i++)
					h[i] += LD(c->bias, i);
		}
		kk__row_store(c->y->ptr, c->y->dtype, off, h, dim);
		if (c->mean)
			((float *) c->mean->ptr)[r] = (float) mean;
		if (c->rstd)
			((float *) c->rstd->ptr)[r] = (float) rstd;
	}
	return 0;
}

static int norm_bwd_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct norm_ctx *c = p;
	int64_t dim = c->dim;
	float *dw = c->partial ? c->partial + (size_t) chunk * 2 * dim : NULL;
	float *db = dw ? dw + dim : NULL;
	_cleanup_free_ float *buf = malloc(4 * dim * sizeof(float));
	float *h, *dy, *w, *dx;

	if (!buf)
		return -ENOMEM;
	h = buf, dy = buf + dim, w = buf + 2 * dim, dx = buf + 3 * dim;
	kk__row_f32(w, c->weight->ptr, c->weight->dtype, 0, dim);

	for (int64_t r = b; r < e; r++) {
		size_t off = (size_t) r * dim;
		float rstd = ((const float *) c->rstd_in->ptr)[r];
		float mean = c->layer ? ((const float *) c->mean_in->ptr)[r] : 0.0f;
		double s1 = 0, s2 = 0;

		kk__row_f32(h, c->h->ptr, c->h->dtype, off, dim);
		kk__row_f32(dy, c->dy->ptr, c->dy->dtype, off, dim);
		for (int64_t i = 0; i < dim; i++) {
			float xhat = (h[i] - mean) * rstd, g = dy[i] * w[i];
			s1 += g;
			s2 += (double) g * xhat;
			if (dw)
				dw[i] += dy[i] * xhat;
			if (db)
				db[i] += dy[i];
		}
		for (int64_t i = 0; i < dim; i++) {
			float xhat = (h[i] - mean) * rstd, g = dy[i] * w[i];
			/* RMSNorm: no mean term (xhat = h * rstd). */
			float v = c->layer ? rstd * (g - (float) (s1 / dim) -
						     xhat * (float) (s2 / dim))
					   : rstd * (g - xhat * (float) (s2 / dim));
			if (c->dresidual)
				v += LD(c->dresidual, off + i);
			dx[i] = v;
		}
		kk__row_store(c->dx->ptr, c->dx->dtype, off, dx, dim);
	}
	return 0;
}

static int norm_bwd(struct norm_ctx *c, int64_t rows, kk_buffer *dweight, kk_buffer *dbias)
{
	int chunks = kk__parallel_chunks(rows, (double) c->dim * 12);
	_cleanup_free_ float *partial = NULL;
	int r;

	if (dweight || dbias) {
		partial = calloc((size_t) chunks * 2 * c->dim, sizeof(float));
		if (!partial)
			return -ENOMEM;
		c->partial = partial;
	}
	r = kk__parallel_for(rows, (double) c->dim * 12, norm_bwd_range, c);
	if (r < 0)
		return r;
	for (int ch = 0; ch < chunks && partial; ch++)
		for (int64_t i = 0; i < c->dim; i++) {
			if (dweight)
				((float *) dweight->ptr)[i] +=
					partial[(size_t) ch * 2 * c->dim + i];
			if (dbias)
				((float *) dbias->ptr)[i] +=
					partial[(size_t) ch * 2 * c->dim + c->dim + i];
		}
	return 0;
}

int kk__cpu_rmsnorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, kk_buffer *residual_out,
			kk_buffer *rstd, const kk_buffer *x, const kk_buffer *residual,
			const kk_buffer *weight, int64_t rows, int64_t dim, float eps)
{
	struct norm_ctx c = { .dim = dim,
			      .eps = eps,
			      .y = y,
			      .residual_out = residual_out,
			      .rstd = rstd,
			      .x = x,
			      .residual = residual,
			      .weight = weight };
	return kk__parallel_for(rows, (double) dim * 10, norm_fwd_range, &c);
}

int kk__cpu_layernorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, kk_buffer *residual_out,
			  kk_buffer *mean, kk_buffer *rstd, const kk_buffer *x,
			  const kk_buffer *residual, const kk_buffer *weight, const kk_buffer *bias,
			  int64_t rows, int64_t dim, float eps)
{
	struct norm_ctx c = { .layer = true,
			      .dim = dim,
			      .eps = eps,
			      .y = y,
			      .residual_out = residual_out,
			      .mean = mean,
			      .rstd = rstd,
			      .x = x,
			      .residual = residual,
			      .weight = weight,
			      .bias = bias };
	return kk__parallel_for(rows, (double) dim * 10, norm_fwd_range, &c);
}

int kk__cpu_rmsnorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
			const kk_buffer *dy, const kk_buffer *dresidual, const kk_buffer *h,
			const kk_buffer *weight, const kk_buffer *rstd, int64_t rows, int64_t dim)
{
	struct norm_ctx c = { .dim = dim,
			      .dx = dx,
			      .dy = dy,
			      .dresidual = dresidual,
			      .h = h,
			      .weight = weight,
			      .rstd_in = rstd };
	return norm_bwd(&c, rows, dweight, NULL);
}

int kk__cpu_layernorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
			  kk_buffer *dbias, const kk_buffer *dy, const kk_buffer *dresidual,
			  const kk_buffer *h, const kk_buffer *weight, const kk_buffer *mean,
			  const kk_buffer *rstd, int64_t rows, int64_t dim)
{
	struct norm_ctx c = { .layer = true,
			      .dim = dim,
			      .dx = dx,
			      .dy = dy,
			      .dresidual = dresidual,
			      .h = h,
			      .weight = weight,
			      .mean_in = mean,
			      .rstd_in = rstd };
	return norm_bwd(&c, rows, dweight, dbias);
}

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

/* ---- softmax and cross-entropy ----------------------------------------- */

struct rows_ctx {
	int64_t cols;
	kk_buffer *y;
	const kk_buffer *x;
	const int32_t *targets;
	float scale;
	int kind; /* 0 softmax, 1 xent fwd, 2 xent bwd */
};

static int rows_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct rows_ctx *c = p;
	int64_t n = c->cols;
	_cleanup_free_ float *row = malloc(n * sizeof(float));
	if (!row)
		return -ENOMEM;

	for (int64_t r = b; r < e; r++) {
		size_t off = (size_t) r * n;
		float mx = -INFINITY;
		double sum = 0;
		int32_t t = c->targets ? c->targets[r] : -1;

		kk__row_f32(row, c->x->ptr, c->x->dtype, off, n);
		for (int64_t i = 0; i < n; i++)
			mx = fmaxf(mx, row[i]);
		for (int64_t i = 0; i < n; i++)
			sum += exp((double) row[i] - mx);

		if (c->kind == 1) {
			((float *) c->y->ptr)[r] =
				t < 0 ? 0.0f : (float) (mx + log(sum) - (double) row[t]);
			continue;
		}
		for (int64_t i = 0; i < n; i++) {
			float pr = (float) (exp((double) row[i] - mx) / sum);
			if (c->kind == 2)
				pr = t < 0 ? 0.0f : (pr - (i == t ? 1.0f : 0.0f)) * c->scale;
			row[i] = pr;
		}
		kk__row_store(c->y->ptr, c->y->dtype, off, row, n);
	}
	return 0;
}

int kk__cpu_softmax(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x, int64_t rows,
		    int64_t cols)
{
	struct rows_ctx c = { .cols = cols, .y = y, .x = x, .kind = 0 };
	return kk__parallel_for(rows, (double) cols * 20, rows_range, &c);
}

static int targets_ok(const kk_buffer *targets, int64_t tokens, int64_t vocab)
{
	const int32_t *t = targets->ptr;
	for (int64_t i = 0; i < tokens; i++)
		if (t[i] >= vocab)
			return -ERANGE;
	return 0;
}

int kk__cpu_cross_entropy_fwd(kk_backend *be, kk_stream *st, kk_buffer *losses,
			      const kk_buffer *logits, const kk_buffer *targets, int64_t tokens,
			      int64_t vocab)
{
	struct rows_ctx c = {
		.cols = vocab, .y = losses, .x = logits, .targets = targets->ptr, .kind = 1
	};
	int r = targets_ok(targets, tokens, vocab);
	if (r < 0)
		return r;
	return kk__parallel_for(tokens, (double) vocab * 20, rows_range, &c);
}

int kk__cpu_cross_entropy_bwd(kk_backend *be, kk_stream *st, kk_buffer *dlogits,
			      const kk_buffer *logits, const kk_buffer *targets, int64_t tokens,
			      int64_t vocab, float grad_scale)
{
	struct rows_ctx c = { .cols = vocab,
			      .y = dlogits,
			      .x = logits,
			      .targets = targets->ptr,
			      .scale = grad_scale,
			      .kind = 2 };
	int r = targets_ok(targets, tokens, vocab);
	if (r < 0)
		return r;
	return kk__parallel_for(tokens, (double) vocab * 30, rows_range, &c);
}

/* ---- embedding --------------------------------------------------------- */

static int ids_ok(const kk_buffer *ids, int64_t tokens, int64_t vocab)
{
	const int32_t *t = ids->ptr;
	for (int64_t i = 0; i < tokens; i++)
		if (t[i] < 0 || t[i] >= vocab)
			return -ERANGE;
	return 0;
}

int kk__cpu_embedding_fwd(kk_backend *be, kk_stream *st, kk_buffer *out, const kk_buffer *table,
			  const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim)
{
	const int32_t *id = ids->ptr;
	size_t el = kk_dtype_size(table->dtype, 1);
	int r = ids_ok(ids, tokens, vocab);
	if (r < 0)
		return r;
	for (int64_t t = 0; t < tokens; t++)
		memcpy((char *) out->ptr + (size_t) t * dim * el,
		       (const char *) table->ptr + (size_t) id[t] * dim * el, dim * el);
	return 0;
}

int kk__cpu_embedding_bwd(kk_backend *be, kk_stream *st, kk_buffer *dtable, const kk_buffer *dout,
			  const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim)
{
	const int32_t *id = ids->ptr;
	float *dt = dtable->ptr;
	int r = ids_ok(ids, tokens, vocab);
	if (r < 0)
		return r;
	for (int64_t t = 0; t < tokens; t++)
		for (int64_t i = 0; i < dim; i++)
			dt[(size_t) id[t] * dim + i] += LD(dout, (size_t) t * dim + i);
	return 0;
}

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
	double part[KK_CPU_THREADS_MAX];
};

static int sumsq_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct sumsq_ctx *c = p;
	double s = 0;
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
