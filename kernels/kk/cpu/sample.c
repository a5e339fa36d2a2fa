/* kernels/kk/cpu/sample.c — the cpu backend's token sampling: greedy,
 * temperature, top-k, top-p, reproducible from a seed.
 *
 * The algorithm is spelled out in kk.h so every backend draws the same
 * token: sort candidates by logit (descending, ties by lower id), keep the
 * top_k, then the shortest prefix whose share of the kept mass reaches
 * top_p, and invert the CDF of the renormalized kept set at
 * kk_sample_uniform(seed, row), walking it in id order.  kk_sample_host
 * (host floats, for a caller that processed the logits on the host) runs
 * the same code, so there is one sampler on the cpu side.
 *
 * Sorting a whole row (what sample_sorted below does) cost 3.5-7 ms a
 * token at 32k tokens and 15-35 ms at 128k, so each case takes a shorter
 * way to the very same token, draw for draw:
 *   - temperature 0: the vector max, then the first index holding it;
 *   - top_k: one pass keeps the k best in a heap, and only they are
 *     sorted (heapsort; kk.h's steps then run on the k); without top_p and
 *     from k 256 up, only the k-th best token is found (a threshold from
 *     every 16th token, then selection) and the kept set drawn from with
 *     vector block sums;
 *   - neither top_k nor top_p: every token is kept, nothing to sort: the
 *     mass in blocks of SAMPLE_BLOCK tokens by a vectorized float64 exp
 *     (simd.c, within 1e-15 of exp()), the block the draw falls in, then
 *     that block walked with exp();
 *   - top_p alone: the same vectorized pass also gives the mass above 8
 *     thresholds, then 8 finer steps inside the band that reaches top_p;
 *     the tokens of the step holding the cut are gathered (those above it
 *     enter as their mass) and the cut found among them by a weighted
 *     selection (no sort); the kept set is drawn from with block sums.
 * kk.h sums in id order (the draw) and in sorted order (the top_p total
 * and prefix), one exp() a token; the shortcuts sum in other orders or
 * with the vectorized exp, so their sums differ from kk.h's by rounding,
 * bounded (exp_sum_slack).  A draw or a cut closer than that bound to a
 * boundary is decided by the exact pass (sample_all, sample_top_p, or the
 * whole sort), so the token is always the one sample_sorted draws; the
 * bound is ~1e-10 of the mass at 128k tokens, so that happens about once
 * in 10^10 draws (tests/kernels/test-kk-sample.c checks draw for draw).
 * Every buffer a row needs lives in one scratch block per thread, grown to
 * the largest vocabulary it saw and freed when the thread exits: no
 * allocation per token. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
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

/* cs[0..n) by id, in place (a heapsort: no comparator calls). */
static void sort_by_id(struct cand *cs, int64_t n)
{
	for (int64_t end = n; end > 1; end--) {
		if (end == n)
			for (int64_t i = n / 2 - 1; i >= 0; i--)
				for (int64_t j = i;;) {
					int64_t w = j, l = 2 * j + 1, r = l + 1;
					if (l < n && cs[l].id > cs[w].id)
						w = l;
					if (r < n && cs[r].id > cs[w].id)
						w = r;
					if (w == j)
						break;
					struct cand t = cs[j];
					cs[j] = cs[w];
					cs[w] = t;
					j = w;
				}
		struct cand t = cs[0];
		cs[0] = cs[end - 1];
		cs[end - 1] = t;
		for (int64_t j = 0, m = end - 1;;) {
			int64_t w = j, l = 2 * j + 1, r = l + 1;
			if (l < m && cs[l].id > cs[w].id)
				w = l;
			if (r < m && cs[r].id > cs[w].id)
				w = r;
			if (w == j)
				break;
			struct cand u = cs[j];
			cs[j] = cs[w];
			cs[w] = u;
			j = w;
		}
	}
}

/* kk.h's steps after the sort: cs[0..keep) sorted by cand_cmp, cs[0] the
 * row's largest logit; pr holds keep doubles.  Returns the token. */
