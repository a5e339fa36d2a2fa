/* prefix.c — the engine's prefix cache: finding the running sequence or
 * kept prefix that shares the most whole KV blocks with a request (it is
 * forked, refcounted, instead of prefilled), keeping finished requests'
 * whole blocks (vLLM's automatic prefix caching), evicting them least
 * recently used, and counting the blocks they hold for the stats.
 *
 * It exists apart from the scheduler (sched.c) because it is a cache with
 * its own rules and state (e->retained), which sched.c only asks: who
 * shares my prefix, make room, keep this.  All under e->lock. */
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"
#include "kiln/macro.h"

/* Whole blocks of a's first n tokens that r's tokens share, keeping at
 * least one of r's n_total tokens to feed (its logits are needed). */
static int shared_blocks(const int32_t *a, int n, const ereq *r)
{
	int lim = MIN(n, r->n_total - 1), k = 0;
	while (k < lim && a[k] == r->tokens[k])
		k++;
	return k - k % KK_KV_BLOCK_SIZE;
}

int kiln_engine__find_prefix(const kiln_engine *e, const ereq *r, int *donor, int *entry)
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

int kiln_engine__prefilling_prefix(const kiln_engine *e, const ereq *r)
{
	int best = 0;
	for (int i = 0; i < e->n_running; i++)
		if (e->running[i]->prefilling)
			best = MAX(best,
				   shared_blocks(e->running[i]->tokens, e->running[i]->n_total, r));
	return best;
}

void kiln_engine__prefix_drop(kiln_engine *e, int i)
{
	km_kvcache_seq_free(e->c, e->retained[i].seq);
	free(e->retained[i].tokens);
	e->retained[i] = e->retained[--e->n_retained];
}

bool kiln_engine__prefix_evict(kiln_engine *e, int keep)
{
	int lru = -1;
	for (int i = 0; i < e->n_retained; i++)
		if (i != keep && (lru < 0 || e->retained[i].last_use < e->retained[lru].last_use))
			lru = i;
	if (lru < 0)
		return false;
	kiln_engine__prefix_drop(e, lru);
	e->counters.prefix_evictions++;
	return true;
}

/* For the stats: the distinct blocks the entries hold (a block shared by
 * several counts once), and of those the ones no running sequence holds
 * (held by entries only: evicting would free them, so the stats count
 * them as free, as vLLM counts cached blocks nobody uses). */
void kiln_engine__prefix_count_blocks(kiln_engine *e)
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
void kiln_engine__retire_seq(kiln_engine *e, ereq *r)
{
	int whole = r->n_cached - r->n_cached % KK_KV_BLOCK_SIZE;
	if (!e->retain_max || r->seq < 0 || whole == 0) {
		kiln_engine__release_seq(e, r);
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
			kiln_engine__release_seq(e, r);
			return;
		}
		kiln_engine__prefix_drop(e, i);
	}
	if (e->n_retained == e->retain_max)
		kiln_engine__prefix_evict(e, -1);
	int32_t *toks = malloc((size_t) whole * sizeof(int32_t));
	int seq = toks ? km_kvcache_seq_fork(e->c, r->seq, whole) : -ENOMEM;
	kiln_engine__release_seq(e, r);
	if (seq < 0) {
		free(toks);
		return;
	}
	memcpy(toks, r->tokens, (size_t) whole * sizeof(int32_t));
	e->retained[e->n_retained++] = (cached_prefix){ seq, toks, whole, ++e->use_clock };
}
