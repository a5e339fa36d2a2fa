/* status.c — `kiln status`: the cluster at a glance, from the head node.
 *
 *   kiln [-c FILE] status [--json] [--timeout SECS] [NODES]
 *
 * For every node of the cluster file (or the NODES hostlist) it gathers, in
 * parallel:
 *  - the Slurm state, reason and running jobs, from slurmctld through
 *    libkiln-slurm (kiln_slurm_nodes_load + kiln_slurm_jobs_running, one
 *    call each for the whole cluster);
 *  - the GPUs' health, from the node's kiln-healthd `GET /health` (node
 *    address, health.metrics_port);
 *  - the models served, from kiln-inferd's `GET /v1/models` on the
 *    inference nodes (inference.port).
 * Every query has a deadline (--timeout, 2 s by default): a node whose port
 * is closed is "unreachable", one that accepts and never answers is
 * reported after the deadline, and slurmctld not answering in time leaves
 * the Slurm columns empty.  Nothing waits longer than the deadline: a
 * libslurm call that is still blocked then is abandoned on its thread
 * (libslurm has no per-call timeout of its own), and the process exits.
 *
 * The HTTP client is a few lines of HTTP/1.0 over a non-blocking socket
 * with poll(): both servers are kiln's own (kiln/http.h, libmicrohttpd), a
 * GET with "Connection: close" is all it needs, and the deadline must hold
 * for connect, send and receive alike.
 *
 * Exit status (docs/man/kiln.1): 0 every node is up in Slurm (idle, mixed
 * or allocated, not draining) with no unhealthy GPU and every queried
 * service answering; 1 anything else (a node down, drained, unreachable or
 * unhealthy, slurmctld not answering); 2 usage or cluster-file error.
 * Degraded GPUs (a warning from kiln-healthd) do not fail the status.
 *
 * Every string a node or Slurm supplies (a drain reason anyone with
 * scontrol can set, healthd's state and reasons, model names) goes through
 * kiln_strbuf_append_printable() before it reaches the table: a terminal
 * must show "\x1b[2J", not obey it.  --json leaves the text as it is;
 * jansson writes control characters as \u00XX. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kiln-verbs.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/net.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/slurm.h"
#include "kiln/strbuf.h"

/* Default deadline of each node's queries and of slurmctld's: long enough
 * for a loaded healthd, short enough that a dead node costs little. */
#define STATUS_TIMEOUT_DEFAULT_USEC (2 * KILN_USEC_PER_SEC)
/* Upper bound of --timeout: a status that waits longer is a hang. */
#define STATUS_TIMEOUT_MAX_USEC (300 * KILN_USEC_PER_SEC)
/* Parallel queries: every node at once up to this many threads (a thread
 * per node costs ~8 MiB of address space, little memory); beyond, the
 * nodes wait their turn and the worst case is ceil(nodes / 128) timeouts. */
#define STATUS_THREADS_MAX 128
/* A /health reply is ~1 KiB per GPU; /v1/models far less. */
#define STATUS_BODY_MAX ((size_t) 1 << 20)
/* Job ids listed per node in --json (the count is always exact). */
#define STATUS_JOB_IDS_MAX 64

enum { ARG_TIMEOUT = KILN_OPT_FIRST };

static const char *arg_config;
static bool arg_json;
static uint64_t arg_timeout = STATUS_TIMEOUT_DEFAULT_USEC;

static const kiln_option status_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	KILN_OPTION_JSON_INTO(&arg_json),
	{ "timeout", ARG_TIMEOUT, "SECS",
	  "deadline of each node's queries and of slurmctld's (default 2s;\n"
	  "a duration: 500ms, 5s)",
	  NULL },
	KILN_OPTIONS_COMMON,
	{},
};

static int parse_option(int key, const char *arg);

const kiln_prog kiln_status_prog = {
	.name = "kiln status",
	.summary = "the cluster at a glance: Slurm state, GPU health, jobs, models",
	.usage = "kiln [-c FILE] status [--json] [--timeout SECS] [NODES]",
	.options = status_options,
	.option = parse_option,
	.args_complete = "node",
	.epilog = "NODES: a hostlist of nodes of the cluster file (default: every node).\n"
		  "Each node's Slurm state and reason and its running jobs (slurmctld, via\n"
		  "libslurm), its GPUs from kiln-healthd's /health (health.metrics_port) and,\n"
		  "on inference nodes, the models kiln-inferd serves (/v1/models). Nodes are\n"
		  "queried in parallel; one that does not answer within --timeout is reported\n"
		  "as such. Colour only on a terminal, never with $NO_COLOR set.\n"
		  "Exit status: 0 every node up and healthy (degraded GPUs allowed), 1 any node\n"
		  "down, drained, rebooting, unhealthy or unreachable, or slurmctld not\n"
		  "answering, 2 usage or cluster-file error.\n",
};

