/* chat.c — OpenAI chat messages -> a model's prompt string, without Jinja.
 *
 * Models ship their chat format as a Jinja template (GGUF
 * tokenizer.chat_template, HF tokenizer_config.json).  Running arbitrary
 * Jinja in the inference server is a large attack surface for little
 * gain: nearly every model uses one of a handful of formats.  So ktok
 * recognises the family by its marker tokens and renders it in C, each
 * renderer following the reference template of that family (quoted in
 * docs/tokenizer.md); an unknown template is refused with -EOPNOTSUPP so
 * the server can say so and fall back (to ChatML) knowingly. */
#include <ctype.h>

#include "kiln/strbuf.h"
#include "ktok_internal.h"

static const char *const chat_names[KTOK_CHAT_MAX] = {
	[KTOK_CHAT_CHATML] = "chatml", [KTOK_CHAT_LLAMA2] = "llama2",
	[KTOK_CHAT_LLAMA3] = "llama3", [KTOK_CHAT_MISTRAL] = "mistral",
	[KTOK_CHAT_GEMMA] = "gemma",   [KTOK_CHAT_PHI3] = "phi3",
	[KTOK_CHAT_ZEPHYR] = "zephyr",
};

const char *ktok_chat_name(ktok_chat c)
{
	return (unsigned) c < KTOK_CHAT_MAX ? chat_names[c] : NULL;
}

int ktok_chat_from_name(const char *name)
{
	for (int c = 0; name && c < KTOK_CHAT_MAX; c++)
		if (streq(name, chat_names[c]))
			return c;
	return -EINVAL;
}

int ktok_chat_detect(const char *tmpl)
{
	assert_return(tmpl, -EINVAL);
	if (strstr(tmpl, "<|start_header_id|>"))
		return KTOK_CHAT_LLAMA3;
	if (strstr(tmpl, "<|im_start|>"))
		return KTOK_CHAT_CHATML;
	if (strstr(tmpl, "<start_of_turn>"))
		return KTOK_CHAT_GEMMA;
	if (strstr(tmpl, "[INST]"))
		return strstr(tmpl, "<<SYS>>") ? KTOK_CHAT_LLAMA2 : KTOK_CHAT_MISTRAL;
	if (strstr(tmpl, "<|user|>"))
		return strstr(tmpl, "<|end|>") ? KTOK_CHAT_PHI3 : KTOK_CHAT_ZEPHYR;
	return -EOPNOTSUPP;
}

enum role { R_SYSTEM, R_USER, R_ASSISTANT };

static int role_of(const char *r)
{
	if (!r)
		return -EINVAL;
	if (streq(r, "system") || streq(r, "developer"))
		return R_SYSTEM;
	if (streq(r, "user"))
		return R_USER;
	if (streq(r, "assistant"))
		return R_ASSISTANT;
	return -EINVAL;
}

/* The rendered prompt and where in it the messages' contents lie
 * (lit[2k]..lit[2k+1]): the encoder matches control tokens only outside
 * those ranges, so content is always plain text. */
typedef struct chat_out {
	kiln_strbuf b;
	size_t *lit;
	size_t n_lit, cap;
	bool oom;
} chat_out;

static void out_free(chat_out *o)
{
	kiln_strbuf_free(&o->b);
	free(o->lit);
}

/* Template text: the only text that may hold control tokens. */
static void tpl(chat_out *o, const char *s)
{
	kiln_strbuf_append(&o->b, s);
}

/* A message's content (len bytes): recorded as literal. */
static void content_n(chat_out *o, const char *s, size_t len)
{
	size_t at = o->b.len;
	if (kiln_strbuf_append_n(&o->b, s, len) < 0 || !len)
		return;
	if (o->n_lit && o->lit[2 * o->n_lit - 1] == at) { /* adjoining: one range */
		o->lit[2 * o->n_lit - 1] = o->b.len;
		return;
	}
	if (o->n_lit == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 16;
		size_t *p = realloc(o->lit, 2 * cap * sizeof(size_t));
		if (!p) {
			o->oom = true;
			return;
		}
		o->lit = p;
		o->cap = cap;
	}
	o->lit[2 * o->n_lit] = at;
	o->lit[2 * o->n_lit + 1] = o->b.len;
	o->n_lit++;
}

