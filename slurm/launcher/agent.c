/* agent.c — the kiln-run agent loop on every node, and the rendezvous leader.
 *
 * Every agent talks to the store with the kiln client; the agent on the
 * first live node (Slurm node order) also hosts the store and leads.  Keys
 * (all under the secret-protected /kiln/ prefix):
 *
 *   /kiln/node/<id>      "host addr nproc last_round restarts" (join info)
 *   /kiln/joins          APPEND "<id>\n" per join
 *   /kiln/hb/<id>        ADD 1 every heartbeat
 *   /kiln/live           the leader's liveness port (a TCP connection per
 *                        agent whose close tells the leader at once that the
 *                        agent died; heartbeats catch hangs and partitions)
 *   /kiln/fail, /kiln/done  APPEND "<id> <round> <code>\n" / "<id> <round>\n"
 *   /kiln/round          counter: the latest round; /kiln/round/<R> its text
 *   /kiln/round/<R>/barrier  ADD 1 per member before starting workers
 *   /kiln/restarts       failed rounds so far (survives a store failover)
 *   /kiln/closed, /kiln/result  counter > 0 once the job ended; "code text"
 *
 * Store failover: an agent that loses the store (connection error, or the
 * liveness connection closes) stops its workers and moves on to the next
 * node in Slurm order; the agent on that node starts a new store there and
 * leads.  Agents rejoin with their last round number so rounds keep
 * increasing.
 *
 * The loop is sd-event, one per session (a session ends when the job ends
 * or the store is lost): signal sources, io sources for the liveness
 * connection, the leader's liveness listener and connections and the
 * workers' output pipes (one epoll set, kr_group.epoll_fd), a timer that
 * polls the store every KR_POLL_USEC, and a post source that advances the
 * workers and checks for the end after every event. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <systemd/sd-event.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/slurm.h"
#include "kiln/store.h"
#include "kiln/strbuf.h"
#include "launcher.h"

/* Liveness connections the leader accepts: one per agent, plus slack. */
#define KR_LIVE_MAX (RDZV_MAX_NODES + 64)
/* Longest liveness hello: "<id> <secret>\n". */
#define KR_LIVE_HELLO_MAX (32 + KILN_STORE_SECRET_MAX)
/* First connection to the store host: the agent there may still be starting
 * (srun start skew, a health check). */
#define KR_FIRST_CONNECT_USEC (20 * KILN_USEC_PER_SEC)
/* After the job ended the leader keeps the store up this long at most, so
 * every agent reads the result. */
#define KR_LINGER_USEC (3 * KILN_USEC_PER_SEC)
/* Joining a store that answered but then failed: retries before moving on. */
#define KR_JOIN_TRIES	   3
#define KR_JOIN_RETRY_USEC (200 * 1000)
/* Per-operation client timeout. */
#define KR_OP_TIMEOUT_USEC (5 * KILN_USEC_PER_SEC)

typedef struct live_conn {
	int fd;
	sd_event_source *src; /* while a session runs */
	long id;	      /* -1 until the hello was read */
	char buf[KR_LIVE_HELLO_MAX];
	size_t len;
} live_conn;

typedef struct kr_leader {
	kiln_store_server *srv;
	rdzv_leader st;
	int live_fd;
	live_conn *conns;
	size_t n_conns;
	size_t joins_off, fail_off, done_off;
	bool closed;
	uint64_t closed_usec;
	uint32_t *allow;
	size_t n_allow;
} kr_leader;

typedef enum agent_state {
	A_IDLE,
	A_BARRIER,
	A_RUNNING,
	A_STOPPING,
	A_DONE,
} agent_state;

typedef struct kr_agent {
	const kr_opts *o;
	kr_job *job;
	char secret[KILN_STORE_SECRET_MAX + 1];
	size_t store_idx;
	bool first_connect;
	kiln_store_client *c;
	kiln_store_relay *relay; /* the workers' way to the store (MASTER_PORT) */
	bool munge;		 /* no KILN_RUN_SECRET: the secret comes through MUNGE */
	kr_munge_ctx mctx;
	int live_fd;
	kr_leader *L;
	uint64_t seen_round;
	rdzv_round pending, cur;
	agent_state state;
	uint64_t stop_deadline;
	kr_group g;
	sd_event *ev; /* the session's loop, NULL between sessions */
	uint64_t next_hb;
	int term_sig;
	uint64_t term_deadline;
	bool killed_hard;
	bool ever_member;
	bool finished;
	int exit_code;
	unsigned nproc;
	uint64_t restarts;
	bool healthy;
	int last_worker_code;
	char ifname[64];
} kr_agent;

/* ---- helpers --------------------------------------------------------- */

static bool secret_eq(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = (unsigned char) (la != lb);
	for (size_t i = 0; i < la && i < lb; i++)
		d |= (unsigned char) (a[i] ^ b[i]);
	return d == 0;
}

int kr_make_secret(char *buf, size_t len)
{
	unsigned char raw[KR_SECRET_LEN / 2];
	if (getrandom(raw, sizeof(raw), 0) != (ssize_t) sizeof(raw))
		return -errno;
	for (size_t i = 0; i < sizeof(raw) && 2 * i + 2 < len; i++)
		snprintf(buf + 2 * i, 3, "%02x", raw[i]);
	return 0;
}

static int parse_ipv4_list(const kr_job *j, uint32_t **ret, size_t *ret_n)
{
	uint32_t *v = calloc(j->n, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < j->n; i++)
		if (kiln_parse_ipv4(j->addrs[i], &v[i]) < 0) {
			free(v);
			return -EINVAL;
		}
	*ret = v;
	*ret_n = j->n;
	return 0;
}

static bool store_conn_lost(int r)
{
	return r == -ECONNRESET || r == -ENOTCONN || r == -EPROTO || r == -ETIMEDOUT ||
	       r == -EPIPE || r == -ECONNREFUSED;
}

