/* tests/train/test-train.c — the kmt_ training model suite (cpu backend).
 *
 * Checked against the independent float64 reference of ref-train.c:
 *  - gradient check: every parameter tensor's gradient (kmt_forward_backward,
 *    f32) against central finite differences of the float64 loss, on a tiny
 *    random GQA config with ignored targets, for both RoPE modes and shared
 *    and separate classifiers;
 *  - the loss on the model fixture (tiny260K) for a fixed batch;
 *  - AdamW (clipping, weight decay off for norms, warmup + cosine) against
 *    a float64 AdamW over several steps;
 *  - overfitting one fixed batch;
 *  - data parallel over 2 and 3 forked ranks (cpu socket collectives): the
 *    weights equal one process training on the concatenated batch, and the
 *    ranks' weights are bit-identical;
 *  - bad batches refused with clear errors; the schedule's values. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kk.h"
#include "kmodel.h"
#include "kmtrain.h"
#include "ref-train.h"
#include "../lib/fixture.h"
#include "../lib/model-test.h"

static kk_backend *be;

static uint64_t rng_state;
static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}
static double unif(void)
{
	return (double) (rnd() >> 11) * 0x1.0p-53;
}

/* The tiny config of the gradient check: GQA (4 heads, 2 kv heads,
 * head_dim 4 ... the brief's dim 16, head_dim 8: 2 heads, 1 kv head). */
static km_config tiny_config(kk_rope_mode mode, bool shared)
{
	return kiln_test_config(16, 24, 2, 2, 1, 37, 32, mode, shared);
}

static rt_config rt_of(const km_config *c)
{
	return (rt_config){ .dim = c->dim,
			    .hidden = c->hidden_dim,
			    .layers = c->n_layers,
			    .heads = c->n_heads,
			    .kv_heads = c->n_kv_heads,
			    .vocab = c->vocab_size,
			    .eps = c->norm_eps,
			    .theta = c->rope_theta,
			    .half_rope = c->rope_mode == KK_ROPE_HALF,
			    .shared = c->shared_classifier };
}

/* A model with random weights large enough that every part is non-linear
 * (std 0.3) and norm gains 1 +- 0.3, so a wrong gain gradient shows. */
static kmt_model *random_model(const km_config *c, int batch, int T, uint64_t seed)
{
	kmt_opts o = { .batch = batch, .seq_len = T, .init_seed = seed, .init_std = 0.3f };
	kmt_model *m = NULL;
	kiln_error err = {};
	int r = kmt_model_new(be, c, &o, NULL, &m, &err);
	if (r < 0)
		print_message("kmt_model_new: %s\n", err.msg);
	assert_int_equal(r, 0);
	rng_state = seed * 7 + 1;
	for (size_t i = 0; i < kmt_tensor_count(m); i++) {
		const char *name = kmt_tensor_name(m, i);
		if (!strstr(name, "norm"))
			continue;
		size_t n = kmt_tensor_numel(m, i);
		float *h = malloc(n * sizeof(float));
		for (size_t j = 0; j < n; j++)
			h[j] = (float) (0.7 + 0.6 * unif());
		assert_int_equal(kmt_tensor_set(m, name, h, n), 0);
		free(h);
	}
	return m;
}

/* Copies the model's current parameters into the reference. */
static void to_ref(kmt_model *m, rt_model *ref)
{
	for (size_t i = 0; i < kmt_tensor_count(m); i++) {
		const char *name = kmt_tensor_name(m, i);
		size_t n = kmt_tensor_numel(m, i);
		rt_tensor *t = rt_find(ref, name);
		assert_non_null(t);
		assert_int_equal(t->n, n);
		float *h = malloc(n * sizeof(float));
		assert_int_equal(kmt_tensor_get(m, KMT_PARAM, name, h, n), 0);
		for (size_t j = 0; j < n; j++)
			t->w[j] = h[j];
		free(h);
	}
}

static void random_batch(int32_t *tok, int32_t *tgt, int n, int vocab)
{
	for (int i = 0; i < n; i++) {
		tok[i] = (int32_t) (rnd() % (uint64_t) vocab);
		tgt[i] = (int32_t) (rnd() % (uint64_t) vocab);
	}
}

/* ---- gradient check ---------------------------------------------------- */

/* Central differences in float64 with step H: truncation ~H^2 |f'''| and
 * rounding ~1e-16 / H, both far below the f32 error of the analytic side. */
#define FD_H 1e-5
/* Analytic (f32 forward and backward) against float64 differences:
 * |g - fd| <= FD_ATOL + FD_RTOL |fd|.  Measured worst on these configs:
 * ~2e-7 absolute with gradients of up to ~0.2; the bound leaves 25x. */
#define FD_ATOL 5e-6
#define FD_RTOL 1e-3
/* Elements checked per tensor: all of them for the first config, a random
 * FD_SAMPLE for the others (each config still checks every tensor). */
#define FD_SAMPLE 24

