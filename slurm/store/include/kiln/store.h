/* kiln/store.h — kiln-run's rendezvous store: a key-value server that speaks
 * PyTorch's TCPStore wire protocol, and a blocking C client for it.
 *
 * The agent on the first live node hosts the server; every agent (and any
 * C/CUDA worker) talks to it with the client, and unmodified PyTorch workers
 * use it as their c10d store (MASTER_ADDR/MASTER_PORT with
 * TORCHELASTIC_USE_AGENT_STORE=True).  Both torch 1.13 clients (no VALIDATE
 * handshake, old QueryType numbering) and torch 2.x clients (VALIDATE first)
 * are served; the server tells them apart by the first message.
 *
 * Two key spaces.  Keys starting with KILN_STORE_CONTROL_PREFIX ("/kiln/")
 * are rendezvous control keys: a connection may read or write them only after
 * presenting the per-job secret (kiln's own clients do this at connect).  Any
 * other key is the worker key space: with require_auth only for connections
 * that presented the secret or came through a relay (kiln_store_relay, which
 * vouches for its local workers), else for every admitted peer.  Peers whose
 * IPv4 address is not on the allow-list, and peers on this machine that are
 * processes of another uid (sock_diag), are closed at accept.
 *
 * Error convention: every function returns 0 (or a documented non-negative
 * value) on success and a negative errno on failure; the errors each one can
 * return are listed next to it.  Nothing here logs above debug.  docs/store.md
 * describes the wire protocol, the secret handshake and the limits. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- limits ---------------------------------------------------------------
 * Every limit is a hard cap enforced on input before memory is allocated, so
 * a hostile or broken peer (random bytes, a length of 2^63) costs at most one
 * connection buffer and is then dropped.  The server options below can lower
 * or raise them per server. */

/* Longest key, in bytes.  Same cap as PyTorch's libuv store (MAX_STRING_LEN);
 * real keys ("/worker/attempt_0/default_pg/0//cuda//0") are < 200 bytes. */
#define KILN_STORE_KEY_MAX (8u * 1024u)
/* Largest value, in bytes.  Same cap as PyTorch's libuv store
 * (MAX_PAYLOAD_LEN); an NCCL unique id is 128 bytes, a gloo address a few
 * hundred. */
#define KILN_STORE_VALUE_MAX (8u * 1024u * 1024u)
/* Most keys in one CHECK, WAIT, MULTI_GET or MULTI_SET.  A 4096-rank barrier
 * waits on one key; this leaves room without letting one message pin
 * unbounded waiter state. */
#define KILN_STORE_MULTI_MAX 16384u
/* Most concurrent connections.  kiln must serve 4096 (1024 nodes x 4 local
 * ranks each holding a store connection); twice that leaves room for agents,
 * torch's extra listener sockets and reconnects.  RLIMIT_NOFILE is raised to
 * fit. */
#define KILN_STORE_CONN_MAX 8192u
/* Most bytes buffered per connection in each direction: one largest value
 * plus its key and framing, with slack.  A request that cannot fit is a
 * protocol violation and closes the connection. */
#define KILN_STORE_CONN_BUF_MAX (KILN_STORE_VALUE_MAX + 2u * KILN_STORE_KEY_MAX + 4096u)
/* Most bytes the map may hold: keys + values, plus a fixed overhead per
 * entry and per pending WAIT registration (so that floods of tiny keys or of
 * waits on missing keys count too).  Bounded so that a client in the open
 * worker key space cannot exhaust the hosting agent's memory; a request that
 * would exceed it closes the requesting connection. */
#define KILN_STORE_TOTAL_MAX (512ull * 1024u * 1024u)
/* Most bytes buffered across all connections (input + output).  With 8192
 * connections the per-connection cap alone would allow 128 GiB; this keeps
 * the whole server bounded.  The connection whose read would cross it is
 * closed. */
#define KILN_STORE_TOTAL_BUF_MAX (256ull * 1024u * 1024u)

