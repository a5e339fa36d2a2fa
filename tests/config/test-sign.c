/* test-sign.c — unit tests for kiln/sign.h: key texts round-trip, a good
 * signature verifies, and every way a signature can be wrong is refused
 * with its own error: a flipped byte of the file, another key, a
 * truncated signature, garbage, a wrong version or algorithm, an edited
 * key id; and a secret key file others may read is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kiln/sign.h"
#include "kiln/strbuf.h"

static const char DATA[] =
	"cluster = { name = \"demo\"; };\nnetwork = { subnet = \"10.77.0.0/24\"; };\n";

static kiln_sign_secret key_a, key_b;

static int setup(void **state)
{
	if (kiln_sign_keygen(&key_a) < 0 || kiln_sign_keygen(&key_b) < 0)
		return -1;
	return 0;
}

static int verify_a(const char *data, size_t len, const char *sig, char *err, size_t errlen)
{
	return kiln_sign_verify(&key_a.pub, data, len, sig, strlen(sig), err, errlen);
}

static void test_keygen_ids(void **state)
{
	assert_int_equal(strlen(key_a.pub.id), KILN_SIGN_KEY_ID_LEN);
	assert_int_equal(strspn(key_a.pub.id, "0123456789abcdef"), KILN_SIGN_KEY_ID_LEN);
	assert_string_not_equal(key_a.pub.id, key_b.pub.id);
	assert_memory_not_equal(key_a.pub.pk, key_b.pub.pk, 32);
}

static void test_key_text_round_trip(void **state)
{
	_cleanup_free_ char *pub = NULL, *sec = NULL;
	assert_int_equal(kiln_sign_format_public(&key_a.pub, &pub), 0);
	assert_int_equal(kiln_sign_format_secret(&key_a, &sec), 0);
	assert_true(startswith(pub, "kiln-public-key v1 ed25519 "));
	assert_true(startswith(sec, "kiln-secret-key v1 ed25519 "));
	assert_non_null(strstr(pub, key_a.pub.id));
	assert_int_equal(pub[strlen(pub) - 1], '\n');

	kiln_sign_public p;
	kiln_sign_secret s;
	char err[256];
	assert_int_equal(kiln_sign_parse_public(pub, strlen(pub), &p, err, sizeof(err)), 0);
	assert_memory_equal(p.pk, key_a.pub.pk, 32);
	assert_string_equal(p.id, key_a.pub.id);
	/* without the final newline too */
	assert_int_equal(kiln_sign_parse_public(pub, strlen(pub) - 1, &p, err, sizeof(err)), 0);
	assert_int_equal(kiln_sign_parse_secret(sec, strlen(sec), &s, err, sizeof(err)), 0);
	assert_memory_equal(s.sk, key_a.sk, 64);
	assert_string_equal(s.pub.id, key_a.pub.id);
	/* a public key is not a secret key and the other way round */
	assert_int_equal(kiln_sign_parse_secret(pub, strlen(pub), &s, err, sizeof(err)), -EBADMSG);
	assert_int_equal(kiln_sign_parse_public(sec, strlen(sec), &p, err, sizeof(err)), -EBADMSG);
	/* an edited key id */
	char *id = strstr(pub, key_a.pub.id);
	id[0] = id[0] == '0' ? '1' : '0';
	assert_int_equal(kiln_sign_parse_public(pub, strlen(pub), &p, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "does not match its key"));
	kiln_sign_wipe(&s);
}

static void test_good_signature(void **state)
{
	_cleanup_free_ char *sig = NULL;
	assert_int_equal(kiln_sign_buffer(&key_a, DATA, strlen(DATA), &sig), 0);
	assert_true(startswith(sig, "kiln-signature v1 ed25519 "));
	assert_non_null(strstr(sig, key_a.pub.id));
	char err[256] = "";
	assert_int_equal(verify_a(DATA, strlen(DATA), sig, err, sizeof(err)), 0);
	/* deterministic (ed25519): the same bytes, the same line */
	_cleanup_free_ char *again = NULL;
	assert_int_equal(kiln_sign_buffer(&key_a, DATA, strlen(DATA), &again), 0);
	assert_string_equal(sig, again);
	/* the empty file can be signed too */
	_cleanup_free_ char *empty = NULL;
	assert_int_equal(kiln_sign_buffer(&key_a, "", 0, &empty), 0);
	assert_int_equal(verify_a("", 0, empty, err, sizeof(err)), 0);
}

static void test_flipped_byte(void **state)
{
	_cleanup_free_ char *sig = NULL;
	assert_int_equal(kiln_sign_buffer(&key_a, DATA, strlen(DATA), &sig), 0);
	char copy[sizeof(DATA)];
	char err[256];
	/* every byte position, one bit each: all refused */
	for (size_t i = 0; i < strlen(DATA); i++) {
		memcpy(copy, DATA, sizeof(DATA));
		copy[i] ^= 0x01;
		assert_int_equal(verify_a(copy, strlen(DATA), sig, err, sizeof(err)),
				 -EKEYREJECTED);
	}
	assert_non_null(strstr(err, "does not match the file's bytes"));
	/* one byte more or less */
	assert_int_equal(verify_a(DATA, strlen(DATA) - 1, sig, err, sizeof(err)), -EKEYREJECTED);
	char longer[sizeof(DATA) + 1];
	memcpy(longer, DATA, sizeof(DATA));
	strcat(longer, "\n");
	assert_int_equal(verify_a(longer, strlen(longer), sig, err, sizeof(err)), -EKEYREJECTED);
	/* a flipped byte of the signature itself (base64 letter changed) */
	char *b64 = strrchr(sig, ' ') + 1;
	b64[10] = b64[10] == 'A' ? 'B' : 'A';
	assert_int_equal(verify_a(DATA, strlen(DATA), sig, err, sizeof(err)), -EKEYREJECTED);
}

