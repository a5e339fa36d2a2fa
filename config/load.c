/* config.c — load, check and free a kiln cluster file.
 *
 * libconfig does the syntax; this file does everything after it, driven by
 * the schema table (schema.c): it applies defaults, walks every setting the
 * file holds and rejects those the table does not know, converts values into
 * the typed structs of kiln/config.h, and then checks what one key alone
 * cannot show (duplicates, subnet membership, host/MAC counts, partition
 * members).  It never stops at the first problem: every error is collected
 * with its file, line and setting path so an admin fixes a file in one go.
 * Library code: nothing is logged, errors are handed back. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config-internal.h"
#include "kiln/hostlist.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

/* ---- errors ---------------------------------------------------------- */

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
	kiln_strbuf_printf(b, " %s", err->message);
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

typedef struct loader {
	kiln_cfg *cfg;
	kiln_cfg_errors *errs;
	const char *file;
	int oom;
	config_setting_t **group_set; /* node_groups[i] */
	config_setting_t **addr_set;  /* node_groups[i].addresses */
	config_setting_t **mac_set;   /* node_groups[i].macs */
	config_setting_t **part_set;  /* slurm.partitions[i] */
	config_setting_t **xid_set;
	config_t *lc;
	bool nodes_incomplete; /* some group's hosts are unknown: skip "unknown node" errors */
	int last_line;	       /* where a missing top-level section is reported: the end */
	size_t *name_idx;      /* node indexes sorted by name (then index): find_index() */
} loader;

static char *vformat(const char *fmt, va_list ap)
{
	char *s = NULL;
	if (vasprintf(&s, fmt, ap) < 0)
		return NULL;
	return s;
}

static void add_error(loader *L, int line, const char *path, const char *hint, const char *fmt, ...)
	_printf_(5, 6);
static void add_error(loader *L, int line, const char *path, const char *hint, const char *fmt, ...)
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
	va_list ap;
	va_start(ap, fmt);
	char *msg = vformat(fmt, ap);
	va_end(ap);
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

/* ---- enums ----------------------------------------------------------- */

const char *kiln_cfg_action_to_string(kiln_cfg_action a)
{
	return a >= 0 && a < _KILN_ACTION_MAX ? kiln_cfg__action_names()[a] : NULL;
}
const char *kiln_cfg_quant_to_string(kiln_cfg_quant q)
{
	return q >= 0 && q < _KILN_QUANT_MAX ? kiln_cfg__quant_names()[q] : NULL;
}
const char *kiln_cfg_part_state_to_string(kiln_cfg_part_state s)
{
	static const char *const upper[] = { "UP", "DOWN", "DRAIN", "INACTIVE" };
	return s >= 0 && s < _KILN_PART_STATE_MAX ? upper[s] : NULL;
}

const char *kiln_cfg_type_to_string(kiln_cfg_type t)
{
	static const char *const names[] = {
		[KILN_CFG_STRING] = "string",	    [KILN_CFG_INT] = "integer",
		[KILN_CFG_BOOL] = "boolean",	    [KILN_CFG_DOUBLE] = "number",
		[KILN_CFG_DURATION] = "duration",   [KILN_CFG_SIZE_MB] = "size",
		[KILN_CFG_IPV4] = "address",	    [KILN_CFG_CIDR] = "cidr",
		[KILN_CFG_HOSTLIST] = "hostlist",   [KILN_CFG_PATH] = "path",
		[KILN_CFG_ENUM] = "enum",	    [KILN_CFG_STRV] = "strings",
		[KILN_CFG_IPV4_LIST] = "addresses", [KILN_CFG_ADDRESSES] = "address-range",
		[KILN_CFG_MACS] = "macs",	    [KILN_CFG_NNODES] = "min:max",
		[KILN_CFG_NPROC] = "gpu-or-count",  [KILN_CFG_GROUP] = "group",
		[KILN_CFG_LIST] = "list",
	};
	return t >= 0 && t < _KILN_CFG_TYPE_MAX ? names[t] : NULL;
}

static const char *expected_text(kiln_cfg_type t)
{
	switch (t) {
	case KILN_CFG_INT:
		return "an integer";
	case KILN_CFG_BOOL:
		return "a boolean (true or false)";
	case KILN_CFG_DOUBLE:
		return "a number";
	case KILN_CFG_DURATION:
		return "a duration (\"10s\", \"5m\") or an integer number of seconds";
	case KILN_CFG_SIZE_MB:
		return "a size (\"512G\", \"2T\") or an integer number of MiB";
	case KILN_CFG_STRV:
		return "an array of strings [ \"a\", \"b\" ]";
	case KILN_CFG_IPV4_LIST:
		return "an array of addresses [ \"10.0.0.1\" ]";
	case KILN_CFG_ADDRESSES:
		return "a range \"FIRST-LAST\" or an array of addresses";
	case KILN_CFG_MACS:
		return "an array of MAC addresses";
	case KILN_CFG_NNODES:
		return "\"MIN:MAX\" or an integer";
	case KILN_CFG_NPROC:
		return "\"gpu\" or an integer";
	case KILN_CFG_GROUP:
		return "a group { ... }";
	case KILN_CFG_LIST:
		return "a list ( { ... }, ... )";
	default:
		return "a string";
	}
}

static const char *lc_type_text(int t)
{
	switch (t) {
	case CONFIG_TYPE_GROUP:
		return "a group";
	case CONFIG_TYPE_INT:
	case CONFIG_TYPE_INT64:
		return "an integer";
	case CONFIG_TYPE_FLOAT:
		return "a number";
	case CONFIG_TYPE_STRING:
		return "a string";
	case CONFIG_TYPE_BOOL:
		return "a boolean";
	case CONFIG_TYPE_ARRAY:
		return "an array";
	case CONFIG_TYPE_LIST:
		return "a list";
	default:
		return "nothing";
	}
}

/* ---- schema lookups -------------------------------------------------- */

static const kiln_cfg_key *find_key(const char *pattern)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++)
		if (streq(s[i].path, pattern))
			return &s[i];
	return NULL;
}

/* Length of the parent part of a schema path ("a.b.c" -> 3), 0 at the top. */
static size_t parent_len(const char *path)
{
	const char *dot = strrchr(path, '.');
	return dot ? (size_t) (dot - path) : 0;
}
static const char *last_component(const char *path)
{
	const char *dot = strrchr(path, '.');
	return dot ? dot + 1 : path;
}
static bool is_child(const char *path, const char *parent)
{
	size_t pl = strlen(parent);
	return parent_len(path) == pl && strncmp(path, parent, pl) == 0;
}

static char *unknown_hint(const char *pattern, const char *name)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	const char *best = NULL;
	size_t best_d = SIZE_MAX;
	for (size_t i = 0; i < n; i++) {
		if (!is_child(s[i].path, pattern))
			continue;
		size_t d = kiln_levenshtein(name, last_component(s[i].path));
		if (d < best_d) {
			best_d = d;
			best = last_component(s[i].path);
		}
	}
	char *h = NULL;
	if (best && best_d <= MAX((size_t) 2, strlen(name) / 3)) {
		if (asprintf(&h, "did you mean '%s'?", best) < 0)
			return NULL;
		return h;
	}
	/* The right key in the wrong section. */
	for (size_t i = 0; i < n; i++)
		if (streq(last_component(s[i].path), name) && parent_len(s[i].path) > 0) {
			if (asprintf(&h, "'%s' belongs in '%.*s'", name,
				     (int) parent_len(s[i].path), s[i].path) < 0)
				return NULL;
			return h;
		}
	return NULL;
}

static char *join_path(const char *a, const char *b)
{
	char *s = NULL;
	if (asprintf(&s, "%s%s%s", a, a[0] ? "." : "", b) < 0)
		return NULL;
	return s;
}

/* ---- value parsing --------------------------------------------------- */

/* Parses the string form of a value into dst.  On failure returns a
 * malloc'd message (and maybe a hint); NULL on success. */
