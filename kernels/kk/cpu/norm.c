/* kernels/kk/cpu/norm.c — the cpu backend's RMSNorm and LayerNorm with the
 * fused residual add, forward and backward.
 *
 * Rows are spread over threads with kk__parallel_for; every row widens to
 * f32 (sums in double) and rounds once on store.  The weight/bias gradients
 * are accumulated per chunk and then summed in chunk order, so results do not
 * depend on thread timing. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

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
	_cleanup_free_ float *h = malloc(dim * sizeof(float)), *w = malloc(dim * sizeof(float)),
			     *rs = c->residual ? malloc(dim * sizeof(float)) : NULL;
	if (!h || !w || (c->residual && !rs))
		return -ENOMEM;
	kk__row_f32(w, c->weight->ptr, c->weight->dtype, 0, dim);

	for (int64_t r = b; r < e; r++) {
		size_t off = (size_t) r * dim;
		double s = 0, s2 = 0, mean = 0, rstd;
		kk__row_f32(h, c->x->ptr, c->x->dtype, off, dim);
		if (c->residual) {
			/* Whole rows through the row conversions (vector f16 ones
			 * in half.c): element by element, the 16-bit loads and
			 * rounding were 12 % of an s15m f16 prefill. */
			kk__row_f32(rs, c->residual->ptr, c->residual->dtype, off, dim);
			for (int64_t i = 0; i < dim; i++)
				h[i] += rs[i];
			/* Normalize what the backward pass will see: h as stored
			 * (narrowed and widened back, in rs's memory). */
			if (c->x->dtype != KK_F32) {
				kk__row_store(rs, c->x->dtype, 0, h, dim);
				kk__row_f32(h, rs, c->x->dtype, 0, dim);
			}
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

	/* RMSNorm on f32 rows (training): one vector loop of simd.c per row,
	 * straight on the buffers (f32 sums; this loop's per-element double
	 * sums did not vectorize). */
	bool f32 = !c->layer && c->h->dtype == KK_F32 && c->dy->dtype == KK_F32 &&
		   c->dx->dtype == KK_F32 && (!c->dresidual || c->dresidual->dtype == KK_F32);
	for (int64_t r = b; r < e && f32; r++) {
		size_t off = (size_t) r * dim;
		kk__rms_bwd_row((float *) c->dx->ptr + off, dw, (const float *) c->dy->ptr + off,
				(const float *) c->h->ptr + off, w,
				c->dresidual ? (const float *) c->dresidual->ptr + off : NULL,
				((const float *) c->rstd_in->ptr)[r], (size_t) dim);
	}
	for (int64_t r = b; r < e && !f32; r++) {
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
