/* test-prog.c — the program skeleton (kiln/prog.h): option tables to getopt,
 * --help and --dump-options output, the shared options and their exit
 * meanings, verbs, "which node am I", and the journal test of log.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/prog.h"

enum { OPT_LONGONLY = KILN_OPT_FIRST };

static const char *seen_config, *seen_node, *seen_port;
static bool seen_json, seen_long;
static int own_calls; /* keys that reached parse_option() */

static const kiln_option options[] = { KILN_OPTION_CONFIG_INTO(&seen_config),
				       KILN_OPTION_NODE_INTO(&seen_node),
				       { "port", 'p', "PORT", "TCP port", NULL },
				       { "long-only", OPT_LONGONLY, NULL,
					 "a long option\nwith a second line", NULL,
					 .flag = &seen_long },
				       { "secret", 's', NULL, NULL, NULL }, /* hidden from --help */
				       KILN_OPTION_JSON_INTO(&seen_json),
				       KILN_OPTIONS_COMMON,
				       {} };
static int parse_option(int key, const char *arg);
static const kiln_prog prog = { .name = "kiln-test",
				.summary = "tests the skeleton",
				.usage = "kiln-test [OPTIONS] ARG\nkiln-test --json",
				.options = options,
				.option = parse_option,
				.epilog = "Exit status: 0 ok.\n" };

/* Runs fn(argc, argv) in a child with stdout and stderr captured in out;
 * returns its exit status. */
