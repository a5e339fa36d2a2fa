/* store-client.c — blocking client for the kiln store (and for any PyTorch
 * TCPStore server: it speaks the torch 2.x dialect, VALIDATE first).
 *
 * One request at a time over a non-blocking socket; every send and receive
 * polls against a deadline so no call blocks longer than the client's
 * timeout.  Any failure in the middle of an exchange leaves the byte stream
 * in an unknown state, so the connection is then marked broken. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "kiln/macro.h"
#include "kiln/net.h"
#include "kiln/parse.h"
#include "kiln/store.h"
#include "store-proto.h"

/* Pause between connection attempts while the store is not up yet. */
#define CONNECT_RETRY_USEC (100 * 1000ull)

struct kiln_store_client {
	int fd;
	bool broken;
	bool auth;
	uint64_t timeout_usec;
	/* request being built */
	uint8_t *buf;
	size_t len, cap;
	int err; /* sticky -ENOMEM while building */
};

/* ---- request building ----------------------------------------------------- */

static void put(kiln_store_client *c, const void *p, size_t n)
{
	if (c->err)
		return;
	if (c->len + n > c->cap) {
		size_t cap = MAX((size_t) 256, c->cap);
		while (cap < c->len + n)
			cap *= 2;
		uint8_t *b = realloc(c->buf, cap);
		if (!b) {
			c->err = -ENOMEM;
			return;
		}
		c->buf = b;
		c->cap = cap;
	}
	memcpy(c->buf + c->len, p, n);
	c->len += n;
}
static void put_u8(kiln_store_client *c, uint8_t v)
{
	put(c, &v, 1);
}
static void put_u64(kiln_store_client *c, uint64_t v)
{
	put(c, &v, 8);
}
static void put_bytes(kiln_store_client *c, const void *p, size_t n)
{
	put_u64(c, n);
	if (n)
		put(c, p, n);
}
static void put_str(kiln_store_client *c, const char *s)
{
	put_bytes(c, s, strlen(s));
}

/* A request of an op and n keys (WAIT, CHECK, MULTI_GET). */
static void put_keys_op(kiln_store_client *c, uint8_t op, const char *const *keys, size_t n)
{
	put_u8(c, op);
	put_u64(c, n);
	for (size_t i = 0; i < n; i++)
		put_str(c, keys[i]);
}

/* ---- I/O with deadlines --------------------------------------------------- */

/* All n bytes sent (out) or received before deadline.  A peer that closes
 * (EOF, EPIPE) is -ECONNRESET. */
static int transfer_all(int fd, uint8_t *b, size_t n, uint64_t deadline, bool out)
{
	while (n > 0) {
		ssize_t k = out ? send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT)
				: recv(fd, b, n, MSG_DONTWAIT);
		if (k == 0 && !out)
			return -ECONNRESET;
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				int r = kiln_wait_fd(fd, out ? POLLOUT : POLLIN, deadline);
				if (r < 0)
					return r;
				continue;
			}
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		b += k;
		n -= (size_t) k;
	}
	return 0;
}

static int send_all(int fd, const void *p, size_t n, uint64_t deadline)
{
	return transfer_all(fd, (uint8_t *) p, n, deadline, true); /* send() only reads */
}

static int recv_all(int fd, void *p, size_t n, uint64_t deadline)
{
	return transfer_all(fd, p, n, deadline, false);
}

static int fail(kiln_store_client *c, int r)
{
	c->broken = true;
	return r;
}

static uint64_t deadline_in(uint64_t usec)
{
	uint64_t now = kiln_now_usec();
	return usec > UINT64_MAX - now ? UINT64_MAX : now + usec;
}

/* Sends the request built in c->buf. */
static int flush_req(kiln_store_client *c, uint64_t deadline)
{
	int r = c->err;
	size_t n = c->len;
	c->len = 0;
	c->err = 0;
	if (r < 0)
		return r;
	r = send_all(c->fd, c->buf, n, deadline);
	return r < 0 ? fail(c, r) : 0;
}

static int recv_val(kiln_store_client *c, void *p, size_t n, uint64_t deadline)
{
	int r = recv_all(c->fd, p, n, deadline);
	return r < 0 ? fail(c, r) : 0;
}

static int recv_vec(kiln_store_client *c, void **ret, size_t *ret_len, uint64_t deadline)
{
	uint64_t n;
	int r = recv_val(c, &n, 8, deadline);
	if (r < 0)
		return r;
	if (n > KILN_STORE_VALUE_MAX)
		return fail(c, -EPROTO);
	uint8_t *p = malloc((size_t) n + 1);
	if (!p)
		return fail(c, -ENOMEM);
	r = recv_val(c, p, (size_t) n, deadline);
	if (r < 0) {
		free(p);
		return r;
	}
	p[n] = 0;
	if (ret)
		*ret = p;
	else
		free(p);
	if (ret_len)
		*ret_len = (size_t) n;
	return 0;
}

