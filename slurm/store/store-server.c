/* store-server.c — kiln's TCPStore-compatible key-value server.
 *
 * One epoll loop, non-blocking sockets, one input and one output buffer per
 * connection, each capped; every request is parsed by the pure parser in
 * store-proto.c and answered exactly as PyTorch's libuv TCPStore server
 * answers it.  Entries live in a kiln_store_map (store-map.c: seeded, chained);
 * an entry may exist without a value ("ghost") while connections wait for
 * its key.
 *
 * Locking: one mutex guards everything.  The serving thread (or the caller
 * of kiln_store_server_process()) holds it while it handles a batch of
 * events; the in-process accessors take it too, so the hosting agent can
 * read and write the map while the thread serves.  Connections are only
 * freed by the serving side, at the end of a batch, so an event that
 * epoll_wait() returned for a connection closed meanwhile never touches
 * freed memory. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/store.h"
#include "store-map.h"
#include "store-proto.h"

#define EPOLL_BATCH 256
/* Bytes read per readable event before moving on to other connections. */
#define READ_QUANTUM (256u * 1024u)
#define READ_CHUNK   (64u * 1024u)
/* A connection's buffers start this small and shrink back when drained, so
 * thousands of idle connections cost little. */
#define BUF_MIN	    4096u
#define BUCKETS_MIN 1024u
/* What an entry costs beyond its key and value bytes (struct, allocator
 * headers, bucket slot), and what one WAIT registration costs (a pointer on
 * each side).  Charged to max_total_bytes so that a flood of tiny keys or of
 * waits on missing keys is bounded like a flood of big values. */
#define ENTRY_OVERHEAD 96u
#define WAITER_COST    (2u * sizeof(void *))

typedef struct conn conn;

/* What a connection has proved.  AUTH_WORKER: a relay's WORKER_HELLO with
 * the job secret (the worker key space); AUTH_AGENT: the secret through
 * KILN_STORE_AUTH_KEY (both key spaces). */
typedef enum conn_auth {
	AUTH_NONE = 0,
	AUTH_WORKER,
	AUTH_AGENT,
} conn_auth;

typedef struct entry {
	kiln_store_map_node node; /* key, klen: the key bytes below */
	char *key;		  /* NUL-terminated copy; node.klen bytes may contain NULs */
	uint8_t *val;
	size_t vlen;
	bool present;
	conn **waiters;
	size_t n_waiters, cap_waiters;
	/* the WAIT request that last registered here, to skip duplicate keys
	 * in one request in O(1) */
	uint64_t wait_mark;
} entry;

struct conn {
	int fd;
	uint32_t peer;
	kiln_store_dialect dialect;
	conn_auth auth;
	bool dead;
	bool close_after_flush;
	bool want_out;
	bool hello; /* a WORKER_HELLO was seen */
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_off, out_len, out_cap;
	/* pending WAIT: the entries still missing */
	entry **wait;
	size_t n_wait, cap_wait;
	conn *prev, *next;
};

struct kiln_store_server {
	pthread_mutex_t lock;
	int listen_fd;
	int epoll_fd;
	int event_fd;
	int reserve_fd; /* spare fd to shed a connection when out of fds */
	int diag_fd;	/* sock_diag netlink socket for the peer uid check, -1 until needed */
	uint16_t port;
	pthread_t thread;
	bool running;
	atomic_bool stop;

	uint32_t *allow;
	size_t n_allow;
	bool allow_all, allow_loopback;
	char *secret;
	size_t secret_len;
	kiln_store_server_opts o;
	kiln_store_limits lim;

	kiln_store_map map;
	uint64_t wait_seq;

	conn *conns;
	conn *dead;
	kiln_store_server_stats st;
};

/* epoll data for the two non-connection fds */
static char tag_listen, tag_event;

/* ---- map ---------------------------------------------------------------- */

static entry *map_find(kiln_store_server *s, const uint8_t *key, size_t klen, uint64_t *ret_hash)
{
	kiln_store_map_node *n = kiln_store_map_find(&s->map, key, klen, ret_hash);
	return n ? KILN_STORE_MAP_ENTRY(n, entry, node) : NULL;
}

/* Finds or creates (without a value) the entry for key.  -ENOSPC when a
 * new entry would cross max_total_bytes, -ENOMEM. */
static int map_insert(kiln_store_server *s, const uint8_t *key, size_t klen, entry **ret)
{
	uint64_t h;
	entry *e = map_find(s, key, klen, &h);
	if (e) {
		*ret = e;
		return 0;
	}
	if (s->st.store_bytes + klen + ENTRY_OVERHEAD > s->o.max_total_bytes)
		return -ENOSPC;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->key = malloc(klen + 1);
	if (!e->key) {
		free(e);
		return -ENOMEM;
	}
	memcpy(e->key, key, klen);
	e->key[klen] = 0;
	e->node = (kiln_store_map_node){ .hash = h, .key = (const uint8_t *) e->key, .klen = klen };
	kiln_store_map_add(&s->map, &e->node);
	s->st.store_bytes += klen + ENTRY_OVERHEAD;
	*ret = e;
	return 0;
}

static void entry_free(entry *e)
{
	free(e->key);
	free(e->val);
	free(e->waiters);
	free(e);
}

static void entry_free_node(kiln_store_map_node *n)
{
	entry_free(KILN_STORE_MAP_ENTRY(n, entry, node));
}

