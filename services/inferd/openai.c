/* openai.c — kiln-inferd's OpenAI request layer: a request body -> a typed
 * inferd_request, and typed results -> response JSON.
 *
 * Everything a client can get wrong is found here, before the engine sees
 * anything, and refused with OpenAI's error shape naming the field
 * ("prompt[1]: token id 512 is outside the vocabulary (0..511)").  Text
 * (prompts, rendered chat messages) is encoded here with the model's
 * tokenizer, so a request leaves this file as token ids.  Pure: no I/O, no
 * engine, no HTTP, no logging — which is what lets fuzz-openai throw
 * anything at it. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inferd.h"
#include "kiln/macro.h"
#include "kiln/strbuf.h"

/* One prompt given as token ids (where names it in errors). */
static int ids_prompt(const json_t *p, const char *where, int vocab, int32_t **ret, int *ret_n,
		      kiln_error *err)
{
	size_t n = json_array_size(p);
	if (n < 1 || n > INFERD_PROMPT_MAX)
		return kiln_json_fail(err, where, "expected 1 to %d token ids, got %zu",
				      INFERD_PROMPT_MAX, n);
	int32_t *ids = malloc(n * sizeof(int32_t));
	if (!ids)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(p, i);
		char at[KILN_JSON_PATH_MAX];
		kiln_json_path(at, sizeof(at), where, NULL, i);
		if (!json_is_integer(v)) {
			free(ids);
			return kiln_json_fail(err, at, "expected a token id, got %s",
					      kiln_json_type_name(v));
		}
		json_int_t t = json_integer_value(v);
		if (t < 0 || t >= vocab) {
			free(ids);
			return kiln_json_fail(err, at,
					      "token id %lld is outside the vocabulary (0..%d)",
					      (long long) t, vocab - 1);
		}
		ids[i] = (int32_t) t;
	}
	*ret = ids;
	*ret_n = (int) n;
	return 0;
}

static int need_tokenizer(const inferd_model *m, const char *where, kiln_error *err)
{
	if (m->tok)
		return 0;
	return kiln_json_fail(err, where,
			      "text needs a tokenizer and this server has none; restart "
			      "kiln-inferd with --tokenizer FILE, or send token ids");
}

/* Ids just encoded (r: what the encoder returned) -> a prompt: the
 * doubled BOS dropped, the length checked. */
static int encoded_prompt(const inferd_model *m, int r, int32_t *ids, size_t n, const char *where,
			  int32_t **ret, int *ret_n, kiln_error *err)
{
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		return kiln_json_fail(err, where, "cannot tokenize the text: %s", strerror(-r));
	/* Templates carry their own BOS; the vocabulary may add one more. */
	if (n > 1 && ktok_bos(m->tok) >= 0 && ids[0] == ktok_bos(m->tok) &&
	    ids[1] == ktok_bos(m->tok))
		memmove(ids, ids + 1, --n * sizeof(int32_t));
	if (n < 1 || n > INFERD_PROMPT_MAX) {
		free(ids);
		return kiln_json_fail(err, where, "the text is %zu tokens, expected 1 to %d", n,
				      INFERD_PROMPT_MAX);
	}
	*ret = ids;
	*ret_n = (int) n;
	return 0;
}

size_t inferd_max_piece(const ktok *t)
{
	size_t max = 0;
	for (uint32_t id = 0; t && id < ktok_n_vocab(t); id++) {
		size_t len = 0;
		if (ktok_token_text(t, (int32_t) id, &len))
			max = MAX(max, len);
	}
	return max;
}

/* A text of `bytes` bytes is at least bytes / max_piece tokens: when that
 * is over the context, -EMSGSIZE with err filled and nothing tokenized
 * (a 4 MB body of text would otherwise become a million tokens, and their
 * memory, before the context check); inferd_request_parse() makes it a
 * context_length_exceeded.  0 when it may fit. */
static int over_context(const inferd_model *m, size_t bytes, const char *where, kiln_error *err)
{
	if (!m->max_piece || m->ctx <= 0 || bytes / m->max_piece <= (size_t) m->ctx)
		return 0;
	kiln_json_fail(err, where,
		       "The text is %zu bytes, so at least %zu tokens (no token of this model is "
		       "longer than %zu bytes), more than the model's context of %d tokens; "
		       "shorten it",
		       bytes, bytes / m->max_piece, m->max_piece, m->ctx);
	return -EMSGSIZE;
}

