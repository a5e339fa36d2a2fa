/* http-client.c — the raw-socket HTTP/1.1 client of the HTTP suites (see
 * http-client.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http-client.h"
#include "kiln/macro.h"

double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double) t.tv_sec * 1e3 + (double) t.tv_nsec / 1e6;
}

conn *conn_open(uint16_t port, int rcvbuf)
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

conn *conn_get(uint16_t port, int rcvbuf, const char *path)
{
	conn *c = conn_open(port, rcvbuf);
	char req[512];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	assert_int_equal(conn_send(c, req, (size_t) n), 0);
	return c;
}

void conn_close(conn *c)
{
	if (!c)
		return;
	close(c->fd);
	free(c);
}

int conn_send(conn *c, const char *data, size_t len)
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

int conn_fill(conn *c)
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
int conn_line(conn *c, char *out, size_t size)
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

int conn_bytes(conn *c, kiln_strbuf *out, size_t n)
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

const char *resp_header(const response *r, const char *name)
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

int read_head(conn *c, response *r)
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
int read_chunk(conn *c, kiln_strbuf *out)
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

int read_response(conn *c, response *r, bool head)
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

int request(uint16_t port, const char *raw, response *r)
{
	conn *c = conn_open(port, 0);
	int q = conn_send(c, raw, strlen(raw));
	if (q >= 0)
		q = read_response(c, r, strncmp(raw, "HEAD ", 5) == 0);
	conn_close(c);
	return q;
}

json_t *body_json(const response *r)
{
	json_error_t je;
	json_t *j = json_loadb(r->body.s ?: "", r->body.len, 0, &je);
	if (!j)
		print_error("body is not JSON (%s): %.*s\n", je.text, (int) r->body.len,
			    r->body.s ?: "");
	return j;
}

/* OpenAI's error shape, as http-client.h says. */
void assert_error_shape(const response *r, unsigned status, const char *type, const char *code,
			const char *message)
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

void producer_on_cancel(kiln_http_stream *s, void *userdata)
{
	test_producer *p = userdata;
	p->cancel_ms = now_ms();
	atomic_store(&p->cancelled, 1);
	sem_post(&p->go); /* wake a producer waiting for the test */
}

int wait_flag(atomic_int *flag, int want, int ms)
{
	for (int i = 0; i < ms / 10 && atomic_load(flag) < want; i++)
		usleep(10000);
	return atomic_load(flag);
}

void hang_up(conn *c, atomic_int *cancelled, const double *cancel_ms, const char *what)
{
	assert_false(atomic_load(cancelled));
	double t0 = now_ms();
	conn_close(c);
	assert_true(wait_flag(cancelled, 1, 3000));
	double dt = *cancel_ms - t0;
	print_message("# %s: cancel fired %.1f ms after the client closed\n", what, dt);
	assert_true(dt < 1000);
}

bool raise_nofile(rlim_t need)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < need) {
		rl.rlim_cur = MIN(rl.rlim_max, MAX(need, (rlim_t) 4096));
		setrlimit(RLIMIT_NOFILE, &rl);
		getrlimit(RLIMIT_NOFILE, &rl);
	}
	return rl.rlim_cur >= need;
}

/* The access log of the server test_server_start() started: lines in
 * completion order (which is not request order across threads). */
static char access_lines[1 << 16];
static pthread_mutex_t access_lock = PTHREAD_MUTEX_INITIALIZER;

static void access_record(const kiln_http_access *a, void *u)
{
	pthread_mutex_lock(&access_lock);
	size_t used = strlen(access_lines);
	snprintf(access_lines + used, sizeof(access_lines) - used, "%s %s %u %s%s\n", a->method,
		 a->path, a->status, a->stream ? "stream" : "plain", a->aborted ? " aborted" : "");
	pthread_mutex_unlock(&access_lock);
}

uint16_t test_server_start(const kiln_http_route *routes, size_t n_routes, kiln_http_config cfg,
			   kiln_http_server **ret)
{
	cfg.routes = routes;
	cfg.n_routes = n_routes;
	pthread_mutex_lock(&access_lock);
	access_lines[0] = 0;
	pthread_mutex_unlock(&access_lock);
	cfg.address = cfg.address ?: "127.0.0.1";
	cfg.threads = cfg.threads ?: 2;
	cfg.idle_timeout_s = cfg.idle_timeout_s ?: 20;
	cfg.max_connections_per_client = cfg.max_connections_per_client ?: 1000;
	cfg.access_log = access_record;
	assert_int_equal(kiln_http_server_start(&cfg, ret), 0);
	uint16_t port = kiln_http_server_port(*ret);
	assert_true(port > 0);
	return port;
}

const char *access_wait(const char *path)
{
	static char line[256];
	char pat[128];
	snprintf(pat, sizeof(pat), " %s ", path);
	line[0] = 0;
	for (int i = 0; i < 500 && !line[0]; i++) {
		pthread_mutex_lock(&access_lock);
		const char *p = strstr(access_lines, pat);
		if (p) {
			while (p > access_lines && p[-1] != '\n')
				p--;
			snprintf(line, sizeof(line), "%.*s", (int) strcspn(p, "\n"), p);
		}
		pthread_mutex_unlock(&access_lock);
		if (!line[0])
			usleep(10000);
	}
	return line;
}
