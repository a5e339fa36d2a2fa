/* http.c — the HTTP server glue on libmicrohttpd (see kiln/http.h).
 *
 * MHD calls on_request() several times per request: once when the headers
 * are in (we route, check limits, and may answer 404/405/413/414 before
 * reading any body), once per body chunk (buffered up to the limit), and
 * once at the end (the handler runs).  on_completed() logs the request and
 * releases it.
 *
 * Streams are shared by three parties, each holding a reference: the
 * producer (until kiln_http_stream_close), the MHD response (until its free
 * callback) and the connection (until on_completed).  The stream lock
 * orders everything else: the content reader suspends the connection under
 * it when the buffer is empty, and producers resume it under it, so a
 * resume can never overtake the suspend it answers. */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <pwd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "kiln/http.h"
#include "kiln/list.h"
#include "kiln/log.h"
#include "kiln/strbuf.h"

struct kiln_http_server {
	struct MHD_Daemon *mhd;
	uint16_t port;
	kiln_http_config cfg;
	kiln_http_route *routes;

	pthread_mutex_t lock; /* streams list, stopping */
	pthread_cond_t streams_done;
	kiln_http_stream *streams; /* connected streams */
	size_t n_streams;
	bool stopping;
	/* Set first when the server stops: new connections are refused by the
	 * accept policy (on_accept).  Not MHD_quiesce_daemon(): with a thread
	 * pool on epoll, libmicrohttpd 0.9.75 races its workers taking the
	 * listen socket out of their epoll sets and aborts the process
	 * ("Failed to remove listen FD from epoll set"), seen in test-sse. */
	atomic_bool refusing;

	pthread_t watcher;
	bool watcher_started;
	int wake_fd; /* eventfd: the stream set changed, or stop */
};

typedef struct header {
	char *name, *value;
} header;

struct kiln_http_request {
	kiln_http_server *srv;
	struct MHD_Connection *conn;
	const char *method, *url; /* MHD's, valid for the connection */
	const kiln_http_route *route;
	char id[KILN_HTTP_REQUEST_ID_MAX + 1];
	char client[64];
	kiln_strbuf body;
	bool too_big, dispatched, replied;
	size_t discarded; /* body bytes dropped after too_big */
	unsigned status;
	uint64_t bytes_out;
	struct timespec start;
	header *headers;
	size_t n_headers;
	kiln_http_stream *stream;
};

struct kiln_http_stream {
	kiln_http_server *srv;
	pthread_mutex_t lock;
	pthread_cond_t space; /* room in buf, or gone */
	pthread_cond_t cancel_done;
	unsigned refs;
	char *buf;
	size_t off, len;
	size_t cap;		     /* backpressure threshold */
	size_t alloc;		     /* allocated: cap, or one bigger write */
	struct MHD_Connection *conn; /* NULL once the connection ended */
	int fd;
	bool suspended;
	bool closed;	  /* producer closed: end after draining */
	bool gone;	  /* client gone: end now, sends fail */
	bool stopping;	  /* server stopping: drain, then end */
	int cancel_state; /* 0 not fired, 1 running, 2 done */
	pthread_t cancel_thread;
	kiln_http_cancel_fn on_cancel;
	void *userdata;
	uint64_t bytes_out;
	char id[KILN_HTTP_REQUEST_ID_MAX + 1];
	kiln_http_stream *prev, *next; /* srv->streams */

	/* a deferred reply (kiln_http_reply_later): no streamed body, one
	 * response made on the MHD thread once the producer filled these */
	bool deferred, ready;
	unsigned status;
	char *body, *content_type;
	size_t body_len;
};

static const struct {
	unsigned code;
	const char *text, *type;
} statuses[] = {
	{ 200, "OK", NULL },
	{ 201, "Created", NULL },
	{ 202, "Accepted", NULL },
	{ 204, "No Content", NULL },
	{ 400, "Bad Request", "invalid_request_error" },
	{ 401, "Unauthorized", "authentication_error" },
	{ 403, "Forbidden", "permission_error" },
	{ 404, "Not Found", "not_found_error" },
	{ 405, "Method Not Allowed", "invalid_request_error" },
	{ 408, "Request Timeout", "invalid_request_error" },
	{ 409, "Conflict", "invalid_request_error" },
	{ 413, "Content Too Large", "invalid_request_error" },
	{ 414, "URI Too Long", "invalid_request_error" },
	{ 415, "Unsupported Media Type", "invalid_request_error" },
	{ 422, "Unprocessable Content", "invalid_request_error" },
	{ 429, "Too Many Requests", "rate_limit_error" },
	{ 431, "Request Header Fields Too Large", "invalid_request_error" },
	{ 500, "Internal Server Error", "server_error" },
	{ 501, "Not Implemented", "server_error" },
	{ 502, "Bad Gateway", "server_error" },
	{ 503, "Service Unavailable", "server_error" },
	{ 504, "Gateway Timeout", "server_error" },
};

const char *kiln_http_status_text(unsigned status)
{
	for (size_t i = 0; i < ARRAY_SIZE(statuses); i++)
		if (statuses[i].code == status)
			return statuses[i].text;
	return "Unknown";
}

static const char *status_type(unsigned status)
{
	for (size_t i = 0; i < ARRAY_SIZE(statuses); i++)
		if (statuses[i].code == status && statuses[i].type)
			return statuses[i].type;
	return status >= 500 ? "server_error" : "invalid_request_error";
}

/* *t = CLOCK_REALTIME now plus ms (for pthread_cond_timedwait). */
static void deadline_in(struct timespec *t, unsigned ms)
{
	clock_gettime(CLOCK_REALTIME, t);
	t->tv_sec += ms / 1000;
	t->tv_nsec += (long) (ms % 1000) * 1000000L;
	if (t->tv_nsec >= 1000000000L) {
		t->tv_sec++;
		t->tv_nsec -= 1000000000L;
	}
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double) (t.tv_sec - t0->tv_sec) * 1e3 + (double) (t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* ---- streams: references, cancel, the watcher ---- */

static void stream_unref(kiln_http_stream *s)
{
	pthread_mutex_lock(&s->lock);
	unsigned left = --s->refs;
	pthread_mutex_unlock(&s->lock);
	if (left)
		return;
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->space);
	pthread_cond_destroy(&s->cancel_done);
	free(s->buf);
	free(s->body);
	free(s->content_type);
	free(s);
}