/* One prompt given as text: encoded with BOS as the vocabulary says. */
static int text_prompt(const inferd_model *m, const char *text, unsigned flags, const char *where,
		       int32_t **ret, int *ret_n, kiln_error *err)
{
	int r = need_tokenizer(m, where, err);
	if (r < 0)
		return r;
	if ((r = over_context(m, strlen(text), where, err)) < 0)
		return r;
	int32_t *ids = NULL;
	size_t n = 0;
	r = ktok_encode(m->tok, text, strlen(text), flags, &ids, &n);
	return encoded_prompt(m, r, ids, n, where, ret, ret_n, err);
}

/* "prompt": a string, an array of strings, an array of token ids, or an
 * array of arrays of token ids (OpenAI's four shapes). */
static int get_prompts(const inferd_model *m, const json_t *req, inferd_request *q, kiln_error *err)
{
	json_t *p = json_object_get(req, "prompt");
	if (!p)
		return kiln_json_fail(err, "prompt", "required field is missing");
	if (json_is_string(p)) {
		q->n_prompts = 1;
		return text_prompt(m, json_string_value(p), KTOK_ENC_ADD_SPECIAL, "prompt",
				   &q->prompts[0], &q->prompt_len[0], err);
	}
	if (!json_is_array(p) || json_array_size(p) == 0)
		return kiln_json_fail(err, "prompt",
				      "expected a string, an array of strings, an array of token "
				      "ids or an array of arrays of token ids, got %s",
				      json_is_array(p) ? "an empty array" : kiln_json_type_name(p));
	json_t *first = json_array_get(p, 0);
	if (json_is_integer(first)) {
		q->n_prompts = 1;
		return ids_prompt(p, "prompt", m->vocab, &q->prompts[0], &q->prompt_len[0], err);
	}
	if (json_array_size(p) > INFERD_BATCH_MAX)
		return kiln_json_fail(err, "prompt", "at most %d prompts per request, got %zu",
				      INFERD_BATCH_MAX, json_array_size(p));
	for (size_t i = 0; i < json_array_size(p); i++) {
		json_t *v = json_array_get(p, i);
		char at[KILN_JSON_PATH_MAX];
		kiln_json_path(at, sizeof(at), "prompt", NULL, i);
		int r;
		if (json_is_string(v) && json_is_string(first))
			r = text_prompt(m, json_string_value(v), KTOK_ENC_ADD_SPECIAL, at,
					&q->prompts[i], &q->prompt_len[i], err);
		else if (json_is_array(v) && json_is_array(first))
			r = ids_prompt(v, at, m->vocab, &q->prompts[i], &q->prompt_len[i], err);
		else
			r = kiln_json_fail(err, at, "expected %s like prompt[0], got %s",
					   json_is_string(first) ? "a string" : "an array",
					   kiln_json_type_name(v));
		if (r < 0)
			return r;
		q->n_prompts = (int) i + 1;
	}
	return 0;
}

/* A message's "content": a string, or OpenAI's content parts
 * ([{"type":"text","text":...}], joined with "\n" as vLLM does); *ret is
 * malloc'd. */
static int get_content(const json_t *msg, const char *at, char **ret, kiln_error *err)
{
	char f[KILN_JSON_PATH_MAX];
	kiln_json_path(f, sizeof(f), at, "content", 0);
	json_t *c = json_object_get(msg, "content");
	if (json_is_string(c)) {
		*ret = strdup(json_string_value(c));
		return *ret ? 0 : -ENOMEM;
	}
	if (!json_is_array(c))
		return kiln_json_fail(err, f,
				      "expected a string or an array of content parts, got %s",
				      c ? kiln_json_type_name(c) : "nothing");
	_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
	kiln_strbuf_init(&b);
	for (size_t i = 0; i < json_array_size(c); i++) {
		static const char *const keys[] = { "type", "text", NULL };
		static const char *const types[] = { "text", NULL };
		json_t *part = json_array_get(c, i);
		char p[KILN_JSON_PATH_MAX];
		kiln_json_path(p, sizeof(p), f, NULL, i);
		const char *type = NULL, *text = NULL;
		int t;
		if (!json_is_object(part))
			return kiln_json_fail(err, p, "expected a content part object, got %s",
					      kiln_json_type_name(part));
		if (kiln_json_get_string(part, p, "type", KILN_JSON_REQUIRED, 0, &type, err) < 0)
			return -EINVAL;
		if (kiln_json_get_enum(part, p, "type", KILN_JSON_REQUIRED, types, &t, err) < 0) {
			char tp[KILN_JSON_PATH_MAX];
			kiln_json_path(tp, sizeof(tp), p, "type", 0);
			return kiln_json_fail(err, tp,
					      "kiln-inferd does not support '%s' content parts, "
					      "only 'text'",
					      type);
		}
		if (kiln_json_check_keys(part, p, keys, err) < 0 ||
		    kiln_json_get_string(part, p, "text", KILN_JSON_REQUIRED, 0, &text, err) < 0)
			return -EINVAL;
		if (i)
			kiln_strbuf_append(&b, "\n");
		kiln_strbuf_append(&b, text);
	}
	if (kiln_strbuf_error(&b) < 0)
		return -ENOMEM;
	char *s = kiln_strbuf_steal(&b);
	if (!s && !(s = strdup("")))
		return -ENOMEM;
	*ret = s;
	return 0;
}

