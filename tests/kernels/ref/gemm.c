/* tests/kernels/ref/gemm.c — float64 GEMM with kk_gemm's strides and
 * epilogues (see ref.h). */
#include "ref.h"

void ref_gemm(const kk_gemm_desc *d, const double *a, const double *b, const double *c0,
	      const double *bias, double *c)
{
	int64_t batch = d->batch ? d->batch : 1;
	for (int64_t bt = 0; bt < batch; bt++)
		for (int64_t i = 0; i < d->m; i++)
			for (int64_t j = 0; j < d->n; j++) {
				const double *ab = a + bt * d->stride_a, *bb = b + bt * d->stride_b;
				double s = 0, v;
				for (int64_t p = 0; p < d->k; p++)
					s += (d->trans_a ? ab[p * d->lda + i]
							 : ab[i * d->lda + p]) *
					     (d->trans_b ? bb[j * d->ldb + p] : bb[p * d->ldb + j]);
				size_t o = (size_t) (bt * d->stride_c + i * d->ldc + j);
				v = (double) d->alpha * s + (c0 ? (double) d->beta * c0[o] : 0) +
				    (bias ? bias[j] : 0);
				if (d->epilogue == KK_EPI_GELU)
					v = ref_gelu(v);
				else if (d->epilogue == KK_EPI_SILU)
					v = ref_silu(v);
				c[o] = v;
			}
}
