/* kernels/kk/cpu/quant.c — the cpu backend's weight-only int8/int4
 * quantization: quantize, dequantize, and the quantized GEMV/GEMM.
 *
 * The quantized product quantizes the activations to int8 per 32-block and
 * runs integer dot products (qdot.c) for every m: decode GEMV and prefill
 * alike. */
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

/* ---- quantization ------------------------------------------------------ */

static inline void q4_set(uint8_t *p, size_t j, int q)
{
	uint8_t nib = (uint8_t) (q + 8) & 0x0f;
	if (j & 1)
		p[j / 2] = (uint8_t) ((p[j / 2] & 0x0f) | (nib << 4));
	else
		p[j / 2] = (uint8_t) ((p[j / 2] & 0xf0) | nib);
}

/* Dequantizes row `row` of q into f32 out[k] (simd.c's vector loops; Q4
 * scales are widened to f32 256 groups at a time). */
static void deq_row_packed(const kk_qmatrix *q, int64_t row, float *out);

static void deq_row(const kk_qmatrix *q, int64_t row, float *out)
{
	size_t base = (size_t) row * q->k;
	if (q->pack && row < q->n / KK_QPACK * KK_QPACK) {
		deq_row_packed(q, row, out);
		return;
	}
	if (q->qtype == KK_I8 && !q->group) {
		kk__deq_i8(out, (const int8_t *) q->data->ptr + base, LD(q->scales, row),
			   (size_t) q->k);
		return;
	}
	if (q->qtype == KK_I8) {
		int64_t groups = q->k / q->group;
		for (int64_t g = 0; g < groups; g++)
			kk__deq_i8(out + g * q->group,
				   (const int8_t *) q->data->ptr + base + (size_t) (g * q->group),
				   LD(q->scales, (size_t) (row * groups + g)), (size_t) q->group);
		return;
	}
	int64_t groups = q->k / q->group;
	float sc[256];
	for (int64_t g0 = 0; g0 < groups; g0 += 256) {
		int64_t ng = MIN(groups - g0, (int64_t) 256);
		size_t off = base + (size_t) (g0 * q->group);
		kk__row_f32(sc, q->scales->ptr, q->scales->dtype, (size_t) (row * groups + g0),
			    (size_t) ng);
		kk__deq_q4(out + g0 * q->group, (const uint8_t *) q->data->ptr + off / 2, sc,
			   (size_t) (ng * q->group), (size_t) q->group);
	}
}

/* ---- the packed layout (kk_qmatrix_pack) -------------------------------
 *
 * Rows 8g .. 8g+7 (g < n / 8) keep their bytes (8 rows' worth) but are
 * stored block by block: block b of the group is 8 chunks (int8) or 4
 * (int4) of 32 bytes, and bytes 4i .. 4i+3 of a chunk belong to row i, so
 * lane i of a 256-bit load is row i:
 *   int8  chunk v (0..7): elements 32b + 4v .. + 3 of each row, + 128 (u8);
 *   int4  chunk v (0..3): low nibbles elements 32b + 4v .. + 3, high
 *         nibbles elements 32b + 16 + 4v .. + 3, each + 8 (as stored).
 * Scales (group 32..128): group g's 8 x (k / group) scales in the same
 * place, scale group s of row i at 8s + i; per-channel scales unchanged.
 * Rows past the last whole group stay row after row.  Same bytes, so no
 * memory beyond one group's scratch while packing. */

static inline int q4_get(const uint8_t *row, int64_t e)
{
	return (row[e / 2] >> (4 * (e & 1))) & 15;
}

static void deq_row_packed(const kk_qmatrix *q, int64_t row, float *out)
{
	const bool q4 = q->qtype == KK_Q4;
	const int64_t k = q->k, nb = k / KK_QBLOCK, g = row / KK_QPACK, i = row % KK_QPACK;
	const size_t rowb = q4 ? (size_t) k / 2 : (size_t) k;
	const uint8_t *grp = (const uint8_t *) q->data->ptr + (size_t) g * KK_QPACK * rowb;
	const int64_t ngr = q->group ? k / q->group : 0;
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *blk = grp + b * (q4 ? 128 : 256);
		float sc =
			q->group
				? LD(q->scales,
				     (size_t) ((g * ngr + b * KK_QBLOCK / q->group) * KK_QPACK + i))
				: LD(q->scales, (size_t) row);
		float *o = out + b * KK_QBLOCK;
		if (q4)
			for (int v = 0; v < 4; v++)
				for (int t = 0; t < 4; t++) {
					uint8_t byte = blk[v * 32 + 4 * i + t];
					o[4 * v + t] = (float) ((byte & 15) - 8) * sc;
					o[16 + 4 * v + t] = (float) ((byte >> 4) - 8) * sc;
				}
		else
			for (int v = 0; v < 8; v++)
				for (int t = 0; t < 4; t++)
					o[4 * v + t] =
						(float) ((int) blk[v * 32 + 4 * i + t] - 128) * sc;
	}
}

