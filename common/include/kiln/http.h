/* kiln/http.h — the HTTP server glue kiln-inferd and kiln-healthd share.
 *
 * A small server on libmicrohttpd (MHD): a route table (method + exact path
 * or prefix -> handler), request accessors, reply helpers (JSON, text,
 * empty, OpenAI-shaped errors, 429/503 with Retry-After), streamed replies
 * (a chunked body of bytes a producer thread writes, with bounded buffering
 * and a cancel callback when the client goes away; what the bytes mean is
 * the program's), and deferred replies that another thread completes.
 *
 * Thread model: MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL with a pool
 * of `threads` workers and MHD_ALLOW_SUSPEND_RESUME.  A stream costs no
 * thread: when its buffer is empty the connection is suspended, and the
 * producer's next write resumes it, so hundreds of concurrent streams cost
 * a few KiB each instead of a thread and its stack (thread-per-connection)
 * or a busy-polled callback.  Suspended connections do not notice a client
 * that hangs up, so one watcher thread polls stream sockets for
 * POLLRDHUP/POLLHUP and cancels those streams at once.
 *
 * Handlers run on the MHD worker threads, several at a time: they must be
 * thread-safe and must not block (hand long work to another thread and
 * reply with a stream).  A handler replies exactly once with one of the
 * kiln_http_reply_*() functions; returning < 0 without a reply sends a 500.
 *
 * Library code: it logs at debug only.  Programs that want an access log at
 * info pass `access_log` in the config. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/json.h"
#include "kiln/macro.h"

/* Limits on untrusted input and their reasons; each can be lowered (or the
 * first three raised) per server in kiln_http_config. */
/* Request bodies are buffered whole for the handler: 4 MiB holds a 128k-token
 * chat (about 512 KiB of text) many times over.  Bigger -> 413, answered as
 * soon as Content-Length says so (the body is never read). */
#define KILN_HTTP_BODY_MAX_DEFAULT ((size_t) 4 << 20)
/* A chunked upload (no Content-Length) that passes the body limit is read
 * and dropped so it can get its 413 at the end (MHD cannot answer sooner);
 * past this many times the limit the connection is closed instead. */
#define KILN_HTTP_DISCARD_FACTOR 2u
/* MHD's per-connection memory pool holds the request line, the headers and
 * the I/O buffers; a request whose line or headers do not fit gets 414/431
 * from MHD.  64 KiB allows ~32 KiB of headers (browsers send < 8 KiB). */
#define KILN_HTTP_CONN_MEMORY_DEFAULT ((size_t) 64 << 10)
/* Open connections (suspended streams included) before MHD refuses more. */
#define KILN_HTTP_CONNECTIONS_MAX_DEFAULT 1024u
/* Open connections from one client address before MHD refuses (closes at
 * once) more from it: one client holding idle or dribbling sockets cannot
 * take every slot of max_connections. */
#define KILN_HTTP_PER_CLIENT_DEFAULT 64u
/* A connection idle this long (no bytes either way) is closed; a slow
 * reader that stops reading a stream is dropped after it too.  Streams
 * waiting for their producer do not time out. */
#define KILN_HTTP_IDLE_TIMEOUT_DEFAULT_S 30u
/* MHD worker threads (each runs its own epoll loop). */
#define KILN_HTTP_THREADS_DEFAULT 4u
/* Paths longer than this -> 414 (no route is longer than a few dozen bytes). */
#define KILN_HTTP_URL_MAX 2048u
/* X-Request-Id values longer than this, or with bytes outside
 * [A-Za-z0-9._:-], are replaced by a generated id (they end up in logs). */
#define KILN_HTTP_REQUEST_ID_MAX 64u
/* Bytes a stream buffers before kiln_http_stream_write() pushes back. */
#define KILN_HTTP_STREAM_BUFFER_DEFAULT ((size_t) 64 << 10)
/* One write at most (a write is accepted into an empty buffer even when it
 * is bigger than the buffer, so this bounds it). */
#define KILN_HTTP_STREAM_WRITE_MAX ((size_t) 1 << 20)
/* Routes per server. */
#define KILN_HTTP_ROUTES_MAX 64u
/* kiln_http_server_free() gives open streams this long to flush. */
#define KILN_HTTP_SHUTDOWN_GRACE_MS 2000u

