/* gguf.c — the GGUF (v2, v3) reader.
 *
 * Layout (ggml docs/gguf.md), little-endian: "GGUF", u32 version, u64
 * tensor count, u64 key-value count; the key-values (string key, u32
 * type, value; strings are u64 length + bytes, arrays u32 element type +
 * u64 count + values); the tensor infos (string name, u32 n_dims, u64
 * ne[n_dims], u32 ggml type, u64 offset relative to the data section);
 * padding to general.alignment (default 32); the data section.  ne[0] is
 * the fastest-varying dimension, so the row-major shape is ne reversed.
 *
 * v3 only added big-endian files (marked by the byte-swapped version);
 * kiln refuses those.  Every length is checked against both its KMF_MAX_*
 * limit and the bytes left in the file before anything is allocated. */
#include "kmf_internal.h"

#define GGUF_DEFAULT_ALIGNMENT 32
/* ggml's GGML_MAX_DIMS: GGUF files never hold more dimensions. */
#define GGUF_MAX_DIMS 4

/* ggml type code -> kmf dtype (KMF_DTYPE_MAX: not read by kiln). */
static kmf_dtype ggml_type(uint32_t t)
{
	switch (t) {
	case 0:
		return KMF_F32;
	case 1:
		return KMF_F16;
	case 2:
		return KMF_Q4_0;
	case 3:
		return KMF_Q4_1;
	case 8:
		return KMF_Q8_0;
	case 12:
		return KMF_Q4_K;
	case 14:
		return KMF_Q6_K;
	case 24:
		return KMF_I8;
	case 25:
		return KMF_I16;
	case 26:
		return KMF_I32;
	case 27:
		return KMF_I64;
	case 28:
		return KMF_F64;
	case 30:
		return KMF_BF16;
	default:
		return KMF_DTYPE_MAX;
	}
}

typedef struct cursor {
	kmf_file *f;
	size_t pos;
	kiln_error *err;
} cursor;

static size_t left(const cursor *c)
{
	return c->f->size - c->pos;
}

static int need(cursor *c, uint64_t n, const char *what, const char *tensor)
{
	if (n > left(c))
		return kmf__fail(c->err, -EBADMSG, (int64_t) c->pos, tensor,
				 "%s needs %llu bytes but only %zu are left; the file is "
				 "truncated (an interrupted download or copy?)",
				 what, (unsigned long long) n, left(c));
	return 0;
}

/* A little-endian integer of `bytes` (4 or 8) bytes. */
static int rdle(cursor *c, unsigned bytes, uint64_t *v, const char *what, const char *tensor)
{
	int r = need(c, bytes, what, tensor);
	if (r < 0)
		return r;
	*v = bytes == 4 ? kmf__ld32(c->f->base + c->pos) : kmf__ld64(c->f->base + c->pos);
	c->pos += bytes;
	return 0;
}

static int rd64(cursor *c, uint64_t *v, const char *what, const char *tensor)
{
	return rdle(c, 8, v, what, tensor);
}

static int rd32(cursor *c, uint32_t *v, const char *what, const char *tensor)
{
	uint64_t u = 0;
	int r = rdle(c, 4, &u, what, tensor);
	if (r >= 0)
		*v = (uint32_t) u;
	return r;
}

/* A GGUF string, bounded by max; returns a pointer into the file. */
static int rdstr(cursor *c, uint64_t max, const char *what, const char *tensor, const char **s,
		 uint64_t *len)
{
	size_t at = c->pos;
	int r = rd64(c, len, what, tensor);
	if (r < 0)
		return r;
	if (*len > max)
		return kmf__fail(c->err, -E2BIG, (int64_t) at, tensor,
				 "%s has length %llu, above the limit of %llu; the file is "
				 "corrupt",
				 what, (unsigned long long) *len, (unsigned long long) max);
	r = need(c, *len, what, tensor);
	if (r < 0)
		return r;
	*s = (const char *) c->f->base + c->pos;
	c->pos += *len;
	return 0;
}

static const unsigned vsize[KMF_V_MAX] = {
	[KMF_V_U8] = 1,	 [KMF_V_I8] = 1,  [KMF_V_U16] = 2, [KMF_V_I16] = 2,
	[KMF_V_U32] = 4, [KMF_V_I32] = 4, [KMF_V_F32] = 4, [KMF_V_BOOL] = 1,
	[KMF_V_U64] = 8, [KMF_V_I64] = 8, [KMF_V_F64] = 8,
};

