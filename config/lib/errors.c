/* errors.c — the error list of a cluster-file load.
 *
 * Every pass of the loader reports here instead of stopping: each problem
 * becomes one kiln_cfg_error (file, line, setting path, message, hint), up
 * to KILN_CFG_ERRORS_MAX, so an admin fixes a whole file in one round.
 * Library code: nothing is printed unless the caller asks
 * (kiln_cfg_errors_print). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/strbuf.h"

void kiln_cfg_errors_init(kiln_cfg_errors *e)
{
	*e = (kiln_cfg_errors){ 0 };
}

void kiln_cfg_errors_free(kiln_cfg_errors *e)
{
	if (!e)
		return;
	for (size_t i = 0; i < e->n; i++) {
		free(e->v[i].file);
		free(e->v[i].path);
		free(e->v[i].message);
		free(e->v[i].hint);
	}
	free(e->v);
	*e = (kiln_cfg_errors){ 0 };
}

int kiln_cfg_error_format(const kiln_cfg_error *err, kiln_strbuf *b)
{
	kiln_strbuf_printf(b, "%s:", err->file);
	if (err->line > 0)
		kiln_strbuf_printf(b, "%d:", err->line);
	if (err->path && err->path[0])
		kiln_strbuf_printf(b, " %s:", err->path);
	kiln_strbuf_printf(b, " %s%s", err->warning ? "warning: " : "", err->message);
	if (err->hint)
		kiln_strbuf_printf(b, "; %s", err->hint);
	kiln_strbuf_append(b, "\n");
	return kiln_strbuf_error(b);
}

void kiln_cfg_errors_print(const kiln_cfg_errors *e, FILE *f)
{
	for (size_t i = 0; i < e->n; i++) {
		_cleanup_strbuf_ kiln_strbuf b;
		kiln_strbuf_init(&b);
		if (kiln_cfg_error_format(&e->v[i], &b) >= 0)
			fputs(b.s, f);
	}
	if (e->dropped > 0)
		fprintf(f, "(%zu more errors not shown)\n", e->dropped);
}

static char *vformat(const char *fmt, va_list ap)
{
	char *s = NULL;
	if (vasprintf(&s, fmt, ap) < 0)
		return NULL;
	return s;
}

void kiln_cfg__add_errorv(loader *L, int line, const char *path, const char *hint, const char *fmt,
			  va_list ap)
{
	kiln_cfg_errors *e = L->errs;
	if (e->n >= KILN_CFG_ERRORS_MAX) {
		e->dropped++;
		return;
	}
	if (e->n == e->cap) {
		size_t nc = e->cap ? e->cap * 2 : 16;
		kiln_cfg_error *v = realloc(e->v, nc * sizeof(*v));
		if (!v) {
			L->oom = 1;
			return;
		}
		e->v = v;
		e->cap = nc;
	}
	char *msg = vformat(fmt, ap);
	kiln_cfg_error *x = &e->v[e->n];
	*x = (kiln_cfg_error){ .file = strdup(L->file),
			       .line = line,
			       .path = strdup(path ? path : ""),
			       .message = msg,
			       .hint = hint ? strdup(hint) : NULL };
	if (!x->file || !x->path || !x->message || (hint && !x->hint)) {
		free(x->file);
		free(x->path);
		free(x->message);
		free(x->hint);
		L->oom = 1;
		return;
	}
	e->n++;
}

void kiln_cfg__add_error(loader *L, int line, const char *path, const char *hint, const char *fmt,
			 ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_cfg__add_errorv(L, line, path, hint, fmt, ap);
	va_end(ap);
}

void kiln_cfg__add_warning(loader *L, int line, const char *path, const char *hint, const char *fmt,
			   ...)
{
	kiln_cfg_errors *e = L->errs;
	size_t n = e->n;
	va_list ap;
	va_start(ap, fmt);
	kiln_cfg__add_errorv(L, line, path, hint, fmt, ap);
	va_end(ap);
	if (e->n > n)
		e->v[n].warning = true;
}

void kiln_cfg__errors_drop_warnings(kiln_cfg_errors *e, size_t from)
{
	size_t k = from;
	for (size_t i = from; i < e->n; i++) {
		if (!e->v[i].warning) {
			e->v[k++] = e->v[i];
			continue;
		}
		free(e->v[i].file);
		free(e->v[i].path);
		free(e->v[i].message);
		free(e->v[i].hint);
	}
	e->n = k;
}

size_t kiln_cfg__errors_count(const kiln_cfg_errors *e, size_t from)
{
	size_t k = e->dropped;
	for (size_t i = from; i < e->n; i++)
		k += !e->v[i].warning;
	return k;
}

void kiln_cfg__root_error(loader *L, const char *path, const char *hint, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_cfg__add_errorv(L, kiln_cfg__root_line(L, path), path, hint, fmt, ap);
	va_end(ap);
}

void kiln_cfg__member_error(loader *L, const char *list, size_t i, config_setting_t *elem,
			    const char *key, const char *hint, const char *fmt, ...)
{
	char p[128];
	snprintf(p, sizeof(p), "%s[%zu].%s", list, i, key);
	va_list ap;
	va_start(ap, fmt);
	kiln_cfg__add_errorv(L, kiln_cfg__member_line(elem, key), p, hint, fmt, ap);
	va_end(ap);
}

void kiln_cfg__elem_error(loader *L, config_setting_t *arr, const char *path, size_t i,
			  const char *hint, const char *fmt, ...)
{
	char p[640];
	snprintf(p, sizeof(p), "%s[%zu]", path, i);
	va_list ap;
	va_start(ap, fmt);
	kiln_cfg__add_errorv(L, kiln_cfg__elem_line(arr, i), p, hint, fmt, ap);
	va_end(ap);
}

bool kiln_cfg__errors_full(loader *L)
{
	return L->errs->n >= KILN_CFG_ERRORS_MAX;
}

/* Errors come from several passes; present them in file order (stable, so
 * errors on one line keep the order they were found in). */
void kiln_cfg__errors_sort(kiln_cfg_errors *e, size_t from)
{
	for (size_t i = from + 1; i < e->n; i++) {
		kiln_cfg_error x = e->v[i];
		size_t j = i;
		while (j > from && e->v[j - 1].line > x.line) {
			e->v[j] = e->v[j - 1];
			j--;
		}
		e->v[j] = x;
	}
}

int kiln_cfg__member_line(config_setting_t *parent, const char *name)
{
	config_setting_t *m = parent ? config_setting_get_member(parent, name) : NULL;
	return m ? kiln_cfg__setting_line(m) : kiln_cfg__setting_line(parent);
}
int kiln_cfg__elem_line(config_setting_t *arr, size_t i)
{
	config_setting_t *e = arr ? config_setting_get_elem(arr, (unsigned) i) : NULL;
	int l = kiln_cfg__setting_line(e);
	return l ? l : kiln_cfg__setting_line(arr);
}
int kiln_cfg__root_line(loader *L, const char *path)
{
	config_setting_t *s = config_lookup(L->lc, path);
	return kiln_cfg__setting_line(s);
}
