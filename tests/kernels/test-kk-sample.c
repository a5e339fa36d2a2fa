/* tests/kernels/test-kk-sample.c — the cpu sampler (kernels/kk/cpu/sample.c)
 * against kk.h's definition, two ways:
 *   - draw for draw: kk_sample_host and kk_sample (f32, bf16, f16 buffers)
 *     pick the same token as kk__cpu_sample_host_sorted, the sampler that
 *     sorts the whole row, on random rows, rows with ties at every cut,
 *     rows masked to -inf, top_p cuts that land on a probability boundary
 *     exactly, 32k and 128k vocabularies, every parameter combination;
 *   - in distribution: tokens drawn with fixed seeds follow the exact
 *     probabilities a float64 reference written here computes (softmax of
 *     logits / T, the top_k, the top_p prefix, renormalized), by a
 *     chi-square test at p = 1e-6 (deterministic: the seeds are fixed), and
 *     a token outside the kept set is never drawn. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kk.h"
#include "../../kernels/kk/cpu/cpu.h"
#include "../../kernels/kk/kk_internal.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Every parameter combination kk_sampling has: greedy, temperature alone,
 * top_k (small, at its limit, past V), top_p (small, large), both. */
static const kk_sampling CASES[] = {
	{ 0, 0, 1, 1 },		{ 0.8f, 0, 1, 2 },	   { 1.0f, 0, 0, 3 },
	{ 0.8f, 1, 1, 4 },	{ 0.8f, 40, 1, 5 },	   { 1.3f, 1024, 1, 6 },
	{ 0.8f, 0, 0.9f, 7 },	{ 0.5f, 0, 0.1f, 8 },	   { 1.0f, 0, 0.999f, 9 },
	{ 0.8f, 40, 0.9f, 10 }, { 0.7f, 1024, 0.95f, 11 }, { 2.0f, 5, 0.5f, 12 },
	{ 0.8f, 0, 0.9f, 13 },	{ 0.8f, 2, 0.5f, 14 },
};

static uint64_t rng_state = 88172645463325252ull;

