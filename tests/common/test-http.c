/* test-http.c — kiln/http.h against real sockets on 127.0.0.1.
 *
 * The raw-socket HTTP/1.1 client of tests/lib/http-client.h talks to a
 * server on an ephemeral port: routing, 404/405, JSON echo, 413 without
 * reading the body, malformed requests, 500 concurrent connections, a
 * streamed reply's bytes, deferred replies (answered, given up, client
 * gone, server stopping), and curl's CLI when it is installed.  The
 * streams' machinery under load (order, incremental delivery, cancel on
 * disconnect, backpressure, shutdown) is tested through kiln-inferd's
 * Server-Sent Events, in tests/inferd/test-sse.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <fcntl.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/http-client.h"
#include "kiln/http.h"
#include "kiln/json.h"
#include "kiln/macro.h"
#include "kiln/strbuf.h"

/* ---- the server under test ---- */

enum { STREAM_BYTES, LATER_OK, LATER_WAIT_CANCEL, LATER_CLOSE };

static test_producer ctl;

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

static void *producer(void *arg)
{
	test_producer *c = arg;
	kiln_http_stream *s = c->stream;
	switch (c->mode) {
	case STREAM_BYTES:
		/* the bytes go out as they are, the close's last */
		c->send_after_cancel = kiln_http_stream_write(s, "abc", 3, -1);
		if (c->send_after_cancel == 0)
			c->send_after_cancel = kiln_http_stream_write(s, "d\nef", 4, -1);
		c->close_rc = kiln_http_stream_close(s, "END", 3);
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
		c->send_after_cancel = kiln_http_stream_write(s, "x", 1, 0); /* not a stream */
		c->close_rc = kiln_http_later_error(s, 500, NULL, NULL, NULL, "too late");
		break;
	case LATER_CLOSE:
		c->close_rc = kiln_http_stream_close(s, "x", 1);
		break;
	}
	return NULL;
}

/* /stream and /later: the reply, then a producer thread answers it. */
static int h_produced(kiln_http_request *r, void *u)
{
	test_producer *c = u;
	int q = streq(kiln_http_request_path(r), "/stream")
			? kiln_http_reply_stream(r, "application/octet-stream", producer_on_cancel,
						 c, &c->stream)
			: kiln_http_reply_later(r, producer_on_cancel, c, &c->stream);
	if (q < 0)
		return q;
	c->started = true;
	if (pthread_create(&c->thread, NULL, producer, c) != 0)
		return -EAGAIN;
	return 0;
}

static const kiln_http_route routes[] = {
	{ "GET", "/hello", false, h_hello, NULL },     { "POST", "/echo", false, h_echo, NULL },
	{ "PUT", "/echo", false, h_echo, NULL },       { "GET", "/info", false, h_info, NULL },
	{ "GET", "/v1/models/", true, h_info, NULL },  { "GET", "/busy", false, h_busy, NULL },
	{ "GET", "/down", false, h_down, NULL },       { "GET", "/fail", false, h_fail, NULL },
	{ "GET", "/stream", false, h_produced, &ctl }, { "GET", "/later", false, h_produced, &ctl },
};

#define TEST_BODY_MAX ((size_t) 1 << 20)

static kiln_http_server *srv;
static uint16_t port;

static int setup(void **state)
{
	memset(&ctl, 0, sizeof(ctl));
	sem_init(&ctl.go, 0, 0);
	port = test_server_start(routes, ARRAY_SIZE(routes),
				 (kiln_http_config){ .max_body_bytes = TEST_BODY_MAX }, &srv);
	return 0;
}

