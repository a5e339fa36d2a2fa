/* sign.c — ed25519 keys and detached signatures in kiln's one-line text
 * formats (kiln/sign.h), on libsodium.
 *
 * The head node signs the cluster file it serves; nodes verify it against
 * the public key baked into their image.  Parsing is strict (exactly five
 * space-separated fields, known magic, version and algorithm, a key id
 * that matches the key, base64 of the exact length): a signature file is
 * untrusted input fetched over plain HTTP. */
#include <errno.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/error.h"
#include "kiln/macro.h"
#include "kiln/sign.h"
#include "kiln/strbuf.h"

#define MAGIC_SECRET "kiln-secret-key"
#define MAGIC_PUBLIC "kiln-public-key"
#define MAGIC_SIG    "kiln-signature"


static int init(void)
{
	/* 0 first time, 1 already done, -1 no usable random source */
	return sodium_init() < 0 ? -EIO : 0;
}

static void key_id(const unsigned char pk[32], char out[KILN_SIGN_KEY_ID_LEN + 1])
{
	unsigned char h[32];
	crypto_generichash(h, sizeof(h), pk, 32, NULL, 0);
	sodium_bin2hex(out, KILN_SIGN_KEY_ID_LEN + 1, h, KILN_SIGN_KEY_ID_LEN / 2);
}

int kiln_sign_keygen(kiln_sign_secret *ret)
{
	assert_return(ret, -EINVAL);
	int r = init();
	if (r < 0)
		return r;
	kiln_sign_secret s;
	crypto_sign_keypair(s.pub.pk, s.sk);
	key_id(s.pub.pk, s.pub.id);
	*ret = s;
	sodium_memzero(&s, sizeof(s));
	return 0;
}

void kiln_sign_wipe(kiln_sign_secret *sec)
{
	if (sec)
		sodium_memzero(sec, sizeof(*sec));
}

/* "MAGIC v1 ed25519 ID BASE64\n" */
static int format_line(const char *magic, const char *id, const unsigned char *bin, size_t n,
		       char **ret)
{
	char b64[128];
	sodium_bin2base64(b64, sizeof(b64), bin, n, sodium_base64_VARIANT_ORIGINAL);
	char *s = NULL;
	int r = asprintf(&s, "%s v1 ed25519 %s %s\n", magic, id, b64);
	sodium_memzero(b64, sizeof(b64));
	if (r < 0)
		return -ENOMEM;
	*ret = s;
	return 0;
}

int kiln_sign_format_public(const kiln_sign_public *pub, char **ret)
{
	assert_return(pub && ret, -EINVAL);
	return format_line(MAGIC_PUBLIC, pub->id, pub->pk, sizeof(pub->pk), ret);
}

int kiln_sign_format_secret(const kiln_sign_secret *sec, char **ret)
{
	assert_return(sec && ret, -EINVAL);
	unsigned char seed[crypto_sign_SEEDBYTES];
	crypto_sign_ed25519_sk_to_seed(seed, sec->sk);
	int r = format_line(MAGIC_SECRET, sec->pub.id, seed, sizeof(seed), ret);
	sodium_memzero(seed, sizeof(seed));
	return r;
}

/* Splits "MAGIC v1 ed25519 ID BASE64[\n]" and decodes BASE64 into exactly n
 * bytes of out; *id gets the 16 hex digits.  what names the kind of text
 * for messages ("signature", "public key"). */