/* Runs on_cancel once unless the producer closed first.  Called without
 * s->lock held (on_cancel may take the producer's locks, and the producer
 * may be inside kiln_http_stream_write). */
static void stream_fire_cancel(kiln_http_stream *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->closed || s->cancel_state != 0 || !s->on_cancel) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	s->cancel_state = 1;
	s->cancel_thread = pthread_self();
	pthread_mutex_unlock(&s->lock);
	s->on_cancel(s, s->userdata);
	pthread_mutex_lock(&s->lock);
	s->cancel_state = 2;
	pthread_cond_broadcast(&s->cancel_done);
	pthread_mutex_unlock(&s->lock);
}

/* Wakes a suspended connection; s->lock held. */
static void stream_kick_locked(kiln_http_stream *s)
{
	if (s->suspended && s->conn) {
		s->suspended = false;
		MHD_resume_connection(s->conn);
	}
}

/* The client hung up (the watcher saw it).  A stream whose connection has
 * ended is left alone: the fd the watcher polled may already be another
 * connection's. */
static void stream_gone(kiln_http_stream *s)
{
	pthread_mutex_lock(&s->lock);
	if (!s->conn) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	bool was = s->gone;
	s->gone = true;
	stream_kick_locked(s);
	pthread_cond_broadcast(&s->space);
	pthread_mutex_unlock(&s->lock);
	if (!was)
		stream_fire_cancel(s);
}

static void wake_watcher(kiln_http_server *srv)
{
	uint64_t one = 1;
	if (write(srv->wake_fd, &one, sizeof(one)) < 0)
		log_debug("http: waking the stream watcher failed: %m, ignoring");
}

/* Polls the sockets of connected streams for a client that hung up:
 * suspended connections are invisible to MHD, and inferd must stop
 * generating for such a request at once, not at its next token. */
static void *watcher_main(void *arg)
{
	kiln_http_server *srv = arg;
	struct pollfd *pfd = NULL;
	kiln_http_stream **ss = NULL;
	size_t cap = 0;
	for (;;) {
		pthread_mutex_lock(&srv->lock);
		if (srv->stopping && srv->n_streams == 0) {
			pthread_mutex_unlock(&srv->lock);
			break;
		}
		if (srv->n_streams + 1 > cap) {
			size_t ncap = MAX(srv->n_streams + 1, cap * 2);
			struct pollfd *np = realloc(pfd, ncap * sizeof(*np));
			if (np)
				pfd = np;
			kiln_http_stream **ns = np ? realloc(ss, ncap * sizeof(*ns)) : NULL;
			if (ns)
				ss = ns;
			if (np && ns)
				cap = ncap;
		}
		size_t n = 0;
		for (kiln_http_stream *s = srv->streams; s && n + 1 < cap; s = s->next) {
			pthread_mutex_lock(&s->lock);
			int fd = s->gone || !s->conn ? -1 : s->fd;
			if (fd >= 0)
				s->refs++;
			pthread_mutex_unlock(&s->lock);
			if (fd < 0)
				continue;
			pfd[n] = (struct pollfd){ .fd = fd, .events = POLLRDHUP };
			ss[n++] = s;
		}
		bool stopping = srv->stopping;
		pthread_mutex_unlock(&srv->lock);
		struct pollfd wake = { .fd = srv->wake_fd, .events = POLLIN };
		if (cap > 0)
			pfd[n] = wake;
		/* stopping: streams are ending, poll briefly until they are gone */
		int r = poll(cap > 0 ? pfd : &wake, n + 1, stopping ? 50 : -1);
		if (r > 0) {
			for (size_t i = 0; i < n; i++)
				if (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
					stream_gone(ss[i]);
			if ((cap > 0 ? pfd[n].revents : wake.revents) & POLLIN) {
				uint64_t v;
				if (read(srv->wake_fd, &v, sizeof(v)) < 0)
					log_debug("http: reading the wake eventfd: %m, ignoring");
			}
		}
		for (size_t i = 0; i < n; i++)
			stream_unref(ss[i]);
	}
	free(pfd);
	free(ss);
	return NULL;
}

/* MHD content reader: hands buffered bytes over; suspends when empty. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
	kiln_http_stream *s = cls;
	pthread_mutex_lock(&s->lock);
	if (s->len > s->off && !s->gone) {
		size_t n = MIN(max, s->len - s->off);
		memcpy(out, s->buf + s->off, n);
		s->off += n;
		if (s->off == s->len)
			s->off = s->len = 0;
		s->bytes_out += n;
		pthread_cond_broadcast(&s->space);
		pthread_mutex_unlock(&s->lock);
		return (ssize_t) n;
	}
	ssize_t r;
	if (s->gone)
		r = MHD_CONTENT_READER_END_WITH_ERROR;
	else if (s->closed || s->stopping)
		r = MHD_CONTENT_READER_END_OF_STREAM;
	else {
		/* Suspend under the lock: the producer's resume comes after. */
		s->suspended = true;
		MHD_suspend_connection(s->conn);
		r = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

static void stream_response_free(void *cls)
{
	stream_unref(cls);
}

/* The connection ended (on_completed): detach, cancel if early, unlist. */
static void stream_detach(kiln_http_stream *s, bool complete)
{
	kiln_http_server *srv = s->srv;
	pthread_mutex_lock(&s->lock);
	s->conn = NULL;
	s->fd = -1;
	s->suspended = false;
	bool early = !complete && !s->gone;
	if (!complete)
		s->gone = true;
	pthread_cond_broadcast(&s->space);
	pthread_mutex_unlock(&s->lock);
	if (early)
		stream_fire_cancel(s);

	pthread_mutex_lock(&srv->lock);
	LIST_UNLINK(srv->streams, s);
	srv->n_streams--;
	pthread_cond_broadcast(&srv->streams_done);
	pthread_mutex_unlock(&srv->lock);
	wake_watcher(srv);
	stream_unref(s);
}

/* ---- replies ---- */

static int queue(kiln_http_request *r, unsigned status, struct MHD_Response *resp)
{
	if (!resp)
		return -ENOMEM;
	for (size_t i = 0; i < r->n_headers; i++)
		MHD_add_response_header(resp, r->headers[i].name, r->headers[i].value);
	MHD_add_response_header(resp, "X-Request-Id", r->id);
	enum MHD_Result q = MHD_queue_response(r->conn, status, resp);
	MHD_destroy_response(resp);
	if (q != MHD_YES)
		return -EIO;
	r->replied = true;
	r->status = status;
	return 0;
}

int kiln_http_set_header(kiln_http_request *r, const char *name, const char *value)
{
	assert_return(r && name && value && *name, -EINVAL);
	if (strpbrk(name, "\r\n: ") || strpbrk(value, "\r\n"))
		return -EINVAL;
	header *n = realloc(r->headers, (r->n_headers + 1) * sizeof(*n));
	if (!n)
		return -ENOMEM;
	r->headers = n;
	header h = { strdup(name), strdup(value) };
	if (!h.name || !h.value) {
		free(h.name);
		free(h.value);
		return -ENOMEM;
	}
	r->headers[r->n_headers++] = h;
	return 0;
}

int kiln_http_reply_text(kiln_http_request *r, unsigned status, const char *content_type,
			 const char *body, size_t len)
{
	assert_return(r && (body || len == 0), -EINVAL);
	assert_return(!r->replied, -EALREADY);
	struct MHD_Response *resp =
		MHD_create_response_from_buffer(len, (void *) (body ?: ""), MHD_RESPMEM_MUST_COPY);
	if (resp && content_type)
		MHD_add_response_header(resp, "Content-Type", content_type);
	int q = queue(r, status, resp);
	if (q >= 0)
		r->bytes_out = len;
	return q;
}

int kiln_http_reply_fd(kiln_http_request *r, unsigned status, const char *content_type, int fd,
		       uint64_t offset, uint64_t len)
{
	if (!r || fd < 0 || r->replied) {
		if (fd >= 0)
			close(fd);
		return !r || fd < 0 ? -EINVAL : -EALREADY;
	}
	/* MHD owns fd from here: it closes it when the response is freed */
	struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, offset);
	if (!resp) {
		close(fd);
		return -ENOMEM;
	}
	if (content_type)
		MHD_add_response_header(resp, "Content-Type", content_type);
	int q = queue(r, status, resp);
	if (q >= 0)
		r->bytes_out = streq(r->method, "HEAD") ? 0 : len;
	return q;
}

