/* kmf.c — opening model files: mapping, format detection by content, the
 * tensor and metadata tables, lookups and error formatting.
 *
 * The format readers (safetensors.c, gguf.c, llama2c.c) fill the tables;
 * this file owns their memory and the checks every format shares (tensor
 * sizes, UTF-8). */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "kmf_internal.h"

static const struct {
	const char *name;
	unsigned block_elems, block_bytes;
	bool is_float;
} dtypes[KMF_DTYPE_MAX] = {
	[KMF_F32] = { "F32", 1, 4, true },	    [KMF_F16] = { "F16", 1, 2, true },
	[KMF_BF16] = { "BF16", 1, 2, true },	    [KMF_F64] = { "F64", 1, 8, true },
	[KMF_F8_E4M3] = { "F8_E4M3", 1, 1, false }, [KMF_F8_E5M2] = { "F8_E5M2", 1, 1, false },
	[KMF_BOOL] = { "BOOL", 1, 1, false },	    [KMF_U8] = { "U8", 1, 1, false },
	[KMF_I8] = { "I8", 1, 1, false },	    [KMF_U16] = { "U16", 1, 2, false },
	[KMF_I16] = { "I16", 1, 2, false },	    [KMF_U32] = { "U32", 1, 4, false },
	[KMF_I32] = { "I32", 1, 4, false },	    [KMF_U64] = { "U64", 1, 8, false },
	[KMF_I64] = { "I64", 1, 8, false },	    [KMF_Q8_0] = { "Q8_0", 32, 34, true },
	[KMF_Q4_0] = { "Q4_0", 32, 18, true },	    [KMF_Q4_1] = { "Q4_1", 32, 20, true },
	[KMF_Q4_K] = { "Q4_K", 256, 144, true },    [KMF_Q6_K] = { "Q6_K", 256, 210, true },
};

const char *kmf_dtype_name(kmf_dtype dt)
{
	return (unsigned) dt < KMF_DTYPE_MAX ? dtypes[dt].name : NULL;
}
unsigned kmf_dtype_block_elems(kmf_dtype dt)
{
	return (unsigned) dt < KMF_DTYPE_MAX ? dtypes[dt].block_elems : 0;
}
unsigned kmf_dtype_block_bytes(kmf_dtype dt)
{
	return (unsigned) dt < KMF_DTYPE_MAX ? dtypes[dt].block_bytes : 0;
}
bool kmf_dtype_is_float(kmf_dtype dt)
{
	return (unsigned) dt < KMF_DTYPE_MAX && dtypes[dt].is_float;
}
const char *kmf_format_name(kmf_format f)
{
	static const char *const names[KMF_FORMAT_MAX] = { "safetensors", "gguf", "llama2.c" };
	return (unsigned) f < KMF_FORMAT_MAX ? names[f] : NULL;
}
const char *kmf_vtype_name(kmf_vtype t)
{
	static const char *const names[KMF_V_MAX] = { "u8",  "i8",  "u16",  "i16",    "u32",
						      "i32", "f32", "bool", "string", "array",
						      "u64", "i64", "f64" };
	return (unsigned) t < KMF_V_MAX ? names[t] : NULL;
}

float kmf__f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t) (h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
	float f;
	if (exp == 0) {
		/* zero or subnormal: man * 2^-24, exact in float */
		f = (float) man * 0x1p-24f;
		return sign ? -f : f;
	}
	if (exp == 31)
		u = sign | 0x7f800000u | (man << 13);
	else
		u = sign | ((exp + 112) << 23) | (man << 13);
	memcpy(&f, &u, 4);
	return f;
}

int kmf__fail(kiln_error *err, int code, int64_t offset, const char *tensor, const char *fmt, ...)
{
	if (err) {
		char what[KMF_MSG_MAX];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
		err->code = code;
		err->offset = offset;
		snprintf(err->where, sizeof(err->where), "%s", strempty(tensor));
		if (err->where[0])
			snprintf(err->msg, sizeof(err->msg), "tensor '%s': %s", err->where, what);
		else
			snprintf(err->msg, sizeof(err->msg), "%s", what);
	}
	return code;
}

void kmf__error_reset(kiln_error *err, const char *name)
{
	kiln_error_reset(err, name && *name ? name : "(memory)");
}

void *kmf__alloc(kmf_file *f, size_t bytes)
{
	void *p;
	if (f->n_allocs == f->cap_allocs) {
		size_t cap = f->cap_allocs ? f->cap_allocs * 2 : 64;
		void **n = realloc(f->allocs, cap * sizeof(*n));
		if (!n)
			return NULL;
		f->allocs = n;
		f->cap_allocs = cap;
	}
	p = calloc(1, bytes ? bytes : 1);
	if (p)
		f->allocs[f->n_allocs++] = p;
	return p;
}

char *kmf__strndup(kmf_file *f, const char *s, size_t len)
{
	char *d = kmf__alloc(f, len + 1);
	if (d && len)
		memcpy(d, s, len);
	return d;
}

