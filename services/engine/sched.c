/* sched.c — the engine's scheduling policy: the waiting queue, admission
 * (first come first served, within sequence slots, the step's token budget
 * and free KV blocks, with a watermark), chunked prefill, preemption by
 * recompute, and retiring a step's finished requests.
 *
 * It exists apart from engine.c so the policy docs/inferd-engine.md
 * ("Scheduling policy") describes reads in one place, without the thread,
 * the API and the sampling around it.  Everything here runs on the
 * scheduler thread (or submit/free for the queue) with e->lock held. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "engine-internal.h"
#include "kiln/list.h"
#include "kiln/macro.h"

/* Prefills a step may leave unfinished (vLLM's max_num_partial_prefills
 * default): a long prompt takes the budget the decodes leave, and the
 * requests behind it wait instead of each starting a sliver. */
#define ENGINE_PARTIAL_MAX 1

/* ---- queue helpers (under lock) ----------------------------------------- */

void kiln_engine__wq_unlink(kiln_engine *e, ereq *r)
{
	if (!r->next)
		e->wq_tail = r->prev;
	LIST_UNLINK(e->wq_head, r);
	e->n_waiting--;
}

void kiln_engine__wq_push(kiln_engine *e, ereq *r, bool front)
{
	if (!e->wq_head) {
		r->prev = r->next = NULL;
		e->wq_head = e->wq_tail = r;
	} else if (front) {
		r->prev = NULL;
		r->next = e->wq_head;
		e->wq_head->prev = r;
		e->wq_head = r;
	} else {
		r->next = NULL;
		r->prev = e->wq_tail;
		e->wq_tail->next = r;
		e->wq_tail = r;
	}
	e->n_waiting++;
}

static void running_remove(kiln_engine *e, int i)
{
	memmove(e->running + i, e->running + i + 1,
		(size_t) (e->n_running - i - 1) * sizeof(*e->running));
	e->n_running--;
}

void kiln_engine__release_seq(kiln_engine *e, ereq *r)
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
	kiln_engine__release_seq(e, r);
	running_remove(e, i);
	kiln_engine__wq_push(e, r, true);
	e->counters.preemptions++;
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

/* ---- planning a step ------------------------------------------------------ */

void kiln_engine__apply_cancels(kiln_engine *e, ereq **done)
{
	const bool all = e->stopping && e->mode == KILN_ENGINE_CANCEL;
	for (ereq *r = e->wq_head, *nx; r; r = nx) {
		nx = r->next;
		if (r->cancel || all) {
			kiln_engine__wq_unlink(e, r);
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
				kiln_engine__release_seq(e, r);
			else
				kiln_engine__retire_seq(e, r);
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

/* Budget order (vLLM's chunked-prefill policy): every running sequence's
 * next token first, then the partial prefills already running, oldest
 * first, then waiting requests in order, each with as much of its prefill
 * as the step's token budget and the free blocks allow. */
int kiln_engine__plan_step(kiln_engine *e, ereq **done)
{
	int free_blocks = km_kvcache_free_blocks(e->c);
	/* The running sequences go first; make room for their next tokens. */
	int need = decode_blocks_needed(e);
	while (need > free_blocks && e->n_running > 0) {
		if (kiln_engine__prefix_evict(e, -1)) {
			/* kept prefixes go before running sequences */
		} else if (e->n_running == 1) {
			/* Alone and still out of room: the cache cannot hold
			 * this sequence's context, waiting will not help. */
			ereq *r = e->running[0];
			kiln_engine__release_seq(e, r);
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
			e->counters.prefill_tokens += (uint64_t) r->chunk;
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
		int share = may_share ? kiln_engine__find_prefix(e, r, &donor, &entry) : 0;
		/* A request whose prefix a running sequence is still
		 * prefilling (the n samples of one prompt, the same prompt
		 * sent twice at once) waits for those blocks instead of
		 * computing them again: it forks them once they are cached. */
		if (may_share && kiln_engine__prefilling_prefix(e, r) > share)
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
			if (!kiln_engine__prefix_evict(e, entry))
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
		kiln_engine__wq_unlink(e, r);
		r->seq = seq;
		r->n_cached = share;
		r->chunk = chunk;
		r->prefilling = true;
		if (!r->admit_order) /* the first admission, not one after a preemption */
			kiln_histogram_observe(&e->queue, engine_now() - r->t_submit);
		r->admit_order = ++e->admit_counter;
		e->running[e->n_running++] = r;
		e->in[n] = (km_seq_input){ seq, r->tokens + share, chunk };
		e->step[n++] = r;
		budget -= chunk;
		free_blocks -= blocks; /* later chunks' too: see above */
		partial += chunk < left;
		e->counters.prefill_tokens += (uint64_t) chunk;
		if (e->prefix) {
			e->counters.prefix_queries += (uint64_t) r->n_total;
			e->counters.prefix_hits += (uint64_t) share;
		}
	}
	if (n == 0 && !hold && e->wq_head && e->n_running == 0) {
		/* An empty cache and still no room: only a preempted request
		 * grown past the cache gets here. */
		ereq *r = e->wq_head;
		kiln_engine__wq_unlink(e, r);
		finish(r, KILN_ENGINE_FINISH_LENGTH, -1,
		       "the KV cache cannot hold a longer context", done);
	}
	return n;
}

int kiln_engine__requeue_step(kiln_engine *e)
{
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
	return requeued;
}

void kiln_engine__retire_step(kiln_engine *e, int n, bool failed, const char *msg, ereq **done)
{
	for (int i = e->n_running - 1; i >= 0; i--) {
		ereq *q = e->running[i];
		bool in_step = false;
		for (int j = 0; j < n && !in_step; j++)
			in_step = e->step[j] == q;
		if (!in_step)
			continue;
		if (failed || q->outcome == OUT_ERROR) {
			kiln_engine__release_seq(e, q);
			running_remove(e, i);
			finish(q, KILN_ENGINE_FINISH_ERROR, -1, msg, done);
		} else if (q->outcome == OUT_STOP) {
			kiln_engine__retire_seq(e, q);
			running_remove(e, i);
			finish(q, KILN_ENGINE_FINISH_STOP, q->stop_token, NULL, done);
		} else if (q->outcome == OUT_LENGTH) {
			kiln_engine__retire_seq(e, q);
			running_remove(e, i);
			finish(q, KILN_ENGINE_FINISH_LENGTH, -1, NULL, done);
		}
	}
}
