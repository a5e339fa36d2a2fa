/* kernels/kk/kk.c — the public kk.h entry points: backend registry, handles,
 * and argument checking in front of every backend's vtable.
 *
 * All validation lives here, once, so every backend gets the same errors for
 * the same bad call and a backend slot can trust its arguments (see
 * kk_internal.h).  A NULL slot turns into -EOPNOTSUPP. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kk_internal.h"

#define M(dt)	(1u << (dt))
#define M_FLOAT (M(KK_F32) | M(KK_BF16) | M(KK_F16))
#define M_I32	M(KK_I32)
#define M_F32	M(KK_F32)

/* The dtypes each op takes (its main operand), from the op list:
 * OPM_<NAME>, a compile-time mask. */
#define OPM_FLOAT   M_FLOAT
#define OPM_FLOAT_Q (M_FLOAT | M(KK_I8) | M(KK_Q4))
enum {
#define KK_OP(NAME, name, family, dtypes, params) OPM_##NAME = OPM_##dtypes,
#include "kk_ops.def"
};

/* Dimension limit for any single extent, so products cannot overflow
 * size_t in the checks below (2^40 elements is far past any device). */
#define KK_DIM_MAX (INT64_C(1) << 40)

/* ---- dtypes ------------------------------------------------------------ */

const char *kk_dtype_name(kk_dtype dt)
{
	static const char *const names[KK_DTYPE_MAX] = {
		[KK_F32] = "f32", [KK_BF16] = "bf16", [KK_F16] = "f16",
		[KK_I8] = "i8",	  [KK_Q4] = "q4",     [KK_I32] = "i32",
	};
	if ((unsigned) dt >= KK_DTYPE_MAX)
		return NULL;
	return names[dt];
}

size_t kk_dtype_size(kk_dtype dt, size_t count)
{
	size_t el, r;
	switch (dt) {
	case KK_F32:
	case KK_I32:
		el = 4;
		break;
	case KK_BF16:
	case KK_F16:
		el = 2;
		break;
	case KK_I8:
		el = 1;
		break;
	case KK_Q4:
		return count / 2 + (count & 1);
	default:
		return 0;
	}
	if (__builtin_mul_overflow(count, el, &r))
		return 0;
	return r;
}

/* ---- backends ----------------------------------------------------------
 * "cpu" is built in; "cuda" is the CUDA module, loaded on first use
 * (kernels/kk/kk_module.c). */

static const struct kk_backend_ops *backend_lookup(const char *name, int *err, char *why,
						   size_t len)
{
	const struct kk_backend_ops *ops = NULL;

	if (streq(name, "cpu"))
		return kk_cpu_ops();
	if (streq(name, "cuda")) {
		*err = kk__cuda_ops(&ops, why, len);
		return *err < 0 ? NULL : ops;
	}
	if (why && len)
		snprintf(why, len, "unknown kk backend '%s': use cpu, cuda or auto", name);
	*err = -EINVAL;
	return NULL;
}

int kk_backend_available(const char *name)
{
	const struct kk_backend_ops *ops;
	int err = 0;

	assert_return(name, -EINVAL);
	ops = backend_lookup(name, &err, NULL, 0);
	if (!ops)
		return err == -EINVAL ? -EINVAL : 0;
	return ops->available ? ops->available() > 0 : 1;
}

/* Opens ops as backend `name`: its device check, then init(). */
static int open_ops(const struct kk_backend_ops *ops, const char *name, kk_backend **ret, char *why,
		    size_t len)
{
	kk_backend *be;
	int r;

	if (ops->available && ops->available() <= 0) {
		if (why && len)
			snprintf(why, len, "the %s backend has no usable device", name);
		return -ENODEV;
	}
	be = calloc(1, sizeof(*be));
	if (!be)
		return -ENOMEM;
	be->ops = ops;
	if (ops->init) {
		r = ops->init(be);
		if (r < 0) {
			free(be);
			if (why && len)
				snprintf(why, len, "the %s backend failed to start: %s", name,
					 strerror(-r));
			return r;
		}
	}
	*ret = be;
	return 0;
}

int kk_backend_open_why(const char *name, kk_backend **ret, char *why, size_t len)
{
	const struct kk_backend_ops *ops;
	const char *env = getenv("KILN_BACKEND");
	char cuda_why[KK_WHY_MAX] = "";
	int r = 0;

	assert_return(ret, -EINVAL);
	if (why && len)
		why[0] = '\0';
	if (env && *env)
		name = env;
	if (!name || streq(name, "auto")) {
		/* cuda when the module loads and a device opens, else cpu with
		 * the reason in why (the caller logs it once) */
		ops = backend_lookup("cuda", &r, cuda_why, sizeof(cuda_why));
		if (ops && open_ops(ops, "cuda", ret, cuda_why, sizeof(cuda_why)) == 0)
			return 0;
		ops = kk_cpu_ops();
		r = open_ops(ops, "cpu", ret, why, len);
		if (r == 0 && why && len)
			snprintf(why, len, "backend auto: no cuda (%s); using the cpu backend",
				 cuda_why);
		return r;
	}
	ops = backend_lookup(name, &r, why, len);
	if (!ops)
		return r;
	return open_ops(ops, name, ret, why, len);
}

int kk_backend_open(const char *name, kk_backend **ret)
{
	return kk_backend_open_why(name, ret, NULL, 0);
}

kk_backend *kk_backend_free(kk_backend *be)
{
	if (!be)
		return NULL;
	if (be->ops->fini)
		be->ops->fini(be);
	free(be);
	return NULL;
}

const char *kk_backend_name(const kk_backend *be)
{
	return be ? be->ops->name : NULL;
}

int kk_backend_sync(kk_backend *be)
{
	assert_return(be, -EINVAL);
	return be->ops->sync ? be->ops->sync(be) : 0;
}

int kk_backend_set_threads(kk_backend *be, int n)
{
	assert_return(be && n >= 0 && n <= KK_THREADS_MAX, -EINVAL);
	return be->ops->set_threads ? be->ops->set_threads(be, n) : 0;
}

int kk_backend_threads(const kk_backend *be)
{
	assert_return(be, -EINVAL);
	return be->ops->threads ? be->ops->threads(be) : 1;
}

/* ---- op queries -------------------------------------------------------- */

const char *kk_op_name(kk_op op)
{
	static const char *const names[KK_OP_MAX] = {
#define KK_OP(NAME, name, family, dtypes, params) [KK_OP_##NAME] = #name,
#include "kk_ops.def"
	};
	if ((unsigned) op >= KK_OP_MAX)
		return NULL;
	return names[op];
}

