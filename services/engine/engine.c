/* engine.c — kiln-inferd's continuous-batching engine (see kiln/engine.h):
 * the public API and the scheduler thread's step loop.
 *
 * One scheduler thread owns the model and the KV cache; other threads only
 * touch the waiting queue, the running list's cancel flags and the counters,
 * all under e->lock.  Each turn of the loop: apply cancels; plan a step under
 * the lock (every running sequence brings one token, then waiting requests
 * are admitted first come first served while sequence slots, the token
 * budget and free KV blocks allow; when the running sequences' next tokens
 * need more blocks than are free, the most recently admitted one is
 * preempted by recompute); run km_forward and sample outside the lock;
 * retire under the lock; hand tokens and finishes to the callbacks with the
 * lock released.
 *
 * A request's state is its token list (prompt, then what it generated) and
 * how many of those are in its cache sequence (n_cached).  A step feeds each
 * running request the next chunk of its uncached tokens: one token once it
 * is decoding, more while it prefills (a prompt longer than the step's
 * budget, the tail after a forked prefix, every token again after a
 * preemption), chunked to the budget the decodes leave (km_forward attends
 * a chunk to its cached context, docs/model.md).  Once everything is cached
 * the row's logits are sampled, so the token a recomputed or chunked request
 * samples sees exactly the context it would have seen in one piece.
 *
 * A row that needs more than a token id (logprobs, penalties, logit_bias,
 * min_tokens) makes the step bring its logits to the host, where that row
 * is processed and sampled with kk_sample's own algorithm; other steps
 * copy nothing.  With prefix caching, finished requests leave their whole
 * blocks behind as kept prefixes (evicted least recently used) that later
 * requests fork like a running sequence's.
 *
 * The policy (admission, chunks, preemption) is sched.c's, the prefix
 * cache prefix.c's, the host path logits.c's and the metrics metrics.c's
 * (engine-internal.h says what they share); this file owns the thread,
 * the request lifecycle and the API. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine-internal.h"
#include "kiln/macro.h"
#include "kiln/thread.h"

/* Defaults for zero options (docs/inferd-engine.md). */
#define ENGINE_DEF_RUNNING 64
#define ENGINE_DEF_STEP	   512
#define ENGINE_DEF_BLOCKS  1024
#define ENGINE_DEF_WAITING 1024
/* Admission keeps 1/100 of the cache (at least one block) free while
 * anything runs (vLLM's default watermark is 1% too). */
#define ENGINE_WATERMARK_DIV 100
const char *kiln_engine_finish_name(kiln_engine_finish f)
{
	static const char *const names[] = { "stop", "length", "cancelled", "error" };
	return (unsigned) f < ARRAY_SIZE(names) ? names[f] : "unknown";
}

/* The seed for a request's n-th sampled token: kk draws from (seed, row)
 * and callers advance the seed per step (kk.h); mixing the index in (a
 * SplitMix64 round) makes token n's draw depend on the request's seed and n
 * only, not on the step or the batch it lands in. */
static uint64_t token_seed(uint64_t seed, int n)
{
	uint64_t z = seed ^ ((uint64_t) n * UINT64_C(0xD1B54A32D192ED03));
	z = (z ^ (z >> 31)) * UINT64_C(0x9E3779B97F4A7C15);
	return z ^ (z >> 29);
}

