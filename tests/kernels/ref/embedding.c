/* tests/kernels/ref/embedding.c — float64 embedding gather and its
 * accumulated backward (see ref.h). */
#include "ref.h"

void ref_embedding_fwd(const double *table, const int32_t *ids, int64_t tokens, int64_t dim,
		       double *out)
{
	for (int64_t t = 0; t < tokens; t++)
		for (int64_t i = 0; i < dim; i++)
			out[t * dim + i] = table[(int64_t) ids[t] * dim + i];
}

void ref_embedding_bwd(double *dtable, const double *dout, const int32_t *ids, int64_t tokens,
		       int64_t dim)
{
	for (int64_t t = 0; t < tokens; t++)
		for (int64_t i = 0; i < dim; i++)
			dtable[(int64_t) ids[t] * dim + i] += dout[t * dim + i];
}
