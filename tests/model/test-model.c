/* tests/model/test-model.c — the km_ model suite on the cpu backend.
 *
 * Checked against the independent float64 reference (ref.c) on the
 * model fixture (tiny260K.bin, trained by the build: tests/fixtures): greedy decoding token for
 * token with logits to a stated tolerance, prompts of 1/16/17/40 tokens through prefill, continuous
 * batching (sequences joining and leaving mid-way give the tokens each gives
 * alone), bf16/f16 and int8/int4 weights against f32, the KV cache
 * allocator (also against a simple model on random operations), and bad
 * checkpoints refused with exact messages.  The fixture is found through
 * $KM_TEST_MODEL or build/fixtures/ (tests/lib/fixture.h); without it the
 * model tests fail, naming it. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kk.h"
#include "kmodel.h"
#include "ref.h"

#include "model-check.h"
#include "../lib/fixture.h"
#include "../lib/model-test.h"

/* Greedy decode length compared with the reference (the brief: 200+). */
#define N_GREEDY 256
/* f32 logits against float64: sums of <= 172 products in f32 with
 * different order; measured max ~2e-5 on llama2.c's stories260K (|logits| < 20). */
#define TOL_F32 1e-3
/* Teacher-forced steps for the dtype comparisons. */
#define N_FORCED 128

static const char *fixture;
static kk_backend *be;
static ref_model *ref;
static int greedy[N_GREEDY + 1]; /* BOS then the reference's greedy tokens */
static double *ref_logits;	 /* [N_GREEDY][vocab], after greedy[0..i] */
static int V;

/* the fixture is the build's own: missing is a failure, not a skip */
#define NEED_FIXTURE() KILN_NEED_FIXTURE(ref)

static int group_setup(void **state)
{
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	fixture = kiln_test_model_fixture();
	if (!fixture)
		return 0;
	ref = ref_load(fixture);
	assert_non_null(ref);
	V = ref_vocab(ref);
	ref_logits = calloc((size_t) N_GREEDY * V, sizeof(double));
	assert_non_null(ref_logits);
	greedy[0] = 1;
	for (int i = 0; i < N_GREEDY; i++) {
		assert_int_equal(ref_step(ref, greedy[i], ref_logits + (size_t) i * V), 0);
		greedy[i + 1] = ref_argmax(ref_logits + (size_t) i * V, V);
	}
	return 0;
}

static int group_teardown(void **state)
{
	ref_free(ref);
	free(ref_logits);
	kk_backend_free(be);
	return 0;
}

static km_model *load(kk_dtype dt, int max_tokens, int max_seqs)
{
	kiln_error err = {};
	km_file *f = NULL;
	int r = km_file_open(fixture, &f, &err);
	if (r < 0)
		fail_msg("%s", err.msg);
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = dt, .max_tokens = max_tokens, .max_seqs = max_seqs };
	km_model *m = NULL;
	r = km_model_new(be, km_file_config(f), &o, &src, &m, &err);
	km_file_free(f);
	if (r < 0)
		fail_msg("km_model_new(%s): %s", kk_dtype_name(dt), err.msg);
	return m;
}

static km_kvcache *cache_for(km_model *m, int blocks, int seqs)
{
	km_kvcache *c = NULL;
	assert_int_equal(
		km_kvcache_new(be, km_model_config(m), km_model_act_dtype(m), blocks, seqs, &c), 0);
	return c;
}

static int step(km_model *m, km_kvcache *c, const km_seq_input *in, int n, float *logits)
{
	kiln_error err = {};
	int r = km_forward(m, c, in, n, logits, &err);
	if (r < 0 && r != -ENOSPC && r != -EINVAL && r != -EFBIG)
		fail_msg("km_forward: %s", err.msg);
	return r;
}

static double max_err(const float *a, const double *b, int n)
{
	double e = 0;
	for (int i = 0; i < n; i++)
		e = fmax(e, fabs((double) a[i] - b[i]));
	return e;
}

/* ---- greedy decode against the reference ------------------------------- */

static void test_greedy_matches_reference(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 64, 8);
	km_kvcache *c = cache_for(m, 64, 8);
	int s = km_kvcache_seq_new(c);
	float *lg = malloc(sizeof(float) * (size_t) V);
	int32_t tok = greedy[0];
	double worst = 0;
	kk_sampling g = { .temperature = 0 };
	for (int i = 0; i < N_GREEDY; i++) {
		km_seq_input in = { .seq = s, .tokens = &tok, .n_tokens = 1 };
		assert_int_equal(step(m, c, &in, 1, lg), 0);
		double e = max_err(lg, ref_logits + (size_t) i * V, V);
		worst = fmax(worst, e);
		if (e > TOL_F32)
			fail_msg("step %d: logits differ from the reference by %g (> %g)", i, e,
				 TOL_F32);
		int32_t next;
		assert_int_equal(km_sample(m, 0, 1, &g, &next), 0);
		if (next != greedy[i + 1])
			fail_msg("step %d: token %d, the reference has %d", i, next, greedy[i + 1]);
		tok = next;
	}
	assert_int_equal(km_kvcache_seq_len(c, s), N_GREEDY);
	print_message("# greedy: %d tokens match the float64 reference; max |logit err| %.3g "
		      "(tolerance %g)\n",
		      N_GREEDY, worst, TOL_F32);
	free(lg);
	km_kvcache_free(c);
	km_model_free(m);
}

/* Prompts through prefill (one step), then teacher-forced decode. */
static void test_prefill_lengths(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 64, 8);
	km_kvcache *c = cache_for(m, 32, 8);
	float *lg = malloc(sizeof(float) * (size_t) V);
	const int lens[] = { 1, 15, 16, 17, 33, 40 };
	double worst = 0;
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		int n = lens[li];
		int s = km_kvcache_seq_new(c);
		int32_t prompt[64];
		for (int i = 0; i < n; i++)
			prompt[i] = greedy[i];
		km_seq_input in = { .seq = s, .tokens = prompt, .n_tokens = n };
		assert_int_equal(step(m, c, &in, 1, lg), 0);
		assert_int_equal(km_kvcache_seq_len(c, s), n);
		int32_t blocks[8];
		assert_int_equal(km_kvcache_seq_blocks(c, s, blocks, 8), (n + 15) / 16);
		double e = max_err(lg, ref_logits + (size_t) (n - 1) * V, V);
		worst = fmax(worst, e);
		if (e > TOL_F32)
			fail_msg("prompt of %d: logits off by %g", n, e);
		for (int i = n; i < n + 20; i++) {
			int32_t t = greedy[i];
			km_seq_input d = { .seq = s, .tokens = &t, .n_tokens = 1 };
			assert_int_equal(step(m, c, &d, 1, lg), 0);
			e = max_err(lg, ref_logits + (size_t) i * V, V);
			worst = fmax(worst, e);
			if (e > TOL_F32)
				fail_msg("prompt of %d, position %d: logits off by %g", n, i, e);
			assert_int_equal(kiln_test_argmax(lg, V), greedy[i + 1]);
		}
		assert_int_equal(km_kvcache_seq_free(c, s), 0);
	}
	assert_int_equal(km_kvcache_free_blocks(c), 32);
	print_message("# prefill of 1/15/16/17/33/40 tokens + 20 decode steps: max |logit err| "
		      "%.3g\n",
		      worst);
	free(lg);
	km_kvcache_free(c);
	km_model_free(m);
}

