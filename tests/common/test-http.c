/* test-http.c — kiln/http.h against real sockets on 127.0.0.1.
 *
 * A small raw-socket HTTP/1.1 client (with a chunked decoder) talks to a
 * server on an ephemeral port: routing, 404/405, JSON echo, 413 without
 * reading the body, malformed requests, 500 concurrent connections, SSE
 * (order, incremental delivery, cancel on disconnect, backpressure against
 * a reader that stops, shutdown with a stream open), and curl's CLI when
 * it is installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kiln/http.h"
#include "kiln/json.h"
#include "kiln/macro.h"
#include "kiln/strbuf.h"

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double) t.tv_sec * 1e3 + (double) t.tv_nsec / 1e6;
}

/* ---- the client ---- */

typedef struct conn {
	int fd;
	char buf[1 << 16];
	size_t off, len;
	bool eof;
} conn;

static conn *conn_open(uint16_t port, int rcvbuf)
{
	conn *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(c->fd >= 0);
	if (rcvbuf > 0)
		setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	struct timeval tv = { .tv_sec = 10 };
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(c->fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
	return c;
}

static void conn_close(conn *c)
{
	if (!c)
		return;
	close(c->fd);
	free(c);
}

static int conn_send(conn *c, const char *data, size_t len)
{
	while (len > 0) {
		ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
		if (n < 0)
			return -errno;
		data += n;
		len -= (size_t) n;
	}
	return 0;
}

static int conn_fill(conn *c)
{
	if (c->off > 0) {
		memmove(c->buf, c->buf + c->off, c->len - c->off);
		c->len -= c->off;
		c->off = 0;
	}
	if (c->len == sizeof(c->buf))
		return -ENOBUFS;
	ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
	if (n < 0)
		return -errno;
	if (n == 0) {
		c->eof = true;
		return 0;
	}
	c->len += (size_t) n;
	return (int) n;
}

/* A line without its CRLF into out; -EPIPE at EOF. */
static int conn_line(conn *c, char *out, size_t size)
{
	for (;;) {
		char *nl = memchr(c->buf + c->off, '\n', c->len - c->off);
		if (nl) {
			size_t n = (size_t) (nl - (c->buf + c->off));
			size_t k = n > 0 && nl[-1] == '\r' ? n - 1 : n;
			k = MIN(k, size - 1);
			memcpy(out, c->buf + c->off, k);
			out[k] = 0;
			c->off += n + 1;
			return 0;
		}
		int r = conn_fill(c);
		if (r < 0)
			return r;
		if (r == 0)
			return -EPIPE;
	}
}

static int conn_bytes(conn *c, kiln_strbuf *out, size_t n)
{
	while (n > 0) {
		if (c->len == c->off) {
			int r = conn_fill(c);
			if (r < 0)
				return r;
			if (r == 0)
				return -EPIPE;
		}
		size_t k = MIN(n, c->len - c->off);
		kiln_strbuf_append_n(out, c->buf + c->off, k);
		c->off += k;
		n -= k;
	}
	return 0;
}

typedef struct response {
	int status;
	char headers[8192];
	bool chunked;
	long content_length;
	kiln_strbuf body;
} response;

static const char *resp_header(const response *r, const char *name)
{
	static __thread char v[512];
	size_t nl = strlen(name);
	for (const char *p = r->headers; *p;) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t) (e - p) : strlen(p);
		if (len > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
			const char *val = p + nl + 1;
			while (*val == ' ')
				val++;
			size_t vl = MIN((size_t) (p + len - val), sizeof(v) - 1);
			memcpy(v, val, vl);
			v[vl] = 0;
			return v;
		}
		p += len + (e ? 1 : 0);
	}
	return NULL;
}

static int read_head(conn *c, response *r)
{
	char line[8192];
	memset(r, 0, sizeof(*r));
	kiln_strbuf_init(&r->body);
	r->content_length = -1;
	int q = conn_line(c, line, sizeof(line));
	if (q < 0)
		return q;
	if (sscanf(line, "HTTP/1.%*d %d", &r->status) != 1)
		return -EPROTO;
	size_t used = 0;
	for (;;) {
		q = conn_line(c, line, sizeof(line));
		if (q < 0)
			return q;
		if (!line[0])
			break;
		used += (size_t) snprintf(r->headers + used, sizeof(r->headers) - used, "%s\n",
					  line);
		used = MIN(used, sizeof(r->headers) - 1);
	}
	const char *te = resp_header(r, "Transfer-Encoding");
	r->chunked = te && strcasestr(te, "chunked");
	const char *cl = resp_header(r, "Content-Length");
	if (cl)
		r->content_length = atol(cl);
	return 0;
}

/* Reads one chunk of a chunked body into out; 0 at the last chunk. */
static int read_chunk(conn *c, kiln_strbuf *out)
{
	char line[64];
	int q = conn_line(c, line, sizeof(line));
	if (q < 0)
		return q;
	size_t n = strtoul(line, NULL, 16);
	if (n == 0) {
		q = conn_line(c, line, sizeof(line)); /* the blank line after */
		return q < 0 ? q : 0;
	}
	q = conn_bytes(c, out, n);
	if (q < 0)
		return q;
	q = conn_line(c, line, sizeof(line));
	return q < 0 ? q : 1;
}

static int read_response(conn *c, response *r, bool head)
{
	int q = read_head(c, r);
	if (q < 0)
		return q;
	if (head || r->status == 204)
		return 0;
	if (r->chunked) {
		while ((q = read_chunk(c, &r->body)) > 0)
			;
		return q;
	}
	if (r->content_length >= 0)
		return conn_bytes(c, &r->body, (size_t) r->content_length);
	while (conn_fill(c) > 0)
		;
	kiln_strbuf_append_n(&r->body, c->buf + c->off, c->len - c->off);
	return 0;
}