typedef struct kiln_http_server kiln_http_server;
typedef struct kiln_http_request kiln_http_request;
typedef struct kiln_http_stream kiln_http_stream;

/* Returns >= 0 after replying; < 0 (-errno) without a reply sends a 500. */
typedef int (*kiln_http_handler)(kiln_http_request *req, void *userdata);

typedef struct kiln_http_route {
	const char *method; /* "GET" (also answers HEAD), "POST" ... */
	const char *path;   /* "/v1/models"; with prefix, every path starting so */
	bool prefix;
	kiln_http_handler handler;
	void *userdata;
} kiln_http_route;

/* One finished request, for the program's access log. */
typedef struct kiln_http_access {
	const char *method, *path, *request_id, *client;
	unsigned status;    /* 0 when no reply was sent */
	uint64_t bytes_in;  /* request body bytes */
	uint64_t bytes_out; /* response body bytes handed to MHD */
	double duration_ms; /* from the request headers to the end */
	bool stream;	    /* a streamed reply */
	bool aborted;	    /* the connection ended before the reply did */
} kiln_http_access;

typedef struct kiln_http_config {
	const char *address;		     /* IPv4 or IPv6 literal; NULL: "0.0.0.0" */
	uint16_t port;			     /* 0: an ephemeral port, see kiln_http_server_port() */
	unsigned threads;		     /* 0: KILN_HTTP_THREADS_DEFAULT */
	unsigned max_connections;	     /* 0: KILN_HTTP_CONNECTIONS_MAX_DEFAULT */
	unsigned idle_timeout_s;	     /* 0: KILN_HTTP_IDLE_TIMEOUT_DEFAULT_S */
	unsigned max_connections_per_client; /* 0: KILN_HTTP_PER_CLIENT_DEFAULT */
	size_t max_body_bytes;		     /* 0: KILN_HTTP_BODY_MAX_DEFAULT */
	size_t conn_memory_bytes;	     /* 0: KILN_HTTP_CONN_MEMORY_DEFAULT */
	size_t stream_buffer_bytes;	     /* 0: KILN_HTTP_STREAM_BUFFER_DEFAULT */
	/* Bytes (NUL-terminated) written last on every stream still open when
	 * the server stops, after what it buffered; NULL: such streams just
	 * end.  Not copied. */
	const char *stream_shutdown_bytes;
	const kiln_http_route *routes; /* copied */
	size_t n_routes;
	/* Called once per finished request, from a server thread. */
	void (*access_log)(const kiln_http_access *a, void *userdata);
	void *access_log_userdata;
} kiln_http_config;

/* Binds address:port (cfg->address, cfg->port) and starts serving:
 * kiln_http_listen() then kiln_http_server_start_fd().  Errors: -EINVAL
 * (bad address, no routes, too many routes, a route without
 * method/path/handler), -EADDRINUSE (port taken), -EADDRNOTAVAIL (address
 * not local), -EACCES (a port below 1024 without the capability),
 * -ENOMEM, or -errno from socket or thread creation. */
int kiln_http_server_start(const kiln_http_config *cfg, kiln_http_server **ret);

/* Starts serving on fd, a TCP socket already bound and listening (systemd's
 * socket activation, or kiln_http_listen() earlier); cfg->address and
 * cfg->port are ignored.  Takes fd over on success and on failure (it is
 * closed either way).  Errors: as kiln_http_server_start(), and -ENOTSOCK
 * (fd is no listening TCP socket). */
int kiln_http_server_start_fd(const kiln_http_config *cfg, int fd, kiln_http_server **ret);

/* A listening TCP socket on address:port (IPv4 or IPv6 literal; port 0 an
 * ephemeral one), close-on-exec, SO_REUSEADDR (so a restart is not refused
 * by the last run's TIME_WAIT connections; it never lets two listeners
 * share the port: that is SO_REUSEPORT, which is not set).  Binding comes
 * first, so a daemon holds its port before slow work (loading a model).
 * Returns the fd; -EINVAL (not an address literal), -EADDRINUSE,
 * -EADDRNOTAVAIL, -EACCES, or another -errno of socket/bind/listen. */