/* The store and the relay refuse peers from their own threads; each
 * refusal is logged with who it was (a user's process on a shared node
 * probing the job is worth a line in the job's log), up to
 * KR_REFUSED_LOG_MAX lines, then every KR_REFUSED_LOG_EVERY-th, so that a
 * connect flood cannot flood the log. */
#define KR_REFUSED_LOG_MAX   20
#define KR_REFUSED_LOG_EVERY 1000
static void log_refused(const char *msg, void *userdata)
{
	static atomic_uint n;
	unsigned k = atomic_fetch_add(&n, 1) + 1;
	if (k <= KR_REFUSED_LOG_MAX || k % KR_REFUSED_LOG_EVERY == 0)
		log_warning("Refused a connection to this job's store: %s (%u so far)", msg, k);
}

/* ---- leader ---------------------------------------------------------- */

static void leader_free(kr_leader *L)
{
	if (!L)
		return;
	for (size_t i = 0; i < L->n_conns; i++) {
		L->conns[i].src = sd_event_source_disable_unref(L->conns[i].src);
		closep(&L->conns[i].fd);
	}
	free(L->conns);
	closep(&L->live_fd);
	kiln_store_server_free(L->srv);
	rdzv_leader_done(&L->st);
	free(L->allow);
	free(L);
}

static int leader_new(kr_agent *a, kr_leader **ret)
{
	const kr_opts *o = a->o;
	kr_leader *L = calloc(1, sizeof(*L));
	if (!L)
		return -ENOMEM;
	L->live_fd = -1;
	int r = parse_ipv4_list(a->job, &L->allow, &L->n_allow);
	if (r < 0)
		goto fail;
	kiln_store_server_opts so;
	kiln_store_server_opts_init(&so);
	so.port = o->port;
	so.allow = L->allow;
	so.n_allow = L->n_allow;
	so.allow_loopback = true;
	so.secret = a->secret;
	/* Every connection authenticates: agents with the secret, workers
	 * through their node's relay (docs/store.md, "Who may connect").  A
	 * process on this node must be the job's user. */
	so.require_auth = true;
	so.check_peer_uid = true;
	so.peer_uid = geteuid();
	so.on_refused = log_refused;
	if (a->munge) {
		/* agents without the secret prove their uid with MUNGE */
		so.token_auth = kr_munge_check;
		so.token_auth_userdata = &a->mctx;
	}
	/* A standalone run has no other node: its store and live socket are
	 * on 127.0.0.1 only (docs/kiln-run.md), not open to the network. */
	if (o->standalone)
		so.bind_address = "127.0.0.1";
	r = kiln_store_server_new(&so, &L->srv);
	if (r < 0) {
		log_error_errno(
			r, "Failed to start the store on port %u: %m (pick another with --port)",
			o->port);
		goto fail;
	}
	r = rdzv_leader_init(&L->st, &o->rdzv, a->job->n, kiln_now_usec());
	if (r < 0)
		goto fail;
	rdzv_leader_resume(&L->st, a->seen_round, (unsigned) a->restarts);

	L->live_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (L->live_fd < 0) {
		r = -errno;
		goto fail;
	}
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr =
					  htonl(o->standalone ? INADDR_LOOPBACK : INADDR_ANY) };
	socklen_t sl = sizeof(sa);
	if (bind(L->live_fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
	    listen(L->live_fd, 4096) < 0 ||
	    getsockname(L->live_fd, (struct sockaddr *) &sa, &sl) < 0) {
		r = -errno;
		goto fail;
	}
	char port[16];
	snprintf(port, sizeof(port), "%u", ntohs(sa.sin_port));
	r = kiln_store_server_set(L->srv, "/kiln/live", port, strlen(port));
	if (r < 0)
		goto fail;
	char rs[32];
	snprintf(rs, sizeof(rs), "%" PRIu64, a->restarts);
	r = kiln_store_server_set(L->srv, "/kiln/restarts", rs, strlen(rs));
	if (r < 0)
		goto fail;
	if (a->seen_round > 0) {
		r = kiln_store_server_add(L->srv, "/kiln/round", (int64_t) a->seen_round, NULL);
		if (r < 0)
			goto fail;
	}
	r = kiln_store_server_start(L->srv);
	if (r < 0)
		goto fail;
	*ret = L;
	return 0;
fail:
	leader_free(L);
	return r;
}

static bool peer_allowed(const kr_leader *L, const struct sockaddr_in *sa)
{
	uint32_t a = ntohl(sa->sin_addr.s_addr);
	if ((a >> 24) == 127)
		return true;
	for (size_t i = 0; i < L->n_allow; i++)
		if (L->allow[i] == a)
			return true;
	return false;
}

static int on_conn(sd_event_source *s, int fd, uint32_t revents, void *userdata);

/* An io source for a liveness connection, when a session runs. */
static int conn_watch(kr_agent *a, live_conn *lc)
{
	if (!a->ev || lc->src)
		return 0;
	return sd_event_add_io(a->ev, &lc->src, lc->fd, EPOLLIN, on_conn, a);
}

/* Drops connection i (its source first, then the fd); the last one moves
 * into its slot. */
static void live_conn_close(kr_leader *L, size_t i)
{
	live_conn *lc = &L->conns[i];
	lc->src = sd_event_source_disable_unref(lc->src);
	close(lc->fd);
	L->conns[i] = L->conns[--L->n_conns];
}

static void leader_accept(kr_agent *a)
{
	kr_leader *L = a->L;
	for (;;) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(L->live_fd, (struct sockaddr *) &sa, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		if (!peer_allowed(L, &sa) || L->n_conns >= KR_LIVE_MAX) {
			close(fd);
			continue;
		}
		/* Like the store: a process of another user on this node is
		 * closed at once (it could otherwise hold liveness slots). */
		uid_t uid;
		int k = kiln_store_peer_uid(fd, &uid);
		if ((k == 1 && uid != geteuid()) || k < 0 ||
		    (k == 0 && (ntohl(sa.sin_addr.s_addr) >> 24) == 127)) {
			char msg[160];
			snprintf(msg, sizeof(msg), "liveness socket: port %u: %s%u",
				 ntohs(sa.sin_port),
				 k == 1 ? "a process of uid " : "an unidentifiable peer, error ",
				 k == 1 ? (unsigned) uid : (unsigned) -k);
			log_refused(msg, NULL);
			close(fd);
			continue;
		}
		live_conn *n = realloc(L->conns, (L->n_conns + 1) * sizeof(*n));
		if (!n) {
			close(fd);
			return;
		}
		L->conns = n;
		L->conns[L->n_conns++] = (live_conn){ .fd = fd, .id = -1 };
		if (conn_watch(a, &L->conns[L->n_conns - 1]) < 0) {
			live_conn_close(L, L->n_conns - 1);
			return;
		}
	}
}