static void gradcheck(kk_rope_mode mode, bool shared, bool all)
{
	enum { B = 3, T = 9 };
	km_config c = tiny_config(mode, shared);
	kmt_model *m = random_model(&c, B, T, 11 + mode * 2 + shared);
	rt_config rc = rt_of(&c);
	rt_model *ref = rt_new(&rc);
	assert_non_null(ref);
	to_ref(m, ref);

	int32_t tok[B * T], tgt[B * T];
	random_batch(tok, tgt, B * T, c.vocab_size);
	/* Padding: the tail of the last sequence and one target in the
	 * middle of the first are ignored. */
	tgt[2 * T + 6] = tgt[2 * T + 7] = tgt[2 * T + 8] = KMT_IGNORE;
	tgt[4] = -5;
	kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = B };
	kmt_stats st;
	kiln_error err = {};
	assert_int_equal(kmt_forward_backward(m, &b, NULL, &st, &err), 0);
	int count;
	double l0 = rt_loss(ref, tok, tgt, B, T, &count);
	assert_int_equal(count, B * T - 4);
	assert_int_equal(st.n_targets, count);
	assert_true(fabs(st.loss - l0) < 1e-5 * fabs(l0));

	double worst = 0, worst_rel = 0;
	size_t checked = 0;
	for (size_t i = 0; i < kmt_tensor_count(m); i++) {
		const char *name = kmt_tensor_name(m, i);
		size_t n = kmt_tensor_numel(m, i);
		float *g = malloc(n * sizeof(float));
		assert_int_equal(kmt_tensor_get(m, KMT_GRAD, name, g, n), 0);
		rt_tensor *t = rt_find(ref, name);
		double gmax = 0;
		size_t k_n = all ? n : (n < FD_SAMPLE ? n : FD_SAMPLE);
		for (size_t k = 0; k < k_n; k++) {
			size_t j = all || n <= FD_SAMPLE ? k : (size_t) (rnd() % n);
			double w0 = t->w[j];
			t->w[j] = w0 + FD_H;
			double lp = rt_loss(ref, tok, tgt, B, T, NULL);
			t->w[j] = w0 - FD_H;
			double lm = rt_loss(ref, tok, tgt, B, T, NULL);
			t->w[j] = w0;
			double fd = (lp - lm) / (2 * FD_H), e = fabs(g[j] - fd);
			gmax = fmax(gmax, fabs(fd));
			if (e > FD_ATOL + FD_RTOL * fabs(fd))
				fail_msg("%s rope %d shared %d: d loss / d %s[%zu] = %.9g, finite "
					 "differences %.9g",
					 "gradcheck", mode, shared, name, j, (double) g[j], fd);
			worst = fmax(worst, e);
			worst_rel = fmax(worst_rel, e / (fabs(fd) + 1e-3));
			checked++;
		}
		/* A tensor whose gradient is all zero checks nothing. */
		assert_true(gmax > 1e-6);
		free(g);
	}
	print_message("# gradcheck rope %s %s classifier: %zu elements of %zu tensors, max |err| "
		      "%.2g (rel %.2g)\n",
		      mode == KK_ROPE_HALF ? "half" : "interleaved", shared ? "shared" : "separate",
		      checked, kmt_tensor_count(m), worst, worst_rel);
	rt_free(ref);
	kmt_model_free(m);
}

static void test_gradcheck_interleaved_separate(void **state)
{
	gradcheck(KK_ROPE_INTERLEAVED, false, true);
}
static void test_gradcheck_interleaved_shared(void **state)
{
	gradcheck(KK_ROPE_INTERLEAVED, true, false);
}
static void test_gradcheck_half_separate(void **state)
{
	gradcheck(KK_ROPE_HALF, false, false);
}
static void test_gradcheck_half_shared(void **state)
{
	gradcheck(KK_ROPE_HALF, true, true);
}

/* ---- kmt_config_parse: the shapes kiln-train --init takes -------------- */

static void expect_spec_error(const char *spec, const char *msg)
{
	km_config c = { .dim = -7 };
	kiln_error err = {};
	assert_int_equal(kmt_config_parse(spec, &c, &err), -EINVAL);
	if (!strstr(err.msg, msg))
		fail_msg("'%s': got '%s', want '%s'", spec, err.msg, msg);
	assert_int_equal(c.dim, -7); /* untouched on failure */
}