/* ---- a bounded HTTP GET ----------------------------------------------- */

/* GET http://addr:port/path with HTTP/1.0, everything before `deadline`
 * (kiln_now_usec() clock).  Returns 0 with the status code and the body
 * (malloc'd, NUL-terminated); -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH ...
 * from the network; -EPROTO for a reply that is not HTTP; -EFBIG for a body
 * over STATUS_BODY_MAX; -ENOMEM. */
static int http_get(uint32_t addr, int port, const char *path, uint64_t deadline,
		    unsigned *ret_status, char **ret_body)
{
	_cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t) port),
				  .sin_addr.s_addr = htonl(addr) };
	int r = kiln_connect_deadline(fd, (struct sockaddr *) &sa, sizeof(sa), deadline);
	if (r < 0)
		return r;
	char a[16], req[512];
	int n = snprintf(req, sizeof(req),
			 "GET %s HTTP/1.0\r\nHost: %s:%d\r\nAccept: application/json\r\n"
			 "Connection: close\r\n\r\n",
			 path, kiln_format_ipv4(a, addr), port);
	for (int off = 0; off < n;) {
		ssize_t w = send(fd, req + off, (size_t) (n - off), MSG_NOSIGNAL);
		if (w < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		if (w > 0) {
			off += (int) w;
			continue;
		}
		r = kiln_wait_fd(fd, POLLOUT, deadline);
		if (r < 0)
			return r;
	}
	_cleanup_free_ char *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (cap - len < 4096) {
			if (cap >= STATUS_BODY_MAX + 4096)
				return -EFBIG;
			cap = cap ? cap * 2 : 8192;
			char *nb = realloc(buf, cap + 1);
			if (!nb)
				return -ENOMEM;
			buf = nb;
		}
		ssize_t rd = recv(fd, buf + len, cap - len, 0);
		if (rd == 0)
			break;
		if (rd > 0) {
			len += (size_t) rd;
			continue;
		}
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
		r = kiln_wait_fd(fd, POLLIN, deadline);
		if (r < 0)
			return r;
	}
	if (!buf)
		return -EPROTO; /* closed without a byte */
	buf[len] = '\0';
	unsigned status;
	if (sscanf(buf, "HTTP/1.%*1[01] %3u", &status) != 1)
		return -EPROTO;
	char *body = strstr(buf, "\r\n\r\n");
	if (!body)
		return -EPROTO;
	body += 4;
	char *copy = strdup(body);
	if (!copy)
		return -ENOMEM;
	*ret_status = status;
	*ret_body = copy;
	return 0;
}

/* ---- what is gathered ------------------------------------------------- */

typedef struct svc_result {
	bool queried;
	int err;	 /* 0, or http_get()'s error */
	unsigned status; /* HTTP status when err == 0 */
	json_t *json;	 /* the parsed body when 200 and JSON */
} svc_result;

typedef struct node_status {
	const kiln_cfg_node *node;
	uint64_t deadline;
	svc_result health, models;
	/* from slurmctld */
	bool in_slurm;
	uint32_t state;
	char *reason;
	int jobs;
	json_t *job_ids;
} node_status;

typedef struct status_ctx {
	const kiln_cfg *cfg;
	node_status *ns;
	size_t n;
	uint64_t timeout;
	pthread_mutex_t lock;
	size_t next; /* next node for a worker */
	/* the Slurm thread's result, under lock */
	pthread_cond_t cond;
	bool slurm_done;
	bool slurm_abandoned;
	int slurm_err; /* 0; -ENOENT no slurm.conf; -EHOSTUNREACH; -ETIMEDOUT */
	char slurm_error[KILN_ERROR_MSG_MAX + 32];
	kiln_slurm_nodes *slurm_nodes;
	kiln_slurm_job *jobs;
	size_t n_jobs;
} status_ctx;