/* ---- continuous batching ------------------------------------------------ */

#define NB     6
#define NB_GEN 24

typedef struct bseq {
	int32_t prompt[32];
	int plen, join, gen; /* join step, tokens to generate */
	int32_t out[NB_GEN];
	float out_logits[NB_GEN][512];
} bseq;

/* Runs one sequence alone: prefill, then gen-1 decode steps. */
static void run_alone(km_model *m, bseq *b)
{
	km_kvcache *c = cache_for(m, 16, 1);
	int s = km_kvcache_seq_new(c);
	kk_sampling g = {};
	km_seq_input in = { .seq = s, .tokens = b->prompt, .n_tokens = b->plen };
	for (int i = 0; i < b->gen; i++) {
		assert_int_equal(step(m, c, &in, 1, b->out_logits[i]), 0);
		assert_int_equal(km_sample(m, 0, 1, &g, &b->out[i]), 0);
		in.tokens = &b->out[i];
		in.n_tokens = 1;
	}
	km_kvcache_free(c);
}

static void test_continuous_batching(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 128, 8);
	bseq *b = calloc(NB, sizeof(*b));
	unsigned rs = 12345;
	const int joins[NB] = { 0, 0, 1, 4, 9, 15 }, gens[NB] = { 24, 7, 12, 24, 3, 10 };
	for (int i = 0; i < NB; i++) {
		b[i].plen = 1 + (i * 7) % 29;
		b[i].prompt[0] = 1;
		for (int t = 1; t < b[i].plen; t++)
			b[i].prompt[t] = (int32_t) ((rs = rs * 1103515245u + 12345u) >> 8) % V;
		b[i].join = joins[i];
		b[i].gen = gens[i];
		run_alone(m, &b[i]);
	}
	/* Together: 12 blocks only, so later sequences reuse freed blocks. */
	km_kvcache *c = cache_for(m, 12, 8);
	int seq[NB], done[NB] = {}, live = 0, finished = 0;
	int32_t got[NB][NB_GEN];
	float *lg = malloc(sizeof(float) * 8 * (size_t) V);
	double worst = 0;
	int max_live = 0, mixed_steps = 0;
	kk_sampling g = {};
	for (int stp = 0; finished < NB; stp++) {
		km_seq_input in[NB];
		int who[NB], n = 0, n_prefill = 0;
		for (int i = 0; i < NB; i++) {
			if (b[i].join == stp) {
				seq[i] = km_kvcache_seq_new(c);
				assert_true(seq[i] >= 0);
				in[n] = (km_seq_input){ seq[i], b[i].prompt, b[i].plen };
				who[n++] = i;
				n_prefill++;
				live++;
			} else if (b[i].join < stp && done[i] < b[i].gen) {
				in[n] = (km_seq_input){ seq[i], &got[i][done[i] - 1], 1 };
				who[n++] = i;
			}
		}
		max_live = live > max_live ? live : max_live;
		if (n == 0)
			continue;
		mixed_steps += n_prefill > 0 && n_prefill < n;
		assert_int_equal(step(m, c, in, n, lg), 0);
		for (int j = 0; j < n; j++) {
			int i = who[j];
			assert_int_equal(km_sample(m, j, 1, &g, &got[i][done[i]]), 0);
			if (got[i][done[i]] != b[i].out[done[i]])
				fail_msg("sequence %d token %d: %d batched, %d alone", i, done[i],
					 got[i][done[i]], b[i].out[done[i]]);
			for (int t = 0; t < V; t++)
				worst = fmax(worst, fabs(lg[(size_t) j * V + t] -
							 b[i].out_logits[done[i]][t]));
			if (++done[i] == b[i].gen) {
				assert_int_equal(km_kvcache_seq_free(c, seq[i]), 0);
				live--;
				finished++;
			}
		}
	}
	assert_int_equal(km_kvcache_free_blocks(c), 12);
	assert_true(mixed_steps >= 2);
	assert_true(worst < TOL_F32);
	print_message("# %d sequences (up to %d live, %d mixed prefill+decode steps) give the "
		      "tokens each gives alone; max |logit diff| %.3g\n",
		      NB, max_live, mixed_steps, worst);
	free(lg);
	free(b);
	km_kvcache_free(c);
	km_model_free(m);
}

/* A forked sequence reuses the parent's first 16-token block and continues
 * token by token; it gives the reference's logits. */
static void test_prefix_fork(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 64, 4);
	km_kvcache *c = cache_for(m, 8, 4);
	float lg[512];
	int a = km_kvcache_seq_new(c);
	int32_t prompt[20];
	for (int i = 0; i < 20; i++)
		prompt[i] = greedy[i];
	km_seq_input in = { a, prompt, 20 };
	assert_int_equal(step(m, c, &in, 1, lg), 0);
	int f = km_kvcache_seq_fork(c, a, 16);
	assert_true(f >= 0);
	int32_t ba[4], bf[4];
	assert_int_equal(km_kvcache_seq_blocks(c, a, ba, 4), 2);
	assert_int_equal(km_kvcache_seq_blocks(c, f, bf, 4), 1);
	assert_int_equal(ba[0], bf[0]);
	assert_int_equal(km_kvcache_block_refs(c, ba[0]), 2);
	assert_int_equal(km_kvcache_seq_free(c, a), 0);
	assert_int_equal(km_kvcache_block_refs(c, bf[0]), 1);
	for (int i = 16; i < 30; i++) {
		int32_t t = greedy[i];
		km_seq_input d = { f, &t, 1 };
		assert_int_equal(step(m, c, &d, 1, lg), 0);
		assert_true(max_err(lg, ref_logits + (size_t) i * V, V) < TOL_F32);
	}
	km_kvcache_free(c);
	km_model_free(m);
}

