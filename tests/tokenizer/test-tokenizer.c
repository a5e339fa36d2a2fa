/* test-tokenizer.c — libktok unit tests (cmocka).
 *
 * Golden cases: tests/tokenizer/make-fixtures.py trained small tokenizers
 * with Hugging Face `tokenizers` and `sentencepiece` (independent
 * implementations) and recorded text -> ids -> text for tricky strings,
 * random strings and lines of kiln's docs; every loader (tokenizer.json,
 * GGUF "llama"/"gpt2" with pre "gpt2"/"llama-bpe", llama2.c) must
 * reproduce the reference's ids, ids with BOS, and decoded text exactly.
 * Then: the streaming decoder against the full decode (golden ids and
 * random id sequences, every chunk valid UTF-8), special-token injection,
 * malformed files (bad/expect.json: errno and message), truncations of a
 * good GGUF at every few bytes, chat templates against the reference
 * templates' output, and the encoder's cost on long inputs (not quadratic).
 * Run from the repository root (tests/run-tests.sh does). */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "kiln/macro.h"
#include "kiln/strbuf.h"
#include "ktok.h"

#include "../lib/model-test.h"

#define DATA "tests/tokenizer/data/"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	return kiln_test_xorshift(&rng_state);
}

static ktok *load_ok(const char *path)
{
	ktok *t = NULL;
	kiln_error err;
	KILN_ASSERT_OK(ktok_load(path, &t, &err), &err);
	assert_non_null(t);
	return t;
}

/* Independent UTF-8 check (not ktok's): RFC 3629 by hand. */
static bool valid_utf8(const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *) s;
	for (size_t i = 0; i < len;) {
		unsigned c = u[i], n;
		uint32_t cp;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xE0) == 0xC0) {
			n = 1, cp = c & 0x1F;
		} else if ((c & 0xF0) == 0xE0) {
			n = 2, cp = c & 0x0F;
		} else if ((c & 0xF8) == 0xF0) {
			n = 3, cp = c & 0x07;
		} else {
			return false;
		}
		for (unsigned k = 1; k <= n; k++) {
			if (i + k >= len || (u[i + k] & 0xC0) != 0x80)
				return false;
			cp = (cp << 6) | (u[i + k] & 0x3F);
		}
		static const uint32_t min[] = { 0, 0x80, 0x800, 0x10000 };
		if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return false;
		i += n + 1;
	}
	return true;
}

/* Streams ids through ktok_stream and checks: every chunk is valid UTF-8
 * and the chunks concatenated equal ktok_decode's output. */
static void check_stream(const ktok *t, const int32_t *ids, size_t n, unsigned flags)
{
	_cleanup_free_ char *full = NULL;
	size_t full_len;
	assert_int_equal(ktok_decode(t, ids, n, flags, &full, &full_len), 0);
	assert_true(valid_utf8(full, full_len));
	_cleanup_(ktok_stream_freep) ktok_stream *s = NULL;
	assert_int_equal(ktok_stream_new(t, flags, &s), 0);
	_cleanup_(kiln_strbuf_freep) kiln_strbuf acc;
	kiln_strbuf_init(&acc);
	kiln_strbuf_append(&acc, "");
	const char *chunk;
	size_t len;
	for (size_t i = 0; i <= n; i++) {
		if (i < n)
			assert_int_equal(ktok_stream_feed(s, ids[i], &chunk, &len), 0);
		else
			assert_int_equal(ktok_stream_flush(s, &chunk, &len), 0);
		assert_true(valid_utf8(chunk, len));
		kiln_strbuf_append_n(&acc, chunk, len);
	}
	assert_int_equal(acc.len, full_len);
	assert_memory_equal(acc.s, full, full_len);
}

static void json_ids(json_t *a, int32_t **ids, size_t *n)
{
	*n = json_array_size(a);
	*ids = calloc(*n + 1, sizeof(**ids));
	assert_non_null(*ids);
	for (size_t i = 0; i < *n; i++)
		(*ids)[i] = (int32_t) json_integer_value(json_array_get(a, i));
}

