/* kiln-model.c — `kiln model inspect FILE [--json]`: what is in a model file.
 *
 * Opens a safetensors, GGUF or llama2.c file with libkmf (format by
 * content) and prints its format, metadata and tensor table, or the same
 * as one JSON object with --json (for scripts: jq '.tensors[].name').  A
 * file libkmf refuses is reported as FILE: byte N: tensor 'T': what is
 * wrong, and exits 1; usage errors exit 2.  It also shows the km_config
 * km_file_open derives (the model kiln-inferd would build), or why the
 * file cannot be loaded as a model; that is information, not a failure.  Kept apart from kiln.c,
 * which only dispatches "model" here. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln-verbs.h"
#include "kiln/log.h"
#include "kiln/macro.h"
#include "kmf.h"
#include "kmodel.h"

/* Items of an array shown in the text view (--json prints all). */
#define TEXT_ARRAY_ITEMS 8

static void shape_str(const kmf_tensor *t, char *buf, size_t len)
{
	size_t o = (size_t) snprintf(buf, len, "[");
	for (int d = 0; d < t->ndim && o < len; d++)
		o += (size_t) snprintf(buf + o, len - o, "%s%lld", d ? ", " : "",
				       (long long) t->shape[d]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

/* One array item as JSON. */
static json_t *item_json(kmf_vtype et, const void *items, uint64_t i)
{
	switch (et) {
	case KMF_V_U8:
		return json_integer(((const uint8_t *) items)[i]);
	case KMF_V_I8:
		return json_integer(((const int8_t *) items)[i]);
	case KMF_V_U16:
		return json_integer(((const uint16_t *) items)[i]);
	case KMF_V_I16:
		return json_integer(((const int16_t *) items)[i]);
	case KMF_V_U32:
		return json_integer(((const uint32_t *) items)[i]);
	case KMF_V_I32:
		return json_integer(((const int32_t *) items)[i]);
	case KMF_V_F32:
		return json_real(((const float *) items)[i]);
	case KMF_V_BOOL:
		return json_boolean(((const uint8_t *) items)[i]);
	case KMF_V_STRING: {
		const kmf_str *s = &((const kmf_str *) items)[i];
		return json_stringn_nocheck(s->s, s->len);
	}
	case KMF_V_U64:
		return json_integer((json_int_t) ((const uint64_t *) items)[i]);
	case KMF_V_I64:
		return json_integer(((const int64_t *) items)[i]);
	case KMF_V_F64:
		return json_real(((const double *) items)[i]);
	default:
		return json_null();
	}
}

static json_t *meta_json(const kmf_meta *m)
{
	switch (m->type) {
	case KMF_V_U8:
	case KMF_V_U16:
	case KMF_V_U32:
	case KMF_V_U64:
		/* above INT64_MAX: as a string, JSON integers being int64 in jansson */
		if (m->u > INT64_MAX) {
			char b[32];
			snprintf(b, sizeof(b), "%llu", (unsigned long long) m->u);
			return json_string(b);
		}
		return json_integer((json_int_t) m->u);
	case KMF_V_I8:
	case KMF_V_I16:
	case KMF_V_I32:
	case KMF_V_I64:
		return json_integer(m->i);
	case KMF_V_F32:
	case KMF_V_F64:
		return json_real(m->f);
	case KMF_V_BOOL:
		return json_boolean(m->b);
	case KMF_V_STRING:
		return json_stringn_nocheck(m->str.s, m->str.len);
	case KMF_V_ARRAY: {
		json_t *a = json_array();
		for (uint64_t i = 0; a && i < m->arr.n; i++)
			json_array_append_new(a, item_json(m->arr.etype, m->arr.items, i));
		return a;
	}
	default:
		return json_null();
	}
}

static const char *rope_name(kk_rope_mode m)
{
	return m == KK_ROPE_HALF ? "half" : "interleaved";
}

/* A float as the shortest decimal that reads back as it (1e-05, not
 * 9.99999974e-06). */
static double short_real(float v)
{
	char buf[32];
	for (int p = 6; p < 9; p++) {
		snprintf(buf, sizeof(buf), "%.*g", p, (double) v);
		if ((float) strtod(buf, NULL) == v)
			break;
	}
	return strtod(buf, NULL);
}

/* The model km_file_open derives from the file, as JSON: the config, or
 * {"error": why it cannot be loaded}. */
static json_t *model_json(const char *path)
{
	kiln_error err = {};
	km_file *m = NULL;
	if (km_file_open(path, &m, &err) < 0)
		return json_pack("{s:s}", "error", err.msg);
	const km_config *c = km_file_config(m);
	json_t *j = json_pack(
		"{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:s, s:b}", "kind",
		km_file_kind_name(km_file_kind_of(m)), "dim", c->dim, "hidden_dim", c->hidden_dim,
		"n_layers", c->n_layers, "n_heads", c->n_heads, "n_kv_heads", c->n_kv_heads,
		"head_dim", c->head_dim, "vocab_size", c->vocab_size, "max_seq_len", c->max_seq_len,
		"norm_eps", short_real(c->norm_eps), "rope_theta", short_real(c->rope_theta),
		"rope_mode", rope_name(c->rope_mode), "shared_classifier", c->shared_classifier);
	km_file_free(m);
	return j;
}

static void print_model(const char *path, FILE *out)
{
	kiln_error err = {};
	km_file *m = NULL;
	if (km_file_open(path, &m, &err) < 0) {
		fprintf(out, "model: not loadable: %s\n", err.msg);
		return;
	}
	const km_config *c = km_file_config(m);
	fprintf(out,
		"model: %s: dim %d, hidden %d, %d layers, %d heads (%d kv, head_dim %d), vocab %d, "
		"context %d, norm_eps %g, rope_theta %g, rope %s, %s classifier\n",
		km_file_kind_name(km_file_kind_of(m)), c->dim, c->hidden_dim, c->n_layers,
		c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->max_seq_len,
		(double) c->norm_eps, (double) c->rope_theta, rope_name(c->rope_mode),
		c->shared_classifier ? "shared" : "separate");
	km_file_free(m);
}

static int print_json(const char *path, const kmf_file *f, FILE *out)
{
	json_t *root = json_object(), *meta = json_object(), *tensors = json_array();
	char *s;
	if (!root || !meta || !tensors)
		return -ENOMEM;
	json_object_set_new(root, "file", json_string(path));
	json_object_set_new(root, "format", json_string(kmf_format_name(kmf_file_format(f))));
	json_object_set_new(root, "version", json_integer(kmf_file_version(f)));
	json_object_set_new(root, "model", model_json(path));
	for (size_t i = 0; i < kmf_meta_count(f); i++) {
		const kmf_meta *m = kmf_meta_at(f, i);
		json_object_set_new(meta, m->key, meta_json(m));
	}
	json_object_set_new(root, "metadata", meta);
	for (size_t i = 0; i < kmf_tensor_count(f); i++) {
		const kmf_tensor *t = kmf_tensor_at(f, i);
		json_t *shape = json_array();
		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->shape[d]));
		json_array_append_new(tensors,
				      json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", t->name,
						"dtype", kmf_dtype_name(t->dtype), "shape", shape,
						"offset", (json_int_t) t->offset, "bytes",
						(json_int_t) t->nbytes));
	}
	json_object_set_new(root, "tensors", tensors);
	s = json_dumps(root, JSON_INDENT(2) | JSON_ENSURE_ASCII);
	json_decref(root);
	if (!s)
		return -ENOMEM;
	fprintf(out, "%s\n", s);
	free(s);
	return 0;
}

