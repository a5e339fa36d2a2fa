/* ref-train.h — an independent float64 reference of the Llama training
 * loss for the kmt_ tests: batched sequences, mean cross-entropy with
 * ignored targets, both RoPE modes, shared or separate classifier.
 *
 * Written from the architecture's math (RMSNorm, RoPE, causal GQA softmax
 * attention, SwiGLU), sharing no code with kernels/ (not even kk): every
 * value is a double, one token and one head at a time.  The tests use it as
 * the loss whose central finite differences the backward pass must match. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct rt_config {
	int dim, hidden, layers, heads, kv_heads, vocab;
	double eps, theta;
	int half_rope; /* pairs (i, i + hd/2) instead of (2i, 2i + 1) */
	int shared;    /* the classifier is the embedding */
} rt_config;

typedef struct rt_tensor {
	char name[64];
	double *w;
	size_t n;
} rt_tensor;

typedef struct rt_model {
	rt_config c;
	rt_tensor *t; /* every parameter tensor, by canonical name */
	int n_t;
	/* scratch */
	double *x, *xn, *q, *k, *v, *att, *tmp, *g, *u, *logits;
} rt_model;

/* Allocates zeroed tensors for c (names as kmodel.h); NULL on failure. */
rt_model *rt_new(const rt_config *c);
void rt_free(rt_model *m);
/* The tensor called name, or NULL. */
rt_tensor *rt_find(rt_model *m, const char *name);
/* Mean cross-entropy over the targets >= 0 of n_seqs sequences of T tokens
 * (tokens/targets [n_seqs * T]); also *count (NULL allowed). */
double rt_loss(rt_model *m, const int32_t *tokens, const int32_t *targets, int n_seqs, int T,
	       int *count);
