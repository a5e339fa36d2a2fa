/* main.c — kiln-inferd, an OpenAI-compatible completions and chat
 * completions server on the inference engine (kiln/engine.h), libktok and
 * kiln/http.h.
 *
 *   kiln-inferd --model FILE [--tokenizer FILE] [--port N] [options]
 *
 * Serves POST /v1/completions (prompt as text, a batch of texts, token ids
 * or a batch of token-id lists), POST /v1/chat/completions (messages
 * rendered with a chat template), both streamed over SSE or not, GET
 * /v1/models, GET /metrics (Prometheus) and GET /health.  Replies are
 * decoded as the tokens come (ktok_stream: complete UTF-8 only), so stop
 * strings are found in the text, cut, and never returned.  Without a
 * tokenizer it speaks token ids only.  It loads a llama2.c checkpoint onto
 * the cpu or cuda backend, starts the engine, listens, and stops on
 * SIGTERM/SIGINT: the server stops first (streams are cancelled), then the
 * engine cancels what is left.  Exit codes: 0 ok, 1 failure, 2 usage error
 * (a tokenizer larger than the model's vocabulary included).
 * docs/kiln-inferd.md. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/engine.h"
#include "kiln/http.h"
#include "kiln/json.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"
#include "ktok.h"

#define EXIT_USAGE 2
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

static struct {
	const char *model, *listen, *name, *backend, *dtype, *tokenizer, *chat_template;
	int port, max_running, max_step, blocks, max_waiting, eos, threads;
	bool prefix;
} arg = { .listen = "127.0.0.1",
	  .port = 8000,
	  .backend = "cpu",
	  .dtype = "f32",
	  .eos = 2,
	  .max_running = 64,
	  .max_step = 512,
	  .blocks = 1024,
	  .max_waiting = 1024 };

typedef struct app {
	kiln_engine *engine;
	char name[INFERD_NAME_MAX + 1];
	int vocab, ctx;
	ktok *tok; /* NULL: token ids only */
	ktok_chat chat;
	char bos[KTOK_MAX_TOKEN_LEN + 1], eos[KTOK_MAX_TOKEN_LEN + 1]; /* for templates */
	atomic_uint_fast64_t next_id;
	time_t started;
} app;

typedef struct job job;

/* One choice: one prompt, one engine request.  Its text is decoded as the
 * tokens come (ktok_stream: complete UTF-8 only) so stop strings can be
 * found in it; a streamed choice sends what no stop string can still
 * claim. */
typedef struct seq {
	job *j;
	int index;
	uint64_t id;
	int n_prompt;
	int32_t *out; /* the tokens so far (token_ids) */
	int n_out, cap;
	ktok_stream *dec;
	kiln_strbuf text; /* decoded text, cut at a stop string */
	size_t sent;	  /* bytes of text already streamed */
	char *echo;	  /* the prompt's text when "echo" */
	bool done;	  /* no more text: a stop string, or the finish */
	bool stopped;	  /* a stop string cancelled the engine request */
	bool first;	  /* the first streamed event is not yet out */
	const char *finish;
} seq;

/* One HTTP request: its choices share the reply.  The engine's callback
 * may fire before the handler has its stream (the handler submits first so
 * a full queue is a real 429): it waits on `ready` until the handler says
 * how it went.  Every engine callback runs on the one scheduler thread, so
 * the choices need no lock of their own; the last finish replies and frees
 * the job. */
struct job {
	app *a;
	char rid[80]; /* "cmpl-" / "chatcmpl-" + the HTTP request id */
	bool stream, chat, include_usage;
	char **stops;	 /* NULL-terminated copies */
	size_t stop_max; /* longest stop string */
	int n_seqs, n_live, n_prompt_total, n_gen_total;
	bool cancelled;
	char error[256];
	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum { JOB_PENDING, JOB_READY, JOB_FAILED } state;
	kiln_http_stream *s; /* the SSE stream or the deferred reply */
	seq seqs[];
};

static void job_free(job *j)
{
	if (!j)
		return;
	pthread_mutex_destroy(&j->lock);
	pthread_cond_destroy(&j->cond);
	for (int i = 0; i < j->n_seqs; i++) {
		free(j->seqs[i].out);
		free(j->seqs[i].echo);
		ktok_stream_free(j->seqs[i].dec);
		kiln_strbuf_free(&j->seqs[i].text);
	}
	strv_free(j->stops);
	free(j);
}

static json_t *usage_json(const job *j)
{
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", j->n_prompt_total, "completion_tokens",
			 j->n_gen_total, "total_tokens", j->n_prompt_total + j->n_gen_total);
}

/* A completion choice; toks may be NULL (no token_ids). */
static json_t *choice(int index, const char *text, size_t len, const int32_t *toks, int n,
		      const char *finish)
{
	json_t *ids = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(ids, json_integer(toks[i]));
	return json_pack("{s:i, s:s%, s:o, s:n, s:s?}", "index", index, "text", text ? text : "",
			 text ? len : 0, "token_ids", ids, "logprobs", "finish_reason", finish);
}

/* A chat choice: message (non-streamed) or delta (streamed). */
static json_t *chat_choice(const job *j, int index, bool first, const char *text, size_t len,
			   const char *finish)
{
	json_t *m = json_object();
	if (!j->stream || first)
		json_object_set_new(m, "role", json_string("assistant"));
	if (!j->stream || first || len)
		json_object_set_new(m, "content", json_stringn(text ? text : "", len));
	return json_pack("{s:i, s:o, s:n, s:s?}", "index", index, j->stream ? "delta" : "message",
			 m, "logprobs", "finish_reason", finish);
}

/* The envelope; choices is a choice, an array of them, or NULL (none). */
static json_t *envelope(const job *j, json_t *choices)
{
	if (!choices)
		choices = json_array();
	else if (!json_is_array(choices))
		choices = json_pack("[o]", choices);
	const char *object = j->chat ? (j->stream ? "chat.completion.chunk" : "chat.completion")
				     : "text_completion";
	return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", j->rid, "object", object, "created",
			 (json_int_t) time(NULL), "model", j->a->name, "choices", choices);
}

