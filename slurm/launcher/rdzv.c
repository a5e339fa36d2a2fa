/* rdzv.c — kiln-run's rendezvous state machine (see rdzv.h).
 *
 * Rules, in one place:
 *  - candidates are joined, alive, not excluded nodes, taken in node id
 *    (Slurm node) order, at most max_nodes of them;
 *  - the first round waits for min_nodes, then a last-call window for more
 *    (ends early at max_nodes); later rounds follow a settle delay;
 *  - a member that dies, or a new candidate while the round is below MAX,
 *    starts a new round that does not count against the restart budget;
 *  - a worker failure starts a new round after an exponential backoff and
 *    counts once per round; a failure in a round where a member died is
 *    blamed on the death (survivor workers fail when a peer vanishes);
 *  - a node blamed exclude_after times is excluded for the rest of the job;
 *  - below MIN for join_timeout: time out, naming the missing nodes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"
#include "rdzv.h"

void rdzv_params_default(rdzv_params *p)
{
	*p = (rdzv_params){
		.min_nodes = 1,
		.max_nodes = 1,
		.last_call_usec = 10 * KILN_USEC_PER_SEC,
		.join_timeout_usec = 300 * KILN_USEC_PER_SEC,
		.dead_after_usec = 5 * KILN_USEC_PER_SEC,
		.max_restarts = 3,
		.exclude_after = 2,
		.backoff_base_usec = 1 * KILN_USEC_PER_SEC,
		.backoff_max_usec = 60 * KILN_USEC_PER_SEC,
		.settle_usec = 200 * KILN_USEC_PER_MSEC,
	};
}

int rdzv_leader_init(rdzv_leader *l, const rdzv_params *p, size_t n, uint64_t now)
{
	assert_return(l && p, -EINVAL);
	assert_return(n > 0 && n <= RDZV_MAX_NODES, -EINVAL);
	assert_return(p->min_nodes > 0 && p->min_nodes <= p->max_nodes, -EINVAL);
	*l = (rdzv_leader){ .p = *p, .n = n, .phase = RDZV_WAIT_MIN, .fail_node = -1 };
	l->nodes = calloc(n, sizeof(*l->nodes));
	l->member = calloc(n, sizeof(*l->member));
	if (!l->nodes || !l->member) {
		rdzv_leader_done(l);
		return -ENOMEM;
	}
	l->phase_since_usec = l->wait_since_usec = now;
	return 0;
}

void rdzv_leader_done(rdzv_leader *l)
{
	if (!l)
		return;
	free(l->nodes);
	free(l->member);
	l->nodes = NULL;
	l->member = NULL;
}

void rdzv_leader_resume(rdzv_leader *l, uint64_t last_round, unsigned restarts)
{
	if (last_round > l->round)
		l->round = last_round;
	if (restarts > l->restarts)
		l->restarts = restarts;
}

static bool is_candidate(const rdzv_node *nd)
{
	return nd->joined && !nd->excluded;
}

size_t rdzv_leader_candidates(const rdzv_leader *l)
{
	size_t c = 0;
	for (size_t i = 0; i < l->n; i++)
		c += is_candidate(&l->nodes[i]);
	return c;
}

int rdzv_leader_join(rdzv_leader *l, size_t id, const char *host, const char *addr, unsigned nproc,
		     uint64_t now)
{
	assert_return(l && id < l->n && host && addr, -EINVAL);
	assert_return(nproc > 0 && nproc <= RDZV_MAX_NPROC, -EINVAL);
	assert_return(strlen(host) < RDZV_HOST_MAX && strlen(addr) < RDZV_ADDR_MAX, -EINVAL);
	rdzv_node *nd = &l->nodes[id];
	nd->joined = true;
	snprintf(nd->host, sizeof(nd->host), "%s", host);
	snprintf(nd->addr, sizeof(nd->addr), "%s", addr);
	nd->nproc = nproc;
	nd->hb_seen_usec = now;
	return 0;
}

int rdzv_leader_heartbeat(rdzv_leader *l, size_t id, int64_t counter, uint64_t now)
{
	assert_return(l && id < l->n, -EINVAL);
	rdzv_node *nd = &l->nodes[id];
	if (counter != nd->hb) {
		nd->hb = counter;
		nd->hb_seen_usec = now;
	}
	return 0;
}

static void node_gone(rdzv_leader *l, size_t id, uint64_t now, const char *why)
{
	rdzv_node *nd = &l->nodes[id];
	if (!nd->joined)
		return;
	nd->joined = false;
	if (l->member[id] && l->phase == RDZV_RUNNING) {
		l->death_in_round = true;
		l->phase = RDZV_PENDING;
		l->phase_since_usec = now;
		l->next_round_usec = now + l->p.settle_usec;
		snprintf(l->reason, sizeof(l->reason), "node %s %s", nd->host, why);
	} else if (l->member[id] && l->phase == RDZV_PENDING) {
		l->death_in_round = true;
	}
}

int rdzv_leader_lost(rdzv_leader *l, size_t id, uint64_t now)
{
	assert_return(l && id < l->n, -EINVAL);
	node_gone(l, id, now, "lost its agent");
	return 0;
}

int rdzv_leader_exclude(rdzv_leader *l, size_t id)
{
	assert_return(l && id < l->n, -EINVAL);
	l->nodes[id].excluded = true;
	return 0;
}

static uint64_t backoff(const rdzv_leader *l)
{
	uint64_t b = l->p.backoff_base_usec;
	for (unsigned i = 1; i < l->restarts && b < l->p.backoff_max_usec; i++)
		b *= 2;
	return MIN(b, l->p.backoff_max_usec);
}

int rdzv_leader_worker_failed(rdzv_leader *l, size_t id, uint64_t round, int code, uint64_t now)
{
	assert_return(l && id < l->n, -EINVAL);
	if (round != l->round || !l->member[id])
		return 0; /* stale report from an earlier round */
	if (l->phase != RDZV_RUNNING && l->phase != RDZV_PENDING)
		return 0;
	if (l->round_failed)
		return 0; /* peers fail after the first one: count a round once */
	l->round_failed = true;
	l->fail_node = (int) id;
	l->fail_code = code;
	if (l->phase == RDZV_RUNNING) {
		l->phase = RDZV_PENDING;
		l->phase_since_usec = now;
		/* Decide on blame and backoff when the round is issued; give a
		 * concurrent death a moment to show up first. */
		l->next_round_usec = now + l->p.settle_usec;
		snprintf(l->reason, sizeof(l->reason), "a worker on %s exited with code %d",
			 l->nodes[id].host, code);
	}
	return 0;
}