/* Removes e from the table when it has neither a value nor waiters. */
static void map_gc(kiln_store_server *s, entry *e)
{
	if (e->present || e->n_waiters > 0)
		return;
	kiln_store_map_remove(&s->map, &e->node);
	s->st.store_bytes -= e->node.klen + ENTRY_OVERHEAD;
	entry_free(e);
}

static void entry_drop_value(kiln_store_server *s, entry *e)
{
	if (!e->present)
		return;
	s->st.store_bytes -= e->vlen;
	s->st.keys--;
	free(e->val);
	e->val = NULL;
	e->vlen = 0;
	e->present = false;
}

/* Replaces (or with append, extends) e's value.  -ENOSPC over the store
 * limit, -ENOMEM. */
static int entry_store(kiln_store_server *s, entry *e, const void *v, size_t n, bool append)
{
	size_t old = e->present ? e->vlen : 0;
	size_t newlen = append ? old + n : n;
	uint64_t total = s->st.store_bytes - old + newlen;
	if (total > s->o.max_total_bytes)
		return -ENOSPC;
	if (append && newlen > s->o.max_value)
		return -E2BIG;
	uint8_t *buf = malloc(newlen + 1);
	if (!buf)
		return -ENOMEM;
	if (append && old)
		memcpy(buf, e->val, old);
	if (n)
		memcpy(buf + (append ? old : 0), v, n);
	buf[newlen] = 0;
	if (!e->present)
		s->st.keys++;
	free(e->val);
	e->val = buf;
	e->vlen = newlen;
	e->present = true;
	s->st.store_bytes = total;
	return 0;
}

/* ---- connections: buffers and output -------------------------------------- */

static int buf_reserve(kiln_store_server *s, uint8_t **buf, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	if (need > s->o.max_conn_buf)
		return -EMSGSIZE;
	size_t n = MAX((size_t) BUF_MIN, *cap);
	while (n < need)
		n *= 2;
	n = MIN(n, s->o.max_conn_buf);
	if (s->st.buffered_bytes + (n - *cap) > s->o.max_total_buf)
		return -ENOBUFS;
	uint8_t *p = realloc(*buf, n);
	if (!p)
		return -ENOMEM;
	s->st.buffered_bytes += n - *cap;
	*buf = p;
	*cap = n;
	return 0;
}

static void buf_release(kiln_store_server *s, uint8_t **buf, size_t *cap)
{
	s->st.buffered_bytes -= *cap;
	free(*buf);
	*buf = NULL;
	*cap = 0;
}

static void conn_set_events(kiln_store_server *s, conn *c, bool out)
{
	if (c->want_out == out)
		return;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0),
				  .data.ptr = c };
	if (epoll_ctl(s->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
		c->want_out = out;
}

static void conn_close(kiln_store_server *s, conn *c, uint64_t *counter);

static void conn_flush(kiln_store_server *s, conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			conn_close(s, c, NULL);
			return;
		}
		c->out_off += (size_t) n;
	}
	if (c->out_off == c->out_len) {
		c->out_off = c->out_len = 0;
		if (c->out_cap > BUF_MIN)
			buf_release(s, &c->out, &c->out_cap);
		if (c->close_after_flush) {
			conn_close(s, c, NULL);
			return;
		}
		conn_set_events(s, c, false);
	} else {
		conn_set_events(s, c, true);
	}
}

/* Appends reply bytes; a peer that does not read its replies runs into the
 * buffer cap and is closed. */
static int out_put(kiln_store_server *s, conn *c, const void *p, size_t n)
{
	if (c->dead)
		return -ECONNRESET;
	if (c->out_off > 0 && c->out_len + n > c->out_cap) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
	}
	int r = buf_reserve(s, &c->out, &c->out_cap, c->out_len + n);
	if (r < 0) {
		conn_close(s, c, &s->st.dropped_limits);
		return r;
	}
	memcpy(c->out + c->out_len, p, n);
	c->out_len += n;
	return 0;
}

static int out_u8(kiln_store_server *s, conn *c, uint8_t v)
{
	return out_put(s, c, &v, 1);
}
static int out_i64(kiln_store_server *s, conn *c, int64_t v)
{
	return out_put(s, c, &v, 8);
}
static int out_vec(kiln_store_server *s, conn *c, const void *p, size_t n)
{
	uint64_t l = n;
	int r = out_put(s, c, &l, 8);
	if (r < 0)
		return r;
	return n ? out_put(s, c, p, n) : 0;
}

/* ---- waiting -------------------------------------------------------------- */

static void wait_clear(kiln_store_server *s, conn *c)
{
	for (size_t i = 0; i < c->n_wait; i++) {
		entry *e = c->wait[i];
		for (size_t j = 0; j < e->n_waiters; j++)
			if (e->waiters[j] == c) {
				e->waiters[j] = e->waiters[--e->n_waiters];
				s->st.store_bytes -= WAITER_COST;
				break;
			}
		map_gc(s, e);
	}
	c->n_wait = 0;
}

/* A key got a value: answer every connection for which it was the last
 * missing key of its WAIT. */