/* Chunked prefill: a prompt fed in chunks over a cached context (and
 * mixed in one step with a whole prefill and a decode) gives the logits of
 * the reference at every chunk's last token, and the same greedy
 * continuation as the whole prompt at once. */
static void test_chunked_prefill(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 128, 4);
	km_kvcache *c = cache_for(m, 32, 4);
	float lg[3 * 512];
	int32_t prompt[64];
	for (int i = 0; i < 64; i++)
		prompt[i] = greedy[i];
	/* a: chunks of 1, 15, 20, 28 (ends inside, at and past block edges). */
	int a = km_kvcache_seq_new(c), b = km_kvcache_seq_new(c), d = km_kvcache_seq_new(c);
	const int chunks[] = { 1, 15, 20, 28 };
	int at = 0;
	for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
		km_seq_input in = { a, prompt + at, chunks[k] };
		assert_int_equal(step(m, c, &in, 1, lg), 0);
		at += chunks[k];
		double e = max_err(lg, ref_logits + (size_t) (at - 1) * V, V);
		if (e >= TOL_F32)
			fail_msg("chunk %zu (tokens %d..%d): logits off by %g", k, at - chunks[k],
				 at - 1, e);
	}
	/* One step mixing a whole prefill (b), a chunk (d after its first 10)
	 * and a decode (a). */
	km_seq_input first = { d, prompt, 10 };
	assert_int_equal(step(m, c, &first, 1, lg), 0);
	int32_t next = greedy[64];
	km_seq_input mix[3] = { { a, &next, 1 }, { b, prompt, 40 }, { d, prompt + 10, 30 } };
	assert_int_equal(step(m, c, mix, 3, lg), 0);
	const int want_row[3] = { 64, 39, 39 };
	for (int i = 0; i < 3; i++) {
		double e = max_err(lg + (size_t) i * V, ref_logits + (size_t) want_row[i] * V, V);
		if (e >= TOL_F32)
			fail_msg("mixed step input %d: logits off by %g", i, e);
	}
	assert_int_equal(km_kvcache_seq_len(c, a), 65);
	assert_int_equal(km_kvcache_seq_len(c, d), 40);
	/* Greedy continuation of d matches the reference's. */
	for (int i = 40; i < 80; i++) {
		int32_t t = greedy[i];
		km_seq_input in = { d, &t, 1 };
		assert_int_equal(step(m, c, &in, 1, lg), 0);
		assert_int_equal(kiln_test_argmax(lg, V), greedy[i + 1]);
	}
	km_kvcache_free(c);
	km_model_free(m);
}

/* ---- other dtypes ------------------------------------------------------- */

/* Runs the reference's greedy tokens through m (teacher forcing) and
 * compares its logits with those of base at every step. */
static void forced_compare(km_model *m, km_model *base, double *max_abs, double *agree)
{
	km_kvcache *c = cache_for(m, 16, 1), *cb = cache_for(base, 16, 1);
	int s = km_kvcache_seq_new(c), sb = km_kvcache_seq_new(cb);
	float lg[512], lb[512];
	int same = 0;
	*max_abs = 0;
	for (int i = 0; i < N_FORCED; i++) {
		int32_t t = greedy[i];
		km_seq_input in = { s, &t, 1 }, ib = { sb, &t, 1 };
		assert_int_equal(step(m, c, &in, 1, lg), 0);
		assert_int_equal(step(base, cb, &ib, 1, lb), 0);
		for (int j = 0; j < V; j++)
			*max_abs = fmax(*max_abs, fabs(lg[j] - lb[j]));
		same += kiln_test_argmax(lg, V) == kiln_test_argmax(lb, V);
	}
	*agree = (double) same / N_FORCED;
	km_kvcache_free(c);
	km_kvcache_free(cb);
}

/* A weight source that hands out the checkpoint's linear weights already
 * (and the embedding / classifier, which i8/q4 models quantize too)
 * quantized and dequantized on the host (kk.h's documented scheme: per row
 * for int8, per 32-group for int4, scale = max|w| / qmax, q = rint(w /
 * scale) clamped), so an f32 model over it is the exact target of the
 * int8/int4 models' arithmetic. */
typedef struct fakeq {
	km_weight_source inner;
	int qmax, qmin, group; /* group 0: whole row */
	int dim;
} fakeq;

static int fakeq_read(void *ud, const char *name, float *dst, size_t count, kiln_error *err)
{
	fakeq *f = ud;
	int r = f->inner.read(f->inner.userdata, name, dst, count, err);
	/* The layers' matrices, and the embedding / classifier (quantized too). */
	if (r < 0 || (!strstr(name, ".attention.w") && !strstr(name, ".feed_forward.w") &&
		      strcmp(name, "tok_embeddings.weight") && strcmp(name, "output.weight")))
		return r;
	/* w2's rows are hidden_dim long, the others dim. */
	size_t k = strstr(name, ".w2.") ? count / (size_t) f->dim : (size_t) f->dim;
	size_t g = f->group ? (size_t) f->group : k;
	for (size_t row = 0; row < count / k; row++)
		for (size_t g0 = 0; g0 < k; g0 += g) {
			float *w = dst + row * k + g0, amax = 0;
			size_t n = g0 + g <= k ? g : k - g0;
			for (size_t j = 0; j < n; j++)
				amax = fmaxf(amax, fabsf(w[j]));
			float sc = amax / (float) f->qmax, inv = sc > 0 ? 1.0f / sc : 0;
			for (size_t j = 0; j < n; j++) {
				float q = rintf(w[j] * inv);
				q = q > f->qmax	  ? (float) f->qmax
				    : q < f->qmin ? (float) f->qmin
						  : q;
				w[j] = q * sc;
			}
		}
	return 0;
}

static km_model *load_fakeq(int qmax, int qmin, int group)
{
	kiln_error err = {};
	km_file *l = NULL;
	assert_int_equal(km_file_open(fixture, &l, &err), 0);
	fakeq f = { km_file_source(l), qmax, qmin, group, km_file_config(l)->dim };
	km_weight_source src = { .userdata = &f, .read = fakeq_read };
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 16, .max_seqs = 1 };
	km_model *m = NULL;
	int r = km_model_new(be, km_file_config(l), &o, &src, &m, &err);
	km_file_free(l);
	if (r < 0)
		fail_msg("%s", err.msg);
	return m;
}