static void req_free(ereq *r)
{
	if (!r)
		return;
	free(r->tokens);
	free((void *) r->proc.logit_bias);
	free(r);
}
static void deliver(kiln_engine *e, int n_events, ereq *done)
{
	for (int i = 0; i < n_events; i++) {
		ereq *r = e->events[i].r;
		if (!r->cb)
			continue;
		const int pos = e->events[i].prompt_pos;
		int idx = r->n_total - r->n_prompt - 1;
		/* The token list holds every sampled token; find this one's
		 * index (a request gets at most one event per step). */
		kiln_engine_event ev = {
			.type = pos >= 0 ? KILN_ENGINE_EVENT_PROMPT : KILN_ENGINE_EVENT_TOKEN,
			.id = r->id,
			.token = e->events[i].token,
			.index = pos >= 0 ? pos : idx,
			.n_generated = pos >= 0 ? 0 : idx + 1,
			.n_prompt = r->n_prompt,
			.logprob = e->events[i].logprob,
			.n_top = e->events[i].n_top,
			.top_ids = e->events[i].top_ids,
			.top_logprobs = e->events[i].top_lp,
		};
		r->cb(r->userdata, &ev);
	}
	for (ereq *r = done, *nx; r; r = nx) {
		nx = r->next;
		if (r->cb) {
			kiln_engine_event ev = {
				.type = KILN_ENGINE_EVENT_FINISH,
				.id = r->id,
				.token = r->stop_token,
				.index = -1,
				.n_generated = r->n_total - r->n_prompt,
				.n_prompt = r->n_prompt,
				.reason = r->reason,
				.message = r->msg[0] ? r->msg : NULL,
			};
			r->cb(r->userdata, &ev);
		}
		req_free(r);
	}
}

/* Counts finishes and observes end-to-end latency (under lock). */
static void count_done(kiln_engine *e, ereq *done, double t)
{
	for (ereq *r = done; r; r = r->next) {
		e->counters.requests_finished[r->reason]++;
		kiln_histogram_observe(&e->e2e, t - r->t_submit);
	}
}

static bool is_stop(const kiln_engine *e, const ereq *r, int32_t tok)
{
	if (!r->ignore_eos && e->eos >= 0 && tok == e->eos)
		return true;
	for (int i = 0; i < r->n_stop; i++)
		if (r->stop[i] == tok)
			return true;
	return false;
}