int rdzv_leader_worker_done(rdzv_leader *l, size_t id, uint64_t round, uint64_t now)
{
	assert_return(l && id < l->n, -EINVAL);
	if (round == l->round && l->member[id])
		l->nodes[id].done_round = round;
	return 0;
}

static rdzv_action issue_round(rdzv_leader *l, uint64_t now)
{
	size_t taken = 0;
	for (size_t i = 0; i < l->n; i++) {
		bool take = is_candidate(&l->nodes[i]) && taken < l->p.max_nodes;
		l->member[i] = take;
		taken += take;
	}
	l->n_members = taken;
	l->round++;
	l->round_failed = false;
	l->death_in_round = false;
	l->fail_node = -1;
	l->phase = RDZV_RUNNING;
	l->phase_since_usec = now;
	return RDZV_ACT_ROUND;
}

static rdzv_action time_out(rdzv_leader *l)
{
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	size_t joined = rdzv_leader_candidates(l);
	kiln_strbuf_printf(&b, "%zu of the required %u nodes joined; missing:", joined,
			   l->p.min_nodes);
	size_t shown = 0, missing = 0;
	for (size_t i = 0; i < l->n; i++) {
		const rdzv_node *nd = &l->nodes[i];
		if (is_candidate(nd))
			continue;
		missing++;
		if (shown < 16) {
			if (nd->host[0])
				kiln_strbuf_printf(&b, " %s%s", nd->host,
						   nd->excluded ? "(excluded)" : "");
			else
				kiln_strbuf_printf(&b, " node#%zu", i);
			shown++;
		}
	}
	if (missing > shown)
		kiln_strbuf_printf(&b, " and %zu more", missing - shown);
	snprintf(l->reason, sizeof(l->reason), "%s", b.s ? b.s : "nodes missing");
	l->phase = RDZV_FINISHED;
	return RDZV_ACT_TIMEOUT;
}

static bool all_members_done(const rdzv_leader *l)
{
	if (l->n_members == 0)
		return false;
	for (size_t i = 0; i < l->n; i++)
		if (l->member[i] && l->nodes[i].done_round != l->round)
			return false;
	return true;
}

