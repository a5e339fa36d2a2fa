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
