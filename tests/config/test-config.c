/* test-config.c — unit tests for libkiln-config: the schema table and its
 * defaults, the typed structs of both examples, each validator (message,
 * path and line), the bad-file corpus, the renderers against the golden
 * files, and robustness against mutated input.
 *
 * Runs from the repository root (as `make test` does) or from
 * $KILN_SRCDIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

/* clang-format off */
/* Line numbers matter: the validator cases below expect them. */
static const char *const BASE =
	/*  1 */ "cluster = { name = \"demo\"; domain = \"demo.kiln\"; };\n"
	/*  2 */ "network = { subnet = \"10.77.0.0/24\"; };\n"
	/*  3 */ "head = { hostname = \"head\"; address = \"10.77.0.1\"; };\n"
	/*  4 */ "node_groups = (\n"
	/*  5 */ "  {\n"
	/*  6 */ "    name = \"gpu\";\n"
	/*  7 */ "    hosts = \"node[01-03]\";\n"
	/*  8 */ "    addresses = \"10.77.0.11-10.77.0.13\";\n"
	/*  9 */ "    macs = [ \"52:54:00:77:00:11\", \"52:54:00:77:00:12\", \"52:54:00:77:00:13\" ];\n"
	/* 10 */ "    gpus = { model = \"NVIDIA H100 80GB HBM3\"; count = 4; };\n"
	/* 11 */ "    cpus = 2; sockets = 1; cores_per_socket = 2; threads_per_core = 1;\n"
	/* 12 */ "    memory_mb = 1000;\n"
	/* 13 */ "  }\n"
	/* 14 */ ");\n"
	/* 15 */ "slurm = {\n"
	/* 16 */ "  partitions = ( { name = \"gpu\"; nodes = \"node[01-03]\"; default = true; } );\n"
	/* 17 */ "};\n";
/* clang-format on */

static char *srcpath(const char *rel)
{
	const char *d = getenv("KILN_SRCDIR");
	char *p = NULL;
	assert_true(asprintf(&p, "%s/%s", d && d[0] ? d : ".", rel) > 0);
	return p;
}

/* BASE with the first occurrence of old replaced by new (old must occur). */
static char *edit(const char *old, const char *new)
{
	const char *at = strstr(BASE, old);
	assert_non_null(at);
	char *s = NULL;
	assert_true(asprintf(&s, "%.*s%s%s", (int) (at - BASE), BASE, new, at + strlen(old)) > 0);
	return s;
}

static char *format_errors(const kiln_cfg_errors *e)
{
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	for (size_t i = 0; i < e->n; i++)
		assert_int_equal(kiln_cfg_error_format(&e->v[i], &b), 0);
	if (e->n == 0)
		kiln_strbuf_append(&b, "");
	char *s = kiln_strbuf_steal(&b);
	kiln_strbuf_free(&b);
	return s;
}

/* ---- schema ---------------------------------------------------------- */

static void test_schema_table(void **state)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	assert_true(n > 80);
	for (size_t i = 0; i < n; i++) {
		/* unique */
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(s[i].path, s[j].path);
		assert_non_null(s[i].doc);
		assert_true(strlen(s[i].doc) > 3);
		/* every nested key has its container in the table, before it */
		const char *dot = strrchr(s[i].path, '.');
		if (dot) {
			char parent[128];
			size_t l = (size_t) (dot - s[i].path);
			memcpy(parent, s[i].path, l);
			parent[l] = 0;
			bool list = l > 2 && streq(parent + l - 2, "[]");
			if (list)
				parent[l - 2] = 0;
			bool found = false;
			for (size_t j = 0; j < i; j++)
				if (streq(s[j].path, parent)) {
					assert_int_equal(s[j].type,
							 list ? KILN_CFG_LIST : KILN_CFG_GROUP);
					found = true;
				}
			if (!found)
				fail_msg("key %s has no container %s before it", s[i].path, parent);
		}
		/* lowercase snake_case names */
		for (const char *p = s[i].path; *p; p++)
			assert_true((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
				    strchr("._[]", *p));
		if (s[i].type == KILN_CFG_ENUM)
			assert_non_null(s[i].choices);
		assert_non_null(kiln_cfg_type_to_string(s[i].type));
		/* required keys have no default */
		if (s[i].required)
			assert_null(s[i].def);
	}
}

static void test_docs_cover_schema(void **state)
{
	_cleanup_free_ char *path = srcpath("docs/config.md");
	_cleanup_free_ char *text = NULL;
	size_t len;
	assert_int_equal(kiln_read_file(path, 1 << 22, &text, &len), 0);
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	int missing = 0;
	for (size_t i = 0; i < n; i++) {
		char needle[160];
		snprintf(needle, sizeof(needle), "`%s`", s[i].path);
		if (!strstr(text, needle)) {
			print_error("docs/config.md does not document %s\n", s[i].path);
			missing++;
		}
	}
	assert_int_equal(missing, 0);
}

/* The default column of docs/config.md's tables is the schema's default,
 * written as `kiln show --defaults` prints it: `"10s"`, (derived), unset
 * or **required**. */
static void test_docs_defaults(void **state)
{
	_cleanup_free_ char *path = srcpath("docs/config.md");
	_cleanup_free_ char *text = NULL;
	size_t len;
	assert_int_equal(kiln_read_file(path, 1 << 22, &text, &len), 0);
	size_t n;
	int rows = 0, wrong = 0;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++) {
		char needle[160], want[300];
		snprintf(needle, sizeof(needle), "\n| `%s` | ", s[i].path);
		const char *row = strstr(text, needle);
		if (!row)
			continue; /* containers have a heading, not a row */
		rows++;
		const char *col = strchr(row + strlen(needle), '|'); /* after the type */
		assert_non_null(col);
		if (s[i].type == KILN_CFG_GROUP || s[i].type == KILN_CFG_LIST)
			snprintf(want, sizeof(want), "| |"); /* nested containers */
		else if (s[i].required)
			snprintf(want, sizeof(want), "| **required** |");
		else if (!s[i].def)
			snprintf(want, sizeof(want), "| unset |");
		else if (s[i].def[0] == '(')
			snprintf(want, sizeof(want), "| %s |", s[i].def);
		else
			snprintf(want, sizeof(want), "| `%s` |", s[i].def);
		if (!startswith(col, want)) {
			print_error("docs/config.md: %s: default should read %s\n", s[i].path,
				    want);
			wrong++;
		}
	}
	assert_true(rows > 90);
	assert_int_equal(wrong, 0);
}

/* A UTF-8 byte-order mark is skipped: the file loads, line numbers hold. */
static void test_bom(void **state)
{
	(void) state;
	_cleanup_free_ char *ok = NULL, *bad = NULL;
	assert_true(asprintf(&ok, "\xef\xbb\xbf%s", BASE) > 0);
	kiln_cfg *c = NULL;
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	assert_int_equal(kiln_cfg_load_string(ok, "bom.cfg", &c, &e), 0);
	assert_int_equal(e.n, 0);
	assert_int_equal(c->n_nodes, 3);
	kiln_cfg_free(c);
	c = NULL;
	_cleanup_free_ char *edited = edit("count = 4;", "count = 17;");
	assert_true(asprintf(&bad, "\xef\xbb\xbf%s", edited) > 0);
	assert_int_equal(kiln_cfg_load_string(bad, "bom.cfg", &c, &e), -EINVAL);
	assert_null(c);
	assert_int_equal(e.n, 1);
	assert_int_equal(e.v[0].line, 10);
	assert_string_equal(e.v[0].path, "node_groups[0].gpus.count");
	kiln_cfg_errors_free(&e);
}

/* Texts that end inside a token (a name, a number, a string, a comment)
 * are syntax errors, not reads past the end (ASan/valgrind/fuzz-config). */
static void test_truncated_text(void **state)
{
	(void) state;
	static const char *const texts[] = { "cluster",	    "x = 1; y-_*",   "x = 4294967300",
					     "x = \"abc\\", "x = 1; /* abc", "x = 1; # abc",
					     "x = 0x",	    "x = -",	     "x = 1.5e" };
	for (size_t i = 0; i < ARRAY_SIZE(texts); i++) {
		_cleanup_free_ char *t = strdup(texts[i]); /* exact size for the checkers */
		assert_non_null(t);
		kiln_cfg *c = NULL;
		kiln_cfg_errors e;
		kiln_cfg_errors_init(&e);
		assert_int_equal(kiln_cfg_load_string(t, "t.cfg", &c, &e), -EINVAL);
		assert_null(c);
		assert_true(e.n >= 1);
		kiln_cfg_errors_free(&e);
	}
}

