/* test-json.c — kiln/json.h: parse errors with line:column, limits, and
 * every getter's error message, exactly (clients see them verbatim). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/json.h"
#include "kiln/macro.h"

static json_t *parse(const char *s)
{
	kiln_error err;
	json_t *j = NULL;
	int r = kiln_json_parse(s, strlen(s), &j, &err);
	if (r < 0)
		fail_msg("parse failed: %s", err.msg);
	return j;
}

static void assert_parse_error(const char *s, const char *message, int line, int column)
{
	kiln_error err;
	json_t *j = (json_t *) 0x1;
	assert_int_equal(kiln_json_parse_object(s, strlen(s), &j, &err), -EINVAL);
	assert_ptr_equal(j, (json_t *) 0x1); /* untouched */
	assert_string_equal(err.msg, message);
	assert_string_equal(err.where, "");
	assert_int_equal(err.line, line);
	assert_int_equal(err.column, column);
}

static void test_parse(void **state)
{
	assert_parse_error("{\"a\": 1,\n  \"b\": }",
			   "invalid JSON at line 2, column 8: unexpected token near '}'", 2, 8);
	assert_parse_error("{\"a\": 1",
			   "invalid JSON at line 1, column 7: '}' expected near end of file", 1, 7);
	/* columns count characters, not bytes */
	assert_parse_error("{\"é\": x}", "invalid JSON at line 1, column 7: invalid token near 'x'",
			   1, 7);
	assert_parse_error("   \n\t", "request body is empty: expected JSON", 0, 0);
	assert_parse_error("", "request body is empty: expected JSON", 0, 0);
	assert_parse_error("[1, 2]", "expected a JSON object, got an array", 0, 0);
	assert_parse_error("\"s\"", "expected a JSON object, got a string", 0, 0);
	assert_parse_error("{} {}",
			   "invalid JSON at line 1, column 4: end of file expected near '{'", 1, 4);

	/* depth: 64 levels pass, 65 fail at the 65th bracket (column 69) */
	kiln_error err;
	json_t *j = NULL;
	char deep[256];
	for (int k = 63; k <= 64; k++) {
		int n = snprintf(deep, sizeof(deep), "{\"a\":");
		for (int i = 0; i < k; i++)
			deep[n++] = '[';
		for (int i = 0; i < k; i++)
			deep[n++] = ']';
		deep[n++] = '}';
		deep[n] = 0;
		if (k == 63) {
			assert_int_equal(kiln_json_parse_object(deep, (size_t) n, &j, &err), 0);
			json_decref(j);
		} else
			assert_parse_error(deep,
					   "invalid JSON at line 1, column 69: nested deeper than "
					   "64 levels",
					   1, 69);
	}
	/* brackets inside strings do not count */
	int n = snprintf(deep, sizeof(deep), "{\"a\": \"\\\"");
	for (int i = 0; i < 100; i++)
		deep[n++] = '[';
	n += snprintf(deep + n, sizeof(deep) - (size_t) n, "\\\\\"}");
	assert_int_equal(kiln_json_parse_object(deep, (size_t) n, &j, &err), 0);
	assert_int_equal(json_string_length(json_object_get(j, "a")), 102);
	json_decref(j);

	/* size */
	char *big = malloc(KILN_JSON_SIZE_MAX + 2);
	assert_non_null(big);
	memset(big, ' ', KILN_JSON_SIZE_MAX + 1);
	big[0] = '{';
	big[KILN_JSON_SIZE_MAX] = '}';
	assert_int_equal(kiln_json_parse(big, KILN_JSON_SIZE_MAX + 1, &j, &err), -EINVAL);
	assert_string_equal(err.msg, "request body too large: 4194305 bytes, at most 4194304");
	assert_int_equal(kiln_json_parse(big, KILN_JSON_SIZE_MAX, &j, &err), -EINVAL); /* no '}' */
	big[KILN_JSON_SIZE_MAX - 1] = '}';
	assert_int_equal(kiln_json_parse(big, KILN_JSON_SIZE_MAX, &j, &err), 0);
	json_decref(j);
	free(big);

	/* embedded NUL */
	assert_int_equal(kiln_json_parse("{\"a\":1}\0", 8, &j, &err), -EINVAL);
	assert_int_equal(err.line, 1);
}