int kiln_http_reply_empty(kiln_http_request *r, unsigned status)
{
	return kiln_http_reply_text(r, status, NULL, "", 0);
}

int kiln_http_reply_json(kiln_http_request *r, unsigned status, const json_t *body)
{
	assert_return(r && body, -EINVAL);
	assert_return(!r->replied, -EALREADY);
	_cleanup_free_ char *txt = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
	if (!txt)
		return -ENOMEM;
	return kiln_http_reply_text(r, status, "application/json", txt, strlen(txt));
}

/* {"error":{...}} for a request id; NULL on ENOMEM. */
static json_t *error_vjson(const char *id, unsigned status, const char *type, const char *param,
			   const char *code, const char *fmt, va_list ap)
{
	_cleanup_free_ char *msg = NULL;
	if (vasprintf(&msg, fmt, ap) < 0)
		return NULL;
	return json_pack("{s:{s:s, s:s, s:o, s:o, s:s}}", "error", "message", msg, "type",
			 type ?: status_type(status), "param",
			 param ? json_string(param) : json_null(), "code",
			 code ? json_string(code) : json_null(), "request_id", id);
}

static int reply_verror(kiln_http_request *r, unsigned status, const char *type, const char *param,
			const char *code, const char *fmt, va_list ap)
{
	_cleanup_json_ json_t *err = error_vjson(r->id, status, type, param, code, fmt, ap);
	if (!err)
		return -ENOMEM;
	return kiln_http_reply_json(r, status, err);
}

int kiln_http_reply_error(kiln_http_request *r, unsigned status, const char *type,
			  const char *param, const char *code, const char *fmt, ...)
{
	assert_return(r && fmt, -EINVAL);
	assert_return(!r->replied, -EALREADY);
	va_list ap;
	va_start(ap, fmt);
	int q = reply_verror(r, status, type, param, code, fmt, ap);
	va_end(ap);
	return q;
}

int kiln_http_reply_json_error(kiln_http_request *r, const kiln_error *e)
{
	assert_return(r && e, -EINVAL);
	return kiln_http_reply_error(r, 400, "invalid_request_error", e->where[0] ? e->where : NULL,
				     NULL, "%s", e->msg);
}

int kiln_http_reply_retry(kiln_http_request *r, unsigned status, unsigned retry_after_s,
			  const char *code, const char *fmt, ...)
{
	assert_return(r && fmt, -EINVAL);
	assert_return(!r->replied, -EALREADY);
	if (retry_after_s > 0) {
		char v[16];
		snprintf(v, sizeof(v), "%u", retry_after_s);
		int q = kiln_http_set_header(r, "Retry-After", v);
		if (q < 0)
			return q;
	}
	va_list ap;
	va_start(ap, fmt);
	int q = reply_verror(r, status, NULL, NULL, code, fmt, ap);
	va_end(ap);
	return q;
}

static kiln_http_stream *stream_new(kiln_http_request *r, kiln_http_cancel_fn on_cancel,
				    void *userdata)
{
	kiln_http_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->srv = r->srv;
	s->cap = r->srv->cfg.stream_buffer_bytes;
	s->fd = -1;
	s->on_cancel = on_cancel;
	s->userdata = userdata;
	s->conn = r->conn;
	snprintf(s->id, sizeof(s->id), "%s", r->id);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->space, NULL);
	pthread_cond_init(&s->cancel_done, NULL);
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci)
		s->fd = ci->connect_fd;
	return s;
}

/* Lists s on the server (for the watcher and shutdown); adds refs. */
static int stream_register(kiln_http_stream *s, unsigned refs)
{
	kiln_http_server *srv = s->srv;
	pthread_mutex_lock(&srv->lock);
	if (srv->stopping) {
		pthread_mutex_unlock(&srv->lock);
		return -ESHUTDOWN;
	}
	s->refs += refs;
	s->next = srv->streams;
	if (s->next)
		s->next->prev = s;
	srv->streams = s;
	srv->n_streams++;
	pthread_mutex_unlock(&srv->lock);
	return 0;
}