static void test_defaults(void **state)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	assert_int_equal(kiln_cfg_load_string(BASE, "base.cfg", &c, &e), 0);
	assert_int_equal(e.n, 0);
	kiln_cfg_errors_free(&e);
	/* spot checks against the values the brief and docs promise */
	assert_int_equal(c->network.mtu, 1500);
	assert_string_equal(c->network.boot_interface, "eth0");
	assert_int_equal(c->network.gateway, c->head.address); /* derived */
	assert_int_equal(c->network.n_dns, 1);
	assert_int_equal(c->network.dns[0], c->head.address);
	assert_string_equal(c->slurm.cluster_name, "demo");
	assert_int_equal(c->slurm.control_port, 6817);
	assert_int_equal(c->slurm.slurmd_port, 6818);
	assert_true(c->slurm.slurmd_timeout_usec == 300 * KILN_USEC_PER_SEC);
	assert_non_null(c->slurm.extra);
	assert_null(c->slurm.extra[0]);
	assert_true(c->health.enabled);
	assert_true(c->health.interval_usec == 10 * KILN_USEC_PER_SEC);
	assert_true(c->health.recover_after_usec == 300 * KILN_USEC_PER_SEC);
	assert_int_equal(c->health.metrics_port, 9400);
	assert_string_equal(c->health.metrics_address, "0.0.0.0");
	assert_string_equal(c->health.nvml_library, "libnvidia-ml.so.1");
	assert_true(c->health.nvml_timeout_usec == 5 * KILN_USEC_PER_SEC);
	assert_true(c->health.drain);
	assert_int_equal(c->health.thresholds.temp_warn_c, 85);
	assert_int_equal(c->health.thresholds.remap_pending, KILN_ACTION_DRAIN);
	assert_int_equal(c->health.n_xids, 0);
	assert_true(c->health.active_interval_usec == 0);
	assert_true(c->health.memtest_fraction > 0.049 && c->health.memtest_fraction < 0.051);
	assert_string_equal(c->health.check_program, "/usr/local/libexec/kiln/health-check");
	assert_int_equal(c->launcher.port, 29500);
	assert_int_equal(c->launcher.nnodes_min, 1);
	assert_int_equal(c->launcher.nnodes_max, 1);
	assert_int_equal(c->launcher.nproc_per_node, 0);
	assert_int_equal(c->launcher.max_restarts, 3);
	assert_true(c->launcher.heartbeat_usec == KILN_USEC_PER_SEC);
	assert_true(c->launcher.dead_after_usec == 5 * KILN_USEC_PER_SEC);
	assert_true(c->launcher.last_call_usec == 10 * KILN_USEC_PER_SEC);
	assert_true(c->launcher.join_timeout_usec == 300 * KILN_USEC_PER_SEC);
	assert_true(c->launcher.grace_usec == 120 * KILN_USEC_PER_SEC);
	assert_int_equal(c->launcher.exclude_after_failures, 2);
	assert_true(c->launcher.prefix_output);
	assert_false(c->inference.enabled);
	assert_int_equal(c->inference.port, 8000);
	assert_int_equal(c->inference.kv_block_size, 16);
	assert_int_equal(c->inference.quant, KILN_QUANT_NONE);
	assert_null(c->inference.model);
	assert_string_equal(c->image.base, "bookworm");
	assert_string_equal(c->image.http_url, "http://10.77.0.1/kiln");
	assert_string_equal(c->image.kernel_cmdline, "");
	assert_true(c->slurm.partitions[0].max_time_usec == KILN_USEC_INFINITY);
	assert_int_equal(c->slurm.partitions[0].state, KILN_PART_UP);
}

/* The schema is the one source of defaults: every key with a default
 * written out (not derived, "(...)") holds exactly that value, parsed here
 * on its own, both in kiln_cfg_defaults() and in a loaded file that leaves
 * the key out.  A default written a second time somewhere (and drifting)
 * or overwritten after loading fails this; `kiln show --defaults` prints
 * the same k->def text. */
static const char *const MINIMAL =
	"cluster = { name = \"t\"; };\n"
	"network = { subnet = \"10.0.0.0/24\"; };\n"
	"head = { hostname = \"head\"; address = \"10.0.0.1\"; };\n"
	"node_groups = ( { name = \"g\"; hosts = \"n1\"; addresses = [ \"10.0.0.2\" ];\n"
	"  macs = [ \"52:54:00:00:00:02\" ]; } );\n"
	"slurm = { partitions = ( { name = \"p\"; nodes = \"n1\"; } ); };\n";

/* Checks the value of k stored at obj + k->offset against k->def. */
static void assert_default(const kiln_cfg_key *k, const void *obj)
{
	const void *f = (const char *) obj + k->offset;
	char d[256];
	size_t l = strlen(k->def);
	if (l >= 2 && k->def[0] == '"' && k->def[l - 1] == '"')
		snprintf(d, sizeof(d), "%.*s", (int) (l - 2), k->def + 1);
	else
		snprintf(d, sizeof(d), "%s", k->def);
	switch (k->type) {
	case KILN_CFG_INT: {
		int v;
		assert_int_equal(kiln_parse_int(d, INT_MIN, INT_MAX, &v), 0);
		if (*(const int *) f != v)
			fail_msg("%s: %d, the schema says %s", k->path, *(const int *) f, k->def);
		break;
	}
	case KILN_CFG_BOOL: {
		bool v;
		assert_int_equal(kiln_parse_bool(d, &v), 0);
		if (*(const bool *) f != v)
			fail_msg("%s: %d, the schema says %s", k->path, *(const bool *) f, k->def);
		break;
	}
	case KILN_CFG_DOUBLE: {
		double v;
		assert_int_equal(kiln_parse_double(d, &v), 0);
		if (*(const double *) f != v)
			fail_msg("%s: %g, the schema says %s", k->path, *(const double *) f,
				 k->def);
		break;
	}
	case KILN_CFG_DURATION: {
		uint64_t v;
		assert_int_equal(kiln_parse_duration(d, KILN_USEC_PER_SEC, &v), 0);
		if (*(const uint64_t *) f != v)
			fail_msg("%s: %llu usec, the schema says %s", k->path,
				 (unsigned long long) *(const uint64_t *) f, k->def);
		break;
	}
	case KILN_CFG_SIZE_MB: {
		uint64_t v;
		assert_int_equal(kiln_parse_size(d, 1024 * 1024, &v), 0);
		if (*(const uint64_t *) f != v / (1024 * 1024))
			fail_msg("%s: %llu MiB, the schema says %s", k->path,
				 (unsigned long long) *(const uint64_t *) f, k->def);
		break;
	}
	case KILN_CFG_STRING:
	case KILN_CFG_PATH: {
		const char *v = *(char *const *) f;
		if (!v || !streq(v, d))
			fail_msg("%s: \"%s\", the schema says %s", k->path, strempty(v), k->def);
		break;
	}
	case KILN_CFG_ENUM: {
		int v = -1;
		for (int i = 0; k->choices[i]; i++)
			if (streq(k->choices[i], d))
				v = i;
		assert_true(v >= 0);
		if (*(const int *) f != v)
			fail_msg("%s: %d, the schema says %s", k->path, *(const int *) f, k->def);
		break;
	}
	case KILN_CFG_STRV:
		assert_string_equal(d, "[]");
		assert_non_null(*(char **const *) f);
		assert_null((*(char **const *) f)[0]);
		break;
	case KILN_CFG_NNODES: {
		int lo, hi;
		assert_int_equal(sscanf(d, "%d:%d", &lo, &hi), 2);
		assert_int_equal(((const int *) f)[0], lo);
		assert_int_equal(((const int *) f)[1], hi);
		break;
	}
	case KILN_CFG_NPROC:
		assert_string_equal(d, "gpu"); /* stored as 0 */
		assert_int_equal(*(const int *) f, 0);
		break;
	default:
		fail_msg("%s: default of type %s not checked", k->path,
			 kiln_cfg_type_to_string(k->type));
	}
}

