/* strbuf.c — growable strings, string vectors, and whole-file I/O.
 *
 * Generated files must never be seen half-written by a reader (slurmctld
 * re-reading slurm.conf, dnsmasq on SIGHUP), hence kiln_write_file_atomic:
 * temp file in the same directory, fsync, rename over the old one. */
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
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
