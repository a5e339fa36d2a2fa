/* load.c — the libktok loaders: GGUF tokenizer metadata (via libkmf),
 * Hugging Face tokenizer.json (via jansson) and llama2.c tokenizer.bin.
 *
 * Each loader turns its format into the one ktok structure: token texts in
 * "lookup form" (byte-level GPT-2 text decoded to raw bytes, SentencePiece's
 * U+2581 marker as ' '), types, scores, merges as id pairs, the special ids
 * and the flags the encoder needs.  Validation that every format shares
 * (lengths, UTF-8, duplicates, holes, merges naming unknown tokens) lives
 * in ktok.c's builder; what is particular to a format is checked here, and
 * every refusal says which file, what is wrong and what to do. */
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>

#include "kiln/strbuf.h"
#include "ktok_internal.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_file *, kmf_close);

/* ------------------------------------------------------------------------ */
/* GPT-2 byte-level map                                                      */

/* GPT-2 shows bytes as printable characters: bytes 0x21-0x7E, 0xA1-0xAC
 * and 0xAE-0xFF stand for themselves, the other 68 bytes take code points
 * 256, 257 ... in byte order.  Inverse: code point -> byte, or -1. */
static int bytelevel_byte(uint32_t cp)
{
	if (cp < 256) {
		bool self = (cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || cp >= 0xAE;
		return self ? (int) cp : -1;
	}
	/* The shifted bytes in order: 0x00-0x20, 0x7F-0xA0, 0xAD. */
	uint32_t k = cp - 256;
	if (k <= 32)
		return (int) k;
	if (k <= 66)
		return (int) (0x7F + k - 33);
	return k == 67 ? 0xAD : -1;
}

int ktok__bytelevel_decode(const char *s, size_t len, char *out, size_t *out_len)
{
	size_t o = 0;
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		i += ktok__utf8_next((const unsigned char *) s + i, len - i, &cp);
		int b = bytelevel_byte(cp);
		if (b < 0)
			return -EBADMSG;
		out[o++] = (char) b;
	}
	*out_len = o;
	return 0;
}

size_t ktok__unescape_spaces(char *s, size_t len)
{
	size_t o = 0;
	for (size_t i = 0; i < len; i++) {
		if (i + 2 < len && (unsigned char) s[i] == 0xE2 &&
		    (unsigned char) s[i + 1] == 0x96 && (unsigned char) s[i + 2] == 0x81) {
			s[o++] = ' ';
			i += 2;
		} else {
			s[o++] = s[i];
		}
	}
	return o;
}

