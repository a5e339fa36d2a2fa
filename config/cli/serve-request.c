/* serve-request.c — request paths, Range headers and URLs for `kiln serve`
 * (serve.h): pure functions on hostile input, fuzzed by
 * tests/fuzz/fuzz-serve.c.  Everything here reads strings and fills
 * caller-owned buffers; nothing allocates or touches a file. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "serve.h"

static const char *const secret_names[_KILN_SERVE_SECRET_MAX] = {
	[KILN_SERVE_SECRET_MUNGE_KEY] = "munge.key",
	[KILN_SERVE_SECRET_ROOT_PASSWORD] = "root-password-hash",
	[KILN_SERVE_SECRET_INFERD_KEYS] = "inferd-keys",
};

const char *kiln_serve_secret_name(kiln_serve_secret s)
{
	return (unsigned) s < _KILN_SERVE_SECRET_MAX ? secret_names[s] : NULL;
}

bool kiln_serve_name_ok(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > KILN_SERVE_NAME_MAX || name[0] == '.')
		return false;
	return strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") ==
	       n;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int kiln_serve_parse_mac(const char *s, uint8_t mac[6])
{
	if (strlen(s) != 17)
		return -EINVAL;
	char sep = s[2];
	if (sep != '-' && sep != ':')
		return -EINVAL;
	uint8_t m[6];
	for (size_t i = 0; i < 6; i++) {
		const char *p = s + i * 3;
		int hi = hexval(p[0]), lo = hexval(p[1]);
		if (hi < 0 || lo < 0 || (i < 5 && p[2] != sep))
			return -EINVAL;
		m[i] = (uint8_t) (hi << 4 | lo);
	}
	memcpy(mac, m, 6);
	return 0;
}

static kiln_serve_kind none(kiln_serve_target *t, const char *why)
{
	t->kind = KILN_SERVE_NONE;
	t->why = why;
	return t->kind;
}

kiln_serve_kind kiln_serve_route(const char *base, const char *path, kiln_serve_target *t)
{
	memset(t, 0, sizeof(*t));
	size_t bl = strlen(base);
	if (strncmp(path, base, bl) != 0 || path[bl] != '/')
		return none(t, "not under the image URL's path");
	const char *rest = path + bl + 1;
	const char *sub;
	if ((sub = startswith(rest, "ipxe/"))) {
		if (kiln_serve_parse_mac(sub, t->mac) < 0)
			return none(t, "not a MAC address (ipxe/52-54-00-12-34-56)");
		t->kind = KILN_SERVE_IPXE;
		return t->kind;
	}
	if ((sub = startswith(rest, "secret/"))) {
		for (unsigned i = 0; i < _KILN_SERVE_SECRET_MAX; i++)
			if (streq(sub, secret_names[i])) {
				t->kind = KILN_SERVE_SECRET;
				t->secret = (kiln_serve_secret) i;
				return t->kind;
			}
		return none(t, "no such secret (munge.key, root-password-hash, inferd-keys)");
	}
	if (streq(rest, "boot.ipxe")) {
		t->kind = KILN_SERVE_BOOT;
		return t->kind;
	}
	/* after decoding: a '/' (from "%2f" too), "..", a dotfile, a NUL cut
	 * short, a control byte: none of them is one file of the directory */
	if (!kiln_serve_name_ok(rest))
		return none(t, "not a file of the image directory (one name, no dotfiles, no "
			       "subdirectories)");
	memcpy(t->name, rest, strlen(rest) + 1);
	t->kind = KILN_SERVE_FILE;
	return t->kind;
}

/* A decimal number of at most 19 digits (no sign, no space): 0 or -EINVAL. */
static int parse_u64(const char *s, size_t n, uint64_t *ret)
{
	if (n == 0 || n > 19)
		return -EINVAL;
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (uint64_t) (s[i] - '0');
	}
	*ret = v;
	return 0;
}

