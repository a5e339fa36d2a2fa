/* main.c — kiln-healthd: the GPU health daemon (and its one-shot check).
 *
 *   kiln-healthd [-c FILE] [--node NAME]            run as a systemd service
 *   kiln-healthd --check [--json]                   one poll; exit 0 healthy, 1 unhealthy
 *   kiln-healthd --active                           run the active GPU checks
 *   kiln-healthd --clear-xid GPU|all                forget XIDs after a GPU reset
 *
 * The daemon: load the cluster file (kiln_cfg_open), open NVML, start the
 * XID thread, poll every GPU, publish /metrics, tell systemd READY=1 after
 * the first full check, then run the sd-event loop: the poll timer (every
 * health.interval), the active checks' timer, the wake pipe (XIDs as they
 * come, the end of a round of active checks), signals (SIGTERM/SIGINT stop
 * cleanly, SIGHUP polls now) and the watchdog (sd_event_set_watchdog).
 * Slurm drain/resume runs in its own thread (slurm.c).  Exit codes:
 * KILN_EXIT_OK, KILN_EXIT_FAILURE (also: unhealthy), KILN_EXIT_USAGE (usage
 * or config error). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>

#include "healthd.h"
#include "kiln/http.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

/* XIDs arriving between two wake-ups of the main loop.  A storm beyond this
 * drops the excess (the XID thread must not block on the main loop); the
 * number dropped is logged at the next wake-up. */
#define HD_XID_QUEUE 256

static const char *arg_config;
static const char *arg_node;
static bool arg_check, arg_json, arg_active;
static int arg_metrics_port = -1; /* -1: from the cluster file */
static const char *arg_xid_state; /* NULL: $KILN_HEALTHD_XID_STATE or HD_XID_STATE_PATH */
static const char *arg_clear_xid;

typedef struct manager {
	hd_settings s;
	kiln_cfg *cfg;
	char host[KILN_HOSTNAME_MAX + 1];
	hd_nvml *nvml;
	char nvml_error[256];
	bool nvml_init_hung;
	pthread_mutex_t lock; /* node, metrics */
	hd_node node;
	char *metrics;
	char last_reasons[HD_GPUS_MAX + 1][512];
	hd_state last_state[HD_GPUS_MAX + 1];
	kiln_http_server *http;
	hd_slurm *slurm;
	int wake[2];
	struct {
		int gpu, xid;
	} xq[HD_XID_QUEUE];
	unsigned xh, xt;
	unsigned xid_dropped;
	/* the event loop: signals, the wake pipe, the poll and active timers;
	 * it pings the watchdog itself (sd_event_set_watchdog) */
	sd_event *event;
	sd_event_source *poll_timer, *active_timer;
	/* the watchdog interval (0: none), and the last ping poll_all() sent
	 * while it kept the loop from running */
	uint64_t watchdog_usec, last_watchdog;
	/* active checks run in their own thread: they take gemm_seconds per GPU */
	pthread_t active_thread;
	atomic_bool active_running, active_done;
	bool active_due; /* the schedule says run; starts when none runs and NVML is up */
	char last_status[300];
	/* XIDs that drain, mirrored in the XID state file; the main thread only */
	hd_xid_state xs;
	struct stat xs_seen; /* the file as last read or written (st_ino 0: none) */
	bool xs_checked;
} manager;

enum {
	OPT_CHECK = KILN_OPT_FIRST,
	OPT_ACTIVE,
	OPT_METRICS_PORT,
	OPT_CLEAR_XID,
	OPT_XID_STATE,
};

static const kiln_option options[] = {
	KILN_OPTION_CONFIG,
	KILN_OPTION_NODE,
	{ "check", OPT_CHECK, NULL, "check once, print a table, exit 0 healthy / 1 unhealthy",
	  NULL },
	KILN_OPTION_JSON,
	{ "active", OPT_ACTIVE, NULL, "run the active checks (GEMM, bandwidth, memtest) and exit",
	  NULL },
	{ "metrics-port", OPT_METRICS_PORT, "N", "override health.metrics_port (0: no HTTP server)",
	  NULL },
	{ "clear-xid", OPT_CLEAR_XID, "GPU|all",
	  "after a GPU reset: forget its drain XIDs (GPU: index or\n"
	  "UUID); the daemon resumes the node after recover_after",
	  NULL },
	{ "xid-state", OPT_XID_STATE, "FILE",
	  "XID state file (default $" HD_XID_STATE_ENV " or\n" HD_XID_STATE_PATH ")", "file" },
	KILN_OPTIONS_COMMON,
	{},
};

static const kiln_prog prog = {
	.name = "kiln-healthd",
	.summary = "the kiln GPU health daemon",
	.usage = "kiln-healthd [-c FILE] [--node NAME]     run as a systemd service\n"
		 "kiln-healthd --check [--json]            one poll; exit 0 healthy, 1 unhealthy\n"
		 "kiln-healthd --active                    run the active GPU checks\n"
		 "kiln-healthd --clear-xid GPU|all         forget XIDs after a GPU reset",
	.options = options,
	.epilog = "Checks every GPU through NVML, exports dcgm-exporter compatible metrics,\n"
		  "and drains or resumes the node in Slurm.\n\n"
		  "Exit status: 0 ok, 1 failure or unhealthy, 2 usage or config error.\n"
		  "See kiln-healthd(8).\n",
};

static const char *xid_state_path(void)
{
	return arg_xid_state
		       ?: (!streq(strempty(getenv(HD_XID_STATE_ENV)), "") ? getenv(HD_XID_STATE_ENV)
									  : HD_XID_STATE_PATH);
}