/* A vocabulary entry as written in the file -> lookup form in buf. */
static int to_lookup(const ktok *t, const char *s, size_t len, char *buf, size_t *blen)
{
	if (len > KTOK_MAX_TOKEN_LEN)
		return -E2BIG;
	if (t->byte_level)
		return ktok__bytelevel_decode(s, len, buf, blen);
	memcpy(buf, s, len);
	*blen = ktok__unescape_spaces(buf, len);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Hugging Face tokenizer.json                                               */

static const char LLAMA3_REGEX[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
	"?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_REGEX[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
	"?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char GPT2_REGEX[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *jstr(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

static int hf_metaspace(ktok *t, json_t *p, const char *name, kiln_error *err)
{
	const char *rep = jstr(p, "replacement");
	if (rep && strcmp(rep, "\xE2\x96\x81") != 0)
		return ktok__err(err, name, -EOPNOTSUPP,
				 "Metaspace with replacement \"%s\" is not supported (only U+2581)",
				 rep);
	const char *scheme = jstr(p, "prepend_scheme");
	t->prefix_unless_space = true;
	json_t *aps = json_object_get(p, "add_prefix_space");
	if (scheme) {
		t->add_space_prefix = strcmp(scheme, "never") != 0;
		t->prefix_first_only = strcmp(scheme, "first") == 0;
	} else {
		t->add_space_prefix = !aps || json_is_true(aps);
	}
	json_t *split = json_object_get(p, "split");
	t->pre = (!split || json_is_true(split)) ? KTOK_PRE_METASPACE : KTOK_PRE_NONE;
	return 0;
}

/* The "type" of a pre_tokenizer or normalizer object (`what`): 1 and
 * *type, 0 when there is none (absent or null: nothing to do), -EBADMSG
 * when the object has no type. */
static int hf_type(json_t *o, const char *what, const char *name, const char **type,
		   kiln_error *err)
{
	if (!o || json_is_null(o))
		return 0;
	*type = jstr(o, "type");
	if (!*type)
		return ktok__err(err, name, -EBADMSG, "%s has no \"type\"", what);
	return 1;
}

/* fn on each member of a Sequence's array a, up to the first error. */
static int hf_each(ktok *t, json_t *a, const char *name, kiln_error *err,
		   int (*fn)(ktok *t, json_t *o, const char *name, kiln_error *err))
{
	size_t i;
	json_t *v;
	json_array_foreach(a, i, v)
	{
		int r = fn(t, v, name, err);
		if (r < 0)
			return r;
	}
	return 0;
}

static int hf_pre(ktok *t, json_t *p, const char *name, kiln_error *err)
{
	const char *type = NULL;
	int tr = hf_type(p, "pre_tokenizer", name, &type, err);
	if (tr <= 0)
		return tr;
	if (streq(type, "ByteLevel")) {
		t->byte_level = true;
		json_t *ur = json_object_get(p, "use_regex");
		if (!ur || json_is_true(ur))
			t->pre = t->pre == KTOK_PRE_NONE ? KTOK_PRE_GPT2 : t->pre;
		if (json_is_true(json_object_get(p, "add_prefix_space")))
			return ktok__err(err, name, -EOPNOTSUPP,
					 "ByteLevel add_prefix_space=true is not supported");
		return 0;
	}
	if (streq(type, "Metaspace"))
		return hf_metaspace(t, p, name, err);
	if (streq(type, "Split")) {
		const char *re = jstr(json_object_get(p, "pattern"), "Regex");
		if (re && streq(re, LLAMA3_REGEX))
			t->pre = KTOK_PRE_LLAMA3;
		else if (re && streq(re, GPT2_REGEX))
			t->pre = KTOK_PRE_GPT2;
		else if (re && streq(re, QWEN2_REGEX))
			t->pre = KTOK_PRE_QWEN2;
		else
			return ktok__err(
				err, name, -EOPNOTSUPP,
				"pre_tokenizer Split pattern \"%.200s\" is not one ktok knows "
				"(GPT-2's, Llama 3's and Qwen2's are supported)",
				re ? re : "(not a regex)");
		return 0;
	}
	if (streq(type, "Sequence"))
		return hf_each(t, json_object_get(p, "pretokenizers"), name, err, hf_pre);
	return ktok__err(
		err, name, -EOPNOTSUPP,
		"pre_tokenizer \"%s\" is not supported (ByteLevel, Split with the GPT-2 or "
		"Llama 3 regex, Metaspace and Sequence of those are)",
		type);
}

static int hf_normalizer(ktok *t, json_t *n, const char *name, kiln_error *err)
{
	const char *type = NULL;
	int tr = hf_type(n, "normalizer", name, &type, err);
	if (tr <= 0)
		return tr;
	if (streq(type, "Sequence"))
		return hf_each(t, json_object_get(n, "normalizers"), name, err, hf_normalizer);
	if (streq(type, "Prepend") && streq_ptr(jstr(n, "prepend"), "\xE2\x96\x81")) {
		t->add_space_prefix = true;
		return 0;
	}
	if (streq(type, "Replace") &&
	    streq_ptr(jstr(json_object_get(n, "pattern"), "String"), " ") &&
	    streq_ptr(jstr(n, "content"), "\xE2\x96\x81"))
		return 0; /* spaces as U+2581: ktok's lookup form already is */
	return ktok__err(err, name, -EOPNOTSUPP,
			 "normalizer \"%s\" is not supported (only the SentencePiece-like "
			 "Prepend(U+2581) + Replace(' ' -> U+2581) pair is)",
			 type);
}

/* post_processor TemplateProcessing: a SpecialToken before $A adds BOS,
 * one after it adds EOS. */
static void hf_post(ktok *t, json_t *p)
{
	const char *type = jstr(p, "type");
	if (type && streq(type, "Sequence")) {
		size_t i;
		json_t *v;
		json_array_foreach(json_object_get(p, "processors"), i, v)
		{
			hf_post(t, v);
		}
		return;
	}
	if (!type || !streq(type, "TemplateProcessing"))
		return;
	json_t *single = json_object_get(p, "single");
	bool seen_seq = false;
	size_t i;
	json_t *v;
	json_array_foreach(single, i, v)
	{
		if (json_object_get(v, "Sequence")) {
			seen_seq = true;
			continue;
		}
		const char *id = jstr(json_object_get(v, "SpecialToken"), "id");
		int32_t tid = id ? ktok__lookup(t, id, strlen(id)) : -1;
		if (tid < 0)
			continue;
		if (!seen_seq)
			t->bos = tid, t->add_bos = true;
		else
			t->eos = tid, t->add_eos = true;
	}
}

static int hf_merge_str(ktok *t, const char *s, size_t len, int32_t rank, kiln_error *err)
{
	char a[KTOK_MAX_TOKEN_LEN], b[KTOK_MAX_TOKEN_LEN];
	for (size_t i = 0; i < len; i++) {
		if (s[i] != ' ')
			continue;
		size_t la, lb;
		if (to_lookup(t, s, i, a, &la) < 0 ||
		    to_lookup(t, s + i + 1, len - i - 1, b, &lb) < 0)
			continue;
		int32_t ia = ktok__lookup(t, a, la), ib = ktok__lookup(t, b, lb);
		if (ia >= 0 && ib >= 0)
			return ktok__add_merge(t, ia, ib, rank, err);
	}
	return ktok__err(
		err, t->name, -EBADMSG,
		"merge %d \"%.80s\" does not name two tokens of the vocabulary; the merges "
		"do not belong to this vocabulary",
		rank, s);
}

static int hf_merge_pair(ktok *t, json_t *m, int32_t rank, kiln_error *err)
{
	const char *s[2];
	int32_t id[2];
	for (int k = 0; k < 2; k++) {
		s[k] = json_string_value(json_array_get(m, (size_t) k));
		if (!s[k] || json_array_size(m) != 2)
			return ktok__err(err, t->name, -EBADMSG,
					 "merge %d is neither \"a b\" nor [\"a\", \"b\"]", rank);
		char buf[KTOK_MAX_TOKEN_LEN];
		size_t l;
		if (to_lookup(t, s[k], strlen(s[k]), buf, &l) < 0 ||
		    (id[k] = ktok__lookup(t, buf, l)) < 0)
			return ktok__err(
				err, t->name, -EBADMSG,
				"merge %d names \"%.80s\", which is not in the vocabulary; "
				"the merges do not belong to this vocabulary",
				rank, s[k]);
	}
	return ktok__add_merge(t, id[0], id[1], rank, err);
}

int ktok_load_hf_json(const char *text, size_t len, const char *name, ktok **ret, kiln_error *err)
{
	assert_return(text && ret, -EINVAL);
	if (len > KTOK_MAX_JSON_BYTES)
		return ktok__err(err, name, -E2BIG,
				 "%zu bytes, over the limit of %u for tokenizer.json", len,
				 KTOK_MAX_JSON_BYTES);
	json_error_t je;
	_cleanup_(json_decrefp) json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return ktok__err(err, name, -EBADMSG, "line %d column %d: not valid JSON: %s",
				 je.line, je.column, je.text);
	json_t *model = json_object_get(root, "model");
	const char *mtype = jstr(model, "type");
	json_t *vocab = json_object_get(model, "vocab");
	json_t *merges = json_object_get(model, "merges");
	if (!json_is_object(model))
		return ktok__err(err, name, -EBADMSG,
				 "no \"model\" object: is this a tokenizer.json?");
	if (mtype && !streq(mtype, "BPE"))
		return ktok__err(err, name, -EOPNOTSUPP,
				 "model type \"%s\" is not supported; ktok reads BPE models only",
				 mtype);
	if (!json_is_object(vocab) || !json_is_array(merges))
		return ktok__err(
			err, name, -EBADMSG,
			"model has no \"vocab\" object or \"merges\" array; a BPE model needs "
			"both");
	const char *cwp = jstr(model, "continuing_subword_prefix");
	const char *eow = jstr(model, "end_of_word_suffix");
	if ((cwp && *cwp) || (eow && *eow))
		return ktok__err(
			err, name, -EOPNOTSUPP,
			"BPE with continuing_subword_prefix/end_of_word_suffix is not supported");
	json_t *added = json_object_get(root, "added_tokens");
	if (json_object_size(vocab) > KTOK_MAX_VOCAB || json_array_size(added) > KTOK_MAX_SPECIAL)
		return ktok__err(err, name, -E2BIG, "vocabulary over the limit of %d tokens",
				 KTOK_MAX_VOCAB);
	if (json_array_size(merges) > KTOK_MAX_MERGES)
		return ktok__err(err, name, -E2BIG, "%zu merges, over the limit of %d",
				 json_array_size(merges), KTOK_MAX_MERGES);
	/* Size: the largest id + 1. */
	int64_t max_id = -1;
	const char *key;
	json_t *v;
	json_object_foreach(vocab, key, v)
	{
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= KTOK_MAX_VOCAB)
			return ktok__err(
				err, name, -EBADMSG,
				"vocab entry \"%.80s\" has id that is not an integer in 0..%d", key,
				KTOK_MAX_VOCAB - 1);
		max_id = MAX(max_id, json_integer_value(v));
	}
	size_t i;
	json_array_foreach(added, i, v)
	{
		json_t *id = json_object_get(v, "id");
		if (!json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) >= KTOK_MAX_VOCAB || !jstr(v, "content"))
			return ktok__err(err, name, -EBADMSG,
					 "added_tokens[%zu] needs an integer \"id\" in 0..%d and a "
					 "\"content\" string",
					 i, KTOK_MAX_VOCAB - 1);
		max_id = MAX(max_id, json_integer_value(id));
	}
	if (max_id < 0)
		return ktok__err(err, name, -EBADMSG, "the vocabulary is empty");
	_cleanup_(ktok_freep) ktok *t = NULL;
	int r = ktok__new(name, (uint32_t) max_id + 1, &t);
	if (r < 0)
		return ktok__err(err, name, r, "cannot allocate the vocabulary");
	t->model = KTOK_MODEL_BPE;
	if ((r = hf_normalizer(t, json_object_get(root, "normalizer"), name, err)) < 0 ||
	    (r = hf_pre(t, json_object_get(root, "pre_tokenizer"), name, err)) < 0)
		return r;
	const char *dtype = jstr(json_object_get(root, "decoder"), "type");
	if (dtype && streq(dtype, "ByteLevel"))
		t->byte_level = true;
	t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
	t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
	t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
	if (t->byte_level && (t->add_space_prefix || t->byte_fallback))
		return ktok__err(
			err, name, -EOPNOTSUPP,
			"a byte-level tokenizer with a space-marker normalizer or byte_fallback "
			"is not supported");
	/* Added tokens first: their content is raw text (not byte-level). */
	json_array_foreach(added, i, v)
	{
		uint32_t id = (uint32_t) json_integer_value(json_object_get(v, "id"));
		const char *c = jstr(v, "content");
		bool special = json_is_true(json_object_get(v, "special"));
		if (t->tok[id].text)
			return ktok__err(err, name, -EBADMSG, "added token id %u appears twice",
					 id);
		r = ktok__set(t, id, c, strlen(c), 0, special ? KTOK_CONTROL : KTOK_USER, false,
			      err);
		if (r < 0)
			return r;
		t->tok[id].lstrip = json_is_true(json_object_get(v, "lstrip"));
		t->tok[id].rstrip = json_is_true(json_object_get(v, "rstrip"));
	}
	json_object_foreach(vocab, key, v)
	{
		uint32_t id = (uint32_t) json_integer_value(v);
		if (t->tok[id].text)
			continue; /* an added token with the same id */
		char buf[KTOK_MAX_TOKEN_LEN];
		size_t blen;
		size_t klen = strlen(key);
		r = to_lookup(t, key, klen, buf, &blen);
		if (r == -E2BIG)
			return ktok__err(err, name, -E2BIG,
					 "vocab entry %u is %zu bytes, over the limit of %d", id,
					 klen, KTOK_MAX_TOKEN_LEN);
		if (r < 0)
			return ktok__err(err, name, -EBADMSG,
					 "vocab entry %u \"%.80s\" is not GPT-2 byte-level text",
					 id, key);
		int type = KTOK_NORMAL;
		if (t->byte_fallback && !t->byte_level && blen == 6 && memcmp(buf, "<0x", 3) == 0 &&
		    buf[5] == '>')
			type = KTOK_BYTE;
		/* Byte-level tokens are raw bytes: pieces of characters. */
		if ((r = ktok__set(t, id, buf, blen, 0, type, t->byte_level, err)) < 0)
			return r;
	}
	if ((r = ktok__finish_vocab(t, err)) < 0)
		return r;
	const char *unk = jstr(model, "unk_token");
	if (unk) {
		t->unk = ktok__lookup(t, unk, strlen(unk));
		if (t->unk < 0)
			return ktok__err(err, name, -EBADMSG,
					 "unk_token \"%.80s\" is not in the vocabulary", unk);
		if (t->tok[t->unk].type == KTOK_NORMAL)
			t->tok[t->unk].type = KTOK_UNKNOWN;
	}
	if ((r = ktok__reserve_merges(t, (uint32_t) json_array_size(merges))) < 0)
		return ktok__err(err, name, r, "cannot allocate the merges");
	json_array_foreach(merges, i, v)
	{
		if (json_is_string(v))
			r = hf_merge_str(t, json_string_value(v), json_string_length(v),
					 (int32_t) i, err);
		else
			r = hf_merge_pair(t, v, (int32_t) i, err);
		if (r < 0)
			return r;
	}
	hf_post(t, json_object_get(root, "post_processor"));
	static const char *const eos_names[] = { "</s>",       "<|endoftext|>",
						 "<|eot_id|>", "<|end_of_text|>",
						 "<eos>",      "<|im_end|>" };
	for (size_t k = 0; k < ARRAY_SIZE(eos_names) && t->eos < 0; k++)
		t->eos = ktok__lookup(t, eos_names[k], strlen(eos_names[k]));
	if (t->bos < 0) {
		static const char *const bos_names[] = { "<s>", "<|begin_of_text|>", "<bos>" };
		for (size_t k = 0; k < ARRAY_SIZE(bos_names) && t->bos < 0; k++)
			t->bos = ktok__lookup(t, bos_names[k], strlen(bos_names[k]));
	}
	*ret = TAKE_PTR(t);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* GGUF                                                                      */

static const kmf_meta *gguf_array(const kmf_file *f, const char *key, kmf_vtype et)
{
	const kmf_meta *m = kmf_meta_find(f, key);
	if (!m || m->type != KMF_V_ARRAY || m->arr.etype != et)
		return NULL;
	return m;
}

static int gguf_bool(const kmf_file *f, const char *key, bool def)
{
	const kmf_meta *m = kmf_meta_find(f, key);
	return m && m->type == KMF_V_BOOL ? m->b : def;
}

static int gguf_id(const kmf_file *f, const char *key, int32_t *id)
{
	int64_t v;
	int r = kmf_meta_get_int(f, key, &v);
	if (r == -ENOENT)
		return 0;
	if (r < 0 || v < 0 || v >= KTOK_MAX_VOCAB)
		return -EBADMSG;
	*id = (int32_t) v;
	return 0;
}

int ktok_load_gguf(const kmf_file *f, const char *name, ktok **ret, kiln_error *err)
{
	assert_return(f && ret, -EINVAL);
	const char *model = NULL;
	if (kmf_meta_get_str(f, "tokenizer.ggml.model", &model) < 0)
		return ktok__err(err, name, -EBADMSG,
				 "no tokenizer.ggml.model string: the file carries no tokenizer; "
				 "pass a tokenizer.json or tokenizer.bin instead");
	bool spm = streq(model, "llama"), gpt2 = streq(model, "gpt2");
	if (!spm && !gpt2)
		return ktok__err(
			err, name, -EOPNOTSUPP,
			"tokenizer.ggml.model \"%s\" is not supported (\"llama\" and \"gpt2\" "
			"are)",
			model);
	const kmf_meta *toks = gguf_array(f, "tokenizer.ggml.tokens", KMF_V_STRING);
	if (!toks)
		return ktok__err(err, name, -EBADMSG,
				 "tokenizer.ggml.tokens is missing or not an array "
				 "of strings");
	if (toks->arr.n == 0 || toks->arr.n > KTOK_MAX_VOCAB)
		return ktok__err(err, name, toks->arr.n ? -E2BIG : -EBADMSG,
				 "tokenizer.ggml.tokens holds %llu tokens; 1..%d are accepted",
				 (unsigned long long) toks->arr.n, KTOK_MAX_VOCAB);
	uint32_t n = (uint32_t) toks->arr.n;
	const kmf_meta *scores = gguf_array(f, "tokenizer.ggml.scores", KMF_V_F32);
	const kmf_meta *types = gguf_array(f, "tokenizer.ggml.token_type", KMF_V_I32);
	if ((scores && scores->arr.n != n) || (types && types->arr.n != n))
		return ktok__err(
			err, name, -EBADMSG,
			"tokenizer.ggml.scores/token_type do not have one entry per token (%u)", n);
	if (spm && !scores)
		return ktok__err(
			err, name, -EBADMSG,
			"a \"llama\" tokenizer needs tokenizer.ggml.scores (f32 per token)");
	_cleanup_(ktok_freep) ktok *t = NULL;
	int r = ktok__new(name, n, &t);
	if (r < 0)
		return ktok__err(err, name, r, "cannot allocate the vocabulary");
	t->model = spm ? KTOK_MODEL_SPM : KTOK_MODEL_BPE;
	t->byte_level = gpt2;
	t->byte_fallback = spm;
	t->add_space_prefix = spm && gguf_bool(f, "tokenizer.ggml.add_space_prefix", true);
	t->add_bos = gguf_bool(f, "tokenizer.ggml.add_bos_token", spm);
	t->add_eos = gguf_bool(f, "tokenizer.ggml.add_eos_token", false);
	if (gpt2) {
		const char *pre = "default";
		kmf_meta_get_str(f, "tokenizer.ggml.pre", &pre);
		if (streq(pre, "default") || streq(pre, "gpt2") || streq(pre, "gpt-2"))
			t->pre = KTOK_PRE_GPT2;
		else if (streq(pre, "llama-bpe") || streq(pre, "llama3") || streq(pre, "llama-v3"))
			t->pre = KTOK_PRE_LLAMA3, t->ignore_merges = true;
		else if (streq(pre, "qwen2"))
			t->pre = KTOK_PRE_QWEN2;
		else
			return ktok__err(
				err, name, -EOPNOTSUPP,
				"tokenizer.ggml.pre \"%s\" is not supported: ktok splits text "
				"as \"default\"/\"gpt2\", \"llama-bpe\" and \"qwen2\" only (see "
				"docs/tokenizer.md)",
				pre);
	}
	const kmf_str *ts = toks->arr.items;
	for (uint32_t id = 0; id < n; id++) {
		int type = types ? ((const int32_t *) types->arr.items)[id] : KTOK_NORMAL;
		float score = scores ? ((const float *) scores->arr.items)[id] : 0;
		char buf[KTOK_MAX_TOKEN_LEN];
		size_t blen = ts[id].len;
		if (blen > KTOK_MAX_TOKEN_LEN)
			return ktok__err(
				err, name, -E2BIG,
				"token %u is %zu bytes, over the limit of %d (KTOK_MAX_TOKEN_LEN)",
				id, blen, KTOK_MAX_TOKEN_LEN);
		if (type < KTOK_NORMAL || type > KTOK_BYTE)
			return ktok__err(
				err, name, -EBADMSG,
				"token %u has tokenizer.ggml.token_type %d; known types are 1 "
				"(normal) to 6 (byte)",
				id, type);
		/* Control and user-defined tokens of byte-level vocabularies
		 * are stored as plain text (llama.cpp's convert does so). */
		bool plain = gpt2 && (type == KTOK_CONTROL || type == KTOK_USER);
		if (plain || type == KTOK_BYTE) {
			memcpy(buf, ts[id].s, blen);
		} else if ((r = to_lookup(t, ts[id].s, ts[id].len, buf, &blen)) < 0) {
			if (gpt2) /* llama.cpp falls back to the raw text too */
				memcpy(buf, ts[id].s, blen = ts[id].len);
			else
				return ktok__err(err, name, r, "token %u cannot be read", id);
		}
		if (!gpt2 && !ktok__utf8_valid(ts[id].s, ts[id].len))
			return ktok__err(err, name, -EBADMSG,
					 "token %u is not valid UTF-8; the vocabulary is corrupt",
					 id);
		if ((r = ktok__set(t, id, buf, blen, score, type, gpt2, err)) < 0)
			return r;
	}
	if ((r = ktok__finish_vocab(t, err)) < 0)
		return r;
	if (gguf_id(f, "tokenizer.ggml.bos_token_id", &t->bos) < 0 ||
	    gguf_id(f, "tokenizer.ggml.eos_token_id", &t->eos) < 0 ||
	    gguf_id(f, "tokenizer.ggml.padding_token_id", &t->pad) < 0 ||
	    gguf_id(f, "tokenizer.ggml.unknown_token_id", &t->unk) < 0)
		return ktok__err(err, name, -EBADMSG,
				 "a tokenizer.ggml.*_token_id is not an unsigned integer below %d",
				 KTOK_MAX_VOCAB);
	if ((r = ktok__check_ids(t, err)) < 0)
		return r;
	for (uint32_t id = 0; t->unk < 0 && id < n; id++)
		if (t->tok[id].type == KTOK_UNKNOWN)
			t->unk = (int32_t) id;
	if (gpt2) {
		const kmf_meta *mg = gguf_array(f, "tokenizer.ggml.merges", KMF_V_STRING);
		if (!mg)
			return ktok__err(
				err, name, -EBADMSG,
				"a \"gpt2\" tokenizer needs tokenizer.ggml.merges (strings)");
		if (mg->arr.n > KTOK_MAX_MERGES)
			return ktok__err(err, name, -E2BIG, "%llu merges, over the limit of %d",
					 (unsigned long long) mg->arr.n, KTOK_MAX_MERGES);
		if ((r = ktok__reserve_merges(t, (uint32_t) mg->arr.n)) < 0)
			return ktok__err(err, name, r, "cannot allocate the merges");
		const kmf_str *ms = mg->arr.items;
		for (uint64_t i = 0; i < mg->arr.n; i++)
			if ((r = hf_merge_str(t, ms[i].s, ms[i].len, (int32_t) i, err)) < 0)
				return r;
	}
	const char *tmpl = NULL;
	if (kmf_meta_get_str(f, "tokenizer.chat_template", &tmpl) >= 0 &&
	    !(t->chat_template = strdup(tmpl)))
		return -ENOMEM;
	*ret = TAKE_PTR(t);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* llama2.c tokenizer.bin                                                    */

int ktok_load_llama2c(const void *buf, size_t len, uint32_t vocab_size, const char *name,
		      ktok **ret, kiln_error *err)
{
	assert_return(buf && ret, -EINVAL);
	const unsigned char *p = buf;
	int32_t maxlen;
	if (len < 4)
		return ktok__err(err, name, -EBADMSG, "too short for a llama2.c tokenizer.bin");
	memcpy(&maxlen, p, 4);
	if (maxlen <= 0 || maxlen > KTOK_MAX_TOKEN_LEN)
		return ktok__err(
			err, name, maxlen > 0 ? -E2BIG : -EBADMSG,
			"max_token_length %d is outside 1..%d: not a llama2.c tokenizer.bin",
			maxlen, KTOK_MAX_TOKEN_LEN);
	/* Count the tokens first (the file does not say how many). */
	uint32_t n = 0;
	size_t off = 4;
	while (off < len && (vocab_size == 0 || n < vocab_size)) {
		int32_t l;
		if (len - off < 8)
			return ktok__err(err, name, -EBADMSG, "byte %zu: token %u is truncated",
					 off, n);
		memcpy(&l, p + off + 4, 4);
		if (l < 0 || l > maxlen)
			return ktok__err(
				err, name, l < 0 ? -EBADMSG : -E2BIG,
				"byte %zu: token %u has length %d, outside 0..max_token_length "
				"(%d)",
				off + 4, n, l, maxlen);
		if (len - off - 8 < (size_t) l)
			return ktok__err(err, name, -EBADMSG,
					 "byte %zu: token %u needs %d bytes, the file ends first",
					 off + 8, n, l);
		off += 8 + (size_t) l;
		if (++n > KTOK_MAX_VOCAB)
			return ktok__err(err, name, -E2BIG, "more than %d tokens", KTOK_MAX_VOCAB);
	}
	if (vocab_size && n < vocab_size)
		return ktok__err(err, name, -EBADMSG, "holds %u tokens, the model needs %u", n,
				 vocab_size);
	if (n < 3)
		return ktok__err(err, name, -EBADMSG,
				 "holds %u tokens; <unk>, <s>, </s> come first", n);
	_cleanup_(ktok_freep) ktok *t = NULL;
	int r = ktok__new(name, n, &t);
	if (r < 0)
		return ktok__err(err, name, r, "cannot allocate the vocabulary");
	t->model = KTOK_MODEL_SPM;
	t->byte_fallback = t->add_space_prefix = t->add_bos = true;
	/* llama2.c's export keeps SentencePiece's ids: 0 <unk>, 1 <s>, 2 </s>. */
	t->unk = 0, t->bos = 1, t->eos = 2;
	off = 4;
	for (uint32_t id = 0; id < n; id++) {
		float score;
		int32_t l;
		memcpy(&score, p + off, 4);
		memcpy(&l, p + off + 4, 4);
		const char *s = (const char *) p + off + 8;
		off += 8 + (size_t) l;
		int type = id == 0 ? KTOK_UNKNOWN : id <= 2 ? KTOK_CONTROL : KTOK_NORMAL;
		if (type == KTOK_NORMAL && l == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>')
			type = KTOK_BYTE;
		if ((r = ktok__set(t, id, s, (size_t) l, score, type, false, err)) < 0)
			return r;
	}
	if ((r = ktok__finish_vocab(t, err)) < 0)
		return r;
	*ret = TAKE_PTR(t);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* By content                                                                */

static int load_gguf_path(const char *path, ktok **ret, kiln_error *err)
{
	/* Models are large: libkmf maps them, nothing is read twice. */
	_cleanup_(kmf_closep) kmf_file *f = NULL;
	kiln_error ke;
	int r = kmf_open(path, &f, &ke);
	/* the byte, not the tensor: a tokenizer reads only the metadata */
	const char *what = ke.msg;
	if (r < 0 && ke.where[0])
		what += strlen("tensor '': ") + strlen(ke.where);
	if (r < 0)
		return ktok__err(err, path, r, "byte %lld: %s (GGUF metadata)",
				 (long long) ke.offset, what);
	return ktok_load_gguf(f, path, ret, err);
}

int ktok_load(const char *path, ktok **ret, kiln_error *err)
{
	assert_return(path && ret, -EINVAL);
	char magic[4] = { 0 };
	{
		_cleanup_fclose_ FILE *fp = fopen(path, "re");
		if (!fp)
			return ktok__err(err, path, -errno, "cannot open: %m");
		if (fread(magic, 1, 4, fp) == 4 && memcmp(magic, "GGUF", 4) == 0)
			return load_gguf_path(path, ret, err);
	}
	_cleanup_free_ char *buf = NULL;
	size_t len = 0;
	int r = kiln_read_file(path, KTOK_MAX_JSON_BYTES, &buf, &len);
	if (r == -EFBIG)
		return ktok__err(err, path, -E2BIG,
				 "over %u bytes and not GGUF: too big for a tokenizer.json or "
				 "tokenizer.bin",
				 KTOK_MAX_JSON_BYTES);
	if (r < 0)
		return ktok__err(err, path, r, "cannot read: %s", strerror(-r));
	size_t i = 0;
	while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t'))
		i++;
	if (i < len && buf[i] == '{')
		return ktok_load_hf_json(buf, len, path, ret, err);
	return ktok_load_llama2c(buf, len, 0, path, ret, err);
}