static int parse_line(const char *text, size_t len, const char *magic, const char *what,
		      char id[KILN_SIGN_KEY_ID_LEN + 1], unsigned char *out, size_t n, char *err,
		      size_t errlen)
{
	if (!text || len == 0) {
		kiln_errbuf_printf(err, errlen, "the %s is empty", what);
		return -EBADMSG;
	}
	if (len > KILN_SIGN_TEXT_MAX) {
		kiln_errbuf_printf(err, errlen, "the %s is %zu bytes, not one line of a kiln %s", what, len,
		       what);
		return -EBADMSG;
	}
	if (text[len - 1] == '\n')
		len--;
	if (memchr(text, '\n', len) || memchr(text, '\0', len)) {
		kiln_errbuf_printf(err, errlen, "the %s is more than one line", what);
		return -EBADMSG;
	}
	char line[KILN_SIGN_TEXT_MAX + 1];
	memcpy(line, text, len);
	line[len] = '\0';
	char *f[6] = {}, *save = NULL;
	size_t nf = 0;
	for (char *t = strtok_r(line, " ", &save); t; t = strtok_r(NULL, " ", &save))
		if (nf < ARRAY_SIZE(f))
			f[nf++] = t;
	int r = -EBADMSG;
	if (nf != 5 || !streq(f[0], magic)) {
		kiln_errbuf_printf(err, errlen,
		       "not a kiln %s (expected one line \"%s v1 ed25519 KEYID BASE64\")", what,
		       magic);
		goto out;
	}
	if (!streq(f[1], "v1")) {
		kiln_errbuf_printf(err, errlen, "%s version '%.16s' is not one this kiln reads (v1)", what,
		       f[1]);
		goto out;
	}
	if (!streq(f[2], "ed25519")) {
		kiln_errbuf_printf(err, errlen, "%s algorithm '%.16s' is not ed25519", what, f[2]);
		goto out;
	}
	if (strlen(f[3]) != KILN_SIGN_KEY_ID_LEN ||
	    strspn(f[3], "0123456789abcdef") != KILN_SIGN_KEY_ID_LEN) {
		kiln_errbuf_printf(err, errlen, "%s key id '%.32s' is not %d lower case hex digits", what, f[3],
		       KILN_SIGN_KEY_ID_LEN);
		goto out;
	}
	size_t got = 0;
	const char *end = NULL;
	if (sodium_base642bin(out, n, f[4], strlen(f[4]), NULL, &got, &end,
			      sodium_base64_VARIANT_ORIGINAL) != 0 ||
	    got != n || (end && *end)) {
		kiln_errbuf_printf(err, errlen, "%s value is not the base64 of %zu bytes", what, n);
		goto out;
	}
	memcpy(id, f[3], KILN_SIGN_KEY_ID_LEN + 1);
	r = 0;
out:
	sodium_memzero(line, sizeof(line));
	return r;
}

int kiln_sign_parse_public(const char *text, size_t len, kiln_sign_public *ret, char *err,
			   size_t errlen)
{
	assert_return(ret, -EINVAL);
	int r = init();
	if (r < 0)
		return r;
	kiln_sign_public p;
	char id[KILN_SIGN_KEY_ID_LEN + 1];
	r = parse_line(text, len, MAGIC_PUBLIC, "public key", id, p.pk, sizeof(p.pk), err, errlen);
	if (r < 0)
		return r;
	key_id(p.pk, p.id);
	if (!streq(id, p.id)) {
		kiln_errbuf_printf(err, errlen,
		       "public key's id %s does not match its key (%s): the file was "
		       "edited",
		       id, p.id);
		return -EBADMSG;
	}
	*ret = p;
	return 0;
}

int kiln_sign_parse_secret(const char *text, size_t len, kiln_sign_secret *ret, char *err,
			   size_t errlen)
{
	assert_return(ret, -EINVAL);
	int r = init();
	if (r < 0)
		return r;
	unsigned char seed[crypto_sign_SEEDBYTES];
	char id[KILN_SIGN_KEY_ID_LEN + 1];
	r = parse_line(text, len, MAGIC_SECRET, "secret key", id, seed, sizeof(seed), err, errlen);
	if (r < 0)
		return r;
	kiln_sign_secret s;
	crypto_sign_seed_keypair(s.pub.pk, s.sk, seed);
	sodium_memzero(seed, sizeof(seed));
	key_id(s.pub.pk, s.pub.id);
	if (!streq(id, s.pub.id)) {
		kiln_errbuf_printf(err, errlen,
		       "secret key's id %s does not match its key (%s): the file was "
		       "edited",
		       id, s.pub.id);
		kiln_sign_wipe(&s);
		return -EBADMSG;
	}
	*ret = s;
	kiln_sign_wipe(&s);
	return 0;
}