/* Rendezvous control key space, reachable only with the job secret. */
#define KILN_STORE_CONTROL_PREFIX "/kiln/"
/* The reserved key a client presents the secret through (COMPARE_SET with
 * expected = secret); see kiln_store_client_auth() and docs/store.md. */
#define KILN_STORE_AUTH_KEY "/kiln/.auth"
/* The reserved key an agent presents a token through instead of the
 * secret (COMPARE_SET with expected = the token), on a server with a
 * token_auth hook: kiln-run's MUNGE bootstrap (docs/store.md).  Tokens are
 * 1..KILN_STORE_TOKEN_MAX bytes; a MUNGE credential is a few hundred. */
#define KILN_STORE_TOKEN_KEY "/kiln/.token"
#define KILN_STORE_TOKEN_MAX 4096u
/* Secrets are 1..KILN_STORE_SECRET_MAX bytes (kiln-run generates 32 random
 * bytes, hex encoded = 64 characters). */
#define KILN_STORE_SECRET_MAX 256u

/* PyTorch's TCPStore handshake magic (torch 2.x sends VALIDATE + this). */
#define KILN_STORE_VALIDATE_MAGIC 0x3C85F7CEu

/* ---- server ---------------------------------------------------------------*/

typedef struct kiln_store_server kiln_store_server;

typedef struct kiln_store_server_opts {
	/* IPv4 literal to bind, NULL = "0.0.0.0". */
	const char *bind_address;
	/* TCP port; 0 = an ephemeral port, see kiln_store_server_port(). */
	uint16_t port;
	/* Peers allowed to connect: IPv4 addresses in host byte order (as
	 * kiln_parse_ipv4() returns them), e.g. the allocation's node
	 * addresses.  Copied by kiln_store_server_new(). */
	const uint32_t *allow;
	size_t n_allow;
	/* Accept any peer (tests, single-node runs).  Default false. */
	bool allow_all;
	/* Accept 127.0.0.0/8 even when not listed.  Default true. */
	bool allow_loopback;
	/* The per-job secret that unlocks the control key space; NULL = no
	 * remote connection can reach control keys (in-process access still
	 * can).  Copied. */
	const char *secret;
	/* Every connection must authenticate before it touches any key: the
	 * secret through KILN_STORE_AUTH_KEY (agents, both key spaces) or a
	 * relay's hello (the worker key space).  Unauthenticated connections
	 * may only VALIDATE and PING.  Default false: the worker key space is
	 * open to every admitted peer (torch clients connecting directly). */
	bool require_auth;
	/* Refuse a peer on this machine unless its socket belongs to peer_uid
	 * (looked up through sock_diag at accept; a loopback peer that cannot
	 * be looked up is refused too).  Peers on other machines are not
	 * affected.  Default true, peer_uid = geteuid(). */
	bool check_peer_uid;
	uid_t peer_uid;
	/* Called from the serving side (server locked: do not call back into
	 * it) with one line saying which peer was refused at accept and why
	 * ("127.0.0.1:4711: a process of uid 65534 on this node; ...").
	 * NULL = not reported (log_debug only). */
	void (*on_refused)(const char *msg, void *userdata);
	void *on_refused_userdata;
	/* A second way for agents to authenticate: a token presented through
	 * KILN_STORE_TOKEN_KEY (kiln-run: a MUNGE credential).  Called from the
	 * serving side, server locked; returns 0 with *reply (malloc'd, may be
	 * NULL) to accept (the connection then reaches both key spaces and
	 * gets "ok:" + reply), < 0 to refuse ("denied", connection closed).
	 * NULL = tokens are refused. */
	int (*token_auth)(const void *token, size_t len, void **reply, size_t *reply_len,
			  void *userdata);
	void *token_auth_userdata;
	/* Limits; kiln_store_server_opts_init() sets the KILN_STORE_* values. */
	size_t max_key;
	size_t max_value;
	size_t max_multi;
	size_t max_conns;
	size_t max_conn_buf;
	uint64_t max_total_bytes;
	uint64_t max_total_buf;
	/* listen(2) backlog; default 4096 so that a burst of 4096 connects is
	 * not dropped. */
	int backlog;
} kiln_store_server_opts;