static void print_value(const kmf_meta *m, FILE *out)
{
	json_t *v;
	char *s;
	if (m->type == KMF_V_ARRAY) {
		fprintf(out, "[%llu x %s:", (unsigned long long) m->arr.n,
			kmf_vtype_name(m->arr.etype));
		for (uint64_t i = 0; i < m->arr.n && i < TEXT_ARRAY_ITEMS; i++) {
			v = item_json(m->arr.etype, m->arr.items, i);
			s = json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
			fprintf(out, " %s", strna(s));
			free(s);
			json_decref(v);
		}
		fprintf(out, "%s]", m->arr.n > TEXT_ARRAY_ITEMS ? " ..." : "");
		return;
	}
	v = meta_json(m);
	s = json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
	fprintf(out, "%s (%s)", strna(s), kmf_vtype_name(m->type));
	free(s);
	json_decref(v);
}

static void print_text(const char *path, const kmf_file *f, FILE *out)
{
	uint64_t total = 0;
	for (size_t i = 0; i < kmf_tensor_count(f); i++)
		total += kmf_tensor_at(f, i)->nbytes;
	fprintf(out, "%s: %s", path, kmf_format_name(kmf_file_format(f)));
	if (kmf_file_version(f) > 0)
		fprintf(out, " v%d", kmf_file_version(f));
	fprintf(out, ", %zu tensors, %llu bytes of tensor data, %zu metadata entries\n",
		kmf_tensor_count(f), (unsigned long long) total, kmf_meta_count(f));
	print_model(path, out);
	if (kmf_meta_count(f)) {
		fprintf(out, "\nmetadata:\n");
		for (size_t i = 0; i < kmf_meta_count(f); i++) {
			const kmf_meta *m = kmf_meta_at(f, i);
			fprintf(out, "  %s = ", m->key);
			print_value(m, out);
			fprintf(out, "\n");
		}
	}
	fprintf(out, "\n%-48s %-6s %-22s %14s %12s\n", "tensor", "dtype", "shape", "offset",
		"bytes");
	for (size_t i = 0; i < kmf_tensor_count(f); i++) {
		const kmf_tensor *t = kmf_tensor_at(f, i);
		char shape[160];
		shape_str(t, shape, sizeof(shape));
		fprintf(out, "%-48s %-6s %-22s %14llu %12llu\n", t->name, kmf_dtype_name(t->dtype),
			shape, (unsigned long long) t->offset, (unsigned long long) t->nbytes);
	}
}

