/* values.c — one setting of the cluster file into its typed field.
 *
 * The schema table (schema.c) says what type each key has and where it is
 * stored; this file turns what libconfig read (or a default as the schema
 * writes it) into that field: integers within their range, durations,
 * sizes, addresses, enums, string arrays.  A value that does not fit is
 * reported at its setting path with a hint on how to write it.  The same
 * parser applies the schema's defaults, so a default means exactly what the
 * same text written in the file would. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

const char *kiln_cfg__expected_text(kiln_cfg_type t)
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

const char *kiln_cfg__lc_type_text(int t)
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

const kiln_cfg_key *kiln_cfg__find_key(const char *pattern)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++)
		if (streq(s[i].path, pattern))
			return &s[i];
	return NULL;
}

/* ---- value parsing --------------------------------------------------- */

/* A value that does not parse: returns the message (and sets *hint to h
 * when h is given). */
static char *value_error(char **hint, const char *h, const char *fmt, ...) _printf_(3, 4);
static char *value_error(char **hint, const char *h, const char *fmt, ...)
{
	char *m = NULL;
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&m, fmt, ap) < 0)
		m = NULL;
	va_end(ap);
	if (h)
		*hint = strdup(h);
	return m;
}

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
			if ((unsigned char) *q < 0x20 || *q == 0x7f)
				return value_error(hint, NULL,
						   "control character (0x%02x) at offset %zu",
						   (unsigned) (unsigned char) *q, (size_t) (q - s));
		if (k->type == KILN_CFG_PATH && strpbrk(s, " \t"))
			return value_error(hint, NULL, "\"%s\" contains a space", s);
		if (k->type == KILN_CFG_PATH && s[0] != '/')
			return value_error(hint, NULL, "\"%s\" is not an absolute path", s);
		/* Hostlists are expanded (and reported) once, by the checks. */
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
		if (r < 0)
			return value_error(hint, NULL, "invalid integer \"%s\"", s);
		*(int *) dst = v;
		return NULL;
	}
	case KILN_CFG_BOOL:
		if (kiln_parse_bool(s, (bool *) dst) < 0)
			return value_error(hint, NULL, "invalid boolean \"%s\"", s);
		return NULL;
	case KILN_CFG_DOUBLE:
		if (kiln_parse_double(s, (double *) dst) < 0)
			return value_error(hint, NULL, "invalid number \"%s\"", s);
		return NULL;
	case KILN_CFG_DURATION:
		if (kiln_parse_duration(s, KILN_USEC_PER_SEC, (uint64_t *) dst) < 0)
			return value_error(
				hint, "write it like \"90s\", \"5m\", \"1h30m\" or \"infinite\"",
				"malformed duration \"%s\"", s);
		return NULL;
	case KILN_CFG_SIZE_MB: {
		uint64_t b;
		if (kiln_parse_size(s, 1024 * 1024, &b) < 0)
			return value_error(
				hint, "write it like \"512G\", \"2T\" or an integer number of MiB",
				"malformed size \"%s\"", s);
		*(uint64_t *) dst = b / (1024 * 1024);
		return NULL;
	}
	case KILN_CFG_IPV4:
		if (kiln_parse_ipv4(s, (uint32_t *) dst) < 0)
			return value_error(hint, NULL, "malformed IPv4 address \"%s\"", s);
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
		if (prefix < 8 || prefix > 30)
			return value_error(hint, NULL, "prefix /%d out of range 8..30", prefix);
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
		return value_error(hint, "write it like \"10.0.0.0/24\"", "malformed subnet \"%s\"",
				   s);
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
		return value_error(hint, NULL, "invalid value \"%s\"", s);
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
		if (lo > hi)
			return value_error(hint, NULL, "minimum %d is larger than maximum %d", lo,
					   hi);
		((int *) dst)[0] = lo;
		((int *) dst)[1] = hi;
		return NULL;
	bad_nnodes:
		return value_error(hint, "write it like \"2:4\" (MIN:MAX) or \"4\"",
				   "malformed node count \"%s\"", s);
	}
	case KILN_CFG_NPROC:
		if (streq(s, "gpu")) {
			*(int *) dst = 0;
			return NULL;
		}
		if (kiln_parse_int(s, 1, 1024, (int *) dst) < 0)
			return value_error(hint, "write \"gpu\" (one per GPU) or a number 1..1024",
					   "invalid value \"%s\"", s);
		return NULL;
	default:
		return strdup("internal error: no string form");
	}
}

