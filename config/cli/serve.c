/* serve.c — `kiln serve`: the head node's provisioning server.
 *
 * One HTTP server (kiln/http.h on libmicrohttpd: a pool of epoll threads)
 * answers everything a booting node asks the head for, under the path of
 * image.http_url (docs/serve.md):
 *   BASE/NAME          a file of image.output_dir (vmlinuz, initrd.img,
 *                      cluster.cfg ...): sendfile, one byte range, HEAD;
 *                      regular files only, no dotfiles, no subdirectories,
 *                      no symlinks, none only its owner may read;
 *   BASE/boot.ipxe     the chain script, rendered from the cluster file;
 *   BASE/ipxe/MAC      that one node's script (node.ipxe), or 404;
 *   BASE/secret/NAME   munge.key, root-password-hash, inferd-keys: only
 *                      from a privileged source port (< 1024: root on the
 *                      node) at an address the cluster file gives a node,
 *                      inferd-keys only to inference nodes, and with
 *                      image.secrets_only_when_down only while Slurm does not
 *                      list the node as up.  Every refusal: a warning line
 *                      (who asked, the node, the path, why) and 403.
 *
 * Secret files are read on each request (a rotated key is handed out at
 * once) and must be root's (the munge key: root's or munge's) and not
 * readable by group or others, checked at start (exit 2 with the fix), on
 * SIGHUP and on every read.  SIGHUP re-reads the cluster file: a file
 * with errors, or unsafe secrets, keeps the running one.  READY=1 and
 * watchdog pings through sd_notify. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "kiln-verbs.h"
#include "kiln/config.h"
#include "kiln/http.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/slurm.h"
#include "kiln/strbuf.h"
#include "serve.h"

/* A secret is a key or a hash: a file bigger than this is not one. */
#define SERVE_SECRET_MAX ((size_t) 64 << 10)
/* Connections at once: every node of a 4,096-node cluster booting
 * together holds one or two. */
#define SERVE_CONNECTIONS_MAX 8192u
/* From one address (one node): iPXE and kiln-node-init use one or two at
 * a time; a client holding more cannot take every slot. */
#define SERVE_PER_CLIENT_DEFAULT 16
/* No byte either way for this long: closed (a stalled node retries). */
#define SERVE_IDLE_TIMEOUT_DEFAULT_S 20
/* MHD worker threads: sendfile does the copying, so a few are enough. */
#define SERVE_THREADS_DEFAULT 4
/* Open files: the connections, each file being sent, a margin. */
#define SERVE_NOFILE_WANTED (SERVE_CONNECTIONS_MAX * 2 + 64)

enum { ARG_THREADS = KILN_OPT_FIRST, ARG_IDLE_TIMEOUT, ARG_PER_CLIENT };

static const char *arg_config;
static int arg_threads = SERVE_THREADS_DEFAULT;
static int arg_idle_timeout = SERVE_IDLE_TIMEOUT_DEFAULT_S;
static int arg_per_client = SERVE_PER_CLIENT_DEFAULT;

static const kiln_option serve_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "threads", ARG_THREADS, "N", "HTTP worker threads (default 4)", NULL },
	{ "idle-timeout", ARG_IDLE_TIMEOUT, "SECS",
	  "close a connection idle this long (default 20)", NULL },
	{ "max-connections-per-client", ARG_PER_CLIENT, "N",
	  "open connections one address may hold (default 16)", NULL },
	KILN_OPTIONS_COMMON,
	{},
};

static int parse_option(int key, const char *arg);