bool kk_supports(const kk_backend *be, kk_op op, kk_dtype dt)
{
	static const unsigned masks[KK_OP_MAX] = {
#define KK_OP(NAME, name, family, dtypes, params) [KK_OP_##NAME] = OPM_##NAME,
#include "kk_ops.def"
	};
	bool has = false;

	if (!be || (unsigned) op >= KK_OP_MAX || (unsigned) dt >= KK_DTYPE_MAX)
		return false;
	switch (op) {
#define KK_OP(NAME, name, family, dtypes, params) \
	case KK_OP_##NAME:                        \
		has = be->ops->name != NULL;      \
		break;
#include "kk_ops.def"
	default:
		break;
	}
	return has && (masks[op] & M(dt));
}

bool kk_backend_has(const kk_backend *be, kk_cap cap)
{
	if (!be || (unsigned) cap >= KK_CAP_MAX)
		return false;
	if (cap == KK_CAP_QPACK)
		return be->ops->qmatrix_pack != NULL;
	return (be->ops->caps >> cap) & 1u;
}

int kk__backend_set_ops(kk_backend *be, const struct kk_backend_ops *ops)
{
	assert_return(be && ops, -EINVAL);
	be->ops = ops;
	return 0;
}

/* ---- streams ----------------------------------------------------------- */

#define CHECK_ST(b_, s_)                                           \
	do {                                                       \
		assert_return(b_, -EINVAL);                        \
		assert_return(!(s_) || (s_)->be == (b_), -EINVAL); \
	} while (0)

#define SLOT(b_, name)                      \
	do {                                \
		if (!(b_)->ops->name)       \
			return -EOPNOTSUPP; \
	} while (0)

int kk_stream_create(kk_backend *be, kk_stream **ret)
{
	kk_stream *st;
	int r;

	assert_return(be && ret, -EINVAL);
	SLOT(be, stream_create);
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->be = be;
	r = be->ops->stream_create(be, st);
	if (r < 0) {
		free(st);
		return r;
	}
	*ret = st;
	return 0;
}

kk_stream *kk_stream_free(kk_stream *st)
{
	if (!st)
		return NULL;
	if (st->be->ops->stream_sync)
		(void) st->be->ops->stream_sync(st->be, st);
	if (st->be->ops->stream_free)
		st->be->ops->stream_free(st->be, st);
	free(st);
	return NULL;
}

int kk_stream_sync(kk_backend *be, kk_stream *st)
{
	CHECK_ST(be, st);
	return be->ops->stream_sync ? be->ops->stream_sync(be, st) : 0;
}

/* ---- buffers ----------------------------------------------------------- */

/* b belongs to be, has a dtype in mask and at least n elements. */
static bool bok(const kk_backend *be, const kk_buffer *b, unsigned mask, size_t n)
{
	return b && b->be == be && (mask & M(b->dtype)) && b->count >= n;
}

/* Optional buffer: NULL or bok(). */
static bool bopt(const kk_backend *be, const kk_buffer *b, unsigned mask, size_t n)
{
	return !b || bok(be, b, mask, n);
}

static bool dim_ok(int64_t x)
{
	return x > 0 && x <= KK_DIM_MAX;
}

/* a*b, saturating to SIZE_MAX (then no buffer is ever large enough). */
static size_t mul2(int64_t a, int64_t b)
{
	size_t r;
	if (a < 0 || b < 0 || __builtin_mul_overflow((size_t) a, (size_t) b, &r))
		return SIZE_MAX;
	return r;
}

static size_t mul3(int64_t a, int64_t b, int64_t c)
{
	size_t ab = mul2(a, b), r;
	if (ab == SIZE_MAX || c < 0 || __builtin_mul_overflow(ab, (size_t) c, &r))
		return SIZE_MAX;
	return r;
}

int kk_buffer_alloc(kk_backend *be, kk_dtype dt, size_t count, kk_buffer **ret)
{
	_cleanup_free_ kk_buffer *b = NULL;
	size_t bytes;
	int r;

	assert_return(be && ret, -EINVAL);
	assert_return(count > 0, -EINVAL);
	bytes = kk_dtype_size(dt, count);
	assert_return(bytes > 0 && bytes <= KK_BUFFER_MAX_BYTES, -EINVAL);
	SLOT(be, alloc);

	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	r = be->ops->alloc(be, bytes, &b->ptr);
	if (r < 0)
		return r;
	b->be = be;
	b->bytes = bytes;
	b->count = count;
	b->dtype = dt;
	*ret = TAKE_PTR(b);
	return 0;
}

int kk_buffer_view(kk_buffer *parent, size_t offset, size_t count, kk_buffer **ret)
{
	kk_buffer *b;

	assert_return(parent && ret, -EINVAL);
	assert_return(count > 0 && offset <= parent->count && count <= parent->count - offset,
		      -EINVAL);
	assert_return(parent->dtype != KK_Q4 || offset % 2 == 0, -EINVAL);

	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->be = parent->be;
	b->ptr = (char *) parent->ptr + kk_dtype_size(parent->dtype, offset);
	b->count = count;
	b->bytes = kk_dtype_size(parent->dtype, count);
	b->dtype = parent->dtype;
	b->is_view = true;
	*ret = b;
	return 0;
}

int kk_buffer_wrap_host(kk_backend *be, kk_dtype dt, const void *ptr, size_t count, kk_buffer **ret)
{
	kk_buffer *b;
	size_t align = dt == KK_F32 || dt == KK_I32 ? 4 : dt == KK_BF16 || dt == KK_F16 ? 2 : 1;

	assert_return(be && ptr && ret, -EINVAL);
	assert_return((unsigned) dt < KK_DTYPE_MAX && count > 0, -EINVAL);
	assert_return(kk_dtype_size(dt, count) <= KK_BUFFER_MAX_BYTES, -EINVAL);
	assert_return((uintptr_t) ptr % align == 0, -EINVAL);
	if (!kk_backend_has(be, KK_CAP_HOST_MEMORY))
		return -EOPNOTSUPP;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->be = be;
	b->ptr = (void *) ptr;
	b->count = count;
	b->bytes = kk_dtype_size(dt, count);
	b->dtype = dt;
	b->is_view = true; /* the caller's memory: never freed here */
	*ret = b;
	return 0;
}

