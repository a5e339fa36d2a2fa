/* kiln.c — the admin CLI: check, show and render the cluster file.
 *
 *   kiln [-c FILE] check [--strict] [--json]
 *   kiln [-c FILE] show nodes [--json] | node NAME [--json] | --defaults
 *   kiln [-c FILE] render TARGET [-o PATH] [--node NAME]
 *   kiln [-c FILE] render all -o DIR
 *   kiln [-c FILE] render prometheus -o DIR   (prometheus.yml + kiln-alerts.yml)
 *   kiln model inspect FILE [--json]        (config/cli/kiln-model.c)
 *   kiln tokenize FILE [--text S | --ids L] (config/cli/kiln-tokenize.c)
 *   kiln [-c FILE] status [--json] [--timeout SECS] [NODES] (config/cli/status.c)
 *   kiln [-c FILE] reboot [--wave N] [--dry-run] NODES      (config/cli/reboot.c)
 *   kiln [-c FILE] serve                                   (config/cli/serve.c)
 *   kiln keygen | sign | verify             (config/cli/sign.c)
 *
 * A program on kiln/prog.h with verbs: the global options (-c -v -q) come
 * before the verb, and check, show and render take them after it too, as
 * they always have (`kiln check -c FILE`).  Every verb has its own option
 * table, so its own --help and its own shell completion.
 *
 * Exit status: 0 success, 1 failure (I/O), 2 usage or configuration error.
 * Configuration errors go to stderr one per line, exactly as the library
 * formats them (FILE:LINE: setting.path: message; hint), so editors and
 * tests can parse them, or with `check --json` to stdout as one JSON
 * object; everything else is logged with log.h. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln-verbs.h"
#include "kiln/config.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/pathtrust.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

enum { ARG_DEFAULTS = KILN_OPT_FIRST, ARG_STRICT, ARG_NODE_PATHS, ARG_ROOT };

static const char *arg_config;
static const char *arg_output;
static const char *arg_node;
static bool arg_defaults;
static bool arg_json;
static bool arg_strict;
static bool arg_node_paths;
static const char *arg_root;
static int arg_quiet;

/* ---- option tables ------------------------------------------------------ */

/* The global table and every cluster-file verb's table list only their own
 * options and name where each lands, so only -q needs a look: it also
 * quiets check's summary and render all's count. */
static int parse_option(int key, const char *arg)
{
	if (key == 'q')
		arg_quiet++;
	return 1; /* the log level, and the rest of the shared options */
}

static const kiln_option global_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	KILN_OPTIONS_COMMON,
	{},
};

static const kiln_option check_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "strict", ARG_STRICT, NULL, "treat warnings as errors (exit 2)", NULL,
	  .flag = &arg_strict },
	{ "node-paths", ARG_NODE_PATHS, NULL,
	  "also refuse code the file makes root run on this node (NVML library,\n"
	  "Prolog, Epilog ...) that a user other than root could change",
	  NULL, .flag = &arg_node_paths },
	{ "root", ARG_ROOT, "DIR", "with --node-paths: the node's tree is below DIR", "dir",
	  .str = &arg_root },
	KILN_OPTION_JSON_INTO(&arg_json),
	KILN_OPTIONS_COMMON,
	{},
};

static const kiln_option show_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "defaults", ARG_DEFAULTS, NULL, "print every key of the schema with its type and default",
	  NULL, .flag = &arg_defaults },
	KILN_OPTION_JSON_INTO(&arg_json),
	KILN_OPTIONS_COMMON,
	{},
};

static const kiln_option render_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "output", 'o', "PATH",
	  "write PATH atomically instead of standard output\n"
	  "(a directory for render all, prometheus and mounts; \"-\": standard output)",
	  "file", .str = &arg_output },
	{ "node", KILN_OPT_NODE, "NAME",
	  "the node for render node-env (the head node works too) or node.ipxe", "node",
	  .str = &arg_node },
	KILN_OPTIONS_COMMON,
	{},
};

static const kiln_prog check_prog = {
	.name = "kiln check",
	.summary = "validate the cluster file",
	.usage = "kiln [-c FILE] check [--strict] [--json]\n"
		 "kiln [-c FILE] check --node-paths [--root DIR]",
	.options = check_options,
	.option = parse_option,
	.args_complete = "", /* no arguments */
	.epilog = "Every error is printed to standard error as FILE:LINE: setting.path: message; "
		  "hint\n"
		  "(with --json: {\"ok\": false, \"errors\": [...]} on standard output).\n"
		  "Warnings (FILE:LINE: setting.path: warning: message) leave the file valid;\n"
		  "--strict makes them errors.\n"
		  "--node-paths (kiln-node-init runs it): every program or library the file\n"
		  "makes root run on the node (health.nvml_library, health.prolog, .epilog,\n"
		  ".check_program, slurm.reboot_program, Prolog=... lines of slurm.extra) and\n"
		  "every directory above it must be root's and writable by no group or other\n"
		  "user, as sudo and sshd demand; a path that does not exist passes when only\n"
		  "root could create it.\n"
		  "Exit status: 0 valid, 1 unreadable, 2 missing or invalid (or warnings with "
		  "--strict,\n"
		  "or a code path others can change).\n",
};

