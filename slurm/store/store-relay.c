/* store-relay.c — the worker-facing end of the store on each node.
 *
 * PyTorch's TCPStore client speaks no authentication, and a store that any
 * process could reach would let another user on a shared node read a job's
 * NCCL id or write its keys.  So workers never reach the store host
 * directly: each agent runs a relay on 127.0.0.1 (MASTER_ADDR/MASTER_PORT
 * point there), which admits only local processes of the job's uid (the
 * kernel says whose socket the other end is, through sock_diag,
 * store-peer.c) and forwards each of their connections to the store,
 * opening it with a WORKER_HELLO that carries the job secret.  The store
 * then serves that connection the worker key space; the worker's own bytes
 * (torch 1.13, 2.x or kiln's client) follow unchanged, byte for byte.
 *
 * One thread, one epoll loop; each connection pair has a fixed buffer per
 * direction, and a side is read only while the buffer towards the other
 * side has room, so a slow reader holds back its writer instead of growing
 * memory.  The upstream connect is made in the loop with a short timeout:
 * the store is on the cluster network and answers at once, or is gone (then
 * the agents restart the workers anyway). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/store.h"
#include "store-proto.h"

/* Bytes buffered per direction per connection.  Requests and replies of any
 * size stream through; this only sets how much is in flight. */
#define RELAY_BUF 16384u
/* A store that does not accept within this is gone. */
#define RELAY_CONNECT_MSEC 2000
/* Rounds of read-then-write per wake-up, so that one busy pair does not
 * starve the others. */
#define RELAY_ROUNDS 16
#define RELAY_BATCH  64

typedef struct rpair rpair;

typedef struct rside {
	rpair *p;
	int fd;
	uint32_t events; /* registered interest */
} rside;

typedef struct rdir {
	uint8_t buf[RELAY_BUF];
	size_t off, len;
	bool eof; /* the reading side closed */
} rdir;

struct rpair {
	rside w, u;  /* worker, upstream */
	rdir wu, uw; /* worker -> upstream, upstream -> worker */
	bool dead;
	rpair *prev, *next;
};

struct kiln_store_relay {
	kiln_store_relay_opts o;
	char *secret;
	pthread_mutex_t lock; /* guards upstream */
	struct sockaddr_in upstream;
	int listen_fd, epoll_fd, event_fd;
	int diag_fd;	/* sock_diag socket of the relay's thread, -1 until needed */
	int reserve_fd; /* spare fd to shed a connection when out of fds */
	uint16_t port;
	pthread_t thread;
	bool running;
	atomic_bool stop;
	rpair *pairs, *dead;
	size_t n_pairs;
	atomic_uint_fast64_t refused;
};

static char tag_listen, tag_event;

static void refuse_msg(kiln_store_relay *r, const struct sockaddr_in *sa, const char *fmt, ...)
	_printf_(3, 4);
static void refuse_msg(kiln_store_relay *r, const struct sockaddr_in *sa, const char *fmt, ...)
{
	char b[INET_ADDRSTRLEN], why[200], msg[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(msg, sizeof(msg), "relay: %s:%u: %s",
		 inet_ntop(AF_INET, &sa->sin_addr, b, sizeof(b)) ?: "?", ntohs(sa->sin_port), why);
	log_debug("store %s", msg);
	atomic_fetch_add(&r->refused, 1);
	if (r->o.on_refused)
		r->o.on_refused(msg, r->o.on_refused_userdata);
}

static void pair_close(kiln_store_relay *r, rpair *p)
{
	if (p->dead)
		return;
	p->dead = true;
	epoll_ctl(r->epoll_fd, EPOLL_CTL_DEL, p->w.fd, NULL);
	epoll_ctl(r->epoll_fd, EPOLL_CTL_DEL, p->u.fd, NULL);
	close(p->w.fd);
	close(p->u.fd);
	if (p->prev)
		p->prev->next = p->next;
	else
		r->pairs = p->next;
	if (p->next)
		p->next->prev = p->prev;
	p->prev = NULL;
	p->next = r->dead;
	r->dead = p;
	r->n_pairs--;
}

/* Moves bytes src -> d -> dst until neither side can make progress.
 * Returns 0, or -errno when a socket failed. */
static int flow(int src, rdir *d, int dst)
{
	for (int i = 0; i < RELAY_ROUNDS; i++) {
		bool moved = false;
		if (!d->eof && d->len < RELAY_BUF) {
			ssize_t n = recv(src, d->buf + d->len, RELAY_BUF - d->len, MSG_DONTWAIT);
			if (n > 0) {
				d->len += (size_t) n;
				moved = true;
			} else if (n == 0) {
				d->eof = true;
			} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				return -errno;
			}
		}
		if (d->off < d->len) {
			ssize_t n = send(dst, d->buf + d->off, d->len - d->off,
					 MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n > 0) {
				d->off += (size_t) n;
				moved = true;
			} else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
				   errno != EINTR) {
				return -errno;
			}
		}
		if (d->off == d->len) {
			d->off = d->len = 0;
		} else if (d->len == RELAY_BUF && d->off > 0) {
			memmove(d->buf, d->buf + d->off, d->len - d->off);
			d->len -= d->off;
			d->off = 0;
			moved = true;
		}
		if (!moved)
			break;
	}
	return 0;
}

