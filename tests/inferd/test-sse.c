/* test-sse.c — kiln-inferd's Server-Sent Events (services/inferd/sse.c) on
 * kiln/http.h's byte streams, against real sockets on 127.0.0.1.
 *
 * The framing itself (a data line per line, the blank line), then a server
 * on an ephemeral port, read by tests/lib/http-client.h's raw-socket
 * client: event order and incremental delivery (event i is read before
 * event i+1 exists), cancel within 1 s of a disconnect while the producer
 * is idle, a reader that stops reading (bounded buffer, -ETIMEDOUT, then
 * every event in order), shutdown with an open stream (no [DONE]; with
 * inferd_sse_shutdown as the server's shutdown bytes, OpenAI's error event
 * and [DONE]), 500 streams fed by one thread, and curl -N when installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../lib/http-client.h"
#include "../../services/inferd/inferd.h"
#include "kiln/macro.h"

/* data framed as one event is exactly want */
static void assert_event(const char *data, const char *want)
{
	_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
	kiln_strbuf_init(&b);
	assert_int_equal(inferd_sse_event(&b, data), 0);
	assert_string_equal(b.s, want);
}

static void test_event_framing(void **state)
{
	assert_event("{\"i\":0}", "data: {\"i\":0}\n\n");
	assert_event("line1\nline2", "data: line1\ndata: line2\n\n");
	assert_event("end\n", "data: end\ndata: \n\n");
	assert_event("", "data: \n\n");
	/* the shutdown bytes: one OpenAI error event, then [DONE] */
	const char *done = strstr(inferd_sse_shutdown, "\n\ndata: [DONE]\n\n");
	assert_non_null(done);
	assert_true(strncmp(inferd_sse_shutdown, "data: {\"error\":{", 16) == 0);
	assert_string_equal(done + 2, "data: [DONE]\n\n");
	assert_int_equal(strcspn(inferd_sse_shutdown, "\n"), (size_t) (done - inferd_sse_shutdown));
}

/* ---- the server under test ---- */

/* The producer (p first: the cancel callback gets &ctl.p) and what the
 * SSE cases count. */
typedef struct sse_ctl {
	test_producer p;
	int slow_events, slow_timeouts;
	size_t slow_max_buffered;
	sem_t slow_done;
	int prod_err;	      /* first unexpected producer error */
	int slow_seen_events; /* at the third timeout */
	size_t slow_seen_buffered;
} sse_ctl;

enum { SSE_ORDERED, SSE_WAIT_CANCEL, SSE_SLOW, SSE_QUICK };

static sse_ctl ctl;

/* cmocka's asserts must stay on the test thread: the producer records. */
#define CHECK(expr)                              \
	do {                                     \
		int _q = (expr);                 \
		if (_q != 0 && c->prod_err == 0) \
			c->prod_err = _q;        \
	} while (0)

/* Events of 1.2 KiB until backpressure has been seen three times and 4000
 * events are out. */