static void test_schema_defaults(void **state)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *d = NULL, *c = NULL;
	assert_int_equal(kiln_cfg_defaults(&d), 0);
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	/* one element of each list of accounts and mounts, with only its
	 * required keys */
	_cleanup_free_ char *accounts = NULL;
	assert_true(asprintf(&accounts,
			     "%susers = ( { name = \"u\"; uid = 2000; } );\n"
			     "groups = ( { name = \"g\"; gid = 3000; } );\n"
			     "mounts = ( { what = \"head:/x\"; where = \"/x\"; } );\n",
			     MINIMAL) > 0);
	if (kiln_cfg_load_string(accounts, "minimal.cfg", &c, &e) < 0)
		kiln_cfg_errors_print(&e, stderr);
	kiln_cfg_errors_free(&e);
	assert_non_null(c);
	assert_int_equal(c->n_groups, 1);
	assert_int_equal(c->slurm.n_partitions, 1);
	assert_int_equal(c->n_users, 1);
	assert_int_equal(c->n_unix_groups, 1);
	assert_int_equal(c->n_mounts, 1);

	size_t n, checked = 0;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	for (size_t i = 0; i < n; i++) {
		if (!s[i].def || s[i].def[0] == '(')
			continue; /* none, or derived from other keys */
		if (startswith(s[i].path, "node_groups[].")) {
			assert_default(&s[i], &c->groups[0]);
		} else if (startswith(s[i].path, "slurm.partitions[].")) {
			assert_default(&s[i], &c->slurm.partitions[0]);
		} else if (startswith(s[i].path, "users[].")) {
			assert_default(&s[i], &c->users[0]);
		} else if (startswith(s[i].path, "groups[].")) {
			assert_default(&s[i], &c->unix_groups[0]);
		} else if (startswith(s[i].path, "mounts[].")) {
			assert_default(&s[i], &c->mounts[0]);
		} else {
			assert_false(strchr(s[i].path, '[')); /* no other list has defaults */
			assert_default(&s[i], d);
			assert_default(&s[i], c);
		}
		checked++;
	}
	assert_true(checked > 70);

	/* Nothing else in the defaults-only cfg: no nodes, no derived values. */
	assert_int_equal(d->n_nodes, 0);
	assert_int_equal(d->n_groups, 0);
	assert_null(d->cluster.name);
	assert_null(d->slurm.cluster_name);
	assert_null(d->image.http_url);
	assert_int_equal(d->network.gateway, 0);
}

/* ---- the examples ---------------------------------------------------- */

static kiln_cfg *load_example(const char *name)
{
	_cleanup_free_ char *rel = NULL;
	assert_true(asprintf(&rel, "config/examples/%s", name) > 0);
	_cleanup_free_ char *path = srcpath(rel);
	kiln_cfg *c = NULL;
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	int r = kiln_cfg_load(path, &c, &e);
	if (r < 0)
		kiln_cfg_errors_print(&e, stderr);
	kiln_cfg_errors_free(&e);
	assert_int_equal(r, 0);
	/* golden headers name the file as given on the command line */
	free(c->path);
	c->path = strdup(rel);
	return c;
}

static void test_demo(void **state)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = load_example("demo.cfg");
	char b[18];
	assert_string_equal(c->cluster.name, "demo");
	assert_string_equal(c->cluster.domain, "demo.kiln");
	assert_string_equal(kiln_format_ipv4(b, c->network.subnet), "10.77.0.0");
	assert_int_equal(c->network.prefix, 24);
	assert_int_equal(c->network.netmask, 0xffffff00u);
	assert_string_equal(c->head.hostname, "head");
	assert_string_equal(kiln_format_ipv4(b, c->head.address), "10.77.0.1");
	assert_int_equal(c->n_groups, 1);
	assert_int_equal(c->n_nodes, 3);
	const kiln_cfg_group *g = &c->groups[0];
	assert_string_equal(g->hosts, "node[01-03]");
	assert_int_equal(g->n_hosts, 3);
	assert_string_equal(g->gpu_model, "NVIDIA H100 80GB HBM3");
	assert_string_equal(g->gpu_type, "h100");
	assert_int_equal(g->gpu_count, 4);
	assert_int_equal(g->cpus, 2);
	assert_int_equal(g->sockets, 1);
	assert_int_equal(g->cores_per_socket, 2);
	assert_int_equal(g->threads_per_core, 1);
	assert_int_equal(g->memory_mb, 1000);
	for (size_t i = 0; i < 3; i++) {
		const kiln_cfg_node *n = &c->nodes[i];
		char name[16], addr[16], mac[18];
		snprintf(name, sizeof(name), "node%02zu", i + 1);
		snprintf(addr, sizeof(addr), "10.77.0.%zu", 11 + i);
		snprintf(mac, sizeof(mac), "52:54:00:77:00:%02zu", 11 + i);
		assert_string_equal(n->name, name);
		assert_string_equal(kiln_format_ipv4(b, n->address), addr);
		assert_string_equal(kiln_format_mac(b, n->mac), mac);
		assert_ptr_equal(n->group, g);
		assert_int_equal(n->index_in_group, i);
		assert_string_equal(n->partitions[0], "gpu");
		assert_null(n->partitions[1]);
		assert_false(n->inference);
		assert_ptr_equal(kiln_cfg_find_node(c, name), n);
		assert_ptr_equal(kiln_cfg_find_node_by_mac(c, n->mac), n);
	}
	assert_null(kiln_cfg_find_node(c, "node04"));
	assert_null(kiln_cfg_find_node(c, "head"));
	assert_int_equal(c->slurm.n_partitions, 1);
	const kiln_cfg_partition *p = kiln_cfg_find_partition(c, "gpu");
	assert_non_null(p);
	assert_true(p->is_default);
	assert_int_equal(p->n_members, 3);
	assert_null(kiln_cfg_find_partition(c, "train"));
	assert_int_equal(c->health.metrics_port, 9400);
}

static void test_dgx_pod(void **state)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = load_example("dgx-pod.cfg");
	char b[18];
	assert_int_equal(c->n_nodes, 32);
	assert_int_equal(c->groups[0].gpu_count, 8);
	assert_int_equal(c->groups[0].cpus, 224);
	assert_int_equal(c->groups[0].memory_mb, 2u * 1024 * 1024);
	assert_string_equal(c->nodes[31].name, "dgx32");
	assert_string_equal(kiln_format_ipv4(b, c->nodes[31].address), "10.40.1.32");
	const kiln_cfg_partition *train = kiln_cfg_find_partition(c, "train");
	const kiln_cfg_partition *infer = kiln_cfg_find_partition(c, "infer");
	assert_non_null(train);
	assert_non_null(infer);
	assert_int_equal(train->n_members, 24);
	assert_int_equal(infer->n_members, 8);
	assert_true(train->max_time_usec == 7ULL * 24 * 3600 * KILN_USEC_PER_SEC);
	assert_true(infer->max_time_usec == KILN_USEC_INFINITY);
	assert_string_equal(infer->extra, "OverSubscribe=NO");
	/* inference runs exactly on the infer partition */
	for (size_t i = 0; i < c->n_nodes; i++)
		assert_int_equal(c->nodes[i].inference, i >= 24);
	assert_int_equal(kiln_cfg_xid_action(c, 79, KILN_ACTION_DRAIN), KILN_ACTION_REBOOT);
	assert_int_equal(kiln_cfg_xid_action(c, 13, KILN_ACTION_DRAIN), KILN_ACTION_APP);
	assert_int_equal(kiln_cfg_xid_action(c, 31, KILN_ACTION_IGNORE), KILN_ACTION_IGNORE);
	assert_int_equal(c->launcher.nnodes_min, 2);
	assert_int_equal(c->launcher.nnodes_max, 24);
	assert_true(c->health.active_interval_usec == 24ULL * 3600 * KILN_USEC_PER_SEC);
	assert_int_equal(c->network.mtu, 9000);
	assert_string_equal(kiln_format_ipv4(b, c->network.gateway), "10.40.0.254");
	assert_string_equal(c->image.packages[1], "rdma-core");
	assert_null(c->image.packages[2]);
	assert_string_equal(c->slurm.extra[0], "SchedulerParameters=bf_continue,bf_window=10080");
	/* MACs are distinct and found again by MAC */
	for (size_t i = 0; i < c->n_nodes; i++)
		assert_ptr_equal(kiln_cfg_find_node_by_mac(c, c->nodes[i].mac), &c->nodes[i]);
}

/* ---- validators ------------------------------------------------------ */

typedef struct vcase {
	const char *old, *new;
	const char *expect; /* the exact first error line, without "v.cfg:" */
} vcase;

#define H_DNS                                                                              \
	"; use dot-separated labels of 1 to 63 letters, digits and '-', none starting or " \
	"ending with '-'"
#define H_HOST "; use 1 to 63 lowercase letters, digits and '-', not starting or ending with '-'"
#define T32(line, lit)                                                                          \
	line ": integer " lit " does not fit in 32 bits; write " lit "L (without the L suffix " \
	     "libconfig cuts it to 32 bits)"