static void wake(kiln_store_server *s, entry *e)
{
	size_t n = e->n_waiters;
	conn **w = e->waiters;
	e->waiters = NULL;
	e->n_waiters = e->cap_waiters = 0;
	s->st.store_bytes -= n * WAITER_COST;
	for (size_t i = 0; i < n; i++) {
		conn *c = w[i];
		for (size_t j = 0; j < c->n_wait; j++)
			if (c->wait[j] == e) {
				c->wait[j] = c->wait[--c->n_wait];
				break;
			}
		if (c->n_wait == 0 && !c->dead && out_u8(s, c, KILN_STORE_WAIT_STOP_WAITING) >= 0)
			conn_flush(s, c);
	}
	free(w);
}

/* The array v (n of its *cap elements of size bytes used) with room for
 * one more, doubling: v itself, the reallocated array, or NULL (v is left
 * as it was). */
static void *grow(void *v, size_t n, size_t *cap, size_t size)
{
	if (n < *cap)
		return v;
	size_t k = MAX((size_t) 4, *cap * 2);
	void *p = realloc(v, k * size);
	if (p)
		*cap = k;
	return p;
}

static int add_waiter(kiln_store_server *s, entry *e, conn *c)
{
	if (s->st.store_bytes + WAITER_COST > s->o.max_total_bytes)
		return -ENOSPC;
	conn **w = grow(e->waiters, e->n_waiters, &e->cap_waiters, sizeof(*w));
	if (!w)
		return -ENOMEM;
	e->waiters = w;
	entry **cw = grow(c->wait, c->n_wait, &c->cap_wait, sizeof(*cw));
	if (!cw)
		return -ENOMEM;
	c->wait = cw;
	e->waiters[e->n_waiters++] = c;
	c->wait[c->n_wait++] = e;
	s->st.store_bytes += WAITER_COST;
	return 0;
}

/* ---- connection lifetime -------------------------------------------------- */

static void conn_close(kiln_store_server *s, conn *c, uint64_t *counter)
{
	if (c->dead)
		return;
	if (counter)
		(*counter)++;
	wait_clear(s, c);
	free(c->wait);
	c->wait = NULL;
	c->cap_wait = 0;
	epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->dead = true;
	buf_release(s, &c->in, &c->in_cap);
	buf_release(s, &c->out, &c->out_cap);
	c->in_len = c->out_len = c->out_off = 0;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = NULL;
	c->next = s->dead;
	s->dead = c;
	s->st.connections--;
}

static void reap_dead(kiln_store_server *s)
{
	while (s->dead) {
		conn *c = s->dead;
		s->dead = c->next;
		free(c);
	}
}

static bool peer_allowed(kiln_store_server *s, uint32_t addr)
{
	if (s->allow_all)
		return true;
	if (s->allow_loopback && (addr >> 24) == 127)
		return true;
	for (size_t i = 0; i < s->n_allow; i++)
		if (s->allow[i] == addr)
			return true;
	return false;
}

/* Tells the owner (kiln-run logs it) why a peer was refused. */
static void refused(kiln_store_server *s, const struct sockaddr_in *sa, const char *fmt, ...)
	_printf_(3, 4);
static void refused(kiln_store_server *s, const struct sockaddr_in *sa, const char *fmt, ...)
{
	char b[INET_ADDRSTRLEN], why[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	char msg[300];
	snprintf(msg, sizeof(msg), "%s:%u: %s",
		 inet_ntop(AF_INET, &sa->sin_addr, b, sizeof(b)) ?: "?", ntohs(sa->sin_port), why);
	log_debug("store: refusing %s", msg);
	if (s->o.on_refused)
		s->o.on_refused(msg, s->o.on_refused_userdata);
}

/* A peer on this machine must be a process of peer_uid (sock_diag knows
 * whose socket the other end is); a peer that sock_diag does not find here
 * is another machine, left to the allow-list and, with require_auth, to the
 * secret.  A loopback peer is always on this machine: not finding it, or
 * any failed lookup, refuses (fail closed). */
static bool peer_uid_ok(kiln_store_server *s, int fd, const struct sockaddr_in *sa)
{
	uid_t uid;
	int r = s->diag_fd >= 0 ? 0 : (s->diag_fd = kiln_store_diag_open());
	if (r >= 0)
		r = kiln_store_peer_uid_via(s->diag_fd, fd, &uid);
	if (r == -ETIMEDOUT) {
		/* a late answer may still come: start over on a fresh socket */
		close(s->diag_fd);
		s->diag_fd = -1;
	}
	bool loopback = (ntohl(sa->sin_addr.s_addr) >> 24) == 127;
	if (r == 1 && uid == s->o.peer_uid)
		return true;
	if (r == 1)
		refused(s, sa,
			"a process of uid %u on this node; only uid %u (the job's) may connect",
			(unsigned) uid, (unsigned) s->o.peer_uid);
	else if (r == 0 && !loopback)
		return true;
	else if (r == 0)
		refused(s, sa, "a loopback peer the kernel does not know (sock_diag)");
	else
		refused(s, sa, "cannot tell which user this peer is (sock_diag: %s)", strerror(-r));
	return false;
}

static void on_accept(kiln_store_server *s)
{
	for (int i = 0; i < 1024; i++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(s->listen_fd, (struct sockaddr *) &sa, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) && s->reserve_fd >= 0) {
				/* Out of fds: use the spare one to take the pending
				 * connection off the queue and refuse it, instead
				 * of spinning on a listen socket that stays
				 * readable. */
				close(s->reserve_fd);
				fd = accept(s->listen_fd, NULL, NULL);
				if (fd >= 0)
					close(fd);
				s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
				s->st.refused_peers++;
				continue;
			}
			return;
		}
		uint32_t addr = sa.sin_family == AF_INET ? ntohl(sa.sin_addr.s_addr) : 0;
		if (!peer_allowed(s, addr) || s->st.connections >= s->o.max_conns) {
			if (peer_allowed(s, addr))
				log_debug("store: refusing a peer: too many connections");
			else
				refused(s, &sa, "not in the allocation");
			close(fd);
			s->st.refused_peers++;
			continue;
		}
		if (s->o.check_peer_uid && !peer_uid_ok(s, fd, &sa)) {
			close(fd);
			s->st.refused_uid++;
			continue;
		}
		conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->fd = fd;
		c->peer = addr;
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };
		if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			close(fd);
			free(c);
			continue;
		}
		c->next = s->conns;
		if (s->conns)
			s->conns->prev = c;
		s->conns = c;
		s->st.connections++;
		s->st.accepted++;
	}
}