int kiln_http_reply_stream(kiln_http_request *r, const char *content_type,
			   kiln_http_cancel_fn on_cancel, void *userdata, kiln_http_stream **ret)
{
	assert_return(r && content_type && ret, -EINVAL);
	assert_return(!r->replied && !r->stream, -EALREADY);
	kiln_http_server *srv = r->srv;
	kiln_http_stream *s = stream_new(r, on_cancel, userdata);
	if (!s)
		return -ENOMEM;
	s->refs = 1; /* the response's */
	struct MHD_Response *resp = MHD_create_response_from_callback(
		MHD_SIZE_UNKNOWN, 16 << 10, stream_read, s, stream_response_free);
	if (!resp) {
		stream_unref(s);
		return -ENOMEM;
	}
	MHD_add_response_header(resp, "Content-Type", content_type);
	MHD_add_response_header(resp, "Cache-Control", "no-cache");
	/* nginx and friends must not buffer the stream */
	MHD_add_response_header(resp, "X-Accel-Buffering", "no");

	/* the producer's and the connection's */
	int q = stream_register(s, 2);
	if (q < 0) {
		MHD_destroy_response(resp);
		return q;
	}
	r->stream = s;

	q = queue(r, 200, resp);
	if (q < 0) {
		/* on_completed will still detach the connection's reference */
		stream_unref(s);
		return q;
	}
	wake_watcher(srv);
	*ret = s;
	return 0;
}

int kiln_http_reply_later(kiln_http_request *r, kiln_http_cancel_fn on_cancel, void *userdata,
			  kiln_http_stream **ret)
{
	assert_return(r && ret, -EINVAL);
	assert_return(!r->replied && !r->stream, -EALREADY);
	kiln_http_stream *s = stream_new(r, on_cancel, userdata);
	if (!s)
		return -ENOMEM;
	s->deferred = true;
	int q = stream_register(s, 2); /* the producer's and the connection's */
	if (q < 0) {
		stream_unref(s); /* refs 0 -> freed */
		return q;
	}
	r->stream = s;
	/* MHD calls on_request again once resumed; see later_resumed() */
	pthread_mutex_lock(&s->lock);
	s->suspended = true;
	MHD_suspend_connection(r->conn);
	pthread_mutex_unlock(&s->lock);
	wake_watcher(r->srv);
	*ret = s;
	return 0;
}

/* The producer's side of a deferred reply: store, wake, let go. */
static int later_finish(kiln_http_stream *s, unsigned status, const char *content_type, char *body,
			size_t len)
{
	pthread_mutex_lock(&s->lock);
	while (s->cancel_state == 1 && !pthread_equal(s->cancel_thread, pthread_self()))
		pthread_cond_wait(&s->cancel_done, &s->lock);
	int r = s->gone || s->stopping ? -ECANCELED : 0;
	if (r == 0) {
		s->status = status;
		s->body = body;
		s->body_len = len;
		s->content_type = content_type ? strdup(content_type) : NULL;
		s->ready = true;
		body = NULL;
	}
	s->closed = true;
	stream_kick_locked(s);
	pthread_mutex_unlock(&s->lock);
	free(body);
	stream_unref(s);
	return r;
}

int kiln_http_later_text(kiln_http_stream *s, unsigned status, const char *content_type,
			 const char *body, size_t len)
{
	assert_return(s && s->deferred && (body || len == 0), -EINVAL);
	char *copy = malloc(len + 1);
	if (!copy)
		return -ENOMEM;
	if (len)
		memcpy(copy, body, len);
	copy[len] = 0;
	return later_finish(s, status, content_type, copy, len);
}

int kiln_http_later_json(kiln_http_stream *s, unsigned status, const json_t *body)
{
	assert_return(s && s->deferred && body, -EINVAL);
	char *txt = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
	if (!txt)
		return -ENOMEM;
	return later_finish(s, status, "application/json", txt, strlen(txt));
}

int kiln_http_later_error(kiln_http_stream *s, unsigned status, const char *type, const char *param,
			  const char *code, const char *fmt, ...)
{
	assert_return(s && s->deferred && fmt, -EINVAL);
	va_list ap;
	va_start(ap, fmt);
	_cleanup_json_ json_t *err = error_vjson(s->id, status, type, param, code, fmt, ap);
	va_end(ap);
	if (!err)
		return -ENOMEM;
	return kiln_http_later_json(s, status, err);
}

/* on_request after a deferred request was resumed: reply, or close. */
static enum MHD_Result later_resumed(kiln_http_request *r)
{
	kiln_http_stream *s = r->stream;
	pthread_mutex_lock(&s->lock);
	bool ready = s->ready, gone = s->gone, stopping = s->stopping;
	unsigned status = s->status;
	_cleanup_free_ char *body = TAKE_PTR(s->body);
	_cleanup_free_ char *ctype = TAKE_PTR(s->content_type);
	size_t len = s->body_len;
	if (!ready && !gone && !stopping && !s->closed) {
		/* woken for nothing: wait on */
		s->suspended = true;
		MHD_suspend_connection(r->conn);
		pthread_mutex_unlock(&s->lock);
		return MHD_YES;
	}
	pthread_mutex_unlock(&s->lock);
	int q;
	if (ready)
		q = kiln_http_reply_text(r, status, ctype, body ?: "", len);
	else if (gone)
		return MHD_NO; /* nobody to answer */
	else if (stopping)
		q = kiln_http_reply_error(r, 503, NULL, NULL, "shutting_down",
					  "Server is shutting down (request %s)", r->id);
	else
		q = kiln_http_reply_error(r, 500, "server_error", NULL, NULL,
					  "Internal error: no reply was produced (request %s)",
					  r->id);
	return q < 0 ? MHD_NO : MHD_YES;
}

/* Appends data[0..need) to s's buffer, room or not; s->lock held. */
static int stream_append_locked(kiln_http_stream *s, const char *data, size_t need)
{
	if (s->off > 0) {
		memmove(s->buf, s->buf + s->off, s->len - s->off);
		s->len -= s->off;
		s->off = 0;
	}
	if (s->len + need > s->alloc) {
		/* at most cap, or one write bigger than cap, or cap plus
		 * the final bytes (the close's, the shutdown's) */
		size_t nalloc = MAX(s->cap, s->len + need);
		char *nb = realloc(s->buf, nalloc);
		if (!nb)
			return -ENOMEM;
		s->buf = nb;
		s->alloc = nalloc;
	}
	if (need)
		memcpy(s->buf + s->len, data, need);
	s->len += need;
	stream_kick_locked(s);
	return 0;
}