static const vcase vcases[] = {
	{ "memory_mb = 1000;", "memory_mb = 1000; memroy_mb = 1;",
	  "12: node_groups[0].memroy_mb: unknown setting; did you mean 'memory_mb'?" },
	{ "cpus = 2;", "cpus = \"2\";",
	  "11: node_groups[0].cpus: expected an integer, got a string" },
	{ "    hosts = \"node[01-03]\";\n", "",
	  "5: node_groups[0].hosts: missing required setting; add hosts = \"node[01-03]\";" },
	{ "count = 4;", "count = 17;", "10: node_groups[0].gpus.count: 17 is out of range 0..16" },
	{ "count = 4;", "count = 16;", NULL },
	{ "count = 4;", "count = 0;", NULL },
	{ "\"52:54:00:77:00:12\"", "\"52:54:00:77:00\"",
	  "9: node_groups[0].macs[1]: malformed MAC address \"52:54:00:77:00\"; write it like "
	  "\"52:54:00:12:34:56\"" },
	{ "\"52:54:00:77:00:13\"", "\"52:54:00:77:00:11\"",
	  "9: node_groups[0].macs[2]: duplicate MAC 52:54:00:77:00:11 (also node01)" },
	{ "\"52:54:00:77:00:13\"", "\"52-54-00-77-00-AB\"", NULL },
	{ ", \"52:54:00:77:00:13\" ]", " ]",
	  "9: node_groups[0].macs: 2 MACs for 3 hosts; give exactly one MAC per host, in host "
	  "order" },
	{ "10.77.0.11-10.77.0.13", "10.77.0.11-10.77.0.12",
	  "8: node_groups[0].addresses: range \"10.77.0.11-10.77.0.12\" has 2 addresses for 3 "
	  "hosts" },
	{ "\"10.77.0.11-10.77.0.13\"", "[ \"10.77.0.11\", \"10.77.1.12\", \"10.77.0.13\" ]",
	  "8: node_groups[0].addresses[1]: address 10.77.1.12 is outside the subnet 10.77.0.0/24" },
	{ "\"10.77.0.11-10.77.0.13\"", "[ \"10.77.0.11\", \"10.77.0.11\", \"10.77.0.13\" ]",
	  "8: node_groups[0].addresses: duplicate address 10.77.0.11 (node01 and node02)" },
	{ "node[01-03]\"; default", "node[01-04]\"; default",
	  "16: slurm.partitions[0].nodes: unknown node \"node04\"; did you mean 'node01'?" },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-03\";",
	  "7: node_groups[0].hosts: malformed hostlist \"node[01-03\" at offset 10; write it like "
	  "\"node[01-16,20]\"" },
	{ "memory_mb = 1000;", "memory_mb = \"1.5x\";",
	  "12: node_groups[0].memory_mb: malformed size \"1.5x\"; write it like \"512G\", \"2T\" "
	  "or an integer number of MiB" },
	{ "memory_mb = 1000;", "memory_mb = \"1G\";", NULL },
	/* memory_mb: at most KILN_CFG_MEMORY_MB_MAX (64 TiB) */
	{ "memory_mb = 1000;", "memory_mb = \"64T\";", NULL },
	{ "memory_mb = 1000;", "memory_mb = 67108864;", NULL },
	{ "memory_mb = 1000;", "memory_mb = 67108865;",
	  "12: node_groups[0].memory_mb: 67108865 MiB is more than the limit of 67108864 MiB (64 "
	  "TiB); memory_mb is in MiB (2 TiB is 2097152 or \"2T\"); no server has more than 64 "
	  "TiB" },
	{ "memory_mb = 1000;", "memory_mb = \"1P\";",
	  "12: node_groups[0].memory_mb: 1073741824 MiB is more than the limit of 67108864 MiB (64 "
	  "TiB); memory_mb is in MiB (2 TiB is 2097152 or \"2T\"); no server has more than 64 "
	  "TiB" },
	{ "default = true;", "default = true; max_time = \"1 week\";",
	  "16: slurm.partitions[0].max_time: malformed duration \"1 week\"; write it like \"90s\", "
	  "\"5m\", \"1h30m\" or "
	  "\"infinite\"" },
	{ "subnet = \"10.77.0.0/24\";", "subnet = \"10.77.0.0/24\"; mtu = 100;",
	  "2: network.mtu: 100 is out of range 576..9216" },
	{ "hostname = \"head\";", "hostname = \"node02\";",
	  "7: node_groups[0].hosts: host name \"node02\" is also the head node's" },
	{ "cpus = 2;", "", NULL }, /* derived: 1 x 2 x 1 */
	{ "cpus = 2;", "cpus = 5;",
	  "11: node_groups[0].cpus: 5 CPUs do not match 1 sockets x 2 cores x 1 threads; Slurm "
	  "needs cpus = sockets x "
	  "cores_per_socket x threads_per_core" },
	{ "name = \"demo\";", "name = \"Demo\";",
	  "1: cluster.name: invalid cluster name \"Demo\"; use 1 to 63 lowercase letters, digits, "
	  "'-' and '_'" },
	{ "name = \"demo\";",
	  "name = \""
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\";",
	  NULL }, /* 63 characters */
	{ "name = \"demo\";",
	  "name = \""
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\";",
	  "1: cluster.name: invalid cluster name "
	  "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"; use 1 to 63 "
	  "lowercase letters, digits, '-' and '_'" },
	{ "\"52:54:00:77:00:12\"", "\"ff:ff:ff:ff:ff:ff\"",
	  "9: node_groups[0].macs[1]: MAC address \"ff:ff:ff:ff:ff:ff\" is multicast or broadcast, "
	  "not a NIC's; give the node's boot NIC address (ip link shows it)" },
	{ "\"52:54:00:77:00:12\"", "\"01:00:5e:00:00:01\"",
	  "9: node_groups[0].macs[1]: MAC address \"01:00:5e:00:00:01\" is multicast or broadcast, "
	  "not a NIC's; give the node's boot NIC address (ip link shows it)" },
	{ "\"52:54:00:77:00:12\"", "\"00:00:00:00:00:00\"",
	  "9: node_groups[0].macs[1]: MAC address \"00:00:00:00:00:00\" is all zero, not a NIC's; "
	  "give the node's boot NIC address (ip link shows it)" },
	{ "\"52:54:00:77:00:12\"", "\"02:00:00:00:00:00\"", NULL }, /* locally administered */
	/* libconfig 1.5 would read 4294967300 as 4 and 0x80000000 as negative */
	{ "count = 4;", "count = 4294967300;", T32("10", "4294967300") },
	{ "count = 4;", "count = 0x80000000;", T32("10", "0x80000000") },
	{ "count = 4;", "count = -2147483649;", T32("10", "-2147483649") },
	{ "count = 4;", "count = 4294967300L;",
	  "10: node_groups[0].gpus.count: 4294967300 is out of range 0..16" },
	{ "count = 4;", "count = 0x7fffffff;",
	  "10: node_groups[0].gpus.count: 2147483647 is out of range 0..16" },
	{ "count = 4;", "count = -2147483648;",
	  "10: node_groups[0].gpus.count: -2147483648 is out of range 0..16" },
	{ "count = 4;", "count = 4; /* 4294967300\n 0x80000000 */ # 99999999999\n// 99999999999\n",
	  NULL },
	{ "count = 4;", "count = 4; type = \"h4294967300\\\" 4294967300\"; ",
	  "10: node_groups[0].gpus.type: invalid character '\"' in \"h4294967300\" "
	  "4294967300\"" },
	{ "memory_mb = 1000;", "memory_mb = 4194304; x1e99999999999 = 1.5e99999999999;",
	  "12: node_groups[0].x1e99999999999: unknown setting" },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],NODE01\";",
	  "7: node_groups[0].hosts: host name \"NODE01\" differs from \"node01\" (node_groups[0], "
	  "line 7) only in case; DNS and /etc/hosts ignore case; rename one of them" },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],Head\";",
	  "7: node_groups[0].hosts: host name \"Head\" differs from the head node's \"head\" only "
	  "in case; DNS and /etc/hosts ignore case; rename one of them" },
	{ "nodes = \"node[01-03]\";", "nodes = \"node[01-02],NODE03\";",
	  "16: slurm.partitions[0].nodes: unknown node \"NODE03\"; did you mean 'node03'?" },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],Node03\";",
	  "7: node_groups[0].hosts: host name \"Node03\" is not a valid DNS label" H_HOST "\n"
	  "v.cfg:16: slurm.partitions[0].nodes: unknown node \"node03\"; did you mean 'Node03'?" },
	/* host names are RFC 1123 labels: lowercase letters, digits, '-' */
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],node_03\";",
	  "7: node_groups[0].hosts: host name \"node_03\" is not a valid DNS label" H_HOST },
	{ "hosts = \"node[01-03]\";", "hosts = \"NODE[01-03]\";",
	  "7: node_groups[0].hosts: host name \"NODE01\" is not a valid DNS label (and 2 more "
	  "in this group)" H_HOST },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],node03-\";",
	  "7: node_groups[0].hosts: host name \"node03-\" is not a valid DNS label" H_HOST },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],-node03\";",
	  "7: node_groups[0].hosts: host name \"-node03\" is not a valid DNS label" H_HOST },
	{ "hostname = \"head\";",
	  "hostname = \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-9\";",
	  NULL }, /* 63 characters */
	{ "hostname = \"head\";", "hostname = \"Head\";",
	  "3: head.hostname: host name \"Head\" is not a valid DNS label" H_HOST },
	{ "hostname = \"head\";", "hostname = \"head_1\";",
	  "3: head.hostname: host name \"head_1\" is not a valid DNS label" H_HOST },
	{ "hostname = \"head\";", "hostname = \"head-1\";", NULL },
	{ "hosts = \"node[01-03]\";", "hosts = \"node[01-02],node01\";",
	  "7: node_groups[0].hosts: duplicate host name \"node01\" (also in node_groups[0], line "
	  "7); a host belongs to exactly one group, once" },
	{ "domain = \"demo.kiln\";", "domain = \"-bad..kiln\";",
	  "1: cluster.domain: invalid DNS domain \"-bad..kiln\"" H_DNS },
	{ "domain = \"demo.kiln\";", "domain = \"demo.kiln.\";",
	  "1: cluster.domain: invalid DNS domain \"demo.kiln.\"" H_DNS },
	{ "domain = \"demo.kiln\";", "domain = \"demo-.kiln\";",
	  "1: cluster.domain: invalid DNS domain \"demo-.kiln\"" H_DNS },
	{ "domain = \"demo.kiln\";",
	  "domain = \"a.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\";",
	  "1: cluster.domain: invalid DNS domain "
	  "\"a.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" H_DNS },
	/* ^ a 64-character label */
	{ "domain = \"demo.kiln\";", "domain = \"Pod-1.Example.com\";", NULL },
	{ "domain = \"demo.kiln\";", "domain = \"x\";", NULL },
	{ "cluster = {", "cluster = { @include \"x\";",
	  "1: syntax error; look for a missing ';', quote or bracket here or just above" },
};