static char *parse_from_string(const kiln_cfg_key *k, const char *s, void *dst, char **hint)
{
	char *m = NULL;
	int r;
	switch (k->type) {
	case KILN_CFG_STRING:
	case KILN_CFG_PATH:
	case KILN_CFG_HOSTLIST: {
		/* Values end up in slurm.conf, dnsmasq.conf, iPXE scripts and
		 * environment files, all line based: a newline would inject a line. */
		for (const char *q = s; *q; q++)
			if ((unsigned char) *q < 0x20 || *q == 0x7f) {
				(void) !asprintf(&m, "control character (0x%02x) at offset %zu",
						 (unsigned) (unsigned char) *q, (size_t) (q - s));
				return m;
			}
		if (k->type == KILN_CFG_PATH && strpbrk(s, " \t")) {
			(void) !asprintf(&m, "\"%s\" contains a space", s);
			return m;
		}
		if (k->type == KILN_CFG_PATH && s[0] != '/') {
			(void) !asprintf(&m, "\"%s\" is not an absolute path", s);
			return m;
		}
		/* Hostlists are expanded (and reported) once, by cross_check(). */
		char *c = strdup(s);
		if (!c)
			return strdup("out of memory");
		free(*(char **) dst);
		*(char **) dst = c;
		return NULL;
	}
	case KILN_CFG_INT: {
		int v;
		r = kiln_parse_int(s, (int) k->min, (int) k->max, &v);
		if (r < 0) {
			(void) !asprintf(&m, "invalid integer \"%s\"", s);
			return m;
		}
		*(int *) dst = v;
		return NULL;
	}
	case KILN_CFG_BOOL:
		if (kiln_parse_bool(s, (bool *) dst) < 0) {
			(void) !asprintf(&m, "invalid boolean \"%s\"", s);
			return m;
		}
		return NULL;
	case KILN_CFG_DOUBLE:
		if (kiln_parse_double(s, (double *) dst) < 0) {
			(void) !asprintf(&m, "invalid number \"%s\"", s);
			return m;
		}
		return NULL;
	case KILN_CFG_DURATION:
		if (kiln_parse_duration(s, KILN_USEC_PER_SEC, (uint64_t *) dst) < 0) {
			(void) !asprintf(&m, "malformed duration \"%s\"", s);
			*hint = strdup("write it like \"90s\", \"5m\", \"1h30m\" or \"infinite\"");
			return m;
		}
		return NULL;
	case KILN_CFG_SIZE_MB: {
		uint64_t b;
		if (kiln_parse_size(s, 1024 * 1024, &b) < 0) {
			(void) !asprintf(&m, "malformed size \"%s\"", s);
			*hint = strdup(
				"write it like \"512G\", \"2T\" or an integer number of MiB");
			return m;
		}
		*(uint64_t *) dst = b / (1024 * 1024);
		return NULL;
	}
	case KILN_CFG_IPV4:
		if (kiln_parse_ipv4(s, (uint32_t *) dst) < 0) {
			(void) !asprintf(&m, "malformed IPv4 address \"%s\"", s);
			return m;
		}
		return NULL;
	case KILN_CFG_CIDR: {
		/* Parsed here rather than with kiln_parse_cidr() so that host bits
		 * get their own message and hint. */
		uint32_t net;
		int prefix;
		char addr[32];
		const char *slash = strchr(s, '/');
		if (!slash || (size_t) (slash - s) >= sizeof(addr))
			goto bad_cidr;
		memcpy(addr, s, (size_t) (slash - s));
		addr[slash - s] = 0;
		if (kiln_parse_ipv4(addr, &net) < 0 ||
		    kiln_parse_int(slash + 1, 0, 32, &prefix) < 0)
			goto bad_cidr;
		if (prefix < 8 || prefix > 30) {
			(void) !asprintf(&m, "prefix /%d out of range 8..30", prefix);
			return m;
		}
		uint32_t mask = ~0u << (32 - prefix);
		if (net & ~mask) {
			char b[16];
			(void) !asprintf(&m, "\"%s\" has host bits set", s);
			(void) !asprintf(hint, "did you mean '%s/%d'?",
					 kiln_format_ipv4(b, net & mask), prefix);
			return m;
		}
		kiln_cfg_network *nw = dst;
		nw->subnet = net;
		nw->prefix = prefix;
		nw->netmask = mask;
		return NULL;
	bad_cidr:
		(void) !asprintf(&m, "malformed subnet \"%s\"", s);
		*hint = strdup("write it like \"10.0.0.0/24\"");
		return m;
	}
	case KILN_CFG_ENUM:
		for (size_t i = 0; k->choices[i]; i++)
			if (streq(k->choices[i], s)) {
				*(int *) dst = (int) i;
				return NULL;
			}
		{
			kiln_strbuf b;
			kiln_strbuf_init(&b);
			kiln_strbuf_append(&b, "one of:");
			for (size_t i = 0; k->choices[i]; i++)
				kiln_strbuf_printf(&b, " %s", k->choices[i]);
			*hint = kiln_strbuf_steal(&b);
			kiln_strbuf_free(&b);
		}
		(void) !asprintf(&m, "invalid value \"%s\"", s);
		return m;
	case KILN_CFG_NNODES: {
		int lo, hi;
		const char *colon = strchr(s, ':');
		char buf[32];
		if (strlen(s) >= sizeof(buf))
			goto bad_nnodes;
		if (colon) {
			memcpy(buf, s, (size_t) (colon - s));
			buf[colon - s] = 0;
			if (kiln_parse_int(buf, 1, 100000, &lo) < 0 ||
			    kiln_parse_int(colon + 1, 1, 100000, &hi) < 0)
				goto bad_nnodes;
		} else {
			if (kiln_parse_int(s, 1, 100000, &lo) < 0)
				goto bad_nnodes;
			hi = lo;
		}
		if (lo > hi) {
			(void) !asprintf(&m, "minimum %d is larger than maximum %d", lo, hi);
			return m;
		}
		((int *) dst)[0] = lo;
		((int *) dst)[1] = hi;
		return NULL;
	bad_nnodes:
		(void) !asprintf(&m, "malformed node count \"%s\"", s);
		*hint = strdup("write it like \"2:4\" (MIN:MAX) or \"4\"");
		return m;
	}
	case KILN_CFG_NPROC:
		if (streq(s, "gpu")) {
			*(int *) dst = 0;
			return NULL;
		}
		if (kiln_parse_int(s, 1, 1024, (int *) dst) < 0) {
			(void) !asprintf(&m, "invalid value \"%s\"", s);
			*hint = strdup("write \"gpu\" (one per GPU) or a number 1..1024");
			return m;
		}
		return NULL;
	default:
		return strdup("internal error: no string form");
	}
}

/* Where a key's value lives inside obj (or NULL for BASE_NONE). */
static void *field(const kiln_cfg_key *k, void *obj)
{
	if (k->base == BASE_NONE || !obj)
		return NULL;
	if (k->type == KILN_CFG_CIDR)
		return &((kiln_cfg *) obj)->network;
	return (char *) obj + k->offset;
}

static int apply_defaults(int base, void *obj)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++) {
		const kiln_cfg_key *k = &s[i];
		if (k->base != base)
			continue;
		void *dst = field(k, obj);
		if (k->type == KILN_CFG_STRV) {
			char **v = calloc(1, sizeof(char *));
			if (!v)
				return -ENOMEM;
			*(char ***) dst = v;
			continue;
		}
		if (!k->def || k->def[0] == '(')
			continue;
		char buf[256];
		const char *d = k->def;
		size_t l = strlen(d);
		if (l >= 2 && d[0] == '"' && d[l - 1] == '"' && l - 2 < sizeof(buf)) {
			memcpy(buf, d + 1, l - 2);
			buf[l - 2] = 0;
			d = buf;
		}
		_cleanup_free_ char *hint = NULL;
		_cleanup_free_ char *m = parse_from_string(k, d, dst, &hint);
		if (m)
			return -ENOMEM; /* defaults are known good: only allocation fails */
	}
	return 0;
}

static int setting_line(const config_setting_t *s)
{
	return s ? (int) config_setting_source_line(s) : 0;
}

static bool is_int(int t)
{
	return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
}

/* Reads an array of strings; reports non-strings at their element path. */
static int read_strings(loader *L, config_setting_t *s, const char *disp, char ***ret)
{
	int n = config_setting_length(s);
	char **v = calloc((size_t) n + 1, sizeof(char *));
	if (!v)
		return -ENOMEM;
	int bad = 0, j = 0;
	for (int i = 0; i < n; i++) {
		config_setting_t *e = config_setting_get_elem(s, (unsigned) i);
		if (config_setting_type(e) != CONFIG_TYPE_STRING) {
			char p[512];
			snprintf(p, sizeof(p), "%s[%d]", disp, i);
			add_error(L, setting_line(e) ?: setting_line(s), p, NULL,
				  "expected a string, got %s",
				  lc_type_text(config_setting_type(e)));
			bad = 1;
			continue;
		}
		const char *str = config_setting_get_string(e);
		for (const char *q = str; *q; q++)
			if ((unsigned char) *q < 0x20 || *q == 0x7f) {
				char p[512];
				snprintf(p, sizeof(p), "%s[%d]", disp, i);
				add_error(L, setting_line(e) ?: setting_line(s), p, NULL,
					  "control character (0x%02x) at offset %zu",
					  (unsigned) (unsigned char) *q, (size_t) (q - str));
				bad = 1;
				break;
			}
		if (bad)
			continue;
		v[j] = strdup(str);
		if (!v[j]) {
			strv_free(v);
			return -ENOMEM;
		}
		j++;
	}
	if (bad) {
		strv_free(v);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static void parse_value(loader *L, const kiln_cfg_key *k, config_setting_t *s, const char *disp,
			void *obj)
{
	int t = config_setting_type(s);
	int line = setting_line(s);
	void *dst = field(k, obj);
	_cleanup_free_ char *msg = NULL, *hint = NULL;
	char num[32];

	switch (k->type) {
	case KILN_CFG_INT:
		if (!is_int(t))
			goto wrong_type;
		{
			long long v = config_setting_get_int64(s);
			if (k->min < k->max && (v < k->min || v > k->max)) {
				add_error(L, line, disp, NULL, "%lld is out of range %lld..%lld", v,
					  (long long) k->min, (long long) k->max);
				return;
			}
			*(int *) dst = (int) v;
		}
		return;
	case KILN_CFG_BOOL:
		if (t != CONFIG_TYPE_BOOL)
			goto wrong_type;
		*(bool *) dst = config_setting_get_bool(s);
		return;
	case KILN_CFG_DOUBLE:
		if (t == CONFIG_TYPE_FLOAT)
			*(double *) dst = config_setting_get_float(s);
		else if (is_int(t))
			*(double *) dst = (double) config_setting_get_int64(s);
		else
			goto wrong_type;
		return;
	case KILN_CFG_DURATION:
	case KILN_CFG_SIZE_MB:
		if (is_int(t)) {
			long long v = config_setting_get_int64(s);
			if (v < 0) {
				add_error(L, line, disp, NULL, "negative value %lld", v);
				return;
			}
			if (k->type == KILN_CFG_DURATION) {
				if ((unsigned long long) v > UINT64_MAX / KILN_USEC_PER_SEC) {
					add_error(L, line, disp, NULL,
						  "duration %lld s is too large", v);
					return;
				}
				*(uint64_t *) dst = (uint64_t) v * KILN_USEC_PER_SEC;
			} else
				*(uint64_t *) dst = (uint64_t) v;
			return;
		}
		break;
	case KILN_CFG_NNODES:
	case KILN_CFG_NPROC:
		if (is_int(t)) {
			snprintf(num, sizeof(num), "%lld", (long long) config_setting_get_int64(s));
			msg = parse_from_string(k, num, dst, &hint);
			if (msg)
				add_error(L, line, disp, hint, "%s", msg);
			return;
		}
		break;
	case KILN_CFG_STRV: {
		if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST)
			goto wrong_type;
		char **v = NULL;
		int r = read_strings(L, s, disp, &v);
		if (r == -ENOMEM)
			L->oom = 1;
		if (r < 0)
			return;
		strv_free(*(char ***) dst);
		*(char ***) dst = v;
		return;
	}
	case KILN_CFG_IPV4_LIST: {
		if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST)
			goto wrong_type;
		_cleanup_strv_free_ char **v = NULL;
		int r = read_strings(L, s, disp, &v);
		if (r == -ENOMEM)
			L->oom = 1;
		if (r < 0)
			return;
		size_t n = strv_length(v);
		uint32_t *a = calloc(n + 1, sizeof(uint32_t));
		if (!a) {
			L->oom = 1;
			return;
		}
		for (size_t i = 0; i < n; i++)
			if (kiln_parse_ipv4(v[i], &a[i]) < 0) {
				char p[512];
				snprintf(p, sizeof(p), "%s[%zu]", disp, i);
				add_error(L, line, p, NULL, "malformed IPv4 address \"%s\"", v[i]);
			}
		/* only network.dns has this type */
		free(L->cfg->network.dns);
		L->cfg->network.dns = a;
		L->cfg->network.n_dns = n;
		return;
	}
	case KILN_CFG_GROUP:
	case KILN_CFG_LIST:
		goto wrong_type; /* handled by the walker */
	default:
		break;
	}

	/* Everything else is written as a string. */
	if (t != CONFIG_TYPE_STRING)
		goto wrong_type;
	msg = parse_from_string(k, config_setting_get_string(s), dst, &hint);
	if (msg)
		add_error(L, line, disp, hint, "%s", msg);
	return;

wrong_type:
	add_error(L, line, disp, NULL, "expected %s, got %s", expected_text(k->type),
		  lc_type_text(t));
}

