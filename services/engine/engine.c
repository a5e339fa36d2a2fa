/* engine.c — kiln-inferd's continuous-batching scheduler (see kiln/engine.h).
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
 * requests fork like a running sequence's. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/engine.h"
#include "kiln/macro.h"

/* Defaults for zero options (docs/inferd-engine.md). */
#define ENGINE_DEF_RUNNING 64
#define ENGINE_DEF_STEP	   512
#define ENGINE_DEF_BLOCKS  1024
#define ENGINE_DEF_WAITING 1024
/* Admission keeps 1/100 of the cache (at least one block) free while
 * anything runs (vLLM's default watermark is 1% too). */
#define ENGINE_WATERMARK_DIV 100
/* Prefills a step may leave unfinished (vLLM's max_num_partial_prefills
 * default): a long prompt takes the budget the decodes leave, and the
 * requests behind it wait instead of each starting a sliver. */
#define ENGINE_PARTIAL_MAX 1

/* What a step did to a request. */
enum { OUT_GOING, OUT_ERROR, OUT_STOP, OUT_LENGTH };

typedef struct ereq ereq;
struct ereq {
	uint64_t id;
	int32_t *tokens; /* prompt then generated, capacity n_prompt + max_tokens */
	int n_prompt, n_total, n_cached, max_tokens;
	int seq;	 /* cache sequence, -1 while waiting */
	int chunk;	 /* tokens fed in the current step */
	bool prefilling; /* admitted, its tokens not all cached yet */
	int outcome;	 /* of the current step: OUT_* */
	kk_sampling samp;
	int32_t stop[KILN_ENGINE_STOP_MAX];
	int n_stop;
	bool ignore_eos;
	bool logprobs;
	int top_logprobs;
	/* prompt_logprobs: the next prompt position whose logprob is due
	 * (its logits are those of the token before it, so a chunk must end
	 * there); n_prompt once all are delivered or none are asked. */
	int plp_next;
	kiln_engine_processing proc; /* proc.logit_bias: our copy */
	bool processed;		     /* penalties or logit_bias: sampled on the host */
	kiln_engine_cb cb;
	void *userdata;
	bool cancel;
	bool cancel_stop; /* kiln_engine_stop: the caller's stop string, FINISH_STOP */
	uint64_t admit_order;
	double t_submit, t_last;
	/* finish, once decided */
	kiln_engine_finish reason;
	int32_t stop_token;
	char msg[KM_ERROR_MAX];
	ereq *prev, *next; /* waiting queue, then the finished list */
};

/* A finished request's whole KV blocks kept for reuse (prefix caching): a
 * cache sequence of its first n tokens (a multiple of 16) and those
 * tokens.  Evicted least recently used when blocks or entries run out. */
typedef struct cached_prefix {
	int seq;
	int32_t *tokens;
	int n;
	uint64_t last_use;
} cached_prefix;

/* A token to hand to a callback after the step. */
typedef struct tok_event {
	ereq *r;
	int prompt_pos; /* a prompt token's logprob (PROMPT) at this position; -1: a new token */
	int32_t token;
	float logprob; /* when r->logprobs */
	int n_top;
	int32_t top_ids[KILN_ENGINE_LOGPROBS_MAX];
	float top_lp[KILN_ENGINE_LOGPROBS_MAX];
} tok_event;

struct kiln_engine {
	kk_backend *be;
	km_model *m;
	km_kvcache *c;
	km_config cfg;
	int max_running, max_step, num_blocks, max_waiting, eos;
	int watermark; /* free blocks admission leaves for running sequences */
	bool prefix;
	void (*on_tick)(void *userdata); /* the watchdog hook (opts) */
	void *tick_userdata;
	uint64_t tick_usec;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	bool started, stopping, joined;
	kiln_engine_shutdown_mode mode;

	ereq *wq_head, *wq_tail; /* waiting, FCFS; preempted ones at the front */
	int n_waiting;
	ereq **running; /* [max_running], in admission order */
	int n_running;
	uint64_t admit_counter;

	/* Prefix cache: finished requests' blocks, up to retain_max entries
	 * (each holds a cache sequence id beyond the running ones). */
	cached_prefix *retained;
	int n_retained, retain_max;
	uint64_t use_clock;
	uint64_t prefix_evictions;
	int prefix_blocks; /* distinct blocks the entries hold (under lock) */
	int prefix_only;   /* of those, held by entries only (evictable) */

	/* scheduler scratch */
	bool hold_admission; /* the next plan admits nothing (after -ENOSPC) */
	km_seq_input *in;
	ereq **step;
	tok_event *events;
	/* The step's logits on the host [max_running, vocab], allocated the
	 * first time a request needs them (logprobs, logits processing). */
	float *host_logits;
	float *row; /* one row to process */

	/* counters (under lock) */
	uint64_t finished[4], prompt_tokens, prefill_tokens, generated, preemptions, steps;
	uint64_t prefix_queries, prefix_hits;
	uint64_t rejected;		      /* submits refused with -EAGAIN: the queue was full */
	kiln_histogram ttft, itl, e2e, queue; /* queue: submit to first admission */
	/* The cache's free blocks as of the scheduler's last turn under the
	 * lock: the cache itself changes outside it (km_forward appends), so
	 * other threads read this copy, never the cache. */
	int kv_free;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int errorf(kiln_error *err, int r, const char *fmt, ...) _printf_(3, 4);
static int errorf(kiln_error *err, int r, const char *fmt, ...)
{
	if (err) {
		kiln_error_reset(err, NULL);
		err->code = r;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, KM_ERROR_MAX, fmt, ap);
		va_end(ap);
	}
	return r;
}

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

/* ---- queue helpers (under lock) ----------------------------------------- */

static void wq_unlink(kiln_engine *e, ereq *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		e->wq_head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		e->wq_tail = r->prev;
	r->prev = r->next = NULL;
	e->n_waiting--;
}