rdzv_action rdzv_leader_tick(rdzv_leader *l, uint64_t now)
{
	/* Heartbeat timeouts. */
	for (size_t i = 0; i < l->n; i++) {
		rdzv_node *nd = &l->nodes[i];
		if (nd->joined && now > nd->hb_seen_usec &&
		    now - nd->hb_seen_usec > l->p.dead_after_usec)
			node_gone(l, i, now, "stopped sending heartbeats");
	}

	size_t cand = rdzv_leader_candidates(l);
	switch (l->phase) {
	case RDZV_WAIT_MIN:
		if (cand >= l->p.min_nodes) {
			l->phase = RDZV_LAST_CALL;
			l->phase_since_usec = now;
			/* Later rounds (after a loss) need no last call. */
			if (l->round > 0 || cand >= l->p.max_nodes) {
				snprintf(l->reason, sizeof(l->reason), "%zu nodes joined", cand);
				return issue_round(l, now);
			}
			return RDZV_ACT_NONE;
		}
		if (now - l->wait_since_usec >= l->p.join_timeout_usec)
			return time_out(l);
		return RDZV_ACT_NONE;

	case RDZV_LAST_CALL:
		if (cand < l->p.min_nodes) {
			l->phase = RDZV_WAIT_MIN;
			return RDZV_ACT_NONE;
		}
		if (cand >= l->p.max_nodes || now - l->phase_since_usec >= l->p.last_call_usec) {
			snprintf(l->reason, sizeof(l->reason), "%zu nodes joined", cand);
			return issue_round(l, now);
		}
		return RDZV_ACT_NONE;

	case RDZV_RUNNING:
		if (all_members_done(l)) {
			l->phase = RDZV_FINISHED;
			l->exit_code = 0;
			snprintf(l->reason, sizeof(l->reason),
				 "all workers of round %" PRIu64 " exited 0", l->round);
			return RDZV_ACT_SUCCESS;
		}
		if (l->n_members < l->p.max_nodes) {
			for (size_t i = 0; i < l->n; i++)
				if (is_candidate(&l->nodes[i]) && !l->member[i]) {
					l->phase = RDZV_PENDING;
					l->phase_since_usec = now;
					l->next_round_usec = now + l->p.settle_usec;
					snprintf(l->reason, sizeof(l->reason), "node %s joined",
						 l->nodes[i].host);
					break;
				}
		}
		return RDZV_ACT_NONE;

	case RDZV_PENDING:
		if (now < l->next_round_usec)
			return RDZV_ACT_NONE;
		if (l->round_failed && !l->death_in_round) {
			/* Count the failure once, now that no death explains it. */
			l->round_failed = false;
			l->restarts++;
			if (l->fail_node >= 0) {
				rdzv_node *nd = &l->nodes[l->fail_node];
				if (++nd->failures >= l->p.exclude_after && l->p.exclude_after > 0)
					nd->excluded = true;
			}
			if (l->restarts > l->p.max_restarts) {
				l->phase = RDZV_FINISHED;
				l->exit_code = l->fail_code ? l->fail_code : 1;
				snprintf(l->reason, sizeof(l->reason),
					 "restart budget of %u spent; last failure on %s (code %d)",
					 l->p.max_restarts,
					 l->fail_node >= 0 ? l->nodes[l->fail_node].host : "?",
					 l->fail_code);
				return RDZV_ACT_FAIL;
			}
			if (rdzv_leader_candidates(l) < l->p.min_nodes && l->fail_node >= 0 &&
			    l->nodes[l->fail_node].excluded) {
				/* Excluding the failing node leaves too few: waiting
				 * for the join timeout would only delay the verdict. */
				l->phase = RDZV_FINISHED;
				l->exit_code = l->fail_code ? l->fail_code : 1;
				snprintf(l->reason, sizeof(l->reason),
					 "%s excluded after %u failures (last code %d); fewer than "
					 "%u nodes left",
					 l->nodes[l->fail_node].host,
					 l->nodes[l->fail_node].failures, l->fail_code,
					 l->p.min_nodes);
				return RDZV_ACT_FAIL;
			}
			l->next_round_usec = now + backoff(l);
			return RDZV_ACT_NONE;
		}
		l->round_failed = false;
		l->death_in_round = false;
		if (cand >= l->p.min_nodes)
			return issue_round(l, now);
		l->phase = RDZV_WAIT_MIN;
		l->wait_since_usec = now;
		return RDZV_ACT_NONE;

	case RDZV_FINISHED:
		return RDZV_ACT_NONE;
	}
	return RDZV_ACT_NONE;
}

