/* kiln/prog.h — the one shape of a kiln program.
 *
 * Every kiln program (kiln, kiln-healthd, kiln-healthd-active, kiln-run,
 * kiln-train, kiln-inferd) is written the same way, after systemd's
 * parse_argv()/run()/DEFINE_MAIN_FUNCTION:
 *
 *   static const char *arg_config, *arg_node;
 *   static int arg_port = 8000;
 *
 *   static const kiln_option options[] = {
 *           KILN_OPTION_CONFIG_INTO(&arg_config),
 *           KILN_OPTION_NODE_INTO(&arg_node),
 *           { "port", 'p', "PORT", "TCP port (default 8000)" },
 *           KILN_OPTIONS_COMMON,
 *           {}
 *   };
 *   static int parse_option(int key, const char *arg);
 *   static const kiln_prog prog = { .name = "kiln-x", .summary = "does x",
 *                                   .usage = "kiln-x [OPTIONS]", .options = options,
 *                                   .option = parse_option, .no_args = true };
 *
 *   static int parse_option(int key, const char *arg)
 *   {
 *           switch (key) {
 *           case 'p':
 *                   if (kiln_parse_int(arg, 0, 65535, &arg_port) < 0)
 *                           return kiln_usage_error(&prog, "Invalid --port '%s'.", arg);
 *                   return 0;
 *           default:
 *                   return 1;
 *           }
 *   }
 *
 *   static int parse_argv(int argc, char **argv)
 *   {
 *           return kiln_parse_options(&prog, argc, argv);
 *   }
 *
 *   static int run(int argc, char **argv) { ... }
 *   KILN_DEFINE_MAIN(prog, parse_argv, run)
 *
 * A plain option (a string, or a flag that is set) names where it lands in
 * its table row (.str or .flag) and never reaches the program's code; the
 * shared ones (-v -q -h --version --dump-options) are handled by the
 * skeleton; parse_option() sees only what needs checking.
 *
 * parse_argv() returns > 0 to run, 0 to exit 0 (--help, --version printed),
 * < 0 for a usage error (already printed): exit 2.  run() returns the exit
 * status (KILN_EXIT_*), or a negative errno, which exits 1 (the error has
 * been logged where it happened).
 *
 * The option table is the only source of the getopt tables, of --help's
 * option list and of shell completion (--dump-options, read by
 * mk/gen-completion.sh).  Short letters mean the same thing in every kiln
 * program: the table in docs/where-to-change.md lists them, and
 * tests/common/test-cli-options.sh fails when two programs give one letter
 * two meanings. */
#pragma once

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>

#include "kiln/macro.h"

enum {
	KILN_EXIT_OK = 0,
	KILN_EXIT_FAILURE = 1, /* the work failed (I/O, unhealthy, a peer died ...) */
	KILN_EXIT_USAGE = 2,   /* bad command line or cluster file: fix and rerun */
};

/* Keys for long-only options start here; a short option's key is its letter. */
#define KILN_OPT_FIRST 0x100

/* Keys of the shared options (values every program may list). */
enum {
	KILN_OPT_VERSION = 0x80, /* below KILN_OPT_FIRST: reserved for the shared ones */
	KILN_OPT_NODE,
	KILN_OPT_JSON,
	KILN_OPT_DUMP_OPTIONS,
};

typedef struct kiln_option {
	const char *name;     /* long name without "--"; NULL ends the table */
	int key;	      /* a letter (also the short option) or a key >= KILN_OPT_FIRST */
	const char *arg;      /* metavar ("FILE") when it takes an argument; NULL: none */
	const char *help;     /* one line for --help (may hold '\n' + indent); NULL: hidden */
	const char *complete; /* "file", "dir", "node", "host", or a space-separated list of
				 words; NULL: free text */
	/* Where a plain option lands, so that no program repeats the case that
	 * stores it: an option with an argument stores optarg in *str, one
	 * without sets *flag to true.  Both NULL: the key goes to the program. */
	const char **str;
	bool *flag;
} kiln_option;

