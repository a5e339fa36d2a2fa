/* kernels/kk/cpu/softmax.c — the cpu backend's row softmax and the fused
 * softmax cross-entropy forward/backward: one row per work item, widened to
 * f32, sums in double.  Targets outside [0, vocab) are -ERANGE. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

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
		if (c->x->dtype == KK_F32) {
			/* f32 rows (training's logits): simd.c's 16-lane exp and
			 * sum, where libm's double exp per element, twice for the
			 * backward, was the cost (issue 15).  row keeps exp(x - mx). */
			float x_t = t >= 0 ? row[t] : 0, fs;
			mx = kk__max(row, (size_t) n);
			fs = kk__exp_sum(row, mx, (size_t) n);
			if (c->kind == 1) {
				((float *) c->y->ptr)[r] =
					t < 0 ? 0.0f
					      : (float) (mx + log((double) fs) - (double) x_t);
				continue;
			}
			float inv = 1.0f / fs, sc = c->kind == 2 ? c->scale : 1.0f;
			if (c->kind == 2 && t < 0)
				sc = 0;
			kk__scal(row, inv * sc, (size_t) n);
			if (c->kind == 2 && t >= 0)
				row[t] -= sc;
			kk__row_store(c->y->ptr, c->y->dtype, off, row, n);
			continue;
		}
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