/* Sends one streamed event; a client 64 KiB behind, or gone, loses its
 * request (never block the batch on one client). */
static void send_event(job *j, json_t *c)
{
	_cleanup_json_ json_t *e = c;
	int r = e ? kiln_http_stream_send_json(j->s, e, 0) : -ENOMEM;
	if (r < 0) {
		log_debug_errno(r, "%s: stream send failed (%m), cancelling", j->rid);
		for (int i = 0; i < j->n_seqs; i++)
			kiln_engine_cancel(j->a->engine, j->seqs[i].id);
	}
}

/* Appends newly decoded text and cuts it at the first stop string. */
static void add_text(seq *q, const char *t, size_t len)
{
	job *j = q->j;
	if (q->done || !len)
		return;
	size_t old = q->text.len;
	if (kiln_strbuf_append_n(&q->text, t, len) < 0)
		return; /* the buffer keeps its error; the finish reports it */
	if (!j->stops)
		return;
	/* Only matches that end in the new bytes are new. */
	size_t from = old > j->stop_max ? old - j->stop_max : 0, cut = SIZE_MAX;
	for (char **s = j->stops; *s; s++) {
		const char *m = memmem(q->text.s + from, q->text.len - from, *s, strlen(*s));
		if (m && (size_t) (m - q->text.s) < cut)
			cut = (size_t) (m - q->text.s);
	}
	if (cut == SIZE_MAX)
		return;
	q->text.len = cut;
	q->text.s[cut] = '\0';
	q->done = q->stopped = true;
	q->finish = "stop";
	kiln_engine_cancel(j->a->engine, q->id);
}

/* How much of the text may be streamed now: all of it when done, else all
 * but what could still begin a stop string, backed off to a character
 * boundary so every event is complete UTF-8. */
static size_t sendable(const seq *q)
{
	size_t n = q->text.len;
	if (q->done || !q->j->stops)
		return n;
	n = n > q->j->stop_max - 1 ? n - (q->j->stop_max - 1) : 0;
	while (n > q->sent && ((unsigned char) q->text.s[n] & 0xC0) == 0x80)
		n--;
	return MAX(n, q->sent);
}

static void stream_text(seq *q, const int32_t *tok, int n_tok, const char *finish)
{
	job *j = q->j;
	size_t end = sendable(q);
	const char *t = q->text.s ? q->text.s + q->sent : "";
	size_t len = end - q->sent;
	if (j->chat) {
		/* OpenAI's order: the role alone, then content deltas. */
		if (q->first)
			send_event(j, envelope(j, chat_choice(j, q->index, true, "", 0, NULL)));
		if (len)
			send_event(j, envelope(j, chat_choice(j, q->index, false, t, len, NULL)));
		if (finish)
			send_event(j, envelope(j, chat_choice(j, q->index, false, "", 0, finish)));
	} else {
		_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
		kiln_strbuf_init(&b);
		if (q->first && q->echo)
			kiln_strbuf_append(&b, q->echo);
		kiln_strbuf_append_n(&b, t, len);
		send_event(j, envelope(j, choice(q->index, b.s, b.len, tok, n_tok, finish)));
	}
	q->first = false;
	q->sent = end;
}

/* The last finish: the reply, then the job goes. */
static void job_finish(job *j)
{
	if (j->cancelled) {
		kiln_http_stream_close(j->s, false);
		return;
	}
	if (j->error[0]) {
		log_error("%s: generation failed: %s", j->rid, j->error);
		if (j->stream)
			kiln_http_stream_close(j->s, false);
		else
			kiln_http_later_error(j->s, 500, NULL, NULL, NULL, "Generation failed: %s",
					      j->error);
		return;
	}
	if (j->stream) {
		if (j->include_usage) {
			json_t *c = envelope(j, NULL);
			if (c)
				json_object_set_new(c, "usage", usage_json(j));
			send_event(j, c);
		}
		kiln_http_stream_close(j->s, true);
		return;
	}
	json_t *ch = json_array();
	bool oom = !ch;
	for (int i = 0; i < j->n_seqs && !oom; i++) {
		seq *q = &j->seqs[i];
		if (kiln_strbuf_error(&q->text) < 0) {
			oom = true;
			break;
		}
		_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
		kiln_strbuf_init(&b);
		if (q->echo)
			kiln_strbuf_append(&b, q->echo);
		kiln_strbuf_append_n(&b, q->text.s ? q->text.s : "", q->text.len);
		json_array_append_new(ch,
				      j->chat ? chat_choice(j, i, false, b.s, b.len, q->finish)
					      : choice(i, b.s, b.len, q->out, q->n_out, q->finish));
	}
	_cleanup_json_ json_t *c = oom ? NULL : envelope(j, ch);
	if (oom)
		json_decref(ch);
	if (c && json_object_set_new(c, "usage", usage_json(j)) == 0)
		kiln_http_later_json(j->s, 200, c);
	else
		kiln_http_later_error(j->s, 500, NULL, NULL, NULL, "out of memory");
}