kk_buffer *kk_buffer_free(kk_buffer *buf)
{
	if (!buf)
		return NULL;
	if (!buf->is_view && buf->be->ops->free)
		buf->be->ops->free(buf->be, buf->ptr);
	free(buf);
	return NULL;
}

kk_dtype kk_buffer_dtype(const kk_buffer *buf)
{
	return buf ? buf->dtype : KK_DTYPE_MAX;
}
size_t kk_buffer_count(const kk_buffer *buf)
{
	return buf ? buf->count : 0;
}
size_t kk_buffer_bytes(const kk_buffer *buf)
{
	return buf ? buf->bytes : 0;
}
kk_backend *kk_buffer_backend(const kk_buffer *buf)
{
	return buf ? buf->be : NULL;
}

static bool range_ok(const kk_buffer *b, size_t offset, size_t bytes)
{
	return offset <= b->bytes && bytes <= b->bytes - offset;
}

int kk_buffer_upload(kk_backend *be, kk_stream *st, kk_buffer *dst, size_t offset, const void *src,
		     size_t bytes)
{
	CHECK_ST(be, st);
	assert_return(dst && dst->be == be && (src || bytes == 0), -EINVAL);
	assert_return(range_ok(dst, offset, bytes), -EINVAL);
	if (bytes == 0)
		return 0;
	SLOT(be, upload);
	return be->ops->upload(be, st, (char *) dst->ptr + offset, src, bytes);
}

int kk_buffer_download(kk_backend *be, kk_stream *st, const kk_buffer *src, size_t offset,
		       void *dst, size_t bytes)
{
	CHECK_ST(be, st);
	assert_return(src && src->be == be && (dst || bytes == 0), -EINVAL);
	assert_return(range_ok(src, offset, bytes), -EINVAL);
	if (bytes == 0)
		return 0;
	SLOT(be, download);
	return be->ops->download(be, st, dst, (const char *) src->ptr + offset, bytes);
}

int kk_buffer_memset(kk_backend *be, kk_stream *st, kk_buffer *buf, int byte, size_t offset,
		     size_t bytes)
{
	CHECK_ST(be, st);
	assert_return(buf && buf->be == be, -EINVAL);
	assert_return(range_ok(buf, offset, bytes), -EINVAL);
	if (bytes == 0)
		return 0;
	SLOT(be, memset);
	return be->ops->memset(be, st, (char *) buf->ptr + offset, byte, bytes);
}

int kk_buffer_copy(kk_backend *be, kk_stream *st, kk_buffer *dst, size_t dst_offset,
		   const kk_buffer *src, size_t src_offset, size_t bytes)
{
	const char *s, *d;

	CHECK_ST(be, st);
	assert_return(dst && src && dst->be == be && src->be == be, -EINVAL);
	assert_return(range_ok(dst, dst_offset, bytes) && range_ok(src, src_offset, bytes),
		      -EINVAL);
	if (bytes == 0)
		return 0;
	d = (const char *) dst->ptr + dst_offset;
	s = (const char *) src->ptr + src_offset;
	assert_return(d + bytes <= s || s + bytes <= d, -EINVAL);
	SLOT(be, copy);
	return be->ops->copy(be, st, (char *) dst->ptr + dst_offset, s, bytes);
}

int kk_cast(kk_backend *be, kk_stream *st, kk_buffer *dst, const kk_buffer *src, size_t count)
{
	CHECK_ST(be, st);
	assert_return(count > 0, -EINVAL);
	assert_return(bok(be, dst, OPM_CAST, count) && bok(be, src, OPM_CAST, count), -EINVAL);
	SLOT(be, cast);
	return be->ops->cast(be, st, dst, src, count);
}

int kk_scale(kk_backend *be, kk_stream *st, kk_buffer *x, float scale, size_t count)
{
	CHECK_ST(be, st);
	assert_return(count > 0 && isfinite(scale), -EINVAL);
	assert_return(bok(be, x, OPM_SCALE, count), -EINVAL);
	SLOT(be, scale);
	return be->ops->scale(be, st, x, scale, count);
}

/* ---- GEMM -------------------------------------------------------------- */

/* Elements a strided batch of stored [rows, cols] matrices spans. */
static size_t span(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld)
{
	size_t one, tail, r;
	if (ld < cols || stride < 0)
		return SIZE_MAX;
	one = mul2(rows - 1, ld);
	if (one == SIZE_MAX || __builtin_add_overflow(one, (size_t) cols, &one))
		return SIZE_MAX;
	tail = mul2(batch - 1, stride);
	if (tail == SIZE_MAX || __builtin_add_overflow(one, tail, &r))
		return SIZE_MAX;
	return r;
}

int kk_gemm(kk_backend *be, kk_stream *st, const kk_gemm_desc *d)
{
	int64_t batch;
	unsigned in;

	CHECK_ST(be, st);
	assert_return(d && d->a && d->b && d->c, -EINVAL);
	assert_return(dim_ok(d->m) && dim_ok(d->n) && dim_ok(d->k), -EINVAL);
	assert_return(d->batch >= 0 && d->batch <= KK_DIM_MAX, -EINVAL);
	assert_return(isfinite(d->alpha) && isfinite(d->beta), -EINVAL);
	assert_return(d->epilogue >= KK_EPI_NONE && d->epilogue <= KK_EPI_SILU, -EINVAL);
	batch = d->batch ? d->batch : 1;
	/* Batch entries of C must not overlap (they are written concurrently). */
	assert_return(batch == 1 || d->stride_c >= (d->m - 1) * d->ldc + d->n, -EINVAL);
	assert_return(OPM_GEMM & M(d->a->dtype), -EINVAL);
	in = M(d->a->dtype);
	assert_return(bok(be, d->a, in,
			  span(batch, d->stride_a, d->trans_a ? d->k : d->m,
			       d->trans_a ? d->m : d->k, d->lda)),
		      -EINVAL);
	assert_return(bok(be, d->b, in,
			  span(batch, d->stride_b, d->trans_b ? d->n : d->k,
			       d->trans_b ? d->k : d->n, d->ldb)),
		      -EINVAL);
	assert_return(bok(be, d->c, in | M_F32, span(batch, d->stride_c, d->m, d->n, d->ldc)),
		      -EINVAL);
	assert_return(bopt(be, d->bias, M(d->c->dtype) | M_F32, d->n), -EINVAL);
	SLOT(be, gemm);
	return be->ops->gemm(be, st, d);
}

/* ---- quantization ------------------------------------------------------ */