kmf_meta *kmf__meta_add(kmf_file *f, const char *key, size_t key_len)
{
	kmf_meta *m;
	if (f->n_meta == f->cap_meta) {
		size_t cap = f->cap_meta ? f->cap_meta * 2 : 16;
		kmf_meta *n = realloc(f->meta, cap * sizeof(*n));
		if (!n)
			return NULL;
		f->meta = n;
		f->cap_meta = cap;
	}
	m = &f->meta[f->n_meta];
	memset(m, 0, sizeof(*m));
	m->key = kmf__strndup(f, key, key_len);
	if (!m->key)
		return NULL;
	f->n_meta++;
	return m;
}

int kmf__tensor_size(kmf_tensor *t, int64_t at, bool allow_empty, kiln_error *err)
{
	uint64_t n = 1, nblocks;
	t->block_elems = kmf_dtype_block_elems(t->dtype);
	t->block_bytes = kmf_dtype_block_bytes(t->dtype);
	for (int d = 0; d < t->ndim; d++) {
		if (t->shape[d] < 0 || (t->shape[d] == 0 && !allow_empty))
			return kmf__fail(err, -EBADMSG, at, t->name,
					 "dimension %d is %lld; every dimension must be >= %d "
					 "(the file is corrupt)",
					 d, (long long) t->shape[d], allow_empty ? 0 : 1);
		if (__builtin_mul_overflow(n, (uint64_t) t->shape[d], &n) ||
		    n > KMF_MAX_TENSOR_BYTES)
			return kmf__fail(err, -E2BIG, at, t->name,
					 "shape has more than %llu elements (a corrupt shape or a "
					 "tensor above KMF_MAX_TENSOR_BYTES)",
					 (unsigned long long) KMF_MAX_TENSOR_BYTES);
	}
	if (n % t->block_elems)
		return kmf__fail(
			err, -EBADMSG, at, t->name,
			"%s needs a multiple of %u elements, the shape has %llu (row length "
			"not a whole number of blocks)",
			kmf_dtype_name(t->dtype), t->block_elems, (unsigned long long) n);
	nblocks = n / t->block_elems;
	t->nelem = (int64_t) n;
	t->nbytes = nblocks * t->block_bytes;
	if (t->nbytes > KMF_MAX_TENSOR_BYTES)
		return kmf__fail(
			err, -E2BIG, at, t->name, "%llu bytes is above KMF_MAX_TENSOR_BYTES (%llu)",
			(unsigned long long) t->nbytes, (unsigned long long) KMF_MAX_TENSOR_BYTES);
	return 0;
}