/* The int8/int4 paths compute what their quantized weights say: against
 * an f32 model over host-quantized weights the logits agree to within what
 * kk_qgemm's int8 activations (per 32-block, max|x| / 127 steps: about
 * bf16's relative rounding) move them; the bound is test_dtypes's for bf16
 * weights.  That the integer dot products are exact for the activations
 * as quantized is test-kernels-cpu's test_qdot_variants. */
static void test_quantized_exact(void **state)
{
	NEED_FIXTURE();
	const struct {
		kk_dtype dt;
		int qmax, qmin, group;
	} cases[] = { { KK_I8, 127, -127, 0 }, { KK_Q4, 7, -8, 32 } };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		km_model *m = load(cases[i].dt, 16, 1);
		km_model *f = load_fakeq(cases[i].qmax, cases[i].qmin, cases[i].group);
		double e, a;
		forced_compare(m, f, &e, &a);
		print_message("# %-4s model vs f32 over host-quantized weights: max |logit "
			      "diff| %.3g, top-1 agreement %.3f\n",
			      kk_dtype_name(cases[i].dt), e, a);
		assert_true(e < 4.0);
		assert_true(a >= 0.85);
		km_model_free(f);
		km_model_free(m);
	}
}

static void test_dtypes(void **state)
{
	NEED_FIXTURE();
	km_model *base = load(KK_F32, 16, 1);
	/* Bounds: the measured values (docs/model.md) with about 2x margin.
	 * A 260K-parameter model with dim 64 is very sensitive to weight
	 * error (int4 keeps the f32 top-1 at a quarter of the steps);
	 * test_quantized_exact shows the int8/int4 arithmetic itself is
	 * exact for the weights it holds. */
	const struct {
		kk_dtype dt;
		double max_abs, min_agree;
	} cases[] = {
		{ KK_BF16, 4.0, 0.85 },
		{ KK_F16, 0.3, 0.95 },
		{ KK_I8, 10.0, 0.80 }, /* int8 activations too: 2.98 -> 5.46 */
		{ KK_Q4, 30.0, 0.15 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		km_model *m = load(cases[i].dt, 16, 1);
		double e, a;
		forced_compare(m, base, &e, &a);
		print_message("# %-4s weights vs f32 over %d teacher-forced steps: max |logit "
			      "err| %.4f (bound %.2f), top-1 agreement %.3f (bound %.2f), "
			      "weights %zu bytes\n",
			      kk_dtype_name(cases[i].dt), N_FORCED, e, cases[i].max_abs, a,
			      cases[i].min_agree, km_model_weight_bytes(m));
		assert_true(e <= cases[i].max_abs);
		assert_true(a >= cases[i].min_agree);
		assert_true(e > 0); /* really another dtype */
		km_model_free(m);
	}
	km_model_free(base);
}

/* ---- KV cache ----------------------------------------------------------- */

static km_config small_cfg(void)
{
	return kiln_test_config(16, 32, 2, 2, 1, 10, 100, KK_ROPE_INTERLEAVED, true);
}

static void test_kvcache_basic(void **state)
{
	km_config cfg = small_cfg();
	km_kvcache *c = NULL;
	assert_int_equal(km_kvcache_new(be, &cfg, KK_F32, 0, 4, &c), -EINVAL);
	assert_int_equal(km_kvcache_new(be, &cfg, KK_I8, 4, 4, &c), -EINVAL);
	assert_int_equal(km_kvcache_new(be, &cfg, KK_F32, 4, 2, &c), 0);
	assert_int_equal(km_kvcache_blocks_per_seq(c), 7); /* ceil(100 / 16) */
	int a = km_kvcache_seq_new(c), b = km_kvcache_seq_new(c);
	assert_int_equal(a, 0);
	assert_int_equal(b, 1);
	assert_int_equal(km_kvcache_seq_new(c), -ENOSPC);
	int32_t slots[64];
	/* 17 tokens: two blocks, the 17th in slot 0 of the second. */
	assert_int_equal(km_kvcache_append(c, a, 17, slots), 0);
	assert_int_equal(slots[0], 0);
	assert_int_equal(slots[15], 15);
	assert_int_equal(slots[16], 16);
	assert_int_equal(km_kvcache_free_blocks(c), 2);
	/* b: 16 tokens fill one new block (2). */
	assert_int_equal(km_kvcache_append(c, b, 16, slots), 0);
	assert_int_equal(slots[0], 2 * 16);
	assert_int_equal(km_kvcache_free_blocks(c), 1);
	/* b's 17th token takes the last block (3); a can still grow to 32
	 * tokens inside its second block, not further. */
	assert_int_equal(km_kvcache_append(c, b, 1, slots), 0);
	assert_int_equal(slots[0], 3 * 16);
	assert_int_equal(km_kvcache_can_append(c, a, 15), 1);
	assert_int_equal(km_kvcache_can_append(c, a, 16), 0);
	assert_int_equal(km_kvcache_append(c, a, 16, slots), -ENOSPC);
	assert_int_equal(km_kvcache_seq_len(c, a), 17); /* unchanged */
	/* Freeing b returns its blocks; a reuses them (last freed first). */
	assert_int_equal(km_kvcache_seq_free(c, b), 0);
	assert_int_equal(km_kvcache_seq_free(c, b), -EINVAL);
	assert_int_equal(km_kvcache_free_blocks(c), 2);
	assert_int_equal(km_kvcache_append(c, a, 16, slots), 0);
	assert_int_equal(slots[15], 3 * 16 + 0);
	/* Longer than one block-table row (max_seq_len 100): -EFBIG. */
	assert_int_equal(km_kvcache_append(c, a, 100 - 33 + 1, NULL), -EFBIG);
	assert_int_equal(km_kvcache_seq_len(c, a), 33);
	assert_int_equal(km_kvcache_seq_fork(c, a, 17), -EINVAL);
	assert_int_equal(km_kvcache_seq_fork(c, a, 48), -EINVAL);
	km_kvcache_free(c);
}

/* Random appends, forks and frees against a model that tracks, per
 * sequence, its length and the owners of each block. */
static void test_kvcache_random(void **state)
{
	km_config cfg = small_cfg();
	cfg.max_seq_len = 80;
	enum { NBLK = 20, NSEQ = 6 };
	km_kvcache *c = NULL;
	assert_int_equal(km_kvcache_new(be, &cfg, KK_F32, NBLK, NSEQ, &c), 0);
	int len[NSEQ];
	bool live[NSEQ] = {};
	unsigned rs = 7;
#define RND(n) ((int) (((rs = rs * 1664525u + 1013904223u) >> 8) % (unsigned) (n)))
	for (int it = 0; it < 20000; it++) {
		int op = RND(10), s = RND(NSEQ);
		if (op < 2) {
			int r = km_kvcache_seq_new(c);
			int want = -ENOSPC;
			for (int i = 0; i < NSEQ; i++)
				if (!live[i]) {
					want = i;
					break;
				}
			assert_int_equal(r, want);
			if (r >= 0)
				live[r] = true, len[r] = 0;
		} else if (op < 3) {
			assert_int_equal(km_kvcache_seq_free(c, s), live[s] ? 0 : -EINVAL);
			live[s] = false;
		} else if (op < 4 && live[s]) {
			int n = RND(len[s] / 16 + 1) * 16;
			int r = km_kvcache_seq_fork(c, s, n);
			if (r >= 0)
				live[r] = true, len[r] = n;
			else
				assert_int_equal(r, -ENOSPC);
		} else if (live[s]) {
			int n = 1 + RND(20);
			/* Blocks the model says are free: NBLK minus distinct used. */
			int used = 0;
			bool mark[NBLK] = {};
			for (int i = 0; i < NSEQ; i++) {
				int32_t bl[8];
				if (!live[i])
					continue;
				int nb = km_kvcache_seq_blocks(c, i, bl, 8);
				assert_int_equal(nb, (len[i] + 15) / 16);
				for (int j = 0; j < nb; j++)
					if (!mark[bl[j]])
						mark[bl[j]] = true, used++;
			}
			assert_int_equal(km_kvcache_free_blocks(c), NBLK - used);
			int need = (len[s] + n + 15) / 16 - (len[s] + 15) / 16;
			int want = len[s] + n > 80 ? -EFBIG : need > NBLK - used ? -ENOSPC : 0;
			int32_t slots[20];
			assert_int_equal(km_kvcache_append(c, s, n, slots), want);
			if (want == 0) {
				/* New slots lie in blocks that no other sequence holds,
				 * except in a block already partially this sequence's. */
				for (int j = 0; j < n; j++) {
					int blk = slots[j] / 16;
					assert_int_equal(slots[j] % 16, (len[s] + j) % 16);
					assert_int_equal(km_kvcache_block_refs(c, blk), 1);
				}
				len[s] += n;
			}
			assert_int_equal(km_kvcache_seq_len(c, s), len[s]);
		}
	}
#undef RND
	for (int i = 0; i < NSEQ; i++)
		if (live[i])
			assert_int_equal(km_kvcache_seq_free(c, i), 0);
	assert_int_equal(km_kvcache_free_blocks(c), NBLK);
	for (int b = 0; b < NBLK; b++)
		assert_int_equal(km_kvcache_block_refs(c, b), 0);
	km_kvcache_free(c);
}

/* Out of blocks inside a step: -ENOSPC and nothing appended. */
static void test_forward_enospc(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 64, 4);
	km_kvcache *c = cache_for(m, 3, 4);
	int a = km_kvcache_seq_new(c), b = km_kvcache_seq_new(c);
	int32_t p[40];
	for (int i = 0; i < 40; i++)
		p[i] = greedy[i];
	km_seq_input in[2] = { { a, p, 20 }, { b, p, 20 } };
	kiln_error err = {};
	assert_int_equal(km_forward(m, c, in, 2, NULL, &err), -ENOSPC);
	assert_string_equal(err.msg, "step: the KV cache is out of blocks for sequence 1 (1 "
				     "free); free or preempt a sequence");
	assert_int_equal(km_kvcache_seq_len(c, a), 0);
	assert_int_equal(km_kvcache_free_blocks(c), 3);
	/* Bad inputs. */
	int32_t bad = V;
	km_seq_input one = { a, &bad, 1 };
	assert_int_equal(km_forward(m, c, &one, 1, NULL, &err), -EINVAL);
	assert_string_equal(err.msg,
			    "step: sequence 0: token id 512 outside the vocabulary (0..511)");
	km_seq_input dup[2] = { { a, p, 2 }, { a, p, 2 } };
	assert_int_equal(km_forward(m, c, dup, 2, NULL, &err), -EINVAL);
	assert_string_equal(err.msg, "step: sequence 0 appears twice in one step");
	assert_int_equal(km_forward(m, c, in, 1, NULL, &err), 0);
	km_seq_input empty = { a, p, 0 };
	assert_int_equal(km_forward(m, c, &empty, 1, NULL, &err), -EINVAL);
	assert_string_equal(err.msg, "step: input 0 has no tokens");
	km_seq_input big = { b, p, 40 };
	km_kvcache *c2 = cache_for(m, 8, 4);
	int s2 = km_kvcache_seq_new(c2);
	big.seq = s2;
	assert_int_equal(km_forward(m, c2, &big, 1, NULL, &err), 0);
	km_kvcache_free(c2);
	km_kvcache_free(c);
	km_model_free(m);
}