/* Reads one scalar of type t at p into m (widened): its vsize[t]
 * little-endian bytes, sign-extended for the signed types ((u ^ s) - s
 * with s the sign bit). */
static void scalar(kmf_meta *m, kmf_vtype t, const uint8_t *p)
{
	const unsigned n = vsize[t];
	if (n == 0) /* not a scalar */
		return;
	const uint64_t u = n == 1   ? p[0]
			   : n == 2 ? kmf__ld16(p)
			   : n == 4 ? kmf__ld32(p)
				    : kmf__ld64(p);
	const uint64_t s = n < 8 ? UINT64_C(1) << (8 * n - 1) : 0;
	switch (t) {
	case KMF_V_F32:
		m->f = kmf__ldf32(p);
		break;
	case KMF_V_F64:
		memcpy(&m->f, &u, 8);
		break;
	case KMF_V_BOOL:
		m->b = u != 0;
		break;
	case KMF_V_I8:
	case KMF_V_I16:
	case KMF_V_I32:
	case KMF_V_I64:
		m->i = (int64_t) ((u ^ s) - s);
		break;
	default:
		m->u = u;
		break;
	}
}

static int rdarray(cursor *c, kmf_meta *m)
{
	kmf_file *f = c->f;
	size_t at = c->pos;
	uint32_t et;
	uint64_t n;
	int r = rd32(c, &et, "array element type", NULL);
	if (r < 0)
		return r;
	if (et == KMF_V_ARRAY)
		return kmf__fail(c->err, -EOPNOTSUPP, (int64_t) at, NULL,
				 "key '%s' is an array of arrays, which kiln (like ggml) does "
				 "not read",
				 m->key);
	if (et >= KMF_V_MAX)
		return kmf__fail(c->err, -EBADMSG, (int64_t) at, NULL,
				 "key '%s': unknown array element type %u; the file is corrupt "
				 "or from a newer GGUF version",
				 m->key, et);
	at = c->pos;
	r = rd64(c, &n, "array length", NULL);
	if (r < 0)
		return r;
	if (n > KMF_MAX_ARRAY)
		return kmf__fail(c->err, -E2BIG, (int64_t) at, NULL,
				 "key '%s': array of %llu elements is above KMF_MAX_ARRAY (%llu)",
				 m->key, (unsigned long long) n,
				 (unsigned long long) KMF_MAX_ARRAY);
	/* Each element takes at least its size (8 for a string length). */
	r = need(c, n * (et == KMF_V_STRING ? 8 : vsize[et]), "array", NULL);
	if (r < 0)
		return r;
	m->type = KMF_V_ARRAY;
	m->arr.etype = (kmf_vtype) et;
	m->arr.n = n;
	if (et == KMF_V_STRING) {
		kmf_str *v = kmf__alloc(f, n * sizeof(*v));
		if (!v)
			return kmf__fail(c->err, -ENOMEM, -1, NULL, "out of memory");
		for (uint64_t i = 0; i < n; i++) {
			const char *s;
			uint64_t len;
			r = rdstr(c, KMF_MAX_STRING, "array string", NULL, &s, &len);
			if (r < 0)
				return r;
			v[i].s = kmf__strndup(f, s, len);
			if (!v[i].s)
				return kmf__fail(c->err, -ENOMEM, -1, NULL, "out of memory");
			v[i].len = len;
		}
		m->arr.items = v;
		return 0;
	}
	{
		unsigned sz = vsize[et];
		uint8_t *v = kmf__alloc(f, n * sz);
		const uint8_t *p = f->base + c->pos;
		if (!v)
			return kmf__fail(c->err, -ENOMEM, -1, NULL, "out of memory");
		for (uint64_t i = 0; i < n; i++) {
			kmf_meta one;
			uint8_t u8;
			uint16_t u16;
			uint32_t u32;
			float f32;
			scalar(&one, (kmf_vtype) et, p + i * sz);
			switch (et) {
			case KMF_V_U8:
			case KMF_V_I8:
			case KMF_V_BOOL:
				u8 = et == KMF_V_BOOL ? one.b : (uint8_t) one.u;
				memcpy(v + i, &u8, 1);
				break;
			case KMF_V_U16:
			case KMF_V_I16:
				u16 = (uint16_t) one.u;
				memcpy(v + i * 2, &u16, 2);
				break;
			case KMF_V_U32:
			case KMF_V_I32:
				u32 = (uint32_t) one.u;
				memcpy(v + i * 4, &u32, 4);
				break;
			case KMF_V_F32:
				f32 = (float) one.f;
				memcpy(v + i * 4, &f32, 4);
				break;
			default: /* 8-byte types */
				memcpy(v + i * 8, &one.u, 8);
				break;
			}
		}
		c->pos += n * sz;
		m->arr.items = v;
	}
	return 0;
}

