/* kernels/kk/cpu/comm.c — collectives for the cpu backend over TCP, so
 * multi-process data-parallel runs can be tested without GPUs.
 *
 * Topology: a star through rank 0.  Every rank keeps one connection to
 * rank 0; rank 0 reduces contributions in rank order (so every rank ends
 * with bitwise identical results, deterministic run to run) and sends the
 * result back.  That moves O(world) data through rank 0, which is fine for
 * tests and small CPU runs, not meant to scale.
 *
 * The id is the text "kkcpu:HOST:PORT" (NUL padded to KK_COMM_ID_BYTES).
 * kk_comm_get_id() opens the listening socket at once and parks it in a
 * small per-process table, so ranks may connect before rank 0 reaches
 * kk_comm_init (they also retry until KK_COMM_TIMEOUT_SEC).  An id can be
 * written by hand too; rank 0 then binds that port itself.
 * Every message carries a header (magic, op, bytes) so ranks calling
 * different collectives fail with -EPROTO instead of mixing data. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cpu.h"
#include "kiln/macro.h"

#define COMM_MAGIC     0x6b6b636fu /* "kkco" */
#define COMM_ID_PREFIX "kkcpu:"
/* Listening sockets parked by kk_comm_get_id, per process. */
#define COMM_PARKED_MAX 16
/* Pause between connection attempts while rank 0 is not up yet. */
#define COMM_RETRY_MSEC 50

enum { OP_HELLO = 1, OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST };

struct msg_hdr {
	uint32_t magic, op;
	uint64_t bytes;
};

struct cpu_comm {
	int *fds; /* rank 0: fds[r] for r >= 1; others: fds[0] */
};

static pthread_mutex_t parked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int port, fd;
} parked[COMM_PARKED_MAX];
static int n_parked;

/* ---- socket helpers ---------------------------------------------------- */

static uint64_t now_msec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int wait_fd(int fd, short ev)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int r;
	do
		r = poll(&p, 1, KK_COMM_TIMEOUT_SEC * 1000);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	return 0;
}

static int send_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0) {
			int r;
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			if ((r = wait_fd(fd, POLLOUT)) < 0)
				return r;
			continue;
		}
		p += w;
		n -= (size_t) w;
	}
	return 0;
}

static int recv_all(int fd, void *buf, size_t n)
{
	char *p = buf;
	while (n > 0) {
		ssize_t g;
		int r = wait_fd(fd, POLLIN);
		if (r < 0)
			return r;
		g = recv(fd, p, n, 0);
		if (g < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (g == 0)
			return -ECONNRESET;
		p += g;
		n -= (size_t) g;
	}
	return 0;
}

static int send_msg(int fd, uint32_t op, const void *buf, size_t n)
{
	struct msg_hdr h = { COMM_MAGIC, op, n };
	int r = send_all(fd, &h, sizeof(h));
	return r < 0 ? r : send_all(fd, buf, n);
}

static int recv_msg(int fd, uint32_t op, void *buf, size_t n)
{
	struct msg_hdr h;
	int r = recv_all(fd, &h, sizeof(h));
	if (r < 0)
		return r;
	if (h.magic != COMM_MAGIC || h.op != op || h.bytes != n)
		return -EPROTO;
	return recv_all(fd, buf, n);
}

static int listen_on(int port, int *ret_fd, int *ret_port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_ANY),
				 .sin_port = htons((uint16_t) port) };
	socklen_t len = sizeof(a);
	int one = 1;
	_cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	(void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *) &a, sizeof(a)) < 0 || listen(fd, SOMAXCONN) < 0 ||
	    getsockname(fd, (struct sockaddr *) &a, &len) < 0)
		return -errno;
	*ret_port = ntohs(a.sin_port);
	*ret_fd = TAKE_FD(fd);
	return 0;
}

static bool is_loopback(const struct sockaddr_in *a)
{
	return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
}

/* Our address as peers should dial it: $KILN_COMM_ADDR, else $MASTER_ADDR
 * (kiln-run and torchrun set it to rank 0's host), else the host name's
 * first non-loopback address (Debian maps the name to 127.0.1.1), else the
 * first non-loopback interface, else 127.0.0.1 (single host). */
