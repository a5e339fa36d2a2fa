/* tests/inferd/test-engine.c — the inference engine (kiln/engine.h) on the
 * cpu backend with the model fixture (tiny260K.bin, tests/lib/fixture.h).
 *
 * What it checks: requests run concurrently give the tokens each gives when
 * run alone (greedy and seeded sampling; where greedy output diverges the
 * float64 reference in tests/model/ref.c must show a near-tie there), the
 * greedy output from BOS equals the reference's, preemption under a tiny
 * cache keeps every output unchanged and ends with all blocks free, long
 * prompts past the step budget, stop tokens / EOS / max_tokens / the
 * context limit, cancel (waiting and mid-generation), the queue limit
 * (-EAGAIN), impossible prompts rejected at submit, shutdown with requests
 * in flight (exactly one finish each), submits from 8 threads, and the
 * Prometheus metrics.  The cpu backend is not batch-invariant (logits move
 * by ~3e-5 with the batch shape, see docs/inferd-engine.md), so the
 * concurrent runs are made deterministic (one cpu thread, all requests
 * queued behind a gate) and compared token for token. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kiln/engine.h"
#include "kiln/macro.h"
#include "kiln/metrics.h"
#include "kiln/strbuf.h"
#include "kk.h"
#include "kmodel.h"

#include "../model/ref.h"
#include "../lib/fixture.h"

/* Tokens a test request may generate at most. */
#define GEN_MAX 512
/* How long a test waits for finishes before failing (no hangs in CI);
 * $KILN_TEST_WAIT_S overrides it (valgrind runs ~50x slower). */
#define WAIT_S_DEFAULT 120
static int wait_s = WAIT_S_DEFAULT;
/* A greedy divergence is a near-tie when the reference's two logits are
 * closer than this (the cpu backend's batch-shape noise is ~3e-5). */
#define TIE_TOL 1e-3

static const char *fixture;
static kk_backend *be;
static ref_model *ref;

/* the fixture is the build's own: missing is a failure, not a skip */
#define NEED_FIXTURE() KILN_NEED_FIXTURE(fixture)

/* ---- what a request saw ---------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_finished; /* finishes seen since reset */

/* Alternatives recorded per token (the logprobs cases ask for 5). */
#define TOP_MAX 5

typedef struct run {
	uint64_t id;
	int32_t toks[GEN_MAX];
	float lp[GEN_MAX]; /* logprobs, when asked */
	int32_t top[GEN_MAX][TOP_MAX];
	float top_lp[GEN_MAX][TOP_MAX];
	int n_top, lp_events;
	/* prompt logprobs (prompt_logprobs): position i's at [i] (from 1) */
	float plp[600];
	int32_t ptok[600], ptop[600][TOP_MAX];
	float ptop_lp[600][TOP_MAX];
	int n_plp; /* PROMPT events */
	int n, finishes, after_finish, bad_index;
	kiln_engine_finish reason;
	int32_t stop_token;
	char msg[KM_ERROR_MAX];
	/* test hooks, run on the scheduler thread */
	kiln_engine *e;
	int cancel_at;	/* cancel itself after this many tokens (0: no) */
	int stop_at;	/* kiln_engine_stop itself after this many tokens (0: no) */
	bool gate_wait; /* block at the first token until gate_open */
} run;

static bool gate_open;

static void on_event(void *ud, const kiln_engine_event *ev)
{
	run *r = ud;
	pthread_mutex_lock(&mu);
	if (r->finishes)
		r->after_finish++;
	if (ev->id != r->id)
		r->bad_index++;
	if (ev->type == KILN_ENGINE_EVENT_PROMPT) {
		/* positions 1, 2, ... in order, once each, before any token */
		if (ev->index != r->n_plp + 1 || ev->index >= 600 || r->n || ev->n_generated ||
		    !ev->top_ids || ev->n_top > TOP_MAX) {
			r->bad_index++;
		} else {
			r->plp[ev->index] = ev->logprob;
			r->ptok[ev->index] = ev->token;
			r->n_top = ev->n_top;
			memcpy(r->ptop[ev->index], ev->top_ids, (size_t) ev->n_top * 4);
			memcpy(r->ptop_lp[ev->index], ev->top_logprobs, (size_t) ev->n_top * 4);
			r->n_plp++;
		}
	} else if (ev->type == KILN_ENGINE_EVENT_TOKEN) {
		if (ev->index != r->n || ev->n_generated != r->n + 1)
			r->bad_index++;
		if (r->n < GEN_MAX) {
			if (ev->top_ids && ev->n_top <= TOP_MAX) {
				r->lp[r->n] = ev->logprob;
				r->n_top = ev->n_top;
				memcpy(r->top[r->n], ev->top_ids, (size_t) ev->n_top * 4);
				memcpy(r->top_lp[r->n], ev->top_logprobs, (size_t) ev->n_top * 4);
				r->lp_events += ev->n_top > 0 || ev->logprob != 0;
			}
			r->toks[r->n++] = ev->token;
		}
		while (r->gate_wait && !gate_open)
			pthread_cond_wait(&cv, &mu);
	} else {
		r->finishes++;
		r->reason = ev->reason;
		r->stop_token = ev->token;
		if (ev->n_generated != r->n)
			r->bad_index++;
		snprintf(r->msg, sizeof(r->msg), "%s", ev->message ? ev->message : "");
		n_finished++;
		pthread_cond_broadcast(&cv);
	}
	int n = r->n;
	pthread_mutex_unlock(&mu);
	/* (no cmocka asserts on the scheduler thread: count instead) */
	if (ev->type == KILN_ENGINE_EVENT_TOKEN && r->cancel_at && n == r->cancel_at &&
	    kiln_engine_cancel(r->e, r->id) != 0)
		r->bad_index++;
	if (ev->type == KILN_ENGINE_EVENT_TOKEN && r->stop_at && n == r->stop_at &&
	    kiln_engine_stop(r->e, r->id) != 0)
		r->bad_index++;
}

static void reset_counts(void)
{
	pthread_mutex_lock(&mu);
	n_finished = 0;
	gate_open = false;
	pthread_mutex_unlock(&mu);
}

static void open_gate(void)
{
	pthread_mutex_lock(&mu);
	gate_open = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* Engines of the running test: a test that fails mid-way leaves them
 * behind, so a timeout cancels them first (no callback may reach a later
 * test's memory). */
static kiln_engine *live[4];

static void wait_finished(int target)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += wait_s;
	pthread_mutex_lock(&mu);
	while (n_finished < target) {
		if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT) {
			int got = n_finished;
			gate_open = true;
			pthread_cond_broadcast(&cv);
			pthread_mutex_unlock(&mu);
			for (size_t i = 0; i < ARRAY_SIZE(live); i++)
				if (live[i]) { /* stopped, and left behind */
					kiln_engine_shutdown(live[i], KILN_ENGINE_CANCEL);
					live[i] = NULL;
				}
			fail_msg("only %d of %d requests finished within %d s", got, target,
				 wait_s);
		}
	}
	pthread_mutex_unlock(&mu);
}

/* ---- engines and requests ------------------------------------------------ */

static kiln_engine *track(kiln_engine *e)
{
	for (size_t i = 0; i < ARRAY_SIZE(live); i++)
		if (!live[i]) {
			live[i] = e;
			break;
		}
	return e;
}

/* An engine on the fixture with options o (tracked: see live[]). */
static kiln_engine *engine_with(const kiln_engine_opts *o)
{
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(fixture, &f, &err) < 0)
		fail_msg("%s", err.msg);
	km_weight_source src = km_file_source(f);
	kiln_engine *e = NULL;
	int r = kiln_engine_new(be, km_file_config(f), &src, o, &e, &err);
	km_file_free(f);
	if (r < 0)
		fail_msg("kiln_engine_new: %s", err.msg);
	return track(e);
}

static kiln_engine *engine(int running, int step, int blocks, int waiting, int eos)
{
	kiln_engine_opts o = { .weight_dtype = KK_F32,
			       .max_running = running,
			       .max_step_tokens = step,
			       .num_blocks = blocks,
			       .max_waiting = waiting,
			       .eos_token = eos };
	return engine_with(&o);
}

/* The same with prefix caching (no EOS). */
static kiln_engine *prefix_engine(int running, int step, int blocks, int waiting)
{
	kiln_engine_opts o = { .weight_dtype = KK_F32,
			       .max_running = running,
			       .max_step_tokens = step,
			       .num_blocks = blocks,
			       .max_waiting = waiting,
			       .eos_token = -1,
			       .prefix_caching = true };
	return engine_with(&o);
}

/* Frees an engine from engine() (or kiln_engine_new). */
static void engine_free(kiln_engine *e)
{
	for (size_t i = 0; i < ARRAY_SIZE(live); i++)
		if (live[i] == e)
			live[i] = NULL;
	kiln_engine_free(e);
}

typedef struct spec {
	int32_t prompt[600];
	int n_prompt, max_tokens;
	kk_sampling samp;
	const int32_t *stop;
	int n_stop;
	bool ignore_eos;
	bool logprobs;
	int top_logprobs;
	bool prompt_logprobs;
	kiln_engine_processing proc;
} spec;

/* r must be zeroed, its hooks (cancel_at, gate_wait) set, before. */
static int submit(kiln_engine *e, const spec *s, run *r, uint64_t id, kiln_error *err)
{
	r->id = id;
	r->e = e;
	kiln_engine_request q = { .id = id,
				  .prompt = s->prompt,
				  .n_prompt = s->n_prompt,
				  .max_tokens = s->max_tokens,
				  .sampling = s->samp,
				  .stop = s->stop,
				  .n_stop = s->n_stop,
				  .ignore_eos = s->ignore_eos,
				  .logprobs = s->logprobs,
				  .top_logprobs = s->top_logprobs,
				  .prompt_logprobs = s->prompt_logprobs,
				  .proc = s->proc,
				  .cb = on_event,
				  .userdata = r };
	return kiln_engine_submit(e, &q, err);
}

static void must_submit(kiln_engine *e, const spec *s, run *r, uint64_t id)
{
	kiln_error err = {};
	int rc = submit(e, s, r, id, &err);
	if (rc < 0)
		fail_msg("submit %llu: %s (%d)", (unsigned long long) id, err.msg, rc);
}

/* Until the queue is empty (the gate request was admitted alone). */
static void wait_admitted(kiln_engine *e)
{
	kiln_engine_stats st;
	for (int i = 0; i < wait_s * 1000; i++) {
		kiln_engine_get_stats(e, &st);
		if (!st.waiting)
			return;
		usleep(1000);
	}
	fail_msg("the engine admitted nothing within %d s", wait_s);
}