static void live_drop(kr_agent *a, size_t i)
{
	kr_leader *L = a->L;
	live_conn *lc = &L->conns[i];
	if (lc->id >= 0) {
		log_debug("Liveness connection of %s closed", a->job->nodes[lc->id]);
		rdzv_leader_lost(&L->st, (size_t) lc->id, kiln_now_usec());
	}
	live_conn_close(L, i);
}

static void leader_read_conn(kr_agent *a, size_t i)
{
	kr_leader *L = a->L;
	live_conn *lc = &L->conns[i];
	char tmp[256];
	for (;;) {
		ssize_t r = read(lc->fd, tmp, sizeof(tmp));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r <= 0) {
			live_drop(a, i);
			return;
		}
		if (lc->id >= 0)
			continue; /* nothing more is expected; ignore */
		size_t take = MIN((size_t) r, sizeof(lc->buf) - 1 - lc->len);
		memcpy(lc->buf + lc->len, tmp, take);
		lc->len += take;
		lc->buf[lc->len] = 0;
		char *nl = strchr(lc->buf, '\n');
		if (!nl) {
			if (lc->len >= sizeof(lc->buf) - 1)
				goto bad;
			continue;
		}
		*nl = 0;
		char *sp = strchr(lc->buf, ' ');
		if (!sp)
			goto bad;
		*sp = 0;
		int id;
		if (kiln_parse_int(lc->buf, 0, (int) a->job->n - 1, &id) < 0 ||
		    !secret_eq(sp + 1, a->secret))
			goto bad;
		lc->id = id;
		log_debug("Liveness connection from %s", a->job->nodes[id]);
	}
bad:
	log_debug("Dropping a liveness connection with a bad hello");
	live_conn_close(L, i);
}

/* Reads the next complete lines of an APPEND-built key. */
static int read_lines(kr_leader *L, const char *key, size_t *off, char **ret)
{
	_cleanup_free_ void *v = NULL;
	size_t len = 0;
	int r = kiln_store_server_get(L->srv, key, &v, &len);
	if (r == -ENOENT) {
		*ret = NULL;
		return 0;
	}
	if (r < 0)
		return r;
	const char *s = v;
	const char *end = memrchr(s, '\n', len);
	if (!end || (size_t) (end - s) + 1 <= *off) {
		*ret = NULL;
		return 0;
	}
	size_t n = (size_t) (end - s) + 1 - *off;
	*ret = strndup(s + *off, n);
	if (!*ret)
		return -ENOMEM;
	*off += n;
	return 0;
}

static void leader_publish_end(kr_agent *a, int code, const char *text)
{
	kr_leader *L = a->L;
	char buf[700];
	snprintf(buf, sizeof(buf), "%d %s", code, text);
	kiln_store_server_set(L->srv, "/kiln/result", buf, strlen(buf));
	kiln_store_server_add(L->srv, "/kiln/closed", 1, NULL);
	L->closed = true;
	L->closed_usec = kiln_now_usec();
}

