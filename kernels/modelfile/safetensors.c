/* safetensors.c — the safetensors reader.
 *
 * Layout (huggingface/safetensors, docs "format"): an 8-byte little-endian
 * header length N, N bytes of UTF-8 JSON (an object; it may be padded at
 * the end with spaces), then the byte buffer.  Each key but "__metadata__"
 * is a tensor {"dtype", "shape", "data_offsets": [begin, end)} with offsets
 * relative to the buffer.  The rules enforced here are the reference
 * implementation's: header at most KMF_MAX_HEADER_BYTES, a JSON object, no
 * duplicate keys, offsets inside the buffer and matching dtype x shape, and
 * the tensors covering the buffer exactly (no holes, no overlaps, nothing
 * after the last tensor).  Empty tensors (a dimension of 0) are allowed. */
#include <jansson.h>

#include "kmf_internal.h"

static const struct {
	const char *name;
	kmf_dtype dt;
} st_dtypes[] = {
	{ "F64", KMF_F64 },   { "F32", KMF_F32 },	  { "F16", KMF_F16 },
	{ "BF16", KMF_BF16 }, { "I64", KMF_I64 },	  { "I32", KMF_I32 },
	{ "I16", KMF_I16 },   { "I8", KMF_I8 },		  { "U64", KMF_U64 },
	{ "U32", KMF_U32 },   { "U16", KMF_U16 },	  { "U8", KMF_U8 },
	{ "BOOL", KMF_BOOL }, { "F8_E4M3", KMF_F8_E4M3 }, { "F8_E5M2", KMF_F8_E5M2 },
};

bool kmf__st_probe(const uint8_t *p, size_t n)
{
	/* The JSON text starts right after the length: '{', or '[' for a
	 * header that is JSON but not an object (refused by the parser with
	 * a precise error rather than "unknown format"). */
	return n >= 9 && (p[8] == '{' || p[8] == '[');
}

static void json_freep(json_t **j)
{
	json_decref(*j);
}

/* Best-effort file offset of a tensor's key in the header, for errors. */
static int64_t key_offset(const kmf_file *f, uint64_t hlen, const char *name)
{
	size_t nl = strlen(name);
	const uint8_t *h = f->base + 8, *end = h + hlen;
	for (const uint8_t *p = h; p + nl + 2 <= end; p++) {
		p = memchr(p, '"', (size_t) (end - p));
		if (!p || p + nl + 2 > end)
			break;
		if (memcmp(p + 1, name, nl) == 0 && p[nl + 1] == '"')
			return 8 + (p - h);
	}
	return 8;
}

static int parse_metadata(kmf_file *f, json_t *md, kiln_error *err)
{
	const char *key;
	json_t *v;
	if (!json_is_object(md))
		return kmf__fail(err, -EBADMSG, key_offset(f, kmf__ld64(f->base), "__metadata__"),
				 NULL, "\"__metadata__\" must be an object of strings");
	if (json_object_size(md) > KMF_MAX_META)
		return kmf__fail(err, -E2BIG, 8, NULL,
				 "\"__metadata__\" has %zu keys, above KMF_MAX_META (%d)",
				 json_object_size(md), KMF_MAX_META);
	json_object_foreach(md, key, v)
	{
		kmf_meta *m;
		size_t kl = strlen(key);
		if (!json_is_string(v))
			return kmf__fail(err, -EBADMSG, key_offset(f, kmf__ld64(f->base), key),
					 NULL,
					 "\"__metadata__\" value of '%s' is not a string (the "
					 "format allows only string values)",
					 key);
		if (kl > KMF_MAX_NAME || json_string_length(v) > KMF_MAX_STRING)
			return kmf__fail(err, -E2BIG, key_offset(f, kmf__ld64(f->base), key), NULL,
					 "\"__metadata__\" entry '%.64s' is too long", key);
		m = kmf__meta_add(f, key, kl);
		if (!m)
			return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
		m->type = KMF_V_STRING;
		m->str.len = json_string_length(v);
		m->str.s = kmf__strndup(f, json_string_value(v), m->str.len);
		if (!m->str.s)
			return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	}
	return 0;
}