static void side_watch(kiln_store_relay *r, rside *s, uint32_t events)
{
	if (s->events == events)
		return;
	struct epoll_event ev = { .events = events, .data.ptr = s };
	if (epoll_ctl(r->epoll_fd, EPOLL_CTL_MOD, s->fd, &ev) == 0)
		s->events = events;
}

static void pump(kiln_store_relay *r, rpair *p)
{
	if (flow(p->w.fd, &p->wu, p->u.fd) < 0 || flow(p->u.fd, &p->uw, p->w.fd) < 0) {
		pair_close(r, p);
		return;
	}
	/* Either side gone and what it sent delivered: the pair is done
	 * (TCPStore clients never half-close). */
	if ((p->wu.eof && p->wu.len == 0) || (p->uw.eof && p->uw.len == 0)) {
		pair_close(r, p);
		return;
	}
	side_watch(r, &p->w,
		   (p->wu.eof || p->wu.len == RELAY_BUF ? 0 : EPOLLIN) |
			   (p->uw.len > p->uw.off ? EPOLLOUT : 0));
	side_watch(r, &p->u,
		   (p->uw.eof || p->uw.len == RELAY_BUF ? 0 : EPOLLIN) |
			   (p->wu.len > p->wu.off ? EPOLLOUT : 0));
}