/* ---- the walk -------------------------------------------------------- */

/* The cluster file's lists of groups: where each one's array, count and
 * settings live, so that allocation and per-element setup are one code path. */
typedef struct list_desc {
	const char *pattern;
	int base;	   /* BASE_* of its elements' keys */
	size_t elem_size;  /* sizeof one element */
	size_t array_off;  /* offsetof(kiln_cfg, the element array pointer) */
	size_t count_off;  /* offsetof(kiln_cfg, its size_t count) */
	size_t set_off;	   /* offsetof(loader, the element settings array) */
	size_t line_off;   /* offsetof(element, int line) */
	bool group_extras; /* node_groups: also addresses/macs settings */
} list_desc;

static const list_desc lists[] = {
	{ "node_groups", BASE_GROUP, sizeof(kiln_cfg_group), offsetof(kiln_cfg, groups),
	  offsetof(kiln_cfg, n_groups), offsetof(loader, group_set), offsetof(kiln_cfg_group, line),
	  true },
	{ "slurm.partitions", BASE_PART, sizeof(kiln_cfg_partition),
	  offsetof(kiln_cfg, slurm.partitions), offsetof(kiln_cfg, slurm.n_partitions),
	  offsetof(loader, part_set), offsetof(kiln_cfg_partition, line), false },
	{ "health.xid", BASE_XID, sizeof(kiln_cfg_xid), offsetof(kiln_cfg, health.xids),
	  offsetof(kiln_cfg, health.n_xids), offsetof(loader, xid_set),
	  offsetof(kiln_cfg_xid, line), false },
};

static const list_desc *find_list(const char *pattern)
{
	for (size_t i = 0; i < ARRAY_SIZE(lists); i++)
		if (streq(lists[i].pattern, pattern))
			return &lists[i];
	return NULL;
}

#define FIELD(base, off, type) ((type *) (void *) ((char *) (base) + (off)))

static void *new_element(loader *L, const char *pattern, size_t idx, config_setting_t *s, int *base)
{
	const list_desc *d = find_list(pattern);
	if (!d)
		return NULL;
	char *elem = *FIELD(L->cfg, d->array_off, char *) + idx * d->elem_size;
	*FIELD(elem, d->line_off, int) = setting_line(s);
	(*FIELD(L, d->set_off, config_setting_t **))[idx] = s;
	*base = d->base;
	if (apply_defaults(d->base, elem) < 0)
		L->oom = 1;
	return elem;
}

static int alloc_list(loader *L, const char *pattern, size_t n)
{
	const list_desc *d = find_list(pattern);
	if (!d)
		return -EINVAL;
	size_t m = n ? n : 1;
	void **array = FIELD(L->cfg, d->array_off, void *);
	config_setting_t ***set = FIELD(L, d->set_off, config_setting_t **);
	*array = calloc(m, d->elem_size);
	*set = calloc(m, sizeof(**set));
	*FIELD(L->cfg, d->count_off, size_t) = n;
	if (!*array || !*set)
		return -ENOMEM;
	if (d->group_extras) {
		L->addr_set = calloc(m, sizeof(*L->addr_set));
		L->mac_set = calloc(m, sizeof(*L->mac_set));
		if (!L->addr_set || !L->mac_set)
			return -ENOMEM;
	}
	return 0;
}

static void walk(loader *L, config_setting_t *grp, const char *pattern, const char *disp, int base,
		 void *obj, size_t elem, int depth)
{
	if (L->oom || depth > KILN_CFG_DEPTH_MAX)
		return;
	int n = config_setting_length(grp);
	for (int i = 0; i < n; i++) {
		config_setting_t *ch = config_setting_get_elem(grp, (unsigned) i);
		const char *name = config_setting_name(ch);
		if (!name)
			continue;
		_cleanup_free_ char *pat = join_path(pattern, name);
		_cleanup_free_ char *dsp = join_path(disp, name);
		if (!pat || !dsp) {
			L->oom = 1;
			return;
		}
		const kiln_cfg_key *k = find_key(pat);
		int t = config_setting_type(ch);
		if (!k) {
			_cleanup_free_ char *hint = unknown_hint(pattern, name);
			add_error(L, setting_line(ch), dsp, hint, "unknown setting");
			continue;
		}
		if (k->type == KILN_CFG_GROUP) {
			if (t != CONFIG_TYPE_GROUP) {
				add_error(L, setting_line(ch), dsp, NULL, "expected %s, got %s",
					  expected_text(k->type), lc_type_text(t));
				continue;
			}
			walk(L, ch, pat, dsp, base, obj, elem, depth + 1);
			continue;
		}
		if (k->type == KILN_CFG_LIST) {
			int len = config_setting_length(ch);
			if (t != CONFIG_TYPE_LIST && !(t == CONFIG_TYPE_ARRAY && len == 0)) {
				add_error(L, setting_line(ch), dsp, NULL, "expected %s, got %s",
					  expected_text(k->type), lc_type_text(t));
				continue;
			}
			if (alloc_list(L, pat, (size_t) len) < 0) {
				L->oom = 1;
				return;
			}
			_cleanup_free_ char *epat = NULL;
			if (asprintf(&epat, "%s[]", pat) < 0) {
				L->oom = 1;
				return;
			}
			for (int j = 0; j < len; j++) {
				config_setting_t *e = config_setting_get_elem(ch, (unsigned) j);
				char edsp[512];
				snprintf(edsp, sizeof(edsp), "%s[%d]", dsp, j);
				if (config_setting_type(e) != CONFIG_TYPE_GROUP) {
					add_error(L, setting_line(e) ?: setting_line(ch), edsp,
						  NULL, "expected a group { ... }, got %s",
						  lc_type_text(config_setting_type(e)));
					continue;
				}
				int ebase = BASE_NONE;
				void *eobj = new_element(L, pat, (size_t) j, e, &ebase);
				walk(L, e, epat, edsp, ebase, eobj, (size_t) j, depth + 1);
			}
			continue;
		}
		if (k->type == KILN_CFG_ADDRESSES) {
			L->addr_set[elem] = ch;
			continue;
		}
		if (k->type == KILN_CFG_MACS) {
			L->mac_set[elem] = ch;
			continue;
		}
		parse_value(L, k, ch, dsp, obj);
	}

	/* Required keys of this level. */
	size_t ns;
	const kiln_cfg_key *s = kiln_cfg_schema(&ns);
	for (size_t i = 0; i < ns; i++) {
		if (!s[i].required || !is_child(s[i].path, pattern))
			continue;
		const char *last = last_component(s[i].path);
		if (config_setting_get_member(grp, last))
			continue;
		_cleanup_free_ char *dsp = join_path(disp, last);
		if (depth == 0) {
			_cleanup_free_ char *h = NULL;
			if (asprintf(&h, "add %s = %s", last,
				     s[i].type == KILN_CFG_LIST ? "( { ... } );" : "{ ... };") < 0)
				h = NULL;
			add_error(L, L->last_line, dsp, h, "missing required section");
		} else {
			_cleanup_free_ char *h = NULL;
			if (s[i].example && asprintf(&h, "add %s = %s;", last, s[i].example) < 0)
				h = NULL;
			add_error(L, setting_line(grp), dsp, h, "missing required setting");
		}
	}
}

/* ---- cross checks ---------------------------------------------------- */

static int member_line(config_setting_t *parent, const char *name)
{
	config_setting_t *m = parent ? config_setting_get_member(parent, name) : NULL;
	return m ? setting_line(m) : setting_line(parent);
}
static int elem_line(config_setting_t *arr, size_t i)
{
	config_setting_t *e = arr ? config_setting_get_elem(arr, (unsigned) i) : NULL;
	int l = setting_line(e);
	return l ? l : setting_line(arr);
}
static int root_line(loader *L, const char *path)
{
	config_setting_t *s = config_lookup(L->lc, path);
	return setting_line(s);
}

static bool in_subnet(const kiln_cfg *c, uint32_t a)
{
	return (a & c->network.netmask) == c->network.subnet;
}
static bool usable(const kiln_cfg *c, uint32_t a)
{
	return in_subnet(c, a) && a != c->network.subnet &&
	       a != (c->network.subnet | ~c->network.netmask);
}

static void check_address(loader *L, uint32_t a, int line, const char *path)
{
	kiln_cfg *c = L->cfg;
	char b[16], n[16];
	if (!c->network.prefix)
		return; /* subnet itself was bad: already reported */
	if (!in_subnet(c, a))
		add_error(L, line, path, NULL, "address %s is outside the subnet %s/%d",
			  kiln_format_ipv4(b, a), kiln_format_ipv4(n, c->network.subnet),
			  c->network.prefix);
	else if (!usable(c, a))
		add_error(L, line, path, NULL,
			  "address %s is the network or broadcast address of %s/%d",
			  kiln_format_ipv4(b, a), kiln_format_ipv4(n, c->network.subnet),
			  c->network.prefix);
}