const kiln_prog kiln_serve_prog = {
	.name = "kiln serve",
	.summary = "the head node's provisioning server: image files, per-node iPXE, secrets",
	.usage = "kiln [-c FILE] serve [--threads N] [--idle-timeout SECS] "
		 "[--max-connections-per-client N]",
	.options = serve_options,
	.option = parse_option,
	.no_args = true,
	.epilog =
		"Serves, under the path of image.http_url, on image.serve_listen (default: the\n"
		"URL's host and port):\n"
		"  BASE/NAME            files of image.output_dir (ranges, HEAD, sendfile)\n"
		"  BASE/boot.ipxe       the chain script; BASE/ipxe/MAC one node's script\n"
		"  BASE/secret/NAME     munge.key, root-password-hash, inferd-keys: only to root\n"
		"                       on a node (source port < 1024, the node's address)\n"
		"SIGHUP re-reads the cluster file.  See docs/serve.md.\n"
		"Exit status: 0 stopped by SIGTERM/SIGINT, 1 cannot listen, 2 bad cluster file,\n"
		"unsafe secret file or missing image directory.\n",
};

static int parse_option(int key, const char *arg)
{
	switch (key) {
	case ARG_THREADS:
		if (kiln_parse_int(arg, 1, 256, &arg_threads) < 0)
			return kiln_usage_error(&kiln_serve_prog,
						"Invalid --threads '%s': a number from 1 to 256.",
						arg);
		return 0;
	case ARG_IDLE_TIMEOUT:
		if (kiln_parse_int(arg, 1, 3600, &arg_idle_timeout) < 0)
			return kiln_usage_error(
				&kiln_serve_prog,
				"Invalid --idle-timeout '%s': seconds from 1 to 3600.", arg);
		return 0;
	case ARG_PER_CLIENT:
		if (kiln_parse_int(arg, 1, (int) SERVE_CONNECTIONS_MAX, &arg_per_client) < 0)
			return kiln_usage_error(&kiln_serve_prog,
						"Invalid --max-connections-per-client '%s': a "
						"number from 1 to %u.",
						arg, SERVE_CONNECTIONS_MAX);
		return 0;
	default:
		return 1;
	}
}

/* ---- what one cluster file gives the server ------------------------------ */

typedef struct serve_site {
	kiln_cfg *cfg;
	char base[KILN_SERVE_BASE_MAX]; /* image.http_url's path: "/kiln" */
	char host[KILN_SERVE_HOST_MAX]; /* where to listen */
	uint16_t port;
	int dirfd; /* image.output_dir */
	char *boot_ipxe;
	const char *secret_path[_KILN_SERVE_SECRET_MAX]; /* in cfg; NULL: not configured */
	const char *secret_key[_KILN_SERVE_SECRET_MAX];	 /* the key that names it */
} serve_site;

static void site_free(serve_site *s)
{
	if (!s)
		return;
	if (s->dirfd >= 0)
		close(s->dirfd);
	free(s->boot_ipxe);
	kiln_cfg_free(s->cfg);
	free(s);
}
DEFINE_TRIVIAL_CLEANUP_FUNC(serve_site *, site_free)

static uid_t munge_uid = (uid_t) -1; /* the munge user, when there is one */

/* Whether st may be a secret: a regular file of root's (or, for the munge
 * key, munge's: Debian's munge.key is munge:munge 0400) that neither group
 * nor others may read or write.  Returns true, or false with the fix in
 * why. */
static bool secret_stat_ok(const char *path, const struct stat *st, kiln_serve_secret which,
			   char *why, size_t n)
{
	bool owner_ok = st->st_uid == 0 ||
			(which == KILN_SERVE_SECRET_MUNGE_KEY && st->st_uid == munge_uid);
	if (!S_ISREG(st->st_mode))
		snprintf(why, n, "'%s' is not a regular file; point the key at the file itself",
			 path);
	else if (!owner_ok)
		snprintf(why, n,
			 "'%s' is owned by uid %u, not root%s, so that user could change what "
			 "every node gets: chown root: %s",
			 path, (unsigned) st->st_uid,
			 which == KILN_SERVE_SECRET_MUNGE_KEY ? " or munge" : "", path);
	else if (st->st_mode & 077)
		snprintf(why, n,
			 "'%s' has mode %04o: group or others may read or change it; chmod 600 %s",
			 path, (unsigned) (st->st_mode & 07777), path);
	else
		return true;
	return false;
}

