/* kernels/bench/cpu-decode.c — bench-decode-cpu: the cpu backend's
 * end-to-end model speed against this machine's memory roofline.
 *
 * Builds a Llama of a named shape with random weights in memory (no file:
 * "260K" = stories260K, "15M" = stories15M, dim 288 x 6 layers, "110M" =
 * dim 768 x 12 layers, vocab 32000), or loads a model file, and times on
 * the cpu backend, for each thread count asked:
 *   - prefill of a 128-token prompt (tok/s, best of three),
 *   - single-stream greedy decode (tok/s) and the same as a percentage of
 *     the roofline: copy bandwidth / weight bytes read per token,
 *   - decode of 8 sequences in one batch (aggregate tok/s).
 * Copy bandwidth is a 256 MiB memcpy (bytes read + written per second)
 * with one thread, measured in the same run.  Weight bytes per token are
 * km_model_weight_bytes less the embedding table when the classifier has
 * its own (a decode step reads one embedding row).
 *
 * usage: bench-decode-cpu [--shape 260K|15M|110M | --model FILE]
 *                         [--dtype f32|bf16|f16|i8|q4] [--threads N[,N...]]
 *                         [--tokens N] [--cpu-time]
 * Exit 0, 1 when a step fails, 2 on a bad argument. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/macro.h"
#include "kk.h"
#include "kmodel.h"
#include "bench-clock.h"

#define PROMPT	 128
#define BATCH	 8
#define COPY_MIB 256
#define MAX_RUNS 8

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	return kiln_clock_seconds(clock_id);
}

struct shape {
	const char *name;
	km_config cfg;
};

static const struct shape shapes[] = {
	{ "260K", { 64, 172, 5, 8, 4, 8, 512, 512, 1e-5f, 10000.0f, KK_ROPE_INTERLEAVED, true } },
	{ "15M",
	  { 288, 768, 6, 6, 6, 48, 32000, 256, 1e-5f, 10000.0f, KK_ROPE_INTERLEAVED, true } },
	{ "110M",
	  { 768, 2048, 12, 12, 12, 64, 32000, 1024, 1e-5f, 10000.0f, KK_ROPE_INTERLEAVED, true } },
};

/* Random weights: norms 1, everything else uniform in +-1/sqrt(dim)
 * (xorshift; the values do not matter for speed, only that they are
 * finite and keep activations in range). */
static int random_read(void *userdata, const char *name, float *dst, size_t count, kiln_error *err)
{
	const km_config *c = userdata;
	uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t) count;
	float a = 1.0f / sqrtf((float) c->dim);
	bool norm = strstr(name, "norm") != NULL;
	for (size_t i = 0; i < count; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		dst[i] = norm ? 1.0f : a * (2.0f * (float) (s >> 40) / (float) (1 << 24) - 1.0f);
	}
	return 0;
}

static double copy_gbs(void)
{
	size_t n = (size_t) COPY_MIB << 20;
	char *a = malloc(n), *b = malloc(n);
	double best = 0;
	if (!a || !b) {
		free(a), free(b);
		return 0;
	}
	memset(a, 1, n), memset(b, 2, n);
	for (int i = 0; i < 5; i++) {
		double t0 = now();
		memcpy(b, a, n);
		best = MAX(best, 2.0 * n / (now() - t0) * 1e-9);
	}
	free(a), free(b);
	return best;
}

struct result {
	double prefill, decode, batch; /* tok/s */
};

/* Prefill PROMPT tokens, decode `tokens` single-stream, then BATCH
 * sequences of a 1-token prompt `tokens` steps each. */