static void assert_err(const kiln_error *e, const char *message, const char *param)
{
	assert_string_equal(e->msg, message);
	assert_string_equal(e->where, param);
}

static const char request[] =
	"{\"model\": \"llama\", \"temperature\": 3, \"max_tokens\": 1.5, \"n\": 2.0,"
	" \"stream\": \"yes\", \"top_p\": null, \"user\": 7,"
	" \"messages\": [{\"role\": \"user\", \"content\": \"hi\"},"
	"               {\"role\": \"bot\", \"content\": \"x\"},"
	"               {\"role\": \"user\", \"content\": 5}, 3],"
	" \"stop\": [\"a\", 1], \"prompt\": \"p\", \"logit_bias\": [], \"tags\": [\"t1\", \"t2\"]}";

static void test_getters(void **state)
{
	_cleanup_json_ json_t *j = parse(request);
	assert_non_null(j);
	kiln_error e;

	/* strings */
	const char *s = "unset";
	assert_int_equal(kiln_json_get_string(j, "", "model", KILN_JSON_REQUIRED, 0, &s, &e), 1);
	assert_string_equal(s, "llama");
	assert_int_equal(kiln_json_get_string(j, "", "model", 0, 4, &s, &e), -EINVAL);
	assert_err(&e, "model: too long (5 bytes, at most 4)", "model");
	s = "unset";
	assert_int_equal(kiln_json_get_string(j, "", "suffix", 0, 0, &s, &e), 0);
	assert_string_equal(s, "unset"); /* absent: default kept */
	assert_int_equal(kiln_json_get_string(j, "", "suffix", KILN_JSON_REQUIRED, 0, &s, &e),
			 -EINVAL);
	assert_err(&e, "suffix: required field is missing", "suffix");
	assert_int_equal(kiln_json_get_string(j, "", "top_p", KILN_JSON_REQUIRED, 0, &s, &e),
			 -EINVAL);
	assert_err(&e, "top_p: expected a string, got null", "top_p");
	assert_int_equal(kiln_json_get_string(j, "", "user", 0, 0, &s, &e), -EINVAL);
	assert_err(&e, "user: expected a string, got a number", "user");
	assert_int_equal(kiln_json_get_string(j, "", "messages", 0, 0, &s, &e), -EINVAL);
	assert_err(&e, "messages: expected a string, got an array", "messages");

	/* numbers */
	double d = 1.0;
	assert_int_equal(kiln_json_get_number(j, "", "temperature", 0, 0, 2, &d, &e), -EINVAL);
	assert_err(&e, "temperature: must be between 0 and 2, got 3", "temperature");
	assert_true(d == 1.0);
	assert_int_equal(kiln_json_get_number(j, "", "temperature", 0, 0, 5, &d, &e), 1);
	assert_true(d == 3.0);
	assert_int_equal(kiln_json_get_number(j, "", "top_p", 0, 0, 1, &d, &e), 0); /* null */
	assert_int_equal(kiln_json_get_number(j, "", "model", 0, 0, 1, &d, &e), -EINVAL);
	assert_err(&e, "model: expected a number, got a string", "model");

	int64_t i = 16;
	assert_int_equal(kiln_json_get_int(j, "", "max_tokens", 0, 1, 4096, &i, &e), -EINVAL);
	assert_err(&e, "max_tokens: expected an integer, got a number", "max_tokens");
	assert_int_equal(kiln_json_get_int(j, "", "n", 0, 1, 8, &i, &e), 1); /* 2.0 counts */
	assert_int_equal(i, 2);
	assert_int_equal(kiln_json_get_int(j, "", "n", 0, 3, 8, &i, &e), -EINVAL);
	assert_err(&e, "n: must be between 3 and 8, got 2", "n");
	assert_int_equal(kiln_json_get_int(j, "", "stream", 0, 3, 8, &i, &e), -EINVAL);
	assert_err(&e, "stream: expected an integer, got a string", "stream");

	bool b = false;
	assert_int_equal(kiln_json_get_bool(j, "", "stream", 0, &b, &e), -EINVAL);
	assert_err(&e, "stream: expected a boolean, got a string", "stream");
	assert_int_equal(kiln_json_get_bool(j, "", "echo", 0, &b, &e), 0);

	/* arrays of objects, with element paths */
	json_t *msgs = NULL;
	assert_int_equal(
		kiln_json_get_objects(j, "", "messages", KILN_JSON_REQUIRED, 1, 100, &msgs, &e),
		-EINVAL);
	assert_err(&e, "messages[3]: expected an object, got a number", "messages[3]");
	assert_null(msgs);
	assert_int_equal(kiln_json_get_objects(j, "", "messages", 0, 1, 2, &msgs, &e), -EINVAL);
	assert_err(&e, "messages: expected at most 2 items, got 4", "messages");
	assert_int_equal(kiln_json_get_objects(j, "", "logit_bias", 0, 1, 2, &msgs, &e), -EINVAL);
	assert_err(&e, "logit_bias: expected at least 1 item, got 0", "logit_bias");
	assert_int_equal(kiln_json_get_objects(j, "", "model", 0, 1, 2, &msgs, &e), -EINVAL);
	assert_err(&e, "model: expected an array of objects, got a string", "model");

	/* walk the elements the way inferd will */
	json_t *arr = json_object_get(j, "messages");
	static const char *const roles[] = { "system", "user", "assistant", NULL };
	char where[KILN_JSON_PATH_MAX];
	int role = -1;
	json_t *m0 = json_array_get(arr, 0);
	kiln_json_path(where, sizeof(where), "messages", NULL, 0);
	assert_string_equal(where, "messages[0]");
	assert_int_equal(
		kiln_json_get_enum(m0, where, "role", KILN_JSON_REQUIRED, roles, &role, &e), 1);
	assert_int_equal(role, 1);
	json_t *m1 = json_array_get(arr, 1);
	kiln_json_path(where, sizeof(where), "messages", NULL, 1);
	assert_int_equal(
		kiln_json_get_enum(m1, where, "role", KILN_JSON_REQUIRED, roles, &role, &e),
		-EINVAL);
	assert_err(&e, "messages[1].role: expected one of 'system', 'user', 'assistant', got 'bot'",
		   "messages[1].role");
	json_t *m2 = json_array_get(arr, 2);
	kiln_json_path(where, sizeof(where), "messages", NULL, 2);
	assert_int_equal(kiln_json_get_string(m2, where, "content", KILN_JSON_REQUIRED, 0, &s, &e),
			 -EINVAL);
	assert_err(&e, "messages[2].content: expected a string, got a number",
		   "messages[2].content");
	assert_int_equal(kiln_json_get_string(m2, where, "name", KILN_JSON_REQUIRED, 0, &s, &e),
			 -EINVAL);
	assert_err(&e, "messages[2].name: required field is missing", "messages[2].name");

	/* string or array of strings */
	const char **v = NULL;
	assert_int_equal(kiln_json_get_strings(j, "", "stop", 0, 0, 4, 0, &v, &e), -EINVAL);
	assert_err(&e, "stop[1]: expected a string, got a number", "stop[1]");
	assert_int_equal(kiln_json_get_strings(j, "", "prompt", 0, 1, 4, 0, &v, &e), 1);
	assert_string_equal(v[0], "p");
	assert_null(v[1]);
	free(v);
	assert_int_equal(kiln_json_get_strings(j, "", "tags", 0, 1, 4, 0, &v, &e), 1);
	assert_string_equal(v[0], "t1");
	assert_string_equal(v[1], "t2");
	assert_null(v[2]);
	free(v);
	v = NULL;
	assert_int_equal(kiln_json_get_strings(j, "", "tags", 0, 1, 1, 0, &v, &e), -EINVAL);
	assert_err(&e, "tags: expected 1 item, got 2", "tags");
	assert_int_equal(kiln_json_get_strings(j, "", "tags", 0, 1, 4, 1, &v, &e), -EINVAL);
	assert_err(&e, "tags[0]: too long (2 bytes, at most 1)", "tags[0]");
	assert_int_equal(kiln_json_get_strings(j, "", "n", 0, 1, 4, 0, &v, &e), -EINVAL);
	assert_err(&e, "n: expected a string or an array of strings, got a number", "n");
	assert_null(v);

	/* objects */
	json_t *o = NULL;
	assert_int_equal(kiln_json_get_object(j, "", "logit_bias", 0, &o, &e), -EINVAL);
	assert_err(&e, "logit_bias: expected an object, got an array", "logit_bias");
	assert_int_equal(kiln_json_get_object(j, "", "response_format", 0, &o, &e), 0);
	assert_null(o);
}