static bool loopback(const char *a)
{
	return a && strncmp(a, "127.", 4) == 0;
}

static void query_service(svc_result *s, uint32_t addr, int port, const char *path,
			  uint64_t deadline)
{
	_cleanup_free_ char *body = NULL;
	s->queried = true;
	s->err = http_get(addr, port, path, deadline, &s->status, &body);
	if (s->err == 0 && s->status == 200) {
		json_error_t e;
		s->json = json_loads(body, 0, &e);
		if (!s->json || !json_is_object(s->json)) {
			json_decref(s->json);
			s->json = NULL;
			s->err = -EBADMSG;
		}
	}
}

static void *worker(void *p)
{
	status_ctx *c = p;
	for (;;) {
		pthread_mutex_lock(&c->lock);
		size_t i = c->next++;
		pthread_mutex_unlock(&c->lock);
		if (i >= c->n)
			return NULL;
		node_status *s = &c->ns[i];
		/* from when this node's turn comes: with more nodes than threads
		 * a late node still gets its whole --timeout */
		s->deadline = kiln_now_usec() + c->timeout;
		if (c->cfg->health.enabled && c->cfg->health.metrics_port > 0)
			query_service(&s->health, s->node->address, c->cfg->health.metrics_port,
				      "/health", s->deadline);
		if (s->node->inference && !loopback(c->cfg->inference.address))
			query_service(&s->models, s->node->address, c->cfg->inference.port,
				      "/v1/models", s->deadline);
	}
}