/* Checks every configured secret file; logs each problem.  Returns 0 or
 * -EPERM (a problem was logged). */
static int site_check_secrets(const serve_site *s)
{
	int r = 0;
	for (unsigned i = 0; i < _KILN_SERVE_SECRET_MAX; i++) {
		const char *p = s->secret_path[i];
		if (!p)
			continue;
		struct stat st;
		char why[PATH_MAX * 2 + 256];
		if (lstat(p, &st) < 0) {
			log_error_errno(
				-errno,
				"Cannot read %s '%s' (%s), which kiln serve hands to the "
				"nodes: %m; create it there (mode 0600, owner root) or point "
				"%s at it",
				kiln_serve_secret_name(i), p, s->secret_key[i], s->secret_key[i]);
			r = -EPERM;
		} else if (!secret_stat_ok(p, &st, i, why, sizeof(why))) {
			log_error("Refusing to hand %s to the nodes (%s): %s",
				  kiln_serve_secret_name(i), s->secret_key[i], why);
			r = -EPERM;
		}
	}
	return r;
}

/* Loads the cluster file and everything the server derives from it.
 * Returns 0, or an exit status (KILN_EXIT_USAGE, KILN_EXIT_FAILURE) after
 * logging why. */
static int site_load(const char *path, serve_site **ret)
{
	_cleanup_(site_freep) serve_site *s = calloc(1, sizeof(*s));
	if (!s)
		return log_error_errno(-ENOMEM, "Out of memory: %m"), KILN_EXIT_FAILURE;
	s->dirfd = -1;
	int r = kiln_cfg_open(path, 0, &s->cfg);
	if (r < 0)
		return kiln_exit_for_config(r);
	const kiln_cfg *c = s->cfg;
	const char *url = c->image.http_url;
	char url_host[KILN_SERVE_HOST_MAX];
	uint16_t url_port;
	r = kiln_serve_split_url(url, url_host, &url_port, s->base);
	if (r == -EPROTONOSUPPORT) {
		log_error("image.http_url '%s' is not http://: kiln serve speaks plain HTTP "
			  "(the files are public, secrets are guarded by who asks); write "
			  "http://HEAD_ADDRESS/kiln",
			  url);
		return KILN_EXIT_USAGE;
	}
	if (r < 0) {
		log_error("image.http_url '%s' is not http://HOST[:PORT][/PATH] without a query; "
			  "write it like http://10.77.0.1/kiln",
			  url);
		return KILN_EXIT_USAGE;
	}
	if (c->image.serve_listen) {
		if (kiln_serve_split_listen(c->image.serve_listen, s->host, &s->port) < 0) {
			log_error("image.serve_listen '%s' is not ADDRESS:PORT; write it like "
				  "\"10.77.0.1:80\" or \"[fd00::1]:80\"",
				  c->image.serve_listen);
			return KILN_EXIT_USAGE;
		}
	} else {
		snprintf(s->host, sizeof(s->host), "%s", url_host);
		s->port = url_port;
	}
	struct in6_addr a6;
	struct in_addr a4;
	if (inet_pton(AF_INET, s->host, &a4) != 1 && inet_pton(AF_INET6, s->host, &a6) != 1) {
		log_error("kiln serve listens on an address, and '%s' (%s) is a name; set "
			  "image.serve_listen = \"ADDRESS:PORT\" (the head's boot-network address)",
			  s->host, c->image.serve_listen ? "image.serve_listen" : "image.http_url");
		return KILN_EXIT_USAGE;
	}
	s->dirfd = open(c->image.output_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (s->dirfd < 0) {
		log_error_errno(-errno,
				"Cannot open image.output_dir '%s': %m; build the image into it "
				"(make image IMAGE_OUT=%s) or point image.output_dir at it",
				c->image.output_dir, c->image.output_dir);
		return KILN_EXIT_USAGE;
	}
	s->secret_path[KILN_SERVE_SECRET_MUNGE_KEY] = c->image.munge_key;
	s->secret_key[KILN_SERVE_SECRET_MUNGE_KEY] = "image.munge_key";
	s->secret_path[KILN_SERVE_SECRET_ROOT_PASSWORD] = c->image.root_password_file;
	s->secret_key[KILN_SERVE_SECRET_ROOT_PASSWORD] = "image.root_password_file";
	s->secret_path[KILN_SERVE_SECRET_INFERD_KEYS] = c->inference.api_keys_file;
	s->secret_key[KILN_SERVE_SECRET_INFERD_KEYS] = "inference.api_keys_file";
	if (site_check_secrets(s) < 0)
		return KILN_EXIT_USAGE;
	r = kiln_cfg_render(c, "boot.ipxe", NULL, &s->boot_ipxe);
	if (r < 0)
		return log_error_errno(r, "Failed to render boot.ipxe: %m"), KILN_EXIT_FAILURE;
	*ret = TAKE_PTR(s);
	return 0;
}

/* ---- the server's state ----------------------------------------------- */

typedef struct serve_state {
	pthread_rwlock_t lock; /* site: read by requests, swapped by SIGHUP */
	serve_site *site;
	pthread_mutex_t slurm_lock; /* libslurm calls, one at a time */
	const char *config_path;
} serve_state;

/* The address and port a request came from. */
typedef struct peer {
	bool v4;
	uint32_t addr; /* host order, when v4 (IPv4-mapped IPv6 too) */
	unsigned port;
} peer;

static peer peer_of(kiln_http_request *r)
{
	peer p = {};
	const struct sockaddr *sa = kiln_http_request_peer(r);
	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *) sa;
		p.v4 = true;
		p.addr = ntohl(in->sin_addr.s_addr);
		p.port = ntohs(in->sin_port);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) sa;
		p.port = ntohs(in6->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			uint32_t a;
			memcpy(&a, in6->sin6_addr.s6_addr + 12, 4);
			p.v4 = true;
			p.addr = ntohl(a);
		}
	}
	return p;
}