static void test_keys_and_paths(void **state)
{
	_cleanup_json_ json_t *j = parse("{\"model\": \"m\", \"temprature\": 1, \"zzz\": 2}");
	kiln_error e;
	static const char *const known[] = { "model", "temperature", "top_p", NULL };
	assert_int_equal(kiln_json_check_keys(j, "", known, &e), -EINVAL);
	assert_err(&e, "temprature: unknown field (did you mean 'temperature'?)", "temprature");
	json_object_del(j, "temprature");
	assert_int_equal(kiln_json_check_keys(j, "", known, &e), -EINVAL);
	assert_err(&e, "zzz: unknown field", "zzz");
	json_object_del(j, "zzz");
	assert_int_equal(kiln_json_check_keys(j, "", known, &e), 0);

	_cleanup_json_ json_t *k = parse("{\"a\": {\"rol\": 1}}");
	static const char *const mk[] = { "role", "content", NULL };
	assert_int_equal(kiln_json_check_keys(json_object_get(k, "a"), "messages[0]", mk, &e),
			 -EINVAL);
	assert_err(&e, "messages[0].rol: unknown field (did you mean 'role'?)", "messages[0].rol");

	/* long paths are cut, and say so */
	char buf[16];
	assert_string_equal(kiln_json_path(buf, sizeof(buf), "aaaaaaaaaa", "bbbbbbbbbb", 0),
			    "aaaaaaaaaa.b...");
	assert_string_equal(kiln_json_path(buf, sizeof(buf), "", "k", 0), "k");
	assert_string_equal(kiln_json_path(buf, sizeof(buf), "x", NULL, 12), "x[12]");

	/* a getter on something that is not an object */
	const char *s;
	_cleanup_json_ json_t *arr = parse("[1]");
	assert_int_equal(kiln_json_get_string(arr, "a", "b", 0, 0, &s, &e), -EINVAL);
	assert_err(&e, "a.b: expected an object around this field", "a.b");

	/* type names */
	_cleanup_json_ json_t *all = parse("[{}, [], \"s\", 1, 1.5, true, null]");
	static const char *const names[] = { "an object", "an array",  "a string", "a number",
					     "a number",  "a boolean", "null" };
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		assert_string_equal(kiln_json_type_name(json_array_get(all, i)), names[i]);

	/* a long client value in an enum error is cut */
	_cleanup_json_ json_t *r =
		parse("{\"role\": \"0123456789012345678901234567890123456789\"}");
	static const char *const roles[] = { "user", NULL };
	int idx;
	assert_int_equal(kiln_json_get_enum(r, "", "role", 0, roles, &idx, &e), -EINVAL);
	assert_err(&e, "role: expected one of 'user', got '01234567890123456789012345678901...'",
		   "role");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_getters),
		cmocka_unit_test(test_keys_and_paths),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