/* ---- argument checks ------------------------------------------------------ */

static int check_conn(const kiln_store_client *c)
{
	assert_return(c, -EINVAL);
	return c->broken ? -ENOTCONN : 0;
}

static int check_key(const kiln_store_client *c, const char *key)
{
	assert_return(key && key[0], -EINVAL);
	if (strlen(key) > KILN_STORE_KEY_MAX)
		return -E2BIG;
	if (!c->auth && startswith(key, KILN_STORE_CONTROL_PREFIX))
		return -EACCES;
	return 0;
}

static int check_keys(const kiln_store_client *c, const char *const *keys, size_t n)
{
	assert_return(keys && n > 0, -EINVAL);
	if (n > KILN_STORE_MULTI_MAX)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		int r = check_key(c, keys[i]);
		if (r < 0)
			return r;
	}
	return 0;
}

#define CHECK(expr)                 \
	do {                        \
		int _r_ = (expr);   \
		if (_r_ < 0)        \
			return _r_; \
	} while (0)

/* ---- connect -------------------------------------------------------------- */

static int connect_one(const struct addrinfo *ai, uint64_t deadline, int *ret_fd)
{
	_cleanup_close_ int fd = socket(
		ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0)
		return -errno;
	int r = kiln_connect_deadline(fd, ai->ai_addr, ai->ai_addrlen, deadline);
	if (r < 0)
		return r;
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*ret_fd = TAKE_FD(fd);
	return 0;
}

int kiln_store_client_connect(const char *host, uint16_t port, const char *secret,
			      uint64_t timeout_usec, kiln_store_client **ret)
{
	assert_return(host && ret && port > 0 && timeout_usec > 0, -EINVAL);
	assert_return(!secret || strlen(secret) <= KILN_STORE_SECRET_MAX, -EINVAL);

	uint64_t deadline = deadline_in(timeout_usec);
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC };
	struct addrinfo *ai = NULL;
	int g = getaddrinfo(host, ps, &hints, &ai);
	if (g != 0)
		return g == EAI_MEMORY ? -ENOMEM : g == EAI_SYSTEM ? -errno : -EHOSTUNREACH;

	int fd = -1, r = -ETIMEDOUT;
	for (;;) {
		for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next)
			r = connect_one(a, deadline, &fd);
		if (fd >= 0 || r == -ETIMEDOUT || kiln_now_usec() + CONNECT_RETRY_USEC >= deadline)
			break;
		/* not up yet (refused), or a transient error: try again */
		usleep(CONNECT_RETRY_USEC);
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return r;

	kiln_store_client *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->fd = fd;
	c->timeout_usec = timeout_usec;

	put_u8(c, KILN_STORE_OP_VALIDATE);
	uint32_t magic = KILN_STORE_VALIDATE_MAGIC;
	put(c, &magic, 4);
	r = flush_req(c, deadline);
	/* A peer refused by the allow-list is accepted by the kernel and then
	 * closed: a round trip tells. */
	if (r >= 0)
		r = secret ? kiln_store_client_auth(c, secret) : kiln_store_client_ping(c, NULL);
	if (r < 0) {
		kiln_store_client_free(c);
		return r;
	}
	*ret = c;
	return 0;
}

void kiln_store_client_free(kiln_store_client *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c->buf);
	free(c);
}

int kiln_store_client_set_timeout(kiln_store_client *c, uint64_t timeout_usec)
{
	assert_return(c && timeout_usec > 0, -EINVAL);
	c->timeout_usec = timeout_usec;
	return 0;
}

bool kiln_store_client_authenticated(const kiln_store_client *c)
{
	return c && c->auth;
}

/* The auth handshakes: a COMPARE_SET of the reserved key with the
 * credential as its "expected" value; the server's reply (or its hang-up:
 * -EACCES) in *reply. */
static int auth_exchange(kiln_store_client *c, const char *key, const void *cred, size_t len,
			 char **reply, size_t *n)
{
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_COMPARE_SET);
	put_str(c, key);
	put_bytes(c, cred, len);
	put_bytes(c, NULL, 0);
	CHECK(flush_req(c, deadline));
	int r = recv_vec(c, (void **) reply, n, deadline);
	return r == -ECONNRESET ? -EACCES : r;
}

int kiln_store_client_auth(kiln_store_client *c, const char *secret)
{
	CHECK(check_conn(c));
	assert_return(secret && secret[0] && strlen(secret) <= KILN_STORE_SECRET_MAX, -EINVAL);
	_cleanup_free_ char *reply = NULL;
	size_t n;
	int r = auth_exchange(c, KILN_STORE_AUTH_KEY, secret, strlen(secret), &reply, &n);
	if (r < 0)
		return r;
	if (n == 2 && memcmp(reply, "ok", 2) == 0) {
		c->auth = true;
		return 0;
	}
	return fail(c, -EACCES);
}