static void test_validators(void **state)
{
	for (size_t i = 0; i < ARRAY_SIZE(vcases); i++) {
		_cleanup_free_ char *text = edit(vcases[i].old, vcases[i].new);
		kiln_cfg *c = NULL;
		kiln_cfg_errors e;
		kiln_cfg_errors_init(&e);
		int r = kiln_cfg_load_string(text, "v.cfg", &c, &e);
		_cleanup_free_ char *got = format_errors(&e);
		if (!vcases[i].expect) {
			if (r != 0)
				fail_msg("case %zu: expected success, got:\n%s", i, got);
			assert_non_null(c);
			kiln_cfg_free(c);
		} else {
			char want[512];
			snprintf(want, sizeof(want), "v.cfg:%s\n", vcases[i].expect);
			if (r != -EINVAL || e.n < 1 || strncmp(got, want, strlen(want)) != 0)
				fail_msg("case %zu: r=%d\nwant: %sgot:  %s", i, r, want, got);
			assert_null(c);
		}
		kiln_cfg_errors_free(&e);
	}
}

/* Every error is collected, not just the first. */
static void test_collects_all(void **state)
{
	_cleanup_free_ char *t1 = edit("count = 4;", "count = 99;");
	_cleanup_free_ char *t2 = NULL;
	{
		const char *at = strstr(t1, "cpus = 2;");
		assert_true(asprintf(&t2,
				     "%.*scpus = true;%s\nbogus = 1;\nhealth = { intervall = "
				     "\"1s\"; };\n",
				     (int) (at - t1), t1, at + 9) > 0);
	}
	kiln_cfg *c = NULL;
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	assert_int_equal(kiln_cfg_load_string(t2, "m.cfg", &c, &e), -EINVAL);
	assert_int_equal(e.n, 4);
	/* in file order */
	for (size_t i = 1; i < e.n; i++)
		assert_true(e.v[i - 1].line <= e.v[i].line);
	assert_string_equal(e.v[3].path, "health.intervall");
	assert_string_equal(e.v[3].hint, "did you mean 'interval'?");
	kiln_cfg_errors_free(&e);
}

static void test_error_cap(void **state)
{
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_strbuf_append(&b, BASE);
	for (int i = 0; i < 1000; i++)
		kiln_strbuf_printf(&b, "junk%d = %d;\n", i, i);
	_cleanup_free_ char *text = kiln_strbuf_steal(&b);
	kiln_strbuf_free(&b);
	kiln_cfg *c = NULL;
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	assert_int_equal(kiln_cfg_load_string(text, "cap.cfg", &c, &e), -EINVAL);
	assert_int_equal(e.n, KILN_CFG_ERRORS_MAX);
	assert_int_equal(e.dropped, 1000 - KILN_CFG_ERRORS_MAX);
	kiln_cfg_errors_free(&e);
	/* errs may be NULL: only the status */
	assert_int_equal(kiln_cfg_load_string(text, "cap.cfg", &c, NULL), -EINVAL);
	assert_int_equal(kiln_cfg_load_string(BASE, "ok.cfg", &c, NULL), 0);
	kiln_cfg_free(c);
	assert_int_equal(kiln_cfg_load("/nonexistent/kiln.cfg", &c, NULL), -ENOENT);
}

/* Every file in tests/config/bad/ gives exactly its .expected lines. */
static void test_bad_corpus(void **state)
{
	_cleanup_free_ char *dir = srcpath("tests/config/bad");
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *de;
	int count = 0;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (l < 5 || !streq(de->d_name + l - 4, ".cfg"))
			continue;
		_cleanup_free_ char *rel = NULL, *path = NULL, *exp_path = NULL, *expected = NULL;
		assert_true(asprintf(&rel, "tests/config/bad/%s", de->d_name) > 0);
		path = srcpath(rel);
		assert_true(asprintf(&exp_path, "%.*s.expected", (int) (strlen(path) - 4), path) >
			    0);
		size_t len;
		assert_int_equal(kiln_read_file(exp_path, 1 << 20, &expected, &len), 0);
		/* the expected lines name the file as the CLI test runs it */
		_cleanup_free_ char *text = NULL;
		assert_int_equal(kiln_read_file(path, 1 << 20, &text, &len), 0);
		/* A string ends at its first NUL, so only kiln_cfg_load() can see
		 * one: nul-byte.cfg is checked through it by test-kiln-cli.sh. */
		if (memchr(text, 0, len))
			continue;
		kiln_cfg *c = NULL;
		kiln_cfg_errors e;
		kiln_cfg_errors_init(&e);
		int r = kiln_cfg_load_string(text, rel, &c, &e);
		_cleanup_free_ char *got = format_errors(&e);
		/* warn-*.cfg: only warnings, so the file loads */
		bool warn = strstr(rel, "/warn-") != NULL;
		if (r == 0)
			kiln_cfg_free(c);
		if (r != (warn ? 0 : -EINVAL) || !streq(got, expected))
			fail_msg("%s: r=%d\nexpected:\n%sgot:\n%s", rel, r, expected, got);
		kiln_cfg_errors_free(&e);
		count++;
	}
	closedir(d);
	assert_true(count >= 30);
}

/* ---- renderers ------------------------------------------------------- */

/* A KILN_CFG_RENDER_FILES target (mounts): each file of the text against
 * golden/EX/TARGET/NAME, as `render all` writes them. */
static void check_golden_files(const kiln_cfg *c, const char *ex, const char *target)
{
	_cleanup_free_ char *out = NULL;
	assert_int_equal(kiln_cfg_render(c, target, NULL, &out), 0);
	const size_t ml = strlen(KILN_CFG_RENDER_FILE_MARK);
	for (const char *p = strstr(out, KILN_CFG_RENDER_FILE_MARK); p;) {
		const char *name = p + ml, *nl = strchr(name, '\n');
		assert_non_null(nl);
		const char *next = strstr(nl + 1, "\n" KILN_CFG_RENDER_FILE_MARK);
		size_t blen = next ? (size_t) (next + 1 - (nl + 1)) : strlen(nl + 1);
		_cleanup_free_ char *rel = NULL, *path = NULL, *want = NULL;
		assert_true(asprintf(&rel, "tests/config/golden/%s/%s/%.*s", ex, target,
				     (int) (nl - name), name) > 0);
		path = srcpath(rel);
		size_t len;
		assert_int_equal(kiln_read_file(path, 1 << 22, &want, &len), 0);
		if (len != blen || memcmp(want, nl + 1, blen) != 0)
			fail_msg("%s differs from the render:\n%.*s", rel, (int) blen, nl + 1);
		p = next ? next + 1 : NULL;
	}
}

