/* fuzz-json.c — libFuzzer target for the JSON glue (kiln/json.h).
 *
 * Request bodies come straight from the network, so parsing and validation
 * must survive anything: no crash, leak, hang or undefined behaviour.  Each
 * input is parsed as an object and, when it parses, validated the way
 * kiln-inferd validates a chat completion request, with every getter.  It
 * also checks invariants: a failure always has a message; a parse failure
 * has a line:column when jansson saw the input, and kiln_json_parse agrees
 * with plain jansson except where our depth limit refused the input.  Built
 * with clang -fsanitize=fuzzer,address,undefined by common/build.mk; run
 * 60 s by tests/fuzz/fuzz-json.sh (make test-full). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(int r, const kiln_error *e)
{
	if (r == -EINVAL && (!e->msg[0] || strlen(e->msg) >= KILN_JSON_MESSAGE_MAX))
		abort();
	/* a field error names its field first */
	if (r == -EINVAL && e->where[0] && strncmp(e->msg, e->where, strlen(e->where)) != 0 &&
	    strlen(e->where) < 60)
		abort();
}

static void validate_message(json_t *m, const char *where)
{
	static const char *const roles[] = { "system", "user", "assistant", "tool", NULL };
	static const char *const keys[] = { "role", "content", "name", NULL };
	kiln_error e;
	int role = 0;
	const char *s = NULL;
	check_error(kiln_json_check_keys(m, where, keys, &e), &e);
	check_error(kiln_json_get_enum(m, where, "role", KILN_JSON_REQUIRED, roles, &role, &e), &e);
	check_error(kiln_json_get_string(m, where, "content", KILN_JSON_REQUIRED, 1 << 16, &s, &e),
		    &e);
	check_error(kiln_json_get_string(m, where, "name", 0, 64, &s, &e), &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_error e;
	json_t *j = NULL;
	int r = kiln_json_parse_object((const char *) data, size, &j, &e);
	check_error(r, &e);
	if (r < 0) {
		/* jansson alone: it may accept what our depth limit refused */
		json_error_t je;
		json_t *plain = json_loadb((const char *) data, size, JSON_DECODE_ANY, &je);
		if (plain && json_is_object(plain) && !strstr(e.msg, "nested deeper"))
			abort();
		if (!plain && e.line <= 0 && !strstr(e.msg, "empty"))
			abort();
		json_decref(plain);
		return 0;
	}
	static const char *const keys[] = { "model",	  "messages", "temperature", "top_p",
					    "max_tokens", "stream",   "stop",	     "n",
					    "user",	  "prompt",   NULL };
	const char *model = NULL;
	double t = 1;
	int64_t mt = 16;
	bool stream = false;
	json_t *msgs = NULL;
	const char **stop = NULL;
	check_error(kiln_json_check_keys(j, "", keys, &e), &e);
	check_error(kiln_json_get_string(j, "", "model", KILN_JSON_REQUIRED, 256, &model, &e), &e);
	check_error(kiln_json_get_number(j, "", "temperature", 0, 0, 2, &t, &e), &e);
	check_error(kiln_json_get_number(j, "", "top_p", 0, 0, 1, &t, &e), &e);
	check_error(kiln_json_get_int(j, "", "max_tokens", 0, 1, 1 << 20, &mt, &e), &e);
	check_error(kiln_json_get_int(j, "", "n", 0, 1, 8, &mt, &e), &e);
	check_error(kiln_json_get_bool(j, "", "stream", 0, &stream, &e), &e);
	r = kiln_json_get_strings(j, "", "stop", 0, 0, 4, 64, &stop, &e);
	check_error(r, &e);
	free(stop);
	stop = NULL;
	r = kiln_json_get_strings(j, "", "prompt", 0, 1, 16, 0, &stop, &e);
	check_error(r, &e);
	free(stop);
	json_t *o = NULL;
	check_error(kiln_json_get_object(j, "", "user", 0, &o, &e), &e);
	r = kiln_json_get_objects(j, "", "messages", KILN_JSON_REQUIRED, 1, 1024, &msgs, &e);
	check_error(r, &e);
	if (r > 0) {
		size_t i;
		json_t *m;
		json_array_foreach(msgs, i, m)
		{
			char where[KILN_JSON_PATH_MAX];
			validate_message(m,
					 kiln_json_path(where, sizeof(where), "messages", NULL, i));
		}
	}
	json_decref(j);
	return 0;
}
