/* test-store.c — unit and loopback tests of the kiln store: the pure parser,
 * every operation through the C client against a live server thread, WAIT
 * wake-ups and cancellation, the job secret, the peer allow-list, the
 * limits, the in-process accessors and the caller-driven event loop. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/store.h"
#include "store-proto.h"

#define SEC    1000000ull
#define SECRET "0123456789abcdef-job-secret"

/* ---- helpers -------------------------------------------------------------- */

static kiln_store_server *server_up(const kiln_store_server_opts *o)
{
	kiln_store_server *s = NULL;
	assert_int_equal(kiln_store_server_new(o, &s), 0);
	assert_true(kiln_store_server_port(s) > 0);
	assert_int_equal(kiln_store_server_start(s), 0);
	return s;
}

static kiln_store_server *default_server(void)
{
	kiln_store_server_opts o;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	o.secret = SECRET;
	return server_up(&o);
}

static kiln_store_client *client(kiln_store_server *s, const char *secret)
{
	kiln_store_client *c = NULL;
	assert_int_equal(kiln_store_client_connect("127.0.0.1", kiln_store_server_port(s), secret,
						   5 * SEC, &c),
			 0);
	return c;
}

static int raw_connect(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	struct timeval tv = { .tv_sec = 5 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* True when the server closed fd (EOF or reset) within the receive timeout. */
static bool raw_closed(int fd)
{
	char b[64];
	for (;;) {
		ssize_t n = recv(fd, b, sizeof(b), 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
		if (n < 0)
			return false;
	}
}

static void put_str(uint8_t **p, const char *s)
{
	uint64_t n = strlen(s);
	memcpy(*p, &n, 8);
	memcpy(*p + 8, s, n);
	*p += 8 + n;
}

/* ---- parser --------------------------------------------------------------- */

static const kiln_store_limits lim = {
	.max_key = 64, .max_value = 1024, .max_multi = 4, .max_msg = 4096
};

static void test_parse_dialects(void **state)
{
	uint8_t b[256], *p;
	kiln_store_msg m;
	size_t used;
	kiln_store_dialect d = KILN_STORE_DIALECT_UNKNOWN;

	/* torch 2.x: VALIDATE + magic, then op numbers of kiln_store_op */
	b[0] = 0;
	uint32_t magic = KILN_STORE_VALIDATE_MAGIC;
	memcpy(b + 1, &magic, 4);
	assert_int_equal(kiln_store_parse(b, 3, &d, &lim, &m, &used), 0);
	assert_int_equal(d, KILN_STORE_DIALECT_UNKNOWN);
	assert_int_equal(kiln_store_parse(b, 5, &d, &lim, &m, &used), 1);
	assert_int_equal(d, KILN_STORE_DIALECT_V2);
	assert_int_equal(m.op, KILN_STORE_OP_VALIDATE);
	assert_int_equal(used, 5);
	/* a second VALIDATE is an error */
	assert_int_equal(kiln_store_parse(b, 5, &d, &lim, &m, &used), -EBADMSG);
	p = b;
	*p++ = 3; /* GET in 2.x */
	put_str(&p, "/k");
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b), &d, &lim, &m, &used), 1);
	assert_int_equal(m.op, KILN_STORE_OP_GET);
	assert_int_equal(m.key.len, 2);
	assert_memory_equal(m.key.p, "/k", 2);
	/* every truncation needs more bytes */
	for (size_t i = 0; i < (size_t) (p - b); i++)
		assert_int_equal(kiln_store_parse(b, i, &d, &lim, &m, &used), 0);

	/* torch 1.13: no VALIDATE; SET=0 ... GET=2, WATCH_KEY=7 unsupported */
	d = KILN_STORE_DIALECT_UNKNOWN;
	p = b;
	*p++ = 0;
	put_str(&p, "/k");
	put_str(&p, "v");
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b), &d, &lim, &m, &used), 1);
	assert_int_equal(d, KILN_STORE_DIALECT_V1);
	assert_int_equal(m.op, KILN_STORE_OP_SET);
	assert_int_equal(used, (size_t) (p - b));
	assert_memory_equal(m.value.p, "v", 1);
	b[0] = 2;
	p = b + 1;
	put_str(&p, "/k");
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b), &d, &lim, &m, &used), 1);
	assert_int_equal(m.op, KILN_STORE_OP_GET);
	b[0] = 7;
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b), &d, &lim, &m, &used), -EBADMSG);
	b[0] = 9; /* APPEND does not exist in 1.13 */
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b), &d, &lim, &m, &used), -EBADMSG);
}

