/* tests/inferd/bench-engine.c — the inference engine's throughput and time
 * to first token on the tiny260K fixture (cpu backend), with 1, 8 and 32 clients
 * each keeping one request in flight (a closed loop), against the baseline
 * "sequential": the same requests one at a time straight through km_forward
 * and km_sample, no engine and no scheduler thread.
 *
 * usage: bench-engine [--quick] [MODEL.bin]   (default: the fixture, found
 * as in the tests).  Prints a table; exit 2 when the model is missing.
 * Tokens/s are per wall second and per process CPU second (the build
 * machine is shared: the CPU rate is the one to compare).  Then a shared
 * 96-token prefix with 8 clients: prefix caching off, on, and off with a
 * 32-token step budget (chunked prefill around the running decodes). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/engine.h"
#include "kiln/macro.h"
#include "kk.h"
#include "kmodel.h"
#include "../lib/fixture.h"

#define PROMPT_MAX 32
/* The shared-prefix workload: a 96-token "system prompt" and a tail of
 * 4..16 tokens of the request's own. */
#define SHARED_PREFIX 96
#define SHARED_MAX    (SHARED_PREFIX + 16)

typedef struct breq {
	int32_t prompt[SHARED_MAX];
	int n_prompt, max_tokens;
	double t_submit, ttft;
	int n;
} breq;

static double clk(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}
static double wall(void)
{
	return clk(CLOCK_MONOTONIC);
}
static double cpu(void)
{
	return clk(CLOCK_PROCESS_CPUTIME_ID);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;
	return x < y ? -1 : x > y;
}

static double pct(const breq *q, int n, double p)
{
	double *v = malloc(sizeof(double) * (size_t) n);
	for (int i = 0; i < n; i++)
		v[i] = q[i].ttft;
	qsort(v, (size_t) n, sizeof(double), cmp_d);
	int k = (int) (p * (n - 1) + 0.5);
	double r = v[k];
	free(v);
	return r;
}

/* ---- the engine, C clients in a closed loop -------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int in_flight, done;

static void on_event(void *ud, const kiln_engine_event *ev)
{
	breq *q = ud;
	if (ev->type == KILN_ENGINE_EVENT_TOKEN) {
		if (q->n++ == 0)
			q->ttft = wall() - q->t_submit;
		return;
	}
	pthread_mutex_lock(&mu);
	in_flight--;
	done++;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
}

static int run_engine(kiln_engine *e, breq *q, int n, int clients)
{
	in_flight = done = 0;
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&mu);
		while (in_flight >= clients)
			pthread_cond_wait(&cv, &mu);
		in_flight++;
		pthread_mutex_unlock(&mu);
		q[i].n = 0;
		q[i].t_submit = wall();
		kiln_engine_request r = { .id = (uint64_t) i,
					  .prompt = q[i].prompt,
					  .n_prompt = q[i].n_prompt,
					  .max_tokens = q[i].max_tokens,
					  .cb = on_event,
					  .userdata = &q[i] };
		kiln_error err;
		int rc = kiln_engine_submit(e, &r, &err);
		if (rc < 0) {
			fprintf(stderr, "submit: %s\n", err.msg);
			return rc;
		}
	}
	pthread_mutex_lock(&mu);
	while (done < n)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return 0;
}

/* ---- the baseline: one request at a time, no engine -------------------------- */

static int run_sequential(km_model *m, km_kvcache *c, breq *q, int n)
{
	kiln_error err;
	kk_sampling g = { .temperature = 0 };
	for (int i = 0; i < n; i++) {
		q[i].t_submit = wall();
		q[i].n = 0;
		int s = km_kvcache_seq_new(c);
		if (s < 0)
			return s;
		km_seq_input in = { s, q[i].prompt, q[i].n_prompt };
		int32_t tok;
		for (int t = 0; t < q[i].max_tokens; t++) {
			int r = km_forward(m, c, &in, 1, NULL, &err);
			if (r < 0) {
				fprintf(stderr, "km_forward: %s\n", err.msg);
				return r;
			}
			r = km_sample(m, 0, 1, &g, &tok);
			if (r < 0)
				return r;
			if (q[i].n++ == 0)
				q[i].ttft = wall() - q[i].t_submit;
			in = (km_seq_input){ s, &tok, 1 };
		}
		km_kvcache_seq_free(c, s);
	}
	return 0;
}

