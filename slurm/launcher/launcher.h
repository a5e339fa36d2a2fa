/* launcher.h — the parts of kiln-run (the elastic launcher) and how they fit.
 *
 *   kiln-run.c  command line, cluster-file defaults, main()
 *   slurmenv.c  the job as Slurm describes it: node list (expanded with
 *               libslurm), this node's id, node addresses, requeue
 *   workers.c   one round's worker processes: environment, process groups,
 *               "host:rank" output prefixing, signals, reaping
 *   agent.c     the agent loop on every node (sd-event), and the leader (the
 *               agent that hosts the store): joins, heartbeats, liveness,
 *               rounds, barriers, store failover
 *   rdzv.c      the leader's decisions as a pure state machine
 *
 * Exit codes are part of the user interface (docs/kiln-run.md). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kiln/error.h"
#include "rdzv.h"

/* Exit codes besides the workers' own codes and KILN_EXIT_* (kiln/prog.h:
 * 1 kiln-run itself failed, 2 bad command line or cluster file). */
#define KR_EXIT_JOIN_TIMEOUT 75 /* fewer than MIN nodes joined within the join timeout */
#define KR_EXIT_CLOSED	     76 /* the rendezvous closed before this node got a round */

/* Environment variables. */
#define KR_ENV_SECRET	   "KILN_RUN_SECRET"	/* per-job secret for the control keys */
#define KR_ENV_AGENT	   "KILN_RUN_AGENT"	/* set by the batch-script launch: run as agent */
#define KR_ENV_SIM_NODES   "KILN_RUN_SIM_NODES" /* tests: loopback "nodes" (hostlist) */
#define KR_ENV_SIM_NODE_ID "KILN_RUN_SIM_NODE_ID"
/* munged's socket when it is not libmunge's default (munge.c). */
#define KR_ENV_MUNGE_SOCKET "KILN_RUN_MUNGE_SOCKET"

/* The worker key space entry that says "checkpoint now" (value: a counter). */
#define KR_CHECKPOINT_KEY "kiln/checkpoint_now"
/* How often the agent loop polls the store for a new round or the end. */
#define KR_POLL_USEC (100 * 1000ULL)
/* Stopping workers for a new round: at most this long before SIGKILL (the
 * full --grace applies to job-ending signals). */
#define KR_RESTART_STOP_USEC (10 * 1000 * 1000ULL)
/* A secret is 32 random bytes, hex. */
#define KR_SECRET_LEN 64

typedef struct kr_opts {
	rdzv_params rdzv;
	unsigned nproc; /* 0 = one per GPU */
	uint16_t port;	/* store port; 0 = ephemeral (standalone) */
	uint64_t heartbeat_usec;
	uint64_t grace_usec;
	bool prefix_output;
	bool health_check;
	bool requeue;
	bool standalone;
	const char *run_id;
	const char *healthd; /* path of kiln-healthd */
	int node_gpus;	     /* GPUs of this node from the cluster file, -1 unknown */
	char **argv;	     /* worker program and arguments */
} kr_opts;

typedef struct kr_job {
	char *job_id; /* NULL outside Slurm */
	char **nodes; /* node names, Slurm node order */
	char **addrs; /* IPv4 literal per node */
	size_t n;
	size_t self; /* this node's index */
	bool sim;    /* loopback simulation */
} kr_job;

/* slurmenv.c */
/* The job from the step's Slurm environment and slurmctld (kiln/slurm.h). */
int kr_job_from_slurm(kr_job *ret, kiln_error *err);
int kr_job_standalone(kr_job *ret);
int kr_job_sim(const char *hostlist, const char *id, kr_job *ret, kiln_error *err);
void kr_job_done(kr_job *j);
int kr_count_gpus(void);
/* Name of the interface holding IPv4 address addr, into buf. -ENOENT if none. */
int kr_ifname_for_addr(const char *addr, char *buf, size_t len);

/* workers.c */
typedef struct kr_worker {
	pid_t pid;
	int out_fd, err_fd; /* pipes when prefixing, else -1 */
	char *out_buf, *err_buf;
	size_t out_len, err_len;
	bool exited;
	int code; /* exit code (128+sig for a signal) */
	int rank;
} kr_worker;

typedef struct kr_group {
	kr_worker *w;
	size_t n;
	uint64_t round;
	const char *host;
	bool prefix;
	/* The caller's epoll fd (-1: none): the output pipes are registered
	 * there (EPOLLIN) while open, so one event source on it wakes the
	 * caller to kr_group_pump(). */
	int epoll_fd;
} kr_group;

typedef struct kr_worker_env {
	uint32_t rank_base, local_world, world, group_rank;
	uint64_t restart_count;
	unsigned max_restarts;
	const char *master_addr;
	uint16_t master_port;
	const char *run_id;
	const char *host;
	const char *node_addr; /* this node's address (KILN_NODE_ADDR, KILN_COMM_ADDR) */
	const char *ifname;    /* its interface (GLOO_SOCKET_IFNAME), NULL unknown */
	uint64_t round;
	int gpus; /* GPUs on this node, 0 = none, -1 unknown */
} kr_worker_env;

int kr_group_spawn(kr_group *g, char *const *argv, const kr_worker_env *e, bool prefix);
/* Signals every worker's process group. */
void kr_group_kill(kr_group *g, int sig);
/* Reaps exited workers (non-blocking).  Returns how many are still running. */
size_t kr_group_reap(kr_group *g);
/* Moves whatever the pipes hold to stdout/stderr with "host:rank: " prefixes. */
void kr_group_pump(kr_group *g, bool flush_partial);
/* Exit code of the first failing worker, 0 if all exited 0, -1 if some still run. */
int kr_group_result(const kr_group *g);
void kr_group_free(kr_group *g);

/* munge.c: the job secret through MUNGE (no KILN_RUN_SECRET, several nodes). */
typedef struct kr_munge_ctx {
	const char *job_id;
	const char *secret; /* the store host's secret, handed out */
} kr_munge_ctx;
/* 1 when munged answers here, else 0 with the reason in why. */
int kr_munge_available(char *why, size_t len);
/* A credential for the store host (*ret malloc'd).  -EACCES (logged). */
int kr_munge_token(const char *job_id, char **ret);
/* The store's token hook (kiln_store_server_opts.token_auth, userdata a
 * kr_munge_ctx): accepts a credential of this uid made for this job and
 * answers the secret in a credential only this uid can decode. */
int kr_munge_check(const void *token, size_t len, void **reply, size_t *reply_len, void *userdata);
/* The secret out of the store's answer, which must come from this uid.
 * -EACCES or -EPROTO (logged). */
int kr_munge_secret(const char *reply, char *secret, size_t len);

/* agent.c */
/* KR_SECRET_LEN random hex digits into buf (len > KR_SECRET_LEN).  Returns 0
 * or the negative errno of getrandom(). */
int kr_make_secret(char *buf, size_t len);
int kr_agent_run(const kr_opts *o, kr_job *job);