/* Fills *opts with the defaults above (bind 0.0.0.0, port 0, loopback
 * allowed, no other peer, local peers only of this process's euid, no secret,
 * worker key space open, KILN_STORE_* limits). */
void kiln_store_server_opts_init(kiln_store_server_opts *opts);

/* Creates the server: binds, listens, creates its epoll fd, raises
 * RLIMIT_NOFILE towards max_conns.  Does not start serving: call
 * kiln_store_server_start() or drive kiln_store_server_process().
 * Errors: -EINVAL (NULL ret/opts, bad bind address, zero limits, secret
 * empty or longer than KILN_STORE_SECRET_MAX), -EADDRINUSE and other bind(2)/
 * listen(2) errors, -EMFILE/-ENFILE, -ENOMEM. */
int kiln_store_server_new(const kiln_store_server_opts *opts, kiln_store_server **ret);
/* Stops the thread if running, closes every connection, frees everything.
 * NULL is a no-op. */
void kiln_store_server_free(kiln_store_server *s);

/* The bound port (the ephemeral one when opts.port was 0). */
uint16_t kiln_store_server_port(const kiln_store_server *s);

/* Serves in a background thread until kiln_store_server_stop().
 * Errors: -EINVAL (NULL), -EBUSY (already started), -errno of
 * pthread_create. */
int kiln_store_server_start(kiln_store_server *s);
/* Stops and joins the thread; connections stay open (a later start or
 * process() carries on serving them).  Returns 0, or -EINVAL for NULL;
 * stopping a server that is not started is a no-op. */
int kiln_store_server_stop(kiln_store_server *s);

/* For callers with their own event loop: the epoll fd becomes readable when
 * kiln_store_server_process() has work.  Do not mix with start(). */
int kiln_store_server_fd(const kiln_store_server *s);
/* Handles ready events, waiting at most timeout_usec (0 = do not wait,
 * UINT64_MAX = forever).  Returns the number of events handled (>= 0).
 * Misbehaving peers are closed, never reported as errors.
 * Errors: -EINVAL (NULL), -EBUSY (the background thread is running), -errno
 * of epoll_wait other than EINTR. */
int kiln_store_server_process(kiln_store_server *s, uint64_t timeout_usec);

/* Direct in-process access to the map for the hosting agent.  Thread-safe
 * against the serving thread; writes wake remote waiters exactly as a
 * remote SET would.  Keys are NUL-terminated here; both key spaces are
 * reachable. */

/* Errors: -EINVAL (NULL s/key, value NULL with len > 0), -E2BIG (key or value
 * over the limits), -ENOSPC (store would exceed max_total_bytes), -ENOMEM. */
int kiln_store_server_set(kiln_store_server *s, const char *key, const void *value, size_t len);
/* On success *ret is a malloc'd copy (NUL-terminated for convenience, the
 * terminator not counted in *ret_len).  Errors: -EINVAL, -ENOENT (no such
 * key), -ENOMEM. */
int kiln_store_server_get(kiln_store_server *s, const char *key, void **ret, size_t *ret_len);
/* Adds delta to the decimal integer stored under key (missing = 0), like
 * TCPStore's ADD, and returns the new value in *ret (may be NULL).
 * Errors: -EINVAL, -EBADMSG (the value is not a decimal int64), -ERANGE
 * (overflow), -E2BIG, -ENOSPC, -ENOMEM. */
int kiln_store_server_add(kiln_store_server *s, const char *key, int64_t delta, int64_t *ret);
/* Returns 1 if the key existed and was deleted, 0 if it did not exist.
 * Errors: -EINVAL. */
