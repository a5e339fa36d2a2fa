/* logits.c — the engine's host path: a row whose request wants more than
 * a token id (logprobs, penalties, logit_bias, min_tokens) is brought to
 * the host, processed in vLLM's order and sampled there by kk_sample_host
 * (libkk's own sampler, so it draws what the device would have drawn from
 * the same logits); logprobs are a float64 log-softmax of the raw row.
 *
 * It exists apart from the scheduler because it is arithmetic on one row,
 * testable alone (tests/inferd/test-engine.c calls the kiln_engine__
 * functions directly), and the fast path never enters it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"
#include "kiln/macro.h"

int kiln_engine__process_logits(float *x, int V, const kiln_engine_processing *p,
				const int32_t *tokens, int n_prompt, int n_total,
				const int32_t *stops, int n_stops, int *counts)
{
	for (int i = 0; i < p->n_logit_bias; i++)
		x[p->logit_bias[i].token] += p->logit_bias[i].bias;
	if (n_total - n_prompt < p->min_tokens)
		for (int i = 0; i < n_stops; i++)
			x[stops[i]] = -INFINITY;
	const bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
	if (!rep && p->frequency_penalty == 0 && p->presence_penalty == 0)
		return 0;
	/* Per distinct token of the context: 1 + its count in the output
	 * (counts is all zero outside this function, so the work is the
	 * context's length, not the vocabulary's). */
	for (int i = 0; i < n_total; i++) {
		int *c = &counts[tokens[i]];
		*c += (*c == 0) + (i >= n_prompt);
	}
	for (int i = 0; i < n_total; i++) {
		const int t = tokens[i], count = counts[t] - 1;
		if (count < 0)
			continue; /* done at its first occurrence */
		counts[t] = 0;
		if (rep)
			x[t] = x[t] > 0 ? x[t] / p->repetition_penalty
					: x[t] * p->repetition_penalty;
		if (count)
			x[t] -= p->frequency_penalty * (float) count + p->presence_penalty;
	}
	(void) V;
	return 0;
}

float kiln_engine__logprobs(const float *x, int V, int32_t token, int n, int32_t *top_ids,
			    float *top_lp)
{
	const double lse = kk_logsumexp_host(x, V); /* float64, vectorized */
	/* The n best by insertion (n <= 20): ties keep the lower id first. */
	int k = 0;
	for (int i = 0; i < V && n > 0; i++) {
		if (k == n && i % 16 == 0 && i + 16 <= V) {
			/* 16 tokens at a time: most hold none better than the n-th */
			float m = x[i];
			for (int j = 1; j < 16; j++)
				m = x[i + j] > m ? x[i + j] : m;
			if (!(m > x[top_ids[k - 1]])) {
				i += 15;
				continue;
			}
		}
		if (k == n && !(x[i] > x[top_ids[k - 1]]))
			continue;
		int j = k < n ? k++ : n - 1;
		while (j > 0 && x[i] > x[top_ids[j - 1]]) {
			top_ids[j] = top_ids[j - 1];
			j--;
		}
		top_ids[j] = i;
	}
	for (int i = 0; i < k; i++)
		top_lp[i] = (float) ((double) x[top_ids[i]] - lse);
	return (float) ((double) x[token] - lse);
}

int kiln_engine__sample_row(kiln_engine *e, int i, ereq *q, const kk_sampling *p)
{
	const int V = e->cfg.vocab_size;
	if (!engine_host_sampled(q)) {
		int32_t tok = -1;
		int r = km_sample(e->m, i, 1, p, &tok);
		return r < 0 ? r : tok;
	}
	int32_t stops[KILN_ENGINE_STOP_MAX + 1];
	int n_stops = 0;
	if (!q->ignore_eos && e->eos >= 0)
		stops[n_stops++] = e->eos;
	for (int k = 0; k < q->n_stop; k++)
		stops[n_stops++] = q->stop[k];
	memcpy(e->row, e->host_logits + (size_t) i * V, (size_t) V * sizeof(float));
	int r = kiln_engine__process_logits(e->row, V, &q->proc, q->tokens, q->n_prompt, q->n_total,
					    stops, n_stops, e->counts);
	int32_t tok = -1;
	if (r >= 0)
		r = kk_sample_host(e->row, 1, V, p, &tok);
	return r < 0 ? r : tok;
}
