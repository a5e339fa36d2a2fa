/* engine-internal.h — what the engine's files share (not installed).
 *
 * The engine is one object split by concern: engine.c (the API and the
 * scheduler thread's step loop), sched.c (the waiting queue, admission,
 * chunked prefill, preemption and retiring), prefix.c (the prefix cache),
 * logits.c (the host path: logits processing and logprobs) and metrics.c
 * (stats and Prometheus text).  They share the request and engine structs
 * and the functions below, all kiln_engine__ (double prefix: internal).
 * The "under lock" ones run with e->lock held. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>
#include <time.h>

#include "kiln/engine.h"

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
	float *row;  /* one row to process */
	int *counts; /* vocab_size zeros: kiln_engine__process_logits' scratch */

	/* counters (under lock): kiln_engine_get_stats() hands them out as
	 * they are, with the gauges filled in */
	kiln_engine_stats counters;
	kiln_histogram ttft, itl, e2e, queue; /* queue: submit to first admission */
	/* The cache's free blocks as of the scheduler's last turn under the
	 * lock: the cache itself changes outside it (km_forward appends), so
	 * other threads read this copy, never the cache. */
	int kv_free;
};

static inline double engine_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* Whether q's row is sampled on the host this step. */
static inline bool engine_host_sampled(const ereq *q)
{
	return q->processed || q->n_total - q->n_prompt < q->proc.min_tokens;
}

/* ---- sched.c: the queue, admission, preemption (under lock) ------------- */

void kiln_engine__wq_unlink(kiln_engine *e, ereq *r);
/* Queues r at the back (a new request) or the front (a preempted one). */
void kiln_engine__wq_push(kiln_engine *e, ereq *r, bool front);
/* Drops r's cache sequence (its blocks go back unless shared). */
void kiln_engine__release_seq(kiln_engine *e, ereq *r);
/* Cancels (flags, or everything when shutting down with CANCEL) move to
 * *done. */
void kiln_engine__apply_cancels(kiln_engine *e, ereq **done);
/* Plans the step into e->in / e->step; returns the number of inputs. */
int kiln_engine__plan_step(kiln_engine *e, ereq **done);
/* After km_forward said -ENOSPC: the step's new prefills (or else the
 * latest admitted) back to the queue; returns how many went. */
int kiln_engine__requeue_step(kiln_engine *e);
/* The step's n requests that errored (all when failed), stopped or reached
 * their length leave the running list for *done; msg is the error's. */
void kiln_engine__retire_step(kiln_engine *e, int n, bool failed, const char *msg, ereq **done);

/* ---- prefix.c: the prefix cache (under lock) ---------------------------- */

/* The running sequence or kept prefix whose cached tokens share the most
 * whole blocks with r's tokens; returns the shared token count (a
 * multiple of 16, 0: none), the donor's cache sequence in *donor and,
 * for a kept prefix, its index in *entry (else -1). */
int kiln_engine__find_prefix(const kiln_engine *e, const ereq *r, int *donor, int *entry);
/* Whole blocks of r's tokens that a running sequence still prefilling
 * will hold once its prefill is done. */
int kiln_engine__prefilling_prefix(const kiln_engine *e, const ereq *r);
void kiln_engine__prefix_drop(kiln_engine *e, int i);
/* Evicts the least recently used entry but `keep` (-1: none); false when
 * there is none to evict. */
bool kiln_engine__prefix_evict(kiln_engine *e, int keep);
/* Recounts e->prefix_blocks and e->prefix_only for the stats. */
void kiln_engine__prefix_count_blocks(kiln_engine *e);
/* A finished request's sequence: its whole blocks join the prefix cache,
 * else the sequence is freed. */
void kiln_engine__retire_seq(kiln_engine *e, ereq *r);

/* ---- logits.c: the host path (scheduler thread, no lock) ---------------- */

/* Samples step row i for q: on the device (km_sample), or from the host
 * copy with q's processing applied.  The token, or a negative errno. */
int kiln_engine__sample_row(kiln_engine *e, int i, ereq *q, const kk_sampling *p);
