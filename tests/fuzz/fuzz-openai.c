/* fuzz-openai.c — libFuzzer target for kiln-inferd's request layer
 * (services/inferd/openai.c).
 *
 * Request bodies come straight from the network: whatever they hold, the
 * request layer must answer with a typed request or an OpenAI error —
 * never a crash, leak, hang or undefined behaviour.  Each input that
 * parses as a JSON object is validated as a completion and as a chat
 * request, against a server with token ids only and one with a tokenizer
 * (tests/tokenizer/data/tok512.bin, or $KILN_FUZZ_TOKENIZER; ChatML and
 * llama2 templates), and the invariants checked: an accepted request is
 * within every limit (prompts 1..64 of 1..ctx ids inside the vocabulary,
 * max_tokens, sampling ranges, stop strings); a refused one has a status
 * of 400 or 404 and a message, which names its field first; nothing but
 * -EINVAL or -ENOMEM fails.  Accepted prompts also go through the response
 * builders.  Built with clang -fsanitize=fuzzer,address,undefined by
 * tests/inferd/build.mk; run 60 s by fuzz-openai.sh (make test-full). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../services/inferd/inferd.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { IDS, CHATML, LLAMA2, N_MODELS };
static inferd_model models[N_MODELS];
static ktok *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *path = getenv("KILN_FUZZ_TOKENIZER");
	kiln_error te;
	if (!path)
		path = "tests/tokenizer/data/tok512.bin";
	if (ktok_load(path, &tok, &te) < 0) {
		fprintf(stderr,
			"fuzz-openai: cannot load %s (run from the repository root or set "
			"$KILN_FUZZ_TOKENIZER)\n",
			path);
		exit(1);
	}
	for (int i = 0; i < N_MODELS; i++) {
		inferd_model *m = &models[i];
		snprintf(m->name, sizeof(m->name), "m");
		m->vocab = (int) ktok_n_vocab(tok);
		m->ctx = 512;
		if (i != IDS) {
			m->tok = tok;
			m->chat = i == LLAMA2 ? KTOK_CHAT_LLAMA2 : KTOK_CHAT_CHATML;
			snprintf(m->bos, sizeof(m->bos), "<s>");
			snprintf(m->eos, sizeof(m->eos), "</s>");
		}
	}
	return 0;
}

static void check_accepted(const inferd_model *m, const inferd_request *q)
{
	if (q->n_prompts < 1 || q->n_prompts > INFERD_BATCH_MAX || (q->chat && q->n_prompts != 1))
		abort();
	for (int i = 0; i < q->n_prompts; i++) {
		if (!q->prompts[i] || q->prompt_len[i] < 1 || q->prompt_len[i] > m->ctx)
			abort();
		for (int k = 0; k < q->prompt_len[i]; k++)
			if (q->prompts[i][k] < 0 || q->prompts[i][k] >= m->vocab)
				abort();
	}
	/* 0 only with echo (the prompt scored) */
	if (q->max_tokens < (q->echo ? 0 : 1) || q->max_tokens > INFERD_MAX_TOKENS_MAX)
		abort();
	if (!(q->temperature >= 0 && q->temperature <= 2 && q->top_p >= 0 && q->top_p <= 1))
		abort();
	if (q->top_k < 0 || q->top_k > KK_SAMPLE_TOP_K_MAX || q->seed < -1)
		abort();
	if (q->n_stop_ids < 0 || q->n_stop_ids > KILN_ENGINE_STOP_MAX)
		abort();
	for (int i = 0; i < q->n_stop_ids; i++)
		if (q->stop_ids[i] < 0 || q->stop_ids[i] >= m->vocab)
			abort();
	if (q->stops) {
		size_t n = 0, max = 0;
		if (!m->tok)
			abort();
		for (; q->stops[n]; n++) {
			size_t len = strlen(q->stops[n]);
			if (len < 1 || len > INFERD_STOP_LEN_MAX)
				abort();
			max = len > max ? len : max;
		}
		if (n < 1 || n > INFERD_STOP_STRINGS_MAX || max != q->stop_max)
			abort();
	}
	if ((q->echo && !m->tok) || (q->echo && q->chat))
		abort();
	/* the sampling fields the engine checks again at submit */
	if (q->n < 1 || q->n_prompts * q->n > INFERD_BATCH_MAX || q->top_logprobs < 0 ||
	    q->top_logprobs > KILN_ENGINE_LOGPROBS_MAX || (q->top_logprobs && !q->logprobs))
		abort();
	if (!(fabsf(q->proc.presence_penalty) <= 2 && fabsf(q->proc.frequency_penalty) <= 2 &&
	      q->proc.repetition_penalty > 0 && q->proc.repetition_penalty <= 100) ||
	    q->proc.min_tokens < 0 || q->proc.min_tokens > q->max_tokens)
		abort();
	if (q->n_logit_bias < 0 || q->n_logit_bias > KILN_ENGINE_BIAS_MAX ||
	    q->proc.n_logit_bias != q->n_logit_bias)
		abort();
	for (int i = 0; i < q->n_logit_bias; i++) {
		if (q->logit_bias[i].token < 0 || q->logit_bias[i].token >= m->vocab ||
		    !(fabsf(q->logit_bias[i].bias) <= 100))
			abort();
		for (int k = 0; k < i; k++) /* one entry per token */
			if (q->logit_bias[k].token == q->logit_bias[i].token)
				abort();
	}
	if (q->logprobs) { /* the logprobs JSON of the prompt's tokens as a reply */
		int n = q->prompt_len[0], k = q->top_logprobs;
		float *lp = calloc((size_t) n * (k + 1), sizeof(float));
		int32_t *ti = calloc((size_t) n * (k + 1), sizeof(int32_t));
		size_t off = 0;
		for (int i = 0; i < n * k; i++)
			ti[i] = q->prompts[0][i % n];
		if (q->echo) /* an echoed prompt's first token has no logprob */
			lp[0] = NAN;
		json_t *j = inferd_logprobs_json(m, q->chat, q->prompts[0], lp, ti, lp, k, n, &off);
		if (!j)
			abort();
		json_decref(j);
		free(lp);
		free(ti);
	}
	/* The reply a request like this gets, with its prompts as the tokens. */
	json_t *ch = json_array();
	for (int i = 0; i < q->n_prompts; i++)
		json_array_append_new(
			ch, q->chat ? inferd_chat_choice_json(q->stream, i, i == 0, "x", 1, "stop")
				    : inferd_choice_json(i, "x", 1, q->prompts[i], q->prompt_len[i],
							 "length"));
	json_t *e = inferd_envelope_json("cmpl-1", q->chat, q->stream, m->name, 0, ch);
	if (!e || json_object_set_new(e, "usage", inferd_usage_json(1, 2)) < 0)
		abort();
	json_decref(e);
}