static const kiln_prog show_prog = {
	.name = "kiln show",
	.summary = "what the cluster file says about its nodes",
	.usage = "kiln [-c FILE] show nodes [--json]\n"
		 "kiln [-c FILE] show node NAME [--json]\n"
		 "kiln show --defaults",
	.options = show_options,
	.option = parse_option,
	.epilog =
		"show nodes: a table of every node (name, group, address, MAC, GPUs, partitions).\n"
		"show node NAME: everything about one node, or the head node.\n",
	.args_complete = "nodes node|node",
};

/* --help's target list and completion's words, from the one table of
 * targets (kiln_cfg_render_targets); filled before main() runs. */
static char render_epilog[2048], render_complete[512];

static kiln_prog render_prog = {
	.name = "kiln render",
	.summary = "write a file generated from the cluster file",
	.usage = "kiln [-c FILE] render TARGET [-o PATH] [--node NAME]\n"
		 "kiln [-c FILE] render prometheus -o DIR\n"
		 "kiln [-c FILE] render all -o DIR",
	.options = render_options,
	.option = parse_option,
	.epilog = render_epilog,
	.args_complete = render_complete,
};

__attribute__((constructor)) static void render_prog_init(void)
{
	FILE *h = fmemopen(render_epilog, sizeof(render_epilog), "w");
	FILE *w = fmemopen(render_complete, sizeof(render_complete), "w");
	if (!h || !w)
		abort(); /* before main(): a static buffer that cannot be opened */
	fputs("Targets:\n", h);
	for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++) {
		fprintf(h, "  %-14s %s\n", t->name, t->summary);
		fprintf(w, "%s ", t->name);
	}
	fputs("  prometheus     prometheus.yml and kiln-alerts.yml into DIR (needs -o DIR)\n"
	      "  all            every target into DIR, node-env into DIR/node-env/NAME,\n"
	      "                 node.ipxe into DIR/ipxe/MAC\n",
	      h);
	fputs("prometheus all", w);
	fclose(h);
	fclose(w);
}

/* ---- parsing ------------------------------------------------------------ */

const char *kiln_cli_config(void)
{
	return arg_config;
}

int kiln_cli_print_json(json_t *o, size_t flags)
{
	if (!o)
		return -ENOMEM;
	json_dumpf(o, stdout, flags);
	putchar('\n'); /* a failed write is caught by run()'s flush */
	json_decref(o);
	return 0;
}

static int print_json(json_t *o)
{
	return kiln_cli_print_json(o, JSON_INDENT(2));
}

/* ---- check -------------------------------------------------------------- */

/* check --json: the errors as data.  kiln_cfg_open() prints them, so this
 * one caller loads with kiln_cfg_load() and words the file-level failures
 * (missing, too large, unreadable) the way kiln_cfg_open() decides them. */
static int check_json(void)
{
	const char *path = arg_config ? arg_config : kiln_cfg_default_path();
	_cleanup_(kiln_cfg_errors_freep) kiln_cfg_errors errs;
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	kiln_cfg_errors_init(&errs);
	int r = kiln_cfg_load(path, &c, &errs);
	json_t *errors = json_array(), *warnings = json_array();
	for (size_t i = 0; i < errs.n; i++) {
		const kiln_cfg_error *e = &errs.v[i];
		json_array_append_new(e->warning && !arg_strict ? warnings : errors,
				      json_pack("{s:s, s:i, s:s, s:s, s:s?, s:b}", "file", e->file,
						"line", e->line, "path", e->path, "message",
						e->message, "hint", e->hint, "warning",
						e->warning));
	}
	if (r >= 0 && json_array_size(errors) == 0) {
		json_decref(errors);
		r = print_json(json_pack("{s:s, s:b, s:I, s:I, s:I, s:o}", "file", c->path, "ok", 1,
					 "nodes", (json_int_t) c->n_nodes, "groups",
					 (json_int_t) c->n_groups, "partitions",
					 (json_int_t) c->slurm.n_partitions, "warnings", warnings));
		return r < 0 ? log_error_errno(r, "Out of memory: %m") : KILN_EXIT_OK;
	}
	json_decref(warnings);
	if (r >= 0)
		r = -EINVAL; /* --strict: warnings are errors */
	int status =
		r == -EINVAL || r == -ENOENT || r == -EFBIG ? KILN_EXIT_USAGE : KILN_EXIT_FAILURE;
	if (errs.n == 0) {
		char msg[128];
		if (r == -ENOENT)
			snprintf(msg, sizeof(msg), "the cluster file does not exist");
		else if (r == -EFBIG)
			snprintf(msg, sizeof(msg), "larger than %u MiB",
				 KILN_CFG_FILE_MAX / (1024u * 1024u));
		else
			snprintf(msg, sizeof(msg), "cannot be read: %s", strerror(-r));
		json_array_append_new(
			errors,
			json_pack("{s:s, s:i, s:s, s:s, s:s?}", "file", path, "line", 0, "path", "",
				  "message", msg, "hint",
				  r == -ENOENT ? "pass -c FILE or set $" KILN_CFG_ENV : NULL));
	}
	json_t *o = json_pack("{s:s, s:b, s:o}", "file", path, "ok", 0, "errors", errors);
	if (o && errs.dropped > 0)
		json_object_set_new(o, "dropped", json_integer((json_int_t) errs.dropped));
	r = print_json(o);
	return r < 0 ? log_error_errno(r, "Out of memory: %m") : status;
}

