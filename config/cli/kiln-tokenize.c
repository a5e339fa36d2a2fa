/* kiln-tokenize.c — `kiln tokenize FILE [--text S | --ids 1,2,3] [--json]`.
 *
 * For humans checking what a model sees: loads a tokenizer with libktok
 * (GGUF, tokenizer.json or llama2.c tokenizer.bin, by content) and
 * encodes text (--text, or standard input with --stdin) to ids, decodes
 * ids back to text (--ids), or with neither describes the tokenizer.
 * --json prints one JSON object for scripts.  A refused file is reported
 * as FILE: what is wrong, exit 1; usage errors exit 2.  Kept apart from
 * kiln.c, which only dispatches "tokenize" here. */
#include <jansson.h>
#include <stdio.h>

#include "kiln-verbs.h"
#include "kiln/log.h"
#include "kiln/macro.h"
#include "ktok.h"

/* Most ids accepted by --ids and bytes read by --stdin (a human's input;
 * 64 MiB is far above any prompt). */
#define CLI_MAX_IDS   (1 << 20)
#define CLI_MAX_STDIN (64u << 20)

/* A token's text for people: escapes so control bytes and spaces show. */
static void put_escaped(FILE *out, const char *s, size_t len)
{
	fputc('"', out);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char) s[i];
		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c == '\t')
			fputs("\\t", out);
		else if (c < 0x20 || c == 0x7f)
			fprintf(out, "\\x%02x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

static json_t *json_text(const char *s, size_t len)
{
	/* Byte-level tokens may be pieces of a character: invalid UTF-8
	 * cannot go into JSON, so those are shown as <0xNN> bytes. */
	json_t *j = json_stringn(s, len);
	if (j)
		return j;
	char buf[4 * KTOK_MAX_TOKEN_LEN + 1];
	size_t o = 0;
	for (size_t i = 0; i < len && o + 7 < sizeof(buf); i++)
		o += (size_t) snprintf(buf + o, sizeof(buf) - o, "<0x%02X>", (unsigned char) s[i]);
	return json_stringn(buf, o);
}

static int describe(const ktok *t, const char *path, bool json)
{
	const char *tmpl = ktok_chat_template(t);
	int chat = tmpl ? ktok_chat_detect(tmpl) : -ENOENT;
	const char *chat_name =
		chat >= 0 ? ktok_chat_name((ktok_chat) chat)
		: tmpl	  ? "unknown (not rendered; a server would fall back to chatml)"
			  : "none in file";
	const char *model = ktok_model_kind(t) == KTOK_MODEL_SPM ? "sentencepiece-bpe" : "bpe";
	if (json) {
		json_t *o =
			json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:i, s:i, s:b, s:b, s:s}", "file",
				  path, "model", model, "vocab_size", (int) ktok_n_vocab(t), "pre",
				  ktok_pre_name(ktok_pre_kind(t)), "bos", ktok_bos(t), "eos",
				  ktok_eos(t), "pad", ktok_pad(t), "unk", ktok_unk(t), "add_bos",
				  ktok_adds_bos(t), "add_eos", ktok_adds_eos(t), "chat_template",
				  chat >= 0 ? chat_name
				  : tmpl    ? "unknown"
					    : "none");
		return kiln_cli_print_json(o, JSON_INDENT(2));
	}
	printf("file:          %s\n", path);
	printf("model:         %s\n", model);
	printf("vocab size:    %u\n", ktok_n_vocab(t));
	printf("pre-tokenizer: %s\n", ktok_pre_name(ktok_pre_kind(t)));
	printf("bos/eos:       %d / %d (added when encoding: %s / %s)\n", ktok_bos(t), ktok_eos(t),
	       ktok_adds_bos(t) ? "yes" : "no", ktok_adds_eos(t) ? "yes" : "no");
	printf("pad/unk:       %d / %d\n", ktok_pad(t), ktok_unk(t));
	printf("chat template: %s\n", chat_name);
	return 0;
}

static int encode(const ktok *t, const char *text, size_t len, unsigned flags, bool json)
{
	_cleanup_free_ int32_t *ids = NULL;
	size_t n;
	int r = ktok_encode(t, text, len, flags, &ids, &n);
	if (r < 0)
		return log_error_errno(r, "encoding failed: %m");
	if (json) {
		json_t *o = json_object(), *ja = json_array(), *jt = json_array();
		for (size_t i = 0; i < n; i++) {
			size_t l;
			const char *s = ktok_token_text(t, ids[i], &l);
			json_array_append_new(ja, json_integer(ids[i]));
			json_array_append_new(jt, json_text(s, l));
		}
		json_object_set_new(o, "ids", ja);
		json_object_set_new(o, "tokens", jt);
		json_object_set_new(o, "count", json_integer((json_int_t) n));
		return kiln_cli_print_json(o, JSON_COMPACT);
	}
	for (size_t i = 0; i < n; i++) {
		size_t l;
		const char *s = ktok_token_text(t, ids[i], &l);
		printf("%8d  ", ids[i]);
		put_escaped(stdout, s, l);
		putchar('\n');
	}
	printf("%zu tokens\n", n);
	return 0;
}