static bool group_ok(int g)
{
	return g == 32 || g == 64 || g == 128;
}

static bool qmatrix_ok(const kk_backend *be, const kk_qmatrix *q)
{
	if (!q || !dim_ok(q->n) || !dim_ok(q->k) || (q->pack != 0 && q->pack != KK_QPACK))
		return false;
	if (q->qtype == KK_I8 && q->group == 32)
		return q->k % 32 == 0 && bok(be, q->data, M(KK_I8), mul2(q->n, q->k)) &&
		       bok(be, q->scales, M_F32 | M(KK_F16), mul2(q->n, q->k / 32));
	if (q->qtype == KK_I8)
		return q->group == 0 && bok(be, q->data, M(KK_I8), mul2(q->n, q->k)) &&
		       bok(be, q->scales, M_F32 | M(KK_F16), (size_t) q->n);
	if (q->qtype == KK_Q4)
		return group_ok(q->group) && q->k % q->group == 0 &&
		       bok(be, q->data, M(KK_Q4), mul2(q->n, q->k)) &&
		       bok(be, q->scales, M_F32 | M(KK_F16), mul2(q->n, q->k / q->group));
	return false;
}

int kk_qmatrix_alloc(kk_backend *be, kk_dtype qtype, int64_t n, int64_t k, int group,
		     kk_dtype scale_dt, kk_qmatrix **ret)
{
	kk_qmatrix *q;
	size_t nscales;
	int r;

	assert_return(be && ret && dim_ok(n) && dim_ok(k), -EINVAL);
	assert_return(scale_dt == KK_F32 || scale_dt == KK_F16, -EINVAL);
	if (qtype == KK_I8) {
		assert_return(group == 0 || (group == 32 && k % 32 == 0), -EINVAL);
		nscales = group ? mul2(n, k / 32) : (size_t) n;
	} else if (qtype == KK_Q4) {
		assert_return(group_ok(group) && k % group == 0, -EINVAL);
		nscales = mul2(n, k / group);
	} else
		return -EINVAL;

	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->qtype = qtype;
	q->n = n;
	q->k = k;
	q->group = group;
	r = kk_buffer_alloc(be, qtype, mul2(n, k), &q->data);
	if (r >= 0)
		r = kk_buffer_alloc(be, scale_dt, nscales, &q->scales);
	if (r < 0) {
		kk_qmatrix_free(q);
		return r;
	}
	*ret = q;
	return 0;
}

kk_qmatrix *kk_qmatrix_free(kk_qmatrix *q)
{
	if (!q)
		return NULL;
	kk_buffer_free(q->data);
	kk_buffer_free(q->scales);
	free(q);
	return NULL;
}

int kk_qmatrix_pack(kk_backend *be, kk_qmatrix *q)
{
	assert_return(be && qmatrix_ok(be, q), -EINVAL);
	SLOT(be, qmatrix_pack);
	return be->ops->qmatrix_pack(be, q);
}

int kk_quantize(kk_backend *be, kk_stream *st, kk_qmatrix *q, const kk_buffer *w)
{
	CHECK_ST(be, st);
	assert_return(qmatrix_ok(be, q), -EINVAL);
	assert_return(bok(be, w, M_FLOAT, mul2(q->n, q->k)), -EINVAL);
	SLOT(be, quantize);
	return be->ops->quantize(be, st, q, w);
}

int kk_dequantize(kk_backend *be, kk_stream *st, kk_buffer *w, const kk_qmatrix *q)
{
	CHECK_ST(be, st);
	assert_return(qmatrix_ok(be, q), -EINVAL);
	assert_return(bok(be, w, M_FLOAT, mul2(q->n, q->k)), -EINVAL);
	SLOT(be, dequantize);
	return be->ops->dequantize(be, st, w, q);
}

int kk_qgemm(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x, const kk_qmatrix *w,
	     const kk_buffer *bias, int64_t m)
{
	CHECK_ST(be, st);
	assert_return(qmatrix_ok(be, w) && dim_ok(m), -EINVAL);
	assert_return(bok(be, x, M_FLOAT, mul2(m, w->k)), -EINVAL);
	assert_return(bok(be, y, M(x->dtype), mul2(m, w->n)), -EINVAL);
	assert_return(bopt(be, bias, M(x->dtype) | M_F32, (size_t) w->n), -EINVAL);
	SLOT(be, qgemm);
	return be->ops->qgemm(be, st, y, x, w, bias, m);
}

/* ---- attention --------------------------------------------------------- */

static bool heads_ok(int n_heads, int n_kv_heads, int head_dim)
{
	return n_heads > 0 && n_kv_heads > 0 && n_heads <= 1024 && n_heads % n_kv_heads == 0 &&
	       head_dim >= 1 && head_dim <= KK_ATTN_HEAD_DIM_MAX;
}

static bool attn_desc_ok(const kk_backend *be, const kk_attn_desc *d)
{
	return d && heads_ok(d->n_heads, d->n_kv_heads, d->head_dim) && isfinite(d->scale) &&
	       d->scale >= 0 && d->n_seqs > 0 && dim_ok(d->total_tokens) && d->max_seqlen > 0 &&
	       bok(be, d->cu_seqlens, M_I32, (size_t) d->n_seqs + 1);
}

static bool attn_bufs_ok(const kk_backend *be, const kk_attn_desc *d, const kk_buffer *qlike,
			 const kk_buffer *klike, kk_dtype dt)
{
	return bok(be, qlike, M(dt), mul3(d->total_tokens, d->n_heads, d->head_dim)) &&
	       bok(be, klike, M(dt), mul3(d->total_tokens, d->n_kv_heads, d->head_dim));
}

int kk_attention_fwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d, kk_buffer *out,
		     kk_buffer *lse, const kk_buffer *q, const kk_buffer *k, const kk_buffer *v)
{
	CHECK_ST(be, st);
	assert_return(attn_desc_ok(be, d) && q && (OPM_ATTENTION_FWD & M(q->dtype)), -EINVAL);
	assert_return(attn_bufs_ok(be, d, q, k, q->dtype) && attn_bufs_ok(be, d, out, v, q->dtype),
		      -EINVAL);
	assert_return(bopt(be, lse, M_F32, mul2(d->total_tokens, d->n_heads)), -EINVAL);
	SLOT(be, attention_fwd);
	return be->ops->attention_fwd(be, st, d, out, lse, q, k, v);
}