static void content(chat_out *o, const char *s)
{
	content_n(o, s, strlen(s));
}

/* Jinja's |trim and Python's str.strip() on ASCII whitespace. */
static void content_trim(chat_out *o, const char *s)
{
	size_t len = strlen(s);
	while (len && isspace((unsigned char) *s))
		s++, len--;
	while (len && isspace((unsigned char) s[len - 1]))
		len--;
	content_n(o, s, len);
}

/* Llama 2 / Mistral: [INST] turns that alternate user/assistant; the
 * system message goes into the first user turn (Llama 2: inside <<SYS>>;
 * Mistral's template has no system role: prepended with a blank line, as
 * its later templates do). */
static int render_inst(bool llama2, const ktok_msg *m, size_t n, const char *bos, const char *eos,
		       chat_out *o)
{
	const char *sys = NULL;
	size_t i = 0;
	if (n && role_of(m[0].role) == R_SYSTEM)
		sys = m[0].content, i = 1;
	if (!llama2)
		tpl(o, bos);
	for (size_t k = 0; i < n; i++, k++) {
		int role = role_of(m[i].role);
		if (role != (k % 2 == 0 ? R_USER : R_ASSISTANT))
			return -EINVAL; /* roles must alternate user/assistant */
		if (role == R_USER) {
			if (llama2)
				tpl(o, bos);
			tpl(o, "[INST] ");
			if (k == 0 && sys) {
				if (llama2)
					tpl(o, "<<SYS>>\n");
				content(o, sys);
				tpl(o, llama2 ? "\n<</SYS>>\n\n" : "\n\n");
				content(o, m[i].content);
			} else if (llama2) {
				content_trim(o, m[i].content);
			} else {
				content(o, m[i].content);
			}
			tpl(o, " [/INST]");
		} else if (llama2) {
			tpl(o, " ");
			content_trim(o, m[i].content);
			tpl(o, " ");
			tpl(o, eos);
		} else {
			content(o, m[i].content);
			tpl(o, eos);
		}
	}
	return 0;
}

/* Roles are written into the template as the template's own text: only
 * the three it knows (role_of() refused anything else). */
static const char *role_text(const char *r)
{
	static const char *const names[] = {
		[R_SYSTEM] = "system", [R_USER] = "user", [R_ASSISTANT] = "assistant"
	};
	return names[role_of(r)];
}

/* The templates whose every turn is open, the role, close, the content
 * (trimmed or not) and end (NULL: eos and a newline), after bos when they
 * start with one; then the generation prompt gen, or eos when none is asked
 * for and the template ends with it. */
typedef struct turn_style {
	bool bos, trim, eos_last;
	const char *open, *close, *end, *gen;
} turn_style;

static const turn_style CHATML = {
	false, false, false, "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n"
};
static const turn_style LLAMA3 = { true,
				   true,
				   false,
				   "<|start_header_id|>",
				   "<|end_header_id|>\n\n",
				   "<|eot_id|>",
				   "<|start_header_id|>assistant<|end_header_id|>\n\n" };
static const turn_style PHI3 = { false, false, true, "<|", "|>\n", "<|end|>\n", "<|assistant|>\n" };
static const turn_style ZEPHYR = { false, false, false, "<|", "|>\n", NULL, "<|assistant|>\n" };

static const turn_style *const turns[KTOK_CHAT_MAX] = {
	[KTOK_CHAT_CHATML] = &CHATML,
	[KTOK_CHAT_LLAMA3] = &LLAMA3,
	[KTOK_CHAT_PHI3] = &PHI3,
	[KTOK_CHAT_ZEPHYR] = &ZEPHYR,
};