static const kiln_cfg_node *node_by_address(const kiln_cfg *c, uint32_t addr)
{
	for (size_t i = 0; i < c->n_nodes; i++)
		if (c->nodes[i].address == addr)
			return &c->nodes[i];
	return NULL;
}

static int reply_plain(kiln_http_request *r, unsigned status, const char *cache, const char *text)
{
	if (cache)
		(void) kiln_http_set_header(r, "Cache-Control", cache);
	return kiln_http_reply_text(r, status, "text/plain; charset=utf-8", text, strlen(text));
}

/* ---- files ------------------------------------------------------------- */

static const char *content_type(const char *name)
{
	static const char *const text[] = { ".cfg", ".sig", ".ipxe", ".txt", ".sha256", ".stats" };
	for (size_t i = 0; i < ARRAY_SIZE(text); i++) {
		size_t n = strlen(name), m = strlen(text[i]);
		if (n > m && streq(name + n - m, text[i]))
			return "text/plain; charset=utf-8";
	}
	return "application/octet-stream";
}

static int serve_file(kiln_http_request *r, const serve_site *s, const char *name)
{
	const char *client = kiln_http_request_client(r);
	int fd = openat(s->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		int e = errno;
		log_info("%s: GET %s: 404 (%s in %s)", client, kiln_http_request_path(r),
			 e == ELOOP ? "a symlink, not served" : strerror(e),
			 s->cfg->image.output_dir);
		return reply_plain(r, 404, "no-cache", "kiln serve: no such file\n");
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !(st.st_mode & 044)) {
		bool secretish = S_ISREG(st.st_mode) && !(st.st_mode & 044);
		close(fd);
		if (secretish)
			log_warning(
				"%s: GET %s: 404: %s/%s is readable by its owner only (a secret?): "
				"never served",
				client, kiln_http_request_path(r), s->cfg->image.output_dir, name);
		return reply_plain(r, 404, "no-cache", "kiln serve: no such file\n");
	}
	uint64_t size = (uint64_t) st.st_size, off = 0, len = size;
	const char *range = kiln_http_request_header(r, "Range");
	/* If-Range: we give no validators, so a conditional range is sent whole */
	if (kiln_http_request_header(r, "If-Range"))
		range = NULL;
	int q = kiln_serve_parse_range(range, size, &off, &len);
	char v[96];
	(void) kiln_http_set_header(r, "Accept-Ranges", "bytes");
	(void) kiln_http_set_header(r, "Cache-Control", "no-cache");
	if (q == -ERANGE) {
		close(fd);
		snprintf(v, sizeof(v), "bytes */%llu", (unsigned long long) size);
		(void) kiln_http_set_header(r, "Content-Range", v);
		return kiln_http_reply_text(r, 416, "text/plain; charset=utf-8",
					    "kiln serve: range not satisfiable\n", 34);
	}
	if (q > 0) {
		snprintf(v, sizeof(v), "bytes %llu-%llu/%llu", (unsigned long long) off,
			 (unsigned long long) (off + len - 1), (unsigned long long) size);
		(void) kiln_http_set_header(r, "Content-Range", v);
	}
	return kiln_http_reply_fd(r, q > 0 ? 206 : 200, content_type(name), fd, off, len);
}