/* Seeded sampling: the same seed gives the same tokens; temperature 0
 * equals greedy.  Temperature 2: the fixture is sure of its stories, and
 * at temperature 1 with top_p 0.9 it picks its greedy tokens anyway. */
static void test_sampling(void **state)
{
	NEED_FIXTURE();
	km_model *m = load(KK_F32, 16, 2);
	km_kvcache *c = cache_for(m, 4, 2);
	int32_t run[2][20];
	for (int rep = 0; rep < 2; rep++) {
		int s = km_kvcache_seq_new(c);
		int32_t t = 1;
		for (int i = 0; i < 20; i++) {
			km_seq_input in = { s, &t, 1 };
			assert_int_equal(step(m, c, &in, 1, NULL), 0);
			kk_sampling p = { .temperature = 2.0f,
					  .top_k = 40,
					  .top_p = 0.95f,
					  .seed = 1000 + (uint64_t) i };
			assert_int_equal(km_sample(m, 0, 1, &p, &run[rep][i]), 0);
			assert_true(run[rep][i] >= 0 && run[rep][i] < V);
			t = run[rep][i];
		}
		km_kvcache_seq_free(c, s);
	}
	assert_memory_equal(run[0], run[1], sizeof(run[0]));
	/* Two sequences in one batch, each sampled on its own row with its
	 * own seed, give the tokens they give alone (run[0] for seq A). */
	int a = km_kvcache_seq_new(c), b = km_kvcache_seq_new(c);
	int32_t ta = 1, tb = 7, got;
	for (int i = 0; i < 20; i++) {
		km_seq_input in[2] = { { b, &tb, 1 }, { a, &ta, 1 } };
		assert_int_equal(step(m, c, in, 2, NULL), 0);
		kk_sampling pa = { .temperature = 2.0f,
				   .top_k = 40,
				   .top_p = 0.95f,
				   .seed = 1000 + (uint64_t) i };
		kk_sampling pb = pa;
		pb.seed = 99;
		assert_int_equal(km_sample(m, 1, 1, &pa, &got), 0);
		assert_int_equal(got, run[0][i]);
		ta = got;
		assert_int_equal(km_sample(m, 0, 1, &pb, &tb), 0);
	}
	assert_memory_not_equal(run[0], greedy + 1, sizeof(run[0])); /* really sampled */
	int32_t x;
	assert_int_equal(km_sample(m, 2, 1, &(kk_sampling){}, &x), -EINVAL); /* 2 rows only */
	km_kvcache_free(c);
	km_model_free(m);
}

