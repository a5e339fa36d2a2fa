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
#include <unistd.h>

#include "healthd.h"
#include "manager.h"
#include "kiln/http.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/pathtrust.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

static const char *arg_config;
static const char *arg_node;
static bool arg_check, arg_json, arg_active;
static int arg_metrics_port = -1; /* -1: from the cluster file */
static const char *arg_xid_state; /* NULL: $KILN_HEALTHD_XID_STATE or HD_XID_STATE_PATH */
static const char *arg_clear_xid;

enum {
	OPT_CHECK = KILN_OPT_FIRST,
	OPT_ACTIVE,
	OPT_METRICS_PORT,
	OPT_CLEAR_XID,
	OPT_XID_STATE,
};

static const kiln_option options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	KILN_OPTION_NODE_INTO(&arg_node),
	{ "check", OPT_CHECK, NULL, "check once, print a table, exit 0 healthy / 1 unhealthy", NULL,
	  .flag = &arg_check },
	KILN_OPTION_JSON_INTO(&arg_json),
	{ "active", OPT_ACTIVE, NULL, "run the active checks (GEMM, bandwidth, memtest) and exit",
	  NULL, .flag = &arg_active },
	{ "metrics-port", OPT_METRICS_PORT, "N", "override health.metrics_port (0: no HTTP server)",
	  NULL },
	{ "clear-xid", OPT_CLEAR_XID, "GPU|all",
	  "after a GPU reset: forget its drain XIDs (GPU: index or\n"
	  "UUID); the daemon resumes the node after recover_after",
	  NULL, .str = &arg_clear_xid },
	{ "xid-state", OPT_XID_STATE, "FILE",
	  "XID state file (default $" HD_XID_STATE_ENV " or\n" HD_XID_STATE_PATH ")", "file",
	  .str = &arg_xid_state },
	KILN_OPTIONS_COMMON,
	{},
};

static int parse_option(int key, const char *arg);

static const kiln_prog prog = {
	.name = "kiln-healthd",
	.summary = "the kiln GPU health daemon",
	.usage = "kiln-healthd [-c FILE] [--node NAME]     run as a systemd service\n"
		 "kiln-healthd --check [--json]            one poll; exit 0 healthy, 1 unhealthy\n"
		 "kiln-healthd --active                    run the active GPU checks\n"
		 "kiln-healthd --clear-xid GPU|all         forget XIDs after a GPU reset",
	.options = options,
	.option = parse_option,
	.no_args = true,
	.epilog = "Checks every GPU through NVML, exports dcgm-exporter compatible metrics,\n"
		  "and drains or resumes the node in Slurm.\n\n"
		  "Exit status: 0 ok, 1 failure or unhealthy, 2 usage or config error.\n"
		  "See kiln-healthd(8).\n",
};

const char *xid_state_path(void)
{
	return arg_xid_state
		       ?: (!streq(strempty(getenv(HD_XID_STATE_ENV)), "") ? getenv(HD_XID_STATE_ENV)
									  : HD_XID_STATE_PATH);
}

static int parse_option(int key, const char *arg)
{
	if (key != OPT_METRICS_PORT)
		return 1;
	if (kiln_parse_int(arg, 0, 65535, &arg_metrics_port) < 0)
		return kiln_usage_error(
			&prog, "Invalid --metrics-port '%s': expected a port number 0..65535.",
			arg);
	return 0;
}

