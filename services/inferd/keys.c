/* keys.c — kiln-inferd's API keys: the keys file (one key a line, read
 * once at start, refused when others may read or change it) and the
 * bearer-token check every route makes (OpenAI's 401 shape), compared in
 * constant time.
 *
 * It exists apart from the routes because it holds a secret and the rules
 * around it (file checks, limits, no key ever logged), which read best in
 * one small file. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <inttypes.h>
#include <unistd.h>
#include <pwd.h>
#include <strings.h>
#include <sys/stat.h>

#include "program.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

/* ---- API keys ------------------------------------------------------------ */

/* Longest key accepted (OpenAI's are ~170 characters), and most keys in a
 * file: bounds the constant-time walk over them. */
#define API_KEY_MAX  256
#define API_KEYS_MAX 4096

/* The keys of --api-keys-file, each NUL-padded to API_KEY_MAX + 1 bytes so
 * every comparison reads the same number of bytes; n 0: no keys, every
 * request is inferd_served. */
static struct {
	char (*key)[API_KEY_MAX + 1];
	size_t *len;
	int n;
} keys;

void inferd_keys_free(void)
{
	if (keys.key)
		explicit_bzero(keys.key, (size_t) keys.n * sizeof(*keys.key));
	free(keys.key);
	free(keys.len);
	keys.key = NULL;
	keys.len = NULL;
	keys.n = 0;
}

/* Who may own the keys file: root, or the user kiln-inferd runs as.  Any
 * other owner could rewrite the keys (or chmod the file open) at will. */
static bool keys_owner_ok(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

/* The keys are secrets, and whoever can write the file chooses who gets in:
 * refuses a file that every user may read, that its group or every user may
 * write, or that a user other than root or this one owns.  Group read stays
 * allowed, for a root:kiln-inferd 0640 file.  Returns 0 or, having logged
 * what is wrong and the fix, KILN_EXIT_USAGE (fix the file and rerun). */
static int keys_check_file(const char *path, const struct stat *st)
{
	const char *what = (st->st_mode & S_IWOTH)   ? "writable by every user"
			   : (st->st_mode & S_IWGRP) ? "writable by its group"
			   : (st->st_mode & S_IROTH) ? "readable by every user"
						     : NULL;
	if (what) {
		log_error("--api-keys-file %s is %s (mode %04o), and the keys are secrets that "
			  "decide who gets in: chown root: %s; chmod 600 %s",
			  path, what, (unsigned) (st->st_mode & 07777), path, path);
		return KILN_EXIT_USAGE;
	}
	if (!keys_owner_ok(st->st_uid)) {
		/* getpwuid() returns one static buffer: copy the owner's name */
		char owner[64];
		const struct passwd *pw = getpwuid(st->st_uid);
		snprintf(owner, sizeof(owner), "%s", pw ? pw->pw_name : "an unknown user");
		const struct passwd *me = getpwuid(geteuid());
		log_error("--api-keys-file %s is owned by %s (uid %u), not by root or %s (the user "
			  "kiln-inferd runs as), so that user could change the keys: chown root: "
			  "%s; chmod 600 %s",
			  path, owner, (unsigned) st->st_uid, me ? me->pw_name : "this user", path,
			  path);
		return KILN_EXIT_USAGE;
	}
	return 0;
}

/* Reads path: one key a line, blank lines and '#' comments skipped,
 * surrounding spaces dropped.  A file keys_check_file() refuses is exit 2;
 * one that cannot be read, or without a key, exit 1.  Returns 0 or an exit
 * status. */
int inferd_keys_load(const char *path)
{
	_cleanup_fclose_ FILE *f = fopen(path, "re");
	if (!f)
		return log_error_errno(-errno, "--api-keys-file %s: %m", path), KILN_EXIT_FAILURE;
	struct stat st;
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		log_error("--api-keys-file %s: not a regular file", path);
		return KILN_EXIT_FAILURE;
	}
	int r = keys_check_file(path, &st);
	if (r != 0)
		return r;
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;
	ssize_t got;
	int lineno = 0, n_alloc = 0;
	while ((got = getline(&line, &cap, f)) >= 0) {
		lineno++;
		char *k = line;
		while (*k == ' ' || *k == '\t')
			k++;
		size_t len = strcspn(k, "\r\n");
		while (len && (k[len - 1] == ' ' || k[len - 1] == '\t'))
			len--;
		k[len] = '\0';
		if (!len || k[0] == '#')
			continue;
		if (len > API_KEY_MAX || k[strcspn(k, " \t")] || keys.n == API_KEYS_MAX) {
			log_error("%s:%d: %s", path, lineno,
				  keys.n == API_KEYS_MAX ? "more than 4096 keys"
				  : len > API_KEY_MAX	 ? "a key longer than 256 characters"
						      : "a key with a space in it (one key a line, "
							"nothing else)");
			explicit_bzero(line, cap);
			return KILN_EXIT_FAILURE;
		}
		if (keys.n == n_alloc) {
			int m = n_alloc ? 2 * n_alloc : 16;
			void *nk = realloc(keys.key, (size_t) m * sizeof(*keys.key));
			if (nk)
				keys.key = nk;
			void *nl = realloc(keys.len, (size_t) m * sizeof(*keys.len));
			if (nl)
				keys.len = nl;
			if (!nk || !nl)
				return log_error_errno(-ENOMEM, "%s: %m", path), KILN_EXIT_FAILURE;
			n_alloc = m;
		}
		memset(keys.key[keys.n], 0, sizeof(*keys.key));
		memcpy(keys.key[keys.n], k, len);
		keys.len[keys.n++] = len;
	}
	if (line)
		explicit_bzero(line, cap);
	if (keys.n == 0) {
		log_error("--api-keys-file %s holds no key: no client could be served; add one a "
			  "line, or drop the setting to serve without keys",
			  path);
		return KILN_EXIT_FAILURE;
	}
	log_info("API keys: %d from %s; every request but /health%s needs one", keys.n, path,
		 inferd_arg.metrics_auth ? "" : " and /metrics");
	return 0;
}

