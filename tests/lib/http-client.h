/* tests/lib/http-client.h — a small raw-socket HTTP/1.1 client for the
 * suites that test a kiln/http.h server on 127.0.0.1 (tests/common/
 * test-http.c, tests/inferd/test-sse.c): connections with a 10 s receive
 * timeout, responses with their headers, a chunked decoder, the body as
 * JSON and OpenAI's error shape checked, and the server they talk to
 * started and its access log recorded, so the suites share one client
 * instead of each writing its own.  Asserts with cmocka: call it from the
 * test thread. */
#pragma once

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <sys/resource.h>

#include "kiln/http.h"
#include "kiln/strbuf.h"

typedef struct conn {
	int fd;
	char buf[1 << 16];
	size_t off, len;
	bool eof;
} conn;

typedef struct response {
	int status;
	char headers[8192];
	bool chunked;
	long content_length;
	kiln_strbuf body;
} response;

/* CLOCK_MONOTONIC in milliseconds. */
double now_ms(void);

/* Connects to 127.0.0.1:port (rcvbuf > 0: that SO_RCVBUF); asserts. */
conn *conn_open(uint16_t port, int rcvbuf);
void conn_close(conn *c);
/* conn_open(), then "GET path HTTP/1.1" sent (the response not read). */
conn *conn_get(uint16_t port, int rcvbuf, const char *path);
/* Sends all of data: 0 or -errno. */
int conn_send(conn *c, const char *data, size_t len);
/* Reads what the socket has: bytes read, 0 at EOF, or -errno. */
int conn_fill(conn *c);
/* A line without its CRLF into out; -EPIPE at EOF. */
int conn_line(conn *c, char *out, size_t size);
/* n bytes appended to out; -EPIPE at EOF. */
int conn_bytes(conn *c, kiln_strbuf *out, size_t n);

/* A response header's value (case-insensitive name), NULL when absent;
 * valid until the next call on this thread. */
const char *resp_header(const response *r, const char *name);
/* The status line and headers into r (its body empty, initialised). */
int read_head(conn *c, response *r);
/* One chunk of a chunked body appended to out: 1, 0 at the last chunk,
 * or -errno. */
int read_chunk(conn *c, kiln_strbuf *out);
/* A whole response (head: no body expected). */
int read_response(conn *c, response *r, bool head);
/* Sends raw on a new connection and reads the response. */
int request(uint16_t port, const char *raw, response *r);
/* The body parsed as JSON (NULL, with a message, when it is not). */
json_t *body_json(const response *r);
/* Checks OpenAI's error shape: status, type, code (NULL: null), message
 * (NULL: any), and the request id matching X-Request-Id. */
void assert_error_shape(const response *r, unsigned status, const char *type, const char *code,
			const char *message);

/* The thread that answers a stream or a deferred reply in a test, and what
 * it and the test tell each other.  A suite's handler replies with
 * producer_on_cancel and the producer as userdata, then starts the
 * thread. */
typedef struct test_producer {
	atomic_int mode; /* set by the test, read by the producer (via a socket: no HB for TSan) */
	kiln_http_stream *stream;
	pthread_t thread;
	bool started;
	sem_t go; /* posted by the test, or by the cancel */
	atomic_int produced;
	atomic_int cancelled;
	double cancel_ms; /* when the cancel ran (now_ms()) */
	int send_after_cancel, close_rc;
} test_producer;

/* The cancel callback: records when, sets cancelled, posts go. */
void producer_on_cancel(kiln_http_stream *s, void *userdata);

/* Waits up to ms milliseconds for *flag to reach at least want (another
 * thread sets it); its value then. */
int wait_flag(atomic_int *flag, int want, int ms);

/* The client hangs up on a reply whose producer is waiting: closes c and
 * asserts that the reply's cancel callback (which sets *cancel_ms, then
 * *cancelled) had not run before and runs within 1 s after; prints the
 * delay with what ("SSE stream", "deferred reply"). */
void hang_up(conn *c, atomic_int *cancelled, const double *cancel_ms, const char *what);

/* Raises RLIMIT_NOFILE to need when it is lower; false when it cannot. */
bool raise_nofile(rlim_t need);

/* Starts a test server on routes from cfg (anything else the suite sets) with
 * what every suite wants where cfg leaves it 0: 127.0.0.1 on an ephemeral
 * port, 2 threads, a 20 s idle timeout, 1000 connections per client (every
 * test client is 127.0.0.1), and its access log recorded for
 * access_wait() (the record starts empty).  Asserts; returns the port. */
uint16_t test_server_start(const kiln_http_route *routes, size_t n_routes, kiln_http_config cfg,
			   kiln_http_server **ret);
/* Waits (5 s at most) for the access log line of path, "METHOD PATH
 * STATUS stream|plain[ aborted]"; "" when none came. */
const char *access_wait(const char *path);
