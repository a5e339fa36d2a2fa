/* kernels/kk/cpu/rope.c — the cpu backend's rotary position embedding
 * (interleaved or half-split pairs, partial rotary dims, forward and
 * backward), in place, one token per work item.
 *
 * The angles come from a table of (cos, sin) per position and pair, built
 * first (in parallel): one row per distinct position when the positions
 * span no more values than there are tokens (a training batch repeats
 * 0..T-1 in every sequence: T rows, not B * T), else one row per token.
 * Each entry is what the per-token loop computed before (the angle pos *
 * theta^(-2i/rot) / freq_div[i] in double, then cos and sin rounded to
 * f32), so the values do not depend on the layout; only libm's pow and
 * sincos per (token, pair) are gone (issue 15: rope was 3.8 ms of the
 * benchmark model's 58 ms training step).  The last position-keyed table
 * is kept (up to ROPE_CACHE_MAX bytes) for the next call with the same
 * theta, divisors (compared by value: the caller may rewrite its buffer),
 * rotary dims and a range it covers: a training step calls rope four
 * times per layer with the same positions. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "kiln/macro.h"

/* ---- RoPE -------------------------------------------------------------- */

struct rope_ctx {
	kk_buffer *x;
	const int32_t *pos;
	int n_heads, head_dim, rot;
	kk_rope_mode mode;
	bool backward;
	const double *inv_freq; /* [rot / 2]: theta^(-2i/rot) / freq_div[i] */
	float *cs;		/* [rows][rot / 2][2]: cos, sin */
	int64_t pos0;		/* row of token t: pos[t] - pos0, or t when !by_pos */
	bool by_pos;
};

/* Table rows [b, e). */
static int table_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct rope_ctx *c = p;
	int half = c->rot / 2;
	for (int64_t r = b; r < e; r++) {
		double pos = c->by_pos ? (double) (r + c->pos0) : (double) c->pos[r];
		float *row = c->cs + (size_t) r * half * 2;
		for (int i = 0; i < half; i++) {
			double ang = pos * c->inv_freq[i];
			row[2 * i] = (float) cos(ang);
			row[2 * i + 1] = (float) sin(ang);
		}
	}
	return 0;
}

/* Head rows up to this many elements rotate 16-bit x through an f32 copy
 * on the stack. */
#define ROPE_ROW_MAX 512

static int rope_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct rope_ctx *c = p;
	const int half = c->rot / 2, D = c->head_dim;
	/* interleaved: pair i is (2i, 2i + 1); half-split: (i, i + rot/2) */
	const int stride = c->mode == KK_ROPE_INTERLEAVED ? 2 : 1,
		  other = c->mode == KK_ROPE_INTERLEAVED ? 1 : half;
	const float sg = c->backward ? -1.0f : 1.0f;

	for (int64_t t = b; t < e; t++) {
		const float *row =
			c->cs + (size_t) (c->by_pos ? c->pos[t] - c->pos0 : t) * half * 2;
		for (int h = 0; h < c->n_heads; h++) {
			size_t base = ((size_t) t * c->n_heads + h) * D;
			if (c->x->dtype == KK_F32) {
				float *x = (float *) c->x->ptr + base;
				for (int i = 0; i < half; i++) {
					float cs = row[2 * i], sn = sg * row[2 * i + 1];
					float a = x[stride * i], bb = x[stride * i + other];
					x[stride * i] = a * cs - bb * sn;
					x[stride * i + other] = a * sn + bb * cs;
				}
				continue;
			}
			if (D <= ROPE_ROW_MAX) {
				/* bf16/f16: the head's row widened and narrowed whole
				 * (vector conversions, half.c) around the f32 rotation:
				 * the same values as element by element, where the
				 * scalar conversions were 11-18 % of an f16 prefill. */
				float x[ROPE_ROW_MAX];
				kk__row_f32(x, c->x->ptr, c->x->dtype, base, (size_t) D);
				for (int i = 0; i < half; i++) {
					float cs = row[2 * i], sn = sg * row[2 * i + 1];
					float a = x[stride * i], bb = x[stride * i + other];
					x[stride * i] = a * cs - bb * sn;
					x[stride * i + other] = a * sn + bb * cs;
				}
				kk__row_store(c->x->ptr, c->x->dtype, base, x, (size_t) D);
				continue;
			}
			for (int i = 0; i < half; i++) {
				float cs = row[2 * i], sn = sg * row[2 * i + 1];
				size_t ia = base + (size_t) stride * i, ib = ia + other;
				float a = LD(c->x, ia), bb = LD(c->x, ib);
				ST(c->x, ia, a * cs - bb * sn);
				ST(c->x, ib, a * sn + bb * cs);
			}
		}
	}
	return 0;
}

