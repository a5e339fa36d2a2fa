/* kernels/cpu/quant.c — the cpu backend's weight-only int8/int4
 * quantization: quantize, dequantize, and the quantized GEMV/GEMM.
 *
 * The quantized product dequantizes one weight row at a time (GEMV path,
 * small m, threads over output channels) or the whole matrix once and calls
 * sgemm (large m). */
#include <cblas.h>
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

/* From this many activation rows on, the quantized product dequantizes the
 * whole weight once and uses sgemm instead of the GEMV (as the float GEMV
 * of gemm.c: m <= 8). */
#define KK_CPU_QGEMM_GEMM_MIN_M 9

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
static void deq_row(const kk_qmatrix *q, int64_t row, float *out)
{
	size_t base = (size_t) row * q->k;
	if (q->qtype == KK_I8) {
		kk__deq_i8(out, (const int8_t *) q->data->ptr + base, LD(q->scales, row),
			   (size_t) q->k);
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

struct q_ctx {
	kk_qmatrix *q;
	const kk_qmatrix *cq;
	const kk_buffer *w, *x, *bias;
	kk_buffer *out;
	int64_t m;
	const float *xf;
	const float *xe; /* Q4 GEMV: [m][k/2] even elements of x, then [m][k/2] odd */
};

static int quant_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct q_ctx *c = p;
	kk_qmatrix *q = c->q;
	int64_t gsz = q->qtype == KK_I8 ? q->k : q->group, groups = q->k / gsz;
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

/* GEMV path: threads over output channels; each weight row is read once,
 * straight from its int8/int4 form, against every activation row. */
static int qgemv_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct q_ctx *c = p;
	const kk_qmatrix *q = c->cq;
	int64_t groups = q->qtype == KK_Q4 ? q->k / q->group : 1;
	_cleanup_free_ float *sc = malloc(groups * sizeof(float));
	_cleanup_free_ float *rows = c->m > 1 ? malloc(2 * q->k * sizeof(float)) : NULL;

	if (!sc || (c->m > 1 && !rows))
		return -ENOMEM;
	if (c->m > 1) {
		/* Several x rows: dequantize W rows in pairs (j even, j + 1, so
		 * the pairing never depends on the chunks) once into L1 and run
		 * them through the float GEMV's register tile, four x rows per
		 * pass, instead of widening every weight once per x row. */
		for (int64_t j = b; j < e;) {
			int nw = (j % 2 == 0 && j + 1 < e) ? 2 : 1;
			deq_row(q, j, rows);
			if (nw == 2)
				deq_row(q, j + 1, rows + q->k);
			for (int64_t i = 0; i < c->m; i += 4) {
				float s[8];
				int nx = (int) MIN(c->m - i, (int64_t) 4);
				kk__gemv_tile(s, c->xf + i * q->k, q->k, nx, rows,
					      nw == 2 ? rows + q->k : NULL, q->k);
				for (int r = 0; r < nx; r++)
					for (int w = 0; w < nw; w++)
						ST(c->out, (size_t) (i + r) * q->n + j + w,
						   s[r * 2 + w] + (c->bias ? LD(c->bias, j + w) : 0.0f));
			}
			j += nw;
		}
		return 0;
	}
	for (int64_t j = b; j < e; j++) {
		float bj = c->bias ? LD(c->bias, j) : 0.0f;
		size_t base = (size_t) j * q->k;
		kk__row_f32(sc, q->scales->ptr, q->scales->dtype, (size_t) j * groups, groups);
		for (int64_t i = 0; i < c->m; i++) {
			const float *x = c->xf + (size_t) i * q->k;
			float s;
			if (q->qtype == KK_I8)
				s = kk__dot_i8(x, (const int8_t *) q->data->ptr + base, q->k) *
				    sc[0];
			else
				s = kk__dot_q4_row(c->xe + (size_t) i * q->k / 2,
						   c->xe + (size_t) (c->m + i) * q->k / 2,
						   (const uint8_t *) q->data->ptr + base / 2, sc,
						   q->k, q->group);
			ST(c->out, (size_t) i * q->n + j, s + bj);
		}
	}
	return 0;
}

int kk__cpu_qgemm(kk_backend *be, kk_stream *st, kk_buffer *y, const kk_buffer *x,
		  const kk_qmatrix *w, const kk_buffer *bias, int64_t m)
{
	_cleanup_free_ float *x_own = NULL, *wf = NULL, *yf = NULL;
	float *xf;
	int r;

	r = kk__widen(x, (size_t) m * w->k, &xf, &x_own);
	if (r < 0)
		return r;
	if (m < KK_CPU_QGEMM_GEMM_MIN_M) {
		struct q_ctx c = { .cq = w, .out = y, .bias = bias, .m = m, .xf = xf };
		_cleanup_free_ float *split = NULL;
		if (w->qtype == KK_Q4 && m == 1) {
			size_t half = (size_t) w->k / 2;
			split = malloc((size_t) m * w->k * sizeof(float));
			if (!split)
				return -ENOMEM;
			for (int64_t i = 0; i < m; i++)
				for (size_t p = 0; p < half; p++) {
					split[i * half + p] = xf[i * w->k + 2 * p];
					split[(m + i) * half + p] = xf[i * w->k + 2 * p + 1];
				}
			c.xe = split;
		}
		return kk__parallel_for(w->n, (double) w->k * (2 + 2 * m), qgemv_range, &c);
	}

	wf = malloc((size_t) w->n * w->k * sizeof(float));
	yf = malloc((size_t) m * w->n * sizeof(float));
	if (!wf || !yf)
		return -ENOMEM;
	for (int64_t j = 0; j < w->n; j++)
		deq_row(w, j, wf + (size_t) j * w->k);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int) m, (int) w->n, (int) w->k, 1.0f,
		    xf, (int) w->k, wf, (int) w->k, 0.0f, yf, (int) w->n);
	for (int64_t i = 0; i < m; i++)
		for (int64_t j = 0; j < w->n; j++)
			ST(y, (size_t) i * w->n + j,
			   yf[(size_t) i * w->n + j] + (bias ? LD(bias, j) : 0.0f));
	return 0;
}