/* ---- requests ------------------------------------------------------------- */

static bool is_control(const kiln_store_slice *k)
{
	size_t pl = strlen(KILN_STORE_CONTROL_PREFIX);
	return k->len >= pl && memcmp(k->p, KILN_STORE_CONTROL_PREFIX, pl) == 0;
}

/* Constant-time comparison, so the secret cannot be guessed byte by byte
 * from reply timing. */
static bool secret_eq(const kiln_store_server *s, const uint8_t *p, size_t n)
{
	if (!s->secret || n != s->secret_len)
		return false;
	uint8_t d = 0;
	for (size_t i = 0; i < n; i++)
		d |= (uint8_t) (p[i] ^ (uint8_t) s->secret[i]);
	return d == 0;
}

/* Parses a stored counter like std::stoll: optional blanks and sign, then
 * digits; trailing bytes are ignored. */
static int parse_counter(const uint8_t *p, size_t n, int64_t *ret)
{
	size_t i = 0;
	while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n'))
		i++;
	bool neg = false;
	if (i < n && (p[i] == '-' || p[i] == '+'))
		neg = p[i++] == '-';
	if (i >= n || p[i] < '0' || p[i] > '9')
		return -EBADMSG;
	uint64_t v = 0;
	for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
		v = v * 10 + (uint64_t) (p[i] - '0');
		if (v > (uint64_t) INT64_MAX + 1)
			return -ERANGE;
	}
	if (!neg && v > (uint64_t) INT64_MAX)
		return -ERANGE;
	*ret = neg ? (int64_t) (0 - v) : (int64_t) v;
	return 0;
}

static int do_add(kiln_store_server *s, const uint8_t *key, size_t klen, int64_t delta,
		  int64_t *ret)
{
	entry *e;
	int r = map_insert(s, key, klen, &e);
	if (r < 0)
		return r;
	int64_t v = 0;
	if (e->present)
		r = parse_counter(e->val, e->vlen, &v);
	if (r == 0 && __builtin_add_overflow(v, delta, &v))
		r = -ERANGE;
	char buf[32];
	if (r == 0)
		r = entry_store(s, e, buf, (size_t) snprintf(buf, sizeof(buf), "%" PRId64, v),
				false);
	if (r < 0) {
		map_gc(s, e);
		return r;
	}
	wake(s, e);
	*ret = v;
	return 0;
}

static int do_set(kiln_store_server *s, const uint8_t *key, size_t klen, const void *v, size_t n,
		  bool append)
{
	entry *e;
	int r = map_insert(s, key, klen, &e);
	if (r < 0)
		return r;
	r = entry_store(s, e, v, n, append);
	if (r < 0) {
		map_gc(s, e);
		return r;
	}
	wake(s, e);
	return 0;
}

static bool keys_ready(kiln_store_server *s, const kiln_store_msg *m)
{
	kiln_store_items it;
	kiln_store_slice k, v;
	kiln_store_items_init(&it, m);
	while (kiln_store_items_next(&it, &k, &v)) {
		entry *e = map_find(s, k.p, k.len, NULL);
		if (!e || !e->present)
			return false;
	}
	return true;
}

static bool items_allowed(const conn *c, const kiln_store_msg *m)
{
	kiln_store_items it;
	kiln_store_slice k, v;
	if (c->auth == AUTH_AGENT)
		return true;
	kiln_store_items_init(&it, m);
	while (kiln_store_items_next(&it, &k, &v))
		if (is_control(&k))
			return false;
	return true;
}

static bool key_is(const kiln_store_msg *m, const char *key)
{
	return m->key.len == strlen(key) && memcmp(m->key.p, key, m->key.len) == 0;
}

/* COMPARE_SET of KILN_STORE_AUTH_KEY or KILN_STORE_TOKEN_KEY: a client
 * presenting the secret or a token. */
static bool is_auth_request(const kiln_store_msg *m)
{
	return m->op == KILN_STORE_OP_COMPARE_SET &&
	       (key_is(m, KILN_STORE_AUTH_KEY) || key_is(m, KILN_STORE_TOKEN_KEY));
}