static void wq_push_back(kiln_engine *e, ereq *r)
{
	r->next = NULL;
	r->prev = e->wq_tail;
	if (e->wq_tail)
		e->wq_tail->next = r;
	else
		e->wq_head = r;
	e->wq_tail = r;
	e->n_waiting++;
}

static void wq_push_front(kiln_engine *e, ereq *r)
{
	r->prev = NULL;
	r->next = e->wq_head;
	if (e->wq_head)
		e->wq_head->prev = r;
	else
		e->wq_tail = r;
	e->wq_head = r;
	e->n_waiting++;
}

static void running_remove(kiln_engine *e, int i)
{
	memmove(e->running + i, e->running + i + 1,
		(size_t) (e->n_running - i - 1) * sizeof(*e->running));
	e->n_running--;
}

/* Drops r's cache sequence (its blocks go back unless shared). */
static void release_seq(kiln_engine *e, ereq *r)
{
	if (r->seq >= 0)
		km_kvcache_seq_free(e->c, r->seq);
	r->seq = -1;
	r->n_cached = 0;
}

/* Puts a finished request on the list delivered after the step. */
static void finish(ereq *r, kiln_engine_finish reason, int32_t stop_token, const char *msg,
		   ereq **done)
{
	r->reason = reason;
	r->stop_token = stop_token;
	/* msg is a kiln_error's, cut at KM_ERROR_MAX like r->msg */
	snprintf(r->msg, sizeof(r->msg), "%.*s", (int) sizeof(r->msg) - 1, msg ? msg : "");
	r->prev = NULL;
	r->next = *done;
	*done = r;
}

/* Preempts running[i] by recompute: blocks freed, back to the queue's front
 * with every token it has, so it resumes where it was. */
static void preempt(kiln_engine *e, int i)
{
	ereq *r = e->running[i];
	release_seq(e, r);
	running_remove(e, i);
	wq_push_front(e, r);
	e->preemptions++;
}

static int latest_running(const kiln_engine *e)
{
	int best = 0;
	for (int i = 1; i < e->n_running; i++)
		if (e->running[i]->admit_order > e->running[best]->admit_order)
			best = i;
	return best;
}

/* Blocks the running sequences' next tokens need beyond what they hold. */
static int decode_blocks_needed(const kiln_engine *e)
{
	int need = 0;
	for (int i = 0; i < e->n_running; i++)
		need += e->running[i]->n_cached % KK_KV_BLOCK_SIZE == 0;
	return need;
}

/* Whole blocks of a's first n tokens that b's tokens share, keeping at
 * least one of r's n_total tokens to feed (its logits are needed). */
static int shared_blocks(const int32_t *a, int n, const ereq *r)
{
	int lim = MIN(n, r->n_total - 1), k = 0;
	while (k < lim && a[k] == r->tokens[k])
		k++;
	return k - k % KK_KV_BLOCK_SIZE;
}

/* The running sequence or kept prefix whose cached tokens share the most
 * whole blocks with r's tokens; returns the shared token count (a
 * multiple of 16, 0: none), the donor's cache sequence in *donor and,
 * for a kept prefix, its index in *entry (else -1). */
static int find_prefix(const kiln_engine *e, const ereq *r, int *donor, int *entry)
{
	int best = 0;
	*entry = -1;
	for (int i = 0; i < e->n_running; i++) {
		const ereq *q = e->running[i];
		int k = shared_blocks(q->tokens, q->n_cached, r);
		if (k > best) {
			best = k;
			*donor = q->seq;
		}
	}
	for (int i = 0; i < e->n_retained; i++) {
		int k = shared_blocks(e->retained[i].tokens, e->retained[i].n, r);
		if (k > best) {
			best = k;
			*donor = e->retained[i].seq;
			*entry = i;
		}
	}
	return best;
}

/* Whole blocks of r's tokens that a running sequence still prefilling
 * will hold once its prefill is done. */
static int prefilling_prefix(const kiln_engine *e, const ereq *r)
{
	int best = 0;
	for (int i = 0; i < e->n_running; i++)
		if (e->running[i]->prefilling)
			best = MAX(best,
				   shared_blocks(e->running[i]->tokens, e->running[i]->n_total, r));
	return best;
}

/* ---- the prefix cache (under lock) ---------------------------------------- */

static void prefix_drop(kiln_engine *e, int i)
{
	km_kvcache_seq_free(e->c, e->retained[i].seq);
	free(e->retained[i].tokens);
	e->retained[i] = e->retained[--e->n_retained];
}

/* Evicts the least recently used entry but `keep` (-1: none); false when
 * there is none to evict. */
static bool prefix_evict_lru(kiln_engine *e, int keep)
{
	int lru = -1;
	for (int i = 0; i < e->n_retained; i++)
		if (i != keep && (lru < 0 || e->retained[i].last_use < e->retained[lru].last_use))
			lru = i;
	if (lru < 0)
		return false;
	prefix_drop(e, lru);
	e->prefix_evictions++;
	return true;
}

/* For the stats: the distinct blocks the entries hold (a block shared by
 * several counts once), and of those the ones no running sequence holds
 * (held by entries only: evicting would free them, so the stats count
 * them as free, as vLLM counts cached blocks nobody uses). */
static void prefix_count_blocks(kiln_engine *e)
{
	int n = 0, only = 0;
	if (e->n_retained) {
		const int bps = km_kvcache_blocks_per_seq(e->c);
		_cleanup_free_ int *held = calloc((size_t) e->num_blocks, sizeof(int));
		_cleanup_free_ int32_t *b = malloc((size_t) bps * sizeof(int32_t));
		for (int i = 0; held && b && i < e->n_retained; i++) {
			int k = km_kvcache_seq_blocks(e->c, e->retained[i].seq, b, bps);
			for (int j = 0; j < k; j++)
				if (b[j] >= 0 && b[j] < e->num_blocks && held[b[j]]++ == 0)
					n++;
		}
		for (int i = 0; held && i < e->num_blocks; i++)
			only += held[i] && km_kvcache_block_refs(e->c, i) == held[i];
	}
	e->prefix_blocks = n;
	e->prefix_only = only;
}