static void assert_ids(const char *what, const char *file, const char *text, const int32_t *got,
		       size_t ngot, const int32_t *want, size_t nwant)
{
	bool same = ngot == nwant && (nwant == 0 || memcmp(got, want, nwant * sizeof(*got)) == 0);
	if (!same) {
		print_error("%s: %s: text \"%s\"\n  got ", file, what, text);
		for (size_t i = 0; i < ngot; i++)
			print_error("%d ", got[i]);
		print_error("\n want ");
		for (size_t i = 0; i < nwant; i++)
			print_error("%d ", want[i]);
		print_error("\n");
	}
	assert_true(same);
}

static int golden_cases;

/* Every fixture against its reference's golden cases. */
static void test_golden(void **state)
{
	json_error_t je;
	json_t *files = json_load_file(DATA "files.json", 0, &je);
	assert_non_null(files);
	const char *file;
	json_t *refname;
	json_object_foreach(files, file, refname)
	{
		char path[512], gpath[512];
		snprintf(path, sizeof(path), DATA "%s", file);
		snprintf(gpath, sizeof(gpath), DATA "golden-%s.json", json_string_value(refname));
		_cleanup_(ktok_freep) ktok *t = load_ok(path);
		json_t *cases = json_load_file(gpath, 0, &je);
		assert_non_null(cases);
		/* HF tokenizers always match added tokens; sentencepiece never
		 * matches control symbols in text. */
		bool hf = strncmp(json_string_value(refname), "hf-", 3) == 0;
		unsigned base = hf ? KTOK_ENC_PARSE_SPECIAL : 0;
		size_t i;
		json_t *c;
		json_array_foreach(cases, i, c)
		{
			const char *text = json_string_value(json_object_get(c, "text"));
			size_t tlen = json_string_length(json_object_get(c, "text"));
			_cleanup_free_ int32_t *want = NULL, *want_sp = NULL, *got = NULL,
					       *got_sp = NULL;
			size_t nwant, nwant_sp, ngot, ngot_sp;
			json_ids(json_object_get(c, "ids"), &want, &nwant);
			json_ids(json_object_get(c, "ids_special"), &want_sp, &nwant_sp);
			assert_int_equal(ktok_encode(t, text, tlen, base, &got, &ngot), 0);
			assert_ids("ids", file, text, got, ngot, want, nwant);
			assert_int_equal(ktok_encode(t, text, tlen, base | KTOK_ENC_ADD_SPECIAL,
						     &got_sp, &ngot_sp),
					 0);
			assert_ids("ids with BOS/EOS", file, text, got_sp, ngot_sp, want_sp,
				   nwant_sp);
			_cleanup_free_ char *dec = NULL;
			size_t dlen;
			assert_int_equal(
				ktok_decode(t, want, nwant, KTOK_DEC_SKIP_SPECIAL, &dec, &dlen), 0);
			const char *wdec = json_string_value(json_object_get(c, "decoded"));
			if (strcmp(dec, wdec) != 0)
				print_error("%s: decode of \"%s\": got \"%s\" want \"%s\"\n", file,
					    text, dec, wdec);
			assert_string_equal(dec, wdec);
			check_stream(t, want, nwant, KTOK_DEC_SKIP_SPECIAL);
			check_stream(t, want_sp, nwant_sp, 0);
			golden_cases++;
		}
		json_decref(cases);
	}
	json_decref(files);
	assert_true(golden_cases >= 8 * 100);
}

/* Random ids (byte tokens split across characters, lone continuation
 * bytes, specials) through the streaming decoder. */
static void test_stream_random(void **state)
{
	static const char *const files[] = { "hf-bytelevel.json", "hf-spm.json", "sp-llama.gguf",
					     "bpe-llama3.gguf" };
	for (size_t f = 0; f < ARRAY_SIZE(files); f++) {
		char path[256];
		snprintf(path, sizeof(path), DATA "%s", files[f]);
		_cleanup_(ktok_freep) ktok *t = load_ok(path);
		uint32_t n = ktok_n_vocab(t);
		for (int iter = 0; iter < 300; iter++) {
			int32_t ids[40];
			size_t k = 1 + rnd() % ARRAY_SIZE(ids);
			for (size_t i = 0; i < k; i++)
				ids[i] = (int32_t) (rnd() % n);
			check_stream(t, ids, k, (iter & 1) ? KTOK_DEC_SKIP_SPECIAL : 0);
		}
	}
}