int kiln_store_server_delete(kiln_store_server *s, const char *key);
/* Number of keys in the store (both key spaces).  Errors: -EINVAL. */
int64_t kiln_store_server_num_keys(kiln_store_server *s);
/* Calls fn for every key starting with prefix (NULL = all), in no
 * particular order, with the server locked: fn must not call back into s.
 * fn returning < 0 stops the walk and that value is returned.
 * Returns the number of keys visited.  Errors: -EINVAL, fn's error. */
typedef int (*kiln_store_foreach_fn)(const char *key, const void *value, size_t len,
				     void *userdata);
int kiln_store_server_foreach(kiln_store_server *s, const char *prefix, kiln_store_foreach_fn fn,
			      void *userdata);

typedef struct kiln_store_server_stats {
	uint64_t connections;	   /* open now */
	uint64_t accepted;	   /* total accepted */
	uint64_t refused_peers;	   /* closed at accept: address not allowed, or max_conns */
	uint64_t refused_uid;	   /* closed at accept: a local process of another uid */
	uint64_t dropped_protocol; /* closed for garbage, oversize lengths, unknown ops */
	uint64_t dropped_auth;	   /* closed for a wrong secret, a control key without one, or
				      (require_auth) any key before authenticating */
	uint64_t dropped_limits;   /* closed for a store or buffer limit */
	uint64_t keys;
	uint64_t store_bytes;	 /* keys + values + overheads, see KILN_STORE_TOTAL_MAX */
	uint64_t buffered_bytes; /* all connection buffers */
	uint64_t requests;	 /* requests served */
} kiln_store_server_stats;
/* Errors: -EINVAL. */
int kiln_store_server_get_stats(kiln_store_server *s, kiln_store_server_stats *ret);

/* ---- peers ----------------------------------------------------------------
 * TCP has no SO_PEERCRED; the kernel's sock_diag interface (NETLINK_SOCK_DIAG,
 * the one ss(8) uses) finds the socket at the other end of an accepted
 * connection by its four-tuple and reports the uid that created it.  The
 * server, the relay and kiln-run's liveness listener use it to refuse a
 * process of another user on the same node. */

/* Looks up the local socket at the other end of the connected IPv4 TCP
 * socket fd.  Returns 1 with *ret_uid set when it is a live socket of a
 * process on this machine (this network namespace), 0 when no local socket
 * matches (the peer is another machine), or:
 * -EPERM     a local end that no process holds any more (closed before we
 *            looked: its uid no longer says who sent the bytes), or that is
 *            not an established connection;
 * -EAFNOSUPPORT  fd is not IPv4;
 * -errno     of socket(2)/sendto/recv on the netlink socket (a kernel
 *            without CONFIG_INET_DIAG answers -ENOENT or -EPROTONOSUPPORT
 *            when the socket is opened). */
int kiln_store_peer_uid(int fd, uid_t *ret_uid);
/* The same through a netlink socket the caller keeps (one thread at a time):
 * kiln_store_diag_open() returns it (or -errno); close it with close(2). */
int kiln_store_diag_open(void);
int kiln_store_peer_uid_via(int diag_fd, int fd, uid_t *ret_uid);

/* ---- relay ----------------------------------------------------------------
 * The worker-facing end of the store on each node (kiln-run runs one per
 * agent; workers get its address as MASTER_ADDR/MASTER_PORT).  It listens on
 * 127.0.0.1 (an ephemeral port), admits only local processes of peer_uid
 * (sock_diag, see docs/store.md), and forwards each connection to the store
 * after a WORKER_HELLO with the job secret, so that a server with
 * require_auth serves it the worker key space.  PyTorch clients need no
 * change: their bytes pass through unchanged.  Runs in its own thread. */

/* Most relayed connections at once per node: a node's workers (up to
 * RDZV_MAX_NPROC) each hold a few (torch's store, its PrefixStore clones,
 * kiln's C client). */
#define KILN_STORE_RELAY_CONN_MAX 1024u

typedef struct kiln_store_relay kiln_store_relay;

