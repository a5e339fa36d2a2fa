/* tests/kernels/ref/elementwise.c — float64 activations (see ref.h). */
#include <math.h>
#include <stdlib.h>

#include "ref.h"

double *ref_widen(const float *x, size_t n)
{
	double *d = malloc((n ? n : 1) * sizeof(double));
	for (size_t i = 0; d && i < n; i++)
		d[i] = x[i];
	return d;
}

double ref_silu(double x)
{
	return x / (1 + exp(-x));
}

double ref_gelu(double x)
{
	return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