static int decode(const ktok *t, const char *list, unsigned flags, bool json)
{
	_cleanup_free_ int32_t *ids = calloc(CLI_MAX_IDS, sizeof(*ids));
	if (!ids)
		return log_error_errno(-ENOMEM, "out of memory: %m");
	size_t n = 0;
	for (const char *p = list; *p;) {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (end == p || errno || v < 0 || v >= (long) ktok_n_vocab(t) || n == CLI_MAX_IDS) {
			log_error("--ids: \"%s\" is not a comma-separated list of ids in 0..%u",
				  list, ktok_n_vocab(t) - 1);
			return -EINVAL;
		}
		ids[n++] = (int32_t) v;
		p = end;
		while (*p == ',' || *p == ' ')
			p++;
	}
	_cleanup_free_ char *text = NULL;
	size_t len;
	int r = ktok_decode(t, ids, n, flags, &text, &len);
	if (r < 0)
		return log_error_errno(r, "decoding failed: %m");
	if (json) {
		r = kiln_cli_print_json(json_pack("{s:s%}", "text", text, len), JSON_COMPACT);
		if (r < 0)
			return log_error_errno(r, "out of memory: %m");
	} else {
		fwrite(text, 1, len, stdout);
		putchar('\n');
	}
	return 0;
}

/* --stdin: encodes all of standard input (at most CLI_MAX_STDIN bytes). */
static int encode_stdin(const ktok *t, unsigned eflags, bool json)
{
	_cleanup_free_ char *buf = malloc(CLI_MAX_STDIN);
	if (!buf)
		return log_error("out of memory"), -ENOMEM;
	size_t len = fread(buf, 1, CLI_MAX_STDIN, stdin);
	if (!ferror(stdin) && feof(stdin))
		return encode(t, buf, len, eflags, json);
	log_error("standard input: unreadable or over %u bytes", CLI_MAX_STDIN);
	/* cppcheck-suppress memleak ; buf is _cleanup_free_, which cppcheck does not model */
	return -EIO;
}

enum { ARG_NO_SPECIAL = KILN_OPT_FIRST, ARG_PARSE_SPECIAL, ARG_SKIP_SPECIAL, ARG_STDIN };

static const char *arg_text, *arg_ids;
static bool arg_stdin, arg_json, arg_no_special, arg_parse_special, arg_skip_special;

static const kiln_option options[] = {
	{ "text", 't', "S", "encode S to ids", NULL, .str = &arg_text },
	{ "stdin", ARG_STDIN, NULL, "encode standard input", NULL, .flag = &arg_stdin },
	{ "ids", 'i', "1,2,3", "decode comma-separated ids to text", NULL, .str = &arg_ids },
	KILN_OPTION_JSON_INTO(&arg_json),
	{ "no-special", ARG_NO_SPECIAL, NULL, "do not add BOS/EOS when encoding", NULL,
	  .flag = &arg_no_special },
	{ "parse-special", ARG_PARSE_SPECIAL, NULL,
	  "match special tokens written in the text (<|im_end|>)", NULL,
	  .flag = &arg_parse_special },
	{ "skip-special", ARG_SKIP_SPECIAL, NULL, "leave special tokens out when decoding", NULL,
	  .flag = &arg_skip_special },
	KILN_OPTIONS_COMMON,
	{},
};

const kiln_prog kiln_tokenize_prog = {
	.name = "kiln tokenize",
	.summary = "text <-> token ids with a model's tokenizer",
	.usage = "kiln tokenize FILE                    describe the tokenizer\n"
		 "kiln tokenize FILE --text S           encode S to ids\n"
		 "kiln tokenize FILE --stdin            encode standard input\n"
		 "kiln tokenize FILE --ids 1,2,3        decode ids to text",
	.options = options,
	.epilog = "FILE: a GGUF model (tokenizer.ggml.* metadata), a Hugging Face tokenizer.json\n"
		  "or a llama2.c tokenizer.bin; the format is recognised by content.\n"
		  "Exit status: 0 success, 1 the file is refused or unreadable, 2 usage error.\n"
		  "See docs/tokenizer.md.\n",
	.args_complete = "file",
};

int kiln_tokenize_main(int argc, char **argv)
{
	const unsigned eflags = (arg_no_special ? 0 : KTOK_ENC_ADD_SPECIAL) |
				(arg_parse_special ? KTOK_ENC_PARSE_SPECIAL : 0);
	const unsigned dflags = arg_skip_special ? KTOK_DEC_SKIP_SPECIAL : 0;
	if (optind + 1 != argc || (!!arg_text + !!arg_ids + arg_stdin) > 1)
		return kiln_usage_exit(
			&kiln_tokenize_prog,
			"Usage: kiln tokenize FILE [--text S | --stdin | --ids 1,2,3] [--json].");
	const char *path = argv[optind];
	_cleanup_(ktok_freep) ktok *t = NULL;
	kiln_error err;
	int r = ktok_load(path, &t, &err);
	if (r < 0) {
		char line[800];
		log_error("%s", kiln_error_format(&err, line, sizeof(line)));
		return KILN_EXIT_FAILURE;
	}
	if (arg_ids)
		return decode(t, arg_ids, dflags, arg_json) < 0 ? KILN_EXIT_USAGE : KILN_EXIT_OK;
	if (arg_text)
		return encode(t, arg_text, strlen(arg_text), eflags, arg_json) < 0
			       ? KILN_EXIT_FAILURE
			       : KILN_EXIT_OK;
	if (arg_stdin)
		return encode_stdin(t, eflags, arg_json) < 0 ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
	return describe(t, path, arg_json) < 0 ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
}