/* A connected socket to the store, or -errno. */
static int connect_upstream(kiln_store_relay *r)
{
	pthread_mutex_lock(&r->lock);
	struct sockaddr_in sa = r->upstream;
	pthread_mutex_unlock(&r->lock);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
		if (errno != EINPROGRESS) {
			int e = -errno;
			close(fd);
			return e;
		}
		struct pollfd pf = { .fd = fd, .events = POLLOUT };
		int n;
		while ((n = poll(&pf, 1, RELAY_CONNECT_MSEC)) < 0 && errno == EINTR)
			;
		int err = 0;
		socklen_t el = sizeof(err);
		if (n == 0)
			err = ETIMEDOUT;
		else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
			err = errno;
		if (err) {
			close(fd);
			return -err;
		}
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static void on_accept(kiln_store_relay *r)
{
	for (int i = 0; i < 256; i++) {
		struct sockaddr_in sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(r->listen_fd, (struct sockaddr *) &sa, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0 && (errno == EMFILE || errno == ENFILE) && r->reserve_fd >= 0) {
			/* Out of fds: take the pending connection off the queue
			 * with the spare one and refuse it, instead of spinning
			 * on a listen socket that stays readable. */
			close(r->reserve_fd);
			fd = accept(r->listen_fd, NULL, NULL);
			if (fd >= 0)
				close(fd);
			r->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			continue;
		}
		if (fd < 0)
			return;
		uid_t uid;
		int k = r->diag_fd >= 0 ? 0 : (r->diag_fd = kiln_store_diag_open());
		if (k >= 0)
			k = kiln_store_peer_uid_via(r->diag_fd, fd, &uid);
		if (k == -ETIMEDOUT) {
			close(r->diag_fd);
			r->diag_fd = -1;
		}
		if (k != 1 || uid != r->o.peer_uid) {
			if (k == 1)
				refuse_msg(r, &sa,
					   "a process of uid %u on this node; only uid %u (the "
					   "job's) may use this job's store",
					   (unsigned) uid, (unsigned) r->o.peer_uid);
			else
				refuse_msg(r, &sa, "cannot tell which user this peer is (%s)",
					   k == 0 ? "not found" : strerror(-k));
			close(fd);
			continue;
		}
		if (r->n_pairs >= r->o.max_conns) {
			log_debug("store relay: too many connections, refusing one");
			close(fd);
			continue;
		}
		int u = connect_upstream(r);
		if (u < 0) {
			log_debug_errno(u, "store relay: cannot reach the store: %m");
			close(fd);
			continue;
		}
		rpair *p = calloc(1, sizeof(*p));
		if (!p) {
			close(fd);
			close(u);
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		p->w = (rside){ .p = p, .fd = fd, .events = EPOLLIN };
		p->u = (rside){ .p = p, .fd = u, .events = EPOLLIN | EPOLLOUT };
		int n = kiln_store_format_worker_hello(r->secret, p->wu.buf, RELAY_BUF);
		p->wu.len = (size_t) MAX(n, 0);
		struct epoll_event ew = { .events = p->w.events, .data.ptr = &p->w };
		struct epoll_event eu = { .events = p->u.events, .data.ptr = &p->u };
		if (n < 0 || epoll_ctl(r->epoll_fd, EPOLL_CTL_ADD, fd, &ew) < 0) {
			close(fd);
			close(u);
			free(p);
			continue;
		}
		if (epoll_ctl(r->epoll_fd, EPOLL_CTL_ADD, u, &eu) < 0) {
			epoll_ctl(r->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
			close(fd);
			close(u);
			free(p);
			continue;
		}
		p->next = r->pairs;
		if (r->pairs)
			r->pairs->prev = p;
		r->pairs = p;
		r->n_pairs++;
	}
}

static void *relay_thread(void *userdata)
{
	kiln_store_relay *r = userdata;
	struct epoll_event evs[RELAY_BATCH];
	while (!atomic_load(&r->stop)) {
		int n = epoll_wait(r->epoll_fd, evs, RELAY_BATCH, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < n; i++) {
			void *d = evs[i].data.ptr;
			if (d == &tag_listen) {
				on_accept(r);
			} else if (d == &tag_event) {
				uint64_t v;
				(void) !read(r->event_fd, &v, sizeof(v));
			} else {
				rpair *p = ((rside *) d)->p;
				if (!p->dead)
					pump(r, p);
			}
		}
		while (r->dead) {
			rpair *p = r->dead;
			r->dead = p->next;
			free(p);
		}
	}
	return NULL;
}

void kiln_store_relay_opts_init(kiln_store_relay_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->peer_uid = geteuid();
	o->max_conns = KILN_STORE_RELAY_CONN_MAX;
}

int kiln_store_relay_set_upstream(kiln_store_relay *r, const char *host, uint16_t port)
{
	assert_return(r && host && port > 0, -EINVAL);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return -EINVAL;
	pthread_mutex_lock(&r->lock);
	r->upstream = sa;
	pthread_mutex_unlock(&r->lock);
	return 0;
}

int kiln_store_relay_new(const kiln_store_relay_opts *o, kiln_store_relay **ret)
{
	assert_return(o && ret && o->secret && o->upstream_host && o->upstream_port > 0, -EINVAL);
	assert_return(o->secret[0] && strlen(o->secret) <= KILN_STORE_SECRET_MAX, -EINVAL);
	assert_return(o->max_conns > 0, -EINVAL);
	kiln_store_relay *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->o = *o;
	r->listen_fd = r->epoll_fd = r->event_fd = r->diag_fd = r->reserve_fd = -1;
	pthread_mutex_init(&r->lock, NULL);
	int e;
	r->secret = strdup(o->secret);
	if (!r->secret) {
		e = -ENOMEM;
		goto fail;
	}
	r->o.secret = NULL;
	r->o.upstream_host = NULL;
	if ((e = kiln_store_relay_set_upstream(r, o->upstream_host, o->upstream_port)) < 0)
		goto fail;

	/* Two fds per relayed connection: make room (best effort). */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rlim_t want = (rlim_t) (2 * o->max_conns + 256);
		if (rl.rlim_cur < want) {
			rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : MIN(want, rl.rlim_max);
			(void) setrlimit(RLIMIT_NOFILE, &rl);
		}
	}
	r->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	/* Workers are on this node: loopback only, an ephemeral port. */
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (r->listen_fd < 0 || bind(r->listen_fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
	    listen(r->listen_fd, 1024) < 0 ||
	    getsockname(r->listen_fd, (struct sockaddr *) &sa, &sl) < 0)
		goto fail_errno;
	r->port = ntohs(sa.sin_port);
	r->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (r->epoll_fd < 0)
		goto fail_errno;
	r->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (r->event_fd < 0)
		goto fail_errno;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &tag_listen };
	if (epoll_ctl(r->epoll_fd, EPOLL_CTL_ADD, r->listen_fd, &ev) < 0)
		goto fail_errno;
	ev.data.ptr = &tag_event;
	if (epoll_ctl(r->epoll_fd, EPOLL_CTL_ADD, r->event_fd, &ev) < 0)
		goto fail_errno;
	e = pthread_create(&r->thread, NULL, relay_thread, r);
	if (e != 0) {
		e = -e;
		goto fail;
	}
	r->running = true;
	*ret = r;
	return 0;
fail_errno:
	e = -errno;
fail:
	kiln_store_relay_free(r);
	return e;
}

uint16_t kiln_store_relay_port(const kiln_store_relay *r)
{
	return r ? r->port : 0;
}

uint64_t kiln_store_relay_refused(kiln_store_relay *r)
{
	return r ? atomic_load(&r->refused) : 0;
}

void kiln_store_relay_free(kiln_store_relay *r)
{
	if (!r)
		return;
	if (r->running) {
		atomic_store(&r->stop, true);
		uint64_t one = 1;
		(void) !write(r->event_fd, &one, sizeof(one));
		pthread_join(r->thread, NULL);
	}
	while (r->pairs)
		pair_close(r, r->pairs);
	while (r->dead) {
		rpair *p = r->dead;
		r->dead = p->next;
		free(p);
	}
	if (r->listen_fd >= 0)
		close(r->listen_fd);
	if (r->epoll_fd >= 0)
		close(r->epoll_fd);
	if (r->event_fd >= 0)
		close(r->event_fd);
	if (r->diag_fd >= 0)
		close(r->diag_fd);
	if (r->reserve_fd >= 0)
		close(r->reserve_fd);
	if (r->secret) {
		explicit_bzero(r->secret, strlen(r->secret));
		free(r->secret);
	}
	pthread_mutex_destroy(&r->lock);
	free(r);
}