static double rnd(void) /* [0, 1) */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (double) (rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static double gauss(void)
{
	return sqrt(-2 * log(1 - rnd())) * cos(6.283185307179586 * rnd());
}

/* Kinds of rows: gaussian logits of a spread, logits on a coarse grid
 * (ties everywhere, at every top_k and top_p cut), a peaked row as a
 * language model gives, a row mostly masked to -inf. */
enum row_kind { ROW_GAUSS, ROW_TIES, ROW_PEAKED, ROW_MASKED, ROW_KINDS };

static void fill_row(float *x, int64_t V, enum row_kind kind)
{
	for (int64_t i = 0; i < V; i++)
		switch (kind) {
		case ROW_GAUSS:
			x[i] = (float) (3 * gauss());
			break;
		case ROW_TIES:
			x[i] = (float) floor(rnd() * 6) * 0.5f;
			break;
		case ROW_PEAKED:
			x[i] = (float) (2 * gauss() + (rnd() < 0.002 ? 12 + 4 * rnd() : 0));
			break;
		default:
			x[i] = rnd() < 0.9 ? -INFINITY : (float) gauss();
			break;
		}
	if (kind == ROW_MASKED)
		x[V / 2] = 1; /* at least one finite logit */
}

/* Draws of rows x[rows, V] by the fast sampler, the cpu backend and the
 * sorting one must agree for every case and seed. */
static void check_same_draws(const float *x, int64_t rows, int64_t V, int seeds)
{
	int32_t *a = malloc(rows * sizeof(int32_t)), *b = malloc(rows * sizeof(int32_t));
	assert_non_null(a);
	assert_non_null(b);
	for (size_t c = 0; c < N(CASES); c++)
		for (int s = 0; s < seeds; s++) {
			kk_sampling p = CASES[c];
			p.seed = p.seed * 7919 + (uint64_t) s;
			assert_int_equal(kk_sample_host(x, rows, V, &p, a), 0);
			assert_int_equal(kk__cpu_sample_host_sorted(x, rows, V, &p, b), 0);
			for (int64_t r = 0; r < rows; r++)
				if (a[r] != b[r]) {
					print_message(
						"case %zu (T %g top_k %d top_p %g) seed %d "
						"row %lld V %lld: %d, the sorted sampler %d\n",
						c, p.temperature, p.top_k, p.top_p, s,
						(long long) r, (long long) V, a[r], b[r]);
					fail();
				}
		}
	free(a);
	free(b);
}

static void test_same_draws_small(void **state)
{
	(void) state;
	static const int64_t VS[] = { 1, 2, 3, 7, 40, 41, 1000, 1025 };
	for (size_t v = 0; v < N(VS); v++)
		for (int kind = 0; kind < ROW_KINDS; kind++) {
			const int64_t V = VS[v], rows = 16;
			float *x = malloc(rows * V * sizeof(float));
			assert_non_null(x);
			for (int64_t r = 0; r < rows; r++)
				fill_row(x + r * V, V, (enum row_kind) kind);
			check_same_draws(x, rows, V, 8);
			free(x);
		}
}

static void test_same_draws_vocab(void **state)
{
	(void) state;
	static const int64_t VS[] = { 32000, 128256 };
	for (size_t v = 0; v < N(VS); v++)
		for (int kind = 0; kind < ROW_KINDS; kind++) {
			const int64_t V = VS[v], rows = 1;
			float *x = malloc(rows * V * sizeof(float));
			assert_non_null(x);
			for (int64_t r = 0; r < rows; r++)
				fill_row(x + r * V, V, (enum row_kind) kind);
			check_same_draws(x, rows, V, 1);
			free(x);
		}
}

/* A top_p cut exactly on a boundary (probabilities 0.4 0.3 0.2 0.1 and
 * top_p 0.7, 0.9, ...: the prefix reaches top_p * total to the last bit or
 * just misses it), and near-boundary cuts in a row of many equal tokens:
 * the one-pass path must fall back or agree, never differ. */
static void test_same_draws_cut_edges(void **state)
{
	(void) state;
	static const float TOP_P[] = { 0.1f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.9f, 0.99f };
	float x4[4] = { logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f) };
	enum { V = 3000 };
	float *flat = malloc(V * sizeof(float));
	assert_non_null(flat);
	for (int i = 0; i < V; i++)
		flat[i] = i % 3 == 0 ? 1.0f : 0.0f;
	for (size_t t = 0; t < N(TOP_P); t++)
		for (int s = 0; s < 64; s++) {
			kk_sampling p = { 1.0f, 0, TOP_P[t], (uint64_t) s };
			int32_t a, b;
			assert_int_equal(kk_sample_host(x4, 1, 4, &p, &a), 0);
			assert_int_equal(kk__cpu_sample_host_sorted(x4, 1, 4, &p, &b), 0);
			assert_int_equal(a, b);
			assert_int_equal(kk_sample_host(flat, 1, V, &p, &a), 0);
			assert_int_equal(kk__cpu_sample_host_sorted(flat, 1, V, &p, &b), 0);
			assert_int_equal(a, b);
		}
	free(flat);
}

/* top_p's one-pass path across temperatures and cuts (its thresholds, the
 * finer band, the mass ahead of it, the selection, the kept set's draw):
 * 5000-token rows of every kind, 4 temperatures x 5 top_p x 24 rows. */
static void test_same_draws_top_p(void **state)
{
	(void) state;
	static const float T[] = { 0.3f, 0.8f, 1.5f, 3.0f };
	static const float P[] = { 0.3f, 0.5f, 0.9f, 0.95f, 0.99f };
	enum { V = 5000 };
	float *x = malloc(V * sizeof(float));
	assert_non_null(x);
	for (int r = 0; r < 24; r++) {
		fill_row(x, V, (enum row_kind)(r % ROW_KINDS));
		for (size_t t = 0; t < N(T); t++)
			for (size_t q = 0; q < N(P); q++) {
				kk_sampling p = { T[t], 0, P[q],
						  (uint64_t) (r * 100 + t * 10 + q) };
				int32_t a, b;
				assert_int_equal(kk_sample_host(x, 1, V, &p, &a), 0);
				assert_int_equal(kk__cpu_sample_host_sorted(x, 1, V, &p, &b), 0);
				if (a != b)
					fail_msg("row %d (kind %d) T %g top_p %g: %d, the sorted "
						 "sampler %d",
						 r, r % ROW_KINDS, T[t], P[q], a, b);
			}
	}
	free(x);
}

/* top_k alone at 256 and above takes the sampled threshold and selection
 * (sample.c's sample_top_k_fast): rows of 20000 tokens of every kind
 * (ties at the k-th token included), 8 seeds each. */