/* A key or tensor name: a string of 1..KMF_MAX_NAME bytes of valid UTF-8
 * without NUL (`what` for rdstr's messages, `desc` for this one's). */
static int rdname(cursor *c, const char *what, const char *desc, const char **s, uint64_t *len)
{
	size_t at = c->pos;
	int r = rdstr(c, KMF_MAX_NAME, what, NULL, s, len);
	if (r < 0)
		return r;
	if (*len == 0 || !kmf__utf8_valid(*s, *len) || memchr(*s, 0, *len))
		return kmf__fail(c->err, -EBADMSG, (int64_t) at, NULL,
				 "%s is empty or not valid UTF-8; the file is corrupt", desc);
	return 0;
}

static int rdkv(cursor *c, size_t *key_at)
{
	kmf_file *f = c->f;
	size_t at = c->pos;
	const char *key;
	uint64_t klen;
	uint32_t t;
	kmf_meta *m;
	int r = rdname(c, "key", "a metadata key", &key, &klen);
	if (r < 0)
		return r;
	*key_at = at;
	m = kmf__meta_add(f, key, klen);
	if (!m)
		return kmf__fail(c->err, -ENOMEM, -1, NULL, "out of memory");
	at = c->pos;
	r = rd32(c, &t, "value type", NULL);
	if (r < 0)
		return r;
	if (t >= KMF_V_MAX)
		return kmf__fail(c->err, -EBADMSG, (int64_t) at, NULL,
				 "key '%s': unknown value type %u; the file is corrupt or from a "
				 "newer GGUF version",
				 m->key, t);
	m->type = (kmf_vtype) t;
	if (t == KMF_V_STRING) {
		const char *s;
		uint64_t len;
		r = rdstr(c, KMF_MAX_STRING, "string value", NULL, &s, &len);
		if (r < 0)
			return r;
		m->str.s = kmf__strndup(f, s, len);
		if (!m->str.s)
			return kmf__fail(c->err, -ENOMEM, -1, NULL, "out of memory");
		m->str.len = len;
		return 0;
	}
	if (t == KMF_V_ARRAY)
		return rdarray(c, m);
	r = need(c, vsize[t], "value", NULL);
	if (r < 0)
		return r;
	scalar(m, (kmf_vtype) t, f->base + c->pos);
	c->pos += vsize[t];
	return 0;
}

bool kmf__gguf_probe(const uint8_t *p, size_t n)
{
	return n >= 4 && memcmp(p, "GGUF", 4) == 0;
}