static void *scheduler(void *arg)
{
	kiln_engine *e = arg;
	kiln_error err;
	for (;;) {
		ereq *done = NULL;
		if (e->on_tick)
			e->on_tick(e->tick_userdata);
		pthread_mutex_lock(&e->lock);
		while (!e->stopping && e->n_waiting == 0 && e->n_running == 0) {
			if (!e->on_tick || !e->tick_usec) {
				pthread_cond_wait(&e->cond, &e->lock);
				continue;
			}
			/* Idle is healthy: wake up to say so (the hook). */
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			uint64_t ns = (uint64_t) ts.tv_nsec + e->tick_usec * 1000;
			ts.tv_sec += (time_t) (ns / 1000000000);
			ts.tv_nsec = (long) (ns % 1000000000);
			if (pthread_cond_timedwait(&e->cond, &e->lock, &ts) == ETIMEDOUT) {
				pthread_mutex_unlock(&e->lock);
				e->on_tick(e->tick_userdata);
				pthread_mutex_lock(&e->lock);
			}
		}
		kiln_engine__apply_cancels(e, &done);
		if (e->stopping && e->n_waiting == 0 && e->n_running == 0) {
			e->kv_free = km_kvcache_free_blocks(e->c);
			kiln_engine__prefix_count_blocks(e);
			count_done(e, done, engine_now());
			pthread_mutex_unlock(&e->lock);
			deliver(e, 0, done);
			break;
		}
		int n = kiln_engine__plan_step(e, &done);
		e->kv_free = km_kvcache_free_blocks(e->c);
		kiln_engine__prefix_count_blocks(e);
		count_done(e, done, engine_now());
		pthread_mutex_unlock(&e->lock);
		deliver(e, 0, done);
		done = NULL;
		if (n == 0)
			continue;

		/* Logits come to the host only for a step with a row that
		 * samples there or returns logprobs (the fast path copies
		 * nothing). */
		bool host = false;
		for (int i = 0; i < n && !host; i++) {
			const ereq *q = e->step[i];
			host = (q->n_cached + q->chunk >= q->n_total &&
				(q->logprobs || engine_host_sampled(q))) ||
			       (q->plp_next < q->n_prompt && q->n_cached + q->chunk == q->plp_next);
		}
		if (host && !e->host_logits) {
			e->host_logits = malloc((size_t) e->max_running *
						(size_t) e->cfg.vocab_size * sizeof(float));
			e->row = malloc((size_t) e->cfg.vocab_size * sizeof(float));
			e->counts = calloc((size_t) e->cfg.vocab_size, sizeof(int));
			if (!e->host_logits || !e->row || !e->counts) {
				free(e->host_logits);
				free(e->row);
				free(e->counts);
				e->host_logits = e->row = NULL;
				e->counts = NULL;
			}
		}
		int r = host && !e->host_logits
				? kiln_error_setf(&err, -ENOMEM,
						  "out of memory for the step's logits")
				: km_forward(e->m, e->c, e->in, n, host ? e->host_logits : NULL,
					     &err);
		if (r == -ENOSPC) {
			/* The plan counts blocks, so this is a fallback: put
			 * this step's new prefills back in order (or else the
			 * latest admitted) and run the next step without
			 * admitting, so the engine cannot spin on one plan. */
			pthread_mutex_lock(&e->lock);
			int requeued = kiln_engine__requeue_step(e);
			pthread_mutex_unlock(&e->lock);
			if (requeued) {
				e->hold_admission = true;
				continue;
			}
			/* one sequence, alone, and no room: fail it below */
		}
		int n_events = 0, n_generated = 0;
		double t = engine_now();
		/* Sampling touches only the scheduler's own fields of the
		 * step's requests: no lock. */
		for (int i = 0; i < n; i++) {
			ereq *q = e->step[i];
			q->outcome = OUT_GOING;
			if (r < 0) {
				/* The whole step failed (km rolled the cache back). */
				continue;
			}
			q->n_cached += q->chunk;
			if (q->plp_next < q->n_prompt && q->n_cached == q->plp_next) {
				/* the logits of prompt token plp_next - 1: the
				 * logprob of prompt token plp_next */
				tok_event *ev = &e->events[n_events++];
				ev->r = q;
				ev->prompt_pos = q->plp_next;
				ev->token = q->tokens[q->plp_next];
				ev->n_top = q->top_logprobs;
				ev->logprob = kiln_engine__logprobs(
					e->host_logits + (size_t) i * e->cfg.vocab_size,
					e->cfg.vocab_size, ev->token, q->top_logprobs, ev->top_ids,
					ev->top_lp);
				q->plp_next++;
			}
			if (q->n_cached < q->n_total)
				continue; /* prefill unfinished: no sample */
			q->prefilling = false;
			if (q->max_tokens == 0) { /* the prompt only (scored) */
				q->outcome = OUT_LENGTH;
				continue;
			}
			kk_sampling p = q->samp;
			p.seed = token_seed(q->samp.seed, q->n_total - q->n_prompt);
			int rs = kiln_engine__sample_row(e, i, q, &p);
			int32_t tok = rs;
			if (rs < 0) {
				snprintf(err.msg, sizeof(err.msg), "sampling failed: %s",
					 strerror(-rs));
				q->outcome = OUT_ERROR;
				continue;
			}
			if (is_stop(e, q, tok)) {
				q->outcome = OUT_STOP;
				q->stop_token = tok;
				continue;
			}
			q->tokens[q->n_total++] = tok;
			if (q->n_total - q->n_prompt == 1)
				kiln_histogram_observe(&e->ttft, t - q->t_submit);
			else
				kiln_histogram_observe(&e->itl, t - q->t_last);
			q->t_last = t;
			tok_event *ev = &e->events[n_events++];
			n_generated++;
			ev->r = q;
			ev->prompt_pos = -1;
			ev->token = tok;
			ev->n_top = 0;
			if (q->logprobs) {
				ev->n_top = q->top_logprobs;
				ev->logprob = kiln_engine__logprobs(
					e->host_logits + (size_t) i * e->cfg.vocab_size,
					e->cfg.vocab_size, tok, q->top_logprobs, ev->top_ids,
					ev->top_lp);
			}
			if (q->n_total - q->n_prompt >= q->max_tokens ||
			    q->n_cached >= e->cfg.max_seq_len)
				q->outcome = OUT_LENGTH;
		}
		pthread_mutex_lock(&e->lock);
		e->counters.steps++;
		e->counters.generated_tokens += (uint64_t) n_generated;
		/* Retire: errors, stops and lengths leave the running list. */
		kiln_engine__retire_step(e, n, r < 0, err.msg, &done);
		e->kv_free = km_kvcache_free_blocks(e->c);
		kiln_engine__prefix_count_blocks(e);
		count_done(e, done, t);
		pthread_mutex_unlock(&e->lock);
		deliver(e, n_events, done);
	}
	return NULL;
}

