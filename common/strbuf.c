/* strbuf.c — growable strings, string vectors, and whole-file I/O.
 *
 * Generated files must never be seen half-written by a reader (slurmctld
 * re-reading slurm.conf, dnsmasq on SIGHUP), hence kiln_write_file_atomic:
 * temp file in the same directory, fsync, rename over the old one. */
#include <fcntl.h>
#include <limits.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/strbuf.h"

void kiln_strbuf_init(kiln_strbuf *b)
{
	memset(b, 0, sizeof(*b));
}

void kiln_strbuf_free(kiln_strbuf *b)
{
	free(b->s);
	kiln_strbuf_init(b);
}

static int reserve(kiln_strbuf *b, size_t extra)
{
	if (b->error)
		return b->error;
	if (b->len + extra + 1 <= b->cap)
		return 0;
	size_t cap = MAX(b->cap * 2, b->len + extra + 1);
	cap = MAX(cap, (size_t) 64);
	char *s = realloc(b->s, cap);
	if (!s)
		return (b->error = -ENOMEM);
	b->s = s;
	b->cap = cap;
	return 0;
}

int kiln_strbuf_append_n(kiln_strbuf *b, const char *s, size_t n)
{
	int r = reserve(b, n);
	if (r < 0)
		return r;
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = 0;
	return 0;
}

int kiln_strbuf_append(kiln_strbuf *b, const char *s)
{
	return kiln_strbuf_append_n(b, s, strlen(s));
}

int kiln_strbuf_vprintf(kiln_strbuf *b, const char *fmt, va_list ap)
{
	va_list aq;
	va_copy(aq, ap);
	int n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0)
		return (b->error = -EINVAL);
	int r = reserve(b, (size_t) n);
	if (r < 0)
		return r;
	vsnprintf(b->s + b->len, (size_t) n + 1, fmt, ap);
	b->len += (size_t) n;
	return 0;
}

/* The length of the valid UTF-8 sequence at s (1..4), or 0 when s does not
 * start one: overlong forms, surrogates and code points past U+10FFFF are not
 * valid (RFC 3629, section 4). */
static size_t utf8_sequence(const unsigned char *s)
{
	unsigned char c = s[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		if (c == 0xe0)
			lo = 0xa0; /* overlong */
		else if (c == 0xed)
			hi = 0x9f; /* surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		if (c == 0xf0)
			lo = 0x90; /* overlong */
		else if (c == 0xf4)
			hi = 0x8f; /* past U+10FFFF */
	} else
		return 0;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0; /* also stops at the NUL */
	return n;
}

int kiln_strbuf_append_printable(kiln_strbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *) s;
	while (*p) {
		size_t n = utf8_sequence(p);
		/* C0 and DEL; C1 is U+0080..U+009F, in UTF-8 0xc2 0x80..0x9f */
		bool control =
			n == 1 ? (*p < 0x20 || *p == 0x7f) : n == 2 && *p == 0xc2 && p[1] < 0xa0;
		if (n == 0)
			n = 1;
		if (control || (n == 1 && *p >= 0x80)) {
			for (size_t i = 0; i < n; i++)
				kiln_strbuf_printf(b, "\\x%02x", p[i]);
		} else
			kiln_strbuf_append_n(b, (const char *) p, n);
		p += n;
	}
	return kiln_strbuf_error(b);
}

char *kiln_str_printable(const char *s)
{
	if (!s) {
		errno = 0;
		return NULL;
	}
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	if (kiln_strbuf_append_printable(&b, s) < 0) {
		kiln_strbuf_free(&b);
		errno = ENOMEM;
		return NULL;
	}
	return kiln_strbuf_steal(&b);
}

int kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = kiln_strbuf_vprintf(b, fmt, ap);
	va_end(ap);
	return r;
}

int kiln_strbuf_error(const kiln_strbuf *b)
{
	return b->error;
}

char *kiln_strbuf_steal(kiln_strbuf *b)
{
	if (b->error) {
		kiln_strbuf_free(b);
		return NULL;
	}
	if (!b->s) {
		if (reserve(b, 0) < 0)
			return NULL;
		b->s[0] = 0;
	}
	char *s = b->s;
	kiln_strbuf_init(b);
	return s;
}

size_t strv_length(char *const *v)
{
	size_t n = 0;
	while (v && v[n])
		n++;
	return n;
}

int strv_consume(char ***v, char *s)
{
	if (!s)
		return -ENOMEM;
	size_t n = strv_length(*v);
	char **nv = realloc(*v, (n + 2) * sizeof(char *));
	if (!nv) {
		free(s);
		return -ENOMEM;
	}
	nv[n] = s;
	nv[n + 1] = NULL;
	*v = nv;
	return 0;
}

int strv_extend(char ***v, const char *s)
{
	return strv_consume(v, strdup(s));
}

int strv_contains(char *const *v, const char *s)
{
	for (size_t i = 0; v && v[i]; i++)
		if (streq(v[i], s))
			return 1;
	return 0;
}

/* write(2) moves at most ~2 GiB per call on Linux; ask for less. */
#define WRITE_STEP ((size_t) 1 << 30)

int kiln_write_all(int fd, const void *data, size_t len)
{
	const char *p = data;
	assert_return(data || len == 0, -EINVAL);
	while (len > 0) {
		ssize_t n = write(fd, p, MIN(len, WRITE_STEP));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t) n;
	}
	return 0;
}

int kiln_write_file_atomic(const char *path, const char *data, size_t len, unsigned mode)
{
	assert_return(path && (data || len == 0), -EINVAL);
	_cleanup_free_ char *tmp = NULL;
	if (asprintf(&tmp, "%s.kiln-tmp.XXXXXX", path) < 0)
		return -ENOMEM;
	_cleanup_close_ int fd = mkstemp(tmp);
	if (fd < 0)
		return -errno;
	int r = kiln_write_all(fd, data, len);
	if (r < 0)
		goto fail;
	if (fchmod(fd, mode) < 0 || fsync(fd) < 0) {
		r = -errno;
		goto fail;
	}
	if (rename(tmp, path) < 0) {
		r = -errno;
		goto fail;
	}
	return 0;
fail:
	unlink(tmp);
	return r;
}

int kiln_read_file(const char *path, size_t max, char **ret, size_t *ret_len)
{
	assert_return(path && ret, -EINVAL);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	_cleanup_free_ char *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			cap = MAX(cap * 2, (size_t) 8192);
			char *nb = realloc(buf, cap);
			if (!nb)
				return -ENOMEM;
			buf = nb;
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		len += (size_t) n;
		if (len > max)
			return -EFBIG;
	}
	if (!buf && !(buf = malloc(1)))
		return -ENOMEM;
	buf[len] = 0;
	if (ret_len)
		*ret_len = len;
	*ret = TAKE_PTR(buf);
	return 0;
}