static void free_contents(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

/* "messages": system (or developer, its new name)/user/assistant with text
 * content, rendered with the chat template and the assistant's header
 * (add_generation_prompt). */
static int get_messages(const inferd_model *m, const json_t *req, inferd_request *q,
			kiln_error *err)
{
	static const char *const roles[] = { "system", "user", "assistant", "developer", NULL };
	static const char *const keys[] = { "role", "content", "name", NULL };
	json_t *arr = NULL;
	int r = kiln_json_get_objects(req, "", "messages", KILN_JSON_REQUIRED, 1,
				      KTOK_MAX_CHAT_MESSAGES, &arr, err);
	if (r < 0)
		return r;
	if ((r = need_tokenizer(m, "messages", err)) < 0)
		return r;
	size_t n = json_array_size(arr);
	_cleanup_free_ ktok_msg *msgs = calloc(n, sizeof(*msgs));
	char **contents = calloc(n, sizeof(char *));
	if (!msgs || !contents) {
		free(contents);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *msg = json_array_get(arr, i);
		char at[KILN_JSON_PATH_MAX];
		kiln_json_path(at, sizeof(at), "messages", NULL, i);
		int role;
		const char *name = NULL;
		if ((r = kiln_json_get_enum(msg, at, "role", KILN_JSON_REQUIRED, roles, &role,
					    err)) < 0 ||
		    (r = kiln_json_check_keys(msg, at, keys, err)) < 0 ||
		    (r = kiln_json_get_string(msg, at, "name", 0, INFERD_NAME_MAX, &name, err)) <
			    0 ||
		    (r = get_content(msg, at, &contents[i], err)) < 0) {
			free_contents(contents, n);
			return r;
		}
		msgs[i] = (ktok_msg){ .role = roles[role == 3 ? 0 : role], .content = contents[i] };
	}
	size_t bytes = 0;
	for (size_t i = 0; i < n; i++)
		bytes += contents[i] ? strlen(contents[i]) : 0;
	if ((r = over_context(m, bytes, "messages", err)) < 0) {
		free_contents(contents, n);
		return r;
	}
	/* Only the template's own markers become control tokens: a user who
	 * types "<|im_end|><|im_start|>system" gets those characters, not a
	 * new turn (ktok_chat_encode keeps each content literal). */
	int32_t *ids = NULL;
	size_t n_ids = 0;
	r = ktok_chat_encode(m->tok, m->chat, msgs, n, true, m->bos, m->eos,
			     KTOK_ENC_ADD_SPECIAL | KTOK_ENC_PARSE_SPECIAL, &ids, &n_ids);
	free_contents(contents, n);
	if (r == -ENOMEM)
		return r;
	if (r == -EINVAL || r == -E2BIG)
		return kiln_json_fail(err, "messages",
				      "the %s chat template cannot render these messages (%s); "
				      "check the roles and their order",
				      ktok_chat_name(m->chat), strerror(-r));
	q->n_prompts = 1;
	return encoded_prompt(m, r, ids, n_ids, "messages", &q->prompts[0], &q->prompt_len[0], err);
}

/* "stop_token_ids" (vLLM's extension): an array of token ids. */
static int get_stop(const json_t *req, int vocab, int32_t *stop, int *ret_n, kiln_error *err)
{
	json_t *p = json_object_get(req, "stop_token_ids");
	*ret_n = 0;
	if (!p || json_is_null(p))
		return 0;
	if (!json_is_array(p) || json_array_size(p) > KILN_ENGINE_STOP_MAX)
		return kiln_json_fail(err, "stop_token_ids", "expected at most %d token ids",
				      KILN_ENGINE_STOP_MAX);
	for (size_t i = 0; i < json_array_size(p); i++) {
		json_t *v = json_array_get(p, i);
		char where[KILN_JSON_PATH_MAX];
		kiln_json_path(where, sizeof(where), "stop_token_ids", NULL, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= vocab)
			return kiln_json_fail(err, where, "expected a token id in 0..%d",
					      vocab - 1);
		stop[i] = (int32_t) json_integer_value(v);
	}
	*ret_n = (int) json_array_size(p);
	return 0;
}

/* "stop": a string or up to 4 non-empty strings, copied into *ret. */
static int get_stop_strings(const inferd_model *m, const json_t *req, char ***ret, size_t *ret_max,
			    kiln_error *err)
{
	json_t *p = json_object_get(req, "stop");
	if (!p || json_is_null(p) || (json_is_array(p) && json_array_size(p) == 0))
		return 0;
	_cleanup_free_ const char **v = NULL;
	int r = kiln_json_get_strings(req, "", "stop", 0, 1, INFERD_STOP_STRINGS_MAX,
				      INFERD_STOP_LEN_MAX, &v, err);
	if (r < 0)
		return r;
	if ((r = need_tokenizer(m, "stop", err)) < 0)
		return r;
	_cleanup_strv_free_ char **out = NULL;
	size_t max = 1;
	for (size_t i = 0; v[i]; i++) {
		if (!v[i][0]) {
			char at[KILN_JSON_PATH_MAX];
			kiln_json_path(at, sizeof(at), "stop", NULL, i);
			return kiln_json_fail(err, json_is_string(p) ? "stop" : at,
					      "a stop string must not be empty");
		}
		if (strv_extend(&out, v[i]) < 0)
			return -ENOMEM;
		max = MAX(max, strlen(v[i]));
	}
	*ret = TAKE_PTR(out);
	*ret_max = max;
	return 0;
}

/* An error that is not "400 about a field" (kiln_json_fail's shape). */
static int fail_with(inferd_error *err, unsigned status, const char *param, const char *code,
		     const char *fmt, ...) _printf_(5, 6);
static int fail_with(inferd_error *err, unsigned status, const char *param, const char *code,
		     const char *fmt, ...)
{
	va_list ap;
	err->status = status;
	err->code = code;
	snprintf(err->json.where, sizeof(err->json.where), "%s", param);
	va_start(ap, fmt);
	vsnprintf(err->json.msg, sizeof(err->json.msg), fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* "field: kiln-inferd does not support WHAT; HINT" (a 400 naming the field). */
#define UNSUPPORTED(e, field, what, hint) \
	kiln_json_fail(e, field, "kiln-inferd does not support " what "; " hint)

/* "logit_bias": {"token id": bias, ...}, at most KILN_ENGINE_BIAS_MAX
 * entries of token ids in the vocabulary, biases -100..100. */
static int get_logit_bias(const inferd_model *m, const json_t *req, inferd_request *ret,
			  kiln_error *e)
{
	json_t *o = NULL, *v;
	const char *key;
	if (kiln_json_get_object(req, "", "logit_bias", 0, &o, e) < 0)
		return -EINVAL;
	if (!o)
		return 0;
	if (json_object_size(o) > KILN_ENGINE_BIAS_MAX)
		return kiln_json_fail(e, "logit_bias", "%zu entries, at most %d",
				      json_object_size(o), KILN_ENGINE_BIAS_MAX);
	json_object_foreach(o, key, v)
	{
		char at[KILN_JSON_PATH_MAX], *end;
		kiln_json_path(at, sizeof(at), "logit_bias", key, 0);
		/* canonical decimal only: " 5", "+5" and "05" would be a
		 * second entry for token 5 */
		errno = 0;
		long id = strtol(key, &end, 10);
		if (!*key || *end || errno || id < 0 || id >= m->vocab ||
		    !isdigit((unsigned char) key[0]) || (key[0] == '0' && key[1]))
			return kiln_json_fail(e, at,
					      "the key must be a token id of this model (0..%d), "
					      "as a string",
					      m->vocab - 1);
		if (!json_is_number(v) || !(fabs(json_number_value(v)) <= 100))
			return kiln_json_fail(e, at, "the bias must be a number in -100..100");
		ret->logit_bias[ret->n_logit_bias++] =
			(kiln_engine_bias){ (int32_t) id, (float) json_number_value(v) };
	}
	ret->proc.n_logit_bias = ret->n_logit_bias;
	return 0;
}

/* tool_choice / function_call: anything but "none" or "auto" (or null)
 * asks for calls this server never makes. */
static int refuse_choice(const json_t *req, const char *key, const char *what, kiln_error *e)
{
	const json_t *v = json_object_get(req, key);
	const char *s = json_string_value(v);
	if (v && !json_is_null(v) && !(s && (streq(s, "none") || streq(s, "auto"))))
		return kiln_json_fail(e, key,
				      "kiln-inferd does not support %s; leave the field out or "
				      "send \"none\"",
				      what);
	return 0;
}

/* n, penalties, logit_bias, min_tokens, logprobs (OpenAI's and vLLM's
 * sampling fields), and fields stock clients (the openai package,
 * LangChain ...) send that kiln takes at their neutral values only:
 * anything else asks for what kiln does not do, and is refused naming the
 * field rather than silently ignored. */
static int get_sampling(const inferd_model *m, const json_t *req, bool chat, inferd_request *ret,
			kiln_error *e)
{
	static const char *const known_rf[] = { "type", NULL };
	static const char *const rf_types[] = { "text", NULL };
	int64_t n = 1, top = 0, min_tokens = 0;
	double pp = 0, fp = 0, rp = 1;
	bool b = false;
	const char *user = NULL;
	json_t *o = NULL, *v;
	int t;
	if (kiln_json_get_int(req, "", "n", 0, 1, INFERD_BATCH_MAX, &n, e) < 0 ||
	    kiln_json_get_number(req, "", "presence_penalty", 0, -2, 2, &pp, e) < 0 ||
	    kiln_json_get_number(req, "", "frequency_penalty", 0, -2, 2, &fp, e) < 0 ||
	    kiln_json_get_number(req, "", "repetition_penalty", 0, 0.01, 100, &rp, e) < 0 ||
	    kiln_json_get_int(req, "", "min_tokens", 0, 0, INFERD_MAX_TOKENS_MAX, &min_tokens, e) <
		    0 ||
	    get_logit_bias(m, req, ret, e) < 0)
		return -EINVAL;
	ret->n = (int) n;
	ret->proc.presence_penalty = (float) pp;
	ret->proc.frequency_penalty = (float) fp;
	ret->proc.repetition_penalty = (float) rp;
	ret->proc.min_tokens = (int) min_tokens;
	/* Chat: logprobs a boolean and top_logprobs a count; completions:
	 * logprobs a count of alternatives (null or false: none). */
	v = json_object_get(req, "logprobs");
	if (chat) {
		if (kiln_json_get_bool(req, "", "logprobs", 0, &ret->logprobs, e) < 0 ||
		    kiln_json_get_int(req, "", "top_logprobs", 0, 0, KILN_ENGINE_LOGPROBS_MAX, &top,
				      e) < 0)
			return -EINVAL;
		if (top && !ret->logprobs)
			return kiln_json_fail(e, "top_logprobs",
					      "top_logprobs needs \"logprobs\": true");
	} else if (json_is_false(v) || json_is_null(v) || !v) {
		/* none */
	} else {
		if (json_is_true(v))
			return kiln_json_fail(e, "logprobs",
					      "for completions logprobs is the number of "
					      "alternatives per token (0..%d), not a boolean",
					      KILN_ENGINE_LOGPROBS_MAX);
		if (kiln_json_get_int(req, "", "logprobs", 0, 0, KILN_ENGINE_LOGPROBS_MAX, &top,
				      e) < 0)
			return -EINVAL;
		ret->logprobs = true;
	}
	ret->top_logprobs = (int) top;
	if (kiln_json_get_bool(req, "", "store", 0, &b, e) < 0 ||
	    kiln_json_get_object(req, "", "metadata", 0, &o, e) < 0 ||
	    kiln_json_get_string(req, "", "user", 0, 0, &user, e) < 0)
		return -EINVAL;
	o = NULL;
	if (kiln_json_get_object(req, "", "response_format", 0, &o, e) < 0)
		return -EINVAL;
	if (o && (kiln_json_check_keys(o, "response_format", known_rf, e) < 0 ||
		  kiln_json_get_string(o, "response_format", "type", KILN_JSON_REQUIRED, 0, &user,
				       e) < 0))
		return -EINVAL;
	if (o && kiln_json_get_enum(o, "response_format", "type", 0, rf_types, &t, e) < 0)
		return kiln_json_fail(e, "response_format.type",
				      "kiln-inferd does not support '%s' output (structured "
				      "output); send {\"type\": \"text\"} or leave it out",
				      user);
	/* Tools: refused unless empty or switched off. */
	v = json_object_get(req, "tools");
	if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v)))
		return UNSUPPORTED(e, "tools", "tool calls", "leave the field out");
	v = json_object_get(req, "functions");
	if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v)))
		return UNSUPPORTED(e, "functions", "function calls", "leave the field out");
	if (refuse_choice(req, "tool_choice", "tool calls", e) < 0 ||
	    refuse_choice(req, "function_call", "function calls", e) < 0)
		return -EINVAL;
	return 0;
}

