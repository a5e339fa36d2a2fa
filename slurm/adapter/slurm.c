/* slurm.c — libkiln-slurm: every libslurm call kiln makes (kiln/slurm.h).
 *
 * libslurm is a thin client of slurmctld with two traps this file keeps
 * from its callers: slurm_init() calls fatal() (and exits the process) when
 * it finds no configuration, so kiln_slurm_init() looks first; and its
 * structures are version-specific, so they are copied into plain kiln types
 * before they leave.  Nothing here logs above debug. */
#include <errno.h>
#include <pthread.h>
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/slurm.h"
#include "kiln/strbuf.h"
/* after kiln/macro.h: <sys/param.h> only defines MIN/MAX when they are not */
#include <arpa/nameser.h>
#include <resolv.h>

/* Where libslurm 22.05 looks for its configuration, in its own order after
 * $SLURM_CONF: the compiled-in default, slurmd's configless cache, then
 * $SLURM_CONF_SERVER or a DNS SRV record. */
#define SLURM_CONF_DEFAULT    "/etc/slurm/slurm.conf"
#define SLURM_CONF_CONFIGLESS "/run/slurm/conf/slurm.conf"
#define SLURM_CONF_SRV	      "_slurmctld._tcp"

/* ---- configuration ---------------------------------------------------- */

