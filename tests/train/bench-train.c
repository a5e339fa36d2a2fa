/* tests/train/bench-train.c — training throughput of kmt_step on the cpu
 * backend for a small Llama, next to the baseline measured in the same
 * run: the model's own forward pass (kmt_forward on the same batch), so
 * the table shows what a training step costs against inference of the
 * same tokens (the textbook ratio is ~3: backward ~2x forward, plus the
 * optimizer).  bench-train.sh adds PyTorch's row for the same model.
 *
 * usage: bench-train [--quick] [--cpu-time] [--profile]
 * --profile: time the training steps only, with kmtrain's per-op profile
 * (KMT_PROFILE=1, printed to stderr at the end).
 * Prints the config line and one row per measurement:
 *   IMPL MS_PER_STEP TOKENS_PER_S
 * exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kk.h"
#include "kmtrain.h"
#include "../../kernels/bench/bench-clock.h"

#include "../lib/model-test.h"

/* The benchmark model: ~0.8M parameters, 512 tokens a step. */
#define DIM    128
#define HIDDEN 352
#define LAYERS 4
#define HEADS  4
#define KV     2
#define VOCAB  512
#define BATCH  4
#define SEQ    128

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	return kiln_clock_seconds(clock_id);
}

int main(int argc, char **argv)
{
	int steps = 20;
	bool profile = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			steps = 4;
		else if (!strcmp(argv[i], "--cpu-time"))
			clock_id = CLOCK_PROCESS_CPUTIME_ID;
		else if (!strcmp(argv[i], "--profile"))
			profile = true;
		else {
			fprintf(stderr, "usage: bench-train [--quick] [--cpu-time] [--profile]\n");
			return 2;
		}
	}
	km_config c = kiln_test_config(DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, SEQ,
				       KK_ROPE_INTERLEAVED, true);
	kmt_opts o = { .batch = BATCH, .seq_len = SEQ, .init_seed = 1 };
	kmt_optim opt = KILN_TEST_OPTIM(1e-3f, 0, 2, 0, 1.0f);
	kk_backend *be = NULL;
	kmt_model *m = NULL;
	kiln_error err = { 0 };
	if (kk_backend_open("cpu", &be) < 0 || kmt_model_new(be, &c, &o, NULL, &m, &err) < 0) {
		fprintf(stderr, "bench-train: %s\n", err.msg);
		return 1;
	}
	static int32_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
	uint64_t z = 7;
	for (int i = 0; i < BATCH * SEQ; i++) {
		z = z * 6364136223846793005ull + 1442695040888963407ull;
		tok[i] = (int32_t) ((z >> 33) % VOCAB);
	}
	for (int i = 0; i < BATCH * SEQ; i++)
		tgt[i] = (i + 1) % SEQ ? tok[i + 1] : KMT_IGNORE;
	kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = BATCH };
	kmt_stats st = { 0 };
	/* One of each first: buffers touched, BLAS threads started. */
	if (kmt_forward(m, &b, &st, &err) < 0 || kmt_step(m, &b, NULL, &opt, &st, &err) < 0) {
		fprintf(stderr, "bench-train: %s\n", err.msg);
		return 1;
	}
	double t0 = now();
	if (profile) /* from here: the steps alone */
		setenv("KMT_PROFILE", "1", 1);
	for (int i = 0; i < steps && !profile; i++)
		if (kmt_forward(m, &b, &st, &err) < 0)
			return 1;
	double fwd = profile ? 0 : (now() - t0) / steps;
	double first = 0;
	t0 = now();
	for (int i = 0; i < steps; i++) {
		if (kmt_step(m, &b, NULL, &opt, &st, &err) < 0) {
			fprintf(stderr, "bench-train: %s\n", err.msg);
			return 1;
		}
		if (!i)
			first = st.loss;
	}
	double step = (now() - t0) / steps;
	const double toks = (double) BATCH * SEQ;
	printf("config dim %d hidden %d layers %d heads %d/%d vocab %d batch %d x %d tokens, "
	       "%zu parameters, %d steps, loss %.3f -> %.3f\n",
	       DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, BATCH, SEQ, kmt_param_count(m), steps, first,
	       st.loss);
	printf("kiln-forward %.2f %.0f\n", fwd * 1e3, toks / fwd);
	printf("kiln-train-step %.2f %.0f\n", step * 1e3, toks / step);
	kmt_model_free(m);
	kk_backend_free(be);
	return 0;
}
