/* kiln/error.h — the one error detail kiln's libraries hand back.
 *
 * A library function that can refuse its input for a reason a user must
 * see (a model file, a tokenizer, a checkpoint, a JSON request) returns a
 * negative errno and, when given a kiln_error (NULL allowed), fills it:
 * which file, where in it, and what is wrong.  Libraries never print it;
 * the program reports it, as one line from kiln_error_format() or, where
 * there is no file (JSON, km_ model checks), as msg alone.  Plain C with
 * no other kiln header, so kernels/, common/ and services/ can all take it.
 *
 * `msg` is the whole message about the fault: it names `where` itself
 * ("tensor 'x': ...", "messages[2].content: ..."), which is there again on
 * its own for programs (OpenAI's "param", tests).  Each library cuts its
 * messages at its own limit (KM_ERROR_MAX, KILN_JSON_MESSAGE_MAX ...), all
 * below KILN_ERROR_MSG_MAX. */
#pragma once

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ERROR_FILE_MAX  256
#define KILN_ERROR_WHERE_MAX 128
/* The longest message: a libkmf one is "tensor 'NAME': " (NAME up to
 * KILN_ERROR_WHERE_MAX - 1 bytes) and up to 383 bytes more. */
#define KILN_ERROR_MSG_MAX 640

typedef struct kiln_error {
	int code;			  /* the negative errno also returned */
	char file[KILN_ERROR_FILE_MAX];	  /* the file (or input) at fault; "" for none */
	int64_t offset;			  /* byte offset of the fault in file; -1 for none */
	int line, column;		  /* 1-based, in text input (JSON); 0 for none */
	char where[KILN_ERROR_WHERE_MAX]; /* the tensor, JSON path ...; "" for none */
	char msg[KILN_ERROR_MSG_MAX];	  /* what is wrong and what to do */
} kiln_error;

/* Empties e (code 0, offset -1, line and column 0, where and msg "") and
 * sets file (NULL: ""; cut to fit).  NULL e: nothing. */
void kiln_error_reset(kiln_error *e, const char *file);

/* Fills e for a refusal: keeps e->file, sets code and msg (cut to
 * KILN_ERROR_MSG_MAX) from fmt, clears offset, line, column and where.
 * Returns code, so that a library can `return kiln_error_setf(err, -EIO,
 * ...)`.  NULL e: only returns code.  Every kiln library formats its
 * error messages through this (or kiln_json_fail(), which adds the path). */
int kiln_error_setf(kiln_error *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* kiln_error_setf with a va_list, for a library's own printf-like wrapper. */
int kiln_error_vsetf(kiln_error *e, int code, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));
/* kiln_error_reset(e, file), then code and the message from fmt, cut at
 * max bytes (the library's own limit; at most KILN_ERROR_MSG_MAX).  NULL
 * e: nothing.  Returns code, for `return kiln_error_vset(...)`. */
int kiln_error_vset(kiln_error *e, const char *file, int code, size_t max, const char *fmt,
		    va_list ap) __attribute__((format(printf, 5, 0)));

/* One line for a user: "FILE: byte N: MSG", without "FILE: " when file is
 * "" and without "byte N: " when offset is -1; "(no error)" for NULL e.
 * Cut to fit len.  Returns buf. */
char *kiln_error_format(const kiln_error *e, char *buf, size_t len);

/* A message into a caller's buffer (the "char *why, size_t whylen" out
 * parameter of functions that explain a refusal): printf into buf, cut to
 * fit; nothing when buf is NULL or len 0. */
void kiln_errbuf_printf(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