int kiln_serve_parse_range(const char *header, uint64_t size, uint64_t *off, uint64_t *len)
{
	if (!header)
		return 0;
	const char *spec = startswith(header, "bytes=");
	if (!spec)
		return 0; /* another unit: ignored */
	spec += strspn(spec, " \t");
	size_t n = strcspn(spec, " \t");
	if (spec[n + strspn(spec + n, " \t")] != '\0')
		return 0; /* several ranges ("a-b, c-d") or trailing garbage: ignored */
	const char *dash = memchr(spec, '-', n);
	if (!dash)
		return 0;
	size_t a_len = (size_t) (dash - spec), b_len = n - a_len - 1;
	uint64_t a, b;
	if (a_len == 0) {
		/* "-N": the last N bytes */
		if (parse_u64(dash + 1, b_len, &b) < 0)
			return 0;
		if (b == 0 || size == 0)
			return -ERANGE;
		*len = MIN(b, size);
		*off = size - *len;
		return 1;
	}
	if (parse_u64(spec, a_len, &a) < 0)
		return 0;
	if (b_len == 0)
		b = UINT64_MAX; /* "A-": to the end */
	else if (parse_u64(dash + 1, b_len, &b) < 0 || b < a)
		return 0; /* "5-3" is invalid, not unsatisfiable: ignored */
	if (a >= size)
		return -ERANGE;
	*off = a;
	*len = MIN(b, size - 1) - a + 1;
	return 1;
}

/* "HOST[:PORT]" (HOST a name, an IPv4 literal or "[V6]") of n bytes. */
static int split_hostport(const char *s, size_t n, char host[KILN_SERVE_HOST_MAX], uint16_t *port,
			  bool port_required)
{
	const char *h = s, *p = NULL;
	size_t hn;
	if (n > 0 && s[0] == '[') {
		const char *close = memchr(s, ']', n);
		if (!close)
			return -EINVAL;
		h = s + 1;
		hn = (size_t) (close - h);
		size_t after = n - (size_t) (close + 1 - s);
		if (after > 0) {
			if (close[1] != ':')
				return -EINVAL;
			p = close + 2;
		}
	} else {
		const char *colon = memchr(s, ':', n);
		hn = colon ? (size_t) (colon - s) : n;
		if (colon)
			p = colon + 1;
	}
	if (hn == 0 || hn >= KILN_SERVE_HOST_MAX || memchr(h, '@', hn))
		return -EINVAL;
	if (strcspn(h, "/?#") < hn || memchr(h, ' ', hn))
		return -EINVAL;
	uint16_t pv = 80;
	if (p) {
		uint64_t v;
		if (parse_u64(p, n - (size_t) (p - s), &v) < 0 || v > 65535)
			return -EINVAL;
		pv = (uint16_t) v;
	} else if (port_required)
		return -EINVAL;
	memcpy(host, h, hn);
	host[hn] = 0;
	*port = pv;
	return 0;
}

int kiln_serve_split_url(const char *url, char host[KILN_SERVE_HOST_MAX], uint16_t *port,
			 char base[KILN_SERVE_BASE_MAX])
{
	if (startswith(url, "https://"))
		return -EPROTONOSUPPORT;
	const char *s = startswith(url, "http://");
	if (!s)
		return -EPROTONOSUPPORT;
	size_t hp = strcspn(s, "/?#");
	if (s[hp] == '?' || s[hp] == '#')
		return -EINVAL;
	const char *path = s + hp;
	if (strpbrk(path, "?# \t%"))
		return -EINVAL;
	size_t pn = strlen(path);
	while (pn > 0 && path[pn - 1] == '/')
		pn--;
	if (pn >= KILN_SERVE_BASE_MAX)
		return -EINVAL;
	char h[KILN_SERVE_HOST_MAX];
	uint16_t p;
	int r = split_hostport(s, hp, h, &p, false);
	if (r < 0)
		return r;
	memcpy(host, h, strlen(h) + 1);
	*port = p;
	memcpy(base, path, pn);
	base[pn] = 0;
	return 0;
}

int kiln_serve_split_listen(const char *s, char host[KILN_SERVE_HOST_MAX], uint16_t *port)
{
	return split_hostport(s, strlen(s), host, port, true);
}
