/* tests/kernels/ref/norm.c — float64 RMSNorm / LayerNorm and their
 * parameter gradients (see ref.h). */
#include <math.h>

#include "ref.h"

/* Mean (0 for RMSNorm) and 1 / sqrt(var + eps) of one row. */
static void row_stats(bool layer, const double *h, int64_t dim, double eps, double *mean,
		      double *rstd)
{
	double mu = 0, var = 0;
	if (layer) {
		for (int64_t i = 0; i < dim; i++)
			mu += h[i];
		mu /= dim;
	}
	for (int64_t i = 0; i < dim; i++)
		var += (h[i] - mu) * (h[i] - mu);
	var /= dim;
	*mean = mu;
	*rstd = 1 / sqrt(var + eps);
}

void ref_norm_fwd(bool layer, int64_t rows, int64_t dim, double eps, const double *h,
		  const double *w, const double *b, double *y)
{
	for (int64_t r = 0; r < rows; r++) {
		const double *hr = h + r * dim;
		double mean, rstd;
		row_stats(layer, hr, dim, eps, &mean, &rstd);
		for (int64_t i = 0; i < dim; i++)
			y[r * dim + i] = (hr[i] - mean) * rstd * w[i] + (layer && b ? b[i] : 0);
	}
}

void ref_norm_dparams(bool layer, int64_t rows, int64_t dim, double eps, const double *h,
		      const double *dy, double *dw, double *db)
{
	for (int64_t r = 0; r < rows; r++) {
		double mean, rstd;
		row_stats(layer, h + r * dim, dim, eps, &mean, &rstd);
		for (int64_t i = 0; i < dim; i++) {
			dw[i] += dy[r * dim + i] * (h[r * dim + i] - mean) * rstd;
			if (db)
				db[i] += dy[r * dim + i];
		}
	}
}