/* A file the cluster file names that this host may legitimately lack: the
 * head node often does not mount the inference nodes' model store, so
 * `kiln check` only warns; kiln-inferd on the node refuses to start
 * without it (exit 1, "cannot open"). */
static int warn_missing_file(const char *cfg_path, const char *key, const char *path)
{
	struct stat st;
	if (!path || stat(path, &st) == 0)
		return 0;
	fprintf(stderr,
		"%s: %s: warning: %s does not exist on this host; fine on a head node that does "
		"not mount it, but kiln-inferd on the inference nodes refuses to start without "
		"it\n",
		cfg_path, key, path);
	return 1;
}

/* accounting.storage_password_file: only the head node (where slurmdbd.conf
 * is rendered) has it, so a missing file is a warning; one others can read
 * is a warning everywhere (it is the database password). */
static int warn_password_file(const char *cfg_path, const char *path)
{
	struct stat st;
	if (!path)
		return 0;
	if (stat(path, &st) < 0) {
		fprintf(stderr,
			"%s: accounting.storage_password_file: warning: %s does not exist on this "
			"host; fine on a compute node, but `kiln render slurmdbd.conf` on the head "
			"node needs it\n",
			cfg_path, path);
		return 1;
	}
	if (st.st_mode & 077) {
		fprintf(stderr,
			"%s: accounting.storage_password_file: warning: %s is readable by others "
			"(mode %04o) and holds the database password; chmod 600 it\n",
			cfg_path, path, (unsigned) (st.st_mode & 07777));
		return 1;
	}
	return 0;
}

/* check --node-paths: one line per code path, refused or absent */
struct node_paths {
	const char *file;
	int refused;
};

static int node_path_one(const char *key, const char *path, void *userdata)
{
	struct node_paths *np = userdata;
	char err[512] = "";
	/* what root runs: root's alone, whoever runs the check */
	int r = kiln_path_trusted(arg_root, path, 0, err, sizeof(err));
	if (r == KILN_PATH_TRUSTED)
		log_debug("%s: %s = \"%s\": root's", np->file, key, path);
	else if (r == KILN_PATH_ABSENT)
		log_info("%s: %s = \"%s\": not on this node (%s)", np->file, key, path, err);
	else {
		log_error("%s: %s = \"%s\": refused, root would run code others can change: %s",
			  np->file, key, path, err);
		np->refused++;
	}
	return 0;
}

static int verb_check(int argc, char **argv)
{
	if (optind < argc)
		return kiln_usage_exit(&check_prog, "check takes no arguments (use -c FILE).");
	if (arg_root && !arg_node_paths)
		return kiln_usage_exit(&check_prog, "--root applies to --node-paths only.");
	if (arg_json && arg_node_paths)
		return kiln_usage_exit(&check_prog, "--node-paths does not take --json.");
	if (arg_json)
		return check_json();
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	/* no hint: the error lines are check's whole output */
	int r = kiln_cfg_open(arg_config, KILN_CFG_OPEN_NO_HINT | KILN_CFG_OPEN_WARNINGS, &c);
	if (r < 0)
		return kiln_exit_for_config(r);
	if (c->inference.enabled && c->inference.model) {
		r += warn_missing_file(c->path, "inference.model", c->inference.model);
		r += warn_missing_file(c->path, "inference.tokenizer", c->inference.tokenizer);
	} else if (c->inference.enabled)
		for (size_t i = 0; i < c->inference.n_models; i++) {
			char key[64];
			snprintf(key, sizeof(key), "inference.models[%zu].path", i);
			r += warn_missing_file(c->path, key, c->inference.models[i].path);
			snprintf(key, sizeof(key), "inference.models[%zu].tokenizer", i);
			r += warn_missing_file(c->path, key, c->inference.models[i].tokenizer);
		}
	if (c->inference.enabled)
		r += warn_missing_file(c->path, "inference.api_keys_file",
				       c->inference.api_keys_file);
	if (c->accounting.storage_host)
		r += warn_password_file(c->path, c->accounting.storage_password_file);
	if (arg_node_paths) {
		struct node_paths np = { .file = c->path };
		kiln_cfg_for_each_code_path(c, node_path_one, &np);
		if (np.refused) {
			log_error("%s names %d program%s or librar%s root would run here that "
				  "others can change; make %s root's and not group- or "
				  "world-writable (chown root:, chmod go-w), directories included",
				  c->path, np.refused, np.refused == 1 ? "" : "s",
				  np.refused == 1 ? "y" : "ies", np.refused == 1 ? "it" : "them");
			return KILN_EXIT_USAGE;
		}
	}
	if (r > 0 && arg_strict)
		return KILN_EXIT_USAGE; /* the warnings are printed: they are the output */
	if (!arg_quiet)
		printf("%s: OK (%zu node%s in %zu group%s, %zu partition%s%s)\n", c->path,
		       c->n_nodes, c->n_nodes == 1 ? "" : "s", c->n_groups,
		       c->n_groups == 1 ? "" : "s", c->slurm.n_partitions,
		       c->slurm.n_partitions == 1 ? "" : "s", r > 0 ? "; warnings above" : "");
	return KILN_EXIT_OK;
}

