/* kernels/cpu/softmax.c — the cpu backend's row softmax and the fused
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