/* The kept table: refcounted, so a call still rotating with it when
 * another replaces it keeps it alive; the cache's own reference is one.
 * data: the divisors it was built with ([rot / 2], when has_div), then
 * the rows. */
#define ROPE_CACHE_MAX (1u << 20)

struct rope_table {
	int refs;
	double theta;
	int rot;
	bool has_div;
	int64_t pos0, rows;
	float *cs;
	float data[];
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rope_table *cache;

static void table_unref(struct rope_table *t)
{
	if (t && --t->refs == 0)
		free(t);
}

/* A reference to the kept table when it covers rows [pos0, pos0 + rows)
 * for theta, div (NULL: none) and rot, else NULL. */
static struct rope_table *cache_find(double theta, const float *div, int rot, int64_t pos0,
				     int64_t rows)
{
	struct rope_table *t = NULL;
	pthread_mutex_lock(&cache_lock);
	if (cache && cache->theta == theta && cache->rot == rot && cache->pos0 <= pos0 &&
	    cache->pos0 + cache->rows >= pos0 + rows && cache->has_div == (div != NULL) &&
	    (!div || memcmp(cache->data, div, sizeof(float) * (size_t) (rot / 2)) == 0)) {
		t = cache;
		t->refs++;
	}
	pthread_mutex_unlock(&cache_lock);
	return t;
}

/* Keeps t (the caller's reference stays the caller's). */
static void cache_keep(struct rope_table *t)
{
	pthread_mutex_lock(&cache_lock);
	table_unref(cache);
	cache = t;
	t->refs++;
	pthread_mutex_unlock(&cache_lock);
}

static void cache_release(struct rope_table *t)
{
	pthread_mutex_lock(&cache_lock);
	table_unref(t);
	pthread_mutex_unlock(&cache_lock);
}

int kk__cpu_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions,
		 int64_t tokens, int n_heads, int head_dim, int rotary_dim, float theta,
		 const kk_buffer *freq_div, kk_rope_mode mode, bool backward)
{
	const int32_t *pos = positions->ptr;
	const float *div = freq_div ? freq_div->ptr : NULL;
	const int half = rotary_dim / 2;
	int64_t lo = INT64_MAX, hi = INT64_MIN, rows;
	int r;

	if (half == 0 || tokens == 0)
		return 0;
	for (int64_t t = 0; t < tokens; t++)
		lo = MIN(lo, (int64_t) pos[t]), hi = MAX(hi, (int64_t) pos[t]);
	bool by_pos = hi - lo + 1 <= tokens;
	rows = by_pos ? hi - lo + 1 : tokens;
	size_t bytes = sizeof(float) * 2 * half * (size_t) rows, nd = div ? (size_t) half : 0;
	struct rope_table *t = by_pos ? cache_find(theta, div, rotary_dim, lo, rows) : NULL;
	struct rope_ctx c = { .x = x,
			      .pos = pos,
			      .n_heads = n_heads,
			      .head_dim = head_dim,
			      .rot = rotary_dim,
			      .mode = mode,
			      .backward = backward,
			      .pos0 = lo,
			      .by_pos = by_pos };

	if (t) { /* kept: rows from its own first position */
		c.cs = t->cs;
		c.pos0 = t->pos0;
		r = kk__parallel_for(tokens, (double) n_heads * head_dim * 4, rope_range, &c);
		cache_release(t);
		return r;
	}
	_cleanup_free_ double *inv = malloc(sizeof(double) * half);
	t = malloc(sizeof(*t) + sizeof(float) * nd + bytes);
	if (!inv || !t) {
		free(t);
		return -ENOMEM;
	}
	*t = (struct rope_table){ .refs = 1,
				  .theta = theta,
				  .rot = rotary_dim,
				  .has_div = div != NULL,
				  .pos0 = lo,
				  .rows = rows };
	if (div)
		memcpy(t->data, div, sizeof(float) * nd);
	t->cs = t->data + nd;
	/* Without divisors exactly the plain RoPE of before. */
	for (int i = 0; i < half; i++)
		inv[i] = div ? pow(theta, -2.0 * i / rotary_dim) / (double) div[i]
			     : pow(theta, -2.0 * i / rotary_dim);
	c.inv_freq = inv;
	c.cs = t->cs;
	r = kk__parallel_for(rows, (double) half * 40, table_range, &c);
	if (r >= 0)
		r = kk__parallel_for(tokens, (double) n_heads * head_dim * 4, rope_range, &c);
	if (r >= 0 && by_pos && bytes <= ROPE_CACHE_MAX)
		cache_keep(t);
	cache_release(t);
	return r;
}
