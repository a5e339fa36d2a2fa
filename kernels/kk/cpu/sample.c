/* kernels/kk/cpu/sample.c — the cpu backend's token sampling: greedy,
 * temperature, top-k, top-p, reproducible from a seed.
 *
 * The algorithm is spelled out in kk.h so every backend draws the same
 * token: sort candidates by logit (descending, ties by lower id), keep the
 * top_k, then the shortest prefix whose share of the kept mass reaches
 * top_p, and invert the CDF of the renormalized kept set at
 * kk_sample_uniform(seed, row), walking it in id order.  kk_sample_host
 * (host floats, for a caller that processed the logits on the host) runs
 * the same code, so there is one sampler on the cpu side. */
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

struct cand {
	float x;
	int32_t id;
};

static int cand_id_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Descending logit, ties by lower id. */
static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->x != y->x)
		return x->x > y->x ? -1 : 1;
	return cand_id_cmp(a, b);
}

struct sample_ctx {
	int32_t *ids;
	const kk_buffer *logits; /* NULL: host holds the rows as floats */
	const float *host;
	int64_t vocab;
	const kk_sampling *p;
};

static int sample_range(void *ptr, int64_t b, int64_t e, int chunk)
{
	struct sample_ctx *c = ptr;
	const kk_sampling *p = c->p;
	int64_t V = c->vocab;
	_cleanup_free_ struct cand *cs = malloc(V * sizeof(*cs));
	_cleanup_free_ double *pr = malloc(V * sizeof(double));

	if (!cs || !pr)
		return -ENOMEM;
	for (int64_t r = b; r < e; r++) {
		int64_t keep, best = 0;
		double total = 0, kept = 0, u, cum = 0;
		int32_t pick;

		for (int64_t i = 0; i < V; i++) {
			cs[i].x = c->host ? c->host[r * V + i] : LD(c->logits, (size_t) r * V + i);
			cs[i].id = (int32_t) i;
			if (cs[i].x > cs[best].x)
				best = i;
		}
		if (p->temperature == 0) {
			c->ids[r] = (int32_t) best;
			continue;
		}
		qsort(cs, V, sizeof(*cs), cand_cmp);
		keep = p->top_k > 0 ? MIN((int64_t) p->top_k, V) : V;
		for (int64_t i = 0; i < keep; i++) {
			pr[i] = exp(((double) cs[i].x - cs[0].x) / p->temperature);
			total += pr[i];
		}
		if (p->top_p > 0 && p->top_p < 1) {
			int64_t n = 0;
			for (; n < keep; n++) {
				kept += pr[n];
				if (kept >= p->top_p * total) {
					n++;
					break;
				}
			}
			keep = MAX(n, (int64_t) 1);
		}
		/* The kept set in id order (kk.h says why), each with its
		 * probability, recomputed from its logit. */
		double top = cs[0].x;
		qsort(cs, keep, sizeof(*cs), cand_id_cmp);
		kept = 0;
		for (int64_t i = 0; i < keep; i++) {
			pr[i] = exp(((double) cs[i].x - top) / p->temperature);
			kept += pr[i];
		}
		u = kk_sample_uniform(p->seed, (uint64_t) r) * kept;
		pick = cs[keep - 1].id;
		for (int64_t i = 0; i < keep; i++) {
			cum += pr[i];
			if (cum > u) {
				pick = cs[i].id;
				break;
			}
		}
		c->ids[r] = pick;
	}
	return 0;
}

int kk__cpu_sample(kk_backend *be, kk_stream *st, kk_buffer *ids, const kk_buffer *logits,
		   int64_t rows, int64_t vocab, const kk_sampling *p)
{
	struct sample_ctx c = { ids->ptr, logits, NULL, vocab, p };
	return kk__parallel_for(rows, (double) vocab * 40, sample_range, &c);
}

/* kk_sample_host: the same rows, read from host floats, on the calling
 * thread (a caller that processed a row on the host samples it as the
 * device would have). */
int kk__cpu_sample_host(const float *logits, int64_t rows, int64_t vocab, const kk_sampling *p,
			int32_t *ids)
{
	struct sample_ctx c = { ids, NULL, logits, vocab, p };
	return sample_range(&c, 0, rows, 0);
}