static int parse_argv(int argc, char **argv)
{
	int c;
	while ((c = kiln_getopt(&prog, argc, argv)) >= 0)
		switch (c) {
		case 'c':
			arg_config = optarg;
			break;
		case KILN_OPT_NODE:
			arg_node = optarg;
			break;
		case OPT_CHECK:
			arg_check = true;
			break;
		case KILN_OPT_JSON:
			arg_json = true;
			break;
		case OPT_ACTIVE:
			arg_active = true;
			break;
		case OPT_CLEAR_XID:
			arg_clear_xid = optarg;
			break;
		case OPT_XID_STATE:
			arg_xid_state = optarg;
			break;
		case OPT_METRICS_PORT:
			if (kiln_parse_int(optarg, 0, 65535, &arg_metrics_port) < 0)
				return kiln_usage_error(&prog,
							"Invalid --metrics-port '%s': expected a "
							"port number 0..65535.",
							optarg);
			break;
		default: {
			int r = kiln_prog_option(&prog, c);
			if (r <= 0)
				return r;
		}
		}
	if (optind < argc)
		return kiln_usage_error(&prog, "Unexpected argument '%s'.", argv[optind]);
	if (arg_json && !arg_check)
		return kiln_usage_error(&prog, "--json only goes with --check.");
	return 1;
}

/* The cluster file through kiln_cfg_open(): -c, $KILN_CONFIG, or the
 * default path.  Without -c or $KILN_CONFIG a missing default file is fine
 * (built-in defaults, no GPU count check, no Slurm); any other problem is a
 * config error.  The node: --node, $SLURMD_NODENAME, or the hostname. */
static int load_config(manager *m)
{
	const char *source;
	int r = hd_settings_defaults(&m->s);
	if (r < 0)
		return log_error_errno(r, "Failed to build the default settings: %m");
	r = kiln_node_name(arg_node, m->host, sizeof(m->host), &source);
	if (r < 0) {
		log_error("The node name from %s is longer than %zu characters.", source,
			  sizeof(m->host) - 1);
		return -EINVAL;
	}
	snprintf(m->s.node, sizeof(m->s.node), "%s", m->host);

	r = kiln_cfg_open(arg_config, KILN_CFG_OPEN_OPTIONAL, &m->cfg);
	if (r < 0)
		return r;
	if (!m->cfg) {
		log_info("No cluster file at %s: using built-in defaults, no GPU count check, no "
			 "Slurm drain",
			 kiln_cfg_default_path());
		m->s.drain = false;
		return 0;
	}
	const char *path = m->cfg->path;
	const kiln_cfg_node *node = kiln_cfg_find_node(m->cfg, m->host);
	if (!node && arg_node) {
		log_error("Node '%s' is not in %s; pass a node name from the cluster file with "
			  "--node.",
			  m->host, path);
		return -EINVAL;
	}
	if (!node && streq(source, "hostname"))
		log_warning(
			"This host (%s) is not a node of %s: no GPU count check, no Slurm drain; "
			"use --node NAME if the hostname differs",
			m->host, path);
	else if (!node)
		log_warning("Node %s (%s) is not a node of %s: no GPU count check, no Slurm "
			    "drain; use --node NAME",
			    m->host, source, path);
	hd_settings_from_cfg(&m->s, m->cfg, node);
	if (!node)
		m->s.drain = false;
	return 0;
}

/* The Slurm job of a process: from its cgroup path (".../job_123/step_0"
 * with proctrack/cgroup), else from SLURM_JOB_ID in its environment. */
static int job_of_pid(unsigned pid, char *buf, size_t len)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%u/cgroup", pid);
	_cleanup_free_ char *text = NULL;
	if (kiln_read_file(p, 64 * 1024, &text, NULL) >= 0) {
		const char *j = strstr(text, "/job_");
		if (j) {
			j += 5;
			size_t n = strspn(j, "0123456789");
			if (n > 0 && n < len) {
				memcpy(buf, j, n);
				buf[n] = 0;
				return 0;
			}
		}
	}
	snprintf(p, sizeof(p), "/proc/%u/environ", pid);
	_cleanup_free_ char *env = NULL;
	size_t envlen = 0;
	if (kiln_read_file(p, 1024 * 1024, &env, &envlen) < 0)
		return -ENOENT;
	for (size_t off = 0; off < envlen; off += strlen(env + off) + 1) {
		const char *v = startswith(env + off, "SLURM_JOB_ID=");
		if (v && *v && strspn(v, "0123456789") == strlen(v) && strlen(v) < len) {
			snprintf(buf, len, "%s", v);
			return 0;
		}
	}
	return -ENOENT;
}

/* Slurm job ids of the processes on a GPU, comma separated. */
static void job_ids(const hd_sample *s, char *buf, size_t len)
{
	buf[0] = 0;
	for (unsigned i = 0; i < s->n_pids; i++) {
		char j[24];
		if (job_of_pid(s->pids[i], j, sizeof(j)) < 0)
			continue;
		char pat[32];
		snprintf(pat, sizeof(pat), ",%s,", j);
		char have[80];
		snprintf(have, sizeof(have), ",%s,", buf);
		if (strstr(have, pat) || strlen(buf) + strlen(j) + 2 > len)
			continue;
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? "," : "", j);
	}
}