static int rdtensor(cursor *c, kmf_tensor *t, uint32_t align)
{
	kmf_file *f = c->f;
	size_t at = c->pos, at_type;
	const char *name;
	uint64_t len, off, ne[GGUF_MAX_DIMS];
	uint32_t nd, type;
	int r = rdname(c, "tensor name", "a tensor name", &name, &len);
	if (r < 0)
		return r;
	t->name = kmf__strndup(f, name, len);
	if (!t->name)
		return kmf__fail(c->err, -ENOMEM, -1, NULL, "out of memory");
	at = c->pos;
	r = rd32(c, &nd, "n_dims", t->name);
	if (r < 0)
		return r;
	if (nd < 1 || nd > GGUF_MAX_DIMS)
		return kmf__fail(c->err, -EBADMSG, (int64_t) at, t->name,
				 "n_dims is %u; GGUF tensors have 1 to %d dimensions", nd,
				 GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < nd; d++) {
		at = c->pos;
		r = rd64(c, &ne[d], "dimension", t->name);
		if (r < 0)
			return r;
		if (ne[d] == 0 || ne[d] > KMF_MAX_TENSOR_BYTES)
			return kmf__fail(c->err, -EBADMSG, (int64_t) at, t->name,
					 "ne[%u] is %llu; every dimension must be 1 .. 2^40", d,
					 (unsigned long long) ne[d]);
	}
	at_type = c->pos;
	r = rd32(c, &type, "tensor type", t->name);
	if (r < 0)
		return r;
	t->dtype = ggml_type(type);
	if (t->dtype == KMF_DTYPE_MAX)
		return kmf__fail(
			c->err, -EOPNOTSUPP, (int64_t) at_type, t->name,
			"ggml type %u is not one kiln reads (F32 F16 BF16 F64 I8 I16 I32 "
			"I64 Q8_0 Q4_0 Q4_1 Q4_K Q6_K); re-quantize the model to one of them",
			type);
	t->ndim = (int) nd;
	for (uint32_t d = 0; d < nd; d++)
		t->shape[nd - 1 - d] = (int64_t) ne[d];
	if (ne[0] % kmf_dtype_block_elems(t->dtype))
		return kmf__fail(c->err, -EBADMSG, (int64_t) at_type, t->name,
				 "row length ne[0] = %llu is not a multiple of the %s block size "
				 "%u; the file is corrupt",
				 (unsigned long long) ne[0], kmf_dtype_name(t->dtype),
				 kmf_dtype_block_elems(t->dtype));
	r = kmf__tensor_size(t, (int64_t) at_type, false, c->err);
	if (r < 0)
		return r;
	at = c->pos;
	r = rd64(c, &off, "tensor offset", t->name);
	if (r < 0)
		return r;
	if (off % align)
		return kmf__fail(c->err, -EBADMSG, (int64_t) at, t->name,
				 "data offset %llu is not a multiple of the alignment %u; the "
				 "file is corrupt",
				 (unsigned long long) off, align);
	t->offset = off; /* relative for now */
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const kmf_tensor *const *x = a, *const *y = b;
	if ((*x)->offset != (*y)->offset)
		return (*x)->offset < (*y)->offset ? -1 : 1;
	return (*x)->nbytes < (*y)->nbytes ? -1 : (*x)->nbytes > (*y)->nbytes;
}

static int cmp_key(const void *a, const void *b, void *arg)
{
	const kmf_meta *m = arg;
	int c = strcmp(m[*(const uint32_t *) a].key, m[*(const uint32_t *) b].key);
	/* equal keys: file order, so the error names the second one */
	return c ? c
		 : (*(const uint32_t *) a > *(const uint32_t *) b) -
			       (*(const uint32_t *) a < *(const uint32_t *) b);
}

/* Duplicate keys, by sorting (a pairwise check is quadratic in a count
 * the file controls). */
static int check_duplicate_keys(kmf_file *f, const size_t *key_at, kiln_error *err)
{
	_cleanup_free_ uint32_t *idx = NULL;
	if (f->n_meta < 2)
		return 0;
	idx = malloc(f->n_meta * sizeof(*idx));
	if (!idx)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	for (size_t i = 0; i < f->n_meta; i++)
		idx[i] = (uint32_t) i;
	qsort_r(idx, f->n_meta, sizeof(*idx), cmp_key, f->meta);
	for (size_t i = 1; i < f->n_meta; i++)
		if (streq(f->meta[idx[i]].key, f->meta[idx[i - 1]].key))
			return kmf__fail(err, -EBADMSG, (int64_t) key_at[idx[i]], NULL,
					 "metadata key '%s' appears twice; the file is corrupt",
					 f->meta[idx[i]].key);
	return 0;
}