/* Until r (gate_wait set) holds the scheduler at its first token: its
 * step is counted, nothing else runs until open_gate. */
static void wait_gate(run *r)
{
	for (int i = 0; i < wait_s * 1000; i++) {
		pthread_mutex_lock(&mu);
		int n = r->n;
		pthread_mutex_unlock(&mu);
		if (n)
			return;
		usleep(1000);
	}
	fail_msg("request %llu got no token within %d s", (unsigned long long) r->id, wait_s);
}

/* Runs s alone (nothing else in the engine) and returns its tokens in out. */
static void run_alone(kiln_engine *e, const spec *s, run *out)
{
	reset_counts();
	memset(out, 0, sizeof(*out));
	must_submit(e, s, out, 9999);
	wait_finished(1);
}

static unsigned rng = 12345;
static int rnd(int n)
{
	rng = rng * 1103515245u + 12345u;
	return (int) ((rng >> 8) % (unsigned) n);
}

static void random_specs(spec *s, int n, int max_prompt, int min_gen, int max_gen, bool sample)
{
	for (int i = 0; i < n; i++) {
		memset(&s[i], 0, sizeof(s[i]));
		s[i].n_prompt = 1 + rnd(max_prompt);
		s[i].prompt[0] = 1; /* BOS */
		for (int j = 1; j < s[i].n_prompt; j++)
			s[i].prompt[j] = rnd(512);
		s[i].max_tokens = min_gen + rnd(max_gen - min_gen + 1);
		if (sample)
			s[i].samp = (kk_sampling){ .temperature = 0.9f,
						   .top_k = 40,
						   .top_p = 0.95f,
						   .seed = 1000u + (unsigned) i };
	}
}

/* The reference's logits after prompt + toks[0..k) into lg[512]. */
static void ref_context(const spec *s, const int32_t *toks, int k, double *lg)
{
	ref_reset(ref);
	for (int i = 0; i < s->n_prompt; i++)
		ref_step(ref, s->prompt[i], lg);
	for (int i = 0; i < k; i++)
		ref_step(ref, toks[i], lg);
}

/* Why two greedy runs may part at token k: the reference's logits of the
 * two tokens chosen are within TIE_TOL, and the argmax flips with
 * last-bit noise (the cpu backend is not batch-invariant: logits move by
 * up to ~4e-5 with the batch's shape). */
static double divergence_margin(const spec *s, const int32_t *toks, int k, int a, int b)
{
	double *lg = malloc(sizeof(double) * 512);
	assert_non_null(lg);
	ref_context(s, toks, k, lg);
	double m = fabs(lg[a] - lg[b]);
	free(lg);
	return m;
}

/* The engine's seed for a request's n-th token (engine.c token_seed; kk
 * draws u = kk_sample_uniform(seed, 0) for a one-row sample). */
static uint64_t test_token_seed(uint64_t seed, int n)
{
	uint64_t z = seed ^ ((uint64_t) n * UINT64_C(0xD1B54A32D192ED03));
	z = (z ^ (z >> 31)) * UINT64_C(0x9E3779B97F4A7C15);
	return z ^ (z >> 29);
}

static int cmp_desc(const void *a, const void *b)
{
	const double *x = a, *y = b;
	return x[0] > y[0] ? -1 : x[0] < y[0] ? 1 : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Why two sampled runs may part at token k: kk walks the kept tokens in id
 * order (kk.h), so logits moved by rounding shift each CDF boundary by a
 * little; a draw sitting within DRAW_TOL (relative to the kept mass) of a
 * boundary in the float64 reference may land on either side.  Or the
 * top-k/top-p cut falls between two near-equal logits (within TIE_TOL),
 * and rounding swaps which of them is kept, moving the boundaries between
 * their ids by one token's mass.  Returns the draw's relative distance to
 * the nearest boundary, or 0 for a near-tie at the cut (*cut set). */
#define DRAW_TOL 1e-4
static double draw_margin(const spec *s, const int32_t *toks, int k, bool *cut)
{
	enum { V = 512 };
	double *lg = malloc(sizeof(double) * V), (*c)[2] = malloc(sizeof(double) * 2 * V);
	char in[V] = { 0 };
	assert_true(lg && c);
	ref_context(s, toks, k, lg);
	for (int i = 0; i < V; i++)
		c[i][0] = lg[i], c[i][1] = i;
	qsort(c, V, sizeof(c[0]), cmp_desc);
	const kk_sampling *p = &s->samp;
	int keep = p->top_k > 0 && p->top_k < V ? p->top_k : V;
	double total = 0, acc = 0, kept = 0, u, cum = 0, best = 1;
	for (int i = 0; i < keep; i++)
		total += exp((c[i][0] - c[0][0]) / p->temperature);
	if (p->top_p > 0 && p->top_p < 1) {
		int n = 0;
		while (n < keep) {
			acc += exp((c[n++][0] - c[0][0]) / p->temperature);
			if (acc >= p->top_p * total)
				break;
		}
		keep = n;
	}
	*cut = keep < V && c[keep - 1][0] - c[keep][0] < TIE_TOL;
	for (int i = 0; i < keep; i++)
		in[(int) c[i][1]] = 1;
	for (int i = 0; i < V; i++)
		if (in[i])
			kept += exp((lg[i] - c[0][0]) / p->temperature);
	u = kk_sample_uniform(test_token_seed(p->seed, k), 0) * kept;
	for (int i = 0; i < V; i++)
		if (in[i]) {
			cum += exp((lg[i] - c[0][0]) / p->temperature);
			best = fmin(best, fabs(cum - u) / kept);
		}
	free(lg);
	free(c);
	return *cut ? 0 : best;
}

/* Compares each concurrent run with the alone run: identical, or parted
 * at an explained near-tie (returns how many). */
static int compare_runs(const spec *s, const run *alone, const run *conc, int n)
{
	int ties = 0;
	for (int i = 0; i < n; i++) {
		assert_int_equal(conc[i].finishes, 1);
		assert_int_equal(conc[i].after_finish, 0);
		assert_int_equal(conc[i].bad_index, 0);
		int k = 0;
		while (k < alone[i].n && k < conc[i].n && alone[i].toks[k] == conc[i].toks[k])
			k++;
		if (k == alone[i].n && k == conc[i].n) {
			assert_int_equal(conc[i].reason, alone[i].reason);
			continue;
		}
		if (k < alone[i].n && k < conc[i].n && s[i].samp.temperature == 0) {
			double m = divergence_margin(&s[i], alone[i].toks, k, alone[i].toks[k],
						     conc[i].toks[k]);
			print_message("# request %d parts at token %d (%d vs %d); reference "
				      "near-tie margin %.3g\n",
				      i, k, alone[i].toks[k], conc[i].toks[k], m);
			if (m < TIE_TOL) {
				ties++;
				continue;
			}
		} else if (k < alone[i].n && k < conc[i].n) {
			bool cut;
			double m = draw_margin(&s[i], alone[i].toks, k, &cut);
			if (cut)
				print_message("# request %d parts at token %d (%d vs %d); the "
					      "reference's top-k/top-p cut is a near-tie\n",
					      i, k, alone[i].toks[k], conc[i].toks[k]);
			else
				print_message("# request %d parts at token %d (%d vs %d); the draw "
					      "is %.3g of the kept mass from a CDF boundary\n",
					      i, k, alone[i].toks[k], conc[i].toks[k], m);
			if (m < DRAW_TOL) {
				ties++;
				continue;
			}
		}
		fail_msg("request %d: concurrent output differs from alone at token %d of %d/%d "
			 "with no near-tie to explain it",
			 i, k, alone[i].n, conc[i].n);
	}
	return ties;
}

static void check_all_free(kiln_engine *e)
{
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	/* every block free (those the prefix cache keeps count as free: they
	 * are freed on demand) */
	assert_int_equal(st.kv_blocks_used, 0);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.waiting, 0);
}

/* Runs the specs alone, then all at once behind a gate (deterministic
 * batches), and compares.  Returns the engine stats of the concurrent run. */
static void alone_vs_concurrent(kiln_engine *e_alone, kiln_engine *e, const spec *s, int n,
				kiln_engine_stats *st)
{
	run *alone = calloc((size_t) n, sizeof(run)), *conc = calloc((size_t) n + 1, sizeof(run));
	assert_true(alone && conc);
	for (int i = 0; i < n; i++) {
		run_alone(e_alone, &s[i], &alone[i]);
		assert_int_equal(alone[i].finishes, 1);
	}
	reset_counts();
	spec g = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 2 };
	conc[n].gate_wait = true;
	must_submit(e, &g, &conc[n], 7777);
	wait_admitted(e);
	for (int i = 0; i < n; i++)
		must_submit(e, &s[i], &conc[i], (uint64_t) i);
	open_gate();
	wait_finished(n + 1);
	int ties = compare_runs(s, alone, conc, n);
	/* Greedy near-ties are rare (an argmax within 1e-3 of the runner-up);
	 * sampled partings are rare too (a draw within 1e-4 of a boundary),
	 * and each one is checked to be one. */
	if (s[0].samp.temperature == 0)
		assert_true(ties <= n / 8);
	int total = 0;
	for (int i = 0; i < n; i++)
		total += conc[i].n;
	print_message("# %d requests, %d tokens: identical to each run alone but %d parted at "
		      "explained near-ties)\n",
		      n, total, ties);
	kiln_engine_get_stats(e, st);
	check_all_free(e);
	free(alone);
	free(conc);
}

/* ---- tests ------------------------------------------------------------------ */

static void test_greedy_concurrent(void **state)
{
	NEED_FIXTURE();
	kiln_engine *ea = engine(4, 256, 256, 64, -1), *e = engine(16, 256, 256, 64, -1);
	spec *s = calloc(32, sizeof(spec));
	random_specs(s, 32, 40, 5, 80, false);
	kiln_engine_stats st;
	alone_vs_concurrent(ea, e, s, 32, &st);
	assert_true(st.steps > 0);
	free(s);
	engine_free(ea);
	engine_free(e);
}

static void test_sampled_concurrent(void **state)
{
	NEED_FIXTURE();
	kiln_engine *ea = engine(4, 256, 256, 64, -1), *e = engine(16, 256, 256, 64, -1);
	spec *s = calloc(24, sizeof(spec));
	random_specs(s, 24, 30, 10, 60, true);
	kiln_engine_stats st;
	alone_vs_concurrent(ea, e, s, 24, &st);
	/* The seed matters: another seed gives another output. */
	run a, b;
	run_alone(ea, &s[0], &a);
	s[0].samp.seed += 1;
	run_alone(ea, &s[0], &b);
	assert_true(a.n != b.n || memcmp(a.toks, b.toks, sizeof(int32_t) * (size_t) a.n) != 0);
	free(s);
	engine_free(ea);
	engine_free(e);
}