static void test_parse_limits(void **state)
{
	uint8_t b[64];
	kiln_store_msg m;
	size_t used;
	kiln_store_dialect d = KILN_STORE_DIALECT_V2;

	/* a key length of 2^63 is rejected as soon as the length is read */
	b[0] = KILN_STORE_OP_SET;
	uint64_t huge = 1ull << 63;
	memcpy(b + 1, &huge, 8);
	assert_int_equal(kiln_store_parse(b, 9, &d, &lim, &m, &used), -E2BIG);
	/* value over max_value */
	uint8_t *p = b + 1;
	put_str(&p, "k");
	uint64_t big = lim.max_value + 1;
	memcpy(p, &big, 8);
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b) + 8, &d, &lim, &m, &used), -E2BIG);
	/* too many keys */
	b[0] = KILN_STORE_OP_WAIT;
	uint64_t n = lim.max_multi + 1;
	memcpy(b + 1, &n, 8);
	assert_int_equal(kiln_store_parse(b, 9, &d, &lim, &m, &used), -E2BIG);
	/* a message over max_msg as a whole (each part within limits) */
	kiln_store_limits small = lim;
	small.max_msg = 32;
	b[0] = KILN_STORE_OP_SET;
	p = b + 1;
	put_str(&p, "key");
	uint64_t vl = 100;
	memcpy(p, &vl, 8);
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b) + 8, &d, &small, &m, &used),
			 -EMSGSIZE);
	/* unknown op */
	b[0] = 200;
	assert_int_equal(kiln_store_parse(b, 1, &d, &lim, &m, &used), -EBADMSG);
}

static void test_parse_multi(void **state)
{
	uint8_t b[256], *p = b;
	kiln_store_msg m;
	size_t used;
	kiln_store_dialect d = KILN_STORE_DIALECT_V2;
	*p++ = KILN_STORE_OP_MULTI_SET;
	uint64_t n = 2;
	memcpy(p, &n, 8);
	p += 8;
	put_str(&p, "a");
	put_str(&p, "1");
	put_str(&p, "bb");
	put_str(&p, "22");
	assert_int_equal(kiln_store_parse(b, (size_t) (p - b), &d, &lim, &m, &used), 1);
	assert_int_equal(m.n, 2);
	kiln_store_items it;
	kiln_store_slice k, v;
	kiln_store_items_init(&it, &m);
	assert_true(kiln_store_items_next(&it, &k, &v));
	assert_int_equal(k.len, 1);
	assert_memory_equal(v.p, "1", 1);
	assert_true(kiln_store_items_next(&it, &k, &v));
	assert_memory_equal(k.p, "bb", 2);
	assert_memory_equal(v.p, "22", 2);
	assert_false(kiln_store_items_next(&it, &k, &v));
}

/* ---- every operation ------------------------------------------------------ */