static void leader_step(kr_agent *a)
{
	kr_leader *L = a->L;
	uint64_t now = kiln_now_usec();
	_cleanup_free_ char *joins = NULL, *fails = NULL, *dones = NULL;

	if (read_lines(L, "/kiln/joins", &L->joins_off, &joins) == 0 && joins) {
		char *save = NULL;
		for (char *t = strtok_r(joins, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
			int id;
			if (kiln_parse_int(t, 0, (int) a->job->n - 1, &id) < 0)
				continue;
			char key[64];
			snprintf(key, sizeof(key), "/kiln/node/%d", id);
			_cleanup_free_ char *info = NULL;
			size_t il;
			if (kiln_store_server_get(L->srv, key, (void **) &info, &il) < 0)
				continue;
			char host[RDZV_HOST_MAX + 1], addr[RDZV_ADDR_MAX + 1];
			unsigned nproc;
			uint64_t last_round, restarts;
			if (sscanf(info, "%64s %16s %u %" SCNu64 " %" SCNu64, host, addr, &nproc,
				   &last_round, &restarts) != 5)
				continue;
			if (rdzv_leader_join(&L->st, (size_t) id, host, addr, nproc, now) < 0)
				continue;
			rdzv_leader_resume(&L->st, last_round,
					   (unsigned) MIN(restarts, UINT32_MAX));
			log_info("%s joined (%u workers)", host, nproc);
		}
	}
	for (size_t i = 0; i < L->st.n; i++) {
		if (!L->st.nodes[i].joined)
			continue;
		char key[64];
		snprintf(key, sizeof(key), "/kiln/hb/%zu", i);
		_cleanup_free_ char *v = NULL;
		size_t vl;
		int64_t hb;
		if (kiln_store_server_get(L->srv, key, (void **) &v, &vl) == 0 &&
		    kiln_parse_int64(v, 0, INT64_MAX, &hb) == 0)
			rdzv_leader_heartbeat(&L->st, i, hb, now);
	}
	if (read_lines(L, "/kiln/fail", &L->fail_off, &fails) == 0 && fails) {
		char *save = NULL;
		for (char *t = strtok_r(fails, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
			unsigned id;
			uint64_t round;
			int code;
			if (sscanf(t, "%u %" SCNu64 " %d", &id, &round, &code) == 3 && id < L->st.n)
				rdzv_leader_worker_failed(&L->st, id, round, code, now);
		}
	}
	if (read_lines(L, "/kiln/done", &L->done_off, &dones) == 0 && dones) {
		char *save = NULL;
		for (char *t = strtok_r(dones, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
			unsigned id;
			uint64_t round;
			if (sscanf(t, "%u %" SCNu64, &id, &round) == 2 && id < L->st.n)
				rdzv_leader_worker_done(&L->st, id, round, now);
		}
	}

	unsigned restarts_before = L->st.restarts;
	rdzv_action act = rdzv_leader_tick(&L->st, now);
	if (L->st.restarts != restarts_before && act != RDZV_ACT_FAIL) {
		char rs[32];
		snprintf(rs, sizeof(rs), "%u", L->st.restarts);
		kiln_store_server_set(L->srv, "/kiln/restarts", rs, strlen(rs));
		log_warning("Restart %u of %u after failure (%s)", L->st.restarts,
			    L->st.p.max_restarts, L->st.reason);
	}
	switch (act) {
	case RDZV_ACT_NONE:
		break;
	case RDZV_ACT_ROUND: {
		rdzv_round rd;
		_cleanup_free_ char *text = NULL;
		if (rdzv_round_from_leader(&L->st, &rd) < 0)
			break;
		int r = rdzv_round_format(&rd, &text);
		if (r == 0) {
			char key[64];
			snprintf(key, sizeof(key), "/kiln/round/%" PRIu64, rd.round);
			r = kiln_store_server_set(L->srv, key, text, strlen(text));
		}
		if (r == 0) {
			int64_t cur = 0;
			kiln_store_server_add(L->srv, "/kiln/round", 0, &cur);
			kiln_store_server_add(L->srv, "/kiln/round", (int64_t) rd.round - cur,
					      NULL);
			log_notice("Round %" PRIu64 ": %" PRIu32 " nodes, WORLD_SIZE %" PRIu32
				   " (%s)",
				   rd.round, rd.n, rd.world_size, L->st.reason);
		} else
			log_warning_errno(r, "Failed to publish round %" PRIu64 ": %m", rd.round);
		rdzv_round_free(&rd);
		break;
	}
	case RDZV_ACT_SUCCESS:
		log_notice("Job finished: %s", L->st.reason);
		leader_publish_end(a, 0, L->st.reason);
		break;
	case RDZV_ACT_FAIL:
		log_error("Job failed: %s", L->st.reason);
		leader_publish_end(a, L->st.exit_code, L->st.reason);
		break;
	case RDZV_ACT_TIMEOUT:
		log_error("Rendezvous timed out: %s", L->st.reason);
		leader_publish_end(a, KR_EXIT_JOIN_TIMEOUT, L->st.reason);
		break;
	}
}

/* ---- agent: store connection ----------------------------------------- */

static void agent_disconnect(kr_agent *a)
{
	kiln_store_client_free(a->c);
	a->c = NULL;
	closep(&a->live_fd);
	a->live_fd = -1;
	if (a->L) {
		leader_free(a->L);
		a->L = NULL;
	}
}

static int live_connect(kr_agent *a, const char *addr)
{
	_cleanup_free_ void *v = NULL;
	size_t len;
	int r = kiln_store_client_get(a->c, "/kiln/live", &v, &len);
	if (r < 0)
		return r;
	int port;
	r = kiln_parse_int(v, 1, 65535, &port);
	if (r < 0)
		return -EPROTO;
	_cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t) port) };
	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		return -EINVAL;
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
		return -errno;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	char hello[KR_LIVE_HELLO_MAX];
	int n = snprintf(hello, sizeof(hello), "%zu %s\n", a->job->self, a->secret);
	if (write(fd, hello, (size_t) n) != n)
		return -EPIPE;
	a->live_fd = TAKE_FD(fd);
	return 0;
}

static int agent_join(kr_agent *a)
{
	char key[64], info[256];
	const kr_job *j = a->job;
	snprintf(key, sizeof(key), "/kiln/node/%zu", j->self);
	snprintf(info, sizeof(info), "%s %s %u %" PRIu64 " %" PRIu64, j->nodes[j->self],
		 j->addrs[j->self], a->nproc, a->seen_round, a->restarts);
	int r = kiln_store_client_set(a->c, key, info, strlen(info));
	if (r < 0)
		return r;
	snprintf(info, sizeof(info), "%zu\n", j->self);
	return kiln_store_client_append(a->c, "/kiln/joins", info, strlen(info));
}

/* Points the workers' relay at the store (starting it the first time, once
 * the secret is known). */
static int relay_to(kr_agent *a, const char *host, uint16_t port)
{
	if (a->relay)
		return kiln_store_relay_set_upstream(a->relay, host, port);
	kiln_store_relay_opts ro;
	kiln_store_relay_opts_init(&ro);
	ro.upstream_host = host;
	ro.upstream_port = port;
	ro.secret = a->secret;
	ro.peer_uid = geteuid();
	ro.on_refused = log_refused;
	return kiln_store_relay_new(&ro, &a->relay);
}

/* Presents a MUNGE credential instead of the secret, and learns the
 * secret from the answer (munge.c). */
static int agent_munge_auth(kr_agent *a)
{
	_cleanup_free_ char *token = NULL, *reply = NULL;
	int r = kr_munge_token(a->job->job_id, &token);
	if (r < 0)
		return r;
	r = kiln_store_client_auth_token(a->c, token, strlen(token), (void **) &reply, NULL);
	if (r < 0)
		return r;
	r = kr_munge_secret(reply, a->secret, sizeof(a->secret));
	if (r < 0)
		return r;
	log_info("Got the job secret from the store host through MUNGE");
	return 0;
}

/* Connects to the store on store_idx, hosting it when that is this node.
 * Moves on to the next node when the host does not answer. */