/* ---- iPXE -------------------------------------------------------------- */

static int serve_ipxe(kiln_http_request *r, const serve_site *s, const uint8_t mac[6])
{
	char m[18];
	kiln_format_mac(m, mac);
	const kiln_cfg_node *n = kiln_cfg_find_node_by_mac(s->cfg, mac);
	if (!n) {
		log_warning("%s: GET %s: 404: no node of %s has MAC %s (a machine not in "
			    "node_groups[].macs, or the wrong port of a node)",
			    kiln_http_request_client(r), kiln_http_request_path(r), s->cfg->path,
			    m);
		_cleanup_free_ char *body = NULL;
		if (asprintf(&body,
			     "#!ipxe\necho kiln serve: MAC %s is in no node group of the cluster "
			     "file; add it to node_groups[].macs\n",
			     m) < 0)
			return -ENOMEM;
		return reply_plain(r, 404, "no-store", body);
	}
	_cleanup_free_ char *text = NULL;
	int q = kiln_cfg_render(s->cfg, "node.ipxe", n->name, &text);
	if (q < 0)
		return q;
	log_debug("%s: boot script of %s (%s)", kiln_http_request_client(r), n->name, m);
	(void) kiln_http_set_header(r, "Cache-Control", "no-store");
	return kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", text, strlen(text));
}

/* ---- secrets ----------------------------------------------------------- */

/* Whether Slurm lists node as up (slurmd answering, not down, failing or
 * rebooting).  Returns 1 up, 0 not up (or unknown to Slurm), < 0 when
 * slurmctld cannot be asked (why filled). */
static int slurm_lists_up(serve_state *st, const char *node, char *why, size_t n)
{
	pthread_mutex_lock(&st->slurm_lock);
	kiln_error e = {};
	kiln_slurm_nodes *ns = NULL;
	int r = kiln_slurm_nodes_load(node, &ns, &e);
	if (r >= 0) {
		const kiln_slurm_node *sn = kiln_slurm_nodes_find(ns, node);
		char state[64] = "unknown to Slurm";
		if (sn)
			kiln_slurm_state_string(sn->state, state, sizeof(state));
		r = sn && !kiln_slurm_state_down(sn->state) &&
		    !kiln_slurm_state_rebooting(sn->state);
		snprintf(why, n, "%s", state);
		kiln_slurm_nodes_free(ns);
	} else
		snprintf(why, n, "%s", e.msg[0] ? e.msg : strerror(-r));
	pthread_mutex_unlock(&st->slurm_lock);
	return r;
}

