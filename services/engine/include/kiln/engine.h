/* kiln/engine.h — the inference engine: a continuous-batching scheduler on
 * libkmodel, the core of kiln-inferd.
 *
 * One engine owns one model (km_model) and its paged KV cache (km_kvcache)
 * and runs a scheduler thread over them.  Any thread submits requests
 * (prompt token ids, max_tokens, sampling, stop ids, a callback) and may
 * cancel them; the scheduler admits waiting requests first come first
 * served while KV blocks and the per-step token budget allow, runs one
 * km_forward step over every running sequence (decodes first, then
 * prompts longer than the budget in chunks of what the decodes leave),
 * samples each row with the request's own seed, hands each new token to the
 * request's callback, retires finished sequences and frees their blocks.
 * When the cache runs out it preempts the most recently admitted running
 * sequence by recompute: its blocks are freed and it goes back to the front
 * of the queue with prompt + generated tokens, so its output is unchanged.
 * A request may also ask for log-probabilities and for logits processing
 * (OpenAI's and vLLM's penalties, logit_bias, min_tokens): those rows are
 * sampled on the host.  With prefix caching, prompts share whole KV blocks
 * with running sequences and with finished requests' kept blocks.
 * docs/inferd-engine.md has the policy, the limits and the measurements.
 *
 * Callbacks run on the scheduler thread, never with the engine's lock held
 * (they may submit or cancel); they must be quick, since the next step waits
 * for them.  Every accepted request gets exactly one finish event, and
 * nothing after it.
 *
 * Conventions: 0 or a negative errno; functions whose failure a user must
 * see take a kiln_error that receives one line (what, where, what to do).
 * Nothing here prints or exits. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kiln/metrics.h"
#include "kk.h"
#include "kmodel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest waiting queue an engine accepts as an option (each waiting
 * request holds its prompt in host memory; a million is far past any
 * useful backlog). */
#define KILN_ENGINE_WAITING_MAX (1 << 20)
/* Stop token ids per request (OpenAI allows a handful of stop strings;
 * a tokenizer maps each to a few ids). */
#define KILN_ENGINE_STOP_MAX 64
/* Alternatives per token a request may ask log-probabilities of (OpenAI's
 * top_logprobs limit: 20). */
#define KILN_ENGINE_LOGPROBS_MAX 20
/* logit_bias entries per request (OpenAI's limit: 300 tokens). */
#define KILN_ENGINE_BIAS_MAX 300

typedef struct kiln_engine kiln_engine;

typedef enum kiln_engine_finish {
	KILN_ENGINE_FINISH_STOP,      /* a stop token or EOS was sampled */
	KILN_ENGINE_FINISH_LENGTH,    /* max_tokens, or the context is full */
	KILN_ENGINE_FINISH_CANCELLED, /* kiln_engine_cancel, or shutdown */
	KILN_ENGINE_FINISH_ERROR,     /* the step failed; message says why */
} kiln_engine_finish;

/* "stop", "length", "cancelled", "error" (OpenAI's finish_reason words
 * where it has them). */
const char *kiln_engine_finish_name(kiln_engine_finish f);

typedef enum kiln_engine_event_type {
	KILN_ENGINE_EVENT_TOKEN,
	KILN_ENGINE_EVENT_FINISH,
	/* A prompt token's log-probability (prompt_logprobs): token is the
	 * prompt's token at position index (1..n_prompt-1, in order, each
	 * once, all before the first TOKEN), logprob/top_* as for TOKEN. */
	KILN_ENGINE_EVENT_PROMPT,
} kiln_engine_event_type;

typedef struct kiln_engine_event {
	kiln_engine_event_type type;
	uint64_t id;	 /* the request's id */
	int32_t token;	 /* TOKEN, PROMPT: the token; FINISH/STOP: the stop id matched, else -1 */
	int index;	 /* TOKEN: 0-based position in the output; PROMPT: in the prompt */
	int n_generated; /* tokens delivered so far (FINISH: in all) */
	int n_prompt;	 /* the request's prompt length */
	kiln_engine_finish reason; /* FINISH only */
	const char *message;	   /* FINISH/ERROR: one line; else NULL */
	/* TOKEN, when the request asked for logprobs: the token's
	 * log-probability (log-softmax of the model's raw logits: before
	 * temperature, penalties and logit_bias, as vLLM returns them by
	 * default), and the n_top most likely tokens, most likely first
	 * (ties by lower id), with theirs.  Valid during the call only. */
	float logprob;
	int n_top;
	const int32_t *top_ids;
	const float *top_logprobs;
} kiln_engine_event;

/* Called on the scheduler thread for every token and once at the finish.
 * ev is valid during the call only. */
typedef void (*kiln_engine_cb)(void *userdata, const kiln_engine_event *ev);