static int32_t sample_kept(struct cand *cs, int64_t keep, const kk_sampling *p, uint64_t row,
			   double *pr)
{
	double total = 0, kept = 0, u, cum = 0;
	if (p->top_p > 0 && p->top_p < 1) {
		/* (the total matters to the top_p cut only) */
		for (int64_t i = 0; i < keep; i++) {
			pr[i] = exp(((double) cs[i].x - cs[0].x) / p->temperature);
			total += pr[i];
		}
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
	sort_by_id(cs, keep);
	kept = 0;
	for (int64_t i = 0; i < keep; i++) {
		pr[i] = exp(((double) cs[i].x - top) / p->temperature);
		kept += pr[i];
	}
	u = kk_sample_uniform(p->seed, row) * kept;
	for (int64_t i = 0; i < keep; i++) {
		cum += pr[i];
		if (cum > u)
			return cs[i].id;
	}
	return cs[keep - 1].id;
}

/* The whole row sorted (temperature > 0): kk.h's algorithm as written,
 * the others' fallback and reference.  cs and pr hold V entries. */
static int32_t sample_sorted(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			     struct cand *cs, double *pr)
{
	for (int64_t i = 0; i < V; i++)
		cs[i] = (struct cand){ x[i], (int32_t) i };
	qsort(cs, V, sizeof(*cs), cand_cmp);
	return sample_kept(cs, p->top_k > 0 ? MIN((int64_t) p->top_k, V) : V, p, row, pr);
}

/* The first index of the largest value (lowest on ties): the vector max,
 * then the first index holding it (a row with a NaN: the scalar walk). */
static int32_t arg_max(const float *x, int64_t V)
{
	const float m = kk__max(x, (size_t) V);
	for (int64_t i = 0; i < V; i++)
		if (x[i] == m)
			return (int32_t) i;
	int64_t best = 0;
	for (int64_t i = 1; i < V; i++)
		if (x[i] > x[best])
			best = i;
	return (int32_t) best;
}

/* Every token kept: the partial sums of exp((x - max) / T) in id order,
 * then the first one past u. */
static int32_t sample_all(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			  double *cum)
{
	const double top = x[arg_max(x, V)];
	double c = 0;
	for (int64_t i = 0; i < V; i++) {
		c += exp(((double) x[i] - top) / p->temperature);
		cum[i] = c;
	}
	const double u = kk_sample_uniform(p->seed, row) * c;
	int64_t lo = 0, hi = V; /* the answer is in [lo, hi] */
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		if (cum[mid] > u)
			hi = mid;
		else
			lo = mid + 1;
	}
	return (int32_t) MIN(lo, V - 1);
}

/* How far kk__exp_sum_d's sum of V terms may lie from the sum of exp()'s
 * added in any order (the reference's): each term within 1e-15 of exp()'s
 * relative, plus the error of its exponent ((x - max) * (1 / T) against
 * (x - max) / T: 3 roundings, |a| e^a <= 1/e a term), plus the two sums'
 * rounding (V - 1 roundings each), all at most s (1e-14 + 1e-15 V) with a
 * factor of 3 to spare (s >= 1: the top token's term is exactly 1). */
static inline double exp_sum_slack(double s, int64_t V)
{
	return s * (1e-14 + 1e-15 * (double) V);
}

/* Tokens summed per block by sample_all_fast: the draw walks one block
 * with exp() after finding it among the block sums. */
#define SAMPLE_BLOCK 512

/* sample_all's token without its V exp() calls: the block sums in
 * vectorized float64 (kk__exp_sum_d), the block the draw falls in, then
 * that block walked with exp().  The partial sums differ from sample_all's
 * by at most exp_sum_slack, so a draw farther than that from both ends
 * of its token's interval is sample_all's draw; a nearer one (about 1e-10
 * of draws at 128k tokens) is left to sample_all.  blocks: V / SAMPLE_BLOCK
 * + 1 doubles. */