int rdzv_round_from_leader(const rdzv_leader *l, rdzv_round *ret)
{
	assert_return(l && ret, -EINVAL);
	rdzv_round r = { .round = l->round };
	r.m = calloc(l->n_members ? l->n_members : 1, sizeof(*r.m));
	if (!r.m)
		return -ENOMEM;
	uint64_t world = 0;
	for (size_t i = 0; i < l->n; i++) {
		if (!l->member[i])
			continue;
		const rdzv_node *nd = &l->nodes[i];
		rdzv_member *m = &r.m[r.n];
		m->id = (uint32_t) i;
		m->group_rank = r.n;
		m->rank_base = (uint32_t) world;
		m->nproc = nd->nproc;
		snprintf(m->host, sizeof(m->host), "%s", nd->host);
		snprintf(m->addr, sizeof(m->addr), "%s", nd->addr);
		world += nd->nproc;
		r.n++;
		if (world > INT32_MAX) {
			free(r.m);
			return -ERANGE;
		}
	}
	r.world_size = (uint32_t) world;
	*ret = r;
	return 0;
}

int rdzv_round_format(const rdzv_round *r, char **ret)
{
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_strbuf_printf(&b, "round %" PRIu64 " world %" PRIu32 " n %" PRIu32 "\n", r->round,
			   r->world_size, r->n);
	for (uint32_t i = 0; i < r->n; i++) {
		const rdzv_member *m = &r->m[i];
		kiln_strbuf_printf(&b, "%" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %s %s\n",
				   m->id, m->group_rank, m->rank_base, m->nproc, m->host, m->addr);
	}
	if (kiln_strbuf_error(&b) < 0)
		return -ENOMEM;
	*ret = kiln_strbuf_steal(&b);
	return *ret ? 0 : -ENOMEM;
}

/* Hand-written field parsers: every agent parses the round text, and
 * sscanf made that 1.7 ms for 1024 members. */
static int take_u32(const char **p, uint32_t *ret)
{
	const char *s = *p;
	uint64_t v = 0;
	if (*s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		v = v * 10 + (uint64_t) (*s - '0');
		if (v > UINT32_MAX)
			return -EINVAL;
	}
	*ret = (uint32_t) v;
	*p = s;
	return 0;
}

static int take_word(const char **p, char *buf, size_t size)
{
	size_t n = strcspn(*p, " \n");
	if (n == 0 || n >= size)
		return -EINVAL;
	memcpy(buf, *p, n);
	buf[n] = 0;
	*p += n;
	return 0;
}

static int take_char(const char **p, char c)
{
	if (**p != c)
		return -EINVAL;
	(*p)++;
	return 0;
}

static int parse_member(const char **p, rdzv_member *m)
{
	if (take_u32(p, &m->id) < 0 || take_char(p, ' ') < 0 || take_u32(p, &m->group_rank) < 0 ||
	    take_char(p, ' ') < 0 || take_u32(p, &m->rank_base) < 0 || take_char(p, ' ') < 0 ||
	    take_u32(p, &m->nproc) < 0 || take_char(p, ' ') < 0 ||
	    take_word(p, m->host, sizeof(m->host)) < 0 || take_char(p, ' ') < 0 ||
	    take_word(p, m->addr, sizeof(m->addr)) < 0)
		return -EINVAL;
	while (**p == '\n')
		(*p)++;
	return 0;
}

int rdzv_round_parse(const char *s, rdzv_round *ret)
{
	assert_return(s && ret, -EINVAL);
	rdzv_round r = { 0 };
	int pos = 0;
	if (sscanf(s, "round %" SCNu64 " world %" SCNu32 " n %" SCNu32 "\n%n", &r.round,
		   &r.world_size, &r.n, &pos) != 3 ||
	    pos == 0)
		return -EINVAL;
	if (r.n == 0 || r.n > RDZV_MAX_NODES)
		return -EINVAL;
	r.m = calloc(r.n, sizeof(*r.m));
	if (!r.m)
		return -ENOMEM;
	const char *p = s + pos;
	uint64_t world = 0;
	for (uint32_t i = 0; i < r.n; i++) {
		rdzv_member *m = &r.m[i];
		if (parse_member(&p, m) < 0 || m->group_rank != i || m->rank_base != world ||
		    m->nproc == 0 || m->nproc > RDZV_MAX_NPROC ||
		    (i > 0 && m->id <= r.m[i - 1].id)) {
			free(r.m);
			return -EINVAL;
		}
		world += m->nproc;
	}
	if (world != r.world_size || *p != 0) {
		free(r.m);
		return -EINVAL;
	}
	*ret = r;
	return 0;
}

void rdzv_round_free(rdzv_round *r)
{
	if (!r)
		return;
	free(r->m);
	r->m = NULL;
	r->n = 0;
}

const rdzv_member *rdzv_round_find(const rdzv_round *r, uint32_t id)
{
	for (uint32_t i = 0; i < r->n; i++)
		if (r->m[i].id == id)
			return &r->m[i];
	return NULL;
}