/* The engine's greedy output from BOS is the float64 reference's. */
static void test_matches_reference(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(4, 64, 64, 8, -1);
	spec s = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 200 };
	run r;
	run_alone(e, &s, &r);
	assert_int_equal(r.n, 200);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_LENGTH);
	double *lg = malloc(sizeof(double) * 512);
	ref_reset(ref);
	int tok = 1;
	for (int i = 0; i < 200; i++) {
		ref_step(ref, tok, lg);
		tok = ref_argmax(lg, 512);
		if (tok != r.toks[i])
			fail_msg("token %d: engine %d, reference %d", i, r.toks[i], tok);
	}
	free(lg);
	engine_free(e);
}

static void test_preemption(void **state)
{
	NEED_FIXTURE();
	/* 10 blocks = 160 tokens for 8 requests that want up to 24 + 60 each. */
	kiln_engine *ea = engine(8, 128, 64, 64, -1), *e = engine(8, 128, 10, 64, -1);
	spec *s = calloc(12, sizeof(spec));
	random_specs(s, 12, 24, 40, 60, false);
	kiln_engine_stats st;
	alone_vs_concurrent(ea, e, s, 12, &st);
	print_message("# preemptions %llu, prefill tokens %llu for %llu prompt tokens\n",
		      (unsigned long long) st.preemptions, (unsigned long long) st.prefill_tokens,
		      (unsigned long long) st.prompt_tokens);
	assert_true(st.preemptions >= 3);
	assert_true(st.prefill_tokens > st.prompt_tokens); /* recomputation happened */
	/* The same with seeded sampling. */
	random_specs(s, 12, 24, 40, 60, true);
	uint64_t before = st.preemptions;
	alone_vs_concurrent(ea, e, s, 12, &st);
	assert_true(st.preemptions > before);
	free(s);
	engine_free(ea);
	engine_free(e);
}

/* A prompt longer than the step budget prefills in chunks of the budget
 * (ceil(90 / 32) = 3 steps, not 1 + 58 catch-up steps), samples only after
 * the last chunk, and gives the reference's tokens and a big-budget
 * engine's; the same through a budget the decodes share. */
static void test_long_prompt(void **state)
{
	NEED_FIXTURE();
	kiln_engine *big = engine(4, 256, 64, 8, -1), *small = engine(4, 32, 64, 8, -1);
	spec *s = calloc(1, sizeof(spec));
	random_specs(s, 1, 1, 20, 20, false);
	s->n_prompt = 90;
	for (int i = 1; i < 90; i++)
		s->prompt[i] = (i * 37) % 512;
	run a, b;
	run_alone(big, s, &a);
	run_alone(small, s, &b);
	assert_int_equal(a.n, 20);
	assert_int_equal(b.n, 20);
	/* Greedy against the float64 reference. */
	double *lg = malloc(sizeof(double) * 512);
	ref_reset(ref);
	for (int i = 0; i < 90 - 1; i++)
		ref_step(ref, s->prompt[i], lg);
	int tok = s->prompt[89];
	for (int i = 0; i < 20; i++) {
		ref_step(ref, tok, lg);
		tok = ref_argmax(lg, 512);
		if (tok != b.toks[i])
			fail_msg("token %d: chunked %d, reference %d", i, b.toks[i], tok);
	}
	free(lg);
	assert_memory_equal(a.toks, b.toks, sizeof(int32_t) * 20);
	kiln_engine_stats st;
	kiln_engine_get_stats(small, &st);
	assert_int_equal(st.prefill_tokens, 90);
	/* 3 prefill steps (the third samples token 0), then 19 decodes. */
	assert_int_equal(st.steps, 3 + 19);

	/* Behind a running request the long one gets 32 - 1 tokens a step:
	 * ceil(90 / 31) = 3 prefill steps, the same tokens. */
	reset_counts();
	spec *g = calloc(1, sizeof(spec));
	random_specs(g, 1, 1, 40, 40, false);
	run rg = { .gate_wait = true }, rl = {};
	must_submit(small, g, &rg, 1);
	wait_gate(&rg);
	must_submit(small, s, &rl, 2);
	kiln_engine_get_stats(small, &st);
	uint64_t steps0 = st.steps, pre0 = st.prefill_tokens;
	open_gate();
	wait_finished(2);
	assert_int_equal(rl.n, 20);
	assert_memory_equal(a.toks, rl.toks, sizeof(int32_t) * 20);
	assert_int_equal(rg.n, 40);
	kiln_engine_get_stats(small, &st);
	assert_int_equal(st.prefill_tokens - pre0, 90);
	/* The gate's 39 decodes after its first token overlap the long
	 * prompt's 3 + 19 steps entirely: 39 steps, and none more. */
	assert_int_equal(st.steps - steps0, 39);
	free(g);
	free(s);
	engine_free(big);
	engine_free(small);
}

/* A prefix-cache tail longer than the step budget: the request forks the
 * donor's 64 tokens and prefills its 40-token tail in chunks of what the
 * donor's decode leaves (16 - 1 = 15: ceil(40 / 15) = 3 steps), and gives
 * the tokens it gives alone. */
static void test_prefix_tail_chunked(void **state)
{
	NEED_FIXTURE();
	kiln_engine *ea = engine(4, 128, 64, 8, -1);
	kiln_engine *e = prefix_engine(2, 16, 64, 4);
	spec *s = calloc(2, sizeof(spec));
	random_specs(s, 2, 1, 10, 10, false);
	s[0].max_tokens = 40;
	s[0].n_prompt = 64;
	s[1].n_prompt = 64 + 40;
	for (int i = 0; i < 2; i++)
		for (int j = 1; j < s[i].n_prompt; j++)
			s[i].prompt[j] = j < 64 ? (j * 13 + 7) % 512 : (j * 71) % 512;
	run alone[2], conc[2] = { { .gate_wait = true }, {} };
	for (int i = 0; i < 2; i++)
		run_alone(ea, &s[i], &alone[i]);
	reset_counts();
	must_submit(e, &s[0], &conc[0], 0);
	wait_gate(&conc[0]); /* prefilled in 4 chunks of 16, token 0 sampled */
	must_submit(e, &s[1], &conc[1], 1);
	open_gate();
	wait_finished(2);
	compare_runs(s, alone, conc, 2);
	assert_int_equal(conc[1].n, 10);
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	print_message("# prefix tail: %llu shared, %llu prefilled, %llu steps\n",
		      (unsigned long long) st.prefix_hits, (unsigned long long) st.prefill_tokens,
		      (unsigned long long) st.steps);
	assert_int_equal(st.prefix_hits, 64);
	assert_int_equal(st.prefix_queries, 64 + 104);
	assert_int_equal(st.prefill_tokens, 64 + 40);
	/* The donor: 4 prefill steps, then 39 decodes; the forked request's
	 * 3 tail chunks and 9 decodes fit inside them (a tail fed one token
	 * a step would take 40 + 9 = 49 steps, past the donor's end). */
	assert_int_equal(st.steps, 4 + 39);
	check_all_free(e);
	free(s);
	engine_free(e);
	engine_free(ea);
}

/* Prefix caching: requests sharing a 64-token prompt prefix with a running
 * one fork its blocks, prefill nothing, and give the tokens they give alone
 * (near-ties explained as elsewhere). */
static void test_prefix_caching(void **state)
{
	NEED_FIXTURE();
	kiln_engine *ea = engine(4, 128, 64, 8, -1);
	kiln_engine *e = prefix_engine(8, 128, 64, 16);
	enum { N = 6 };
	spec *s = calloc(N, sizeof(spec));
	random_specs(s, N, 1, 20, 40, false);
	/* s[0] holds the prefix; s[1..] share it, with tails of 1..40 tokens
	 * (each prefilled in one chunk on top of the forked blocks). */
	const int tails[N] = { 5, 1, 7, 16, 30, 40 };
	for (int i = 0; i < N; i++) {
		s[i].n_prompt = 64 + tails[i];
		for (int j = 1; j < 64; j++)
			s[i].prompt[j] = (j * 29 + 3) % 512;
		/* the tails agree on their first 3 tokens too: the shared
		 * prefix is 67 tokens, of which whole blocks (64) fork */
		for (int j = 64; j < s[i].n_prompt; j++)
			s[i].prompt[j] = j < 67 ? 100 + j : rnd(512);
	}
	s[2].samp = (kk_sampling){ .temperature = 0.8f, .top_k = 20, .seed = 5 };
	run *alone = calloc(N, sizeof(run)), *conc = calloc(N, sizeof(run));
	for (int i = 0; i < N; i++)
		run_alone(ea, &s[i], &alone[i]);
	reset_counts();
	conc[0].gate_wait = true; /* s[0] prefilled, then waits at its first token */
	must_submit(e, &s[0], &conc[0], 0);
	wait_admitted(e);
	for (int i = 1; i < N; i++)
		must_submit(e, &s[i], &conc[i], (uint64_t) i);
	open_gate();
	wait_finished(N);
	compare_runs(s, alone, conc, N);
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	int q = 0;
	for (int i = 0; i < N; i++)
		q += s[i].n_prompt;
	print_message("# prefix cache: %llu of %llu prompt tokens shared, %llu prefilled\n",
		      (unsigned long long) st.prefix_hits, (unsigned long long) st.prefix_queries,
		      (unsigned long long) st.prefill_tokens);
	int tail_sum = 0;
	for (int i = 1; i < N; i++)
		tail_sum += tails[i];
	assert_int_equal(st.prefix_hits, (N - 1) * 64);
	assert_int_equal(st.prefix_queries, q);
	assert_int_equal(st.prefill_tokens, s[0].n_prompt + tail_sum);
	check_all_free(e);
	free(s);
	free(alone);
	free(conc);
	engine_free(e);
	engine_free(ea);
}

/* Prefix caching keeps finished requests' whole blocks: the same long
 * prompt again shares all its whole blocks (96 of 100 tokens, 4
 * prefilled) and gives the same greedy tokens; a prompt that needs the
 * kept blocks evicts them (LRU), runs, and afterwards every block is free
 * but the ones its own kept prefix holds; the metrics show it. */
