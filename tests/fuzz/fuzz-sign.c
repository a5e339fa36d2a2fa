/* fuzz-sign.c — libFuzzer target for kiln/sign.h's parsers and verify.
 *
 * kiln-node-init hands `kiln verify` a signature fetched over plain HTTP,
 * so the signature line (and the key lines) must survive anything: no
 * crash, leak, hang or undefined behaviour.  Each input is split at its
 * first NUL-free newline into a signature text and a "file"; it is parsed
 * as a public key, a secret key and a signature of the file against a key
 * made at random when the process starts.  Invariants: a failure always
 * leaves a message; nothing the fuzzer writes verifies (it would be a
 * forgery); a signature the key makes of the file always verifies.
 * Built with clang -fsanitize=fuzzer,address,undefined by
 * tests/fuzz/build.mk; run by tests/fuzz/fuzz-sign.sh (make test-full). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/sign.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static kiln_sign_secret key;
	static int have_key;
	if (!have_key) {
		if (kiln_sign_keygen(&key) < 0)
			abort();
		have_key = 1;
	}
	const char *text = (const char *) data;
	const char *nl = memchr(text, '\n', size);
	size_t sig_len = nl ? (size_t) (nl - text) + 1 : size;
	const char *file = text + sig_len;
	size_t file_len = size - sig_len;

	char err[256];
	kiln_sign_public p;
	kiln_sign_secret s;
	err[0] = 0;
	int r = kiln_sign_parse_public(text, sig_len, &p, err, sizeof(err));
	if (r < 0 && !err[0])
		abort();
	err[0] = 0;
	r = kiln_sign_parse_secret(text, sig_len, &s, err, sizeof(err));
	if (r < 0 && !err[0])
		abort();
	if (r == 0)
		kiln_sign_wipe(&s);
	err[0] = 0;
	r = kiln_sign_verify(&key.pub, file, file_len, text, sig_len, err, sizeof(err));
	if (r < 0 && !err[0])
		abort();
	if (r == 0)
		abort(); /* a forgery of a key made at random in this process */
	/* and a signature this key makes of the file always verifies */
	char *sig = NULL;
	if (kiln_sign_buffer(&key, file, file_len, &sig) < 0)
		abort();
	if (kiln_sign_verify(&key.pub, file, file_len, sig, strlen(sig), err, sizeof(err)) != 0)
		abort();
	free(sig);
	return 0;
}