/* A source of small pseudo-random weights for synthetic configs. */
static int random_read(void *ud, const char *name, float *dst, size_t count, kiln_error *err)
{
	unsigned *rs = ud;
	for (size_t i = 0; i < count; i++)
		dst[i] = (float) ((*rs = *rs * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
	return 0;
}

/* A head dim the backend has no attention kernel for is refused when the
 * model is made, with the reason (on cuda: anything but 64/128). */
static void test_unsupported_head_dim(void **state)
{
	km_config c = small_cfg();
	c.dim = 256;
	c.n_heads = 1;
	c.n_kv_heads = 1;
	c.head_dim = 256;
	unsigned rs = 3;
	km_weight_source src = { .userdata = &rs, .read = random_read };
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 4, .max_seqs = 1 };
	km_model *m = NULL;
	kiln_error err = {};
	assert_int_equal(km_model_new(be, &c, &o, &src, &m, &err), -EOPNOTSUPP);
	assert_null(m);
	assert_string_equal(err.msg, "attention: backend 'cpu' has no kernel for this model "
				     "(head_dim 256, dtype f32); kk attention takes head dims "
				     "1..128 on cpu, 64 and 128 on cuda: run it on a backend "
				     "that has it (KILN_BACKEND=cpu)");
	/* The same shape with head_dim 128 runs (two heads), HF RoPE and an
	 * unshared classifier included. */
	c.n_heads = c.n_kv_heads = 2;
	c.head_dim = 128;
	c.rope_mode = KK_ROPE_HALF;
	c.shared_classifier = false;
	assert_int_equal(km_model_new(be, &c, &o, &src, &m, &err), 0);
	km_kvcache *kv = cache_for(m, 2, 1);
	int32_t t[3] = { 1, 2, 3 };
	km_seq_input in = { km_kvcache_seq_new(kv), t, 3 };
	float lg[10];
	assert_int_equal(step(m, kv, &in, 1, lg), 0);
	for (int i = 0; i < 10; i++)
		assert_true(isfinite(lg[i]));
	km_kvcache_free(kv);
	km_model_free(m);
}

static char tmpdir[] = "/tmp/test-model-XXXXXX";

/* An unshared classifier (negative vocab in the header, the matrix after
 * the RoPE tables): the fixture plus half its embedding table appended as
 * the classifier gives half the shared model's logits, as the reference
 * computes them from the file. */
static void test_unshared_classifier(void **state)
{
	NEED_FIXTURE();
	FILE *in = fopen(fixture, "rb");
	assert_non_null(in);
	static char buf[1056540 + 512 * 64 * 4];
	assert_int_equal(fread(buf, 1, 1056540, in), 1056540);
	fclose(in);
	int32_t neg = -512;
	memcpy(buf + 20, &neg, 4);
	for (int i = 0; i < 512 * 64; i++) {
		float w;
		memcpy(&w, buf + 28 + 4 * i, 4);
		w *= 0.5f;
		memcpy(buf + 1056540 + 4 * i, &w, 4);
	}
	char path[] = "/tmp/test-model-cls-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, sizeof(buf)), (ssize_t) sizeof(buf));
	close(fd);

	kiln_error err = {};
	km_file *f = NULL;
	assert_int_equal(km_file_open(path, &f, &err), 0);
	assert_false(km_file_config(f)->shared_classifier);
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 8, .max_seqs = 1 };
	km_model *m = NULL, *mq = NULL;
	assert_int_equal(km_model_new(be, km_file_config(f), &o, &src, &m, &err), 0);
	/* An int8 model quantizes its own classifier (not the embedding's). */
	o.weight_dtype = KK_I8;
	assert_int_equal(km_model_new(be, km_file_config(f), &o, &src, &mq, &err), 0);
	km_file_free(f);
	ref_model *r2 = ref_load(path);
	assert_non_null(r2);
	unlink(path);
	km_kvcache *c = cache_for(m, 4, 1), *cq = cache_for(mq, 4, 1);
	int s = km_kvcache_seq_new(c), sq = km_kvcache_seq_new(cq);
	float lg[512], lq[512];
	double rl[512], worst = 0, amax = 0;
	for (int i = 0; i < 40; i++) {
		int32_t t = greedy[i];
		km_seq_input si = { s, &t, 1 }, sqi = { sq, &t, 1 };
		assert_int_equal(step(m, c, &si, 1, lg), 0);
		assert_int_equal(ref_step(r2, t, rl), 0);
		assert_true(max_err(lg, rl, V) < TOL_F32);
		for (int j = 0; j < V; j++)
			assert_true(fabs(rl[j] - 0.5 * ref_logits[(size_t) i * V + j]) < 1e-9);
		assert_int_equal(step(mq, cq, &sqi, 1, lq), 0);
		worst = fmax(worst, max_err(lq, rl, V));
		for (int j = 0; j < V; j++)
			amax = fmax(amax, fabs(rl[j]));
	}
	/* The shared table instead would double every logit (off by amax). */
	print_message("# unshared classifier, i8: max |logit err| %.3g, logits up to %.3g\n", worst,
		      amax);
	assert_true(worst < 0.35 * amax);
	ref_free(r2);
	km_kvcache_free(c);
	km_kvcache_free(cq);
	km_model_free(m);
	km_model_free(mq);
}

/* A random model with the shapes GPUs serve: head dim 64, 2:1 GQA, an
 * FFN width no Q4 group divides; both RoPE conventions (checked to matter:
 * the two give logits that differ by far more than the tolerance). */
