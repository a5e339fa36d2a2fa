/* kiln/strbuf.h — a growable string buffer and string-vector helpers.
 *
 * Renderers, metrics and JSON glue build text with it.  On allocation failure
 * the buffer remembers the error (kiln_strbuf_error()), so callers can append
 * freely and check once at the end. */
#pragma once

#include <stdarg.h>
#include <stddef.h>

#include "kiln/macro.h"

typedef struct kiln_strbuf {
	char *s;
	size_t len, cap;
	int error; /* 0 or -ENOMEM once an append failed */
} kiln_strbuf;

void kiln_strbuf_init(kiln_strbuf *b);
void kiln_strbuf_free(kiln_strbuf *b); /* frees contents, not b */
int kiln_strbuf_append(kiln_strbuf *b, const char *s);
int kiln_strbuf_append_n(kiln_strbuf *b, const char *s, size_t n);
int kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) _printf_(2, 3);
int kiln_strbuf_vprintf(kiln_strbuf *b, const char *fmt, va_list ap);
int kiln_strbuf_error(const kiln_strbuf *b);
/* Hands the string over (never NULL on success: "" for empty); NULL on error. */
char *kiln_strbuf_steal(kiln_strbuf *b);
static inline void kiln_strbuf_freep(kiln_strbuf *b)
{
	kiln_strbuf_free(b);
}
#define _cleanup_strbuf_ _cleanup_(kiln_strbuf_freep)

/* Text from elsewhere (a Slurm drain reason, a node's JSON, a model name) made
 * safe to print on a terminal: appends s with every control character (C0
 * including ESC, DEL, and C1 U+0080..U+009F, which some terminals also obey)
 * and every byte that is not part of valid UTF-8 written as a visible "\xHH"
 * per byte.  Valid UTF-8 text passes unchanged.  Returns 0 or -ENOMEM. */
int kiln_strbuf_append_printable(kiln_strbuf *b, const char *s);
/* The same into a new string (free() it); NULL on -ENOMEM.  s may be NULL
 * (gives NULL, errno 0): callers pass optional fields straight through. */
char *kiln_str_printable(const char *s);

/* NULL-terminated string vectors (char **). */
size_t strv_length(char *const *v);
/* Appends a copy of s; returns 0 or -ENOMEM. */
int strv_extend(char ***v, const char *s);
/* Appends s itself (takes ownership even on failure). */
int strv_consume(char ***v, char *s);
int strv_contains(char *const *v, const char *s);

/* Writes all len bytes of data to fd, retrying short writes and EINTR.
 * Returns 0 or -errno. */
int kiln_write_all(int fd, const void *data, size_t len);
/* Writes data to path atomically: a temp file in the same directory, fsync,
 * rename.  mode as for open(2).  Returns 0 or -errno; the old file survives
 * any failure. */
int kiln_write_file_atomic(const char *path, const char *data, size_t len, unsigned mode);
/* Reads a whole file (NUL-terminated) with a size cap. */
int kiln_read_file(const char *path, size_t max, char **ret, size_t *ret_len);