/* Reads node_groups[gi].addresses into g->addresses (n_hosts of them). */
static void group_addresses(loader *L, size_t gi, const char *gpath)
{
	kiln_cfg_group *g = &L->cfg->groups[gi];
	config_setting_t *s = L->addr_set[gi];
	char path[600];
	snprintf(path, sizeof(path), "%s.addresses", gpath);
	if (!s)
		return; /* missing: reported by the walk */
	int t = config_setting_type(s);
	int line = setting_line(s);
	uint32_t *a = NULL;
	size_t n = 0;
	if (t == CONFIG_TYPE_STRING) {
		const char *str = config_setting_get_string(s);
		const char *dash = strchr(str, '-');
		char first[64];
		uint32_t lo, hi;
		if (!dash || (size_t) (dash - str) >= sizeof(first))
			goto bad_range;
		memcpy(first, str, (size_t) (dash - str));
		first[dash - str] = 0;
		if (kiln_parse_ipv4(first, &lo) < 0 || kiln_parse_ipv4(dash + 1, &hi) < 0)
			goto bad_range;
		if (hi < lo) {
			add_error(L, line, path, NULL, "range \"%s\" ends before it starts", str);
			return;
		}
		n = (size_t) (hi - lo) + 1;
		if (n != g->n_hosts) {
			add_error(L, line, path, NULL,
				  "range \"%s\" has %zu addresses for %zu hosts", str, n,
				  g->n_hosts);
			return;
		}
		a = calloc(n ? n : 1, sizeof(uint32_t));
		if (!a) {
			L->oom = 1;
			return;
		}
		for (size_t i = 0; i < n; i++)
			a[i] = lo + (uint32_t) i;
		for (size_t i = 0; i < n; i++)
			if (!L->cfg->network.prefix || !usable(L->cfg, a[i])) {
				check_address(L, a[i], line, path);
				break;
			}
		g->addresses = a;
		return;
	bad_range:
		add_error(L, line, path,
			  "write a range \"10.0.0.11-10.0.0.42\" or a list [ \"10.0.0.11\", ... ]",
			  "malformed address range \"%s\"", str);
		return;
	}
	if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) {
		add_error(L, line, path, NULL, "expected %s, got %s",
			  expected_text(KILN_CFG_ADDRESSES), lc_type_text(t));
		return;
	}
	_cleanup_strv_free_ char **v = NULL;
	int r = read_strings(L, s, path, &v);
	if (r == -ENOMEM)
		L->oom = 1;
	if (r < 0)
		return;
	n = strv_length(v);
	if (n != g->n_hosts) {
		add_error(L, line, path, NULL, "%zu addresses for %zu hosts", n, g->n_hosts);
		return;
	}
	a = calloc(n ? n : 1, sizeof(uint32_t));
	if (!a) {
		L->oom = 1;
		return;
	}
	bool ok = true;
	for (size_t i = 0; i < n; i++) {
		char p[640];
		snprintf(p, sizeof(p), "%s[%zu]", path, i);
		if (kiln_parse_ipv4(v[i], &a[i]) < 0) {
			add_error(L, elem_line(s, i), p, NULL, "malformed IPv4 address \"%s\"",
				  v[i]);
			ok = false;
			continue;
		}
		if (L->cfg->network.prefix && !usable(L->cfg, a[i]))
			check_address(L, a[i], elem_line(s, i), p);
	}
	if (!ok) {
		free(a);
		return;
	}
	g->addresses = a;
}

static void group_macs(loader *L, size_t gi, const char *gpath)
{
	kiln_cfg_group *g = &L->cfg->groups[gi];
	config_setting_t *s = L->mac_set[gi];
	char path[600];
	snprintf(path, sizeof(path), "%s.macs", gpath);
	if (!s)
		return;
	int t = config_setting_type(s);
	if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) {
		add_error(L, setting_line(s), path, NULL, "expected %s, got %s",
			  expected_text(KILN_CFG_MACS), lc_type_text(t));
		return;
	}
	_cleanup_strv_free_ char **v = NULL;
	int r = read_strings(L, s, path, &v);
	if (r == -ENOMEM)
		L->oom = 1;
	if (r < 0)
		return;
	size_t n = strv_length(v);
	uint8_t(*m)[6] = calloc(n ? n : 1, 6);
	if (!m) {
		L->oom = 1;
		return;
	}
	bool ok = true;
	for (size_t i = 0; i < n; i++)
		if (kiln_parse_mac(v[i], m[i]) < 0) {
			char p[640];
			snprintf(p, sizeof(p), "%s[%zu]", path, i);
			add_error(L, elem_line(s, i), p, "write it like \"52:54:00:12:34:56\"",
				  "malformed MAC address \"%s\"", v[i]);
			ok = false;
		} else if ((m[i][0] & 1) || !memcmp(m[i], (const uint8_t[6]){ 0 }, 6)) {
			/* A NIC never has a multicast/broadcast or all-zero
			 * address: DHCP would never match it. */
			char p[640];
			snprintf(p, sizeof(p), "%s[%zu]", path, i);
			add_error(L, elem_line(s, i), p,
				  "give the node's boot NIC address (ip link shows it)",
				  "MAC address \"%s\" is %s, not a NIC's", v[i],
				  (m[i][0] & 1) ? "multicast or broadcast" : "all zero");
			ok = false;
		}
	if (ok && n != g->n_hosts)
		add_error(L, setting_line(s), path, "give exactly one MAC per host, in host order",
			  "%zu MACs for %zu hosts", n, g->n_hosts);
	if (!ok || n != g->n_hosts) {
		free(m);
		return;
	}
	g->macs = m;
}

static char *hint_from(const char *name, char *const *cands)
{
	const char *best = NULL;
	size_t bd = SIZE_MAX;
	for (char *const *c = cands; c && *c; c++) {
		size_t d = kiln_levenshtein(name, *c);
		if (d < bd) {
			bd = d;
			best = *c;
		}
	}
	char *h = NULL;
	if (best && bd <= MAX((size_t) 2, strlen(name) / 3) &&
	    asprintf(&h, "did you mean '%s'?", best) < 0)
		return NULL;
	return h;
}

#define DNS_NAME_MAX  253 /* RFC 1035, without the final dot */
#define DNS_LABEL_MAX 63
#define NAME_MAX_LEN  63 /* cluster, group and partition names */
#define NAME_HINT     "use 1 to 63 lowercase letters, digits, '-' and '_'"

static bool valid_name(const char *s)
{
	if (!s[0] || strlen(s) > NAME_MAX_LEN)
		return false;
	for (const char *p = s; *p; p++)
		if (!(islower((unsigned char) *p) || isdigit((unsigned char) *p) || *p == '-' ||
		      *p == '_'))
			return false;
	return true;
}

/* Durations whose range one key alone cannot express: Slurm keeps most of
 * its timeouts in 16-bit fields, and a daemon polling every 0 s would spin. */
#define SEC KILN_USEC_PER_SEC
static const struct {
	const char *path;
	uint64_t min, max; /* usec, inclusive */
} duration_limits[] = {
	{ "slurm.slurmd_timeout", 1 * SEC, 65533 * SEC },
	{ "slurm.message_timeout", 1 * SEC, 65533 * SEC },
	{ "slurm.resume_timeout", 1 * SEC, 65533 * SEC },
	{ "slurm.kill_wait", 1 * SEC, 65533 * SEC },
	{ "slurm.unkillable_timeout", 1 * SEC, 65533 * SEC },
	{ "health.health_check_interval", 1 * SEC, 65533 * SEC },
	{ "health.interval", 100 * KILN_USEC_PER_MSEC, 86400 * SEC },
	{ "health.recover_after", 0, 365 * 86400 * SEC },
	{ "health.nvml_timeout", 1 * KILN_USEC_PER_MSEC, 3600 * SEC },
	{ "health.watchdog", 0, 86400 * SEC },
	{ "health.active_interval", 0, 365 * 86400 * SEC },
	{ "launcher.heartbeat", 10 * KILN_USEC_PER_MSEC, 3600 * SEC },
	{ "launcher.dead_after", 10 * KILN_USEC_PER_MSEC, 86400 * SEC },
	{ "launcher.last_call", 0, 86400 * SEC },
	{ "launcher.join_timeout", 1 * SEC, KILN_USEC_INFINITY },
	{ "launcher.grace", 0, 86400 * SEC },
};

static void check_durations(loader *L)
{
	for (size_t i = 0; i < ARRAY_SIZE(duration_limits); i++) {
		const kiln_cfg_key *k = find_key(duration_limits[i].path);
		assert(k && k->type == KILN_CFG_DURATION && k->base == BASE_ROOT);
		uint64_t v = *(uint64_t *) field(k, L->cfg);
		if (v >= duration_limits[i].min && v <= duration_limits[i].max)
			continue;
		char a[32], b[32], x[32];
		kiln_format_duration(x, sizeof(x), v);
		kiln_format_duration(a, sizeof(a), duration_limits[i].min);
		kiln_format_duration(b, sizeof(b), duration_limits[i].max);
		add_error(L, root_line(L, k->path), k->path, NULL, "%s is out of range %s..%s", x,
			  a, b);
	}
	for (size_t i = 0; i < L->cfg->slurm.n_partitions; i++) {
		uint64_t v = L->cfg->slurm.partitions[i].max_time_usec;
		if (v != KILN_USEC_INFINITY && (v < 60 * SEC || v > 365ULL * 86400 * SEC)) {
			char p[64], x[32];
			snprintf(p, sizeof(p), "slurm.partitions[%zu].max_time", i);
			add_error(L, member_line(L->part_set[i], "max_time"), p,
				  "use 1m..365d or \"infinite\"", "%s is out of range",
				  kiln_format_duration(x, sizeof(x), v));
		}
	}
}
#undef SEC

/* Words that land unquoted in slurm.conf or dnsmasq.conf: letters, digits
 * and the few punctuation characters the format allows (extra). */
static void check_word(loader *L, int line, const char *path, const char *v, const char *extra)
{
	if (!v)
		return;
	for (const char *p = v; *p; p++)
		if (!isalnum((unsigned char) *p) && !strchr(extra, *p)) {
			add_error(L, line, path, NULL, "invalid character '%c' in \"%s\"", *p, v);
			return;
		}
	if (!v[0])
		add_error(L, line, path, NULL, "must not be empty");
}

static bool has_bad_char(const char *v, const char *extra)
{
	for (const char *p = v; *p; p++)
		if (!isalnum((unsigned char) *p) && !strchr(extra, *p))
			return true;
	return false;
}

/* An RFC 1123 domain: it lands in dnsmasq.conf, /etc/hosts and every
 * node's FQDN, and dnsmasq --test does not check it. */
static bool valid_domain(const char *s)
{
	size_t len = strlen(s);
	if (len == 0 || len > DNS_NAME_MAX)
		return false;
	for (const char *l = s;;) {
		size_t n = strcspn(l, ".");
		if (n == 0 || n > DNS_LABEL_MAX || l[0] == '-' || l[n - 1] == '-')
			return false;
		if (!l[n])
			return true;
		l += n + 1;
	}
}

/* A host name: one RFC 1123 label, lowercase.  Slurm node names become DNS
 * names (NAME.DOMAIN in dnsmasq and /etc/hosts), and Slurm compares them
 * case-sensitively while DNS does not, so only lowercase is accepted. */