int kiln_store_client_auth_token(kiln_store_client *c, const void *token, size_t len, void **ret,
				 size_t *ret_len)
{
	CHECK(check_conn(c));
	assert_return(token && len > 0 && len <= KILN_STORE_TOKEN_MAX && ret, -EINVAL);
	_cleanup_free_ char *reply = NULL;
	size_t n;
	int r = auth_exchange(c, KILN_STORE_TOKEN_KEY, token, len, &reply, &n);
	if (r < 0)
		return r;
	if (n < 3 || memcmp(reply, "ok:", 3) != 0)
		return fail(c, -EACCES);
	char *p = malloc(n - 3 + 1);
	if (!p)
		return fail(c, -ENOMEM);
	memcpy(p, reply + 3, n - 3);
	p[n - 3] = 0;
	c->auth = true;
	*ret = p;
	if (ret_len)
		*ret_len = n - 3;
	return 0;
}

/* ---- operations ----------------------------------------------------------- */

/* SET and APPEND: a key and a value, no reply. */
static int key_value_op(kiln_store_client *c, uint8_t op, const char *key, const void *value,
			size_t len)
{
	CHECK(check_conn(c));
	CHECK(check_key(c, key));
	assert_return(value || len == 0, -EINVAL);
	if (len > KILN_STORE_VALUE_MAX)
		return -E2BIG;
	put_u8(c, op);
	put_str(c, key);
	put_bytes(c, value, len);
	return flush_req(c, deadline_in(c->timeout_usec));
}

int kiln_store_client_set(kiln_store_client *c, const char *key, const void *value, size_t len)
{
	return key_value_op(c, KILN_STORE_OP_SET, key, value, len);
}

int kiln_store_client_append(kiln_store_client *c, const char *key, const void *value, size_t len)
{
	return key_value_op(c, KILN_STORE_OP_APPEND, key, value, len);
}

static int do_wait(kiln_store_client *c, const char *const *keys, size_t n, uint64_t timeout_usec)
{
	uint64_t deadline = deadline_in(timeout_usec);
	put_keys_op(c, KILN_STORE_OP_WAIT, keys, n);
	CHECK(flush_req(c, deadline));
	uint8_t v;
	int r = recv_all(c->fd, &v, 1, deadline);
	if (r == 0)
		return v == KILN_STORE_WAIT_STOP_WAITING ? 0 : fail(c, -EPROTO);
	if (r != -ETIMEDOUT)
		return fail(c, r);

	/* Timed out: cancel.  The server may have answered STOP_WAITING just
	 * before it saw the cancel; then WAIT_CANCELED follows it. */
	deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_CANCEL_WAIT);
	CHECK(flush_req(c, deadline));
	CHECK(recv_val(c, &v, 1, deadline));
	if (v == KILN_STORE_WAIT_CANCELED)
		return -ETIMEDOUT;
	if (v != KILN_STORE_WAIT_STOP_WAITING)
		return fail(c, -EPROTO);
	CHECK(recv_val(c, &v, 1, deadline));
	return v == KILN_STORE_WAIT_CANCELED ? 0 : fail(c, -EPROTO);
}

int kiln_store_client_wait(kiln_store_client *c, const char *const *keys, size_t n,
			   uint64_t timeout_usec)
{
	CHECK(check_conn(c));
	CHECK(check_keys(c, keys, n));
	return do_wait(c, keys, n, timeout_usec ? timeout_usec : c->timeout_usec);
}

static int do_get(kiln_store_client *c, const char *key, void **ret, size_t *ret_len)
{
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_GET);
	put_str(c, key);
	CHECK(flush_req(c, deadline));
	return recv_vec(c, ret, ret_len, deadline);
}

int kiln_store_client_get(kiln_store_client *c, const char *key, void **ret, size_t *ret_len)
{
	CHECK(check_conn(c));
	CHECK(check_key(c, key));
	assert_return(ret, -EINVAL);
	CHECK(do_wait(c, &key, 1, c->timeout_usec));
	return do_get(c, key, ret, ret_len);
}

int kiln_store_client_check(kiln_store_client *c, const char *const *keys, size_t n)
{
	CHECK(check_conn(c));
	CHECK(check_keys(c, keys, n));
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_keys_op(c, KILN_STORE_OP_CHECK, keys, n);
	CHECK(flush_req(c, deadline));
	uint8_t v;
	CHECK(recv_val(c, &v, 1, deadline));
	if (v == KILN_STORE_CHECK_READY)
		return 1;
	if (v == KILN_STORE_CHECK_NOT_READY)
		return 0;
	return fail(c, -EPROTO);
}

