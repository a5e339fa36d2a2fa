/* prog.c — the program skeleton of kiln/prog.h: getopt tables, --help and
 * --dump-options built from one option table, the shared options, verbs,
 * and "which node am I".
 *
 * getopt_long() wants a short-option string and a struct option array; both
 * are derived here from the kiln_option table on the first call, so a
 * program lists each option exactly once. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/log.h"
#include "kiln/prog.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

/* More options than any kiln program has (kiln-inferd: ~30). */
#define KILN_OPTIONS_MAX 96

static bool is_short(int key)
{
	return key > 0 && key < 0x80 && isalnum(key);
}

static size_t count_options(const kiln_option *o)
{
	size_t n = 0;
	while (o && o[n].name)
		n++;
	return n;
}

int kiln_getopt(const kiln_prog *p, int argc, char **argv)
{
	/* One program parses one table at a time; a verb's table replaces the
	 * global one when the verb starts parsing (optind is reset then). */
	static const kiln_prog *built;
	static struct option longopts[KILN_OPTIONS_MAX + 1];
	static char shortopts[2 + 3 * KILN_OPTIONS_MAX + 1];

	if (built != p) {
		size_t n = count_options(p->options), k = 0;
		if (n > KILN_OPTIONS_MAX)
			n = KILN_OPTIONS_MAX;
		/* '+': stop at the first non-option when a command line or a
		 * verb follows; ':' is not used: getopt prints its own message. */
		if (p->stop_at_positional || p->n_verbs > 0)
			shortopts[k++] = '+';
		for (size_t i = 0; i < n; i++) {
			const kiln_option *o = &p->options[i];
			longopts[i] =
				(struct option){ o->name, o->arg ? required_argument : no_argument,
						 NULL, o->key };
			if (is_short(o->key)) {
				shortopts[k++] = (char) o->key;
				if (o->arg)
					shortopts[k++] = ':';
			}
		}
		longopts[n] = (struct option){};
		shortopts[k] = 0;
		built = p;
	}
	for (;;) {
		int i = -1, c = getopt_long(argc, argv, shortopts, longopts, &i);
		const kiln_option *o = NULL;
		if (i >= 0) /* a long option */
			o = &p->options[i];
		else
			for (const kiln_option *x = p->options; x && c > 0 && x->name && !o; x++)
				if (x->key == c)
					o = x;
		if (o && o->str && o->arg)
			*o->str = optarg;
		else if (o && o->flag && !o->arg)
			*o->flag = true;
		else
			return c;
	}
}

int kiln_parse_options(const kiln_prog *p, int argc, char **argv)
{
	int c, r;
	while ((c = kiln_getopt(p, argc, argv)) >= 0) {
		r = p->option ? p->option(c, optarg) : 1;
		if (r > 0) { /* not the program's: -v, -q, -h, --version, '?' */
			r = kiln_prog_option(p, c);
			if (r <= 0)
				return r;
		} else if (r < 0)
			return r;
	}
	if (p->no_args && optind < argc)
		return kiln_usage_error(p, "Unexpected argument '%s'.", argv[optind]);
	return 1;
}

void kiln_prog_init(const kiln_prog *p)
{
	/* "kiln render" logs as "kiln" */
	static char name[64];
	snprintf(name, sizeof(name), "%.*s", (int) strcspn(p->name, " "), p->name);
	log_set_program(name);
}

static void print_wrapped_help(const char *help, int indent)
{
	for (const char *s = help; *s;) {
		size_t n = strcspn(s, "\n");
		printf("%.*s\n", (int) n, s);
		s += n;
		if (*s == '\n') {
			s++;
			printf("%*s", indent, "");
		}
	}
}

void kiln_prog_help(const kiln_prog *p)
{
	printf("%s — %s\n\nUsage:\n", p->name, p->summary);
	for (const char *s = p->usage; s && *s;) {
		size_t n = strcspn(s, "\n");
		printf("  %.*s\n", (int) n, s);
		s += n + (s[n] == '\n');
	}
	if (p->n_verbs > 0) {
		printf("\nCommands:\n");
		for (size_t i = 0; i < p->n_verbs; i++)
			printf("  %-18s %s\n", p->verbs[i].name, p->verbs[i].summary);
	}
	printf("\nOptions:\n");
	for (const kiln_option *o = p->options; o && o->name; o++) {
		if (!o->help)
			continue;
		char left[64];
		int n;
		if (is_short(o->key))
			n = snprintf(left, sizeof(left), "  -%c, --%s", o->key, o->name);
		else
			n = snprintf(left, sizeof(left), "      --%s", o->name);
		if (o->arg && n > 0 && (size_t) n < sizeof(left))
			snprintf(left + n, sizeof(left) - (size_t) n, " %s", o->arg);
		if (strlen(left) > 22) /* at least two spaces before the help */
			printf("%s\n%24s", left, "");
		else
			printf("%-24s", left);
		print_wrapped_help(o->help, 24);
	}
	if (p->n_verbs > 0)
		printf("\nSee '%s COMMAND --help' for a command's own options.\n", p->name);
	if (p->epilog)
		printf("\n%s", p->epilog);
}

