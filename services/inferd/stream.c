/* stream.c — kiln-inferd's streaming and stop-string layer: one HTTP
 * request's life on the engine.
 *
 * A validated request (openai.c) becomes a job: one engine request per
 * choice (a "seq": each prompt n times), all answering one HTTP reply.
 * With logprobs, each seq keeps its tokens' log-probabilities and
 * alternatives from the engine's events and puts them in its choice (in
 * the event of the token that brought them, when streaming); with echo
 * too, the prompt's (the engine's PROMPT events; the first token's null)
 * come first, in the first event.  Tokens arrive on the
 * engine's scheduler thread; each seq decodes them as they come
 * (ktok_stream: complete UTF-8 only) so stop strings are found in the text
 * even when split across tokens, cut, and never returned.  Streamed, a seq
 * sends what no stop string can still claim (the last longest-stop - 1
 * bytes wait, backed off to a character boundary), so the events' texts
 * join to exactly the non-streamed text.  The last finish sends the usage
 * chunk or the whole reply and frees the job. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "inferd.h"
#include "kiln/log.h"
#include "kiln/strbuf.h"

size_t inferd_stop_cut(const char *text, size_t len, size_t old_len, char *const *stops,
		       size_t stop_max)
{
	/* Only matches that end in the new bytes are new. */
	size_t from = old_len > stop_max ? old_len - stop_max : 0, cut = SIZE_MAX;
	for (char *const *s = stops; s && *s; s++) {
		const char *m = memmem(text + from, len - from, *s, strlen(*s));
		if (m && (size_t) (m - text) < cut)
			cut = (size_t) (m - text);
	}
	return cut;
}

size_t inferd_sendable(const char *text, size_t len, size_t sent, size_t stop_max, bool hold)
{
	size_t n = len;
	if (!hold)
		return n;
	n = n > stop_max - 1 ? n - (stop_max - 1) : 0;
	while (n > sent && ((unsigned char) text[n] & 0xC0) == 0x80)
		n--;
	return MAX(n, sent);
}

typedef struct job job;

/* One choice: one sample of one prompt, one engine request.  Its text is decoded as the
 * tokens come so stop strings can be found in it; a streamed choice sends
 * what no stop string can still claim. */
typedef struct seq {
	job *j;
	int index;
	uint64_t id;
	int n_prompt;
	int32_t *out; /* the tokens so far (token_ids) */
	int n_out, cap;
	/* logprobs: out's, and top alternatives per token (job's n_top) */
	float *lp;
	int32_t *top_ids;
	float *top_lp;
	int n_lp_sent;	  /* tokens whose logprobs are streamed */
	size_t lp_offset; /* completions' text_offset so far */
	/* echo with logprobs: the prompt's tokens, their logprobs (NaN: none
	 * yet, or the first) and alternatives, and where each token's text
	 * starts in the echoed text */
	int32_t *ptok;
	float *plp;
	int32_t *ptop_ids;
	float *ptop_lp;
	size_t *poff;
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
	inferd_app *a;
	char rid[80]; /* "cmpl-" / "chatcmpl-" + the HTTP request id */
	bool stream, chat, include_usage;
	bool logprobs;
	int n_top;
	int min_tokens;	 /* stop strings count only from this many tokens on (vLLM) */
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
		free(j->seqs[i].lp);
		free(j->seqs[i].top_ids);
		free(j->seqs[i].top_lp);
		free(j->seqs[i].ptok);
		free(j->seqs[i].plp);
		free(j->seqs[i].ptop_ids);
		free(j->seqs[i].ptop_lp);
		free(j->seqs[i].poff);
		free(j->seqs[i].echo);
		ktok_stream_free(j->seqs[i].dec);
		kiln_strbuf_free(&j->seqs[i].text);
	}
	strv_free(j->stops);
	free(j);
}

static json_t *envelope(const job *j, json_t *choices)
{
	return inferd_envelope_json(j->rid, j->chat, j->stream, j->a->model.name, time(NULL),
				    choices);
}

/* The echoed prompt's logprobs (completions' shape), text_offset where
 * each token starts in the echoed text; q->lp_offset goes past it. */