struct qpack_ctx {
	kk_qmatrix *q;
	uint8_t *scratch; /* one group's bytes (or scales) per chunk */
	size_t per_chunk;
};

/* Groups [b, e) of q into the packed layout. */
static int qpack_range(void *p, int64_t b, int64_t e, int chunk)
{
	const struct qpack_ctx *c = p;
	kk_qmatrix *q = c->q;
	const bool q4 = q->qtype == KK_Q4;
	const int64_t k = q->k, nb = k / KK_QBLOCK, ngr = q->group ? k / q->group : 0;
	const size_t rowb = q4 ? (size_t) k / 2 : (size_t) k, gb = KK_QPACK * rowb;
	const size_t es = kk_dtype_size(q->scales->dtype, 1), gsb = KK_QPACK * ngr * es;
	uint8_t *tmp = c->scratch + (size_t) chunk * c->per_chunk;
	for (int64_t g = b; g < e; g++) {
		uint8_t *dst = (uint8_t *) q->data->ptr + (size_t) g * gb;
		memcpy(tmp, dst, gb);
		for (int i = 0; i < KK_QPACK; i++) {
			const uint8_t *row = tmp + i * rowb;
			for (int64_t bl = 0; bl < nb; bl++) {
				uint8_t *blk = dst + bl * (q4 ? 128 : 256) + 4 * i;
				if (q4) {
					/* row's bytes 16 bl .. + 15: elements 2j, 2j+1 */
					uint8_t code[KK_QBLOCK];
					for (int j = 0; j < KK_QBLOCK / 2; j++) {
						code[2 * j] = row[bl * 16 + j] & 15;
						code[2 * j + 1] = row[bl * 16 + j] >> 4;
					}
					for (int v = 0; v < 4; v++)
						for (int t = 0; t < 4; t++)
							blk[v * 32 + t] =
								(uint8_t) (code[4 * v + t] |
									   code[16 + 4 * v + t]
										   << 4);
				} else {
					for (int v = 0; v < 8; v++)
						for (int t = 0; t < 4; t++)
							blk[v * 32 + t] =
								row[bl * KK_QBLOCK + 4 * v + t] ^
								0x80;
				}
			}
		}
		if (!ngr)
			continue;
		uint8_t *sdst = (uint8_t *) q->scales->ptr + (size_t) g * gsb;
		memcpy(tmp, sdst, gsb);
		for (int i = 0; i < KK_QPACK; i++)
			for (int64_t sg = 0; sg < ngr; sg++)
				memcpy(sdst + (sg * KK_QPACK + i) * es, tmp + (i * ngr + sg) * es,
				       es);
	}
	return 0;
}

int kk__cpu_qpack(kk_backend *be, kk_qmatrix *q)
{
	(void) be;
	const char *env = getenv("KK_CPU_QPACK");
	if (q->pack)
		return 1;
	if ((env && streq(env, "0")) || q->k % KK_QBLOCK || q->n < KK_QPACK)
		return 0;
	/* Every chunk's scratch first: nothing is moved unless all of it
	 * can be. */
	const int64_t ngroups = q->n / KK_QPACK, ngr = q->group ? q->k / q->group : 0;
	const double cost = (double) KK_QPACK * q->k;
	const size_t rowb = q->qtype == KK_Q4 ? (size_t) q->k / 2 : (size_t) q->k;
	struct qpack_ctx c = { .q = q,
			       .per_chunk =
				       MAX(KK_QPACK * rowb,
					   KK_QPACK * ngr * kk_dtype_size(q->scales->dtype, 1)) };
	_cleanup_free_ uint8_t *scratch =
		malloc((size_t) kk__parallel_chunks(ngroups, cost) * c.per_chunk);
	if (!scratch)
		return -ENOMEM;
	c.scratch = scratch;
	int r = kk__parallel_for(ngroups, cost, qpack_range, &c);
	if (r < 0)
		return r;
	q->pack = KK_QPACK;
	return 1;
}