static void test_prefix_kept(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = prefix_engine(4, 128, 20, 8);
	spec *s = calloc(1, sizeof(spec));
	run *a = calloc(1, sizeof(run)), *b = calloc(1, sizeof(run));
	s->n_prompt = 100;
	s->prompt[0] = 1;
	for (int i = 1; i < 100; i++)
		s->prompt[i] = (i * 53 + 7) % 512;
	s->max_tokens = 20;
	kiln_engine_stats st;
	run_alone(e, s, a);
	kiln_engine_get_stats(e, &st);
	/* 119 tokens cached (the 20th is sampled, never fed): 7 whole blocks */
	assert_int_equal(st.prefix_hits, 0);
	assert_int_equal(st.prefix_entries, 1);
	assert_int_equal(st.prefix_blocks, 7);
	assert_int_equal(st.kv_blocks_used, 0); /* kept blocks count as free */
	run_alone(e, s, b);
	kiln_engine_get_stats(e, &st);
	print_message("# kept prefix: %llu of %llu prompt tokens shared, %llu prefilled\n",
		      (unsigned long long) st.prefix_hits, (unsigned long long) st.prefix_queries,
		      (unsigned long long) st.prefill_tokens);
	assert_int_equal(st.prefix_hits, 96);
	assert_int_equal(st.prefix_queries, 200);
	assert_int_equal(st.prefill_tokens, 100 + 4);
	assert_int_equal(b->n, 20);
	for (int k = 0; k < 20; k++)
		if (a->toks[k] != b->toks[k]) {
			double m = divergence_margin(s, a->toks, k, a->toks[k], b->toks[k]);
			if (m > TIE_TOL)
				fail_msg("token %d: %d first, %d from the kept prefix (margin %g)",
					 k, a->toks[k], b->toks[k], m);
			break;
		}
	assert_int_equal(st.prefix_entries, 1); /* the same prefix, kept once */
	/* 300 tokens need 19 of the 20 blocks: the kept 7 are evicted. */
	spec *big = calloc(1, sizeof(spec));
	big->n_prompt = 300;
	big->prompt[0] = 1;
	for (int i = 1; i < 300; i++)
		big->prompt[i] = (i * 31 + 11) % 512;
	big->max_tokens = 5;
	run_alone(e, big, b);
	assert_int_equal(b->n, 5);
	assert_int_equal(b->reason, KILN_ENGINE_FINISH_LENGTH);
	kiln_engine_get_stats(e, &st);
	assert_int_equal(st.prefix_evictions, 1);
	assert_int_equal(st.prefix_entries, 1);
	assert_int_equal(st.prefix_blocks, 19); /* 304 tokens cached */
	check_all_free(e);
	/* The first prompt again: no hit left (evicted), and it evicts the
	 * big one in turn; its greedy tokens are still the first run's. */
	run_alone(e, s, b);
	kiln_engine_get_stats(e, &st);
	assert_int_equal(st.prefix_hits, 96);
	assert_int_equal(st.prefix_evictions, 2);
	assert_int_equal(st.prefix_blocks, 7);
	assert_memory_equal(a->toks, b->toks, sizeof(int32_t) * 20);
	check_all_free(e);
	_cleanup_strbuf_ kiln_strbuf mb;
	kiln_strbuf_init(&mb);
	kiln_metrics m;
	kiln_metrics_init(&m, &mb);
	assert_int_equal(kiln_engine_metrics(&e, (const char *[]){ "m" }, 1, &m), 0);
	assert_int_equal(kiln_metrics_finish(&m), 0);
	const char *want[] = {
		"vllm:prefix_cache_hits_total{model_name=\"m\"} 96\n",
		"vllm:prefix_cache_queries_total{model_name=\"m\"} 600\n",
		"kiln_inferd_prefix_cache_blocks{model_name=\"m\"} 7\n",
		"kiln_inferd_prefix_cache_evictions_total{model_name=\"m\"} 2\n",
		"kiln_inferd_kv_cache_blocks{model_name=\"m\",state=\"used\"} 0\n",
		"kiln_inferd_kv_cache_blocks{model_name=\"m\",state=\"free\"} 20\n"
	};
	for (size_t i = 0; i < ARRAY_SIZE(want); i++)
		if (!strstr(mb.s, want[i]))
			fail_msg("metrics lack \"%s\":\n%s", want[i], mb.s);
	free(s);
	free(big);
	free(a);
	free(b);
	engine_free(e);
}

/* n samples of one prompt (4 identical 100-token prompts at once): the
 * first prefills, the other three wait one step and fork its 96 whole
 * tokens (4 prefilled each) instead of prefilling all 100 again; greedy,
 * all four give the tokens of the prompt run alone. */
static void test_prefix_siblings(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = prefix_engine(8, 128, 64, 8);
	kiln_engine *ea = engine(4, 128, 64, 8, -1);
	spec *s = calloc(1, sizeof(spec));
	run *alone = calloc(1, sizeof(run)), *r = calloc(4, sizeof(run));
	s->n_prompt = 100;
	s->prompt[0] = 1;
	for (int i = 1; i < 100; i++)
		s->prompt[i] = (i * 71 + 3) % 512;
	s->max_tokens = 12;
	run_alone(ea, s, alone);
	/* All four queued behind a gate request, so they meet the scheduler
	 * together (not the first alone before the rest arrive). */
	reset_counts();
	spec g = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 2 };
	run *rg = calloc(1, sizeof(run));
	rg->gate_wait = true;
	must_submit(e, &g, rg, 7777);
	wait_gate(rg);
	for (int i = 0; i < 4; i++)
		must_submit(e, s, &r[i], 100 + (uint64_t) i);
	open_gate();
	wait_finished(5);
	free(rg);
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	print_message("# 4 siblings: %llu of %llu prompt tokens shared, %llu prefilled\n",
		      (unsigned long long) st.prefix_hits, (unsigned long long) st.prefix_queries,
		      (unsigned long long) st.prefill_tokens);
	assert_int_equal(st.prefix_hits, 3 * 96);
	assert_int_equal(st.prefill_tokens, 1 + 100 + 3 * 4); /* the gate's 1 */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(r[i].n, 12);
		for (int k = 0; k < 12; k++)
			if (r[i].toks[k] != alone->toks[k]) {
				double m = divergence_margin(s, alone->toks, k, alone->toks[k],
							     r[i].toks[k]);
				if (m > TIE_TOL)
					fail_msg("sibling %d token %d: %d, alone %d (margin %g)", i,
						 k, r[i].toks[k], alone->toks[k], m);
				break;
			}
	}
	check_all_free(e);
	free(s);
	free(alone);
	free(r);
	engine_free(e);
	engine_free(ea);
}

static void test_stop_and_length(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(4, 64, 64, 8, -1);
	spec s = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 60 };
	run base, r;
	run_alone(e, &s, &base);
	assert_int_equal(base.n, 60);
	/* A stop id: the first token at index >= 5 that did not occur before. */
	int k = 5;
	for (;; k++) {
		assert_true(k < 60);
		bool seen = false;
		for (int j = 0; j < k; j++)
			seen |= base.toks[j] == base.toks[k];
		if (!seen)
			break;
	}
	int32_t stop[2] = { -1, base.toks[k] };
	for (int id = 511; stop[0] < 0; id--) { /* an id base never produced */
		bool seen = false;
		for (int j = 0; j < base.n; j++)
			seen |= base.toks[j] == id;
		if (!seen)
			stop[0] = id;
	}
	s.stop = stop;
	s.n_stop = 2;
	run_alone(e, &s, &r);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_STOP);
	assert_int_equal(r.stop_token, base.toks[k]);
	assert_int_equal(r.n, k); /* the stop token itself is not delivered */
	assert_memory_equal(r.toks, base.toks, sizeof(int32_t) * (size_t) k);
	/* max_tokens */
	s.n_stop = 0;
	s.max_tokens = 7;
	run_alone(e, &s, &r);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(r.n, 7);
	assert_int_equal(r.stop_token, -1);
	engine_free(e);

	/* EOS (an engine option), and ignore_eos. */
	e = engine(4, 64, 64, 8, base.toks[k]);
	s.max_tokens = 60;
	run_alone(e, &s, &r);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_STOP);
	assert_int_equal(r.n, k);
	s.ignore_eos = true;
	run_alone(e, &s, &r);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(r.n, 60);
	engine_free(e);

	/* The context (512) ends a request: a 500-token prompt gets 13 tokens
	 * (positions 500..511 fed, plus the last one sampled). */
	e = engine(4, 512, 64, 8, -1);
	spec *l = calloc(1, sizeof(spec));
	l->n_prompt = 500;
	l->max_tokens = 100;
	l->prompt[0] = 1;
	for (int i = 1; i < 500; i++)
		l->prompt[i] = (i * 11) % 512;
	run_alone(e, l, &r);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(r.n, 13);
	check_all_free(e);
	free(l);
	engine_free(e);
}

static void test_cancel(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(2, 64, 64, 8, -1);
	reset_counts();
	spec s = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 400 };
	run *r = calloc(4, sizeof(run));
	/* r[0] cancels itself mid-generation from its callback; r[1] and
	 * r[2] fill the two slots so r[3] waits and is cancelled there. */
	r[0].cancel_at = 5;
	must_submit(e, &s, &r[0], 1);
	s.max_tokens = 300;
	must_submit(e, &s, &r[1], 2);
	must_submit(e, &s, &r[2], 3);
	must_submit(e, &s, &r[3], 4);
	assert_int_equal(kiln_engine_cancel(e, 4), 0);
	assert_int_equal(kiln_engine_cancel(e, 12345), -ENOENT);
	wait_finished(1);
	/* r[3] (waiting) or r[0] (5 tokens) finishes first; then cancel r[1]. */
	assert_int_equal(kiln_engine_cancel(e, 2), 0);
	wait_finished(3);
	assert_int_equal(r[3].reason, KILN_ENGINE_FINISH_CANCELLED);
	assert_int_equal(r[3].n, 0);
	assert_int_equal(r[0].reason, KILN_ENGINE_FINISH_CANCELLED);
	assert_true(r[0].n >= 5 && r[0].n <= 6);
	assert_int_equal(r[1].reason, KILN_ENGINE_FINISH_CANCELLED);
	assert_true(r[1].n < 300);
	wait_finished(4);
	assert_int_equal(r[2].reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(kiln_engine_cancel(e, 3), -ENOENT); /* finished */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(r[i].finishes, 1);
		assert_int_equal(r[i].after_finish, 0);
	}
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	assert_int_equal(st.requests_finished[KILN_ENGINE_FINISH_CANCELLED], 3);
	assert_int_equal(st.requests_finished[KILN_ENGINE_FINISH_LENGTH], 1);
	check_all_free(e);
	free(r);
	engine_free(e);
}