/* The event loop pings the watchdog (sd_event_set_watchdog), but
 * poll_all() keeps it from running for up to health.nvml_timeout per GPU
 * whose NVML call hangs: between GPUs it pings itself, at a third of the
 * interval (one hung call between two pings still leaves margin). */
static void watchdog_keepalive(manager *m)
{
	if (!m->watchdog_usec)
		return;
	uint64_t now = kiln_now_usec();
	if (now - m->last_watchdog >= m->watchdog_usec / 3) {
		sd_notify(0, "WATCHDOG=1");
		m->last_watchdog = now;
	}
}

/* Logs what changed since the last evaluation: state transitions and new
 * reasons, at the journal priority that matches the state. */
static void log_changes(manager *m)
{
	for (int i = -1; i < m->node.n_gpus; i++) {
		const hd_reasons *r = i < 0 ? &m->node.reasons : &m->node.gpus[i].reasons;
		hd_state st = i < 0 ? hd_reasons_state(r) : m->node.gpus[i].state;
		char joined[512] = "";
		for (int k = 0; k < r->n; k++)
			snprintf(joined + strlen(joined), sizeof(joined) - strlen(joined), "%s%s",
				 k ? "; " : "", r->v[k].text);
		int slot = i + 1;
		if (st == m->last_state[slot] && streq(joined, m->last_reasons[slot]))
			continue;
		char who[160];
		if (i < 0)
			snprintf(who, sizeof(who), "node %s", m->host);
		else
			snprintf(who, sizeof(who), "gpu%d (%s)", i,
				 m->node.gpus[i].cur.uuid[0] ? m->node.gpus[i].cur.uuid : "?");
		if (st == HD_UNHEALTHY)
			log_error("%s unhealthy: %s", who, joined);
		else if (st == HD_DEGRADED)
			log_warning("%s degraded: %s", who, joined);
		else if (m->node.polls > 1 || m->last_state[slot] != HD_HEALTHY)
			log_notice("%s healthy again", who);
		m->last_state[slot] = st;
		snprintf(m->last_reasons[slot], sizeof(m->last_reasons[slot]), "%s", joined);
	}
}

/* After any change: evaluate, log, re-render metrics, tell Slurm and
 * systemd.  Called with m->lock held. */
static void publish(manager *m)
{
	uint64_t now = kiln_now_usec();
	if (!arg_check)
		hd_xid_state_apply(&m->xs, &m->node);
	hd_node_evaluate(&m->s, &m->node, now);
	log_changes(m);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	hd_metrics_render(&m->node, m->host, &b);
	char reason[HD_SLURM_REASON_MAX];
	bool drain = hd_node_drain_reason(&m->node, reason, sizeof(reason));
	kiln_metrics km;
	kiln_metrics_init(&km, &b);
	/* the reason kiln drains the node for, for dashboards (docs/monitoring.md) */
	kiln_metrics_family(&km, "kiln_node_drain", KILN_METRIC_GAUGE,
			    "1 while the node is unhealthy, with the reason kiln drains it for in "
			    "Slurm (health.drain).");
	if (drain)
		kiln_metrics_sample(
			&km, (const char *[]){ "Hostname", m->host, "reason", reason, NULL }, 1);
	if (m->slurm) {
		kiln_metrics_family(&km, "kiln_slurm_reachable", KILN_METRIC_GAUGE,
				    "Whether slurmctld answered the last request.");
		kiln_metrics_sample(&km, NULL, hd_slurm_reachable(m->slurm) > 0);
	}
	if (m->nvml) {
		kiln_metrics_family(&km, "kiln_nvml_hung_calls", KILN_METRIC_GAUGE,
				    "NVML calls that timed out and have not returned.");
		kiln_metrics_sample(&km, NULL, hd_nvml_abandoned(m->nvml));
	}
	kiln_metrics_finish(&km);
	char *txt = kiln_strbuf_steal(&b);
	if (txt) {
		free(m->metrics);
		m->metrics = txt;
	}
	bool resume_ok = m->node.state == HD_HEALTHY && m->node.healthy_since_usec &&
			 now - m->node.healthy_since_usec >= m->s.recover_after_usec;
	if (m->slurm)
		hd_slurm_want(m->slurm, drain, reason, resume_ok);
	char status[sizeof(m->last_status)];
	hd_node_summary(&m->node, status, sizeof(status));
	if (!streq(status, m->last_status)) {
		sd_notifyf(0, "STATUS=%s", status);
		memcpy(m->last_status, status, sizeof(status));
	}
}

