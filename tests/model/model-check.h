/* model-check.h — greedy decoding on a kk backend checked against the
 * float64 reference, shared by the cpu suite (test-model.c) and the cuda
 * one (test-model-cuda.c).  Include after cmocka.h, kmodel.h and ref.h. */
#pragma once

#include <math.h>
#include <stdlib.h>

/* Loads path on be with weight dtype dt and RoPE mode `mode` (overriding
 * the llama2.c convention, for HF-style checks) and, rope not NULL, its
 * theta and scaling (the model's divisors from the reference's
 * frequencies), feeds `steps` tokens from
 * BOS one at a time, and compares each step's logits with the reference's
 * (max |diff| <= tol, the worst in *worst) and argmax (*mismatch counts
 * differences).  The tokens fed are the reference's greedy choices (seed
 * 0) or pseudo-random ids from seed: a random model decoding greedily
 * repeats one token, and with identical V rows attention (and RoPE) has no
 * effect.  Fails the test on any error. */
static void check_against_ref_rope(kk_backend *be, const char *path, kk_dtype dt, kk_rope_mode mode,
				   const ref_rope *rope, int steps, unsigned seed, double tol,
				   double *worst, int *mismatch)
{
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(path, &f, &err) < 0)
		fail_msg("%s", err.msg);
	km_config cfg = *km_file_config(f);
	cfg.rope_mode = mode;
	if (rope) {
		/* the reference's scaled frequencies as the divisors of its
		 * plain ones: the model gets them as a config would */
		ref_rope plain = { .theta = rope->theta };
		cfg.rope_theta = (float) rope->theta;
		cfg.rope_scaled = rope->kind != REF_ROPE_NONE;
		for (int i = 0; i < cfg.head_dim / 2; i++)
			cfg.rope_freq_div[i] = (float) (ref_rope_freq(&plain, i, cfg.head_dim) /
							ref_rope_freq(rope, i, cfg.head_dim));
	}
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = dt, .max_tokens = 8, .max_seqs = 1 };
	km_model *m = NULL;
	if (km_model_new(be, &cfg, &o, &src, &m, &err) < 0)
		fail_msg("km_model_new: %s", err.msg);
	km_file_free(f);
	ref_model *r = ref_load(path);
	assert_non_null(r);
	ref_set_half_rope(r, mode == KK_ROPE_HALF);
	if (rope)
		ref_set_rope(r, rope);
	int V = cfg.vocab_size;
	km_kvcache *c = NULL;
	assert_int_equal(km_kvcache_new(be, &cfg, km_model_act_dtype(m),
					(steps + KK_KV_BLOCK_SIZE) / KK_KV_BLOCK_SIZE, 1, &c),
			 0);
	int s = km_kvcache_seq_new(c);
	float *lg = malloc(sizeof(float) * (size_t) V);
	double *rl = malloc(sizeof(double) * (size_t) V);
	assert_true(lg && rl);
	int32_t tok = 1;
	const int follow = seed == 0;
	*worst = 0;
	*mismatch = 0;
	for (int i = 0; i < steps; i++) {
		km_seq_input in = { s, &tok, 1 };
		if (km_forward(m, c, &in, 1, lg, &err) < 0)
			fail_msg("step %d: %s", i, err.msg);
		assert_int_equal(ref_step(r, tok, rl), 0);
		int best = 0, rbest = ref_argmax(rl, V);
		for (int j = 0; j < V; j++) {
			*worst = fmax(*worst, fabs(lg[j] - rl[j]));
			if (lg[j] > lg[best])
				best = j;
		}
		if (*worst > tol)
			fail_msg("step %d: logits differ from the reference by %g (> %g)", i,
				 *worst, tol);
		*mismatch += best != rbest;
		seed = seed * 1664525u + 1013904223u;
		tok = follow ? rbest : (int32_t) ((seed >> 8) % (unsigned) V);
	}
	free(lg);
	free(rl);
	ref_free(r);
	km_kvcache_free(c);
	km_model_free(m);
}

static void check_against_ref(kk_backend *be, const char *path, kk_dtype dt, kk_rope_mode mode,
			      int steps, unsigned seed, double tol, double *worst, int *mismatch)
{
	check_against_ref_rope(be, path, dt, mode, NULL, steps, seed, tol, worst, mismatch);
}