/* Where a key's value lives inside obj (or NULL for BASE_NONE). */
void *kiln_cfg__field(const kiln_cfg_key *k, void *obj)
{
	if (k->base == BASE_NONE || !obj)
		return NULL;
	if (k->type == KILN_CFG_CIDR)
		return &((kiln_cfg *) obj)->network;
	return (char *) obj + k->offset;
}

int kiln_cfg__apply_defaults(int base, void *obj)
{
	for (const kiln_cfg_key *k = NULL; (k = kiln_cfg__next_key(base, k));) {
		void *dst = kiln_cfg__field(k, obj);
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
			kiln_cfg__elem_error(L, s, disp, (size_t) i, NULL,
					     "expected a string, got %s",
					     kiln_cfg__lc_type_text(config_setting_type(e)));
			bad = 1;
			continue;
		}
		const char *str = config_setting_get_string(e);
		for (const char *q = str; *q; q++)
			if ((unsigned char) *q < 0x20 || *q == 0x7f) {
				kiln_cfg__elem_error(L, s, disp, (size_t) i, NULL,
						     "control character (0x%02x) at offset %zu",
						     (unsigned) (unsigned char) *q,
						     (size_t) (q - str));
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

int kiln_cfg__read_string_array(loader *L, config_setting_t *s, const char *disp,
				kiln_cfg_type type, char ***ret)
{
	int t = config_setting_type(s);
	if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) {
		kiln_cfg__add_error(L, kiln_cfg__setting_line(s), disp, NULL, "expected %s, got %s",
				    kiln_cfg__expected_text(type), kiln_cfg__lc_type_text(t));
		return -EINVAL;
	}
	int r = read_strings(L, s, disp, ret);
	if (r == -ENOMEM)
		L->oom = 1;
	return r;
}

void kiln_cfg__parse_value(loader *L, const kiln_cfg_key *k, config_setting_t *s, const char *disp,
			   void *obj)
{
	int t = config_setting_type(s);
	int line = kiln_cfg__setting_line(s);
	void *dst = kiln_cfg__field(k, obj);
	_cleanup_free_ char *msg = NULL, *hint = NULL;
	char num[32];

	switch (k->type) {
	case KILN_CFG_INT:
		if (!is_int(t))
			goto wrong_type;
		{
			long long v = config_setting_get_int64(s);
			if (k->min < k->max && (v < k->min || v > k->max)) {
				kiln_cfg__add_error(L, line, disp, NULL,
						    "%lld is out of range %lld..%lld", v,
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
				kiln_cfg__add_error(L, line, disp, NULL, "negative value %lld", v);
				return;
			}
			if (k->type == KILN_CFG_DURATION) {
				if ((unsigned long long) v > UINT64_MAX / KILN_USEC_PER_SEC) {
					kiln_cfg__add_error(L, line, disp, NULL,
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
				kiln_cfg__add_error(L, line, disp, hint, "%s", msg);
			return;
		}
		break;
	case KILN_CFG_STRV: {
		char **v = NULL;
		if (kiln_cfg__read_string_array(L, s, disp, k->type, &v) < 0)
			return;
		strv_free(*(char ***) dst);
		*(char ***) dst = v;
		return;
	}
	case KILN_CFG_IPV4_LIST: {
		_cleanup_strv_free_ char **v = NULL;
		if (kiln_cfg__read_string_array(L, s, disp, k->type, &v) < 0)
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
				kiln_cfg__add_error(L, line, p, NULL,
						    "malformed IPv4 address \"%s\"", v[i]);
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
		kiln_cfg__add_error(L, line, disp, hint, "%s", msg);
	return;

wrong_type:
	kiln_cfg__add_error(L, line, disp, NULL, "expected %s, got %s",
			    kiln_cfg__expected_text(k->type), kiln_cfg__lc_type_text(t));
}
