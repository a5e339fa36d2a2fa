/* convert.c — GGUF block dequantizers and conversion of file tensors to
 * the kk host layouts (f32/bf16/f16 arrays, int8 per-channel, int4 grouped).
 *
 * The dequantizers follow the block layouts of ggml's docs and
 * ggml-quants.h (block_q8_0, block_q4_0, block_q4_1, block_q4_K,
 * block_q6_K); they are written from those layouts, and the tests check
 * them against values generated independently in Python.  Quantization
 * reproduces kk_quantize's rule (kernels/kk/cpu/quant.c) so that a weight
 * loaded through kmf equals the same weight quantized by kk. */
#include <math.h>

#include "kmf_internal.h"

/* Elements converted per step: bounds the temporary f32 buffer. */
#define CHUNK_ELEMS 8192 /* a multiple of every block size */

static void dq_q8_0(const uint8_t *b, float *y)
{
	float d = kmf__f16_to_f32(kmf__ld16(b));
	for (int i = 0; i < 32; i++)
		y[i] = d * (float) (int8_t) b[2 + i];
}

static void dq_q4_0(const uint8_t *b, float *y)
{
	float d = kmf__f16_to_f32(kmf__ld16(b));
	for (int i = 0; i < 16; i++) {
		y[i] = d * (float) ((b[2 + i] & 0x0f) - 8);
		y[i + 16] = d * (float) ((b[2 + i] >> 4) - 8);
	}
}

static void dq_q4_1(const uint8_t *b, float *y)
{
	float d = kmf__f16_to_f32(kmf__ld16(b)), m = kmf__f16_to_f32(kmf__ld16(b + 2));
	for (int i = 0; i < 16; i++) {
		y[i] = d * (float) (b[4 + i] & 0x0f) + m;
		y[i + 16] = d * (float) (b[4 + i] >> 4) + m;
	}
}

/* The 8 6-bit (scale, min) pairs of a Q4_K super-block, packed in 12 bytes:
 * pairs 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); pairs
 * 4-7 in the nibbles of bytes 8-11 with their top 2 bits in the high bits
 * of bytes 0-7. */