int kk_attention_bwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d, kk_buffer *dq,
		     kk_buffer *dk, kk_buffer *dv, const kk_buffer *dout, const kk_buffer *q,
		     const kk_buffer *k, const kk_buffer *v, const kk_buffer *out,
		     const kk_buffer *lse)
{
	CHECK_ST(be, st);
	assert_return(attn_desc_ok(be, d) && q && (OPM_ATTENTION_BWD & M(q->dtype)), -EINVAL);
	assert_return(attn_bufs_ok(be, d, q, k, q->dtype) &&
			      attn_bufs_ok(be, d, out, v, q->dtype) &&
			      attn_bufs_ok(be, d, dq, dk, q->dtype) &&
			      attn_bufs_ok(be, d, dout, dv, q->dtype),
		      -EINVAL);
	assert_return(bok(be, lse, M_F32, mul2(d->total_tokens, d->n_heads)), -EINVAL);
	SLOT(be, attention_bwd);
	return be->ops->attention_bwd(be, st, d, dq, dk, dv, dout, q, k, v, out, lse);
}

/* The checks decode and paged attention share; q and out hold q_rows;
 * dts: the dtypes the op takes. */
static bool paged_ok(const kk_backend *be, unsigned dts, const kk_paged_desc *d,
		     const kk_buffer *out, const kk_buffer *q, const kk_buffer *k_cache,
		     const kk_buffer *v_cache, int64_t q_rows)
{
	size_t qn, cn;

	if (!d || !heads_ok(d->n_heads, d->n_kv_heads, d->head_dim))
		return false;
	if (!isfinite(d->scale) || d->scale < 0 || d->n_seqs <= 0 || d->num_blocks <= 0 ||
	    d->max_blocks_per_seq <= 0 || d->max_context_len <= 0 ||
	    (int64_t) d->max_context_len > (int64_t) d->max_blocks_per_seq * KK_KV_BLOCK_SIZE)
		return false;
	if (!q || !(dts & M(q->dtype)) || q_rows < 0)
		return false;
	qn = mul3(q_rows, d->n_heads, d->head_dim);
	cn = mul3((int64_t) d->num_blocks * KK_KV_BLOCK_SIZE, d->n_kv_heads, d->head_dim);
	return bok(be, q, M(q->dtype), qn) && bok(be, out, M(q->dtype), qn) &&
	       bok(be, k_cache, M(q->dtype), cn) && bok(be, v_cache, M(q->dtype), cn) &&
	       bok(be, d->block_tables, M_I32, mul2(d->n_seqs, d->max_blocks_per_seq)) &&
	       bok(be, d->context_lens, M_I32, (size_t) d->n_seqs);
}

int kk_attention_decode(kk_backend *be, kk_stream *st, const kk_paged_desc *d, kk_buffer *out,
			const kk_buffer *q, const kk_buffer *k_cache, const kk_buffer *v_cache)
{
	CHECK_ST(be, st);
	assert_return(d && !d->cu_q, -EINVAL);
	assert_return(paged_ok(be, OPM_ATTENTION_DECODE, d, out, q, k_cache, v_cache, d->n_seqs),
		      -EINVAL);
	SLOT(be, attention_decode);
	return be->ops->attention_decode(be, st, d, out, q, k_cache, v_cache);
}

int kk_attention_paged(kk_backend *be, kk_stream *st, const kk_paged_desc *d, kk_buffer *out,
		       const kk_buffer *q, const kk_buffer *k_cache, const kk_buffer *v_cache)
{
	CHECK_ST(be, st);
	assert_return(d && d->cu_q && d->total_q >= 0, -EINVAL);
	assert_return(paged_ok(be, OPM_ATTENTION_PAGED, d, out, q, k_cache, v_cache, d->total_q),
		      -EINVAL);
	assert_return(bok(be, d->cu_q, M_I32, (size_t) d->n_seqs + 1), -EINVAL);
	SLOT(be, attention_paged);
	if (d->total_q == 0)
		return 0;
	return be->ops->attention_paged(be, st, d, out, q, k_cache, v_cache);
}

int kk_kv_cache_write(kk_backend *be, kk_stream *st, kk_buffer *k_cache, kk_buffer *v_cache,
		      const kk_buffer *k, const kk_buffer *v, const kk_buffer *slot_mapping,
		      int64_t n_tokens, int n_kv_heads, int head_dim, int num_blocks)
{
	size_t tn, cn;

	CHECK_ST(be, st);
	assert_return(dim_ok(n_tokens) && heads_ok(n_kv_heads, n_kv_heads, head_dim) &&
			      num_blocks > 0,
		      -EINVAL);
	assert_return(k && (OPM_KV_CACHE_WRITE & M(k->dtype)), -EINVAL);
	tn = mul3(n_tokens, n_kv_heads, head_dim);
	cn = mul3((int64_t) num_blocks * KK_KV_BLOCK_SIZE, n_kv_heads, head_dim);
	assert_return(bok(be, k, M(k->dtype), tn) && bok(be, v, M(k->dtype), tn), -EINVAL);
	assert_return(bok(be, k_cache, M(k->dtype), cn) && bok(be, v_cache, M(k->dtype), cn),
		      -EINVAL);
	assert_return(bok(be, slot_mapping, M_I32, (size_t) n_tokens), -EINVAL);
	SLOT(be, kv_cache_write);
	return be->ops->kv_cache_write(be, st, k_cache, v_cache, k, v, slot_mapping, n_tokens,
				       n_kv_heads, head_dim, num_blocks);
}

/* ---- normalization ----------------------------------------------------- */

static bool norm_shape_ok(int64_t rows, int64_t dim, float eps)
{
	return dim_ok(rows) && dim_ok(dim) && isfinite(eps) && eps >= 0;
}

int kk_rmsnorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, kk_buffer *residual_out,
		   kk_buffer *rstd, const kk_buffer *x, const kk_buffer *residual,
		   const kk_buffer *weight, int64_t rows, int64_t dim, float eps)
{
	size_t n = mul2(rows, dim);
	unsigned dt;

	CHECK_ST(be, st);
	assert_return(norm_shape_ok(rows, dim, eps) && x && (OPM_RMSNORM_FWD & M(x->dtype)),
		      -EINVAL);
	dt = M(x->dtype);
	assert_return(bok(be, x, dt, n) && bok(be, y, dt, n) && bopt(be, residual, dt, n) &&
			      bopt(be, residual_out, dt, n) && bok(be, weight, dt, (size_t) dim) &&
			      bopt(be, rstd, M_F32, (size_t) rows),
		      -EINVAL);
	SLOT(be, rmsnorm_fwd);
	return be->ops->rmsnorm_fwd(be, st, y, residual_out, rstd, x, residual, weight, rows, dim,
				    eps);
}