/* The shared rows; the _INTO forms name where the value lands (.str, .flag). */
#define KILN_OPTION_CONFIG_INTO(store)                                                          \
	{                                                                                       \
		"config", 'c', "FILE",                                                          \
			"cluster file (default $KILN_CONFIG or /etc/kiln/cluster.cfg)", "file", \
			.str = (store)                                                          \
	}
#define KILN_OPTION_NODE_INTO(store)                                                              \
	{                                                                                         \
		"node", KILN_OPT_NODE, "NAME",                                                    \
			"which node of the cluster file this is (default $SLURMD_NODENAME, then " \
			"the hostname)",                                                          \
			"node", .str = (store)                                                    \
	}
#define KILN_OPTION_JSON_INTO(store)                                                             \
	{                                                                                        \
		"json", KILN_OPT_JSON, NULL, "print JSON instead of text", NULL, .flag = (store) \
	}
#define KILN_OPTION_CONFIG KILN_OPTION_CONFIG_INTO(NULL)
#define KILN_OPTION_NODE   KILN_OPTION_NODE_INTO(NULL)
#define KILN_OPTION_JSON   KILN_OPTION_JSON_INTO(NULL)
/* -v, -q, -h, --version (and the hidden --dump-options); last in every table. */
#define KILN_OPTIONS_COMMON                                                       \
	{ "verbose", 'v', NULL, "more log output (repeat for debug)", NULL },     \
		{ "quiet", 'q', NULL, "less output", NULL },                      \
		{ "help", 'h', NULL, "show this help", NULL },                    \
		{ "version", KILN_OPT_VERSION, NULL, "print the version", NULL }, \
	{                                                                         \
		"dump-options", KILN_OPT_DUMP_OPTIONS, NULL, NULL, NULL           \
	}

/* A command with verbs (kiln check|show|render ...): each verb parses its
 * own options with its own kiln_prog and has its own --help. */
typedef struct kiln_verb {
	const char *name;
	const char *summary;
	/* argv[0] is the verb; with a prog, its options are parsed already and
	 * optind is at its first argument; returns the exit status. */
	int (*run)(int argc, char **argv);
	const struct kiln_prog *prog; /* the verb's options; NULL: run() parses argv */
} kiln_verb;

typedef struct kiln_prog {
	const char *name;	    /* "kiln-healthd", or "kiln render" for a verb */
	const char *summary;	    /* one line: what it is */
	const char *usage;	    /* usage lines, '\n'-separated, without "Usage: " */
	const kiln_option *options; /* terminated by an entry with name NULL */
	const char *epilog;	    /* after the option list (exit status, see also); NULL */
	bool stop_at_positional;    /* stop at the first non-option (a command line follows) */
	bool no_args;		    /* kiln_parse_options() refuses any positional argument */
	/* The program's own options, those its table does not store: returns 0
	 * when it took the key, 1 to leave it to kiln_prog_option() (-v -q -h
	 * --version ...), or a negative errno after printing a usage error.
	 * NULL: the table stores every option. */
	int (*option)(int key, const char *arg);
	const kiln_verb *verbs; /* a command with verbs: listed in --help and --dump-options */
	size_t n_verbs;
	/* Completion of the positional arguments for --dump-options: one
	 * kiln_option.complete value per position, '|'-separated
	 * ("nodes node|node": `show nodes` or `show node NAME`); NULL: none. */
	const char *args_complete;
} kiln_prog;

/* Called first by KILN_DEFINE_MAIN: names the program for log lines. */
void kiln_prog_init(const kiln_prog *p);

/* getopt_long() over the option table.  Stores the plain options (.str,
 * .flag) itself and returns the next other option's key, -1 at the end of
 * the options, or '?' for an unknown option or a missing argument (getopt
 * has printed it; kiln_prog_option('?') adds the hint).  optarg/optind as
 * with getopt_long(). */