static int run(km_model *m, kk_backend *be, int tokens, struct result *res, kiln_error *err)
{
	const km_config *cfg = km_model_config(m);
	km_kvcache *c = NULL;
	int32_t prompt[PROMPT], tok[BATCH];
	km_seq_input in[BATCH];
	kk_sampling g = {};
	int per_seq = DIV_ROUND_UP(PROMPT + tokens + 1, KK_KV_BLOCK_SIZE), r;
	double t0;

	r = km_kvcache_new(be, cfg, km_model_act_dtype(m), per_seq * BATCH, BATCH, &c);
	if (r < 0)
		return r;
	for (int i = 0; i < PROMPT; i++)
		prompt[i] = 1 + (i * 7919) % (cfg->vocab_size - 1);
	/* Prefill: best of three (one step each; the last one's sequence
	 * goes on to decode). */
	for (int rep = 0; rep < 3; rep++) {
		if (rep > 0)
			km_kvcache_seq_free(c, in[0].seq);
		in[0] = (km_seq_input){ km_kvcache_seq_new(c), prompt, PROMPT };
		t0 = now();
		if ((r = km_forward(m, c, in, 1, NULL, err)) < 0 ||
		    (r = km_sample(m, 0, 1, &g, tok)) < 0)
			goto out;
		res->prefill = MAX(res->prefill, PROMPT / (now() - t0));
	}
	in[0].tokens = tok;
	in[0].n_tokens = 1;
	t0 = now();
	for (int s = 0; s < tokens; s++)
		if ((r = km_forward(m, c, in, 1, NULL, err)) < 0 ||
		    (r = km_sample(m, 0, 1, &g, tok)) < 0)
			goto out;
	res->decode = tokens / (now() - t0);
	km_kvcache_seq_free(c, in[0].seq);

	for (int i = 0; i < BATCH; i++) {
		tok[i] = 1 + i;
		in[i] = (km_seq_input){ km_kvcache_seq_new(c), &tok[i], 1 };
	}
	if ((r = km_forward(m, c, in, BATCH, NULL, err)) < 0 ||
	    (r = km_sample(m, 0, BATCH, &g, tok)) < 0)
		goto out;
	t0 = now();
	for (int s = 0; s < tokens; s++)
		if ((r = km_forward(m, c, in, BATCH, NULL, err)) < 0 ||
		    (r = km_sample(m, 0, BATCH, &g, tok)) < 0)
			goto out;
	res->batch = (double) BATCH * tokens / (now() - t0);
out:
	km_kvcache_free(c);
	return r;
}

static int parse_dtype(const char *s, kk_dtype *ret)
{
	for (int d = 0; d < KK_I32; d++)
		if (streq(s, kk_dtype_name((kk_dtype) d))) {
			*ret = (kk_dtype) d;
			return 0;
		}
	return -EINVAL;
}