int kiln_http_listen(const char *address, uint16_t port);

/* systemd's socket activation: the one listening TCP socket this process
 * was given ($LISTEN_FDS, $LISTEN_PID; sd_listen_fds(3)), or 0 when none
 * was.  The variables are unset so children do not see them.  Returns the
 * fd (>= 3); 0: not socket-activated; -EINVAL: more than one fd was passed,
 * or the one passed is not a listening TCP stream socket (check the unit's
 * ListenStream=). */
int kiln_http_activation_fd(void);

/* Who holds TCP port `port` in the LISTEN state, for the message of a
 * daemon refused with -EADDRINUSE: "user nobody (uid 65534), pid 4242
 * (python3)", from /proc/net/tcp{,6} (the socket's owner, which every user
 * may read) and, where this process may look, /proc/PID/fd (the process).
 * Writes at least "an unknown process" into buf; returns 0 when an owner
 * was found, -ENOENT when none. */
int kiln_http_port_holder(uint16_t port, char *buf, size_t len);
/* The port actually bound (the ephemeral one when config.port was 0). */
uint16_t kiln_http_server_port(const kiln_http_server *s);
/* Stops accepting, ends open streams (what they buffered is flushed, then
 * config.stream_shutdown_bytes when set; cancel callbacks fire), waits up
 * to KILN_HTTP_SHUTDOWN_GRACE_MS for them, closes everything and frees.
 * Producers may still hold streams: their sends return -ECANCELED until
 * they close them.  NULL is fine. */
