/* tests/gpu/test-model-cuda.c — the km_ model on the cuda backend.
 *
 * Every test is a skip, with the reason, where no cuda backend is usable
 * (a CUDA=0 build or no GPU).  On a GPU machine: a random model with head
 * dim 64 (2:1 GQA) decoded in f32 and bf16 against the float64 reference
 * in both RoPE conventions, and with Llama 3.1 RoPE scaling; continuous batching (sequences joining
 * and leaving) giving the tokens each gives alone; a prompt in chunks giving the logits and tokens
 * of the whole prompt; and the tiny260K fixture (head dim 8, which cuda attention lacks) refused at
 * load with the reason. NOT YET RUN ON A GPU: the tolerances below are first guesses (TF32 or
 * different summation orders in cuBLASLt may need them widened). */
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

#include "../lib/fixture.h"
#include "../lib/model-test.h"
#include "../model/ref.h"

#include "../model/model-check.h"

/* The backend under test (-DKM_TEST_BACKEND="cpu" runs the same checks
 * on the cpu backend, to check the test itself). */
#ifndef KM_TEST_BACKEND
#define KM_TEST_BACKEND "cuda"
#endif

static kk_backend *be;
static char skip_reason[160];
static char rand_path[] = "/tmp/test-model-cuda-XXXXXX";

#define NEED_CUDA() KILN_SKIP_UNLESS(be, skip_reason)

static void test_random_f32(void **state)
{
	NEED_CUDA();
	const kk_rope_mode modes[] = { KK_ROPE_INTERLEAVED, KK_ROPE_HALF };
	for (int i = 0; i < 2; i++) {
		double worst;
		int mism;
		check_against_ref(be, rand_path, KK_F32, modes[i], 150, 7, 5e-3, &worst, &mism);
		print_message("# " KM_TEST_BACKEND
			      " f32, %s RoPE: max |logit err| %.3g, %d argmax mismatches\n",
			      i ? "half" : "interleaved", worst, mism);
		assert_true(mism <= 2);
	}
}

/* Llama 3.1 RoPE scaling (the divisors on the device), as in test-model. */
static void test_random_scaled(void **state)
{
	NEED_CUDA();
	const ref_rope l3 = { .theta = 500000,
			      .kind = REF_ROPE_LLAMA3,
			      .factor = 8,
			      .low_freq_factor = 1,
			      .high_freq_factor = 4,
			      .original_max_pos = 64 };
	const kk_rope_mode modes[] = { KK_ROPE_INTERLEAVED, KK_ROPE_HALF };
	for (int i = 0; i < 2; i++) {
		double worst;
		int mism;
		check_against_ref_rope(be, rand_path, KK_F32, modes[i], &l3, 150, 7, 5e-3, &worst,
				       &mism);
		print_message("# " KM_TEST_BACKEND
			      " f32, %s RoPE, Llama 3.1 scaling: max |logit err| %.3g, %d argmax "
			      "mismatches\n",
			      i ? "half" : "interleaved", worst, mism);
		assert_true(mism <= 2);
	}
}

static void test_random_bf16(void **state)
{
	NEED_CUDA();
	double worst;
	int mism;
	check_against_ref(be, rand_path, KK_BF16, KK_ROPE_INTERLEAVED, 150, 7, 1.0, &worst, &mism);
	print_message("# " KM_TEST_BACKEND
		      " bf16: max |logit err| %.3g, %d/150 argmax mismatches\n",
		      worst, mism);
	assert_true(mism <= 30);
}