static int stream_push(kiln_http_stream *s, const char *data, size_t need, int timeout_ms,
		       bool force)
{
	if (s->deferred)
		return -EINVAL;
	if (need > KILN_HTTP_STREAM_WRITE_MAX)
		return -EMSGSIZE;
	struct timespec deadline;
	deadline_in(&deadline, timeout_ms > 0 ? (unsigned) timeout_ms : 0);
	pthread_mutex_lock(&s->lock);
	int r = 0;
	for (;;) {
		if (s->gone || s->stopping || !s->conn) {
			r = -ECANCELED;
			break;
		}
		size_t used = s->len - s->off;
		if (force || used == 0 || used + need <= s->cap)
			break;
		if (timeout_ms == 0) {
			r = -EAGAIN;
			break;
		}
		if (timeout_ms < 0)
			pthread_cond_wait(&s->space, &s->lock);
		else if (pthread_cond_timedwait(&s->space, &s->lock, &deadline) == ETIMEDOUT) {
			r = -ETIMEDOUT;
			break;
		}
	}
	if (r == 0)
		r = stream_append_locked(s, data, need);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int kiln_http_stream_write(kiln_http_stream *s, const char *data, size_t len, int timeout_ms)
{
	assert_return(s && (data || len == 0), -EINVAL);
	return stream_push(s, data, len, timeout_ms, false);
}

int kiln_http_stream_close(kiln_http_stream *s, const char *final, size_t len)
{
	if (!s)
		return 0;
	int r = final && len > 0 && !s->deferred ? stream_push(s, final, len, 0, true) : 0;
	pthread_mutex_lock(&s->lock);
	/* wait out a cancel callback running on another thread */
	while (s->cancel_state == 1 && !pthread_equal(s->cancel_thread, pthread_self()))
		pthread_cond_wait(&s->cancel_done, &s->lock);
	if (s->gone)
		r = -ECANCELED;
	s->closed = true;
	stream_kick_locked(s);
	pthread_mutex_unlock(&s->lock);
	stream_unref(s);
	return r < 0 ? r : 0;
}

const char *kiln_http_stream_request_id(const kiln_http_stream *s)
{
	return s ? s->id : NULL;
}

size_t kiln_http_stream_buffered(kiln_http_stream *s)
{
	assert_return(s, 0);
	pthread_mutex_lock(&s->lock);
	size_t n = s->len - s->off;
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* ---- requests ---- */

const char *kiln_http_request_method(const kiln_http_request *r)
{
	return r->method;
}

const char *kiln_http_request_path(const kiln_http_request *r)
{
	return r->url;
}

const char *kiln_http_request_query(const kiln_http_request *r, const char *key)
{
	assert_return(r && key, NULL);
	return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *kiln_http_request_header(const kiln_http_request *r, const char *name)
{
	assert_return(r && name, NULL);
	return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *kiln_http_request_body(const kiln_http_request *r, size_t *len)
{
	if (len)
		*len = r->body.len;
	return r->body.s ?: "";
}

const char *kiln_http_request_client(const kiln_http_request *r)
{
	return r->client;
}

const struct sockaddr *kiln_http_request_peer(const kiln_http_request *r)
{
	assert_return(r, NULL);
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	return ci ? ci->client_addr : NULL;
}

const char *kiln_http_request_id(const kiln_http_request *r)
{
	return r->id;
}

int kiln_http_request_json(const kiln_http_request *r, json_t **ret, kiln_error *err)
{
	assert_return(r && ret && err, -EINVAL);
	return kiln_json_parse_object(r->body.s ?: "", r->body.len, ret, err);
}

static void request_free(kiln_http_request *r)
{
	kiln_strbuf_free(&r->body);
	for (size_t i = 0; i < r->n_headers; i++) {
		free(r->headers[i].name);
		free(r->headers[i].value);
	}
	free(r->headers);
	free(r);
}

static bool request_id_ok(const char *v)
{
	size_t n = strlen(v);
	return n > 0 && n <= KILN_HTTP_REQUEST_ID_MAX &&
	       strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") == n;
}

static void request_id_make(char *buf, size_t size)
{
	uint8_t rnd[12];
	if (getrandom(rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t) sizeof(rnd)) {
		/* no entropy yet (early boot): unique enough for logs */
		static uint64_t counter;
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
		uint64_t a = (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
		uint64_t b = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
		memcpy(rnd, &a, 8);
		memcpy(rnd + 8, &b, 4);
	}
	int n = snprintf(buf, size, "req_");
	for (size_t i = 0; i < sizeof(rnd) && (size_t) n + 2 < size; i++)
		n += snprintf(buf + n, size - (size_t) n, "%02x", rnd[i]);
}

static void client_format(struct MHD_Connection *c, char *buf, size_t size)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char ip[INET6_ADDRSTRLEN] = "?";
	if (!ci || !ci->client_addr) {
		snprintf(buf, size, "?");
		return;
	}
	const struct sockaddr *sa = ci->client_addr;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *) sa;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		snprintf(buf, size, "%s:%u", ip, ntohs(in->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		snprintf(buf, size, "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else
		snprintf(buf, size, "?");
}

static bool method_is(const char *route_method, const char *method)
{
	return streq(route_method, method) || (streq(method, "HEAD") && streq(route_method, "GET"));
}

static bool path_matches(const kiln_http_route *rt, const char *path)
{
	return rt->prefix ? startswith(path, rt->path) != NULL : streq(rt->path, path);
}

/* 404 or 405 (with Allow) when no route takes method + path. */
static int route_or_reply(kiln_http_request *r)
{
	kiln_http_server *srv = r->srv;
	bool path_known = false;
	for (size_t i = 0; i < srv->cfg.n_routes; i++) {
		const kiln_http_route *rt = &srv->routes[i];
		if (!path_matches(rt, r->url))
			continue;
		path_known = true;
		if (method_is(rt->method, r->method)) {
			r->route = rt;
			return 0;
		}
	}
	if (!path_known)
		return kiln_http_reply_error(r, 404, "invalid_request_error", NULL, "unknown_url",
					     "Invalid URL (%s %s)", r->method, r->url);
	_cleanup_strbuf_ kiln_strbuf allow;
	kiln_strbuf_init(&allow);
	bool get = false, head = false;
	for (size_t i = 0; i < srv->cfg.n_routes; i++) {
		const kiln_http_route *rt = &srv->routes[i];
		if (!path_matches(rt, r->url))
			continue;
		/* each method once */
		bool seen = false;
		for (size_t j = 0; j < i; j++)
			if (path_matches(&srv->routes[j], r->url) &&
			    streq(srv->routes[j].method, rt->method))
				seen = true;
		if (seen)
			continue;
		get |= streq(rt->method, "GET");
		head |= streq(rt->method, "HEAD");
		kiln_strbuf_printf(&allow, "%s%s", allow.len ? ", " : "", rt->method);
	}
	if (get && !head)
		kiln_strbuf_append(&allow, ", HEAD");
	if (kiln_strbuf_error(&allow) < 0)
		return -ENOMEM;
	int q = kiln_http_set_header(r, "Allow", allow.s);
	if (q < 0)
		return q;
	return kiln_http_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
				     "Method %s not allowed for %s: use %s", r->method, r->url,
				     allow.s);
}

static void reply_500_unless_replied(kiln_http_request *r, int err)
{
	if (r->replied || r->stream) /* a stream or deferred reply is under way */
		return;
	log_debug_errno(err, "http: %s: handler for %s %s failed without a reply: %m", r->id,
			r->method, r->url);
	(void) kiln_http_reply_error(r, 500, "server_error", NULL, NULL,
				     "Internal error while handling %s %s (request %s)", r->method,
				     r->url, r->id);
}

static int hexdigit(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

/* MHD's unescaping of the path and the query, except that "%00" stays as
 * it is: decoded, the NUL would end the path early, so that
 * "/kiln/vmlinuz%00/../../etc/passwd" reached a handler as "/kiln/vmlinuz"
 * (kiln serve's hostile suite). */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
	char *w = s;
	for (const char *p = s; *p;) {
		int hi, lo;
		if (p[0] == '%' && (hi = hexdigit(p[1])) >= 0 && (lo = hexdigit(p[2])) >= 0 &&
		    (hi | lo) != 0) {
			*w++ = (char) (hi << 4 | lo);
			p += 3;
		} else
			*w++ = *p++;
	}
	*w = 0;
	return (size_t) (w - s);
}

/* MHD's accept policy: every connection while serving, none once the
 * server stops (the client sees its connection closed). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	const kiln_http_server *srv = cls;
	return atomic_load(&srv->refusing) ? MHD_NO : MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **ctx)
{
	kiln_http_server *srv = cls;
	kiln_http_request *r = *ctx;
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (!r)
			return MHD_NO;
		*ctx = r;
		r->srv = srv;
		r->conn = c;
		r->method = method;
		r->url = url;
		clock_gettime(CLOCK_MONOTONIC, &r->start);
		kiln_strbuf_init(&r->body);
		const char *rid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
		if (rid && request_id_ok(rid))
			snprintf(r->id, sizeof(r->id), "%s", rid);
		else
			request_id_make(r->id, sizeof(r->id));
		client_format(c, r->client, sizeof(r->client));

		if (strlen(url) > KILN_HTTP_URL_MAX) {
			int q = kiln_http_reply_error(r, 414, NULL, NULL, "url_too_long",
						      "URL too long: %zu bytes, at most %u",
						      strlen(url), KILN_HTTP_URL_MAX);
			return q < 0 ? MHD_NO : MHD_YES;
		}
		int q = route_or_reply(r);
		if (q < 0)
			return MHD_NO;
		if (r->replied)
			return MHD_YES;
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl) {
			char *end;
			errno = 0;
			unsigned long long v = strtoull(cl, &end, 10);
			if (errno == 0 && *end == 0 && v > srv->cfg.max_body_bytes) {
				q = kiln_http_reply_error(
					r, 413, NULL, NULL, "request_too_large",
					"Request body too large: %llu bytes, at most %zu", v,
					srv->cfg.max_body_bytes);
				return q < 0 ? MHD_NO : MHD_YES;
			}
		}
		return MHD_YES;
	}
	if (*upload_size > 0) {
		if (!r->replied && !r->too_big) {
			if (r->body.len + *upload_size > srv->cfg.max_body_bytes)
				r->too_big = true; /* chunked upload: answered at the end */
			else if (kiln_strbuf_append_n(&r->body, upload, *upload_size) < 0)
				return MHD_NO;
		}
		if (r->too_big) {
			/* MHD (0.9.75) cannot answer before the upload ends: drop
			 * what arrives, and hang up on a client that keeps going */
			r->discarded += r->body.len + *upload_size;
			kiln_strbuf_free(&r->body);
			kiln_strbuf_init(&r->body);
			if (r->discarded > srv->cfg.max_body_bytes * KILN_HTTP_DISCARD_FACTOR) {
				log_debug("http: %s: upload over %zu bytes still going, closing",
					  r->id,
					  srv->cfg.max_body_bytes * KILN_HTTP_DISCARD_FACTOR);
				return MHD_NO;
			}
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (r->stream && r->stream->deferred && !r->replied)
		return later_resumed(r);
	if (r->replied || r->dispatched)
		return MHD_YES;
	r->dispatched = true;
	if (r->too_big) {
		int q = kiln_http_reply_error(r, 413, NULL, NULL, "request_too_large",
					      "Request body too large: more than %zu bytes",
					      srv->cfg.max_body_bytes);
		return q < 0 ? MHD_NO : MHD_YES;
	}
	int q = r->route->handler(r, r->route->userdata);
	reply_500_unless_replied(r, q < 0 ? q : -EPROTO);
	return r->replied || r->stream ? MHD_YES : MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx,
			 enum MHD_RequestTerminationCode toe)
{
	kiln_http_server *srv = cls;
	kiln_http_request *r = *ctx;
	if (!r)
		return;
	*ctx = NULL;
	bool ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
	uint64_t out = r->bytes_out;
	bool streamed = r->stream && !r->stream->deferred;
	if (streamed) {
		pthread_mutex_lock(&r->stream->lock);
		out = r->stream->bytes_out;
		pthread_mutex_unlock(&r->stream->lock);
	}
	kiln_http_access a = {
		.method = r->method,
		.path = r->url,
		.request_id = r->id,
		.client = r->client,
		.status = r->status,
		.bytes_in = r->body.len,
		.bytes_out = out,
		.duration_ms = ms_since(&r->start),
		.stream = streamed,
		.aborted = !ok,
	};
	log_debug("http: %s \"%s %s\" %u %llu bytes %.1f ms %s%s", a.client, a.method, a.path,
		  a.status, (unsigned long long) a.bytes_out, a.duration_ms, a.request_id,
		  a.aborted ? " (aborted)" : "");
	if (srv->cfg.access_log)
		srv->cfg.access_log(&a, srv->cfg.access_log_userdata);
	if (r->stream)
		stream_detach(r->stream, ok);
	request_free(r);
}

/* ---- the server ---- */

static int parse_address(const char *address, uint16_t port, struct sockaddr_storage *ss, bool *v6)
{
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in = (struct sockaddr_in *) ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) ss;
	if (inet_pton(AF_INET, address, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		*v6 = false;
		return 0;
	}
	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET6, address, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		*v6 = true;
		return 0;
	}
	return -EINVAL;
}

int kiln_http_listen(const char *address, uint16_t port)
{
	struct sockaddr_storage ss;
	bool v6;
	int r = parse_address(address ?: "0.0.0.0", port, &ss, &v6);
	if (r < 0)
		return r;
	int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	(void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* "::" serves IPv6 only: 0.0.0.0 is its own address, as in MHD */
	if (v6)
		(void) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	socklen_t len = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	/* a backlog as MHD's own (SOMAXCONN): bursts of clients wait in the
	 * kernel while the workers accept */
	if (bind(fd, (struct sockaddr *) &ss, len) < 0 || listen(fd, SOMAXCONN) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

/* A listening TCP stream socket (IPv4 or IPv6), and its port. */
static int check_listen_fd(int fd, uint16_t *port)
{
	int v = 0;
	socklen_t l = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) < 0)
		return -errno;
	if (v != SOCK_STREAM)
		return -ENOTSOCK;
	l = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) < 0 || !v)
		return -ENOTSOCK;
	struct sockaddr_storage ss;
	l = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *) &ss, &l) < 0)
		return -errno;
	if (ss.ss_family == AF_INET)
		*port = ntohs(((struct sockaddr_in *) &ss)->sin_port);
	else if (ss.ss_family == AF_INET6)
		*port = ntohs(((struct sockaddr_in6 *) &ss)->sin6_port);
	else
		return -ENOTSOCK;
	return 0;
}