int kiln_store_client_try_get(kiln_store_client *c, const char *key, void **ret, size_t *ret_len)
{
	assert_return(ret, -EINVAL);
	int r = kiln_store_client_check(c, &key, 1);
	if (r < 0)
		return r;
	if (r == 0)
		return -ENOENT;
	return do_get(c, key, ret, ret_len);
}

int kiln_store_client_add(kiln_store_client *c, const char *key, int64_t delta, int64_t *ret)
{
	CHECK(check_conn(c));
	CHECK(check_key(c, key));
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_ADD);
	put_str(c, key);
	put(c, &delta, 8);
	CHECK(flush_req(c, deadline));
	int64_t v;
	CHECK(recv_val(c, &v, 8, deadline));
	if (ret)
		*ret = v;
	return 0;
}

int kiln_store_client_compare_set(kiln_store_client *c, const char *key, const void *expected,
				  size_t elen, const void *desired, size_t dlen, void **ret,
				  size_t *ret_len)
{
	CHECK(check_conn(c));
	CHECK(check_key(c, key));
	assert_return((expected || elen == 0) && (desired || dlen == 0), -EINVAL);
	if (elen > KILN_STORE_VALUE_MAX || dlen > KILN_STORE_VALUE_MAX)
		return -E2BIG;
	if (streq(key, KILN_STORE_AUTH_KEY))
		return -EINVAL;
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_COMPARE_SET);
	put_str(c, key);
	put_bytes(c, expected, elen);
	put_bytes(c, desired, dlen);
	CHECK(flush_req(c, deadline));
	return recv_vec(c, ret, ret_len, deadline);
}

int kiln_store_client_delete(kiln_store_client *c, const char *key)
{
	CHECK(check_conn(c));
	CHECK(check_key(c, key));
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_DELETE_KEY);
	put_str(c, key);
	CHECK(flush_req(c, deadline));
	int64_t v;
	CHECK(recv_val(c, &v, 8, deadline));
	return v > 0 ? 1 : 0;
}

int kiln_store_client_num_keys(kiln_store_client *c, int64_t *ret)
{
	CHECK(check_conn(c));
	assert_return(ret, -EINVAL);
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_GETNUMKEYS);
	CHECK(flush_req(c, deadline));
	return recv_val(c, ret, 8, deadline);
}

int kiln_store_client_multi_get(kiln_store_client *c, const char *const *keys, size_t n,
				kiln_store_value *ret)
{
	CHECK(check_conn(c));
	CHECK(check_keys(c, keys, n));
	assert_return(ret, -EINVAL);
	CHECK(do_wait(c, keys, n, c->timeout_usec));
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_keys_op(c, KILN_STORE_OP_MULTI_GET, keys, n);
	CHECK(flush_req(c, deadline));
	memset(ret, 0, n * sizeof(*ret));
	for (size_t i = 0; i < n; i++) {
		int r = recv_vec(c, &ret[i].data, &ret[i].len, deadline);
		if (r < 0) {
			kiln_store_values_free(ret, i);
			return r;
		}
	}
	return 0;
}

int kiln_store_client_multi_set(kiln_store_client *c, const char *const *keys,
				const kiln_store_value *values, size_t n)
{
	CHECK(check_conn(c));
	CHECK(check_keys(c, keys, n));
	assert_return(values, -EINVAL);
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		assert_return(values[i].data || values[i].len == 0, -EINVAL);
		if (values[i].len > KILN_STORE_VALUE_MAX)
			return -E2BIG;
		total += values[i].len + strlen(keys[i]) + 16;
	}
	/* the server takes at most one connection buffer per request */
	if (total + 16 > KILN_STORE_CONN_BUF_MAX)
		return -E2BIG;
	put_u8(c, KILN_STORE_OP_MULTI_SET);
	put_u64(c, n);
	for (size_t i = 0; i < n; i++) {
		put_str(c, keys[i]);
		put_bytes(c, values[i].data, values[i].len);
	}
	return flush_req(c, deadline_in(c->timeout_usec));
}

int kiln_store_client_ping(kiln_store_client *c, uint64_t *ret_usec)
{
	CHECK(check_conn(c));
	uint32_t nonce, echo;
	if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != sizeof(nonce))
		nonce = (uint32_t) kiln_now_usec();
	uint64_t start = kiln_now_usec();
	uint64_t deadline = deadline_in(c->timeout_usec);
	put_u8(c, KILN_STORE_OP_PING);
	put(c, &nonce, 4);
	CHECK(flush_req(c, deadline));
	CHECK(recv_val(c, &echo, 4, deadline));
	if (echo != nonce)
		return fail(c, -EPROTO);
	if (ret_usec)
		*ret_usec = kiln_now_usec() - start;
	return 0;
}

void kiln_store_values_free(kiln_store_value *v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++) {
		free(v[i].data);
		v[i].data = NULL;
		v[i].len = 0;
	}
}