static int32_t sample_all_fast(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			       double *blocks)
{
	const float top = kk__max(x, (size_t) V);
	if (!isfinite(top))
		return sample_all(x, V, p, row, blocks);
	const double inv_t = 1.0 / p->temperature;
	const int64_t nb = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
	double total = 0;
	for (int64_t b = 0; b < nb; b++) {
		const int64_t lo = b * SAMPLE_BLOCK, n = MIN(V - lo, (int64_t) SAMPLE_BLOCK);
		blocks[b] = kk__exp_sum_d(x + lo, (size_t) n, top, inv_t);
		total += blocks[b];
	}
	const double u = kk_sample_uniform(p->seed, row) * total;
	const double margin = 3 * exp_sum_slack(total, V);
	double c = 0;
	int64_t b = 0;
	for (; b < nb && !(c + blocks[b] > u); b++)
		c += blocks[b];
	for (int64_t i = b * SAMPLE_BLOCK; b < nb && i < MIN(V, (b + 1) * SAMPLE_BLOCK); i++) {
		const double before = c;
		c += exp(((double) x[i] - top) / p->temperature);
		if (c > u) {
			if ((i == 0 || u - before > margin) && c - u > margin)
				return (int32_t) i;
			break;
		}
	}
	return sample_all(x, V, p, row, blocks);
}

/* "a is worse than b" in kk.h's order (the heap's root is the worst). */
static inline bool cand_worse(const struct cand *a, const struct cand *b)
{
	return a->x < b->x || (a->x == b->x && a->id > b->id);
}