static void test_ops(void **state)
{
	kiln_store_server *s = default_server();
	kiln_store_client *c = client(s, NULL);
	void *v = NULL;
	size_t n = 0;
	int64_t x;

	assert_false(kiln_store_client_authenticated(c));
	assert_int_equal(kiln_store_client_set(c, "a", "hello", 5), 0);
	assert_int_equal(kiln_store_client_get(c, "a", &v, &n), 0);
	assert_int_equal(n, 5);
	assert_string_equal(v, "hello");
	free(v);
	/* binary values with NULs survive */
	assert_int_equal(kiln_store_client_set(c, "bin", "\0\1\2\0", 4), 0);
	assert_int_equal(kiln_store_client_try_get(c, "bin", &v, &n), 0);
	assert_int_equal(n, 4);
	assert_memory_equal(v, "\0\1\2\0", 4);
	free(v);
	assert_int_equal(kiln_store_client_try_get(c, "missing", &v, &n), -ENOENT);

	assert_int_equal(kiln_store_client_add(c, "ctr", 5, &x), 0);
	assert_int_equal(x, 5);
	assert_int_equal(kiln_store_client_add(c, "ctr", -7, &x), 0);
	assert_int_equal(x, -2);
	assert_int_equal(kiln_store_client_get(c, "ctr", &v, &n), 0);
	assert_string_equal(v, "-2");
	free(v);

	const char *ks[] = { "a", "ctr", "nope" };
	assert_int_equal(kiln_store_client_check(c, ks, 2), 1);
	assert_int_equal(kiln_store_client_check(c, ks, 3), 0);

	/* compare_set: match, mismatch, missing with empty expected, missing
	 * with non-empty expected (torch returns expected) */
	assert_int_equal(kiln_store_client_compare_set(c, "a", "hello", 5, "world", 5, &v, &n), 0);
	assert_string_equal(v, "world");
	free(v);
	assert_int_equal(kiln_store_client_compare_set(c, "a", "xx", 2, "yy", 2, &v, &n), 0);
	assert_string_equal(v, "world");
	free(v);
	assert_int_equal(kiln_store_client_compare_set(c, "cs", "", 0, "new", 3, &v, &n), 0);
	assert_string_equal(v, "new");
	free(v);
	assert_int_equal(kiln_store_client_compare_set(c, "cs2", "exp", 3, "new", 3, &v, &n), 0);
	assert_string_equal(v, "exp");
	free(v);
	assert_int_equal(kiln_store_client_check(c, (const char *[]){ "cs2" }, 1), 0);

	assert_int_equal(kiln_store_client_num_keys(c, &x), 0);
	assert_int_equal(x, 4); /* a bin ctr cs */
	assert_int_equal(kiln_store_client_delete(c, "bin"), 1);
	assert_int_equal(kiln_store_client_delete(c, "bin"), 0);
	assert_int_equal(kiln_store_client_num_keys(c, &x), 0);
	assert_int_equal(x, 3);

	assert_int_equal(kiln_store_client_append(c, "log", "ab", 2), 0);
	assert_int_equal(kiln_store_client_append(c, "log", "cd", 2), 0);
	assert_int_equal(kiln_store_client_get(c, "log", &v, &n), 0);
	assert_string_equal(v, "abcd");
	free(v);

	const char *mk[] = { "m1", "m2", "m3" };
	kiln_store_value mv[3] = { { "one", 3 }, { "", 0 }, { "three", 5 } };
	assert_int_equal(kiln_store_client_multi_set(c, mk, mv, 3), 0);
	kiln_store_value got[3];
	assert_int_equal(kiln_store_client_multi_get(c, mk, 3, got), 0);
	assert_string_equal(got[0].data, "one");
	assert_int_equal(got[1].len, 0);
	assert_string_equal(got[2].data, "three");
	kiln_store_values_free(got, 3);

	uint64_t rtt = 0;
	assert_int_equal(kiln_store_client_ping(c, &rtt), 0);
	assert_true(rtt > 0 && rtt < SEC);

	/* the in-process view sees what remote clients wrote, and back */
	assert_int_equal(kiln_store_server_get(s, "log", &v, &n), 0);
	assert_string_equal(v, "abcd");
	free(v);
	assert_int_equal(kiln_store_server_set(s, "srv", "x", 1), 0);
	assert_int_equal(kiln_store_client_get(c, "srv", &v, &n), 0);
	assert_string_equal(v, "x");
	free(v);

	/* argument errors never reach the wire */
	assert_int_equal(kiln_store_client_set(c, "", "x", 1), -EINVAL);
	assert_int_equal(kiln_store_client_set(c, "k", NULL, 1), -EINVAL);
	assert_int_equal(kiln_store_client_ping(c, NULL), 0);

	kiln_store_client_free(c);
	kiln_store_server_free(s);
}

/* ---- waiting -------------------------------------------------------------- */

typedef struct waiter {
	kiln_store_server *s;
	const char *key;
	int r;
	uint64_t woke;
	char *value;
} waiter;

static void *wait_thread(void *p)
{
	waiter *w = p;
	kiln_store_client *c = client(w->s, NULL);
	const char *keys[] = { w->key, "also" };
	w->r = kiln_store_client_wait(c, keys, 2, 10 * SEC);
	w->woke = kiln_now_usec();
	if (w->r == 0) {
		size_t n;
		w->r = kiln_store_client_get(c, w->key, (void **) &w->value, &n);
	}
	kiln_store_client_free(c);
	return NULL;
}

static void test_wait_wakes_on_set(void **state)
{
	kiln_store_server *s = default_server();
	kiln_store_client *c = client(s, NULL);
	waiter w[3] = { { .s = s, .key = "go" },
			{ .s = s, .key = "go" },
			{ .s = s, .key = "go2" } };
	pthread_t t[3];
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&t[i], NULL, wait_thread, &w[i]), 0);
	usleep(200 * 1000);
	/* still waiting: one of two keys is not enough */
	assert_int_equal(kiln_store_client_set(c, "also", "1", 1), 0);
	usleep(100 * 1000);
	for (int i = 0; i < 3; i++)
		assert_int_equal(w[i].woke, 0);
	uint64_t t0 = kiln_now_usec();
	assert_int_equal(kiln_store_client_set(c, "go", "now", 3), 0);	  /* remote SET */
	assert_int_equal(kiln_store_server_set(s, "go2", "later", 5), 0); /* in-process SET */
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(w[i].r, 0);
		assert_true(w[i].woke >= t0);
		assert_true(w[i].woke - t0 < SEC);
	}
	assert_string_equal(w[0].value, "now");
	assert_string_equal(w[2].value, "later");
	for (int i = 0; i < 3; i++)
		free(w[i].value);
	kiln_store_client_free(c);
	kiln_store_server_free(s);
}

