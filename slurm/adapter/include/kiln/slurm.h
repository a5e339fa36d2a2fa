/* kiln/slurm.h — libkiln-slurm, the one place kiln talks to Slurm.
 *
 * Every libslurm call kiln makes goes through here: finding the
 * configuration libslurm would read (so that slurm_init() never calls
 * fatal() and exits the program), node states and reasons, drain and
 * resume with a reason, `scontrol reboot`, running jobs, requeue, hostlist
 * expansion in Slurm's own order, and the job as the Slurm environment of a
 * step describes it.  Callers see plain C types and never include
 * <slurm/slurm.h>.
 *
 * Contract: functions return >= 0 on success and -errno on failure; output
 * parameters are untouched on failure.  A kiln_error (NULL allowed) gets the
 * message for a user, with libslurm's own error text where there is one.
 * Nothing here logs above debug or exits.  Errors every call to slurmctld
 * can return: -ENOENT no Slurm configuration (kiln_slurm_init()),
 * -EHOSTUNREACH slurmctld did not answer or refused, -ENOMEM. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Slurm keeps a node's reason short; kiln's reasons are cut to this. */
#define KILN_SLURM_REASON_MAX 256

/* ---- configuration ---------------------------------------------------- */

/* Writes where libslurm 22.05 would read its configuration from to buf
 * ($SLURM_CONF, /etc/slurm/slurm.conf, configless /run/slurm/conf/slurm.conf,
 * $SLURM_CONF_SERVER, DNS SRV _slurmctld._tcp, in libslurm's order).
 * -ENOENT: none; buf then says what was looked for. */
int kiln_slurm_conf_source(char *buf, size_t len);

/* kiln_slurm_conf_source(), then slurm_init() once per process.  Every
 * function below that talks to slurmctld calls it first.  -ENOENT: no
 * configuration (err->msg: what was looked for). */
int kiln_slurm_init(kiln_error *err);

/* ---- node states ------------------------------------------------------ */

/* A node state as sinfo would say it, lower case: idle, mixed, allocated,
 * drained, draining, down, rebooting, reboot-pending, fail, completing ...,
 * with "*" when the node does not respond.  Returns buf. */
const char *kiln_slurm_state_string(uint32_t state, char *buf, size_t len);
/* In service: idle, mixed or allocated, and not drained, failing, rebooting
 * or unresponsive. */
bool kiln_slurm_state_ok(uint32_t state);
bool kiln_slurm_state_drained(uint32_t state);
/* Down, failing or not responding: out of service without an admin's say
 * (a drain is a choice; this is a fault). */
bool kiln_slurm_state_down(uint32_t state);
/* A reboot requested (pending) or issued. */
bool kiln_slurm_state_rebooting(uint32_t state);

typedef struct kiln_slurm_node {
	char *name;
	char *addr;   /* NodeAddr; NULL when Slurm has none */
	char *reason; /* NULL when none */
	uint32_t state;
} kiln_slurm_node;

typedef struct kiln_slurm_nodes {
	kiln_slurm_node *v;
	size_t n;
} kiln_slurm_nodes;

/* Loads the node `name` (NULL: every node) from slurmctld into *ret (free
 * with kiln_slurm_nodes_free()).  A name Slurm does not know gives n == 0. */
int kiln_slurm_nodes_load(const char *name, kiln_slurm_nodes **ret, kiln_error *err);
void kiln_slurm_nodes_free(kiln_slurm_nodes *nodes);
static inline void kiln_slurm_nodes_freep(kiln_slurm_nodes **p)
{
	kiln_slurm_nodes_free(*p);
}
/* The node called name, or NULL (also for NULL nodes). */
const kiln_slurm_node *kiln_slurm_nodes_find(const kiln_slurm_nodes *nodes, const char *name);

/* Drains node with reason (cut to KILN_SLURM_REASON_MAX), as this uid. */
int kiln_slurm_node_drain(const char *node, const char *reason, kiln_error *err);
/* Resumes node (clears the drain and its reason). */
int kiln_slurm_node_resume(const char *node, kiln_error *err);

/* `scontrol reboot ASAP nextstate=RESUME reason=REASON NODES`: slurmctld
 * drains NODES, lets their jobs end and has slurmd run RebootProgram
 * (slurm_reboot_nodes() is not in 22.05's public header, hence scontrol;
 * its own messages go to stderr).  -ENOEXEC: scontrol could not be run
 * (slurm-client missing); -EIO: it failed (err->msg has its exit status). */
int kiln_slurm_reboot_asap(const char *nodes, const char *reason, kiln_error *err);

/* ---- jobs ------------------------------------------------------------- */

typedef struct kiln_slurm_job {
	uint32_t id;
	char *nodes; /* hostlist of its nodes */
} kiln_slurm_job;

/* The running jobs that have nodes, into *ret / *ret_n (free with
 * kiln_slurm_jobs_free()). */
int kiln_slurm_jobs_running(kiln_slurm_job **ret, size_t *ret_n, kiln_error *err);
void kiln_slurm_jobs_free(kiln_slurm_job *jobs, size_t n);

/* Requeues job_id (a decimal Slurm job id).  -EINVAL: not a job id. */
int kiln_slurm_requeue(const char *job_id, kiln_error *err);

/* ---- hostlists and the step's environment ----------------------------- */

/* Expands a Slurm hostlist with libslurm (Slurm's node order) into a
 * NULL-terminated vector (strv_free()).  -EINVAL: not a hostlist or empty;
 * -E2BIG: more than KILN_HOSTLIST_MAX names. */
int kiln_slurm_hostlist_expand(const char *list, char ***ret, size_t *ret_n);

/* What a job step's environment says about the job (pointers into the
 * environment). */
typedef struct kiln_slurm_env {
	const char *job_id;   /* SLURM_JOB_ID */
	const char *nodelist; /* SLURM_JOB_NODELIST, else SLURM_NODELIST */
	const char *node;     /* SLURMD_NODENAME: this node */
} kiln_slurm_env;

/* -ENOENT: one of them is not set (err->msg names them). */
int kiln_slurm_env_read(kiln_slurm_env *ret, kiln_error *err);

#ifdef __cplusplus
}
#endif
