/* tests/lib/model-test.h — what the model, train and modelfile suites
 * share (cmocka): the km_config of a small test model, the AdamW settings
 * of the training tests, the argmax of a row of logits, a xorshift
 * generator, a skip for a missing backend, and an assertion that a call
 * succeeded that prints the kiln_error when it did not.  Header-only: the
 * kmtrain type needs no library.  One place, so
 * the suites do not each write their own. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kmodel.h"
#include "kmtrain.h"

/* A model of the given shape with llama2.c's norm epsilon and RoPE theta;
 * head_dim is dim / heads. */
static inline km_config kiln_test_config(int dim, int hidden, int layers, int heads, int kv_heads,
					 int vocab, int seq, kk_rope_mode mode, bool shared)
{
	return (km_config){ .dim = dim,
			    .hidden_dim = hidden,
			    .n_layers = layers,
			    .n_heads = heads,
			    .n_kv_heads = kv_heads,
			    .head_dim = dim / heads,
			    .vocab_size = vocab,
			    .max_seq_len = seq,
			    .norm_eps = 1e-5f,
			    .rope_theta = 10000.0f,
			    .rope_mode = mode,
			    .shared_classifier = shared };
}

/* AdamW as the training tests run it (torch-like betas, eps 1e-8, weight
 * decay 0.1); a constant expression, for static initializers too. */
#define KILN_TEST_OPTIM(lr, lr_min_, warmup, total, clip_) \
	((kmt_optim){ .lr_max = (lr),                      \
		      .lr_min = (lr_min_),                 \
		      .warmup_steps = (warmup),            \
		      .total_steps = (total),              \
		      .beta1 = 0.9f,                       \
		      .beta2 = 0.95f,                      \
		      .eps = 1e-8f,                        \
		      .weight_decay = 0.1f,                \
		      .clip = (clip_) })

/* xorshift64 (Marsaglia): the suites' reproducible test data. */
static inline uint64_t kiln_test_xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The first index of the largest of x[0..n). */
static inline int kiln_test_argmax(const float *x, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* Skips the running test with `reason` unless `have` (hardware: a GPU, a
 * backend; never a file the build makes, see fixture.h). */
#define KILN_SKIP_UNLESS(have, reason)                          \
	do {                                                    \
		if (!(have)) {                                  \
			print_message("# SKIP %s\n", (reason)); \
			skip();                                 \
		}                                               \
	} while (0)

/* Asserts r == 0, first printing e's line ("FILE: MSG") when it is not. */
#define KILN_ASSERT_OK(r, e)                                                               \
	do {                                                                               \
		int r_ = (r);                                                              \
		if (r_ < 0) {                                                              \
			char line_[800];                                                   \
			print_error("%s\n", kiln_error_format((e), line_, sizeof(line_))); \
		}                                                                          \
		assert_int_equal(r_, 0);                                                   \
	} while (0)