typedef struct kiln_store_relay_opts {
	/* The store: an IPv4 literal and its port (changed later with
	 * kiln_store_relay_set_upstream(), e.g. after a store failover). */
	const char *upstream_host;
	uint16_t upstream_port;
	/* The job secret, presented upstream for every relayed connection.
	 * Copied. */
	const char *secret;
	/* Only local processes of this uid may connect; default geteuid(). */
	uid_t peer_uid;
	size_t max_conns; /* default KILN_STORE_RELAY_CONN_MAX */
	/* Called from the relay's thread with one line for each refused peer
	 * ("relay: 127.0.0.1:4711: a process of uid 65534 ..."); NULL = not
	 * reported. */
	void (*on_refused)(const char *msg, void *userdata);
	void *on_refused_userdata;
} kiln_store_relay_opts;

void kiln_store_relay_opts_init(kiln_store_relay_opts *opts);
/* Binds 127.0.0.1:0 and starts the relay's thread.  Errors: -EINVAL (NULL,
 * no secret or upstream, a host that is not an IPv4 literal), -errno of
 * socket/bind/listen/epoll/eventfd/pthread_create, -ENOMEM. */
int kiln_store_relay_new(const kiln_store_relay_opts *opts, kiln_store_relay **ret);
/* The port workers connect to (on 127.0.0.1). */
uint16_t kiln_store_relay_port(const kiln_store_relay *r);
/* New connections go to host:port from now on; open ones keep theirs.
 * Errors: -EINVAL. */
int kiln_store_relay_set_upstream(kiln_store_relay *r, const char *host, uint16_t port);
/* Peers refused so far (another uid, or not identifiable). */
uint64_t kiln_store_relay_refused(kiln_store_relay *r);
/* Stops the thread, closes every connection, frees.  NULL is a no-op. */
void kiln_store_relay_free(kiln_store_relay *r);

/* ---- client ---------------------------------------------------------------
 * Blocking, one request at a time, not thread-safe (one client per thread).
 * Every call waits at most the client's timeout (set at connect, changed with
 * kiln_store_client_set_timeout()).  After -ETIMEDOUT in the middle of a
 * reply, -ECONNRESET, -EPROTO or -EACCES the connection is unusable and later
 * calls return -ENOTCONN: free it and reconnect. */

typedef struct kiln_store_client kiln_store_client;

typedef struct kiln_store_value {
	void *data; /* malloc'd, NUL-terminated (terminator not in len) */
	size_t len;
} kiln_store_value;

/* Connects to host:port (a name or IPv4 literal; every address getaddrinfo
 * returns is tried until timeout_usec has passed, retrying refused
 * connections since the store may not be up yet), sends the VALIDATE
 * handshake and, when secret is non-NULL, presents it.
 * Errors: -EINVAL (NULL host/ret, port 0, secret too long), -EHOSTUNREACH
 * (name does not resolve), -ETIMEDOUT (nobody accepted in time),
 * -ECONNREFUSED/-ECONNRESET (refused, or closed by the server's allow-list),
 * -EACCES (the server rejected the secret), -ENOMEM. */
int kiln_store_client_connect(const char *host, uint16_t port, const char *secret,
			      uint64_t timeout_usec, kiln_store_client **ret);
/* Closes and frees; NULL is a no-op. */
void kiln_store_client_free(kiln_store_client *c);
/* Presents the job secret on an open connection (connect() does this when
 * given one).  Errors: -EINVAL, -EACCES (wrong secret; the server closes the
 * connection), -ETIMEDOUT, -ECONNRESET, -EPROTO, -ENOTCONN. */
int kiln_store_client_auth(kiln_store_client *c, const char *secret);
/* Presents a token (1..KILN_STORE_TOKEN_MAX bytes) through
 * KILN_STORE_TOKEN_KEY instead of the secret; on success the connection is
 * authenticated and *ret (malloc'd, NUL-terminated, length in *ret_len,
 * which may be NULL) holds the server's reply.  Errors: -EINVAL, -EACCES
 * (refused; the server closes the connection), -ETIMEDOUT, -ECONNRESET,
 * -EPROTO, -ENOTCONN, -ENOMEM. */
