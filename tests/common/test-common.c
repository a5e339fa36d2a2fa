/* test-common.c — unit tests for common/: parsers, hostlists, strbuf, files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

static void test_parse_int(void **state)
{
	int64_t v = 7;
	int i = 3;
	assert_int_equal(kiln_parse_int64("42", 0, 100, &v), 0);
	assert_int_equal(v, 42);
	assert_int_equal(kiln_parse_int64("-5", -10, 10, &v), 0);
	assert_int_equal(v, -5);
	assert_int_equal(kiln_parse_int64("101", 0, 100, &v), -ERANGE);
	assert_int_equal(kiln_parse_int64("99999999999999999999", 0, INT64_MAX, &v), -ERANGE);
	assert_int_equal(kiln_parse_int64("12abc", 0, 100, &v), -EINVAL);
	assert_int_equal(kiln_parse_int64("", 0, 100, &v), -EINVAL);
	assert_int_equal(kiln_parse_int64(" 1", 0, 100, &v), -EINVAL);
	assert_int_equal(v, -5); /* untouched on failure */
	assert_int_equal(kiln_parse_int("17", 0, 16, &i), -ERANGE);
	assert_int_equal(i, 3);
	uint64_t u;
	assert_int_equal(kiln_parse_uint64("-1", UINT64_MAX, &u), -EINVAL);
	assert_int_equal(kiln_parse_uint64("18446744073709551615", UINT64_MAX, &u), 0);
	assert_true(u == UINT64_MAX);
	double d;
	assert_int_equal(kiln_parse_double("2.5", &d), 0);
	assert_true(d == 2.5);
	assert_int_equal(kiln_parse_double("nan", &d), -EINVAL);
	assert_int_equal(kiln_parse_double("1.0x", &d), -EINVAL);
}

static void test_parse_bool(void **state)
{
	bool b = false;
	assert_int_equal(kiln_parse_bool("Yes", &b), 0);
	assert_true(b);
	assert_int_equal(kiln_parse_bool("off", &b), 0);
	assert_false(b);
	assert_int_equal(kiln_parse_bool("maybe", &b), -EINVAL);
}