/* ---- public API ------------------------------------------------------------ */

int kiln_engine_new(kk_backend *be, const km_config *cfg, const km_weight_source *src,
		    const kiln_engine_opts *opts, kiln_engine **ret, kiln_error *err)
{
	if (!be || !cfg || !src || !opts || !ret)
		return kiln_error_setf(err, -EINVAL, "kiln_engine_new: missing argument");
	kiln_engine_opts o = *opts;
	if (!o.max_running)
		o.max_running = ENGINE_DEF_RUNNING;
	if (!o.max_step_tokens)
		o.max_step_tokens = ENGINE_DEF_STEP;
	if (!o.num_blocks)
		o.num_blocks = ENGINE_DEF_BLOCKS;
	if (!o.max_waiting)
		o.max_waiting = ENGINE_DEF_WAITING;
	if (o.max_running < 1 || o.max_running > KM_KV_SEQS_MAX)
		return kiln_error_setf(err, -EINVAL,
				       "engine options: max_running %d, must be 1..%d",
				       o.max_running, KM_KV_SEQS_MAX);
	if (o.max_step_tokens < o.max_running)
		return kiln_error_setf(
			err, -EINVAL,
			"engine options: max_step_tokens %d is below max_running %d (every "
			"running sequence brings a token each step)",
			o.max_step_tokens, o.max_running);
	if (o.max_waiting < 1 || o.max_waiting > KILN_ENGINE_WAITING_MAX)
		return kiln_error_setf(err, -EINVAL,
				       "engine options: max_waiting %d, must be 1..%d",
				       o.max_waiting, KILN_ENGINE_WAITING_MAX);
	if (o.eos_token < -1 || o.eos_token >= cfg->vocab_size)
		return kiln_error_setf(
			err, -EINVAL,
			"engine options: eos_token %d outside the vocabulary (0..%d, or -1)",
			o.eos_token, cfg->vocab_size - 1);

	kiln_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return kiln_error_setf(err, -ENOMEM, "out of memory");
	e->be = be;
	e->max_running = o.max_running;
	e->max_step = o.max_step_tokens;
	e->num_blocks = o.num_blocks;
	e->kv_free = o.num_blocks;
	e->watermark = MAX(1, o.num_blocks / ENGINE_WATERMARK_DIV);
	e->max_waiting = o.max_waiting;
	e->eos = o.eos_token;
	e->prefix = o.prefix_caching;
	/* Kept prefixes: as many entries as running sequences, each holding a
	 * cache sequence id of its own. */
	e->retain_max = o.prefix_caching ? MIN(o.max_running, KM_KV_SEQS_MAX - o.max_running) : 0;
	e->on_tick = o.on_tick;
	e->tick_userdata = o.tick_userdata;
	e->tick_usec = o.tick_usec;
	pthread_mutex_init(&e->lock, NULL);
	/* CLOCK_MONOTONIC: the idle wake-ups of the watchdog hook must not
	 * jump with the wall clock. */
	kiln_cond_init_monotonic(&e->cond);
	/* Buckets: vLLM's, with sub-millisecond ones for small models. */
	static const double ttft_b[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
					 0.06,	 0.08,	0.1,	0.25,  0.5,  0.75, 1,
					 2.5,	 5,	7.5,	10,    20,   40,   80 };
	static const double itl_b[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
					0.025,	0.05,	 0.075,	 0.1,	0.15,	0.2,   0.3,
					0.4,	0.5,	 0.75,	 1,	2.5,	5,     10 };
	static const double e2e_b[] = { 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1,  1.5, 2,   2.5,
					5,    10,   15,	 20,  30,  40,	50, 60,	 120, 300 };
	kiln_histogram_init(&e->ttft, ttft_b, ARRAY_SIZE(ttft_b));
	kiln_histogram_init(&e->itl, itl_b, ARRAY_SIZE(itl_b));
	kiln_histogram_init(&e->e2e, e2e_b, ARRAY_SIZE(e2e_b));
	kiln_histogram_init(&e->queue, e2e_b, ARRAY_SIZE(e2e_b)); /* vLLM: the same buckets */

	km_model_opts mo = { .weight_dtype = o.weight_dtype,
			     .q4_group = o.q4_group,
			     .max_tokens = o.max_step_tokens,
			     .max_seqs = o.max_running };
	int r = km_model_new(be, cfg, &mo, src, &e->m, err);
	if (r < 0)
		goto fail;
	e->cfg = *km_model_config(e->m);
	r = km_kvcache_new(be, &e->cfg, km_model_act_dtype(e->m), o.num_blocks,
			   o.max_running + e->retain_max, &e->c);
	if (r < 0) {
		kiln_error_setf(err, r, "engine: KV cache of %d blocks for %d sequences: %s",
				o.num_blocks, o.max_running, strerror(-r));
		goto fail;
	}
	e->running = calloc((size_t) o.max_running, sizeof(*e->running));
	e->in = calloc((size_t) o.max_running, sizeof(*e->in));
	e->step = calloc((size_t) o.max_running, sizeof(*e->step));
	e->events = calloc((size_t) o.max_running, sizeof(*e->events));
	e->retained = calloc((size_t) MAX(e->retain_max, 1), sizeof(*e->retained));
	if (!e->running || !e->in || !e->step || !e->events || !e->retained) {
		r = kiln_error_setf(err, -ENOMEM, "out of memory");
		goto fail;
	}
	r = -pthread_create(&e->thread, NULL, scheduler, e);
	if (r < 0) {
		kiln_error_setf(err, r, "engine: cannot start the scheduler thread: %s",
				strerror(-r));
		goto fail;
	}
	e->started = true;
	*ret = e;
	return 0;
fail:
	e->joined = true;
	kiln_engine_free(e);
	return r;
}