#define HOST_NAME_HINT \
	"use 1 to 63 lowercase letters, digits and '-', not starting or ending with '-'"
static bool valid_host_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > DNS_LABEL_MAX || s[0] == '-' || s[n - 1] == '-')
		return false;
	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
			return false;
	return true;
}

/* qsort_r comparators over node indexes; ties by index keep file order. */
static int cmp_index(size_t a, size_t b)
{
	return a < b ? -1 : a > b;
}
/* Host name order: case-insensitive, then exact (a total order, so that
 * find_index() can still look up an exact name). */
static int name_cmp(const char *a, const char *b)
{
	int r = strcasecmp(a, b);
	return r ? r : strcmp(a, b);
}
static int cmp_name(const void *x, const void *y, void *ctx)
{
	const kiln_cfg_node *n = ctx;
	size_t a = *(const size_t *) x, b = *(const size_t *) y;
	int r = name_cmp(n[a].name, n[b].name);
	return r ? r : cmp_index(a, b);
}
static int cmp_mac(const void *x, const void *y, void *ctx)
{
	const kiln_cfg_node *n = ctx;
	size_t a = *(const size_t *) x, b = *(const size_t *) y;
	int r = memcmp(n[a].mac, n[b].mac, 6);
	return r ? r : cmp_index(a, b);
}
static int cmp_addr(const void *x, const void *y, void *ctx)
{
	const kiln_cfg_node *n = ctx;
	size_t a = *(const size_t *) x, b = *(const size_t *) y;
	if (n[a].address != n[b].address)
		return n[a].address < n[b].address ? -1 : 1;
	return cmp_index(a, b);
}

