/* fuzz-tokenizer.c — libFuzzer target for the libktok loaders and encoder.
 *
 * Tokenizer files come from model downloads, i.e. from strangers: every
 * loader must refuse garbage cleanly, and what loads must encode and
 * decode anything.  The input is loaded by content like ktok_load (GGUF
 * magic -> libkmf + ktok_load_gguf, '{' -> tokenizer.json, else llama2.c);
 * when it loads, its last 256 bytes are encoded (special parsing on and
 * off), decoded in full and streamed, and invariants checked: failures
 * carry a message, decode output is valid UTF-8, the stream equals the
 * full decode.  Built with clang -fsanitize=fuzzer,address,undefined by
 * tests/tokenizer/build.mk; run 60 s by fuzz-tokenizer.sh (make test-full). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/tokenizer/ktok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const ktok *t, const char *text, size_t len, unsigned flags)
{
	int32_t *ids = NULL;
	size_t n = 0;
	if (ktok_encode(t, text, len, flags, &ids, &n) < 0)
		abort();
	char *dec = NULL;
	size_t dlen = 0;
	if (ktok_decode(t, ids, n, 0, &dec, &dlen) < 0 || !ktok__utf8_valid(dec, dlen))
		abort();
	ktok_stream *s = NULL;
	if (ktok_stream_new(t, 0, &s) < 0)
		abort();
	size_t got = 0;
	for (size_t i = 0; i <= n; i++) {
		const char *c;
		size_t l;
		int r = i < n ? ktok_stream_feed(s, ids[i], &c, &l) : ktok_stream_flush(s, &c, &l);
		if (r < 0 || got + l > dlen || memcmp(dec + got, c, l) != 0)
			abort();
		got += l;
	}
	if (got != dlen)
		abort();
	ktok_stream_free(s);
	free(dec);
	free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ktok *t = NULL;
	kiln_error err;
	int r;
	if (size >= 4 && memcmp(data, "GGUF", 4) == 0) {
		kmf_file *f = NULL;
		kiln_error ke;
		r = kmf_open_mem(data, size, "fuzz.gguf", &f, &ke);
		if (r >= 0)
			r = ktok_load_gguf(f, "fuzz.gguf", &t, &err);
		else
			err.msg[0] = 'x';
		kmf_close(f);
	} else if (size && data[0] == '{') {
		r = ktok_load_hf_json((const char *) data, size, "fuzz.json", &t, &err);
	} else {
		r = ktok_load_llama2c(data, size, 0, "fuzz.bin", &t, &err);
	}
	if (r < 0) {
		if (t || !err.msg[0])
			abort();
		return 0;
	}
	size_t tl = size < 256 ? size : 256;
	const char *text = (const char *) data + size - tl;
	check(t, text, tl, 0);
	check(t, text, tl, KTOK_ENC_PARSE_SPECIAL | KTOK_ENC_ADD_SPECIAL);
	ktok_free(t);
	return 0;
}