/* Engine callback (scheduler thread). */
static void on_event(void *ud, const kiln_engine_event *ev)
{
	seq *q = ud;
	job *j = q->j;
	pthread_mutex_lock(&j->lock);
	while (j->state == JOB_PENDING)
		pthread_cond_wait(&j->cond, &j->lock);
	bool failed = j->state == JOB_FAILED;
	pthread_mutex_unlock(&j->lock);
	const bool fin = ev->type == KILN_ENGINE_EVENT_FINISH;
	if (failed) {
		if (fin && --j->n_live == 0)
			job_free(j);
		return;
	}
	if (!fin) {
		if (q->stopped)
			return; /* tokens the cancel did not catch in time */
		if (q->n_out < q->cap)
			q->out[q->n_out++] = ev->token;
		j->n_gen_total++;
		if (q->dec) {
			const char *t;
			size_t len;
			if (ktok_stream_feed(q->dec, ev->token, &t, &len) >= 0)
				add_text(q, t, len);
		}
		if (j->stream)
			stream_text(q, &ev->token, 1, q->stopped ? "stop" : NULL);
		return;
	}
	if (ev->reason == KILN_ENGINE_FINISH_CANCELLED && !q->stopped) {
		log_debug("%s: cancelled", j->rid);
		j->cancelled = true;
	} else if (ev->reason == KILN_ENGINE_FINISH_ERROR) {
		snprintf(j->error, sizeof(j->error), "%s", ev->message);
	} else if (!q->stopped) {
		if (q->dec) {
			const char *t;
			size_t len;
			if (ktok_stream_flush(q->dec, &t, &len) >= 0)
				add_text(q, t, len);
		}
		if (!q->stopped)
			q->finish = ev->reason == KILN_ENGINE_FINISH_STOP ? "stop" : "length";
		q->done = true;
		if (j->stream && !j->cancelled && !j->error[0])
			stream_text(q, NULL, 0, q->finish);
	}
	if (--j->n_live == 0) {
		job_finish(j);
		job_free(j);
	}
}

/* HTTP cancel (server thread): the client left or the server is stopping. */
static void on_http_cancel(kiln_http_stream *s, void *ud)
{
	job *j = ud;
	for (int i = 0; i < j->n_seqs; i++)
		kiln_engine_cancel(j->a->engine, j->seqs[i].id);
}

/* One prompt given as token ids (where names it in errors). */
static int ids_prompt(const json_t *p, const char *where, int vocab, int32_t **ret, int *ret_n,
		      kiln_error *err)
{
	size_t n = json_array_size(p);
	if (n < 1 || n > INFERD_PROMPT_MAX)
		return kiln_json_fail(err, where, "expected 1 to %d token ids, got %zu",
				      INFERD_PROMPT_MAX, n);
	int32_t *ids = malloc(n * sizeof(int32_t));
	if (!ids)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(p, i);
		char at[KILN_JSON_PATH_MAX];
		kiln_json_path(at, sizeof(at), where, NULL, i);
		if (!json_is_integer(v)) {
			free(ids);
			return kiln_json_fail(err, at, "expected a token id, got %s",
					      kiln_json_type_name(v));
		}
		json_int_t t = json_integer_value(v);
		if (t < 0 || t >= vocab) {
			free(ids);
			return kiln_json_fail(err, at,
					      "token id %lld is outside the vocabulary (0..%d)",
					      (long long) t, vocab - 1);
		}
		ids[i] = (int32_t) t;
	}
	*ret = ids;
	*ret_n = (int) n;
	return 0;
}

static int need_tokenizer(const app *a, const char *where, kiln_error *err)
{
	if (a->tok)
		return 0;
	return kiln_json_fail(err, where,
			      "text needs a tokenizer and this server has none; restart "
			      "kiln-inferd with --tokenizer FILE, or send token ids");
}

/* One prompt given as text: encoded with BOS as the vocabulary says. */
static int text_prompt(const app *a, const char *text, unsigned flags, const char *where,
		       int32_t **ret, int *ret_n, kiln_error *err)
{
	int r = need_tokenizer(a, where, err);
	if (r < 0)
		return r;
	int32_t *ids = NULL;
	size_t n = 0;
	r = ktok_encode(a->tok, text, strlen(text), flags, &ids, &n);
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		return kiln_json_fail(err, where, "cannot tokenize the text: %s", strerror(-r));
	/* Templates carry their own BOS; the vocabulary may add one more. */
	if (n > 1 && ktok_bos(a->tok) >= 0 && ids[0] == ktok_bos(a->tok) &&
	    ids[1] == ktok_bos(a->tok))
		memmove(ids, ids + 1, --n * sizeof(int32_t));
	if (n < 1 || n > INFERD_PROMPT_MAX) {
		free(ids);
		return kiln_json_fail(err, where, "the text is %zu tokens, expected 1 to %d", n,
				      INFERD_PROMPT_MAX);
	}
	*ret = ids;
	*ret_n = (int) n;
	return 0;
}

/* A batch of prompts: malloc'd arrays in prompts[], their lengths. */
typedef struct batch {
	int n;
	int32_t *ids[INFERD_BATCH_MAX];
	int len[INFERD_BATCH_MAX];
} batch;

static void batch_free(batch *b)
{
	for (int i = 0; i < b->n; i++)
		free(b->ids[i]);
	b->n = 0;
}

/* "prompt": a string, an array of strings, an array of token ids, or an
 * array of arrays of token ids (OpenAI's four shapes). */
static int get_prompts(const app *a, const json_t *req, batch *b, kiln_error *err)
{
	json_t *p = json_object_get(req, "prompt");
	if (!p)
		return kiln_json_fail(err, "prompt", "required field is missing");
	if (json_is_string(p)) {
		b->n = 1;
		return text_prompt(a, json_string_value(p), KTOK_ENC_ADD_SPECIAL, "prompt",
				   &b->ids[0], &b->len[0], err);
	}
	if (!json_is_array(p) || json_array_size(p) == 0)
		return kiln_json_fail(err, "prompt",
				      "expected a string, an array of strings, an array of token "
				      "ids or an array of arrays of token ids, got %s",
				      json_is_array(p) ? "an empty array" : kiln_json_type_name(p));
	json_t *first = json_array_get(p, 0);
	if (json_is_integer(first)) {
		b->n = 1;
		return ids_prompt(p, "prompt", a->vocab, &b->ids[0], &b->len[0], err);
	}
	if (json_array_size(p) > INFERD_BATCH_MAX)
		return kiln_json_fail(err, "prompt", "at most %d prompts per request, got %zu",
				      INFERD_BATCH_MAX, json_array_size(p));
	for (size_t i = 0; i < json_array_size(p); i++) {
		json_t *v = json_array_get(p, i);
		char at[KILN_JSON_PATH_MAX];
		kiln_json_path(at, sizeof(at), "prompt", NULL, i);
		int r;
		if (json_is_string(v) && json_is_string(first))
			r = text_prompt(a, json_string_value(v), KTOK_ENC_ADD_SPECIAL, at,
					&b->ids[i], &b->len[i], err);
		else if (json_is_array(v) && json_is_array(first))
			r = ids_prompt(v, at, a->vocab, &b->ids[i], &b->len[i], err);
		else
			r = kiln_json_fail(err, at, "expected %s like prompt[0], got %s",
					   json_is_string(first) ? "a string" : "an array",
					   kiln_json_type_name(v));
		if (r < 0)
			return r;
		b->n = (int) i + 1;
	}
	return 0;
}