struct q_ctx {
	kk_qmatrix *q;
	const kk_qmatrix *cq;
	const kk_buffer *w, *x, *bias;
	kk_buffer *out;
};

static int quant_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct q_ctx *c = p;
	kk_qmatrix *q = c->q;
	int64_t gsz = q->group ? q->group : q->k, groups = q->k / gsz;
	float qmax = q->qtype == KK_I8 ? 127.0f : 7.0f, qmin = q->qtype == KK_I8 ? -127.0f : -8.0f;
	_cleanup_free_ float *row = malloc(q->k * sizeof(float));
	if (!row)
		return -ENOMEM;

	for (int64_t r = b; r < e; r++) {
		size_t base = (size_t) r * q->k;
		kk__row_f32(row, c->w->ptr, c->w->dtype, base, q->k);
		for (int64_t g = 0; g < groups; g++) {
			float amax = 0, s, inv;
			for (int64_t j = g * gsz; j < (g + 1) * gsz; j++)
				amax = fmaxf(amax, fabsf(row[j]));
			/* Quantize against the scale as stored (f16 rounds it). */
			s = kk__round(q->scales->dtype, amax / qmax);
			ST(q->scales, (size_t) r * groups + g, s);
			inv = s > 0 ? 1.0f / s : 0.0f;
			for (int64_t j = g * gsz; j < (g + 1) * gsz; j++) {
				float v = CLAMP(rintf(row[j] * inv), qmin, qmax);
				if (q->qtype == KK_I8)
					((int8_t *) q->data->ptr)[base + j] = (int8_t) v;
				else
					q4_set(q->data->ptr, base + j, (int) v);
			}
		}
	}
	return 0;
}

int kk__cpu_quantize(kk_backend *be, kk_stream *st, kk_qmatrix *q, const kk_buffer *w)
{
	struct q_ctx c = { .q = q, .w = w };
	q->pack = 0; /* written row after row */
	return kk__parallel_for(q->n, (double) q->k * 6, quant_range, &c);
}

static int dequant_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct q_ctx *c = p;
	_cleanup_free_ float *row = malloc(c->cq->k * sizeof(float));
	if (!row)
		return -ENOMEM;
	for (int64_t r = b; r < e; r++) {
		deq_row(c->cq, r, row);
		kk__row_store(c->out->ptr, c->out->dtype, (size_t) r * c->cq->k, row, c->cq->k);
	}
	return 0;
}

int kk__cpu_dequantize(kk_backend *be, kk_stream *st, kk_buffer *w, const kk_qmatrix *q)
{
	struct q_ctx c = { .cq = q, .out = w };
	return kk__parallel_for(q->n, (double) q->k * 3, dequant_range, &c);
}

/* The product: X quantized per 32-block to int8 (qdot.c), then threads
 * over output channels; each weight row (a pair of rows where two fall in
 * one chunk) is read once, from its int8/int4 form, against every X row in
 * tiles of 4 (the integer dot tiles of qdot.c).  One path for every m: W's
 * rows stay in L1 while the quantized X (m * k bytes) streams from L2.
 * A packed matrix (kk__cpu_qpack) goes through pqgemm_range instead: the
 * same plan, a group of 8 rows at a time. */
struct qg_ctx {
	const kk_qmatrix *w;
	const kk_buffer *bias;
	kk_buffer *y;
	int64_t m;
	const float *xf;
	kk__qact act;
	const kk__qdot_impl *impl;
};

static int qact_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct qg_ctx *c = p;
	for (int64_t r = b; r < e; r++)
		kk__qact_quantize(&c->act, r, c->xf + r * c->w->k, c->w->qtype == KK_Q4);
	return 0;
}

/* Weight row j's scale for each 32-block: f32 scales of group 32 as
 * stored, else converted / spread into ws[nb]; per-channel int8 gets NULL
 * (all ones: the caller applies the row's scale to the sum). */
static const float *row_scales(const kk_qmatrix *q, int64_t j, float *ws)
{
	if (q->group == 0)
		return NULL;
	if (q->group == KK_QBLOCK && q->scales->dtype == KK_F32)
		return (const float *) q->scales->ptr + j * (q->k / KK_QBLOCK);
	int64_t groups = q->k / q->group, per = q->group / KK_QBLOCK;
	kk__row_f32(ws, q->scales->ptr, q->scales->dtype, (size_t) (j * groups), (size_t) groups);
	/* Spread in place from the end: group g's blocks start at g * per >= g. */
	for (int64_t g = groups - 1; g >= 0 && per > 1; g--) {
		float s = ws[g];
		for (int64_t i = per - 1; i >= 0; i--)
			ws[g * per + i] = s;
	}
	return ws;
}