static int parse_argv(int argc, char **argv)
{
	int r = kiln_parse_options(&prog, argc, argv);
	if (r <= 0)
		return r;
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
	/* the library is dlopened as root: refuse one others can change now,
	 * with the key's name, rather than as a poll's NVML error */
	if (strchr(m->s.nvml_library, '/')) {
		char why[384];
		if (kiln_path_trusted(NULL, m->s.nvml_library, geteuid(), why, sizeof(why)) ==
		    -EPERM) {
			log_error("%s: health.nvml_library = \"%s\": refusing to load it as root: "
				  "%s",
				  path, m->s.nvml_library, why);
			return -EINVAL;
		}
	}
	/* the shared mounts check reads the node's mount table, PID 1's (the
	 * unit's ProtectHome= and PrivateMounts= give this daemon a namespace
	 * of its own); a test that runs the daemon in a node's namespace
	 * names its own table (KILN_HEALTHD_MOUNTINFO=/proc/self/mountinfo) */
	const char *mi = getenv(HD_MOUNTINFO_ENV);
	if (mi && mi[0])
		snprintf(m->s.mountinfo, sizeof(m->s.mountinfo), "%s", mi);
	return 0;
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
void publish(manager *m)
{
	uint64_t now = kiln_now_usec();
	if (!m->oneshot)
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
	if (m->s.n_mounts > 0) {
		/* the shared mounts check (mounts.c), one sample per mounts[] entry */
		kiln_metrics_family(&km, "kiln_mount_up", KILN_METRIC_GAUGE,
				    "1 while a shared mount of the cluster file's mounts[] is "
				    "mounted and answers, 0 while it is missing or dead.");
		for (size_t i = 0; i < m->s.n_mounts; i++) {
			const kiln_cfg_mount *mt = &m->s.mounts[i];
			kiln_metrics_sample(&km,
					    (const char *[]){ "Hostname", m->host, "mountpoint",
							      mt->where, "type", mt->type, NULL },
					    hd_mount_ok(&m->node.mounts, mt));
		}
	}
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

/* The shared mounts (mounts.c), on every poll: published with the GPUs. */
static void check_mounts(manager *m)
{
	hd_reasons mr;
	m->mounts_state.wait = arg_check; /* one poll: wait for the probes */
	if (hd_mounts_check(&m->s, &m->mounts_state, kiln_now_usec(), &mr) < 0 &&
	    !m->mounts_warned) {
		log_error("Cannot read the mount table: the shared mounts check reports the node "
			  "unhealthy");
		m->mounts_warned = true;
	}
	pthread_mutex_lock(&m->lock);
	m->node.mounts = mr;
	pthread_mutex_unlock(&m->lock);
}

static int poll_all(manager *m)
{
	int n = 0;
	check_mounts(m);
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
		hd_job_ids(&s, jobs, sizeof(jobs));
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

/* /metrics, /health and / on the common HTTP glue (kiln/http.h): it
 * answers 404/405 (with Allow) in OpenAI's error shape and HEAD like GET. */
/* The port is bound before NVML is opened (start_http() comes first, so
 * no user can take it while nvmlInit is slow); until the first poll has
 * published, /metrics and /health answer 503 "starting". */
static int http_starting(kiln_http_request *r)
{
	static const char msg[] = "kiln-healthd is starting: no GPU poll has finished yet\n";
	(void) kiln_http_set_header(r, "Retry-After", "5");
	return kiln_http_reply_text(r, 503, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
}

static int http_metrics(kiln_http_request *r, void *userdata)
{
	manager *m = userdata;
	pthread_mutex_lock(&m->lock);
	_cleanup_free_ char *body = m->metrics ? strdup(m->metrics) : NULL;
	bool published = m->metrics;
	pthread_mutex_unlock(&m->lock);
	if (!published)
		return http_starting(r);
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
	bool published = m->metrics;
	if (published)
		hd_json_render(&m->node, m->host, &b);
	pthread_mutex_unlock(&m->lock);
	if (!published)
		return http_starting(r);
	if (kiln_strbuf_error(&b) < 0)
		return -ENOMEM;
	return kiln_http_reply_text(r, 200, "application/json", b.s ?: "", b.len);
}

static int http_root(kiln_http_request *r, void *userdata)
{
	static const char msg[] = "kiln-healthd: see /metrics (Prometheus) and /health (JSON)\n";
	return kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
}

/* /metrics and /health answer a Prometheus scrape every few seconds from a
 * handful of addresses, so 64 connections are plenty.  One address may hold
 * only 8 of them: with the per-client cap at the global one, a single
 * process holding 64 idle or dribbling sockets (a bug or an attack) took
 * every slot and stopped every scrape until the idle timeout; now it holds
 * at most 8 and the others are still served. */
#define HD_HTTP_CONNECTIONS_MAX	   64u
#define HD_HTTP_CONNECTIONS_PER_IP 8u
_Static_assert(HD_HTTP_CONNECTIONS_PER_IP * 4 <= HD_HTTP_CONNECTIONS_MAX,
	       "one client address must leave most slots to the others");

/* The HTTP server on the socket systemd passed (kiln-healthd.socket, bound
 * at boot before any user can run anything), else on
 * health.metrics_address:port bound here.  A taken port is fatal at once,
 * naming who holds it: a squatter's fake /metrics must not stand in for
 * this node's GPUs. */
static int start_http(manager *m)
{
	int port = arg_metrics_port >= 0 ? arg_metrics_port : m->s.metrics_port;
	int fd = kiln_http_activation_fd();
	if (fd < 0) {
		log_error("kiln-healthd was socket-activated with more than one socket, or one "
			  "that is not a listening TCP socket: kiln-healthd.socket needs exactly "
			  "one ListenStream=ADDRESS:PORT");
		return -EINVAL;
	}
	if (fd == 0 && port == 0)
		return 0;
	bool passed = fd > 0;
	if (passed)
		log_info("Serving /metrics on the socket systemd passed (kiln-healthd.socket); "
			 "health.metrics_address and metrics_port are not used");
	else {
		struct in_addr a;
		if (inet_pton(AF_INET, m->s.metrics_address, &a) != 1) {
			log_error("health.metrics_address '%s' is not an IPv4 address; fix the "
				  "cluster file.",
				  m->s.metrics_address);
			return -EINVAL;
		}
		fd = kiln_http_listen(m->s.metrics_address, (uint16_t) port);
		if (fd == -EADDRINUSE) {
			char who[160];
			(void) kiln_http_port_holder((uint16_t) port, who, sizeof(who));
			log_error("Port %d (%s) for /metrics is already in use, held by %s; "
				  "kiln-healthd does not share its port (Prometheus would scrape "
				  "whoever holds it).  Stop that process (ss -ltnp 'sport = :%d' "
				  "shows it), or set health.metrics_port; on a node, "
				  "kiln-healthd.socket binds the port at boot, before any user can",
				  port, m->s.metrics_address, who, port);
			return fd;
		}
		if (fd < 0)
			return log_error_errno(fd, "Failed to listen on %s:%d for /metrics: %m",
					       m->s.metrics_address, port);
	}
	const kiln_http_route routes[] = {
		{ "GET", "/metrics", false, http_metrics, m },
		{ "GET", "/health", false, http_health, m },
		{ "GET", "/", false, http_root, m },
	};
	kiln_http_config cfg = {
		.threads = 1, /* a scrape every few seconds */
		.max_connections = HD_HTTP_CONNECTIONS_MAX,
		.max_connections_per_client = HD_HTTP_CONNECTIONS_PER_IP,
		.idle_timeout_s = 10,
		.max_body_bytes = 4096, /* GET only */
		.routes = routes,
		.n_routes = ARRAY_SIZE(routes),
	};
	int r = kiln_http_server_start_fd(&cfg, fd, &m->http);
	if (r < 0)
		return log_error_errno(r, "Failed to start the /metrics server: %m");
	unsigned bound = kiln_http_server_port(m->http);
	if (passed && port && bound != (unsigned) port)
		log_warning("kiln-healthd.socket listens on port %u but health.metrics_port is %d: "
			    "Prometheus, following the cluster file, misses this node; render the "
			    "socket's drop-in (kiln render kiln-healthd.socket.conf -o "
			    "/etc/systemd/system/kiln-healthd.socket.d/kiln.conf), daemon-reload and "
			    "restart kiln-healthd.socket",
			    bound, port);
	log_info("Serving /metrics on %s:%u", passed ? "the passed socket" : m->s.metrics_address,
		 bound);
	return 0;
}

int open_nvml(manager *m)
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
		check_mounts(m);
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

	/* the port before NVML: nvmlInit can take seconds (health.nvml_timeout) */
	if ((r = start_http(m)) < 0)
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
	hd_mounts_state_free(&m->mounts_state);
	sd_event_source_unref(m->poll_timer);
	sd_event_source_unref(m->active_timer);
	sd_event_unref(m->event);
	kiln_cfg_free(m->cfg);
	free(m->metrics);
}

static int run(int argc, char **argv)
{
	if (arg_clear_xid)
		return run_clear_xid(arg_clear_xid);
	static manager m; /* large (per-GPU samples); static keeps it off the stack */
	m.oneshot = arg_check || arg_active;
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