static void check_golden(const kiln_cfg *c, const char *ex, const char *target, const char *node)
{
	_cleanup_free_ char *out = NULL, *rel = NULL, *path = NULL, *want = NULL;
	const kiln_cfg_render_target *t = kiln_cfg_render_target_find(target);
	if (t && (t->flags & KILN_CFG_RENDER_FILES)) {
		check_golden_files(c, ex, target);
		return;
	}
	assert_int_equal(kiln_cfg_render(c, target, node, &out), 0);
	const kiln_cfg_node *n = node ? kiln_cfg_find_node(c, node) : NULL;
	if (node && (t->flags & KILN_CFG_RENDER_BY_MAC)) {
		const uint8_t *m = n->mac;
		assert_true(asprintf(&rel,
				     "tests/config/golden/%s/ipxe/%02x-%02x-%02x-%02x-%02x-%02x",
				     ex, m[0], m[1], m[2], m[3], m[4], m[5]) > 0);
	} else if (node)
		assert_true(asprintf(&rel, "tests/config/golden/%s/%s/%s", ex, target, node) > 0);
	else
		assert_true(asprintf(&rel, "tests/config/golden/%s/%s", ex, target) > 0);
	path = srcpath(rel);
	size_t len;
	assert_int_equal(kiln_read_file(path, 1 << 22, &want, &len), 0);
	if (!streq(out, want))
		fail_msg("%s differs from the render:\n%s", rel, out);
	/* a pure function: a second render is byte-identical */
	_cleanup_free_ char *again = NULL;
	assert_int_equal(kiln_cfg_render(c, target, node, &again), 0);
	assert_string_equal(out, again);
}

static void test_render_golden(void **state)
{
	const char *examples[] = { "demo", "dgx-pod" };
	for (size_t x = 0; x < ARRAY_SIZE(examples); x++) {
		_cleanup_free_ char *file = NULL;
		assert_true(asprintf(&file, "%s.cfg", examples[x]) > 0);
		_cleanup_(kiln_cfg_freep) kiln_cfg *c = load_example(file);
		for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++) {
			if (!(t->flags & KILN_CFG_RENDER_PER_NODE)) {
				check_golden(c, examples[x], t->name, NULL);
				continue;
			}
			for (size_t i = 0; i < c->n_nodes; i++)
				check_golden(c, examples[x], t->name, c->nodes[i].name);
			if (!(t->flags & KILN_CFG_RENDER_BY_MAC)) /* the head does not PXE-boot */
				check_golden(c, examples[x], t->name, c->head.hostname);
		}
	}
}

/* DefMemPerGPU/DefCpuPerGPU: the GPU group with the least per GPU; keys
 * override; a 1-socket group gets no Cores=. */
/* The one table of targets: every row complete, names unique, the secret
 * written 0600, and kiln_cfg_render() refusing what the table does not
 * allow. */
static void test_render_targets_table(void **state)
{
	size_t n = 0, per_node = 0, slurm = 0;
	for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++, n++) {
		assert_non_null(t->summary);
		assert_non_null(t->render);
		assert_true(t->mode == 0644 || t->mode == 0600);
		assert_ptr_equal(kiln_cfg_render_target_find(t->name), t);
		per_node += !!(t->flags & KILN_CFG_RENDER_PER_NODE);
		slurm += !!(t->flags & KILN_CFG_RENDER_SLURM);
	}
	assert_true(n <= KILN_CFG_RENDER_TARGETS_MAX);
	assert_int_equal(per_node, 2); /* node-env, node.ipxe */
	assert_int_equal(slurm, 4);
	assert_string_equal(kiln_cfg_render_targets[0].name, "slurm.conf"); /* kiln apply's first */
	assert_int_equal(kiln_cfg_render_target_find("slurmdbd.conf")->mode, 0600);
	assert_null(kiln_cfg_render_target_find("nope.conf"));
	assert_null(kiln_cfg_render_target_find(NULL));
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = load_example("demo.cfg");
	char *out = NULL;
	assert_int_equal(kiln_cfg_render(c, "nope.conf", NULL, &out), -EINVAL);
	assert_int_equal(kiln_cfg_render(c, "node-env", NULL, &out), -EINVAL);
	assert_null(out);
}

/* The inference partitions closed to users: a partition holding an
 * inference node gets AllowGroups= (root by default, [] too, the groups of
 * inference.allow_groups), others none, [ "ALL" ] none. */
