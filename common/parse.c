/* parse.c — whole-string, range-checked parsers for user-supplied values.
 *
 * strtol and friends accept leading spaces, trailing junk and silently clamp;
 * a cluster file typo must never pass that way, so each parser here accepts
 * the complete string or fails with -EINVAL / -ERANGE. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kiln/macro.h"
#include "kiln/parse.h"

int kiln_parse_int64(const char *s, int64_t min, int64_t max, int64_t *ret)
{
	assert_return(s && ret, -EINVAL);
	if (!*s || isspace((unsigned char) *s))
		return -EINVAL;
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 0);
	if (*end)
		return -EINVAL;
	if (errno == ERANGE || v < min || v > max)
		return -ERANGE;
	if (errno)
		return -EINVAL;
	*ret = v;
	return 0;
}

int kiln_parse_uint64(const char *s, uint64_t max, uint64_t *ret)
{
	assert_return(s && ret, -EINVAL);
	if (!*s || !isdigit((unsigned char) *s))
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (*end)
		return -EINVAL;
	if (errno == ERANGE || v > max)
		return -ERANGE;
	if (errno)
		return -EINVAL;
	*ret = v;
	return 0;
}

int kiln_parse_int(const char *s, int min, int max, int *ret)
{
	int64_t v;
	int r = kiln_parse_int64(s, min, max, &v);
	if (r < 0)
		return r;
	*ret = (int) v;
	return 0;
}

int kiln_parse_double(const char *s, double *ret)
{
	assert_return(s && ret, -EINVAL);
	if (!*s || isspace((unsigned char) *s))
		return -EINVAL;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (*end || !isfinite(v))
		return -EINVAL;
	if (errno == ERANGE)
		return -ERANGE;
	*ret = v;
	return 0;
}

int kiln_parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = { "1", "yes", "y", "true", "t", "on" };
	static const char *const no[] = { "0", "no", "n", "false", "f", "off" };
	assert_return(s && ret, -EINVAL);
	for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* Reads "<number><unit>" components; units map to multipliers.  Used for both
 * durations and sizes, which differ only in their unit tables. */
struct unit {
	const char *suffix;
	uint64_t mult;
};

static int parse_with_units(const char *s, const struct unit *units, size_t n_units,
			    uint64_t default_unit, bool multi, uint64_t *ret)
{
	const char *p = s;
	long double total = 0;
	int parts = 0;
	if (!*s)
		return -EINVAL;
	while (*p) {
		/* Only plain decimals: strtold alone would take "1e3", "0x10". */
		const char *num = p;
		size_t digits = 0, dots = 0;
		for (; isdigit((unsigned char) *p) || *p == '.'; p++)
			*p == '.' ? dots++ : digits++;
		if (!digits || dots > 1 || p - num > 40)
			return -EINVAL;
		char tmp[48];
		memcpy(tmp, num, (size_t) (p - num));
		tmp[p - num] = 0;
		long double v = strtold(tmp, NULL);
		const char *u = p;
		while (*p && isalpha((unsigned char) *p))
			p++;
		size_t ulen = (size_t) (p - u);
		uint64_t mult = 0;
		if (ulen == 0) {
			if (*p || parts > 0)
				return -EINVAL; /* bare numbers only alone */
			mult = default_unit;
		} else {
			for (size_t i = 0; i < n_units; i++)
				if (strlen(units[i].suffix) == ulen &&
				    strncasecmp(u, units[i].suffix, ulen) == 0) {
					mult = units[i].mult;
					break;
				}
			if (!mult)
				return -EINVAL;
		}
		total += v * (long double) mult;
		parts++;
		if (!multi && *p)
			return -EINVAL;
	}
	if (total >= 18446744073709551615.0L)
		return -ERANGE;
	*ret = (uint64_t) (total + 0.5L);
	return 0;
}

int kiln_parse_duration(const char *s, uint64_t default_unit_usec, uint64_t *ret_usec)
{
	static const struct unit units[] = {
		{ "us", 1 },
		{ "usec", 1 },
		{ "ms", KILN_USEC_PER_MSEC },
		{ "msec", KILN_USEC_PER_MSEC },
		{ "s", KILN_USEC_PER_SEC },
		{ "sec", KILN_USEC_PER_SEC },
		{ "m", KILN_USEC_PER_MINUTE },
		{ "min", KILN_USEC_PER_MINUTE },
		{ "h", 60 * KILN_USEC_PER_MINUTE },
		{ "hr", 60 * KILN_USEC_PER_MINUTE },
		{ "d", 24 * 60 * KILN_USEC_PER_MINUTE },
		{ "day", 24 * 60 * KILN_USEC_PER_MINUTE },
		{ "days", 24 * 60 * KILN_USEC_PER_MINUTE },
	};
	assert_return(s && ret_usec && default_unit_usec > 0, -EINVAL);
	if (strcasecmp(s, "infinite") == 0 || strcasecmp(s, "infinity") == 0) {
		*ret_usec = KILN_USEC_INFINITY;
		return 0;
	}
	return parse_with_units(s, units, ARRAY_SIZE(units), default_unit_usec, true, ret_usec);
}