static void *slurm_thread(void *p)
{
	status_ctx *c = p;
	kiln_slurm_nodes *nodes = NULL;
	kiln_slurm_job *jobs = NULL;
	size_t n_jobs = 0;
	kiln_error e;
	kiln_error_reset(&e, NULL);
	int err = kiln_slurm_nodes_load(NULL, &nodes, &e);
	if (err >= 0)
		err = kiln_slurm_jobs_running(&jobs, &n_jobs, &e);
	pthread_mutex_lock(&c->lock);
	if (c->slurm_abandoned) {
		/* the caller gave up: nobody reads these any more */
		pthread_mutex_unlock(&c->lock);
		kiln_slurm_nodes_free(nodes);
		kiln_slurm_jobs_free(jobs, n_jobs);
		return NULL;
	}
	c->slurm_nodes = nodes;
	c->jobs = jobs;
	c->n_jobs = n_jobs;
	c->slurm_err = MIN(err, 0);
	if (err == -ENOENT)
		snprintf(c->slurm_error, sizeof(c->slurm_error), "%s; set SLURM_CONF", e.msg);
	else if (err < 0)
		snprintf(c->slurm_error, sizeof(c->slurm_error), "%s", e.msg);
	c->slurm_done = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static node_status *find_status(status_ctx *c, const char *name)
{
	for (size_t i = 0; i < c->n; i++)
		if (streq(c->ns[i].node->name, name))
			return &c->ns[i];
	return NULL;
}

/* Copies what slurmctld said into the nodes (under no lock: the Slurm
 * thread is done). */
static void apply_slurm(status_ctx *c)
{
	for (size_t i = 0; c->slurm_nodes && i < c->slurm_nodes->n; i++) {
		const kiln_slurm_node *ni = &c->slurm_nodes->v[i];
		node_status *s = find_status(c, ni->name);
		if (!s)
			continue;
		s->in_slurm = true;
		s->state = ni->state;
		if (ni->reason)
			s->reason = strdup(ni->reason);
	}
	for (size_t i = 0; i < c->n_jobs; i++) {
		_cleanup_strv_free_ char **names = NULL;
		size_t nn = 0;
		if (kiln_hostlist_expand(c->jobs[i].nodes, &names, &nn, NULL) < 0)
			continue;
		for (size_t k = 0; k < nn; k++) {
			node_status *s = find_status(c, names[k]);
			if (!s)
				continue;
			s->jobs++;
			if (json_array_size(s->job_ids) < STATUS_JOB_IDS_MAX)
				json_array_append_new(s->job_ids, json_integer(c->jobs[i].id));
		}
	}
}

/* ---- judging and printing --------------------------------------------- */

typedef struct health_counts {
	int gpus, healthy, degraded, unhealthy;
	const char *state; /* the node's: "healthy", "degraded", "unhealthy" */
} health_counts;

static void count_health(json_t *h, health_counts *hc)
{
	*hc = (health_counts){ .state = json_string_value(json_object_get(h, "state")) };
	size_t i;
	json_t *g;
	json_array_foreach(json_object_get(h, "gpus"), i, g)
	{
		const char *st = json_string_value(json_object_get(g, "state"));
		hc->gpus++;
		if (streq_ptr(st, "healthy"))
			hc->healthy++;
		else if (streq_ptr(st, "degraded"))
			hc->degraded++;
		else
			hc->unhealthy++;
	}
	if (!hc->state)
		hc->state = "unknown";
}

/* The node's reasons, then each GPU's as "gpuN: text". */
static json_t *health_reasons(json_t *h)
{
	json_t *out = json_array(), *r, *g;
	size_t i, k;
	json_array_foreach(json_object_get(h, "reasons"), i, r)
	{
		json_t *t = json_object_get(r, "text");
		if (json_is_string(t))
			json_array_append(out, t);
	}
	json_array_foreach(json_object_get(h, "gpus"), i, g)
	{
		json_int_t idx = json_integer_value(json_object_get(g, "index"));
		json_array_foreach(json_object_get(g, "reasons"), k, r)
		{
			const char *t = json_string_value(json_object_get(r, "text"));
			if (t) {
				char b[512];
				snprintf(b, sizeof(b), "gpu%lld: %s", (long long) idx, t);
				json_array_append_new(out, json_string(b));
			}
		}
	}
	return out;
}

/* "connection refused", "no answer within 2s", "HTTP 404" ... */
static void svc_error(const svc_result *s, uint64_t timeout, char *buf, size_t len)
{
	char d[32];
	if (s->err == -ETIMEDOUT)
		snprintf(buf, len, "no answer within %s",
			 kiln_format_duration(d, sizeof(d), timeout));
	else if (s->err == -EPROTO)
		snprintf(buf, len, "not an HTTP reply");
	else if (s->err == -EBADMSG)
		snprintf(buf, len, "reply is not a JSON object");
	else if (s->err < 0)
		snprintf(buf, len, "%s", strerror(-s->err));
	else if (s->status != 200)
		snprintf(buf, len, "HTTP %u", s->status);
	else
		buf[0] = '\0';
}

static bool svc_ok(const svc_result *s)
{
	return !s->queried || s->json;
}

static bool node_ok(const status_ctx *c, const node_status *s)
{
	if (c->slurm_err || !s->in_slurm || !kiln_slurm_state_ok(s->state))
		return false;
	if (!svc_ok(&s->health) || !svc_ok(&s->models))
		return false;
	if (s->health.json) {
		health_counts hc;
		count_health(s->health.json, &hc);
		if (hc.unhealthy > 0 || streq(hc.state, "unhealthy") || streq(hc.state, "unknown"))
			return false;
	}
	return true;
}

static json_t *svc_error_json(const svc_result *s, uint64_t timeout)
{
	char e[128];
	svc_error(s, timeout, e, sizeof(e));
	return json_string(e);
}

static json_t *node_json(const status_ctx *c, const node_status *s)
{
	char a[16], st[48];
	json_t *o = json_object();
	json_object_set_new(o, "name", json_string(s->node->name));
	json_object_set_new(o, "address", json_string(kiln_format_ipv4(a, s->node->address)));
	json_object_set_new(o, "ok", json_boolean(node_ok(c, s)));
	json_t *sl = json_null();
	if (!c->slurm_err)
		sl = json_pack("{s:s, s:s?, s:i, s:O}", "state",
			       s->in_slurm ? kiln_slurm_state_string(s->state, st, sizeof(st))
					   : "not-in-slurm",
			       "reason", s->reason, "jobs", s->jobs, "job_ids", s->job_ids);
	json_object_set_new(o, "slurm", sl);
	json_t *h = json_null();
	if (s->health.queried) {
		if (s->health.json) {
			health_counts hc;
			count_health(s->health.json, &hc);
			json_t *reasons = health_reasons(s->health.json);
			h = json_pack("{s:b, s:s, s:i, s:i, s:i, s:i, s:o, s:n}", "reachable", 1,
				      "state", hc.state, "gpus", hc.gpus, "healthy", hc.healthy,
				      "degraded", hc.degraded, "unhealthy", hc.unhealthy, "reasons",
				      reasons, "error");
		} else
			h = json_pack("{s:b, s:s, s:o}", "reachable", 0, "state", "unreachable",
				      "error", svc_error_json(&s->health, c->timeout));
	}
	json_object_set_new(o, "health", h);
	json_t *m = json_null();
	if (s->node->inference) {
		json_t *models = json_array();
		size_t i;
		json_t *e;
		json_array_foreach(json_object_get(s->models.json, "data"), i, e)
		{
			json_t *id = json_object_get(e, "id");
			if (json_is_string(id))
				json_array_append(models, id);
		}
		if (!s->models.queried)
			m = json_pack("{s:b, s:o, s:s}", "reachable", 0, "models", models, "error",
				      "inference.address is a loopback address: not reachable "
				      "from the head node");
		else if (s->models.json)
			m = json_pack("{s:b, s:o, s:n}", "reachable", 1, "models", models, "error");
		else
			m = json_pack("{s:b, s:o, s:o}", "reachable", 0, "models", models, "error",
				      svc_error_json(&s->models, c->timeout));
	}
	json_object_set_new(o, "inference", m);
	return o;
}

static bool use_colour(void)
{
	const char *t = getenv("TERM");
	return isatty(STDOUT_FILENO) && !getenv("NO_COLOR") && !(t && streq(t, "dumb"));
}

enum { C_NONE, C_GREEN, C_YELLOW, C_RED };

/* One table cell padded to width w, coloured when colour is on (the escape
 * codes do not count towards the width). */
static void cell(bool colour, int c, int w, const char *s)
{
	static const char *const esc[] = { "", "\033[32m", "\033[33m", "\033[1;31m" };
	if (colour && c != C_NONE)
		printf("%s%s\033[0m%*s", esc[c], s, w > (int) strlen(s) ? w - (int) strlen(s) : 0,
		       "");
	else
		printf("%-*s", w, s);
}

static int print_text(const status_ctx *c, size_t n_ok)
{
	bool colour = use_colour();
	int wn = 4;
	for (size_t i = 0; i < c->n; i++)
		wn = MAX(wn, (int) strlen(c->ns[i].node->name));
	printf("%-*s  %-15s  %-16s %4s  %-13s %-11s %-s\n", wn, "NODE", "ADDRESS", "SLURM", "JOBS",
	       "GPUS", "HEALTH", "MODELS / REASON");
	for (size_t i = 0; i < c->n; i++) {
		const node_status *s = &c->ns[i];
		char a[16], st[48], jobs[16], gpus[32], why[512] = "";
		printf("%-*s  %-15s  ", wn, s->node->name, kiln_format_ipv4(a, s->node->address));
		int sc = C_NONE;
		if (c->slurm_err)
			snprintf(st, sizeof(st), "?");
		else if (!s->in_slurm)
			snprintf(st, sizeof(st), "not-in-slurm"), sc = C_RED;
		else {
			kiln_slurm_state_string(s->state, st, sizeof(st));
			sc = kiln_slurm_state_ok(s->state)     ? C_GREEN
			     : kiln_slurm_state_down(s->state) ? C_RED
							       : C_YELLOW;
		}
		cell(colour, sc, 16, st);
		snprintf(jobs, sizeof(jobs), "%d", s->jobs);
		printf(" %4s  ", c->slurm_err ? "?" : jobs);
		const char *hs = "-";
		int hcol = C_NONE;
		snprintf(gpus, sizeof(gpus), "-");
		if (s->health.json) {
			health_counts hc;
			count_health(s->health.json, &hc);
			if (hc.unhealthy)
				snprintf(gpus, sizeof(gpus), "%d/%d ok,%d bad", hc.healthy, hc.gpus,
					 hc.unhealthy);
			else
				snprintf(gpus, sizeof(gpus), "%d/%d ok", hc.healthy, hc.gpus);
			hs = hc.state;
			hcol = streq(hs, "healthy")    ? C_GREEN
			       : streq(hs, "degraded") ? C_YELLOW
						       : C_RED;
		} else if (s->health.queried) {
			hs = "unreachable";
			hcol = C_RED;
		}
		/* models, then why the node is not fine */
		kiln_strbuf b;
		kiln_strbuf_init(&b);
		if (s->node->inference) {
			if (s->models.json) {
				size_t k;
				json_t *e;
				int nm = 0;
				json_array_foreach(json_object_get(s->models.json, "data"), k, e)
				{
					const char *id =
						json_string_value(json_object_get(e, "id"));
					if (id) {
						kiln_strbuf_append(&b, nm++ ? "," : "");
						kiln_strbuf_append_printable(&b, id);
					}
				}
				if (!nm)
					kiln_strbuf_append(&b, "(no model)");
			} else if (s->models.queried) {
				svc_error(&s->models, c->timeout, why, sizeof(why));
				kiln_strbuf_printf(&b, "inferd: %s", why);
			} else
				kiln_strbuf_append(&b, "inferd: on 127.0.0.1 only");
		}
		if (s->reason) {
			kiln_strbuf_printf(&b, "%s\"", b.len ? "  " : "");
			kiln_strbuf_append_printable(&b, s->reason);
			kiln_strbuf_append(&b, "\"");
		}
		if (s->health.queried && !s->health.json) {
			svc_error(&s->health, c->timeout, why, sizeof(why));
			kiln_strbuf_printf(&b, "%shealthd: %s", b.len ? "  " : "", why);
		} else if (s->health.json && !(s->reason && strncmp(s->reason, "kiln:", 5) == 0)) {
			/* (a "kiln: ..." drain reason is healthd's own: said once) */
			size_t k;
			json_t *r, *reasons = health_reasons(s->health.json);
			json_array_foreach(reasons, k, r)
			{
				kiln_strbuf_append(&b, b.len ? "; " : "");
				kiln_strbuf_append_printable(&b, json_string_value(r));
			}
			json_decref(reasons);
		}
		printf("%-13s ", gpus);
		_cleanup_free_ char *hs_p = kiln_str_printable(hs);    /* healthd's word */
		cell(colour, hcol, b.len ? 11 : 0, hs_p ? hs_p : "?"); /* no trailing blanks */
		if (b.len)
			printf(" %s", b.s);
		putchar('\n');
		kiln_strbuf_free(&b);
	}
	if (c->slurm_err) {
		_cleanup_free_ char *e = kiln_str_printable(c->slurm_error);
		printf("Slurm: %s\n", e ? e : "?");
	}
	printf("%zu node%s: %zu ok, %zu with problems\n", c->n, c->n == 1 ? "" : "s", n_ok,
	       c->n - n_ok);
	return 0;
}

/* ---- the verb --------------------------------------------------------- */

static int parse_option(int key, const char *arg)
{
	if (key != ARG_TIMEOUT)
		return 1;
	if (kiln_parse_duration(arg, KILN_USEC_PER_SEC, &arg_timeout) < 0 || arg_timeout == 0 ||
	    arg_timeout > STATUS_TIMEOUT_MAX_USEC)
		return kiln_usage_error(
			&kiln_status_prog,
			"--timeout '%s' is not a duration between 1ms and 300s (e.g. "
			"2, 500ms, 5s).",
			arg);
	return 0;
}

int kiln_status_main(int argc, char **argv)
{
	const uint64_t timeout = arg_timeout;
	if (argc - optind > 1)
		return kiln_usage_exit(
			&kiln_status_prog,
			"Unexpected argument '%s'; NODES is one hostlist (node[01-04],gpu07).",
			argv[optind + 1]);
	/* -c after the verb wins over the global one (`kiln -c FILE status`) */
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = kiln_cfg_open(arg_config ?: kiln_cli_config(), 0, &cfg);
	if (r < 0)
		return kiln_exit_for_config(r);

	status_ctx c = { .cfg = cfg, .timeout = timeout };
	_cleanup_free_ node_status *ns = calloc(cfg->n_nodes ? cfg->n_nodes : 1, sizeof(*ns));
	if (!ns)
		return log_error_errno(-ENOMEM, "Out of memory: %m");
	c.ns = ns;
	if (optind < argc) {
		_cleanup_strv_free_ char **names = NULL;
		size_t nn = 0, pos = 0;
		r = kiln_hostlist_expand(argv[optind], &names, &nn, &pos);
		if (r < 0)
			return kiln_usage_exit(&kiln_status_prog,
					       "NODES '%s' is not a hostlist (at byte %zu: %s).",
					       argv[optind], pos, strerror(-r));
		for (size_t i = 0; i < nn; i++) {
			const kiln_cfg_node *n = kiln_cfg_find_node(cfg, names[i]);
			if (!n) {
				log_error("No node '%s' in %s; `kiln show nodes` lists them.",
					  names[i], cfg->path);
				return KILN_EXIT_USAGE;
			}
			if (!find_status(&c, n->name))
				ns[c.n++].node = n;
		}
	} else
		for (size_t i = 0; i < cfg->n_nodes; i++)
			ns[c.n++].node = &cfg->nodes[i];

	uint64_t start = kiln_now_usec();
	for (size_t i = 0; i < c.n; i++)
		ns[i].job_ids = json_array();
	pthread_mutex_init(&c.lock, NULL);
	kiln_cond_init_monotonic(&c.cond);

	/* slurmctld, on a detached thread that may be abandoned */
	kiln_error se;
	kiln_error_reset(&se, NULL);
	if (kiln_slurm_init(&se) < 0) {
		c.slurm_err = -ENOENT;
		snprintf(c.slurm_error, sizeof(c.slurm_error), "%s; set SLURM_CONF", se.msg);
		c.slurm_done = true;
	} else {
		pthread_t t;
		if (pthread_create(&t, NULL, slurm_thread, &c) != 0)
			return log_error_errno(-EAGAIN, "Failed to start a thread: %m");
		pthread_detach(t);
	}
	size_t n_threads = MIN(c.n, (size_t) STATUS_THREADS_MAX);
	pthread_t threads[STATUS_THREADS_MAX];
	size_t started = 0;
	for (; started < n_threads; started++)
		if (pthread_create(&threads[started], NULL, worker, &c) != 0)
			break;
	if (started == 0 && c.n > 0)
		worker(&c); /* no thread: one by one, still bounded per node */
	for (size_t i = 0; i < started; i++)
		pthread_join(threads[i], NULL);

	pthread_mutex_lock(&c.lock);
	uint64_t dl = start + timeout;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = kiln_now_usec();
	if (dl > now) {
		uint64_t ns_ = (uint64_t) ts.tv_nsec + (dl - now) * 1000;
		ts.tv_sec += (time_t) (ns_ / 1000000000);
		ts.tv_nsec = (long) (ns_ % 1000000000);
		while (!c.slurm_done)
			if (pthread_cond_timedwait(&c.cond, &c.lock, &ts) == ETIMEDOUT)
				break;
	}
	if (!c.slurm_done) {
		char d[32];
		c.slurm_abandoned = true;
		c.slurm_err = -ETIMEDOUT;
		snprintf(c.slurm_error, sizeof(c.slurm_error),
			 "slurmctld did not answer within %s (is it running? `scontrol ping`)",
			 kiln_format_duration(d, sizeof(d), timeout));
	}
	pthread_mutex_unlock(&c.lock);
	if (c.slurm_done && !c.slurm_err)
		apply_slurm(&c);

	size_t n_ok = 0;
	for (size_t i = 0; i < c.n; i++)
		n_ok += node_ok(&c, &ns[i]);
	if (arg_json) {
		json_t *nodes = json_array();
		for (size_t i = 0; i < c.n; i++)
			json_array_append_new(nodes, node_json(&c, &ns[i]));
		json_t *sl = c.slurm_err ? json_pack("{s:b, s:s}", "reachable", 0, "error",
						     c.slurm_error)
					 : json_pack("{s:b, s:n}", "reachable", 1, "error");
		r = kiln_cli_print_json(
			json_pack("{s:s, s:b, s:o, s:{s:I, s:I, s:I}, s:o}", "cluster",
				  cfg->cluster.name, "ok", !c.slurm_err && n_ok == c.n, "slurm", sl,
				  "summary", "nodes", (json_int_t) c.n, "ok", (json_int_t) n_ok,
				  "problems", (json_int_t) (c.n - n_ok), "nodes", nodes),
			JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		if (r < 0)
			return log_error_errno(-ENOMEM, "Out of memory: %m");
	} else
		print_text(&c, n_ok);

	for (size_t i = 0; i < c.n; i++) {
		json_decref(ns[i].health.json);
		json_decref(ns[i].models.json);
		json_decref(ns[i].job_ids);
		free(ns[i].reason);
	}
	if (c.slurm_done) {
		kiln_slurm_nodes_free(c.slurm_nodes);
		kiln_slurm_jobs_free(c.jobs, c.n_jobs);
	}
	return !c.slurm_err && n_ok == c.n ? KILN_EXIT_OK : KILN_EXIT_FAILURE;
}
