/* kiln-store-server — the kiln store as a standalone program, for the store's
 * script tests and benchmarks (PyTorch clients, hostile clients, load).
 *
 *   kiln-store-server [--bind ADDR] [--port P] [--secret S] [--allow ADDR]...
 *                     [--allow-all] [--no-loopback] [--max-conns N]
 *                     [--require-auth] [--any-uid] [--relay-port-file FILE]
 *                     [--port-file FILE] [--dump-keys]
 *
 * Prints "port N" on stdout once listening (and writes N to --port-file),
 * serves until SIGTERM/SIGINT, then prints its counters (and with
 * --dump-keys every key, one "key NAME" line each) on stderr.  The
 * secret may also come from $KILN_STORE_SECRET.  --require-auth: every
 * connection must present the secret or come through a relay (kiln-run's
 * setting); --any-uid: admit local peers of every uid (the library's
 * default admits only this process's euid); --relay-port-file: also run a
 * relay (as kiln-run does on each node) in front of the store and write
 * its port there.  Each refused peer is a "refused: ..." line on stderr.
 * Exit: 0, 1 on a runtime failure, 2 on bad usage. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/store.h"
#include "kiln/strbuf.h"

#define ALLOW_MAX 4096

static int dump_key(const char *key, const void *value, size_t len, void *userdata)
{
	fprintf(stderr, "key %s\n", key);
	return 0;
}

static void print_refused(const char *msg, void *userdata)
{
	fprintf(stderr, "refused: %s\n", msg);
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kiln-store-server [--bind ADDR] [--port P] [--secret S] [--allow ADDR]...\n"
		"                         [--allow-all] [--no-loopback] [--max-conns N] "
		"[--port-file FILE]\n"
		"                         [--require-auth] [--any-uid] [--relay-port-file FILE]\n"
		"                         [--dump-keys]\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = { { "bind", required_argument, NULL, 'b' },
						  { "port", required_argument, NULL, 'p' },
						  { "secret", required_argument, NULL, 's' },
						  { "allow", required_argument, NULL, 'a' },
						  { "allow-all", no_argument, NULL, 'A' },
						  { "no-loopback", no_argument, NULL, 'L' },
						  { "max-conns", required_argument, NULL, 'm' },
						  { "port-file", required_argument, NULL, 'f' },
						  { "dump-keys", no_argument, NULL, 'D' },
						  { "require-auth", no_argument, NULL, 'R' },
						  { "any-uid", no_argument, NULL, 'U' },
						  { "relay-port-file", required_argument, NULL,
						    'r' },
						  { "help", no_argument, NULL, 'h' },
						  {} };
	kiln_store_server_opts o;
	static uint32_t allow[ALLOW_MAX];
	const char *port_file = NULL, *relay_file = NULL;
	bool dump_keys = false;
	int c, r;

	kiln_store_server_opts_init(&o);
	o.secret = getenv("KILN_STORE_SECRET");
	if (o.secret && !o.secret[0])
		o.secret = NULL;
	o.allow = allow;
	while ((c = getopt_long(argc, argv, "b:p:s:a:ALm:f:DRUr:h", longopts, NULL)) >= 0) {
		switch (c) {
		case 'b':
			o.bind_address = optarg;
			break;
		case 'p': {
			int p;
			if (kiln_parse_int(optarg, 0, 65535, &p) < 0) {
				log_error("--port: '%s' is not a port number (0-65535).", optarg);
				return 2;
			}
			o.port = (uint16_t) p;
			break;
		}
		case 's':
			o.secret = optarg;
			break;
		case 'a':
			if (o.n_allow >= ALLOW_MAX ||
			    kiln_parse_ipv4(optarg, &allow[o.n_allow]) < 0) {
				log_error("--allow: '%s' is not an IPv4 address (or more than %d "
					  "given).",
					  optarg, ALLOW_MAX);
				return 2;
			}
			o.n_allow++;
			break;
		case 'A':
			o.allow_all = true;
			break;
		case 'L':
			o.allow_loopback = false;
			break;
		case 'm': {
			int m;
			if (kiln_parse_int(optarg, 1, 1 << 20, &m) < 0) {
				log_error(
					"--max-conns: '%s' is not a number between 1 and 1048576.",
					optarg);
				return 2;
			}
			o.max_conns = (size_t) m;
			break;
		}
		case 'f':
			port_file = optarg;
			break;
		case 'D':
			dump_keys = true;
			break;
		case 'R':
			o.require_auth = true;
			break;
		case 'U':
			o.check_peer_uid = false;
			break;
		case 'r':
			relay_file = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		log_error("Unexpected argument '%s'.", argv[optind]);
		usage(stderr);
		return 2;
	}

	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	pthread_sigmask(SIG_BLOCK, &ss, NULL);

	o.on_refused = print_refused;
	if (relay_file && !o.secret) {
		log_error("--relay-port-file needs --secret (the relay presents it).");
		return 2;
	}
	kiln_store_server *s = NULL;
	r = kiln_store_server_new(&o, &s);
	if (r < 0) {
		log_error_errno(r, "Failed to start the store on %s:%u: %m",
				o.bind_address ? o.bind_address : "0.0.0.0", o.port);
		return 1;
	}
	r = kiln_store_server_start(s);
	if (r < 0) {
		log_error_errno(r, "Failed to start the store thread: %m");
		kiln_store_server_free(s);
		return 1;
	}
	if (port_file) {
		char buf[16];
		int n = snprintf(buf, sizeof(buf), "%u\n", kiln_store_server_port(s));
		r = kiln_write_file_atomic(port_file, buf, (size_t) n, 0644);
		if (r < 0) {
			log_error_errno(r, "Failed to write '%s': %m", port_file);
			kiln_store_server_free(s);
			return 1;
		}
	}
	kiln_store_relay *relay = NULL;
	if (relay_file) {
		kiln_store_relay_opts ro;
		kiln_store_relay_opts_init(&ro);
		ro.upstream_host = "127.0.0.1";
		ro.upstream_port = kiln_store_server_port(s);
		ro.secret = o.secret;
		ro.on_refused = print_refused;
		char buf[16];
		r = kiln_store_relay_new(&ro, &relay);
		if (r >= 0) {
			int n = snprintf(buf, sizeof(buf), "%u\n", kiln_store_relay_port(relay));
			r = kiln_write_file_atomic(relay_file, buf, (size_t) n, 0644);
		}
		if (r < 0) {
			log_error_errno(r, "Failed to start the relay: %m");
			kiln_store_relay_free(relay);
			kiln_store_server_free(s);
			return 1;
		}
	}
	printf("port %u\n", kiln_store_server_port(s));
	fflush(stdout);

	int sig;
	sigwait(&ss, &sig);
	kiln_store_relay_free(relay);
	kiln_store_server_stop(s);
	kiln_store_server_stats st;
	kiln_store_server_get_stats(s, &st);
	fprintf(stderr,
		"stats: connections=%" PRIu64 " accepted=%" PRIu64 " refused=%" PRIu64
		" refused_uid=%" PRIu64 " dropped_protocol=%" PRIu64 " dropped_auth=%" PRIu64
		" dropped_limits=%" PRIu64 " keys=%" PRIu64 " store_bytes=%" PRIu64
		" buffered=%" PRIu64 " requests=%" PRIu64 "\n",
		st.connections, st.accepted, st.refused_peers, st.refused_uid, st.dropped_protocol,
		st.dropped_auth, st.dropped_limits, st.keys, st.store_bytes, st.buffered_bytes,
		st.requests);
	if (dump_keys)
		kiln_store_server_foreach(s, NULL, dump_key, NULL);
	kiln_store_server_free(s);
	return 0;
}
