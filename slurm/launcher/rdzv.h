/* rdzv.h — kiln-run's rendezvous decisions, as a pure state machine.
 *
 * The agent on the node that hosts the store is the rendezvous leader.  It
 * feeds this state machine what it observes (joins, heartbeats, lost
 * liveness connections, worker failures and successes) and the current
 * time; rdzv_leader_tick() answers what to do next: publish a new round,
 * close the job successfully, fail it, or time out.  No I/O happens here,
 * so every rule of the issue (MIN then a last-call window up to MAX, ranks
 * in Slurm node order, a new round on death / failure / new joiner, restart
 * budget with exponential backoff, exclusion after K failures, join
 * timeout naming who was missing) is unit-tested without sockets.
 *
 * The round assignment travels as text (rdzv_round_format/parse) so that
 * every agent derives RANK/WORLD_SIZE from the same bytes. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/hostlist.h"

/* Node ids are indexes into the expanded SLURM_JOB_NODELIST. */
#define RDZV_MAX_NODES KILN_HOSTLIST_MAX
/* Processes per node: far above any real node (8-16 GPUs), low enough that
 * WORLD_SIZE (nodes * procs) fits an int. */
#define RDZV_MAX_NPROC 1024
/* Longest "host addr" strings carried in a round. */
#define RDZV_HOST_MAX (KILN_HOSTNAME_MAX + 1)
#define RDZV_ADDR_MAX 16

typedef struct rdzv_params {
	unsigned min_nodes, max_nodes;
	uint64_t last_call_usec;    /* wait for more after MIN joined (first round) */
	uint64_t join_timeout_usec; /* below MIN for this long -> timeout */
	uint64_t dead_after_usec;   /* no heartbeat for this long -> dead */
	unsigned max_restarts;	    /* failed rounds allowed */
	unsigned exclude_after;	    /* a node whose workers failed this often is excluded */
	uint64_t backoff_base_usec; /* first failure restart waits this, doubling */
	uint64_t backoff_max_usec;
	uint64_t settle_usec; /* batch membership changes this long */
} rdzv_params;

void rdzv_params_default(rdzv_params *p);

typedef struct rdzv_node {
	bool joined;   /* joined and not (yet) found dead */
	bool excluded; /* failed exclude_after times, or unhealthy */
	char host[RDZV_HOST_MAX];
	char addr[RDZV_ADDR_MAX];
	unsigned nproc;
	int64_t hb;	       /* last heartbeat counter seen */
	uint64_t hb_seen_usec; /* when it last changed */
	unsigned failures;
	uint64_t done_round; /* round in which its workers all exited 0 */
} rdzv_node;

typedef enum rdzv_phase {
	RDZV_WAIT_MIN,	/* fewer than MIN candidates */
	RDZV_LAST_CALL, /* MIN reached, waiting up to last_call for MAX */
	RDZV_RUNNING,	/* a round is published */
	RDZV_PENDING,	/* a new round is due at next_round_usec */
	RDZV_FINISHED,
} rdzv_phase;

typedef enum rdzv_action {
	RDZV_ACT_NONE,
	RDZV_ACT_ROUND,	  /* publish round l->round with l->member[] */
	RDZV_ACT_SUCCESS, /* every member of the final round exited 0 */
	RDZV_ACT_FAIL,	  /* restart budget spent: exit with l->exit_code */
	RDZV_ACT_TIMEOUT, /* below MIN at join timeout: l->reason names who is missing */
} rdzv_action;

typedef struct rdzv_leader {
	rdzv_params p;
	size_t n;
	rdzv_node *nodes;
	bool *member; /* membership of the current round */
	size_t n_members;
	rdzv_phase phase;
	uint64_t phase_since_usec;
	uint64_t wait_since_usec; /* start of the current wait for MIN */
	uint64_t next_round_usec;
	uint64_t round;	     /* last published round, 0 = none yet */
	unsigned restarts;   /* failed rounds counted against max_restarts */
	bool round_failed;   /* a worker failed in the current round */
	bool death_in_round; /* a member died in the current round */
	int fail_node;	     /* node blamed for the current round's failure */
	int fail_code;	     /* its first failing worker's exit code */
	int exit_code;
	char reason[512]; /* why the last non-NONE action happened */
} rdzv_leader;

/* Errors: -EINVAL (n == 0, n > RDZV_MAX_NODES, min > max, min == 0), -ENOMEM. */
int rdzv_leader_init(rdzv_leader *l, const rdzv_params *p, size_t n, uint64_t now);
void rdzv_leader_done(rdzv_leader *l);
/* Continue numbering after a store failover. */
void rdzv_leader_resume(rdzv_leader *l, uint64_t last_round, unsigned restarts);

/* Events.  All return 0, or -EINVAL for an id out of range or bad fields. */
int rdzv_leader_join(rdzv_leader *l, size_t id, const char *host, const char *addr, unsigned nproc,
		     uint64_t now);
int rdzv_leader_heartbeat(rdzv_leader *l, size_t id, int64_t counter, uint64_t now);
/* The node is gone for sure (its liveness connection closed). */
int rdzv_leader_lost(rdzv_leader *l, size_t id, uint64_t now);
int rdzv_leader_exclude(rdzv_leader *l, size_t id);
int rdzv_leader_worker_failed(rdzv_leader *l, size_t id, uint64_t round, int code, uint64_t now);
int rdzv_leader_worker_done(rdzv_leader *l, size_t id, uint64_t round, uint64_t now);

rdzv_action rdzv_leader_tick(rdzv_leader *l, uint64_t now);
/* Nodes that are candidates for a round (joined, alive, not excluded). */
size_t rdzv_leader_candidates(const rdzv_leader *l);

/* A published round. */
typedef struct rdzv_member {
	uint32_t id, group_rank, rank_base, nproc;
	char host[RDZV_HOST_MAX];
	char addr[RDZV_ADDR_MAX];
} rdzv_member;

typedef struct rdzv_round {
	uint64_t round;
	uint32_t world_size;
	uint32_t n;
	rdzv_member *m;
} rdzv_round;

/* Builds the round from the leader's current membership (ranks in node id
 * order).  Errors: -ENOMEM, -ERANGE (WORLD_SIZE overflow). */
int rdzv_round_from_leader(const rdzv_leader *l, rdzv_round *ret);
/* Text form: "round R world W n N\n" then per member
 * "id group_rank rank_base nproc host addr\n".  Returns a malloc'd string. */
int rdzv_round_format(const rdzv_round *r, char **ret);
/* Errors: -EINVAL malformed or inconsistent (ranks not contiguous, world
 * mismatch), -ENOMEM. */
int rdzv_round_parse(const char *s, rdzv_round *ret);
void rdzv_round_free(rdzv_round *r);
/* Member with node id, or NULL. */
const rdzv_member *rdzv_round_find(const rdzv_round *r, uint32_t id);
