/* test-serve-request.c — the pure half of kiln serve (config/cli/serve.h):
 * which request paths name a file, a boot script or a secret, and which
 * are refused (traversal in every decoded form MHD can hand over); Range
 * headers (one range, suffix, open end, 416, what is ignored); the URL and
 * listen address splits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <string.h>

#include "kiln/macro.h"
#include "serve.h"

static void test_route(void **state)
{
	kiln_serve_target t;
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/initrd.img", &t), KILN_SERVE_FILE);
	assert_string_equal(t.name, "initrd.img");
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/cluster.cfg.sig", &t), KILN_SERVE_FILE);
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/boot.ipxe", &t), KILN_SERVE_BOOT);
	assert_int_equal(kiln_serve_route("", "/vmlinuz", &t), KILN_SERVE_FILE);
	assert_int_equal(kiln_serve_route("/a/b", "/a/b/vmlinuz", &t), KILN_SERVE_FILE);
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/ipxe/52-54-00-5e-00-0a", &t),
			 KILN_SERVE_IPXE);
	static const uint8_t mac[6] = { 0x52, 0x54, 0x00, 0x5e, 0x00, 0x0a };
	assert_memory_equal(t.mac, mac, 6);
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/ipxe/52:54:00:5E:00:0A", &t),
			 KILN_SERVE_IPXE);
	assert_memory_equal(t.mac, mac, 6);
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/secret/munge.key", &t),
			 KILN_SERVE_SECRET);
	assert_int_equal(t.secret, KILN_SERVE_SECRET_MUNGE_KEY);
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/secret/inferd-keys", &t),
			 KILN_SERVE_SECRET);
	assert_int_equal(t.secret, KILN_SERVE_SECRET_INFERD_KEYS);
	assert_int_equal(kiln_serve_route("/kiln", "/kiln/secret/root-password-hash", &t),
			 KILN_SERVE_SECRET);

	/* not ours, or not one file of the directory (paths as MHD decodes
	 * them: %2e%2e -> "..", %2f -> "/") */
	static const char *const refused[] = {
		"/kiln",
		"/kiln/",
		"/kilnx/vmlinuz",
		"/other/vmlinuz",
		"/vmlinuz",
		"/kiln/..",
		"/kiln/.",
		"/kiln/../etc/passwd",
		"/kiln/../../etc/shadow",
		"/kiln/.hidden",
		"/kiln/sub/file",
		"/kiln/sub/../vmlinuz",
		"/kiln//vmlinuz",
		"/kiln/vmlinuz/",
		"/kiln/a\\b",
		"/kiln/a b",
		"/kiln/a\tb",
		"/kiln/\x01",
		"/kiln/\xc3\xa9",
		"/kiln/ipxe/",
		"/kiln/ipxe/52-54-00-5e-00",
		"/kiln/ipxe/52-54-00-5e-00-0a-ff",
		"/kiln/ipxe/52-54:00-5e-00-0a",
		"/kiln/ipxe/zz-54-00-5e-00-0a",
		"/kiln/ipxe/../secret/munge.key",
		"/kiln/secret/",
		"/kiln/secret/shadow",
		"/kiln/secret/munge.key/",
		"/kiln/secret/../munge.key",
		"/kiln/secret/munge.key.bak",
	};
	for (size_t i = 0; i < ARRAY_SIZE(refused); i++) {
		kiln_serve_kind k = kiln_serve_route("/kiln", refused[i], &t);
		if (k != KILN_SERVE_NONE)
			fail_msg("'%s' routed to %d", refused[i], k);
		assert_non_null(t.why);
	}
	/* a name of 255 bytes is one; 256 is not */
	char p[300] = "/kiln/";
	memset(p + 6, 'a', 255);
	p[261] = 0;
	assert_int_equal(kiln_serve_route("/kiln", p, &t), KILN_SERVE_FILE);
	p[261] = 'a';
	p[262] = 0;
	assert_int_equal(kiln_serve_route("/kiln", p, &t), KILN_SERVE_NONE);
}