int kiln_slurm_conf_source(char *buf, size_t len)
{
	struct stat st;
	const char *env = getenv("SLURM_CONF");
	if (env && *env) {
		/* libslurm uses $SLURM_CONF alone when it is set */
		if (stat(env, &st) == 0)
			return snprintf(buf, len, "%s", env), 0;
		snprintf(buf, len, "$SLURM_CONF names %s, which does not exist", env);
		return -ENOENT;
	}
	if (stat(SLURM_CONF_DEFAULT, &st) == 0)
		return snprintf(buf, len, "%s", SLURM_CONF_DEFAULT), 0;
	if (stat(SLURM_CONF_CONFIGLESS, &st) == 0)
		return snprintf(buf, len, "%s", SLURM_CONF_CONFIGLESS), 0;
	env = getenv("SLURM_CONF_SERVER");
	if (env && *env)
		return snprintf(buf, len, "SLURM_CONF_SERVER=%s", env), 0;
	unsigned char answer[NS_PACKETSZ];
	if (res_search(SLURM_CONF_SRV, ns_c_in, ns_t_srv, answer, sizeof(answer)) > 0)
		return snprintf(buf, len, "DNS SRV %s", SLURM_CONF_SRV), 0;
	snprintf(buf, len,
		 "no $SLURM_CONF, no " SLURM_CONF_DEFAULT ", no " SLURM_CONF_CONFIGLESS
		 ", no $SLURM_CONF_SERVER, no DNS SRV record " SLURM_CONF_SRV);
	return -ENOENT;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_libslurm(void)
{
	slurm_init(NULL);
}

int kiln_slurm_init(kiln_error *err)
{
	char where[320];
	if (kiln_slurm_conf_source(where, sizeof(where)) < 0)
		return kiln_error_setf(err, -ENOENT, "no Slurm configuration (%s)", where);
	pthread_once(&init_once, init_libslurm);
	return 0;
}

/* slurmctld refused or did not answer: its error text into err. */
static int ctld_error(kiln_error *err, const char *what)
{
	int e = slurm_get_errno();
	log_debug("slurm: %s: %s", what, slurm_strerror(e));
	return kiln_error_setf(err, -EHOSTUNREACH, "slurmctld: %s: %s", what, slurm_strerror(e));
}

/* ---- node states ------------------------------------------------------ */

const char *kiln_slurm_state_string(uint32_t s, char *buf, size_t len)
{
	static const char *const base[] = { "unknown", "down",	"idle",	 "allocated",
					    "error",   "mixed", "future" };
	uint32_t b = s & NODE_STATE_BASE;
	const char *name = b < ARRAY_SIZE(base) ? base[b] : "unknown";
	bool busy =
		b == NODE_STATE_ALLOCATED || b == NODE_STATE_MIXED || (s & NODE_STATE_COMPLETING);
	if (s & NODE_STATE_REBOOT_ISSUED)
		name = "rebooting";
	else if (s & NODE_STATE_REBOOT_REQUESTED)
		name = "reboot-pending";
	else if (s & NODE_STATE_FAIL)
		name = busy ? "failing" : "fail";
	else if ((s & NODE_STATE_DRAIN) && b != NODE_STATE_DOWN)
		name = busy ? "draining" : "drained";
	else if (b == NODE_STATE_IDLE && (s & NODE_STATE_COMPLETING))
		name = "completing";
	snprintf(buf, len, "%s%s", name, (s & NODE_STATE_NO_RESPOND) ? "*" : "");
	return buf;
}

bool kiln_slurm_state_ok(uint32_t s)
{
	uint32_t b = s & NODE_STATE_BASE;
	if (b != NODE_STATE_IDLE && b != NODE_STATE_ALLOCATED && b != NODE_STATE_MIXED)
		return false;
	return !(s &
		 (NODE_STATE_DRAIN | NODE_STATE_FAIL | NODE_STATE_NO_RESPOND |
		  NODE_STATE_REBOOT_ISSUED | NODE_STATE_REBOOT_REQUESTED | NODE_STATE_INVALID_REG));
}

bool kiln_slurm_state_drained(uint32_t s)
{
	return s & NODE_STATE_DRAIN;
}

bool kiln_slurm_state_down(uint32_t s)
{
	return (s & NODE_STATE_BASE) == NODE_STATE_DOWN ||
	       (s & (NODE_STATE_FAIL | NODE_STATE_NO_RESPOND));
}

bool kiln_slurm_state_rebooting(uint32_t s)
{
	return s & (NODE_STATE_REBOOT_REQUESTED | NODE_STATE_REBOOT_ISSUED);
}

/* ---- nodes ------------------------------------------------------------ */

static void node_clear(kiln_slurm_node *k)
{
	free(k->name);
	free(k->addr);
	free(k->reason);
}

void kiln_slurm_nodes_free(kiln_slurm_nodes *nodes)
{
	for (size_t i = 0; nodes && i < nodes->n; i++)
		node_clear(&nodes->v[i]);
	if (nodes)
		free(nodes->v);
	free(nodes);
}

/* strdup of an optional string: NULL and "" give NULL.  false: no memory. */
static bool dup_opt(const char *s, char **ret)
{
	*ret = s && *s ? strdup(s) : NULL;
	return !(s && *s) || *ret;
}

int kiln_slurm_nodes_load(const char *name, kiln_slurm_nodes **ret, kiln_error *err)
{
	assert_return(ret, -EINVAL);
	int r = kiln_slurm_init(err);
	if (r < 0)
		return r;
	node_info_msg_t *m = NULL;
	if (name) {
		char buf[KILN_HOSTNAME_MAX + 1]; /* libslurm takes a char * */
		snprintf(buf, sizeof(buf), "%s", name);
		r = slurm_load_node_single(&m, buf, SHOW_ALL);
	} else
		r = slurm_load_node(0, &m, SHOW_ALL);
	if (r != SLURM_SUCCESS)
		return ctld_error(err, "cannot load nodes");
	_cleanup_(kiln_slurm_nodes_freep) kiln_slurm_nodes *v = calloc(1, sizeof(*v));
	if (v && m && m->record_count)
		v->v = calloc(m->record_count, sizeof(*v->v));
	for (uint32_t i = 0; v && m && v->v && i < m->record_count; i++) {
		const node_info_t *ni = &m->node_array[i];
		if (!ni->name)
			continue;
		kiln_slurm_node *k = &v->v[v->n++];
		k->state = ni->node_state;
		if (!dup_opt(ni->name, &k->name) || !dup_opt(ni->node_addr, &k->addr) ||
		    !dup_opt(ni->reason, &k->reason)) {
			slurm_free_node_info_msg(m);
			return kiln_error_setf(err, -ENOMEM, "out of memory");
		}
	}
	bool short_of_memory = !v || (m && m->record_count && !v->v);
	slurm_free_node_info_msg(m);
	if (short_of_memory)
		return kiln_error_setf(err, -ENOMEM, "out of memory");
	*ret = TAKE_PTR(v);
	return 0;
}

const kiln_slurm_node *kiln_slurm_nodes_find(const kiln_slurm_nodes *nodes, const char *name)
{
	for (size_t i = 0; nodes && name && i < nodes->n; i++)
		if (streq(nodes->v[i].name, name))
			return &nodes->v[i];
	return NULL;
}

static int update_node(const char *node, uint32_t state, const char *reason, kiln_error *err)
{
	assert_return(node, -EINVAL);
	int r = kiln_slurm_init(err);
	if (r < 0)
		return r;
	update_node_msg_t u;
	slurm_init_update_node_msg(&u);
	char nodebuf[KILN_HOSTNAME_MAX + 1], reasonbuf[KILN_SLURM_REASON_MAX];
	snprintf(nodebuf, sizeof(nodebuf), "%s", node);
	u.node_names = nodebuf;
	u.node_state = state;
	if (reason) {
		snprintf(reasonbuf, sizeof(reasonbuf), "%s", reason);
		u.reason = reasonbuf;
		u.reason_uid = getuid();
	}
	if (slurm_update_node(&u) != SLURM_SUCCESS)
		return ctld_error(err, state == NODE_RESUME ? "cannot resume node"
							    : "cannot drain node");
	return 0;
}

int kiln_slurm_node_drain(const char *node, const char *reason, kiln_error *err)
{
	assert_return(reason, -EINVAL);
	return update_node(node, NODE_STATE_DRAIN, reason, err);
}

int kiln_slurm_node_resume(const char *node, kiln_error *err)
{
	return update_node(node, NODE_RESUME, NULL, err);
}

int kiln_slurm_reboot_asap(const char *nodes, const char *reason, kiln_error *err)
{
	assert_return(nodes && reason, -EINVAL);
	_cleanup_free_ char *rs = NULL, *hl = strdup(nodes);
	if (asprintf(&rs, "reason=%s", reason) < 0 || !hl)
		return kiln_error_setf(err, -ENOMEM, "out of memory");
	char *const argv[] = { "scontrol", "reboot", "ASAP", "nextstate=RESUME", rs, hl, NULL };
	pid_t pid = fork();
	if (pid < 0)
		return kiln_error_setf(err, -errno, "cannot start scontrol: %s", strerror(errno));
	if (pid == 0) {
		execvp("scontrol", argv);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return kiln_error_setf(err, -errno, "waiting for scontrol: %s",
					       strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		return kiln_error_setf(err, -ENOEXEC, "cannot run scontrol (install slurm-client)");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return kiln_error_setf(err, -EIO, "scontrol reboot %s failed (%s %d)", nodes,
				       WIFEXITED(st) ? "exit" : "signal",
				       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return 0;
}

/* ---- jobs ------------------------------------------------------------- */

void kiln_slurm_jobs_free(kiln_slurm_job *jobs, size_t n)
{
	for (size_t i = 0; jobs && i < n; i++)
		free(jobs[i].nodes);
	free(jobs);
}

int kiln_slurm_jobs_running(kiln_slurm_job **ret, size_t *ret_n, kiln_error *err)
{
	assert_return(ret && ret_n, -EINVAL);
	int r = kiln_slurm_init(err);
	if (r < 0)
		return r;
	job_info_msg_t *m = NULL;
	if (slurm_load_jobs(0, &m, SHOW_ALL) != SLURM_SUCCESS)
		return ctld_error(err, "cannot load jobs");
	kiln_slurm_job *v = calloc(m && m->record_count ? m->record_count : 1, sizeof(*v));
	size_t n = 0;
	for (uint32_t i = 0; v && m && i < m->record_count; i++) {
		const slurm_job_info_t *j = &m->job_array[i];
		if ((j->job_state & JOB_STATE_BASE) != JOB_RUNNING || !j->nodes)
			continue;
		v[n].id = j->job_id;
		v[n].nodes = strdup(j->nodes);
		if (!v[n++].nodes) {
			kiln_slurm_jobs_free(v, n);
			v = NULL;
		}
	}
	slurm_free_job_info_msg(m);
	if (!v)
		return kiln_error_setf(err, -ENOMEM, "out of memory");
	*ret = v;
	*ret_n = n;
	return 0;
}

int kiln_slurm_requeue(const char *job_id, kiln_error *err)
{
	uint64_t id;
	if (kiln_parse_uint64(job_id ? job_id : "", UINT32_MAX, &id) < 0)
		return kiln_error_setf(err, -EINVAL, "'%s' is not a Slurm job id",
				       strempty(job_id));
	int r = kiln_slurm_init(err);
	if (r < 0)
		return r;
	if (slurm_requeue((uint32_t) id, 0) != SLURM_SUCCESS)
		return ctld_error(err, "cannot requeue the job");
	return 0;
}

/* ---- hostlists and the step's environment ----------------------------- */

int kiln_slurm_hostlist_expand(const char *list, char ***ret, size_t *ret_n)
{
	assert_return(list && ret && ret_n, -EINVAL);
	char *buf = strdupa(list); /* libslurm takes a char * */
	hostlist_t hl = slurm_hostlist_create(buf);
	if (!hl)
		return -EINVAL;
	_cleanup_strv_free_ char **v = NULL;
	size_t n = 0;
	char *h;
	int r = 0;
	while ((h = slurm_hostlist_shift(hl))) {
		if (n >= KILN_HOSTLIST_MAX)
			r = -E2BIG;
		else if (strv_extend(&v, h) < 0)
			r = -ENOMEM;
		else
			n++;
		free(h);
		if (r < 0)
			break;
	}
	slurm_hostlist_destroy(hl);
	if (r < 0)
		return r;
	if (n == 0)
		return -EINVAL;
	*ret = TAKE_PTR(v);
	*ret_n = n;
	return 0;
}

int kiln_slurm_env_read(kiln_slurm_env *ret, kiln_error *err)
{
	assert_return(ret, -EINVAL);
	kiln_slurm_env e = {
		.job_id = getenv("SLURM_JOB_ID"),
		.nodelist = getenv("SLURM_JOB_NODELIST") ?: getenv("SLURM_NODELIST"),
		.node = getenv("SLURMD_NODENAME"),
	};
	if (!e.job_id || !e.nodelist || !e.node)
		return kiln_error_setf(err, -ENOENT,
				       "SLURM_JOB_ID, SLURM_JOB_NODELIST or SLURMD_NODENAME is "
				       "not set");
	*ret = e;
	return 0;
}