static void on_xid(int gpu, int xid, void *data);
static int open_nvml(manager *m);

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Writes the XID state file (creating its directory when run outside
 * systemd's RuntimeDirectory=). */
static int xid_state_write(const char *path, const hd_xid_state *st)
{
	int r = hd_xid_state_save(path, st);
	if (r == -ENOENT) {
		_cleanup_free_ char *dir = strdup(path);
		if (!dir)
			return -ENOMEM;
		if (mkdir(dirname(dir), 0755) < 0 && errno != EEXIST)
			return -errno;
		r = hd_xid_state_save(path, st);
	}
	return r;
}

/* Re-reads the XID state file when it changed on disk (an admin's
 * --clear-xid, or a restart).  A missing file means nothing is drained by
 * XIDs.  A file that cannot be read keeps the node drained: it exists only
 * because some XID drained the node, and which GPU needs a reset is then
 * unknown.  Called from the main thread with m->lock held. */
static void xid_state_sync(manager *m)
{
	const char *path = xid_state_path();
	struct stat st = {};
	if (stat(path, &st) < 0)
		st = (struct stat){};
	if (m->xs_checked && same_file(&st, &m->xs_seen))
		return;
	bool first = !m->xs_checked;
	m->xs_checked = true;
	m->xs_seen = st;
	static hd_xid_state n; /* large: off the stack */
	int line = 0, r = st.st_ino ? hd_xid_state_load(path, &n, &line) : -ENOENT;
	if (r == -ENOENT) {
		if (m->xs.n > 0)
			log_notice("XID state file %s is gone: forgetting %d XID(s)", path,
				   m->xs.n);
		m->xs.n = 0;
		m->node.xid_state_error[0] = 0;
		return;
	}
	if (r < 0) {
		char where[32] = "";
		if (r == -EBADMSG && line > 0)
			snprintf(where, sizeof(where), ":%d", line);
		char what[96] = "corrupt";
		if (r != -EBADMSG)
			snprintf(what, sizeof(what), "unreadable (%s)", strerror(-r));
		log_error("XID state file %s%s is %s: keeping the node drained (a GPU may need a "
			  "reset); after resetting the GPUs run 'kiln-healthd --clear-xid all'",
			  path, where, what);
		snprintf(m->node.xid_state_error, sizeof(m->node.xid_state_error),
			 "XID state file %s unreadable", path);
		return;
	}
	m->node.xid_state_error[0] = 0;
	if (n.n > 0)
		log_notice("XID state file %s: %d XID(s) keep GPUs drained%s", path, n.n,
			   first && !arg_check ? " (from before a restart)" : "");
	else if (m->xs.n > 0)
		log_notice("XID state file %s: cleared, no XID keeps a GPU drained now", path);
	m->xs = n;
}

/* After the first poll: say which entries match no GPU now. */
static void xid_state_unmatched(manager *m)
{
	for (int k = 0; k < m->xs.n; k++)
		if (hd_xid_state_find_gpu(&m->xs.v[k], &m->node) < 0)
			log_notice("XID state: gpu%d %s (XID %d) is not present now, ignoring it",
				   m->xs.v[k].gpu, m->xs.v[k].uuid[0] ? m->xs.v[k].uuid : "-",
				   m->xs.v[k].xid);
}

/* kiln-healthd --clear-xid GPU|all */
static int run_clear_xid(void)
{
	const char *path = xid_state_path();
	static hd_xid_state st; /* large: off the stack */
	int line = 0, r = hd_xid_state_load(path, &st, &line);
	if (r == -ENOENT) {
		printf("No XID state file at %s: nothing to clear\n", path);
		return 0;
	}
	if (r < 0 && !(streq(arg_clear_xid, "all") && r == -EBADMSG)) {
		log_error("Cannot read XID state file %s%s: %s; 'kiln-healthd --clear-xid all' "
			  "replaces a corrupt file",
			  path, line > 0 ? " (bad line)" : "",
			  r == -EBADMSG ? "corrupt" : strerror(-r));
		return KILN_EXIT_FAILURE;
	}
	if (r < 0)
		st.n = 0; /* corrupt, and "all": start over */
	int removed = r < 0 ? 0 : hd_xid_state_clear(&st, arg_clear_xid);
	if (removed < 0) {
		log_error("Invalid --clear-xid '%s': expected a GPU index, a GPU UUID or 'all'",
			  arg_clear_xid);
		return KILN_EXIT_USAGE;
	}
	r = xid_state_write(path, &st);
	if (r < 0) {
		log_error_errno(r, "Failed to write %s: %m", path);
		return KILN_EXIT_FAILURE;
	}
	printf("Cleared %d XID entr%s for %s in %s (%d left); kiln-healthd picks this up at its "
	       "next poll\n",
	       removed, removed == 1 ? "y" : "ies", arg_clear_xid, path, st.n);
	return 0;
}

static int poll_all(manager *m)
{
	int n = 0;
	if (!m->nvml && !arg_check && !m->nvml_init_hung) {
		/* the driver may come up after us (module load, persistenced) */
		if (open_nvml(m) < 0) {
			if (m->nvml_init_hung)
				log_error("nvmlInit hangs: %s; not retrying, restart kiln-healthd "
					  "once the "
					  "driver is fixed",
					  m->nvml_error);
			pthread_mutex_lock(&m->lock);
			m->node.polls++;
			publish(m);
			pthread_mutex_unlock(&m->lock);
			return 0;
		}
		log_notice("NVML is available now (%s)", m->s.nvml_library);
		pthread_mutex_lock(&m->lock);
		m->node.nvml_down[0] = 0;
		pthread_mutex_unlock(&m->lock);
		if (hd_nvml_start_events(m->nvml, on_xid, m) < 0)
			log_warning("NVML event API unavailable: XIDs are not watched");
	}
	if (!m->nvml)
		return 0;
	int r = hd_nvml_count(m->nvml, &n);
	if (r < 0) {
		/* keep the last count: a hung or failing count must not make every GPU vanish */
		n = m->node.n_gpus;
		log_debug("NVML device count failed: %s", strerror(-r));
	}
	n = MIN(n, HD_GPUS_MAX);
	for (int i = 0; i < n; i++) {
		hd_sample s;
		pthread_mutex_lock(&m->lock);
		s = m->node.gpus[i].cur; /* identity survives a failed poll */
		pthread_mutex_unlock(&m->lock);
		memset(s.hung_call, 0, sizeof(s.hung_call));
		s.lost = false;
		hd_nvml_poll(m->nvml, i, &s);
		char jobs[64];
		job_ids(&s, jobs, sizeof(jobs));
		pthread_mutex_lock(&m->lock);
		hd_gpu *g = &m->node.gpus[i];
		g->index = i;
		if (g->cur.at_usec) {
			g->prev = g->cur;
			g->have_prev = true;
		}
		g->cur = s;
		snprintf(g->job_ids, sizeof(g->job_ids), "%s", jobs);
		pthread_mutex_unlock(&m->lock);
		watchdog_keepalive(m); /* a hung call per GPU must not starve the watchdog */
	}
	pthread_mutex_lock(&m->lock);
	m->node.n_gpus = n;
	m->node.polls++;
	publish(m);
	pthread_mutex_unlock(&m->lock);
	return 0;
}

static void on_xid(int gpu, int xid, void *data)
{
	manager *m = data;
	pthread_mutex_lock(&m->lock);
	if (m->xt - m->xh < HD_XID_QUEUE) {
		m->xq[m->xt % HD_XID_QUEUE].gpu = gpu;
		m->xq[m->xt % HD_XID_QUEUE].xid = xid;
		m->xt++;
	} else
		m->xid_dropped++;
	pthread_mutex_unlock(&m->lock);
	char c = 'x';
	(void) !write(m->wake[1], &c, 1);
}

static void handle_xids(manager *m)
{
	char buf[64];
	while (read(m->wake[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&m->lock);
	bool any = false;
	if (m->xid_dropped) {
		log_warning("%u XID events dropped: more than %d arrived between two wake-ups "
			    "(XID storm); kiln_xid_total undercounts them",
			    m->xid_dropped, HD_XID_QUEUE);
		m->xid_dropped = 0;
	}
	while (m->xh != m->xt) {
		int gpu = m->xq[m->xh % HD_XID_QUEUE].gpu, xid = m->xq[m->xh % HD_XID_QUEUE].xid;
		m->xh++;
		if (gpu < 0 || gpu >= m->node.n_gpus) {
			log_warning("XID %d on an unknown GPU, ignoring", xid);
			continue;
		}
		kiln_cfg_action a = hd_gpu_add_xid(&m->s, &m->node.gpus[gpu], xid);
		if (a >= KILN_ACTION_DRAIN &&
		    hd_xid_state_add(&m->xs, gpu, m->node.gpus[gpu].cur.uuid, xid, a,
				     (int64_t) time(NULL))) {
			const char *path = xid_state_path();
			/* an unreadable file may hold what it cannot tell: keep it */
			int r = m->node.xid_state_error[0] ? -EBADMSG
							   : xid_state_write(path, &m->xs);
			if (r == -EBADMSG)
				log_error("XID %d of gpu%d is not saved: %s is unreadable (kept as "
					  "it is); the XID holds in memory only",
					  xid, gpu, path);
			else if (r < 0)
				log_error_errno(r,
						"Failed to save XID %d of gpu%d to %s: %m; a "
						"restart of kiln-healthd would forget it",
						xid, gpu, path);
			else if (stat(path, &m->xs_seen) < 0)
				m->xs_seen = (struct stat){};
		}
		int prio = a == KILN_ACTION_IGNORE ? LOG_INFO
			   : a == KILN_ACTION_APP  ? LOG_WARNING
						   : LOG_ERR;
		log_full(prio, "gpu%d: XID %d (%s): action %s", gpu, xid, hd_xid_what(xid),
			 kiln_cfg_action_to_string(a));
		any = true;
	}
	if (any)
		publish(m);
	pthread_mutex_unlock(&m->lock);
}

/* /metrics, /health and / on the common HTTP glue (kiln/http.h): it
 * answers 404/405 (with Allow) in OpenAI's error shape and HEAD like GET. */
static int http_metrics(kiln_http_request *r, void *userdata)
{
	manager *m = userdata;
	pthread_mutex_lock(&m->lock);
	_cleanup_free_ char *body = strdup(m->metrics ?: "");
	pthread_mutex_unlock(&m->lock);
	if (!body)
		return -ENOMEM;
	return kiln_http_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", body,
				    strlen(body));
}

static int http_health(kiln_http_request *r, void *userdata)
{
	manager *m = userdata;
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	pthread_mutex_lock(&m->lock);
	hd_json_render(&m->node, m->host, &b);
	pthread_mutex_unlock(&m->lock);
	if (kiln_strbuf_error(&b) < 0)
		return -ENOMEM;
	return kiln_http_reply_text(r, 200, "application/json", b.s ?: "", b.len);
}

static int http_root(kiln_http_request *r, void *userdata)
{
	static const char msg[] = "kiln-healthd: see /metrics (Prometheus) and /health (JSON)\n";
	return kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
}

static int start_http(manager *m)
{
	int port = arg_metrics_port >= 0 ? arg_metrics_port : m->s.metrics_port;
	if (port == 0)
		return 0;
	struct in_addr a;
	if (inet_pton(AF_INET, m->s.metrics_address, &a) != 1) {
		log_error(
			"health.metrics_address '%s' is not an IPv4 address; fix the cluster file.",
			m->s.metrics_address);
		return -EINVAL;
	}
	const kiln_http_route routes[] = {
		{ "GET", "/metrics", false, http_metrics, m },
		{ "GET", "/health", false, http_health, m },
		{ "GET", "/", false, http_root, m },
	};
	kiln_http_config cfg = {
		.address = m->s.metrics_address,
		.port = (uint16_t) port,
		.threads = 1, /* a scrape every few seconds */
		.max_connections = 64,
		.idle_timeout_s = 10,
		.max_body_bytes = 4096, /* GET only */
		.routes = routes,
		.n_routes = ARRAY_SIZE(routes),
	};
	int r = kiln_http_server_start(&cfg, &m->http);
	if (r < 0)
		return log_error_errno(
			r,
			"Failed to listen on %s:%d for /metrics (in use? set health.metrics_port)",
			m->s.metrics_address, port);
	log_info("Serving /metrics on %s:%d", m->s.metrics_address, port);
	return 0;
}

static int open_nvml(manager *m)
{
	int r = hd_nvml_open(m->s.nvml_library, m->s.nvml_timeout_usec, &m->nvml, m->nvml_error,
			     sizeof(m->nvml_error));
	if (r < 0) {
		m->nvml = NULL;
		/* each hung nvmlInit leaves a thread behind: try once only */
		m->nvml_init_hung = r == -ETIMEDOUT;
		return r;
	}
	return 0;
}

static void no_nvml_reason(manager *m, int r)
{
	snprintf(m->node.nvml_down, sizeof(m->node.nvml_down), "%s",
		 r == -ENOENT ? "no NVIDIA driver" : m->nvml_error);
}

static int run_check(manager *m)
{
	int r = open_nvml(m);
	if (r < 0) {
		log_full(m->s.expected_gpus > 0 ? LOG_ERR : LOG_NOTICE, "Cannot use NVML (%s): %s",
			 m->s.nvml_library, m->nvml_error);
		no_nvml_reason(m, r);
	} else
		poll_all(m);
	/* The XIDs the daemon persisted: one poll cannot see an XID 79 that
	 * happened an hour ago, and the prolog must not let a job onto that
	 * GPU.  Same reasons as the daemon's (hd_gpu_add_sticky_xid), and an
	 * unreadable file keeps the node unhealthy, as in the daemon. */
	pthread_mutex_lock(&m->lock);
	xid_state_sync(m);
	hd_xid_state_apply(&m->xs, &m->node);
	hd_node_evaluate(&m->s, &m->node, kiln_now_usec());
	pthread_mutex_unlock(&m->lock);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	if (arg_json)
		hd_json_render(&m->node, m->host, &b);
	else
		hd_table_render(&m->node, m->host, &b);
	if (kiln_strbuf_error(&b) < 0)
		return log_error_errno(-ENOMEM, "Out of memory");
	fputs(b.s, stdout);
	return m->node.state == HD_UNHEALTHY ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
}

static int run_active(manager *m)
{
	int r = open_nvml(m), n = 0, failed = 0;
	if (r == 0 && hd_nvml_count(m->nvml, &n) < 0)
		n = 0;
	printf("%-4s %-10s %-8s %12s %12s  %s\n", "GPU", "CHECK", "RESULT", "MEASURED", "EXPECTED",
	       "DETAIL");
	for (int i = 0; i < MAX(n, 1); i++) {
		hd_sample s = {};
		if (m->nvml && n > 0)
			hd_nvml_poll(m->nvml, i, &s);
		hd_active_result res[HD_ACTIVE_CHECKS];
		char idx[16] = "-";
		if (n > 0)
			snprintf(idx, sizeof(idx), "%d", i);
		if (s.has_pids && s.n_pids > 0) {
			/* a GEMM burn next to a training job would hurt the job */
			printf("%-4s %-10s %-8s %12s %12s  %s\n", idx, "all", "skipped", "-", "-",
			       "the GPU is running a job's processes");
			continue;
		}
		hd_active_run(&m->s, n > 0 ? i : -1, s.name,
			      s.has_mem ? s.mem_total - s.mem_used : 0, res);
		for (int k = 0; k < HD_ACTIVE_CHECKS; k++) {
			const char *unit = streq(res[k].name, "gemm")	   ? "TFLOP/s"
					   : streq(res[k].name, "memtest") ? "GiB"
									   : "GB/s";
			char meas[32] = "-", exp[32] = "-";
			if (!streq(res[k].status, "skipped"))
				snprintf(meas, sizeof(meas), "%.1f %s", res[k].value, unit);
			if (res[k].expected > 0)
				snprintf(exp, sizeof(exp), "%.0f %s", res[k].expected, unit);
			printf("%-4s %-10s %-8s %12s %12s  %s\n", idx, res[k].name, res[k].status,
			       meas, exp, res[k].detail);
			failed += streq(res[k].status, "failed");
		}
	}
	return failed ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
}

/* Runs the active checks on every idle GPU, one after the other, and turns
 * failures into unhealthy reasons (kept until the checks pass again). */
static void *active_main(void *p)
{
	manager *m = p;
	pthread_mutex_lock(&m->lock);
	int n = m->node.n_gpus;
	pthread_mutex_unlock(&m->lock);
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&m->lock);
		hd_sample cs = m->node.gpus[i].cur;
		pthread_mutex_unlock(&m->lock);
		hd_active_result res[HD_ACTIVE_CHECKS];
		if (cs.n_pids > 0) {
			log_info("gpu%d: active checks skipped: the GPU is running %u process(es)",
				 i, cs.n_pids);
			continue;
		}
		if (!cs.present || cs.lost || cs.hung_call[0])
			continue;
		if (hd_active_run(&m->s, i, cs.name, cs.has_mem ? cs.mem_total - cs.mem_used : 0,
				  res) < 0)
			continue;
		hd_reasons bad = {};
		bool same = true;
		for (int k = 0; k < HD_ACTIVE_CHECKS; k++)
			same = same && streq(res[k].status, "skipped") &&
			       streq(res[k].detail, res[0].detail);
		if (same) {
			log_info("gpu%d: active checks skipped: %s", i, res[0].detail);
			continue;
		}
		for (int k = 0; k < HD_ACTIVE_CHECKS; k++) {
			bool failed = streq(res[k].status, "failed");
			log_full(failed ? LOG_ERR : LOG_INFO, "gpu%d: active check %s %s: %s", i,
				 res[k].name, res[k].status, res[k].detail);
			if (failed)
				hd_reasons_add(&bad, HD_UNHEALTHY, "active check %s failed: %s",
					       res[k].name, res[k].detail);
		}
		pthread_mutex_lock(&m->lock);
		m->node.gpus[i].active = bad;
		pthread_mutex_unlock(&m->lock);
	}
	m->active_done = true;
	char c = 'a';
	(void) !write(m->wake[1], &c, 1);
	return NULL;
}