static void test_wait_timeout_cancels(void **state)
{
	kiln_store_server *s = default_server();
	kiln_store_client *c = client(s, NULL);
	const char *k[] = { "never" };
	uint64_t t0 = kiln_now_usec();
	assert_int_equal(kiln_store_client_wait(c, k, 1, 200 * 1000), -ETIMEDOUT);
	uint64_t dt = kiln_now_usec() - t0;
	assert_true(dt >= 200 * 1000 && dt < 2 * SEC);
	/* the connection is still in sync after CANCEL_WAIT */
	assert_int_equal(kiln_store_client_ping(c, NULL), 0);
	/* a later SET of the cancelled key must not send a stray
	 * STOP_WAITING that would corrupt the next reply */
	assert_int_equal(kiln_store_server_set(s, "never", "1", 1), 0);
	int64_t x;
	assert_int_equal(kiln_store_client_add(c, "n", 41, &x), 0);
	assert_int_equal(x, 41);
	/* get() times out the same way on a missing key */
	kiln_store_client_set_timeout(c, 150 * 1000);
	void *v;
	size_t n;
	assert_int_equal(kiln_store_client_get(c, "missing", &v, &n), -ETIMEDOUT);
	assert_int_equal(kiln_store_client_ping(c, NULL), 0);
	kiln_store_client_free(c);
	kiln_store_server_free(s);
}

/* ---- secret ---------------------------------------------------------------- */

static void test_secret(void **state)
{
	kiln_store_server *s = default_server();
	kiln_store_client *c = NULL;
	kiln_store_server_stats st;

	/* wrong secret: refused and closed */
	assert_int_equal(kiln_store_client_connect("127.0.0.1", kiln_store_server_port(s), "wrong",
						   5 * SEC, &c),
			 -EACCES);
	/* right secret: control keys work */
	kiln_store_client *a = client(s, SECRET);
	assert_true(kiln_store_client_authenticated(a));
	assert_int_equal(kiln_store_client_set(a, "/kiln/rdzv/round", "3", 1), 0);
	int64_t x;
	assert_int_equal(kiln_store_client_add(a, "/kiln/rdzv/joined", 1, &x), 0);

	/* no secret: control keys refused client-side, worker keys fine */
	kiln_store_client *u = client(s, NULL);
	void *v;
	size_t n;
	assert_int_equal(kiln_store_client_get(u, "/kiln/rdzv/round", &v, &n), -EACCES);
	assert_int_equal(kiln_store_client_set(u, "/worker/attempt_0/x", "1", 1), 0);
	/* authenticate later on the same connection */
	assert_int_equal(kiln_store_client_auth(u, SECRET), 0);
	assert_int_equal(kiln_store_client_get(u, "/kiln/rdzv/round", &v, &n), 0);
	assert_string_equal(v, "3");
	free(v);

	/* a raw (PyTorch-like) connection touching a control key is closed */
	kiln_store_server_get_stats(s, &st);
	uint64_t before = st.dropped_auth;
	int fd = raw_connect(kiln_store_server_port(s));
	uint8_t b[128], *p = b;
	*p++ = 2; /* torch 1.13 GET */
	put_str(&p, "/kiln/rdzv/round");
	assert_int_equal(send(fd, b, (size_t) (p - b), MSG_NOSIGNAL), p - b);
	assert_true(raw_closed(fd));
	close(fd);
	/* and so is one that CHECKs/WAITs on one among others */
	fd = raw_connect(kiln_store_server_port(s));
	p = b;
	*p++ = 0;
	uint32_t magic = KILN_STORE_VALIDATE_MAGIC;
	memcpy(p, &magic, 4);
	p += 4;
	*p++ = KILN_STORE_OP_WAIT;
	uint64_t cnt = 2;
	memcpy(p, &cnt, 8);
	p += 8;
	put_str(&p, "/worker/x");
	put_str(&p, "/kiln/rdzv/round");
	assert_int_equal(send(fd, b, (size_t) (p - b), MSG_NOSIGNAL), p - b);
	assert_true(raw_closed(fd));
	close(fd);
	kiln_store_server_get_stats(s, &st);
	assert_int_equal(st.dropped_auth, before + 2);
	/* the store still serves */
	assert_int_equal(kiln_store_client_ping(a, NULL), 0);
	kiln_store_client_free(a);
	kiln_store_client_free(u);
	kiln_store_server_free(s);

	/* a server without a secret: nobody gets in remotely */
	kiln_store_server_opts o;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	s = server_up(&o);
	assert_int_equal(kiln_store_client_connect("127.0.0.1", kiln_store_server_port(s), SECRET,
						   5 * SEC, &c),
			 -EACCES);
	/* but the hosting agent still reaches control keys in-process */
	assert_int_equal(kiln_store_server_set(s, "/kiln/x", "1", 1), 0);
	kiln_store_server_free(s);
}