static int run_child(int (*fn)(int, char **), int argc, char **argv, char *out, size_t len)
{
	char path[] = "/tmp/test-prog-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	unlink(path);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		setenv("KILN_LOG_PREFIX", "0", 1);
		int r = fn(argc, argv);
		fflush(NULL);
		_exit(r);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	ssize_t n = pread(fd, out, len - 1, 0);
	out[n > 0 ? n : 0] = 0;
	close(fd);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* Only what the table does not store reaches the program: -p, -s, and the
 * shared keys it hands back (1). */
static int parse_option(int key, const char *arg)
{
	own_calls++;
	switch (key) {
	case 'p':
		if (streq(arg, "bad"))
			return kiln_usage_error(&prog, "Invalid --port '%s'.", arg);
		seen_port = arg;
		return 0;
	case 's':
		return 0;
	default:
		return 1;
	}
}

static int parse_argv(int argc, char **argv)
{
	optind = 0;
	int r = kiln_parse_options(&prog, argc, argv);
	if (r <= 0)
		return r;
	if (optind + 1 != argc)
		return kiln_usage_error(&prog, "Expected one argument.");
	return 1;
}

static int run(int argc, char **argv)
{
	printf("ran %s\n", argv[argc - 1]);
	return 7;
}

static KILN_DEFINE_MAIN_AS(test_main, prog, parse_argv, run)

	static void test_parse(void **state)
{
	char *argv[] = { "kiln-test", "-c",	     "x.cfg", "--port=81",
			 "--json",    "--long-only", "arg",   NULL };
	own_calls = 0;
	assert_int_equal(parse_argv(7, argv), 1);
	assert_string_equal(seen_config, "x.cfg");
	assert_string_equal(seen_port, "81");
	assert_true(seen_json && seen_long);
	assert_int_equal(own_calls, 1); /* --port only: the rest landed in the table's stores */

	/* short and long spellings land in the same store; -s reaches the program */
	char *argv2[] = { "kiln-test", "--config=y.cfg", "--node", "n7", "-s", "-v", "arg", NULL };
	own_calls = 0;
	assert_int_equal(parse_argv(7, argv2), 1);
	assert_string_equal(seen_config, "y.cfg");
	assert_string_equal(seen_node, "n7");
	assert_int_equal(own_calls, 2); /* -s, and -v handed on to kiln_prog_option() */
	log_adjust_level(-1);

	/* the program's own usage error stops the loop: exit 2, its message */
	char out[1024];
	char *argv3[] = { "kiln-test", "-p", "bad", "arg", NULL };
	assert_int_equal(run_child(test_main, 4, argv3, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_string_equal(out,
			    "kiln-test: error: Invalid --port 'bad'. Try 'kiln-test --help'.\n");
}

static void test_exit_codes(void **state)
{
	char out[8192];
	char *ok[] = { "kiln-test", "-v", "-q", "a", NULL };
	assert_int_equal(run_child(test_main, 4, ok, out, sizeof(out)), 7);
	assert_string_equal(out, "ran a\n");

	char *help[] = { "kiln-test", "--help", NULL };
	assert_int_equal(run_child(test_main, 2, help, out, sizeof(out)), KILN_EXIT_OK);
	assert_non_null(strstr(out,
			       "kiln-test — tests the skeleton\n\nUsage:\n  kiln-test [OPTIONS] "
			       "ARG\n  kiln-test --json\n"));
	assert_non_null(strstr(out, "  -p, --port PORT       TCP port\n"));
	assert_non_null(strstr(out, "      --long-only       a long option\n"
				    "                        with a second line\n"));
	assert_non_null(strstr(out, "  -c, --config FILE     cluster file"));
	assert_null(strstr(out, "secret"));
	assert_null(strstr(out, "dump-options"));
	assert_non_null(strstr(out, "\nExit status: 0 ok.\n"));

	char *version[] = { "kiln-test", "--version", NULL };
	assert_int_equal(run_child(test_main, 2, version, out, sizeof(out)), KILN_EXIT_OK);
	assert_string_equal(out, "kiln-test " KILN_VERSION "\n");

	char *bad[] = { "kiln-test", "--nope", "a", NULL };
	assert_int_equal(run_child(test_main, 3, bad, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_non_null(strstr(out, "unrecognized option '--nope'"));
	assert_non_null(strstr(out, "Try 'kiln-test --help'."));

	char *missing[] = { "kiln-test", "a", "-p", NULL };
	assert_int_equal(run_child(test_main, 3, missing, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_non_null(strstr(out, "requires an argument"));

	char *extra[] = { "kiln-test", "a", "b", NULL };
	assert_int_equal(run_child(test_main, 3, extra, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_non_null(
		strstr(out, "kiln-test: error: Expected one argument. Try 'kiln-test --help'."));
}

static void test_dump_options(void **state)
{
	char out[8192];
	char *dump[] = { "kiln-test", "--dump-options", NULL };
	assert_int_equal(run_child(test_main, 2, dump, out, sizeof(out)), KILN_EXIT_OK);
	assert_non_null(strstr(out, "option\t--config\t-c\tFILE\tfile\n"));
	assert_non_null(strstr(out, "option\t--node\t\tNAME\tnode\n"));
	assert_non_null(strstr(out, "option\t--port\t-p\tPORT\t\n"));
	assert_non_null(strstr(out, "option\t--secret\t-s\t\t\n")); /* hidden, still completed */
	assert_non_null(strstr(out, "option\t--version\t\t\t\n"));
	assert_null(strstr(out, "dump-options"));
}

/* ---- verbs ----------------------------------------------------------- */

static const char *verb_output;
static const kiln_option verb_options[] = {
	{ "output", 'o', "PATH", "where", "file", .str = &verb_output }, KILN_OPTIONS_COMMON, {}
};
static const kiln_prog verb_prog = { .name = "kiln-test render",
				     .summary = "renders",
				     .usage = "kiln-test render [-o PATH]",
				     .options = verb_options };

/* A verb with a prog: kiln_verb_dispatch() has parsed its options. */
static int verb_run(int argc, char **argv)
{
	printf("render to %s, %d left\n", verb_output ?: "-", argc - optind);
	return 0;
}

/* A verb without one gets its words as they are. */
static int check_run(int argc, char **argv)
{
	printf("check got %d words, optind %d\n", argc, optind);
	return 0;
}

static const kiln_verb verbs[] = {
	{ "render", "renders files", verb_run, &verb_prog },
	{ "check", "checks", check_run, NULL },
};
static const char *top_config;
static const kiln_option top_options[] = { KILN_OPTION_CONFIG_INTO(&top_config),
					   KILN_OPTIONS_COMMON,
					   {} };
static const kiln_prog top = { .name = "kiln-test",
			       .summary = "has verbs",
			       .usage = "kiln-test [OPTIONS] COMMAND ...",
			       .options = top_options,
			       .verbs = verbs,
			       .n_verbs = ARRAY_SIZE(verbs) };

static int top_main(int argc, char **argv)
{
	optind = 0;
	int r = kiln_parse_options(&top, argc, argv);
	if (r <= 0)
		return kiln_parse_exit(r);
	return kiln_verb_dispatch(&top, argc - optind, argv + optind);
}

static void test_verbs(void **state)
{
	char out[8192];
	char *r1[] = { "kiln-test", "-c", "f", "render", "-o", "x", "y", NULL };
	assert_int_equal(run_child(top_main, 7, r1, out, sizeof(out)), 0);
	assert_string_equal(out, "render to x, 1 left\n");

	char *r1b[] = { "kiln-test", "render", "--nope", NULL };
	assert_int_equal(run_child(top_main, 3, r1b, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_non_null(strstr(out, "Try 'kiln-test render --help'."));
	assert_null(strstr(out, "render to")); /* not run */

	char *r1c[] = { "kiln-test", "check", "--nope", "y", NULL };
	assert_int_equal(run_child(top_main, 4, r1c, out, sizeof(out)), 0);
	assert_string_equal(out, "check got 3 words, optind 0\n");

	char *r2[] = { "kiln-test", "render", "--help", NULL };
	assert_int_equal(run_child(top_main, 3, r2, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "kiln-test render — renders\n"));
	assert_non_null(strstr(out, "-o, --output PATH"));

	char *r3[] = { "kiln-test", "frob", NULL };
	assert_int_equal(run_child(top_main, 2, r3, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_non_null(strstr(out, "Unknown command 'frob'. Commands:"));
	assert_non_null(strstr(out, "  render "));
	assert_non_null(strstr(out, "  check "));

	char *r4[] = { "kiln-test", NULL };
	assert_int_equal(run_child(top_main, 1, r4, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_non_null(strstr(out, "No command given."));

	char *r5[] = { "kiln-test", "--help", NULL };
	assert_int_equal(run_child(top_main, 2, r5, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "Commands:\n  render             renders files\n"));
	assert_non_null(strstr(out, "See 'kiln-test COMMAND --help'"));

	char *r6[] = { "kiln-test", "--dump-options", NULL };
	assert_int_equal(run_child(top_main, 2, r6, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "verb\trender\trenders files\n"));
	assert_non_null(strstr(out, "render\toption\t--output\t-o\tPATH\tfile\n"));
	assert_non_null(strstr(out, "verb\tcheck\tchecks\n"));
}

/* ---- no positional arguments, kiln_usage_exit() ----------------------- */

static const kiln_option bare_options[] = { KILN_OPTIONS_COMMON, {} };
static const kiln_prog bare = { .name = "kiln-bare",
				.summary = "takes no arguments",
				.usage = "kiln-bare",
				.options = bare_options,
				.no_args = true };

static int bare_main(int argc, char **argv)
{
	kiln_prog_init(&bare);
	optind = 0;
	int r = kiln_parse_options(&bare, argc, argv);
	if (r <= 0)
		return kiln_parse_exit(r);
	if (getenv("BARE_FAIL"))
		return kiln_usage_exit(&bare, "Told to fail (%d).", 42);
	printf("ran\n");
	return 0;
}

static void test_no_args(void **state)
{
	char out[8192];
	char *ok[] = { "kiln-bare", "-q", NULL };
	assert_int_equal(run_child(bare_main, 2, ok, out, sizeof(out)), 0);
	assert_string_equal(out, "ran\n");

	char *extra[] = { "kiln-bare", "x", NULL };
	assert_int_equal(run_child(bare_main, 2, extra, out, sizeof(out)), KILN_EXIT_USAGE);
	assert_string_equal(out,
			    "kiln-bare: error: Unexpected argument 'x'. Try 'kiln-bare --help'.\n");

	setenv("BARE_FAIL", "1", 1);
	assert_int_equal(run_child(bare_main, 1, ok, out, sizeof(out)), KILN_EXIT_USAGE);
	unsetenv("BARE_FAIL");
	assert_string_equal(out, "kiln-bare: error: Told to fail (42). Try 'kiln-bare --help'.\n");
}

static void test_node_name(void **state)
{
	char buf[64], host[256];
	const char *src;
	unsetenv("SLURMD_NODENAME");
	assert_int_equal(kiln_node_name("n1", buf, sizeof(buf), &src), 0);
	assert_string_equal(buf, "n1");
	assert_string_equal(src, "--node");
	setenv("SLURMD_NODENAME", "node07", 1);
	assert_int_equal(kiln_node_name(NULL, buf, sizeof(buf), &src), 0);
	assert_string_equal(buf, "node07");
	assert_string_equal(src, "$SLURMD_NODENAME");
	assert_int_equal(kiln_node_name("n1", buf, sizeof(buf), NULL), 0);
	assert_string_equal(buf, "n1"); /* --node wins */
	setenv("SLURMD_NODENAME", "", 1);
	assert_int_equal(kiln_node_name(NULL, buf, sizeof(buf), &src), 0);
	assert_int_equal(gethostname(host, sizeof(host)), 0);
	assert_string_equal(buf, host);
	assert_string_equal(src, "hostname");
	assert_int_equal(kiln_node_name("a-very-long-name", buf, 4, NULL), -ENAMETOOLONG);
	unsetenv("SLURMD_NODENAME");
}

static int log_one(int argc, char **argv)
{
	log_set_program("kiln-test");
	log_error("boom");
	return 0;
}

static int log_journal(int argc, char **argv)
{
	struct stat st;
	char js[64];
	if (fstat(STDERR_FILENO, &st) < 0)
		return 99;
	snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long) st.st_dev,
		 (unsigned long long) st.st_ino);
	setenv("JOURNAL_STREAM", js, 1);
	unsetenv("KILN_LOG_PREFIX");
	return log_one(argc, argv);
}

/* sd-daemon prefixes only when $JOURNAL_STREAM names stderr itself. */
static void test_journal_prefix(void **state)
{
	char out[512];
	char *argv[] = { "x", NULL };

	unsetenv("JOURNAL_STREAM");
	assert_int_equal(run_child(log_one, 1, argv, out, sizeof(out)), 0);
	assert_string_equal(out, "kiln-test: error: boom\n");
	/* a pipe or file that inherited another stream's $JOURNAL_STREAM */
	setenv("JOURNAL_STREAM", "1:2", 1);
	assert_int_equal(run_child(log_one, 1, argv, out, sizeof(out)), 0);
	assert_string_equal(out, "kiln-test: error: boom\n");
	unsetenv("JOURNAL_STREAM");
	/* stderr is the stream $JOURNAL_STREAM names: the journal */
	assert_int_equal(run_child(log_journal, 1, argv, out, sizeof(out)), 0);
	assert_string_equal(out, "<3>boom\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),	       cmocka_unit_test(test_exit_codes),
		cmocka_unit_test(test_dump_options),   cmocka_unit_test(test_verbs),
		cmocka_unit_test(test_no_args),	       cmocka_unit_test(test_node_name),
		cmocka_unit_test(test_journal_prefix),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