/* The first node called name (binary search of name_idx), or -1. */
static ssize_t find_index(loader *L, const char *name)
{
	const kiln_cfg *c = L->cfg;
	size_t lo = 0, hi = c->n_nodes;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (name_cmp(c->nodes[L->name_idx[mid]].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < c->n_nodes && streq(c->nodes[L->name_idx[lo]].name, name))
		return (ssize_t) L->name_idx[lo];
	return -1;
}

/* Expands a hostlist, reporting why it cannot be. */
static int expand_hostlist(loader *L, int line, const char *path, const char *s, char ***ret,
			   size_t *ret_n)
{
	size_t pos = 0;
	int r = kiln_hostlist_expand(s, ret, ret_n, &pos);
	if (r == -ENOMEM)
		L->oom = 1;
	else if (r == -E2BIG)
		add_error(L, line, path, NULL, "hostlist \"%s\" expands to more than %d names", s,
			  KILN_HOSTLIST_MAX);
	else if (r < 0 || *ret_n == 0) {
		add_error(L, line, path, "write it like \"node[01-16,20]\"",
			  "malformed hostlist \"%s\" at offset %zu", s, pos);
		strv_free(*ret);
		*ret = NULL;
		r = -EINVAL;
	}
	return r;
}

static bool errors_full(loader *L)
{
	return L->errs->n >= KILN_CFG_ERRORS_MAX;
}

static void cross_check(loader *L)
{
	kiln_cfg *c = L->cfg;
	char b1[16];
	config_setting_t *ng = config_lookup(L->lc, "node_groups");
	if (!ng || config_setting_type(ng) != CONFIG_TYPE_LIST)
		L->nodes_incomplete = true;

	if (c->cluster.name && !valid_name(c->cluster.name))
		add_error(L, root_line(L, "cluster.name"), "cluster.name", NAME_HINT,
			  "invalid cluster name \"%s\"", c->cluster.name);

	check_durations(L);

	/* Values written unquoted into generated files. */
	check_word(L, root_line(L, "cluster.domain"), "cluster.domain", c->cluster.domain, ".-");
	if (c->cluster.domain && c->cluster.domain[0] && !has_bad_char(c->cluster.domain, ".-") &&
	    !valid_domain(c->cluster.domain))
		add_error(L, root_line(L, "cluster.domain"), "cluster.domain",
			  "use dot-separated labels of 1 to 63 letters, digits and '-', none "
			  "starting or ending with '-'",
			  "invalid DNS domain \"%s\"", c->cluster.domain);
	check_word(L, root_line(L, "network.boot_interface"), "network.boot_interface",
		   c->network.boot_interface, "._:-@");
	check_word(L, root_line(L, "slurm.user"), "slurm.user", c->slurm.user, "._-");
	check_word(L, root_line(L, "slurm.select_type"), "slurm.select_type", c->slurm.select_type,
		   "_");
	check_word(L, root_line(L, "slurm.proctrack_type"), "slurm.proctrack_type",
		   c->slurm.proctrack_type, "_");
	check_word(L, root_line(L, "slurm.task_plugin"), "slurm.task_plugin", c->slurm.task_plugin,
		   "_,");
	check_word(L, root_line(L, "slurm.cluster_name"), "slurm.cluster_name",
		   c->slurm.cluster_name, "_-");
	check_word(L, root_line(L, "health.metrics_address"), "health.metrics_address",
		   c->health.metrics_address, ".:");
	check_word(L, root_line(L, "inference.address"), "inference.address", c->inference.address,
		   ".:");
	if (c->image.http_url) {
		if (!startswith(c->image.http_url, "http://") &&
		    !startswith(c->image.http_url, "https://"))
			add_error(L, root_line(L, "image.http_url"), "image.http_url",
				  "write it like \"http://10.0.0.1/kiln\"",
				  "\"%s\" is not an http:// or https:// URL", c->image.http_url);
		else if (strpbrk(c->image.http_url, " \t"))
			add_error(L, root_line(L, "image.http_url"), "image.http_url", NULL,
				  "URL contains a space");
	}
	/* The image must never ship a root account anyone can log into without
	 * a secret: an empty (or non-hash) value would become exactly that. */
	if (c->image.root_password_hash && c->image.root_password_hash[0] != '$')
		add_error(L, root_line(L, "image.root_password_hash"), "image.root_password_hash",
			  "write a crypt(3) hash from `mkpasswd -m yescrypt`, or remove the key "
			  "to lock root's password",
			  "not a crypt(3) hash (must start with '$'; an empty password is never "
			  "allowed)");
	else if (c->image.root_password_hash && strpbrk(c->image.root_password_hash, ": \t\n"))
		add_error(L, root_line(L, "image.root_password_hash"), "image.root_password_hash",
			  NULL, "a crypt(3) hash contains no ':' or white space");
	for (size_t i = 0; c->image.packages && c->image.packages[i]; i++) {
		const char *k = c->image.packages[i];
		char p[48];
		bool ok = k[0] && (islower((unsigned char) k[0]) || isdigit((unsigned char) k[0]));
		for (const char *q = k; ok && *q; q++)
			ok = islower((unsigned char) *q) || isdigit((unsigned char) *q) ||
			     strchr(".+-", *q);
		snprintf(p, sizeof(p), "image.packages[%zu]", i);
		/* Names go to mmdebstrap --include=a,b: Debian policy's package
		 * name alphabet keeps a stray comma or space from adding others. */
		if (!ok)
			add_error(L, root_line(L, "image.packages"), p,
				  "Debian package names use a-z, 0-9, '.', '+' and '-'",
				  "\"%s\" is not a Debian package name", k);
	}
	for (size_t i = 0; c->image.ssh_keys && c->image.ssh_keys[i]; i++) {
		const char *k = c->image.ssh_keys[i];
		char p[48];
		snprintf(p, sizeof(p), "image.ssh_keys[%zu]", i);
		/* One authorized_keys line each: a newline would smuggle in a second. */
		if (strpbrk(k, "\n\r") || !strchr(k, ' ') ||
		    !(startswith(k, "ssh-") || startswith(k, "ecdsa-") || startswith(k, "sk-")))
			add_error(L, root_line(L, "image.ssh_keys"), p,
				  "paste one line of a .pub file, like \"ssh-ed25519 AAAA... "
				  "admin@head\"",
				  "not an SSH public key line");
	}
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		config_setting_t *gs = L->group_set[gi];
		char p[96];
		if (!gs)
			continue;
		if (g->name && !valid_name(g->name)) {
			snprintf(p, sizeof(p), "node_groups[%zu].name", gi);
			add_error(L, member_line(gs, "name"), p, NAME_HINT,
				  "invalid group name \"%s\"", g->name);
		}
		snprintf(p, sizeof(p), "node_groups[%zu].gpus.type", gi);
		config_setting_t *gp = config_setting_get_member(gs, "gpus");
		check_word(L, member_line(gp ? gp : gs, "type"), p, g->gpu_type, "_.-");
		for (size_t j = 0; g->features && g->features[j]; j++) {
			snprintf(p, sizeof(p), "node_groups[%zu].features[%zu]", gi, j);
			check_word(L, elem_line(config_setting_get_member(gs, "features"), j), p,
				   g->features[j], "_.-");
		}
	}

	/* Network and head. */
	if (c->head.address && c->network.prefix)
		check_address(L, c->head.address, root_line(L, "head.address"), "head.address");
	if (!c->network.gateway)
		c->network.gateway = c->head.address;
	else if (c->network.prefix)
		check_address(L, c->network.gateway, root_line(L, "network.gateway"),
			      "network.gateway");
	if (c->network.n_dns == 0 && c->head.address) {
		free(c->network.dns);
		c->network.dns = calloc(2, sizeof(uint32_t));
		if (!c->network.dns) {
			L->oom = 1;
			return;
		}
		c->network.dns[0] = c->head.address;
		c->network.n_dns = 1;
	}
	if (c->head.hostname) {
		char **v = NULL;
		size_t nv = 0;
		if (kiln_hostlist_expand(c->head.hostname, &v, &nv, NULL) < 0 || nv != 1 ||
		    !streq(v[0], c->head.hostname))
			add_error(L, root_line(L, "head.hostname"), "head.hostname", NULL,
				  "invalid host name \"%s\"", c->head.hostname);
		else if (!valid_host_name(c->head.hostname))
			add_error(L, root_line(L, "head.hostname"), "head.hostname", HOST_NAME_HINT,
				  "host name \"%s\" is not a valid DNS label", c->head.hostname);
		strv_free(v);
	}

	/* Groups: expand hosts, addresses, MACs. */
	size_t total = 0;
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		char gpath[64];
		snprintf(gpath, sizeof(gpath), "node_groups[%zu]", gi);
		if (!L->group_set[gi]) {
			L->nodes_incomplete = true;
			continue;
		}
		if (g->hosts && total >= KILN_HOSTLIST_MAX) {
			char p[96];
			snprintf(p, sizeof(p), "%s.hosts", gpath);
			add_error(L, member_line(L->group_set[gi], "hosts"), p, NULL,
				  "the cluster has more than %d nodes", KILN_HOSTLIST_MAX);
		} else if (g->hosts) {
			char p[96];
			size_t nh = 0;
			snprintf(p, sizeof(p), "%s.hosts", gpath);
			if (expand_hostlist(L, member_line(L->group_set[gi], "hosts"), p, g->hosts,
					    &g->hostnames, &nh) < 0)
				g->hostnames = NULL;
			g->n_hosts = g->hostnames ? nh : 0;
		}
		if (!g->hostnames) {
			L->nodes_incomplete = true;
			continue;
		}
		group_addresses(L, gi, gpath);
		group_macs(L, gi, gpath);
		if (g->gpu_count > 0 && !g->gpu_type && g->gpu_model) {
			g->gpu_type = kiln_cfg_gpu_type_from_model(g->gpu_model);
			if (!g->gpu_type) {
				L->oom = 1;
				return;
			}
		}
		if (g->memory_mb < 1) {
			char p[96];
			snprintf(p, sizeof(p), "%s.memory_mb", gpath);
			add_error(L, member_line(L->group_set[gi], "memory_mb"), p, NULL,
				  "must be at least 1 MiB");
		} else if (g->memory_mb > KILN_CFG_MEMORY_MB_MAX) {
			char p[96];
			snprintf(p, sizeof(p), "%s.memory_mb", gpath);
			add_error(L, member_line(L->group_set[gi], "memory_mb"), p,
				  "memory_mb is in MiB (2 TiB is 2097152 or \"2T\"); no server has "
				  "more than 64 TiB",
				  "%llu MiB is more than the limit of %llu MiB (64 TiB)",
				  (unsigned long long) g->memory_mb,
				  (unsigned long long) KILN_CFG_MEMORY_MB_MAX);
		}
		int prod = g->sockets * g->cores_per_socket * g->threads_per_core;
		if (g->cpus == 0)
			g->cpus = prod;
		else if (g->cpus != prod && g->cpus != g->sockets * g->cores_per_socket) {
			char p[96];
			snprintf(p, sizeof(p), "%s.cpus", gpath);
			add_error(
				L, member_line(L->group_set[gi], "cpus"), p,
				"Slurm needs cpus = sockets x cores_per_socket x threads_per_core",
				"%d CPUs do not match %d sockets x %d cores x %d threads", g->cpus,
				g->sockets, g->cores_per_socket, g->threads_per_core);
		}
		for (size_t j = 0; j < gi; j++)
			if (c->groups[j].name && g->name && streq(c->groups[j].name, g->name)) {
				char p[96];
				snprintf(p, sizeof(p), "%s.name", gpath);
				add_error(L, member_line(L->group_set[gi], "name"), p, NULL,
					  "duplicate group name \"%s\" (first at line %d)", g->name,
					  c->groups[j].line);
			}
		total += g->n_hosts;
	}
	if (total > KILN_HOSTLIST_MAX) {
		add_error(L, root_line(L, "node_groups"), "node_groups", NULL, "more than %d nodes",
			  KILN_HOSTLIST_MAX);
		return;
	}

	/* Flatten nodes (only groups whose addresses and MACs are good). */
	c->nodes = calloc(total ? total : 1, sizeof(*c->nodes));
	if (!c->nodes) {
		L->oom = 1;
		return;
	}
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		if (!g->hostnames)
			continue;
		for (size_t i = 0; i < g->n_hosts; i++) {
			kiln_cfg_node *n = &c->nodes[c->n_nodes++];
			n->name = g->hostnames[i];
			n->group = g;
			n->index_in_group = i;
			if (g->addresses)
				n->address = g->addresses[i];
			if (g->macs)
				memcpy(n->mac, g->macs[i], 6);
		}
	}

	/* Duplicates: names, MACs, addresses, against each other and the head.
	 * Sorted indexes keep this O(n log n) up to KILN_HOSTLIST_MAX nodes. */
	L->name_idx = malloc((c->n_nodes ? c->n_nodes : 1) * sizeof(size_t));
	_cleanup_free_ size_t *ix = malloc((c->n_nodes ? c->n_nodes : 1) * sizeof(size_t));
	if (!L->name_idx || !ix) {
		L->oom = 1;
		return;
	}
	for (size_t a = 0; a < c->n_nodes; a++) {
		kiln_cfg_node *n = &c->nodes[a];
		size_t gi = (size_t) (n->group - c->groups);
		char p[128];
		L->name_idx[a] = a;
		if (c->head.hostname && strcasecmp(n->name, c->head.hostname) == 0) {
			snprintf(p, sizeof(p), "node_groups[%zu].hosts", gi);
			if (streq(n->name, c->head.hostname))
				add_error(L, member_line(L->group_set[gi], "hosts"), p, NULL,
					  "host name \"%s\" is also the head node's", n->name);
			else
				add_error(
					L, member_line(L->group_set[gi], "hosts"), p,
					"DNS and /etc/hosts ignore case; rename one of them",
					"host name \"%s\" differs from the head node's \"%s\" only "
					"in case",
					n->name, c->head.hostname);
		}
		if (n->group->addresses && n->address == c->head.address) {
			snprintf(p, sizeof(p), "node_groups[%zu].addresses", gi);
			add_error(L, member_line(L->group_set[gi], "addresses"), p, NULL,
				  "address %s of %s is also the head node's",
				  kiln_format_ipv4(b1, n->address), n->name);
		}
	}
	/* Sorted case-insensitively first, so names DNS and /etc/hosts would
	 * take for one ("node01", "NODE01") end up next to each other. */
	qsort_r(L->name_idx, c->n_nodes, sizeof(size_t), cmp_name, c->nodes);
	for (size_t k = 1; k < c->n_nodes; k++) {
		const kiln_cfg_node *n = &c->nodes[L->name_idx[k]];
		const kiln_cfg_node *o = &c->nodes[L->name_idx[k - 1]];
		if (strcasecmp(n->name, o->name) != 0)
			continue;
		if (n < o) { /* report the one later in the file */
			const kiln_cfg_node *t = n;
			n = o;
			o = t;
		}
		size_t gi = (size_t) (n->group - c->groups);
		size_t ogi = (size_t) (o->group - c->groups);
		char p[96];
		snprintf(p, sizeof(p), "node_groups[%zu].hosts", gi);
		if (streq(n->name, o->name))
			add_error(L, member_line(L->group_set[gi], "hosts"), p,
				  "a host belongs to exactly one group, once",
				  "duplicate host name \"%s\" (also in node_groups[%zu], line %d)",
				  n->name, ogi, member_line(L->group_set[ogi], "hosts"));
		else
			add_error(
				L, member_line(L->group_set[gi], "hosts"), p,
				"DNS and /etc/hosts ignore case; rename one of them",
				"host name \"%s\" differs from \"%s\" (node_groups[%zu], line %d) "
				"only in case",
				n->name, o->name, ogi, member_line(L->group_set[ogi], "hosts"));
	}
	/* After the duplicate checks, so that a case-only collision is still
	 * named; one error per group, for the first bad name. */
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		const kiln_cfg_group *g = &c->groups[gi];
		size_t nbad = 0;
		const char *first = NULL;
		for (size_t i = 0; g->hostnames && i < g->n_hosts; i++)
			if (!valid_host_name(g->hostnames[i]) && nbad++ == 0)
				first = g->hostnames[i];
		if (!first)
			continue;
		char p[96], more[64] = "";
		snprintf(p, sizeof(p), "node_groups[%zu].hosts", gi);
		if (nbad > 1)
			snprintf(more, sizeof(more), " (and %zu more in this group)", nbad - 1);
		add_error(L, member_line(L->group_set[gi], "hosts"), p, HOST_NAME_HINT,
			  "host name \"%s\" is not a valid DNS label%s", first, more);
	}
	size_t nm = 0;
	for (size_t a = 0; a < c->n_nodes; a++)
		if (c->nodes[a].group->macs)
			ix[nm++] = a;
	qsort_r(ix, nm, sizeof(size_t), cmp_mac, c->nodes);
	for (size_t k = 1, first = 0; k < nm; k++) {
		const kiln_cfg_node *n = &c->nodes[ix[k]], *o = &c->nodes[ix[first]];
		if (memcmp(n->mac, o->mac, 6) != 0) {
			first = k;
			continue;
		}
		size_t gi = (size_t) (n->group - c->groups);
		char p[128], mb[18];
		snprintf(p, sizeof(p), "node_groups[%zu].macs[%zu]", gi, n->index_in_group);
		add_error(L, elem_line(L->mac_set[gi], n->index_in_group), p, NULL,
			  "duplicate MAC %s (also %s)", kiln_format_mac(mb, n->mac), o->name);
	}
	size_t na = 0;
	for (size_t a = 0; a < c->n_nodes; a++)
		if (c->nodes[a].group->addresses)
			ix[na++] = a;
	qsort_r(ix, na, sizeof(size_t), cmp_addr, c->nodes);
	for (size_t k = 1, first = 0; k < na; k++) {
		const kiln_cfg_node *n = &c->nodes[ix[k]], *o = &c->nodes[ix[first]];
		if (n->address != o->address) {
			first = k;
			continue;
		}
		size_t gi = (size_t) (n->group - c->groups);
		char p[128];
		snprintf(p, sizeof(p), "node_groups[%zu].addresses", gi);
		add_error(L, member_line(L->group_set[gi], "addresses"), p, NULL,
			  "duplicate address %s (%s and %s)", kiln_format_ipv4(b1, n->address),
			  o->name, n->name);
	}

	/* Partitions. */
	_cleanup_strv_free_ char **pnames = calloc(c->slurm.n_partitions + 1, sizeof(char *));
	_cleanup_free_ char **nnames = calloc(c->n_nodes + 1, sizeof(char *)); /* borrowed */
	_cleanup_free_ size_t *mark = calloc(c->n_nodes ? c->n_nodes : 1, sizeof(size_t));
	if (!pnames || !nnames || !mark) {
		L->oom = 1;
		return;
	}
	for (size_t i = 0; i < c->n_nodes; i++)
		nnames[i] = c->nodes[i].name;
	size_t np = 0;
	int default_line = 0;
	for (size_t pi = 0; pi < c->slurm.n_partitions; pi++) {
		kiln_cfg_partition *p = &c->slurm.partitions[pi];
		char ppath[64];
		snprintf(ppath, sizeof(ppath), "slurm.partitions[%zu]", pi);
		if (!L->part_set[pi] || !p->name)
			continue;
		char ap[96];
		if (!valid_name(p->name)) {
			snprintf(ap, sizeof(ap), "%s.name", ppath);
			add_error(L, member_line(L->part_set[pi], "name"), ap, NAME_HINT,
				  "invalid partition name \"%s\"", p->name);
		}
		if (strv_contains(pnames, p->name)) {
			size_t first = 0;
			while (first < pi &&
			       !(L->part_set[first] && c->slurm.partitions[first].name &&
				 streq(c->slurm.partitions[first].name, p->name)))
				first++;
			snprintf(ap, sizeof(ap), "%s.name", ppath);
			add_error(
				L, member_line(L->part_set[pi], "name"), ap,
				"give each partition its own name, or merge the two",
				"duplicate partition \"%s\" (also slurm.partitions[%zu], line %d)",
				p->name, first, member_line(L->part_set[first], "name"));
		}
		if (!(pnames[np++] = strdup(p->name))) {
			L->oom = 1;
			return;
		}
		if (p->is_default) {
			if (default_line) {
				snprintf(ap, sizeof(ap), "%s.default", ppath);
				add_error(L, member_line(L->part_set[pi], "default"), ap, NULL,
					  "a second default partition (the first is at line %d)",
					  default_line);
			} else
				default_line = member_line(L->part_set[pi], "default");
		}
	}
	/* Members: explicit nodes first, then groups naming the partition; each
	 * node once (mark[i] == pi + 1 when node i is already in). */
	for (size_t pi = 0; pi < c->slurm.n_partitions; pi++) {
		kiln_cfg_partition *p = &c->slurm.partitions[pi];
		if (!L->part_set[pi] || !p->name)
			continue;
		char ap[96];
		snprintf(ap, sizeof(ap), "slurm.partitions[%zu].nodes", pi);
		char **members = calloc(c->n_nodes + 1, sizeof(char *));
		if (!members) {
			L->oom = 1;
			return;
		}
		size_t nmem = 0;
		if (p->nodes) {
			_cleanup_strv_free_ char **v = NULL;
			size_t nv = 0;
			if (expand_hostlist(L, member_line(L->part_set[pi], "nodes"), ap, p->nodes,
					    &v, &nv) < 0) {
				free(members);
				continue;
			}
			for (size_t i = 0; i < nv; i++) {
				ssize_t ni = find_index(L, v[i]);
				if (ni < 0) {
					if (L->nodes_incomplete || errors_full(L))
						continue;
					_cleanup_free_ char *h = hint_from(v[i], nnames);
					add_error(L, member_line(L->part_set[pi], "nodes"), ap, h,
						  "unknown node \"%s\"", v[i]);
					continue;
				}
				if (mark[ni] != pi + 1) {
					mark[ni] = pi + 1;
					members[nmem++] = c->nodes[ni].name;
				}
			}
		}
		for (size_t ni = 0; ni < c->n_nodes; ni++) {
			const kiln_cfg_group *g = c->nodes[ni].group;
			if (g->partitions && strv_contains(g->partitions, p->name) &&
			    mark[ni] != pi + 1) {
				mark[ni] = pi + 1;
				members[nmem++] = c->nodes[ni].name;
			}
		}
		/* members borrowed node names so far; now own copies, and record
		 * the partition on each member node (in partition order). */
		for (size_t i = 0; i < nmem; i++) {
			ssize_t ni = find_index(L, members[i]);
			members[i] = strdup(members[i]);
			if (!members[i] || strv_extend(&c->nodes[ni].partitions, p->name) < 0) {
				strv_free(members);
				L->oom = 1;
				return;
			}
		}
		if (nmem == 0) {
			free(members);
			if (!p->nodes)
				add_error(L, p->line, ap,
					  "set nodes, or name the partition in a node group's "
					  "partitions",
					  "partition \"%s\" has no nodes", p->name);
			continue;
		}
		p->n_members = nmem;
		p->members = members;
	}
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		if (!L->group_set[gi] || !g->partitions)
			continue;
		for (size_t j = 0; g->partitions[j]; j++)
			if (!strv_contains(pnames, g->partitions[j])) {
				char ap[96];
				snprintf(ap, sizeof(ap), "node_groups[%zu].partitions[%zu]", gi, j);
				_cleanup_free_ char *h = hint_from(g->partitions[j], pnames);
				config_setting_t *ps =
					config_setting_get_member(L->group_set[gi], "partitions");
				if (!h && asprintf(&h, "add { name = \"%s\"; } to slurm.partitions",
						   g->partitions[j]) < 0)
					h = NULL; /* no hint then */
				add_error(L, elem_line(ps, j), ap, h, "unknown partition \"%s\"",
					  g->partitions[j]);
			}
	}
	/* Nodes in no partition still get an empty vector. */
	for (size_t a = 0; a < c->n_nodes; a++)
		if (!c->nodes[a].partitions &&
		    !(c->nodes[a].partitions = calloc(1, sizeof(char *)))) {
			L->oom = 1;
			return;
		}

	/* Health. */
	for (size_t i = 0; i < c->health.n_xids; i++)
		for (size_t j = 0; j < i; j++)
			if (c->health.xids[i].xid &&
			    c->health.xids[i].xid == c->health.xids[j].xid) {
				char ap[64];
				snprintf(ap, sizeof(ap), "health.xid[%zu].xid", i);
				add_error(L, member_line(L->xid_set[i], "xid"), ap, NULL,
					  "XID %d is already set at line %d", c->health.xids[i].xid,
					  c->health.xids[j].line);
				break;
			}
	if (c->health.memtest_fraction < 0.0 || c->health.memtest_fraction > 1.0)
		add_error(L, root_line(L, "health.memtest_fraction"), "health.memtest_fraction",
			  NULL, "%g is out of range 0..1", c->health.memtest_fraction);
	if (c->health.thresholds.temp_max_c &&
	    c->health.thresholds.temp_max_c < c->health.thresholds.temp_warn_c)
		add_error(L, root_line(L, "health.thresholds.temp_max_c"),
			  "health.thresholds.temp_max_c", NULL, "%d C is below temp_warn_c (%d C)",
			  c->health.thresholds.temp_max_c, c->health.thresholds.temp_warn_c);
	if (c->launcher.dead_after_usec <= c->launcher.heartbeat_usec)
		add_error(L, root_line(L, "launcher.dead_after"), "launcher.dead_after", NULL,
			  "must be longer than launcher.heartbeat");

	/* Inference: where it runs. */
	if (c->inference.enabled && !c->inference.model)
		add_error(L, root_line(L, "inference.enabled"), "inference.model",
			  "set model = \"/path/to/model\"; or enabled = false;",
			  "missing required setting when inference is enabled");
	if (c->inference.nodes) {
		const kiln_cfg_partition *p = kiln_cfg_find_partition(c, c->inference.nodes);
		if (p) {
			for (size_t i = 0; p->members && p->members[i]; i++) {
				ssize_t ni = find_index(L, p->members[i]);
				if (ni >= 0)
					c->nodes[ni].inference = c->inference.enabled;
			}
		} else {
			_cleanup_strv_free_ char **v = NULL;
			size_t nv = 0;
			if (kiln_hostlist_expand(c->inference.nodes, &v, &nv, NULL) < 0)
				add_error(L, root_line(L, "inference.nodes"), "inference.nodes",
					  NULL, "\"%s\" is neither a partition nor a hostlist",
					  c->inference.nodes);
			else
				for (size_t i = 0; i < nv; i++) {
					ssize_t ni = find_index(L, v[i]);
					if (ni < 0) {
						if (L->nodes_incomplete || errors_full(L))
							continue;
						_cleanup_free_ char *h = hint_from(v[i], nnames);
						add_error(L, root_line(L, "inference.nodes"),
							  "inference.nodes", h,
							  "unknown node or partition \"%s\"", v[i]);
					} else
						c->nodes[ni].inference = c->inference.enabled;
				}
		}
	} else
		for (size_t i = 0; i < c->n_nodes; i++)
			c->nodes[i].inference = c->inference.enabled;

	/* Derived defaults. */
	if (!c->slurm.cluster_name && c->cluster.name &&
	    !(c->slurm.cluster_name = strdup(c->cluster.name)))
		L->oom = 1;
	if (!c->image.http_url && asprintf(&c->image.http_url, "http://%s/kiln",
					   kiln_format_ipv4(b1, c->head.address)) < 0) {
		c->image.http_url = NULL;
		L->oom = 1;
	}
}