static void test_config_parse(void **state)
{
	km_config c;
	kiln_error err = {};
	assert_int_equal(kmt_config_parse("dim=64,hidden=172,layers=5,heads=8,kv_heads=4,vocab=512,"
					  "seq=512",
					  &c, &err),
			 0);
	assert_int_equal(c.dim, 64);
	assert_int_equal(c.hidden_dim, 172);
	assert_int_equal(c.n_layers, 5);
	assert_int_equal(c.n_heads, 8);
	assert_int_equal(c.n_kv_heads, 4);
	assert_int_equal(c.head_dim, 8);
	assert_int_equal(c.vocab_size, 512);
	assert_int_equal(c.max_seq_len, 512);
	assert_true(c.shared_classifier);
	assert_int_equal(c.rope_mode, KK_ROPE_INTERLEAVED);
	assert_true(c.norm_eps == 1e-5f && c.rope_theta == 10000.0f);
	/* kv_heads defaults to heads; the optional keys, in any order */
	assert_int_equal(kmt_config_parse("seq=64,vocab=100,heads=4,layers=2,hidden=48,dim=32,"
					  "shared=0,rope_theta=500000,norm_eps=1e-6",
					  &c, &err),
			 0);
	assert_int_equal(c.n_kv_heads, 4);
	assert_false(c.shared_classifier);
	assert_true(c.rope_theta == 500000.0f && c.norm_eps == 1e-6f);
	expect_spec_error("", "model spec is empty");
	expect_spec_error("dim=64,hidden=172,layers=5,heads=8,vocab=512,seq=512,dropout=0.1",
			  "unknown key 'dropout' at offset 53");
	expect_spec_error("dim=64,hidden=172,layers=5,heads=8,vocab=512", "'seq' is missing");
	expect_spec_error("dim=64,dim=64,hidden=172,layers=5,heads=8,vocab=512,seq=512",
			  "'dim' given twice");
	expect_spec_error("dim=64,hidden=1x,layers=5,heads=8,vocab=512,seq=512",
			  "hidden '1x': must be 1..");
	expect_spec_error("dim=64,hidden=172,layers=5,heads=8,vocab=512,seq=512,shared=2",
			  "shared '2': must be 0 or 1");
	expect_spec_error("dim=64,hidden=172,layers,heads=8,vocab=512,seq=512",
			  "'layers' at offset 18 is not KEY=VALUE");
	expect_spec_error("dim=60,hidden=172,layers=5,heads=8,vocab=512,seq=512",
			  "dim 60 is not a multiple of heads 8");
	/* km_config_validate's own rules reach the caller too */
	expect_spec_error("dim=64,hidden=172,layers=5,heads=8,kv_heads=3,vocab=512,seq=512",
			  "n_kv_heads");
}

/* ---- loss on the model fixture (tiny260K) ------------------------------------------------ */

/* The f32 loss against float64 on the fixture: measured ~1e-6 relative. */
#define LOSS_RTOL 2e-5

static void test_loss_fixture(void **state)
{
	const char *path = kiln_test_model_fixture();
	KILN_NEED_FIXTURE(path);
	enum { B = 2, T = 40 };
	km_file *f = NULL;
	kiln_error err = {};
	assert_int_equal(km_file_open(path, &f, &err), 0);
	const km_config *c = km_file_config(f);
	km_weight_source src = km_file_source(f);
	kmt_opts o = { .batch = B, .seq_len = T };
	kmt_model *m = NULL;
	assert_int_equal(kmt_model_new(be, c, &o, &src, &m, &err), 0);
	rt_config rc = rt_of(c);
	rt_model *ref = rt_new(&rc);
	/* The reference reads the file through the source itself. */
	for (int i = 0; i < ref->n_t; i++)
		if (!rc.shared || strcmp(ref->t[i].name, "output.weight")) {
			float *h = malloc(ref->t[i].n * sizeof(float));
			assert_int_equal(
				src.read(src.userdata, ref->t[i].name, h, ref->t[i].n, &err), 0);
			for (size_t j = 0; j < ref->t[i].n; j++)
				ref->t[i].w[j] = h[j];
			free(h);
		}
	int32_t tok[B * T], tgt[B * T];
	rng_state = 99;
	random_batch(tok, tgt, B * T, c->vocab_size);
	/* Text-like: the targets are the next tokens, and BOS starts each. */
	for (int s = 0; s < B; s++) {
		tok[s * T] = 1;
		for (int t = 0; t + 1 < T; t++)
			tgt[s * T + t] = tok[s * T + t + 1];
	}
	tgt[B * T - 1] = KMT_IGNORE;
	kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = B };
	kmt_stats st;
	assert_int_equal(kmt_forward(m, &b, &st, &err), 0);
	int count;
	double want = rt_loss(ref, tok, tgt, B, T, &count);
	print_message("# fixture loss %.9f, float64 reference %.9f (%d targets)\n", st.loss, want,
		      count);
	assert_int_equal(st.n_targets, count);
	assert_true(fabs(st.loss - want) <= LOSS_RTOL * want);
	/* The same loss after forward + backward (which must not change the
	 * forward). */
	assert_int_equal(kmt_forward_backward(m, &b, NULL, &st, &err), 0);
	assert_true(fabs(st.loss - want) <= LOSS_RTOL * want);
	rt_free(ref);
	kmt_model_free(m);
	km_file_free(f);
}

/* ---- AdamW ---------------------------------------------------------------- */

/* f32 AdamW against float64 over ADAM_STEPS steps, both fed the same f32
 * gradients: the update is lr * m/(sqrt(v)+eps) per step, so the f32
 * rounding of the weights and moments stays ~1e-7 relative per step. */
#define ADAM_STEPS 6
#define ADAM_TOL   2e-6

