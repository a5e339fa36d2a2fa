/* log.c — stderr logging with sd-daemon priority prefixes.
 *
 * journald reads a leading "<N>" on each line as the syslog priority, so a
 * service's stderr keeps its levels in the journal.  On a terminal the
 * prefix would be noise; there we print "prog: level: message" instead. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/log.h"

static int max_level = LOG_INFO;
static const char *program;
static int use_prefix = -1; /* -1: decide on first use */

void log_set_program(const char *name)
{
	program = name;
}

void log_set_max_level(int level)
{
	max_level = CLAMP(level, LOG_EMERG, LOG_DEBUG);
}

int log_get_max_level(void)
{
	return max_level;
}

void log_adjust_level(int delta)
{
	log_set_max_level(max_level + delta);
}

int log_level_from_string(const char *s, int *ret)
{
	static const char *const names[] = { "emerg",	"alert",  "crit", "err",
					     "warning", "notice", "info", "debug" };
	assert_return(s && ret, -EINVAL);
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (strcasecmp(s, names[i]) == 0 || (s[0] == '0' + (int) i && s[1] == 0)) {
			*ret = (int) i;
			return 0;
		}
	if (strcasecmp(s, "error") == 0) {
		*ret = LOG_ERR;
		return 0;
	}
	if (strcasecmp(s, "warn") == 0) {
		*ret = LOG_WARNING;
		return 0;
	}
	return -EINVAL;
}

/* systemd sets $JOURNAL_STREAM to "DEV:INO" of the stream it connected
 * stdout/stderr to; a child whose stderr was redirected inherits the
 * variable, so it counts only when it names our stderr (sd-daemon(3)). */
static bool stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long) st.st_dev == dev && (unsigned long long) st.st_ino == ino;
}

static bool prefix_wanted(void)
{
	if (use_prefix < 0) {
		const char *e = getenv("KILN_LOG_PREFIX");
		if (e && (streq(e, "1") || streq(e, "0")))
			use_prefix = streq(e, "1");
		else
			use_prefix = stderr_is_journal();
	}
	return use_prefix;
}

int log_internal(int level, int error, const char *file, int line, const char *func,
		 const char *format, ...)
{
	static const char *const level_names[] = { "emergency", "alert",  "critical", "error",
						   "warning",	"notice", "info",     "debug" };
	int saved = errno;
	if (error < 0)
		error = -error;
	if (level > max_level) {
		errno = saved;
		return -error;
	}
	char msg[4096];
	va_list ap;
	errno = error; /* so that %m prints the error we were given */
	va_start(ap, format);
	vsnprintf(msg, sizeof(msg), format, ap);
	va_end(ap);
	if (prefix_wanted()) {
		if (max_level >= LOG_DEBUG)
			fprintf(stderr, "<%d>%s:%d %s: %s\n", level, file, line, func, msg);
		else
			fprintf(stderr, "<%d>%s\n", level, msg);
	} else {
		const char *p = program ? program : program_invocation_short_name;
		if (level <= LOG_WARNING)
			fprintf(stderr, "%s: %s: %s\n", p, level_names[level & 7], msg);
		else
			fprintf(stderr, "%s: %s\n", p, msg);
	}
	errno = saved;
	return -error;
}