/* One logit_bias entry: added to token's logit before sampling. */
typedef struct kiln_engine_bias {
	int32_t token;
	float bias; /* -100..100 (OpenAI's range) */
} kiln_engine_bias;

/* What a request changes in its logits before sampling; all zero: nothing,
 * and the row is sampled on the device as usual.  Any of them makes the
 * engine fetch that row's logits and sample it on the host (the same
 * algorithm as kk_sample, kk.h), in this order (vLLM's): logit_bias added;
 * until min_tokens tokens are generated, EOS (unless ignore_eos) and the
 * stop ids masked to -inf; repetition_penalty over the tokens of the
 * prompt and the output (each distinct token once: a positive logit
 * divided by it, a negative one multiplied); frequency_penalty times the
 * token's count in the output subtracted; presence_penalty subtracted
 * from every token the output holds. */
typedef struct kiln_engine_processing {
	float presence_penalty;	  /* OpenAI's, -2..2; 0: none */
	float frequency_penalty;  /* OpenAI's, -2..2; 0: none */
	float repetition_penalty; /* vLLM's/HF's, > 0; 0 or 1: none */
	const kiln_engine_bias *logit_bias;
	int n_logit_bias; /* <= KILN_ENGINE_BIAS_MAX, tokens in the vocabulary */
	int min_tokens;	  /* >= 0; stops are not sampled before this many tokens */
} kiln_engine_processing;

typedef struct kiln_engine_request {
	uint64_t id; /* the caller's; cancel finds the request by it */
	const int32_t *prompt;
	int n_prompt; /* >= 1 */
	/* Tokens to generate at most, >= 0; 0: only the prompt is run (with
	 * prompt_logprobs: scored), the finish is LENGTH. */
	int max_tokens;
	kk_sampling sampling;
	/* Sampling the EOS token (the engine's eos_token option) or one of
	 * these ends the request with FINISH_STOP; that token is not
	 * delivered (OpenAI's behaviour). */
	const int32_t *stop;
	int n_stop; /* <= KILN_ENGINE_STOP_MAX */
	bool ignore_eos;
	/* Deliver each token's log-probability, and those of the
	 * top_logprobs (0..KILN_ENGINE_LOGPROBS_MAX) most likely tokens
	 * (kiln_engine_event); the row's logits are fetched to the host. */
	bool logprobs;
	int top_logprobs;
	/* With logprobs: also deliver the prompt's tokens' (PROMPT events,
	 * positions 1..n_prompt-1; the first token has none).  km_forward
	 * gives the logits of each input's last token only, so such a prompt
	 * is prefilled one token per step (as slowly as decoding) and never
	 * shares a cached prefix; a recompute after preemption catches up in
	 * one chunk and repeats no event. */
	bool prompt_logprobs;
	kiln_engine_processing proc; /* copied */
	kiln_engine_cb cb;	     /* NULL allowed */
	void *userdata;
} kiln_engine_request;

typedef struct kiln_engine_opts {
	kk_dtype weight_dtype; /* km_model_opts.weight_dtype */
	int q4_group;	       /* km_model_opts.q4_group */
	int max_running;       /* sequences per step (km max_seqs); 0: 64 */
	int max_step_tokens;   /* tokens per step, all sequences (km max_tokens); 0: 512 */
	int num_blocks;	       /* KV cache blocks of 16 tokens; 0: 1024 */
	int max_waiting;       /* queue limit, submit says -EAGAIN past it; 0: 1024 */
	int eos_token;	       /* -1: none; llama2.c models use 2 */
	/* Share whole 16-token blocks of a prompt prefix with a running
	 * sequence or a finished request's kept blocks (km_kvcache_seq_fork)
	 * instead of prefilling them; the rest of the prompt is prefilled in
	 * chunks on top of the shared blocks.  Finished requests' whole
	 * blocks are kept (up to max_running prefixes) and evicted least
	 * recently used when blocks are needed. */
	bool prefix_caching;
	/* The watchdog hook: called by the scheduler thread at the top of
	 * every iteration of its loop (each step, and at least every
	 * tick_usec while it waits for work), without the engine's lock.  A
	 * scheduler wedged in a step stops calling it, which is what
	 * kiln-inferd's systemd watchdog keys on.  NULL: none; tick_usec 0:
	 * no wake-ups while idle (the hook then runs only when there is work). */
	void (*on_tick)(void *userdata);
	void *tick_userdata;
	uint64_t tick_usec;
} kiln_engine_opts;

/* Creates the model (weights read from src during the call only), its KV
 * cache, and starts the scheduler thread.  be must outlive the engine.
 * Errors (err filled): -EINVAL (opts, config), km_model_new's and
 * km_kvcache_new's errors, -errno from pthread_create. */
int kiln_engine_new(kk_backend *be, const km_config *cfg, const km_weight_source *src,
		    const kiln_engine_opts *opts, kiln_engine **ret, kiln_error *err);