static int qgemm_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct qg_ctx *c = p;
	const kk_qmatrix *q = c->w;
	const int64_t nb = c->act.nb, k = q->k;
	const size_t rowb = q->qtype == KK_Q4 ? (size_t) k / 2 : (size_t) k;
	const kk__qtile_fn tile = q->qtype == KK_Q4 ? c->impl->q4 : c->impl->i8;
	_cleanup_free_ float *ws = malloc(2 * (size_t) nb * sizeof(float));

	if (!ws)
		return -ENOMEM;
	for (int64_t j = b; j < e;) {
		int nw = (j % 2 == 0 && j + 1 < e) ? 2 : 1;
		const void *w[2];
		const float *wsp[2];
		float bj[2] = { 0, 0 }, sj[2] = { 1, 1 };
		for (int cc = 0; cc < nw; cc++) {
			w[cc] = (const uint8_t *) q->data->ptr + (size_t) (j + cc) * rowb;
			wsp[cc] = row_scales(q, j + cc, ws + cc * nb);
			if (!q->group)
				sj[cc] = LD(q->scales, j + cc);
			if (c->bias)
				bj[cc] = LD(c->bias, j + cc);
		}
		for (int64_t i = 0; i < c->m; i += 4) {
			float s[8];
			int nx = (int) MIN(c->m - i, (int64_t) 4);
			tile(s, &c->act, i, nx, w, wsp, nw, k);
			for (int r = 0; r < nx; r++)
				for (int cc = 0; cc < nw; cc++)
					ST(c->y, (size_t) (i + r) * q->n + j + cc,
					   s[r * 2 + cc] * sj[cc] + bj[cc]);
		}
		j += nw;
	}
	return 0;
}

/* Packed weights: row `row` past the last whole group (stored row after
 * row) against activation row r, in the natural code order. */
static float ptail_dot(const kk_qmatrix *q, const kk__qact *a, int64_t r, int64_t row)
{
	const bool q4 = q->qtype == KK_Q4;
	const int64_t k = q->k, nb = k / KK_QBLOCK, ngr = q->group ? k / q->group : 0;
	const uint8_t *wr = (const uint8_t *) q->data->ptr + (size_t) row * (q4 ? k / 2 : k);
	const int8_t *xq = a->q + r * a->ldq;
	float acc = 0;
	for (int64_t b = 0; b < nb; b++) {
		int32_t t = 0;
		for (int64_t e = b * KK_QBLOCK; e < (b + 1) * KK_QBLOCK; e++)
			t += (q4 ? q4_get(wr, e) - 8 : (int8_t) wr[e]) * xq[e];
		float ws = ngr ? LD(q->scales, (size_t) (row * ngr + b * KK_QBLOCK / q->group)) : 1;
		acc = fmaf((float) t, a->d[r * a->nb + b] * ws, acc);
	}
	return acc;
}

static int pqact_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct qg_ctx *c = p;
	for (int64_t r = b; r < e; r++)
		c->impl->qact_p(&c->act, r, c->xf + r * c->w->k);
	return 0;
}

/* Packed weights: groups [b, e) of KK_QPACK rows (the last one, when n is
 * not a multiple, the rows past the whole groups), each read once against
 * every X row in tiles of up to 8 (vnni) or 4 X rows (qdot.c's packed
 * tiles): the group (8 x k codes, 3-16 KiB) stays in L1 while X streams
 * from L2. */