int kiln_http_activation_fd(void)
{
	int n = sd_listen_fds(1);
	if (n <= 0)
		return 0; /* not socket-activated (or the variables were not for us) */
	if (n > 1)
		return -EINVAL;
	int fd = SD_LISTEN_FDS_START;
	if (sd_is_socket_inet(fd, 0, SOCK_STREAM, 1, 0) <= 0)
		return -EINVAL;
	(void) fcntl(fd, F_SETFD, FD_CLOEXEC);
	return fd;
}

int kiln_http_server_start(const kiln_http_config *cfg, kiln_http_server **ret)
{
	assert_return(cfg && ret, -EINVAL);
	assert_return(cfg->routes && cfg->n_routes > 0 && cfg->n_routes <= KILN_HTTP_ROUTES_MAX,
		      -EINVAL);
	int fd = kiln_http_listen(cfg->address, cfg->port);
	if (fd < 0)
		return fd;
	return kiln_http_server_start_fd(cfg, fd, ret);
}

int kiln_http_server_start_fd(const kiln_http_config *cfg, int fd, kiln_http_server **ret)
{
	if (!cfg || !ret || fd < 0 || !cfg->routes || cfg->n_routes == 0 ||
	    cfg->n_routes > KILN_HTTP_ROUTES_MAX) {
		if (fd >= 0)
			close(fd);
		return -EINVAL;
	}
	for (size_t i = 0; i < cfg->n_routes; i++)
		if (!cfg->routes[i].method || !cfg->routes[i].path || !cfg->routes[i].handler) {
			close(fd);
			return -EINVAL;
		}
	uint16_t bound_port = 0;
	int q = check_listen_fd(fd, &bound_port);
	if (q < 0) {
		close(fd);
		return q;
	}

	kiln_http_server *srv = calloc(1, sizeof(*srv));
	if (!srv) {
		close(fd);
		return -ENOMEM;
	}
	srv->cfg = *cfg;
	srv->cfg.address = NULL; /* not kept */
	/* a limit left 0: its default */
	kiln_http_config *c = &srv->cfg;
	c->threads = c->threads ?: KILN_HTTP_THREADS_DEFAULT;
	c->max_connections = c->max_connections ?: KILN_HTTP_CONNECTIONS_MAX_DEFAULT;
	c->idle_timeout_s = c->idle_timeout_s ?: KILN_HTTP_IDLE_TIMEOUT_DEFAULT_S;
	c->max_connections_per_client =
		c->max_connections_per_client ?: KILN_HTTP_PER_CLIENT_DEFAULT;
	c->max_body_bytes = c->max_body_bytes ?: KILN_HTTP_BODY_MAX_DEFAULT;
	c->conn_memory_bytes = c->conn_memory_bytes ?: KILN_HTTP_CONN_MEMORY_DEFAULT;
	c->stream_buffer_bytes = c->stream_buffer_bytes ?: KILN_HTTP_STREAM_BUFFER_DEFAULT;
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->streams_done, NULL);
	srv->wake_fd = -1;
	srv->routes = calloc(cfg->n_routes, sizeof(*srv->routes));
	if (!srv->routes) {
		close(fd);
		kiln_http_server_free(srv);
		return -ENOMEM;
	}
	memcpy(srv->routes, cfg->routes, cfg->n_routes * sizeof(*srv->routes));
	srv->cfg.routes = srv->routes;

	srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->wake_fd < 0) {
		q = -errno;
		close(fd);
		kiln_http_server_free(srv);
		return q;
	}
	q = -pthread_create(&srv->watcher, NULL, watcher_main, srv);
	if (q < 0) {
		close(fd);
		kiln_http_server_free(srv);
		return q;
	}
	srv->watcher_started = true;

	/* MHD serves on the socket bound here or by systemd
	 * (MHD_OPTION_LISTEN_SOCKET) and closes it when it stops; the port
	 * argument is then unused.  It gets a duplicate: whether a failed
	 * MHD_start_daemon() closed the socket it was given is not part of
	 * its contract, so ours is closed here either way (at worst MHD's
	 * copy stays open after a failed start). */
	int mfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	q = mfd < 0 ? -errno : 0;
	close(fd);
	if (q < 0) {
		kiln_http_server_free(srv);
		return q;
	}
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
	srv->mhd = MHD_start_daemon(
		flags, bound_port, on_accept, srv, on_request, srv, MHD_OPTION_LISTEN_SOCKET, mfd,
		MHD_OPTION_THREAD_POOL_SIZE, srv->cfg.threads, MHD_OPTION_CONNECTION_LIMIT,
		srv->cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, srv->cfg.idle_timeout_s,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, srv->cfg.conn_memory_bytes,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT, srv->cfg.max_connections_per_client,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_UNESCAPE_CALLBACK,
		unescape, NULL, MHD_OPTION_END);
	if (!srv->mhd) {
		kiln_http_server_free(srv);
		return -ENOMEM;
	}
	srv->port = bound_port;
	*ret = srv;
	return 0;
}