int kk_rmsnorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
		   const kk_buffer *dy, const kk_buffer *dresidual, const kk_buffer *h,
		   const kk_buffer *weight, const kk_buffer *rstd, int64_t rows, int64_t dim)
{
	size_t n = mul2(rows, dim);
	unsigned dt;

	CHECK_ST(be, st);
	assert_return(norm_shape_ok(rows, dim, 0) && h && (OPM_RMSNORM_BWD & M(h->dtype)), -EINVAL);
	dt = M(h->dtype);
	assert_return(bok(be, h, dt, n) && bok(be, dx, dt, n) && bok(be, dy, dt, n) &&
			      bopt(be, dresidual, dt, n) && bok(be, weight, dt, (size_t) dim) &&
			      bok(be, rstd, M_F32, (size_t) rows) &&
			      bopt(be, dweight, M_F32, (size_t) dim),
		      -EINVAL);
	SLOT(be, rmsnorm_bwd);
	return be->ops->rmsnorm_bwd(be, st, dx, dweight, dy, dresidual, h, weight, rstd, rows, dim);
}

int kk_layernorm_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, kk_buffer *residual_out,
		     kk_buffer *mean, kk_buffer *rstd, const kk_buffer *x,
		     const kk_buffer *residual, const kk_buffer *weight, const kk_buffer *bias,
		     int64_t rows, int64_t dim, float eps)
{
	size_t n = mul2(rows, dim);
	unsigned dt;

	CHECK_ST(be, st);
	assert_return(norm_shape_ok(rows, dim, eps) && x && (OPM_LAYERNORM_FWD & M(x->dtype)),
		      -EINVAL);
	dt = M(x->dtype);
	assert_return(bok(be, x, dt, n) && bok(be, y, dt, n) && bopt(be, residual, dt, n) &&
			      bopt(be, residual_out, dt, n) && bok(be, weight, dt, (size_t) dim) &&
			      bopt(be, bias, dt, (size_t) dim) &&
			      bopt(be, mean, M_F32, (size_t) rows) &&
			      bopt(be, rstd, M_F32, (size_t) rows),
		      -EINVAL);
	SLOT(be, layernorm_fwd);
	return be->ops->layernorm_fwd(be, st, y, residual_out, mean, rstd, x, residual, weight,
				      bias, rows, dim, eps);
}

int kk_layernorm_bwd(kk_backend *be, kk_stream *st, kk_buffer *dx, kk_buffer *dweight,
		     kk_buffer *dbias, const kk_buffer *dy, const kk_buffer *dresidual,
		     const kk_buffer *h, const kk_buffer *weight, const kk_buffer *mean,
		     const kk_buffer *rstd, int64_t rows, int64_t dim)
{
	size_t n = mul2(rows, dim);
	unsigned dt;

	CHECK_ST(be, st);
	assert_return(norm_shape_ok(rows, dim, 0) && h && (OPM_LAYERNORM_BWD & M(h->dtype)),
		      -EINVAL);
	dt = M(h->dtype);
	assert_return(bok(be, h, dt, n) && bok(be, dx, dt, n) && bok(be, dy, dt, n) &&
			      bopt(be, dresidual, dt, n) && bok(be, weight, dt, (size_t) dim) &&
			      bok(be, mean, M_F32, (size_t) rows) &&
			      bok(be, rstd, M_F32, (size_t) rows) &&
			      bopt(be, dweight, M_F32, (size_t) dim) &&
			      bopt(be, dbias, M_F32, (size_t) dim),
		      -EINVAL);
	SLOT(be, layernorm_bwd);
	return be->ops->layernorm_bwd(be, st, dx, dweight, dbias, dy, dresidual, h, weight, mean,
				      rstd, rows, dim);
}

/* ---- rope, activations, softmax ---------------------------------------- */

int kk_rope(kk_backend *be, kk_stream *st, kk_buffer *x, const kk_buffer *positions, int64_t tokens,
	    int n_heads, int head_dim, int rotary_dim, float theta, const kk_buffer *freq_div,
	    kk_rope_mode mode, bool backward)
{
	CHECK_ST(be, st);
	assert_return(dim_ok(tokens) && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, -EINVAL);
	assert_return(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0, -EINVAL);
	assert_return(isfinite(theta) && theta > 0, -EINVAL);
	assert_return(mode == KK_ROPE_INTERLEAVED || mode == KK_ROPE_HALF, -EINVAL);
	int rot = rotary_dim ? rotary_dim : head_dim;
	assert_return(bok(be, x, OPM_ROPE, mul3(tokens, n_heads, head_dim)) &&
			      bok(be, positions, M_I32, (size_t) tokens) &&
			      bopt(be, freq_div, M_F32, (size_t) rot / 2),
		      -EINVAL);
	SLOT(be, rope);
	return be->ops->rope(be, st, x, positions, tokens, n_heads, head_dim, rot, theta, freq_div,
			     mode, backward);
}

static bool act_ok(kk_act a)
{
	return a == KK_ACT_SILU || a == KK_ACT_GELU;
}

int kk_act_fwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *y, const kk_buffer *x,
	       size_t n)
{
	CHECK_ST(be, st);
	assert_return(act_ok(act) && n > 0 && x && (OPM_ACT_FWD & M(x->dtype)), -EINVAL);
	assert_return(bok(be, x, M(x->dtype), n) && bok(be, y, M(x->dtype), n), -EINVAL);
	SLOT(be, act_fwd);
	return be->ops->act_fwd(be, st, act, y, x, n);
}

int kk_act_bwd(kk_backend *be, kk_stream *st, kk_act act, kk_buffer *dx, const kk_buffer *dy,
	       const kk_buffer *x, size_t n)
{
	CHECK_ST(be, st);
	assert_return(act_ok(act) && n > 0 && x && (OPM_ACT_BWD & M(x->dtype)), -EINVAL);
	assert_return(bok(be, x, M(x->dtype), n) && bok(be, dx, M(x->dtype), n) &&
			      bok(be, dy, M(x->dtype), n),
		      -EINVAL);
	SLOT(be, act_bwd);
	return be->ops->act_bwd(be, st, act, dx, dy, x, n);
}