static void test_same_draws_top_k_large(void **state)
{
	(void) state;
	static const int K[] = { 256, 300, 1000, 1024 };
	enum { V = 20000 };
	float *x = malloc(V * sizeof(float));
	assert_non_null(x);
	for (int kind = 0; kind < ROW_KINDS; kind++) {
		fill_row(x, V, (enum row_kind) kind);
		for (size_t k = 0; k < N(K); k++)
			for (uint64_t s = 0; s < 8; s++) {
				kk_sampling p = { 0.9f, K[k], 1, s };
				int32_t a, b;
				assert_int_equal(kk_sample_host(x, 1, V, &p, &a), 0);
				assert_int_equal(kk__cpu_sample_host_sorted(x, 1, V, &p, &b), 0);
				if (a != b)
					fail_msg("kind %d top_k %d seed %llu: %d, the sorted "
						 "sampler %d",
						 kind, K[k], (unsigned long long) s, a, b);
			}
	}
	free(x);
}

/* The cpu backend's kk_sample on f32, bf16 and f16 buffers: the same
 * draws as the sorting sampler on the row as the buffer holds it. */
static void test_backend_dtypes(void **state)
{
	(void) state;
	static const kk_dtype DT[] = { KK_F32, KK_BF16, KK_F16 };
	enum { R = 8, V = 5000 };
	kk_backend *be = NULL;
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	float *x = malloc(R * V * sizeof(float)), *y = malloc(R * V * sizeof(float));
	assert_true(x && y);
	for (int r = 0; r < R; r++)
		fill_row(x + r * V, V, (enum row_kind)(r % ROW_KINDS));
	kk_buffer *ids = NULL;
	assert_int_equal(kk_buffer_alloc(be, KK_I32, R, &ids), 0);
	for (size_t d = 0; d < N(DT); d++) {
		kk_buffer *lb = NULL;
		const size_t es = DT[d] == KK_F32 ? 4 : 2;
		void *h = malloc(R * V * es);
		assert_non_null(h);
		assert_int_equal(kk_convert_host(DT[d], h, KK_F32, x, R * V), 0);
		assert_int_equal(kk_convert_host(KK_F32, y, DT[d], h, R * V), 0);
		assert_int_equal(kk_buffer_alloc(be, DT[d], R * V, &lb), 0);
		assert_int_equal(kk_buffer_upload(be, NULL, lb, 0, h, R * V * es), 0);
		free(h);
		for (size_t c = 0; c < N(CASES); c++) {
			int32_t got[R], want[R];
			assert_int_equal(kk_sample(be, NULL, ids, lb, R, V, &CASES[c]), 0);
			assert_int_equal(kk_buffer_download(be, NULL, ids, 0, got, sizeof(got)), 0);
			assert_int_equal(kk__cpu_sample_host_sorted(y, R, V, &CASES[c], want), 0);
			assert_memory_equal(got, want, sizeof(got));
		}
		kk_buffer_free(lb);
	}
	kk_buffer_free(ids);
	kk_backend_free(be);
	free(x);
	free(y);
}

/* The vectorized float64 exp the one-pass paths sum with is within 1e-15
 * of exp() (sample.c's margins rest on it) from e^0 to e^-700, 0 below,
 * and kk_logsumexp_host within 1e-14 of the float64 log-sum-exp. */
static void test_exp_accuracy(void **state)
{
	(void) state;
	double worst = 0;
	for (int i = 0; i <= 2000000; i++) {
		const float x = (float) (-700.0 * i / 2000000);
		const double got = kk__exp_sum_d(&x, 1, 0, 1), want = exp((double) x);
		worst = fmax(worst, fabs(got - want) / want);
		/* (x - shift) * scale with another shift and scale */
		const float y = (float) (3 * gauss());
		const double sh = 9.5, sc = 1 / 0.7;
		const double g2 = kk__exp_sum_d(&y, 1, sh, sc), w2 = exp(((double) y - sh) * sc);
		worst = fmax(worst, fabs(g2 - w2) / w2);
	}
	print_message("# exp: worst relative error %.3g\n", worst);
	assert_true(worst <= 1e-15);
	const float below = -701, ninf = -INFINITY;
	assert_true(kk__exp_sum_d(&below, 1, 0, 1) == 0 && kk__exp_sum_d(&ninf, 1, 0, 1) == 0);
	assert_true(kk__exp_sum_d((const float[]){ 0 }, 1, 0, 1) == 1);
	enum { V = 100000 };
	float *x = malloc(V * sizeof(float));
	assert_non_null(x);
	fill_row(x, V, ROW_PEAKED);
	double mx = -INFINITY, sum = 0;
	for (int i = 0; i < V; i++)
		mx = fmax(mx, x[i]);
	for (int i = 0; i < V; i++)
		sum += exp(x[i] - mx);
	assert_true(fabs(kk_logsumexp_host(x, V) - (mx + log(sum))) <= 1e-14 * fabs(mx + log(sum)));
	for (int i = 0; i < V; i++)
		x[i] = -INFINITY;
	assert_true(isinf(kk_logsumexp_host(x, V)) && kk_logsumexp_host(x, V) < 0);
	assert_true(isnan(kk_logsumexp_host(NULL, V)));
	free(x);
}

