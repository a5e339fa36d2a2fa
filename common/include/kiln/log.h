/* kiln/log.h — logging for kiln programs.
 *
 * Programs log to stderr.  When stderr is the journal ($JOURNAL_STREAM names
 * it, as systemd sets it for a service), every line starts with the
 * sd-daemon priority prefix ("<3>" for errors ...) so the journal records
 * its level; on a terminal, a pipe or a file lines read "PROG: error:
 * message".  KILN_LOG_PREFIX=1/0 forces prefixes on/off.
 *
 * Library code (common/, config/, kernels/) never logs above debug; it
 * returns -errno and lets the program report.  log_*_errno() return
 * -abs(error) so `return log_error_errno(r, "Failed to ...: %m");` works; %m
 * prints strerror(error). */
#pragma once

#include <stdarg.h>
#include <syslog.h>

#include "kiln/macro.h"

/* Set the name printed on terminal lines (default: program_invocation_short_name). */
void log_set_program(const char *name);
/* LOG_ERR .. LOG_DEBUG; default LOG_INFO. */
void log_set_max_level(int level);
int log_get_max_level(void);
/* Raise (+1 per --verbose) or lower (-1 per --quiet) the level. */
void log_adjust_level(int delta);
/* Parse "err", "warning", "notice", "info", "debug" or 3..7. Returns 0 or -EINVAL. */
int log_level_from_string(const char *s, int *ret);

int log_internal(int level, int error, const char *file, int line, const char *func,
		 const char *format, ...) _printf_(6, 7);

#define log_full_errno(level, error, ...) \
	log_internal(level, error, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_full(level, ...) (void) log_full_errno(level, 0, __VA_ARGS__)

#define log_debug(...)	 log_full(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)	 log_full(LOG_INFO, __VA_ARGS__)
#define log_notice(...)	 log_full(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) log_full(LOG_WARNING, __VA_ARGS__)
#define log_error(...)	 log_full(LOG_ERR, __VA_ARGS__)
#define log_crit(...)	 log_full(LOG_CRIT, __VA_ARGS__)

#define log_debug_errno(e, ...)	  log_full_errno(LOG_DEBUG, e, __VA_ARGS__)
#define log_info_errno(e, ...)	  log_full_errno(LOG_INFO, e, __VA_ARGS__)
#define log_notice_errno(e, ...)  log_full_errno(LOG_NOTICE, e, __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, e, __VA_ARGS__)
#define log_error_errno(e, ...)	  log_full_errno(LOG_ERR, e, __VA_ARGS__)
