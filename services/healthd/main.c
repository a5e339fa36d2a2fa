/* main.c — kiln-healthd: the GPU health daemon (and its one-shot check).
 *
 *   kiln-healthd [-c FILE] [--node NAME]            run as a systemd service
 *   kiln-healthd --check [--json]                   one poll; exit 0 healthy, 1 unhealthy
 *   kiln-healthd --active                           run the active GPU checks
 *   kiln-healthd --clear-xid GPU|all                forget XIDs after a GPU reset
 *
 * The daemon: load the cluster file, open NVML, start the XID thread, poll
 * every GPU, publish /metrics, tell systemd READY=1 after the first full
 * check, then loop: poll every health.interval, handle XIDs as they come,
 * ping the watchdog, drain or resume the node in Slurm (slurm.c), stop
 * cleanly on SIGTERM.  Exit codes: 0 ok, 1 failure or unhealthy, 2 usage or
 * config error. */
#include <dirent.h>
#include <getopt.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <libgen.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <fcntl.h>

#include "healthd.h"
#include "kiln/http.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

#define EXIT_USAGE 2
/* XIDs arriving between two wake-ups of the main loop.  A storm beyond this
 * drops the excess (the XID thread must not block on the main loop); the
 * number dropped is logged at the next wake-up. */
#define HD_XID_QUEUE 256

static struct {
	const char *config;
	const char *node;
	bool check, json, active;
	int metrics_port;      /* -1: from the cluster file */
	const char *xid_state; /* NULL: $KILN_HEALTHD_XID_STATE or HD_XID_STATE_PATH */
	const char *clear_xid;
} arg = { .metrics_port = -1 };

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
	uint64_t watchdog_usec, last_watchdog;
	/* active checks run in their own thread: they take gemm_seconds per GPU */
	pthread_t active_thread;
	atomic_bool active_running, active_done;
	uint64_t next_active;
	char last_status[300];
	/* XIDs that drain, mirrored in the XID state file; the main thread only */
	hd_xid_state xs;
	struct stat xs_seen; /* the file as last read or written (st_ino 0: none) */
	bool xs_checked;
} manager;

static void help(void)
{
	printf("Usage: kiln-healthd [OPTIONS]\n\n"
	       "The kiln GPU health daemon: checks every GPU through NVML, exports\n"
	       "dcgm-exporter compatible metrics, and drains or resumes the node in Slurm.\n\n"
	       "  -c, --config FILE     cluster file (default $KILN_CONFIG or %s)\n"
	       "      --node NAME       which node of the cluster file this is (default: "
	       "hostname)\n"
	       "      --check           check once, print a table, exit 0 healthy / 1 unhealthy\n"
	       "      --json            with --check: print JSON\n"
	       "      --active          run the active checks (GEMM, bandwidth, memtest) and exit\n"
	       "      --metrics-port N  override health.metrics_port (0: no HTTP server)\n"
	       "      --clear-xid GPU|all\n"
	       "                        after a GPU reset: forget its drain XIDs (GPU: index or\n"
	       "                        UUID); the daemon resumes the node after recover_after\n"
	       "      --xid-state FILE  XID state file (default $%s or %s)\n"
	       "  -v, --verbose         more log output (repeat for debug)\n"
	       "  -q, --quiet           less log output\n"
	       "  -h, --help            this help\n"
	       "      --version         print the version\n",
	       KILN_CFG_DEFAULT_PATH, HD_XID_STATE_ENV, HD_XID_STATE_PATH);
}

static const char *xid_state_path(void)
{
	return arg.xid_state
		       ?: (!streq(strempty(getenv(HD_XID_STATE_ENV)), "") ? getenv(HD_XID_STATE_ENV)
									  : HD_XID_STATE_PATH);
}