static int agent_connect(kr_agent *a)
{
	const kr_job *j = a->job;
	unsigned join_tries = 0;
	while (a->store_idx < j->n) {
		const char *host = j->addrs[a->store_idx];
		int r;
		if (a->store_idx == j->self) {
			/* the first store host of a MUNGE job makes the secret;
			 * a later one (failover) has learned it */
			if (!a->secret[0] && (r = kr_make_secret(a->secret, sizeof(a->secret))) < 0)
				return log_error_errno(r, "Failed to generate the job secret: %m");
			r = leader_new(a, &a->L);
			if (r < 0)
				return r;
			uint16_t port = kiln_store_server_port(a->L->srv);
			log_info("Hosting the store on %s:%u", j->nodes[j->self], port);
			r = relay_to(a, "127.0.0.1", port);
			if (r < 0)
				return log_error_errno(
					r, "Failed to start the workers' store relay: %m");
			r = kiln_store_client_connect("127.0.0.1", port, a->secret,
						      KR_OP_TIMEOUT_USEC, &a->c);
			if (r < 0)
				return log_error_errno(r,
						       "Failed to connect to the local store: %m");
		} else {
			uint64_t t = a->first_connect
					     ? KR_FIRST_CONNECT_USEC + a->o->rdzv.dead_after_usec
					     : a->o->rdzv.dead_after_usec;
			r = kiln_store_client_connect(host, a->o->port,
						      a->secret[0] ? a->secret : NULL, t, &a->c);
			if (r == 0 && !a->secret[0]) {
				r = agent_munge_auth(a);
				if (r < 0) {
					kiln_store_client_free(a->c);
					a->c = NULL;
				}
				if (r == -EACCES || r == -EPROTO)
					return log_error_errno(
						r,
						"The store on %s did not hand this agent "
						"the job secret through MUNGE: %m",
						j->nodes[a->store_idx]);
			}
			if (r == -EACCES)
				return log_error_errno(
					r,
					"The store on %s rejected this job's secret; are all "
					"agents started by the same job with the same %s?",
					j->nodes[a->store_idx], KR_ENV_SECRET);
			if (r < 0) {
				log_warning_errno(r,
						  "Store host %s (%s:%u) does not answer: %m; "
						  "trying the next node",
						  j->nodes[a->store_idx], host, a->o->port);
				a->store_idx++;
				a->first_connect = false;
				continue;
			}
			kiln_store_client_set_timeout(a->c, KR_OP_TIMEOUT_USEC);
			r = relay_to(a, host, a->o->port);
			if (r < 0)
				return log_error_errno(
					r, "Failed to start the workers' store relay: %m");
		}
		a->first_connect = false;
		if (a->healthy) {
			r = agent_join(a);
			if (r < 0)
				goto lost;
		}
		if (!a->L) {
			r = live_connect(a, host);
			if (r < 0)
				goto lost;
		}
		return 0;
	lost:
		log_warning_errno(r, "Lost the store on %s while joining: %m",
				  j->nodes[a->store_idx]);
		agent_disconnect(a);
		/* A store that just moved may still be settling: try the same
		 * host again a few times before giving up on it. */
		if (a->store_idx != j->self && ++join_tries < KR_JOIN_TRIES) {
			usleep(KR_JOIN_RETRY_USEC);
			continue;
		}
		join_tries = 0;
		a->store_idx++;
	}
	return log_error_errno(-EHOSTUNREACH,
			       "No node of the allocation can host the store any more; giving up");
}

/* ---- agent: workers --------------------------------------------------- */

static void start_stop(kr_agent *a, int sig, uint64_t within)
{
	kr_group_kill(&a->g, sig);
	a->stop_deadline = kiln_now_usec() + within;
	a->killed_hard = false;
	a->state = A_STOPPING;
}

static void spawn_round(kr_agent *a)
{
	const rdzv_member *me = rdzv_round_find(&a->cur, (uint32_t) a->job->self);
	const rdzv_member *m0 = &a->cur.m[0];
	(void) m0;
	kr_worker_env e = {
		.rank_base = me->rank_base,
		.local_world = me->nproc,
		.world = a->cur.world_size,
		.group_rank = me->group_rank,
		.restart_count = a->cur.round - 1,
		.max_restarts = a->o->rdzv.max_restarts,
		/* the relay on this node, which vouches for the workers */
		.master_addr = "127.0.0.1",
		.master_port = kiln_store_relay_port(a->relay),
		.run_id = a->o->run_id,
		.host = a->job->nodes[a->job->self],
		.node_addr = a->job->addrs[a->job->self],
		.ifname = a->ifname[0] ? a->ifname : NULL,
		.round = a->cur.round,
		.gpus = a->o->node_gpus,
	};
	int r = kr_group_spawn(&a->g, a->o->argv, &e, a->o->prefix_output);
	if (r < 0) {
		log_error_errno(r, "Failed to start workers: %m");
		a->state = A_STOPPING;
		kr_group_kill(&a->g, SIGKILL);
		a->stop_deadline = kiln_now_usec();
		return;
	}
	log_info("%s: round %" PRIu64 ": started ranks %" PRIu32 "-%" PRIu32 " of %" PRIu32,
		 a->job->nodes[a->job->self], a->cur.round, me->rank_base,
		 me->rank_base + me->nproc - 1, a->cur.world_size);
	a->state = A_RUNNING;
	a->ever_member = true;
}

static int report(kr_agent *a, const char *key, const char *line)
{
	return kiln_store_client_append(a->c, key, line, strlen(line));
}