static void adamw_reference(float clip)
{
	enum { B = 2, T = 8 };
	km_config c = tiny_config(KK_ROPE_INTERLEAVED, false);
	kmt_model *m = random_model(&c, B, T, 5);
	const kmt_optim o = KILN_TEST_OPTIM(3e-2f, 3e-3f, 2, 5, clip);
	size_t n = kmt_param_count(m), nt = kmt_tensor_count(m);
	double *w = calloc(n, sizeof(double)), *mm = calloc(n, sizeof(double)),
	       *vv = calloc(n, sizeof(double));
	float *g = malloc(n * sizeof(float)), *p = malloc(n * sizeof(float));
	int *decay = calloc(n, sizeof(int));
	size_t off = 0;
	for (size_t i = 0; i < nt; i++) {
		size_t k = kmt_tensor_numel(m, i);
		assert_int_equal(kmt_tensor_get(m, KMT_PARAM, kmt_tensor_name(m, i), p + off, k),
				 0);
		for (size_t j = 0; j < k; j++) {
			w[off + j] = p[off + j];
			decay[off + j] = !strstr(kmt_tensor_name(m, i), "norm");
		}
		off += k;
	}
	assert_int_equal(off, n);
	int32_t tok[B * T], tgt[B * T];
	kiln_error err = {};
	int clipped = 0;
	for (int s = 1; s <= ADAM_STEPS; s++) {
		random_batch(tok, tgt, B * T, c.vocab_size);
		kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = B };
		kmt_stats st;
		assert_int_equal(kmt_forward_backward(m, &b, NULL, &st, &err), 0);
		off = 0;
		for (size_t i = 0; i < nt; i++) {
			size_t k = kmt_tensor_numel(m, i);
			assert_int_equal(
				kmt_tensor_get(m, KMT_GRAD, kmt_tensor_name(m, i), g + off, k), 0);
			off += k;
		}
		assert_int_equal(kmt_optimizer_step(m, &o, &st, &err), 0);
		/* The reference: norm, clip, schedule, AdamW, in double. */
		double norm = 0;
		for (size_t j = 0; j < n; j++)
			norm += (double) g[j] * g[j];
		norm = sqrt(norm);
		assert_true(fabs(st.grad_norm - norm) <= 1e-5 * norm);
		double scale = o.clip > 0 && norm > o.clip ? o.clip / (norm + 1e-6) : 1.0;
		clipped += scale < 1.0;
		double lr;
		if (s <= o.warmup_steps)
			lr = o.lr_max * (double) s / o.warmup_steps;
		else if (s >= o.total_steps)
			lr = o.lr_min;
		else
			lr = o.lr_min +
			     0.5 * (o.lr_max - o.lr_min) *
				     (1 + cos(M_PI * (s - o.warmup_steps) /
					      (double) (o.total_steps - o.warmup_steps)));
		assert_true(fabs(st.lr - lr) <= 1e-6 * lr);
		assert_int_equal(st.step, s);
		double b1 = o.beta1, b2 = o.beta2;
		for (size_t j = 0; j < n; j++) {
			double gj = g[j] * scale;
			mm[j] = b1 * mm[j] + (1 - b1) * gj;
			vv[j] = b2 * vv[j] + (1 - b2) * gj * gj;
			double mh = mm[j] / (1 - pow(b1, s)), vh = vv[j] / (1 - pow(b2, s));
			w[j] -= lr *
				(mh / (sqrt(vh) + o.eps) + (decay[j] ? o.weight_decay : 0) * w[j]);
		}
		off = 0;
		double worst = 0;
		for (size_t i = 0; i < nt; i++) {
			size_t k = kmt_tensor_numel(m, i);
			assert_int_equal(
				kmt_tensor_get(m, KMT_PARAM, kmt_tensor_name(m, i), p + off, k), 0);
			off += k;
		}
		for (size_t j = 0; j < n; j++)
			worst = fmax(worst, fabs(p[j] - w[j]) / (fabs(w[j]) + 1e-2));
		if (worst > ADAM_TOL)
			fail_msg("step %d: weights differ from float64 AdamW by %.3g", s, worst);
		/* Continue from the f32 weights so only one step's error counts. */
		for (size_t j = 0; j < n; j++)
			w[j] = p[j];
	}
	/* With a clip below the gradient norms every step clips; without one
	 * none does. */
	print_message("# adamw (clip %g): %d of %d steps clipped\n", (double) clip, clipped,
		      ADAM_STEPS);
	assert_int_equal(clipped, clip > 0 ? ADAM_STEPS : 0);
	free(w);
	free(mm);
	free(vv);
	free(g);
	free(p);
	free(decay);
	kmt_model_free(m);
}

static void test_adamw_reference(void **state)
{
	adamw_reference(0.5f);
}

static void test_adamw_reference_noclip(void **state)
{
	adamw_reference(0.0f);
}