static void test_range(void **state)
{
	uint64_t off = 7, len = 7;
	assert_int_equal(kiln_serve_parse_range(NULL, 100, &off, &len), 0);
	assert_int_equal(kiln_serve_parse_range("bytes=0-9", 100, &off, &len), 1);
	assert_true(off == 0 && len == 10);
	assert_int_equal(kiln_serve_parse_range("bytes=90-", 100, &off, &len), 1);
	assert_true(off == 90 && len == 10);
	assert_int_equal(kiln_serve_parse_range("bytes=-10", 100, &off, &len), 1);
	assert_true(off == 90 && len == 10);
	assert_int_equal(kiln_serve_parse_range("bytes=-1000", 100, &off, &len), 1);
	assert_true(off == 0 && len == 100);
	assert_int_equal(kiln_serve_parse_range("bytes=50-1000", 100, &off, &len), 1);
	assert_true(off == 50 && len == 50);
	assert_int_equal(kiln_serve_parse_range("bytes=99-99", 100, &off, &len), 1);
	assert_true(off == 99 && len == 1);
	assert_int_equal(kiln_serve_parse_range("bytes= 5-6 ", 100, &off, &len), 1);
	assert_true(off == 5 && len == 2);
	/* past the end: 416 */
	assert_int_equal(kiln_serve_parse_range("bytes=100-", 100, &off, &len), -ERANGE);
	assert_int_equal(kiln_serve_parse_range("bytes=100-200", 100, &off, &len), -ERANGE);
	assert_int_equal(kiln_serve_parse_range("bytes=-0", 100, &off, &len), -ERANGE);
	assert_int_equal(kiln_serve_parse_range("bytes=0-0", 0, &off, &len), -ERANGE);
	/* ignored: the whole file */
	static const char *const ignored[] = {
		"bytes=0-1,5-6", "bytes=5-3",
		"items=0-1",	 "bytes=",
		"bytes=-",	 "bytes=a-b",
		"bytes=1-2x",	 "bytes=+1-2",
		"bytes=1--2",	 "bytes=99999999999999999999-",
		"Bytes=0-1",	 "bytes=0-1 junk",
		"bytes 0-1",
	};
	for (size_t i = 0; i < ARRAY_SIZE(ignored); i++)
		if (kiln_serve_parse_range(ignored[i], 100, &off, &len) != 0)
			fail_msg("'%s' not ignored", ignored[i]);
	/* the largest numbers do not wrap */
	assert_int_equal(
		kiln_serve_parse_range("bytes=0-9999999999999999999", UINT64_MAX, &off, &len), 1);
	assert_true(off == 0 && len == 9999999999999999999ull + 1);
}

static void test_url(void **state)
{
	char host[KILN_SERVE_HOST_MAX], base[KILN_SERVE_BASE_MAX];
	uint16_t port;
	assert_int_equal(kiln_serve_split_url("http://10.77.0.1/kiln", host, &port, base), 0);
	assert_string_equal(host, "10.77.0.1");
	assert_int_equal(port, 80);
	assert_string_equal(base, "/kiln");
	assert_int_equal(kiln_serve_split_url("http://10.0.0.1:8080/a/b/", host, &port, base), 0);
	assert_int_equal(port, 8080);
	assert_string_equal(base, "/a/b");
	assert_int_equal(kiln_serve_split_url("http://[fd00::1]:81", host, &port, base), 0);
	assert_string_equal(host, "fd00::1");
	assert_int_equal(port, 81);
	assert_string_equal(base, "");
	assert_int_equal(kiln_serve_split_url("http://head/", host, &port, base), 0);
	assert_string_equal(host, "head");
	assert_string_equal(base, "");
	assert_int_equal(kiln_serve_split_url("https://10.0.0.1/kiln", host, &port, base),
			 -EPROTONOSUPPORT);
	assert_int_equal(kiln_serve_split_url("ftp://10.0.0.1/kiln", host, &port, base),
			 -EPROTONOSUPPORT);
	static const char *const bad[] = {
		"http://",	  "http:///kiln", "http://h:99999/", "http://h:/",   "http://u@h/",
		"http://h/k?x=1", "http://h?x",	  "http://h/a b",    "http://[::1/", "http://h/%2e",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		if (kiln_serve_split_url(bad[i], host, &port, base) != -EINVAL)
			fail_msg("'%s' accepted", bad[i]);
	assert_int_equal(kiln_serve_split_listen("0.0.0.0:80", host, &port), 0);
	assert_string_equal(host, "0.0.0.0");
	assert_int_equal(kiln_serve_split_listen("[::]:8080", host, &port), 0);
	assert_string_equal(host, "::");
	assert_int_equal(port, 8080);
	assert_int_equal(kiln_serve_split_listen("10.0.0.1", host, &port), -EINVAL);
	assert_int_equal(kiln_serve_split_listen(":80", host, &port), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_route),
		cmocka_unit_test(test_range),
		cmocka_unit_test(test_url),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