static void test_random_head64(void **state)
{
	char path[] = "/tmp/test-model-rand-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(ref_write_random(path, 128, 344, 2, 2, 1, 300, 160, 42), 0);
	ref_model *ri = ref_load(path), *rh = ref_load(path);
	assert_true(ri && rh);
	ref_set_half_rope(rh, 1);
	double li[300], lh[300], apart = 0;
	unsigned rs = 7;
	for (int i = 0, t = 1; i < 50; i++) {
		assert_int_equal(ref_step(ri, t, li), 0);
		assert_int_equal(ref_step(rh, t, lh), 0);
		for (int j = 0; j < 300; j++)
			apart = fmax(apart, fabs(li[j] - lh[j]));
		rs = rs * 1664525u + 1013904223u;
		t = (int) ((rs >> 8) % 300u);
	}
	ref_free(ri);
	ref_free(rh);
	assert_true(apart > 100 * TOL_F32);
	const kk_rope_mode modes[] = { KK_ROPE_INTERLEAVED, KK_ROPE_HALF };
	for (int i = 0; i < 2; i++) {
		double worst;
		int mism;
		check_against_ref(be, path, KK_F32, modes[i], 150, 7, TOL_F32, &worst, &mism);
		print_message("# random dim 128, head_dim 64, GQA 2:1, %s RoPE: 150 steps, max "
			      "|logit err| %.3g, %d argmax mismatches (the two conventions "
			      "differ by %.3g)\n",
			      i ? "half" : "interleaved", worst, mism, apart);
		assert_int_equal(mism, 0);
	}
	/* Llama 3.1's scaling at theta 500000 (factor 8, low/high frequency
	 * factors 1/4, original context 64: of the 32 pairs, 0-2 keep their
	 * frequency, 3-5 blend, 6-31 are divided), the reference computing
	 * the scaled frequencies itself; checked to matter: the model run
	 * unscaled at the same theta is far off. */
	const ref_rope l3 = { .theta = 500000,
			      .kind = REF_ROPE_LLAMA3,
			      .factor = 8,
			      .low_freq_factor = 1,
			      .high_freq_factor = 4,
			      .original_max_pos = 64 };
	for (int i = 0; i < 2; i++) {
		double worst, plain;
		int mism;
		check_against_ref_rope(be, path, KK_F32, modes[i], &l3, 150, 7, TOL_F32, &worst,
				       &mism);
		assert_int_equal(mism, 0);
		ref_model *ru = ref_load(path), *rs8 = ref_load(path);
		assert_true(ru && rs8);
		ref_set_rope(ru, &(ref_rope){ .theta = 500000 });
		ref_set_rope(rs8, &l3);
		double lu[300], ls[300];
		plain = 0;
		for (int k = 0, t = 1; k < 150; k++) {
			assert_int_equal(ref_step(ru, t, lu), 0);
			assert_int_equal(ref_step(rs8, t, ls), 0);
			for (int j = 0; j < 300; j++)
				plain = fmax(plain, fabs(lu[j] - ls[j]));
			t = (t * 7919 + 13) % 300;
		}
		ref_free(ru);
		ref_free(rs8);
		print_message("# the same, Llama 3.1 RoPE scaling, %s: max |logit err| %.3g, %d "
			      "argmax mismatches (unscaled differs by %.3g)\n",
			      i ? "half" : "interleaved", worst, mism, plain);
		assert_true(plain > 100 * TOL_F32);
	}
	unlink(path);
}

/* ---- configuration and checkpoints ------------------------------------- */

/* km_memory_estimate on a hand-computed config (dim 16, hidden 32, 2
 * layers, kv dim 8, vocab 10, tied classifier): linear weights 4608,
 * their rows 256, embedding + norms 240 elements; and, with the fixture,
 * the weights km_model_new really holds in f32 and bf16. */
static void test_memory_estimate(void **state)
{
	km_config c = small_cfg();
	km_memory m;
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 8, .max_seqs = 2 };
	assert_int_equal(km_memory_estimate(&c, &o, 3, &m), 0);
	assert_int_equal(m.weights, 4608 * 4 + 240 * 4);
	assert_int_equal(m.kv, 3 * 2048); /* K and V, 2 layers, 16 tokens, 8 floats */
	assert_int_equal(m.buffers, 8 * (4 * 16 + 2 * 8 + 3 * 32) * 4 + 2 * 10 * 4);
	assert_int_equal(km_kv_block_bytes(&c, KK_F32), 2048);
	o.weight_dtype = KK_BF16;
	assert_int_equal(km_memory_estimate(&c, &o, 3, &m), 0);
	assert_int_equal(m.weights, (4608 + 240) * 2);
	assert_int_equal(m.kv, 3 * 1024);
	o.weight_dtype = KK_I8; /* a f32 scale per row; activations f32 */
	assert_int_equal(km_memory_estimate(&c, &o, 0, &m), 0);
	assert_int_equal(m.weights, 4608 + 256 * 4 + 240 * 4);
	assert_int_equal(m.kv, 0);
	o.weight_dtype = KK_Q4; /* 4 bits, a f32 scale per 32 */
	assert_int_equal(km_memory_estimate(&c, &o, 1, &m), 0);
	assert_int_equal(m.weights, 4608 / 2 + 4608 / 32 * 4 + 240 * 4);
	assert_int_equal(m.kv, 2048);
	assert_int_equal(km_memory_estimate(NULL, &o, 1, &m), -EINVAL);
	assert_int_equal(km_memory_estimate(&c, &o, -1, &m), -EINVAL);

	NEED_FIXTURE();
	const kk_dtype dts[] = { KK_F32, KK_BF16 };
	for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++) {
		km_model *mod = load(dts[i], 16, 1);
		o = (km_model_opts){ .weight_dtype = dts[i], .max_tokens = 16, .max_seqs = 1 };
		assert_int_equal(km_memory_estimate(km_model_config(mod), &o, 0, &m), 0);
		print_message("# %s: weights estimated %llu bytes, held %zu\n",
			      kk_dtype_name(dts[i]), (unsigned long long) m.weights,
			      km_model_weight_bytes(mod));
		assert_int_equal(m.weights, km_model_weight_bytes(mod));
		km_model_free(mod);
	}
}