/* ---- allow-list ------------------------------------------------------------ */

/* A token hook like kiln-run's MUNGE one: "good-token" gets the secret. */
static int token_hook(const void *token, size_t len, void **reply, size_t *reply_len,
		      void *userdata)
{
	if (len != strlen("good-token") || memcmp(token, "good-token", len) != 0)
		return -EACCES;
	*reply = strdup(userdata);
	*reply_len = strlen(userdata);
	return 0;
}

static void test_token_and_require_auth(void **state)
{
	kiln_store_server_opts o;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	o.secret = SECRET;
	o.require_auth = true;
	o.token_auth = token_hook;
	o.token_auth_userdata = (void *) SECRET;
	kiln_store_server *s = server_up(&o);
	void *v;
	size_t n;

	/* require_auth: connect (VALIDATE + PING) works, any key closes */
	kiln_store_client *u = client(s, NULL);
	assert_int_equal(kiln_store_client_try_get(u, "/worker/x", &v, &n), -ECONNRESET);
	kiln_store_client_free(u);

	/* a good token authenticates and returns the hook's answer */
	u = client(s, NULL);
	assert_int_equal(kiln_store_client_auth_token(u, "good-token", 10, &v, &n), 0);
	assert_int_equal(n, strlen(SECRET));
	assert_string_equal(v, SECRET);
	free(v);
	assert_true(kiln_store_client_authenticated(u));
	assert_int_equal(kiln_store_client_set(u, "/kiln/ctl", "1", 1), 0);
	assert_int_equal(kiln_store_client_set(u, "/worker/x", "1", 1), 0);
	kiln_store_client_free(u);

	/* a bad one is refused and the connection closed */
	u = client(s, NULL);
	assert_int_equal(kiln_store_client_auth_token(u, "bad-token", 9, &v, &n), -EACCES);
	assert_int_equal(kiln_store_client_ping(u, NULL), -ENOTCONN);
	kiln_store_client_free(u);

	/* the secret still works beside tokens */
	u = client(s, SECRET);
	assert_int_equal(kiln_store_client_get(u, "/kiln/ctl", &v, &n), 0);
	free(v);
	kiln_store_client_free(u);

	/* a server without a hook refuses every token */
	kiln_store_server *plain = default_server();
	u = client(plain, NULL);
	assert_int_equal(kiln_store_client_auth_token(u, "good-token", 10, &v, &n), -EACCES);
	kiln_store_client_free(u);
	kiln_store_server_free(plain);
	kiln_store_server_free(s);
}

static void test_allow_list(void **state)
{
	kiln_store_server_opts o;
	kiln_store_client *c = NULL;
	kiln_store_server_stats st;
	uint32_t other[] = { 0x0a000001 /* 10.0.0.1 */ };

	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	o.allow_loopback = false;
	o.allow = other;
	o.n_allow = 1;
	kiln_store_server *s = server_up(&o);
	int r = kiln_store_client_connect("127.0.0.1", kiln_store_server_port(s), NULL, 2 * SEC,
					  &c);
	assert_true(r == -ECONNRESET || r == -EPIPE);
	kiln_store_server_get_stats(s, &st);
	assert_int_equal(st.refused_peers, 1);
	assert_int_equal(st.connections, 0);
	kiln_store_server_free(s);

	/* listed explicitly */
	uint32_t lo[] = { 0x7f000001 };
	o.allow = lo;
	s = server_up(&o);
	c = client(s, NULL);
	assert_int_equal(kiln_store_client_ping(c, NULL), 0);
	kiln_store_client_free(c);
	kiln_store_server_free(s);

	/* loopback allowed by default */
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	s = server_up(&o);
	c = client(s, NULL);
	kiln_store_client_free(c);
	kiln_store_server_free(s);
}

/* ---- limits ---------------------------------------------------------------- */