void inferd_request_done(inferd_request *q)
{
	if (!q)
		return;
	for (int i = 0; i < q->n_prompts; i++)
		free(q->prompts[i]);
	q->n_prompts = 0;
	strv_free(q->stops);
	q->stops = NULL;
}

int inferd_request_parse(const inferd_model *m, const json_t *req, bool chat, inferd_request *ret,
			 inferd_error *err)
{
	/* The fields each endpoint takes: one list, the endpoints in a mask. */
	enum { CMPL = 1, CHAT = 2, BOTH = CMPL | CHAT };
	static const struct {
		const char *name;
		unsigned in;
	} fields[] = {
		{ "model", BOTH },
		{ "prompt", CMPL },
		{ "messages", CHAT },
		{ "max_tokens", BOTH },
		{ "max_completion_tokens", CHAT },
		{ "temperature", BOTH },
		{ "top_p", BOTH },
		{ "top_k", BOTH },
		{ "seed", BOTH },
		{ "stream", BOTH },
		{ "n", BOTH },
		{ "stop_token_ids", BOTH },
		{ "ignore_eos", BOTH },
		{ "user", BOTH },
		{ "stop", BOTH },
		{ "echo", CMPL },
		{ "stream_options", BOTH },
		{ "logprobs", BOTH },
		{ "top_logprobs", CHAT },
		{ "presence_penalty", BOTH },
		{ "frequency_penalty", BOTH },
		{ "repetition_penalty", BOTH },
		{ "logit_bias", BOTH },
		{ "min_tokens", BOTH },
		{ "store", BOTH },
		{ "metadata", BOTH },
		{ "response_format", CHAT },
		{ "tools", CHAT },
		{ "tool_choice", CHAT },
		{ "parallel_tool_calls", CHAT },
		{ "functions", CHAT },
		{ "function_call", CHAT },
	};
	const char *known[ARRAY_SIZE(fields) + 1];
	size_t n_known = 0;
	for (size_t i = 0; i < ARRAY_SIZE(fields); i++)
		if (fields[i].in & (chat ? CHAT : CMPL))
			known[n_known++] = fields[i].name;
	known[n_known] = NULL;
	static const char *const known_so[] = { "include_usage", NULL };
	assert_return(m && req && ret && err, -EINVAL);
	*err = (inferd_error){ .status = 400 };
	*ret = (inferd_request){ .chat = chat,
				 .max_tokens = chat ? INFERD_MAX_TOKENS_MAX : 16,
				 .temperature = 1.0,
				 .top_p = 1.0,
				 .seed = -1 };
	kiln_error *e = &err->json;
	const char *model = NULL;
	json_t *so = NULL;
	/* max_tokens 0 (completions, with echo): the prompt scored, nothing
	 * generated, as lm-eval-harness asks */
	if (kiln_json_check_keys(req, "", known, e) < 0 ||
	    kiln_json_get_string(req, "", "model", KILN_JSON_REQUIRED, INFERD_NAME_MAX, &model, e) <
		    0 ||
	    kiln_json_get_int(req, "", "max_tokens", 0, chat ? 1 : 0, INFERD_MAX_TOKENS_MAX,
			      &ret->max_tokens, e) < 0 ||
	    (chat && kiln_json_get_int(req, "", "max_completion_tokens", 0, 1,
				       INFERD_MAX_TOKENS_MAX, &ret->max_tokens, e) < 0) ||
	    kiln_json_get_number(req, "", "temperature", 0, 0, 2, &ret->temperature, e) < 0 ||
	    kiln_json_get_number(req, "", "top_p", 0, 0, 1, &ret->top_p, e) < 0 ||
	    kiln_json_get_int(req, "", "top_k", 0, 0, KK_SAMPLE_TOP_K_MAX, &ret->top_k, e) < 0 ||
	    kiln_json_get_int(req, "", "seed", 0, 0, INT64_MAX, &ret->seed, e) < 0 ||
	    get_sampling(m, req, chat, ret, e) < 0 ||
	    kiln_json_get_bool(req, "", "stream", 0, &ret->stream, e) < 0 ||
	    kiln_json_get_bool(req, "", "echo", 0, &ret->echo, e) < 0 ||
	    kiln_json_get_bool(req, "", "ignore_eos", 0, &ret->ignore_eos, e) < 0 ||
	    kiln_json_get_object(req, "", "stream_options", 0, &so, e) < 0 ||
	    (so && (kiln_json_check_keys(so, "stream_options", known_so, e) < 0 ||
		    kiln_json_get_bool(so, "stream_options", "include_usage", 0,
				       &ret->include_usage, e) < 0)) ||
	    get_stop(req, m->vocab, ret->stop_ids, &ret->n_stop_ids, e) < 0)
		return -EINVAL;
	if (!streq(model, m->name))
		return fail_with(err, 404, "model", "model_not_found",
				 "The model '%s' does not exist (this server has '%s')", model,
				 m->name);
	int r = get_stop_strings(m, req, &ret->stops, &ret->stop_max, e);
	if (r < 0)
		return r;
	if (ret->echo && !m->tok)
		return need_tokenizer(m, "echo", e);
	if (ret->max_tokens == 0 && !ret->echo)
		return kiln_json_fail(e, "max_tokens",
				      "max_tokens 0 generates nothing; it is taken with \"echo\": "
				      "true only (to score the prompt, with logprobs); ask for at "
				      "least 1 token");
	if (ret->proc.min_tokens > ret->max_tokens)
		return kiln_json_fail(e, "min_tokens", "min_tokens %d is more than max_tokens %lld",
				      ret->proc.min_tokens, (long long) ret->max_tokens);
	r = chat ? get_messages(m, req, ret, e) : get_prompts(m, req, ret, e);
	if (r == -EMSGSIZE) { /* over_context(): e says why */
		err->status = 400;
		err->code = "context_length_exceeded";
		return -EINVAL;
	}
	if (r < 0)
		return r;
	if (ret->n_prompts * ret->n > INFERD_BATCH_MAX)
		return kiln_json_fail(
			e, "n", "%d prompts x n %d is %d choices, at most %d in one request",
			ret->n_prompts, ret->n, ret->n_prompts * ret->n, INFERD_BATCH_MAX);
	for (int i = 0; i < ret->n_prompts; i++)
		if (ret->prompt_len[i] > m->ctx)
			return fail_with(err, 400, chat ? "messages" : "prompt",
					 "context_length_exceeded",
					 "The %s%s is %d tokens, more than the model's context of "
					 "%d tokens; shorten it",
					 chat ? "rendered chat" : "prompt",
					 ret->n_prompts > 1 ? " in a batch" : "",
					 ret->prompt_len[i], m->ctx);
	/* Asked for more than the context holds: refused as vLLM does, not
	 * cut short.  Chat without max_tokens runs until the context is full. */
	bool asked = !chat || json_object_get(req, "max_tokens") ||
		     json_object_get(req, "max_completion_tokens");
	for (int i = 0; asked && i < ret->n_prompts; i++)
		if (ret->prompt_len[i] + ret->max_tokens > m->ctx)
			return fail_with(err, 400, chat ? "messages" : "prompt",
					 "context_length_exceeded",
					 "This model's maximum context length is %d tokens. "
					 "However, you requested %lld tokens (%d in the %s, %lld "
					 "in the completion). Please reduce the length of the %s "
					 "or completion.",
					 m->ctx, (long long) ret->prompt_len[i] + ret->max_tokens,
					 ret->prompt_len[i], chat ? "messages" : "prompt",
					 (long long) ret->max_tokens, chat ? "messages" : "prompt");
	return 0;
}