/* A character split over byte tokens comes out whole, once, and not
 * before its last byte. */
static void test_stream_split_char(void **state)
{
	_cleanup_(ktok_freep) ktok *t = load_ok(DATA "sp-llama.gguf");
	/* U+1F916 (robot face) = F0 9F A4 96; <0xNN> ids are 3 + NN here. */
	int32_t ids[] = { 3 + 0xF0, 3 + 0x9F, 3 + 0xA4, 3 + 0x96 };
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(ktok_token_type(t, ids[i]), KTOK_BYTE);
	_cleanup_(ktok_stream_freep) ktok_stream *s = NULL;
	assert_int_equal(ktok_stream_new(t, 0, &s), 0);
	const char *c;
	size_t len;
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(ktok_stream_feed(s, ids[i], &c, &len), 0);
		assert_int_equal(len, 0);
	}
	assert_int_equal(ktok_stream_feed(s, ids[3], &c, &len), 0);
	assert_int_equal(len, 4);
	assert_memory_equal(c, "\xF0\x9F\xA4\x96", 4);
	/* An interrupted sequence: F0 9F then 'A' byte -> U+FFFD then 'A'. */
	int32_t bad[] = { 3 + 0xF0, 3 + 0x9F, 3 + 'A' };
	_cleanup_free_ char *dec = NULL;
	assert_int_equal(ktok_decode(t, bad, 3, 0, &dec, &len), 0);
	assert_string_equal(dec, "\xEF\xBF\xBD"
				 "A");
	/* The leading space of the first piece is the dummy prefix. */
	int32_t hello[8];
	_cleanup_free_ int32_t *ids2 = NULL;
	size_t n2;
	assert_int_equal(ktok_encode(t, "Hello", 5, 0, &ids2, &n2), 0);
	assert_true(n2 < ARRAY_SIZE(hello));
	_cleanup_free_ char *d2 = NULL;
	assert_int_equal(ktok_decode(t, ids2, n2, 0, &d2, &len), 0);
	assert_string_equal(d2, "Hello");
}