static void test_config_errors(void **state)
{
	kiln_error err;
	km_config c = small_cfg();
	assert_int_equal(km_config_validate(&c, &err), 0);
	c.n_kv_heads = 3;
	assert_int_equal(km_config_validate(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "model config: n_kv_heads = 3 must divide n_heads = 2");
	c = small_cfg();
	c.head_dim = 4;
	assert_int_equal(km_config_validate(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "model config: head_dim = 4, must be dim / n_heads = 8");
	c = small_cfg();
	c.rope_theta = 0;
	assert_int_equal(km_config_validate(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "model config: rope_theta = 0, must be in (1, 1e12)");
	c = small_cfg();
	c.dim = KM_DIM_MAX;
	c.head_dim = KM_DIM_MAX / 2;
	assert_int_equal(km_config_validate(&c, &err), -EINVAL);
	assert_string_equal(err.msg, "model config: head_dim = 32768, must be even and at most "
				     "256 (RoPE, kk)");
}

/* Writes the fixture with its header changed (hdr_idx >= 0) and its size
 * cut or grown by `delta` bytes. */
static char *write_variant(const char *name, int hdr_idx, int32_t val, long delta)
{
	FILE *in = fopen(fixture, "rb");
	assert_non_null(in);
	fseek(in, 0, SEEK_END);
	long n = ftell(in);
	rewind(in);
	char *buf = calloc(1, (size_t) (n + (delta > 0 ? delta : 0)));
	assert_int_equal(fread(buf, 1, (size_t) n, in), (size_t) n);
	fclose(in);
	if (hdr_idx >= 0)
		memcpy(buf + 4 * hdr_idx, &val, 4);
	static char path[256];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	FILE *out = fopen(path, "wb");
	assert_non_null(out);
	assert_int_equal(fwrite(buf, 1, (size_t) (n + delta), out), (size_t) (n + delta));
	fclose(out);
	free(buf);
	return path;
}

/* A llama2.c file has no magic: kmf recognises one only by the size its
 * header implies, so a damaged one is "not a model file" with its size. */
static void expect_refused(const char *path, long size)
{
	kiln_error err = {};
	km_file *f = NULL;
	assert_int_equal(km_file_open(path, &f, &err), -EOPNOTSUPP);
	assert_null(f);
	char want[512];
	snprintf(want, sizeof(want),
		 "%s: byte 0: not a model file kiln reads: no GGUF magic, no safetensors header "
		 "(8-byte "
		 "length then '{'), and the size (%ld bytes) is not the one a llama2.c header "
		 "implies; check the path or re-export the model as safetensors or GGUF",
		 path, size);
	assert_string_equal(err.msg, want);
}

static void test_bad_checkpoints(void **state)
{
	NEED_FIXTURE();
	assert_non_null(mkdtemp(tmpdir));
	expect_refused(write_variant("trunc.bin", -1, 0, -1000), 1055540);
	expect_refused(write_variant("long.bin", -1, 0, 4), 1056544);
	expect_refused(write_variant("tiny.bin", -1, 0, -1056530), 10);
	/* header fields that break the rules (n_heads 7 does not divide dim
	 * 64, vocab 0, n_kv_heads 3, n_layers -5) */
	expect_refused(write_variant("heads.bin", 3, 7, 0), 1056540);
	expect_refused(write_variant("vocab.bin", 5, 0, 0), 1056540);
	expect_refused(write_variant("kv.bin", 4, 3, 0), 1056540);
	expect_refused(write_variant("layers.bin", 2, -5, 0), 1056540);
	/* A negative vocab means an unshared classifier after the RoPE
	 * tables: the same file is then short of vocab * dim floats. */
	expect_refused(write_variant("unshared.bin", 5, -512, 0), 1056540);
	kiln_error err;
	km_file *f = NULL;
	snprintf(err.msg, sizeof(err.msg), "x");
	assert_int_equal(km_file_open("/nonexistent/m.bin", &f, &err), -ENOENT);
	assert_string_equal(err.msg, "/nonexistent/m.bin: cannot open: No such file or directory");
	/* A good file: a tensor by the wrong count or name is refused. */
	assert_int_equal(km_file_open(fixture, &f, &err), 0);
	km_weight_source src = km_file_source(f);
	float x[64];
	assert_int_equal(src.read(src.userdata, "norm.weight", x, 63, &err), -EINVAL);
	assert_int_equal(src.read(src.userdata, "output.weight", x, 64, &err), -ENOENT);
	assert_int_equal(src.read(src.userdata, "layers.5.ffn_norm.weight", x, 64, &err), -ENOENT);
	assert_int_equal(src.read(src.userdata, "layers.4.ffn_norm.weight", x, 64, &err), 0);
	km_file_free(f);
	/* Model options. */
	assert_int_equal(km_file_open(fixture, &f, &err), 0);
	km_model_opts o = { .weight_dtype = KK_Q4, .q4_group = 48, .max_tokens = 4, .max_seqs = 1 };
	km_model *m = NULL;
	assert_int_equal(km_model_new(be, km_file_config(f), &o, &src, &m, &err), -EINVAL);
	assert_string_equal(err.msg, "model options: q4 group 48, must be 32, 64 or 128");
	o.q4_group = 128;
	assert_int_equal(km_model_new(be, km_file_config(f), &o, &src, &m, &err), -EINVAL);
	assert_string_equal(err.msg, "model options: q4 needs dim (64) to be a multiple of the "
				     "group (128); use i8 or a smaller group");
	km_file_free(f);
	const char *names[] = { "trunc.bin", "long.bin", "tiny.bin",   "heads.bin",
				"vocab.bin", "kv.bin",	 "layers.bin", "unshared.bin" };
	char p[300];
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", tmpdir, names[i]);
		unlink(p);
	}
	rmdir(tmpdir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_errors),
		cmocka_unit_test(test_memory_estimate),
		cmocka_unit_test(test_kvcache_basic),
		cmocka_unit_test(test_kvcache_random),
		cmocka_unit_test(test_bad_checkpoints),
		cmocka_unit_test(test_greedy_matches_reference),
		cmocka_unit_test(test_prefill_lengths),
		cmocka_unit_test(test_continuous_batching),
		cmocka_unit_test(test_prefix_fork),
		cmocka_unit_test(test_chunked_prefill),
		cmocka_unit_test(test_forward_enospc),
		cmocka_unit_test(test_sampling),
		cmocka_unit_test(test_unsupported_head_dim),
		cmocka_unit_test(test_random_head64),
		cmocka_unit_test(test_unshared_classifier),
		cmocka_unit_test(test_quantized_exact),
		cmocka_unit_test(test_dtypes),
	};
	return cmocka_run_group_tests_name("model", tests, group_setup, group_teardown);
}