static int parse_args(int argc, char **argv)
{
	enum {
		OPT_NODE = 0x100,
		OPT_CHECK,
		OPT_JSON,
		OPT_ACTIVE,
		OPT_PORT,
		OPT_VERSION,
		OPT_CLEAR_XID,
		OPT_XID_STATE,
	};
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "node", required_argument, NULL, OPT_NODE },
		{ "check", no_argument, NULL, OPT_CHECK },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "active", no_argument, NULL, OPT_ACTIVE },
		{ "metrics-port", required_argument, NULL, OPT_PORT },
		{ "clear-xid", required_argument, NULL, OPT_CLEAR_XID },
		{ "xid-state", required_argument, NULL, OPT_XID_STATE },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, OPT_VERSION },
		{}
	};
	int c;
	while ((c = getopt_long(argc, argv, "c:vqh", opts, NULL)) >= 0) {
		switch (c) {
		case 'c':
			arg.config = optarg;
			break;
		case OPT_NODE:
			arg.node = optarg;
			break;
		case OPT_CHECK:
			arg.check = true;
			break;
		case OPT_JSON:
			arg.json = true;
			break;
		case OPT_ACTIVE:
			arg.active = true;
			break;
		case OPT_CLEAR_XID:
			arg.clear_xid = optarg;
			break;
		case OPT_XID_STATE:
			arg.xid_state = optarg;
			break;
		case OPT_PORT:
			if (kiln_parse_int(optarg, 0, 65535, &arg.metrics_port) < 0) {
				log_error("Invalid --metrics-port '%s': expected a port number "
					  "0..65535",
					  optarg);
				return -EINVAL;
			}
			break;
		case 'v':
			log_adjust_level(+1);
			break;
		case 'q':
			log_adjust_level(-1);
			break;
		case 'h':
			help();
			return 0;
		case OPT_VERSION:
			printf("kiln-healthd %s\n", KILN_VERSION);
			return 0;
		default:
			log_error("Try 'kiln-healthd --help'.");
			return -EINVAL;
		}
	}
	if (optind < argc) {
		log_error("Unexpected argument '%s'. Try 'kiln-healthd --help'.", argv[optind]);
		return -EINVAL;
	}
	if (arg.json && !arg.check) {
		log_error("--json only goes with --check.");
		return -EINVAL;
	}
	return 1;
}

/* Loads the cluster file: -c, $KILN_CONFIG, or the default path.  Without
 * -c or $KILN_CONFIG a missing default file is fine (built-in defaults, no
 * GPU count check, no Slurm); any other problem is a config error. */
static int load_config(manager *m)
{
	hd_settings_defaults(&m->s);
	if (arg.node)
		snprintf(m->host, sizeof(m->host), "%s", arg.node);
	else if (gethostname(m->host, sizeof(m->host)) < 0)
		snprintf(m->host, sizeof(m->host), "localhost");
	snprintf(m->s.node, sizeof(m->s.node), "%s", m->host);

	bool explicit = arg.config || !streq(strempty(getenv(KILN_CFG_ENV)), "");
	const char *path = arg.config ?: kiln_cfg_default_path();
	if (!explicit && access(path, F_OK) < 0) {
		log_info("No cluster file at %s: using built-in defaults, no GPU count check, no "
			 "Slurm drain",
			 path);
		m->s.drain = false;
		return 0;
	}
	_cleanup_(kiln_cfg_errors_freep) kiln_cfg_errors errs;
	kiln_cfg_errors_init(&errs);
	int r = kiln_cfg_load(path, &m->cfg, &errs);
	if (r == -EINVAL) {
		kiln_cfg_errors_print(&errs, stderr);
		log_error(
			"%s has errors (listed above); fix them and check with 'kiln check -c %s'.",
			path, path);
		return r;
	}
	if (r < 0)
		return log_error_errno(r, "Failed to read cluster file %s: %m", path);
	const kiln_cfg_node *node = kiln_cfg_find_node(m->cfg, m->host);
	if (!node && arg.node) {
		log_error("Node '%s' is not in %s; pass a node name from the cluster file with "
			  "--node.",
			  m->host, path);
		return -EINVAL;
	}
	if (!node)
		log_warning(
			"This host (%s) is not a node of %s: no GPU count check, no Slurm drain; "
			"use --node NAME if the hostname differs",
			m->host, path);
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

static void watchdog_maybe(manager *m)
{
	if (!m->watchdog_usec)
		return;
	uint64_t now = kiln_now_usec();
	/* a third of WatchdogSec: one hung NVML call (nvml_timeout) between
	 * two pings still leaves margin */
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
	if (!arg.check)
		hd_xid_state_apply(&m->xs, &m->node);
	hd_node_evaluate(&m->s, &m->node, now);
	log_changes(m);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	hd_metrics_render(&m->node, m->host, &b);
	if (m->slurm)
		kiln_strbuf_printf(
			&b,
			"# HELP kiln_slurm_reachable Whether slurmctld answered the last request.\n"
			"# TYPE kiln_slurm_reachable gauge\nkiln_slurm_reachable %d\n",
			hd_slurm_reachable(m->slurm) > 0);
	if (m->nvml)
		kiln_strbuf_printf(&b,
				   "# HELP kiln_nvml_hung_calls NVML calls that timed out and have "
				   "not returned.\n"
				   "# TYPE kiln_nvml_hung_calls gauge\nkiln_nvml_hung_calls %d\n",
				   hd_nvml_abandoned(m->nvml));
	char *txt = kiln_strbuf_steal(&b);
	if (txt) {
		free(m->metrics);
		m->metrics = txt;
	}
	char reason[HD_SLURM_REASON_MAX];
	bool drain = hd_node_drain_reason(&m->node, reason, sizeof(reason));
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
			   first ? " (from before a restart)" : "");
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
	if (r < 0 && !(streq(arg.clear_xid, "all") && r == -EBADMSG)) {
		log_error("Cannot read XID state file %s%s: %s; 'kiln-healthd --clear-xid all' "
			  "replaces a corrupt file",
			  path, line > 0 ? " (bad line)" : "",
			  r == -EBADMSG ? "corrupt" : strerror(-r));
		return 1;
	}
	if (r < 0)
		st.n = 0; /* corrupt, and "all": start over */
	int removed = r < 0 ? 0 : hd_xid_state_clear(&st, arg.clear_xid);
	if (removed < 0) {
		log_error("Invalid --clear-xid '%s': expected a GPU index, a GPU UUID or 'all'",
			  arg.clear_xid);
		return EXIT_USAGE;
	}
	r = xid_state_write(path, &st);
	if (r < 0) {
		log_error_errno(r, "Failed to write %s: %m", path);
		return 1;
	}
	printf("Cleared %d XID entr%s for %s in %s (%d left); kiln-healthd picks this up at its "
	       "next poll\n",
	       removed, removed == 1 ? "y" : "ies", arg.clear_xid, path, st.n);
	return 0;
}