int main(int argc, char **argv)
{
	const struct shape *sh = &shapes[1];
	const char *path = NULL;
	kk_dtype dt = KK_F32;
	int threads[MAX_RUNS] = { 1 }, n_runs = 1, tokens = 64;
	km_file *f = NULL;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (streq(a, "--cpu-time")) {
			clock_id = CLOCK_PROCESS_CPUTIME_ID;
			continue;
		}
		if (!v)
			goto usage;
		i++;
		if (streq(a, "--shape")) {
			sh = NULL;
			for (size_t s = 0; s < ARRAY_SIZE(shapes); s++)
				if (streq(v, shapes[s].name))
					sh = &shapes[s];
			if (!sh) {
				fprintf(stderr, "--shape '%s': want 260K, 15M or 110M\n", v);
				return 2;
			}
		} else if (streq(a, "--model"))
			path = v;
		else if (streq(a, "--dtype")) {
			if (parse_dtype(v, &dt) < 0) {
				fprintf(stderr, "--dtype '%s': want f32, bf16, f16, i8 or q4\n", v);
				return 2;
			}
		} else if (streq(a, "--tokens")) {
			tokens = atoi(v);
			if (tokens < 1 || tokens > 4096) {
				fprintf(stderr, "--tokens '%s': want 1..4096\n", v);
				return 2;
			}
		} else if (streq(a, "--threads")) {
			char *end;
			n_runs = 0;
			for (const char *p = v; *p && n_runs < MAX_RUNS; p = *end ? end + 1 : end) {
				long t = strtol(p, &end, 10);
				if (end == p || (*end && *end != ',') || t < 1 ||
				    t > KK_THREADS_MAX) {
					fprintf(stderr,
						"--threads '%s': want counts 1..%d, "
						"comma-separated\n",
						v, KK_THREADS_MAX);
					return 2;
				}
				threads[n_runs++] = (int) t;
			}
		} else
			goto usage;
	}

	kk_backend *be = NULL;
	kiln_error err = {};
	km_config cfg = sh->cfg;
	km_weight_source src = { .userdata = &cfg, .read = random_read };
	int r = kk_backend_open("cpu", &be), rc = 0;
	if (r < 0) {
		fprintf(stderr, "bench-decode-cpu: cannot open the cpu backend: %s\n",
			strerror(-r));
		return 1;
	}
	if (path) {
		if (km_file_open(path, &f, &err) < 0) {
			fprintf(stderr, "bench-decode-cpu: %s\n", err.msg);
			kk_backend_free(be);
			return 1;
		}
		cfg = *km_file_config(f);
		src = km_file_source(f);
	}
	if (cfg.max_seq_len < PROMPT + tokens + 1)
		cfg.max_seq_len = PROMPT + tokens + 1;
	km_model_opts o = { .weight_dtype = dt, .max_tokens = PROMPT, .max_seqs = BATCH };
	km_model *m = NULL;
	if (km_model_new(be, &cfg, &o, &src, &m, &err) < 0) {
		fprintf(stderr, "bench-decode-cpu: %s\n", err.msg);
		km_file_free(f);
		kk_backend_free(be);
		return 1;
	}
	size_t wb = km_model_weight_bytes(m);
	if (!cfg.shared_classifier) { /* one embedding row per token, not the table */
		size_t vd = (size_t) cfg.vocab_size * cfg.dim;
		/* i8/q4 models quantize the table like their layers (f32 scales). */
		if (dt == KK_I8)
			wb -= vd + (size_t) cfg.vocab_size * 4;
		else if (dt == KK_Q4)
			wb -= vd / 2 + vd / 32 * 4;
		else
			wb -= kk_dtype_size(km_model_act_dtype(m), vd);
	}
	double bw = copy_gbs();
	printf("model %s (dim %d, %d layers, vocab %d), weights %s, %.1f MB read per decoded "
	       "token; copy bandwidth %.2f GB/s (1 thread, read+write); %s time\n",
	       path ? path : sh->name, cfg.dim, cfg.n_layers, cfg.vocab_size, kk_dtype_name(dt),
	       wb / 1e6, bw, clock_id == CLOCK_MONOTONIC ? "wall" : "process CPU");
	printf("| threads | prefill %d tok/s | decode tok/s | %% of roofline (%.0f tok/s) | "
	       "batch %d decode tok/s |\n",
	       PROMPT, bw * 1e9 / wb, BATCH);
	printf("|---------|------------------|--------------|-----------------------|"
	       "-----------------------|\n");
	for (int i = 0; i < n_runs; i++) {
		struct result res = {};
		kk_backend_set_threads(be, threads[i]);
		if ((r = run(m, be, tokens, &res, &err)) < 0) {
			fprintf(stderr, "bench-decode-cpu: %d threads: %s\n", threads[i],
				err.msg[0] ? err.msg : strerror(-r));
			rc = 1;
			continue;
		}
		printf("| %7d | %16.0f | %12.1f | %20.1f%% | %21.0f |\n", threads[i], res.prefill,
		       res.decode, 100.0 * res.decode / (bw * 1e9 / wb), res.batch);
	}
	km_model_free(m);
	km_file_free(f);
	kk_backend_free(be);
	return rc;
usage:
	fprintf(stderr,
		"usage: %s [--shape 260K|15M|110M | --model FILE] [--dtype NAME] "
		"[--threads N[,N...]] [--tokens N] [--cpu-time]\n",
		argv[0]);
	return 2;
}
