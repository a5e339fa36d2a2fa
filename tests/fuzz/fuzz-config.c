/* fuzz-config.c — libFuzzer target for libkiln-config: parse + validate,
 * then render every target when the input is a valid cluster.
 *
 * The cluster file is the one input every kiln program trusts to be checked,
 * and nodes fetch it over HTTP at boot, so loading must survive anything:
 * no crash, leak, hang or undefined behaviour on arbitrary bytes.  Built with
 * clang -fsanitize=fuzzer,address,undefined by config/build.mk; run 60 s by
 * tests/fuzz/fuzz-config.sh (make test-full). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/config.h"
#include "kiln/strbuf.h"

/* Renders for at most this many nodes per input keep one run fast. */
#define FUZZ_NODE_ENV_MAX 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = 0;

	kiln_cfg *cfg = NULL;
	kiln_cfg_errors errs;
	kiln_cfg_errors_init(&errs);
	int r = kiln_cfg_load_string(text, "fuzz.cfg", &cfg, &errs);
	if (r < 0) {
		kiln_strbuf b;
		kiln_strbuf_init(&b);
		for (size_t i = 0; i < errs.n; i++)
			kiln_cfg_error_format(&errs.v[i], &b);
		kiln_strbuf_free(&b);
		if (r == -EINVAL && errs.n == 0)
			abort(); /* an error must always be explained */
	} else {
		if (errs.n != 0)
			abort(); /* success with errors */
		for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++) {
			if (t->flags & KILN_CFG_RENDER_PER_NODE)
				continue;
			char *out = NULL;
			int rr = kiln_cfg_render(cfg, t->name, NULL, &out);
			/* slurmdbd.conf reads the password file the input names:
			 * failing to read it is its contract, not a bug */
			if (rr < 0 && !(strcmp(t->name, "slurmdbd.conf") == 0 &&
					cfg->accounting.storage_host && rr != -ENOMEM))
				abort();
			free(out);
		}
		for (size_t i = 0; i < cfg->n_nodes && i < FUZZ_NODE_ENV_MAX; i++) {
			char *out = NULL;
			if (kiln_cfg_render(cfg, "node-env", cfg->nodes[i].name, &out) < 0)
				abort();
			free(out);
		}
		kiln_cfg_free(cfg);
	}
	kiln_cfg_errors_free(&errs);
	free(text);
	return 0;
}
