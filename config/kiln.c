/* kiln.c — the admin CLI: check, show and render the cluster file.
 *
 *   kiln [-c FILE] check
 *   kiln [-c FILE] show nodes | node NAME | --defaults
 *   kiln [-c FILE] render TARGET [-o PATH] [--node NAME]
 *   kiln [-c FILE] render all -o DIR
 *   kiln model inspect FILE [--json]      (config/kiln-model.c)
 *   kiln tokenize FILE [--text S | --ids L] (config/kiln-tokenize.c)
 *
 * Exit status: 0 success, 1 failure (I/O), 2 usage or configuration error.
 * Configuration errors go to stderr one per line, exactly as the library
 * formats them (FILE:LINE: setting.path: message; hint), so editors and
 * tests can parse them; everything else is logged with log.h. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

int kiln_model_main(int argc, char **argv);    /* kiln-model.c */
int kiln_tokenize_main(int argc, char **argv); /* kiln-tokenize.c */

static const char *arg_config;
static const char *arg_output;
static const char *arg_node;
static bool arg_defaults;
static int arg_quiet;

static void help(void)
{
	printf("kiln " KILN_VERSION " — check, show and render a kiln cluster file.\n\n"
	       "Usage:\n"
	       "  kiln [OPTIONS] check                     validate the cluster file\n"
	       "  kiln [OPTIONS] show nodes                table of every node\n"
	       "  kiln [OPTIONS] show node NAME            everything about one node (or the "
	       "head)\n"
	       "  kiln show --defaults                     every key with its type and default\n"
	       "  kiln [OPTIONS] render TARGET [-o PATH]   write a generated file (stdout without "
	       "-o)\n"
	       "  kiln [OPTIONS] render all -o DIR         write every target into DIR\n"
	       "  kiln model inspect FILE [--json]         tensors and metadata of a model file\n"
	       "  kiln tokenize FILE [--text S | --ids L]  text <-> token ids (kiln tokenize "
	       "--help)\n\n"
	       "Targets: slurm.conf gres.conf cgroup.conf dnsmasq.conf boot.ipxe hosts node-env\n"
	       "image-env\n"
	       "(node-env needs --node NAME; NAME may be the head node).\n\n"
	       "Options:\n"
	       "  -c, --config FILE   cluster file (default $" KILN_CFG_ENV
	       " or " KILN_CFG_DEFAULT_PATH ")\n"
	       "  -o, --output PATH   where render writes (atomically)\n"
	       "  -n, --node NAME     node for render node-env\n"
	       "      --defaults      with show: print the schema table\n"
	       "  -v, --verbose       more log output\n"
	       "  -q, --quiet         less output\n"
	       "  -h, --help          this help\n"
	       "      --version       print the version\n\n"
	       "Exit status: 0 success, 1 failure, 2 usage or configuration error.\n"
	       "See kiln(1) and docs/config.md.\n");
}

static int load(kiln_cfg **ret)
{
	const char *path = arg_config ? arg_config : kiln_cfg_default_path();
	_cleanup_(kiln_cfg_errors_freep) kiln_cfg_errors errs;
	kiln_cfg_errors_init(&errs);
	int r = kiln_cfg_load(path, ret, &errs);
	if (r == -EINVAL && errs.n > 0) {
		kiln_cfg_errors_print(&errs, stderr);
		return -EINVAL;
	}
	if (r == -ENOENT) {
		log_error("Cluster file '%s' does not exist; pass -c FILE or set $" KILN_CFG_ENV
			  ".",
			  path);
		return -EINVAL;
	}
	if (r == -EFBIG) {
		log_error("Cluster file '%s' is larger than %u MiB; is it the right file?", path,
			  KILN_CFG_FILE_MAX / (1024u * 1024u));
		return -EINVAL;
	}
	if (r < 0) {
		log_error_errno(r, "Failed to read cluster file '%s': %m", path);
		return r;
	}
	return 0;
}

static int exit_for(int r)
{
	if (r >= 0)
		return EXIT_OK;
	return r == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
}

static int cmd_check(void)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = load(&c);
	if (r < 0)
		return exit_for(r);
	if (!arg_quiet)
		printf("%s: OK (%zu node%s in %zu group%s, %zu partition%s)\n", c->path, c->n_nodes,
		       c->n_nodes == 1 ? "" : "s", c->n_groups, c->n_groups == 1 ? "" : "s",
		       c->slurm.n_partitions, c->slurm.n_partitions == 1 ? "" : "s");
	return EXIT_OK;
}

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