json_t *inferd_usage_json(int prompt_tokens, int completion_tokens)
{
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt_tokens, "completion_tokens",
			 completion_tokens, "total_tokens", prompt_tokens + completion_tokens);
}

json_t *inferd_choice_json(int index, const char *text, size_t len, const int32_t *toks, int n,
			   const char *finish)
{
	json_t *ids = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(ids, json_integer(toks[i]));
	return json_pack("{s:i, s:s%, s:o, s:n, s:s?}", "index", index, "text", text ? text : "",
			 text ? len : 0, "token_ids", ids, "logprobs", "finish_reason", finish);
}

json_t *inferd_chat_choice_json(bool stream, int index, bool first, const char *text, size_t len,
				const char *finish)
{
	json_t *m = json_object();
	if (!stream || first)
		json_object_set_new(m, "role", json_string("assistant"));
	if (!stream || first || len)
		json_object_set_new(m, "content", json_stringn(text ? text : "", len));
	return json_pack("{s:i, s:o, s:n, s:s?}", "index", index, stream ? "delta" : "message", m,
			 "logprobs", "finish_reason", finish);
}

/* A token's text for logprobs: its bytes when they are UTF-8, else
 * "bytes:\\xNN..." (vLLM's spelling); "token_id:N" without a tokenizer.
 * A byte-fallback token (<0xNN>) is its byte, in *byte. */
