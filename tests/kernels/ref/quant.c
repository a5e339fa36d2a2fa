/* tests/kernels/ref/quant.c — the weight-only quantization rule in float64
 * (see ref.h). */
#include <math.h>

#include "ref.h"

double ref_quant_scale(const double *w, size_t n, kk_dtype qt)
{
	double amax = 0;
	for (size_t i = 0; i < n; i++)
		amax = fmax(amax, fabs(w[i]));
	return amax / (qt == KK_I8 ? 127 : 7);
}

double ref_quant_level(double w, double s, kk_dtype qt)
{
	double qmax = qt == KK_I8 ? 127 : 7;
	return fmin(fmax(nearbyint(w / s), -qmax - (qt == KK_Q4)), qmax);
}

void ref_qact_bound(const double *x, const double *w, int64_t m, int64_t n, int64_t k,
		    double *bound)
{
	for (int64_t i = 0; i < m; i++)
		for (int64_t j = 0; j < n; j++) {
			double t = 0;
			for (int64_t b = 0; b < k; b += 32) {
				double amax = 0, wsum = 0;
				for (int64_t l = b; l < k && l < b + 32; l++) {
					amax = fmax(amax, fabs(x[i * k + l]));
					wsum += fabs(w[j * k + l]);
				}
				t += amax / 254 * wsum;
			}
			bound[i * n + j] = t;
		}
}