/* A finished request's sequence: its whole blocks join the prefix cache
 * (vLLM's automatic prefix caching keeps finished requests' full blocks),
 * else the sequence is freed. */
static void retire_seq(kiln_engine *e, ereq *r)
{
	int whole = r->n_cached - r->n_cached % KK_KV_BLOCK_SIZE;
	if (!e->retain_max || r->seq < 0 || whole == 0) {
		release_seq(e, r);
		return;
	}
	/* An entry this one extends goes (its blocks are this one's too);
	 * one that extends this one is only touched. */
	for (int i = e->n_retained - 1; i >= 0; i--) {
		cached_prefix *c = &e->retained[i];
		int n = MIN(c->n, whole);
		if (memcmp(c->tokens, r->tokens, (size_t) n * sizeof(int32_t)) != 0)
			continue;
		if (c->n >= whole) {
			c->last_use = ++e->use_clock;
			release_seq(e, r);
			return;
		}
		prefix_drop(e, i);
	}
	if (e->n_retained == e->retain_max)
		prefix_evict_lru(e, -1);
	int32_t *toks = malloc((size_t) whole * sizeof(int32_t));
	int seq = toks ? km_kvcache_seq_fork(e->c, r->seq, whole) : -ENOMEM;
	release_seq(e, r);
	if (seq < 0) {
		free(toks);
		return;
	}
	memcpy(toks, r->tokens, (size_t) whole * sizeof(int32_t));
	e->retained[e->n_retained++] = (cached_prefix){ seq, toks, whole, ++e->use_clock };
}

/* ---- one turn of the scheduler ------------------------------------------- */

/* Cancels (flags, or everything when shutting down with CANCEL) move to done. */
static void apply_cancels(kiln_engine *e, ereq **done)
{
	const bool all = e->stopping && e->mode == KILN_ENGINE_CANCEL;
	for (ereq *r = e->wq_head, *nx; r; r = nx) {
		nx = r->next;
		if (r->cancel || all) {
			wq_unlink(e, r);
			if (r->cancel_stop && !all)
				finish(r, KILN_ENGINE_FINISH_STOP, -1, "stop string", done);
			else
				finish(r, KILN_ENGINE_FINISH_CANCELLED, -1, "cancelled", done);
		}
	}
	for (int i = e->n_running - 1; i >= 0; i--) {
		ereq *r = e->running[i];
		if (r->cancel || all) {
			if (all)
				release_seq(e, r);
			else
				retire_seq(e, r);
			running_remove(e, i);
			if (r->cancel_stop && !all)
				finish(r, KILN_ENGINE_FINISH_STOP, -1, "stop string", done);
			else
				finish(r, KILN_ENGINE_FINISH_CANCELLED, -1, "cancelled", done);
		}
	}
}

/* New blocks a sequence holding n_cached tokens needs for chunk more. */
static int blocks_for(int n_cached, int chunk)
{
	return DIV_ROUND_UP(n_cached + chunk, KK_KV_BLOCK_SIZE) -
	       DIV_ROUND_UP(n_cached, KK_KV_BLOCK_SIZE);
}

/* The most tokens, up to want, that a sequence holding n_cached tokens can
 * append with avail more blocks (0 when not even one fits). */
static int tokens_fitting(int n_cached, int want, int avail)
{
	int room = (DIV_ROUND_UP(n_cached, KK_KV_BLOCK_SIZE) + avail) * KK_KV_BLOCK_SIZE - n_cached;
	return MAX(0, MIN(want, room));
}

/* The longest chunk r may feed now: up to the token whose logits give the
 * next prompt logprob due (prompt_logprobs), else any. */
static int chunk_cap(const ereq *r)
{
	return r->plp_next < r->n_prompt ? r->plp_next - r->n_cached : INT_MAX;
}

/* Plans the step into e->in / e->step; returns the number of inputs.
 * Budget order (vLLM's chunked-prefill policy): every running sequence's
 * next token first, then the partial prefills already running, oldest
 * first, then waiting requests in order, each with as much of its prefill
 * as the step's token budget and the free blocks allow. */