/* An engine on f's weights, or NULL after saying why. */
static kiln_engine *engine_open(kk_backend *be, km_file *f, const kiln_engine_opts *o)
{
	km_weight_source src = km_file_source(f);
	kiln_error err;
	kiln_engine *e = NULL;
	if (kiln_engine_new(be, km_file_config(f), &src, o, &e, &err) < 0)
		fprintf(stderr, "engine: %s\n", err.msg);
	return e;
}

static void row(const char *name, const breq *q, int n, double w, double c)
{
	long tokens = 0;
	for (int i = 0; i < n; i++)
		tokens += q[i].n;
	printf("| %-22s | %6ld | %9.0f | %9.0f | %9.2f | %9.2f |\n", name, tokens, tokens / w,
	       tokens / c, pct(q, n, 0.5) * 1e3, pct(q, n, 0.99) * 1e3);
}

int main(int argc, char **argv)
{
	bool quick = false;
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		if (streq(argv[i], "--quick"))
			quick = true;
		else
			path = argv[i];
	}
	if (!path)
		path = kiln_test_model_fixture();
	if (!path || access(path, R_OK) != 0) {
		fprintf(stderr, "model fixture %s is not readable: %s\n", kiln_test_model_path(),
			KILN_TEST_FIXTURE_HINT);
		return 2;
	}
	const int N = quick ? 32 : 128;
	breq *q = calloc((size_t) N, sizeof(breq));
	unsigned rng = 7;
	for (int i = 0; i < N; i++) {
		rng = rng * 1103515245u + 12345u;
		q[i].n_prompt = 4 + (int) ((rng >> 8) % (PROMPT_MAX - 3));
		q[i].prompt[0] = 1;
		for (int j = 1; j < q[i].n_prompt; j++) {
			rng = rng * 1103515245u + 12345u;
			q[i].prompt[j] = (int32_t) ((rng >> 8) % 512);
		}
		rng = rng * 1103515245u + 12345u;
		q[i].max_tokens = 32 + (int) ((rng >> 8) % 97);
	}

	kk_backend *be = NULL;
	kiln_error err;
	km_file *f = NULL;
	if (kk_backend_open("cpu", &be) < 0 || km_file_open(path, &f, &err) < 0) {
		fprintf(stderr, "cannot open the cpu backend or %s\n", path);
		return 1;
	}
	km_weight_source src = km_file_source(f);
	printf("tiny260K, cpu backend, %d requests (prompt 4..%d tokens, 32..128 generated, "
	       "greedy)\n\n",
	       N, PROMPT_MAX);
	printf("| %-22s | %6s | %9s | %9s | %9s | %9s |\n", "run", "tokens", "tok/s", "tok/CPU-s",
	       "TTFT p50", "TTFT p99");
	printf("|------------------------|--------|-----------|-----------|-----------|-----------|"
	       "\n");

	/* Baseline: sequential. */
	km_model *m = NULL;
	km_kvcache *c = NULL;
	km_model_opts mo = { .weight_dtype = KK_F32, .max_tokens = 512, .max_seqs = 1 };
	if (km_model_new(be, km_file_config(f), &mo, &src, &m, &err) < 0 ||
	    km_kvcache_new(be, km_model_config(m), KK_F32, 64, 1, &c) < 0) {
		fprintf(stderr, "model: %s\n", err.msg);
		return 1;
	}
	double w0 = wall(), c0 = cpu();
	if (run_sequential(m, c, q, N) < 0)
		return 1;
	double bw = wall() - w0, bc = cpu() - c0;
	row("baseline: sequential", q, N, bw, bc);
	km_kvcache_free(c);
	km_model_free(m);

	const int clients[] = { 1, 8, 32 };
	char notes[ARRAY_SIZE(clients)][160];
	for (size_t k = 0; k < ARRAY_SIZE(clients); k++) {
		kiln_engine_opts o = { .weight_dtype = KK_F32,
				       .max_running = 32,
				       .max_step_tokens = 512,
				       .num_blocks = 512,
				       .max_waiting = 256,
				       .eos_token = -1 };
		kiln_engine *e = engine_open(be, f, &o);
		if (!e)
			return 1;
		w0 = wall();
		c0 = cpu();
		if (run_engine(e, q, N, clients[k]) < 0)
			return 1;
		double w = wall() - w0, cc = cpu() - c0;
		char name[64];
		snprintf(name, sizeof(name), "engine, %d client%s", clients[k],
			 clients[k] > 1 ? "s" : "");
		row(name, q, N, w, cc);
		kiln_engine_stats st;
		kiln_engine_get_stats(e, &st);
		snprintf(notes[k], sizeof(notes[k]),
			 "%s: %llu steps, %.1f tokens per step, %llu preemptions", name,
			 (unsigned long long) st.steps,
			 st.steps ? (double) (st.generated_tokens + st.prefill_tokens) / st.steps
				  : 0,
			 (unsigned long long) st.preemptions);
		kiln_engine_free(e);
	}
	/* Shared prefix, 8 clients, prefix caching off and on. */
	for (int i = 0; i < N; i++) {
		int tail = 4 + i % 13;
		q[i].n_prompt = SHARED_PREFIX + tail;
		for (int j = 1; j < SHARED_PREFIX; j++)
			q[i].prompt[j] = (int32_t) ((j * 29 + 3) % 512);
		for (int j = SHARED_PREFIX; j < q[i].n_prompt; j++) {
			rng = rng * 1103515245u + 12345u;
			q[i].prompt[j] = (int32_t) ((rng >> 8) % 512);
		}
	}
	/* Then the same with caching off and a 32-token step budget (8
	 * sequences): 100..112-token prompts prefill in chunks around the
	 * running decodes, the case chunked prefill is for. */
	static const struct {
		bool pc;
		int running, step;
		const char *name;
	} pruns[] = { { false, 32, 512, "shared 96, cache off" },
		      { true, 32, 512, "shared 96, cache on" },
		      { false, 8, 32, "shared 96, step 32" } };
	char pnotes[ARRAY_SIZE(pruns)][160];
	for (size_t k = 0; k < ARRAY_SIZE(pruns); k++) {
		const bool pc = pruns[k].pc;
		kiln_engine_opts o = { .weight_dtype = KK_F32,
				       .max_running = pruns[k].running,
				       .max_step_tokens = pruns[k].step,
				       .num_blocks = 512,
				       .max_waiting = 256,
				       .eos_token = -1,
				       .prefix_caching = pc };
		kiln_engine *e = engine_open(be, f, &o);
		if (!e)
			return 1;
		w0 = wall();
		c0 = cpu();
		if (run_engine(e, q, N, 8) < 0)
			return 1;
		double w = wall() - w0, cc = cpu() - c0;
		row(pruns[k].name, q, N, w, cc);
		kiln_engine_stats st;
		kiln_engine_get_stats(e, &st);
		snprintf(pnotes[k], sizeof(pnotes[k]),
			 "%s, 8 clients: %llu prefill tokens, %llu shared, %llu steps",
			 pruns[k].name, (unsigned long long) st.prefill_tokens,
			 (unsigned long long) st.prefix_hits, (unsigned long long) st.steps);
		kiln_engine_free(e);
	}

	printf("\nTTFT in ms, from submit to the first token.\n");
	for (size_t k = 0; k < ARRAY_SIZE(clients); k++)
		printf("%s\n", notes[k]);
	for (size_t k = 0; k < ARRAY_SIZE(pruns); k++)
		printf("%s\n", pnotes[k]);
	km_file_free(f);
	kk_backend_free(be);
	free(q);
	return 0;
}