static int parse_tensor(kmf_file *f, kmf_tensor *t, const char *name, json_t *v, uint64_t data_size,
			uint64_t *begin, kiln_error *err)
{
	int64_t at = 8; /* the caller puts the key's offset in err on failure */
	json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
	       *offs = json_object_get(v, "data_offsets");
	json_int_t b, e;
	size_t i;
	int r;

	if (strlen(name) > KMF_MAX_NAME)
		return kmf__fail(err, -E2BIG, at, NULL, "a tensor name is longer than %d bytes",
				 KMF_MAX_NAME);
	t->name = kmf__strndup(f, name, strlen(name));
	if (!t->name)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) ||
	    !json_is_array(offs))
		return kmf__fail(err, -EBADMSG, at, name,
				 "entry must be an object with \"dtype\" (string), \"shape\" "
				 "(array) and \"data_offsets\" (array)");
	t->dtype = KMF_DTYPE_MAX;
	for (i = 0; i < ARRAY_SIZE(st_dtypes); i++)
		if (streq(json_string_value(dt), st_dtypes[i].name))
			t->dtype = st_dtypes[i].dt;
	if (t->dtype == KMF_DTYPE_MAX)
		return kmf__fail(err, -EOPNOTSUPP, at, name,
				 "unknown dtype \"%.32s\" (kiln reads F64 F32 F16 BF16 I64 I32 I16 "
				 "I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2)",
				 json_string_value(dt));
	if (json_array_size(shape) > KMF_MAX_DIMS)
		return kmf__fail(err, -E2BIG, at, name, "shape has %zu dimensions, above %d",
				 json_array_size(shape), KMF_MAX_DIMS);
	t->ndim = (int) json_array_size(shape);
	for (i = 0; i < json_array_size(shape); i++) {
		json_t *d = json_array_get(shape, i);
		if (!json_is_integer(d))
			return kmf__fail(err, -EBADMSG, at, name, "shape[%zu] is not an integer",
					 i);
		t->shape[i] = json_integer_value(d);
	}
	r = kmf__tensor_size(t, at, true, err);
	if (r < 0)
		return r;
	if (json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
	    !json_is_integer(json_array_get(offs, 1)))
		return kmf__fail(err, -EBADMSG, at, name,
				 "\"data_offsets\" must be two integers [begin, end]");
	b = json_integer_value(json_array_get(offs, 0));
	e = json_integer_value(json_array_get(offs, 1));
	if (b < 0 || e < b || (uint64_t) e > data_size)
		return kmf__fail(err, -EBADMSG, at, name,
				 "data_offsets [%lld, %lld] are outside the data section "
				 "(%llu bytes); the file is truncated or corrupt",
				 (long long) b, (long long) e, (unsigned long long) data_size);
	if ((uint64_t) (e - b) != t->nbytes)
		return kmf__fail(err, -EBADMSG, at, name,
				 "data_offsets [%lld, %lld] hold %lld bytes but %s x %lld elements "
				 "need %llu",
				 (long long) b, (long long) e, (long long) (e - b),
				 kmf_dtype_name(t->dtype), (long long) t->nelem,
				 (unsigned long long) t->nbytes);
	*begin = (uint64_t) b;
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const kmf_tensor *x = a, *y = b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	/* Empty tensors first at equal offsets, so the coverage walk sees
	 * them as zero-length spans. */
	if (x->nbytes != y->nbytes)
		return x->nbytes < y->nbytes ? -1 : 1;
	return strcmp(x->name, y->name);
}

int kmf__st_parse(kmf_file *f, kiln_error *err)
{
	_cleanup_(json_freep) json_t *root = NULL;
	json_error_t jerr;
	uint64_t hlen, data_start, data_size, pos;
	const char *key;
	json_t *v;
	size_t n = 0, cap;
	int r;

	f->format = KMF_FORMAT_SAFETENSORS;
	hlen = kmf__ld64(f->base);
	if (hlen > KMF_MAX_HEADER_BYTES)
		return kmf__fail(
			err, -E2BIG, 0, NULL,
			"header length %llu is above KMF_MAX_HEADER_BYTES (%llu); the file "
			"is corrupt or not safetensors",
			(unsigned long long) hlen, (unsigned long long) KMF_MAX_HEADER_BYTES);
	if (hlen > f->size - 8)
		return kmf__fail(err, -EBADMSG, 0, NULL,
				 "header length %llu runs past the end of the file (%zu bytes); "
				 "the file is truncated (an interrupted download or copy?)",
				 (unsigned long long) hlen, f->size);
	data_start = 8 + hlen;
	data_size = f->size - data_start;
	root = json_loadb((const char *) f->base + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return kmf__fail(err, -EBADMSG, 8 + jerr.position, NULL,
				 "header is not valid JSON: %s", jerr.text);
	if (!json_is_object(root))
		return kmf__fail(err, -EBADMSG, 8, NULL, "header is JSON but not an object");
	cap = json_object_size(root);
	if (cap > KMF_MAX_TENSORS)
		return kmf__fail(err, -E2BIG, 8, NULL,
				 "header lists %zu entries, above KMF_MAX_TENSORS (%d)", cap,
				 KMF_MAX_TENSORS);
	f->tensors = calloc(cap ? cap : 1, sizeof(*f->tensors));
	if (!f->tensors)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	json_object_foreach(root, key, v)
	{
		uint64_t begin = 0;
		if (streq(key, "__metadata__")) {
			r = parse_metadata(f, v, err);
			if (r < 0)
				return r;
			continue;
		}
		r = parse_tensor(f, &f->tensors[n], key, v, data_size, &begin, err);
		if (r < 0) {
			/* found only now: searching the header per tensor would
			 * make opening quadratic in the tensor count */
			if (err && err->offset >= 0)
				err->offset = key_offset(f, hlen, key);
			return r;
		}
		f->tensors[n].offset = data_start + begin;
		f->tensors[n].data = f->base + data_start + begin;
		n++;
	}
	f->n_tensors = n;
	qsort(f->tensors, n, sizeof(*f->tensors), cmp_offset);
	/* The buffer must be covered exactly: no overlap, no hole, no tail. */
	pos = data_start;
	for (size_t i = 0; i < n; i++) {
		const kmf_tensor *t = &f->tensors[i];
		if (t->nbytes == 0)
			continue;
		if (t->offset < pos)
			return kmf__fail(err, -EBADMSG, (int64_t) t->offset, t->name,
					 "data [%llu, %llu) overlaps the previous tensor '%s' "
					 "(which ends at %llu); the file is corrupt",
					 (unsigned long long) (t->offset - data_start),
					 (unsigned long long) (t->offset - data_start + t->nbytes),
					 i ? f->tensors[i - 1].name : "",
					 (unsigned long long) (pos - data_start));
		if (t->offset > pos)
			return kmf__fail(err, -EBADMSG, (int64_t) pos, t->name,
					 "%llu bytes before this tensor belong to no tensor (the "
					 "format forbids holes); the file is corrupt",
					 (unsigned long long) (t->offset - pos));
		pos = t->offset + t->nbytes;
	}
	if (pos != f->size)
		return kmf__fail(err, -EBADMSG, (int64_t) pos, NULL,
				 "%llu bytes after the last tensor belong to no tensor (trailing "
				 "garbage, or a header that lost entries); the file is corrupt",
				 (unsigned long long) (f->size - pos));
	return 0;
}