static bool arg_json;

static const kiln_option options[] = {
	KILN_OPTION_JSON_INTO(&arg_json),
	KILN_OPTIONS_COMMON,
	{},
};

const kiln_prog kiln_model_prog = {
	.name = "kiln model",
	.summary = "inspect model and checkpoint files",
	.usage = "kiln model inspect FILE [--json]   format, metadata and tensors of FILE, and\n"
		 "                                   the model config derived from it",
	.options = options,
	.epilog = "FILE may be safetensors, GGUF (v2, v3) or a llama2.c checkpoint; the format is\n"
		  "recognised by content.  Exit status: 0 success, 1 the file is refused or\n"
		  "unreadable, 2 usage error.  See docs/modelfile.md.\n",
	.args_complete = "inspect|file",
};

int kiln_model_main(int argc, char **argv)
{
	kmf_file *f = NULL;
	kiln_error e;
	char line[1024];
	if (argc - optind != 2 || !streq(argv[optind], "inspect"))
		return kiln_usage_exit(&kiln_model_prog,
				       "Usage: kiln model inspect FILE [--json].");
	int r = kmf_open(argv[optind + 1], &f, &e);
	if (r < 0) {
		log_error("%s", kiln_error_format(&e, line, sizeof(line)));
		return KILN_EXIT_FAILURE;
	}
	if (arg_json)
		r = print_json(argv[optind + 1], f, stdout);
	else
		print_text(argv[optind + 1], f, stdout);
	kmf_close(f);
	if (r < 0)
		return log_error_errno(r, "Failed to format the output: %m");
	return KILN_EXIT_OK;
}
