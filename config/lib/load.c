/* load.c — load a kiln cluster file: read it, walk it, check it, free it.
 *
 * libconfig does the syntax; this file drives everything after it from the
 * schema table (schema.c): it applies the defaults, walks every setting the
 * file holds and rejects those the table does not know (with "did you
 * mean"), has values.c convert each value into the typed structs of
 * kiln/config.h, and then runs the checks one key alone cannot make
 * (check-*.c) and fills the derived defaults (derive.c).  It never stops at
 * the first problem: every error is collected (errors.c) with its file,
 * line and setting path so an admin fixes a file in one go.
 * Library code: nothing is logged, errors are handed back. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

/* ---- schema paths ---------------------------------------------------- */

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

/* Keys kiln no longer reads, refused by name with what replaces them: a
 * key that moved for a reason (a secret out of the served file) must not
 * pass silently, nor look like a typo. */
static const struct {
	const char *path, *why, *hint;
} removed_keys[] = {
	{ "image.root_password_hash",
	  "no longer accepted: the cluster file is served to every node and installed 0644 "
	  "there, so a hash in it is readable by every user",
	  "put the hash (mkpasswd -m yescrypt) in a root-owned 0600 file on the head node and "
	  "name it with image.root_password_file (kiln serve hands it to the nodes)" },
};