static void render_turns(const turn_style *t, const ktok_msg *msgs, size_t n,
			 bool add_generation_prompt, const char *bos, const char *eos, chat_out *o)
{
	if (t->bos)
		tpl(o, bos);
	for (size_t i = 0; i < n; i++) {
		tpl(o, t->open);
		tpl(o, role_text(msgs[i].role));
		tpl(o, t->close);
		(t->trim ? content_trim : content)(o, msgs[i].content);
		tpl(o, t->end ? t->end : eos);
		if (!t->end)
			tpl(o, "\n");
	}
	if (add_generation_prompt)
		tpl(o, t->gen);
	else if (t->eos_last)
		tpl(o, eos);
}

/* Gemma: no system role; Gemma 3's template puts it at the top of the
 * first user turn followed by a blank line. */
static int render_gemma(const ktok_msg *msgs, size_t n, bool add_generation_prompt, const char *bos,
			chat_out *o)
{
	size_t i = 0;
	const char *sys = NULL;
	if (n && role_of(msgs[0].role) == R_SYSTEM)
		sys = msgs[0].content, i = 1;
	tpl(o, bos);
	for (size_t k = 0; i < n; i++, k++) {
		int role = role_of(msgs[i].role);
		if (role == R_SYSTEM)
			return -EINVAL;
		tpl(o, role == R_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
		if (k == 0 && sys && role == R_USER) {
			content_trim(o, sys);
			tpl(o, "\n\n");
		}
		content_trim(o, msgs[i].content);
		tpl(o, "<end_of_turn>\n");
	}
	if (add_generation_prompt)
		tpl(o, "<start_of_turn>model\n");
	return 0;
}

static int render(ktok_chat c, const ktok_msg *msgs, size_t n, bool add_generation_prompt,
		  const char *bos, const char *eos, chat_out *o)
{
	assert_return((unsigned) c < KTOK_CHAT_MAX && (msgs || !n), -EINVAL);
	if (n > KTOK_MAX_CHAT_MESSAGES)
		return -E2BIG;
	for (size_t i = 0; i < n; i++)
		if (role_of(msgs[i].role) < 0 || !msgs[i].content)
			return -EINVAL;
	if (!bos)
		bos = c == KTOK_CHAT_LLAMA3  ? "<|begin_of_text|>"
		      : c == KTOK_CHAT_GEMMA ? "<bos>"
					     : "<s>";
	if (!eos)
		eos = "</s>";
	int r = 0;
	if (turns[c])
		render_turns(turns[c], msgs, n, add_generation_prompt, bos, eos, o);
	else if (c == KTOK_CHAT_GEMMA)
		r = render_gemma(msgs, n, add_generation_prompt, bos, o);
	else /* KTOK_CHAT_LLAMA2, KTOK_CHAT_MISTRAL */
		r = render_inst(c == KTOK_CHAT_LLAMA2, msgs, n, bos, eos, o);
	if (r < 0)
		return r;
	if (o->oom || kiln_strbuf_error(&o->b) < 0)
		return -ENOMEM;
	return 0;
}

int ktok_chat_render(ktok_chat c, const ktok_msg *msgs, size_t n, bool add_generation_prompt,
		     const char *bos, const char *eos, char **out)
{
	assert_return(out, -EINVAL);
	chat_out o = { 0 };
	kiln_strbuf_init(&o.b);
	int r = render(c, msgs, n, add_generation_prompt, bos, eos, &o);
	char *s = r < 0 ? NULL : kiln_strbuf_steal(&o.b);
	out_free(&o);
	if (r < 0)
		return r;
	if (!s && !(s = strdup("")))
		return -ENOMEM;
	*out = s;
	return 0;
}

int ktok_chat_encode(const ktok *t, ktok_chat c, const ktok_msg *msgs, size_t n,
		     bool add_generation_prompt, const char *bos, const char *eos, unsigned flags,
		     int32_t **ids, size_t *n_ids)
{
	assert_return(t && ids && n_ids, -EINVAL);
	chat_out o = { 0 };
	kiln_strbuf_init(&o.b);
	int r = render(c, msgs, n, add_generation_prompt, bos, eos, &o);
	if (r >= 0)
		r = ktok__encode_spans(t, o.b.s ? o.b.s : "", o.b.len, o.lit, o.n_lit, flags, ids,
				       n_ids);
	out_free(&o);
	return r;
}