static json_t *prompt_logprobs(job *j, seq *q)
{
	size_t off = 0;
	json_t *lp = inferd_logprobs_json(&j->a->model, false, q->ptok, q->plp, q->ptop_ids,
					  q->ptop_lp, j->n_top, q->n_prompt, &off);
	json_t *offs = json_array();
	for (int i = 0; offs && i < q->n_prompt; i++)
		json_array_append_new(offs, json_integer((json_int_t) q->poff[i]));
	if (lp)
		json_object_set_new(lp, "text_offset", offs);
	else
		json_decref(offs);
	q->lp_offset = strlen(q->echo);
	return lp;
}

/* The logprobs of q's tokens [from, to), after the prompt's when
 * with_prompt (NULL when not asked). */
static json_t *seq_logprobs(job *j, seq *q, int from, int to, bool with_prompt)
{
	if (!j->logprobs)
		return NULL;
	json_t *p = with_prompt && q->ptok ? prompt_logprobs(j, q) : NULL;
	json_t *lp = inferd_logprobs_json(&j->a->model, j->chat, q->out + from, q->lp + from,
					  q->top_ids + (size_t) from * j->n_top,
					  q->top_lp + (size_t) from * j->n_top, j->n_top, to - from,
					  &q->lp_offset);
	if (!p || !lp) {
		json_decref(p);
		return lp;
	}
	const char *key;
	json_t *v;
	json_object_foreach(p, key, v)
	{
		json_array_extend(v, json_object_get(lp, key));
	}
	json_decref(lp);
	return p;
}

/* Sets a choice's "logprobs" (lp stolen; NULL: left null). */
static json_t *with_logprobs(json_t *choice, json_t *lp)
{
	if (choice && lp)
		json_object_set_new(choice, "logprobs", lp);
	else
		json_decref(lp);
	return choice;
}

/* Sends one streamed event; a client 64 KiB behind, or gone, loses its
 * request (never block the batch on one client). */
static void send_event(job *j, json_t *c)
{
	_cleanup_json_ json_t *e = c;
	int r = e ? inferd_sse_send_json(j->s, e, 0) : -ENOMEM;
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
	if (!j->stops || q->n_out < j->min_tokens)
		return;
	size_t cut = inferd_stop_cut(q->text.s, q->text.len, old, j->stops, j->stop_max);
	if (cut == SIZE_MAX)
		return;
	q->text.len = cut;
	q->text.s[cut] = '\0';
	q->done = q->stopped = true;
	q->finish = "stop";
	kiln_engine_stop(j->a->engine, q->id); /* counted as a stop, not a cancel */
}

static void stream_text(seq *q, const int32_t *tok, int n_tok, const char *finish)
{
	job *j = q->j;
	size_t end =
		inferd_sendable(q->text.s, q->text.len, q->sent, j->stop_max, !q->done && j->stops);
	const char *t = q->text.s ? q->text.s + q->sent : "";
	size_t len = end - q->sent;
	/* The tokens' logprobs go with the event of the token that brought
	 * them, whether or not its text is held back. */
	const bool with_prompt = q->first && q->ptok;
	json_t *lp = q->n_lp_sent < q->n_out || with_prompt
			     ? seq_logprobs(j, q, q->n_lp_sent, q->n_out, with_prompt)
			     : NULL;
	q->n_lp_sent = q->n_out;
	if (j->chat) {
		/* OpenAI's order: the role alone, then content deltas. */
		if (q->first)
			send_event(j, envelope(j, inferd_chat_choice_json(true, q->index, true, "",
									  0, NULL)));
		if (len || lp)
			send_event(j, envelope(j, with_logprobs(inferd_chat_choice_json(
									true, q->index, false, t,
									len, NULL),
								lp)));
		if (finish)
			send_event(j, envelope(j, inferd_chat_choice_json(true, q->index, false, "",
									  0, finish)));
	} else {
		_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
		kiln_strbuf_init(&b);
		if (q->first && q->echo)
			kiln_strbuf_append(&b, q->echo);
		kiln_strbuf_append_n(&b, t, len);
		send_event(j, envelope(j, with_logprobs(inferd_choice_json(q->index, b.s, b.len,
									   tok, n_tok, finish),
							lp)));
	}
	q->first = false;
	q->sent = end;
}