static const char *removed_key(const char *pattern, const char **ret_hint)
{
	for (size_t i = 0; i < ARRAY_SIZE(removed_keys); i++)
		if (streq(removed_keys[i].path, pattern)) {
			*ret_hint = removed_keys[i].hint;
			return removed_keys[i].why;
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
	{ "topology.switches", BASE_SWITCH, sizeof(kiln_cfg_switch), offsetof(kiln_cfg, switches),
	  offsetof(kiln_cfg, n_switches), offsetof(loader, switch_set),
	  offsetof(kiln_cfg_switch, line), false },
	{ "inference.models", BASE_MODEL, sizeof(kiln_cfg_model),
	  offsetof(kiln_cfg, inference.models), offsetof(kiln_cfg, inference.n_models),
	  offsetof(loader, model_set), offsetof(kiln_cfg_model, line), false },
	/* users, groups and shared storage (check-users.c) */
	{ "users", BASE_USER, sizeof(kiln_cfg_user), offsetof(kiln_cfg, users),
	  offsetof(kiln_cfg, n_users), offsetof(loader, user_set), offsetof(kiln_cfg_user, line),
	  false },
	{ "groups", BASE_UGROUP, sizeof(kiln_cfg_unix_group), offsetof(kiln_cfg, unix_groups),
	  offsetof(kiln_cfg, n_unix_groups), offsetof(loader, ugroup_set),
	  offsetof(kiln_cfg_unix_group, line), false },
	{ "mounts", BASE_MOUNT, sizeof(kiln_cfg_mount), offsetof(kiln_cfg, mounts),
	  offsetof(kiln_cfg, n_mounts), offsetof(loader, mount_set), offsetof(kiln_cfg_mount, line),
	  false },
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
	*FIELD(elem, d->line_off, int) = kiln_cfg__setting_line(s);
	(*FIELD(L, d->set_off, config_setting_t **))[idx] = s;
	*base = d->base;
	if (kiln_cfg__apply_defaults(d->base, elem) < 0)
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
		const kiln_cfg_key *k = kiln_cfg__find_key(pat);
		int t = config_setting_type(ch);
		const char *rhint = NULL, *why = k ? NULL : removed_key(pat, &rhint);
		if (why) {
			kiln_cfg__add_error(L, kiln_cfg__setting_line(ch), dsp, rhint, "%s", why);
			continue;
		}
		if (!k && depth == 0 && (streq(name, "ldap") || streq(name, "sssd"))) {
			/* asked for by name: say it is missing, not mistyped */
			kiln_cfg__add_error(L, kiln_cfg__setting_line(ch), dsp,
					    "list the accounts in users and groups (docs/config.md); "
					    "a site with a directory keeps its own sssd.conf in the "
					    "image (image.packages: sssd)",
					    "LDAP/SSSD is not supported yet");
			continue;
		}
		if (!k) {
			_cleanup_free_ char *hint = unknown_hint(pattern, name);
			kiln_cfg__add_error(L, kiln_cfg__setting_line(ch), dsp, hint,
					    "unknown setting");
			continue;
		}
		if (k->type == KILN_CFG_GROUP) {
			if (t != CONFIG_TYPE_GROUP) {
				kiln_cfg__add_error(L, kiln_cfg__setting_line(ch), dsp, NULL,
						    "expected %s, got %s",
						    kiln_cfg__expected_text(k->type),
						    kiln_cfg__lc_type_text(t));
				continue;
			}
			walk(L, ch, pat, dsp, base, obj, elem, depth + 1);
			continue;
		}
		if (k->type == KILN_CFG_LIST) {
			int len = config_setting_length(ch);
			if (t != CONFIG_TYPE_LIST && !(t == CONFIG_TYPE_ARRAY && len == 0)) {
				kiln_cfg__add_error(L, kiln_cfg__setting_line(ch), dsp, NULL,
						    "expected %s, got %s",
						    kiln_cfg__expected_text(k->type),
						    kiln_cfg__lc_type_text(t));
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
					kiln_cfg__add_error(
						L,
						kiln_cfg__setting_line(e)
							?: kiln_cfg__setting_line(ch),
						edsp, NULL, "expected a group { ... }, got %s",
						kiln_cfg__lc_type_text(config_setting_type(e)));
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
		kiln_cfg__parse_value(L, k, ch, dsp, obj);
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
			kiln_cfg__add_error(L, L->last_line, dsp, h, "missing required section");
		} else {
			_cleanup_free_ char *h = NULL;
			if (s[i].example && asprintf(&h, "add %s = %s;", last, s[i].example) < 0)
				h = NULL;
			kiln_cfg__add_error(L, kiln_cfg__setting_line(grp), dsp, h,
					    "missing required setting");
		}
	}
}

/* ---- cross checks ---------------------------------------------------- */

/* What one key alone cannot show, in the order the checks have always run
 * (errors on one line keep that order); derived defaults last. */
static void cross_check(loader *L)
{
	config_setting_t *ng = config_lookup(L->lc, "node_groups");
	if (!ng || config_setting_type(ng) != CONFIG_TYPE_LIST)
		L->nodes_incomplete = true;

	kiln_cfg__check_cluster_name(L);
	kiln_cfg__check_durations(L);
	kiln_cfg__check_network_words(L);
	kiln_cfg__check_service_words(L);
	kiln_cfg__check_image(L);
	kiln_cfg__check_group_words(L);
	kiln_cfg__check_network(L);
	if (kiln_cfg__check_nodes(L) < 0 || kiln_cfg__check_partitions(L) < 0)
		return;
	kiln_cfg__check_health(L);
	kiln_cfg__check_inference(L);
	kiln_cfg__check_topology(L);
	kiln_cfg__check_accounting(L);
	kiln_cfg__check_logging(L);
	kiln_cfg__check_users(L);
	if (!L->oom)
		kiln_cfg__derive(L);
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
					kiln_cfg__add_error(
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
	for (const kiln_cfg_key *k = NULL; (k = kiln_cfg__next_key(base, k));) {
		switch (k->type) {
		case KILN_CFG_STRING:
		case KILN_CFG_PATH:
		case KILN_CFG_HOSTLIST:
			free(*(char **) kiln_cfg__field(k, obj));
			break;
		case KILN_CFG_STRV:
			strv_free(*(char ***) kiln_cfg__field(k, obj));
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
	for (size_t i = 0; i < c->n_switches; i++)
		free_fields(BASE_SWITCH, &c->switches[i]);
	free(c->switches);
	for (size_t i = 0; i < c->inference.n_models; i++)
		free_fields(BASE_MODEL, &c->inference.models[i]);
	free(c->inference.models);
	for (size_t i = 0; i < c->n_users; i++)
		free_fields(BASE_USER, &c->users[i]);
	free(c->users);
	for (size_t i = 0; i < c->n_unix_groups; i++)
		free_fields(BASE_UGROUP, &c->unix_groups[i]);
	free(c->unix_groups);
	for (size_t i = 0; i < c->n_mounts; i++)
		free_fields(BASE_MOUNT, &c->mounts[i]);
	free(c->mounts);
	free(c->network.dns);
	free_fields(BASE_ROOT, c);
	free(c->path);
	free(c);
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

/* A kiln_cfg named name holding the schema's defaults and nothing else. */
static int cfg_new(const char *name, kiln_cfg **ret)
{
	kiln_cfg *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->path = strdup(name);
	if (!c->path || kiln_cfg__apply_defaults(BASE_ROOT, c) < 0) {
		kiln_cfg_free(c);
		return -ENOMEM;
	}
	*ret = c;
	return 0;
}

int kiln_cfg_defaults(kiln_cfg **ret)
{
	assert_return(ret, -EINVAL);
	return cfg_new("(schema defaults)", ret);
}

#define UTF8_BOM "\xef\xbb\xbf"

int kiln_cfg_load_string(const char *text, const char *name, kiln_cfg **ret, kiln_cfg_errors *errs)
{
	assert_return(text, -EINVAL);
	assert_return(name, -EINVAL);
	kiln_cfg_errors local;
	kiln_cfg_errors_init(&local);
	kiln_cfg_errors *e = errs ? errs : &local;
	size_t before = e->n, dropped_before = e->dropped;
	/* Editors on Windows save a UTF-8 byte-order mark that libconfig
	 * would call a syntax error; it carries no meaning, so skip it. */
	if (startswith(text, UTF8_BOM))
		text += strlen(UTF8_BOM);

	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	if (cfg_new(name, &c) < 0)
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
		kiln_cfg__add_error(&L, inc, "", "put everything in one file",
				    "@include is not supported");
	} else if (find_truncated_ints(&L, text) > 0) {
		/* what libconfig would read there is wrong: stop here */
	} else if (config_read_string(&lc, text) != CONFIG_TRUE) {
		const char *et = config_error_text(&lc);
		if (!et || streq(et, "syntax error"))
			kiln_cfg__add_error(
				&L, config_error_line(&lc), "",
				"look for a missing ';', quote or bracket here or just above",
				"syntax error");
		else
			kiln_cfg__add_error(&L, config_error_line(&lc), "", syntax_hint(et),
					    "syntax error: %s", et);
	} else {
		walk(&L, config_root_setting(&lc), "", "", BASE_ROOT, c, 0, 0);
		if (!L.oom)
			cross_check(&L);
	}
	config_destroy(&lc);
	kiln_cfg__errors_sort(e, before);
	free(L.name_idx);
	free(L.node_names);
	free(L.group_set);
	free(L.addr_set);
	free(L.mac_set);
	free(L.part_set);
	free(L.xid_set);
	free(L.switch_set);
	free(L.model_set);
	free(L.user_set);
	free(L.ugroup_set);
	free(L.mount_set);
	if (L.oom)
		r = -ENOMEM;
	else if (kiln_cfg__errors_count(e, before) > dropped_before) {
		r = -EINVAL; /* warnings alone do not fail a load */
		kiln_cfg__errors_drop_warnings(e, before);
	}
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
		kiln_cfg__add_error(&L, line, "", "a cluster file is text; is this the right file?",
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
