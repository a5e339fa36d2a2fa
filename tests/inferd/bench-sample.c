/* tests/inferd/bench-sample.c — the sampler alone (make bench): microseconds
 * per token at a 32,000- and a 128,256-token vocabulary for each sampling
 * parameter combination kiln-inferd accepts, the sampler now
 * (kk_sample_host, and kiln_engine__process_logits for penalties and
 * logit_bias, kiln_engine__logprobs for logprobs) against the baseline in
 * the same run: the sampler as it was (kk__cpu_sample_host_sorted, which
 * sorts every row whole, and the processing that allocated two vocabulary
 * arrays per token, copied below), and each one's share of a decode step
 * of a 110M-shaped model (llama2.c 110M: dim 768, 12 layers, hidden 2048;
 * int8 weights, random) with that vocabulary, timed here on the cpu backend.
 *
 * The rows are language-model-like: N(0, 2.5^2) logits with one token in
 * 500 raised by 8-14 (a peaked head and a long tail); the "flat row" cases
 * drop the head (the worst case of top_p: its cut thousands of tokens
 * deep).  n (choices) samples
 * each choice's row the same way, and seed only picks the draw, so neither
 * has a row of its own.
 *
 * usage: bench-sample [--quick] [--cpu-time].  Exits 1 on a failure. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/engine.h"
#include "kk.h"
#include "kmodel.h"
#include "../../kernels/bench/bench-clock.h"
#include "../../kernels/kk/kk_internal.h"

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	return kiln_clock_seconds(clock_id);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static double rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double) (rng >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- the baseline's logits processing (engine/logits.c before) ---------- */

static int old_process_logits(float *x, int V, const kiln_engine_processing *p,
			      const int32_t *tokens, int n_prompt, int n_total)
{
	for (int i = 0; i < p->n_logit_bias; i++)
		x[p->logit_bias[i].token] += p->logit_bias[i].bias;
	const bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
	if (!rep && p->frequency_penalty == 0 && p->presence_penalty == 0)
		return 0;
	int *count = calloc((size_t) V, sizeof(int));
	bool *seen = calloc((size_t) V, sizeof(bool));
	if (!count || !seen) {
		free(count);
		free(seen);
		return -ENOMEM;
	}
	for (int i = 0; i < n_total; i++) {
		seen[tokens[i]] = true;
		if (i >= n_prompt)
			count[tokens[i]]++;
	}
	for (int t = 0; t < V; t++) {
		if (!seen[t])
			continue;
		if (rep)
			x[t] = x[t] > 0 ? x[t] / p->repetition_penalty
					: x[t] * p->repetition_penalty;
		if (count[t])
			x[t] -= p->frequency_penalty * (float) count[t] + p->presence_penalty;
	}
	free(count);
	free(seen);
	return 0;
}

/* ---- the cases ------------------------------------------------------------ */

typedef struct bcase {
	const char *name;
	kk_sampling s;
	bool process; /* penalties + logit_bias (the host path) */
	int logprobs; /* -1: none; else top_logprobs */
	bool flat;    /* the row without its peaked head */
} bcase;

static const bcase CASES[] = {
	{ "greedy", { 0, 0, 1, 0 }, false, -1 },
	{ "temperature 0.8", { 0.8f, 0, 1, 0 }, false, -1 },
	{ "T 0.8 top_k 40", { 0.8f, 40, 1, 0 }, false, -1 },
	{ "T 0.8 top_k 1024", { 0.8f, 1024, 1, 0 }, false, -1 },
	{ "T 0.8 top_p 0.9", { 0.8f, 0, 0.9f, 0 }, false, -1 },
	{ "T 0.8 top_p 0.95", { 0.8f, 0, 0.95f, 0 }, false, -1 },
	{ "T 0.8 top_k 40 top_p 0.9", { 0.8f, 40, 0.9f, 0 }, false, -1 },
	{ "T 0.8 + penalties, bias", { 0.8f, 0, 1, 0 }, true, -1 },
	{ "T 0.8 top_p 0.9 + penalties", { 0.8f, 0, 0.9f, 0 }, true, -1 },
	{ "T 0.8 + logprobs 5", { 0.8f, 0, 1, 0 }, false, 5 },
	{ "greedy + logprobs 20", { 0, 0, 1, 0 }, false, 20 },
	{ "flat row: temperature 0.8", { 0.8f, 0, 1, 0 }, false, -1, true },
	{ "flat row: T 0.8 top_p 0.9", { 0.8f, 0, 0.9f, 0 }, false, -1, true },
	{ "flat row: T 1.5 top_p 0.95", { 1.5f, 0, 0.95f, 0 }, false, -1, true },
	{ "flat row: T 0.8 top_k 1024", { 0.8f, 1024, 1, 0 }, false, -1, true },
};