int kk_swiglu_fwd(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *gate,
		  const kk_buffer *up, size_t n)
{
	CHECK_ST(be, st);
	assert_return(n > 0 && gate && (OPM_SWIGLU_FWD & M(gate->dtype)), -EINVAL);
	assert_return(bok(be, gate, M(gate->dtype), n) && bok(be, up, M(gate->dtype), n) &&
			      bok(be, y, M(gate->dtype), n),
		      -EINVAL);
	SLOT(be, swiglu_fwd);
	return be->ops->swiglu_fwd(be, st, y, gate, up, n);
}

int kk_swiglu_bwd(kk_backend *be, kk_stream *st, kk_buffer *dgate, kk_buffer *dup,
		  const kk_buffer *dy, const kk_buffer *gate, const kk_buffer *up, size_t n)
{
	unsigned dt;

	CHECK_ST(be, st);
	assert_return(n > 0 && gate && (OPM_SWIGLU_BWD & M(gate->dtype)), -EINVAL);
	dt = M(gate->dtype);
	assert_return(bok(be, gate, dt, n) && bok(be, up, dt, n) && bok(be, dy, dt, n) &&
			      bok(be, dgate, dt, n) && bok(be, dup, dt, n),
		      -EINVAL);
	SLOT(be, swiglu_bwd);
	return be->ops->swiglu_bwd(be, st, dgate, dup, dy, gate, up, n);
}

int kk_softmax(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x, int64_t rows,
	       int64_t cols)
{
	CHECK_ST(be, st);
	assert_return(dim_ok(rows) && dim_ok(cols) && x && (OPM_SOFTMAX & M(x->dtype)), -EINVAL);
	assert_return(bok(be, x, M(x->dtype), mul2(rows, cols)) &&
			      bok(be, y, M(x->dtype), mul2(rows, cols)),
		      -EINVAL);
	SLOT(be, softmax);
	return be->ops->softmax(be, st, y, x, rows, cols);
}

/* ---- embedding, cross-entropy ------------------------------------------ */

int kk_embedding_fwd(kk_backend *be, kk_stream *st, kk_buffer *out, const kk_buffer *table,
		     const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim)
{
	CHECK_ST(be, st);
	assert_return(dim_ok(tokens) && dim_ok(vocab) && dim_ok(dim), -EINVAL);
	assert_return(table && (OPM_EMBEDDING_FWD & M(table->dtype)), -EINVAL);
	assert_return(bok(be, table, M(table->dtype), mul2(vocab, dim)) &&
			      bok(be, out, M(table->dtype), mul2(tokens, dim)) &&
			      bok(be, ids, M_I32, (size_t) tokens),
		      -EINVAL);
	SLOT(be, embedding_fwd);
	return be->ops->embedding_fwd(be, st, out, table, ids, tokens, vocab, dim);
}

int kk_embedding_bwd(kk_backend *be, kk_stream *st, kk_buffer *dtable, const kk_buffer *dout,
		     const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim)
{
	CHECK_ST(be, st);
	assert_return(dim_ok(tokens) && dim_ok(vocab) && dim_ok(dim), -EINVAL);
	assert_return(bok(be, dtable, M_F32, mul2(vocab, dim)) &&
			      bok(be, dout, OPM_EMBEDDING_BWD, mul2(tokens, dim)) &&
			      bok(be, ids, M_I32, (size_t) tokens),
		      -EINVAL);
	SLOT(be, embedding_bwd);
	return be->ops->embedding_bwd(be, st, dtable, dout, ids, tokens, vocab, dim);
}

int kk_cross_entropy_fwd(kk_backend *be, kk_stream *st, kk_buffer *losses, const kk_buffer *logits,
			 const kk_buffer *targets, int64_t tokens, int64_t vocab)
{
	CHECK_ST(be, st);
	assert_return(dim_ok(tokens) && dim_ok(vocab), -EINVAL);
	assert_return(bok(be, logits, OPM_CROSS_ENTROPY_FWD, mul2(tokens, vocab)) &&
			      bok(be, targets, M_I32, (size_t) tokens) &&
			      bok(be, losses, M_F32, (size_t) tokens),
		      -EINVAL);
	SLOT(be, cross_entropy_fwd);
	return be->ops->cross_entropy_fwd(be, st, losses, logits, targets, tokens, vocab);
}

int kk_cross_entropy_bwd(kk_backend *be, kk_stream *st, kk_buffer *dlogits, const kk_buffer *logits,
			 const kk_buffer *targets, int64_t tokens, int64_t vocab, float grad_scale)
{
	CHECK_ST(be, st);
	assert_return(dim_ok(tokens) && dim_ok(vocab) && isfinite(grad_scale), -EINVAL);
	assert_return(logits && (OPM_CROSS_ENTROPY_BWD & M(logits->dtype)), -EINVAL);
	assert_return(bok(be, logits, M(logits->dtype), mul2(tokens, vocab)) &&
			      bok(be, dlogits, M(logits->dtype), mul2(tokens, vocab)) &&
			      bok(be, targets, M_I32, (size_t) tokens),
		      -EINVAL);
	SLOT(be, cross_entropy_bwd);
	return be->ops->cross_entropy_bwd(be, st, dlogits, logits, targets, tokens, vocab,
					  grad_scale);
}

/* ---- optimizer --------------------------------------------------------- */

int kk_adamw(kk_backend *be, kk_stream *st, kk_buffer *master, kk_buffer *params,
	     const kk_buffer *grads, kk_buffer *m, kk_buffer *v, size_t n, const kk_adamw_params *p)
{
	CHECK_ST(be, st);
	assert_return(p && n > 0 && p->step >= 1, -EINVAL);
	assert_return(isfinite(p->lr) && p->lr >= 0 && p->beta1 >= 0 && p->beta1 < 1 &&
			      p->beta2 >= 0 && p->beta2 < 1 && p->eps > 0 && isfinite(p->eps) &&
			      isfinite(p->weight_decay) && p->weight_decay >= 0 &&
			      isfinite(p->grad_scale),
		      -EINVAL);
	assert_return(bok(be, master, M_F32, n) && bok(be, m, M_F32, n) && bok(be, v, M_F32, n) &&
			      bok(be, grads, OPM_ADAMW, n) && bopt(be, params, M_FLOAT, n),
		      -EINVAL);
	SLOT(be, adamw);
	return be->ops->adamw(be, st, master, params, grads, m, v, n, p);
}