static int plan_step(kiln_engine *e, ereq **done)
{
	int free_blocks = km_kvcache_free_blocks(e->c);
	/* The running sequences go first; make room for their next tokens. */
	int need = decode_blocks_needed(e);
	while (need > free_blocks && e->n_running > 0) {
		if (prefix_evict_lru(e, -1)) {
			/* kept prefixes go before running sequences */
		} else if (e->n_running == 1) {
			/* Alone and still out of room: the cache cannot hold
			 * this sequence's context, waiting will not help. */
			ereq *r = e->running[0];
			release_seq(e, r);
			running_remove(e, 0);
			finish(r, KILN_ENGINE_FINISH_LENGTH, -1,
			       "the KV cache cannot hold a longer context", done);
		} else {
			preempt(e, latest_running(e));
		}
		free_blocks = km_kvcache_free_blocks(e->c);
		need = decode_blocks_needed(e);
	}
	free_blocks -= need;
	int n = 0, budget = e->max_step;
	for (int i = 0; i < e->n_running; i++) {
		ereq *r = e->running[i];
		r->chunk = 1;
		e->in[n] = (km_seq_input){ r->seq, r->tokens + r->n_cached, 1 };
		e->step[n++] = r;
		budget--;
	}
	/* Running sequences still prefilling (a long prompt, a forked tail,
	 * a recompute) grow their one token into a chunk with what is left.
	 * With others running, the watermark stays free as at admission. */
	const int reserve_running = e->n_running > 1 ? e->watermark : 0;
	int partial = 0; /* prefills this step leaves unfinished */
	for (int i = 0; i < n; i++) {
		ereq *r = e->step[i];
		int left = r->n_total - r->n_cached;
		if (left > 1 && budget > 0) {
			int have = blocks_for(r->n_cached, 1); /* counted in need */
			int chunk = tokens_fitting(r->n_cached,
						   MIN(MIN(left, 1 + budget), chunk_cap(r)),
						   have + MAX(0, free_blocks - reserve_running));
			if (chunk > 1) {
				free_blocks -= blocks_for(r->n_cached, chunk) - have;
				budget -= chunk - 1;
				r->chunk = chunk;
				e->in[i].n_tokens = chunk;
			}
		}
		if (r->prefilling)
			e->prefill_tokens += (uint64_t) r->chunk;
		partial += r->chunk < left;
	}
	/* Then waiting requests, strictly in order: the first that does not
	 * fit stops admission (no overtaking, so a long prompt is not
	 * starved by short ones; it runs once the budget frees).  A request
	 * may start with a partial chunk only while fewer than
	 * ENGINE_PARTIAL_MAX prefills are left unfinished, so the budget is
	 * not spread thin over many half-prefilled prompts. */
	const bool hold = e->hold_admission;
	e->hold_admission = false;
	while (!hold && e->wq_head && e->n_running < e->max_running && budget > 0) {
		ereq *r = e->wq_head;
		int donor = -1, entry = -1;
		/* A prefix-cache hit forks the donor's whole shared blocks
		 * (refcounted, no copy) and prefills only the tail, in
		 * chunks like any prompt: forking never costs more than
		 * prefilling, whatever the tail's length. */
		/* (A request that wants its prompt's logprobs must run every
		 * prompt token itself.) */
		const bool may_share =
			e->prefix && r->n_total > KK_KV_BLOCK_SIZE && r->plp_next >= r->n_prompt;
		int share = may_share ? find_prefix(e, r, &donor, &entry) : 0;
		/* A request whose prefix a running sequence is still
		 * prefilling (the n samples of one prompt, the same prompt
		 * sent twice at once) waits for those blocks instead of
		 * computing them again: it forks them once they are cached. */
		if (may_share && prefilling_prefix(e, r) > share)
			break;
		int left = r->n_total - share;
		/* Admission needs blocks for the whole prefill, not just the
		 * first chunk: one admitted into the blocks left over would
		 * grow into the running sequences' room and preempt them
		 * (the suite's 10-block cache: 32 preemptions instead of 11).
		 * With others running, keep a watermark of free blocks for
		 * their growth too.  Alone, anything that fits may run. */
		int reserve = e->n_running ? e->watermark : 0;
		int blocks = blocks_for(share, left);
		int chunk = MIN(MIN(left, budget), chunk_cap(r));
		/* Room comes from kept prefixes first, least recently used
		 * first (never the donor's). */
		while (blocks > free_blocks - reserve) {
			int before = km_kvcache_free_blocks(e->c);
			if (!prefix_evict_lru(e, entry))
				break;
			free_blocks += km_kvcache_free_blocks(e->c) - before;
			for (int k = 0; entry >= 0 && k < e->n_retained; k++)
				if (e->retained[k].seq == donor)
					entry = k; /* the donor moved (swap-remove) */
		}
		if (blocks > free_blocks - reserve ||
		    (chunk < left && partial >= ENGINE_PARTIAL_MAX))
			break;
		int seq =
			share ? km_kvcache_seq_fork(e->c, donor, share) : km_kvcache_seq_new(e->c);
		if (seq >= 0 && entry >= 0)
			e->retained[entry].last_use = ++e->use_clock;
		if (seq < 0)
			break;
		wq_unlink(e, r);
		r->seq = seq;
		r->n_cached = share;
		r->chunk = chunk;
		r->prefilling = true;
		if (!r->admit_order) /* the first admission, not one after a preemption */
			kiln_histogram_observe(&e->queue, now_s() - r->t_submit);
		r->admit_order = ++e->admit_counter;
		e->running[e->n_running++] = r;
		e->in[n] = (km_seq_input){ seq, r->tokens + share, chunk };
		e->step[n++] = r;
		budget -= chunk;
		free_blocks -= blocks; /* later chunks' too: see above */
		partial += chunk < left;
		e->prefill_tokens += (uint64_t) chunk;
		if (e->prefix) {
			e->prefix_queries += (uint64_t) r->n_total;
			e->prefix_hits += (uint64_t) share;
		}
	}
	if (n == 0 && !hold && e->wq_head && e->n_running == 0) {
		/* An empty cache and still no room: only a preempted request
		 * grown past the cache gets here. */
		ereq *r = e->wq_head;
		wq_unlink(e, r);
		finish(r, KILN_ENGINE_FINISH_LENGTH, -1,
		       "the KV cache cannot hold a longer context", done);
	}
	return n;
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
		e->finished[r->reason]++;
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

/* ---- the host path: logprobs and logits processing ---------------------- */

int kiln_engine__process_logits(float *x, int V, const kiln_engine_processing *p,
				const int32_t *tokens, int n_prompt, int n_total,
				const int32_t *stops, int n_stops)
{
	for (int i = 0; i < p->n_logit_bias; i++)
		x[p->logit_bias[i].token] += p->logit_bias[i].bias;
	if (n_total - n_prompt < p->min_tokens)
		for (int i = 0; i < n_stops; i++)
			x[stops[i]] = -INFINITY;
	const bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
	if (!rep && p->frequency_penalty == 0 && p->presence_penalty == 0)
		return 0;
	/* Per token: its count in the output, and whether the prompt has it. */
	_cleanup_free_ int *count = calloc((size_t) V, sizeof(int));
	_cleanup_free_ bool *seen = calloc((size_t) V, sizeof(bool));
	if (!count || !seen)
		return -ENOMEM;
	for (int i = 0; i < n_total; i++) {
		seen[tokens[i]] = true;
		if (i >= n_prompt)
			count[tokens[i]]++;
	}
	for (int t = 0; t < V; t++) {
		if (!seen[t])
			continue;
		if (rep)
			x[t] = x[t] > 0 ? x[t] / p->repetition_penalty
					: x[t] * p->repetition_penalty;
		if (count[t])
			x[t] -= p->frequency_penalty * (float) count[t] + p->presence_penalty;
	}
	return 0;
}

typedef struct cand {
	float x;
	int32_t id;
} cand;

static int cand_id_cmp(const void *a, const void *b)
{
	const cand *x = a, *y = b;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Descending logit, ties by lower id (kk_sample's order). */
static int cand_cmp(const void *a, const void *b)
{
	const cand *x = a, *y = b;
	if (x->x != y->x)
		return x->x > y->x ? -1 : 1;
	return cand_id_cmp(a, b);
}

int32_t kiln_engine__sample_host(const float *x, int V, const kk_sampling *p)
{
	int best = 0;
	for (int i = 1; i < V; i++)
		if (x[i] > x[best])
			best = i;
	if (p->temperature == 0)
		return best;
	_cleanup_free_ cand *cs = malloc((size_t) V * sizeof(*cs));
	_cleanup_free_ double *pr = malloc((size_t) V * sizeof(double));
	if (!cs || !pr)
		return -ENOMEM;
	for (int i = 0; i < V; i++)
		cs[i] = (cand){ x[i], i };
	qsort(cs, (size_t) V, sizeof(*cs), cand_cmp);
	int keep = p->top_k > 0 ? MIN(p->top_k, V) : V;
	double total = 0, kept = 0, cum = 0;
	for (int i = 0; i < keep; i++)
		total += pr[i] = exp(((double) cs[i].x - cs[0].x) / p->temperature);
	if (p->top_p > 0 && p->top_p < 1) {
		int n = 0;
		for (; n < keep; n++) {
			kept += pr[n];
			if (kept >= p->top_p * total) {
				n++;
				break;
			}
		}
		keep = MAX(n, 1);
	}
	double top = cs[0].x;
	qsort(cs, (size_t) keep, sizeof(*cs), cand_id_cmp);
	kept = 0;
	for (int i = 0; i < keep; i++)
		kept += pr[i] = exp(((double) cs[i].x - top) / p->temperature);
	double u = kk_sample_uniform(p->seed, 0) * kept;
	for (int i = 0; i < keep; i++) {
		cum += pr[i];
		if (cum > u)
			return cs[i].id;
	}
	return cs[keep - 1].id;
}

float kiln_engine__logprobs(const float *x, int V, int32_t token, int n, int32_t *top_ids,
			    float *top_lp)
{
	double mx = x[0];
	for (int i = 1; i < V; i++)
		mx = MAX(mx, (double) x[i]);
	double sum = exp((double) x[0] - mx); /* >= 1 once mx is finite */
	for (int i = 1; i < V; i++)
		sum += exp((double) x[i] - mx);
	const double lse = mx + log(sum);
	/* The n best by insertion (n <= 20): ties keep the lower id first. */
	int k = 0;
	for (int i = 0; i < V && n > 0; i++) {
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

/* Whether q's row is sampled on the host this step. */
static bool host_sampled(const ereq *q)
{
	return q->processed || q->n_total - q->n_prompt < q->proc.min_tokens;
}

/* Samples step row i for q: on the device (km_sample), or from the host
 * copy with q's processing applied.  The token, or a negative errno. */
static int sample_row(kiln_engine *e, int i, ereq *q, const kk_sampling *p)
{
	const int V = e->cfg.vocab_size;
	if (!host_sampled(q)) {
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
					    stops, n_stops);
	return r < 0 ? r : kiln_engine__sample_host(e->row, V, p);
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
		apply_cancels(e, &done);
		if (e->stopping && e->n_waiting == 0 && e->n_running == 0) {
			e->kv_free = km_kvcache_free_blocks(e->c);
			prefix_count_blocks(e);
			count_done(e, done, now_s());
			pthread_mutex_unlock(&e->lock);
			deliver(e, 0, done);
			break;
		}
		int n = plan_step(e, &done);
		e->kv_free = km_kvcache_free_blocks(e->c);
		prefix_count_blocks(e);
		count_done(e, done, now_s());
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
				(q->logprobs || host_sampled(q))) ||
			       (q->plp_next < q->n_prompt && q->n_cached + q->chunk == q->plp_next);
		}
		if (host && !e->host_logits) {
			e->host_logits = malloc((size_t) e->max_running *
						(size_t) e->cfg.vocab_size * sizeof(float));
			e->row = malloc((size_t) e->cfg.vocab_size * sizeof(float));
			if (!e->host_logits || !e->row) {
				free(e->host_logits);
				free(e->row);
				e->host_logits = e->row = NULL;
			}
		}
		int r = host && !e->host_logits
				? errorf(&err, -ENOMEM, "out of memory for the step's logits")
				: km_forward(e->m, e->c, e->in, n, host ? e->host_logits : NULL,
					     &err);
		if (r == -ENOSPC) {
			/* The plan counts blocks, so this is a fallback: put
			 * this step's new prefills back in order (or else the
			 * latest admitted) and run the next step without
			 * admitting, so the engine cannot spin on one plan. */
			pthread_mutex_lock(&e->lock);
			int requeued = 0;
			for (int i = e->n_running - 1; i >= 0; i--)
				if (e->running[i]->n_cached == 0) {
					preempt(e, i);
					requeued++;
				}
			if (!requeued && e->n_running > 1) {
				preempt(e, latest_running(e));
				requeued++;
			}
			pthread_mutex_unlock(&e->lock);
			if (requeued) {
				e->hold_admission = true;
				continue;
			}
			/* one sequence, alone, and no room: fail it below */
		}
		int n_events = 0, n_generated = 0;
		double t = now_s();
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
			int rs = sample_row(e, i, q, &p);
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
		e->steps++;
		e->generated += (uint64_t) n_generated;
		/* Retire: errors, stops and lengths leave the running list. */
		for (int i = e->n_running - 1; i >= 0; i--) {
			ereq *q = e->running[i];
			bool in_step = false;
			for (int j = 0; j < n && !in_step; j++)
				in_step = e->step[j] == q;
			if (!in_step)
				continue;
			if (r < 0 || q->outcome == OUT_ERROR) {
				release_seq(e, q);
				running_remove(e, i);
				finish(q, KILN_ENGINE_FINISH_ERROR, -1, err.msg, &done);
			} else if (q->outcome == OUT_STOP) {
				retire_seq(e, q);
				running_remove(e, i);
				finish(q, KILN_ENGINE_FINISH_STOP, q->stop_token, NULL, &done);
			} else if (q->outcome == OUT_LENGTH) {
				retire_seq(e, q);
				running_remove(e, i);
				finish(q, KILN_ENGINE_FINISH_LENGTH, -1, NULL, &done);
			}
		}
		e->kv_free = km_kvcache_free_blocks(e->c);
		prefix_count_blocks(e);
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
		return errorf(err, -EINVAL, "kiln_engine_new: missing argument");
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
		return errorf(err, -EINVAL, "engine options: max_running %d, must be 1..%d",
			      o.max_running, KM_KV_SEQS_MAX);
	if (o.max_step_tokens < o.max_running)
		return errorf(err, -EINVAL,
			      "engine options: max_step_tokens %d is below max_running %d (every "
			      "running sequence brings a token each step)",
			      o.max_step_tokens, o.max_running);
	if (o.max_waiting < 1 || o.max_waiting > KILN_ENGINE_WAITING_MAX)
		return errorf(err, -EINVAL, "engine options: max_waiting %d, must be 1..%d",
			      o.max_waiting, KILN_ENGINE_WAITING_MAX);
	if (o.eos_token < -1 || o.eos_token >= cfg->vocab_size)
		return errorf(err, -EINVAL,
			      "engine options: eos_token %d outside the vocabulary (0..%d, or -1)",
			      o.eos_token, cfg->vocab_size - 1);

	kiln_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return errorf(err, -ENOMEM, "out of memory");
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
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->cond, &ca);
	pthread_condattr_destroy(&ca);
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
		errorf(err, r, "engine: KV cache of %d blocks for %d sequences: %s", o.num_blocks,
		       o.max_running, strerror(-r));
		goto fail;
	}
	e->running = calloc((size_t) o.max_running, sizeof(*e->running));
	e->in = calloc((size_t) o.max_running, sizeof(*e->in));
	e->step = calloc((size_t) o.max_running, sizeof(*e->step));
	e->events = calloc((size_t) o.max_running, sizeof(*e->events));
	e->retained = calloc((size_t) MAX(e->retain_max, 1), sizeof(*e->retained));
	if (!e->running || !e->in || !e->step || !e->events || !e->retained) {
		r = errorf(err, -ENOMEM, "out of memory");
		goto fail;
	}
	r = -pthread_create(&e->thread, NULL, scheduler, e);
	if (r < 0) {
		errorf(err, r, "engine: cannot start the scheduler thread: %s", strerror(-r));
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
		return errorf(err, -EINVAL, "kiln_engine_submit: missing argument");
	const uint64_t id = q->id;
	if (!q->prompt || q->n_prompt < 1)
		return errorf(err, -EINVAL, "request %llu: the prompt is empty",
			      (unsigned long long) id);
	if (q->n_prompt > e->cfg.max_seq_len)
		return errorf(err, -E2BIG,
			      "request %llu: the prompt has %d tokens, more than the model's "
			      "context of %d; shorten it",
			      (unsigned long long) id, q->n_prompt, e->cfg.max_seq_len);
	if (DIV_ROUND_UP(q->n_prompt, KK_KV_BLOCK_SIZE) > e->num_blocks)
		return errorf(err, -E2BIG,
			      "request %llu: the prompt has %d tokens, more than the whole KV "
			      "cache holds (%d blocks of %d); shorten it or give the server a "
			      "larger cache",
			      (unsigned long long) id, q->n_prompt, e->num_blocks,
			      KK_KV_BLOCK_SIZE);
	for (int i = 0; i < q->n_prompt; i++)
		if (q->prompt[i] < 0 || q->prompt[i] >= e->cfg.vocab_size)
			return errorf(err, -EINVAL,
				      "request %llu: prompt token %d is %d, outside the "
				      "vocabulary (0..%d)",
				      (unsigned long long) id, i, q->prompt[i],
				      e->cfg.vocab_size - 1);
	if (q->max_tokens < 0)
		return errorf(err, -EINVAL, "request %llu: max_tokens is %d, must be >= 0",
			      (unsigned long long) id, q->max_tokens);
	if (q->prompt_logprobs && !q->logprobs)
		return errorf(err, -EINVAL, "request %llu: prompt_logprobs needs logprobs",
			      (unsigned long long) id);
	if (q->n_stop < 0 || q->n_stop > KILN_ENGINE_STOP_MAX || (q->n_stop && !q->stop))
		return errorf(err, -EINVAL, "request %llu: %d stop tokens, at most %d",
			      (unsigned long long) id, q->n_stop, KILN_ENGINE_STOP_MAX);
	const kk_sampling *s = &q->sampling;
	if (!(s->temperature >= 0) || s->top_k < 0 || s->top_k > KK_SAMPLE_TOP_K_MAX ||
	    !(s->top_p >= 0 && s->top_p <= 1))
		return errorf(err, -EINVAL,
			      "request %llu: sampling temperature %g (>= 0), top_k %d "
			      "(0..%d), top_p %g (0..1)",
			      (unsigned long long) id, s->temperature, s->top_k,
			      KK_SAMPLE_TOP_K_MAX, s->top_p);

	const kiln_engine_processing *pp = &q->proc;
	if (q->top_logprobs < 0 || q->top_logprobs > KILN_ENGINE_LOGPROBS_MAX)
		return errorf(err, -EINVAL, "request %llu: top_logprobs %d, must be 0..%d",
			      (unsigned long long) id, q->top_logprobs, KILN_ENGINE_LOGPROBS_MAX);
	if (!(fabsf(pp->presence_penalty) <= 2) || !(fabsf(pp->frequency_penalty) <= 2) ||
	    !(pp->repetition_penalty >= 0 && pp->repetition_penalty <= 100) || pp->min_tokens < 0)
		return errorf(err, -EINVAL,
			      "request %llu: presence_penalty %g, frequency_penalty %g (-2..2), "
			      "repetition_penalty %g (0..100), min_tokens %d (>= 0)",
			      (unsigned long long) id, pp->presence_penalty, pp->frequency_penalty,
			      pp->repetition_penalty, pp->min_tokens);
	if (pp->n_logit_bias < 0 || pp->n_logit_bias > KILN_ENGINE_BIAS_MAX ||
	    (pp->n_logit_bias && !pp->logit_bias))
		return errorf(err, -EINVAL, "request %llu: %d logit_bias entries, at most %d",
			      (unsigned long long) id, pp->n_logit_bias, KILN_ENGINE_BIAS_MAX);
	for (int i = 0; i < pp->n_logit_bias; i++)
		if (pp->logit_bias[i].token < 0 || pp->logit_bias[i].token >= e->cfg.vocab_size ||
		    !(fabsf(pp->logit_bias[i].bias) <= 100))
			return errorf(err, -EINVAL,
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
		return errorf(err, -ENOMEM, "request %llu: out of memory", (unsigned long long) id);
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
	r->t_submit = r->t_last = now_s();

	pthread_mutex_lock(&e->lock);
	int rc = 0;
	if (e->stopping)
		rc = errorf(err, -ESHUTDOWN, "request %llu: the engine is shutting down",
			    (unsigned long long) id);
	else if (e->n_waiting >= e->max_waiting)
		rc = errorf(err, -EAGAIN,
			    "request %llu: %d requests are waiting already (the limit); retry "
			    "later",
			    (unsigned long long) id, e->n_waiting);
	if (rc == -EAGAIN)
		e->rejected++;
	if (rc == 0) {
		wq_push_back(e, r);
		e->prompt_tokens += (uint64_t) q->n_prompt;
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
		wq_unlink(e, r);
		req_free(r);
	}
	while (e->retained && e->n_retained)
		prefix_drop(e, e->n_retained - 1);
	free(e->retained);
	km_kvcache_free(e->c);
	km_model_free(e->m);
	free(e->running);
	free(e->in);
	free(e->step);
	free(e->events);
	free(e->host_logits);
	free(e->row);
	kiln_histogram_destroy(&e->ttft);
	kiln_histogram_destroy(&e->itl);
	kiln_histogram_destroy(&e->e2e);
	kiln_histogram_destroy(&e->queue);
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	free(e);
	return NULL;
}

void kiln_engine_get_stats(kiln_engine *e, kiln_engine_stats *ret)
{
	if (!e || !ret)
		return;
	kiln_engine_stats s = {};
	pthread_mutex_lock(&e->lock);
	s.waiting = e->n_waiting;
	s.running = e->n_running;
	memcpy(s.requests_finished, e->finished, sizeof(s.requests_finished));
	s.prompt_tokens = e->prompt_tokens;
	s.prefill_tokens = e->prefill_tokens;
	s.generated_tokens = e->generated;
	s.preemptions = e->preemptions;
	s.steps = e->steps;
	s.prefix_queries = e->prefix_queries;
	s.prefix_hits = e->prefix_hits;
	s.requests_rejected = e->rejected;
	s.prefix_entries = e->n_retained;
	s.prefix_blocks = e->prefix_blocks;
	s.prefix_evictions = e->prefix_evictions;
	s.kv_blocks_total = e->num_blocks;
	s.kv_blocks_used = e->num_blocks - e->kv_free - e->prefix_only;
	pthread_mutex_unlock(&e->lock);
	*ret = s;
}

/* The names are vLLM's (docs.vllm.ai, "Production Metrics"; v1 names
 * where v0 and v1 differ: kv_cache_usage_perc, prefix_cache_*,
 * inter_token_latency_seconds) with a model_name label, so a dashboard
 * built for vLLM works unchanged; kiln's own extras keep the vllm: prefix
 * only where vLLM has the same meaning and are kiln_inferd_* otherwise.
 * vLLM's finished_reason words are stop, length and abort (a cancel). */
static const char *finished_reason(kiln_engine_finish f)
{
	return f == KILN_ENGINE_FINISH_CANCELLED ? "abort" : kiln_engine_finish_name(f);
}

enum {
	MX_RUNNING,
	MX_WAITING,
	MX_KV_PERC,
	MX_KV_USED,
	MX_KV_FREE,
	MX_PREEMPT,
	MX_PROMPT,
	MX_PREFILL,
	MX_GEN,
	MX_STEPS,
	MX_PQ,
	MX_PH,
	MX_PBLOCKS,
	MX_PEVICT,
	MX_REJECTED
};

static double stat_value(const kiln_engine_stats *s, int what)
{
	switch (what) {
	case MX_RUNNING:
		return s->running;
	case MX_WAITING:
		return s->waiting;
	case MX_KV_PERC:
		return s->kv_blocks_total ? (double) s->kv_blocks_used / s->kv_blocks_total : 0;
	case MX_KV_USED:
		return s->kv_blocks_used;
	case MX_KV_FREE:
		return s->kv_blocks_total - s->kv_blocks_used;
	case MX_PREEMPT:
		return (double) s->preemptions;
	case MX_PROMPT:
		return (double) s->prompt_tokens;
	case MX_PREFILL:
		return (double) s->prefill_tokens;
	case MX_GEN:
		return (double) s->generated_tokens;
	case MX_STEPS:
		return (double) s->steps;
	case MX_PQ:
		return (double) s->prefix_queries;
	case MX_PH:
		return (double) s->prefix_hits;
	case MX_PBLOCKS:
		return s->prefix_blocks;
	case MX_PEVICT:
		return (double) s->prefix_evictions;
	default:
		return (double) s->requests_rejected;
	}
}

int kiln_engine_metrics(kiln_engine *const *engines, const char *const *names, int n,
			kiln_metrics *m)
{
	assert_return(engines && names && n >= 0 && m, -EINVAL);
	static const struct {
		const char *name;
		kiln_metric_type type;
		const char *help;
		int what;
		const char *label, *value; /* an extra label, or NULL */
	} fams[] = {
		{ "vllm:num_requests_running", KILN_METRIC_GAUGE,
		  "Requests in the running batch (holding KV cache blocks).", MX_RUNNING, NULL,
		  NULL },
		{ "vllm:num_requests_waiting", KILN_METRIC_GAUGE,
		  "Requests queued for admission (new or preempted).", MX_WAITING, NULL, NULL },
		{ "vllm:kv_cache_usage_perc", KILN_METRIC_GAUGE,
		  "Fraction of KV cache blocks in use (0..1).", MX_KV_PERC, NULL, NULL },
		{ "kiln_inferd_kv_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks of 16 tokens, by state.", MX_KV_USED, "state", "used" },
		{ "kiln_inferd_kv_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks of 16 tokens, by state.", MX_KV_FREE, "state", "free" },
		{ "vllm:num_preemptions_total", KILN_METRIC_COUNTER,
		  "Running requests preempted (recomputed later) for KV cache room.", MX_PREEMPT,
		  NULL, NULL },
		{ "vllm:prompt_tokens_total", KILN_METRIC_COUNTER,
		  "Prompt tokens of accepted requests.", MX_PROMPT, NULL, NULL },
		{ "kiln_inferd_prefill_tokens_total", KILN_METRIC_COUNTER,
		  "Tokens run through prefill, recomputation after preemption included.",
		  MX_PREFILL, NULL, NULL },
		{ "vllm:generation_tokens_total", KILN_METRIC_COUNTER,
		  "Tokens generated and delivered.", MX_GEN, NULL, NULL },
		{ "kiln_inferd_engine_steps_total", KILN_METRIC_COUNTER,
		  "Forward steps run by the scheduler.", MX_STEPS, NULL, NULL },
		{ "vllm:prefix_cache_queries_total", KILN_METRIC_COUNTER,
		  "Prompt tokens looked up in the prefix cache.", MX_PQ, NULL, NULL },
		{ "vllm:prefix_cache_hits_total", KILN_METRIC_COUNTER,
		  "Prompt tokens shared from a running sequence or a kept prefix instead of "
		  "prefilled.",
		  MX_PH, NULL, NULL },
		{ "kiln_inferd_prefix_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks held by finished requests' kept prefixes (freed on demand).",
		  MX_PBLOCKS, NULL, NULL },
		{ "kiln_inferd_prefix_cache_evictions_total", KILN_METRIC_COUNTER,
		  "Kept prefixes evicted (least recently used) for room.", MX_PEVICT, NULL, NULL },
		{ "kiln_inferd_num_requests_rejected_total", KILN_METRIC_COUNTER,
		  "Requests refused because max_waiting requests were queued (HTTP 429).",
		  MX_REJECTED, NULL, NULL },
	};
	kiln_engine_stats st[n > 0 ? n : 1];
	for (int i = 0; i < n; i++)
		kiln_engine_get_stats(engines[i], &st[i]);
	for (size_t f = 0; f < ARRAY_SIZE(fams); f++) {
		kiln_metrics_family(m, fams[f].name, fams[f].type, fams[f].help);
		for (int i = 0; i < n; i++)
			kiln_metrics_sample(m,
					    (const char *[]){ "model_name", names[i], fams[f].label,
							      fams[f].value, NULL },
					    stat_value(&st[i], fams[f].what));
	}
	kiln_metrics_family(m, "vllm:request_success_total", KILN_METRIC_COUNTER,
			    "Finished requests by finish reason (stop, length, abort, error).");
	for (int i = 0; i < n; i++)
		for (int f = 0; f < 4; f++)
			kiln_metrics_sample(m,
					    (const char *[]){ "model_name", names[i],
							      "finished_reason", finished_reason(f),
							      NULL },
					    (double) st[i].requests_finished[f]);
	static const struct {
		const char *name, *help;
		size_t off;
	} hists[] = {
		{ "vllm:time_to_first_token_seconds",
		  "Time from submit to the first generated token.", offsetof(kiln_engine, ttft) },
		{ "vllm:inter_token_latency_seconds",
		  "Time between consecutive tokens of one request.", offsetof(kiln_engine, itl) },
		{ "vllm:e2e_request_latency_seconds", "Time from submit to the finish, any reason.",
		  offsetof(kiln_engine, e2e) },
		{ "vllm:request_queue_time_seconds",
		  "Time from submit to the first admission into the running batch.",
		  offsetof(kiln_engine, queue) },
	};
	for (size_t h = 0; h < ARRAY_SIZE(hists); h++) {
		kiln_metrics_family(m, hists[h].name, KILN_METRIC_HISTOGRAM, hists[h].help);
		for (int i = 0; i < n; i++)
			kiln_metrics_histogram_from(
				m, (const char *[]){ "model_name", names[i], NULL },
				(kiln_histogram *) (void *) ((char *) engines[i] + hists[h].off));
	}
	return m->error;
}