/* One line per option, one per verb, tab-separated, for
 * mk/gen-completion.sh and tests/common/test-cli-options.sh:
 *   option	--LONG	-S|""	ARG|""	COMPLETE|""
 *   args	COMPLETE-OF-1ST	COMPLETE-OF-2ND ...   (when args_complete is set)
 *   verb	NAME	SUMMARY
 * (verbs' own options and args follow as "VERB option ..." lines). */
static void dump_options(const kiln_prog *p, const char *prefix)
{
	const char *sep = *prefix ? "\t" : "";
	for (const kiln_option *o = p->options; o && o->name; o++) {
		if (o->key == KILN_OPT_DUMP_OPTIONS)
			continue;
		char s[3] = "";
		if (is_short(o->key))
			snprintf(s, sizeof(s), "-%c", o->key);
		printf("%s%soption\t--%s\t%s\t%s\t%s\n", prefix, sep, o->name, s, o->arg ?: "",
		       o->complete ?: "");
	}
	if (p->args_complete) {
		printf("%s%sargs\t", prefix, sep);
		for (const char *a = p->args_complete; *a; a++)
			putchar(*a == '|' ? '\t' : *a);
		putchar('\n');
	}
	for (size_t i = 0; i < p->n_verbs; i++) {
		printf("verb\t%s\t%s\n", p->verbs[i].name, p->verbs[i].summary);
		if (p->verbs[i].prog)
			dump_options(p->verbs[i].prog, p->verbs[i].name);
	}
}

_printf_(2, 0) static void log_usage_error(const kiln_prog *p, const char *format, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof(msg), format, ap);
	log_error("%s Try '%s --help'.", msg, p->name);
}

int kiln_usage_error(const kiln_prog *p, const char *format, ...)
{
	va_list ap;
	va_start(ap, format);
	log_usage_error(p, format, ap);
	va_end(ap);
	return -EINVAL;
}

int kiln_usage_exit(const kiln_prog *p, const char *format, ...)
{
	va_list ap;
	va_start(ap, format);
	log_usage_error(p, format, ap);
	va_end(ap);
	return KILN_EXIT_USAGE;
}

int kiln_prog_option(const kiln_prog *p, int key)
{
	switch (key) {
	case 'v':
		log_adjust_level(+1);
		return 1;
	case 'q':
		log_adjust_level(-1);
		return 1;
	case 'h':
		kiln_prog_help(p);
		return 0;
	case KILN_OPT_VERSION:
		printf("%.*s %s\n", (int) strcspn(p->name, " "), p->name, KILN_VERSION);
		return 0;
	case KILN_OPT_DUMP_OPTIONS:
		dump_options(p, "");
		return 0;
	default:
		/* '?': getopt_long has said what was wrong. */
		log_error("Try '%s --help'.", p->name);
		return -EINVAL;
	}
}

int kiln_verb_dispatch(const kiln_prog *p, int argc, char **argv)
{
	if (argc < 1) {
		log_error("No command given. Commands:");
	} else {
		for (size_t i = 0; i < p->n_verbs; i++)
			if (streq(argv[0], p->verbs[i].name)) {
				optind = 0; /* the verb parses from its argv[1] */
				if (p->verbs[i].prog) {
					int r = kiln_parse_options(p->verbs[i].prog, argc, argv);
					if (r <= 0)
						return kiln_parse_exit(r);
				}
				return p->verbs[i].run(argc, argv);
			}
		log_error("Unknown command '%s'. Commands:", argv[0]);
	}
	for (size_t i = 0; i < p->n_verbs; i++)
		fprintf(stderr, "  %-18s %s\n", p->verbs[i].name, p->verbs[i].summary);
	fprintf(stderr, "See '%s --help'.\n", p->name);
	return KILN_EXIT_USAGE;
}

int kiln_node_name(const char *arg, char *buf, size_t len, const char **source)
{
	const char *src, *name = NULL;
	char host[256];
	assert_return(buf && len > 0, -EINVAL);
	if (arg && *arg) {
		name = arg;
		src = "--node";
	} else if ((name = getenv("SLURMD_NODENAME")) && *name) {
		src = "$SLURMD_NODENAME";
	} else {
		if (gethostname(host, sizeof(host)) < 0 || !*host)
			snprintf(host, sizeof(host), "localhost");
		host[sizeof(host) - 1] = 0;
		name = host;
		src = "hostname";
	}
	if (source)
		*source = src;
	if (strlen(name) >= len)
		return -ENAMETOOLONG;
	memcpy(buf, name, strlen(name) + 1);
	return 0;
}