/* "messages": system/user/assistant with string content, rendered with the
 * chat template and the assistant's header (add_generation_prompt). */
static int get_messages(const app *a, const json_t *req, batch *b, kiln_error *err)
{
	static const char *const roles[] = { "system", "user", "assistant", NULL };
	static const char *const keys[] = { "role", "content", "name", NULL };
	json_t *arr = NULL;
	int r = kiln_json_get_objects(req, "", "messages", KILN_JSON_REQUIRED, 1,
				      KTOK_MAX_CHAT_MESSAGES, &arr, err);
	if (r < 0)
		return r;
	if ((r = need_tokenizer(a, "messages", err)) < 0)
		return r;
	size_t n = json_array_size(arr);
	_cleanup_free_ ktok_msg *msgs = calloc(n, sizeof(*msgs));
	if (!msgs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(arr, i);
		char at[KILN_JSON_PATH_MAX];
		kiln_json_path(at, sizeof(at), "messages", NULL, i);
		int role;
		const char *name = NULL;
		if ((r = kiln_json_check_keys(m, at, keys, err)) < 0 ||
		    (r = kiln_json_get_enum(m, at, "role", KILN_JSON_REQUIRED, roles, &role, err)) <
			    0 ||
		    (r = kiln_json_get_string(m, at, "name", 0, INFERD_NAME_MAX, &name, err)) < 0)
			return r;
		json_t *c = json_object_get(m, "content");
		if (!json_is_string(c)) {
			char f[KILN_JSON_PATH_MAX];
			kiln_json_path(f, sizeof(f), at, "content", 0);
			return kiln_json_fail(err, f,
					      "expected a string, got %s (this server takes text "
					      "content only, not content parts)",
					      c ? kiln_json_type_name(c) : "nothing");
		}
		msgs[i] = (ktok_msg){ .role = roles[role], .content = json_string_value(c) };
	}
	_cleanup_free_ char *text = NULL;
	r = ktok_chat_render(a->chat, msgs, n, true, a->bos, a->eos, &text);
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		return kiln_json_fail(err, "messages",
				      "the %s chat template cannot render these messages (%s); "
				      "check the roles and their order",
				      ktok_chat_name(a->chat), strerror(-r));
	b->n = 1;
	return text_prompt(a, text, KTOK_ENC_ADD_SPECIAL | KTOK_ENC_PARSE_SPECIAL, "messages",
			   &b->ids[0], &b->len[0], err);
}

/* "stop_token_ids" (vLLM's extension): an array of token ids. */
static int get_stop(const json_t *req, int vocab, int32_t *stop, int *ret_n, kiln_error *err)
{
	json_t *p = json_object_get(req, "stop_token_ids");
	*ret_n = 0;
	if (!p || json_is_null(p))
		return 0;
	if (!json_is_array(p) || json_array_size(p) > KILN_ENGINE_STOP_MAX)
		return kiln_json_fail(err, "stop_token_ids", "expected at most %d token ids",
				      KILN_ENGINE_STOP_MAX);
	for (size_t i = 0; i < json_array_size(p); i++) {
		json_t *v = json_array_get(p, i);
		char where[KILN_JSON_PATH_MAX];
		kiln_json_path(where, sizeof(where), "stop_token_ids", NULL, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= vocab)
			return kiln_json_fail(err, where, "expected a token id in 0..%d",
					      vocab - 1);
		stop[i] = (int32_t) json_integer_value(v);
	}
	*ret_n = (int) json_array_size(p);
	return 0;
}

/* "stop": a string or up to 4 non-empty strings, copied into *ret. */
static int get_stop_strings(const app *a, const json_t *req, char ***ret, size_t *ret_max,
			    kiln_error *err)
{
	json_t *p = json_object_get(req, "stop");
	if (!p || json_is_null(p) || (json_is_array(p) && json_array_size(p) == 0))
		return 0;
	_cleanup_free_ const char **v = NULL;
	int r = kiln_json_get_strings(req, "", "stop", 0, 1, INFERD_STOP_STRINGS_MAX,
				      INFERD_STOP_LEN_MAX, &v, err);
	if (r < 0)
		return r;
	if ((r = need_tokenizer(a, "stop", err)) < 0)
		return r;
	_cleanup_strv_free_ char **out = NULL;
	size_t max = 1;
	for (size_t i = 0; v[i]; i++) {
		if (!v[i][0]) {
			char at[KILN_JSON_PATH_MAX];
			kiln_json_path(at, sizeof(at), "stop", NULL, i);
			return kiln_json_fail(err, json_is_string(p) ? "stop" : at,
					      "a stop string must not be empty");
		}
		if (strv_extend(&out, v[i]) < 0)
			return -ENOMEM;
		max = MAX(max, strlen(v[i]));
	}
	*ret = TAKE_PTR(out);
	*ret_max = max;
	return 0;
}