/* Starts a round of active checks when the schedule asked for one, none is
 * running and NVML is up (it may come up late); the next round is due
 * health.active_interval after this one starts. */
static void active_maybe(manager *m)
{
	if (!m->active_due || m->active_running || !m->nvml)
		return;
	m->active_due = false;
	if (m->s.active_interval_usec) {
		sd_event_source_set_time(m->active_timer,
					 kiln_now_usec() + m->s.active_interval_usec);
		sd_event_source_set_enabled(m->active_timer, SD_EVENT_ONESHOT);
	}
	m->active_done = false;
	if (pthread_create(&m->active_thread, NULL, active_main, m) == 0)
		m->active_running = true;
	else
		log_warning("Failed to start the active checks thread, skipping this round");
}

/* Joins a finished round (its thread wrote to the wake pipe) and shows
 * its results. */
static void active_reap(manager *m)
{
	if (!m->active_running || !m->active_done)
		return;
	pthread_join(m->active_thread, NULL);
	m->active_running = false;
	pthread_mutex_lock(&m->lock);
	publish(m);
	pthread_mutex_unlock(&m->lock);
	active_maybe(m);
}

static int on_active_timer(sd_event_source *s, uint64_t usec, void *userdata)
{
	manager *m = userdata;
	m->active_due = true;
	active_maybe(m);
	return 0;
}