/* Queues a request (prompt, stop ids and logit_bias are copied).  Errors
 * (err filled):
 *   -EINVAL   empty prompt, token id outside the vocabulary, max_tokens < 1,
 *             too many stop ids, bad sampling parameters, top_logprobs,
 *             penalties, logit_bias or min_tokens out of range;
 *   -E2BIG    the prompt can never run: longer than the model's context
 *             (max_seq_len) or than the whole KV cache;
 *   -EAGAIN   the waiting queue is at max_waiting (inferd answers 429);
 *   -ESHUTDOWN the engine is shutting down;
 *   -ENOMEM. */
int kiln_engine_submit(kiln_engine *e, const kiln_engine_request *req, kiln_error *err);

/* Cancels a waiting or running request; its callback gets FINISH_CANCELLED
 * (from the scheduler thread, soon after) and its blocks are freed.
 * -ENOENT: no live request has that id (finished already, or never). */
int kiln_engine_cancel(kiln_engine *e, uint64_t id);
/* The same, but the request ends with FINISH_STOP (counted as a stop in
 * the stats and metrics): the caller found a stop string in its text. */
int kiln_engine_stop(kiln_engine *e, uint64_t id);

typedef enum kiln_engine_shutdown_mode {
	KILN_ENGINE_DRAIN,  /* finish everything accepted, accept nothing new */
	KILN_ENGINE_CANCEL, /* cancel everything waiting or running */
} kiln_engine_shutdown_mode;

/* Stops accepting requests, drains or cancels the rest, and joins the
 * scheduler thread.  Returns once every callback got its finish.  Calling it
 * again does nothing.  Call it (and kiln_engine_free) from one thread, never
 * from a callback (it would wait for itself). */
void kiln_engine_shutdown(kiln_engine *e, kiln_engine_shutdown_mode mode);
/* kiln_engine_shutdown(CANCEL) if not done, then frees everything. */
kiln_engine *kiln_engine_free(kiln_engine *e);

typedef struct kiln_engine_stats {
	int waiting, running;
	uint64_t requests_finished[4]; /* by kiln_engine_finish */
	uint64_t prompt_tokens;	       /* tokens submitted as prompts */
	uint64_t prefill_tokens;       /* tokens run through prefill (chunks, forked
					* tails, recompute) */
	uint64_t generated_tokens;     /* tokens delivered */
	uint64_t preemptions;
	uint64_t steps;
	uint64_t prefix_queries; /* prompt tokens looked up (prefix_caching) */
	uint64_t prefix_hits;	 /* of those, tokens shared instead of prefilled */
	int kv_blocks_total, kv_blocks_used;
	uint64_t requests_rejected; /* refused: the queue was full (HTTP 429) */
	/* Prefix cache (prefix_caching): finished requests' kept prefixes,
	 * the distinct KV blocks they hold, and entries evicted for room.
	 * Blocks held by kept prefixes only are freed on demand, so
	 * kv_blocks_used leaves them out (vLLM counts such cached blocks as
	 * free); those a running sequence shares are in it. */
	int prefix_entries, prefix_blocks;
	uint64_t prefix_evictions;
} kiln_engine_stats;

void kiln_engine_get_stats(kiln_engine *e, kiln_engine_stats *ret);

/* Appends the metrics of n engines, each sample labelled model_name =
 * names[i], to m: vLLM's names (vllm:num_requests_running/waiting,
 * vllm:kv_cache_usage_perc, token, preemption and prefix-cache counters,
 * vllm:request_success_total by finished_reason, time-to-first-token,
 * inter-token and end-to-end latency histograms) and kiln's extras
 * (kiln_inferd_*: KV blocks, prefill tokens, steps, 429s).  Returns m's
 * error state; -EINVAL for bad arguments. */
int kiln_engine_metrics(kiln_engine *const *engines, const char *const *names, int n,
			kiln_metrics *m);

/* ---- the host path's pieces, exported for tests/inferd/test-engine.c */

/* Applies p to logits[vocab] in place for a request whose tokens are
 * tokens[0..n_total) (the first n_prompt the prompt); stops[n_stops] are
 * the ids masked while fewer than p->min_tokens are generated (the caller
 * adds EOS).  counts: vocab ints, all zero, left all zero (the caller's
 * scratch, so no token allocates).  Returns 0. */
int kiln_engine__process_logits(float *logits, int vocab, const kiln_engine_processing *p,
				const int32_t *tokens, int n_prompt, int n_total,
				const int32_t *stops, int n_stops, int *counts);
/* The log-softmax of logits[vocab] at token, and the n most likely tokens
 * (descending, ties by lower id) with theirs into top_ids/top_lp. */
float kiln_engine__logprobs(const float *logits, int vocab, int32_t token, int n, int32_t *top_ids,
			    float *top_lp);

#ifdef __cplusplus
}
#endif