/* A stop string found by the caller (kiln_engine_stop) ends the request
 * with FINISH_STOP and is counted as a stop, not as a cancel. */
static void test_stop_by_caller(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(2, 64, 64, 8, -1);
	reset_counts();
	spec s = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 400 };
	run *r = calloc(2, sizeof(run));
	r[0].stop_at = 4;
	must_submit(e, &s, &r[0], 1);
	r[1].cancel_at = 4;
	must_submit(e, &s, &r[1], 2);
	wait_finished(2);
	assert_int_equal(r[0].reason, KILN_ENGINE_FINISH_STOP);
	assert_int_equal(r[1].reason, KILN_ENGINE_FINISH_CANCELLED);
	assert_int_equal(r[0].bad_index + r[1].bad_index, 0);
	assert_int_equal(kiln_engine_stop(e, 1), -ENOENT); /* finished */
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	assert_int_equal(st.requests_finished[KILN_ENGINE_FINISH_STOP], 1);
	assert_int_equal(st.requests_finished[KILN_ENGINE_FINISH_CANCELLED], 1);
	check_all_free(e);
	free(r);
	engine_free(e);
}

static void test_queue_full(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(1, 64, 64, 4, -1);
	reset_counts();
	spec s = { .n_prompt = 3, .prompt = { 1, 5, 9 }, .max_tokens = 3 };
	run *r = calloc(6, sizeof(run));
	/* r[0] runs and blocks the scheduler in its first token's callback. */
	r[0].gate_wait = true;
	must_submit(e, &s, &r[0], 0);
	wait_admitted(e);
	for (int i = 1; i <= 4; i++)
		must_submit(e, &s, &r[i], (uint64_t) i);
	kiln_error err = {};
	assert_int_equal(submit(e, &s, &r[5], 5, &err), -EAGAIN);
	assert_string_equal(err.msg,
			    "request 5: 4 requests are waiting already (the limit); retry later");
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	assert_int_equal(st.requests_rejected, 1); /* kiln_inferd_num_requests_rejected_total */
	open_gate();
	wait_finished(5);
	for (int i = 0; i <= 4; i++)
		assert_int_equal(r[i].n, 3);
	assert_int_equal(r[5].finishes, 0);
	/* Room again. */
	reset_counts();
	memset(&r[5], 0, sizeof(r[5]));
	must_submit(e, &s, &r[5], 5);
	wait_finished(1);
	free(r);
	engine_free(e);
}