/* Draws that land on a token boundary exactly, where the one-pass sum must
 * give way to the exact walk: 65536 equal logits have boundaries at k /
 * 65536 and the draw u = k / 2^24, so one draw in 256 sits on one; the
 * token is floor(u * V) (the first partial sum past u).  And random rows
 * of 65536 against the walk kk.h defines, computed here (exp() in id
 * order, the first partial sum past u). */
static void test_boundaries(void **state)
{
	(void) state;
	enum { V = 65536 };
	float *x = calloc(V, sizeof(float));
	assert_non_null(x);
	int on = 0;
	for (uint64_t s = 0; s < 4096; s++) {
		kk_sampling p = { 1.0f, 0, 1, s };
		int32_t tok;
		assert_int_equal(kk_sample_host(x, 1, V, &p, &tok), 0);
		const double u = kk_sample_uniform(s, 0) * (double) V;
		on += u == floor(u);
		assert_int_equal(tok, (int32_t) floor(u));
	}
	assert_true(on >= 4); /* the case was met */
	for (int r = 0; r < 64; r++) {
		fill_row(x, V, r % 2 ? ROW_PEAKED : ROW_GAUSS);
		kk_sampling p = { 0.8f, 0, 1, (uint64_t) r };
		float mx = x[0];
		for (int i = 1; i < V; i++)
			mx = x[i] > mx ? x[i] : mx;
		double total = 0, cum = 0;
		for (int i = 0; i < V; i++)
			total += exp(((double) x[i] - mx) / p.temperature);
		const double u = kk_sample_uniform(p.seed, 0) * total;
		int32_t want = V - 1, tok;
		for (int i = 0; i < V; i++) {
			cum += exp(((double) x[i] - mx) / p.temperature);
			if (cum > u) {
				want = i;
				break;
			}
		}
		assert_int_equal(kk_sample_host(x, 1, V, &p, &tok), 0);
		assert_int_equal(tok, want);
	}
	free(x);
}

/* ---- the distribution ---------------------------------------------------- */

struct rc {
	double x;
	int id;
};

static int rc_cmp(const void *a, const void *b)
{
	const struct rc *x = a, *y = b;
	if (x->x != y->x)
		return x->x > y->x ? -1 : 1;
	return x->id - y->id;
}

/* kk.h's distribution in float64, from its words: prob[V] receives each
 * token's probability (0 outside the kept set). */
static void exact_probs(const float *x, int V, const kk_sampling *p, double *prob)
{
	struct rc *c = malloc(V * sizeof(*c));
	assert_non_null(c);
	for (int i = 0; i < V; i++)
		c[i] = (struct rc){ x[i], i };
	qsort(c, V, sizeof(*c), rc_cmp);
	memset(prob, 0, V * sizeof(double));
	int keep = p->top_k > 0 && p->top_k < V ? p->top_k : V;
	double total = 0;
	for (int i = 0; i < keep; i++)
		total += exp((c[i].x - c[0].x) / p->temperature);
	if (p->top_p > 0 && p->top_p < 1) {
		double acc = 0;
		int n = 0;
		while (n < keep) {
			acc += exp((c[n++].x - c[0].x) / p->temperature);
			if (acc >= (double) p->top_p * total)
				break;
		}
		keep = n;
	}
	double kept = 0;
	for (int i = 0; i < keep; i++)
		kept += prob[c[i].id] = exp((c[i].x - c[0].x) / p->temperature);
	for (int i = 0; i < V; i++)
		prob[i] /= kept;
	free(c);
}

/* The chi-square quantile at 1 - 1e-6 for k degrees of freedom
 * (Wilson-Hilferty; z = 4.753). */