static json_t *token_string(const inferd_model *m, int32_t id, const char **bytes, size_t *len,
			    char *byte)
{
	char buf[4 * KTOK_MAX_TOKEN_LEN + 16];
	unsigned v;
	*bytes = m->tok ? ktok_token_text(m->tok, id, len) : NULL;
	if (*bytes && ktok_token_type(m->tok, id) == KTOK_BYTE && *len == 6 &&
	    sscanf(*bytes, "<0x%2x>", &v) == 1) {
		*byte = (char) v;
		*bytes = byte;
		*len = 1;
	}
	if (!*bytes) {
		snprintf(buf, sizeof(buf), "token_id:%d", id);
		*bytes = "";
		*len = 0;
		return json_string(buf);
	}
	json_t *t = json_stringn(*bytes, *len);
	if (t)
		return t;
	size_t o = (size_t) snprintf(buf, sizeof(buf), "bytes:");
	for (size_t i = 0; i < *len && o + 5 < sizeof(buf); i++)
		o += (size_t) snprintf(buf + o, sizeof(buf) - o, "\\x%02x",
				       (unsigned char) (*bytes)[i]);
	return json_string(buf);
}

static json_t *bytes_json(const char *b, size_t len)
{
	json_t *a = json_array();
	for (size_t i = 0; i < len; i++)
		json_array_append_new(a, json_integer((unsigned char) b[i]));
	return a;
}