static void test_render_allow_groups(void **state)
{
	static const char *const infer =
		"cluster = { name = \"demo\"; };\n"
		"network = { subnet = \"10.77.0.0/24\"; };\n"
		"head = { hostname = \"head\"; address = \"10.77.0.1\"; };\n"
		"node_groups = ( { name = \"gpu\"; hosts = \"node[01-03]\";\n"
		"  addresses = \"10.77.0.11-10.77.0.13\";\n"
		"  macs = [ \"52:54:00:77:00:11\", \"52:54:00:77:00:12\", \"52:54:00:77:00:13\" "
		"];\n"
		"  gpus = { model = \"NVIDIA H100 80GB HBM3\"; count = 4; }; } );\n"
		"slurm = { partitions = ( { name = \"gpu\"; nodes = \"node[01-02]\"; default = "
		"true; },\n"
		"  { name = \"infer\"; nodes = \"node03\"; } ); };\n"
		"inference = { enabled = true; model = \"/dev/null\"; nodes = \"infer\"; %s };\n";
	static const struct {
		const char *keys, *want;
	} cases[] = {
		{ "", " State=UP AllowGroups=root\n" },
		{ "allow_groups = [ ];", " State=UP AllowGroups=root\n" },
		{ "allow_groups = [ \"root\", \"inferops\" ];",
		  " State=UP AllowGroups=root,inferops\n" },
		{ "allow_groups = [ \"ALL\" ];", " State=UP\n" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		_cleanup_free_ char *text = NULL, *slurm = NULL, *want = NULL;
		_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
		assert_true(asprintf(&text, infer, cases[i].keys) > 0);
		kiln_cfg_errors e;
		kiln_cfg_errors_init(&e);
		if (kiln_cfg_load_string(text, "infer.cfg", &c, &e) < 0)
			kiln_cfg_errors_print(&e, stderr);
		kiln_cfg_errors_free(&e);
		assert_non_null(c);
		assert_int_equal(kiln_cfg_render(c, "slurm.conf", NULL, &slurm), 0);
		assert_true(asprintf(&want,
				     "\nPartitionName=infer Nodes=node03 Default=NO "
				     "MaxTime=UNLIMITED%s",
				     cases[i].want) > 0);
		if (!strstr(slurm, want))
			fail_msg("case %zu (%s): no '%s' in\n%s", i, cases[i].keys, want, slurm);
		/* the users' partition stays open */
		assert_non_null(strstr(slurm, "\nPartitionName=gpu Nodes=node[01-02] Default=YES "
					      "MaxTime=UNLIMITED State=UP\n"));
	}
}

static void test_render_per_gpu_defaults(void **state)
{
	static const char *const two =
		"cluster = { name = \"demo\"; domain = \"demo.kiln\"; };\n"
		"network = { subnet = \"10.77.0.0/24\"; };\n"
		"head = { hostname = \"head\"; address = \"10.77.0.1\"; };\n"
		"node_groups = (\n"
		"  { name = \"a\"; hosts = \"a01\"; addresses = [ \"10.77.0.11\" ];\n"
		"    macs = [ \"52:54:00:77:00:11\" ]; partitions = [ \"p\" ];\n"
		"    gpus = { model = \"NVIDIA H100 80GB HBM3\"; count = 8; };\n"
		"    sockets = 2; cores_per_socket = 32; memory_mb = 1024000; },\n"
		"  { name = \"b\"; hosts = \"b01\"; addresses = [ \"10.77.0.12\" ];\n"
		"    macs = [ \"52:54:00:77:00:12\" ]; partitions = [ \"p\" ];\n"
		"    gpus = { model = \"NVIDIA H100 80GB HBM3\"; count = 4; };\n"
		"    cores_per_socket = 48; memory_mb = 256000; }\n"
		");\n"
		"slurm = { partitions = ( { name = \"p\"; } ); %s };\n";
	char buf[2048];
	kiln_cfg *c = NULL;
	_cleanup_free_ char *slurm = NULL, *gres = NULL, *slurm2 = NULL;
	snprintf(buf, sizeof(buf), two, "");
	assert_int_equal(kiln_cfg_load_string(buf, "two.cfg", &c, NULL), 0);
	assert_int_equal(kiln_cfg_render(c, "slurm.conf", NULL, &slurm), 0);
	/* memory: min(1024000/8, 256000/4) = 64000; CPUs: min(64/8, 48/4) = 8 */
	assert_non_null(strstr(slurm, "\nDefMemPerGPU=64000\nDefCpuPerGPU=8\n"));
	assert_int_equal(kiln_cfg_render(c, "gres.conf", NULL, &gres), 0);
	assert_non_null(strstr(gres, "\nNodeName=a01 Name=gpu Type=h100 File=/dev/nvidia[4-7] "
				     "Cores=32-63\n"));
	assert_non_null(strstr(gres, "\nNodeName=b01 Name=gpu Type=h100 File=/dev/nvidia[0-3]\n"));
	kiln_cfg_free(c);
	c = NULL;
	snprintf(buf, sizeof(buf), two,
		 "def_mem_per_gpu = \"100G\"; def_cpu_per_gpu = 3; reboot_program = "
		 "\"/sbin/reboot\";");
	assert_int_equal(kiln_cfg_load_string(buf, "two.cfg", &c, NULL), 0);
	assert_int_equal(kiln_cfg_render(c, "slurm.conf", NULL, &slurm2), 0);
	assert_non_null(strstr(slurm2, "\nDefMemPerGPU=102400\nDefCpuPerGPU=3\n"));
	assert_non_null(strstr(slurm2, "\nRebootProgram=/sbin/reboot\n"));
	kiln_cfg_free(c);
	/* BASE: 2 CPUs for 4 GPUs: any DefCpuPerGPU would make --gres=gpu:4
	 * unschedulable there (the test cluster's srun --gres=gpu:4) */
	_cleanup_free_ char *slurm3 = NULL;
	c = NULL;
	assert_int_equal(kiln_cfg_load_string(BASE, "base.cfg", &c, NULL), 0);
	assert_int_equal(kiln_cfg_render(c, "slurm.conf", NULL, &slurm3), 0);
	assert_null(strstr(slurm3, "DefCpuPerGPU"));
	assert_non_null(strstr(slurm3, "\nDefMemPerGPU=250\n"));
	kiln_cfg_free(c);
}

static void test_render_content(void **state)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = load_example("dgx-pod.cfg");
	_cleanup_free_ char *slurm = NULL, *gres = NULL, *dns = NULL, *ipxe = NULL, *env = NULL;
	assert_int_equal(kiln_cfg_render(c, "slurm.conf", NULL, &slurm), 0);
	assert_non_null(strstr(slurm, "# generated by kiln from config/examples/dgx-pod.cfg"));
	assert_non_null(strstr(
		slurm, "\nNodeName=dgx17 NodeAddr=10.40.1.17 CPUs=224 Sockets=2 CoresPerSocket=56 "
		       "ThreadsPerCore=2 RealMemory=2097152 Gres=gpu:h100:8 Feature=h100,nvlink,ib "
		       "State=UNKNOWN\n"));
	assert_non_null(strstr(slurm, "\nPartitionName=train Nodes=dgx[01-24] Default=YES "
				      "MaxTime=7-00:00:00 State=UP\n"));
	assert_non_null(strstr(
		slurm,
		"\nPartitionName=infer Nodes=dgx[25-32] Default=NO MaxTime=UNLIMITED State=UP "
		"AllowGroups=root,inferops OverSubscribe=NO\n"));
	assert_non_null(
		strstr(slurm, "\nHealthCheckProgram=/usr/local/libexec/kiln/health-check\n"));
	assert_non_null(strstr(slurm, "\nSlurmdTimeout=300\n"));
	assert_non_null(strstr(slurm, "\nSchedulerParameters=bf_continue,bf_window=10080\n"));
	assert_null(strstr(slurm, "  "));
	assert_int_equal(kiln_cfg_render(c, "gres.conf", NULL, &gres), 0);
	/* HGX: GPUs 0-3 on socket 0, 4-7 on socket 1 (56 cores per socket) */
	assert_non_null(strstr(gres,
			       "\nNodeName=dgx[01-32] Name=gpu Type=h100 File=/dev/nvidia[0-3] "
			       "Cores=0-55\nNodeName=dgx[01-32] Name=gpu Type=h100 "
			       "File=/dev/nvidia[4-7] Cores=56-111\n"));
	/* 2 TiB / 8 GPUs, 224 CPUs / 8 GPUs */
	assert_non_null(strstr(slurm, "\nDefMemPerGPU=262144\nDefCpuPerGPU=28\n"));
	assert_non_null(strstr(slurm, "\nPrologFlags=Alloc\n"));
	assert_non_null(strstr(slurm, "\nRebootProgram=/usr/sbin/reboot\n"));
	assert_int_equal(kiln_cfg_render(c, "dnsmasq.conf", NULL, &dns), 0);
	assert_non_null(strstr(dns, "\ndhcp-host=b8:3f:d2:4a:13:fc,10.40.1.32,dgx32,infinite\n"));
	assert_non_null(strstr(dns, "\ndhcp-boot=tag:ipxe,http://10.40.0.1/kiln/boot.ipxe\n"));
	assert_non_null(strstr(dns, "\ninterface=enp65s0f0\n"));
	assert_int_equal(kiln_cfg_render(c, "boot.ipxe", NULL, &ipxe), 0);
	assert_true(startswith(ipxe, "#!ipxe\n"));
	/* boot.ipxe names no node: it chains to the booting port's script */
	assert_non_null(strstr(ipxe, "\nchain ${base}/ipxe/${netX/mac:hexhyp} || "));
	assert_null(strstr(ipxe, "dgx32"));
	_cleanup_free_ char *nipxe = NULL;
	assert_int_equal(kiln_cfg_render(c, "node.ipxe", "dgx32", &nipxe), 0);
	assert_non_null(strstr(nipxe, " ifname=boot0:b8:3f:d2:4a:13:fc ip=10.40.1.32::"));
	assert_non_null(strstr(nipxe, " kiln.node=dgx32 kiln.url=${base}"));
	assert_non_null(strstr(nipxe, "console=ttyS0,115200n8"));
	char *none = NULL;
	assert_int_equal(kiln_cfg_render(c, "node.ipxe", c->head.hostname, &none), -ENXIO);
	assert_null(none);
	assert_int_equal(kiln_cfg_render(c, "node-env", "dgx30", &env), 0);
	assert_non_null(strstr(env, "\nKILN_SERVICES=\"munge slurmd kiln-healthd kiln-inferd\"\n"));
	assert_non_null(strstr(env, "\nKILN_PARTITIONS=infer\n"));
	char *x = NULL;
	assert_int_equal(kiln_cfg_render(c, "node-env", "dgx99", &x), -ENXIO);
	assert_int_equal(kiln_cfg_render(c, "node-env", NULL, &x), -EINVAL);
	assert_int_equal(kiln_cfg_render(c, "nope", NULL, &x), -EINVAL);
	assert_null(x);
}