static int poll_all(manager *m)
{
	int n = 0;
	if (!m->nvml && !arg.check && !m->nvml_init_hung) {
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
		watchdog_maybe(m); /* a hung call per GPU must not starve the watchdog */
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
	int port = arg.metrics_port >= 0 ? arg.metrics_port : m->s.metrics_port;
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
		hd_node_evaluate(&m->s, &m->node, kiln_now_usec());
	} else {
		poll_all(m);
		pthread_mutex_lock(&m->lock);
		hd_node_evaluate(&m->s, &m->node, kiln_now_usec());
		pthread_mutex_unlock(&m->lock);
	}
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	if (arg.json)
		hd_json_render(&m->node, m->host, &b);
	else
		hd_table_render(&m->node, m->host, &b);
	if (kiln_strbuf_error(&b) < 0)
		return log_error_errno(-ENOMEM, "Out of memory");
	fputs(b.s, stdout);
	return m->node.state == HD_UNHEALTHY ? 1 : 0;
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
	return failed ? 1 : 0;
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

static void active_maybe(manager *m)
{
	if (m->active_running && m->active_done) {
		pthread_join(m->active_thread, NULL);
		m->active_running = false;
		pthread_mutex_lock(&m->lock);
		publish(m);
		pthread_mutex_unlock(&m->lock);
	}
	if (m->active_running || !m->nvml || !m->next_active || kiln_now_usec() < m->next_active)
		return;
	m->next_active =
		m->s.active_interval_usec ? kiln_now_usec() + m->s.active_interval_usec : 0;
	m->active_done = false;
	if (pthread_create(&m->active_thread, NULL, active_main, m) == 0)
		m->active_running = true;
	else
		log_warning("Failed to start the active checks thread, skipping this round");
}

static int run_daemon(manager *m)
{
	int r;
	if (pipe2(m->wake, O_CLOEXEC | O_NONBLOCK) < 0)
		return log_error_errno(errno, "Failed to create a pipe: %m");
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &mask, NULL); /* before any thread starts: they inherit it */
	signal(SIGPIPE, SIG_IGN);
	_cleanup_close_ int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		return log_error_errno(errno, "Failed to create a signalfd: %m");

	if (sd_watchdog_enabled(0, &m->watchdog_usec) <= 0)
		m->watchdog_usec = 0;
	if (m->watchdog_usec && m->s.watchdog_usec != m->watchdog_usec) {
		/* health.watchdog wins over the unit's WatchdogSec (systemd takes
		 * WATCHDOG_USEC= at run time; 0 turns its watchdog off) */
		log_info("health.watchdog (%.1fs) replaces WatchdogSec (%.1fs)",
			 m->s.watchdog_usec / 1e6, m->watchdog_usec / 1e6);
		sd_notifyf(0, "WATCHDOG_USEC=%llu", (unsigned long long) m->s.watchdog_usec);
		m->watchdog_usec = m->s.watchdog_usec;
	}
	if (m->watchdog_usec && m->watchdog_usec < 2 * m->s.nvml_timeout_usec)
		log_warning("The watchdog (%.1fs) is less than twice health.nvml_timeout (%.1fs): "
			    "a hung driver call may get the daemon killed; raise health.watchdog",
			    m->watchdog_usec / 1e6, m->s.nvml_timeout_usec / 1e6);

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
		r = hd_slurm_start(m->host, &m->slurm);
		if (r == -ENOENT) {
			/* keep checking and exporting metrics: a node whose Slurm
			 * is not set up yet still wants its GPUs watched */
			char where[256];
			hd_slurm_config_source(where, sizeof(where));
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
	if (m->s.active_on_start)
		m->next_active = kiln_now_usec();
	else if (m->s.active_interval_usec)
		m->next_active = kiln_now_usec() + m->s.active_interval_usec;
	sd_notify(0, "READY=1");
	log_info("kiln-healthd %s on %s: %d GPU(s), polling every %.1fs", KILN_VERSION, m->host,
		 m->node.n_gpus, m->s.interval_usec / 1e6);

	uint64_t next_poll = kiln_now_usec() + m->s.interval_usec;
	for (;;) {
		watchdog_maybe(m);
		active_maybe(m);
		uint64_t now = kiln_now_usec();
		if (now >= next_poll) {
			pthread_mutex_lock(&m->lock);
			xid_state_sync(m); /* an admin's --clear-xid lands here */
			pthread_mutex_unlock(&m->lock);
			poll_all(m);
			next_poll = MAX(next_poll + m->s.interval_usec, kiln_now_usec());
			continue;
		}
		uint64_t wait = next_poll - now;
		if (m->watchdog_usec)
			wait = MIN(wait, m->watchdog_usec / 4);
		struct pollfd p[2] = { { .fd = sfd, .events = POLLIN },
				       { .fd = m->wake[0], .events = POLLIN } };
		int n = poll(p, 2, (int) DIV_ROUND_UP(wait, KILN_USEC_PER_MSEC));
		if (n < 0 && errno != EINTR)
			return log_error_errno(errno, "poll() failed: %m");
		if (n > 0 && (p[0].revents & POLLIN)) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				if (si.ssi_signo == SIGHUP) {
					log_info("SIGHUP: polling now");
					next_poll = 0;
					continue;
				}
				log_info("Received %s, shutting down",
					 strsignal((int) si.ssi_signo));
				break;
			}
		}
		if (n > 0 && (p[1].revents & POLLIN))
			handle_xids(m); /* also wakes us when the active checks end */
	}
	sd_notify(0, "STOPPING=1");
	kiln_http_server_free(m->http);
	m->http = NULL;
	hd_slurm_stop(m->slurm);
	hd_nvml_close(m->nvml);
	m->nvml = NULL;
	return 0;
}

int main(int argc, char **argv)
{
	log_set_program("kiln-healthd");
	int r = parse_args(argc, argv);
	if (r <= 0)
		return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;

	if (arg.clear_xid)
		return run_clear_xid();
	static manager m; /* large (per-GPU samples); static keeps it off the stack */
	pthread_mutex_init(&m.lock, NULL);
	if (load_config(&m) < 0)
		return EXIT_USAGE;
	if (arg.check)
		r = run_check(&m);
	else if (arg.active)
		r = run_active(&m);
	else if (!m.s.enabled) {
		log_notice("health.enabled is false in the cluster file: kiln-healthd has nothing "
			   "to do");
		r = 0;
	} else
		r = run_daemon(&m) < 0 ? 1 : 0;
	if (m.nvml && (arg.check || arg.active))
		hd_nvml_close(m.nvml);
	kiln_cfg_free(m.cfg);
	free(m.metrics);
	return r;
}