static void test_lr_schedule(void **state)
{
	kmt_optim o = { .lr_max = 1.0f, .lr_min = 0.1f, .warmup_steps = 10, .total_steps = 110 };
	assert_float_equal(kmt_lr(&o, 1), 0.1f, 1e-7);
	assert_float_equal(kmt_lr(&o, 5), 0.5f, 1e-7);
	assert_float_equal(kmt_lr(&o, 10), 1.0f, 1e-7);
	assert_float_equal(kmt_lr(&o, 60), 0.55f, 1e-6); /* half way: the mean */
	assert_float_equal(kmt_lr(&o, 110), 0.1f, 1e-7);
	assert_float_equal(kmt_lr(&o, 1000), 0.1f, 1e-7);
	assert_true(kmt_lr(&o, 30) > kmt_lr(&o, 31));
	o.total_steps = 0; /* constant after warmup */
	assert_float_equal(kmt_lr(&o, 500), 1.0f, 1e-7);
	o.warmup_steps = 0;
	assert_float_equal(kmt_lr(&o, 1), 1.0f, 1e-7);
}

/* ---- overfitting --------------------------------------------------------- */

#define OVERFIT_STEPS 150
#define OVERFIT_LOSS  0.05

static void test_overfit(void **state)
{
	enum { B = 2, T = 16 };
	km_config c = tiny_config(KK_ROPE_INTERLEAVED, true);
	c.dim = 32;
	c.head_dim = 16;
	c.hidden_dim = 64;
	kmt_opts oo = { .batch = B, .seq_len = T, .init_seed = 3 };
	kmt_model *m = NULL;
	kiln_error err = {};
	assert_int_equal(kmt_model_new(be, &c, &oo, NULL, &m, &err), 0);
	const kmt_optim o = { .lr_max = 1e-2f,
			      .lr_min = 1e-3f,
			      .warmup_steps = 10,
			      .total_steps = OVERFIT_STEPS,
			      .beta1 = 0.9f,
			      .beta2 = 0.99f,
			      .eps = 1e-8f,
			      .clip = 1.0f };
	int32_t tok[B * T], tgt[B * T];
	rng_state = 1234;
	random_batch(tok, tgt, B * T, c.vocab_size);
	kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = B };
	kmt_stats st;
	double first = 0;
	for (int s = 0; s < OVERFIT_STEPS; s++) {
		assert_int_equal(kmt_step(m, &b, NULL, &o, &st, &err), 0);
		if (s == 0)
			first = st.loss;
	}
	assert_int_equal(kmt_forward(m, &b, &st, &err), 0);
	print_message("# overfit: loss %.4f -> %.4f in %d steps\n", first, st.loss, OVERFIT_STEPS);
	assert_true(first > 3.0); /* ~ln 37 at the start */
	assert_true(st.loss < OVERFIT_LOSS);
	kmt_model_free(m);
}

/* ---- data parallel ------------------------------------------------------- */

#define DP_STEPS 3
/* World ranks summing f32 gradients in another order than one process,
 * then AdamW, whose m / sqrt(v) turns a rounding difference in a near-zero
 * gradient into a difference of up to ~lr in the update: measured 7e-6
 * (|w| + 0.01)-relative after DP_STEPS steps; an unscaled or per-rank-mean
 * gradient is off by > 1e-2. */
#define DP_TOL 1e-4

static const kmt_optim dp_optim = KILN_TEST_OPTIM(1e-2f, 0, 1, 10, 1.0f);

/* The global batch of step s: world * B sequences, some targets ignored
 * (more on some ranks than others, so per-rank means would be wrong). */
static void dp_batch(int s, int nseq, int T, int vocab, int32_t *tok, int32_t *tgt)
{
	rng_state = 1000 + (uint64_t) s;
	random_batch(tok, tgt, nseq * T, vocab);
	for (int i = 0; i < 5 + s; i++)
		tgt[(nseq - 1) * T + i] = KMT_IGNORE;
}

static int dp_rank(const char *id, int rank, int world, const char *out)
{
	enum { B = 2, T = 8 };
	kk_backend *b = NULL;
	kk_comm *comm = NULL;
	kmt_model *m = NULL;
	kiln_error err = {};
	km_config c = tiny_config(KK_ROPE_HALF, false);
	/* Each rank initializes differently; kmt_sync_from makes them all
	 * rank 0's (seed 77, what the single process uses). */
	kmt_opts o = {
		.batch = B, .seq_len = T, .init_seed = 77 + (uint64_t) rank * 1000, .init_std = 0.3f
	};
	int32_t tok[8 * B * T], tgt[8 * B * T];
	if (kk_backend_open("cpu", &b) < 0 ||
	    kk_comm_init(b, rank, world, id, KK_COMM_ID_BYTES, &comm) < 0 ||
	    kmt_model_new(b, &c, &o, NULL, &m, &err) < 0 || kmt_sync_from(m, comm, 0, &err) < 0)
		return 2;
	for (int s = 0; s < DP_STEPS; s++) {
		dp_batch(s, world * B, T, c.vocab_size, tok, tgt);
		kmt_batch bt = { .tokens = tok + rank * B * T,
				 .targets = tgt + rank * B * T,
				 .n_seqs = B };
		if (kmt_step(m, &bt, comm, &dp_optim, NULL, &err) < 0) {
			fprintf(stderr, "rank %d: %s\n", rank, err.msg);
			return 3;
		}
	}
	size_t n = kmt_param_count(m), off = 0;
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; i < kmt_tensor_count(m); i++) {
		size_t k = kmt_tensor_numel(m, i);
		kmt_tensor_get(m, KMT_PARAM, kmt_tensor_name(m, i), p + off, k);
		off += k;
	}
	FILE *f = fopen(out, "wb");
	if (!f || fwrite(p, sizeof(float), n, f) != n || fclose(f) != 0)
		return 4;
	free(p);
	kmt_model_free(m);
	kk_comm_free(comm);
	kk_backend_free(b);
	return 0;
}

