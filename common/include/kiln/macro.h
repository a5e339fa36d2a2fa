/* kiln/macro.h — small language helpers used everywhere in kiln.
 *
 * Scope-bound cleanup (`_cleanup_free_ char *s = NULL;`), explicit ownership
 * hand-over (`*ret = TAKE_PTR(s);`), argument checks for public entry points
 * (`assert_return(x, -EINVAL)`), and a few size helpers.  Header only. */
#pragma once

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f)   __attribute__((cleanup(f)))
#define _unused_       __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _noreturn_     __attribute__((noreturn))
#define _likely_(x)    __builtin_expect(!!(x), 1)
#define _unlikely_(x)  __builtin_expect(!!(x), 0)

#define ARRAY_SIZE(a)	   (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)	   ((a) < (b) ? (a) : (b))
#define MAX(a, b)	   ((a) > (b) ? (a) : (b))
#define CLAMP(x, lo, hi)   MIN(MAX(x, lo), hi)
#define DIV_ROUND_UP(x, d) (((x) + (d) -1) / (d))

/* Take ownership of a pointer or fd, leaving NULL / -1 behind. */
#define TAKE_PTR(p)                       \
	({                                \
		__typeof__(p) _tp_ = (p); \
		(p) = NULL;               \
		_tp_;                     \
	})
#define TAKE_FD(fd)               \
	({                        \
		int _tfd_ = (fd); \
		(fd) = -1;        \
		_tfd_;            \
	})

/* Public entry points check their arguments and return an error code
 * instead of crashing. */
#define assert_return(expr, r)           \
	do {                             \
		if (_unlikely_(!(expr))) \
			return (r);      \
	} while (0)

static inline void freep(void *p)
{
	free(*(void **) p);
}
static inline void closep(int *fd)
{
	if (*fd >= 0) {
		int saved = errno;
		close(*fd);
		errno = saved;
	}
}
static inline void fclosep(FILE **f)
{
	if (*f)
		fclose(*f);
}
/* Frees a NULL-terminated array of strings. */
static inline void strv_free(char **v)
{
	if (!v)
		return;
	for (char **s = v; *s; s++)
		free(*s);
	free(v);
}
static inline void strv_freep(char ***v)
{
	strv_free(*v);
}

#define _cleanup_free_	    _cleanup_(freep)
#define _cleanup_close_	    _cleanup_(closep)
#define _cleanup_fclose_    _cleanup_(fclosep)
#define _cleanup_strv_free_ _cleanup_(strv_freep)

/* Room for element n of the array *p of *cap elements of `size` bytes:
 * when n reaches *cap, the array grows to twice that (64 at first).  0, or
 * -ENOMEM with *p and *cap unchanged.  GROW(p, cap, n) for a typed p. */
static inline int kiln_grow(void **p, size_t *cap, size_t n, size_t size)
{
	size_t c = *cap ? *cap * 2 : 64, bytes;
	void *q;
	if (n < *cap)
		return 0;
	if (__builtin_mul_overflow(c, size, &bytes) || !(q = realloc(*p, bytes)))
		return -ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}
#define GROW(p, cap, n) kiln_grow((void **) &(p), &(cap), (n), sizeof(*(p)))

/* free() on every argument in order (NULL allowed): a destructor's owned
 * arrays in one statement, FREE_ALL(o->a, o->b, o). */
#define FREE_ALL(...)                                           \
	do {                                                    \
		void *_fa[] = { __VA_ARGS__ };                  \
		for (size_t _i = 0; _i < ARRAY_SIZE(_fa); _i++) \
			free(_fa[_i]);                          \
	} while (0)

/* DEFINE_TRIVIAL_CLEANUP_FUNC(kiln_cfg *, kiln_cfg_free) defines
 * kiln_cfg_freep() for use with _cleanup_(). */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func) \
	static inline void func##p(type *p)     \
	{                                       \
		if (*p)                         \
			func(*p);               \
	}

static inline int streq(const char *a, const char *b)
{
	return strcmp(a, b) == 0;
}
static inline int streq_ptr(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
}
static inline const char *startswith(const char *s, const char *prefix)
{
	size_t l = strlen(prefix);
	return strncmp(s, prefix, l) == 0 ? s + l : NULL;
}
static inline const char *strempty(const char *s)
{
	return s ? s : "";
}
static inline const char *strna(const char *s)
{
	return s ? s : "n/a";
}