int kk_grad_norm(kk_backend *be, kk_stream *st, kk_buffer *out, kk_buffer *const *grads,
		 size_t n_bufs)
{
	CHECK_ST(be, st);
	assert_return(grads && n_bufs > 0 && bok(be, out, M_F32, 1), -EINVAL);
	for (size_t i = 0; i < n_bufs; i++)
		assert_return(bok(be, grads[i], OPM_GRAD_NORM, 1), -EINVAL);
	SLOT(be, grad_norm);
	return be->ops->grad_norm(be, st, out, grads, n_bufs);
}

int kk_grad_clip(kk_backend *be, kk_stream *st, kk_buffer *const *grads, size_t n_bufs,
		 float max_norm, float *ret_norm)
{
	kk_buffer *out = NULL;
	float norm = 0;
	int r;

	CHECK_ST(be, st);
	assert_return(isfinite(max_norm) && max_norm > 0, -EINVAL);
	r = kk_buffer_alloc(be, KK_F32, 1, &out);
	if (r < 0)
		return r;
	r = kk_grad_norm(be, st, out, grads, n_bufs);
	if (r >= 0)
		r = kk_buffer_download(be, st, out, 0, &norm, sizeof(norm));
	kk_buffer_free(out);
	if (r < 0)
		return r;
	if (norm > max_norm) {
		float coef = max_norm / (norm + 1e-6f);
		for (size_t i = 0; i < n_bufs; i++) {
			r = kk_scale(be, st, grads[i], coef, grads[i]->count);
			if (r < 0)
				return r;
		}
	}
	if (ret_norm)
		*ret_norm = norm;
	return 0;
}

/* ---- sampling ---------------------------------------------------------- */

static bool sampling_ok(int64_t rows, int64_t vocab, const kk_sampling *p)
{
	return p && dim_ok(rows) && dim_ok(vocab) && vocab <= INT32_MAX &&
	       isfinite(p->temperature) && p->temperature >= 0 && p->top_k >= 0 &&
	       p->top_k <= KK_SAMPLE_TOP_K_MAX && isfinite(p->top_p) && p->top_p >= 0 &&
	       p->top_p <= 1;
}

int kk_sample(kk_backend *be, kk_stream *st, kk_buffer *ids, const kk_buffer *logits, int64_t rows,
	      int64_t vocab, const kk_sampling *p)
{
	CHECK_ST(be, st);
	assert_return(sampling_ok(rows, vocab, p), -EINVAL);
	assert_return(bok(be, logits, OPM_SAMPLE, mul2(rows, vocab)) &&
			      bok(be, ids, M_I32, (size_t) rows),
		      -EINVAL);
	SLOT(be, sample);
	return be->ops->sample(be, st, ids, logits, rows, vocab, p);
}

double kk_logsumexp_host(const float *x, int64_t n)
{
	if (!x || n < 1)
		return NAN;
	return kk__cpu_logsumexp(x, n);
}

int kk_sample_host(const float *logits, int64_t rows, int64_t vocab, const kk_sampling *p,
		   int32_t *ids)
{
	assert_return(logits && ids && sampling_ok(rows, vocab, p), -EINVAL);
	return kk__cpu_sample_host(logits, rows, vocab, p, ids);
}

/* ---- collectives ------------------------------------------------------- */

int kk_comm_get_id(kk_backend *be, void *id, size_t len)
{
	assert_return(be && id && len >= KK_COMM_ID_BYTES, -EINVAL);
	SLOT(be, comm_get_id);
	memset(id, 0, len);
	return be->ops->comm_get_id(be, id, len);
}

int kk_comm_init(kk_backend *be, int rank, int world, const void *id, size_t id_len, kk_comm **ret)
{
	kk_comm *c;
	int r;

	assert_return(be && ret && id && id_len >= KK_COMM_ID_BYTES, -EINVAL);
	assert_return(world > 0 && world <= KK_COMM_WORLD_MAX && rank >= 0 && rank < world,
		      -EINVAL);
	SLOT(be, comm_init);
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->be = be;
	c->rank = rank;
	c->world = world;
	r = be->ops->comm_init(c, id, id_len);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret = c;
	return 0;
}

kk_comm *kk_comm_free(kk_comm *c)
{
	if (!c)
		return NULL;
	if (c->be->ops->comm_free)
		c->be->ops->comm_free(c);
	free(c);
	return NULL;
}

int kk_comm_rank(const kk_comm *c)
{
	return c ? c->rank : -EINVAL;
}

int kk_comm_world(const kk_comm *c)
{
	return c ? c->world : -EINVAL;
}

static bool op_ok(kk_reduce_op op)
{
	return op == KK_SUM || op == KK_AVG || op == KK_MAX;
}

int kk_all_reduce(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send, size_t count,
		  kk_reduce_op op)
{
	assert_return(c && count > 0 && op_ok(op) && send, -EINVAL);
	CHECK_ST(c->be, st);
	assert_return(bok(c->be, send, OPM_ALL_REDUCE, count) &&
			      bok(c->be, recv, M(send->dtype), count),
		      -EINVAL);
	SLOT(c->be, all_reduce);
	return c->be->ops->all_reduce(c, st, recv, send, count, op);
}

int kk_reduce_scatter(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
		      size_t count, kk_reduce_op op)
{
	assert_return(c && count > 0 && op_ok(op) && send, -EINVAL);
	CHECK_ST(c->be, st);
	assert_return(bok(c->be, send, OPM_REDUCE_SCATTER, mul2((int64_t) count, c->world)) &&
			      bok(c->be, recv, M(send->dtype), count),
		      -EINVAL);
	SLOT(c->be, reduce_scatter);
	return c->be->ops->reduce_scatter(c, st, recv, send, count, op);
}

int kk_all_gather(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send, size_t count)
{
	assert_return(c && count > 0 && send, -EINVAL);
	CHECK_ST(c->be, st);
	assert_return(bok(c->be, send, OPM_ALL_GATHER, count) &&
			      bok(c->be, recv, M(send->dtype), mul2((int64_t) count, c->world)),
		      -EINVAL);
	SLOT(c->be, all_gather);
	return c->be->ops->all_gather(c, st, recv, send, count);
}

int kk_broadcast(kk_comm *c, kk_stream *st, kk_buffer *buf, size_t count, int root)
{
	assert_return(c && count > 0 && root >= 0 && root < c->world, -EINVAL);
	CHECK_ST(c->be, st);
	assert_return(bok(c->be, buf, OPM_BROADCAST, count), -EINVAL);
	SLOT(c->be, broadcast);
	return c->be->ops->broadcast(c, st, buf, count, root);
}