char *kiln_format_duration(char *buf, size_t len, uint64_t usec)
{
	static const struct unit units[] = {
		{ "d", 24 * 60 * KILN_USEC_PER_MINUTE },
		{ "h", 60 * KILN_USEC_PER_MINUTE },
		{ "m", KILN_USEC_PER_MINUTE },
		{ "s", KILN_USEC_PER_SEC },
		{ "ms", KILN_USEC_PER_MSEC },
		{ "us", 1 },
	};
	if (usec == KILN_USEC_INFINITY) {
		snprintf(buf, len, "infinite");
		return buf;
	}
	if (usec == 0) {
		snprintf(buf, len, "0");
		return buf;
	}
	size_t off = 0;
	buf[0] = 0;
	for (size_t i = 0; i < ARRAY_SIZE(units) && usec > 0 && off < len; i++) {
		uint64_t n = usec / units[i].mult;
		if (!n)
			continue;
		off += (size_t) snprintf(buf + off, len - off, "%" PRIu64 "%s", n, units[i].suffix);
		usec -= n * units[i].mult;
	}
	return buf;
}

int kiln_parse_size(const char *s, uint64_t default_unit, uint64_t *ret_bytes)
{
	static const struct unit units[] = {
		{ "B", 1ULL },	       { "K", 1ULL << 10 }, { "KB", 1ULL << 10 },
		{ "KiB", 1ULL << 10 }, { "M", 1ULL << 20 }, { "MB", 1ULL << 20 },
		{ "MiB", 1ULL << 20 }, { "G", 1ULL << 30 }, { "GB", 1ULL << 30 },
		{ "GiB", 1ULL << 30 }, { "T", 1ULL << 40 }, { "TB", 1ULL << 40 },
		{ "TiB", 1ULL << 40 }, { "P", 1ULL << 50 }, { "PB", 1ULL << 50 },
		{ "PiB", 1ULL << 50 },
	};
	assert_return(s && ret_bytes && default_unit > 0, -EINVAL);
	return parse_with_units(s, units, ARRAY_SIZE(units), default_unit, false, ret_bytes);
}

int kiln_parse_mac(const char *s, uint8_t ret[6])
{
	uint8_t mac[6];
	assert_return(s && ret, -EINVAL);
	if (strlen(s) != 17)
		return -EINVAL;
	char sep = s[2];
	if (sep != ':' && sep != '-')
		return -EINVAL;
	for (int i = 0; i < 6; i++) {
		const char *p = s + 3 * i;
		if (!isxdigit((unsigned char) p[0]) || !isxdigit((unsigned char) p[1]))
			return -EINVAL;
		if (i < 5 && p[2] != sep)
			return -EINVAL;
		char hex[3] = { p[0], p[1], 0 };
		mac[i] = (uint8_t) strtoul(hex, NULL, 16);
	}
	memcpy(ret, mac, 6);
	return 0;
}

char *kiln_format_mac(char *buf, const uint8_t mac[6])
{
	snprintf(buf, 18, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4],
		 mac[5]);
	return buf;
}

int kiln_parse_ipv4(const char *s, uint32_t *ret)
{
	struct in_addr a;
	assert_return(s && ret, -EINVAL);
	/* inet_pton accepts only the strict dotted quad, unlike inet_aton. */
	if (inet_pton(AF_INET, s, &a) != 1)
		return -EINVAL;
	*ret = ntohl(a.s_addr);
	return 0;
}

int kiln_parse_cidr(const char *s, uint32_t *ret_net, int *ret_prefix)
{
	assert_return(s && ret_net && ret_prefix, -EINVAL);
	const char *slash = strchr(s, '/');
	if (!slash || slash - s > 15)
		return -EINVAL;
	char addr[16];
	memcpy(addr, s, (size_t) (slash - s));
	addr[slash - s] = 0;
	uint32_t a;
	int prefix, r;
	r = kiln_parse_ipv4(addr, &a);
	if (r < 0)
		return r;
	if (!isdigit((unsigned char) slash[1]))
		return -EINVAL;
	r = kiln_parse_int(slash + 1, 0, 32, &prefix);
	if (r < 0)
		return r;
	uint32_t mask = prefix ? ~0U << (32 - prefix) : 0;
	if (a & ~mask)
		return -EINVAL; /* host bits set: "10.0.0.1/24" is not a network */
	*ret_net = a;
	*ret_prefix = prefix;
	return 0;
}

char *kiln_format_ipv4(char *buf, uint32_t addr)
{
	snprintf(buf, 16, "%u.%u.%u.%u", addr >> 24, (addr >> 16) & 255, (addr >> 8) & 255,
		 addr & 255);
	return buf;
}

static size_t levenshtein(const char *a, const char *b, bool fold_case)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 256 || lb > 256)
		return MAX(la, lb); /* hints only; keep the cost bounded */
	size_t row[257];
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			unsigned char x = (unsigned char) a[i - 1], y = (unsigned char) b[j - 1];
			size_t cost = fold_case ? tolower(x) != tolower(y) : x != y;
			row[j] = MIN(MIN(row[j] + 1, row[j - 1] + 1), diag + cost);
			diag = up;
		}
	}
	return row[lb];
}

size_t kiln_levenshtein(const char *a, const char *b)
{
	return levenshtein(a, b, true);
}

size_t kiln_levenshtein_exact(const char *a, const char *b)
{
	return levenshtein(a, b, false);
}

static uint64_t clock_usec(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (uint64_t) ts.tv_sec * KILN_USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

uint64_t kiln_now_usec(void)
{
	return clock_usec(CLOCK_MONOTONIC);
}

uint64_t kiln_realtime_usec(void)
{
	return clock_usec(CLOCK_REALTIME);
}

void kiln_cond_init_monotonic(pthread_cond_t *cond)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cond, &ca);
	pthread_condattr_destroy(&ca);
}
