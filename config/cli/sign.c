/* sign.c — `kiln keygen`, `kiln sign` and `kiln verify`: the head node's
 * signing key and the signatures of the cluster file it serves.
 *
 *   kiln keygen [--key FILE] [--force]     FILE (0600) and FILE's .pub (0644)
 *   kiln [-c CFG] sign [--key FILE] [FILE]  FILE.sig, written atomically
 *   kiln verify --key PUB FILE [SIG]        exit 0 good, 2 not signed by PUB
 *
 * Why: nodes fetch the cluster file over plain HTTP, and the file names
 * code root runs.  The image carries the head's public key
 * (/etc/kiln/head.pub); kiln-node-init runs `kiln verify` on what it
 * fetched and refuses a file without a good signature by that key.  The
 * formats are kiln/sign.h's (one text line each, docs/image.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln-verbs.h"
#include "kiln/config.h"
#include "kiln/log.h"
#include "kiln/sign.h"
#include "kiln/strbuf.h"

/* The cluster file is at most KILN_CFG_FILE_MAX; `kiln sign FILE` signs
 * other files too, up to this. */
#define SIGN_FILE_MAX (64u * 1024 * 1024)

enum { ARG_KEY = KILN_OPT_FIRST, ARG_FORCE };

static const char *arg_config, *arg_key;
static bool arg_force;

/* ---- shared helpers ------------------------------------------------------ */

/* "DIR/head.key" -> "DIR/head.pub"; any other name gets ".pub" appended. */
static char *public_path(const char *secret)
{
	size_t n = strlen(secret);
	char *p = NULL;
	if (n > 4 && streq(secret + n - 4, ".key")) {
		if (asprintf(&p, "%.*s.pub", (int) (n - 4), secret) < 0)
			return NULL;
	} else if (asprintf(&p, "%s.pub", secret) < 0)
		return NULL;
	return p;
}

/* The secret key's path: --key, else image.signing_key of the cluster file
 * (cfg_path, else -c/$KILN_CONFIG/the default; a missing default file
 * means the schema's default key path).  Returns 0 or an exit status. */
static int signing_key_path(const char *cfg_path, char **ret)
{
	if (arg_key) {
		*ret = strdup(arg_key);
		return *ret ? 0 : KILN_EXIT_FAILURE;
	}
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = kiln_cfg_open(cfg_path, KILN_CFG_OPEN_OPTIONAL, &c);
	if (r < 0)
		return kiln_exit_for_config(r);
	if (c)
		*ret = strdup(c->image.signing_key);
	else {
		_cleanup_(kiln_cfg_freep) kiln_cfg *d = NULL;
		if (kiln_cfg_defaults(&d) < 0)
			return KILN_EXIT_FAILURE;
		*ret = strdup(d->image.signing_key);
	}
	return *ret ? 0 : KILN_EXIT_FAILURE;
}

/* ---- keygen -------------------------------------------------------------- */

static const kiln_option keygen_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "key", ARG_KEY, "FILE",
	  "the secret key to write (default: the cluster file's image.signing_key,\n"
	  "/etc/kiln/head.key); the public key goes next to it as .pub",
	  "file", .str = &arg_key },
	{ "force", ARG_FORCE, NULL,
	  "replace an existing key (nodes then refuse files signed by it)", NULL,
	  .flag = &arg_force },
	KILN_OPTIONS_COMMON,
	{},
};

const kiln_prog kiln_keygen_prog = {
	.name = "kiln keygen",
	.summary = "make the head node's key that signs the cluster file",
	.usage = "kiln [-c FILE] keygen [--key FILE] [--force]",
	.options = keygen_options,
	.args_complete = "",
	.epilog = "Writes an ed25519 key pair: the secret key (mode 0600; keep it on the head\n"
		  "node) and the public key next to it (head.key -> head.pub, mode 0644), which\n"
		  "the image build puts into the image as /etc/kiln/head.pub.  Refuses to\n"
		  "replace an existing key without --force: every image made with the old\n"
		  "public key refuses files signed by a new one until it is rebuilt.\n"
		  "Exit status: 0 written, 1 write failure, 2 usage or a key already there.\n",
};

