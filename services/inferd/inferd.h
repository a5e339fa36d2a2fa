/* inferd.h — kiln-inferd's internal header: the three layers of the server
 * and what they share.
 *
 *   openai.c  the OpenAI request layer: a JSON body -> a typed request
 *             (prompts already as token ids), typed results -> response
 *             JSON.  Pure: no I/O, no engine, no HTTP (fuzzed by
 *             tests/fuzz/fuzz-openai.c, tested by test-openai.c).
 *   stream.c  one HTTP request's life on the engine: engine events ->
 *             decoded text, stop strings found across tokens and SSE
 *             events, UTF-8 hold-back, usage, the reply.
 *   sse.c     Server-Sent Events framing on kiln/http.h's byte streams.
 *   main.c    options, model/tokenizer/engine/HTTP setup, routes, signals.
 *
 * Not installed: only services/inferd and its tests include it. */
#pragma once

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kiln/engine.h"
#include "kiln/http.h"
#include "kiln/json.h"
#include "kiln/strbuf.h"
#include "kk.h"
#include "kmf.h"
#include "ktok.h"

/* Token ids in a prompt array; the engine refuses prompts longer than the
 * model's context anyway, this bounds the JSON walk first. */
#define INFERD_PROMPT_MAX (1 << 20)
/* Prompts in one batched /v1/completions request: each becomes its own
 * engine request (and its own place in the queue), so one HTTP request
 * must not be able to fill the queue alone. */
#define INFERD_BATCH_MAX 64
/* Stop strings per request: OpenAI's own limit. */
#define INFERD_STOP_STRINGS_MAX 4
/* Longest stop string in bytes: streamed text is held back by this much
 * (a stop string may be split across tokens), so it bounds the latency a
 * stop string adds; real ones are a few bytes. */
#define INFERD_STOP_LEN_MAX 256
/* max_tokens accepted (OpenAI's own ceiling is in this range). */
#define INFERD_MAX_TOKENS_MAX 65536
/* The served model's name, in replies and checked against "model". */
#define INFERD_NAME_MAX 128

/* ---- the request layer (openai.c) */

/* What the request layer knows of the served model. */
typedef struct inferd_model {
	char name[INFERD_NAME_MAX + 1];
	int vocab, ctx;
	const ktok *tok; /* NULL: token ids only */
	ktok_chat chat;
	char bos[KTOK_MAX_TOKEN_LEN + 1], eos[KTOK_MAX_TOKEN_LEN + 1]; /* for templates */
	/* The longest token text of tok's vocabulary, bytes (0: unknown).  No
	 * token decodes to more bytes than its text has, so a text of L bytes
	 * is at least L / max_piece tokens: a text over the context by that
	 * bound is refused before it is tokenized (inferd_max_piece()). */
	size_t max_piece;
} inferd_model;

/* The longest token text of t's vocabulary in bytes (for max_piece). */
size_t inferd_max_piece(const ktok *t);

/* A validated /v1/completions or /v1/chat/completions request. */
typedef struct inferd_request {
	bool chat;
	int64_t max_tokens; /* 0 only with echo (the prompt scored) */
	double temperature, top_p;
	int64_t top_k;
	int64_t seed; /* -1: none given */
	bool stream, include_usage, echo, ignore_eos;
	int32_t stop_ids[KILN_ENGINE_STOP_MAX]; /* "stop_token_ids" */
	int n_stop_ids;
	char **stops;	 /* "stop": NULL-terminated copies; NULL: none */
	size_t stop_max; /* the longest stop string (bytes) */
	int n;		 /* choices per prompt; n_prompts * n <= INFERD_BATCH_MAX */
	bool logprobs;	 /* completions: logprobs given; chat: logprobs true;
			  * with echo, the prompt's tokens' too */
	int top_logprobs;
	kiln_engine_processing proc; /* proc.logit_bias unset: logit_bias below */
	kiln_engine_bias logit_bias[KILN_ENGINE_BIAS_MAX];
	int n_logit_bias;
	int n_prompts; /* 1, or a batch of up to INFERD_BATCH_MAX */
	int32_t *prompts[INFERD_BATCH_MAX];
	int prompt_len[INFERD_BATCH_MAX];
} inferd_request;

/* A refused request: OpenAI's error shape.  status 400 (code NULL or
 * "context_length_exceeded") or 404 ("model_not_found"); json.msg and
 * json.where ("" when not about one field) as the HTTP error carries them. */
typedef struct inferd_error {
	unsigned status;
	const char *code;
	kiln_error json;
} inferd_error;

/* Validates body against model m and fills *ret (free it with
 * inferd_request_done(), also after a failure).  Returns 0; -EINVAL with
 * *err filled for anything the client got wrong; -ENOMEM. */
int inferd_request_parse(const inferd_model *m, const json_t *body, bool chat, inferd_request *ret,
			 inferd_error *err);
void inferd_request_done(inferd_request *q);

/* Response JSON.  Each returns a new reference, NULL when out of memory. */
json_t *inferd_usage_json(int prompt_tokens, int completion_tokens);
/* A completion choice; toks may be NULL (n 0: empty token_ids). */
json_t *inferd_choice_json(int index, const char *text, size_t len, const int32_t *toks, int n,
			   const char *finish);
/* A chat choice: "message" (not streamed) or "delta" (streamed; role only
 * in the first, content only when there is some or it is the first). */
json_t *inferd_chat_choice_json(bool stream, int index, bool first, const char *text, size_t len,
				const char *finish);