static int refuse(kiln_http_request *r, const char *node, const char *reason)
{
	log_warning("secret refused: %s (node %s) GET %s: %s", kiln_http_request_client(r),
		    node ?: "none", kiln_http_request_path(r), reason);
	_cleanup_free_ char *body = NULL;
	if (asprintf(&body, "kiln serve: refused: %s\n", reason) < 0)
		return -ENOMEM;
	return reply_plain(r, 403, "no-store", body);
}

static int serve_secret(kiln_http_request *r, serve_state *st, const serve_site *s,
			kiln_serve_secret which)
{
	const kiln_cfg *c = s->cfg;
	peer p = peer_of(r);
	char why[PATH_MAX * 2 + 256];
	const kiln_cfg_node *n = p.v4 ? node_by_address(c, p.addr) : NULL;
	const char *node = n ? n->name : NULL;
	/* Binding a port below 1024 takes root (CAP_NET_BIND_SERVICE) on the
	 * node: a user's job cannot, whatever else it can do. */
	if (p.port == 0 || p.port >= 1024) {
		snprintf(why, sizeof(why),
			 "source port %u is not privileged (< 1024): only root on a node may ask",
			 p.port);
		return refuse(r, node, why);
	}
	if (!n)
		return refuse(r, NULL, "the address is not one the cluster file gives a node");
	if (which == KILN_SERVE_SECRET_INFERD_KEYS && !n->inference)
		return refuse(r, node, "not an inference node (inference.nodes)");
	const char *path = s->secret_path[which];
	if (!path) {
		log_info("%s (node %s) GET %s: 404: %s is not set", kiln_http_request_client(r),
			 node, kiln_http_request_path(r), s->secret_key[which]);
		snprintf(why, sizeof(why), "kiln serve: %s is not set in the cluster file\n",
			 s->secret_key[which]);
		return reply_plain(r, 404, "no-store", why);
	}
	if (c->image.secrets_only_when_down) {
		char state[KILN_ERROR_MSG_MAX];
		int up = slurm_lists_up(st, node, state, sizeof(state));
		if (up < 0) {
			snprintf(why, sizeof(why),
				 "cannot ask Slurm whether the node is up "
				 "(image.secrets_only_when_down): %s",
				 state);
			return refuse(r, node, why);
		}
		if (up > 0) {
			snprintf(
				why, sizeof(why),
				"Slurm lists the node as up (%s); secrets only while it is down or "
				"rebooting (image.secrets_only_when_down)",
				state);
			return refuse(r, node, why);
		}
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
	struct stat sst;
	if (fd < 0 || fstat(fd, &sst) < 0) {
		log_error_errno(-errno, "%s (node %s) GET %s: 503: cannot read '%s' (%s): %m",
				kiln_http_request_client(r), node, kiln_http_request_path(r), path,
				s->secret_key[which]);
		if (fd >= 0)
			close(fd);
		return reply_plain(r, 503, "no-store", "kiln serve: the secret cannot be read\n");
	}
	_cleanup_close_ int cfd = fd;
	if (!secret_stat_ok(path, &sst, which, why, sizeof(why))) {
		log_error("%s (node %s) GET %s: 503: not handed out: %s",
			  kiln_http_request_client(r), node, kiln_http_request_path(r), why);
		return reply_plain(r, 503, "no-store",
				   "kiln serve: the secret's file on the head is unsafe\n");
	}
	if ((uint64_t) sst.st_size > SERVE_SECRET_MAX) {
		log_error("%s (node %s) GET %s: 503: '%s' is %lld bytes, more than a secret's %zu",
			  kiln_http_request_client(r), node, kiln_http_request_path(r), path,
			  (long long) sst.st_size, SERVE_SECRET_MAX);
		return reply_plain(r, 503, "no-store", "kiln serve: the secret cannot be read\n");
	}
	_cleanup_free_ char *buf = malloc((size_t) sst.st_size + 1);
	if (!buf)
		return -ENOMEM;
	size_t got = 0;
	while (got < (size_t) sst.st_size) {
		ssize_t k = read(cfd, buf + got, (size_t) sst.st_size - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t) k;
	}
	if (got != (size_t) sst.st_size) {
		log_error("%s (node %s) GET %s: 503: short read of '%s'",
			  kiln_http_request_client(r), node, kiln_http_request_path(r), path);
		return reply_plain(r, 503, "no-store", "kiln serve: the secret cannot be read\n");
	}
	log_info("%s (node %s): handed %s (%s)", kiln_http_request_client(r), node,
		 kiln_serve_secret_name(which), path);
	(void) kiln_http_set_header(r, "Cache-Control", "no-store");
	(void) kiln_http_set_header(r, "Pragma", "no-cache");
	return kiln_http_reply_text(r, 200, "application/octet-stream", buf, got);
}

/* ---- the one route ----------------------------------------------------- */

static int on_request(kiln_http_request *r, void *userdata)
{
	serve_state *st = userdata;
	pthread_rwlock_rdlock(&st->lock);
	const serve_site *s = st->site;
	kiln_serve_target t;
	int q;
	switch (kiln_serve_route(s->base, kiln_http_request_path(r), &t)) {
	case KILN_SERVE_FILE:
		q = serve_file(r, s, t.name);
		break;
	case KILN_SERVE_BOOT:
		(void) kiln_http_set_header(r, "Cache-Control", "no-cache");
		q = kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", s->boot_ipxe,
					 strlen(s->boot_ipxe));
		break;
	case KILN_SERVE_IPXE:
		q = serve_ipxe(r, s, t.mac);
		break;
	case KILN_SERVE_SECRET:
		q = serve_secret(r, st, s, t.secret);
		break;
	default: {
		log_info("%s: GET %s: 404: %s", kiln_http_request_client(r),
			 kiln_http_request_path(r), t.why);
		char body[256];
		snprintf(body, sizeof(body), "kiln serve: not found: %s\n", t.why);
		q = reply_plain(r, 404, "no-cache", body);
		break;
	}
	}
	pthread_rwlock_unlock(&st->lock);
	return q;
}