static void test_wrong_key(void **state)
{
	_cleanup_free_ char *sig = NULL;
	assert_int_equal(kiln_sign_buffer(&key_b, DATA, strlen(DATA), &sig), 0);
	char err[256];
	assert_int_equal(verify_a(DATA, strlen(DATA), sig, err, sizeof(err)), -ENOKEY);
	assert_non_null(strstr(err, key_b.pub.id));
	assert_non_null(strstr(err, key_a.pub.id));
	/* key b's signature relabelled with key a's id: still refused */
	char *id = strstr(sig, key_b.pub.id);
	memcpy(id, key_a.pub.id, KILN_SIGN_KEY_ID_LEN);
	assert_int_equal(verify_a(DATA, strlen(DATA), sig, err, sizeof(err)), -EKEYREJECTED);
}

static void test_truncated_and_garbage(void **state)
{
	_cleanup_free_ char *sig = NULL;
	assert_int_equal(kiln_sign_buffer(&key_a, DATA, strlen(DATA), &sig), 0);
	char err[256];
	size_t n = strlen(sig);
	/* every truncation of the line */
	for (size_t cut = 0; cut + 1 < n; cut++)
		assert_int_equal(kiln_sign_verify(&key_a.pub, DATA, strlen(DATA), sig, cut, err,
						  sizeof(err)),
				 -EBADMSG);
	static const char *const bad[] = {
		"garbage\n",
		"kiln-signature v1 ed25519\n",
		"kiln-signature v2 ed25519 0123456789abcdef AAAA\n",
		"kiln-signature v1 rsa 0123456789abcdef AAAA\n",
		"kiln-signature v1 ed25519 0123456789ABCDEF AAAA\n",
		"kiln-signature v1 ed25519 0123 AAAA\n",
		"kiln-signature v1 ed25519 0123456789abcdef !!!!\n",
		"kiln-signature v1 ed25519 0123456789abcdef AAAA\n",
		"kiln-signature v1 ed25519 0123456789abcdef AAAA extra\n",
		"kiln-signature v1 ed25519 0123456789abcdef AAAA\nsecond line\n",
		"",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		assert_int_equal(verify_a(DATA, strlen(DATA), bad[i], err, sizeof(err)), -EBADMSG);
	/* a NUL inside */
	char nul[] = "kiln-signature v1\0ed25519 x y\n";
	assert_int_equal(kiln_sign_verify(&key_a.pub, DATA, strlen(DATA), nul, sizeof(nul) - 1, err,
					  sizeof(err)),
			 -EBADMSG);
	/* larger than any signature line */
	char *big = malloc(KILN_SIGN_TEXT_MAX + 2);
	memset(big, 'A', KILN_SIGN_TEXT_MAX + 1);
	big[KILN_SIGN_TEXT_MAX + 1] = '\0';
	assert_int_equal(verify_a(DATA, strlen(DATA), big, err, sizeof(err)), -EBADMSG);
	free(big);
	/* the version's and algorithm's own messages */
	assert_int_equal(verify_a(DATA, strlen(DATA), bad[2], err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "version 'v2'"));
	assert_int_equal(verify_a(DATA, strlen(DATA), bad[3], err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "'rsa' is not ed25519"));
}

static void test_key_files(void **state)
{
	char dir[] = "/tmp/kiln-test-sign.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char sec_path[64], pub_path[64];
	snprintf(sec_path, sizeof(sec_path), "%s/head.key", dir);
	snprintf(pub_path, sizeof(pub_path), "%s/head.pub", dir);
	_cleanup_free_ char *sec = NULL, *pub = NULL;
	assert_int_equal(kiln_sign_format_secret(&key_a, &sec), 0);
	assert_int_equal(kiln_sign_format_public(&key_a.pub, &pub), 0);
	assert_int_equal(kiln_write_file_atomic(sec_path, sec, strlen(sec), 0600), 0);
	assert_int_equal(kiln_write_file_atomic(pub_path, pub, strlen(pub), 0644), 0);
	kiln_sign_secret s;
	kiln_sign_public p;
	char err[256];
	assert_int_equal(kiln_sign_load_secret(sec_path, &s, err, sizeof(err)), 0);
	assert_memory_equal(s.sk, key_a.sk, 64);
	assert_int_equal(kiln_sign_load_public(pub_path, &p, err, sizeof(err)), 0);
	assert_string_equal(p.id, key_a.pub.id);
	/* others may read it: refused like ssh refuses such a private key */
	assert_int_equal(chmod(sec_path, 0640), 0);
	assert_int_equal(kiln_sign_load_secret(sec_path, &s, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "chmod 600"));
	assert_int_equal(chmod(sec_path, 0604), 0);
	assert_int_equal(kiln_sign_load_secret(sec_path, &s, err, sizeof(err)), -EPERM);
	/* missing */
	unlink(sec_path);
	assert_int_equal(kiln_sign_load_secret(sec_path, &s, err, sizeof(err)), -ENOENT);
	unlink(pub_path);
	assert_int_equal(kiln_sign_load_public(pub_path, &p, err, sizeof(err)), -ENOENT);
	rmdir(dir);
	kiln_sign_wipe(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keygen_ids),     cmocka_unit_test(test_key_text_round_trip),
		cmocka_unit_test(test_good_signature), cmocka_unit_test(test_flipped_byte),
		cmocka_unit_test(test_wrong_key),      cmocka_unit_test(test_truncated_and_garbage),
		cmocka_unit_test(test_key_files),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