/* A context of 512 tokens (prompt 384) with repeats, and 16 biased tokens:
 * what the processing walks. */
enum { CTX = 512, PROMPT = 384, NBIAS = 16 };

/* Seconds per token of one case, new (old false) or baseline: the best of
 * 3 rounds of reps tokens (a processed row is copied first, as the
 * engine does). */
static double time_case(const bcase *c, const float *x, float *w, int V, int reps, bool old,
			const int32_t *ctx, const kiln_engine_processing *proc, int *counts)
{
	double best = INFINITY;
	int32_t top_ids[KILN_ENGINE_LOGPROBS_MAX];
	float top_lp[KILN_ENGINE_LOGPROBS_MAX];
	for (int round = 0; round < 3; round++) {
		double t0 = now();
		for (int k = 0; k < reps; k++) {
			kk_sampling s = c->s;
			s.seed = (uint64_t) k * 7919 + (uint64_t) round;
			int32_t tok = -1;
			int r;
			const float *row = x;
			if (c->process) {
				memcpy(w, x, (size_t) V * sizeof(float));
				row = w;
				r = old ? old_process_logits(w, V, proc, ctx, PROMPT, CTX)
					: kiln_engine__process_logits(w, V, proc, ctx, PROMPT, CTX,
								      NULL, 0, counts);
				if (r < 0)
					return -1;
			}
			r = old ? kk__cpu_sample_host_sorted(row, 1, V, &s, &tok)
				: kk_sample_host(row, 1, V, &s, &tok);
			if (r < 0)
				return -1;
			if (c->logprobs >= 0)
				(void) kiln_engine__logprobs(x, V, tok, c->logprobs, top_ids,
							     top_lp);
		}
		best = fmin(best, (now() - t0) / reps);
	}
	return best;
}

/* ---- the decode step -------------------------------------------------------- */

static int rand_read(void *userdata, const char *name, float *dst, size_t count, kiln_error *err)
{
	const float scale = strstr(name, "norm") ? 0 : 0.02f;
	for (size_t i = 0; i < count; i++)
		dst[i] = strstr(name, "norm") ? 1.0f : scale * (float) (2 * rnd() - 1);
	return 0;
}

/* Seconds of one decode step (batch 1, int8 weights) of the 110M shape
 * with vocab V: the mean of `steps` steps after 32 warm-up tokens. */
static double decode_step(kk_backend *be, int V, int steps)
{
	km_config cfg = { .dim = 768,
			  .hidden_dim = 2048,
			  .n_layers = 12,
			  .n_heads = 12,
			  .n_kv_heads = 12,
			  .head_dim = 64,
			  .vocab_size = V,
			  .max_seq_len = 1024,
			  .norm_eps = 1e-5f,
			  .rope_theta = 10000,
			  .rope_mode = KK_ROPE_INTERLEAVED,
			  .shared_classifier = false };
	km_weight_source src = { .read = rand_read };
	km_model_opts o = { .weight_dtype = KK_I8, .max_tokens = 64, .max_seqs = 1 };
	km_model *m = NULL;
	km_kvcache *kv = NULL;
	kiln_error err = {};
	double t = -1;
	if (km_model_new(be, &cfg, &o, &src, &m, &err) < 0) {
		fprintf(stderr, "bench-sample: %s\n", err.msg);
		return -1;
	}
	if (km_kvcache_new(be, km_model_config(m), km_model_act_dtype(m), 64, 1, &kv) < 0)
		goto out;
	int32_t tok = 1;
	km_seq_input in = { km_kvcache_seq_new(kv), &tok, 1 };
	for (int s = 0; s < 32; s++)
		if (km_forward(m, kv, &in, 1, NULL, &err) < 0)
			goto fail;
	double t0 = now();
	for (int s = 0; s < steps; s++) {
		tok = 1 + s % 100;
		if (km_forward(m, kv, &in, 1, NULL, &err) < 0)
			goto fail;
	}
	t = (now() - t0) / steps;
	goto out;
fail:
	fprintf(stderr, "bench-sample: %s\n", err.msg);
out:
	km_kvcache_free(kv);
	km_model_free(m);
	return t;
}