/* User text cannot inject control tokens unless the caller asks. */
static void test_injection(void **state)
{
	static const struct {
		const char *file, *special;
	} cases[] = {
		{ "hf-bytelevel.json", "<|im_end|>" },
		{ "bpe-gpt2.gguf", "<|im_end|>" },
		{ "hf-spm.json", "</s>" },
		{ "sp-llama.gguf", "<s>" },
		{ "sp-tokenizer.bin", "\n</s>\n" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		char path[256];
		snprintf(path, sizeof(path), DATA "%s", cases[i].file);
		_cleanup_(ktok_freep) ktok *t = load_ok(path);
		int32_t sp = ktok_find(t, cases[i].special, strlen(cases[i].special));
		assert_true(sp >= 0);
		assert_int_equal(ktok_token_type(t, sp), KTOK_CONTROL);
		char text[128];
		int len = snprintf(text, sizeof(text), "hi %s there", cases[i].special);
		for (int parse = 0; parse < 2; parse++) {
			_cleanup_free_ int32_t *ids = NULL;
			size_t n;
			assert_int_equal(ktok_encode(t, text, (size_t) len,
						     parse ? KTOK_ENC_PARSE_SPECIAL : 0, &ids, &n),
					 0);
			size_t hits = 0;
			for (size_t k = 0; k < n; k++)
				hits += ids[k] == sp;
			assert_int_equal(hits, (size_t) parse);
			/* Round trip of the literal text without parsing. */
			if (!parse) {
				_cleanup_free_ char *dec = NULL;
				assert_int_equal(ktok_decode(t, ids, n, 0, &dec, NULL), 0);
				assert_string_equal(dec, text);
			}
		}
	}
	/* User-defined (non-special) added tokens are always matched. */
	_cleanup_(ktok_freep) ktok *t = load_ok(DATA "hf-bytelevel.json");
	int32_t kn = ktok_find(t, "kiln-node", 9);
	assert_int_equal(ktok_token_type(t, kn), KTOK_USER);
	_cleanup_free_ int32_t *ids = NULL;
	size_t n;
	assert_int_equal(ktok_encode(t, "a kiln-node b", 13, 0, &ids, &n), 0);
	bool found = false;
	for (size_t k = 0; k < n; k++)
		found |= ids[k] == kn;
	assert_true(found);
}

static int errno_of(const char *name)
{
	if (streq(name, "EBADMSG"))
		return -EBADMSG;
	if (streq(name, "E2BIG"))
		return -E2BIG;
	if (streq(name, "EOPNOTSUPP"))
		return -EOPNOTSUPP;
	fail_msg("unknown errno name %s", name);
	return 0;
}

/* Each malformed file is refused with its errno and a message naming the
 * fault, and *ret stays untouched. */
static void test_bad_files(void **state)
{
	json_error_t je;
	json_t *exp = json_load_file(DATA "bad/expect.json", 0, &je);
	assert_non_null(exp);
	const char *name;
	json_t *v;
	size_t count = 0;
	json_object_foreach(exp, name, v)
	{
		char path[512];
		snprintf(path, sizeof(path), DATA "bad/%s", name);
		ktok *t = (ktok *) (uintptr_t) 1;
		kiln_error err;
		int r = ktok_load(path, &t, &err);
		int want = errno_of(json_string_value(json_array_get(v, 0)));
		const char *msg = json_string_value(json_array_get(v, 1));
		if (r != want || !strstr(err.msg, msg))
			print_error("%s: got %d \"%s\", want %d with \"%s\"\n", name, r, err.msg,
				    want, msg);
		assert_int_equal(r, want);
		assert_int_equal(err.code, want);
		assert_non_null(strstr(err.msg, msg));
		assert_true(strlen(err.msg) > 10);
		assert_ptr_equal(t, (ktok *) (uintptr_t) 1);
		count++;
	}
	assert_true(count >= 20);
	json_decref(exp);
}

/* Every prefix of good files (step 7 bytes) fails cleanly or loads. */
static void test_truncations(void **state)
{
	static const char *const files[] = { "sp-llama.gguf", "bpe-gpt2.gguf", "sp-tokenizer.bin",
					     "hf-spm.json" };
	for (size_t f = 0; f < ARRAY_SIZE(files); f++) {
		char path[256];
		snprintf(path, sizeof(path), DATA "%s", files[f]);
		_cleanup_free_ char *buf = NULL;
		size_t len;
		assert_int_equal(kiln_read_file(path, 1 << 24, &buf, &len), 0);
		size_t refused = 0;
		for (size_t cut = 0; cut < len; cut += 7) {
			ktok *t = NULL;
			kiln_error err;
			int r;
			if (strstr(files[f], ".json")) {
				r = ktok_load_hf_json(buf, cut, files[f], &t, &err);
			} else if (strstr(files[f], ".bin")) {
				r = ktok_load_llama2c(buf, cut, 1000, files[f], &t, &err);
			} else {
				kmf_file *mf = NULL;
				kiln_error ke;
				r = kmf_open_mem(buf, cut, files[f], &mf, &ke);
				if (r >= 0)
					r = ktok_load_gguf(mf, files[f], &t, &err);
				kmf_close(mf);
			}
			if (r < 0) {
				refused++;
				assert_null(t);
			}
			ktok_free(t);
		}
		assert_true(refused >= len / 7 - 2);
	}
}

static void test_chat(void **state)
{
	const ktok_msg conv[] = {
		{ "system", "Be brief." },
		{ "user", "Hi" },
		{ "assistant", "Hello!" },
		{ "user", "What is kiln?" },
	};
	/* Expected strings: the reference Jinja templates of each family
	 * rendered by hand (docs/tokenizer.md quotes them). */
	static const struct {
		ktok_chat c;
		const char *want;
	} cases[] = {
		{ KTOK_CHAT_CHATML,
		  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
		  "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is "
		  "kiln?<|im_end|>\n<|im_start|>assistant\n" },
		{ KTOK_CHAT_LLAMA2,
		  "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] "
		  "What is kiln? [/INST]" },
		{ KTOK_CHAT_LLAMA3,
		  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
		  "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_"
		  "header_id|>"
		  "assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_"
		  "header_id|>\n\nWhat "
		  "is kiln?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" },
		{ KTOK_CHAT_MISTRAL,
		  "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] What is kiln? [/INST]" },
		{ KTOK_CHAT_GEMMA,
		  "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
		  "Hello!<end_of_turn>\n<start_of_turn>user\nWhat is "
		  "kiln?<end_of_turn>\n<start_of_turn>model\n" },
		{ KTOK_CHAT_PHI3,
		  "<|system|>\nBe "
		  "brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
		  "<|user|>\nWhat is kiln?<|end|>\n<|assistant|>\n" },
		{ KTOK_CHAT_ZEPHYR,
		  "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
		  "<|user|>\nWhat is kiln?</s>\n<|assistant|>\n" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		_cleanup_free_ char *out = NULL;
		assert_int_equal(ktok_chat_render(cases[i].c, conv, ARRAY_SIZE(conv), true, NULL,
						  NULL, &out),
				 0);
		if (strcmp(out, cases[i].want) != 0)
			print_error("%s:\n got: %s\nwant: %s\n", ktok_chat_name(cases[i].c), out,
				    cases[i].want);
		assert_string_equal(out, cases[i].want);
		assert_int_equal(ktok_chat_from_name(ktok_chat_name(cases[i].c)), (int) cases[i].c);
	}
	/* Roles must alternate for [INST] templates; unknown roles refused. */
	const ktok_msg two_users[] = { { "user", "a" }, { "user", "b" } };
	const ktok_msg odd_role[] = { { "wizard", "a" } };
	char *out = NULL;
	assert_int_equal(ktok_chat_render(KTOK_CHAT_LLAMA2, two_users, 2, true, NULL, NULL, &out),
			 -EINVAL);
	assert_int_equal(ktok_chat_render(KTOK_CHAT_CHATML, odd_role, 1, true, NULL, NULL, &out),
			 -EINVAL);
	assert_null(out);
	/* Detection from the fixtures' templates and from unknown ones. */
	_cleanup_(ktok_freep) ktok *a = load_ok(DATA "sp-llama.gguf");
	_cleanup_(ktok_freep) ktok *b = load_ok(DATA "bpe-gpt2.gguf");
	assert_int_equal(ktok_chat_detect(ktok_chat_template(a)), KTOK_CHAT_LLAMA2);
	assert_int_equal(ktok_chat_detect(ktok_chat_template(b)), KTOK_CHAT_CHATML);
	assert_int_equal(ktok_chat_detect("{{ messages }}"), -EOPNOTSUPP);
	assert_int_equal(ktok_chat_detect("{% for m in messages %}<start_of_turn>{% endfor %}"),
			 KTOK_CHAT_GEMMA);
	assert_int_equal(ktok_chat_detect("[INST] {{ m }} [/INST]"), KTOK_CHAT_MISTRAL);
	assert_int_equal(ktok_chat_detect("<|user|>{{ m }}<|end|>"), KTOK_CHAT_PHI3);
	assert_int_equal(ktok_chat_detect("<|user|>{{ m + eos_token }}"), KTOK_CHAT_ZEPHYR);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Encoding 16x more text costs about 16x more, not 256x: one long word
 * (a single SentencePiece piece; a long GPT-2 letter run) both ways. */
static void test_not_quadratic(void **state)
{
	static const char *const files[] = { "sp-llama.gguf", "hf-bytelevel.json" };
	for (size_t f = 0; f < ARRAY_SIZE(files); f++) {
		char path[256];
		snprintf(path, sizeof(path), DATA "%s", files[f]);
		_cleanup_(ktok_freep) ktok *t = load_ok(path);
		double per[2] = { 0, 0 };
		size_t sizes[2] = { 10000, 160000 };
		for (int k = 0; k < 2; k++) {
			_cleanup_free_ char *s = malloc(sizes[k]);
			for (size_t i = 0; i < sizes[k]; i++)
				s[i] = "kilnodes"[rnd() % 8];
			double best = 1e9;
			for (int rep = 0; rep < 5; rep++) {
				_cleanup_free_ int32_t *ids = NULL;
				size_t n;
				double t0 = now();
				assert_int_equal(ktok_encode(t, s, sizes[k], 0, &ids, &n), 0);
				best = MIN(best, now() - t0);
				assert_true(n > 0 && n <= sizes[k]);
				if (k == 1 && best / (double) sizes[1] > 8 * per[0])
					break; /* failing already: no more slow reps */
			}
			per[k] = best / (double) sizes[k];
		}
		/* n log n is ~1.3x per byte here, cache effects and a shared
		 * machine add noise; quadratic would be 16x. */
		if (per[1] > 8 * per[0])
			print_error("%s: %.1f ns/byte at 10 kB, %.1f ns/byte at 160 kB\n", files[f],
				    per[0] * 1e9, per[1] * 1e9);
		assert_true(per[1] < 8 * per[0]);
	}
}

/* Found by fuzz-tokenizer: byte fallback for a byte with no <0xNN>
 * token and no unknown token emitted id -1.  Now: dropped, as HF does. */
static void test_missing_byte_token(void **state)
{
	static const char js[] =
		"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"merges\": [],"
		" \"vocab\": {\"a\": 0, \" \": 1, \"<0x61>\": 2}}, \"added_tokens\": []}";
	_cleanup_(ktok_freep) ktok *t = NULL;
	kiln_error err;
	assert_int_equal(ktok_load_hf_json(js, strlen(js), "mini", &t, &err), 0);
	assert_int_equal(ktok_unk(t), -1);
	_cleanup_free_ int32_t *ids = NULL;
	size_t n;
	assert_int_equal(ktok_encode(t,
				     "ab\xC3\xA9"
				     "a",
				     5, 0, &ids, &n),
			 0);
	assert_int_equal(n, 2);
	assert_int_equal(ids[0], 0);
	assert_int_equal(ids[1], 0);
}

static void test_api_errors(void **state)
{
	_cleanup_(ktok_freep) ktok *t = load_ok(DATA "hf-spm.json");
	int32_t bad[] = { 0, (int32_t) ktok_n_vocab(t) };
	char *out = NULL;
	assert_int_equal(ktok_decode(t, bad, 2, 0, &out, NULL), -EINVAL);
	assert_null(out);
	int32_t *ids = NULL;
	size_t n = 7;
	assert_int_equal(ktok_encode(NULL, "a", 1, 0, &ids, &n), -EINVAL);
	assert_int_equal(n, 7);
	assert_int_equal(ktok_encode(t, "", 0, 0, &ids, &n), 0);
	assert_int_equal(n, 0);
	free(ids);
	assert_int_equal(ktok_find(t, "no such token at all", 20), -ENOENT);
	assert_null(ktok_token_text(t, -1, NULL));
	assert_int_equal(ktok_token_type(t, 1 << 30), -EINVAL);
	kiln_error err;
	ktok *x = NULL;
	assert_int_equal(ktok_load("/nonexistent/tokenizer.json", &x, &err), -ENOENT);
	assert_non_null(strstr(err.file, "/nonexistent"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_golden),
		cmocka_unit_test(test_stream_random),
		cmocka_unit_test(test_stream_split_char),
		cmocka_unit_test(test_injection),
		cmocka_unit_test(test_bad_files),
		cmocka_unit_test(test_truncations),
		cmocka_unit_test(test_chat),
		cmocka_unit_test(test_not_quadratic),
		cmocka_unit_test(test_api_errors),
		cmocka_unit_test(test_missing_byte_token),
	};
	return cmocka_run_group_tests_name("tokenizer", tests, NULL, NULL);
}