static int request(uint16_t port, const char *raw, response *r)
{
	conn *c = conn_open(port, 0);
	int q = conn_send(c, raw, strlen(raw));
	if (q >= 0)
		q = read_response(c, r, strncmp(raw, "HEAD ", 5) == 0);
	conn_close(c);
	return q;
}

static json_t *body_json(const response *r)
{
	json_error_t je;
	json_t *j = json_loadb(r->body.s ?: "", r->body.len, 0, &je);
	if (!j)
		print_error("body is not JSON (%s): %.*s\n", je.text, (int) r->body.len,
			    r->body.s ?: "");
	return j;
}

/* Checks OpenAI's error shape and returns error.message. */
static void assert_error_shape(const response *r, unsigned status, const char *type,
			       const char *code, const char *message)
{
	assert_int_equal(r->status, status);
	assert_string_equal(resp_header(r, "Content-Type"), "application/json");
	_cleanup_json_ json_t *j = body_json(r);
	assert_non_null(j);
	json_t *e = json_object_get(j, "error");
	assert_true(json_is_object(e));
	assert_string_equal(json_string_value(json_object_get(e, "type")), type);
	if (code)
		assert_string_equal(json_string_value(json_object_get(e, "code")), code);
	else
		assert_true(json_is_null(json_object_get(e, "code")));
	assert_non_null(json_object_get(e, "param"));
	if (message)
		assert_string_equal(json_string_value(json_object_get(e, "message")), message);
	const char *rid = resp_header(r, "X-Request-Id");
	assert_non_null(rid);
	assert_string_equal(json_string_value(json_object_get(e, "request_id")), rid);
}

/* ---- the server under test ---- */

typedef struct sse_ctl {
	atomic_int mode; /* set by the test, read by the producer (via a socket: no HB for TSan) */
	kiln_http_stream *stream;
	pthread_t producer;
	bool started;
	sem_t go;
	atomic_int produced;
	atomic_int cancelled;
	double cancel_ms;
	int send_after_cancel, close_rc;
	int slow_events, slow_timeouts;
	size_t slow_max_buffered;
	sem_t slow_done;
	int prod_err;	      /* first unexpected producer error */
	int slow_seen_events; /* at the third timeout */
	size_t slow_seen_buffered;
} sse_ctl;

enum {
	SSE_ORDERED,
	SSE_WAIT_CANCEL,
	SSE_SLOW,
	SSE_QUICK,
	LATER_OK,
	LATER_WAIT_CANCEL,
	LATER_CLOSE
};

static sse_ctl ctl;
static atomic_int access_count;
static char last_access[1 << 16];
static pthread_mutex_t access_lock = PTHREAD_MUTEX_INITIALIZER;

static int h_hello(kiln_http_request *r, void *u)
{
	static const char msg[] = "hello\n";
	return kiln_http_reply_text(r, 200, "text/plain", msg, sizeof(msg) - 1);
}