/* OpenAI reports -inf as a large negative number (JSON has no infinity). */
static json_t *lp_json(float lp)
{
	return json_real(isfinite(lp) ? lp : -9999.0);
}

json_t *inferd_logprobs_json(const inferd_model *m, bool chat, const int32_t *toks, const float *lp,
			     const int32_t *top_ids, const float *top_lp, int n_top, int n,
			     size_t *offset)
{
	const char *b;
	size_t len;
	char byte;
	if (chat) {
		json_t *content = json_array();
		for (int i = 0; i < n; i++) {
			json_t *alts = json_array();
			for (int k = 0; k < n_top; k++) {
				json_t *t =
					token_string(m, top_ids[i * n_top + k], &b, &len, &byte);
				json_array_append_new(
					alts, json_pack("{s:o, s:o, s:o}", "token", t, "logprob",
							lp_json(top_lp[i * n_top + k]), "bytes",
							bytes_json(b, len)));
			}
			json_t *t = token_string(m, toks[i], &b, &len, &byte);
			json_array_append_new(content,
					      json_pack("{s:o, s:o, s:o, s:o}", "token", t,
							"logprob", lp_json(lp[i]), "bytes",
							bytes_json(b, len), "top_logprobs", alts));
		}
		return json_pack("{s:o}", "content", content);
	}
	json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
	       *offs = json_array();
	for (int i = 0; i < n; i++) {
		json_array_append_new(tokens, token_string(m, toks[i], &b, &len, &byte));
		json_array_append_new(offs, json_integer((json_int_t) *offset));
		*offset += len;
		if (isnan(lp[i])) { /* the prompt's first token (echo) */
			json_array_append_new(lps, json_null());
			json_array_append_new(tops, json_null());
			continue;
		}
		json_array_append_new(lps, lp_json(lp[i]));
		/* vLLM's keys: the alternatives' texts (the sampled token
		 * among them when it is not one). */
		json_t *alts = json_object();
		for (int k = 0; k < n_top; k++) {
			json_t *t = token_string(m, top_ids[i * n_top + k], &b, &len, &byte);
			json_object_set_new(alts, json_string_value(t),
					    lp_json(top_lp[i * n_top + k]));
			json_decref(t);
		}
		json_array_append_new(tops, alts);
	}
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
			 "top_logprobs", tops, "text_offset", offs);
}

json_t *inferd_envelope_json(const char *id, bool chat, bool stream, const char *model,
			     time_t created, json_t *choices)
{
	if (!choices)
		choices = json_array();
	else if (!json_is_array(choices))
		choices = json_pack("[o]", choices);
	const char *object =
		chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
	return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", id, "object", object, "created",
			 (json_int_t) created, "model", model, "choices", choices);
}

json_t *inferd_model_json(const char *name, time_t created, int ctx)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", name, "object", "model", "created",
			 (json_int_t) created, "owned_by", "kiln", "max_model_len", ctx);
}

json_t *inferd_models_json(const char *name, time_t created, int ctx)
{
	json_t *m = inferd_model_json(name, created, ctx);
	return m ? json_pack("{s:s, s:[o]}", "object", "list", "data", m) : NULL;
}
