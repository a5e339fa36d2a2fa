/* tests/kernels/ref/gemm.c — float64 GEMM with kk_gemm's strides and
 * epilogues (see ref.h). */
#include "ref.h"

void ref_gemm(const struct ref_gemm *g)
{
	for (int64_t bt = 0; bt < g->batch; bt++)
		for (int64_t i = 0; i < g->m; i++)
			for (int64_t j = 0; j < g->n; j++) {
				const double *a = g->a + bt * g->stride_a,
					     *b = g->b + bt * g->stride_b;
				double s = 0, v;
				for (int64_t p = 0; p < g->k; p++)
					s += (g->trans_a ? a[p * g->lda + i] : a[i * g->lda + p]) *
					     (g->trans_b ? b[j * g->ldb + p] : b[p * g->ldb + j]);
				size_t o = (size_t) (bt * g->stride_c + i * g->ldc + j);
				v = g->alpha * s + (g->c0 ? g->beta * g->c0[o] : 0) +
				    (g->bias ? g->bias[j] : 0);
				if (g->epilogue == KK_EPI_GELU)
					v = ref_gelu(v);
				else if (g->epilogue == KK_EPI_SILU)
					v = ref_silu(v);
				g->c[o] = v;
			}
}