static int submit(kiln_http_request *r, app *a, const json_t *req, bool chat)
{
	kiln_error err;
	static const char *const known_cmpl[] = {
		"model", "prompt",	   "max_tokens",     "temperature",
		"top_p", "top_k",	   "seed",	     "stream",
		"n",	 "stop_token_ids", "ignore_eos",     "user",
		"stop",	 "echo",	   "stream_options", NULL
	};
	static const char *const known_chat[] = {
		"model",       "messages", "max_tokens",     "max_completion_tokens",
		"temperature", "top_p",	   "top_k",	     "seed",
		"stream",      "n",	   "stop_token_ids", "ignore_eos",
		"user",	       "stop",	   "stream_options", NULL
	};
	static const char *const known_so[] = { "include_usage", NULL };
	const char *model = NULL;
	int64_t max_tokens = chat ? INFERD_MAX_TOKENS_MAX : 16, top_k = 0, seed = -1, n = 1;
	double temperature = 1.0, top_p = 1.0;
	bool stream = false, ignore_eos = false, echo = false, include_usage = false;
	int32_t stop[KILN_ENGINE_STOP_MAX];
	int n_stop = 0;
	json_t *so = NULL;
	if (kiln_json_check_keys(req, "", chat ? known_chat : known_cmpl, &err) < 0 ||
	    kiln_json_get_string(req, "", "model", KILN_JSON_REQUIRED, INFERD_NAME_MAX, &model,
				 &err) < 0 ||
	    kiln_json_get_int(req, "", "max_tokens", 0, 1, INFERD_MAX_TOKENS_MAX, &max_tokens,
			      &err) < 0 ||
	    (chat && kiln_json_get_int(req, "", "max_completion_tokens", 0, 1,
				       INFERD_MAX_TOKENS_MAX, &max_tokens, &err) < 0) ||
	    kiln_json_get_number(req, "", "temperature", 0, 0, 2, &temperature, &err) < 0 ||
	    kiln_json_get_number(req, "", "top_p", 0, 0, 1, &top_p, &err) < 0 ||
	    kiln_json_get_int(req, "", "top_k", 0, 0, KK_SAMPLE_TOP_K_MAX, &top_k, &err) < 0 ||
	    kiln_json_get_int(req, "", "seed", 0, 0, INT64_MAX, &seed, &err) < 0 ||
	    kiln_json_get_int(req, "", "n", 0, 1, 1, &n, &err) < 0 ||
	    kiln_json_get_bool(req, "", "stream", 0, &stream, &err) < 0 ||
	    kiln_json_get_bool(req, "", "echo", 0, &echo, &err) < 0 ||
	    kiln_json_get_bool(req, "", "ignore_eos", 0, &ignore_eos, &err) < 0 ||
	    kiln_json_get_object(req, "", "stream_options", 0, &so, &err) < 0 ||
	    (so && (kiln_json_check_keys(so, "stream_options", known_so, &err) < 0 ||
		    kiln_json_get_bool(so, "stream_options", "include_usage", 0, &include_usage,
				       &err) < 0)) ||
	    get_stop(req, a->vocab, stop, &n_stop, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	if (!streq(model, a->name))
		return kiln_http_reply_error(r, 404, NULL, "model", "model_not_found",
					     "The model '%s' does not exist (this server has '%s')",
					     model, a->name);
	_cleanup_strv_free_ char **stops = NULL;
	size_t stop_max = 0;
	int q = get_stop_strings(a, req, &stops, &stop_max, &err);
	if (q == -ENOMEM)
		return q;
	if (q < 0)
		return kiln_http_reply_json_error(r, &err);
	if (echo && !a->tok) {
		need_tokenizer(a, "echo", &err);
		return kiln_http_reply_json_error(r, &err);
	}
	_cleanup_(batch_free) batch b = { 0 };
	q = chat ? get_messages(a, req, &b, &err) : get_prompts(a, req, &b, &err);
	if (q == -ENOMEM)
		return q;
	if (q < 0)
		return kiln_http_reply_json_error(r, &err);
	for (int i = 0; i < b.n; i++)
		if (b.len[i] > a->ctx)
			return kiln_http_reply_error(
				r, 400, NULL, chat ? "messages" : "prompt",
				"context_length_exceeded",
				"The %s%s is %d tokens, more than the model's context of %d "
				"tokens; shorten it",
				chat ? "rendered chat" : "prompt", b.n > 1 ? " in a batch" : "",
				b.len[i], a->ctx);

	job *j = calloc(1, sizeof(*j) + (size_t) b.n * sizeof(seq));
	if (!j)
		return -ENOMEM;
	j->a = a;
	snprintf(j->rid, sizeof(j->rid), "%s-%s", chat ? "chatcmpl" : "cmpl",
		 kiln_http_request_id(r));
	j->stream = stream;
	j->chat = chat;
	j->include_usage = include_usage;
	j->stops = TAKE_PTR(stops);
	j->stop_max = stop_max;
	j->n_seqs = b.n;
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->cond, NULL);
	for (int i = 0; i < b.n; i++) {
		seq *s = &j->seqs[i];
		s->j = j;
		s->index = i;
		s->first = true;
		s->n_prompt = b.len[i];
		kiln_strbuf_init(&s->text);
		s->cap = (int) MIN(max_tokens, (int64_t) a->ctx + 1);
		j->n_prompt_total += b.len[i];
		if (!(s->out = malloc((size_t) s->cap * sizeof(int32_t))) ||
		    (a->tok && ktok_stream_new(a->tok, KTOK_DEC_SKIP_SPECIAL, &s->dec) < 0) ||
		    (echo && ktok_decode(a->tok, b.ids[i], (size_t) b.len[i], KTOK_DEC_SKIP_SPECIAL,
					 &s->echo, NULL) < 0)) {
			job_free(j);
			return -ENOMEM;
		}
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	int n_sub = 0;
	uint64_t ids[INFERD_BATCH_MAX]; /* j may be gone once its state is set */
	kiln_error kerr;
	for (; n_sub < b.n; n_sub++) {
		seq *s = &j->seqs[n_sub];
		s->id = atomic_fetch_add(&a->next_id, 1);
		kiln_engine_request er = {
			.id = s->id,
			.prompt = b.ids[n_sub],
			.n_prompt = b.len[n_sub],
			.max_tokens = (int) max_tokens,
			.sampling = { .temperature = (float) temperature,
				      .top_k = (int) top_k,
				      .top_p = (float) top_p,
				      /* no seed: a fresh one per request */
				      .seed = seed >= 0 ? (uint64_t) seed
							: (uint64_t) now.tv_nsec *
									  0x9E3779B97F4A7C15u ^
								  s->id },
			.stop = stop,
			.n_stop = n_stop,
			.ignore_eos = ignore_eos,
			.cb = on_event,
			.userdata = s,
		};
		if ((q = kiln_engine_submit(a->engine, &er, &kerr)) < 0)
			break;
		ids[n_sub] = s->id;
		j->n_live++;
	}
	bool ok = q >= 0;
	if (q >= 0)
		q = stream ? kiln_http_reply_sse(r, on_http_cancel, j, &j->s)
			   : kiln_http_reply_later(r, on_http_cancel, j, &j->s);
	else if (q == -EAGAIN)
		q = kiln_http_reply_retry(r, 429, 1, "overloaded", "%s", kerr.msg);
	else if (q == -ESHUTDOWN)
		q = kiln_http_reply_retry(r, 503, 0, NULL, "%s", kerr.msg);
	else if (q == -E2BIG || q == -EINVAL)
		q = kiln_http_reply_error(r, 400, NULL, chat ? "messages" : "prompt", NULL, "%s",
					  kerr.msg);
	else
		q = q < 0 ? q : -EIO;
	if (n_sub == 0) { /* the engine took nothing */
		job_free(j);
		return q;
	}
	ok = ok && q >= 0;
	pthread_mutex_lock(&j->lock);
	j->state = ok ? JOB_READY : JOB_FAILED;
	pthread_cond_broadcast(&j->cond);
	pthread_mutex_unlock(&j->lock);
	/* No reply channel: the callbacks free j at the last finish. */
	for (int i = 0; !ok && i < n_sub; i++)
		kiln_engine_cancel(a->engine, ids[i]);
	return q;
}

static int on_completions(kiln_http_request *r, void *u)
{
	kiln_error err;
	_cleanup_json_ json_t *req = NULL;
	if (kiln_http_request_json(r, &req, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	return submit(r, u, req, false);
}

static int on_chat(kiln_http_request *r, void *u)
{
	kiln_error err;
	_cleanup_json_ json_t *req = NULL;
	if (kiln_http_request_json(r, &req, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	return submit(r, u, req, true);
}

static int on_models(kiln_http_request *r, void *u)
{
	app *a = u;
	_cleanup_json_ json_t *o =
		json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
			  a->name, "object", "model", "created", (json_int_t) a->started,
			  "owned_by", "kiln", "max_model_len", a->ctx);
	if (!o)
		return -ENOMEM;
	return kiln_http_reply_json(r, 200, o);
}

static int on_metrics(kiln_http_request *r, void *u)
{
	app *a = u;
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;
	kiln_metrics_init(&m, &b);
	kiln_engine_metrics(a->engine, &m);
	int q = kiln_metrics_finish(&m);
	if (q < 0)
		return q;
	return kiln_http_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.s, b.len);
}

static int on_health(kiln_http_request *r, void *u)
{
	return kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", "ok\n", 3);
}

static void help(void)
{
	printf("Usage: kiln-inferd --model FILE [--tokenizer FILE] [OPTIONS]\n"
	       "\n"
	       "OpenAI-compatible completions and chat completions on the kiln inference\n"
	       "engine.  Serves POST /v1/completions (text or token-id prompts), POST\n"
	       "/v1/chat/completions (\"stream\": true for SSE on both), GET /v1/models,\n"
	       "GET /metrics and GET /health.  Without a tokenizer: token ids only.\n"
	       "\n"
	       "  -m, --model FILE          model: llama2.c, safetensors (kiln-train's, or "
	       "Hugging\n"
	       "                            Face with config.json beside it), GGUF llama "
	       "(required)\n"
	       "      --name NAME           model name in the API (default: the file's base name)\n"
	       "  -l, --listen ADDR         address to listen on (default 127.0.0.1)\n"
	       "  -p, --port N              port (default 8000; 0: an ephemeral one, logged)\n"
	       "      --backend NAME        kk backend: cpu or cuda (default cpu)\n"
	       "      --dtype NAME          weights: f32, bf16, f16, i8 or q4 (default f32)\n"
	       "      --max-running N       sequences per step (default 64)\n"
	       "      --max-step-tokens N   tokens per step (default 512)\n"
	       "      --kv-blocks N         KV cache blocks of 16 tokens (default 1024)\n"
	       "      --max-waiting N       queued requests before 429 (default 1024)\n"
	       "      --eos ID              end-of-sequence token, -1 for none (default 2)\n"
	       "      --prefix-caching      share prompt-prefix KV blocks between requests\n"
	       "      --threads N           HTTP worker threads (default 4)\n"
	       "      --tokenizer FILE      tokenizer for text prompts and replies: GGUF,\n"
	       "                            tokenizer.json or llama2.c tokenizer.bin (default:\n"
	       "                            the model's own when --model is a GGUF holding one)\n"
	       "      --chat-template NAME  chatml, llama2, llama3, mistral, gemma, phi3 or\n"
	       "                            zephyr (default: detected from the tokenizer's\n"
	       "                            template, else chatml)\n"
	       "  -v, --verbose             more logging\n"
	       "  -q, --quiet               less logging\n"
	       "  -h, --help                this help\n"
	       "      --version             the version\n");
}

enum {
	OPT_NAME = 256,
	OPT_BACKEND,
	OPT_DTYPE,
	OPT_RUNNING,
	OPT_STEP,
	OPT_BLOCKS,
	OPT_WAITING,
	OPT_EOS,
	OPT_PREFIX,
	OPT_THREADS,
	OPT_TOKENIZER,
	OPT_CHAT_TEMPLATE,
	OPT_VERSION,
};

/* 0 to run, 1 to exit 0 (help/version), -EINVAL for a usage error. */
static int parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "name", required_argument, NULL, OPT_NAME },
		{ "listen", required_argument, NULL, 'l' },
		{ "port", required_argument, NULL, 'p' },
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "dtype", required_argument, NULL, OPT_DTYPE },
		{ "max-running", required_argument, NULL, OPT_RUNNING },
		{ "max-step-tokens", required_argument, NULL, OPT_STEP },
		{ "kv-blocks", required_argument, NULL, OPT_BLOCKS },
		{ "max-waiting", required_argument, NULL, OPT_WAITING },
		{ "eos", required_argument, NULL, OPT_EOS },
		{ "prefix-caching", no_argument, NULL, OPT_PREFIX },
		{ "threads", required_argument, NULL, OPT_THREADS },
		{ "tokenizer", required_argument, NULL, OPT_TOKENIZER },
		{ "chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, OPT_VERSION },
		{},
	};
	int c;
	while ((c = getopt_long(argc, argv, "m:l:p:vqh", opts, NULL)) >= 0) {
		int r = 0;
		switch (c) {
		case 'm':
			arg.model = optarg;
			break;
		case OPT_NAME:
			arg.name = optarg;
			break;
		case 'l':
			arg.listen = optarg;
			break;
		case 'p':
			r = kiln_parse_int(optarg, 0, 65535, &arg.port);
			break;
		case OPT_BACKEND:
			arg.backend = optarg;
			break;
		case OPT_DTYPE:
			arg.dtype = optarg;
			break;
		case OPT_RUNNING:
			r = kiln_parse_int(optarg, 1, KM_KV_SEQS_MAX, &arg.max_running);
			break;
		case OPT_STEP:
			r = kiln_parse_int(optarg, 1, 1 << 20, &arg.max_step);
			break;
		case OPT_BLOCKS:
			r = kiln_parse_int(optarg, 1, KM_KV_BLOCKS_MAX, &arg.blocks);
			break;
		case OPT_WAITING:
			r = kiln_parse_int(optarg, 1, KILN_ENGINE_WAITING_MAX, &arg.max_waiting);
			break;
		case OPT_EOS:
			r = kiln_parse_int(optarg, -1, KM_VOCAB_MAX, &arg.eos);
			break;
		case OPT_PREFIX:
			arg.prefix = true;
			break;
		case OPT_THREADS:
			r = kiln_parse_int(optarg, 1, 256, &arg.threads);
			break;
		case OPT_TOKENIZER:
			arg.tokenizer = optarg;
			break;
		case OPT_CHAT_TEMPLATE:
			arg.chat_template = optarg;
			break;
		case 'v':
			log_adjust_level(+1);
			break;
		case 'q':
			log_adjust_level(-1);
			break;
		case 'h':
			help();
			return 1;
		case OPT_VERSION:
			printf("kiln-inferd %s\n", KILN_VERSION);
			return 1;
		default:
			return -EINVAL;
		}
		if (r < 0)
			return log_error_errno(r, "Invalid value '%s' for --%s; see --help", optarg,
					       c == 'p' ? "port" : "an option");
	}
	if (optind < argc)
		return log_error_errno(-EINVAL, "Unexpected argument '%s'; see --help",
				       argv[optind]);
	if (!arg.model)
		return log_error_errno(-EINVAL, "--model FILE is required; see --help");
	return 0;
}

static int parse_dtype(const char *s, kk_dtype *ret)
{
	static const struct {
		const char *name;
		kk_dtype dt;
	} t[] = { { "f32", KK_F32 },
		  { "bf16", KK_BF16 },
		  { "f16", KK_F16 },
		  { "i8", KK_I8 },
		  { "q4", KK_Q4 } };
	for (size_t i = 0; i < ARRAY_SIZE(t); i++)
		if (streq(s, t[i].name)) {
			*ret = t[i].dt;
			return 0;
		}
	return -EINVAL;
}

/* Copies token id's text into buf (NUL-terminated); false when the
 * vocabulary has no such token. */
static bool token_text(const ktok *t, int32_t id, char *buf, size_t size)
{
	size_t len = 0;
	const char *s = id >= 0 ? ktok_token_text(t, id, &len) : NULL;
	if (!s || len >= size)
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	return true;
}

/* The tokenizer: --tokenizer FILE, else the model's own when the model is
 * a GGUF file with tokenizer.ggml.* metadata, else none (token ids only).
 * Then the chat template: --chat-template, else the one the tokenizer's
 * chat_template string is recognised as, else ChatML.  Returns 0 or the
 * exit code: 1 (an unreadable tokenizer), EXIT_USAGE (a tokenizer that
 * does not fit the model). */
static int load_tokenizer(app *a, int chat)
{
	kiln_error te = {};
	char buf[sizeof(te.file) + sizeof(te.msg) + 4];
	const char *path = arg.tokenizer;
	if (!path) {
		char magic[4] = { 0 };
		/* Plain fclose: cppcheck cannot see cleanup attributes. */
		FILE *fp = fopen(arg.model, "re");
		size_t got = fp ? fread(magic, 1, 4, fp) : 0;
		if (fp)
			fclose(fp);
		if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
			log_notice("No --tokenizer: prompts and replies are token ids only");
			return 0;
		}
		path = arg.model;
	}
	int r = ktok_load(path, &a->tok, &te);
	if (r < 0 && !arg.tokenizer) {
		log_notice("%s holds no usable tokenizer (%s): prompts and replies are token ids "
			   "only; pass --tokenizer FILE for text",
			   path, kiln_error_format(&te, buf, sizeof(buf)));
		return 0;
	}
	if (r < 0) {
		log_error("--tokenizer: %s", kiln_error_format(&te, buf, sizeof(buf)));
		return 1;
	}
	if (ktok_n_vocab(a->tok) > (uint32_t) a->vocab) {
		log_error("%s has %u tokens but the model %s only %d: they do not belong together "
			  "(the model could never produce, or read, the extra ids); pass the "
			  "model's own tokenizer",
			  path, ktok_n_vocab(a->tok), arg.model, a->vocab);
		return EXIT_USAGE;
	}
	if (!token_text(a->tok, ktok_bos(a->tok), a->bos, sizeof(a->bos)))
		snprintf(a->bos, sizeof(a->bos), "<s>");
	if (!token_text(a->tok, ktok_eos(a->tok), a->eos, sizeof(a->eos)))
		snprintf(a->eos, sizeof(a->eos), "</s>");
	const char *tmpl = ktok_chat_template(a->tok);
	if (chat >= 0) {
		a->chat = (ktok_chat) chat;
	} else if (tmpl && (r = ktok_chat_detect(tmpl)) >= 0) {
		a->chat = (ktok_chat) r;
	} else {
		a->chat = KTOK_CHAT_CHATML;
		log_notice("%s: %s; chat completions use ChatML (choose another with "
			   "--chat-template)",
			   path,
			   tmpl ? "its chat template is not one kiln knows" : "no chat template");
	}
	log_info("Tokenizer %s: %u tokens, chat template %s", path, ktok_n_vocab(a->tok),
		 ktok_chat_name(a->chat));
	return 0;
}