int kiln_engine_submit(kiln_engine *e, const kiln_engine_request *q, kiln_error *err)
{
	if (!e || !q)
		return kiln_error_setf(err, -EINVAL, "kiln_engine_submit: missing argument");
	const uint64_t id = q->id;
	if (!q->prompt || q->n_prompt < 1)
		return kiln_error_setf(err, -EINVAL, "request %llu: the prompt is empty",
				       (unsigned long long) id);
	if (q->n_prompt > e->cfg.max_seq_len)
		return kiln_error_setf(
			err, -E2BIG,
			"request %llu: the prompt has %d tokens, more than the model's "
			"context of %d; shorten it",
			(unsigned long long) id, q->n_prompt, e->cfg.max_seq_len);
	if (DIV_ROUND_UP(q->n_prompt, KK_KV_BLOCK_SIZE) > e->num_blocks)
		return kiln_error_setf(
			err, -E2BIG,
			"request %llu: the prompt has %d tokens, more than the whole KV "
			"cache holds (%d blocks of %d); shorten it or give the server a "
			"larger cache",
			(unsigned long long) id, q->n_prompt, e->num_blocks, KK_KV_BLOCK_SIZE);
	for (int i = 0; i < q->n_prompt; i++)
		if (q->prompt[i] < 0 || q->prompt[i] >= e->cfg.vocab_size)
			return kiln_error_setf(err, -EINVAL,
					       "request %llu: prompt token %d is %d, outside the "
					       "vocabulary (0..%d)",
					       (unsigned long long) id, i, q->prompt[i],
					       e->cfg.vocab_size - 1);
	if (q->max_tokens < 0)
		return kiln_error_setf(err, -EINVAL, "request %llu: max_tokens is %d, must be >= 0",
				       (unsigned long long) id, q->max_tokens);
	if (q->prompt_logprobs && !q->logprobs)
		return kiln_error_setf(err, -EINVAL, "request %llu: prompt_logprobs needs logprobs",
				       (unsigned long long) id);
	if (q->n_stop < 0 || q->n_stop > KILN_ENGINE_STOP_MAX || (q->n_stop && !q->stop))
		return kiln_error_setf(err, -EINVAL, "request %llu: %d stop tokens, at most %d",
				       (unsigned long long) id, q->n_stop, KILN_ENGINE_STOP_MAX);
	const kk_sampling *s = &q->sampling;
	if (!(s->temperature >= 0) || s->top_k < 0 || s->top_k > KK_SAMPLE_TOP_K_MAX ||
	    !(s->top_p >= 0 && s->top_p <= 1))
		return kiln_error_setf(err, -EINVAL,
				       "request %llu: sampling temperature %g (>= 0), top_k %d "
				       "(0..%d), top_p %g (0..1)",
				       (unsigned long long) id, s->temperature, s->top_k,
				       KK_SAMPLE_TOP_K_MAX, s->top_p);

	const kiln_engine_processing *pp = &q->proc;
	if (q->top_logprobs < 0 || q->top_logprobs > KILN_ENGINE_LOGPROBS_MAX)
		return kiln_error_setf(err, -EINVAL, "request %llu: top_logprobs %d, must be 0..%d",
				       (unsigned long long) id, q->top_logprobs,
				       KILN_ENGINE_LOGPROBS_MAX);
	if (!(fabsf(pp->presence_penalty) <= 2) || !(fabsf(pp->frequency_penalty) <= 2) ||
	    !(pp->repetition_penalty >= 0 && pp->repetition_penalty <= 100) || pp->min_tokens < 0)
		return kiln_error_setf(
			err, -EINVAL,
			"request %llu: presence_penalty %g, frequency_penalty %g (-2..2), "
			"repetition_penalty %g (0..100), min_tokens %d (>= 0)",
			(unsigned long long) id, pp->presence_penalty, pp->frequency_penalty,
			pp->repetition_penalty, pp->min_tokens);
	if (pp->n_logit_bias < 0 || pp->n_logit_bias > KILN_ENGINE_BIAS_MAX ||
	    (pp->n_logit_bias && !pp->logit_bias))
		return kiln_error_setf(
			err, -EINVAL, "request %llu: %d logit_bias entries, at most %d",
			(unsigned long long) id, pp->n_logit_bias, KILN_ENGINE_BIAS_MAX);
	for (int i = 0; i < pp->n_logit_bias; i++)
		if (pp->logit_bias[i].token < 0 || pp->logit_bias[i].token >= e->cfg.vocab_size ||
		    !(fabsf(pp->logit_bias[i].bias) <= 100))
			return kiln_error_setf(err, -EINVAL,
					       "request %llu: logit_bias token %d (0..%d), bias %g "
					       "(-100..100)",
					       (unsigned long long) id, pp->logit_bias[i].token,
					       e->cfg.vocab_size - 1, pp->logit_bias[i].bias);

	ereq *r = calloc(1, sizeof(*r));
	/* Room for the prompt and every token it may generate (capped at the
	 * context: nothing past max_seq_len + 1 is ever stored). */
	int cap = q->n_prompt + MIN(q->max_tokens, e->cfg.max_seq_len + 1);
	if (r)
		r->tokens = malloc((size_t) cap * sizeof(int32_t));
	if (r && pp->n_logit_bias) {
		kiln_engine_bias *b = malloc((size_t) pp->n_logit_bias * sizeof(*b));
		if (b)
			memcpy(b, pp->logit_bias, (size_t) pp->n_logit_bias * sizeof(*b));
		r->proc.logit_bias = b;
	}
	if (!r || !r->tokens || (pp->n_logit_bias && !r->proc.logit_bias)) {
		req_free(r);
		return kiln_error_setf(err, -ENOMEM, "request %llu: out of memory",
				       (unsigned long long) id);
	}
	r->id = id;
	memcpy(r->tokens, q->prompt, (size_t) q->n_prompt * sizeof(int32_t));
	r->n_prompt = r->n_total = q->n_prompt;
	r->max_tokens = MIN(q->max_tokens, cap - q->n_prompt);
	r->seq = -1;
	r->samp = *s;
	r->n_stop = q->n_stop;
	if (q->n_stop)
		memcpy(r->stop, q->stop, (size_t) q->n_stop * sizeof(int32_t));
	r->ignore_eos = q->ignore_eos;
	r->logprobs = q->logprobs;
	r->top_logprobs = q->logprobs ? q->top_logprobs : 0;
	r->plp_next = q->prompt_logprobs ? 1 : q->n_prompt;
	{
		const kiln_engine_bias *b = r->proc.logit_bias;
		r->proc = *pp;
		r->proc.logit_bias = b;
	}
	r->processed = pp->n_logit_bias || pp->presence_penalty != 0 ||
		       pp->frequency_penalty != 0 ||
		       (pp->repetition_penalty > 0 && pp->repetition_penalty != 1);
	r->cb = q->cb;
	r->userdata = q->userdata;
	r->stop_token = -1;
	r->t_submit = r->t_last = engine_now();

	pthread_mutex_lock(&e->lock);
	int rc = 0;
	if (e->stopping)
		rc = kiln_error_setf(err, -ESHUTDOWN, "request %llu: the engine is shutting down",
				     (unsigned long long) id);
	else if (e->n_waiting >= e->max_waiting)
		rc = kiln_error_setf(
			err, -EAGAIN,
			"request %llu: %d requests are waiting already (the limit); retry "
			"later",
			(unsigned long long) id, e->n_waiting);
	if (rc == -EAGAIN)
		e->counters.requests_rejected++;
	if (rc == 0) {
		kiln_engine__wq_push(e, r, false);
		e->counters.prompt_tokens += (uint64_t) q->n_prompt;
		pthread_cond_signal(&e->cond);
	}
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		req_free(r);
	return rc;
}