int kiln_sign_load_public(const char *path, kiln_sign_public *ret, char *err, size_t errlen)
{
	assert_return(path && ret, -EINVAL);
	_cleanup_free_ char *text = NULL;
	size_t len = 0;
	int r = kiln_read_file(path, KILN_SIGN_TEXT_MAX + 1, &text, &len);
	if (r == -EFBIG) {
		kiln_errbuf_printf(err, errlen, "the public key is larger than %d bytes", KILN_SIGN_TEXT_MAX);
		return -EBADMSG;
	}
	if (r < 0) {
		kiln_errbuf_printf(err, errlen, "cannot read it: %s", strerror(-r));
		return r;
	}
	return kiln_sign_parse_public(text, len, ret, err, errlen);
}

int kiln_sign_load_secret(const char *path, kiln_sign_secret *ret, char *err, size_t errlen)
{
	assert_return(path && ret, -EINVAL);
	struct stat st;
	if (stat(path, &st) < 0) {
		int r = -errno;
		kiln_errbuf_printf(err, errlen, "cannot read it: %s", strerror(errno));
		return r;
	}
	/* as ssh refuses a private key others can read */
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		kiln_errbuf_printf(err, errlen,
		       "its mode is %04o: others may read or change the secret key; "
		       "chmod 600 it (and make a new key if others could read it)",
		       (unsigned) (st.st_mode & 07777));
		return -EPERM;
	}
	char *text = NULL;
	size_t len = 0;
	int r = kiln_read_file(path, KILN_SIGN_TEXT_MAX + 1, &text, &len);
	if (r == -EFBIG) {
		kiln_errbuf_printf(err, errlen, "the secret key is larger than %d bytes", KILN_SIGN_TEXT_MAX);
		return -EBADMSG;
	}
	if (r < 0) {
		kiln_errbuf_printf(err, errlen, "cannot read it: %s", strerror(-r));
		return r;
	}
	r = kiln_sign_parse_secret(text, len, ret, err, errlen);
	sodium_memzero(text, len);
	free(text);
	return r;
}

/* KILN_SIGN_CONTEXT || data, the message that is signed */
static int message(const void *data, size_t len, unsigned char **ret, size_t *ret_len)
{
	size_t cl = strlen(KILN_SIGN_CONTEXT);
	if (len > SIZE_MAX - cl)
		return -ENOMEM;
	unsigned char *m = malloc(cl + len + 1);
	if (!m)
		return -ENOMEM;
	memcpy(m, KILN_SIGN_CONTEXT, cl);
	if (len)
		memcpy(m + cl, data, len);
	*ret = m;
	*ret_len = cl + len;
	return 0;
}

int kiln_sign_buffer(const kiln_sign_secret *sec, const void *data, size_t len, char **ret)
{
	assert_return(sec && (data || len == 0) && ret, -EINVAL);
	int r = init();
	if (r < 0)
		return r;
	_cleanup_free_ unsigned char *m = NULL;
	size_t ml = 0;
	r = message(data, len, &m, &ml);
	if (r < 0)
		return r;
	unsigned char sig[crypto_sign_BYTES];
	crypto_sign_detached(sig, NULL, m, ml, sec->sk);
	return format_line(MAGIC_SIG, sec->pub.id, sig, sizeof(sig), ret);
}

int kiln_sign_verify(const kiln_sign_public *pub, const void *data, size_t len, const char *sig,
		     size_t sig_len, char *err, size_t errlen)
{
	assert_return(pub && (data || len == 0), -EINVAL);
	int r = init();
	if (r < 0)
		return r;
	unsigned char s[crypto_sign_BYTES];
	char id[KILN_SIGN_KEY_ID_LEN + 1];
	r = parse_line(sig, sig_len, MAGIC_SIG, "signature", id, s, sizeof(s), err, errlen);
	if (r < 0)
		return r;
	if (!streq(id, pub->id)) {
		kiln_errbuf_printf(err, errlen, "signed by key %s, not by the trusted key %s", id, pub->id);
		return -ENOKEY;
	}
	_cleanup_free_ unsigned char *m = NULL;
	size_t ml = 0;
	r = message(data, len, &m, &ml);
	if (r < 0)
		return r;
	if (crypto_sign_verify_detached(s, m, ml, pub->pk) != 0) {
		kiln_errbuf_printf(err, errlen,
		       "the signature by key %s does not match the file's bytes (the "
		       "file was altered, or the signature belongs to another file)",
		       id);
		return -EKEYREJECTED;
	}
	return 0;
}
