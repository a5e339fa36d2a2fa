/* kiln/json.h — JSON glue on jansson for validating requests.
 *
 * kiln-inferd validates OpenAI request bodies with these: a parser that
 * reports "line L, column C" for malformed JSON and refuses over-deep or
 * over-long input, and typed getters whose errors name the offending field
 * by its path, e.g.
 *
 *     messages[2].content: expected a string, got a number
 *
 * with the path ("messages[2].content") also in err->where, which is what
 * OpenAI's error shape calls "param".  Every getter takes the object, the
 * path of that object ("" for the request root, "messages[2]" for an
 * element), and the key.  Optional fields that are absent or null leave the
 * output untouched (so callers preset defaults) and return 0; present ones
 * return 1.  Errors return -EINVAL (with err filled) and leave outputs
 * untouched.  Strings returned point into the json_t and live as long as it
 * does. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kiln/macro.h"

/* Bodies bigger than this are refused before parsing (same reason as
 * KILN_HTTP_BODY_MAX_DEFAULT: nothing legitimate comes close). */
#define KILN_JSON_SIZE_MAX ((size_t) 4 << 20)
/* Nesting deeper than this is refused before jansson sees it: no OpenAI
 * request nests more than ~6 levels, and jansson recurses per level. */
#define KILN_JSON_DEPTH_MAX 64
/* Paths in messages are cut at this length ("..." marks the cut), and
 * messages at KILN_JSON_MESSAGE_MAX (the same).  The errors are kiln_errors
 * (kiln/error.h): msg "path: what is wrong", where the path ("" when not
 * about a field), line and column 1-based for malformed JSON (else 0), code
 * -EINVAL; no file or offset. */
#define KILN_JSON_PATH_MAX    KILN_ERROR_WHERE_MAX
#define KILN_JSON_MESSAGE_MAX 320

/* Flags for the getters. */
enum {
	KILN_JSON_REQUIRED = 1 << 0, /* absent or null is an error */
};

/* jansson's own json_decrefp (GCC/clang) releases a json_t * at scope end. */
#define _cleanup_json_ _cleanup_(json_decrefp)

/* Parses len bytes (any JSON value).  Errors (-EINVAL, err filled):
 * empty input, over KILN_JSON_SIZE_MAX, nested deeper than
 * KILN_JSON_DEPTH_MAX, malformed ("invalid JSON at line 1, column 9: ...").
 * -ENOMEM. */
int kiln_json_parse(const char *data, size_t len, json_t **ret, kiln_error *err);
/* The same, and the value must be an object ("expected a JSON object, got
 * an array"). */
int kiln_json_parse_object(const char *data, size_t len, json_t **ret, kiln_error *err);

/* "an object", "an array", "a string", "an integer", "a number",
 * "a boolean", "null". */
const char *kiln_json_type_name(const json_t *v);
/* Writes "where.key" (or "key" when where is ""), or "where[index]" when
 * key is NULL, into buf (cut with "..." when too long); returns buf. */
char *kiln_json_path(char *buf, size_t size, const char *where, const char *key, size_t index);

/* Fills err (msg "path: <fmt>", where path) and returns -EINVAL. */
int kiln_json_fail(kiln_error *err, const char *path, const char *fmt, ...) _printf_(3, 4);

/* Refuses keys of obj not in known (NULL-terminated):
 * "temprature: unknown field (did you mean 'temperature'?)".  Call it where
 * unknown fields must not pass silently; skip it where they may. */
int kiln_json_check_keys(const json_t *obj, const char *where, const char *const *known,
			 kiln_error *err);

/* A string of at most max_len bytes (0: any length). */
int kiln_json_get_string(const json_t *obj, const char *where, const char *key, unsigned flags,
			 size_t max_len, const char **ret, kiln_error *err);
/* A string that is one of choices (NULL-terminated); *ret its index. */
int kiln_json_get_enum(const json_t *obj, const char *where, const char *key, unsigned flags,
		       const char *const *choices, int *ret, kiln_error *err);
/* Any number (integer or real) within [lo, hi]. */
int kiln_json_get_number(const json_t *obj, const char *where, const char *key, unsigned flags,
			 double lo, double hi, double *ret, kiln_error *err);
/* An integer within [lo, hi] (a real with an integral value counts). */
int kiln_json_get_int(const json_t *obj, const char *where, const char *key, unsigned flags,
		      int64_t lo, int64_t hi, int64_t *ret, kiln_error *err);
int kiln_json_get_bool(const json_t *obj, const char *where, const char *key, unsigned flags,
		       bool *ret, kiln_error *err);
/* An object. */
int kiln_json_get_object(const json_t *obj, const char *where, const char *key, unsigned flags,
			 json_t **ret, kiln_error *err);
/* An array of min..max objects (every element checked:
 * "messages[2]: expected an object, got a string"). */
int kiln_json_get_objects(const json_t *obj, const char *where, const char *key, unsigned flags,
			  size_t min, size_t max, json_t **ret, kiln_error *err);
/* A string, or an array of min..max strings (OpenAI's "prompt", "stop"):
 * *ret is a NULL-terminated array of pointers into the JSON (free() it);
 * each string at most max_len bytes (0: any). */
int kiln_json_get_strings(const json_t *obj, const char *where, const char *key, unsigned flags,
			  size_t min, size_t max, size_t max_len, const char ***ret,
			  kiln_error *err);