static void test_parse_duration(void **state)
{
	uint64_t u = 0;
	char buf[64];
	assert_int_equal(kiln_parse_duration("90", KILN_USEC_PER_SEC, &u), 0);
	assert_true(u == 90 * KILN_USEC_PER_SEC);
	assert_int_equal(kiln_parse_duration("1500ms", KILN_USEC_PER_SEC, &u), 0);
	assert_true(u == 1500 * KILN_USEC_PER_MSEC);
	assert_int_equal(kiln_parse_duration("1h30m", KILN_USEC_PER_SEC, &u), 0);
	assert_true(u == 90 * KILN_USEC_PER_MINUTE);
	assert_int_equal(kiln_parse_duration("1.5h", KILN_USEC_PER_SEC, &u), 0);
	assert_true(u == 90 * KILN_USEC_PER_MINUTE);
	assert_int_equal(kiln_parse_duration("2d", KILN_USEC_PER_SEC, &u), 0);
	assert_true(u == 48 * 60 * KILN_USEC_PER_MINUTE);
	assert_int_equal(kiln_parse_duration("infinite", KILN_USEC_PER_SEC, &u), 0);
	assert_true(u == KILN_USEC_INFINITY);
	assert_int_equal(kiln_parse_duration("5 m", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_int_equal(kiln_parse_duration("5x", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_int_equal(kiln_parse_duration("1e3s", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_int_equal(kiln_parse_duration("10m5", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_int_equal(kiln_parse_duration("", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_int_equal(kiln_parse_duration("-5s", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_int_equal(kiln_parse_duration("1.2.3s", KILN_USEC_PER_SEC, &u), -EINVAL);
	assert_string_equal(kiln_format_duration(buf, sizeof(buf), 90 * KILN_USEC_PER_MINUTE),
			    "1h30m");
	assert_string_equal(kiln_format_duration(buf, sizeof(buf), 250 * KILN_USEC_PER_MSEC),
			    "250ms");
	assert_string_equal(kiln_format_duration(buf, sizeof(buf), KILN_USEC_INFINITY), "infinite");
	/* format -> parse round trip */
	uint64_t vals[] = { 1, 999, 1000001, 3600 * KILN_USEC_PER_SEC + 7, 86400ULL * 1000000 * 3 };
	for (size_t i = 0; i < ARRAY_SIZE(vals); i++) {
		assert_int_equal(
			kiln_parse_duration(kiln_format_duration(buf, sizeof(buf), vals[i]),
					    KILN_USEC_PER_SEC, &u),
			0);
		assert_true(u == vals[i]);
	}
}

static void test_parse_size(void **state)
{
	uint64_t u = 0;
	assert_int_equal(kiln_parse_size("4096", 1, &u), 0);
	assert_true(u == 4096);
	assert_int_equal(kiln_parse_size("80G", 1, &u), 0);
	assert_true(u == 80ULL << 30);
	assert_int_equal(kiln_parse_size("64MiB", 1, &u), 0);
	assert_true(u == 64ULL << 20);
	assert_int_equal(kiln_parse_size("1.5T", 1, &u), 0);
	assert_true(u == 3ULL << 39);
	assert_int_equal(kiln_parse_size("512", 1 << 20, &u), 0);
	assert_true(u == 512ULL << 20);
	assert_int_equal(kiln_parse_size("12Q", 1, &u), -EINVAL);
	assert_int_equal(kiln_parse_size("1G2M", 1, &u), -EINVAL);
	assert_int_equal(kiln_parse_size("99999999999P", 1, &u), -ERANGE);
}

static void test_parse_mac_ip(void **state)
{
	uint8_t mac[6];
	char buf[32];
	uint32_t a, net;
	int prefix;
	assert_int_equal(kiln_parse_mac("52:54:00:AB:cd:0F", mac), 0);
	assert_string_equal(kiln_format_mac(buf, mac), "52:54:00:ab:cd:0f");
	assert_int_equal(kiln_parse_mac("52-54-00-ab-cd-0f", mac), 0);
	assert_int_equal(kiln_parse_mac("52:54:00:ab:cd", mac), -EINVAL);
	assert_int_equal(kiln_parse_mac("52:54:00:ab:cd:0g", mac), -EINVAL);
	assert_int_equal(kiln_parse_mac("52:54-00:ab:cd:0f", mac), -EINVAL);
	assert_int_equal(kiln_parse_ipv4("10.77.0.11", &a), 0);
	assert_true(a == ((10u << 24) | (77u << 16) | 11u));
	assert_string_equal(kiln_format_ipv4(buf, a), "10.77.0.11");
	assert_int_equal(kiln_parse_ipv4("10.77.0.256", &a), -EINVAL);
	assert_int_equal(kiln_parse_ipv4("10.77.0", &a), -EINVAL);
	assert_int_equal(kiln_parse_cidr("10.77.0.0/24", &net, &prefix), 0);
	assert_int_equal(prefix, 24);
	assert_int_equal(kiln_parse_cidr("10.77.0.1/24", &net, &prefix), -EINVAL);
	assert_int_equal(kiln_parse_cidr("10.77.0.0/33", &net, &prefix), -ERANGE);
	assert_int_equal(kiln_parse_cidr("10.77.0.0", &net, &prefix), -EINVAL);
}

static void test_levenshtein(void **state)
{
	assert_int_equal(kiln_levenshtein("interval", "intreval"), 2);
	assert_int_equal(kiln_levenshtein("metrics_port", "metric_port"), 1);
	assert_int_equal(kiln_levenshtein("", "abc"), 3);
	assert_int_equal(kiln_levenshtein("same", "same"), 0);
	/* the config's hints ignore case; JSON keys' (kiln_levenshtein_exact) do not */
	assert_int_equal(kiln_levenshtein("Top_P", "top_p"), 0);
	assert_int_equal(kiln_levenshtein_exact("Top_P", "top_p"), 2);
	assert_int_equal(kiln_levenshtein_exact("temprature", "temperature"), 1);
	assert_int_equal(kiln_levenshtein_exact("rol", "role"), 1);
}

static char *expand_join(const char *s, int *ret_r, size_t *errpos)
{
	_cleanup_strv_free_ char **v = NULL;
	size_t n = 0;
	*ret_r = kiln_hostlist_expand(s, &v, &n, errpos);
	if (*ret_r < 0)
		return NULL;
	assert_int_equal(n, strv_length(v));
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	for (size_t i = 0; i < n; i++)
		kiln_strbuf_printf(&b, "%s%s", i ? " " : "", v[i]);
	return kiln_strbuf_steal(&b);
}

static void test_hostlist_expand(void **state)
{
	static const struct {
		const char *in, *out;
	} ok[] = {
		{ "gpu[01-03,07]", "gpu01 gpu02 gpu03 gpu07" },
		{ "n[8-11]", "n8 n9 n10 n11" },
		{ "n[008-010]", "n008 n009 n010" },
		{ "head,gpu[1-2]", "head gpu1 gpu2" },
		{ "r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2" },
		{ "a[1-2]-ib", "a1-ib a2-ib" },
		{ "node01", "node01" },
		{ "x[5]", "x5" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(ok); i++) {
		int r;
		_cleanup_free_ char *s = expand_join(ok[i].in, &r, NULL);
		assert_int_equal(r, 0);
		assert_string_equal(s, ok[i].out);
	}
	static const struct {
		const char *in;
		int r;
		size_t pos;
	} bad[] = {
		{ "gpu[01-03", -EINVAL, 9 },
		{ "gpu01-03]", -EINVAL, 8 },
		{ "n[5-1]", -EINVAL, 4 },
		{ "n[a-b]", -EINVAL, 2 },
		{ "a,,b", -EINVAL, 2 },
		{ "", -EINVAL, 0 },
		{ "n[[1-2]]", -EINVAL, 2 },
		{ "bad name", -EINVAL, 3 },
		{ "n[1-2,]", -EINVAL, 6 },
		{ "n[0-999999999]", -E2BIG, 0 },
		{ "n[0-9999]m[0-9999]", -E2BIG, 0 },
		{ "n[1-1234567890]", -EINVAL, 4 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		int r;
		size_t pos = 999;
		_cleanup_free_ char *s = expand_join(bad[i].in, &r, &pos);
		assert_null(s);
		assert_int_equal(r, bad[i].r);
		if (r == -EINVAL)
			assert_int_equal(pos, bad[i].pos);
	}
	/* exactly the cap expands; one more is refused */
	{
		_cleanup_strv_free_ char **v = NULL;
		size_t n = 0;
		assert_int_equal(kiln_hostlist_expand("n[00000-65535]", &v, &n, NULL), 0);
		assert_int_equal(n, KILN_HOSTLIST_MAX);
		assert_string_equal(v[65535], "n65535");
		assert_null(v[n]);
		_cleanup_strv_free_ char **w = NULL;
		assert_int_equal(kiln_hostlist_expand("n[00000-65535],x", &w, &n, NULL), -E2BIG);
		assert_null(w);
	}
	/* a name longer than a DNS label */
	char longname[80];
	memset(longname, 'a', 70);
	longname[70] = 0;
	int r;
	assert_null(expand_join(longname, &r, NULL));
	assert_int_equal(r, -EINVAL);
}

static void test_hostlist_compress(void **state)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "gpu01,gpu02,gpu03,gpu07", "gpu[01-03,07]" },
		{ "gpu03,gpu01,gpu02,gpu02", "gpu[01-03]" },
		{ "n9,n10,n11", "n[9-11]" },
		{ "n08,n09,n10", "n[08-10]" },
		{ "head,gpu1,gpu2", "gpu[1-2],head" },
		{ "r1n1,r1n2,r2n1", "r1n[1-2],r2n1" },
		{ "a1-ib,a2-ib", "a[1-2]-ib" },
		{ "solo", "solo" },
		{ "n1,n01", "n[01,1]" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		_cleanup_strv_free_ char **v = NULL;
		_cleanup_free_ char *c = NULL;
		size_t n;
		/* build the input vector by splitting on commas (no brackets in inputs) */
		_cleanup_free_ char *copy = strdup(cases[i].in);
		for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ","))
			assert_int_equal(strv_extend(&v, tok), 0);
		n = strv_length(v);
		assert_int_equal(kiln_hostlist_compress(v, n, &c), 0);
		assert_string_equal(c, cases[i].out);
	}
}

/* Random round trip: expand(compress(set)) == sorted unique set. */
static void test_hostlist_roundtrip(void **state)
{
	srand(1234);
	for (int iter = 0; iter < 300; iter++) {
		_cleanup_strv_free_ char **v = NULL;
		int n = 1 + rand() % 40;
		for (int i = 0; i < n; i++) {
			char name[32];
			int kind = rand() % 4;
			if (kind == 0)
				snprintf(name, sizeof(name), "gpu%02d", rand() % 120);
			else if (kind == 1)
				snprintf(name, sizeof(name), "n%d", rand() % 30);
			else if (kind == 2)
				snprintf(name, sizeof(name), "r%dn%d", rand() % 3, rand() % 5);
			else
				snprintf(name, sizeof(name), "h%03d-ib", rand() % 20);
			assert_int_equal(strv_extend(&v, name), 0);
		}
		_cleanup_free_ char *c = NULL;
		assert_int_equal(kiln_hostlist_compress(v, (size_t) n, &c), 0);
		_cleanup_strv_free_ char **back = NULL;
		size_t nb;
		assert_int_equal(kiln_hostlist_expand(c, &back, &nb, NULL), 0);
		/* every input present, no duplicates, nothing extra */
		for (int i = 0; i < n; i++)
			assert_true(strv_contains(back, v[i]));
		for (size_t i = 0; i < nb; i++) {
			assert_true(strv_contains(v, back[i]));
			for (size_t j = i + 1; j < nb; j++)
				assert_string_not_equal(back[i], back[j]);
		}
	}
}

/* Terminal escapes from a node (a Slurm reason, healthd's JSON) are shown,
 * not obeyed; valid UTF-8 text is kept as it is. */
static void test_str_printable(void **state)
{
	(void) state;
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "bad DIMM", "bad DIMM" },
		{ "", "" },
		{ "\033[2Jgone", "\\x1b[2Jgone" },
		{ "a\tb\nc\rd\x7f", "a\\x09b\\x0ac\\x0dd\\x7f" },
		{ "C1 \xc2\x9b"
		  "31m",
		  "C1 \\xc2\\x9b31m" },				/* U+009B, CSI */
		{ "\xc2\x85 \xc2\xa0", "\\xc2\\x85 \xc2\xa0" }, /* NEL escaped, NBSP kept */
		{ "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x94\xa5",
		  "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x94\xa5" },
		{ "\xff\xfe", "\\xff\\xfe" },
		{ "\xc0\xaf", "\\xc0\\xaf" },	       /* overlong '/' */
		{ "\xe0\x80\xaf", "\\xe0\\x80\\xaf" }, /* overlong, 3 bytes */
		{ "\xed\xa0\x80", "\\xed\\xa0\\x80" }, /* a surrogate */
		{ "\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80" },
		{ "cut \xe2\x9c", "cut \\xe2\\x9c" }, /* truncated at the end */
		{ "\xc3(", "\\xc3(" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		_cleanup_free_ char *s = kiln_str_printable(cases[i].in);
		assert_non_null(s);
		assert_string_equal(s, cases[i].out);
	}
	assert_null(kiln_str_printable(NULL));
	/* appending keeps what the buffer held */
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_strbuf_append(&b, "\"");
	assert_int_equal(kiln_strbuf_append_printable(&b, "x\033y"), 0);
	kiln_strbuf_append(&b, "\"");
	_cleanup_free_ char *q = kiln_strbuf_steal(&b);
	assert_string_equal(q, "\"x\\x1by\"");
}

static void test_strbuf(void **state)
{
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	for (int i = 0; i < 1000; i++)
		assert_int_equal(kiln_strbuf_printf(&b, "%d,", i), 0);
	assert_int_equal(kiln_strbuf_error(&b), 0);
	assert_true(strncmp(b.s, "0,1,2,", 6) == 0);
	assert_int_equal(b.len, strlen(b.s));
	_cleanup_free_ char *s = kiln_strbuf_steal(&b);
	assert_non_null(s);
	assert_null(b.s);
	kiln_strbuf e;
	kiln_strbuf_init(&e);
	_cleanup_free_ char *empty = kiln_strbuf_steal(&e);
	assert_string_equal(empty, "");
}

static void test_atomic_write(void **state)
{
	char dir[] = "/tmp/kiln-test-XXXXXX";
	assert_non_null(mkdtemp(dir));
	_cleanup_free_ char *path = NULL;
	assert_true(asprintf(&path, "%s/out.conf", dir) > 0);
	assert_int_equal(kiln_write_file_atomic(path, "one\n", 4, 0644), 0);
	assert_int_equal(kiln_write_file_atomic(path, "two\n", 4, 0600), 0);
	_cleanup_free_ char *data = NULL;
	size_t len;
	assert_int_equal(kiln_read_file(path, 1 << 20, &data, &len), 0);
	assert_string_equal(data, "two\n");
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	/* a failing write leaves the old file and no temp file behind */
	_cleanup_free_ char *bad = NULL;
	assert_true(asprintf(&bad, "%s/missing-dir/x", dir) > 0);
	assert_int_equal(kiln_write_file_atomic(bad, "x", 1, 0644), -ENOENT);
	_cleanup_free_ char *small = NULL;
	assert_int_equal(kiln_read_file(path, 2, &small, &len), -EFBIG);
	assert_int_equal(kiln_read_file("/nonexistent/x", 10, &small, &len), -ENOENT);
	unlink(path);
	assert_int_equal(rmdir(dir), 0); /* nothing else was left in it */
}

static void test_log_errno(void **state)
{
	log_set_max_level(LOG_ERR);
	assert_int_equal(log_error_errno(ENOENT, "x"), -ENOENT);
	assert_int_equal(log_debug_errno(-EIO, "x"), -EIO);
	int lvl;
	assert_int_equal(log_level_from_string("warning", &lvl), 0);
	assert_int_equal(lvl, LOG_WARNING);
	assert_int_equal(log_level_from_string("7", &lvl), 0);
	assert_int_equal(lvl, LOG_DEBUG);
	assert_int_equal(log_level_from_string("loud", &lvl), -EINVAL);
}

/* A timed wait on kiln_cond_init_monotonic()'s condition variable takes a
 * kiln_now_usec() deadline: 20 ms from now times out after 20 ms, not at
 * once (a CLOCK_REALTIME condvar would see a deadline decades past). */
static void test_cond_monotonic(void **state)
{
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond;
	kiln_cond_init_monotonic(&cond);
	uint64_t start = kiln_now_usec(), deadline = start + 20 * KILN_USEC_PER_MSEC;
	struct timespec ts = { .tv_sec = (time_t) (deadline / KILN_USEC_PER_SEC),
			       .tv_nsec = (long) (deadline % KILN_USEC_PER_SEC) * 1000 };
	pthread_mutex_lock(&lock);
	int r;
	do
		r = pthread_cond_timedwait(&cond, &lock, &ts);
	while (r == 0);
	pthread_mutex_unlock(&lock);
	assert_int_equal(r, ETIMEDOUT);
	uint64_t waited = kiln_now_usec() - start;
	assert_true(waited >= 20 * KILN_USEC_PER_MSEC);
	assert_true(waited < 10 * KILN_USEC_PER_SEC);
	pthread_cond_destroy(&cond);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_int),	   cmocka_unit_test(test_parse_bool),
		cmocka_unit_test(test_parse_duration),	   cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_parse_mac_ip),	   cmocka_unit_test(test_levenshtein),
		cmocka_unit_test(test_hostlist_expand),	   cmocka_unit_test(test_hostlist_compress),
		cmocka_unit_test(test_hostlist_roundtrip), cmocka_unit_test(test_strbuf),
		cmocka_unit_test(test_str_printable),	   cmocka_unit_test(test_atomic_write),
		cmocka_unit_test(test_log_errno),	   cmocka_unit_test(test_cond_monotonic),
	};
	return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