static void dp_world(int world)
{
	enum { B = 2, T = 8 };
	char id[KK_COMM_ID_BYTES], path[8][64];
	pid_t pids[8];
	setenv("KILN_COMM_ADDR", "127.0.0.1", 1);
	assert_int_equal(kk_comm_get_id(be, id, sizeof(id)), 0);
	for (int r = 0; r < world; r++) {
		snprintf(path[r], sizeof(path[r]), "/tmp/kmt-dp-%d-%d-%d", (int) getpid(), world,
			 r);
		pids[r] = fork();
		assert_true(pids[r] >= 0);
		if (pids[r] == 0) {
			alarm(60);
			_exit(dp_rank(id, r, world, path[r]));
		}
	}
	int failed = 0;
	for (int r = 0; r < world; r++) {
		int status;
		assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
		failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
	}
	assert_int_equal(failed, 0);

	/* One process on the concatenated batch. */
	km_config c = tiny_config(KK_ROPE_HALF, false);
	kmt_opts o = { .batch = world * B, .seq_len = T, .init_seed = 77, .init_std = 0.3f };
	kmt_model *m = NULL;
	kiln_error err = {};
	assert_int_equal(kmt_model_new(be, &c, &o, NULL, &m, &err), 0);
	int32_t tok[8 * B * T], tgt[8 * B * T];
	for (int s = 0; s < DP_STEPS; s++) {
		dp_batch(s, world * B, T, c.vocab_size, tok, tgt);
		kmt_batch bt = { .tokens = tok, .targets = tgt, .n_seqs = world * B };
		assert_int_equal(kmt_step(m, &bt, NULL, &dp_optim, NULL, &err), 0);
	}
	size_t n = kmt_param_count(m), off = 0;
	float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)),
	      *r0 = malloc(n * sizeof(float)), *init = malloc(n * sizeof(float));
	for (size_t i = 0; i < kmt_tensor_count(m); i++) {
		size_t k = kmt_tensor_numel(m, i);
		assert_int_equal(kmt_tensor_get(m, KMT_PARAM, kmt_tensor_name(m, i), want + off, k),
				 0);
		off += k;
	}
	double worst = 0;
	for (int r = 0; r < world; r++) {
		FILE *f = fopen(path[r], "rb");
		assert_non_null(f);
		assert_int_equal(fread(r ? got : r0, sizeof(float), n, f), n);
		fclose(f);
		unlink(path[r]);
		if (r)
			assert_memory_equal(got, r0, n * sizeof(float));
	}
	for (size_t j = 0; j < n; j++)
		worst = fmax(worst, fabs(r0[j] - want[j]) / (fabs(want[j]) + 1e-2));
	print_message("# dp %d ranks: bit-identical; max rel diff from one process %.3g\n", world,
		      worst);
	assert_true(worst < DP_TOL);
	/* And training moved the weights (the comparison is not vacuous). */
	kmt_model *m0 = NULL;
	assert_int_equal(kmt_model_new(be, &c, &o, NULL, &m0, &err), 0);
	off = 0;
	for (size_t i = 0; i < kmt_tensor_count(m0); i++) {
		size_t k = kmt_tensor_numel(m0, i);
		kmt_tensor_get(m0, KMT_PARAM, kmt_tensor_name(m0, i), init + off, k);
		off += k;
	}
	double moved = 0;
	for (size_t j = 0; j < n; j++)
		moved = fmax(moved, fabs(init[j] - want[j]));
	assert_true(moved > 1e-3);
	free(want);
	free(got);
	free(r0);
	free(init);
	kmt_model_free(m);
	kmt_model_free(m0);
}