/* A token through KILN_STORE_TOKEN_KEY, checked by the owner's hook. */
static int token_auth(kiln_store_server *s, conn *c, const kiln_store_msg *m)
{
	void *reply = NULL;
	size_t rlen = 0;
	int r = -EACCES;
	if (s->o.token_auth && m->value.len > 0 && m->value.len <= KILN_STORE_TOKEN_MAX)
		r = s->o.token_auth(m->value.p, m->value.len, &reply, &rlen,
				    s->o.token_auth_userdata);
	if (r < 0) {
		log_debug("store: token refused, closing");
		s->st.dropped_auth++;
		c->close_after_flush = true;
		return out_vec(s, c, "denied", 6);
	}
	c->auth = AUTH_AGENT;
	uint64_t l = 3 + rlen;
	r = out_put(s, c, &l, 8);
	if (r >= 0)
		r = out_put(s, c, "ok:", 3);
	if (r >= 0 && rlen)
		r = out_put(s, c, reply, rlen);
	if (reply)
		explicit_bzero(reply, rlen);
	free(reply);
	return r;
}

/* Handles one request.  Returns 0, or < 0 after closing the connection. */
static int handle(kiln_store_server *s, conn *c, const kiln_store_msg *m)
{
	int r = 0;
	entry *e;
	s->st.requests++;

	if (m->op == KILN_STORE_OP_WORKER_HELLO) {
		/* only as the first request: the parser accepts it while the
		 * dialect is undecided, which a hello does not change */
		if (c->auth != AUTH_NONE || c->hello) {
			conn_close(s, c, &s->st.dropped_protocol);
			return -EBADMSG;
		}
		c->hello = true;
		if (!secret_eq(s, m->value.p, m->value.len)) {
			log_debug("store: relay hello with a wrong job secret, closing");
			conn_close(s, c, &s->st.dropped_auth);
			return -EACCES;
		}
		c->auth = AUTH_WORKER;
		return 0;
	}
	if (s->o.require_auth && c->auth == AUTH_NONE && m->op != KILN_STORE_OP_VALIDATE &&
	    m->op != KILN_STORE_OP_PING && !is_auth_request(m)) {
		log_debug("store: %s before authenticating, closing", kiln_store_op_name(m->op));
		conn_close(s, c, &s->st.dropped_auth);
		return -EACCES;
	}

	switch (m->op) {
	case KILN_STORE_OP_SET:
	case KILN_STORE_OP_COMPARE_SET:
	case KILN_STORE_OP_GET:
	case KILN_STORE_OP_ADD:
	case KILN_STORE_OP_DELETE_KEY:
	case KILN_STORE_OP_APPEND:
		if (is_auth_request(m))
			break;
		if (c->auth != AUTH_AGENT && is_control(&m->key)) {
			log_debug("store: %s of a control key without the job secret, closing",
				  kiln_store_op_name(m->op));
			conn_close(s, c, &s->st.dropped_auth);
			return -EACCES;
		}
		break;
	case KILN_STORE_OP_CHECK:
	case KILN_STORE_OP_WAIT:
	case KILN_STORE_OP_MULTI_GET:
	case KILN_STORE_OP_MULTI_SET:
		if (!items_allowed(c, m)) {
			conn_close(s, c, &s->st.dropped_auth);
			return -EACCES;
		}
		break;
	default:
		break;
	}

	switch (m->op) {
	case KILN_STORE_OP_VALIDATE:
		return 0;
	case KILN_STORE_OP_PING:
		return out_put(s, c, &m->nonce, 4);
	case KILN_STORE_OP_SET:
	case KILN_STORE_OP_APPEND:
		r = do_set(s, m->key.p, m->key.len, m->value.p, m->value.len,
			   m->op == KILN_STORE_OP_APPEND);
		break;
	case KILN_STORE_OP_COMPARE_SET: {
		if (key_is(m, KILN_STORE_TOKEN_KEY))
			return token_auth(s, c, m);
		if (is_auth_request(m)) {
			if (secret_eq(s, m->value.p, m->value.len)) {
				c->auth = AUTH_AGENT;
				return out_vec(s, c, "ok", 2);
			}
			log_debug("store: wrong job secret, closing");
			s->st.dropped_auth++;
			c->close_after_flush = true;
			return out_vec(s, c, "denied", 6);
		}
		e = map_find(s, m->key.p, m->key.len, NULL);
		if (!e || !e->present) {
			if (m->value.len > 0)
				return out_vec(s, c, m->value.p, m->value.len);
			r = do_set(s, m->key.p, m->key.len, m->value2.p, m->value2.len, false);
			if (r < 0)
				break;
			return out_vec(s, c, m->value2.p, m->value2.len);
		}
		if (e->vlen == m->value.len && memcmp(e->val, m->value.p, e->vlen) == 0) {
			r = entry_store(s, e, m->value2.p, m->value2.len, false);
			if (r < 0)
				break;
			wake(s, e);
		}
		return out_vec(s, c, e->val, e->vlen);
	}
	case KILN_STORE_OP_GET:
		e = map_find(s, m->key.p, m->key.len, NULL);
		return e && e->present ? out_vec(s, c, e->val, e->vlen) : out_vec(s, c, NULL, 0);
	case KILN_STORE_OP_ADD: {
		int64_t v;
		r = do_add(s, m->key.p, m->key.len, m->delta, &v);
		if (r == -EBADMSG || r == -ERANGE) {
			log_debug("store: ADD to a key that is not a counter, closing");
			conn_close(s, c, &s->st.dropped_protocol);
			return r;
		}
		if (r < 0)
			break;
		return out_i64(s, c, v);
	}
	case KILN_STORE_OP_CHECK:
		return out_u8(s, c,
			      keys_ready(s, m) ? KILN_STORE_CHECK_READY
					       : KILN_STORE_CHECK_NOT_READY);
	case KILN_STORE_OP_WAIT: {
		/* One WAIT at a time per connection: torch clients block on
		 * it.  A new one (torch 1.13 after a client-side timeout)
		 * replaces the old. */
		wait_clear(s, c);
		if (keys_ready(s, m))
			return out_u8(s, c, KILN_STORE_WAIT_STOP_WAITING);
		kiln_store_items it;
		kiln_store_slice k, v;
		uint64_t seq = ++s->wait_seq;
		kiln_store_items_init(&it, m);
		while (kiln_store_items_next(&it, &k, &v)) {
			if ((r = map_insert(s, k.p, k.len, &e)) < 0)
				break;
			if (e->present || e->wait_mark == seq)
				continue;
			e->wait_mark = seq;
			if ((r = add_waiter(s, e, c)) < 0) {
				map_gc(s, e);
				break;
			}
		}
		break;
	}
	case KILN_STORE_OP_GETNUMKEYS:
		return out_i64(s, c, (int64_t) s->st.keys);
	case KILN_STORE_OP_DELETE_KEY: {
		e = map_find(s, m->key.p, m->key.len, NULL);
		int64_t n = e && e->present;
		if (e) {
			entry_drop_value(s, e);
			map_gc(s, e);
		}
		return out_i64(s, c, n);
	}
	case KILN_STORE_OP_MULTI_GET: {
		kiln_store_items it;
		kiln_store_slice k, v;
		kiln_store_items_init(&it, m);
		while (kiln_store_items_next(&it, &k, &v)) {
			e = map_find(s, k.p, k.len, NULL);
			r = e && e->present ? out_vec(s, c, e->val, e->vlen)
					    : out_vec(s, c, NULL, 0);
			if (r < 0)
				return r;
		}
		return 0;
	}
	case KILN_STORE_OP_MULTI_SET: {
		kiln_store_items it;
		kiln_store_slice k, v;
		kiln_store_items_init(&it, m);
		while (kiln_store_items_next(&it, &k, &v))
			if ((r = do_set(s, k.p, k.len, v.p, v.len, false)) < 0)
				break;
		break;
	}
	case KILN_STORE_OP_CANCEL_WAIT:
		wait_clear(s, c);
		return out_u8(s, c, KILN_STORE_WAIT_CANCELED);
	default:
		r = -EBADMSG;
		break;
	}
	if (r < 0 && !c->dead) {
		log_debug_errno(r, "store: %s failed, closing: %m", kiln_store_op_name(m->op));
		conn_close(s, c, r == -EBADMSG ? &s->st.dropped_protocol : &s->st.dropped_limits);
	}
	return r;
}