/* ---- load / free ----------------------------------------------------- */

/* libconfig's "@include" would read other files (and /dev/zero under a
 * fuzzer); kiln keeps the whole cluster in one file. */
static int find_include(const char *text)
{
	int line = 1;
	const char *p = text;
	while (*p) {
		const char *q = p;
		while (*q == ' ' || *q == '\t')
			q++;
		if (startswith(q, "@include"))
			return line;
		const char *nl = strchr(p, '\n');
		if (!nl)
			break;
		p = nl + 1;
		line++;
	}
	return 0;
}

/* Length of a libconfig float token at p (its scanner's {float} pattern),
 * or 0. */
static size_t float_len(const char *p)
{
	const char *q = p;
	if (*q == '-' || *q == '+')
		q++;
	const char *d = q;
	while (isdigit((unsigned char) *q))
		q++;
	bool int_part = q > d, dot = *q == '.';
	if (dot)
		for (q++; isdigit((unsigned char) *q); q++)
			;
	if (*q == 'e' || *q == 'E') {
		const char *e = q + 1;
		if (*e == '-' || *e == '+')
			e++;
		if (isdigit((unsigned char) *e)) {
			while (isdigit((unsigned char) *e))
				e++;
			if (dot || int_part)
				return (size_t) (e - p);
		}
	}
	return dot ? (size_t) (q - p) : 0;
}

/* libconfig 1.5 keeps an integer written without an L suffix in an int:
 * "4294967300" silently becomes 4 and "0x80000000" a negative number.  Its
 * scanner is followed here just far enough (comments, strings, names,
 * numbers) to find such literals before they are misread; each is an
 * error on its line.  Returns how many it found. */