int kiln_keygen_main(int argc, char **argv)
{
	if (optind < argc)
		return kiln_usage_exit(&kiln_keygen_prog,
				       "keygen takes no arguments (use --key FILE).");
	_cleanup_free_ char *sec_path = NULL;
	int r = signing_key_path(arg_config ? arg_config : kiln_cli_config(), &sec_path);
	if (r)
		return r;
	_cleanup_free_ char *pub_path = public_path(sec_path);
	if (!pub_path)
		return log_error_errno(-ENOMEM, "Out of memory: %m"), KILN_EXIT_FAILURE;
	if (!arg_force)
		for (const char *p = sec_path; p; p = p == sec_path ? pub_path : NULL)
			if (access(p, F_OK) == 0) {
				log_error(
					"%s already exists; kiln keygen does not replace a key "
					"(images carry its public half). To replace it, run kiln "
					"keygen --force, then rebuild the image and kiln sign the "
					"cluster file again.",
					p);
				return KILN_EXIT_USAGE;
			}
	kiln_sign_secret k;
	r = kiln_sign_keygen(&k);
	if (r < 0)
		return log_error_errno(r, "Failed to make a key (no random source?): %m"),
		       KILN_EXIT_FAILURE;
	_cleanup_free_ char *sec_text = NULL, *pub_text = NULL;
	r = kiln_sign_format_secret(&k, &sec_text);
	if (r >= 0)
		r = kiln_sign_format_public(&k.pub, &pub_text);
	char id[sizeof(k.pub.id)];
	memcpy(id, k.pub.id, sizeof(id));
	kiln_sign_wipe(&k);
	if (r < 0)
		return log_error_errno(r, "Out of memory: %m"), KILN_EXIT_FAILURE;
	/* 0600 from the first byte (kiln_write_file_atomic's temp file is
	 * mkstemp's 0600), the public half only after the secret is in place */
	r = kiln_write_file_atomic(sec_path, sec_text, strlen(sec_text), 0600);
	explicit_bzero(sec_text, strlen(sec_text));
	if (r < 0)
		return log_error_errno(r, "Failed to write the secret key '%s': %m", sec_path),
		       KILN_EXIT_FAILURE;
	r = kiln_write_file_atomic(pub_path, pub_text, strlen(pub_text), 0644);
	if (r < 0)
		return log_error_errno(r, "Failed to write the public key '%s': %m", pub_path),
		       KILN_EXIT_FAILURE;
	printf("kiln keygen: key %s: secret key %s (0600, keep it on the head node), public key "
	       "%s (goes into the image)\n",
	       id, sec_path, pub_path);
	return KILN_EXIT_OK;
}

/* ---- sign ---------------------------------------------------------------- */

static const kiln_option sign_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "key", ARG_KEY, "FILE", "the secret key (default: the cluster file's image.signing_key)",
	  "file", .str = &arg_key },
	KILN_OPTIONS_COMMON,
	{},
};

const kiln_prog kiln_sign_prog = {
	.name = "kiln sign",
	.summary = "sign the cluster file (or FILE) with the head node's key",
	.usage = "kiln [-c CFG] sign [--key FILE] [FILE]",
	.options = sign_options,
	.args_complete = "file",
	.epilog = "Writes FILE.sig (one line: kiln-signature v1 ed25519 KEYID BASE64) atomically,\n"
		  "mode 0644.  FILE defaults to the cluster file (-c, $KILN_CONFIG,\n"
		  "/etc/kiln/cluster.cfg); the key to image.signing_key of -c CFG, else of\n"
		  "FILE when it is a cluster file, else of the default cluster file (or\n"
		  "/etc/kiln/head.key without one).\n"
		  "kiln apply and the image build sign the file they publish themselves.\n"
		  "Exit status: 0 signed, 1 I/O failure, 2 usage, or a missing or unusable key.\n",
};

int kiln_sign_text_with(const char *key_path, const char *what, const char *data, size_t len,
			char **ret_sig)
{
	char err[256] = "";
	kiln_sign_secret k;
	int r = kiln_sign_load_secret(key_path, &k, err, sizeof(err));
	if (r < 0) {
		log_error("Cannot use the signing key %s: %s.%s", key_path, err,
			  r == -ENOENT ? " Make one with kiln keygen (or set image.signing_key, or "
					 "give --key)."
				       : "");
		return r == -ENOENT || r == -EPERM || r == -EBADMSG ? KILN_EXIT_USAGE
								    : KILN_EXIT_FAILURE;
	}
	r = kiln_sign_buffer(&k, data, len, ret_sig);
	char id[sizeof(k.pub.id)];
	memcpy(id, k.pub.id, sizeof(id));
	kiln_sign_wipe(&k);
	if (r < 0)
		return log_error_errno(r, "Failed to sign %s: %m", what), KILN_EXIT_FAILURE;
	log_debug("Signed %s with key %s", what, id);
	return KILN_EXIT_OK;
}

int kiln_sign_file_with(const char *key_path, const char *what, const char *data, size_t len,
			const char *sig_path)
{
	_cleanup_free_ char *sig = NULL;
	int r = kiln_sign_text_with(key_path, what, data, len, &sig);
	if (r != KILN_EXIT_OK)
		return r;
	r = kiln_write_file_atomic(sig_path, sig, strlen(sig), 0644);
	if (r < 0)
		return log_error_errno(r, "Failed to write '%s': %m", sig_path), KILN_EXIT_FAILURE;
	log_info("Signed %s with key %.16s: %s", what, sig + strlen("kiln-signature v1 ed25519 "),
		 sig_path);
	return KILN_EXIT_OK;
}