static void q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	} else {
		*sc = (uint8_t) ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
		*mn = (uint8_t) ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

static void dq_q4_k(const uint8_t *b, float *y)
{
	float d = kmf__f16_to_f32(kmf__ld16(b)), dmin = kmf__f16_to_f32(kmf__ld16(b + 2));
	const uint8_t *scales = b + 4, *q = b + 16;
	/* 4 chunks of 64 values: 32 low nibbles then 32 high nibbles of 32
	 * bytes, each half with its own (scale, min). */
	for (int c = 0; c < 4; c++) {
		uint8_t sc, mn;
		float d1, m1, d2, m2;
		q4k_scale_min(2 * c, scales, &sc, &mn);
		d1 = d * sc, m1 = dmin * mn;
		q4k_scale_min(2 * c + 1, scales, &sc, &mn);
		d2 = d * sc, m2 = dmin * mn;
		for (int l = 0; l < 32; l++) {
			y[64 * c + l] = d1 * (float) (q[32 * c + l] & 0x0f) - m1;
			y[64 * c + 32 + l] = d2 * (float) (q[32 * c + l] >> 4) - m2;
		}
	}
}

static void dq_q6_k(const uint8_t *b, float *y)
{
	const uint8_t *ql = b, *qh = b + 128;
	const int8_t *sc = (const int8_t *) (b + 192);
	float d = kmf__f16_to_f32(kmf__ld16(b + 208));
	/* 2 halves of 128 values; value = 4 low bits from ql, 2 high bits
	 * from qh, minus 32, times d * the int8 scale of its 16 values. */
	for (int h = 0; h < 2; h++) {
		for (int l = 0; l < 32; l++) {
			int is = l / 16;
			int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
			int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
			int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
			int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
			y[l] = d * (float) sc[is] * (float) q1;
			y[l + 32] = d * (float) sc[is + 2] * (float) q2;
			y[l + 64] = d * (float) sc[is + 4] * (float) q3;
			y[l + 96] = d * (float) sc[is + 6] * (float) q4;
		}
		y += 128;
		ql += 64;
		qh += 32;
		sc += 8;
	}
}

int kmf_dequantize(kmf_dtype dt, const void *src, size_t nblocks, float *dst)
{
	void (*fn)(const uint8_t *, float *);
	unsigned bb = kmf_dtype_block_bytes(dt), be = kmf_dtype_block_elems(dt);
	assert_return(src && dst, -EINVAL);
	switch (dt) {
	case KMF_Q8_0:
		fn = dq_q8_0;
		break;
	case KMF_Q4_0:
		fn = dq_q4_0;
		break;
	case KMF_Q4_1:
		fn = dq_q4_1;
		break;
	case KMF_Q4_K:
		fn = dq_q4_k;
		break;
	case KMF_Q6_K:
		fn = dq_q6_k;
		break;
	default:
		return -EINVAL;
	}
	for (size_t i = 0; i < nblocks; i++)
		fn((const uint8_t *) src + i * bb, dst + i * be);
	return 0;
}

/* f32 values of elements [start, start + n) of t; start and n are
 * multiples of the block size. */
static int read_f32(const kmf_tensor *t, size_t start, size_t n, float *out)
{
	const uint8_t *p = t->data;
	switch (t->dtype) {
	case KMF_F32:
		memcpy(out, p + start * 4, n * 4);
		return 0;
	case KMF_F16:
		for (size_t i = 0; i < n; i++)
			out[i] = kmf__f16_to_f32(kmf__ld16(p + (start + i) * 2));
		return 0;
	case KMF_BF16:
		for (size_t i = 0; i < n; i++)
			out[i] = kk_bf16_to_f32(kmf__ld16(p + (start + i) * 2));
		return 0;
	case KMF_F64:
		for (size_t i = 0; i < n; i++) {
			uint64_t u = kmf__ld64(p + (start + i) * 8);
			double v;
			memcpy(&v, &u, 8);
			out[i] = (float) v;
		}
		return 0;
	default:
		if (!kmf_dtype_is_float(t->dtype))
			return -EOPNOTSUPP;
		return kmf_dequantize(t->dtype, p + start / t->block_elems * t->block_bytes,
				      n / t->block_elems, out);
	}
}

int kmf_tensor_to_float(const kmf_tensor *t, kk_dtype dst_dt, void *out, size_t count)
{
	_cleanup_free_ float *tmp = NULL;
	size_t esz;
	assert_return(t && out, -EINVAL);
	assert_return(dst_dt == KK_F32 || dst_dt == KK_BF16 || dst_dt == KK_F16, -EINVAL);
	assert_return(count == (size_t) t->nelem, -EINVAL);
	if (!kmf_dtype_is_float(t->dtype))
		return -EOPNOTSUPP;
	esz = dst_dt == KK_F32 ? 4 : 2;
	/* Same dtype: the bits as stored. */
	if ((dst_dt == KK_F32 && t->dtype == KMF_F32) ||
	    (dst_dt == KK_F16 && t->dtype == KMF_F16) ||
	    (dst_dt == KK_BF16 && t->dtype == KMF_BF16)) {
		memcpy(out, t->data, count * esz);
		return 0;
	}
	if (dst_dt == KK_F32)
		return read_f32(t, 0, count, out);
	tmp = malloc(CHUNK_ELEMS * sizeof(float));
	if (!tmp)
		return -ENOMEM;
	for (size_t s = 0; s < count; s += CHUNK_ELEMS) {
		size_t n = MIN((size_t) CHUNK_ELEMS, count - s);
		int r = read_f32(t, s, n, tmp);
		if (r < 0)
			return r;
		r = kk_convert_host(dst_dt, (uint8_t *) out + s * esz, KK_F32, tmp, n);
		if (r < 0)
			return r;
	}
	return 0;
}

/* The scale as kk stores it (f16 rounds it), and stores it. */
static float put_scale(kk_dtype dt, void *scales, size_t i, float s)
{
	if (dt == KK_F16) {
		uint16_t h;
		kk_convert_host(KK_F16, &h, KK_F32, &s, 1);
		memcpy((uint8_t *) scales + i * 2, &h, 2);
		return kmf__f16_to_f32(h);
	}
	memcpy((uint8_t *) scales + i * 4, &s, 4);
	return s;
}

/* kk_quantize's rule for one group of g values. */
static void quant_group(const float *x, int64_t g, float qmin, float qmax, kk_dtype sdt,
			void *scales, size_t si, int8_t *codes)
{
	float amax = 0, s, inv;
	for (int64_t j = 0; j < g; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	s = put_scale(sdt, scales, si, amax / qmax);
	inv = s > 0 ? 1.0f / s : 0.0f;
	for (int64_t j = 0; j < g; j++)
		codes[j] = (int8_t) CLAMP(rintf(x[j] * inv), qmin, qmax);
}

static int check_2d(const kmf_tensor *t, kk_dtype scale_dt)
{
	assert_return(t, -EINVAL);
	assert_return(t->ndim == 2 && t->shape[0] > 0 && t->shape[1] > 0, -EINVAL);
	assert_return(scale_dt == KK_F32 || scale_dt == KK_F16, -EINVAL);
	if (!kmf_dtype_is_float(t->dtype))
		return -EINVAL;
	return 0;
}

static void pack_q4(const int8_t *codes, int64_t n, uint8_t *dst)
{
	for (int64_t j = 0; j < n; j += 2)
		dst[j / 2] =
			(uint8_t) (((codes[j] + 8) & 0x0f) | (((codes[j + 1] + 8) & 0x0f) << 4));
}

/* Quantizes every row of t [n, k] by kk_quantize's rule in groups of
 * `group` (k: per channel): int8 codes to i8, or (i8 NULL) 4-bit codes
 * packed to q4. */
static int quant_rows(const kmf_tensor *t, int64_t group, kk_dtype scale_dt, void *scales,
		      int8_t *i8, uint8_t *q4)
{
	const int64_t n = t->shape[0], k = t->shape[1], groups = k / group;
	const float qmin = i8 ? -127.0f : -8.0f, qmax = i8 ? 127.0f : 7.0f;
	_cleanup_free_ float *row = malloc((size_t) k * sizeof(float));
	_cleanup_free_ int8_t *packing = i8 ? NULL : malloc((size_t) k);
	if (!row || (!i8 && !packing))
		return -ENOMEM;
	for (int64_t i = 0; i < n; i++) {
		int8_t *codes = i8 ? i8 + i * k : packing;
		int r = read_f32(t, (size_t) (i * k), (size_t) k, row);
		if (r < 0)
			return r;
		for (int64_t g = 0; g < groups; g++)
			quant_group(row + g * group, group, qmin, qmax, scale_dt, scales,
				    (size_t) (i * groups + g), codes + g * group);
		if (!i8)
			pack_q4(codes, k, q4 + i * k / 2);
	}
	return 0;
}

/* A quantized conversion's end: *exact (may be NULL) says whether the
 * codes and scales are the source's own. */
static int converted(int r, bool *exact, bool native)
{
	if (r >= 0 && exact)
		*exact = native;
	return r;
}

int kmf_tensor_to_i8(const kmf_tensor *t, kk_dtype scale_dt, int8_t *q, void *scales)
{
	int r = check_2d(t, scale_dt);
	if (r < 0)
		return r;
	assert_return(q && scales, -EINVAL);
	return quant_rows(t, t->shape[1], scale_dt, scales, q, NULL);
}

int kmf_tensor_to_i8_g32(const kmf_tensor *t, kk_dtype scale_dt, int8_t *q, void *scales,
			 bool *exact)
{
	int r = check_2d(t, scale_dt);
	if (r < 0)
		return r;
	assert_return(q && scales, -EINVAL);
	assert_return(t->shape[1] % 32 == 0, -EINVAL);
	if (t->dtype != KMF_Q8_0)
		return converted(quant_rows(t, 32, scale_dt, scales, q, NULL), exact, false);
	/* ggml's block: an f16 scale, then 32 int8 codes in order. */
	const uint8_t *b = t->data;
	for (int64_t blk = 0; blk < t->nelem / 32; blk++, b += 34) {
		memcpy(q + blk * 32, b + 2, 32);
		/* exact: an f16 value round-trips through f32 */
		put_scale(scale_dt, scales, (size_t) blk, kmf__f16_to_f32(kmf__ld16(b)));
	}
	return converted(0, exact, true);
}

int kmf_tensor_to_q4(const kmf_tensor *t, int group, kk_dtype scale_dt, uint8_t *q, void *scales,
		     bool *exact)
{
	int r = check_2d(t, scale_dt);
	if (r < 0)
		return r;
	assert_return(q && scales, -EINVAL);
	assert_return(group == 32 || group == 64 || group == 128, -EINVAL);
	assert_return(t->shape[1] % group == 0, -EINVAL);
	if (t->dtype != KMF_Q4_0 || group != 32)
		return converted(quant_rows(t, group, scale_dt, scales, NULL, q), exact, false);
	/* Same codes and scale: repack the nibbles (ggml: element i in the
	 * low nibble of byte i, element i + 16 in its high nibble; kk:
	 * elements 2m and 2m + 1 in byte m). */
	const uint8_t *b = t->data;
	for (int64_t blk = 0; blk < t->nelem / 32; blk++, b += 18) {
		uint8_t nib[32];
		for (int i = 0; i < 16; i++) {
			nib[i] = b[2 + i] & 0x0f;
			nib[i + 16] = b[2 + i] >> 4;
		}
		for (int m = 0; m < 16; m++)
			q[blk * 16 + m] = (uint8_t) (nib[2 * m] | (nib[2 * m + 1] << 4));
		/* exact: an f16 value round-trips through f32 */
		put_scale(scale_dt, scales, (size_t) blk, kmf__f16_to_f32(kmf__ld16(b)));
	}
	return converted(0, exact, true);
}