static int find_truncated_ints(loader *L, const char *text)
{
	int line = 1, found = 0;
	for (const char *p = text; *p;) {
		if (*p == '\n') {
			line++;
			p++;
		} else if (startswith(p, "/*")) {
			for (p += 2; *p && !startswith(p, "*/"); p++)
				line += *p == '\n';
			p += *p ? 2 : 0;
		} else if (*p == '#' || startswith(p, "//")) {
			p += strcspn(p, "\n");
		} else if (*p == '"') {
			for (p++; *p && *p != '"'; p++) {
				line += *p == '\n';
				if (*p == '\\' && p[1])
					p++; /* an escape: \" does not end the string */
			}
			p += *p ? 1 : 0;
		} else if (isalpha((unsigned char) *p) || *p == '*') {
			while (isalnum((unsigned char) *p) || (*p && strchr("-_*", *p)))
				p++;
		} else if (isdigit((unsigned char) *p) ||
			   ((*p == '-' || *p == '+' || *p == '.') &&
			    (isdigit((unsigned char) p[1]) || p[1] == '.'))) {
			const char *q = p + (*p == '-' || *p == '+');
			bool hex = q == p && q[0] == '0' && (q[1] == 'x' || q[1] == 'X') &&
				   isxdigit((unsigned char) q[2]);
			size_t ilen = 0;
			if (hex)
				for (ilen = 2; isxdigit((unsigned char) q[ilen]); ilen++)
					;
			else
				while (isdigit((unsigned char) q[ilen]))
					ilen++;
			size_t n = (size_t) (q - p) + ilen, fl = float_len(p);
			if (ilen == 0 || fl > n) { /* a float (or a lone sign) */
				p += fl ? fl : 1;
				continue;
			}
			if (p[n] != 'L') {
				errno = 0;
				char *end;
				long long v = strtoll(p, &end, hex ? 16 : 10);
				if (errno == ERANGE || v < INT_MIN || v > INT_MAX) {
					add_error(
						L, line, "", NULL,
						"integer %.*s does not fit in 32 bits; write %.*sL "
						"(without the L suffix libconfig cuts it to 32 "
						"bits)",
						(int) n, p, (int) n, p);
					found++;
				}
			}
			p += n;
			while (*p == 'L')
				p++;
		} else
			p++;
	}
	return found;
}

static void free_fields(int base, void *obj)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++) {
		const kiln_cfg_key *k = &s[i];
		if (k->base != base)
			continue;
		switch (k->type) {
		case KILN_CFG_STRING:
		case KILN_CFG_PATH:
		case KILN_CFG_HOSTLIST:
			free(*(char **) field(k, obj));
			break;
		case KILN_CFG_STRV:
			strv_free(*(char ***) field(k, obj));
			break;
		default:
			break;
		}
	}
}

void kiln_cfg_free(kiln_cfg *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_groups; i++) {
		kiln_cfg_group *g = &c->groups[i];
		free_fields(BASE_GROUP, g);
		strv_free(g->hostnames);
		free(g->addresses);
		free(g->macs);
	}
	free(c->groups);
	for (size_t i = 0; i < c->n_nodes; i++)
		strv_free(c->nodes[i].partitions);
	free(c->nodes);
	for (size_t i = 0; i < c->slurm.n_partitions; i++) {
		free_fields(BASE_PART, &c->slurm.partitions[i]);
		strv_free(c->slurm.partitions[i].members);
	}
	free(c->slurm.partitions);
	free(c->health.xids);
	free(c->network.dns);
	free_fields(BASE_ROOT, c);
	free(c->path);
	free(c);
}

/* Errors come from several passes; present them in file order (stable, so
 * errors on one line keep the order they were found in). */
static void sort_errors(kiln_cfg_errors *e, size_t from)
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

/* What to do about libconfig 1.5's other parse errors. */
static const char *syntax_hint(const char *error_text)
{
	static const struct {
		const char *text, *hint;
	} hints[] = {
		{ "duplicate setting name",
		  "a key may appear only once in a group; remove or merge "
		  "the second one" },
		{ "mismatched element type in array",
		  "an array [ ... ] holds values of one type: all strings or all numbers" },
		{ "memory exhausted", "groups or lists are nested too deeply" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(hints); i++)
		if (streq(error_text, hints[i].text))
			return hints[i].hint;
	return NULL;
}

#define UTF8_BOM "\xef\xbb\xbf"

int kiln_cfg_load_string(const char *text, const char *name, kiln_cfg **ret, kiln_cfg_errors *errs)
{
	assert_return(text, -EINVAL);
	assert_return(name, -EINVAL);
	kiln_cfg_errors local;
	kiln_cfg_errors_init(&local);
	kiln_cfg_errors *e = errs ? errs : &local;
	size_t before = e->n + e->dropped;
	/* Editors on Windows save a UTF-8 byte-order mark that libconfig
	 * would call a syntax error; it carries no meaning, so skip it. */
	if (startswith(text, UTF8_BOM))
		text += strlen(UTF8_BOM);

	_cleanup_(kiln_cfg_freep) kiln_cfg *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->path = strdup(name);
	if (!c->path)
		return -ENOMEM;
	if (apply_defaults(BASE_ROOT, c) < 0)
		return -ENOMEM;

	loader L = { .cfg = c, .errs = e, .file = name, .last_line = 1 };
	for (const char *p = text; *p; p++)
		if (*p == '\n' && p[1])
			L.last_line++;
	int r = 0;
	int inc = find_include(text);
	config_t lc;
	config_init(&lc);
	L.lc = &lc;
	if (inc) {
		add_error(&L, inc, "", "put everything in one file", "@include is not supported");
	} else if (find_truncated_ints(&L, text) > 0) {
		/* what libconfig would read there is wrong: stop here */
	} else if (config_read_string(&lc, text) != CONFIG_TRUE) {
		const char *et = config_error_text(&lc);
		if (!et || streq(et, "syntax error"))
			add_error(&L, config_error_line(&lc), "",
				  "look for a missing ';', quote or bracket here or just above",
				  "syntax error");
		else
			add_error(&L, config_error_line(&lc), "", syntax_hint(et),
				  "syntax error: %s", et);
	} else {
		walk(&L, config_root_setting(&lc), "", "", BASE_ROOT, c, 0, 0);
		if (!L.oom)
			cross_check(&L);
	}
	config_destroy(&lc);
	sort_errors(e, before);
	free(L.name_idx);
	free(L.group_set);
	free(L.addr_set);
	free(L.mac_set);
	free(L.part_set);
	free(L.xid_set);
	if (L.oom)
		r = -ENOMEM;
	else if (e->n + e->dropped > before)
		r = -EINVAL;
	kiln_cfg_errors_free(&local);
	if (r < 0)
		return r;
	*ret = TAKE_PTR(c);
	return 0;
}

int kiln_cfg_load(const char *path, kiln_cfg **ret, kiln_cfg_errors *errs)
{
	assert_return(path, -EINVAL);
	_cleanup_free_ char *text = NULL;
	size_t len;
	int r = kiln_read_file(path, KILN_CFG_FILE_MAX, &text, &len);
	if (r < 0)
		return r;
	const char *nul = memchr(text, 0, len);
	if (nul) {
		kiln_cfg_errors local;
		kiln_cfg_errors_init(&local);
		loader L = { .errs = errs ? errs : &local, .file = path };
		int line = 1;
		for (const char *p = text; p < nul; p++)
			line += *p == '\n';
		add_error(&L, line, "", "a cluster file is text; is this the right file?",
			  "binary data (a NUL byte)");
		kiln_cfg_errors_free(&local);
		return L.oom ? -ENOMEM : -EINVAL;
	}
	return kiln_cfg_load_string(text, path, ret, errs);
}

const char *kiln_cfg_default_path(void)
{
	const char *e = getenv(KILN_CFG_ENV);
	return e && e[0] ? e : KILN_CFG_DEFAULT_PATH;
}

/* ---- lookups --------------------------------------------------------- */

const kiln_cfg_node *kiln_cfg_find_node(const kiln_cfg *cfg, const char *name)
{
	if (!cfg || !name)
		return NULL;
	for (size_t i = 0; i < cfg->n_nodes; i++)
		if (streq(cfg->nodes[i].name, name))
			return &cfg->nodes[i];
	return NULL;
}

const kiln_cfg_node *kiln_cfg_find_node_by_mac(const kiln_cfg *cfg, const uint8_t mac[6])
{
	if (!cfg || !mac)
		return NULL;
	for (size_t i = 0; i < cfg->n_nodes; i++)
		if (memcmp(cfg->nodes[i].mac, mac, 6) == 0)
			return &cfg->nodes[i];
	return NULL;
}

const kiln_cfg_partition *kiln_cfg_find_partition(const kiln_cfg *cfg, const char *name)
{
	if (!cfg || !name)
		return NULL;
	for (size_t i = 0; i < cfg->slurm.n_partitions; i++)
		if (cfg->slurm.partitions[i].name && streq(cfg->slurm.partitions[i].name, name))
			return &cfg->slurm.partitions[i];
	return NULL;
}

kiln_cfg_action kiln_cfg_xid_action(const kiln_cfg *cfg, int xid, kiln_cfg_action def)
{
	if (!cfg)
		return def;
	for (size_t i = 0; i < cfg->health.n_xids; i++)
		if (cfg->health.xids[i].xid == xid)
			return cfg->health.xids[i].action;
	return def;
}

char *kiln_cfg_gpu_type_from_model(const char *model)
{
	if (!model)
		return NULL;
	/* The first word with a digit that is not a vendor or memory size:
	 * "NVIDIA H100 80GB HBM3" -> h100, "Tesla V100-SXM2-32GB" -> v100. */
	const char *p = model;
	while (*p) {
		while (*p && !isalnum((unsigned char) *p))
			p++;
		const char *w = p;
		while (*p && isalnum((unsigned char) *p))
			p++;
		size_t l = (size_t) (p - w);
		bool digit = false, alpha = false;
		for (size_t i = 0; i < l; i++) {
			if (isdigit((unsigned char) w[i]))
				digit = true;
			else
				alpha = true;
		}
		if (l && digit && alpha) {
			char *s = strndup(w, l);
			if (!s)
				return NULL;
			for (char *q = s; *q; q++)
				*q = (char) tolower((unsigned char) *q);
			return s;
		}
	}
	/* No model number: the whole name, lowercased, non-alnum dropped. */
	char *s = malloc(strlen(model) + 4);
	if (!s)
		return NULL;
	size_t j = 0;
	for (const char *q = model; *q; q++)
		if (isalnum((unsigned char) *q))
			s[j++] = (char) tolower((unsigned char) *q);
	if (j == 0)
		s[j++] = 'g', s[j++] = 'p', s[j++] = 'u';
	s[j] = 0;
	return s;
}