int kiln_sign_main(int argc, char **argv)
{
	if (argc - optind > 1)
		return kiln_usage_exit(&kiln_sign_prog, "sign takes at most one FILE.");
	const char *cfg = arg_config ? arg_config : kiln_cli_config();
	const char *file = optind < argc ? argv[optind] : cfg ? cfg : kiln_cfg_default_path();
	_cleanup_free_ char *key = NULL;
	/* no -c: the key setting comes from FILE itself when it is a valid
	 * cluster file, else from $KILN_CONFIG or the default cluster file */
	const char *key_cfg = cfg;
	if (!key_cfg && !arg_key) {
		_cleanup_(kiln_cfg_freep) kiln_cfg *f = NULL;
		key_cfg = kiln_cfg_load(file, &f, NULL) >= 0 ? file : NULL;
	}
	int r = signing_key_path(key_cfg, &key);
	if (r)
		return r;
	_cleanup_free_ char *data = NULL, *sig_path = NULL;
	size_t len = 0;
	r = kiln_read_file(file, SIGN_FILE_MAX, &data, &len);
	if (r < 0)
		return log_error_errno(r, "Failed to read '%s': %m", file), KILN_EXIT_FAILURE;
	if (asprintf(&sig_path, "%s.sig", file) < 0)
		return log_error_errno(-ENOMEM, "Out of memory: %m"), KILN_EXIT_FAILURE;
	r = kiln_sign_file_with(key, file, data, len, sig_path);
	if (r == KILN_EXIT_OK)
		printf("%s\n", sig_path);
	return r;
}

/* ---- verify -------------------------------------------------------------- */

static const kiln_option verify_options[] = {
	{ "key", ARG_KEY, "PUB", "the trusted public key (the image's /etc/kiln/head.pub)", "file",
	  .str = &arg_key },
	KILN_OPTIONS_COMMON,
	{},
};

const kiln_prog kiln_verify_prog = {
	.name = "kiln verify",
	.summary = "check FILE's signature against a public key",
	.usage = "kiln verify --key PUB FILE [SIG]",
	.options = verify_options,
	.args_complete = "file|file",
	.epilog = "SIG defaults to FILE.sig.  kiln-node-init runs this on the cluster file it\n"
		  "fetched, against the image's /etc/kiln/head.pub.\n"
		  "Exit status: 0 good signature by PUB; 2 not signed (no SIG), signed by another\n"
		  "key, altered, a malformed SIG or PUB, or usage; 1 FILE unreadable.\n",
};

int kiln_verify_main(int argc, char **argv)
{
	if (!arg_key)
		return kiln_usage_exit(&kiln_verify_prog,
				       "verify needs --key PUB (the public key).");
	if (argc - optind < 1 || argc - optind > 2)
		return kiln_usage_exit(&kiln_verify_prog, "verify needs FILE and at most one SIG.");
	const char *file = argv[optind];
	_cleanup_free_ char *sig_path = NULL;
	if (argc - optind == 2)
		sig_path = strdup(argv[optind + 1]);
	else if (asprintf(&sig_path, "%s.sig", file) < 0)
		sig_path = NULL;
	if (!sig_path)
		return log_error_errno(-ENOMEM, "Out of memory: %m"), KILN_EXIT_FAILURE;

	char err[256] = "";
	kiln_sign_public pub;
	int r = kiln_sign_load_public(arg_key, &pub, err, sizeof(err));
	if (r < 0) {
		log_error("Cannot use the public key %s: %s; it is what kiln keygen wrote next to "
			  "the head's secret key (head.pub)",
			  arg_key, err);
		return KILN_EXIT_USAGE;
	}
	_cleanup_free_ char *data = NULL, *sig = NULL;
	size_t len = 0, sig_len = 0;
	r = kiln_read_file(file, SIGN_FILE_MAX, &data, &len);
	if (r < 0)
		return log_error_errno(r, "Failed to read '%s': %m", file), KILN_EXIT_FAILURE;
	r = kiln_read_file(sig_path, KILN_SIGN_TEXT_MAX + 1, &sig, &sig_len);
	if (r == -ENOENT) {
		log_error(
			"%s is not signed: there is no %s. Sign it on the head node (kiln sign, or "
			"kiln apply publishes it signed).",
			file, sig_path);
		return KILN_EXIT_USAGE;
	}
	if (r == -EFBIG) {
		log_error("%s: bad signature %s: larger than %d bytes, not a kiln signature", file,
			  sig_path, KILN_SIGN_TEXT_MAX);
		return KILN_EXIT_USAGE;
	}
	if (r < 0)
		return log_error_errno(r, "Failed to read '%s': %m", sig_path), KILN_EXIT_FAILURE;
	r = kiln_sign_verify(&pub, data, len, sig, sig_len, err, sizeof(err));
	if (r < 0) {
		log_error("%s: bad signature %s: %s. Sign the file on the head node with the key "
			  "whose public half is %s (kiln sign), or rebuild the image with the "
			  "head's current key.",
			  file, sig_path, err, arg_key);
		return r == -ENOMEM ? KILN_EXIT_FAILURE : KILN_EXIT_USAGE;
	}
	log_info("%s: good signature by key %s", file, pub.id);
	return KILN_EXIT_OK;
}