static int h_echo(kiln_http_request *r, void *u)
{
	kiln_error err;
	_cleanup_json_ json_t *j = NULL;
	if (kiln_http_request_json(r, &j, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	const char *name = NULL;
	if (kiln_json_get_string(j, "", "name", KILN_JSON_REQUIRED, 64, &name, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	kiln_http_set_header(r, "X-Echo", name);
	return kiln_http_reply_json(r, 200, j);
}

static int h_info(kiln_http_request *r, void *u)
{
	_cleanup_json_ json_t *j =
		json_pack("{s:s, s:s, s:s?, s:s?, s:s, s:s}", "method", kiln_http_request_method(r),
			  "path", kiln_http_request_path(r), "q", kiln_http_request_query(r, "q"),
			  "x_test", kiln_http_request_header(r, "x-test"), "client",
			  kiln_http_request_client(r), "id", kiln_http_request_id(r));
	return kiln_http_reply_json(r, 200, j);
}

static int h_busy(kiln_http_request *r, void *u)
{
	return kiln_http_reply_retry(r, 429, 3, "overloaded", "Server is busy: %d requests queued",
				     7);
}

static int h_down(kiln_http_request *r, void *u)
{
	return kiln_http_reply_retry(r, 503, 0, NULL, "Model is loading");
}

static int h_fail(kiln_http_request *r, void *u)
{
	return -EIO;
}

static void on_cancel(kiln_http_stream *s, void *u)
{
	sse_ctl *c = u;
	c->cancel_ms = now_ms();
	atomic_store(&c->cancelled, 1);
	sem_post(&c->go); /* wake a producer waiting for the test */
}

/* cmocka's asserts must stay on the test thread: the producer records. */
#define CHECK(expr)                              \
	do {                                     \
		int _q = (expr);                 \
		if (_q != 0 && c->prod_err == 0) \
			c->prod_err = _q;        \
	} while (0)

static void *producer(void *arg)
{
	sse_ctl *c = arg;
	kiln_http_stream *s = c->stream;
	char ev[1200];
	switch (c->mode) {
	case SSE_ORDERED:
		for (int i = 0; i < 5; i++) {
			sem_wait(&c->go);
			snprintf(ev, sizeof(ev), "{\"i\":%d}", i);
			/* counted first: the client may read it before send returns */
			atomic_fetch_add(&c->produced, 1);
			CHECK(kiln_http_stream_send(s, ev, -1));
		}
		c->close_rc = kiln_http_stream_close(s, true);
		break;
	case SSE_QUICK:
		for (int i = 0; i < 3; i++) {
			_cleanup_json_ json_t *j = json_pack("{s:i, s:s}", "i", i, "t", "a\"b");
			CHECK(kiln_http_stream_send_json(s, j, -1));
		}
		CHECK(kiln_http_stream_send(s, "line1\nline2", -1));
		c->close_rc = kiln_http_stream_close(s, true);
		break;
	case SSE_WAIT_CANCEL:
		CHECK(kiln_http_stream_send(s, "{\"i\":0}", -1));
		atomic_fetch_add(&c->produced, 1);
		/* wait for cancel (or the test giving up) */
		sem_wait(&c->go);
		c->send_after_cancel = kiln_http_stream_send(s, "{\"i\":1}", 0);
		c->close_rc = kiln_http_stream_close(s, true);
		break;
	case LATER_OK: {
		usleep(50000);
		_cleanup_json_ json_t *j =
			json_pack("{s:b, s:s}", "ok", 1, "id", kiln_http_stream_request_id(s));
		c->close_rc = kiln_http_later_json(s, 201, j);
		break;
	}
	case LATER_WAIT_CANCEL:
		atomic_fetch_add(&c->produced, 1);
		sem_wait(&c->go);
		c->send_after_cancel = kiln_http_stream_send(s, "x", 0); /* not a stream */
		c->close_rc = kiln_http_later_error(s, 500, NULL, NULL, NULL, "too late");
		break;
	case LATER_CLOSE:
		c->close_rc = kiln_http_stream_close(s, true);
		break;
	case SSE_SLOW: {
		memset(ev, 'x', sizeof(ev) - 1);
		ev[sizeof(ev) - 1] = 0;
		for (int i = 0; i < 100000; i++) {
			int n = snprintf(ev, sizeof(ev), "%08d", i);
			ev[n] = 'x';
			int q = kiln_http_stream_send(s, ev, 100);
			size_t b = kiln_http_stream_buffered(s);
			c->slow_max_buffered = MAX(c->slow_max_buffered, b);
			if (q == -ETIMEDOUT) {
				c->slow_timeouts++;
				i--;
				if (c->slow_timeouts == 3) {
					c->slow_seen_events = c->slow_events;
					c->slow_seen_buffered = c->slow_max_buffered;
					sem_post(&c->slow_done); /* the test starts reading */
				}
				if (c->slow_timeouts > 200)
					break;
				continue;
			}
			CHECK(q);
			c->slow_events++;
			if (c->slow_timeouts >= 3 && c->slow_events >= 4000)
				break;
		}
		c->close_rc = kiln_http_stream_close(s, true);
		break;
	}
	}
	return NULL;
}

static int h_stream(kiln_http_request *r, void *u)
{
	sse_ctl *c = u;
	int q = kiln_http_reply_sse(r, on_cancel, c, &c->stream);
	if (q < 0)
		return q;
	c->started = true;
	if (pthread_create(&c->producer, NULL, producer, c) != 0)
		return -EAGAIN;
	return 0;
}

static int h_later(kiln_http_request *r, void *u)
{
	sse_ctl *c = u;
	int q = kiln_http_reply_later(r, on_cancel, c, &c->stream);
	if (q < 0)
		return q;
	c->started = true;
	if (pthread_create(&c->producer, NULL, producer, c) != 0)
		return -EAGAIN;
	return 0;
}

/* /many: streams for the test thread to feed */
#define N_STREAMS 500
static kiln_http_stream *many[N_STREAMS];
static atomic_int n_many;

static int h_many(kiln_http_request *r, void *u)
{
	kiln_http_stream *st;
	int q = kiln_http_reply_sse(r, NULL, NULL, &st);
	if (q < 0)
		return q;
	int i = atomic_fetch_add(&n_many, 1);
	if (i >= N_STREAMS) {
		kiln_http_stream_close(st, false);
		return 0;
	}
	many[i] = st;
	return 0;
}

static void access_cb(const kiln_http_access *a, void *u)
{
	/* lines in completion order (which is not request order across threads) */
	pthread_mutex_lock(&access_lock);
	size_t used = strlen(last_access);
	snprintf(last_access + used, sizeof(last_access) - used, "%s %s %u %s%s\n", a->method,
		 a->path, a->status, a->stream ? "stream" : "plain", a->aborted ? " aborted" : "");
	pthread_mutex_unlock(&access_lock);
	atomic_fetch_add(&access_count, 1);
}

/* Waits (5 s at most) for the access log line of path; returns it. */
static const char *wait_access(const char *path)
{
	static char line[256];
	char pat[128];
	snprintf(pat, sizeof(pat), " %s ", path);
	line[0] = 0;
	for (int i = 0; i < 500 && !line[0]; i++) {
		pthread_mutex_lock(&access_lock);
		const char *p = strstr(last_access, pat);
		if (p) {
			while (p > last_access && p[-1] != '\n')
				p--;
			snprintf(line, sizeof(line), "%.*s", (int) strcspn(p, "\n"), p);
		}
		pthread_mutex_unlock(&access_lock);
		if (!line[0])
			usleep(10000);
	}
	return line;
}

static const kiln_http_route routes[] = {
	{ "GET", "/hello", false, h_hello, NULL },    { "POST", "/echo", false, h_echo, NULL },
	{ "PUT", "/echo", false, h_echo, NULL },      { "GET", "/info", false, h_info, NULL },
	{ "GET", "/v1/models/", true, h_info, NULL }, { "GET", "/busy", false, h_busy, NULL },
	{ "GET", "/down", false, h_down, NULL },      { "GET", "/fail", false, h_fail, NULL },
	{ "GET", "/stream", false, h_stream, &ctl },  { "GET", "/later", false, h_later, &ctl },
	{ "GET", "/many", false, h_many, NULL },
};

#define TEST_BODY_MAX	((size_t) 1 << 20)
#define TEST_SSE_BUFFER ((size_t) 16 << 10)

static kiln_http_server *srv;
static uint16_t port;
static const char *shutdown_event; /* the next setup's sse_shutdown_event */

static int setup(void **state)
{
	memset(&ctl, 0, sizeof(ctl));
	pthread_mutex_lock(&access_lock);
	last_access[0] = 0;
	pthread_mutex_unlock(&access_lock);
	sem_init(&ctl.go, 0, 0);
	sem_init(&ctl.slow_done, 0, 0);
	kiln_http_config cfg = {
		.address = "127.0.0.1",
		.threads = 2,
		.max_body_bytes = TEST_BODY_MAX,
		.sse_buffer_bytes = TEST_SSE_BUFFER,
		.idle_timeout_s = 20,
		.max_connections_per_client = 1000, /* every test client is 127.0.0.1 */
		.sse_shutdown_event = shutdown_event,
		.routes = routes,
		.n_routes = ARRAY_SIZE(routes),
		.access_log = access_cb,
	};
	assert_int_equal(kiln_http_server_start(&cfg, &srv), 0);
	port = kiln_http_server_port(srv);
	assert_true(port > 0);
	return 0;
}

static int teardown(void **state)
{
	kiln_http_server_free(srv);
	srv = NULL;
	if (ctl.started)
		pthread_join(ctl.producer, NULL);
	sem_destroy(&ctl.go);
	sem_destroy(&ctl.slow_done);
	return 0;
}

static void test_start_errors(void **state)
{
	kiln_http_server *s = NULL;
	kiln_http_config cfg = { .address = "not-an-ip", .routes = routes, .n_routes = 1 };
	assert_int_equal(kiln_http_server_start(&cfg, &s), -EINVAL);
	cfg.address = "127.0.0.1";
	cfg.n_routes = 0;
	assert_int_equal(kiln_http_server_start(&cfg, &s), -EINVAL);
	/* the port the fixture holds is taken */
	cfg.n_routes = 1;
	cfg.port = port;
	assert_int_equal(kiln_http_server_start(&cfg, &s), -EADDRINUSE);
	assert_null(s);
	/* IPv6 loopback, when the kernel has it */
	cfg.address = "::1";
	cfg.port = 0;
	if (kiln_http_server_start(&cfg, &s) == 0) {
		assert_true(kiln_http_server_port(s) > 0);
		kiln_http_server_free(s);
	}
}

static void test_routing(void **state)
{
	response r;
	assert_int_equal(request(port, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body.s, "hello\n");
	assert_string_equal(resp_header(&r, "Content-Type"), "text/plain");
	assert_non_null(resp_header(&r, "X-Request-Id"));
	kiln_strbuf_free(&r.body);

	/* HEAD answers like GET, without a body */
	assert_int_equal(request(port, "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 200);
	kiln_strbuf_free(&r.body);

	assert_int_equal(request(port, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 404, "invalid_request_error", "unknown_url",
			   "Invalid URL (GET /nope)");
	kiln_strbuf_free(&r.body);

	assert_int_equal(request(port, "DELETE /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 405, "invalid_request_error", "method_not_allowed",
			   "Method DELETE not allowed for /hello: use GET, HEAD");
	assert_string_equal(resp_header(&r, "Allow"), "GET, HEAD");
	kiln_strbuf_free(&r.body);

	assert_int_equal(request(port, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 405);
	assert_string_equal(resp_header(&r, "Allow"), "POST, PUT");
	kiln_strbuf_free(&r.body);

	/* prefix route, query args, headers, client, request id */
	assert_int_equal(request(port,
				 "GET /v1/models/llama-3%2F8b?q=a%20b&z=1 HTTP/1.1\r\nHost: x\r\n"
				 "X-Test: yes\r\nX-Request-Id: abc-123\r\n\r\n",
				 &r),
			 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(resp_header(&r, "X-Request-Id"), "abc-123");
	_cleanup_json_ json_t *j = body_json(&r);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "path")), "/v1/models/llama-3/8b");
	assert_string_equal(json_string_value(json_object_get(j, "q")), "a b");
	assert_string_equal(json_string_value(json_object_get(j, "x_test")), "yes");
	assert_string_equal(json_string_value(json_object_get(j, "id")), "abc-123");
	assert_non_null(strstr(json_string_value(json_object_get(j, "client")), "127.0.0.1:"));
	kiln_strbuf_free(&r.body);

	/* /v1/models (no slash) is not under the prefix */
	assert_int_equal(request(port, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 404);
	kiln_strbuf_free(&r.body);

	/* an insane X-Request-Id is replaced */
	assert_int_equal(
		request(port, "GET /info HTTP/1.1\r\nHost: x\r\nX-Request-Id: a b\r\n\r\n", &r), 0);
	const char *rid = resp_header(&r, "X-Request-Id");
	assert_int_equal(strlen(rid), 4 + 24);
	assert_true(strncmp(rid, "req_", 4) == 0);
	assert_int_equal(strspn(rid + 4, "0123456789abcdef"), 24);
	kiln_strbuf_free(&r.body);

	/* a handler failing without a reply: 500 */
	assert_int_equal(request(port, "GET /fail HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 500, "server_error", NULL, NULL);
	kiln_strbuf_free(&r.body);

	/* the access log saw the last one */
	assert_string_equal(wait_access("/fail"), "GET /fail 500 plain");
}

static void test_errors(void **state)
{
	response r;
	assert_int_equal(request(port, "GET /busy HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 429, "rate_limit_error", "overloaded",
			   "Server is busy: 7 requests queued");
	assert_string_equal(resp_header(&r, "Retry-After"), "3");
	kiln_strbuf_free(&r.body);

	assert_int_equal(request(port, "GET /down HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 503, "server_error", NULL, "Model is loading");
	assert_null(resp_header(&r, "Retry-After"));
	kiln_strbuf_free(&r.body);
}

static void post(const char *body, response *r)
{
	char raw[4096];
	snprintf(raw, sizeof(raw),
		 "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\n\r\n%s",
		 strlen(body), body);
	assert_int_equal(request(port, raw, r), 0);
}

static void test_json_echo(void **state)
{
	response r;
	post("{\"name\": \"kiln\", \"n\": [1, 2.5, {\"x\": null}]}", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(resp_header(&r, "X-Echo"), "kiln");
	_cleanup_json_ json_t *want =
		json_loads("{\"name\":\"kiln\",\"n\":[1,2.5,{\"x\":null}]}", 0, NULL);
	_cleanup_json_ json_t *got = body_json(&r);
	assert_true(json_equal(want, got));
	kiln_strbuf_free(&r.body);

	post("{\"name\": \"kiln\",\n \"n\": [1, }", &r);
	assert_error_shape(&r, 400, "invalid_request_error", NULL,
			   "invalid JSON at line 2, column 11: unexpected token near '}'");
	kiln_strbuf_free(&r.body);

	post("{\"name\": 5}", &r);
	assert_error_shape(&r, 400, "invalid_request_error", NULL,
			   "name: expected a string, got a number");
	_cleanup_json_ json_t *j = body_json(&r);
	assert_string_equal(
		json_string_value(json_object_get(json_object_get(j, "error"), "param")), "name");
	kiln_strbuf_free(&r.body);

	post("", &r);
	assert_error_shape(&r, 400, "invalid_request_error", NULL,
			   "request body is empty: expected JSON");
	kiln_strbuf_free(&r.body);
}

static void test_body_too_large(void **state)
{
	/* Content-Length over the limit: 413 at once, the body is never sent */
	conn *c = conn_open(port, 0);
	const char *head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n";
	double t0 = now_ms();
	assert_int_equal(conn_send(c, head, strlen(head)), 0);
	response r;
	assert_int_equal(read_response(c, &r, false), 0);
	assert_true(now_ms() - t0 < 5000);
	assert_error_shape(&r, 413, "invalid_request_error", "request_too_large",
			   "Request body too large: 1000000000 bytes, at most 1048576");
	kiln_strbuf_free(&r.body);
	conn_close(c);

	/* chunked upload over the limit: not kept, 413 at its end */
	c = conn_open(port, 0);
	head = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
	assert_int_equal(conn_send(c, head, strlen(head)), 0);
	static char chunk[65536 + 16];
	int n = snprintf(chunk, sizeof(chunk), "%x\r\n", 65536);
	memset(chunk + n, ' ', 65536);
	memcpy(chunk + n + 65536, "\r\n", 2);
	int sent = 0;
	for (int i = 0; i < 20; i++) /* 1.25 MiB */
		if (conn_send(c, chunk, (size_t) n + 65536 + 2) == 0)
			sent++;
	conn_send(c, "0\r\n\r\n", 5);
	int q = read_response(c, &r, false);
	if (q == 0) {
		assert_error_shape(&r, 413, "invalid_request_error", "request_too_large",
				   "Request body too large: more than 1048576 bytes");
		kiln_strbuf_free(&r.body);
	} else
		fail_msg("no 413 after a chunked upload over the limit (%d, %d chunks sent)", q,
			 sent);
	conn_close(c);

	/* a chunked upload that goes on past twice the limit: hung up on */
	c = conn_open(port, 0);
	assert_int_equal(conn_send(c, head, strlen(head)), 0);
	int err = 0;
	for (int i = 0; i < 64 && err == 0; i++) /* up to 4 MiB */
		err = conn_send(c, chunk, (size_t) n + 65536 + 2);
	if (err == 0)
		conn_send(c, "0\r\n\r\n", 5);
	q = read_response(c, &r, false);
	assert_true(q == -EPIPE || q == -ECONNRESET);
	assert_true(err == 0 || err == -EPIPE || err == -ECONNRESET);
	conn_close(c);

	/* the server is fine */
	response ok;
	assert_int_equal(request(port, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", &ok), 0);
	assert_int_equal(ok.status, 200);
	kiln_strbuf_free(&ok.body);
}

static void test_malformed(void **state)
{
	response r;
	/* garbage: MHD answers 400 or closes; the server lives on */
	conn *c = conn_open(port, 0);
	static const char garbage[] = "\x01\x02\xff GARBAGE \x7f\r\n\r\n";
	conn_send(c, garbage, sizeof(garbage) - 1);
	int q = read_response(c, &r, false);
	if (q == 0) {
		assert_int_equal(r.status, 400);
		kiln_strbuf_free(&r.body);
	}
	conn_close(c);

	/* a 100 KiB header line: 431 (or a close) without hurting the server */
	size_t big = 100 << 10;
	char *raw = malloc(big + 128);
	assert_non_null(raw);
	int n = snprintf(raw, 128, "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: ");
	memset(raw + n, 'a', big);
	memcpy(raw + n + big, "\r\n\r\n", 5);
	c = conn_open(port, 0);
	conn_send(c, raw, strlen(raw));
	q = read_response(c, &r, false);
	assert_int_equal(q, 0);
	assert_int_equal(r.status, 431);
	kiln_strbuf_free(&r.body);
	conn_close(c);

	/* a 100 KiB URL: 414 */
	n = snprintf(raw, 128, "GET /hello?x=");
	memset(raw + n, 'a', big);
	strcpy(raw + n + big, " HTTP/1.1\r\nHost: x\r\n\r\n");
	c = conn_open(port, 0);
	conn_send(c, raw, strlen(raw));
	q = read_response(c, &r, false);
	assert_int_equal(q, 0);
	assert_int_equal(r.status, 414);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	free(raw);

	assert_int_equal(request(port, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 200);
	kiln_strbuf_free(&r.body);
}

#define N_CONCURRENT 500

/* One client address past max_connections_per_client: the excess is
 * closed at once, while the ones it holds stay open. */
static void test_per_client_cap(void **state)
{
	kiln_http_config cfg = { .address = "127.0.0.1",
				 .threads = 1,
				 .max_connections_per_client = 4,
				 .routes = routes,
				 .n_routes = ARRAY_SIZE(routes) };
	kiln_http_server *s = NULL;
	assert_int_equal(kiln_http_server_start(&cfg, &s), 0);
	uint16_t p = kiln_http_server_port(s);
	conn *c[8];
	int closed = 0;
	for (int i = 0; i < 8; i++)
		c[i] = conn_open(p, 0);
	usleep(200 * 1000);
	for (int i = 0; i < 8; i++) {
		struct timeval tv = { .tv_usec = 100 * 1000 };
		setsockopt(c[i]->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		char b;
		ssize_t n = recv(c[i]->fd, &b, 1, 0);
		closed += n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
	}
	print_message("# 8 idle connections, cap 4: %d closed at once\n", closed);
	assert_int_equal(closed, 4);
	for (int i = 0; i < 8; i++)
		conn_close(c[i]);
	kiln_http_server_free(s);
}

static void test_concurrent(void **state)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < 2 * N_CONCURRENT + 64) {
		rl.rlim_cur = MIN(rl.rlim_max, (rlim_t) 4096);
		setrlimit(RLIMIT_NOFILE, &rl);
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur < 2 * N_CONCURRENT + 64)
		skip();
	conn **cs = calloc(N_CONCURRENT, sizeof(*cs));
	assert_non_null(cs);
	double t0 = now_ms();
	/* all connections open at once, then every request, then every reply */
	for (int i = 0; i < N_CONCURRENT; i++)
		cs[i] = conn_open(port, 0);
	for (int i = 0; i < N_CONCURRENT; i++) {
		char raw[128];
		snprintf(raw, sizeof(raw),
			 "GET /info?q=%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", i);
		assert_int_equal(conn_send(cs[i], raw, strlen(raw)), 0);
	}
	int ok = 0;
	for (int i = 0; i < N_CONCURRENT; i++) {
		response r;
		int q = read_response(cs[i], &r, false);
		if (q < 0 || r.status != 200)
			print_message("# connection %d: %s, status %d\n", i, strerror(-q),
				      r.status);
		if (q == 0 && r.status == 200) {
			_cleanup_json_ json_t *j = body_json(&r);
			char want[16];
			snprintf(want, sizeof(want), "%d", i);
			if (j && streq_ptr(json_string_value(json_object_get(j, "q")), want))
				ok++;
		}
		kiln_strbuf_free(&r.body);
		conn_close(cs[i]);
	}
	free(cs);
	print_message("# %d concurrent connections answered in %.0f ms\n", ok, now_ms() - t0);
	assert_int_equal(ok, N_CONCURRENT);
}

static int read_event(conn *c, response *r, char *out, size_t size);

static void test_sse_many(void **state)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < 2 * N_STREAMS + 64) {
		rl.rlim_cur = MIN(rl.rlim_max, (rlim_t) 4096);
		setrlimit(RLIMIT_NOFILE, &rl);
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur < 2 * N_STREAMS + 64)
		skip();
	atomic_store(&n_many, 0);
	conn **cs = calloc(N_STREAMS, sizeof(*cs));
	assert_non_null(cs);
	double t0 = now_ms();
	for (int i = 0; i < N_STREAMS; i++) {
		cs[i] = conn_open(port, 0);
		const char *req = "GET /many HTTP/1.1\r\nHost: x\r\n\r\n";
		assert_int_equal(conn_send(cs[i], req, strlen(req)), 0);
	}
	for (int i = 0; i < 1000 && atomic_load(&n_many) < N_STREAMS; i++)
		usleep(10000);
	assert_int_equal(atomic_load(&n_many), N_STREAMS);
	/* one producer (this thread) feeds every stream, never blocking */
	char ev[64];
	for (int k = 0; k < 10; k++)
		for (int i = 0; i < N_STREAMS; i++) {
			snprintf(ev, sizeof(ev), "{\"k\":%d}", k);
			assert_int_equal(kiln_http_stream_send(many[i], ev, 0), 0);
		}
	for (int i = 0; i < N_STREAMS; i++)
		assert_int_equal(kiln_http_stream_close(many[i], true), 0);
	int ok = 0;
	for (int i = 0; i < N_STREAMS; i++) {
		response r;
		bool good = read_head(cs[i], &r) == 0 && r.status == 200;
		char got[128], want[64];
		for (int k = 0; k <= 10 && good; k++) {
			if (k < 10)
				snprintf(want, sizeof(want), "data: {\"k\":%d}\n\n", k);
			else
				snprintf(want, sizeof(want), "data: [DONE]\n\n");
			good = read_event(cs[i], &r, got, sizeof(got)) == 0 && streq(got, want);
		}
		ok += good;
		kiln_strbuf_free(&r.body);
		conn_close(cs[i]);
	}
	free(cs);
	print_message("# %d concurrent SSE streams x 11 events, one producer thread: %.0f ms\n", ok,
		      now_ms() - t0);
	assert_int_equal(ok, N_STREAMS);
}

/* Reads SSE bytes until a blank line: one event ("data: ...\n\n"). */
static int read_event(conn *c, response *r, char *out, size_t size)
{
	kiln_strbuf acc;
	kiln_strbuf_init(&acc);
	for (;;) {
		/* events may straddle chunks; keep unread decoded bytes in r->body */
		char *end = r->body.s ? strstr(r->body.s, "\n\n") : NULL;
		if (end) {
			size_t n = (size_t) (end - r->body.s) + 2;
			snprintf(out, size, "%.*s", (int) n, r->body.s);
			memmove(r->body.s, r->body.s + n, r->body.len - n + 1);
			r->body.len -= n;
			kiln_strbuf_free(&acc);
			return 0;
		}
		int q = read_chunk(c, &r->body);
		if (q <= 0) {
			kiln_strbuf_free(&acc);
			return q == 0 ? -EPIPE : q;
		}
	}
}

static void test_sse_order(void **state)
{
	ctl.mode = SSE_ORDERED;
	conn *c = conn_open(port, 0);
	const char *req = "GET /stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	response r;
	assert_int_equal(read_head(c, &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(resp_header(&r, "Content-Type"), "text/event-stream");
	assert_string_equal(resp_header(&r, "Cache-Control"), "no-cache");
	assert_true(r.chunked);
	char ev[256], want[64];
	for (int i = 0; i < 5; i++) {
		sem_post(&ctl.go); /* let the producer make event i */
		assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
		snprintf(want, sizeof(want), "data: {\"i\":%d}\n\n", i);
		assert_string_equal(ev, want);
		/* incremental: event i arrived before event i+1 was produced */
		assert_int_equal(atomic_load(&ctl.produced), i + 1);
	}
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	assert_string_equal(ev, "data: [DONE]\n\n");
	assert_int_equal(read_chunk(c, &r.body), 0); /* the chunked end */
	kiln_strbuf_free(&r.body);
	conn_close(c);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.prod_err, 0);
	assert_int_equal(ctl.close_rc, 0);
	assert_false(atomic_load(&ctl.cancelled));
}

static void test_sse_disconnect(void **state)
{
	ctl.mode = SSE_WAIT_CANCEL;
	conn *c = conn_open(port, 0);
	const char *req = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	response r;
	assert_int_equal(read_head(c, &r), 0);
	char ev[256];
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	assert_string_equal(ev, "data: {\"i\":0}\n\n");
	kiln_strbuf_free(&r.body);
	/* the producer is idle (its stream suspended) when the client leaves */
	assert_false(atomic_load(&ctl.cancelled));
	double t0 = now_ms();
	conn_close(c);
	for (int i = 0; i < 300 && !atomic_load(&ctl.cancelled); i++)
		usleep(10000);
	assert_true(atomic_load(&ctl.cancelled));
	double dt = ctl.cancel_ms - t0;
	print_message("# cancel fired %.1f ms after the client closed\n", dt);
	assert_true(dt < 1000);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.prod_err, 0);
	assert_int_equal(ctl.send_after_cancel, -ECANCELED);
	assert_int_equal(ctl.close_rc, -ECANCELED);
	assert_string_equal(wait_access("/stream"), "GET /stream 200 stream aborted");
}

static void test_sse_slow_reader(void **state)
{
	ctl.mode = SSE_SLOW;
	/* a small receive window so the kernel does not soak it all up */
	conn *c = conn_open(port, 4096);
	const char *req = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	/* do not read until the producer has hit backpressure three times */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 30;
	assert_int_equal(sem_timedwait(&ctl.slow_done, &ts), 0);
	int before = ctl.slow_seen_events;
	size_t maxbuf = ctl.slow_seen_buffered;
	print_message("# backpressure after %d events of 1.2 KiB; the stream buffered at most "
		      "%zu bytes\n",
		      before, maxbuf);
	/* bounded: the stream's buffer plus MHD's and the kernel's */
	assert_true(maxbuf <= TEST_SSE_BUFFER + 1300);
	assert_true((size_t) before * 1210 < (size_t) 8 << 20);
	/* now read all of it: every event, in order, then [DONE] */
	response r;
	assert_int_equal(read_head(c, &r), 0);
	char ev[1400];
	int i = 0;
	for (;; i++) {
		assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
		if (streq(ev, "data: [DONE]\n\n"))
			break;
		char want[32];
		snprintf(want, sizeof(want), "data: %08d", i);
		assert_true(strncmp(ev, want, strlen(want)) == 0);
		assert_int_equal(strlen(ev), 6 + 1199 + 2);
	}
	assert_int_equal(read_chunk(c, &r.body), 0);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.prod_err, 0);
	assert_int_equal(i, ctl.slow_events);
	assert_int_equal(ctl.close_rc, 0);
}

static void test_sse_shutdown(void **state)
{
	ctl.mode = SSE_WAIT_CANCEL;
	conn *c = conn_open(port, 0);
	const char *req = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	response r;
	assert_int_equal(read_head(c, &r), 0);
	char ev[256];
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	double t0 = now_ms();
	kiln_http_server_free(srv);
	srv = NULL;
	double dt = now_ms() - t0;
	print_message("# server stopped with an open stream in %.1f ms\n", dt);
	assert_true(dt < KILN_HTTP_SHUTDOWN_GRACE_MS + 1000);
	assert_true(atomic_load(&ctl.cancelled));
	/* the client sees the stream end (no [DONE]) */
	int q = read_event(c, &r, ev, sizeof(ev));
	assert_true(q == -EPIPE || q == -ECONNRESET);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.prod_err, 0);
	assert_int_equal(ctl.send_after_cancel, -ECANCELED);
}

static int setup_shutdown_event(void **state)
{
	shutdown_event = "{\"error\":\"stopping\"}";
	int r = setup(state);
	shutdown_event = NULL;
	return r;
}

/* With sse_shutdown_event, a stream cut by the shutdown ends with that
 * event and [DONE], after what it had. */
static void test_sse_shutdown_event(void **state)
{
	ctl.mode = SSE_WAIT_CANCEL;
	conn *c = conn_open(port, 0);
	const char *req = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	response r;
	assert_int_equal(read_head(c, &r), 0);
	char ev[256];
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	kiln_http_server_free(srv);
	srv = NULL;
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	assert_string_equal(ev, "data: {\"error\":\"stopping\"}\n\n");
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	assert_string_equal(ev, "data: [DONE]\n\n");
	int q = read_event(c, &r, ev, sizeof(ev));
	assert_true(q == -EPIPE || q == -ECONNRESET);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.send_after_cancel, -ECANCELED);
}

static void test_later(void **state)
{
	response r;
	ctl.mode = LATER_OK;
	assert_int_equal(request(port, "GET /later HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 201);
	_cleanup_json_ json_t *j = body_json(&r);
	assert_true(json_is_true(json_object_get(j, "ok")));
	assert_string_equal(json_string_value(json_object_get(j, "id")),
			    resp_header(&r, "X-Request-Id"));
	kiln_strbuf_free(&r.body);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.close_rc, 0);
	assert_string_equal(wait_access("/later"), "GET /later 201 plain");

	/* the producer gives up without a reply: 500 */
	ctl.mode = LATER_CLOSE;
	assert_int_equal(request(port, "GET /later HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 500, "server_error", NULL, NULL);
	kiln_strbuf_free(&r.body);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.close_rc, 0);
	assert_false(atomic_load(&ctl.cancelled));
}

static void test_later_disconnect(void **state)
{
	ctl.mode = LATER_WAIT_CANCEL;
	conn *c = conn_open(port, 0);
	const char *req = "GET /later HTTP/1.1\r\nHost: x\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	for (int i = 0; i < 500 && !atomic_load(&ctl.produced); i++)
		usleep(10000);
	assert_int_equal(atomic_load(&ctl.produced), 1);
	usleep(50000);
	assert_false(atomic_load(&ctl.cancelled));
	double t0 = now_ms();
	conn_close(c);
	for (int i = 0; i < 300 && !atomic_load(&ctl.cancelled); i++)
		usleep(10000);
	assert_true(atomic_load(&ctl.cancelled));
	print_message("# deferred reply: cancel fired %.1f ms after the client closed\n",
		      ctl.cancel_ms - t0);
	assert_true(ctl.cancel_ms - t0 < 1000);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.send_after_cancel, -EINVAL);
	assert_int_equal(ctl.close_rc, -ECANCELED);
	assert_string_equal(wait_access("/later"), "GET /later 0 plain aborted");
}

static void test_later_shutdown(void **state)
{
	ctl.mode = LATER_WAIT_CANCEL;
	conn *c = conn_open(port, 0);
	const char *req = "GET /later HTTP/1.1\r\nHost: x\r\n\r\n";
	assert_int_equal(conn_send(c, req, strlen(req)), 0);
	for (int i = 0; i < 500 && !atomic_load(&ctl.produced); i++)
		usleep(10000);
	kiln_http_server_free(srv);
	srv = NULL;
	assert_true(atomic_load(&ctl.cancelled));
	response r;
	assert_int_equal(read_response(c, &r, false), 0);
	assert_error_shape(&r, 503, "server_error", "shutting_down", NULL);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.close_rc, -ECANCELED);
}

static void test_sse_curl(void **state)
{
	if (access("/usr/bin/curl", X_OK) != 0)
		skip();
	ctl.mode = SSE_QUICK;
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "/usr/bin/curl -sS -N --max-time 10 http://127.0.0.1:%u/stream",
		 port);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	char out[1024];
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	assert_int_equal(pclose(p), 0);
	assert_string_equal(out, "data: {\"i\":0,\"t\":\"a\\\"b\"}\n\n"
				 "data: {\"i\":1,\"t\":\"a\\\"b\"}\n\n"
				 "data: {\"i\":2,\"t\":\"a\\\"b\"}\n\n"
				 "data: line1\ndata: line2\n\n"
				 "data: [DONE]\n\n");
	pthread_join(ctl.producer, NULL);
	ctl.started = false;
	assert_int_equal(ctl.prod_err, 0);
	assert_int_equal(ctl.close_rc, 0);

	/* and a plain request with a body through curl */
	snprintf(cmd, sizeof(cmd),
		 "/usr/bin/curl -sS --max-time 10 -d '{\"name\":\"c\"}' "
		 "-H 'Content-Type: application/json' http://127.0.0.1:%u/echo",
		 port);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	assert_int_equal(pclose(p), 0);
	assert_string_equal(out, "{\"name\":\"c\"}");
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_start_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_routing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_json_echo, setup, teardown),
		cmocka_unit_test_setup_teardown(test_body_too_large, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
		cmocka_unit_test(test_per_client_cap),
		cmocka_unit_test_setup_teardown(test_sse_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_slow_reader, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_shutdown, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_shutdown_event, setup_shutdown_event,
						teardown),
		cmocka_unit_test_setup_teardown(test_sse_many, setup, teardown),
		cmocka_unit_test_setup_teardown(test_later, setup, teardown),
		cmocka_unit_test_setup_teardown(test_later_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_later_shutdown, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_curl, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