static void test_limits(void **state)
{
	kiln_store_server_opts o;
	kiln_store_server_stats st;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	o.max_total_bytes = 1000;
	o.max_conns = 3;
	kiln_store_server *s = server_up(&o);

	kiln_store_client *c = client(s, NULL);
	/* client-side caps */
	_cleanup_free_ char *longkey = malloc(KILN_STORE_KEY_MAX + 2);
	memset(longkey, 'k', KILN_STORE_KEY_MAX + 1);
	longkey[KILN_STORE_KEY_MAX + 1] = 0;
	assert_int_equal(kiln_store_client_set(c, longkey, "x", 1), -E2BIG);
	static char big[2000];
	assert_int_equal(kiln_store_client_set(c, "k", big, KILN_STORE_VALUE_MAX + 1), -E2BIG);

	/* store total: the writer over the limit is dropped, the data stays */
	assert_int_equal(kiln_store_client_set(c, "fits", big, 500), 0);
	assert_int_equal(kiln_store_client_set(c, "toobig", big, 600), 0); /* no reply to SET ... */
	assert_int_equal(kiln_store_client_ping(c, NULL), -ECONNRESET); /* ... but the drop shows */
	kiln_store_client_free(c);
	assert_int_equal(kiln_store_server_set(s, "inproc", big, 600), -ENOSPC);
	kiln_store_server_get_stats(s, &st);
	assert_int_equal(st.keys, 1);
	assert_true(st.store_bytes <= 1000);
	assert_int_equal(st.dropped_limits, 1);

	/* the store still serves; max_conns is enforced at accept */
	kiln_store_client *cs[3];
	for (int i = 0; i < 3; i++)
		cs[i] = client(s, NULL);
	kiln_store_client *extra = NULL;
	int r = kiln_store_client_connect("127.0.0.1", kiln_store_server_port(s), NULL, 2 * SEC,
					  &extra);
	assert_true(r == -ECONNRESET || r == -EPIPE);
	for (int i = 0; i < 3; i++)
		kiln_store_client_free(cs[i]);

	/* a length of 2^63 drops the connection at once */
	usleep(100 * 1000);
	int fd = raw_connect(kiln_store_server_port(s));
	uint8_t b[16];
	b[0] = 0; /* torch 1.13 SET */
	uint64_t huge = 1ull << 63;
	memcpy(b + 1, &huge, 8);
	assert_int_equal(send(fd, b, 9, MSG_NOSIGNAL), 9);
	assert_true(raw_closed(fd));
	close(fd);
	c = client(s, NULL);
	assert_int_equal(kiln_store_client_ping(c, NULL), 0);
	kiln_store_client_free(c);
	kiln_store_server_free(s);
}

/* Waits on many missing keys ("ghost" entries) count against the store
 * limit; the connection that crosses it is dropped and everything it held
 * is released. */
static void test_wait_flood_bounded(void **state)
{
	kiln_store_server_opts o;
	kiln_store_server_stats st;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	o.max_total_bytes = 20000;
	kiln_store_server *s = server_up(&o);

	int fd = raw_connect(kiln_store_server_port(s));
	static uint8_t b[64 * 1024];
	uint8_t *p = b;
	*p++ = 0;
	uint32_t magic = KILN_STORE_VALIDATE_MAGIC;
	memcpy(p, &magic, 4);
	p += 4;
	*p++ = KILN_STORE_OP_WAIT;
	uint64_t cnt = 200;
	memcpy(p, &cnt, 8);
	p += 8;
	char k[128];
	for (int i = 0; i < 200; i++) {
		snprintf(k, sizeof(k), "/worker/ghost/%0100d", i);
		put_str(&p, k);
	}
	assert_int_equal(send(fd, b, (size_t) (p - b), MSG_NOSIGNAL), p - b);
	assert_true(raw_closed(fd));
	close(fd);
	kiln_store_server_get_stats(s, &st);
	assert_int_equal(st.dropped_limits, 1);
	assert_int_equal(st.store_bytes, 0);

	/* a wait that fits is served and released the same way */
	kiln_store_client *c = client(s, NULL);
	const char *keys[] = { "/worker/a", "/worker/b" };
	assert_int_equal(kiln_store_client_wait(c, keys, 2, 50 * 1000), -ETIMEDOUT);
	kiln_store_server_get_stats(s, &st);
	assert_int_equal(st.store_bytes, 0);
	kiln_store_client_free(c);
	kiln_store_server_free(s);
}

/* A WAIT naming the same missing key twice is woken by one SET, and a
 * large WAIT of distinct keys registers each once. */