/* A rank that took a step alone: kmt_sync_from refuses on every rank. */
static int mismatch_rank(const char *id, int rank)
{
	enum { B = 1, T = 4 };
	kk_backend *b = NULL;
	kk_comm *comm = NULL;
	kmt_model *m = NULL;
	kiln_error err = {};
	km_config c = tiny_config(KK_ROPE_HALF, true);
	kmt_opts o = { .batch = B, .seq_len = T, .init_seed = 1 };
	if (kk_backend_open("cpu", &b) < 0 || kmt_model_new(b, &c, &o, NULL, &m, &err) < 0)
		return 2;
	if (rank == 1) {
		int32_t tok[B * T] = { 1, 2, 3, 4 }, tgt[B * T] = { 2, 3, 4, 5 };
		kmt_batch bt = { .tokens = tok, .targets = tgt, .n_seqs = B };
		if (kmt_step(m, &bt, NULL, &dp_optim, NULL, &err) < 0)
			return 3;
	}
	if (kk_comm_init(b, rank, 2, id, KK_COMM_ID_BYTES, &comm) < 0)
		return 4;
	int r = kmt_sync_from(m, comm, 0, &err);
	if (r != -EINVAL || !strstr(err.msg, "ranks are at different steps (0 to 1)")) {
		fprintf(stderr, "rank %d: %d %s\n", rank, r, err.msg);
		return 5;
	}
	kmt_model_free(m);
	kk_comm_free(comm);
	kk_backend_free(b);
	return 0;
}

static void test_dp_step_mismatch(void **state)
{
	char id[KK_COMM_ID_BYTES];
	pid_t pids[2];
	setenv("KILN_COMM_ADDR", "127.0.0.1", 1);
	assert_int_equal(kk_comm_get_id(be, id, sizeof(id)), 0);
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		assert_true(pids[r] >= 0);
		if (pids[r] == 0) {
			alarm(60);
			_exit(mismatch_rank(id, r));
		}
	}
	for (int r = 0; r < 2; r++) {
		int status;
		assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
}

static void test_dp_2(void **state)
{
	dp_world(2);
}
static void test_dp_3(void **state)
{
	dp_world(3);
}

/* Two micro-batches of 2 sequences accumulate to one batch of 4: the
 * same loss and, after two AdamW steps, the same weights (to the rounding
 * of another summation order). */
static void test_accumulation(void **state)
{
	enum { T = 8 };
	km_config c = tiny_config(KK_ROPE_INTERLEAVED, false);
	kmt_opts o4 = { .batch = 4, .seq_len = T, .init_seed = 9, .init_std = 0.3f },
		 o2 = { .batch = 2, .seq_len = T, .init_seed = 9, .init_std = 0.3f };
	kmt_model *big = NULL, *acc = NULL;
	kiln_error err = {};
	assert_int_equal(kmt_model_new(be, &c, &o4, NULL, &big, &err), 0);
	assert_int_equal(kmt_model_new(be, &c, &o2, NULL, &acc, &err), 0);
	int32_t tok[4 * T], tgt[4 * T];
	for (int s = 0; s < 2; s++) {
		rng_state = 500 + (uint64_t) s;
		random_batch(tok, tgt, 4 * T, c.vocab_size);
		/* Uneven ignored targets: a mean of the two halves' means
		 * would differ from the mean over all. */
		for (int i = 0; i < 6; i++)
			tgt[i] = KMT_IGNORE;
		kmt_batch whole = { .tokens = tok, .targets = tgt, .n_seqs = 4 };
		kmt_batch parts[2] = {
			{ .tokens = tok, .targets = tgt, .n_seqs = 2 },
			{ .tokens = tok + 2 * T, .targets = tgt + 2 * T, .n_seqs = 2 }
		};
		kmt_stats a, b;
		assert_int_equal(kmt_forward_backward(big, &whole, NULL, &a, &err), 0);
		assert_int_equal(kmt_forward_backward_accum(acc, parts, 2, NULL, &b, &err), 0);
		assert_int_equal(a.n_targets, b.n_targets);
		assert_true(fabs(a.loss - b.loss) < 1e-6 * a.loss);
		assert_int_equal(kmt_optimizer_step(big, &dp_optim, NULL, &err), 0);
		assert_int_equal(kmt_optimizer_step(acc, &dp_optim, NULL, &err), 0);
	}
	double worst = 0;
	for (size_t i = 0; i < kmt_tensor_count(big); i++) {
		size_t k = kmt_tensor_numel(big, i);
		float *x = malloc(k * sizeof(float)), *y = malloc(k * sizeof(float));
		assert_int_equal(kmt_tensor_get(big, KMT_PARAM, kmt_tensor_name(big, i), x, k), 0);
		assert_int_equal(kmt_tensor_get(acc, KMT_PARAM, kmt_tensor_name(big, i), y, k), 0);
		for (size_t j = 0; j < k; j++)
			worst = fmax(worst, fabs(x[j] - y[j]) / (fabs(x[j]) + 1e-2));
		free(x);
		free(y);
	}
	print_message("# accumulation: 2 x 2 sequences vs 4: max rel diff %.3g\n", worst);
	assert_true(worst < DP_TOL);
	/* A bad micro-batch anywhere fails before any work. */
	kmt_batch bad[2] = { { .tokens = tok, .targets = tgt, .n_seqs = 2 },
			     { .tokens = tok, .targets = tgt, .n_seqs = 3 } };
	assert_int_equal(kmt_forward_backward_accum(acc, bad, 2, NULL, NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "3 sequences, the model takes 1..2"));
	kmt_model_free(big);
	kmt_model_free(acc);
}