static void own_address(char *buf, size_t len)
{
	const char *env = getenv("KILN_COMM_ADDR");
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	struct ifaddrs *ifs = NULL;
	char host[256];

	if (!env || !*env)
		env = getenv("MASTER_ADDR");
	if (env && *env && strlen(env) < len) {
		snprintf(buf, len, "%s", env);
		return;
	}
	snprintf(buf, len, "127.0.0.1");
	if (gethostname(host, sizeof(host)) == 0) {
		host[sizeof(host) - 1] = 0;
		if (getaddrinfo(host, NULL, &hints, &ai) == 0) {
			for (struct addrinfo *p = ai; p; p = p->ai_next) {
				struct sockaddr_in *sa = (struct sockaddr_in *) p->ai_addr;
				if (!is_loopback(sa)) {
					inet_ntop(AF_INET, &sa->sin_addr, buf, (socklen_t) len);
					freeaddrinfo(ai);
					return;
				}
			}
			freeaddrinfo(ai);
		}
	}
	if (getifaddrs(&ifs) == 0) {
		for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
			if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
			    (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
				inet_ntop(AF_INET, &((struct sockaddr_in *) i->ifa_addr)->sin_addr,
					  buf, (socklen_t) len);
				break;
			}
		freeifaddrs(ifs);
	}
}

static int parse_id(const void *id, size_t id_len, char *host, size_t hlen, int *port)
{
	char s[KK_COMM_ID_BYTES + 1];
	const char *rest, *colon;
	char *end;
	long p;

	memcpy(s, id, KK_COMM_ID_BYTES);
	s[KK_COMM_ID_BYTES] = 0;
	rest = startswith(s, COMM_ID_PREFIX);
	if (!rest || !(colon = strrchr(rest, ':')) || (size_t) (colon - rest) >= hlen ||
	    colon == rest)
		return -EINVAL;
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (errno || *end || p <= 0 || p > 65535)
		return -EINVAL;
	memcpy(host, rest, colon - rest);
	host[colon - rest] = 0;
	*port = (int) p;
	return 0;
}

int kk__cpu_comm_get_id(kk_backend *be, void *id, size_t len)
{
	char addr[64];
	int fd, port, r;

	r = listen_on(0, &fd, &port);
	if (r < 0)
		return r;
	pthread_mutex_lock(&parked_lock);
	if (n_parked == COMM_PARKED_MAX) {
		pthread_mutex_unlock(&parked_lock);
		close(fd);
		return -EMFILE;
	}
	parked[n_parked].port = port;
	parked[n_parked++].fd = fd;
	pthread_mutex_unlock(&parked_lock);

	own_address(addr, sizeof(addr));
	snprintf(id, len, COMM_ID_PREFIX "%s:%d", addr, port);
	return 0;
}

static int take_parked(int port)
{
	int fd = -1;
	pthread_mutex_lock(&parked_lock);
	for (int i = 0; i < n_parked; i++)
		if (parked[i].port == port) {
			fd = parked[i].fd;
			parked[i] = parked[--n_parked];
			break;
		}
	pthread_mutex_unlock(&parked_lock);
	return fd;
}