static void heap_down(struct cand *h, int n, int i)
{
	for (;;) {
		int w = i, l = 2 * i + 1, r = l + 1;
		if (l < n && cand_worse(&h[l], &h[w]))
			w = l;
		if (r < n && cand_worse(&h[r], &h[w]))
			w = r;
		if (w == i)
			return;
		struct cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

/* top_k < V: the k best by one pass over the row (a later token with the
 * root's logit has a higher id, so it is worse and stays out), then kk.h's
 * steps on them alone. */
static int32_t sample_top_k(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			    struct cand *h, double *pr)
{
	const int k = p->top_k;
	for (int i = 0; i < k; i++)
		h[i] = (struct cand){ x[i], i };
	for (int i = k / 2 - 1; i >= 0; i--)
		heap_down(h, k, i);
	for (int64_t i = k; i < V; i += 16) {
		/* 16 tokens at a time: most blocks hold none better than the root */
		const int64_t n = MIN((int64_t) 16, V - i);
		float m = x[i];
		for (int64_t j = 1; j < n; j++)
			m = x[i + j] > m ? x[i + j] : m;
		if (!(m > h[0].x))
			continue;
		for (int64_t j = i; j < i + n; j++)
			if (x[j] > h[0].x) {
				h[0] = (struct cand){ x[j], (int32_t) j };
				heap_down(h, k, 0);
			}
	}
	/* Pop the worst to the end: best first, kk.h's order. */
	for (int end = k - 1; end > 0; end--) {
		struct cand t = h[0];
		h[0] = h[end];
		h[end] = t;
		heap_down(h, end, 0);
	}
	return sample_kept(h, k, p, row, pr);
}

/* Buckets of probability for top_p: half a nat each, the last one
 * holding everything below exp(-31.5) of the top token. */
#define SAMPLE_BUCKETS	       64
#define SAMPLE_BUCKETS_PER_NAT 2

static inline int prob_bucket(double a) /* a = (x - max) / T <= 0 */
{
	double b = -a * SAMPLE_BUCKETS_PER_NAT;
	return b < SAMPLE_BUCKETS - 1 ? (int) b : SAMPLE_BUCKETS - 1; /* NaN, inf: last */
}

/* top_p alone with exp() on every token (sample_top_p_fast's fallback,
 * for rows too flat for its thresholds or a cut within its bound): the
 * pass that sums the mass in id order also buckets it by probability (half
 * a nat a bucket); the top buckets that hold top_p of it are sorted, and
 * where the cut lies within the total's reordering bound (2 (V - 1) 2^-53
 * of it, x2) of top_p, the whole sort decides. */
static int32_t sample_top_p(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			    struct cand *cs, double *e)
{
	const double top = x[arg_max(x, V)];
	double total = 0, mass[SAMPLE_BUCKETS] = { 0 };
	for (int64_t i = 0; i < V; i++) {
		double a = ((double) x[i] - top) / p->temperature;
		e[i] = exp(a);
		total += e[i];
		mass[prob_bucket(a)] += e[i];
	}
	/* kk.h's total (sorted order) is within slack of this one, so its
	 * threshold top_p * total lies in [lo, hi]. */
	const double slack = 4.5e-16 * (double) V * total;
	const double lo = p->top_p * (total - slack), hi = p->top_p * (total + slack);
	int last = 0;
	double acc = 0;
	for (; last < SAMPLE_BUCKETS - 1; last++) {
		acc += mass[last];
		if (acc >= hi + 2 * slack)
			break;
	}
	int64_t n = 0;
	for (int64_t i = 0; i < V; i++)
		if (prob_bucket(((double) x[i] - top) / p->temperature) <= last)
			cs[n++] = (struct cand){ x[i], (int32_t) i };
	qsort(cs, n, sizeof(*cs), cand_cmp);
	/* The first prefix reaching hi; kk.h's cut is the same one when the
	 * prefix before it is below lo. */
	double kept = 0, before = 0;
	int64_t keep = 0;
	while (keep < n) {
		before = kept;
		kept += e[cs[keep++].id];
		if (kept >= hi)
			break;
	}
	if (!(kept >= hi) || (keep > 1 && !(before < lo)))
		return sample_sorted(x, V, p, row, cs, e);
	/* kk.h's tail on the kept prefix: probabilities recomputed from the
	 * logits (the same doubles as e[]), summed and walked in id order. */
	qsort(cs, keep, sizeof(*cs), cand_id_cmp);
	double sum = 0, cum = 0;
	for (int64_t i = 0; i < keep; i++)
		sum += e[cs[i].id];
	const double u = kk_sample_uniform(p->seed, row) * sum;
	for (int64_t i = 0; i < keep; i++) {
		cum += e[cs[i].id];
		if (cum > u)
			return cs[i].id;
	}
	return cs[keep - 1].id;
}

/* The draw from the kept set {x[i] > cx, or == cx with i <= cid} as kk.h
 * makes it (exp() in id order, the first partial sum past u), the way
 * sample_all_fast makes it: block sums of the vector exp's terms e[V] (or,
 * e NULL, of the vector exp computed here), the block walked with exp(), a draw within the bound of
 * a boundary left to the caller (-1).  blocks: V / SAMPLE_BLOCK + 1 doubles. */
static int32_t draw_kept_fast(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			      float top, float cx, int32_t cid, const double *e, double *blocks)
{
	const int64_t nb = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
	double total = 0;
	for (int64_t b = 0; b < nb; b++) {
		const int64_t lo = b * SAMPLE_BLOCK, n = MIN(V - lo, (int64_t) SAMPLE_BLOCK);
		blocks[b] = e ? kk__sum_kept(e + lo, x + lo, (size_t) n, cx, cid - lo)
			      : kk__exp_sum_d_kept(x + lo, (size_t) n, top, 1.0 / p->temperature,
						   cx, cid - lo);
		total += blocks[b];
	}
	const double u = kk_sample_uniform(p->seed, row) * total;
	const double margin = 3 * exp_sum_slack(total, V);
	double c = 0;
	int64_t b = 0;
	for (; b < nb && !(c + blocks[b] > u); b++)
		c += blocks[b];
	/* only the row's first kept token has exactly nothing before it */
	bool first = b == 0;
	const int64_t end = b < nb ? MIN(V, (b + 1) * SAMPLE_BLOCK) : 0;
	for (int64_t i = b * SAMPLE_BLOCK; i < end; i++) {
		const float xi = x[i];
		if (!(xi > cx || (xi == cx && cid >= i)))
			continue;
		const double before = c;
		c += exp(((double) x[i] - top) / p->temperature);
		if (c > u)
			return (first || u - before > margin) && c - u > margin ? (int32_t) i : -1;
		first = false;
	}
	return -1;
}

/* A gathered token with its probability (exp() of its exponent, as kk.h
 * computes it). */
struct surv {
	double e;
	float x;
	int32_t id;
};

/* "a comes before b" in kk.h's order (ids are distinct: a total order). */
static inline bool surv_before(const struct surv *a, const struct surv *b)
{
	return a->x > b->x || (a->x == b->x && a->id < b->id);
}

/* The token of sv[0..n) (any order) at which the mass summed in kk.h's
 * order, starting from acc, first reaches hi (weighted quickselect: no
 * sort); *before gets the mass of the tokens ahead of it.  sv is
 * reordered.  -1 when all of them together stay below hi. */
static int64_t surv_cut(struct surv *sv, int64_t n, double acc, double hi, double *before)
{
	int64_t lo = 0, end = n;
	while (end - lo > 0) {
		/* the median of three as the pivot, moved to lo */
		const int64_t mid = lo + (end - lo) / 2, last = end - 1;
		int64_t pv = lo;
		if (surv_before(&sv[mid], &sv[lo]) != surv_before(&sv[mid], &sv[last]))
			pv = mid;
		else if (surv_before(&sv[last], &sv[lo]) != surv_before(&sv[last], &sv[mid]))
			pv = last;
		struct surv t = sv[lo];
		sv[lo] = sv[pv];
		sv[pv] = t;
		/* [lo + 1, b): ahead of the pivot; [b, end): behind it */
		int64_t b = lo + 1;
		double ahead = 0;
		for (int64_t i = lo + 1; i < end; i++)
			if (surv_before(&sv[i], &sv[lo])) {
				ahead += sv[i].e;
				t = sv[b];
				sv[b] = sv[i];
				sv[i] = t;
				b++;
			}
		if (acc + ahead >= hi) { /* in the part ahead */
			t = sv[lo];
			sv[lo] = sv[b - 1];
			sv[b - 1] = t;
			end = b - 1;
			continue;
		}
		if (acc + ahead + sv[lo].e >= hi) {
			*before = acc + ahead;
			return lo;
		}
		acc += ahead + sv[lo].e;
		lo = b;
	}
	return -1;
}

/* top_p alone without V exp() calls and without sorting: one vectorized
 * pass sums the mass (kk__exp_sum_d_th), within exp_sum_slack of kk.h's
 * total, and the mass above 8 thresholds; the tokens above the first
 * threshold holding top_p of it (with the slack) are gathered with their
 * probabilities (the pass's vector exp, stored in e), and the token where
 * the mass in kk.h's order first reaches top_p * (total + slack) is found
 * by selection.  Its sums differ from kk.h's (sorted, sequential, exp())
 * by rounding only (within (3e-16 n + 3e-15) of the total); so where the mass ahead of it, plus
 * that, stays below top_p * (total - slack) it is kk.h's cut, else sample_top_p decides. The kept
 * tokens (it and those ahead of it) are then taken from the row in id order and drawn from as kk.h
 * does.  A row too flat for the lowest threshold (e^-24 of the top token) goes to sample_top_p too.
 */
static int32_t sample_top_p_fast(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
				 struct cand *cs, double *e, struct surv *sv)
{
	static const double th[KK__EXP_TH] = { -1, -2, -4, -6, -8, -12, -16, -24 };
	const float top = kk__max(x, (size_t) V);
	if (!isfinite(top))
		return sample_top_p(x, V, p, row, cs, e);
	const double inv_t = 1.0 / p->temperature;
	double mass[KK__EXP_TH];
	const double total = kk__exp_sum_d_th(e, x, (size_t) V, top, inv_t, th, mass);
	const double slack = 3 * exp_sum_slack(total, V);
	int k = 0;
	while (k < KK__EXP_TH && !(mass[k] >= p->top_p * (total + slack) + slack))
		k++;
	if (k == KK__EXP_TH)
		return sample_top_p(x, V, p, row, cs, e);
	/* The band between the threshold above (not enough mass) and this
	 * one, cut in 8 finer steps: the tokens above the step that still
	 * falls short of top_p (with twice the slack) are all ahead of the cut
	 * and enter as their mass (acc); only the step that reaches it is
	 * gathered. */
	const double up = k ? th[k - 1] : 1, down = th[k];
	double sub[KK__EXP_TH], smass[KK__EXP_TH];
	for (int j = 0; j < KK__EXP_TH; j++)
		sub[j] = j == KK__EXP_TH - 1
				 ? down
				 : (k ? up : 0) + (down - (k ? up : 0)) * (j + 1) / KK__EXP_TH;
	kk__mass_th(e, x, (size_t) V, top, inv_t, sub, smass);
	const double lo0 = p->top_p * (total - 2 * slack);
	int j = 0;
	while (j < KK__EXP_TH - 1 && !(smass[j] >= p->top_p * (total + slack) + slack))
		j++;
	double acc = 0, above = up;
	if (j > 0 && smass[j - 1] + slack < lo0)
		acc = smass[j - 1], above = sub[j - 1];
	else if (j == 0 && k > 0 && mass[k - 1] + slack < lo0)
		acc = mass[k - 1];
	else
		above = 1; /* everything from sub[j] up */
	const double floor_a = sub[j], ceil_a = above > 0 ? INFINITY : above;
	int64_t n = 0;
	for (int64_t i = 0; i < V; i++) { /* no branch: a flat row gathers half */
		const double a = ((double) x[i] - top) * inv_t;
		sv[n] = (struct surv){ e[i], x[i], (int32_t) i };
		n += (a >= floor_a) & (a < ceil_a);
	}
	/* the reorderings' rounding and the vector exp's 1e-15 a term on top
	 * of the total's slack (and acc's) */
	const double slack2 = 2 * slack + (3e-16 * (double) n + 3e-15) * total;
	const double lo = p->top_p * (total - slack2), hi = p->top_p * (total + slack2);
	double before = 0;
	const int64_t c = surv_cut(sv, n, acc, hi, &before);
	if (c < 0 || !(before < lo))
		return sample_top_p(x, V, p, row, cs, e);
	/* The kept set in id order: the cut token and those ahead of it. */
	const struct surv cut = sv[c];
	int32_t tok = draw_kept_fast(x, V, p, row, top, cut.x, cut.id, e, (double *) sv);
	if (tok >= 0)
		return tok;
	double sum = 0, cum = 0;
	int64_t keep = 0;
	for (int64_t i = 0; i < V; i++)
		if (x[i] > cut.x || (x[i] == cut.x && cut.id >= i)) {
			cs[keep++] = (struct cand){ x[i], (int32_t) i };
			sum += e[keep - 1] = exp(((double) x[i] - top) / p->temperature);
		}
	const double u = kk_sample_uniform(p->seed, row) * sum;
	for (int64_t i = 0; i < keep; i++) {
		cum += e[i];
		if (cum > u)
			return cs[i].id;
	}
	return cs[keep - 1].id;
}

/* Below this top_k the heap of sample_top_k is cheaper than
 * sample_top_k_fast's passes over the row (measured: k 40 at 32k tokens,
 * 14 us against 88; k 1024, 327 us against 181). */
#define SAMPLE_TOP_K_SELECT 256

/* top_k alone (no top_p): the kept set is the k best, drawn from in id
 * order, so only the k-th best token is needed, not their order.  Every
 * 16th token of the row gives a threshold that about 1.5 k tokens pass
 * (the q-th best of the sample, q = k / 16 + 3 sqrt(k / 16) + 4); those
 * are gathered and the k-th best found among them by selection (unit
 * weights: exact sums); then the draw as draw_kept_fast makes it.  Fewer
 * than k passing, or a draw at a boundary: -1 (sample_top_k decides).
 * sv: V entries. */
static int32_t sample_top_k_fast(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
				 struct surv *sv, double *blocks)
{
	const int64_t k = p->top_k, ns = V / 16;
	const int64_t q = k / 16 + (int64_t) (3 * sqrt((double) k / 16)) + 4;
	if (ns < 4 * q)
		return -1;
	for (int64_t j = 0; j < ns; j++)
		sv[j] = (struct surv){ 1, x[16 * j], (int32_t) (16 * j) };
	double before;
	const int64_t t = surv_cut(sv, ns, 0, (double) q, &before);
	if (t < 0)
		return -1;
	const float tau = sv[t].x;
	int64_t n = 0;
	for (int64_t i = 0; i < V; i++) /* ~1.5 k of V pass: a branch predicts well */
		if (x[i] >= tau)
			sv[n++] = (struct surv){ 1, x[i], (int32_t) i };
	if (n < k)
		return -1;
	const int64_t c = surv_cut(sv, n, 0, (double) k, &before);
	if (c < 0)
		return -1;
	const float top = kk__max(x, (size_t) V);
	return draw_kept_fast(x, V, p, row, top, sv[c].x, sv[c].id, NULL, blocks);
}

/* One thread's buffers: a row widened to f32 (bf16/f16 logits), V
 * candidates, V doubles and V gathered tokens. */
struct sample_scratch {
	int64_t vocab;
	float *row;
	struct cand *cs;
	double *d;
	struct surv *sv;
};

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_err;

static void scratch_free(void *ptr)
{
	struct sample_scratch *s = ptr;
	if (!s)
		return;
	free(s->row);
	free(s->cs);
	free(s->d);
	free(s->sv);
	free(s);
}

static void scratch_key_init(void)
{
	scratch_key_err = pthread_key_create(&scratch_key, scratch_free);
}

/* This thread's scratch for V tokens, grown if needed; NULL: no memory. */
static struct sample_scratch *scratch_get(int64_t V)
{
	pthread_once(&scratch_once, scratch_key_init);
	if (scratch_key_err)
		return NULL;
	struct sample_scratch *s = pthread_getspecific(scratch_key);
	if (s && s->vocab >= V)
		return s;
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s || pthread_setspecific(scratch_key, s) != 0) {
			free(s);
			return NULL;
		}
	}
	free(s->row);
	free(s->cs);
	free(s->d);
	free(s->sv);
	s->row = malloc((size_t) V * sizeof(float));
	s->cs = malloc((size_t) V * sizeof(struct cand));
	s->d = malloc((size_t) V * sizeof(double));
	s->sv = malloc((size_t) V * sizeof(struct surv));
	s->vocab = s->row && s->cs && s->d && s->sv ? V : 0;
	return s->vocab ? s : NULL;
}