/* ---- the daemon -------------------------------------------------------- */

static int on_stop(sd_event_source *es, const struct signalfd_siginfo *si, void *u)
{
	log_info("%s: stopping", strsignal((int) si->ssi_signo));
	(void) sd_notify(0, "STOPPING=1");
	return sd_event_exit(sd_event_source_get_event(es), 0);
}

static int on_reload(sd_event_source *es, const struct signalfd_siginfo *si, void *u)
{
	serve_state *st = u;
	(void) sd_notify(0, "RELOADING=1");
	serve_site *n = NULL;
	int r = site_load(st->config_path, &n);
	if (r != 0) {
		log_error("SIGHUP: %s not reloaded (errors above); still serving the one loaded "
			  "before",
			  st->config_path ?: kiln_cfg_default_path());
		(void) sd_notify(0, "READY=1");
		return 0;
	}
	if (!streq(n->host, st->site->host) || n->port != st->site->port)
		log_warning("SIGHUP: the listen address changed to %s:%u; still listening on "
			    "%s:%u until kiln serve restarts",
			    n->host, n->port, st->site->host, st->site->port);
	pthread_rwlock_wrlock(&st->lock);
	serve_site *old = st->site;
	st->site = n;
	pthread_rwlock_unlock(&st->lock);
	site_free(old);
	log_info("SIGHUP: reloaded %s (%zu nodes)", n->cfg->path, n->cfg->n_nodes);
	(void) sd_notifyf(0, "READY=1\nSTATUS=Serving %s (%zu nodes)", n->cfg->image.output_dir,
			  n->cfg->n_nodes);
	return 0;
}