/* Strict UTF-8 (RFC 3629): no overlongs, no surrogates, nothing above U+10FFFF. */
bool kmf__utf8_valid(const char *str, size_t len)
{
	const uint8_t *s = (const uint8_t *) str, *end = s + len;
	while (s < end) {
		uint8_t c = *s;
		size_t n;
		uint32_t cp, min;
		if (c < 0x80) {
			s++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			n = 1, cp = c & 0x1f, min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			n = 2, cp = c & 0x0f, min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			n = 3, cp = c & 0x07, min = 0x10000;
		} else {
			return false;
		}
		if ((size_t) (end - s) <= n)
			return false;
		for (size_t i = 1; i <= n; i++) {
			if ((s[i] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		s += n + 1;
	}
	return true;
}

static int cmp_name(const void *a, const void *b, void *arg)
{
	const kmf_tensor *t = arg;
	return strcmp(t[*(const uint32_t *) a].name, t[*(const uint32_t *) b].name);
}

/* Builds the sorted index and refuses duplicate names (a format may
 * already have refused them with a better offset). */
static int index_names(kmf_file *f, kiln_error *err)
{
	if (f->n_tensors == 0)
		return 0;
	f->sorted = malloc(f->n_tensors * sizeof(*f->sorted));
	if (!f->sorted)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	for (size_t i = 0; i < f->n_tensors; i++)
		f->sorted[i] = (uint32_t) i;
	qsort_r(f->sorted, f->n_tensors, sizeof(*f->sorted), cmp_name, f->tensors);
	for (size_t i = 1; i < f->n_tensors; i++)
		if (streq(f->tensors[f->sorted[i]].name, f->tensors[f->sorted[i - 1]].name))
			return kmf__fail(err, -EBADMSG, -1, f->tensors[f->sorted[i]].name,
					 "two tensors have this name; the file is corrupt");
	return 0;
}

kmf_file *kmf_close(kmf_file *f)
{
	if (!f)
		return NULL;
	if (f->mapped && f->base)
		munmap((void *) f->base, f->size);
	for (size_t i = 0; i < f->n_allocs; i++)
		free(f->allocs[i]);
	FREE_ALL(f->allocs, f->tensors, f->sorted, f->meta, f);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_file *, kmf_close);

static int open_region(kmf_file *f, kiln_error *err)
{
	int r;
	/* llama2.c before safetensors: its exact-size test is the stronger
	 * evidence (a 123-layer llama2.c model has '{' at byte 8). */
	if (kmf__gguf_probe(f->base, f->size))
		r = kmf__gguf_parse(f, err);
	else if (kmf__l2c_probe(f->base, f->size))
		r = kmf__l2c_parse(f, err);
	else if (kmf__st_probe(f->base, f->size))
		r = kmf__st_parse(f, err);
	else
		return kmf__fail(
			err, -EOPNOTSUPP, 0, NULL,
			"not a model file kiln reads: no GGUF magic, no safetensors "
			"header (8-byte length then '{'), and the size (%zu bytes) is not "
			"the one a llama2.c header implies; check the path or re-export the "
			"model as safetensors or GGUF",
			f->size);
	if (r < 0)
		return r;
	return index_names(f, err);
}

int kmf_open_mem(const void *buf, size_t len, const char *name, kmf_file **ret, kiln_error *err)
{
	_cleanup_(kmf_closep) kmf_file *f = NULL;
	int r;
	kmf__error_reset(err, name);
	if (!ret || (!buf && len))
		return kmf__fail(err, -EINVAL, -1, NULL, "invalid argument");
	f = calloc(1, sizeof(*f));
	if (!f)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	f->base = buf;
	f->size = len;
	r = open_region(f, err);
	if (r < 0)
		return r;
	*ret = TAKE_PTR(f);
	return 0;
}

int kmf_open(const char *path, kmf_file **ret, kiln_error *err)
{
	_cleanup_(kmf_closep) kmf_file *f = NULL;
	_cleanup_close_ int fd = -1;
	struct stat st;
	void *map = NULL;
	int r;
	kmf__error_reset(err, path);
	if (!path || !ret)
		return kmf__fail(err, -EINVAL, -1, NULL, "invalid argument");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return kmf__fail(err, -errno, -1, NULL, "cannot open: %s", strerror(errno));
	if (fstat(fd, &st) < 0)
		return kmf__fail(err, -errno, -1, NULL, "cannot stat: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return kmf__fail(err, -EINVAL, -1, NULL, "not a regular file");
	if (st.st_size > 0) {
		map = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED)
			return kmf__fail(err, -errno, -1, NULL, "cannot mmap %lld bytes: %s",
					 (long long) st.st_size, strerror(errno));
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		if (map)
			munmap(map, (size_t) st.st_size);
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	}
	f->size = (size_t) st.st_size;
	f->base = map;
	f->mapped = map != NULL;
	r = open_region(f, err);
	if (r < 0)
		return r;
	*ret = TAKE_PTR(f);
	return 0;
}

kmf_format kmf_file_format(const kmf_file *f)
{
	return f ? f->format : KMF_FORMAT_MAX;
}
int kmf_file_version(const kmf_file *f)
{
	return f ? f->version : -EINVAL;
}
size_t kmf_tensor_count(const kmf_file *f)
{
	return f ? f->n_tensors : 0;
}
const kmf_tensor *kmf_tensor_at(const kmf_file *f, size_t i)
{
	return f && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const kmf_tensor *kmf_tensor_find(const kmf_file *f, const char *name)
{
	size_t lo = 0, hi;
	if (!f || !name || !f->sorted)
		return NULL;
	hi = f->n_tensors;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const kmf_tensor *t = &f->tensors[f->sorted[mid]];
		int c = strcmp(name, t->name);
		if (c == 0)
			return t;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

size_t kmf_meta_count(const kmf_file *f)
{
	return f ? f->n_meta : 0;
}
const kmf_meta *kmf_meta_at(const kmf_file *f, size_t i)
{
	return f && i < f->n_meta ? &f->meta[i] : NULL;
}
const kmf_meta *kmf_meta_find(const kmf_file *f, const char *key)
{
	if (!f || !key)
		return NULL;
	for (size_t i = 0; i < f->n_meta; i++)
		if (streq(f->meta[i].key, key))
			return &f->meta[i];
	return NULL;
}

int kmf_meta_get_int(const kmf_file *f, const char *key, int64_t *ret)
{
	const kmf_meta *m = kmf_meta_find(f, key);
	if (!m)
		return -ENOENT;
	switch (m->type) {
	case KMF_V_U8:
	case KMF_V_U16:
	case KMF_V_U32:
	case KMF_V_U64:
		if (m->u > INT64_MAX)
			return -ERANGE;
		*ret = (int64_t) m->u;
		return 0;
	case KMF_V_I8:
	case KMF_V_I16:
	case KMF_V_I32:
	case KMF_V_I64:
		*ret = m->i;
		return 0;
	default:
		return -EINVAL;
	}
}

int kmf_meta_get_str(const kmf_file *f, const char *key, const char **ret)
{
	const kmf_meta *m = kmf_meta_find(f, key);
	if (!m)
		return -ENOENT;
	if (m->type != KMF_V_STRING)
		return -EINVAL;
	*ret = m->str.s;
	return 0;
}