/* One row (temperature > 0 or not) with this thread's scratch. */
static int32_t sample_one(const float *x, int64_t V, const kk_sampling *p, uint64_t row,
			  struct sample_scratch *s)
{
	if (p->temperature == 0)
		return arg_max(x, V);
	if (p->top_k > 0 && p->top_k < V) {
		struct cand h[KK_SAMPLE_TOP_K_MAX];
		int32_t tok = -1;
		if (p->top_k >= SAMPLE_TOP_K_SELECT && !(p->top_p > 0 && p->top_p < 1) &&
		    isfinite(kk__max(x, (size_t) V)))
			tok = sample_top_k_fast(x, V, p, row, s->sv, s->d);
		return tok >= 0 ? tok : sample_top_k(x, V, p, row, h, s->d);
	}
	if (p->top_p > 0 && p->top_p < 1)
		return sample_top_p_fast(x, V, p, row, s->cs, s->d, s->sv);
	return sample_all_fast(x, V, p, row, s->d);
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
	const int64_t V = c->vocab;
	struct sample_scratch *s = scratch_get(V);
	if (!s)
		return -ENOMEM;
	for (int64_t r = b; r < e; r++) {
		const float *x;
		if (c->host)
			x = c->host + r * V;
		else if (c->logits->dtype == KK_F32)
			x = (const float *) c->logits->ptr + r * V;
		else {
			kk__row_f32(s->row, c->logits->ptr, c->logits->dtype, (size_t) (r * V),
				    (size_t) V);
			x = s->row;
		}
		c->ids[r] = sample_one(x, V, c->p, (uint64_t) r, s);
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

double kk__cpu_logsumexp(const float *x, int64_t n)
{
	const float top = kk__max(x, (size_t) n);
	if (!isfinite(top))
		return top;
	double s = 0;
	for (int64_t lo = 0; lo < n; lo += SAMPLE_BLOCK)
		s += kk__exp_sum_d(x + lo, (size_t) MIN(n - lo, (int64_t) SAMPLE_BLOCK), top, 1.0);
	return (double) top + log(MAX(s, 1.0)); /* s >= 1: the top's term is 1 */
}

/* The sampler before this file's shortcuts, as it was: every row sorted
 * whole, its buffers allocated per call (make bench's baseline, and the
 * tests' draw-for-draw reference). */
int kk__cpu_sample_host_sorted(const float *logits, int64_t rows, int64_t V, const kk_sampling *p,
			       int32_t *ids)
{
	assert_return(logits && ids && p && rows >= 0 && V >= 1, -EINVAL);
	_cleanup_free_ struct cand *cs = malloc((size_t) V * sizeof(*cs));
	_cleanup_free_ double *pr = malloc((size_t) V * sizeof(double));
	if (!cs || !pr)
		return -ENOMEM;
	for (int64_t r = 0; r < rows; r++) {
		const float *x = logits + r * V;
		int64_t best = 0; /* the scalar arg-max, as before */
		for (int64_t i = 1; i < V; i++)
			if (x[i] > x[best])
				best = i;
		ids[r] = p->temperature == 0 ? (int32_t) best
					     : sample_sorted(x, V, p, (uint64_t) r, cs, pr);
	}
	return 0;
}