/* Logprobs of n tokens in OpenAI's shape: chat {"content": [{token,
 * logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}; completions
 * {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset},
 * the offsets counting from *offset (advanced past the tokens' texts).
 * lp[i] is toks[i]'s; top_ids/top_lp hold n_top alternatives per token.
 * Completions: lp[i] NaN (an echoed prompt's first token, which has none)
 * gives null in token_logprobs and top_logprobs, as OpenAI's and vLLM's. */
json_t *inferd_logprobs_json(const inferd_model *m, bool chat, const int32_t *toks, const float *lp,
			     const int32_t *top_ids, const float *top_lp, int n_top, int n,
			     size_t *offset);
/* The envelope around choices (a choice, an array of them, or NULL for
 * none; the reference is stolen): id, object, created, model, choices. */
json_t *inferd_envelope_json(const char *id, bool chat, bool stream, const char *model,
			     time_t created, json_t *choices);
/* GET /v1/models, and one model (GET /v1/models/{id}). */
json_t *inferd_models_json(const char *name, time_t created, int ctx);
json_t *inferd_model_json(const char *name, time_t created, int ctx);

/* ---- the streaming and stop-string layer (stream.c) */

/* Where text[0..len) must be cut because a stop string in stops (a
 * NULL-terminated list, longest stop_max bytes) ends in the bytes added
 * after the first old_len: the offset of the first such match, or
 * SIZE_MAX when none. */
size_t inferd_stop_cut(const char *text, size_t len, size_t old_len, char *const *stops,
		       size_t stop_max);
/* How much of text[0..len) may be streamed when sent bytes are out: all of
 * it unless hold (stop strings may still claim the tail), else all but
 * stop_max - 1 bytes, backed off to a UTF-8 character boundary, never
 * less than sent. */
size_t inferd_sendable(const char *text, size_t len, size_t sent, size_t stop_max, bool hold);

/* ---- Server-Sent Events (sse.c) */

/* Appends one event to b: "data: <line>\n" per line of data, then a blank
 * line.  Returns 0 or -ENOMEM (b keeps the error). */
int inferd_sse_event(kiln_strbuf *b, const char *data);
/* Replies 200 text/event-stream (kiln_http_reply_stream()). */
int inferd_sse_reply(kiln_http_request *r, kiln_http_cancel_fn on_cancel, void *userdata,
		     kiln_http_stream **ret);
/* Queues one event (kiln_http_stream_write(): its backpressure and errors;
 * -EMSGSIZE for an event over KILN_HTTP_STREAM_WRITE_MAX once framed). */
int inferd_sse_send(kiln_http_stream *s, const char *data, int timeout_ms);
/* The same with a compact JSON serialisation of event. */
int inferd_sse_send_json(kiln_http_stream *s, const json_t *event, int timeout_ms);
/* Ends the stream, after "data: [DONE]" when done (kiln_http_stream_close()). */
int inferd_sse_close(kiln_http_stream *s, bool done);
/* The bytes a stream still open at the server's stop ends with (the
 * server's stream_shutdown_bytes): an OpenAI error event, then [DONE]. */
extern const char inferd_sse_shutdown[];

/* Models one kiln-inferd serves at most (inference.models, --model):
 * each has its own backend, engine, KV cache and scheduler thread. */
#define INFERD_MODELS_MAX 16

/* One served model: the model as the request layer sees it, and its
 * engine.  main.c keeps one per model and routes each request by its
 * "model" to one of them. */
typedef struct inferd_app {
	inferd_model model;
	kiln_engine *engine;
	atomic_uint_fast64_t next_id;
	time_t started;
	_Atomic uint64_t last_tick; /* the engine's on_tick (CLOCK_MONOTONIC usec) */
} inferd_app;

/* Submits request q (its prompts n times each, one engine request per
 * choice) and replies:
 * an SSE stream or a deferred JSON reply when the engine took it, 429 /
 * 503 / 400 when it did not.  Takes q->stops (q->stops is NULL after).
 * Returns what the kiln_http_reply_* call returned, or a negative errno. */
int inferd_submit(kiln_http_request *r, inferd_app *a, inferd_request *q);

/* ---- dtype.c: --dtype auto ---------------------------------------------- */

/* A model_spec's dtype meaning "what the file holds" (--dtype auto, the
 * default), decided per model once its backend is open. */
#define INFERD_DTYPE_AUTO (-3)

/* The dtype holding the most elements among path's tensors of two or more
 * dimensions, and that share of them.  0, or kmf_open's errors (err
 * filled); -EINVAL (err filled) for a file with no such tensor. */
int inferd_file_weight_dtype(const char *path, kmf_dtype *ret, double *share, kiln_error *err);
/* Whether a backend computes on weights of dt (ctx: the backend). */
typedef bool (*inferd_dtype_ok)(const void *ctx, kk_dtype dt);
/* inferd_dtype_ok for a kk backend: kk_supports for the ops a model of
 * that dtype runs (QGEMM for i8/q4; GEMM, paged attention, RMSNorm). */
bool inferd_backend_computes(const void *be, kk_dtype dt);
/* The kk dtype --dtype auto serves weights stored as `stored` with: as
 * stored where ok() says the backend computes on it, else the closest it
 * does (dtype.c has the table); why (len bytes) receives the reason for
 * the log ("as stored (Q8_0)", "F16 converted to f32: ..."). */
kk_dtype inferd_dtype_auto(kmf_dtype stored, inferd_dtype_ok ok, const void *ctx, char *why,
			   size_t len);