static int pqgemm_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct qg_ctx *c = p;
	const kk_qmatrix *q = c->w;
	const int64_t k = q->k, nb = k / KK_QBLOCK, ngr = q->group ? k / q->group : 0;
	const size_t rowb = q->qtype == KK_Q4 ? (size_t) k / 2 : (size_t) k;
	const size_t es = kk_dtype_size(q->scales->dtype, 1);
	const kk__qptile_fn tile = q->qtype == KK_Q4 ? c->impl->p4 : c->impl->p8;
	const int sdt = !ngr ? KK_QS_NONE : q->scales->dtype == KK_F16 ? KK_QS_F16 : KK_QS_F32;
	const int sshift = ngr ? __builtin_ctz((unsigned) (q->group / KK_QBLOCK)) : 0;
	const bool yf32 = kk_buffer_dtype(c->y) == KK_F32;

	for (int64_t g = b; g < e; g++) {
		const int64_t j0 = g * KK_QPACK, nw = MIN((int64_t) KK_QPACK, q->n - j0);
		float bj[KK_QPACK] = { 0 }, sj[KK_QPACK];
		for (int i = 0; i < nw; i++) {
			sj[i] = ngr ? 1.0f : LD(q->scales, (size_t) (j0 + i));
			if (c->bias)
				bj[i] = LD(c->bias, (size_t) (j0 + i));
		}
		if (nw < KK_QPACK) { /* the rows after the last group */
			for (int64_t r = 0; r < c->m; r++)
				for (int i = 0; i < nw; i++)
					ST(c->y, (size_t) (r * q->n + j0 + i),
					   ptail_dot(q, &c->act, r, j0 + i) * sj[i] + bj[i]);
			continue;
		}
		const uint8_t *wg = (const uint8_t *) q->data->ptr + (size_t) j0 * rowb;
		const void *ws = (const uint8_t *) q->scales->ptr + (size_t) (j0 * ngr) * es;
		for (int64_t r0 = 0; r0 < c->m; r0 += c->impl->pnx) {
			float s[KK_QPTILE_MAX * 8];
			int nx = (int) MIN(c->m - r0, (int64_t) c->impl->pnx);
			tile(s, &c->act, r0, nx, wg, ws, sdt, sshift, nb);
			if (yf32) { /* 8 lanes at a time */
				typedef float v8 __attribute__((vector_size(32)));
				v8 vs, vj, vb;
				memcpy(&vj, sj, sizeof(vj));
				memcpy(&vb, bj, sizeof(vb));
				for (int r = 0; r < nx; r++) {
					memcpy(&vs, s + r * 8, sizeof(vs));
					vs = vs * vj + vb;
					memcpy((float *) c->y->ptr + (r0 + r) * q->n + j0, &vs,
					       sizeof(vs));
				}
				continue;
			}
			for (int r = 0; r < nx; r++)
				for (int i = 0; i < KK_QPACK; i++)
					ST(c->y, (size_t) ((r0 + r) * q->n + j0 + i),
					   s[r * 8 + i] * sj[i] + bj[i]);
		}
	}
	return 0;
}

/* Work (KK_QPACK * k * (1 + m) a group) per chunk of a packed product on
 * the pool: a few microseconds (s15m's 288 x 288 layers at m = 128: two
 * groups), so that the thread that finishes first waits at most that long
 * for the other's last chunk, where 4 chunks a thread (4-5 groups each)
 * left it up to an eighth of the product.  s15m q4_0 prefill, 2 threads:
 * docs/kernels.md, "Decode's cache reads and small prefill chunks". */
#define KK_QGEMM_CHUNK_WORK (double) (1 << 19)
/* ... for products of at least this many activation rows: fewer rows read
 * the weights from memory, and chunks of one or two groups broke the
 * weight stream between the threads (its prefetch runs past a chunk's end):
 * s110m 8-sequence decode at 2 threads lost 10 %. */
#define KK_QGEMM_FINE_M 32

int kk__cpu_qgemm(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x,
		  const kk_qmatrix *w, const kk_buffer *bias, int64_t m)
{
	_cleanup_free_ float *x_own = NULL;
	struct qg_ctx c = { .w = w, .bias = bias, .y = y, .m = m, .impl = kk__qdot() };
	float *xf;
	int r;

	r = kk__widen(x, (size_t) m * w->k, &xf, &x_own);
	if (r < 0)
		return r;
	c.xf = xf;
	r = kk__qact_init(&c.act, m, w->k);
	if (r >= 0 && w->pack) {
		c.act.xoff = w->qtype == KK_Q4 ? 8 : 128;
		r = kk__parallel_for(m, (double) w->k * 4, pqact_range, &c);
		if (r >= 0)
			r = kk__parallel_for_fine((w->n + KK_QPACK - 1) / KK_QPACK,
						  (double) KK_QPACK * w->k * (1 + m),
						  m >= KK_QGEMM_FINE_M ? KK_QGEMM_CHUNK_WORK
								       : INFINITY,
						  pqgemm_range, &c);
		kk__qact_free(&c.act);
		return r;
	}
	if (r >= 0)
		r = kk__parallel_for(m, (double) w->k * 4, qact_range, &c);
	if (r >= 0)
		r = kk__parallel_for(w->n, (double) w->k * (1 + m), qgemm_range, &c);
	kk__qact_free(&c.act);
	return r;
}