/* ---- show --------------------------------------------------------------- */

static void print_defaults(void)
{
	size_t n;
	const kiln_cfg_key *s = kiln_cfg_schema(&n);
	printf("%-44s %-14s %s\n", "KEY", "TYPE", "DEFAULT");
	for (size_t i = 0; i < n; i++) {
		if (s[i].type == KILN_CFG_GROUP || s[i].type == KILN_CFG_LIST)
			continue;
		printf("%-44s %-14s %s\n", s[i].path, kiln_cfg_type_to_string(s[i].type),
		       s[i].required ? "(required)"
		       : s[i].def    ? s[i].def
				     : "(unset)");
	}
}

static void join(char *buf, size_t len, char *const *v, const char *sep, const char *none)
{
	buf[0] = 0;
	size_t o = 0;
	for (size_t i = 0; v && v[i] && o < len; i++)
		o += (size_t) snprintf(buf + o, len - o, "%s%s", i ? sep : "", v[i]);
	if (!buf[0])
		snprintf(buf, len, "%s", none);
}

static json_t *strv_json(char *const *v)
{
	json_t *a = json_array();
	for (size_t i = 0; v && v[i]; i++)
		json_array_append_new(a, json_string(v[i]));
	return a;
}

static int show_nodes(const kiln_cfg *c)
{
	char ab[16], mb[18], gb[64], pb[256];
	json_t *nodes = arg_json ? json_array() : NULL;
	if (!arg_json)
		printf("%-16s %-12s %-15s %-17s %-12s %s\n", "NAME", "GROUP", "ADDRESS", "MAC",
		       "GPUS", "PARTITIONS");
	for (size_t i = 0; i < c->n_nodes; i++) {
		const kiln_cfg_node *n = &c->nodes[i];
		const kiln_cfg_group *g = n->group;
		kiln_format_ipv4(ab, n->address);
		kiln_format_mac(mb, n->mac);
		if (arg_json) {
			json_array_append_new(
				nodes, json_pack("{s:s, s:s, s:s, s:s, s:i, s:s?, s:o}", "name",
						 n->name, "group", g->name, "address", ab, "mac",
						 mb, "gpus", g->gpu_count, "gpu_type",
						 g->gpu_count > 0 ? g->gpu_type : NULL,
						 "partitions", strv_json(n->partitions)));
			continue;
		}
		if (g->gpu_count <= 0)
			snprintf(gb, sizeof(gb), "-");
		else
			snprintf(gb, sizeof(gb), "%d x %s", g->gpu_count,
				 g->gpu_type ? g->gpu_type : "gpu");
		join(pb, sizeof(pb), n->partitions, ",", "-");
		printf("%-16s %-12s %-15s %-17s %-12s %s\n", n->name, g->name, ab, mb, gb, pb);
	}
	if (arg_json)
		return print_json(json_pack("{s:s, s:o}", "file", c->path, "nodes", nodes));
	return 0;
}

static int show_head(const kiln_cfg *c)
{
	char ab[16];
	char *services[] = { "munge", "slurmctld", "dnsmasq", NULL };
	kiln_format_ipv4(ab, c->head.address);
	if (arg_json) {
		char *fqdn = NULL;
		if (c->cluster.domain &&
		    asprintf(&fqdn, "%s.%s", c->head.hostname, c->cluster.domain) < 0)
			fqdn = NULL;
		int r = print_json(json_pack(
			"{s:s, s:s?, s:s, s:s, s:i, s:s, s:o}", "name", c->head.hostname, "fqdn",
			fqdn, "role", "head", "address", ab, "prefix", c->network.prefix,
			"interface", c->network.boot_interface, "services", strv_json(services)));
		free(fqdn);
		return r;
	}
	/* What render node-env --node HEAD knows about it. */
	printf("name:        %s\n", c->head.hostname);
	if (c->cluster.domain)
		printf("fqdn:        %s.%s\n", c->head.hostname, c->cluster.domain);
	printf("role:        head\n");
	printf("address:     %s/%d\n", ab, c->network.prefix);
	printf("interface:   %s\n", c->network.boot_interface);
	printf("services:    munge slurmctld dnsmasq\n");
	return 0;
}