static void produce_slow(sse_ctl *c, kiln_http_stream *s)
{
	char ev[1200];
	memset(ev, 'x', sizeof(ev) - 1);
	ev[sizeof(ev) - 1] = 0;
	for (int i = 0; i < 100000; i++) {
		int n = snprintf(ev, sizeof(ev), "%08d", i);
		ev[n] = 'x';
		int q = inferd_sse_send(s, ev, 100);
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
}

static void *producer(void *arg)
{
	sse_ctl *c = arg;
	kiln_http_stream *s = c->p.stream;
	char ev[64];
	switch (c->p.mode) {
	case SSE_ORDERED:
		for (int i = 0; i < 5; i++) {
			sem_wait(&c->p.go);
			snprintf(ev, sizeof(ev), "{\"i\":%d}", i);
			/* counted first: the client may read it before send returns */
			atomic_fetch_add(&c->p.produced, 1);
			CHECK(inferd_sse_send(s, ev, -1));
		}
		break;
	case SSE_QUICK:
		for (int i = 0; i < 3; i++) {
			_cleanup_json_ json_t *j = json_pack("{s:i, s:s}", "i", i, "t", "a\"b");
			CHECK(inferd_sse_send_json(s, j, -1));
		}
		CHECK(inferd_sse_send(s, "line1\nline2", -1));
		break;
	case SSE_WAIT_CANCEL:
		CHECK(inferd_sse_send(s, "{\"i\":0}", -1));
		atomic_fetch_add(&c->p.produced, 1);
		/* wait for cancel (or the test giving up) */
		sem_wait(&c->p.go);
		c->p.send_after_cancel = inferd_sse_send(s, "{\"i\":1}", 0);
		break;
	case SSE_SLOW:
		produce_slow(c, s);
		break;
	}
	c->p.close_rc = inferd_sse_close(s, true);
	return NULL;
}

static int h_stream(kiln_http_request *r, void *u)
{
	sse_ctl *c = u;
	int q = inferd_sse_reply(r, producer_on_cancel, &c->p, &c->p.stream);
	if (q < 0)
		return q;
	c->p.started = true;
	return pthread_create(&c->p.thread, NULL, producer, c) != 0 ? -EAGAIN : 0;
}

/* /many: streams for the test thread to feed */
#define N_STREAMS 500
static kiln_http_stream *many[N_STREAMS];
static atomic_int n_many;

static int h_many(kiln_http_request *r, void *u)
{
	kiln_http_stream *st;
	int q = inferd_sse_reply(r, NULL, NULL, &st);
	if (q < 0)
		return q;
	int i = atomic_fetch_add(&n_many, 1);
	if (i >= N_STREAMS)
		return inferd_sse_close(st, false);
	many[i] = st;
	return 0;
}

static const kiln_http_route routes[] = {
	{ "GET", "/stream", false, h_stream, &ctl },
	{ "GET", "/many", false, h_many, NULL },
};

#define TEST_BUFFER ((size_t) 16 << 10)

static kiln_http_server *srv;
static uint16_t port;

static int setup_with(const char *shutdown_bytes)
{
	memset(&ctl, 0, sizeof(ctl));
	sem_init(&ctl.p.go, 0, 0);
	sem_init(&ctl.slow_done, 0, 0);
	port = test_server_start(routes, ARRAY_SIZE(routes),
				 (kiln_http_config){ .stream_buffer_bytes = TEST_BUFFER,
						     .stream_shutdown_bytes = shutdown_bytes },
				 &srv);
	return 0;
}

static int setup(void **state)
{
	return setup_with(NULL);
}

/* kiln-inferd's own shutdown bytes */
static int setup_inferd_shutdown(void **state)
{
	return setup_with(inferd_sse_shutdown);
}

static int teardown(void **state)
{
	kiln_http_server_free(srv);
	srv = NULL;
	if (ctl.p.started)
		pthread_join(ctl.p.thread, NULL);
	sem_destroy(&ctl.p.go);
	sem_destroy(&ctl.slow_done);
	return 0;
}

/* The producer is done: it saw no unexpected error. */
static void join_producer(void)
{
	pthread_join(ctl.p.thread, NULL);
	ctl.p.started = false;
	assert_int_equal(ctl.prod_err, 0);
}

/* Reads SSE bytes until a blank line: one event ("data: ...\n\n"). */
static int read_event(conn *c, response *r, char *out, size_t size)
{
	for (;;) {
		/* events may straddle chunks; keep unread decoded bytes in r->body */
		char *end = r->body.s ? strstr(r->body.s, "\n\n") : NULL;
		if (end) {
			size_t n = (size_t) (end - r->body.s) + 2;
			snprintf(out, size, "%.*s", (int) n, r->body.s);
			memmove(r->body.s, r->body.s + n, r->body.len - n + 1);
			r->body.len -= n;
			return 0;
		}
		int q = read_chunk(c, &r->body);
		if (q <= 0)
			return q == 0 ? -EPIPE : q;
	}
}

/* Opens /stream and reads the response head (and the first event when
 * first is not NULL). */
static conn *open_stream(response *r, char *first, size_t size)
{
	conn *c = conn_get(port, 0, "/stream");
	assert_int_equal(read_head(c, r), 0);
	if (first)
		assert_int_equal(read_event(c, r, first, size), 0);
	return c;
}

static void test_sse_order(void **state)
{
	ctl.p.mode = SSE_ORDERED;
	response r;
	conn *c = open_stream(&r, NULL, 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(resp_header(&r, "Content-Type"), "text/event-stream");
	assert_string_equal(resp_header(&r, "Cache-Control"), "no-cache");
	assert_true(r.chunked);
	char ev[256], want[64];
	for (int i = 0; i < 5; i++) {
		sem_post(&ctl.p.go); /* let the producer make event i */
		assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
		snprintf(want, sizeof(want), "data: {\"i\":%d}\n\n", i);
		assert_string_equal(ev, want);
		/* incremental: event i arrived before event i+1 was produced */
		assert_int_equal(atomic_load(&ctl.p.produced), i + 1);
	}
	assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
	assert_string_equal(ev, "data: [DONE]\n\n");
	assert_int_equal(read_chunk(c, &r.body), 0); /* the chunked end */
	kiln_strbuf_free(&r.body);
	conn_close(c);
	join_producer();
	assert_int_equal(ctl.p.close_rc, 0);
	assert_false(atomic_load(&ctl.p.cancelled));
}

static void test_sse_disconnect(void **state)
{
	ctl.p.mode = SSE_WAIT_CANCEL;
	response r;
	char ev[256];
	conn *c = open_stream(&r, ev, sizeof(ev));
	assert_string_equal(ev, "data: {\"i\":0}\n\n");
	kiln_strbuf_free(&r.body);
	/* the producer is idle (its stream suspended) when the client leaves */
	hang_up(c, &ctl.p.cancelled, &ctl.p.cancel_ms, "SSE stream");
	assert_string_equal(access_wait("/stream"), "GET /stream 200 stream aborted");
	/* the producer's send and close after the cancel */
	join_producer();
	assert_int_equal(ctl.p.send_after_cancel, -ECANCELED);
	assert_int_equal(ctl.p.close_rc, -ECANCELED);
}

static void test_sse_slow_reader(void **state)
{
	ctl.p.mode = SSE_SLOW;
	/* a small receive window so the kernel does not soak it all up */
	conn *c = conn_get(port, 4096, "/stream");
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
	assert_true(maxbuf <= TEST_BUFFER + 1300);
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
	join_producer();
	assert_int_equal(i, ctl.slow_events);
	assert_int_equal(ctl.p.close_rc, 0);
}

/* The server stops with a stream open: the producer is cancelled, the
 * client gets the shutdown bytes (when set) and the end. */
static void stop_with_open_stream(const char *const *then)
{
	ctl.p.mode = SSE_WAIT_CANCEL;
	response r;
	char ev[512];
	conn *c = open_stream(&r, ev, sizeof(ev));
	double t0 = now_ms();
	kiln_http_server_free(srv);
	srv = NULL;
	double dt = now_ms() - t0;
	print_message("# server stopped with an open stream in %.1f ms\n", dt);
	assert_true(dt < KILN_HTTP_SHUTDOWN_GRACE_MS + 1000);
	assert_true(atomic_load(&ctl.p.cancelled));
	for (; *then; then++) {
		assert_int_equal(read_event(c, &r, ev, sizeof(ev)), 0);
		assert_string_equal(ev, *then);
	}
	int q = read_event(c, &r, ev, sizeof(ev));
	assert_true(q == -EPIPE || q == -ECONNRESET);
	kiln_strbuf_free(&r.body);
	conn_close(c);
	join_producer();
	assert_int_equal(ctl.p.send_after_cancel, -ECANCELED);
}

/* Without shutdown bytes the client sees the stream end (no [DONE]). */
static void test_sse_shutdown(void **state)
{
	stop_with_open_stream((const char *const[]){ NULL });
}

/* kiln-inferd's: a stream cut by the shutdown ends with OpenAI's error
 * event and [DONE], after what it had. */
static void test_sse_shutdown_event(void **state)
{
	char event[512];
	snprintf(event, sizeof(event), "%.*s",
		 (int) (strstr(inferd_sse_shutdown, "\n\n") + 2 - inferd_sse_shutdown),
		 inferd_sse_shutdown);
	assert_non_null(strstr(event, "\"code\":\"server_shutdown\""));
	stop_with_open_stream((const char *const[]){ event, "data: [DONE]\n\n", NULL });
}

static void test_sse_many(void **state)
{
	if (!raise_nofile(2 * N_STREAMS + 64))
		skip();
	atomic_store(&n_many, 0);
	conn **cs = calloc(N_STREAMS, sizeof(*cs));
	assert_non_null(cs);
	double t0 = now_ms();
	for (int i = 0; i < N_STREAMS; i++) {
		cs[i] = conn_get(port, 0, "/many");
	}
	assert_int_equal(wait_flag(&n_many, N_STREAMS, 10000), N_STREAMS);
	/* one producer (this thread) feeds every stream, never blocking */
	char ev[64];
	for (int k = 0; k < 10; k++)
		for (int i = 0; i < N_STREAMS; i++) {
			snprintf(ev, sizeof(ev), "{\"k\":%d}", k);
			assert_int_equal(inferd_sse_send(many[i], ev, 0), 0);
		}
	for (int i = 0; i < N_STREAMS; i++)
		assert_int_equal(inferd_sse_close(many[i], true), 0);
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

static void test_sse_curl(void **state)
{
	if (access("/usr/bin/curl", X_OK) != 0)
		skip();
	ctl.p.mode = SSE_QUICK;
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
	join_producer();
	assert_int_equal(ctl.p.close_rc, 0);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_event_framing),
		cmocka_unit_test_setup_teardown(test_sse_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_disconnect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_slow_reader, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_shutdown, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_shutdown_event, setup_inferd_shutdown,
						teardown),
		cmocka_unit_test_setup_teardown(test_sse_many, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sse_curl, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