/* Every health.interval, at a fixed rate: a poll that overran (hung NVML
 * calls) is followed by the next one at once. */
static int on_poll_timer(sd_event_source *s, uint64_t usec, void *userdata)
{
	manager *m = userdata;
	pthread_mutex_lock(&m->lock);
	xid_state_sync(m); /* an admin's --clear-xid lands here */
	pthread_mutex_unlock(&m->lock);
	poll_all(m);
	sd_event_source_set_time(s, MAX(usec + m->s.interval_usec, kiln_now_usec()));
	sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
	active_maybe(m);
	return 0;
}

/* XIDs queued by the XID thread, or the end of a round of active checks. */
static int on_wake(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	manager *m = userdata;
	handle_xids(m);
	active_reap(m);
	return 0;
}

/* SIGHUP (systemctl reload): poll now.  SIGTERM, SIGINT: stop. */
static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata)
{
	manager *m = userdata;
	if (si->ssi_signo == SIGHUP) {
		log_info("SIGHUP: polling now");
		sd_event_source_set_time(m->poll_timer, kiln_now_usec());
		sd_event_source_set_enabled(m->poll_timer, SD_EVENT_ONESHOT);
		return 0;
	}
	log_info("Received %s, shutting down", strsignal((int) si->ssi_signo));
	return sd_event_exit(sd_event_source_get_event(s), 0);
}