int kiln_getopt(const kiln_prog *p, int argc, char **argv);

/* The option loop of every program: kiln_getopt() over p's table, each
 * key it returns first to p->option(key, optarg), then, if that leaves it,
 * to kiln_prog_option().  With p->no_args, a positional argument is a usage error
 * ("Unexpected argument 'X'.").  Returns > 0 to run, 0 to exit 0 (--help,
 * --version), < 0 for a usage error (printed); kiln_parse_exit() maps that
 * to an exit status. */
int kiln_parse_options(const kiln_prog *p, int argc, char **argv);

/* kiln_parse_options()'s result (<= 0) as the exit status: 0 after --help,
 * KILN_EXIT_USAGE after a usage error. */
static inline int kiln_parse_exit(int r)
{
	return r < 0 ? KILN_EXIT_USAGE : KILN_EXIT_OK;
}

/* The shared options and the errors: -v/-q adjust the log level and return
 * 1 (go on parsing); -h and --version print and return 0 (exit 0);
 * --dump-options prints the table for completion and returns 0; '?' or any
 * key the program did not handle prints "Try 'PROG --help'." and returns
 * -EINVAL (exit 2). */
int kiln_prog_option(const kiln_prog *p, int key);

/* Prints --help from the table to stdout. */
void kiln_prog_help(const kiln_prog *p);

/* Logs "MESSAGE Try 'PROG --help'." as an error; returns -EINVAL. */
int kiln_usage_error(const kiln_prog *p, const char *format, ...) _printf_(2, 3);

/* The same for a verb's run(), which returns an exit status: returns
 * KILN_EXIT_USAGE. */
int kiln_usage_exit(const kiln_prog *p, const char *format, ...) _printf_(2, 3);

/* The exit status for run()'s result: >= 0 as is, < 0 -> KILN_EXIT_FAILURE. */
static inline int kiln_prog_exit(int r)
{
	return r < 0 ? KILN_EXIT_FAILURE : r;
}

/* The exit status for a failed kiln_cfg_open() (or any call that returns
 * -EINVAL for bad input): -EINVAL -> KILN_EXIT_USAGE, else KILN_EXIT_FAILURE. */
static inline int kiln_exit_for_config(int r)
{
	return r >= 0 ? KILN_EXIT_OK : r == -EINVAL ? KILN_EXIT_USAGE : KILN_EXIT_FAILURE;
}

/* Which node this is: `arg` (--node) if given, else $SLURMD_NODENAME, else
 * the hostname.  Returns 0, or -ENAMETOOLONG if it does not fit `len`.
 * `*source` (may be NULL) says which: "--node", "$SLURMD_NODENAME",
 * "hostname". */
int kiln_node_name(const char *arg, char *buf, size_t len, const char **source);

/* Runs the verb of p->verbs named argv[0] (argv as left after the global
 * options: argv[0] is the verb), after parsing its options with
 * kiln_parse_options() when it has a prog (--help, a usage error: exit
 * without running it).  Unknown or missing: an error listing every verb,
 * KILN_EXIT_USAGE. */
int kiln_verb_dispatch(const kiln_prog *p, int argc, char **argv);

/* main() for a program; KILN_DEFINE_MAIN_AS names the function (tests). */
#define KILN_DEFINE_MAIN_AS(fn, prog, parse, run)       \
	int fn(int argc, char **argv)                   \
	{                                               \
		kiln_prog_init(&(prog));                \
		int _r = parse(argc, argv);             \
		if (_r <= 0)                            \
			return kiln_parse_exit(_r);     \
		return kiln_prog_exit(run(argc, argv)); \
	}
#define KILN_DEFINE_MAIN(prog, parse, run) KILN_DEFINE_MAIN_AS(main, prog, parse, run)