/* The last finish: the reply, then the job goes. */
static void job_finish(job *j)
{
	if (j->cancelled) {
		inferd_sse_close(j->s, false);
		return;
	}
	if (j->error[0]) {
		log_error("%s: generation failed: %s", j->rid, j->error);
		if (j->stream)
			inferd_sse_close(j->s, false);
		else
			kiln_http_later_error(j->s, 500, NULL, NULL, NULL, "Generation failed: %s",
					      j->error);
		return;
	}
	if (j->stream) {
		if (j->include_usage) {
			json_t *c = envelope(j, NULL);
			if (c)
				json_object_set_new(
					c, "usage",
					inferd_usage_json(j->n_prompt_total, j->n_gen_total));
			send_event(j, c);
		}
		inferd_sse_close(j->s, true);
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
		json_array_append_new(
			ch, with_logprobs(j->chat ? inferd_chat_choice_json(false, i, false, b.s,
									    b.len, q->finish)
						  : inferd_choice_json(i, b.s, b.len, q->out,
								       q->n_out, q->finish),
					  seq_logprobs(j, q, 0, q->n_out, true)));
	}
	_cleanup_json_ json_t *c = oom ? NULL : envelope(j, ch);
	if (oom)
		json_decref(ch);
	if (c && json_object_set_new(c, "usage",
				     inferd_usage_json(j->n_prompt_total, j->n_gen_total)) == 0)
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
	if (ev->type == KILN_ENGINE_EVENT_PROMPT) {
		if (q->ptok && ev->index > 0 && ev->index < q->n_prompt) {
			q->plp[ev->index] = ev->logprob;
			for (int k = 0; k < j->n_top; k++) {
				size_t at = (size_t) ev->index * j->n_top + k;
				q->ptop_ids[at] = k < ev->n_top ? ev->top_ids[k] : ev->token;
				q->ptop_lp[at] = k < ev->n_top ? ev->top_logprobs[k] : ev->logprob;
			}
		}
		return;
	}
	if (!fin) {
		if (q->stopped)
			return; /* tokens the cancel did not catch in time */
		if (q->n_out < q->cap) {
			if (j->logprobs) {
				q->lp[q->n_out] = ev->logprob;
				for (int k = 0; k < j->n_top; k++) {
					size_t at = (size_t) q->n_out * j->n_top + k;
					q->top_ids[at] = k < ev->n_top ? ev->top_ids[k] : ev->token;
					q->top_lp[at] =
						k < ev->n_top ? ev->top_logprobs[k] : ev->logprob;
				}
			}
			q->out[q->n_out++] = ev->token;
		}
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

/* echo with logprobs: s's prompt (its n_prompt tokens), room for their
 * logprobs (NaN until the engine's PROMPT events; the first stays NaN:
 * null) and n_top alternatives, and where each token's text starts in the
 * echoed text (the same decoder as the echo, token by token). */
static int echo_logprobs_new(seq *s, const inferd_model *m, const int32_t *prompt, int n_top)
{
	const size_t n = (size_t) s->n_prompt, nt = MAX(n * (size_t) n_top, 1);
	_cleanup_(ktok_stream_freep) ktok_stream *dec = NULL;
	if (!(s->ptok = malloc(n * sizeof(int32_t))) || !(s->plp = malloc(n * sizeof(float))) ||
	    !(s->ptop_ids = calloc(nt, sizeof(int32_t))) ||
	    !(s->ptop_lp = calloc(nt, sizeof(float))) || !(s->poff = malloc(n * sizeof(size_t))) ||
	    ktok_stream_new(m->tok, KTOK_DEC_SKIP_SPECIAL, &dec) < 0)
		return -ENOMEM;
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		const char *t;
		size_t len = 0;
		s->ptok[i] = prompt[i];
		s->plp[i] = NAN;
		s->poff[i] = off;
		if (ktok_stream_feed(dec, prompt[i], &t, &len) >= 0)
			off += len;
	}
	return 0;
}

int inferd_submit(kiln_http_request *r, inferd_app *a, inferd_request *rq)
{
	const inferd_model *m = &a->model;
	const bool chat = rq->chat;
	const int n_seqs = rq->n_prompts * MAX(rq->n, 1); /* n choices per prompt */
	job *j = calloc(1, sizeof(*j) + (size_t) n_seqs * sizeof(seq));
	if (!j)
		return -ENOMEM;
	j->a = a;
	snprintf(j->rid, sizeof(j->rid), "%s-%s", chat ? "chatcmpl" : "cmpl",
		 kiln_http_request_id(r));
	j->stream = rq->stream;
	j->chat = chat;
	j->include_usage = rq->include_usage;
	j->stops = TAKE_PTR(rq->stops);
	j->stop_max = rq->stop_max;
	j->n_seqs = n_seqs;
	j->logprobs = rq->logprobs;
	j->n_top = rq->top_logprobs;
	j->min_tokens = rq->proc.min_tokens;
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->cond, NULL);
	/* Choice i is sample i % n of prompt i / n (OpenAI's indexing). */
	const int n = MAX(rq->n, 1);
	for (int i = 0; i < n_seqs; i++) {
		seq *s = &j->seqs[i];
		const int p = i / n;
		s->j = j;
		s->index = i;
		s->first = true;
		s->n_prompt = rq->prompt_len[p];
		kiln_strbuf_init(&s->text);
		s->cap = (int) MIN(rq->max_tokens, (int64_t) m->ctx + 1);
		if (i % n == 0) /* usage counts each prompt once, as OpenAI does */
			j->n_prompt_total += rq->prompt_len[p];
		const size_t nt = (size_t) s->cap * (size_t) j->n_top;
		if (!(s->out = malloc((size_t) s->cap * sizeof(int32_t))) ||
		    (j->logprobs && (!(s->lp = malloc((size_t) s->cap * sizeof(float))) ||
				     !(s->top_ids = malloc(MAX(nt, 1) * sizeof(int32_t))) ||
				     !(s->top_lp = malloc(MAX(nt, 1) * sizeof(float))))) ||
		    (m->tok && ktok_stream_new(m->tok, KTOK_DEC_SKIP_SPECIAL, &s->dec) < 0) ||
		    (rq->echo && ktok_decode(m->tok, rq->prompts[p], (size_t) rq->prompt_len[p],
					     KTOK_DEC_SKIP_SPECIAL, &s->echo, NULL) < 0) ||
		    (rq->echo && rq->logprobs &&
		     echo_logprobs_new(s, m, rq->prompts[p], j->n_top) < 0)) {
			job_free(j);
			return -ENOMEM;
		}
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	int n_sub = 0, q = 0;
	uint64_t ids[INFERD_BATCH_MAX]; /* j may be gone once its state is set */
	kiln_error kerr;
	kiln_engine_processing proc = rq->proc;
	proc.logit_bias = rq->logit_bias;
	proc.n_logit_bias = rq->n_logit_bias;
	for (; n_sub < n_seqs; n_sub++) {
		seq *s = &j->seqs[n_sub];
		s->id = atomic_fetch_add(&a->next_id, 1);
		/* A given seed: each of the n samples gets its own (seed + k). */
		const uint64_t k = (uint64_t) (n_sub % n);
		kiln_engine_request er = {
			.id = s->id,
			.prompt = rq->prompts[n_sub / n],
			.n_prompt = rq->prompt_len[n_sub / n],
			.max_tokens = (int) rq->max_tokens,
			.sampling = { .temperature = (float) rq->temperature,
				      .top_k = (int) rq->top_k,
				      .top_p = (float) rq->top_p,
				      /* no seed: a fresh one per request */
				      .seed = rq->seed >= 0 ? (uint64_t) rq->seed + k
							    : (uint64_t) now.tv_nsec *
									      0x9E3779B97F4A7C15u ^
								      s->id },
			.stop = rq->stop_ids,
			.n_stop = rq->n_stop_ids,
			.ignore_eos = rq->ignore_eos,
			.logprobs = rq->logprobs,
			.top_logprobs = rq->top_logprobs,
			.prompt_logprobs = rq->echo && rq->logprobs,
			.proc = proc,
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
		q = rq->stream ? inferd_sse_reply(r, on_http_cancel, j, &j->s)
			       : kiln_http_reply_later(r, on_http_cancel, j, &j->s);
	else if (q == -EAGAIN)
		q = kiln_http_reply_retry(r, 429, 1, "overloaded", "%s", kerr.msg);
	else if (q == -ESHUTDOWN)
		q = kiln_http_reply_retry(r, 503, 0, NULL, "%s", kerr.msg);
	else if (q == -E2BIG || q == -EINVAL)
		q = kiln_http_reply_error(r, 400, NULL, chat ? "messages" : "prompt", NULL, "%s",
					  kerr.msg);
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