static void node_gpus(const kiln_cfg_node *n, char *buf, size_t len)
{
	const kiln_cfg_group *g = n->group;
	if (g->gpu_count <= 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%d x %s", g->gpu_count, g->gpu_type ? g->gpu_type : "gpu");
}

static void join(char *buf, size_t len, char **v)
{
	buf[0] = 0;
	size_t o = 0;
	for (size_t i = 0; v && v[i] && o < len; i++)
		o += (size_t) snprintf(buf + o, len - o, "%s%s", i ? "," : "", v[i]);
	if (!buf[0])
		snprintf(buf, len, "-");
}

static int cmd_show(int argc, char **argv)
{
	if (arg_defaults) {
		if (argc > 0) {
			log_error("show --defaults takes no arguments.");
			return EXIT_USAGE;
		}
		print_defaults();
		return EXIT_OK;
	}
	if (argc < 1) {
		log_error("show needs what to show: nodes, node NAME, or --defaults.");
		return EXIT_USAGE;
	}
	bool all = streq(argv[0], "nodes");
	if (!all && !streq(argv[0], "node")) {
		log_error("Unknown show target '%s'; use nodes, node NAME, or --defaults.",
			  argv[0]);
		return EXIT_USAGE;
	}
	if ((all && argc != 1) || (!all && argc != 2)) {
		log_error(all ? "show nodes takes no arguments."
			      : "show node needs exactly one NAME.");
		return EXIT_USAGE;
	}
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = load(&c);
	if (r < 0)
		return exit_for(r);
	char ab[16], mb[18], gb[64], pb[256];
	if (all) {
		printf("%-16s %-12s %-15s %-17s %-12s %s\n", "NAME", "GROUP", "ADDRESS", "MAC",
		       "GPUS", "PARTITIONS");
		for (size_t i = 0; i < c->n_nodes; i++) {
			const kiln_cfg_node *n = &c->nodes[i];
			node_gpus(n, gb, sizeof(gb));
			join(pb, sizeof(pb), n->partitions);
			printf("%-16s %-12s %-15s %-17s %-12s %s\n", n->name, n->group->name,
			       kiln_format_ipv4(ab, n->address), kiln_format_mac(mb, n->mac), gb,
			       pb);
		}
		return EXIT_OK;
	}
	const kiln_cfg_node *n = kiln_cfg_find_node(c, argv[1]);
	if (!n && streq(argv[1], c->head.hostname)) {
		/* The head node: what render node-env --node HEAD knows about it. */
		printf("name:        %s\n", c->head.hostname);
		if (c->cluster.domain)
			printf("fqdn:        %s.%s\n", c->head.hostname, c->cluster.domain);
		printf("role:        head\n");
		printf("address:     %s/%d\n", kiln_format_ipv4(ab, c->head.address),
		       c->network.prefix);
		printf("interface:   %s\n", c->network.boot_interface);
		printf("services:    munge slurmctld dnsmasq\n");
		return EXIT_OK;
	}
	if (!n) {
		log_error("No node '%s' in %s; `kiln show nodes` lists them.", argv[1], c->path);
		return EXIT_USAGE;
	}
	const kiln_cfg_group *g = n->group;
	printf("name:        %s\n", n->name);
	if (c->cluster.domain)
		printf("fqdn:        %s.%s\n", n->name, c->cluster.domain);
	printf("role:        compute\n");
	printf("group:       %s\n", g->name);
	printf("address:     %s/%d\n", kiln_format_ipv4(ab, n->address), c->network.prefix);
	printf("mac:         %s\n", kiln_format_mac(mb, n->mac));
	printf("gpus:        %d%s%s\n", g->gpu_count, g->gpu_model ? " x " : "",
	       strempty(g->gpu_model));
	printf("gres type:   %s\n", g->gpu_type ? g->gpu_type : "-");
	printf("cpus:        %d (%d sockets x %d cores x %d threads)\n", g->cpus, g->sockets,
	       g->cores_per_socket, g->threads_per_core);
	printf("memory:      %llu MiB\n", (unsigned long long) g->memory_mb);
	join(pb, sizeof(pb), n->partitions);
	printf("partitions:  %s\n", pb);
	join(pb, sizeof(pb), g->features);
	printf("features:    %s\n", pb);
	printf("services:    munge slurmd%s%s\n", c->health.enabled ? " kiln-healthd" : "",
	       n->inference ? " kiln-inferd" : "");
	return EXIT_OK;
}

static bool is_target(const char *t)
{
	for (size_t i = 0; kiln_cfg_render_targets[i]; i++)
		if (streq(kiln_cfg_render_targets[i], t))
			return true;
	return false;
}

static int write_out(const char *path, const char *data)
{
	int r = kiln_write_file_atomic(path, data, strlen(data), 0644);
	if (r < 0)
		return log_error_errno(r, "Failed to write '%s': %m", path);
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

static int render_all(const kiln_cfg *c)
{
	if (!arg_output) {
		log_error("render all needs -o DIR.");
		return EXIT_USAGE;
	}
	_cleanup_free_ char *envdir = NULL;
	if (asprintf(&envdir, "%s/node-env", arg_output) < 0)
		return log_error_errno(-ENOMEM, "Out of memory"), EXIT_FAIL;
	int r = mkdir_p(envdir);
	if (r < 0)
		return log_error_errno(r, "Failed to create '%s': %m", envdir), EXIT_FAIL;
	for (size_t i = 0; kiln_cfg_render_targets[i]; i++) {
		const char *t = kiln_cfg_render_targets[i];
		if (streq(t, "node-env"))
			continue;
		_cleanup_free_ char *text = NULL, *path = NULL;
		r = kiln_cfg_render(c, t, NULL, &text);
		if (r < 0)
			return log_error_errno(r, "Failed to render %s: %m", t), EXIT_FAIL;
		if (asprintf(&path, "%s/%s", arg_output, t) < 0)
			return EXIT_FAIL;
		if (write_out(path, text) < 0)
			return EXIT_FAIL;
	}
	for (size_t i = 0; i <= c->n_nodes; i++) {
		const char *name = i < c->n_nodes ? c->nodes[i].name : c->head.hostname;
		_cleanup_free_ char *text = NULL, *path = NULL;
		r = kiln_cfg_render(c, "node-env", name, &text);
		if (r < 0)
			return log_error_errno(r, "Failed to render node-env for %s: %m", name),
			       EXIT_FAIL;
		if (asprintf(&path, "%s/%s", envdir, name) < 0)
			return EXIT_FAIL;
		if (write_out(path, text) < 0)
			return EXIT_FAIL;
	}
	if (!arg_quiet)
		printf("Wrote %zu files to %s\n", (size_t) 6 + c->n_nodes + 1, arg_output);
	return EXIT_OK;
}

static int cmd_render(int argc, char **argv)
{
	if (argc != 1) {
		log_error("render needs exactly one TARGET (or all); see kiln --help.");
		return EXIT_USAGE;
	}
	const char *t = argv[0];
	if (!streq(t, "all") && !is_target(t)) {
		log_error("Unknown render target '%s'; one of slurm.conf gres.conf cgroup.conf "
			  "dnsmasq.conf "
			  "boot.ipxe hosts node-env all.",
			  t);
		return EXIT_USAGE;
	}
	if (streq(t, "node-env") && !arg_node) {
		log_error("render node-env needs --node NAME.");
		return EXIT_USAGE;
	}
	if (!streq(t, "node-env") && arg_node) {
		log_error("--node applies to render node-env only, not to %s.", t);
		return EXIT_USAGE;
	}
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = load(&c);
	if (r < 0)
		return exit_for(r);
	if (streq(t, "all"))
		return render_all(c);
	_cleanup_free_ char *text = NULL;
	r = kiln_cfg_render(c, t, arg_node, &text);
	if (r == -ENXIO) {
		log_error("No node '%s' in %s; `kiln show nodes` lists them.", arg_node, c->path);
		return EXIT_USAGE;
	}
	if (r < 0) {
		log_error_errno(r, "Failed to render %s: %m", t);
		return EXIT_FAIL;
	}
	if (!arg_output || streq(arg_output, "-")) {
		fputs(text, stdout);
		return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
	}
	return write_out(arg_output, text) < 0 ? EXIT_FAIL : EXIT_OK;
}

int main(int argc, char **argv)
{
	enum { ARG_VERSION = 0x100, ARG_DEFAULTS };
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "output", required_argument, NULL, 'o' },
		{ "node", required_argument, NULL, 'n' },
		{ "defaults", no_argument, NULL, ARG_DEFAULTS },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, ARG_VERSION },
		{},
	};
	log_set_program("kiln");
	/* `kiln model ...` parses its own options (config/kiln-model.c). */
	if (argc > 1 && streq(argv[1], "model"))
		return kiln_model_main(argc - 1, argv + 1);
	if (argc > 1 && streq(argv[1], "tokenize"))
		return kiln_tokenize_main(argc - 1, argv + 1);
	int o;
	while ((o = getopt_long(argc, argv, "c:o:n:vqh", opts, NULL)) >= 0) {
		switch (o) {
		case 'c':
			arg_config = optarg;
			break;
		case 'o':
			arg_output = optarg;
			break;
		case 'n':
			arg_node = optarg;
			break;
		case ARG_DEFAULTS:
			arg_defaults = true;
			break;
		case 'v':
			log_adjust_level(+1);
			break;
		case 'q':
			arg_quiet = 1;
			log_adjust_level(-1);
			break;
		case 'h':
			help();
			return EXIT_OK;
		case ARG_VERSION:
			printf("kiln %s\n", KILN_VERSION);
			return EXIT_OK;
		default:
			fprintf(stderr, "Try 'kiln --help'.\n");
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		log_error("No command given; one of check, show, render. See kiln --help.");
		return EXIT_USAGE;
	}
	const char *cmd = argv[optind];
	int n = argc - optind - 1;
	char **rest = argv + optind + 1;
	int r;
	if (streq(cmd, "check")) {
		if (n) {
			log_error("check takes no arguments (use -c FILE).");
			return EXIT_USAGE;
		}
		r = cmd_check();
	} else if (streq(cmd, "show"))
		r = cmd_show(n, rest);
	else if (streq(cmd, "render"))
		r = cmd_render(n, rest);
	else if (streq(cmd, "help")) {
		help();
		r = EXIT_OK;
	} else {
		log_error("Unknown command '%s'; one of check, show, render. See kiln --help.",
			  cmd);
		return EXIT_USAGE;
	}
	/* A table cut short (disk full, closed pipe) must not look like success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		log_error_errno(-(errno ? errno : EIO), "Failed to write to standard output: %m");
		return EXIT_FAIL;
	}
	return r;
}