/* health.watchdog wins over the unit's WatchdogSec: systemd takes
 * WATCHDOG_USEC= at run time (0 turns its watchdog off), and the event
 * loop's pings follow $WATCHDOG_USEC, so both are set to it.  Without a
 * watchdog from systemd there is nothing to ping. */
static int watchdog_setup(manager *m)
{
	uint64_t unit_usec = 0;
	if (sd_watchdog_enabled(0, &unit_usec) <= 0)
		return 0;
	m->watchdog_usec = m->s.watchdog_usec;
	if (m->watchdog_usec != unit_usec) {
		log_info("health.watchdog (%.1fs) replaces WatchdogSec (%.1fs)",
			 m->watchdog_usec / 1e6, unit_usec / 1e6);
		sd_notifyf(0, "WATCHDOG_USEC=%llu", (unsigned long long) m->watchdog_usec);
		char v[32];
		snprintf(v, sizeof(v), "%llu", (unsigned long long) m->watchdog_usec);
		if (m->watchdog_usec)
			setenv("WATCHDOG_USEC", v, 1);
		else
			unsetenv("WATCHDOG_USEC");
	}
	if (!m->watchdog_usec)
		return 0;
	if (m->watchdog_usec < 2 * m->s.nvml_timeout_usec)
		log_warning("The watchdog (%.1fs) is less than twice health.nvml_timeout (%.1fs): "
			    "a hung driver call may get the daemon killed; raise health.watchdog",
			    m->watchdog_usec / 1e6, m->s.nvml_timeout_usec / 1e6);
	int r = sd_event_set_watchdog(m->event, true);
	if (r < 0)
		return log_error_errno(r, "Failed to set up the watchdog: %m");
	m->last_watchdog = kiln_now_usec(); /* sd_event_set_watchdog() pinged */
	return 0;
}

/* The event loop's sources: signals, the wake pipe, the poll timer and the
 * active checks' schedule. */