int kmf__gguf_parse(kmf_file *f, kiln_error *err)
{
	cursor c = { .f = f, .pos = 4, .err = err };
	uint32_t version, align = GGUF_DEFAULT_ALIGNMENT;
	uint64_t nt, nkv, data_start, data_size;
	const kmf_meta *am;
	_cleanup_free_ const kmf_tensor **order = NULL;
	_cleanup_free_ size_t *key_at = NULL;
	int r;

	f->format = KMF_FORMAT_GGUF;
	r = rd32(&c, &version, "version", NULL);
	if (r < 0)
		return r;
	if (version == 0x02000000 || version == 0x03000000)
		return kmf__fail(err, -EOPNOTSUPP, 4, NULL,
				 "big-endian GGUF (version %u byte-swapped) is not supported; "
				 "convert the model on a little-endian machine",
				 __builtin_bswap32(version));
	if (version != 2 && version != 3)
		return kmf__fail(err, -EOPNOTSUPP, 4, NULL,
				 "GGUF version %u is not supported (kiln reads versions 2 and 3); "
				 "re-convert the model with a current llama.cpp",
				 version);
	f->version = (int) version;
	r = rd64(&c, &nt, "tensor count", NULL);
	if (r < 0)
		return r;
	r = rd64(&c, &nkv, "key-value count", NULL);
	if (r < 0)
		return r;
	if (nt > KMF_MAX_TENSORS)
		return kmf__fail(
			err, -E2BIG, 8, NULL,
			"tensor count %llu is above KMF_MAX_TENSORS (%d); the file is corrupt",
			(unsigned long long) nt, KMF_MAX_TENSORS);
	if (nkv > KMF_MAX_META)
		return kmf__fail(
			err, -E2BIG, 16, NULL,
			"key-value count %llu is above KMF_MAX_META (%d); the file is corrupt",
			(unsigned long long) nkv, KMF_MAX_META);
	/* A tensor info takes at least 32 bytes, a key-value at least 13:
	 * refuse counts the file cannot hold before allocating for them. */
	if (nt * 32 + nkv * 13 > left(&c))
		return kmf__fail(
			err, -EBADMSG, 8, NULL,
			"%llu tensors and %llu key-values cannot fit in the %zu bytes left; "
			"the file is truncated or corrupt",
			(unsigned long long) nt, (unsigned long long) nkv, left(&c));
	key_at = calloc(nkv ? nkv : 1, sizeof(*key_at));
	if (!key_at)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	for (uint64_t i = 0; i < nkv; i++) {
		r = rdkv(&c, &key_at[i]);
		if (r < 0)
			return r;
	}
	r = check_duplicate_keys(f, key_at, err);
	if (r < 0)
		return r;
	am = kmf_meta_find(f, "general.alignment");
	if (am) {
		if (am->type != KMF_V_U32 || am->u == 0 || (am->u & (am->u - 1)) ||
		    am->u > (1u << 20))
			return kmf__fail(err, -EBADMSG, -1, NULL,
					 "general.alignment must be a u32 power of two up to 2^20 "
					 "(it is a %s); the file is corrupt",
					 kmf_vtype_name(am->type));
		align = (uint32_t) am->u;
	}
	f->tensors = calloc(nt ? nt : 1, sizeof(*f->tensors));
	if (!f->tensors)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	for (uint64_t i = 0; i < nt; i++) {
		r = rdtensor(&c, &f->tensors[i], align);
		if (r < 0)
			return r;
		f->n_tensors++;
	}
	data_start = (c.pos + align - 1) / align * align;
	if (data_start > f->size) {
		if (nt == 0)
			data_start = f->size; /* a metadata-only file needs no padding */
		else
			return kmf__fail(err, -EBADMSG, (int64_t) c.pos, NULL,
					 "the file ends before its data section (padding to %u); "
					 "the file is truncated",
					 align);
	}
	data_size = f->size - data_start;
	order = calloc(nt ? nt : 1, sizeof(*order));
	if (!order)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	for (uint64_t i = 0; i < nt; i++) {
		kmf_tensor *t = &f->tensors[i];
		if (t->offset > data_size || t->nbytes > data_size - t->offset)
			return kmf__fail(err, -EBADMSG, (int64_t) (data_start + t->offset), t->name,
					 "data [%llu, +%llu) runs past the end of the data section "
					 "(%llu bytes); the file is truncated",
					 (unsigned long long) t->offset,
					 (unsigned long long) t->nbytes,
					 (unsigned long long) data_size);
		order[i] = t;
	}
	qsort(order, nt, sizeof(*order), cmp_offset);
	for (uint64_t i = 1; i < nt; i++)
		if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
			return kmf__fail(err, -EBADMSG, (int64_t) (data_start + order[i]->offset),
					 order[i]->name,
					 "data at offset %llu overlaps tensor '%s' [%llu, +%llu); "
					 "the file is corrupt",
					 (unsigned long long) order[i]->offset, order[i - 1]->name,
					 (unsigned long long) order[i - 1]->offset,
					 (unsigned long long) order[i - 1]->nbytes);
	for (uint64_t i = 0; i < nt; i++) {
		kmf_tensor *t = &f->tensors[i];
		t->offset += data_start;
		t->data = f->base + t->offset;
	}
	return 0;
}