/* Four sequences with staggered joins and lengths, together and alone. */
static void test_batching(void **state)
{
	NEED_CUDA();
	kiln_error err = {};
	km_file *f = NULL;
	assert_int_equal(km_file_open(rand_path, &f, &err), 0);
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 64, .max_seqs = 4 };
	km_model *m = NULL;
	if (km_model_new(be, km_file_config(f), &o, &src, &m, &err) < 0)
		fail_msg("%s", err.msg);
	km_file_free(f);
	enum { N = 4, GEN = 20 };
	const int plen[N] = { 1, 16, 17, 9 }, join[N] = { 0, 0, 3, 8 }, gen[N] = { 20, 5, 12, 20 };
	int32_t prompt[N][17], alone[N][GEN], got[N][GEN];
	kk_sampling g = {};
	unsigned rs = 5;
	for (int i = 0; i < N; i++) {
		for (int t = 0; t < plen[i]; t++)
			prompt[i][t] = (int32_t) (((rs = rs * 1664525u + 1013904223u) >> 8) % 300u);
		km_kvcache *c = NULL;
		assert_int_equal(km_kvcache_new(be, km_model_config(m), KK_F32, 4, 1, &c), 0);
		km_seq_input in = { km_kvcache_seq_new(c), prompt[i], plen[i] };
		for (int k = 0; k < gen[i]; k++) {
			if (km_forward(m, c, &in, 1, NULL, &err) < 0)
				fail_msg("%s", err.msg);
			assert_int_equal(km_sample(m, 0, 1, &g, &alone[i][k]), 0);
			in.tokens = &alone[i][k];
			in.n_tokens = 1;
		}
		km_kvcache_free(c);
	}
	km_kvcache *c = NULL;
	assert_int_equal(km_kvcache_new(be, km_model_config(m), KK_F32, 8, N, &c), 0);
	int seq[N], done[N] = {}, finished = 0;
	for (int stp = 0; finished < N; stp++) {
		km_seq_input in[N];
		int who[N], n = 0;
		for (int i = 0; i < N; i++) {
			if (join[i] == stp) {
				seq[i] = km_kvcache_seq_new(c);
				in[n] = (km_seq_input){ seq[i], prompt[i], plen[i] };
				who[n++] = i;
			} else if (join[i] < stp && done[i] < gen[i]) {
				in[n] = (km_seq_input){ seq[i], &got[i][done[i] - 1], 1 };
				who[n++] = i;
			}
		}
		if (!n)
			continue;
		if (km_forward(m, c, in, n, NULL, &err) < 0)
			fail_msg("%s", err.msg);
		for (int j = 0; j < n; j++) {
			int i = who[j];
			assert_int_equal(km_sample(m, j, 1, &g, &got[i][done[i]]), 0);
			assert_int_equal(got[i][done[i]], alone[i][done[i]]);
			if (++done[i] == gen[i]) {
				assert_int_equal(km_kvcache_seq_free(c, seq[i]), 0);
				finished++;
			}
		}
	}
	assert_int_equal(km_kvcache_free_blocks(c), 8);
	km_kvcache_free(c);
	km_model_free(m);
}

/* Chunked prefill (kk_attention_paged on this backend): a 40-token prompt
 * fed as 7 + 16 + 17 tokens gives the logits of the whole prompt at once,
 * and the same greedy continuation. */