static void tune(int fd)
{
	int one = 1;
	(void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int root_accept(kk_comm *c, struct cpu_comm *cc, int port)
{
	_cleanup_close_ int lfd = take_parked(port);
	uint64_t deadline = now_msec() + KK_COMM_TIMEOUT_SEC * 1000ull;
	int joined = 0, r, dummy;

	if (lfd < 0 && (r = listen_on(port, &lfd, &dummy)) < 0)
		return r;
	while (joined < c->world - 1) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		int32_t hello[2];
		int64_t left = (int64_t) (deadline - now_msec());
		_cleanup_close_ int fd = -1;

		if (left <= 0)
			return -ETIMEDOUT;
		r = poll(&p, 1, (int) left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		tune(fd);
		r = recv_msg(fd, OP_HELLO, hello, sizeof(hello));
		if (r < 0)
			return r;
		if (hello[1] != c->world || hello[0] <= 0 || hello[0] >= c->world ||
		    cc->fds[hello[0]] >= 0)
			return -EPROTO;
		cc->fds[hello[0]] = TAKE_FD(fd);
		joined++;
	}
	return 0;
}

static int peer_connect(kk_comm *c, struct cpu_comm *cc, const char *host, int port)
{
	uint64_t deadline = now_msec() + KK_COMM_TIMEOUT_SEC * 1000ull;
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char ports[16];
	int32_t hello[2] = { c->rank, c->world };
	int r;

	snprintf(ports, sizeof(ports), "%d", port);
	r = getaddrinfo(host, ports, &hints, &ai);
	if (r != 0)
		return r == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
	for (;;) {
		_cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			r = -errno;
			break;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
			tune(fd);
			cc->fds[0] = TAKE_FD(fd);
			r = 0;
			break;
		}
		r = -errno;
		if ((r != -ECONNREFUSED && r != -ETIMEDOUT && r != -EHOSTUNREACH) ||
		    now_msec() >= deadline)
			break;
		usleep(COMM_RETRY_MSEC * 1000);
	}
	freeaddrinfo(ai);
	if (r < 0)
		return r;
	return send_msg(cc->fds[0], OP_HELLO, hello, sizeof(hello));
}

void kk__cpu_comm_free(kk_comm *c)
{
	struct cpu_comm *cc = c->impl;
	if (!cc)
		return;
	for (int i = 0; cc->fds && i < c->world; i++)
		if (cc->fds[i] >= 0)
			close(cc->fds[i]);
	free(cc->fds);
	free(cc);
	c->impl = NULL;
}

int kk__cpu_comm_init(kk_comm *c, const void *id, size_t id_len)
{
	char host[KK_COMM_ID_BYTES];
	struct cpu_comm *cc;
	int port, r;

	r = parse_id(id, id_len, host, sizeof(host), &port);
	if (r < 0)
		return r;
	cc = calloc(1, sizeof(*cc));
	if (!cc)
		return -ENOMEM;
	c->impl = cc;
	cc->fds = malloc(c->world * sizeof(int));
	if (!cc->fds) {
		kk__cpu_comm_free(c);
		return -ENOMEM;
	}
	for (int i = 0; i < c->world; i++)
		cc->fds[i] = -1;
	if (c->world == 1) {
		int fd = take_parked(port); /* nobody will dial in */
		if (fd >= 0)
			close(fd);
		return 0;
	}
	r = c->rank == 0 ? root_accept(c, cc, port) : peer_connect(c, cc, host, port);
	if (r < 0)
		kk__cpu_comm_free(c);
	return r;
}

/* ---- collectives ------------------------------------------------------- */

static void combine(float *acc, const void *src, kk_dtype dt, size_t n, kk_reduce_op op)
{
	for (size_t i = 0; i < n; i++) {
		float v = kk__ld(src, dt, i);
		acc[i] = op == KK_MAX ? fmaxf(acc[i], v) : acc[i] + v;
	}
}

/* Rank 0: acc = op over ranks of `n` elements each rank sends. */
static int root_reduce(kk_comm *c, uint32_t opc, const kk_buffer *send, size_t n, kk_reduce_op op,
		       float **ret)
{
	struct cpu_comm *cc = c->impl;
	size_t bytes = kk_dtype_size(send->dtype, n);
	_cleanup_free_ float *acc = malloc(n * sizeof(float));
	_cleanup_free_ void *tmp = malloc(bytes);
	int r;

	if (!acc || !tmp)
		return -ENOMEM;
	kk__row_f32(acc, send->ptr, send->dtype, 0, n);
	for (int rk = 1; rk < c->world; rk++) {
		r = recv_msg(cc->fds[rk], opc, tmp, bytes);
		if (r < 0)
			return r;
		combine(acc, tmp, send->dtype, n, op);
	}
	if (op == KK_AVG)
		for (size_t i = 0; i < n; i++)
			acc[i] /= (float) c->world;
	*ret = TAKE_PTR(acc);
	return 0;
}

int kk__cpu_all_reduce(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
		       size_t count, kk_reduce_op op)
{
	struct cpu_comm *cc = c->impl;
	size_t bytes = kk_dtype_size(send->dtype, count);
	_cleanup_free_ float *acc = NULL;
	int r;

	if (c->rank != 0) {
		r = send_msg(cc->fds[0], OP_ALL_REDUCE, send->ptr, bytes);
		return r < 0 ? r : recv_msg(cc->fds[0], OP_ALL_REDUCE, recv->ptr, bytes);
	}
	r = root_reduce(c, OP_ALL_REDUCE, send, count, op, &acc);
	if (r < 0)
		return r;
	kk__row_store(recv->ptr, recv->dtype, 0, acc, count);
	for (int rk = 1; rk < c->world; rk++)
		if ((r = send_msg(cc->fds[rk], OP_ALL_REDUCE, recv->ptr, bytes)) < 0)
			return r;
	return 0;
}

int kk__cpu_reduce_scatter(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
			   size_t count, kk_reduce_op op)
{
	struct cpu_comm *cc = c->impl;
	size_t total = count * c->world, cbytes = kk_dtype_size(send->dtype, count);
	_cleanup_free_ float *acc = NULL;
	_cleanup_free_ void *chunk = NULL;
	int r;

	if (c->rank != 0) {
		r = send_msg(cc->fds[0], OP_REDUCE_SCATTER, send->ptr,
			     kk_dtype_size(send->dtype, total));
		return r < 0 ? r : recv_msg(cc->fds[0], OP_REDUCE_SCATTER, recv->ptr, cbytes);
	}
	r = root_reduce(c, OP_REDUCE_SCATTER, send, total, op, &acc);
	if (r < 0)
		return r;
	chunk = malloc(cbytes);
	if (!chunk)
		return -ENOMEM;
	for (int rk = 1; rk < c->world; rk++) {
		kk__row_store(chunk, send->dtype, 0, acc + (size_t) rk * count, count);
		if ((r = send_msg(cc->fds[rk], OP_REDUCE_SCATTER, chunk, cbytes)) < 0)
			return r;
	}
	kk__row_store(recv->ptr, recv->dtype, 0, acc, count);
	return 0;
}

int kk__cpu_all_gather(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
		       size_t count)
{
	struct cpu_comm *cc = c->impl;
	size_t cbytes = kk_dtype_size(send->dtype, count), total = cbytes * c->world;
	int r;

	if (c->rank != 0) {
		r = send_msg(cc->fds[0], OP_ALL_GATHER, send->ptr, cbytes);
		return r < 0 ? r : recv_msg(cc->fds[0], OP_ALL_GATHER, recv->ptr, total);
	}
	memmove(recv->ptr, send->ptr, cbytes);
	for (int rk = 1; rk < c->world; rk++)
		if ((r = recv_msg(cc->fds[rk], OP_ALL_GATHER, (char *) recv->ptr + rk * cbytes,
				  cbytes)) < 0)
			return r;
	for (int rk = 1; rk < c->world; rk++)
		if ((r = send_msg(cc->fds[rk], OP_ALL_GATHER, recv->ptr, total)) < 0)
			return r;
	return 0;
}

int kk__cpu_broadcast(kk_comm *c, kk_stream *st, kk_buffer *buf, size_t count, int root)
{
	struct cpu_comm *cc = c->impl;
	size_t bytes = kk_dtype_size(buf->dtype, count);
	int r;

	if (c->rank != 0) {
		if (c->rank == root)
			return send_msg(cc->fds[0], OP_BROADCAST, buf->ptr, bytes);
		return recv_msg(cc->fds[0], OP_BROADCAST, buf->ptr, bytes);
	}
	if (root != 0 && (r = recv_msg(cc->fds[root], OP_BROADCAST, buf->ptr, bytes)) < 0)
		return r;
	for (int rk = 1; rk < c->world; rk++)
		if (rk != root && (r = send_msg(cc->fds[rk], OP_BROADCAST, buf->ptr, bytes)) < 0)
			return r;
	return 0;
}