static void test_gpu_type(void **state)
{
	static const char *const cases[][2] = {
		{ "NVIDIA H100 80GB HBM3", "h100" }, { "NVIDIA A100-SXM4-80GB", "a100" },
		{ "Tesla V100-SXM2-32GB", "v100" },  { "NVIDIA L40S", "l40s" },
		{ "NVIDIA GH200 480GB", "gh200" },   { "NVIDIA B200", "b200" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		_cleanup_free_ char *t = kiln_cfg_gpu_type_from_model(cases[i][0]);
		assert_string_equal(t, cases[i][1]);
	}
	assert_null(kiln_cfg_gpu_type_from_model(NULL));
}

/* A big cluster loads fast (no quadratic checks) and a duplicate MAC at the
 * very end is still found. */
static void test_large_cluster(void **state)
{
	const int n = 8000;
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_strbuf_printf(&b,
			   "cluster = { name = \"big\"; };\n"
			   "network = { subnet = \"10.0.0.0/16\"; };\n"
			   "head = { hostname = \"head\"; address = \"10.0.0.1\"; };\n"
			   "node_groups = ( { name = \"n\"; hosts = \"n[0001-%04d]\";\n"
			   "  addresses = \"10.0.1.0-10.0.%d.%d\";\n  macs = [",
			   n, 1 + (n - 1) / 256, (n - 1) % 256);
	for (int i = 0; i < n; i++) {
		int m = i == n - 1 ? 17 : i; /* the last repeats node 18's MAC */
		kiln_strbuf_printf(&b, "%s\"02:00:00:00:%02x:%02x\"", i ? ", " : " ", m >> 8,
				   m & 255);
	}
	kiln_strbuf_printf(&b,
			   " ];\n  partitions = [ \"all\" ]; } );\n"
			   "slurm = { partitions = ( { name = \"all\"; default = true; } ); };\n");
	_cleanup_free_ char *text = kiln_strbuf_steal(&b);
	kiln_strbuf_free(&b);
	kiln_cfg *c = NULL;
	kiln_cfg_errors e;
	kiln_cfg_errors_init(&e);
	uint64_t t0 = kiln_now_usec();
	assert_int_equal(kiln_cfg_load_string(text, "big.cfg", &c, &e), -EINVAL);
	uint64_t dt = kiln_now_usec() - t0;
	assert_int_equal(e.n, 1);
	assert_string_equal(e.v[0].path, "node_groups[0].macs[7999]");
	assert_string_equal(e.v[0].message, "duplicate MAC 02:00:00:00:00:11 (also n0018)");
	kiln_cfg_errors_free(&e);
	/* fixed: loads, every node in the partition */
	char *at = strstr(text, "\"02:00:00:00:00:11\" ]");
	assert_non_null(at);
	memcpy(at, "\"02:00:00:00:ff:ff\" ]", 21);
	assert_int_equal(kiln_cfg_load_string(text, "big.cfg", &c, NULL), 0);
	assert_int_equal(c->n_nodes, n);
	assert_int_equal(c->slurm.partitions[0].n_members, n);
	assert_string_equal(c->nodes[n - 1].partitions[0], "all");
	_cleanup_free_ char *slurm = NULL;
	assert_int_equal(kiln_cfg_render(c, "slurm.conf", NULL, &slurm), 0);
	assert_non_null(strstr(slurm, "\nPartitionName=all Nodes=n[0001-8000] Default=YES"));
	kiln_cfg_free(c);
	if (dt > 5 * KILN_USEC_PER_SEC)
		fail_msg("loading %d nodes took %llu ms", n, (unsigned long long) dt / 1000);
}

/* Random mutations of a valid file: the loader must either succeed (with
 * warnings at most) or report errors, never crash or succeed with errors. */
static void test_mutations(void **state)
{
	size_t len = strlen(BASE);
	_cleanup_free_ char *buf = malloc(len + 1);
	static const char alphabet[] = "{}()[];=\",.-:0123456789abcxyz \n#@/";
	srand(12345);
	for (int round = 0; round < 3000; round++) {
		memcpy(buf, BASE, len + 1);
		int flips = 1 + rand() % 4;
		for (int f = 0; f < flips; f++)
			buf[rand() % len] = alphabet[rand() % (sizeof(alphabet) - 1)];
		kiln_cfg *c = NULL;
		kiln_cfg_errors e;
		kiln_cfg_errors_init(&e);
		int r = kiln_cfg_load_string(buf, "mut.cfg", &c, &e);
		if (r == 0) {
			for (size_t k = 0; k < e.n; k++) /* a loaded file has warnings at most */
				assert_true(e.v[k].warning);
			for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name;
			     t++) {
				char *out = NULL;
				const char *node = c->n_nodes ? c->nodes[0].name : c->head.hostname;
				assert_int_equal(kiln_cfg_render(c, t->name, node, &out), 0);
				free(out);
			}
			kiln_cfg_free(c);
		} else {
			assert_int_equal(r, -EINVAL);
			assert_true(e.n > 0);
			assert_null(c);
		}
		kiln_cfg_errors_free(&e);
	}
}

/* kiln_cfg_diff_keys(): what kiln apply maps to restarts.  The same file
 * (even reformatted, or a default written out) differs in nothing; a
 * threshold, an NTP server list and an XID override are named by path;
 * node groups are not keys (their changes are in the renders). */
static void test_diff_keys(void **state)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *a = NULL, *b = NULL, *d = NULL;
	_cleanup_free_ char *t2 = NULL, *t3 = NULL;
	assert_int_equal(kiln_cfg_load_string(BASE, "a.cfg", &a, NULL), 0);
	assert_true(asprintf(&t2, "%s\nhealth = { thresholds = { temp_warn_c = 85; }; };\n", BASE) >
		    0);
	assert_int_equal(kiln_cfg_load_string(t2, "b.cfg", &b, NULL), 0);
	_cleanup_strv_free_ char **k = NULL;
	assert_int_equal(kiln_cfg_diff_keys(a, b, &k), 0);
	assert_null(k); /* 85 is the default: nothing changed */
	assert_true(
		asprintf(&t3,
			 "%s\nhealth = { thresholds = { temp_warn_c = 80; }; xid = ( { xid = 79; "
			 "action = \"reboot\"; } ); };\ntime = { servers = [ \"ntp1\" ]; };\n",
			 BASE) > 0);
	assert_int_equal(kiln_cfg_load_string(t3, "d.cfg", &d, NULL), 0);
	assert_int_equal(kiln_cfg_diff_keys(a, d, &k), 0);
	assert_non_null(k);
	assert_int_equal(strv_length(k), 3);
	assert_string_equal(k[0], "health.thresholds.temp_warn_c");
	assert_string_equal(k[1], "time.servers");
	assert_string_equal(k[2], "health.xid");
	strv_free(TAKE_PTR(k));
	assert_int_equal(kiln_cfg_diff_keys(d, a, &k), 0);
	assert_int_equal(strv_length(k), 3); /* symmetric */
	strv_free(TAKE_PTR(k));
	assert_int_equal(kiln_cfg_diff_keys(a, a, &k), 0);
	assert_null(k);
	/* the lists kiln-node-init applies: users, groups, mounts */
	_cleanup_(kiln_cfg_freep) kiln_cfg *e = NULL, *f = NULL;
	_cleanup_free_ char *t4 = NULL, *t5 = NULL;
	assert_true(asprintf(&t4,
			     "%s\ngroups = ( { name = \"g\"; gid = 3000; } );\n"
			     "users = ( { name = \"u\"; uid = 2000; groups = [ \"g\" ]; } );\n"
			     "mounts = ( { what = \"h:/x\"; where = \"/x\"; } );\n",
			     BASE) > 0);
	assert_int_equal(kiln_cfg_load_string(t4, "e.cfg", &e, NULL), 0);
	assert_int_equal(kiln_cfg_diff_keys(a, e, &k), 0);
	assert_int_equal(strv_length(k), 3);
	assert_string_equal(k[0], "users");
	assert_string_equal(k[1], "groups");
	assert_string_equal(k[2], "mounts");
	strv_free(TAKE_PTR(k));
	/* one option of one mount */
	assert_true(
		asprintf(&t5,
			 "%s\ngroups = ( { name = \"g\"; gid = 3000; } );\n"
			 "users = ( { name = \"u\"; uid = 2000; groups = [ \"g\" ]; } );\n"
			 "mounts = ( { what = \"h:/x\"; where = \"/x\"; required = false; } );\n",
			 BASE) > 0);
	assert_int_equal(kiln_cfg_load_string(t5, "f.cfg", &f, NULL), 0);
	assert_int_equal(kiln_cfg_diff_keys(e, f, &k), 0);
	assert_int_equal(strv_length(k), 1);
	assert_string_equal(k[0], "mounts");
	strv_free(TAKE_PTR(k));
}

/* Under SAN=-fsanitize=address: libconfig 1.5 leaks scanner token strings
 * when a syntax error follows them (no bison %destructor), which the
 * mutation test hits.  Not kiln's memory; see tests/fuzz/fuzz-config.supp. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
	return "leak:^strbuf_append$\nleak:^libconfig_yylex$\n";
}

int main(void)
{
	/* clang-format off */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_schema_table),
		cmocka_unit_test(test_docs_cover_schema),
		cmocka_unit_test(test_docs_defaults),
		cmocka_unit_test(test_bom),
		cmocka_unit_test(test_truncated_text),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_schema_defaults),
		cmocka_unit_test(test_demo),
		cmocka_unit_test(test_dgx_pod),
		cmocka_unit_test(test_validators),
		cmocka_unit_test(test_collects_all),
		cmocka_unit_test(test_error_cap),
		cmocka_unit_test(test_bad_corpus),
		cmocka_unit_test(test_render_golden),
		cmocka_unit_test(test_render_targets_table),
		cmocka_unit_test(test_render_content),
		cmocka_unit_test(test_render_allow_groups),
		cmocka_unit_test(test_render_per_gpu_defaults),
		cmocka_unit_test(test_gpu_type),
		cmocka_unit_test(test_large_cluster),
		cmocka_unit_test(test_mutations),
		cmocka_unit_test(test_diff_keys),
	};
	/* clang-format on */
	return cmocka_run_group_tests(tests, NULL, NULL);
}
