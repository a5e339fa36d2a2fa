/* kiln/parse.h — checked parsing of the small values kiln reads from users:
 * integers with ranges, booleans, durations, sizes, MAC and IPv4 addresses.
 *
 * Every parser accepts the whole string or nothing: trailing garbage, empty
 * strings, overflow and out-of-range values are errors.  All return 0 on
 * success or a negative errno (-EINVAL malformed, -ERANGE out of range) and
 * leave *ret untouched on failure. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

int kiln_parse_int64(const char *s, int64_t min, int64_t max, int64_t *ret);
int kiln_parse_uint64(const char *s, uint64_t max, uint64_t *ret);
int kiln_parse_int(const char *s, int min, int max, int *ret);
int kiln_parse_double(const char *s, double *ret);
/* yes/no, true/false, on/off, 1/0 (case-insensitive). */
int kiln_parse_bool(const char *s, bool *ret);

/* Durations: "90", "90s", "1500ms", "5m", "1h30m", "2d", "1.5h", "infinite"
 * (-> UINT64_MAX).  A bare number is in units of default_unit_usec
 * (e.g. KILN_USEC_PER_SEC).  Result in microseconds. */
#define KILN_USEC_PER_MSEC   1000ULL
#define KILN_USEC_PER_SEC    1000000ULL
#define KILN_USEC_PER_MINUTE (60ULL * KILN_USEC_PER_SEC)
#define KILN_USEC_INFINITY   UINT64_MAX
int kiln_parse_duration(const char *s, uint64_t default_unit_usec, uint64_t *ret_usec);
/* Formats a duration compactly ("1h30m", "250ms", "infinite"). */
char *kiln_format_duration(char *buf, size_t len, uint64_t usec);

/* Sizes: "4096", "512K", "80G", "1.5T", "64MiB", "64MB" — K/M/G/T/P are
 * powers of 1024 (as Slurm and memory sizes mean them).  A bare number is in
 * units of default_unit (1 for bytes, 1024*1024 for MiB ...). */
int kiln_parse_size(const char *s, uint64_t default_unit, uint64_t *ret_bytes);

/* MAC "aa:bb:cc:dd:ee:ff" (or '-' separated), case-insensitive. */
int kiln_parse_mac(const char *s, uint8_t ret[6]);
/* Writes the lowercase colon form into buf (>= 18 bytes). */
char *kiln_format_mac(char *buf, const uint8_t mac[6]);

/* IPv4 dotted quad -> host-order uint32. */
int kiln_parse_ipv4(const char *s, uint32_t *ret);
/* "10.0.0.0/24" -> network (host order) and prefix length. */
int kiln_parse_cidr(const char *s, uint32_t *ret_net, int *ret_prefix);
char *kiln_format_ipv4(char *buf, uint32_t addr); /* buf >= 16 bytes */

/* Edit distance (for "did you mean ...?" hints). */
size_t kiln_levenshtein(const char *a, const char *b);	     /* ignoring ASCII case */
size_t kiln_levenshtein_exact(const char *a, const char *b); /* case counts */

/* Monotonic and wall clocks in microseconds. */
uint64_t kiln_now_usec(void);
uint64_t kiln_realtime_usec(void);

/* A condition variable whose pthread_cond_timedwait() deadlines are on the
 * monotonic clock (kiln_now_usec()), so a clock step cannot stretch them. */
void kiln_cond_init_monotonic(pthread_cond_t *cond);