static void on_readable(kiln_store_server *s, conn *c)
{
	size_t total = 0;
	while (!c->dead && total < READ_QUANTUM) {
		int r = buf_reserve(s, &c->in, &c->in_cap,
				    MIN(c->in_len + READ_CHUNK, s->o.max_conn_buf));
		if (r < 0 || c->in_len >= c->in_cap) {
			/* a request that cannot fit in the buffer */
			log_debug("store: request over the connection buffer, closing");
			conn_close(s, c, &s->st.dropped_limits);
			return;
		}
		ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				conn_close(s, c, NULL);
			break;
		}
		if (n == 0) {
			conn_close(s, c, NULL);
			return;
		}
		c->in_len += (size_t) n;
		total += (size_t) n;

		size_t off = 0;
		while (!c->dead && off < c->in_len) {
			kiln_store_msg m;
			size_t used = 0;
			r = kiln_store_parse(c->in + off, c->in_len - off, &c->dialect, &s->lim, &m,
					     &used);
			if (r == 0)
				break;
			if (r < 0) {
				log_debug_errno(r, "store: malformed request, closing: %m");
				conn_close(s, c, &s->st.dropped_protocol);
				return;
			}
			off += used;
			handle(s, c, &m);
		}
		if (c->dead)
			return;
		if (off > 0) {
			memmove(c->in, c->in + off, c->in_len - off);
			c->in_len -= off;
		}
		if (c->out_len > c->out_off)
			conn_flush(s, c);
		if ((size_t) n < READ_CHUNK)
			break;
	}
	if (!c->dead && c->in_len == 0 && c->in_cap > BUF_MIN)
		buf_release(s, &c->in, &c->in_cap);
}

/* ---- public --------------------------------------------------------------- */

void kiln_store_server_opts_init(kiln_store_server_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->allow_loopback = true;
	o->check_peer_uid = true;
	o->peer_uid = geteuid();
	o->max_key = KILN_STORE_KEY_MAX;
	o->max_value = KILN_STORE_VALUE_MAX;
	o->max_multi = KILN_STORE_MULTI_MAX;
	o->max_conns = KILN_STORE_CONN_MAX;
	o->max_conn_buf = KILN_STORE_CONN_BUF_MAX;
	o->max_total_bytes = KILN_STORE_TOTAL_MAX;
	o->max_total_buf = KILN_STORE_TOTAL_BUF_MAX;
	o->backlog = 4096;
}