/* Whether the bearer token is one of the keys: every key is compared, over
 * all API_KEY_MAX + 1 bytes, whichever matches, so the time taken says
 * nothing about how much of a key a guess got right, or which. */
static bool key_matches(const char *token)
{
	unsigned char buf[API_KEY_MAX + 1] = { 0 };
	size_t len = strnlen(token, API_KEY_MAX + 1);
	memcpy(buf, token, MIN(len, (size_t) API_KEY_MAX));
	unsigned found = 0;
	for (int i = 0; i < keys.n; i++) {
		unsigned d = (unsigned) (len ^ keys.len[i]);
		for (size_t j = 0; j < sizeof(buf); j++)
			d |= (unsigned) (buf[j] ^ (unsigned char) keys.key[i][j]);
		/* 1 when d is 0, without a branch */
		found |= 1u & (((d | (0u - d)) >> (sizeof(d) * 8 - 1)) ^ 1u);
	}
	explicit_bzero(buf, sizeof(buf));
	return found;
}

/* With keys: 0 when the request carries "Authorization: Bearer KEY" with
 * one of them, else OpenAI's 401 (type invalid_request_error, code
 * invalid_api_key), never echoing what was sent.  Without keys: 0.
 * Returns 0 to go on, else what the reply returned (> 0 never). */
int inferd_authorize(kiln_http_request *r, bool *refused)
{
	*refused = false;
	if (keys.n == 0)
		return 0;
	const char *h = kiln_http_request_header(r, "Authorization");
	*refused = true;
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return kiln_http_reply_error(
			r, 401, "invalid_request_error", NULL, "invalid_api_key",
			"You didn't provide an API key. Send it in an Authorization header: "
			"\"Authorization: Bearer KEY\" (the keys are in %s on the server).",
			inferd_arg.api_keys);
	h += 7;
	while (*h == ' ')
		h++;
	if (!key_matches(h))
		return kiln_http_reply_error(
			r, 401, "invalid_request_error", NULL, "invalid_api_key",
			"Incorrect API key provided. Use one of the keys of %s "
			"on the server.",
			inferd_arg.api_keys);
	*refused = false;
	return 0;
}