int main(int argc, char **argv)
{
	bool quick = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			quick = true;
		else if (strcmp(argv[i], "--cpu-time") == 0)
			clock_id = CLOCK_PROCESS_CPUTIME_ID;
		else {
			fprintf(stderr, "usage: bench-sample [--quick] [--cpu-time]\n");
			return 2;
		}
	}
	static const int VOCABS[] = { 32000, 128256 };
	kk_backend *be = NULL;
	int r = kk_backend_open("cpu", &be);
	if (r < 0) {
		fprintf(stderr, "bench-sample: cannot open the cpu backend: %s\n", strerror(-r));
		return 1;
	}
	printf("the sampler alone, one row per token (us per token, best of 3 rounds, %s); "
	       "baseline: the sampler before (whole-row sort, buffers per call); "
	       "share: of a decode step of the 110M shape (int8, batch 1, %d cpu threads) with "
	       "that vocabulary\n",
	       clock_id == CLOCK_MONOTONIC ? "wall clock" : "process CPU time",
	       kk_backend_threads(be));
	int rc = 0;
	for (size_t v = 0; v < sizeof(VOCABS) / sizeof(VOCABS[0]); v++) {
		const int V = VOCABS[v];
		double step = decode_step(be, V, quick ? 8 : 32);
		if (step < 0) {
			rc = 1;
			continue;
		}
		printf("\nvocabulary %d: decode step %.2f ms\n", V, step * 1e3);
		printf("%-30s %12s %10s %8s %8s\n", "parameters", "baseline us", "now us",
		       "speed-up", "share");
		float *x = malloc((size_t) V * sizeof(float)),
		      *w = malloc((size_t) V * sizeof(float));
		float *flat = malloc((size_t) V * sizeof(float));
		int *counts = calloc((size_t) V, sizeof(int));
		int32_t ctx[CTX];
		kiln_engine_bias bias[NBIAS];
		if (!x || !w || !counts || !flat) {
			free(flat);
			free(x);
			free(w);
			free(counts);
			rc = 1;
			continue;
		}
		for (int i = 0; i < V; i++) {
			flat[i] = (float) (2.5 * sqrt(-2 * log(1 - rnd())) * cos(6.283185 * rnd()));
			x[i] = flat[i] + (float) (rnd() < 0.002 ? 8 + 6 * rnd() : 0);
		}
		for (int i = 0; i < CTX; i++)
			ctx[i] = (int32_t) (rnd() * (i % 4 ? 2000 : V)); /* repeats */
		for (int i = 0; i < NBIAS; i++)
			bias[i] = (kiln_engine_bias){ (int32_t) (rnd() * V),
						      (float) (10 * rnd() - 5) };
		kiln_engine_processing proc = { .presence_penalty = 0.5f,
						.frequency_penalty = 0.3f,
						.repetition_penalty = 1.1f,
						.logit_bias = bias,
						.n_logit_bias = NBIAS };
		for (size_t c = 0; c < sizeof(CASES) / sizeof(CASES[0]); c++) {
			const int reps = quick ? 4 : V > 100000 ? 12 : 30;
			const float *row = CASES[c].flat ? flat : x;
			double told = time_case(&CASES[c], row, w, V,
						quick	     ? 2
						: V > 100000 ? 3
							     : 6,
						true, ctx, &proc, counts);
			double tnew =
				time_case(&CASES[c], row, w, V, reps, false, ctx, &proc, counts);
			if (told < 0 || tnew < 0) {
				fprintf(stderr, "bench-sample: %s failed\n", CASES[c].name);
				rc = 1;
				continue;
			}
			printf("%-30s %12.1f %10.1f %7.1fx %7.2f%%\n", CASES[c].name, told * 1e6,
			       tnew * 1e6, told / tnew, 100 * tnew / step);
		}
		free(x);
		free(flat);
		free(w);
		free(counts);
	}
	kk_backend_free(be);
	return rc;
}