static void test_wait_duplicates(void **state)
{
	kiln_store_server *s = default_server();
	int fd = raw_connect(kiln_store_server_port(s));
	static uint8_t b[200000];
	uint8_t *p = b;
	*p++ = 0;
	uint32_t magic = KILN_STORE_VALIDATE_MAGIC;
	memcpy(p, &magic, 4);
	p += 4;
	*p++ = KILN_STORE_OP_WAIT;
	uint64_t cnt = 3;
	memcpy(p, &cnt, 8);
	p += 8;
	put_str(&p, "/dup");
	put_str(&p, "/dup");
	put_str(&p, "/dup");
	assert_int_equal(send(fd, b, (size_t) (p - b), MSG_NOSIGNAL), p - b);
	usleep(50 * 1000);
	assert_int_equal(kiln_store_server_set(s, "/dup", "1", 1), 0);
	uint8_t r;
	assert_int_equal(recv(fd, &r, 1, 0), 1);
	assert_int_equal(r, KILN_STORE_WAIT_STOP_WAITING);

	/* 10000 distinct missing keys (a pathological WAIT) is handled
	 * promptly and cancelled cleanly */
	p = b;
	*p++ = KILN_STORE_OP_WAIT;
	cnt = 10000;
	memcpy(p, &cnt, 8);
	p += 8;
	char k[32];
	for (int i = 0; i < 10000; i++) {
		snprintf(k, sizeof(k), "/w/%d", i);
		put_str(&p, k);
	}
	*p++ = KILN_STORE_OP_CANCEL_WAIT;
	uint64_t t0 = kiln_now_usec();
	assert_int_equal(send(fd, b, (size_t) (p - b), MSG_NOSIGNAL), p - b);
	assert_int_equal(recv(fd, &r, 1, MSG_WAITALL), 1);
	assert_int_equal(r, KILN_STORE_WAIT_CANCELED);
	assert_true(kiln_now_usec() - t0 < SEC);
	kiln_store_server_stats st;
	kiln_store_server_get_stats(s, &st);
	assert_int_equal(st.keys, 1);
	close(fd);
	kiln_store_server_free(s);
}

/* A torch 1.13 session sent one byte at a time, then pipelined in one
 * write: the replies are the same and in order. */
static void test_partial_and_pipelined(void **state)
{
	kiln_store_server *s = default_server();
	for (int mode = 0; mode < 2; mode++) {
		int fd = raw_connect(kiln_store_server_port(s));
		uint8_t b[512], *p = b;
		char key[32];
		snprintf(key, sizeof(key), "/ctr%d", mode);
		*p++ = 3; /* 1.13 ADD */
		put_str(&p, key);
		int64_t d = 40;
		memcpy(p, &d, 8);
		p += 8;
		*p++ = 0; /* 1.13 SET */
		put_str(&p, "/k");
		put_str(&p, "val");
		*p++ = 5; /* 1.13 WAIT */
		uint64_t one = 1;
		memcpy(p, &one, 8);
		p += 8;
		put_str(&p, "/k");
		*p++ = 2; /* 1.13 GET */
		put_str(&p, "/k");
		*p++ = 6; /* 1.13 GETNUMKEYS */
		if (mode == 0) {
			for (uint8_t *q = b; q < p; q++) {
				assert_int_equal(send(fd, q, 1, MSG_NOSIGNAL), 1);
				if ((q - b) % 7 == 0)
					usleep(200);
			}
		} else {
			assert_int_equal(send(fd, b, (size_t) (p - b), MSG_NOSIGNAL), p - b);
		}
		uint8_t r[8 + 1 + 8 + 3 + 8];
		size_t got = 0;
		while (got < sizeof(r)) {
			ssize_t n = recv(fd, r + got, sizeof(r) - got, 0);
			assert_true(n > 0);
			got += (size_t) n;
		}
		int64_t v;
		memcpy(&v, r, 8);
		assert_int_equal(v, 40);
		assert_int_equal(r[8], KILN_STORE_WAIT_STOP_WAITING);
		uint64_t l;
		memcpy(&l, r + 9, 8);
		assert_int_equal(l, 3);
		assert_memory_equal(r + 17, "val", 3);
		memcpy(&v, r + 20, 8);
		assert_int_equal(v, mode + 2);
		close(fd);
	}
	kiln_store_server_free(s);
}

/* ---- in-process access ---------------------------------------------------- */

static int count_cb(const char *key, const void *value, size_t len, void *userdata)
{
	(*(int *) userdata)++;
	assert_non_null(startswith(key, "/kiln/hb/"));
	return 0;
}