/* ---- who holds a port ---- */

/* The inode and owner of the socket listening on port in one of
 * /proc/net/tcp{,6}'s tables ("sl local rem st ... uid timeout inode"). */
static int listen_socket_of(const char *table, uint16_t port, unsigned long *inode, uid_t *uid)
{
	FILE *f = fopen(table, "re");
	if (!f)
		return -errno;
	char line[512];
	int r = -ENOENT;
	(void) !fgets(line, sizeof(line), f); /* the header */
	while (fgets(line, sizeof(line), f)) {
		char local[64];
		unsigned st, u;
		unsigned long ino;
		if (sscanf(line, " %*d: %63s %*s %x %*s %*s %*s %u %*d %lu", local, &st, &u, &ino) !=
		    4)
			continue;
		const char *colon = strrchr(local, ':');
		if (st != 0x0A /* TCP_LISTEN */ || !colon || strtoul(colon + 1, NULL, 16) != port)
			continue;
		*inode = ino;
		*uid = (uid_t) u;
		r = 0;
		break;
	}
	fclose(f);
	return r;
}

/* The process with an fd on socket:[inode], where /proc lets us look. */
static pid_t process_of_socket(unsigned long inode, char *comm, size_t len)
{
	DIR *proc = opendir("/proc");
	if (!proc)
		return 0;
	char want[64];
	snprintf(want, sizeof(want), "socket:[%lu]", inode);
	pid_t found = 0;
	struct dirent *de;
	while (!found && (de = readdir(proc))) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		char path[64];
		snprintf(path, sizeof(path), "/proc/%ld/fd", pid);
		DIR *fds = opendir(path);
		if (!fds)
			continue; /* another user's, without CAP_SYS_PTRACE */
		struct dirent *fe;
		while ((fe = readdir(fds))) {
			char link[300], target[64];
			snprintf(link, sizeof(link), "/proc/%ld/fd/%s", pid, fe->d_name);
			ssize_t n = readlink(link, target, sizeof(target) - 1);
			if (n > 0 && (target[n] = 0, streq(target, want))) {
				found = (pid_t) pid;
				break;
			}
		}
		closedir(fds);
	}
	closedir(proc);
	comm[0] = 0;
	if (found) {
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/comm", (int) found);
		FILE *f = fopen(path, "re");
		if (f) {
			if (fgets(comm, (int) len, f))
				comm[strcspn(comm, "\n")] = 0;
			fclose(f);
		}
	}
	return found;
}