/* Returns < 0 on a store error. */
static int workers_step(kr_agent *a, uint64_t now)
{
	int r = 0;
	char key[96], line[96];
	if (a->g.n)
		kr_group_reap(&a->g);
	switch (a->state) {
	case A_IDLE:
	case A_DONE:
		if (!a->pending.n || a->term_sig || a->finished)
			break;
		rdzv_round_free(&a->cur);
		a->cur = a->pending;
		a->pending = (rdzv_round){ 0 };
		if (!rdzv_round_find(&a->cur, (uint32_t) a->job->self)) {
			log_info("%s: round %" PRIu64 " does not include this node; waiting",
				 a->job->nodes[a->job->self], a->cur.round);
			a->state = A_IDLE;
			break;
		}
		snprintf(key, sizeof(key), "/kiln/round/%" PRIu64 "/barrier", a->cur.round);
		r = kiln_store_client_add(a->c, key, 1, NULL);
		if (r < 0)
			return r;
		a->state = A_BARRIER;
		__attribute__((fallthrough));
	case A_BARRIER: {
		if (a->pending.n) {
			a->state = A_IDLE;
			break;
		}
		int64_t v = 0;
		snprintf(key, sizeof(key), "/kiln/round/%" PRIu64 "/barrier", a->cur.round);
		r = kiln_store_client_add(a->c, key, 0, &v);
		if (r < 0)
			return r;
		if (v >= (int64_t) a->cur.n)
			spawn_round(a);
		break;
	}
	case A_RUNNING: {
		int res = kr_group_result(&a->g);
		if (a->pending.n && res < 0) {
			log_notice("%s: round %" PRIu64 " replaces round %" PRIu64
				   "; stopping workers",
				   a->job->nodes[a->job->self], a->pending.round, a->cur.round);
			start_stop(a, SIGTERM, MIN(a->o->grace_usec, KR_RESTART_STOP_USEC));
			break;
		}
		if (res < 0)
			break;
		kr_group_pump(&a->g, true);
		if (res == 0) {
			log_info("%s: round %" PRIu64 ": all workers exited 0",
				 a->job->nodes[a->job->self], a->cur.round);
			snprintf(line, sizeof(line), "%zu %" PRIu64 "\n", a->job->self,
				 a->cur.round);
			a->state = A_DONE;
			a->last_worker_code = 0;
			if (!a->term_sig)
				r = report(a, "/kiln/done", line);
			return r;
		}
		a->last_worker_code = res;
		log_warning("%s: round %" PRIu64
			    ": a worker exited with code %d; stopping the others",
			    a->job->nodes[a->job->self], a->cur.round, res);
		if (!a->term_sig) {
			snprintf(line, sizeof(line), "%zu %" PRIu64 " %d\n", a->job->self,
				 a->cur.round, res);
			r = report(a, "/kiln/fail", line);
		}
		start_stop(a, SIGTERM, MIN(a->o->grace_usec, KR_RESTART_STOP_USEC));
		break;
	}
	case A_STOPPING:
		if (kr_group_result(&a->g) >= 0) {
			kr_group_pump(&a->g, true);
			a->state = A_IDLE;
			break;
		}
		if (now >= a->stop_deadline && !a->killed_hard) {
			log_warning("%s: workers did not stop in time; killing them",
				    a->job->nodes[a->job->self]);
			kr_group_kill(&a->g, SIGKILL);
			a->killed_hard = true;
		}
		break;
	}
	return r;
}

/* ---- agent: main loop ------------------------------------------------ */

enum { SESSION_END = 0, SESSION_LOST = 1 };

static void handle_signal(kr_agent *a, int sig)
{
	switch (sig) {
	case SIGCHLD:
		break;
	case SIGTERM:
	case SIGINT:
	case SIGHUP:
		if (!a->term_sig) {
			log_notice("Got %s; forwarding to workers, SIGKILL in %s", strsignal(sig),
				   kiln_format_duration((char[32]){ 0 }, 32, a->o->grace_usec));
			a->term_sig = sig;
			a->term_deadline = kiln_now_usec() + a->o->grace_usec;
		}
		kr_group_kill(&a->g, sig);
		break;
	case SIGUSR1:
		log_notice("%s: got SIGUSR1 (Slurm's warning): telling workers to checkpoint now",
			   a->job->nodes[a->job->self]);
		/* The key first, so that a worker reading it on the signal sees it. */
		if (a->c) {
			int r = kiln_store_client_add(a->c, KR_CHECKPOINT_KEY, 1, NULL);
			if (r < 0)
				log_warning_errno(r, "Failed to set %s: %m, ignoring",
						  KR_CHECKPOINT_KEY);
		}
		kr_group_kill(&a->g, SIGUSR1);
		if (a->o->requeue && a->L && a->job->job_id && !a->job->sim) {
			kiln_error e;
			kiln_error_reset(&e, NULL);
			int r = kiln_slurm_requeue(a->job->job_id, &e);
			if (r < 0)
				log_warning("Failed to requeue job %s: %s, ignoring",
					    a->job->job_id, e.msg);
			else
				log_notice("Requeued job %s", a->job->job_id);
		}
		break;
	default:
		kr_group_kill(&a->g, sig);
		break;
	}
}

static int poll_store(kr_agent *a, uint64_t now)
{
	int r;
	char key[64];
	if (now >= a->next_hb) {
		snprintf(key, sizeof(key), "/kiln/hb/%zu", a->job->self);
		r = kiln_store_client_add(a->c, key, 1, NULL);
		if (r < 0)
			return r;
		a->next_hb = now + a->o->heartbeat_usec;
	}
	int64_t closed = 0, round = 0;
	r = kiln_store_client_add(a->c, "/kiln/closed", 0, &closed);
	if (r < 0)
		return r;
	if (closed > 0 && !a->finished) {
		_cleanup_free_ char *res = NULL;
		size_t len;
		r = kiln_store_client_get(a->c, "/kiln/result", (void **) &res, &len);
		if (r < 0)
			return r;
		int code = KILN_EXIT_FAILURE, n = 0;
		sscanf(res, "%d %n", &code, &n);
		a->finished = true;
		if (code == KR_EXIT_JOIN_TIMEOUT)
			log_error("Rendezvous timed out: %s", res + n);
		else if (!a->ever_member && !a->L) {
			log_error("The rendezvous closed before this node got a round (%s)",
				  res + n);
			code = KR_EXIT_CLOSED;
		}
		a->exit_code = code;
		if (a->state == A_RUNNING || a->state == A_BARRIER)
			start_stop(a, SIGTERM, a->o->grace_usec);
		return 0;
	}
	r = kiln_store_client_add(a->c, "/kiln/round", 0, &round);
	if (r < 0)
		return r;
	if ((uint64_t) round > a->seen_round) {
		_cleanup_free_ char *text = NULL;
		size_t len;
		snprintf(key, sizeof(key), "/kiln/round/%" PRId64, round);
		r = kiln_store_client_get(a->c, key, (void **) &text, &len);
		if (r < 0)
			return r;
		rdzv_round rd;
		r = rdzv_round_parse(text, &rd);
		if (r < 0) {
			log_warning("Round %" PRId64 " is malformed, ignoring", round);
			a->seen_round = (uint64_t) round;
			return 0;
		}
		_cleanup_free_ char *rs = NULL;
		if (kiln_store_client_try_get(a->c, "/kiln/restarts", (void **) &rs, &len) == 0)
			kiln_parse_uint64(rs, UINT32_MAX, &a->restarts);
		rdzv_round_free(&a->pending);
		a->pending = rd;
		a->seen_round = (uint64_t) round;
	}
	return 0;
}

