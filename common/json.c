/* json.c — JSON parsing with positions and typed, path-aware getters
 * (see kiln/json.h).
 *
 * jansson does the parsing; we add what request validation needs: a cheap
 * pre-scan that refuses over-deep nesting with a line:column before
 * jansson recurses into it, and errors phrased "path: problem" so a client
 * learns which field of a big request is wrong. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kiln/json.h"
#include "kiln/parse.h"

int kiln_json_fail(kiln_error *err, const char *path, const char *fmt, ...)
{
	if (!err)
		return -EINVAL;
	char what[KILN_JSON_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	kiln_error_reset(err, NULL);
	err->code = -EINVAL;
	int n = snprintf(err->where, sizeof(err->where), "%s", path ?: "");
	if (path && *path)
		n = snprintf(err->msg, KILN_JSON_MESSAGE_MAX, "%s: %s", path, what);
	else
		n = snprintf(err->msg, KILN_JSON_MESSAGE_MAX, "%s", what);
	if (n >= KILN_JSON_MESSAGE_MAX) /* cut: say so */
		memcpy(err->msg + KILN_JSON_MESSAGE_MAX - 4, "...", 4);
	return -EINVAL;
}

static int fail_at(kiln_error *err, int line, int column, const char *what)
{
	kiln_json_fail(err, "", "invalid JSON at line %d, column %d: %s", line, column, what);
	err->line = line;
	err->column = column;
	return -EINVAL;
}

/* Refuses nesting deeper than KILN_JSON_DEPTH_MAX, counting brackets
 * outside strings.  Columns count characters (UTF-8 continuation bytes do
 * not start one), as jansson's do. */
static int check_depth(const char *p, size_t len, kiln_error *err)
{
	int depth = 0, line = 1, column = 0;
	bool in_string = false, escaped = false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char) p[i];
		if ((c & 0xc0) != 0x80)
			column++;
		if (c == '\n') {
			line++;
			column = 0;
		}
		if (in_string) {
			if (escaped)
				escaped = false;
			else if (c == '\\')
				escaped = true;
			else if (c == '"')
				in_string = false;
			continue;
		}
		if (c == '"')
			in_string = true;
		else if (c == '[' || c == '{') {
			if (++depth > KILN_JSON_DEPTH_MAX) {
				char what[64];
				snprintf(what, sizeof(what), "nested deeper than %d levels",
					 KILN_JSON_DEPTH_MAX);
				return fail_at(err, line, column, what);
			}
		} else if (c == ']' || c == '}')
			depth--;
	}
	return 0;
}

int kiln_json_parse(const char *data, size_t len, json_t **ret, kiln_error *err)
{
	assert_return(ret && err && (data || len == 0), -EINVAL);
	if (len > KILN_JSON_SIZE_MAX)
		return kiln_json_fail(err, "", "request body too large: %zu bytes, at most %zu",
				      len, KILN_JSON_SIZE_MAX);
	size_t i = 0;
	while (i < len && strchr(" \t\r\n", data[i]) && data[i])
		i++;
	if (i == len)
		return kiln_json_fail(err, "", "request body is empty: expected JSON");
	int r = check_depth(data, len, err);
	if (r < 0)
		return r;
	json_error_t je;
	json_t *v = json_loadb(data, len, JSON_DECODE_ANY, &je);
	if (!v) {
		if (json_error_code(&je) == json_error_out_of_memory)
			return -ENOMEM;
		return fail_at(err, MAX(je.line, 1), MAX(je.column, 1), je.text);
	}
	*ret = v;
	return 0;
}

int kiln_json_parse_object(const char *data, size_t len, json_t **ret, kiln_error *err)
{
	json_t *v = NULL;
	int r = kiln_json_parse(data, len, &v, err);
	if (r < 0)
		return r;
	if (!json_is_object(v)) {
		r = kiln_json_fail(err, "", "expected a JSON object, got %s",
				   kiln_json_type_name(v));
		json_decref(v);
		return r;
	}
	*ret = v;
	return 0;
}

const char *kiln_json_type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
	case JSON_REAL:
		return "a number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	case JSON_NULL:
	default:
		return "null";
	}
}

char *kiln_json_path(char *buf, size_t size, const char *where, const char *key, size_t index)
{
	if (!buf || size == 0)
		return buf;
	where = where ?: "";
	int n;
	if (key)
		n = snprintf(buf, size, "%s%s%s", where, *where ? "." : "", key);
	else
		n = snprintf(buf, size, "%s[%zu]", where, index);
	if (n >= 0 && (size_t) n >= size && size > 4)
		memcpy(buf + size - 4, "...", 4);
	return buf;
}