static void check_refused(int r, const inferd_error *e)
{
	if (r != -EINVAL)
		return;
	if (e->status != 400 && e->status != 404)
		abort();
	if (!e->json.msg[0] || strlen(e->json.msg) >= sizeof(e->json.msg))
		abort();
	/* a field error names its field first (OpenAI's "param" and ours agree) */
	if (!e->code && e->json.where[0] && strlen(e->json.where) < 60 &&
	    strncmp(e->json.msg, e->json.where, strlen(e->json.where)) != 0)
		abort();
	if (e->code && strcmp(e->code, "model_not_found") != 0 &&
	    strcmp(e->code, "context_length_exceeded") != 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_error je;
	json_t *body = NULL;
	if (kiln_json_parse_object((const char *) data, size, &body, &je) < 0)
		return 0;
	for (int i = 0; i < N_MODELS; i++)
		for (int chat = 0; chat <= 1; chat++) {
			if (i == LLAMA2 && !chat)
				continue; /* the same as CHATML for completions */
			inferd_request q;
			inferd_error e;
			int r = inferd_request_parse(&models[i], body, chat, &q, &e);
			if (r == 0)
				check_accepted(&models[i], &q);
			else if (r != -EINVAL && r != -ENOMEM)
				abort();
			else
				check_refused(r, &e);
			inferd_request_done(&q);
		}
	json_decref(body);
	return 0;
}
