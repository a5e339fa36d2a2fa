/* kiln-verbs.h — the verbs of the `kiln` CLI that live outside kiln.c.
 *
 * kiln.c owns the command line up to the verb; `kiln model` and `kiln
 * tokenize` work on model files, not on the cluster file, so they are kept
 * in their own files and only their kiln_prog (for --help and
 * --dump-options, and for kiln_verb_dispatch() to parse the verb's options
 * with) and their run function are shared.  A run function gets argv[0] =
 * the verb, with optind at its first argument, and returns the exit
 * status. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "kiln/prog.h"

extern const kiln_prog kiln_model_prog; /* config/cli/kiln-model.c */
int kiln_model_main(int argc, char **argv);

extern const kiln_prog kiln_tokenize_prog; /* config/cli/kiln-tokenize.c */
int kiln_tokenize_main(int argc, char **argv);

/* Prints o and a newline to stdout with json_dumpf() flags, and releases
 * it (NULL, a failed json_pack(), is -ENOMEM).  Returns 0 or -ENOMEM. */
int kiln_cli_print_json(json_t *o, size_t flags);

/* The global -c FILE given before the verb (`kiln -c FILE status`), or NULL. */
const char *kiln_cli_config(void);

extern const kiln_prog kiln_status_prog; /* config/cli/status.c */
int kiln_status_main(int argc, char **argv);

extern const kiln_prog kiln_reboot_prog; /* config/cli/reboot.c */
int kiln_reboot_main(int argc, char **argv);

extern const kiln_prog kiln_apply_prog; /* config/cli/apply.c */
int kiln_apply_main(int argc, char **argv);

/* config/cli/sign.c: the head node's signing key and signatures */
extern const kiln_prog kiln_keygen_prog;
int kiln_keygen_main(int argc, char **argv);
extern const kiln_prog kiln_sign_prog;
int kiln_sign_main(int argc, char **argv);
extern const kiln_prog kiln_verify_prog;
int kiln_verify_main(int argc, char **argv);
/* Signs data (what: its name in messages) with the secret key at key_path
 * into sig_path, atomically, mode 0644; logs errors.  Returns an exit
 * status: 0, 1 (I/O) or 2 (a missing, unreadable-by-design or malformed
 * key).  kiln sign and kiln apply. */
int kiln_sign_file_with(const char *key_path, const char *what, const char *data, size_t len,
			const char *sig_path);
/* The same, into memory: *ret_sig (free() it) is the signature line. */
int kiln_sign_text_with(const char *key_path, const char *what, const char *data, size_t len,
			char **ret_sig);
extern const kiln_prog kiln_serve_prog; /* config/cli/serve.c */
int kiln_serve_main(int argc, char **argv);