static int teardown(void **state)
{
	kiln_http_server_free(srv);
	srv = NULL;
	if (ctl.started)
		pthread_join(ctl.thread, NULL);
	sem_destroy(&ctl.go);
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
	assert_string_equal(access_wait("/fail"), "GET /fail 500 plain");
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
	if (!raise_nofile(2 * N_CONCURRENT + 64))
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

/* A streamed reply carries the producer's bytes as they are, chunked. */
static void test_stream_bytes(void **state)
{
	response r;
	ctl.mode = STREAM_BYTES;
	assert_int_equal(request(port, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(resp_header(&r, "Content-Type"), "application/octet-stream");
	assert_string_equal(resp_header(&r, "Cache-Control"), "no-cache");
	assert_string_equal(resp_header(&r, "X-Accel-Buffering"), "no");
	assert_true(r.chunked);
	assert_string_equal(r.body.s, "abcd\nefEND");
	kiln_strbuf_free(&r.body);
	pthread_join(ctl.thread, NULL);
	ctl.started = false;
	assert_int_equal(ctl.send_after_cancel, 0);
	assert_int_equal(ctl.close_rc, 0);
	assert_string_equal(access_wait("/stream"), "GET /stream 200 stream");
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
	pthread_join(ctl.thread, NULL);
	ctl.started = false;
	assert_int_equal(ctl.close_rc, 0);
	assert_string_equal(access_wait("/later"), "GET /later 201 plain");

	/* the producer gives up without a reply: 500 */
	ctl.mode = LATER_CLOSE;
	assert_int_equal(request(port, "GET /later HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_error_shape(&r, 500, "server_error", NULL, NULL);
	kiln_strbuf_free(&r.body);
	pthread_join(ctl.thread, NULL);
	ctl.started = false;
	assert_int_equal(ctl.close_rc, 0);
	assert_false(atomic_load(&ctl.cancelled));
}

static void test_later_disconnect(void **state)
{
	ctl.mode = LATER_WAIT_CANCEL;
	conn *c = conn_get(port, 0, "/later");
	assert_int_equal(wait_flag(&ctl.produced, 1, 5000), 1);
	usleep(50000);
	hang_up(c, &ctl.cancelled, &ctl.cancel_ms, "deferred reply");
	pthread_join(ctl.thread, NULL);
	ctl.started = false;
	assert_int_equal(ctl.send_after_cancel, -EINVAL);
	assert_int_equal(ctl.close_rc, -ECANCELED);
	assert_string_equal(access_wait("/later"), "GET /later 0 plain aborted");
}

static void test_later_shutdown(void **state)
{
	ctl.mode = LATER_WAIT_CANCEL;
	conn *c = conn_get(port, 0, "/later");
	wait_flag(&ctl.produced, 1, 5000);
	kiln_http_server_free(srv);
	srv = NULL;
	assert_true(atomic_load(&ctl.cancelled));
	response r;
	assert_int_equal(read_response(c, &r, false), 0);
	assert_error_shape(&r, 503, "server_error", "shutting_down", NULL);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	pthread_join(ctl.thread, NULL);
	ctl.started = false;
	assert_int_equal(ctl.close_rc, -ECANCELED);
}

static void test_curl(void **state)
{
	if (access("/usr/bin/curl", X_OK) != 0)
		skip();
	/* a plain request with a body through curl */
	char cmd[256], out[1024];
	snprintf(cmd, sizeof(cmd),
		 "/usr/bin/curl -sS --max-time 10 -d '{\"name\":\"c\"}' "
		 "-H 'Content-Type: application/json' http://127.0.0.1:%u/echo",
		 port);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	assert_int_equal(pclose(p), 0);
	assert_string_equal(out, "{\"name\":\"c\"}");
}

/* A socket bound before the server starts (bind-before-load) serves; while
 * it is held nobody else binds the port, and kiln_http_port_holder() names
 * this process as the holder. */
static void test_listen_fd(void **state)
{
	int fd = kiln_http_listen("127.0.0.1", 0);
	assert_true(fd >= 0);
	/* bound and listening before any server: a second bind is refused */
	struct sockaddr_in sa;
	socklen_t l = sizeof(sa);
	assert_int_equal(getsockname(fd, (struct sockaddr *) &sa, &l), 0);
	uint16_t p = ntohs(sa.sin_port);
	assert_int_equal(kiln_http_listen("127.0.0.1", p), -EADDRINUSE);
	assert_int_equal(kiln_http_listen("0.0.0.0", p), -EADDRINUSE);
	char who[160];
	assert_int_equal(kiln_http_port_holder(p, who, sizeof(who)), 0);
	char want[64];
	snprintf(want, sizeof(want), "(uid %u), pid %d", (unsigned) getuid(), (int) getpid());
	print_message("# port %u held by %s\n", p, who);
	assert_non_null(strstr(who, want));

	kiln_http_server *s = NULL;
	kiln_http_config cfg = { .routes = routes, .n_routes = ARRAY_SIZE(routes) };
	assert_int_equal(kiln_http_server_start_fd(&cfg, fd, &s), 0);
	assert_int_equal(kiln_http_server_port(s), p);
	response r;
	assert_int_equal(request(p, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", &r), 0);
	assert_int_equal(r.status, 200);
	kiln_strbuf_free(&r.body);
	kiln_http_server_free(s);
	/* freed: the port is free again, and nobody holds it */
	assert_int_equal(kiln_http_port_holder(p, who, sizeof(who)), -ENOENT);
	fd = kiln_http_listen("127.0.0.1", p);
	assert_true(fd >= 0);
	close(fd);
}

/* What start_fd refuses: a socket that does not listen, a datagram socket;
 * the fd is closed either way. */
static void test_listen_fd_refused(void **state)
{
	kiln_http_server *s = NULL;
	kiln_http_config cfg = { .routes = routes, .n_routes = ARRAY_SIZE(routes) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(kiln_http_server_start_fd(&cfg, fd, &s), -ENOTSOCK);
	assert_int_equal(fcntl(fd, F_GETFD), -1); /* closed */
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_int_equal(kiln_http_server_start_fd(&cfg, fd, &s), -ENOTSOCK);
	assert_null(s);
	assert_int_equal(kiln_http_server_start_fd(&cfg, -1, &s), -EINVAL);
	assert_int_equal(kiln_http_listen("not-an-ip", 0), -EINVAL);
}

/* systemd's socket activation in a child (it takes fd 3 over): LISTEN_FDS=1
 * and LISTEN_PID=us with a listening socket at fd 3 -> 3 and the variables
 * gone; not our pid -> 0; two fds, or a non-listening one -> -EINVAL. */
static int activation_child(int how)
{
	int fd = how == 3 ? socket(AF_INET, SOCK_STREAM, 0) : kiln_http_listen("127.0.0.1", 0);
	if (fd < 0 || dup2(fd, 3) < 0)
		return 10;
	char pid[32];
	snprintf(pid, sizeof(pid), "%d", how == 1 ? 1 : (int) getpid());
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", how == 2 ? "2" : "1", 1);
	if (how == 2 && dup2(fd, 4) < 0)
		return 10;
	int r = kiln_http_activation_fd();
	switch (how) {
	case 0:
		return r == 3 && !getenv("LISTEN_FDS") && !getenv("LISTEN_PID") ? 0 : 1;
	case 1:
		return r == 0 ? 0 : 1;
	default:
		return r == -EINVAL ? 0 : 1;
	}
}

static void test_activation(void **state)
{
	assert_int_equal(kiln_http_activation_fd(), 0); /* not activated */
	for (int how = 0; how < 4; how++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0)
			_exit(activation_child(how));
		int st;
		assert_int_equal(waitpid(pid, &st, 0), pid);
		print_message("# activation case %d: exit %d\n", how, WEXITSTATUS(st));
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
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
		cmocka_unit_test(test_listen_fd),
		cmocka_unit_test(test_listen_fd_refused),
		cmocka_unit_test(test_activation),
		cmocka_unit_test_setup_teardown(test_stream_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_later, setup, teardown),
		cmocka_unit_test_setup_teardown(test_later_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_later_shutdown, setup, teardown),
		cmocka_unit_test_setup_teardown(test_curl, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