static int event_setup(manager *m)
{
	int r = sd_event_new(&m->event);
	if (r < 0)
		return log_error_errno(r, "Failed to create the event loop: %m");
	static const int signals[] = { SIGTERM, SIGINT, SIGHUP };
	for (size_t i = 0; i < ARRAY_SIZE(signals); i++) {
		r = sd_event_add_signal(m->event, NULL, signals[i], on_signal, m);
		if (r < 0)
			return log_error_errno(r, "Failed to watch signal %d: %m", signals[i]);
	}
	r = sd_event_add_io(m->event, NULL, m->wake[0], EPOLLIN, on_wake, m);
	if (r < 0)
		return log_error_errno(r, "Failed to watch the wake pipe: %m");
	/* accuracy 1 us: the 2 s fault-to-drain bound has no room for
	 * sd-event's default 250 ms timer coalescing */
	r = sd_event_add_time_relative(m->event, &m->poll_timer, CLOCK_MONOTONIC,
				       m->s.interval_usec, 1, on_poll_timer, m);
	if (r < 0)
		return log_error_errno(r, "Failed to add the poll timer: %m");
	r = sd_event_add_time_relative(m->event, &m->active_timer, CLOCK_MONOTONIC,
				       m->s.active_on_start ? 0 : m->s.active_interval_usec, 1,
				       on_active_timer, m);
	if (r < 0)
		return log_error_errno(r, "Failed to add the active checks timer: %m");
	if (!m->s.active_on_start && !m->s.active_interval_usec)
		sd_event_source_set_enabled(m->active_timer, SD_EVENT_OFF);
	return 0;
}

static int run_daemon(manager *m)
{
	int r;
	if (pipe2(m->wake, O_CLOEXEC | O_NONBLOCK) < 0)
		return log_error_errno(errno, "Failed to create a pipe: %m");
	/* before any thread starts (they inherit the mask): the event loop
	 * takes these through a signalfd */
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	if ((r = event_setup(m)) < 0 || (r = watchdog_setup(m)) < 0)
		return r;

	r = open_nvml(m);
	if (r < 0) {
		log_full(m->s.expected_gpus > 0 ? LOG_ERR : LOG_WARNING,
			 "Cannot use NVML (%s): %s; %s", m->s.nvml_library, m->nvml_error,
			 r == -ENOENT ? "is the NVIDIA driver installed?"
				      : "check the driver with nvidia-smi");
		no_nvml_reason(m, r);
	} else if (hd_nvml_start_events(m->nvml, on_xid, m) < 0)
		log_warning("NVML event API unavailable: XIDs are not watched");

	if (start_http(m) < 0)
		return -EADDRINUSE;
	if (m->s.drain) {
		char where[320];
		r = hd_slurm_start(m->host, &m->slurm, NULL);
		if (r == -ENOENT) {
			/* keep checking and exporting metrics: a node whose Slurm
			 * is not set up yet still wants its GPUs watched */
			kiln_slurm_conf_source(where, sizeof(where));
			log_error("No Slurm configuration (%s): Slurm drain/resume disabled; "
				  "install slurm.conf or set SLURM_CONF, or set health.drain = "
				  "false",
				  where);
			m->slurm = NULL;
		} else if (r < 0)
			return log_error_errno(r, "Failed to start the Slurm thread: %m");
	} else
		log_info("Slurm drain/resume disabled");

	pthread_mutex_lock(&m->lock);
	xid_state_sync(m);
	pthread_mutex_unlock(&m->lock);
	poll_all(m);
	pthread_mutex_lock(&m->lock);
	xid_state_unmatched(m);
	if (!m->nvml)
		publish(m);
	pthread_mutex_unlock(&m->lock);
	/* the first poll took a while: the next one is an interval from now */
	sd_event_source_set_time(m->poll_timer, kiln_now_usec() + m->s.interval_usec);
	sd_notify(0, "READY=1");
	log_info("kiln-healthd %s on %s: %d GPU(s), polling every %.1fs", KILN_VERSION, m->host,
		 m->node.n_gpus, m->s.interval_usec / 1e6);

	r = sd_event_loop(m->event);
	if (r < 0)
		log_error_errno(r, "The event loop failed: %m");
	sd_notify(0, "STOPPING=1");
	kiln_http_server_free(m->http);
	m->http = NULL;
	hd_slurm_stop(m->slurm);
	hd_nvml_close(m->nvml);
	m->nvml = NULL;
	return r < 0 ? r : 0;
}

static void manager_done(manager *m)
{
	if (m->nvml && (arg_check || arg_active))
		hd_nvml_close(m->nvml);
	sd_event_source_unref(m->poll_timer);
	sd_event_source_unref(m->active_timer);
	sd_event_unref(m->event);
	kiln_cfg_free(m->cfg);
	free(m->metrics);
}

static int run(int argc, char **argv)
{
	if (arg_clear_xid)
		return run_clear_xid();
	static manager m; /* large (per-GPU samples); static keeps it off the stack */
	pthread_mutex_init(&m.lock, NULL);
	int r = load_config(&m);
	if (r < 0)
		r = kiln_exit_for_config(r);
	else if (arg_check)
		r = run_check(&m);
	else if (arg_active)
		r = run_active(&m);
	else if (!m.s.enabled) {
		log_notice("health.enabled is false in the cluster file: kiln-healthd has nothing "
			   "to do");
		r = KILN_EXIT_OK;
	} else
		r = run_daemon(&m);
	manager_done(&m);
	return r;
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