int kiln_json_check_keys(const json_t *obj, const char *where, const char *const *known,
			 kiln_error *err)
{
	assert_return(obj && known && err, -EINVAL);
	const char *key;
	json_t *v;
	json_object_foreach((json_t *) obj, key, v)
	{
		bool ok = false;
		const char *best = NULL;
		size_t best_d = SIZE_MAX;
		for (const char *const *k = known; *k; k++) {
			if (streq(*k, key)) {
				ok = true;
				break;
			}
			size_t d = kiln_levenshtein_exact(key, *k);
			if (d < best_d) {
				best_d = d;
				best = *k;
			}
		}
		if (ok)
			continue;
		char path[KILN_JSON_PATH_MAX];
		kiln_json_path(path, sizeof(path), where, key, 0);
		if (best && best_d <= MAX((size_t) 2, strlen(best) / 3))
			return kiln_json_fail(err, path, "unknown field (did you mean '%s'?)",
					      best);
		return kiln_json_fail(err, path, "unknown field");
	}
	return 0;
}

/* Looks key up: 0 absent/null (error when required), 1 found. */
static int lookup(const json_t *obj, const char *key, unsigned flags, const char *path,
		  const char *expected, json_t **ret, kiln_error *err)
{
	if (!json_is_object(obj))
		return kiln_json_fail(err, path, "expected an object around this field");
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (!(flags & KILN_JSON_REQUIRED))
			return 0;
		if (!v)
			return kiln_json_fail(err, path, "required field is missing");
		return kiln_json_fail(err, path, "expected %s, got null", expected);
	}
	*ret = v;
	return 1;
}

int kiln_json_get_string(const json_t *obj, const char *where, const char *key, unsigned flags,
			 size_t max_len, const char **ret, kiln_error *err)
{
	assert_return(obj && key && ret && err, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "a string", &v, err);
	if (r <= 0)
		return r;
	if (!json_is_string(v))
		return kiln_json_fail(err, path, "expected a string, got %s",
				      kiln_json_type_name(v));
	size_t n = json_string_length(v);
	if (max_len && n > max_len)
		return kiln_json_fail(err, path, "too long (%zu bytes, at most %zu)", n, max_len);
	*ret = json_string_value(v);
	return 1;
}

int kiln_json_get_enum(const json_t *obj, const char *where, const char *key, unsigned flags,
		       const char *const *choices, int *ret, kiln_error *err)
{
	assert_return(choices && ret, -EINVAL);
	const char *s = NULL;
	int r = kiln_json_get_string(obj, where, key, flags, 0, &s, err);
	if (r <= 0)
		return r;
	char list[192] = "";
	size_t used = 0;
	for (int i = 0; choices[i]; i++) {
		if (streq(choices[i], s)) {
			*ret = i;
			return 1;
		}
		int n = snprintf(list + used, sizeof(list) - used, "%s'%s'", i ? ", " : "",
				 choices[i]);
		if (n > 0)
			used = MIN(used + (size_t) n, sizeof(list) - 1);
	}
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	/* the value is the client's: cut it so the message stays readable */
	return kiln_json_fail(err, path, "expected one of %s, got '%.32s%s'", list, s,
			      strlen(s) > 32 ? "..." : "");
}

int kiln_json_get_number(const json_t *obj, const char *where, const char *key, unsigned flags,
			 double lo, double hi, double *ret, kiln_error *err)
{
	assert_return(obj && key && ret && err, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "a number", &v, err);
	if (r <= 0)
		return r;
	if (!json_is_number(v))
		return kiln_json_fail(err, path, "expected a number, got %s",
				      kiln_json_type_name(v));
	double d = json_number_value(v);
	if (!(d >= lo && d <= hi))
		return kiln_json_fail(err, path, "must be between %g and %g, got %g", lo, hi, d);
	*ret = d;
	return 1;
}

int kiln_json_get_int(const json_t *obj, const char *where, const char *key, unsigned flags,
		      int64_t lo, int64_t hi, int64_t *ret, kiln_error *err)
{
	assert_return(obj && key && ret && err, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "an integer", &v, err);
	if (r <= 0)
		return r;
	int64_t x;
	if (json_is_integer(v))
		x = json_integer_value(v);
	else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
		 fabs(json_real_value(v)) < 9.0e15)
		x = (int64_t) json_real_value(v);
	else
		return kiln_json_fail(err, path, "expected an integer, got %s",
				      kiln_json_type_name(v));
	if (x < lo || x > hi)
		return kiln_json_fail(err, path, "must be between %lld and %lld, got %lld",
				      (long long) lo, (long long) hi, (long long) x);
	*ret = x;
	return 1;
}