/* ---- agent: the session's event loop ---------------------------------- */

static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata)
{
	handle_signal(userdata, (int) si->ssi_signo);
	return 0;
}

/* The agent's liveness connection to the store host: readable means closed
 * (the leader never writes), or an error. */
static int on_live(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	kr_agent *a = userdata;
	char tmp[64];
	ssize_t r = read(a->live_fd, tmp, sizeof(tmp));
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
		if (!a->finished)
			log_warning("Lost the store host %s", a->job->nodes[a->store_idx]);
		return sd_event_exit(a->ev, SESSION_LOST);
	}
	return 0;
}

static int on_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	kr_agent *a = userdata;
	if (a->L)
		leader_accept(a);
	return 0;
}

static int on_conn(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	kr_agent *a = userdata;
	for (size_t i = 0; a->L && i < a->L->n_conns; i++)
		if (a->L->conns[i].src == s) {
			leader_read_conn(a, i);
			break;
		}
	return 0;
}

static int on_pipes(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	kr_agent *a = userdata;
	kr_group_pump(&a->g, false);
	return 0;
}

/* Every KR_POLL_USEC: the leader's step, then this agent's look at the store. */
static int on_poll(sd_event_source *s, uint64_t usec, void *userdata)
{
	kr_agent *a = userdata;
	int r = sd_event_source_set_time_relative(s, KR_POLL_USEC);
	if (r >= 0)
		r = sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
	if (r < 0)
		return sd_event_exit(a->ev, r);
	if (a->L && !a->L->closed)
		leader_step(a);
	r = poll_store(a, kiln_now_usec());
	if (r < 0) {
		if (a->finished && !a->L)
			return sd_event_exit(
				a->ev, SESSION_END); /* the leader went away after the end: fine */
		log_warning_errno(r, "Lost the store on %s: %m", a->job->nodes[a->store_idx]);
		return sd_event_exit(a->ev, SESSION_LOST);
	}
	return 0;
}

/* After every event: the workers' state machine, then the endings. */
static int on_post(sd_event_source *s, void *userdata)
{
	kr_agent *a = userdata;
	uint64_t now = kiln_now_usec();
	int r = workers_step(a, now);
	if (r < 0 && store_conn_lost(r))
		return sd_event_exit(a->ev, SESSION_LOST);
	if (a->term_sig) {
		if (kr_group_result(&a->g) >= 0 || !a->g.n)
			return sd_event_exit(a->ev, SESSION_END);
		if (now >= a->term_deadline && !a->killed_hard) {
			log_warning("Grace period over; killing workers");
			kr_group_kill(&a->g, SIGKILL);
			a->killed_hard = true;
		}
	}
	if (a->finished && a->state != A_STOPPING && a->state != A_RUNNING) {
		if (!a->L)
			return sd_event_exit(a->ev, SESSION_END);
		/* Keep the store up until the others have read the result. */
		if (a->L->n_conns == 0 || now > a->L->closed_usec + KR_LINGER_USEC)
			return sd_event_exit(a->ev, SESSION_END);
	}
	return 0;
}

static const int agent_signals[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD };

static int session_sources(kr_agent *a)
{
	sd_event *e = a->ev;
	int r;
	for (size_t i = 0; i < ARRAY_SIZE(agent_signals); i++)
		if ((r = sd_event_add_signal(e, NULL, agent_signals[i], on_signal, a)) < 0)
			return r;
	if (a->live_fd >= 0 && (r = sd_event_add_io(e, NULL, a->live_fd, EPOLLIN, on_live, a)) < 0)
		return r;
	if (a->L) {
		if ((r = sd_event_add_io(e, NULL, a->L->live_fd, EPOLLIN, on_accept, a)) < 0)
			return r;
		for (size_t i = 0; i < a->L->n_conns; i++)
			if ((r = conn_watch(a, &a->L->conns[i])) < 0)
				return r;
	}
	if ((r = sd_event_add_io(e, NULL, a->g.epoll_fd, EPOLLIN, on_pipes, a)) < 0)
		return r;
	/* The first look at the store right away, then every KR_POLL_USEC;
	 * accuracy 1 us: the default (250 ms) would slow heartbeats down. */
	if ((r = sd_event_add_time_relative(e, NULL, CLOCK_MONOTONIC, 0, 1, on_poll, a)) < 0)
		return r;
	return sd_event_add_post(e, NULL, on_post, a);
}

/* Runs one session: until the job ends (SESSION_END) or the store is lost
 * (SESSION_LOST); < 0 when the loop itself fails. */
static int session(kr_agent *a)
{
	int r = sd_event_new(&a->ev);
	if (r < 0)
		return r;
	r = session_sources(a);
	if (r >= 0)
		r = sd_event_loop(a->ev);
	/* The connections' sources go with the loop; the fds stay. */
	for (size_t i = 0; a->L && i < a->L->n_conns; i++)
		a->L->conns[i].src = sd_event_source_disable_unref(a->L->conns[i].src);
	a->ev = sd_event_unref(a->ev);
	return r;
}

/* The agent's signals are blocked for good: sd-event reads them through
 * signalfd in a session, and between sessions they stay pending. */