int kiln_http_port_holder(uint16_t port, char *buf, size_t len)
{
	assert_return(buf && len > 0, -EINVAL);
	unsigned long inode = 0;
	uid_t uid = 0;
	if (listen_socket_of("/proc/self/net/tcp", port, &inode, &uid) < 0 &&
	    listen_socket_of("/proc/self/net/tcp6", port, &inode, &uid) < 0) {
		snprintf(buf, len, "an unknown process");
		return -ENOENT;
	}
	char name[64];
	struct passwd pw, *pwp = NULL;
	char pwbuf[1024];
	if (getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &pwp) == 0 && pwp)
		snprintf(name, sizeof(name), "%s", pwp->pw_name);
	else
		snprintf(name, sizeof(name), "an unknown user");
	char comm[32];
	pid_t pid = inode ? process_of_socket(inode, comm, sizeof(comm)) : 0;
	if (pid)
		snprintf(buf, len, "user %s (uid %u), pid %d (%s)", name, (unsigned) uid,
			 (int) pid, comm[0] ? comm : "?");
	else
		snprintf(buf, len, "user %s (uid %u)", name, (unsigned) uid);
	return 0;
}

uint16_t kiln_http_server_port(const kiln_http_server *s)
{
	return s ? s->port : 0;
}

void kiln_http_server_free(kiln_http_server *srv)
{
	if (!srv)
		return;
	atomic_store(&srv->refusing, true);

	/* End every open stream: flush what is buffered, then end. */
	pthread_mutex_lock(&srv->lock);
	srv->stopping = true;
	size_t n = 0;
	for (kiln_http_stream *s = srv->streams; s; s = s->next)
		n++;
	kiln_http_stream **all = n ? calloc(n, sizeof(*all)) : NULL;
	size_t k = 0;
	for (kiln_http_stream *s = srv->streams; s && all; s = s->next) {
		pthread_mutex_lock(&s->lock);
		s->refs++;
		/* A stream cut short can say so (the program's bytes), so
		 * that clients see an error instead of a silent end. */
		if (srv->cfg.stream_shutdown_bytes && !s->deferred && !s->closed && !s->gone &&
		    s->conn)
			(void) stream_append_locked(s, srv->cfg.stream_shutdown_bytes,
						    strlen(srv->cfg.stream_shutdown_bytes));
		s->stopping = true;
		stream_kick_locked(s);
		pthread_cond_broadcast(&s->space);
		pthread_mutex_unlock(&s->lock);
		all[k++] = s;
	}
	pthread_mutex_unlock(&srv->lock);
	for (size_t i = 0; i < k; i++) {
		stream_fire_cancel(all[i]);
		stream_unref(all[i]);
	}
	free(all);
	if (srv->wake_fd >= 0)
		wake_watcher(srv);

	/* Give them a moment to flush and end cleanly. */
	struct timespec deadline;
	deadline_in(&deadline, KILN_HTTP_SHUTDOWN_GRACE_MS);
	pthread_mutex_lock(&srv->lock);
	while (srv->n_streams > 0 &&
	       pthread_cond_timedwait(&srv->streams_done, &srv->lock, &deadline) == 0)
		;
	/* Whatever is left (a client that does not read): resume it so MHD
	 * can close it. */
	for (kiln_http_stream *s = srv->streams; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		s->gone = true;
		stream_kick_locked(s);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&srv->lock);

	if (srv->mhd)
		MHD_stop_daemon(srv->mhd);
	if (srv->watcher_started) {
		pthread_mutex_lock(&srv->lock);
		srv->stopping = true;
		pthread_mutex_unlock(&srv->lock);
		wake_watcher(srv);
		pthread_join(srv->watcher, NULL);
	}
	if (srv->wake_fd >= 0)
		close(srv->wake_fd);
	pthread_mutex_destroy(&srv->lock);
	pthread_cond_destroy(&srv->streams_done);
	free(srv->routes);
	free(srv);
}