static int show_node(const kiln_cfg *c, const kiln_cfg_node *n)
{
	const kiln_cfg_group *g = n->group;
	char ab[16], mb[18], pb[256];
	char *services[5] = { "munge", "slurmd" }, **s = services + 2;
	if (c->health.enabled)
		*s++ = "kiln-healthd";
	if (n->inference)
		*s++ = "kiln-inferd";
	kiln_format_ipv4(ab, n->address);
	kiln_format_mac(mb, n->mac);
	if (arg_json) {
		char *fqdn = NULL;
		if (c->cluster.domain && asprintf(&fqdn, "%s.%s", n->name, c->cluster.domain) < 0)
			fqdn = NULL;
		json_t *o = json_pack("{s:s, s:s?, s:s, s:s, s:s, s:i, s:s, s:i, s:s?, s:s?}",
				      "name", n->name, "fqdn", fqdn, "role", "compute", "group",
				      g->name, "address", ab, "prefix", c->network.prefix, "mac",
				      mb, "gpus", g->gpu_count, "gpu_model", g->gpu_model,
				      "gres_type", g->gpu_type);
		if (!o) {
			free(fqdn);
			return -ENOMEM;
		}
		json_object_set_new(o, "cpus", json_integer(g->cpus));
		json_object_set_new(o, "sockets", json_integer(g->sockets));
		json_object_set_new(o, "cores_per_socket", json_integer(g->cores_per_socket));
		json_object_set_new(o, "threads_per_core", json_integer(g->threads_per_core));
		json_object_set_new(o, "memory_mb", json_integer((json_int_t) g->memory_mb));
		json_object_set_new(o, "partitions", strv_json(n->partitions));
		json_object_set_new(o, "features", strv_json(g->features));
		json_object_set_new(o, "services", strv_json(services));
		free(fqdn);
		return print_json(o);
	}
	printf("name:        %s\n", n->name);
	if (c->cluster.domain)
		printf("fqdn:        %s.%s\n", n->name, c->cluster.domain);
	printf("role:        compute\n");
	printf("group:       %s\n", g->name);
	printf("address:     %s/%d\n", ab, c->network.prefix);
	printf("mac:         %s\n", mb);
	printf("gpus:        %d%s%s\n", g->gpu_count, g->gpu_model ? " x " : "",
	       strempty(g->gpu_model));
	printf("gres type:   %s\n", g->gpu_type ? g->gpu_type : "-");
	printf("cpus:        %d (%d sockets x %d cores x %d threads)\n", g->cpus, g->sockets,
	       g->cores_per_socket, g->threads_per_core);
	printf("memory:      %llu MiB\n", (unsigned long long) g->memory_mb);
	join(pb, sizeof(pb), n->partitions, ",", "-");
	printf("partitions:  %s\n", pb);
	join(pb, sizeof(pb), g->features, ",", "-");
	printf("features:    %s\n", pb);
	join(pb, sizeof(pb), services, " ", "-");
	printf("services:    %s\n", pb);
	return 0;
}

static int verb_show(int argc, char **argv)
{
	argc -= optind;
	argv += optind;
	if (arg_defaults) {
		if (argc > 0)
			return kiln_usage_exit(&show_prog, "show --defaults takes no arguments.");
		if (arg_json)
			return kiln_usage_exit(&show_prog,
					       "--json applies to show nodes and show node.");
		print_defaults();
		return KILN_EXIT_OK;
	}
	if (argc < 1)
		return kiln_usage_exit(&show_prog,
				       "show needs what to show: nodes, node NAME, or --defaults.");
	bool all = streq(argv[0], "nodes");
	if (!all && !streq(argv[0], "node"))
		return kiln_usage_exit(
			&show_prog,
			"Unknown show target '%s'; use nodes, node NAME, or --defaults.", argv[0]);
	if ((all && argc != 1) || (!all && argc != 2))
		return kiln_usage_exit(&show_prog, all ? "show nodes takes no arguments."
						       : "show node needs exactly one NAME.");
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = kiln_cfg_open(arg_config, 0, &c);
	if (r < 0)
		return kiln_exit_for_config(r);
	const kiln_cfg_node *n = all ? NULL : kiln_cfg_find_node(c, argv[1]);
	if (all)
		r = show_nodes(c);
	else if (n)
		r = show_node(c, n);
	else if (streq(argv[1], c->head.hostname))
		r = show_head(c);
	else {
		log_error("No node '%s' in %s; `kiln show nodes` lists them.", argv[1], c->path);
		return KILN_EXIT_USAGE;
	}
	return r < 0 ? log_error_errno(r, "Out of memory: %m") : KILN_EXIT_OK;
}

/* ---- render ------------------------------------------------------------- */

/* Writes a rendered target t at the table's mode. */
static int write_out(const kiln_cfg_render_target *t, const char *path, const char *data)
{
	int r = kiln_write_file_atomic(path, data, strlen(data), t->mode);
	if (r < 0)
		return log_error_errno(r, "Failed to write '%s': %m", path);
	return 0;
}

