/* error.c — kiln_error, the error detail every kiln library hands back
 * (kiln/error.h): reset, the one formatter of messages, and the one-line
 * format. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kiln/error.h"

void kiln_error_reset(kiln_error *e, const char *file)
{
	if (!e)
		return;
	memset(e, 0, sizeof(*e));
	e->offset = -1;
	snprintf(e->file, sizeof(e->file), "%s", file ? file : "");
}

int kiln_error_vset(kiln_error *e, const char *file, int code, size_t max, const char *fmt,
		    va_list ap)
{
	if (!e)
		return code;
	kiln_error_reset(e, file);
	e->code = code;
	vsnprintf(e->msg, max < sizeof(e->msg) ? max : sizeof(e->msg), fmt, ap);
	return code;
}

int kiln_error_vsetf(kiln_error *e, int code, const char *fmt, va_list ap)
{
	if (!e)
		return code;
	char file[KILN_ERROR_FILE_MAX];
	memcpy(file, e->file, sizeof(file));
	file[sizeof(file) - 1] = 0;
	return kiln_error_vset(e, file, code, sizeof(e->msg), fmt, ap);
}

int kiln_error_setf(kiln_error *e, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_error_vsetf(e, code, fmt, ap);
	va_end(ap);
	return code;
}

char *kiln_error_format(const kiln_error *e, char *buf, size_t len)
{
	char at[32] = "";
	if (!buf || len == 0)
		return buf;
	if (!e) {
		snprintf(buf, len, "(no error)");
		return buf;
	}
	if (e->offset >= 0)
		snprintf(at, sizeof(at), "byte %lld: ", (long long) e->offset);
	snprintf(buf, len, "%s%s%s%s", e->file, e->file[0] ? ": " : "", at, e->msg);
	return buf;
}

void kiln_errbuf_printf(char *buf, size_t len, const char *fmt, ...)
{
	if (!buf || !len)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}