/* 1,000 idle sockets and a few thousand booting nodes need more than the
 * usual 1,024 descriptors. */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	rlim_t want = MIN((rlim_t) SERVE_NOFILE_WANTED, rl.rlim_max);
	if (rl.rlim_cur < want) {
		rl.rlim_cur = want;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			log_debug_errno(-errno, "Raising RLIMIT_NOFILE: %m, ignoring");
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2048)
		log_warning("Only %llu open files allowed (ulimit -n): fewer nodes can download "
			    "at once; raise LimitNOFILE=",
			    (unsigned long long) rl.rlim_cur);
}

int kiln_serve_main(int argc, char **argv)
{
	const struct passwd *pw = getpwnam("munge");
	if (pw)
		munge_uid = pw->pw_uid;
	serve_state st = { .config_path = arg_config ?: kiln_cli_config() };
	int r = site_load(st.config_path, &st.site);
	if (r != 0)
		return r;
	/* before any thread starts: they inherit the mask, and sd-event takes
	 * the signals through a signalfd */
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigaddset(&ss, SIGHUP);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	raise_nofile();
	pthread_rwlock_init(&st.lock, NULL);
	pthread_mutex_init(&st.slurm_lock, NULL);

	_cleanup_(sd_event_unrefp) sd_event *ev = NULL;
	if ((r = sd_event_default(&ev)) < 0 ||
	    (r = sd_event_add_signal(ev, NULL, SIGTERM, on_stop, &st)) < 0 ||
	    (r = sd_event_add_signal(ev, NULL, SIGINT, on_stop, &st)) < 0 ||
	    (r = sd_event_add_signal(ev, NULL, SIGHUP, on_reload, &st)) < 0 ||
	    (r = sd_event_set_watchdog(ev, true)) < 0) {
		site_free(st.site);
		return log_error_errno(r, "Failed to set up the event loop: %m");
	}
	static const kiln_http_route routes[] = {
		{ "GET", "/", true, on_request, NULL },
	};
	kiln_http_route rt[1] = { routes[0] };
	rt[0].userdata = &st;
	kiln_http_config hc = {
		.address = st.site->host,
		.port = st.site->port,
		.threads = (unsigned) arg_threads,
		.max_connections = SERVE_CONNECTIONS_MAX,
		.max_connections_per_client = (unsigned) arg_per_client,
		.idle_timeout_s = (unsigned) arg_idle_timeout,
		/* nothing is uploaded: a body is refused before it is read */
		.max_body_bytes = 1,
		.routes = rt,
		.n_routes = 1,
	};
	kiln_http_server *srv = NULL;
	r = kiln_http_server_start(&hc, &srv);
	if (r < 0) {
		log_error_errno(r,
				"Failed to listen on %s:%u: %m; is another server (nginx, a "
				"second kiln serve) on that port, and is the address this "
				"host's?",
				st.site->host, st.site->port);
		site_free(st.site);
		return KILN_EXIT_FAILURE;
	}
	const serve_site *s = st.site;
	log_info("Serving %s and %zu nodes' boot scripts at http://%s%s%s:%u%s/ (secrets: %s%s)",
		 s->cfg->image.output_dir, s->cfg->n_nodes, strchr(s->host, ':') ? "[" : "",
		 s->host, strchr(s->host, ':') ? "]" : "", kiln_http_server_port(srv), s->base,
		 s->cfg->image.secrets_only_when_down ? "only to nodes Slurm lists down, " : "",
		 "root on a node only");
	(void) sd_notifyf(0, "READY=1\nSTATUS=Serving %s (%zu nodes)", s->cfg->image.output_dir,
			  s->cfg->n_nodes);
	r = sd_event_loop(ev);
	if (r < 0)
		log_error_errno(r, "Event loop failed: %m");
	kiln_http_server_free(srv);
	site_free(st.site);
	pthread_rwlock_destroy(&st.lock);
	pthread_mutex_destroy(&st.slurm_lock);
	return r < 0 ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
}