int kiln_json_get_bool(const json_t *obj, const char *where, const char *key, unsigned flags,
		       bool *ret, kiln_error *err)
{
	assert_return(obj && key && ret && err, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "a boolean", &v, err);
	if (r <= 0)
		return r;
	if (!json_is_boolean(v))
		return kiln_json_fail(err, path, "expected a boolean, got %s",
				      kiln_json_type_name(v));
	*ret = json_is_true(v);
	return 1;
}

int kiln_json_get_object(const json_t *obj, const char *where, const char *key, unsigned flags,
			 json_t **ret, kiln_error *err)
{
	assert_return(obj && key && ret && err, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "an object", &v, err);
	if (r <= 0)
		return r;
	if (!json_is_object(v))
		return kiln_json_fail(err, path, "expected an object, got %s",
				      kiln_json_type_name(v));
	*ret = v;
	return 1;
}

static int check_count(const char *path, size_t n, size_t min, size_t max, kiln_error *err)
{
	if (n >= min && n <= max)
		return 0;
	if (min == max)
		return kiln_json_fail(err, path, "expected %zu item%s, got %zu", min,
				      min == 1 ? "" : "s", n);
	if (n < min)
		return kiln_json_fail(err, path, "expected at least %zu item%s, got %zu", min,
				      min == 1 ? "" : "s", n);
	return kiln_json_fail(err, path, "expected at most %zu item%s, got %zu", max,
			      max == 1 ? "" : "s", n);
}

int kiln_json_get_objects(const json_t *obj, const char *where, const char *key, unsigned flags,
			  size_t min, size_t max, json_t **ret, kiln_error *err)
{
	assert_return(obj && key && ret && err && min <= max, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "an array of objects", &v, err);
	if (r <= 0)
		return r;
	if (!json_is_array(v))
		return kiln_json_fail(err, path, "expected an array of objects, got %s",
				      kiln_json_type_name(v));
	r = check_count(path, json_array_size(v), min, max, err);
	if (r < 0)
		return r;
	size_t i;
	json_t *e;
	json_array_foreach(v, i, e) if (!json_is_object(e))
	{
		char epath[KILN_JSON_PATH_MAX];
		kiln_json_path(epath, sizeof(epath), path, NULL, i);
		return kiln_json_fail(err, epath, "expected an object, got %s",
				      kiln_json_type_name(e));
	}
	*ret = v;
	return 1;
}

int kiln_json_get_strings(const json_t *obj, const char *where, const char *key, unsigned flags,
			  size_t min, size_t max, size_t max_len, const char ***ret,
			  kiln_error *err)
{
	assert_return(obj && key && ret && err && min <= max, -EINVAL);
	char path[KILN_JSON_PATH_MAX];
	kiln_json_path(path, sizeof(path), where, key, 0);
	json_t *v;
	int r = lookup(obj, key, flags, path, "a string or an array of strings", &v, err);
	if (r <= 0)
		return r;
	if (json_is_string(v)) {
		size_t n = json_string_length(v);
		if (max_len && n > max_len)
			return kiln_json_fail(err, path, "too long (%zu bytes, at most %zu)", n,
					      max_len);
		r = check_count(path, 1, min, max, err);
		if (r < 0)
			return r;
		const char **out = calloc(2, sizeof(*out));
		if (!out)
			return -ENOMEM;
		out[0] = json_string_value(v);
		*ret = out;
		return 1;
	}
	if (!json_is_array(v))
		return kiln_json_fail(err, path, "expected a string or an array of strings, got %s",
				      kiln_json_type_name(v));
	r = check_count(path, json_array_size(v), min, max, err);
	if (r < 0)
		return r;
	size_t i;
	json_t *e;
	json_array_foreach(v, i, e)
	{
		char epath[KILN_JSON_PATH_MAX];
		if (!json_is_string(e))
			return kiln_json_fail(err,
					      kiln_json_path(epath, sizeof(epath), path, NULL, i),
					      "expected a string, got %s", kiln_json_type_name(e));
		if (max_len && json_string_length(e) > max_len)
			return kiln_json_fail(err,
					      kiln_json_path(epath, sizeof(epath), path, NULL, i),
					      "too long (%zu bytes, at most %zu)",
					      json_string_length(e), max_len);
	}
	const char **out = calloc(json_array_size(v) + 1, sizeof(*out));
	if (!out)
		return -ENOMEM;
	json_array_foreach(v, i, e) out[i] = json_string_value(e);
	*ret = out;
	return 1;
}
