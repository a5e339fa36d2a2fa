/* tests/kernels/ref/sample.c — kk.h's sampling algorithm in float64: sort
 * by logit (ties by id), greedy at temperature 0, else keep the top-k, then
 * the top-p prefix, and draw by the inverse CDF over the kept tokens in id
 * order with kk_sample_uniform(seed, row) (see ref.h). */
#include <math.h>
#include <stdlib.h>

#include "ref.h"

struct scand {
	double x;
	int id;
};

static int scand_cmp(const void *a, const void *b)
{
	const struct scand *x = a, *y = b;
	if (x->x != y->x)
		return x->x > y->x ? -1 : 1;
	return x->id - y->id;
}

int ref_sample(const double *logits, int V, const kk_sampling *p, uint64_t row)
{
	struct scand *c = malloc(V * sizeof(*c));
	double *pr = malloc(V * sizeof(double)), total = 0, kept = 0, u, cum = 0;
	int keep, pick;

	for (int i = 0; i < V; i++)
		c[i] = (struct scand){ logits[i], i };
	qsort(c, V, sizeof(*c), scand_cmp);
	if (p->temperature == 0) {
		pick = c[0].id;
		goto out;
	}
	keep = p->top_k > 0 && p->top_k < V ? p->top_k : V;
	for (int i = 0; i < keep; i++)
		total += pr[i] = exp((c[i].x - c[0].x) / p->temperature);
	if (p->top_p > 0 && p->top_p < 1) {
		int n = 0;
		double acc = 0;
		while (n < keep) {
			acc += pr[n++];
			if (acc >= p->top_p * total)
				break;
		}
		keep = n;
	}
	/* The inverse CDF walks the kept tokens in id order (kk.h). */
	char *in = calloc(V, 1);
	for (int i = 0; i < keep; i++)
		in[c[i].id] = 1;
	for (int i = 0; i < V; i++)
		if (in[i])
			kept += exp((logits[i] - c[0].x) / p->temperature);
	u = kk_sample_uniform(p->seed, row) * kept;
	pick = -1;
	for (int i = 0; i < V; i++) {
		if (!in[i])
			continue;
		pick = i; /* the last kept id if rounding leaves cum <= u */
		cum += exp((logits[i] - c[0].x) / p->temperature);
		if (cum > u)
			break;
	}
	free(in);
out:
	free(c);
	free(pr);
	return pick;
}
