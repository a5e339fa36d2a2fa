/* serve.h — the pure half of `kiln serve`: what a request path asks for,
 * what a Range header asks for, where to listen.
 *
 * No I/O, no globals, no allocation: serve.c calls these on every request,
 * and tests/serve/test-serve-request.c and the libFuzzer target
 * tests/fuzz/fuzz-serve.c call them on hostile input.  The path they see
 * is libmicrohttpd's, already percent-decoded: "%2e%2e" has become "..",
 * "%2f" a "/", "%00" the end of the string; a name is therefore checked
 * after decoding, and one component is all a file name may be. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A served file's name: one path component of at most this many bytes
 * (NAME_MAX), made of [A-Za-z0-9._+-], not starting with '.' (no dotfiles,
 * no "." or ".."). */
#define KILN_SERVE_NAME_MAX 255u
/* The URL's path prefix (image.http_url's path) and host: longer ones are
 * refused when the server starts. */
#define KILN_SERVE_BASE_MAX 512u
#define KILN_SERVE_HOST_MAX 256u

typedef enum kiln_serve_kind {
	KILN_SERVE_NONE,   /* not ours: 404 (why says so) */
	KILN_SERVE_FILE,   /* BASE/NAME: a file of image.output_dir */
	KILN_SERVE_BOOT,   /* BASE/boot.ipxe: the chain script, rendered */
	KILN_SERVE_IPXE,   /* BASE/ipxe/MAC: one node's script, rendered */
	KILN_SERVE_SECRET, /* BASE/secret/NAME: under the rule (docs/serve.md) */
} kiln_serve_kind;

/* The secrets kiln serve knows, by the name in BASE/secret/NAME. */
typedef enum kiln_serve_secret {
	KILN_SERVE_SECRET_MUNGE_KEY,	 /* "munge.key": image.munge_key */
	KILN_SERVE_SECRET_ROOT_PASSWORD, /* "root-password-hash": image.root_password_file */
	KILN_SERVE_SECRET_INFERD_KEYS,	 /* "inferd-keys": inference.api_keys_file */
	_KILN_SERVE_SECRET_MAX,
} kiln_serve_secret;

typedef struct kiln_serve_target {
	kiln_serve_kind kind;
	char name[KILN_SERVE_NAME_MAX + 1]; /* FILE: the file's name */
	uint8_t mac[6];			    /* IPXE */
	kiln_serve_secret secret;	    /* SECRET */
	const char *why;		    /* NONE: a short reason (static) */
} kiln_serve_target;

/* The name of a secret ("munge.key" ...), NULL past the end. */
const char *kiln_serve_secret_name(kiln_serve_secret s);

/* A file name as KILN_SERVE_NAME_MAX says. */
bool kiln_serve_name_ok(const char *name);

/* "52-54-00-12-34-56" (iPXE's ${mac:hexhyp}) or "52:54:00:12:34:56", either
 * case.  Returns 0 or -EINVAL. */
int kiln_serve_parse_mac(const char *s, uint8_t mac[6]);

/* Classifies a decoded request path under base ("/kiln", or "" for a URL
 * whose path is "/").  Always fills *t; returns t->kind. */
kiln_serve_kind kiln_serve_route(const char *base, const char *path, kiln_serve_target *t);

/* A Range header against a file of size bytes.  Only one "bytes=" range
 * is honoured ("A-B", "A-", "-N"); anything else (several ranges, another
 * unit, garbage) is ignored, as RFC 9110 lets a server do, and the whole
 * file is sent.  Returns 1 with *off and *len set (a 206), 0 for the whole
 * file (header NULL or ignored), -ERANGE when the one range lies past the
 * end (a 416). */
int kiln_serve_parse_range(const char *header, uint64_t size, uint64_t *off, uint64_t *len);

/* Splits "http://HOST[:PORT][/PATH]" into host (brackets of an IPv6
 * literal removed), port (80 when absent) and base path (no trailing '/',
 * "" for none).  Returns 0; -EPROTONOSUPPORT for https:// (kiln serve
 * speaks plain HTTP) or another scheme; -EINVAL when malformed (a port out
 * of range, user info, a query, a host or path too long). */
int kiln_serve_split_url(const char *url, char host[KILN_SERVE_HOST_MAX], uint16_t *port,
			 char base[KILN_SERVE_BASE_MAX]);

/* image.serve_listen: "ADDR:PORT" or "[V6ADDR]:PORT" (port 1-65535; 0 for
 * tests: an ephemeral port).  Returns 0 or -EINVAL. */
int kiln_serve_split_listen(const char *s, char host[KILN_SERVE_HOST_MAX], uint16_t *port);