static void test_rejects(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(2, 64, 4, 8, -1);
	kiln_error err = {};
	run r = {};
	spec *s = calloc(1, sizeof(spec));
	s->n_prompt = 513;
	s->max_tokens = 1;
	assert_int_equal(submit(e, s, &r, 1, &err), -E2BIG);
	assert_string_equal(err.msg, "request 1: the prompt has 513 tokens, more than the model's "
				     "context of 512; shorten it");
	s->n_prompt = 65;
	assert_int_equal(submit(e, s, &r, 2, &err), -E2BIG);
	assert_string_equal(err.msg,
			    "request 2: the prompt has 65 tokens, more than the whole KV cache "
			    "holds (4 blocks of 16); shorten it or give the server a larger cache");
	s->n_prompt = 3;
	s->prompt[1] = 512;
	assert_int_equal(submit(e, s, &r, 3, &err), -EINVAL);
	assert_string_equal(err.msg,
			    "request 3: prompt token 1 is 512, outside the vocabulary (0..511)");
	s->prompt[1] = 7;
	s->n_prompt = 0;
	assert_int_equal(submit(e, s, &r, 4, &err), -EINVAL);
	assert_string_equal(err.msg, "request 4: the prompt is empty");
	s->n_prompt = 3;
	s->max_tokens = -1;
	assert_int_equal(submit(e, s, &r, 5, &err), -EINVAL);
	assert_string_equal(err.msg, "request 5: max_tokens is -1, must be >= 0");
	s->max_tokens = 4;
	s->prompt_logprobs = true;
	assert_int_equal(submit(e, s, &r, 5, &err), -EINVAL);
	assert_string_equal(err.msg, "request 5: prompt_logprobs needs logprobs");
	s->prompt_logprobs = false;
	s->samp.temperature = -1;
	assert_int_equal(submit(e, s, &r, 6, &err), -EINVAL);
	s->samp.temperature = 1;
	s->samp.top_p = 1.5f;
	assert_int_equal(submit(e, s, &r, 7, &err), -EINVAL);
	s->samp.top_p = 0;
	s->samp.top_k = KK_SAMPLE_TOP_K_MAX + 1;
	assert_int_equal(submit(e, s, &r, 8, &err), -EINVAL);
	s->samp.top_k = 0;
	s->n_stop = KILN_ENGINE_STOP_MAX + 1;
	s->stop = s->prompt;
	assert_int_equal(submit(e, s, &r, 9, &err), -EINVAL);
	s->n_stop = 0;
	/* A prompt exactly the cache's size is accepted and finishes by
	 * length once the cache cannot hold more. */
	s->n_prompt = 64;
	s->max_tokens = 10;
	reset_counts();
	must_submit(e, s, &r, 10);
	wait_finished(1);
	assert_int_equal(r.reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(r.n, 1);
	assert_string_equal(r.msg, "the KV cache cannot hold a longer context");
	check_all_free(e);
	free(s);
	engine_free(e);

	/* Bad options. */
	km_file *f = NULL;
	assert_int_equal(km_file_open(fixture, &f, &err), 0);
	km_weight_source src = km_file_source(f);
	kiln_engine_opts o = { .max_running = 8, .max_step_tokens = 4 };
	kiln_engine *x = NULL;
	assert_int_equal(kiln_engine_new(be, km_file_config(f), &src, &o, &x, &err), -EINVAL);
	assert_string_equal(err.msg, "engine options: max_step_tokens 4 is below max_running 8 "
				     "(every running sequence brings a token each step)");
	o = (kiln_engine_opts){ .eos_token = 512 };
	assert_int_equal(kiln_engine_new(be, km_file_config(f), &src, &o, &x, &err), -EINVAL);
	assert_null(x);
	km_file_free(f);
}

static void test_shutdown_in_flight(void **state)
{
	NEED_FIXTURE();
	for (int mode = 0; mode < 2; mode++) {
		kiln_engine *e = engine(4, 64, 64, 64, -1);
		reset_counts();
		spec s = { .n_prompt = 2, .prompt = { 1, 42 }, .max_tokens = 200 };
		run *r = calloc(12, sizeof(run));
		for (int i = 0; i < 12; i++)
			must_submit(e, &s, &r[i], (uint64_t) i);
		usleep(20000);
		kiln_engine_shutdown(e, mode ? KILN_ENGINE_CANCEL : KILN_ENGINE_DRAIN);
		kiln_error err = {};
		run late = {};
		assert_int_equal(submit(e, &s, &late, 99, &err), -ESHUTDOWN);
		int cancelled = 0;
		for (int i = 0; i < 12; i++) {
			assert_int_equal(r[i].finishes, 1);
			assert_int_equal(r[i].after_finish, 0);
			if (mode == 0) {
				assert_int_equal(r[i].reason, KILN_ENGINE_FINISH_LENGTH);
				assert_int_equal(r[i].n, 200);
			}
			cancelled += r[i].reason == KILN_ENGINE_FINISH_CANCELLED;
		}
		if (mode == 1)
			assert_true(cancelled >=
				    8); /* at most 4 ran, 20 ms is far from 200 tokens */
		print_message("# shutdown %s: 12 in flight, %d cancelled\n",
			      mode ? "cancel" : "drain", cancelled);
		check_all_free(e);
		engine_free(e);
		free(r);
	}
}

typedef struct submitter {
	kiln_engine *e;
	spec *s;
	run *r;
	int base, n, rejected;
} submitter;

static void *submit_thread(void *arg)
{
	submitter *t = arg;
	for (int i = 0; i < t->n; i++) {
		kiln_error err;
		int rc = submit(t->e, &t->s[t->base + i], &t->r[t->base + i],
				(uint64_t) (t->base + i), &err);
		if (rc < 0)
			t->rejected++;
	}
	return NULL;
}

static void test_threads(void **state)
{
	NEED_FIXTURE();
	enum { THREADS = 8, PER = 12, N = THREADS * PER };
	kiln_engine *e = engine(16, 128, 128, N, -1), *ea = engine(4, 128, 128, 8, -1);
	spec *s = calloc(N, sizeof(spec));
	run *r = calloc(N, sizeof(run));
	random_specs(s, N, 20, 5, 20, false);
	reset_counts();
	pthread_t th[THREADS];
	submitter t[THREADS];
	for (int i = 0; i < THREADS; i++) {
		t[i] = (submitter){ e, s, r, i * PER, PER, 0 };
		assert_int_equal(pthread_create(&th[i], NULL, submit_thread, &t[i]), 0);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(t[i].rejected, 0);
	}
	wait_finished(N);
	uint64_t total = 0;
	for (int i = 0; i < N; i++) {
		assert_int_equal(r[i].finishes, 1);
		assert_int_equal(r[i].bad_index, 0);
		assert_int_equal(r[i].n, s[i].max_tokens);
		total += (uint64_t) r[i].n;
	}
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	assert_int_equal(st.generated_tokens, total);
	assert_int_equal(st.requests_finished[KILN_ENGINE_FINISH_LENGTH], N);
	check_all_free(e);
	/* A sample of them against their alone runs (the batches here were
	 * not deterministic: explained near-ties allowed). */
	run *alone = calloc(8, sizeof(run));
	for (int i = 0; i < 8; i++)
		run_alone(ea, &s[i * PER], &alone[i]);
	for (int i = 0; i < 8; i++) {
		run one[1] = { r[i * PER] };
		compare_runs(&s[i * PER], &alone[i], one, 1);
	}
	free(alone);
	free(s);
	free(r);
	engine_free(e);
	engine_free(ea);
}

static void test_metrics(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(4, 64, 64, 8, -1);
	spec s = { .n_prompt = 3, .prompt = { 1, 2, 3 }, .max_tokens = 5 };
	run r;
	run_alone(e, &s, &r);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;
	kiln_metrics_init(&m, &b);
	/* two engines' samples under one family each, told apart by model_name */
	kiln_engine *two[] = { e, e };
	assert_int_equal(kiln_engine_metrics(two, (const char *[]){ "a", "b" }, 2, &m), 0);
	assert_int_equal(kiln_metrics_finish(&m), 0);
	const char *want[] = {
		"# TYPE vllm:num_requests_running "
		"gauge\nvllm:num_requests_running{model_name=\"a\"} "
		"0\nvllm:num_requests_running{model_name=\"b\"} 0\n",
		"vllm:num_requests_waiting{model_name=\"a\"} 0\n",
		"vllm:kv_cache_usage_perc{model_name=\"a\"} 0\n",
		"kiln_inferd_kv_cache_blocks{model_name=\"a\",state=\"free\"} 64\n",
		"vllm:num_preemptions_total{model_name=\"a\"} 0\n",
		"vllm:prompt_tokens_total{model_name=\"a\"} 3\n",
		"kiln_inferd_prefill_tokens_total{model_name=\"a\"} 3\n",
		"vllm:generation_tokens_total{model_name=\"b\"} 5\n",
		"vllm:request_success_total{model_name=\"a\",finished_reason=\"length\"} 1\n",
		"vllm:request_success_total{model_name=\"a\",finished_reason=\"stop\"} 0\n",
		"vllm:request_success_total{model_name=\"a\",finished_reason=\"abort\"} 0\n",
		"vllm:time_to_first_token_seconds_count{model_name=\"a\"} 1\n",
		"vllm:inter_token_latency_seconds_count{model_name=\"a\"} 4\n",
		"vllm:e2e_request_latency_seconds_count{model_name=\"b\"} 1\n",
		"vllm:request_queue_time_seconds_count{model_name=\"a\"} 1\n",
		"# TYPE vllm:time_to_first_token_seconds histogram\n",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (!strstr(b.s, want[i]))
			fail_msg("metrics lack \"%s\":\n%s", want[i], b.s);
	engine_free(e);
}

/* ---- logprobs and logits processing ------------------------------------- */

/* Log-probabilities agree with the float64 reference to this (the cpu
 * backend's float32 logits are ~4e-5 off; log-softmax adds little). */
#define LP_TOL 1e-3

/* The reference's float64 log-softmax of lg[V] into ls. */
static void ref_log_softmax(const double *lg, int V, double *ls)
{
	double mx = lg[0], sum = 0;
	for (int i = 1; i < V; i++)
		mx = fmax(mx, lg[i]);
	for (int i = 0; i < V; i++)
		sum += exp(lg[i] - mx);
	for (int i = 0; i < V; i++)
		ls[i] = lg[i] - mx - log(sum);
}

/* r's logprobs (top alternatives each) against the reference's
 * log-softmax of the raw logits along r's own tokens: the sampled token's,
 * the alternatives' values and order, and no token outside them more
 * likely than the last.  Returns the largest difference. */
static double check_logprobs(const spec *s, const run *r, int top)
{
	enum { V = 512 };
	double *lg = malloc(sizeof(double) * V), *ls = malloc(sizeof(double) * V), worst = 0;
	assert_true(lg && ls);
	assert_int_equal(r->n_top, top);
	ref_reset(ref);
	for (int i = 0; i < s->n_prompt; i++)
		ref_step(ref, s->prompt[i], lg);
	for (int k = 0; k < r->n; k++) {
		ref_log_softmax(lg, V, ls);
		double d = fabs(ls[r->toks[k]] - r->lp[k]);
		worst = fmax(worst, d);
		if (d > LP_TOL)
			fail_msg("token %d (%d): logprob %g, reference %g", k, r->toks[k], r->lp[k],
				 ls[r->toks[k]]);
		bool in[V] = { false };
		for (int i = 0; i < top; i++) {
			int32_t t = r->top[k][i];
			assert_true(t >= 0 && t < V && !in[t]);
			in[t] = true;
			d = fabs(ls[t] - r->top_lp[k][i]);
			worst = fmax(worst, d);
			if (d > LP_TOL)
				fail_msg("token %d, alternative %d (%d): %g, reference %g", k, i, t,
					 r->top_lp[k][i], ls[t]);
			if (i > 0 && r->top_lp[k][i] > r->top_lp[k][i - 1])
				fail_msg("token %d: alternatives out of order at %d", k, i);
		}
		for (int t = 0; t < V && top > 0; t++)
			if (!in[t] && ls[t] > r->top_lp[k][top - 1] + LP_TOL)
				fail_msg(
					"token %d: %d (%g) is more likely than alternative %d (%g)",
					k, t, ls[t], top - 1, r->top_lp[k][top - 1]);
		ref_step(ref, r->toks[k], lg);
	}
	free(lg);
	free(ls);
	return worst;
}

/* logprobs: the log-softmax of the raw logits (before temperature), the
 * alternatives, checked against the float64 reference; asking for them
 * does not change the tokens (greedy and seeded sampling). */
static void test_logprobs(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(4, 64, 64, 8, -1);
	spec *s = calloc(1, sizeof(spec));
	run *a = calloc(1, sizeof(run)), *b = calloc(1, sizeof(run));
	s->n_prompt = 3;
	s->prompt[0] = 1, s->prompt[1] = 403, s->prompt[2] = 90;
	s->max_tokens = 40;
	run_alone(e, s, a);
	assert_int_equal(a->lp_events, 0); /* not asked: nothing */
	s->logprobs = true;
	s->top_logprobs = TOP_MAX;
	run_alone(e, s, b);
	assert_int_equal(b->n, 40);
	assert_memory_equal(a->toks, b->toks, sizeof(int32_t) * 40);
	for (int k = 0; k < b->n; k++) {
		/* greedy: the token is the most likely, its logprob the top's */
		assert_int_equal(b->top[k][0], b->toks[k]);
		assert_true(b->top_lp[k][0] == b->lp[k]);
	}
	double wg = check_logprobs(s, b, TOP_MAX);
	/* Seeded sampling at T 0.7: the same tokens as without logprobs, and
	 * the logprobs of the raw logits, not of the tempered ones. */
	s->samp = (kk_sampling){ .temperature = 0.7f, .top_k = 0, .top_p = 1, .seed = 77 };
	s->logprobs = false;
	run_alone(e, s, a);
	s->logprobs = true;
	s->top_logprobs = 0;
	run_alone(e, s, b);
	assert_memory_equal(a->toks, b->toks, sizeof(int32_t) * 40);
	double ws = check_logprobs(s, b, 0);
	print_message("# logprobs vs float64 reference: max |diff| %.2g greedy (top %d), %.2g "
		      "sampled\n",
		      wg, TOP_MAX, ws);
	free(s);
	free(a);
	free(b);
	engine_free(e);
}

/* r's prompt logprobs (positions 1..n_prompt-1, top alternatives each)
 * against the reference's log-softmax of the logits after each prompt
 * prefix, stepped one token at a time.  Returns the largest difference. */
static double check_prompt_logprobs(const spec *s, const run *r, int top)
{
	enum { V = 512 };
	double *lg = malloc(sizeof(double) * V), *ls = malloc(sizeof(double) * V), worst = 0;
	assert_true(lg && ls);
	assert_int_equal(r->bad_index, 0);
	assert_int_equal(r->n_plp, s->n_prompt - 1);
	if (s->n_prompt > 1)
		assert_int_equal(r->n_top, top);
	ref_reset(ref);
	for (int p = 1; p < s->n_prompt; p++) {
		ref_step(ref, s->prompt[p - 1], lg);
		ref_log_softmax(lg, V, ls);
		assert_int_equal(r->ptok[p], s->prompt[p]);
		double d = fabs(ls[s->prompt[p]] - r->plp[p]);
		worst = fmax(worst, d);
		if (d > LP_TOL)
			fail_msg("prompt token %d (%d): logprob %g, reference %g", p, s->prompt[p],
				 r->plp[p], ls[s->prompt[p]]);
		for (int i = 0; i < top; i++) {
			int32_t t = r->ptop[p][i];
			assert_true(t >= 0 && t < V);
			d = fabs(ls[t] - r->ptop_lp[p][i]);
			worst = fmax(worst, d);
			if (d > LP_TOL)
				fail_msg("prompt token %d, alternative %d (%d): %g, reference %g",
					 p, i, t, r->ptop_lp[p][i], ls[t]);
		}
		/* the first alternative is the reference's most likely */
		if (top > 0 && ls[ref_argmax(lg, V)] > r->ptop_lp[p][0] + LP_TOL)
			fail_msg("prompt token %d: the reference's best %d is not first", p,
				 ref_argmax(lg, V));
	}
	free(lg);
	free(ls);
	return worst;
}

/* prompt_logprobs (echo with logprobs, prompt scoring): every prompt
 * token's logprob but the first, against the float64 reference; with
 * max_tokens 0 nothing is generated; the tokens generated after it are
 * those of a request without it; prefix caching does not skip them; many
 * at once under preemption (recompute) give each position once. */
static void test_prompt_logprobs(void **state)
{
	NEED_FIXTURE();
	kiln_engine *e = engine(4, 64, 64, 8, -1);
	spec *s = calloc(8, sizeof(spec));
	run *a = calloc(9, sizeof(run)), *b = calloc(1, sizeof(run));
	assert_true(s && a && b);
	/* a 43-token prompt: the model's own continuation of "1 403 90" */
	s->n_prompt = 3;
	s->prompt[0] = 1, s->prompt[1] = 403, s->prompt[2] = 90;
	s->max_tokens = 40;
	run_alone(e, s, a);
	assert_int_equal(a->n, 40);
	memcpy(s->prompt + 3, a->toks, 40 * sizeof(int32_t));
	s->n_prompt = 43;
	/* scoring only */
	s->max_tokens = 0;
	run_alone(e, s, b);
	assert_int_equal(b->reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(b->n, 0);
	assert_int_equal(b->n_plp, 0); /* not asked */
	s->logprobs = s->prompt_logprobs = true;
	s->top_logprobs = TOP_MAX;
	run_alone(e, s, b);
	assert_int_equal(b->reason, KILN_ENGINE_FINISH_LENGTH);
	assert_int_equal(b->n, 0);
	double w0 = check_prompt_logprobs(s, b, TOP_MAX);
	/* The greedy continuation scored as prompt: each token was the most
	 * likely, its logprob the best alternative's. */
	for (int p = 3; p < 43; p++)
		assert_int_equal(b->ptop[p][0], s->prompt[p]);
	check_all_free(e);
	/* then generating: the tokens of the same request without it */
	s->max_tokens = 20;
	s->logprobs = s->prompt_logprobs = false;
	run_alone(e, s, a);
	s->logprobs = s->prompt_logprobs = true;
	s->top_logprobs = 2;
	run_alone(e, s, b);
	assert_int_equal(b->n, 20);
	assert_memory_equal(a->toks, b->toks, sizeof(int32_t) * 20);
	double w1 = fmax(check_prompt_logprobs(s, b, 2), check_logprobs(s, b, 2));
	engine_free(e);

	/* Prefix caching on, the prompt cached already: still every token. */
	e = prefix_engine(8, 64, 8, 16);
	s->logprobs = s->prompt_logprobs = false;
	run_alone(e, s, a); /* leaves the prompt's blocks in the cache */
	s->logprobs = s->prompt_logprobs = true;
	run_alone(e, s, b);
	w1 = fmax(w1, check_prompt_logprobs(s, b, 2));
	assert_memory_equal(a->toks, b->toks, sizeof(int32_t) * 20);
	engine_free(e);
	/* Eight at once in 8 blocks (128 tokens) of 43 + 40 each: preempted
	 * and recomputed, each prompt position still comes once, right. */
	e = engine(8, 64, 8, 16, -1);
	s->max_tokens = 40;
	for (int i = 1; i < 8; i++) {
		s[i] = s[0];
		s[i].prompt[42] = (int32_t) (100 + i); /* distinct last tokens */
		s[i].prompt_logprobs = i % 2;	       /* half of them */
		s[i].logprobs = i % 2;
	}
	reset_counts();
	a[8].gate_wait = true;
	spec g = { .n_prompt = 1, .prompt = { 1 }, .max_tokens = 2 };
	must_submit(e, &g, &a[8], 7777);
	wait_admitted(e);
	for (int i = 0; i < 8; i++) {
		memset(&a[i], 0, sizeof(run));
		must_submit(e, &s[i], &a[i], (uint64_t) i);
	}
	open_gate();
	wait_finished(9);
	kiln_engine_stats st;
	kiln_engine_get_stats(e, &st);
	for (int i = 0; i < 8; i++) {
		assert_int_equal(a[i].finishes, 1);
		assert_int_equal(a[i].n, 40);
		if (s[i].prompt_logprobs)
			w1 = fmax(w1, check_prompt_logprobs(&s[i], &a[i], 2));
		else
			assert_int_equal(a[i].n_plp, 0);
	}
	assert_true(st.preemptions >= 1);
	check_all_free(e);
	print_message("# prompt logprobs vs float64 reference: max |diff| %.2g scoring (top %d), "
		      "%.2g generating, cached and preempted (%llu preemptions)\n",
		      w0, TOP_MAX, w1, (unsigned long long) st.preemptions);
	free(s);
	free(a);
	free(b);
	engine_free(e);
}

/* The host path samples with kk_sample_host, which draws what kk_sample
 * draws on the engine's backend from the same logits, so a request that
 * takes the host path samples as it would have on the device. */
static void test_host_sampler(void **state)
{
	enum { V = 512, T = 400 };
	float *x = malloc(sizeof(float) * V);
	kk_buffer *lb = NULL, *ib = NULL;
	assert_int_equal(kk_buffer_alloc(be, KK_F32, V, &lb), 0);
	assert_int_equal(kk_buffer_alloc(be, KK_I32, 1, &ib), 0);
	const kk_sampling cases[] = {
		{ 0, 0, 1, 1 },		 { 0.8f, 0, 1, 7 },	 { 1.0f, 5, 1, 8 },
		{ 1.2f, 0, 0.5f, 9 },	 { 0.7f, 40, 0.9f, 10 }, { 1.0f, 1, 1, 11 },
		{ 0.01f, 0, 0.99f, 12 },
	};
	int differ = 0;
	for (int t = 0; t < T; t++) {
		for (int i = 0; i < V; i++)
			x[i] = (float) (rnd(20001) - 10000) / 2000.0f;
		if (t % 3 == 0)
			x[rnd(V)] = x[rnd(V)]; /* ties */
		assert_int_equal(kk_buffer_upload(be, NULL, lb, 0, x, sizeof(float) * V), 0);
		kk_sampling p = cases[t % ARRAY_SIZE(cases)];
		p.seed += (uint64_t) t * 1000003u;
		int32_t dev = -1;
		assert_int_equal(kk_sample(be, NULL, ib, lb, 1, V, &p), 0);
		assert_int_equal(kk_buffer_download(be, NULL, ib, 0, &dev, sizeof(dev)), 0);
		int32_t host = -1;
		assert_int_equal(kk_sample_host(x, 1, V, &p, &host), 0);
		differ += host != dev;
	}
	assert_int_equal(differ, 0);
	kk_buffer_free(lb);
	kk_buffer_free(ib);
	free(x);
}

/* engine.h's processing in its own words, over the whole vocabulary (the
 * engine's walks the context instead): the reference for
 * test_process_random. */
static void ref_process_f(float *x, int V, const kiln_engine_processing *p, const int32_t *toks,
			int n_prompt, int n_total, const int32_t *stops, int n_stops)
{
	for (int i = 0; i < p->n_logit_bias; i++)
		x[p->logit_bias[i].token] += p->logit_bias[i].bias;
	if (n_total - n_prompt < p->min_tokens)
		for (int i = 0; i < n_stops; i++)
			x[stops[i]] = -INFINITY;
	for (int t = 0; t < V; t++) {
		int in = 0, out = 0;
		for (int i = 0; i < n_total; i++)
			if (toks[i] == t) {
				in = 1;
				out += i >= n_prompt;
			}
		if (!in)
			continue;
		if (p->repetition_penalty > 0 && p->repetition_penalty != 1)
			x[t] = x[t] > 0 ? x[t] / p->repetition_penalty
					: x[t] * p->repetition_penalty;
		if (out)
			x[t] -= p->frequency_penalty * (float) out + p->presence_penalty;
	}
}

/* Penalties and logit_bias on random rows and contexts (repeats, long
 * outputs): the engine's processing equals the reference to the bit and
 * leaves its scratch zero; then the tokens the host path draws
 * (processing + kk_sample_host, seeds fixed) follow the processed row's
 * softmax (temperature, top_k, top_p) by a chi-square at p = 1e-6. */
static void test_process_random(void **state)
{
	enum { V = 64, CTX = 300, DRAWS = 20000 };
	static const kk_sampling SAMP[] = { { 1.0f, 0, 1, 1 }, { 0.7f, 8, 1, 2 },
					    { 1.2f, 0, 0.8f, 3 }, { 0.9f, 20, 0.9f, 4 } };
	uint64_t z = 12345;
#define RND() ((z = z * 6364136223846793005ull + 1442695040888963407ull) >> 33)
	int counts[V] = { 0 };
	for (int trial = 0; trial < 40; trial++) {
		int32_t toks[CTX], stops[2] = { (int32_t) (RND() % V), (int32_t) (RND() % V) };
		const int n_total = 1 + (int) (RND() % CTX), n_prompt = 1 + (int) (RND() % n_total);
		for (int i = 0; i < n_total; i++)
			toks[i] = (int32_t) (RND() % (trial % 2 ? 8 : V)); /* repeats */
		kiln_engine_bias bias[5];
		for (int i = 0; i < 5; i++)
			bias[i] = (kiln_engine_bias){ (int32_t) (RND() % V),
						      (float) ((int) (RND() % 400) - 200) / 2 };
		kiln_engine_processing p = {
			.presence_penalty = (float) ((int) (RND() % 9) - 4) / 2,
			.frequency_penalty = (float) ((int) (RND() % 9) - 4) / 2,
			.repetition_penalty = trial % 3 ? 0.5f + (float) (RND() % 8) / 4 : 0,
			.logit_bias = bias,
			.n_logit_bias = (int) (RND() % 6),
			.min_tokens = (int) (RND() % 4),
		};
		float x[V], y[V];
		for (int i = 0; i < V; i++)
			x[i] = y[i] = (float) ((int) (RND() % 2000) - 1000) / 250;
		assert_int_equal(kiln_engine__process_logits(x, V, &p, toks, n_prompt, n_total,
							     stops, 2, counts),
				 0);
		ref_process_f(y, V, &p, toks, n_prompt, n_total, stops, 2);
		assert_memory_equal(x, y, sizeof(x));
		for (int i = 0; i < V; i++)
			assert_int_equal(counts[i], 0);
		if (trial >= 4)
			continue;
		/* The draws of the whole host path against the exact
		 * distribution of the reference's row. */
		const kk_sampling *sp = &SAMP[trial];
		double prob[V] = { 0 }, cnt[V] = { 0 }, order[V][2], total = 0, acc = 0, kept = 0;
		for (int i = 0; i < V; i++)
			order[i][0] = y[i], order[i][1] = i;
		qsort(order, V, sizeof(order[0]), cmp_desc);
		int keep = sp->top_k > 0 ? sp->top_k : V, n = 0;
		for (int i = 0; i < keep; i++)
			total += exp((order[i][0] - order[0][0]) / sp->temperature);
		while (n < keep) {
			acc += exp((order[n++][0] - order[0][0]) / sp->temperature);
			if (sp->top_p < 1 && acc >= (double) sp->top_p * total)
				break;
		}
		for (int i = 0; i < n; i++)
			kept += prob[(int) order[i][1]] =
				exp((order[i][0] - order[0][0]) / sp->temperature);
		for (int d = 0; d < DRAWS; d++) {
			float w[V];
			kk_sampling q = *sp;
			q.seed = (uint64_t) d * 0x9E3779B97F4A7C15ull + sp->seed;
			memcpy(w, x, sizeof(w)); /* already processed: sample only */
			int32_t tok = -1;
			assert_int_equal(kk_sample_host(w, 1, V, &q, &tok), 0);
			assert_true(tok >= 0 && tok < V && prob[tok] > 0);
			cnt[tok]++;
		}
		double chi = 0, pe = 0, po = 0;
		int cells = 0;
		for (int i = 0; i < V; i++) {
			double e = prob[i] / kept * DRAWS;
			if (e == 0)
				continue;
			if (e < 5) {
				pe += e, po += cnt[i];
				continue;
			}
			chi += (cnt[i] - e) * (cnt[i] - e) / e, cells++;
		}
		if (pe > 0)
			chi += (po - pe) * (po - pe) / pe, cells++;
		/* the chi-square quantile at 1 - 1e-6 (Wilson-Hilferty) */
		const double k = cells - 1, h = 2 / (9 * k), t = 1 - h + 4.753424 * sqrt(h);
		if (cells > 1 && chi > k * t * t * t)
			fail_msg("case %d: chi-square %.1f over %d cells", trial, chi, cells);
	}
#undef RND
}

/* The processing order and arithmetic on a hand-computed row. */
static void test_process_logits(void **state)
{
	/* prompt 1 2, output 2 3 3 */
	const int32_t toks[] = { 1, 2, 2, 3, 3 };
	const int32_t stops[] = { 7 };
	const kiln_engine_bias bias[] = { { 5, 2.5f }, { 0, -100 } };
	kiln_engine_processing p = { .presence_penalty = 0.25f,
				     .frequency_penalty = 0.5f,
				     .repetition_penalty = 2,
				     .logit_bias = bias,
				     .n_logit_bias = 2,
				     .min_tokens = 4 };
	float x[8] = { 1, 2, -1, 4, 0.5f, 1, 3, 9 };
	int counts[8] = { 0 }; /* the scratch, left all zero */
	/* bias: x0 1 - 100, x5 1 + 2.5; 3 generated < min_tokens 4: x7 -inf;
	 * repetition over {1, 2, 3}: 2 / 2, -1 * 2, 4 / 2; frequency and
	 * presence over the output {2: 1, 3: 2}: -2 - 0.5 - 0.25,
	 * 2 - 1 - 0.25. */
	const float want[8] = { -99, 1, -2.75f, 0.75f, 0.5f, 3.5f, 3, -INFINITY };
	assert_int_equal(kiln_engine__process_logits(x, 8, &p, toks, 2, 5, stops, 1, counts), 0);
	for (int i = 0; i < 8; i++)
		if (!(x[i] == want[i]))
			fail_msg("logit %d: %g, want %g", i, x[i], want[i]);
	kk_sampling greedy = { 0 };
	int32_t tok = -1;
	assert_int_equal(kk_sample_host(x, 1, 8, &greedy, &tok), 0);
	assert_int_equal(tok, 5);
	/* min_tokens reached (4 generated): the stop is left alone. */
	float y[8] = { 0, 0, 0, 0, 0, 0, 0, 9 };
	const int32_t toks2[] = { 1, 2, 2, 3, 3, 4 };
	assert_int_equal(kiln_engine__process_logits(y, 8, &p, toks2, 2, 6, stops, 1, counts), 0);
	assert_true(y[7] == 9);
	/* repetition_penalty < 1 raises the repeated tokens (x / 0.5) */
	kiln_engine_processing q = { .repetition_penalty = 0.5f };
	float z[4] = { 1, -1, 1, 1 };
	const int32_t toks3[] = { 0, 1 };
	assert_int_equal(kiln_engine__process_logits(z, 4, &q, toks3, 2, 2, NULL, 0, counts), 0);
	assert_true(z[0] == 2 && z[1] == -0.5f && z[2] == 1);
	for (int i = 0; i < 8; i++)
		assert_int_equal(counts[i], 0);
	/* logprobs: log-softmax of { 0, ln 3 } is { ln 1/4, ln 3/4 } */
	float w[3] = { 0, logf(3), -INFINITY };
	int32_t ti[3];
	float tl[3];
	float lp = kiln_engine__logprobs(w, 3, 0, 3, ti, tl);
	assert_true(fabs(lp - log(0.25)) < 1e-6);
	assert_true(ti[0] == 1 && ti[1] == 0 && ti[2] == 2);
	assert_true(fabs(tl[0] - log(0.75)) < 1e-6 && isinf(tl[2]));
}

/* The reference's float64 logits processed as kiln_engine_processing says,
 * written again here (no code shared with engine.c). */
static void ref_process(double *lg, int V, const kiln_engine_processing *p, const int32_t *prompt,
			int n_prompt, const int32_t *out, int n_out, const int32_t *stops,
			int n_stops)
{
	for (int i = 0; i < p->n_logit_bias; i++)
		lg[p->logit_bias[i].token] += p->logit_bias[i].bias;
	if (n_out < p->min_tokens)
		for (int i = 0; i < n_stops; i++)
			lg[stops[i]] = -INFINITY;
	for (int t = 0; t < V; t++) {
		int in_prompt = 0, cnt = 0;
		for (int i = 0; i < n_prompt; i++)
			in_prompt |= prompt[i] == t;
		for (int i = 0; i < n_out; i++)
			cnt += out[i] == t;
		if ((in_prompt || cnt) && p->repetition_penalty > 0)
			lg[t] = lg[t] > 0 ? lg[t] / p->repetition_penalty
					  : lg[t] * p->repetition_penalty;
		lg[t] -= p->frequency_penalty * cnt + (cnt ? p->presence_penalty : 0);
	}
}

/* Greedy requests with penalties, logit_bias and min_tokens through the
 * engine give the float64 reference's processed argmax at every token (a
 * parting only at a near-tie), and change the output; logit_bias +100 on
 * one token makes it every token; min_tokens holds off a stop id. */
static void test_penalties(void **state)
{
	NEED_FIXTURE();
	enum { V = 512, N = 60 };
	kiln_engine *e = engine(4, 64, 64, 8, 2);
	spec *s = calloc(1, sizeof(spec));
	run *a = calloc(1, sizeof(run)), *b = calloc(1, sizeof(run));
	s->n_prompt = 1;
	s->prompt[0] = 1;
	s->max_tokens = N;
	s->ignore_eos = true;
	run_alone(e, s, a);
	const kiln_engine_bias bias[] = { { a->toks[3], -5 }, { 300, 1.5f } };
	s->proc = (kiln_engine_processing){ .presence_penalty = 0.6f,
					    .frequency_penalty = 0.4f,
					    .repetition_penalty = 1.3f,
					    .logit_bias = bias,
					    .n_logit_bias = 2 };
	run_alone(e, s, b);
	assert_int_equal(b->n, N);
	assert_memory_not_equal(a->toks, b->toks, sizeof(int32_t) * N);
	double *lg = malloc(sizeof(double) * V);
	ref_reset(ref);
	ref_step(ref, 1, lg);
	for (int k = 0; k < N; k++) {
		ref_process(lg, V, &s->proc, s->prompt, 1, b->toks, k, NULL, 0);
		int want = ref_argmax(lg, V);
		if (want != b->toks[k] && fabs(lg[want] - lg[b->toks[k]]) > TIE_TOL)
			fail_msg("token %d: engine %d, processed reference %d (margin %g)", k,
				 b->toks[k], want, lg[want] - lg[b->toks[k]]);
		if (want != b->toks[k])
			break; /* a near-tie: the contexts part here */
		ref_step(ref, b->toks[k], lg);
	}
	/* logit_bias +100: that token every time */
	const kiln_engine_bias force[] = { { 77, 100 } };
	s->proc = (kiln_engine_processing){ .logit_bias = force, .n_logit_bias = 1 };
	s->max_tokens = 8;
	run_alone(e, s, b);
	for (int k = 0; k < 8; k++)
		assert_int_equal(b->toks[k], 77);
	/* min_tokens: the greedy's 3rd token as a stop id ends the request at
	 * 2 tokens; with min_tokens 6 it is held off until 6 are out. */
	const int32_t stop[] = { a->toks[2] };
	s->proc = (kiln_engine_processing){ 0 };
	s->max_tokens = N;
	s->stop = stop;
	s->n_stop = 1;
	run_alone(e, s, b);
	assert_int_equal(b->reason, KILN_ENGINE_FINISH_STOP);
	assert_int_equal(b->n, 2);
	s->proc.min_tokens = 6;
	run_alone(e, s, b);
	assert_true(b->n >= 6);
	for (int k = 0; k < 6; k++)
		assert_int_not_equal(b->toks[k], stop[0]);
	/* and the reference agrees on the masked argmax at token 2 */
	ref_reset(ref);
	ref_step(ref, 1, lg);
	ref_step(ref, b->toks[0], lg);
	ref_step(ref, b->toks[1], lg);
	ref_process(lg, V, &s->proc, s->prompt, 1, b->toks, 2, stop, 1);
	assert_int_equal(ref_argmax(lg, V), b->toks[2]);
	/* bad values are refused at submit */
	kiln_error err = {};
	s->proc = (kiln_engine_processing){ .presence_penalty = 2.5f };
	assert_int_equal(submit(e, s, b, 1, &err), -EINVAL);
	const kiln_engine_bias outside[] = { { 512, 1 } };
	s->proc = (kiln_engine_processing){ .logit_bias = outside, .n_logit_bias = 1 };
	assert_int_equal(submit(e, s, b, 1, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "logit_bias token 512"));
	s->proc = (kiln_engine_processing){ 0 };
	s->logprobs = true;
	s->top_logprobs = 21;
	assert_int_equal(submit(e, s, b, 1, &err), -EINVAL);
	free(lg);
	free(s);
	free(a);
	free(b);
	engine_free(e);
}

static int group_setup(void **state)
{
	/* One cpu thread: kk's cpu threads split reductions differently from
	 * run to run, which would make the batch comparisons nondeterministic. */
	setenv("KK_CPU_THREADS", "1", 0);
	const char *w = getenv("KILN_TEST_WAIT_S");
	if (w && atoi(w) > 0)
		wait_s = atoi(w);
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	fixture = kiln_test_model_fixture();
	if (fixture) {
		ref = ref_load(fixture);
		assert_non_null(ref);
	}
	return 0;
}

static int group_teardown(void **state)
{
	ref_free(ref);
	kk_backend_free(be);
	return 0;
}

int main(int argc, char **argv)
{
	/* OpenBLAS reads its thread count when it is loaded, before main: run
	 * again with one thread so the batches compute the same bits run to
	 * run (kk's own threads are set in group_setup). */
	if (!getenv("OPENBLAS_NUM_THREADS")) {
		setenv("OPENBLAS_NUM_THREADS", "1", 1);
		execv("/proc/self/exe", argv);
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matches_reference),
		cmocka_unit_test(test_greedy_concurrent),
		cmocka_unit_test(test_sampled_concurrent),
		cmocka_unit_test(test_preemption),
		cmocka_unit_test(test_long_prompt),
		cmocka_unit_test(test_prefix_caching),
		cmocka_unit_test(test_prefix_tail_chunked),
		cmocka_unit_test(test_stop_and_length),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_stop_by_caller),
		cmocka_unit_test(test_queue_full),
		cmocka_unit_test(test_rejects),
		cmocka_unit_test(test_shutdown_in_flight),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_metrics),
		cmocka_unit_test(test_logprobs),
		cmocka_unit_test(test_prompt_logprobs),
		cmocka_unit_test(test_host_sampler),
		cmocka_unit_test(test_process_logits),
		cmocka_unit_test(test_process_random),
		cmocka_unit_test(test_penalties),
		cmocka_unit_test(test_prefix_kept),
		cmocka_unit_test(test_prefix_siblings),
	};
	return cmocka_run_group_tests_name("engine", tests, group_setup, group_teardown);
}