/* ---- bad input ------------------------------------------------------------- */

static void test_bad_batch(void **state)
{
	enum { B = 2, T = 4 };
	km_config c = tiny_config(KK_ROPE_INTERLEAVED, true);
	kmt_model *m = random_model(&c, B, T, 1);
	int32_t tok[B * T] = { 0 }, tgt[B * T] = { 0 };
	kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = B };
	kiln_error err = {};
	kmt_stats st = { .loss = 42 };
	tok[5] = 37;
	assert_int_equal(kmt_forward_backward(m, &b, NULL, &st, &err), -EINVAL);
	assert_string_equal(err.msg, "training batch: token 37 at sequence 1 position 1 is outside "
				     "the vocabulary (0..36)");
	assert_true(st.loss == 42); /* untouched */
	tok[5] = 0;
	tgt[2] = 40;
	assert_int_equal(kmt_forward(m, &b, &st, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "target 40 at sequence 0 position 2"));
	for (int i = 0; i < B * T; i++)
		tgt[i] = KMT_IGNORE;
	assert_int_equal(kmt_forward_backward(m, &b, NULL, &st, &err), -EINVAL);
	assert_string_equal(err.msg, "training batch: every target is ignored");
	b.n_seqs = 3;
	assert_int_equal(kmt_forward(m, &b, &st, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "3 sequences, the model takes 1..2"));
	kmt_optim bad = { .lr_max = 1e-3f, .beta1 = 1.0f, .beta2 = 0.9f, .eps = 1e-8f };
	assert_int_equal(kmt_optimizer_step(m, &bad, NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "betas in [0, 1)"));
	assert_int_equal(kmt_model_step(m), 0);
	kmt_model_free(m);

	kmt_opts o = { .batch = 1, .seq_len = 33 };
	assert_int_equal(kmt_model_new(be, &c, &o, NULL, &m, &err), -EINVAL);
	assert_string_equal(err.msg, "training options: seq_len 33, must be 1..max_seq_len (32)");
}

/* The trained weights serve inference: km_model_new through
 * kmt_weight_source gives the same next-token logits as the reference. */
static void test_inference_source(void **state)
{
	km_config c = tiny_config(KK_ROPE_HALF, false);
	kmt_model *m = random_model(&c, 1, 8, 21);
	km_weight_source src = kmt_weight_source(m);
	km_model_opts mo = { .weight_dtype = KK_F32, .max_tokens = 8, .max_seqs = 1 };
	km_model *im = NULL;
	km_kvcache *kv = NULL;
	kiln_error err = {};
	assert_int_equal(km_model_new(be, &c, &mo, &src, &im, &err), 0);
	assert_int_equal(km_kvcache_new(be, &c, KK_F32, 4, 1, &kv), 0);
	int seq = km_kvcache_seq_new(kv);
	int32_t tok[8] = { 1, 5, 9, 2, 30, 36, 0, 7 }, tgt[8];
	float logits[37];
	km_seq_input in = { .seq = seq, .tokens = tok, .n_tokens = 8 };
	assert_int_equal(km_forward(im, kv, &in, 1, logits, &err), 0);
	/* The training loss of target j at the last position is
	 * logsumexp(logits) - logits[j]; compare for every j. */
	double lse = 0, mx = -INFINITY;
	for (int j = 0; j < 37; j++)
		mx = fmax(mx, logits[j]);
	for (int j = 0; j < 37; j++)
		lse += exp(logits[j] - mx);
	lse = mx + log(lse);
	for (int j = 0; j < 37; j += 6) {
		for (int t = 0; t < 8; t++)
			tgt[t] = t == 7 ? j : KMT_IGNORE;
		kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = 1 };
		kmt_stats st;
		assert_int_equal(kmt_forward(m, &b, &st, &err), 0);
		assert_true(fabs(st.loss - (lse - logits[j])) < 1e-4);
	}
	km_kvcache_free(kv);
	km_model_free(im);
	kmt_model_free(m);
}

static int group_setup(void **state)
{
	return kk_backend_open("cpu", &be) < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	kk_backend_free(be);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gradcheck_interleaved_separate),
		cmocka_unit_test(test_gradcheck_interleaved_shared),
		cmocka_unit_test(test_gradcheck_half_separate),
		cmocka_unit_test(test_gradcheck_half_shared),
		cmocka_unit_test(test_config_parse),
		cmocka_unit_test(test_loss_fixture),
		cmocka_unit_test(test_adamw_reference),
		cmocka_unit_test(test_adamw_reference_noclip),
		cmocka_unit_test(test_lr_schedule),
		cmocka_unit_test(test_overfit),
		cmocka_unit_test(test_dp_2),
		cmocka_unit_test(test_dp_3),
		cmocka_unit_test(test_dp_step_mismatch),
		cmocka_unit_test(test_accumulation),
		cmocka_unit_test(test_bad_batch),
		cmocka_unit_test(test_inference_source),
	};
	return cmocka_run_group_tests_name("train", tests, group_setup, group_teardown);
}