static int setup_signals(void)
{
	sigset_t ss;
	sigemptyset(&ss);
	for (size_t i = 0; i < ARRAY_SIZE(agent_signals); i++)
		sigaddset(&ss, agent_signals[i]);
	if (sigprocmask(SIG_BLOCK, &ss, NULL) < 0)
		return -errno;
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

static int run_health_check(const kr_opts *o)
{
	if (!o->healthd || access(o->healthd, X_OK) < 0) {
		log_warning("--health-check: %s not found, skipping the check",
			    o->healthd ? o->healthd : "kiln-healthd");
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		sigset_t all;
		sigemptyset(&all);
		sigprocmask(SIG_SETMASK, &all, NULL);
		execl(o->healthd, o->healthd, "--check", (char *) NULL);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int kr_agent_run(const kr_opts *o, kr_job *job)
{
	kr_agent a = { .o = o,
		       .job = job,
		       .live_fd = -1,
		       .g.epoll_fd = -1,
		       .first_connect = true,
		       .healthy = true };
	int r;

	const char *sec = getenv(KR_ENV_SECRET);
	if (sec && *sec) {
		if (strlen(sec) > KILN_STORE_SECRET_MAX)
			return log_error_errno(-EINVAL, "%s is longer than %u bytes", KR_ENV_SECRET,
					       KILN_STORE_SECRET_MAX);
		snprintf(a.secret, sizeof(a.secret), "%s", sec);
	} else if (job->n == 1) {
		/* One agent, nobody to agree with: a fresh random secret.  The
		 * workers never need it (they come through the relay). */
		r = kr_make_secret(a.secret, sizeof(a.secret));
		if (r < 0)
			return log_error_errno(r, "Failed to generate the job secret: %m");
	} else {
		/* Agents on different nodes must share a secret nobody else
		 * knows; anything derived from the job (its id, the uid) is
		 * public on a shared cluster.  With MUNGE the store host makes
		 * one and hands it to agents that prove the job's uid; without
		 * it, fail closed. */
		char why[128];
		if (!kr_munge_available(why, sizeof(why))) {
			log_error(
				"%s is not set, this job has %zu nodes, and MUNGE cannot hand out "
				"a secret here (%s): the agents need a shared secret so that "
				"other users on these nodes cannot read or write the rendezvous. "
				"Run kiln-run in the batch script without srun (it makes the "
				"secret), or export %s=$(kiln-run --make-secret) before srun.",
				KR_ENV_SECRET, job->n, why, KR_ENV_SECRET);
			return KILN_EXIT_USAGE;
		}
		a.munge = true;
		a.secret[0] = 0;
		log_info("%s is not set: the agents get the job secret through MUNGE",
			 KR_ENV_SECRET);
	}
	a.mctx = (kr_munge_ctx){ .job_id = job->job_id, .secret = a.secret };

	a.nproc = o->nproc;
	if (a.nproc == 0) {
		int g = o->node_gpus >= 0 ? o->node_gpus : kr_count_gpus();
		if (g <= 0)
			return log_error_errno(-EINVAL,
					       "--nproc-per-node gpu: %s has no GPUs (cluster file "
					       "and /dev/nvidia*); give a number instead",
					       job->nodes[job->self]);
		a.nproc = (unsigned) g;
	}
	if (a.nproc > RDZV_MAX_NPROC)
		return log_error_errno(-EINVAL, "--nproc-per-node %u is above the limit of %u",
				       a.nproc, RDZV_MAX_NPROC);

	if (o->health_check) {
		r = run_health_check(o);
		if (r == 0) {
			log_warning("Health check failed on %s: leaving this node out of the job",
				    job->nodes[job->self]);
			a.healthy = false;
		}
	}

	if (kr_ifname_for_addr(job->addrs[job->self], a.ifname, sizeof(a.ifname)) < 0)
		a.ifname[0] = 0;

	r = setup_signals();
	if (r < 0)
		return log_error_errno(r, "Failed to set up signal handling: %m");
	a.g.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (a.g.epoll_fd < 0)
		return log_error_errno(-errno, "Failed to create an epoll instance: %m");

	for (;;) {
		r = agent_connect(&a);
		if (r < 0)
			break;
		r = session(&a);
		if (r < 0) {
			log_error_errno(r, "Agent loop failed: %m");
			break;
		}
		if (r == SESSION_END)
			break;
		/* The store is gone: stop workers, move it to the next node. */
		if (a.g.n && kr_group_result(&a.g) < 0) {
			kr_group_kill(&a.g, SIGTERM);
			uint64_t end = kiln_now_usec() + MIN(o->grace_usec, KR_RESTART_STOP_USEC);
			while (kr_group_reap(&a.g) > 0) {
				if (kiln_now_usec() > end)
					kr_group_kill(&a.g, SIGKILL);
				kr_group_pump(&a.g, false);
				usleep(10000);
			}
			kr_group_pump(&a.g, true);
		}
		a.state = A_IDLE;
		rdzv_round_free(&a.pending);
		agent_disconnect(&a);
		if (a.term_sig)
			break;
		a.store_idx++;
		log_notice("Moving the store to %s",
			   a.store_idx < job->n ? job->nodes[a.store_idx] : "(none left)");
	}
	int code;
	if (r < 0)
		code = KILN_EXIT_FAILURE;
	else if (a.term_sig)
		code = a.g.n ? kr_group_result(&a.g) : 128 + a.term_sig;
	else
		code = a.exit_code;
	if (code < 0)
		code = KILN_EXIT_FAILURE;
	log_full(code == 0 ? LOG_INFO : LOG_NOTICE, "%s: exiting with status %d",
		 job->nodes[job->self], code);
	kr_group_pump(&a.g, true);
	kr_group_free(&a.g);
	rdzv_round_free(&a.pending);
	rdzv_round_free(&a.cur);
	agent_disconnect(&a);
	kiln_store_relay_free(a.relay);
	closep(&a.g.epoll_fd);
	return code;
}