static void test_chunked_prefill(void **state)
{
	NEED_CUDA();
	kiln_error err = {};
	km_file *f = NULL;
	assert_int_equal(km_file_open(rand_path, &f, &err), 0);
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 64, .max_seqs = 2 };
	km_model *m = NULL;
	if (km_model_new(be, km_file_config(f), &o, &src, &m, &err) < 0)
		fail_msg("%s", err.msg);
	km_file_free(f);
	const int V = km_model_config(m)->vocab_size;
	enum { P = 40, GEN = 10 };
	int32_t prompt[P], whole[GEN], chunked[GEN];
	unsigned rs = 11;
	for (int t = 0; t < P; t++)
		prompt[t] = (int32_t) (((rs = rs * 1664525u + 1013904223u) >> 8) % 300u);
	float *lw = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V);
	assert_non_null(lw);
	assert_non_null(lc);
	kk_sampling g = {};
	km_kvcache *c = NULL;
	assert_int_equal(km_kvcache_new(be, km_model_config(m), KK_F32, 16, 2, &c), 0);
	int a = km_kvcache_seq_new(c), b = km_kvcache_seq_new(c);
	km_seq_input in = { a, prompt, P };
	if (km_forward(m, c, &in, 1, lw, &err) < 0)
		fail_msg("%s", err.msg);
	const int chunks[] = { 7, 16, 17 };
	int at = 0;
	for (int k = 0; k < 3; k++) {
		km_seq_input ck = { b, prompt + at, chunks[k] };
		if (km_forward(m, c, &ck, 1, lc, &err) < 0)
			fail_msg("chunk %d: %s", k, err.msg);
		at += chunks[k];
	}
	double worst = 0;
	for (int j = 0; j < V; j++)
		worst = fmax(worst, fabs((double) lw[j] - lc[j]));
	print_message("# " KM_TEST_BACKEND " chunked vs whole prefill: max |logit diff| %.3g\n",
		      worst);
	assert_true(worst < 5e-3);
	/* Greedy continuations, both sequences in one step. */
	km_seq_input two[2] = { { a, NULL, 1 }, { b, NULL, 1 } };
	int32_t ta = 0, tb;
	/* The last step's logits are b's; a's first token from lw on the host. */
	for (int j = 1; j < V; j++)
		if (lw[j] > lw[ta])
			ta = j;
	assert_int_equal(km_sample(m, 0, 1, &g, &tb), 0);
	for (int k = 0; k < GEN; k++) {
		whole[k] = ta;
		chunked[k] = tb;
		two[0].tokens = &whole[k];
		two[1].tokens = &chunked[k];
		if (km_forward(m, c, two, 2, NULL, &err) < 0)
			fail_msg("%s", err.msg);
		assert_int_equal(km_sample(m, 0, 1, &g, &ta), 0);
		assert_int_equal(km_sample(m, 1, 1, &g, &tb), 0);
	}
	for (int k = 0; k < GEN; k++)
		assert_int_equal(whole[k], chunked[k]);
	free(lw);
	free(lc);
	km_kvcache_free(c);
	km_model_free(m);
}

static void test_head_dim_8_refused(void **state)
{
	NEED_CUDA();
	const char *p = kiln_test_model_fixture();
	KILN_NEED_FIXTURE(p);
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(p, &f, &err) < 0)
		fail_msg("%s", err.msg);
	km_weight_source src = km_file_source(f);
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 4, .max_seqs = 1 };
	km_model *m = NULL;
	assert_int_equal(km_model_new(be, km_file_config(f), &o, &src, &m, &err), -EOPNOTSUPP);
	assert_null(m);
	assert_string_equal(err.msg, "attention: backend 'cuda' has no kernel for this model "
				     "(head_dim 8, dtype f32); kk attention takes head dims "
				     "1..128 on cpu, 64 and 128 on cuda: run it on a backend "
				     "that has it (KILN_BACKEND=cpu)");
	km_file_free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_f32),	cmocka_unit_test(test_random_scaled),
		cmocka_unit_test(test_random_bf16),	cmocka_unit_test(test_batching),
		cmocka_unit_test(test_chunked_prefill), cmocka_unit_test(test_head_dim_8_refused),
	};
	unsetenv("KILN_BACKEND"); /* this binary tests the cuda backend */
	int r = kk_backend_available(KM_TEST_BACKEND);
	if (r <= 0)
		snprintf(skip_reason, sizeof(skip_reason),
			 "backend " KM_TEST_BACKEND " not available (%s)",
			 r == 0 ? "not built in or no device" : "unknown");
	else if ((r = kk_backend_open(KM_TEST_BACKEND, &be)) < 0)
		snprintf(skip_reason, sizeof(skip_reason),
			 "backend " KM_TEST_BACKEND " failed to open: %s", strerror(-r));
	if (be) {
		int fd = mkstemp(rand_path);
		if (fd < 0 || close(fd) < 0 ||
		    ref_write_random(rand_path, 128, 344, 2, 2, 1, 300, 160, 42) < 0) {
			fprintf(stderr, "test-model-cuda: cannot write %s\n", rand_path);
			return 1;
		}
	}
	r = cmocka_run_group_tests_name("model-cuda", tests, NULL, NULL);
	if (be)
		unlink(rand_path);
	kk_backend_free(be);
	return r;
}
