/* tests/model/bench-model.c — decode tokens/s of km_forward on the cpu
 * backend for the tiny260K fixture, single stream and a batch of 8, in each weight
 * dtype, next to the baseline: the unbatched float64 reference (ref.c)
 * decoding the same number of tokens, timed in the same run.
 *
 * usage: bench-model [--quick] [--cpu-time] [MODEL.bin]   (default: the
 * fixture as the test finds it).  Prints a table; exits 1 on any failure. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kk.h"
#include "kmodel.h"
#include "ref.h"
#include "../lib/fixture.h"
#include "../../kernels/bench/bench-clock.h"

#define BATCH 8

/* Wall clock by default; the process CPU clock with --cpu-time (the only
 * meaningful one on a busy shared machine, with one thread). */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	return kiln_clock_seconds(clock_id);
}

static void row(const char *impl, const char *dt, int batch, long tokens, double secs)
{
	printf("%-28s %-5s %5d %7ld %8.3f %10.0f\n", impl, dt, batch, tokens, secs,
	       (double) tokens / secs);
}

/* Prefills `batch` one-token prompts, then times `steps` greedy decode
 * steps over all of them; returns seconds or < 0. */
static double bench_kiln(kk_backend *be, km_file *f, kk_dtype dt, int batch, int steps)
{
	kiln_error err = {};
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = dt, .max_tokens = BATCH, .max_seqs = BATCH };
	km_model *m = NULL;
	km_kvcache *c = NULL;
	double t = -1;
	if (km_model_new(be, km_file_config(f), &o, &src, &m, &err) < 0) {
		fprintf(stderr, "bench-model: %s\n", err.msg);
		return -1;
	}
	int blocks = batch * ((steps + 1 + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE);
	if (km_kvcache_new(be, km_model_config(m), km_model_act_dtype(m), blocks, batch, &c) < 0)
		goto out;
	km_seq_input in[BATCH];
	int32_t tok[BATCH];
	kk_sampling g = {};
	for (int i = 0; i < batch; i++) {
		tok[i] = 1 + i; /* different prompts */
		in[i] = (km_seq_input){ km_kvcache_seq_new(c), &tok[i], 1 };
	}
	if (km_forward(m, c, in, batch, NULL, &err) < 0 || km_sample(m, 0, batch, &g, tok) < 0)
		goto fail;
	double t0 = now();
	for (int s = 0; s < steps; s++)
		if (km_forward(m, c, in, batch, NULL, &err) < 0 ||
		    km_sample(m, 0, batch, &g, tok) < 0)
			goto fail;
	t = now() - t0;
	goto out;
fail:
	fprintf(stderr, "bench-model: %s\n", err.msg);
out:
	km_kvcache_free(c);
	km_model_free(m);
	return t;
}

int main(int argc, char **argv)
{
	int steps = 256;
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			steps = 32;
		else if (strcmp(argv[i], "--cpu-time") == 0)
			clock_id = CLOCK_PROCESS_CPUTIME_ID;
		else
			path = argv[i];
	}
	if (!path)
		path = kiln_test_model_fixture();
	if (!path) {
		fprintf(stderr, "bench-model: model fixture %s is not readable: %s\n",
			kiln_test_model_path(), KILN_TEST_FIXTURE_HINT);
		return 2;
	}
	kk_backend *be = NULL;
	km_file *f = NULL;
	kiln_error err = {};
	int r = kk_backend_open("cpu", &be);
	if (r < 0) {
		fprintf(stderr, "bench-model: cannot open the cpu backend: %s\n", strerror(-r));
		return 1;
	}
	if (km_file_open(path, &f, &err) < 0) {
		fprintf(stderr, "bench-model: %s\n", err.msg);
		kk_backend_free(be);
		return 1;
	}
	printf("tiny260K greedy decode, %d steps per sequence after a 1-token prompt, "
	       "%s seconds\n",
	       steps, clock_id == CLOCK_MONOTONIC ? "wall-clock" : "process CPU");
	printf("%-28s %-5s %5s %7s %8s %10s\n", "implementation", "dtype", "batch", "tokens",
	       "seconds", "tokens/s");
	const kk_dtype dts[] = { KK_F32, KK_BF16, KK_I8, KK_Q4 };
	int rc = 0;
	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
		for (int batch = 1; batch <= BATCH; batch += BATCH - 1) {
			double t = bench_kiln(be, f, dts[d], batch, steps);
			if (t < 0) {
				rc = 1;
				continue;
			}
			row("kiln km_forward (cpu)", kk_dtype_name(dts[d]), batch,
			    (long) batch * steps, t);
		}
	/* Baseline: the reference, one sequence at a time (it has no batch). */
	ref_model *ref = ref_load(path);
	if (!ref) {
		fprintf(stderr, "bench-model: the reference cannot load %s\n", path);
		rc = 1;
	} else {
		double *lg = malloc(sizeof(double) * (size_t) ref_vocab(ref));
		for (int batch = 1; batch <= BATCH && lg; batch += BATCH - 1) {
			double t0 = now();
			for (int b = 0; b < batch; b++) {
				ref_reset(ref);
				int tok = 1 + b;
				for (int s = 0; s <= steps; s++) {
					if (ref_step(ref, tok, lg) < 0) {
						rc = 1;
						break;
					}
					tok = ref_argmax(lg, ref_vocab(ref));
				}
			}
			/* steps + 1 ref steps per sequence (prompt included). */
			row("baseline: ref.c float64", "f64", batch, (long) batch * (steps + 1),
			    now() - t0);
		}
		free(lg);
		ref_free(ref);
	}
	km_file_free(f);
	kk_backend_free(be);
	return rc;
}