static int end_request(kiln_engine *e, uint64_t id, bool stop)
{
	assert_return(e, -EINVAL);
	int rc = -ENOENT;
	pthread_mutex_lock(&e->lock);
	for (ereq *r = e->wq_head; r && rc < 0; r = r->next)
		if (r->id == id && !r->cancel) {
			r->cancel = true;
			r->cancel_stop = stop;
			rc = 0;
		}
	for (int i = 0; i < e->n_running && rc < 0; i++)
		if (e->running[i]->id == id && !e->running[i]->cancel) {
			e->running[i]->cancel = true;
			e->running[i]->cancel_stop = stop;
			rc = 0;
		}
	if (rc == 0)
		pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return rc;
}

int kiln_engine_cancel(kiln_engine *e, uint64_t id)
{
	return end_request(e, id, false);
}

int kiln_engine_stop(kiln_engine *e, uint64_t id)
{
	return end_request(e, id, true);
}

void kiln_engine_shutdown(kiln_engine *e, kiln_engine_shutdown_mode mode)
{
	if (!e || e->joined)
		return;
	pthread_mutex_lock(&e->lock);
	e->stopping = true;
	e->mode = mode;
	pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	if (e->started)
		pthread_join(e->thread, NULL);
	e->joined = true;
}

kiln_engine *kiln_engine_free(kiln_engine *e)
{
	if (!e)
		return NULL;
	kiln_engine_shutdown(e, KILN_ENGINE_CANCEL);
	/* After a failed start nothing ran: only the queue could hold anything. */
	while (e->wq_head) {
		ereq *r = e->wq_head;
		kiln_engine__wq_unlink(e, r);
		req_free(r);
	}
	while (e->retained && e->n_retained)
		kiln_engine__prefix_drop(e, e->n_retained - 1);
	free(e->retained);
	km_kvcache_free(e->c);
	km_model_free(e->m);
	free(e->running);
	free(e->in);
	free(e->step);
	free(e->events);
	free(e->host_logits);
	free(e->row);
	free(e->counts);
	kiln_histogram_destroy(&e->ttft);
	kiln_histogram_destroy(&e->itl);
	kiln_histogram_destroy(&e->e2e);
	kiln_histogram_destroy(&e->queue);
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	free(e);
	return NULL;
}