void kiln_http_server_free(kiln_http_server *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(kiln_http_server *, kiln_http_server_free)

/* Request accessors: valid during the handler.  Strings are never NULL
 * except query/header lookups of absent names. */
const char *kiln_http_request_method(const kiln_http_request *r);
const char *kiln_http_request_path(const kiln_http_request *r); /* without the query */
const char *kiln_http_request_query(const kiln_http_request *r, const char *key);
const char *kiln_http_request_header(const kiln_http_request *r, const char *name);
/* The body, NUL-terminated ("" when none); *len its length (may be NULL). */
const char *kiln_http_request_body(const kiln_http_request *r, size_t *len);
/* "127.0.0.1:40312" or "[::1]:40312". */
const char *kiln_http_request_client(const kiln_http_request *r);
/* The client's socket address (AF_INET or AF_INET6, port included), for
 * rules on who asks (kiln serve's secrets); NULL when MHD has none. */
struct sockaddr;
const struct sockaddr *kiln_http_request_peer(const kiln_http_request *r);
/* X-Request-Id from the client when sane, else "req_" + 24 hex digits;
 * every reply carries it back in X-Request-Id. */
const char *kiln_http_request_id(const kiln_http_request *r);

/* Parses the body as a JSON object (kiln_json_parse_object()). */
int kiln_http_request_json(const kiln_http_request *r, json_t **ret, kiln_error *err);

/* Adds a header to the reply this request will get.  -EINVAL for names or
 * values with CR/LF, -ENOMEM. */
int kiln_http_set_header(kiln_http_request *r, const char *name, const char *value);

/* Replies.  Each returns 0, -EALREADY (already replied), -ENOMEM, or -EIO
 * (MHD refused: the connection is gone). */
int kiln_http_reply_json(kiln_http_request *r, unsigned status, const json_t *body);
int kiln_http_reply_text(kiln_http_request *r, unsigned status, const char *content_type,
			 const char *body, size_t len);
int kiln_http_reply_empty(kiln_http_request *r, unsigned status);
/* len bytes of the open regular file fd from offset, sent with sendfile(2)
 * where MHD can (no copy through user space: a 2 GB initrd costs a few
 * KiB per connection); HEAD gets the headers only.  Takes fd over: it is
 * closed once the reply is sent, and on error.  content_type may be NULL.
 * The caller sets Content-Range / Accept-Ranges with kiln_http_set_header(). */
int kiln_http_reply_fd(kiln_http_request *r, unsigned status, const char *content_type, int fd,
		       uint64_t offset, uint64_t len);
/* OpenAI's error shape:
 *   {"error":{"message":M,"type":T,"param":P,"code":C,"request_id":ID}}
 * type NULL picks the usual one for the status (400 invalid_request_error,
 * 401 authentication_error, 403 permission_error, 404 not_found_error,
 * 429 rate_limit_error, 5xx server_error ...); param/code NULL -> null. */
int kiln_http_reply_error(kiln_http_request *r, unsigned status, const char *type,
			  const char *param, const char *code, const char *fmt, ...) _printf_(6, 7);
/* 400 invalid_request_error from a kiln_json_* error (its where as "param"). */
int kiln_http_reply_json_error(kiln_http_request *r, const kiln_error *e);
/* 429 (overloaded: type rate_limit_error) or 503 (type server_error) with
 * Retry-After: retry_after_s (0: no header). */
int kiln_http_reply_retry(kiln_http_request *r, unsigned status, unsigned retry_after_s,
			  const char *code, const char *fmt, ...) _printf_(5, 6);

/* Streamed replies.  Replies 200 with content_type and a chunked body
 * (Cache-Control: no-cache, X-Accel-Buffering: no) and returns a stream
 * the handler hands to a producer thread.  on_cancel (may be NULL) runs at
 * most once, on a server thread, when the client disconnects, the
 * connection times out, or the server shuts down before the producer
 * closed the stream; it never runs after kiln_http_stream_close() returned,
 * and must not call kiln_http_stream_close() itself.  Errors as for the
 * replies, plus -ESHUTDOWN while the server is stopping. */
typedef void (*kiln_http_cancel_fn)(kiln_http_stream *s, void *userdata);
int kiln_http_reply_stream(kiln_http_request *r, const char *content_type,
			   kiln_http_cancel_fn on_cancel, void *userdata, kiln_http_stream **ret);
/* Queues data[0..len) whole, in order after what was written before.
 * Backpressure: when the buffer lacks room, waits up to timeout_ms (0: not
 * at all, < 0: forever) for the client to read.  Returns 0, -EAGAIN (full,
 * timeout 0), -ETIMEDOUT, -ECANCELED (client gone or server stopping),
 * -EMSGSIZE (len over KILN_HTTP_STREAM_WRITE_MAX), -EINVAL (s is a
 * deferred reply), -ENOMEM. */
int kiln_http_stream_write(kiln_http_stream *s, const char *data, size_t len, int timeout_ms);
/* Ends the stream, after final[0..len) when len > 0 (queued even when the
 * buffer is full; ignored for a deferred reply), and drops the producer's
 * hold on it: s is invalid afterwards.  Returns 0 or -ECANCELED when the
 * client was already gone (nothing more is sent). */
int kiln_http_stream_close(kiln_http_stream *s, const char *final, size_t len);
/* The request id of the stream's request (valid until close). */
const char *kiln_http_stream_request_id(const kiln_http_stream *s);
/* Bytes queued but not yet handed to MHD. */
size_t kiln_http_stream_buffered(kiln_http_stream *s);

/* Deferred replies, for work that finishes on another thread (a
 * non-streaming completion): the handler calls kiln_http_reply_later() and
 * returns; the connection waits, suspended (no thread, no timeout), until
 * the producer answers with exactly one kiln_http_later_*() call (or
 * kiln_http_stream_close(), which answers 500).  on_cancel as for streams:
 * the client disconnected or the server is stopping (the request then gets
 * 503).  The kiln_http_later_*() functions drop the producer's hold on s
 * and return 0, -ECANCELED (client gone or server stopping: nothing sent),
 * -ENOMEM or -EINVAL (s is not a deferred reply). */
int kiln_http_reply_later(kiln_http_request *r, kiln_http_cancel_fn on_cancel, void *userdata,
			  kiln_http_stream **ret);
int kiln_http_later_json(kiln_http_stream *s, unsigned status, const json_t *body);
int kiln_http_later_text(kiln_http_stream *s, unsigned status, const char *content_type,
			 const char *body, size_t len);
int kiln_http_later_error(kiln_http_stream *s, unsigned status, const char *type, const char *param,
			  const char *code, const char *fmt, ...) _printf_(6, 7);

/* Reason phrase for a status ("Not Found"); "Unknown" when unknown. */
const char *kiln_http_status_text(unsigned status);