/* A target that holds a secret (mode 0600 in the table: slurmdbd.conf and
 * its database password) going to standard output: `> FILE` made FILE with
 * the shell's umask, 0644 as a rule, so it is narrowed to the table's mode
 * before a byte is written, and the render is refused when it cannot be
 * (a file someone else owns).  On a terminal the secret is about to be on
 * screen and in the scrollback: one line on stderr says so.  A pipe is the
 * reader's business. */
static int protect_stdout(const kiln_cfg_render_target *t)
{
	struct stat st;
	if (t->mode & 077)
		return 0;
	if (fstat(STDOUT_FILENO, &st) < 0)
		return 0; /* no stdout: nothing is written anywhere */
	if (S_ISREG(st.st_mode) && fchmod(STDOUT_FILENO, t->mode) < 0)
		return log_error_errno(
			-errno,
			"Refusing to write %s (it holds a secret) to standard output: "
			"cannot make the file mode %04o: %m; use -o FILE",
			t->name, t->mode);
	if (isatty(STDOUT_FILENO))
		log_notice("%s holds a secret; it is shown on this terminal.", t->name);
	return 0;
}

/* mkdir -p: render all -o DIR creates DIR and its parents. */
static int mkdir_p(const char *path)
{
	_cleanup_free_ char *p = strdup(path);
	if (!p)
		return -ENOMEM;
	for (char *s = p + 1; *s; s++)
		if (*s == '/') {
			*s = 0;
			if (mkdir(p, 0755) < 0 && errno != EEXIST)
				return -errno;
			*s = '/';
		}
	if (mkdir(p, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* The one render that reads a file (slurmdbd.conf: the database password)
 * says which file and what to do; the others only run out of memory. */
static int render_error(const kiln_cfg *c, const char *t, const char *node, int r)
{
	if (streq(t, "slurmdbd.conf") && r == -EBADMSG)
		return log_error_errno(r,
				       "Failed to render slurmdbd.conf: the password file '%s' "
				       "(accounting.storage_password_file) is empty, longer than "
				       "1024 bytes or holds a control character; write the "
				       "password alone on one line",
				       c->accounting.storage_password_file);
	if (streq(t, "slurmdbd.conf"))
		return log_error_errno(r,
				       "Failed to render slurmdbd.conf: cannot read the database "
				       "password from '%s' (accounting.storage_password_file): %m; "
				       "create it (mode 0600) on this head node",
				       c->accounting.storage_password_file);
	return log_error_errno(r, "Failed to render %s%s%s: %m", t, node ? " for " : "",
			       strempty(node));
}

/* A KILN_CFG_RENDER_FILES target's text into files below dir: each starts
 * at a KILN_CFG_RENDER_FILE_MARK NAME line (NAME may hold one '/': a
 * drop-in directory, created).  Counts them in *files. */
static int write_files(const kiln_cfg_render_target *t, const char *dir, const char *text,
		       size_t *files)
{
	int r = mkdir_p(dir);
	if (r < 0)
		return log_error_errno(r, "Failed to create '%s': %m", dir);
	const size_t ml = strlen(KILN_CFG_RENDER_FILE_MARK);
	const char *p = strstr(text, KILN_CFG_RENDER_FILE_MARK);
	while (p) {
		const char *name = p + ml, *nl = strchr(name, '\n');
		if (!nl)
			break;
		const char *body = nl + 1, *next = strstr(body, "\n" KILN_CFG_RENDER_FILE_MARK);
		size_t len = next ? (size_t) (next + 1 - body) : strlen(body);
		_cleanup_free_ char *path = NULL, *data = strndup(body, len);
		if (!data || asprintf(&path, "%s/%.*s", dir, (int) (nl - name), name) < 0)
			return log_error_errno(-ENOMEM, "Out of memory: %m");
		char *slash = strrchr(path, '/');
		if (slash > path + strlen(dir)) {
			*slash = 0;
			r = mkdir_p(path);
			*slash = '/';
			if (r < 0)
				return log_error_errno(
					r, "Failed to create the directory of '%s': %m", path);
		}
		r = write_out(t, path, data);
		if (r < 0)
			return r;
		(*files)++;
		p = next ? next + 1 : NULL;
	}
	return 0;
}

/* Renders target t (for node, when per node) into dir/name. */
static int render_to(const kiln_cfg *c, const kiln_cfg_render_target *t, const char *node,
		     const char *dir, const char *name)
{
	_cleanup_free_ char *text = NULL, *path = NULL;
	int r = kiln_cfg_render(c, t->name, node, &text);
	if (r < 0)
		return render_error(c, t->name, node, r);
	if (asprintf(&path, "%s/%s", dir, name) < 0)
		return log_error_errno(-ENOMEM, "Out of memory: %m");
	return write_out(t, path, text);
}

/* Renders into arg_output every target with a flag of want (0: any) and
 * none of skip, counting the files. */
static int render_kind(const kiln_cfg *c, unsigned want, unsigned skip, size_t *files)
{
	for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++) {
		if ((want && !(t->flags & want)) || (t->flags & skip))
			continue;
		if (t->flags & KILN_CFG_RENDER_FILES) {
			/* DIR/TARGET/ holds its files */
			_cleanup_free_ char *text = NULL, *dir = NULL;
			int r = kiln_cfg_render(c, t->name, NULL, &text);
			if (r < 0)
				return render_error(c, t->name, NULL, r);
			if (!strstr(text, KILN_CFG_RENDER_FILE_MARK))
				continue; /* no files (no mounts): no empty DIR/TARGET */
			if (asprintf(&dir, "%s/%s", arg_output, t->name) < 0)
				return log_error_errno(-ENOMEM, "Out of memory: %m");
			r = write_files(t, dir, text, files);
			if (r < 0)
				return r;
			continue;
		}
		int r = render_to(c, t, NULL, arg_output, t->name);
		if (r < 0)
			return r;
		(*files)++;
	}
	return 0;
}

/* DIR/ipxe/MAC (52-54-00-12-34-56) for every node: the URL path boot.ipxe
 * chains to, so a static HTTP server of DIR answers as kiln serve does. */
static int render_by_mac(const kiln_cfg *c, const kiln_cfg_render_target *t, size_t *files)
{
	_cleanup_free_ char *dir = NULL;
	if (asprintf(&dir, "%s/ipxe", arg_output) < 0)
		return log_error_errno(-ENOMEM, "Out of memory: %m");
	int r = mkdir_p(dir);
	if (r < 0)
		return log_error_errno(r, "Failed to create '%s': %m", dir);
	for (size_t i = 0; i < c->n_nodes; i++) {
		const uint8_t *m = c->nodes[i].mac;
		char name[18];
		snprintf(name, sizeof(name), "%02x-%02x-%02x-%02x-%02x-%02x", m[0], m[1], m[2],
			 m[3], m[4], m[5]);
		r = render_to(c, t, c->nodes[i].name, dir, name);
		if (r < 0)
			return r;
		(*files)++;
	}
	return 0;
}

static int render_all(const kiln_cfg *c)
{
	if (!arg_output)
		return kiln_usage_exit(&render_prog, "render all needs -o DIR.");
	int r = mkdir_p(arg_output);
	if (r < 0)
		return log_error_errno(r, "Failed to create '%s': %m", arg_output);
	size_t files = 0;
	r = render_kind(c, 0, KILN_CFG_RENDER_PER_NODE, &files);
	if (r < 0)
		return r;
	for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++) {
		if (!(t->flags & KILN_CFG_RENDER_PER_NODE))
			continue;
		if (t->flags & KILN_CFG_RENDER_BY_MAC) {
			r = render_by_mac(c, t, &files);
			if (r < 0)
				return r;
			continue;
		}
		/* DIR/TARGET/NODE for every node and the head node */
		_cleanup_free_ char *dir = NULL;
		if (asprintf(&dir, "%s/%s", arg_output, t->name) < 0)
			return log_error_errno(-ENOMEM, "Out of memory: %m");
		r = mkdir_p(dir);
		if (r < 0)
			return log_error_errno(r, "Failed to create '%s': %m", dir);
		for (size_t i = 0; i <= c->n_nodes; i++) {
			const char *name = i < c->n_nodes ? c->nodes[i].name : c->head.hostname;
			r = render_to(c, t, name, dir, name);
			if (r < 0)
				return r;
			files++;
		}
	}
	if (!arg_quiet)
		printf("Wrote %zu files to %s\n", files, arg_output);
	return KILN_EXIT_OK;
}

/* render prometheus -o DIR: the scrape configuration and the rules it names,
 * side by side (prometheus.yml finds kiln-alerts.yml relative to itself). */
static int render_prometheus_dir(const kiln_cfg *c)
{
	if (!arg_output || streq(arg_output, "-"))
		return kiln_usage_exit(&render_prog,
				       "render prometheus needs -o DIR (render prometheus.yml or "
				       "kiln-alerts.yml writes one file to standard output).");
	int r = mkdir_p(arg_output);
	if (r < 0)
		return log_error_errno(r, "Failed to create '%s': %m", arg_output);
	size_t files = 0;
	r = render_kind(c, KILN_CFG_RENDER_PROMETHEUS, 0, &files);
	if (r < 0)
		return r;
	if (!arg_quiet)
		printf("Wrote %zu files to %s\n", files, arg_output);
	return KILN_EXIT_OK;
}

static int verb_render(int argc, char **argv)
{
	if (argc - optind != 1)
		return kiln_usage_exit(&render_prog, "render needs exactly one TARGET (or all).");
	const char *t = argv[optind];
	const kiln_cfg_render_target *target = kiln_cfg_render_target_find(t);
	if (!streq(t, "all") && !streq(t, "prometheus") && !target)
		return kiln_usage_exit(&render_prog, "Unknown render target '%s'; one of %s.", t,
				       render_complete);
	bool per_node = target && (target->flags & KILN_CFG_RENDER_PER_NODE);
	if (per_node && !arg_node)
		return kiln_usage_exit(&render_prog, "render %s needs --node NAME.", t);
	if (!per_node && arg_node)
		return kiln_usage_exit(
			&render_prog,
			"--node applies to render node-env and node.ipxe only, not to "
			"%s.",
			t);
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = kiln_cfg_open(arg_config, 0, &c);
	if (r < 0)
		return kiln_exit_for_config(r);
	if (streq(t, "all"))
		return render_all(c);
	if (streq(t, "prometheus"))
		return render_prometheus_dir(c);
	_cleanup_free_ char *text = NULL;
	r = kiln_cfg_render(c, t, arg_node, &text);
	if (r == -ENXIO) {
		log_error("No node '%s' in %s; `kiln show nodes` lists them.", arg_node, c->path);
		return KILN_EXIT_USAGE;
	}
	if (r < 0)
		return render_error(c, t, NULL, r);
	if (!arg_output || streq(arg_output, "-")) {
		if (protect_stdout(target) < 0)
			return KILN_EXIT_FAILURE;
		fputs(text, stdout); /* a failed write is caught by run()'s flush */
		return KILN_EXIT_OK;
	}
	if (target->flags & KILN_CFG_RENDER_FILES) {
		size_t files = 0;
		r = write_files(target, arg_output, text, &files);
		return r < 0 ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
	}
	return write_out(target, arg_output, text);
}

/* ---- the command -------------------------------------------------------- */

static int verb_help(int argc, char **argv);

static const kiln_verb verbs[] = {
	{ "check", "validate the cluster file", verb_check, &check_prog },
	{ "show", "nodes, one node, or the schema's defaults", verb_show, &show_prog },
	{ "render", "slurm.conf, gres.conf, dnsmasq.conf ... from the cluster file", verb_render,
	  &render_prog },
	{ "model", "inspect a model or checkpoint file", kiln_model_main, &kiln_model_prog },
	{ "tokenize", "text <-> token ids with a model's tokenizer", kiln_tokenize_main,
	  &kiln_tokenize_prog },
	{ "apply", "bring the running cluster to the cluster file (Slurm, nodes)", kiln_apply_main,
	  &kiln_apply_prog },
	{ "status", "the cluster at a glance: Slurm, GPU health, jobs, models", kiln_status_main,
	  &kiln_status_prog },
	{ "reboot", "rolling reboot of nodes through Slurm, in waves", kiln_reboot_main,
	  &kiln_reboot_prog },
	{ "keygen", "make the head node's key that signs the cluster file", kiln_keygen_main,
	  &kiln_keygen_prog },
	{ "sign", "sign the cluster file with the head node's key", kiln_sign_main,
	  &kiln_sign_prog },
	{ "verify", "check a file's signature against a public key", kiln_verify_main,
	  &kiln_verify_prog },
	{ "serve", "the head's provisioning server: image, per-node iPXE, secrets", kiln_serve_main,
	  &kiln_serve_prog },
	{ "help", "show this help", verb_help, NULL },
};

static const kiln_prog prog = {
	.name = "kiln",
	.summary =
		"check, show and render a kiln cluster file; see, reboot and provision the cluster",
	.usage = "kiln [OPTIONS] check [--strict] [--json]   validate the cluster file\n"
		 "kiln [OPTIONS] show nodes | node NAME      the nodes, or one (--json)\n"
		 "kiln show --defaults                       every key with its type and default\n"
		 "kiln [OPTIONS] render TARGET [-o PATH]     write a generated file (stdout "
		 "without -o)\n"
		 "kiln [OPTIONS] render all -o DIR           write every target into DIR\n"
		 "kiln model inspect FILE [--json]           tensors and metadata of a model file\n"
		 "kiln tokenize FILE [--text S | --ids L]    text <-> token ids\n"
		 "kiln [OPTIONS] status [--json] [NODES]     the cluster at a glance\n"
		 "kiln [OPTIONS] reboot [--wave N] NODES     rolling reboot in waves\n"
		 "kiln [OPTIONS] keygen [--key FILE]         the head's signing key pair\n"
		 "kiln [OPTIONS] sign [FILE]                 FILE.sig with the head's key\n"
		 "kiln verify --key PUB FILE [SIG]           check FILE's signature\n"
		 "kiln [OPTIONS] serve                       the head's provisioning server",
	.options = global_options,
	.option = parse_option,
	.epilog = "Exit status: 0 success, 1 failure, 2 usage or configuration error.\n"
		  "See kiln(1) and docs/config.md.\n",
	.verbs = verbs,
	.n_verbs = ARRAY_SIZE(verbs),
};

static int verb_help(int argc, char **argv)
{
	kiln_prog_help(&prog);
	return KILN_EXIT_OK;
}

static int parse_argv(int argc, char **argv)
{
	int r = kiln_parse_options(&prog, argc, argv);
	if (r <= 0)
		return r;
	/* a missing verb is kiln_verb_dispatch()'s error (it lists them) */
	return 1;
}

static int run(int argc, char **argv)
{
	int r = kiln_verb_dispatch(&prog, argc - optind, argv + optind);
	/* A table cut short (disk full, closed pipe) must not look like success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		log_error_errno(-(errno ? errno : EIO), "Failed to write to standard output: %m");
		return KILN_EXIT_FAILURE;
	}
	return r;
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