int kiln_store_client_auth_token(kiln_store_client *c, const void *token, size_t len, void **ret,
				 size_t *ret_len);
/* Per-call timeout; 0 is not allowed.  Errors: -EINVAL. */
int kiln_store_client_set_timeout(kiln_store_client *c, uint64_t timeout_usec);
/* True once the secret was accepted. */
bool kiln_store_client_authenticated(const kiln_store_client *c);

/* Errors common to every operation below: -EINVAL (NULL arguments, empty
 * key, value NULL with len > 0), -E2BIG (key over KILN_STORE_KEY_MAX, value
 * over KILN_STORE_VALUE_MAX, more than KILN_STORE_MULTI_MAX keys), -EACCES (a
 * control key on a connection without the secret; nothing is sent),
 * -ETIMEDOUT, -ECONNRESET (the server closed the connection, e.g. a store
 * limit), -EPROTO (a malformed reply), -ENOTCONN (the connection broke
 * earlier), -ENOMEM. */

int kiln_store_client_set(kiln_store_client *c, const char *key, const void *value, size_t len);
/* Waits until key exists (up to the timeout, -ETIMEDOUT), then fetches it,
 * like TCPStore.get().  *ret is malloc'd and NUL-terminated. */
int kiln_store_client_get(kiln_store_client *c, const char *key, void **ret, size_t *ret_len);
/* Fetches key without waiting: -ENOENT when it does not exist. */
int kiln_store_client_try_get(kiln_store_client *c, const char *key, void **ret, size_t *ret_len);
/* Atomic add to a decimal counter (missing = 0); new value in *ret (may be
 * NULL).  A key holding something else than a decimal number makes the
 * server close the connection (-ECONNRESET), as torch's server would fail. */
int kiln_store_client_add(kiln_store_client *c, const char *key, int64_t delta, int64_t *ret);
/* Returns 1 when every key exists, 0 otherwise. */
int kiln_store_client_check(kiln_store_client *c, const char *const *keys, size_t n);
/* Waits until every key exists: 0, or -ETIMEDOUT after timeout_usec (the
 * wait is then cancelled with CANCEL_WAIT and the connection stays usable).
 * timeout_usec 0 = the client's timeout. */
int kiln_store_client_wait(kiln_store_client *c, const char *const *keys, size_t n,
			   uint64_t timeout_usec);
/* TCPStore compare_set: if key holds expected (or is missing and expected is
 * empty) it becomes desired.  *ret (may be NULL) receives the value after the
 * operation (for a missing key with non-empty expected, torch's server
 * returns expected, and so does this one). */
int kiln_store_client_compare_set(kiln_store_client *c, const char *key, const void *expected,
				  size_t elen, const void *desired, size_t dlen, void **ret,
				  size_t *ret_len);
/* Returns 1 if the key was deleted, 0 if it did not exist. */
int kiln_store_client_delete(kiln_store_client *c, const char *key);
/* Number of keys in the whole store. */
int kiln_store_client_num_keys(kiln_store_client *c, int64_t *ret);
/* Waits for every key (client timeout), then fetches them in one round
 * trip: ret[i] for keys[i]; free with kiln_store_values_free(). */
int kiln_store_client_multi_get(kiln_store_client *c, const char *const *keys, size_t n,
				kiln_store_value *ret);
/* Sets n keys in one message. */
int kiln_store_client_multi_set(kiln_store_client *c, const char *const *keys,
				const kiln_store_value *values, size_t n);
/* Appends to the value of key (creating it). */
int kiln_store_client_append(kiln_store_client *c, const char *key, const void *value, size_t len);
/* Round trip with a nonce; *ret_usec (may be NULL) gets the latency. */
int kiln_store_client_ping(kiln_store_client *c, uint64_t *ret_usec);

/* Frees the data of n values (not the array itself). */
void kiln_store_values_free(kiln_store_value *v, size_t n);