static double chi2_crit(int k)
{
	const double z = 4.753424, h = 2.0 / (9.0 * k), t = 1 - h + z * sqrt(h);
	return k * t * t * t;
}

/* n draws of row x (seeds 0..n-1, as the engine advances them) against
 * prob: tokens expected fewer than 5 times are pooled into one cell. */
static void check_distribution(const float *x, int V, const kk_sampling *p0, int n,
			       const char *what)
{
	double *prob = malloc(V * sizeof(double)), *cnt = calloc(V, sizeof(double));
	assert_true(prob && cnt);
	exact_probs(x, V, p0, prob);
	for (int s = 0; s < n; s++) {
		kk_sampling p = *p0;
		p.seed = p0->seed * 1000003u + (uint64_t) s * 0x9E3779B97F4A7C15ull;
		int32_t tok;
		assert_int_equal(kk_sample_host(x, 1, V, &p, &tok), 0);
		assert_true(tok >= 0 && tok < V);
		if (prob[tok] == 0) {
			print_message("%s: token %d drawn, outside the kept set\n", what, tok);
			fail();
		}
		cnt[tok]++;
	}
	double chi = 0, pool_e = 0, pool_o = 0;
	int cells = 0;
	for (int i = 0; i < V; i++) {
		double e = prob[i] * n;
		if (e == 0)
			continue;
		if (e < 5) {
			pool_e += e, pool_o += cnt[i];
			continue;
		}
		chi += (cnt[i] - e) * (cnt[i] - e) / e, cells++;
	}
	if (pool_e > 0)
		chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, cells++;
	if (cells > 1 && chi > chi2_crit(cells - 1)) {
		print_message("%s: chi-square %.1f over %d cells, the 1e-6 quantile is %.1f\n",
			      what, chi, cells, chi2_crit(cells - 1));
		fail();
	}
	free(prob);
	free(cnt);
}

static void test_distribution(void **state)
{
	(void) state;
	static const int VS[] = { 4, 50, 2000 };
	for (size_t v = 0; v < N(VS); v++)
		for (int kind = 0; kind < ROW_KINDS; kind++) {
			const int V = VS[v];
			float *x = malloc(V * sizeof(float));
			assert_non_null(x);
			/* Spread the small rows less so most tokens are seen. */
			fill_row(x, V, (enum row_kind) kind);
			if (V < 1000)
				for (int i = 0; i < V; i++)
					x[i] *= 0.3f;
			for (size_t c = 1; c < N(CASES); c++) {
				char what[96];
				snprintf(what, sizeof(what), "V %d row kind %d case %zu", V, kind,
					 c);
				check_distribution(x, V, &CASES[c], V > 1000 ? 3000 : 20000, what);
			}
			free(x);
		}
}

/* The test catches a sampler that is wrong: draws from the sorting sampler
 * with top_p dropped fail the chi-square against the top_p distribution. */
static void test_distribution_detects(void **state)
{
	(void) state;
	enum { V = 50, n = 20000 };
	float x[V];
	for (int i = 0; i < V; i++)
		x[i] = (float) (0.3 * gauss());
	kk_sampling want = { 1.0f, 0, 0.6f, 1 }, wrong = want;
	wrong.top_p = 1;
	double prob[V], cnt[V] = { 0 }, chi = 0;
	exact_probs(x, V, &want, prob);
	int outside = 0;
	for (int s = 0; s < n; s++) {
		int32_t tok;
		wrong.seed = (uint64_t) s;
		assert_int_equal(kk_sample_host(x, 1, V, &wrong, &tok), 0);
		cnt[tok]++;
		outside += prob[tok] == 0;
	}
	for (int i = 0; i < V; i++)
		if (prob[i] > 0)
			chi += (cnt[i] - prob[i] * n) * (cnt[i] - prob[i] * n) / (prob[i] * n);
	assert_true(outside > 0 && chi > chi2_crit(V));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_draws_small),
		cmocka_unit_test(test_same_draws_vocab),
		cmocka_unit_test(test_same_draws_cut_edges),
		cmocka_unit_test(test_same_draws_top_p),
		cmocka_unit_test(test_same_draws_top_k_large),
		cmocka_unit_test(test_backend_dtypes),
		cmocka_unit_test(test_exp_accuracy),
		cmocka_unit_test(test_boundaries),
		cmocka_unit_test(test_distribution),
		cmocka_unit_test(test_distribution_detects),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