/* Room for the connections plus the process's other files. */
static void raise_nofile(size_t conns)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	rlim_t want = (rlim_t) conns + 256;
	if (rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : MIN(want, rl.rlim_max);
	(void) setrlimit(RLIMIT_NOFILE, &rl);
}

int kiln_store_server_new(const kiln_store_server_opts *opts, kiln_store_server **ret)
{
	assert_return(opts && ret, -EINVAL);
	assert_return(opts->max_key > 0 && opts->max_value > 0 && opts->max_multi > 0 &&
			      opts->max_conns > 0,
		      -EINVAL);
	assert_return(opts->max_conn_buf >= opts->max_key + 64 && opts->max_total_bytes > 0 &&
			      opts->max_total_buf > 0,
		      -EINVAL);
	assert_return(!opts->secret ||
			      (opts->secret[0] && strlen(opts->secret) <= KILN_STORE_SECRET_MAX),
		      -EINVAL);
	assert_return(opts->n_allow == 0 || opts->allow, -EINVAL);

	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(opts->port) };
	if (opts->bind_address) {
		if (inet_pton(AF_INET, opts->bind_address, &sa.sin_addr) != 1)
			return -EINVAL;
	} else {
		sa.sin_addr.s_addr = htonl(INADDR_ANY);
	}

	kiln_store_server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->listen_fd = s->epoll_fd = s->event_fd = s->reserve_fd = s->diag_fd = -1;
	s->o = *opts;
	s->o.bind_address = NULL;
	s->o.allow = NULL;
	s->o.secret = NULL;
	s->allow_all = opts->allow_all;
	s->allow_loopback = opts->allow_loopback;
	s->lim = (kiln_store_limits){
		.max_key = opts->max_key,
		.max_value = opts->max_value,
		.max_multi = opts->max_multi,
		.max_msg = opts->max_conn_buf,
	};
	int r;
	if (pthread_mutex_init(&s->lock, NULL) != 0) {
		free(s);
		return -ENOMEM;
	}
	if (kiln_store_map_init(&s->map, BUCKETS_MIN) < 0)
		goto fail_nomem;
	if (opts->n_allow) {
		s->allow = malloc(opts->n_allow * sizeof(*s->allow));
		if (!s->allow)
			goto fail_nomem;
		memcpy(s->allow, opts->allow, opts->n_allow * sizeof(*s->allow));
		s->n_allow = opts->n_allow;
	}
	if (opts->secret) {
		s->secret = strdup(opts->secret);
		if (!s->secret)
			goto fail_nomem;
		s->secret_len = strlen(s->secret);
	}

	raise_nofile(opts->max_conns);

	s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->listen_fd < 0)
		goto fail_errno;
	int one = 1;
	setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->listen_fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
		goto fail_errno;
	if (listen(s->listen_fd, opts->backlog > 0 ? opts->backlog : 4096) < 0)
		goto fail_errno;
	socklen_t sl = sizeof(sa);
	if (getsockname(s->listen_fd, (struct sockaddr *) &sa, &sl) < 0)
		goto fail_errno;
	s->port = ntohs(sa.sin_port);

	s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (s->epoll_fd < 0)
		goto fail_errno;
	s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->event_fd < 0)
		goto fail_errno;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &tag_listen };
	if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->listen_fd, &ev) < 0)
		goto fail_errno;
	ev.data.ptr = &tag_event;
	if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->event_fd, &ev) < 0)
		goto fail_errno;
	s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	*ret = s;
	return 0;

fail_errno:
	r = -errno;
	kiln_store_server_free(s);
	return r;
fail_nomem:
	kiln_store_server_free(s);
	return -ENOMEM;
}

void kiln_store_server_free(kiln_store_server *s)
{
	if (!s)
		return;
	kiln_store_server_stop(s);
	while (s->conns)
		conn_close(s, s->conns, NULL);
	reap_dead(s);
	kiln_store_map_done(&s->map, entry_free_node);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->epoll_fd >= 0)
		close(s->epoll_fd);
	if (s->event_fd >= 0)
		close(s->event_fd);
	if (s->reserve_fd >= 0)
		close(s->reserve_fd);
	if (s->diag_fd >= 0)
		close(s->diag_fd);
	free(s->allow);
	if (s->secret) {
		explicit_bzero(s->secret, s->secret_len);
		free(s->secret);
	}
	pthread_mutex_destroy(&s->lock);
	free(s);
}

uint16_t kiln_store_server_port(const kiln_store_server *s)
{
	return s ? s->port : 0;
}

int kiln_store_server_fd(const kiln_store_server *s)
{
	assert_return(s, -EINVAL);
	return s->epoll_fd;
}

static int process(kiln_store_server *s, int timeout_ms)
{
	struct epoll_event evs[EPOLL_BATCH];
	int n = epoll_wait(s->epoll_fd, evs, EPOLL_BATCH, timeout_ms);
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < n; i++) {
		void *p = evs[i].data.ptr;
		if (p == &tag_listen) {
			on_accept(s);
		} else if (p == &tag_event) {
			uint64_t v;
			(void) !read(s->event_fd, &v, sizeof(v));
		} else {
			conn *c = p;
			if (c->dead)
				continue;
			if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
				on_readable(s, c);
			if (!c->dead && (evs[i].events & EPOLLOUT))
				conn_flush(s, c);
		}
	}
	reap_dead(s);
	pthread_mutex_unlock(&s->lock);
	return n;
}