static void test_in_process(void **state)
{
	kiln_store_server_opts o;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	kiln_store_server *s = NULL;
	assert_int_equal(kiln_store_server_new(&o, &s), 0); /* not started */
	int64_t x;
	void *v;
	size_t n;
	assert_int_equal(kiln_store_server_add(s, "/kiln/c", 2, &x), 0);
	assert_int_equal(kiln_store_server_add(s, "/kiln/c", 3, &x), 0);
	assert_int_equal(x, 5);
	assert_int_equal(kiln_store_server_set(s, "/kiln/hb/1", "a", 1), 0);
	assert_int_equal(kiln_store_server_set(s, "/kiln/hb/2", "b", 1), 0);
	assert_int_equal(kiln_store_server_set(s, "text", "abc", 3), 0);
	assert_int_equal(kiln_store_server_add(s, "text", 1, &x), -EBADMSG);
	assert_int_equal(kiln_store_server_set(s, "max", "9223372036854775807", 19), 0);
	assert_int_equal(kiln_store_server_add(s, "max", 1, &x), -ERANGE);
	int cnt = 0;
	assert_int_equal(kiln_store_server_foreach(s, "/kiln/hb/", count_cb, &cnt), 2);
	assert_int_equal(cnt, 2);
	assert_int_equal(kiln_store_server_num_keys(s), 5);
	assert_int_equal(kiln_store_server_delete(s, "/kiln/hb/1"), 1);
	assert_int_equal(kiln_store_server_delete(s, "/kiln/hb/1"), 0);
	assert_int_equal(kiln_store_server_get(s, "/kiln/hb/1", &v, &n), -ENOENT);
	assert_int_equal(kiln_store_server_get(s, "/kiln/c", &v, &n), 0);
	assert_string_equal(v, "5");
	free(v);
	/* many keys: the table grows and everything stays reachable */
	char k[32];
	for (int i = 0; i < 20000; i++) {
		snprintf(k, sizeof(k), "key%d", i);
		assert_int_equal(kiln_store_server_set(s, k, k, strlen(k)), 0);
	}
	for (int i = 0; i < 20000; i += 997) {
		snprintf(k, sizeof(k), "key%d", i);
		assert_int_equal(kiln_store_server_get(s, k, &v, &n), 0);
		assert_string_equal(v, k);
		free(v);
	}
	assert_int_equal(kiln_store_server_num_keys(s), 20004);
	assert_int_equal(kiln_store_server_set(NULL, "k", "", 0), -EINVAL);
	assert_int_equal(kiln_store_server_set(s, "", "", 0), -EINVAL);
	kiln_store_server_free(s);
}

/* ---- caller-driven loop --------------------------------------------------- */

static volatile bool drive_stop;
static void *drive_thread(void *p)
{
	kiln_store_server *s = p;
	while (!drive_stop)
		assert_true(kiln_store_server_process(s, 20 * 1000) >= 0);
	return NULL;
}

static void test_process_loop(void **state)
{
	kiln_store_server_opts o;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	kiln_store_server *s = NULL;
	assert_int_equal(kiln_store_server_new(&o, &s), 0);
	assert_true(kiln_store_server_fd(s) >= 0);
	pthread_t t;
	drive_stop = false;
	assert_int_equal(pthread_create(&t, NULL, drive_thread, s), 0);
	kiln_store_client *c = client(s, NULL);
	int64_t x;
	assert_int_equal(kiln_store_client_add(c, "n", 7, &x), 0);
	assert_int_equal(x, 7);
	kiln_store_client_free(c);
	drive_stop = true;
	pthread_join(t, NULL);
	/* start() while the caller drives would race; process() refuses while
	 * the thread runs */
	assert_int_equal(kiln_store_server_start(s), 0);
	assert_int_equal(kiln_store_server_start(s), -EBUSY);
	assert_int_equal(kiln_store_server_process(s, 0), -EBUSY);
	assert_int_equal(kiln_store_server_stop(s), 0);
	kiln_store_server_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_dialects),
		cmocka_unit_test(test_parse_limits),
		cmocka_unit_test(test_parse_multi),
		cmocka_unit_test(test_ops),
		cmocka_unit_test(test_wait_wakes_on_set),
		cmocka_unit_test(test_wait_timeout_cancels),
		cmocka_unit_test(test_secret),
		cmocka_unit_test(test_token_and_require_auth),
		cmocka_unit_test(test_allow_list),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_wait_flood_bounded),
		cmocka_unit_test(test_partial_and_pipelined),
		cmocka_unit_test(test_wait_duplicates),
		cmocka_unit_test(test_in_process),
		cmocka_unit_test(test_process_loop),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
