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

/* Jinja's |trim and Python's str.strip() on ASCII whitespace. */
static int put_trim(kiln_strbuf *b, const char *s)
{
	size_t len = strlen(s);
	while (len && isspace((unsigned char) *s))
		s++, len--;
	while (len && isspace((unsigned char) s[len - 1]))
		len--;
	return kiln_strbuf_append_n(b, s, len);
}

/* Llama 2 / Mistral: [INST] turns that alternate user/assistant; the
 * system message goes into the first user turn (Llama 2: inside <<SYS>>;
 * Mistral's template has no system role: prepended with a blank line, as
 * its later templates do). */
static int render_inst(bool llama2, const ktok_msg *m, size_t n, const char *bos, const char *eos,
		       kiln_strbuf *b)
{
	const char *sys = NULL;
	size_t i = 0;
	if (n && role_of(m[0].role) == R_SYSTEM)
		sys = m[0].content, i = 1;
	if (!llama2)
		kiln_strbuf_append(b, bos);
	for (size_t k = 0; i < n; i++, k++) {
		int role = role_of(m[i].role);
		if (role != (k % 2 == 0 ? R_USER : R_ASSISTANT))
			return -EINVAL; /* roles must alternate user/assistant */
		if (role == R_USER) {
			if (llama2)
				kiln_strbuf_printf(b, "%s[INST] ", bos);
			else
				kiln_strbuf_append(b, "[INST] ");
			if (k == 0 && sys) {
				if (llama2)
					kiln_strbuf_printf(b, "<<SYS>>\n%s\n<</SYS>>\n\n%s", sys,
							   m[i].content);
				else
					kiln_strbuf_printf(b, "%s\n\n%s", sys, m[i].content);
			} else if (llama2) {
				put_trim(b, m[i].content);
			} else {
				kiln_strbuf_append(b, m[i].content);
			}
			kiln_strbuf_append(b, " [/INST]");
		} else if (llama2) {
			kiln_strbuf_append(b, " ");
			put_trim(b, m[i].content);
			kiln_strbuf_printf(b, " %s", eos);
		} else {
			kiln_strbuf_printf(b, "%s%s", m[i].content, eos);
		}
	}
	return 0;
}

int ktok_chat_render(ktok_chat c, const ktok_msg *msgs, size_t n, bool add_generation_prompt,
		     const char *bos, const char *eos, char **out)
{
	assert_return((unsigned) c < KTOK_CHAT_MAX && (msgs || !n) && out, -EINVAL);
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
	_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
	kiln_strbuf_init(&b);
	int r = 0;
	switch (c) {
	case KTOK_CHAT_CHATML:
		for (size_t i = 0; i < n; i++)
			kiln_strbuf_printf(&b, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role,
					   msgs[i].content);
		if (add_generation_prompt)
			kiln_strbuf_append(&b, "<|im_start|>assistant\n");
		break;
	case KTOK_CHAT_LLAMA3:
		kiln_strbuf_append(&b, bos);
		for (size_t i = 0; i < n; i++) {
			kiln_strbuf_printf(&b, "<|start_header_id|>%s<|end_header_id|>\n\n",
					   msgs[i].role);
			put_trim(&b, msgs[i].content);
			kiln_strbuf_append(&b, "<|eot_id|>");
		}
		if (add_generation_prompt)
			kiln_strbuf_append(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case KTOK_CHAT_LLAMA2:
	case KTOK_CHAT_MISTRAL:
		r = render_inst(c == KTOK_CHAT_LLAMA2, msgs, n, bos, eos, &b);
		break;
	case KTOK_CHAT_GEMMA: {
		/* No system role: Gemma 3's template puts it at the top of
		 * the first user turn followed by a blank line. */
		size_t i = 0;
		const char *sys = NULL;
		if (n && role_of(msgs[0].role) == R_SYSTEM)
			sys = msgs[0].content, i = 1;
		kiln_strbuf_append(&b, bos);
		for (size_t k = 0; i < n; i++, k++) {
			int role = role_of(msgs[i].role);
			if (role == R_SYSTEM)
				return -EINVAL;
			kiln_strbuf_printf(&b, "<start_of_turn>%s\n",
					   role == R_ASSISTANT ? "model" : "user");
			if (k == 0 && sys && role == R_USER) {
				put_trim(&b, sys);
				kiln_strbuf_append(&b, "\n\n");
			}
			put_trim(&b, msgs[i].content);
			kiln_strbuf_append(&b, "<end_of_turn>\n");
		}
		if (add_generation_prompt)
			kiln_strbuf_append(&b, "<start_of_turn>model\n");
		break;
	}
	case KTOK_CHAT_PHI3:
		for (size_t i = 0; i < n; i++)
			kiln_strbuf_printf(&b, "<|%s|>\n%s<|end|>\n", msgs[i].role,
					   msgs[i].content);
		if (add_generation_prompt)
			kiln_strbuf_append(&b, "<|assistant|>\n");
		else
			kiln_strbuf_append(&b, eos);
		break;
	case KTOK_CHAT_ZEPHYR:
		for (size_t i = 0; i < n; i++)
			kiln_strbuf_printf(&b, "<|%s|>\n%s%s\n", msgs[i].role, msgs[i].content,
					   eos);
		if (add_generation_prompt)
			kiln_strbuf_append(&b, "<|assistant|>\n");
		break;
	default:
		return -EINVAL;
	}
	if (r < 0)
		return r;
	if (kiln_strbuf_error(&b) < 0)
		return -ENOMEM;
	char *s = kiln_strbuf_steal(&b);
	if (!s && !(s = strdup("")))
		return -ENOMEM;
	*out = s;
	return 0;
}