/* Returns the exit code: 0, 1 (failure) or EXIT_USAGE. */
static int run(int argc, char **argv)
{
	int r = parse_args(argc, argv);
	if (r != 0)
		return r > 0 ? 0 : EXIT_USAGE;
	kk_dtype dt;
	if (parse_dtype(arg.dtype, &dt) < 0) {
		log_error("--dtype %s: expected f32, bf16, f16, i8 or q4", arg.dtype);
		return EXIT_USAGE;
	}
	int chat = -1;
	if (arg.chat_template && (chat = ktok_chat_from_name(arg.chat_template)) < 0) {
		log_error("--chat-template %s: expected chatml, llama2, llama3, mistral, gemma, "
			  "phi3 or zephyr",
			  arg.chat_template);
		return EXIT_USAGE;
	}
	/* Signals are taken by sigwait below; block them before any thread. */
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	pthread_sigmask(SIG_BLOCK, &ss, NULL);

	app a = { .started = time(NULL) };
	atomic_init(&a.next_id, 1);
	const char *slash = strrchr(arg.model, '/');
	snprintf(a.name, sizeof(a.name), "%s", arg.name ? arg.name : slash ? slash + 1 : arg.model);

	kk_backend *be = NULL;
	r = kk_backend_open(arg.backend, &be);
	if (r < 0) {
		log_error_errno(r, "Failed to open the %s backend: %m", arg.backend);
		return 1;
	}
	kiln_error err = {};
	km_file *f = NULL;
	r = km_file_open(arg.model, &f, &err);
	if (r < 0) {
		log_error("%s", err.msg);
		kk_backend_free(be);
		return 1;
	}
	km_weight_source src = km_file_source(f);
	kiln_engine_opts o = { .weight_dtype = dt,
			       .max_running = arg.max_running,
			       .max_step_tokens = arg.max_step,
			       .num_blocks = arg.blocks,
			       .max_waiting = arg.max_waiting,
			       .eos_token = arg.eos,
			       .prefix_caching = arg.prefix };
	a.vocab = km_file_config(f)->vocab_size;
	a.ctx = km_file_config(f)->max_seq_len;
	if ((r = load_tokenizer(&a, chat)) != 0) {
		ktok_free(a.tok);
		km_file_free(f);
		kk_backend_free(be);
		return r;
	}
	r = kiln_engine_new(be, km_file_config(f), &src, &o, &a.engine, &err);
	km_file_free(f);
	if (r < 0) {
		log_error("%s: %s", arg.model, err.msg);
		ktok_free(a.tok);
		kk_backend_free(be);
		return 1;
	}

	const kiln_http_route routes[] = {
		{ "POST", "/v1/completions", false, on_completions, &a },
		{ "POST", "/v1/chat/completions", false, on_chat, &a },
		{ "GET", "/v1/models", false, on_models, &a },
		{ "GET", "/metrics", false, on_metrics, &a },
		{ "GET", "/health", false, on_health, &a },
	};
	kiln_http_config hc = { .address = arg.listen,
				.port = (uint16_t) arg.port,
				.threads = (unsigned) arg.threads,
				.routes = routes,
				.n_routes = ARRAY_SIZE(routes) };
	kiln_http_server *srv = NULL;
	r = kiln_http_server_start(&hc, &srv);
	if (r < 0) {
		log_error_errno(r, "Failed to listen on %s:%d: %m", arg.listen, arg.port);
		kiln_engine_free(a.engine);
		ktok_free(a.tok);
		kk_backend_free(be);
		return 1;
	}
	log_info("Serving %s on http://%s:%u (%s, %s, %d KV blocks)", a.name, arg.listen,
		 kiln_http_server_port(srv), arg.backend, arg.dtype, arg.blocks);
	int sig = 0;
	sigwait(&ss, &sig);
	log_info("Got %s, stopping", strsignal(sig));
	/* The server first: its streams are cancelled and no new request
	 * reaches the engine; then the engine cancels what is left (every
	 * job's finish callback closes its stream and frees it). */
	kiln_http_server_free(srv);
	kiln_engine_shutdown(a.engine, KILN_ENGINE_CANCEL);
	kiln_engine_free(a.engine);
	ktok_free(a.tok); /* after the engine: its last callbacks decode */
	kk_backend_free(be);
	return 0;
}

int main(int argc, char **argv)
{
	return run(argc, argv);
}
