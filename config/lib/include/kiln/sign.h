/* kiln/sign.h — ed25519 signatures of the files the head node serves.
 *
 * Why: a node fetches its cluster file over plain HTTP on the boot network,
 * and the file names code root runs (health.nvml_library, Prolog, Epilog)
 * and the controller's address.  The head node signs the file with its key
 * (`kiln sign`, `kiln apply`, the image build); the image carries the public
 * half, and kiln-node-init refuses a file that does not verify
 * (docs/image.md, "The signed cluster file").
 *
 * Three text files, one line each, so an admin can read and copy them:
 *
 *   secret key  kiln-secret-key v1 ed25519 KEYID BASE64(32-byte seed)
 *   public key  kiln-public-key v1 ed25519 KEYID BASE64(32-byte public key)
 *   signature   kiln-signature v1 ed25519 KEYID BASE64(64-byte signature)
 *
 * KEYID is the first 8 bytes of BLAKE2b-256 of the public key, 16 lower
 * case hex digits: it names the key in messages and tells "signed by
 * another key" from "altered".  The signed message is the context string
 * KILN_SIGN_CONTEXT followed by the file's bytes, so a kiln signature can
 * never be replayed as a signature of something else made with the same
 * key.  Base64 is the standard alphabet with padding (RFC 4648 section 4).
 *
 * Every function returns 0 or a negative errno; on failure the output
 * parameters are untouched and err (when not NULL) holds a sentence that
 * says what was wrong.  Errors:
 *   -EINVAL        a NULL argument
 *   -ENOMEM        out of memory
 *   -EBADMSG       a key or signature text that is not in the format above
 *   -ENOKEY        the signature names another key (KEYID differs)
 *   -EKEYREJECTED  the signature does not match the bytes (altered file,
 *                  or a signature made for another file)
 *   -EPERM         a secret key file that others may read or write
 *   other -errno   reading a file
 * Links libsodium. */
#pragma once

#include <stddef.h>

#define KILN_SIGN_CONTEXT    "kiln-signature v1\n"
#define KILN_SIGN_KEY_ID_LEN 16 /* hex digits */
/* A key or signature line is under 200 bytes; a larger file is not one. */
#define KILN_SIGN_TEXT_MAX 4096

typedef struct kiln_sign_public {
	unsigned char pk[32];
	char id[KILN_SIGN_KEY_ID_LEN + 1];
} kiln_sign_public;

typedef struct kiln_sign_secret {
	unsigned char sk[64]; /* libsodium's secret key: seed || public key */
	kiln_sign_public pub;
} kiln_sign_secret;

/* A new key pair from the system's random source. */
int kiln_sign_keygen(kiln_sign_secret *ret);

/* The one-line texts (with a final newline) of a key; free() them.  The
 * secret text should be written mode 0600 and wiped (kiln_sign_wipe). */
int kiln_sign_format_public(const kiln_sign_public *pub, char **ret);
int kiln_sign_format_secret(const kiln_sign_secret *sec, char **ret);

/* Parses a key text (what the format functions write; a final newline is
 * optional).  A secret key text is checked against its KEYID. */
int kiln_sign_parse_public(const char *text, size_t len, kiln_sign_public *ret, char *err,
			   size_t errlen);
int kiln_sign_parse_secret(const char *text, size_t len, kiln_sign_secret *ret, char *err,
			   size_t errlen);

/* Reads and parses a key file.  The secret key file is refused (-EPERM)
 * when its group or every user may read or write it. */
int kiln_sign_load_public(const char *path, kiln_sign_public *ret, char *err, size_t errlen);
int kiln_sign_load_secret(const char *path, kiln_sign_secret *ret, char *err, size_t errlen);

/* The signature line of data[0..len) (with a final newline); free() it. */
int kiln_sign_buffer(const kiln_sign_secret *sec, const void *data, size_t len, char **ret);

/* Checks the signature line sig[0..sig_len) of data[0..len) against pub.
 * 0: good.  -EBADMSG, -ENOKEY, -EKEYREJECTED as above. */
int kiln_sign_verify(const kiln_sign_public *pub, const void *data, size_t len, const char *sig,
		     size_t sig_len, char *err, size_t errlen);

/* Overwrites a secret key in memory (before free or on the stack's end). */
void kiln_sign_wipe(kiln_sign_secret *sec);