int kiln_store_server_process(kiln_store_server *s, uint64_t timeout_usec)
{
	assert_return(s, -EINVAL);
	if (s->running)
		return -EBUSY;
	int ms = timeout_usec == UINT64_MAX ? -1
					    : (int) MIN(timeout_usec / 1000, (uint64_t) INT_MAX);
	return process(s, ms);
}

static void *serve_thread(void *userdata)
{
	kiln_store_server *s = userdata;
	while (!atomic_load(&s->stop))
		if (process(s, -1) < 0)
			break;
	return NULL;
}

int kiln_store_server_start(kiln_store_server *s)
{
	assert_return(s, -EINVAL);
	if (s->running)
		return -EBUSY;
	atomic_store(&s->stop, false);
	int r = pthread_create(&s->thread, NULL, serve_thread, s);
	if (r != 0)
		return -r;
	s->running = true;
	return 0;
}

int kiln_store_server_stop(kiln_store_server *s)
{
	assert_return(s, -EINVAL);
	if (!s->running)
		return 0;
	atomic_store(&s->stop, true);
	uint64_t one = 1;
	(void) !write(s->event_fd, &one, sizeof(one));
	pthread_join(s->thread, NULL);
	s->running = false;
	return 0;
}

/* in-process access */

static int check_key(const kiln_store_server *s, const char *key)
{
	assert_return(key && key[0], -EINVAL);
	if (strlen(key) > s->o.max_key)
		return -E2BIG;
	return 0;
}

int kiln_store_server_set(kiln_store_server *s, const char *key, const void *value, size_t len)
{
	assert_return(s, -EINVAL);
	assert_return(value || len == 0, -EINVAL);
	int r = check_key(s, key);
	if (r < 0)
		return r;
	if (len > s->o.max_value)
		return -E2BIG;
	pthread_mutex_lock(&s->lock);
	r = do_set(s, (const uint8_t *) key, strlen(key), value, len, false);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int kiln_store_server_get(kiln_store_server *s, const char *key, void **ret, size_t *ret_len)
{
	assert_return(s && ret, -EINVAL);
	int r = check_key(s, key);
	if (r < 0)
		return r == -E2BIG ? -ENOENT : r;
	pthread_mutex_lock(&s->lock);
	entry *e = map_find(s, (const uint8_t *) key, strlen(key), NULL);
	if (!e || !e->present) {
		r = -ENOENT;
	} else {
		void *p = malloc(e->vlen + 1);
		if (!p) {
			r = -ENOMEM;
		} else {
			memcpy(p, e->val, e->vlen + 1);
			*ret = p;
			if (ret_len)
				*ret_len = e->vlen;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int kiln_store_server_add(kiln_store_server *s, const char *key, int64_t delta, int64_t *ret)
{
	assert_return(s, -EINVAL);
	int r = check_key(s, key);
	if (r < 0)
		return r;
	int64_t v = 0;
	pthread_mutex_lock(&s->lock);
	r = do_add(s, (const uint8_t *) key, strlen(key), delta, &v);
	pthread_mutex_unlock(&s->lock);
	if (r >= 0 && ret)
		*ret = v;
	return r;
}

int kiln_store_server_delete(kiln_store_server *s, const char *key)
{
	assert_return(s, -EINVAL);
	int r = check_key(s, key);
	if (r < 0)
		return r == -E2BIG ? 0 : r;
	pthread_mutex_lock(&s->lock);
	entry *e = map_find(s, (const uint8_t *) key, strlen(key), NULL);
	r = e && e->present;
	if (e) {
		entry_drop_value(s, e);
		map_gc(s, e);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int64_t kiln_store_server_num_keys(kiln_store_server *s)
{
	assert_return(s, -EINVAL);
	pthread_mutex_lock(&s->lock);
	int64_t n = (int64_t) s->st.keys;
	pthread_mutex_unlock(&s->lock);
	return n;
}

int kiln_store_server_foreach(kiln_store_server *s, const char *prefix, kiln_store_foreach_fn fn,
			      void *userdata)
{
	assert_return(s && fn, -EINVAL);
	size_t pl = prefix ? strlen(prefix) : 0;
	int n = 0, r = 0;
	pthread_mutex_lock(&s->lock);
	kiln_store_map_iter it = { 0 };
	for (kiln_store_map_node *mn; r >= 0 && (mn = kiln_store_map_next(&s->map, &it));) {
		entry *e = KILN_STORE_MAP_ENTRY(mn, entry, node);
		if (!e->present || mn->klen < pl || memcmp(e->key, prefix, pl) != 0)
			continue;
		r = fn(e->key, e->val, e->vlen, userdata);
		n++;
	}
	pthread_mutex_unlock(&s->lock);
	return r < 0 ? r : n;
}

int kiln_store_server_get_stats(kiln_store_server *s, kiln_store_server_stats *ret)
{
	assert_return(s && ret, -EINVAL);
	pthread_mutex_lock(&s->lock);
	*ret = s->st;
	pthread_mutex_unlock(&s->lock);
	return 0;
}
