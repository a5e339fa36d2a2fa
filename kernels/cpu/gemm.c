/* kernels/cpu/gemm.c — the cpu backend's GEMM (OpenBLAS sgemm).
 *
 * bf16/f16 inputs are widened to f32 scratch and multiplied with sgemm, so
 * accumulation is f32 as the API promises; bias and the GELU/SiLU
 * epilogues run on the f32 result before one rounding on store. */
#include <cblas.h>
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

static size_t gspan(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld)
{
	return (size_t) ((batch - 1) * stride + (rows - 1) * ld + cols);
}

struct epi_ctx {
	float *c;
	int64_t ldc, n;
	const float *bias;
	kk_epilogue epi;
};

/* Bias and activation on rows [b, e) of the f32 result. */
static int epi_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct epi_ctx *c = p;
	for (int64_t row = b; row < e; row++) {
		float *cr = c->c + row * c->ldc;
		for (int64_t j = 0; j < c->n; j++) {
			float v = cr[j] + (c->bias ? c->bias[j] : 0.0f);
			if (c->epi == KK_EPI_GELU)
				v = kk__gelu(v);
			else if (c->epi == KK_EPI_SILU)
				v = kk__silu(v);
			cr[j] = v;
		}
	}
	return 0;
}

int kk__cpu_gemm(kk_backend *be, kk_stream *st, const kk_gemm_desc *d)
{
	int64_t batch = d->batch ? d->batch : 1;
	size_t na = gspan(batch, d->stride_a, d->trans_a ? d->k : d->m, d->trans_a ? d->m : d->k,
			  d->lda);
	size_t nb = gspan(batch, d->stride_b, d->trans_b ? d->n : d->k, d->trans_b ? d->k : d->n,
			  d->ldb);
	_cleanup_free_ float *a_own = NULL, *b_own = NULL, *c_tmp = NULL, *bias = NULL;
	bool direct = d->c->dtype == KK_F32;
	float *a, *b;
	int r;

	r = kk__widen(d->a, na, &a, &a_own);
	if (r < 0)
		return r;
	r = kk__widen(d->b, nb, &b, &b_own);
	if (r < 0)
		return r;
	if (d->bias) {
		bias = malloc(d->n * sizeof(float));
		if (!bias)
			return -ENOMEM;
		kk__row_f32(bias, d->bias->ptr, d->bias->dtype, 0, d->n);
	}
	if (!direct) {
		c_tmp = malloc((size_t) d->m * d->n * sizeof(float));
		if (!c_tmp)
			return -ENOMEM;
	}

	for (int64_t i = 0; i < batch; i++) {
		float *ci;
		int64_t ldc;

		if (direct) {
			ci = (float *) d->c->ptr + i * d->stride_c;
			ldc = d->ldc;
		} else {
			ci = c_tmp;
			ldc = d->n;
			if (d->beta != 0)
				for (int64_t row = 0; row < d->m; row++)
					kk__row_f32(ci + row * d->n, d->c->ptr, d->c->dtype,
						    i * d->stride_c + row * d->ldc, d->n);
		}
		if (d->beta == 0) /* C may hold NaN: never let it leak through 0 * NaN */
			for (int64_t row = 0; row < d->m; row++)
				memset(ci + row * ldc, 0, d->n * sizeof(float));
		cblas_sgemm(CblasRowMajor, d->trans_a ? CblasTrans : CblasNoTrans,
			    d->trans_b ? CblasTrans : CblasNoTrans, (int) d->m, (int) d->n,
			    (int) d->k, d->alpha, a + i * d->stride_a, (int) d->lda,
			    b + i * d->stride_b, (int) d->ldb, d->beta, ci, (int) ldc);

		if (bias || d->epilogue != KK_EPI_NONE) {
			struct epi_ctx e = { ci, ldc, d->n, bias, d->epilogue };
			r = kk__parallel_for(d->m, (double) d->n * 20, epi_range, &e);
			if (r < 0)
				return r;
		}
		if (!direct)
			for (int64_t row = 0; row < d->m; row++)
				kk__row_store(d->c->ptr, d->c->dtype,
					      i * d->stride_c + row * d->ldc, ci + row * d->n,
					      d->n);
	}
	return 0;
}
