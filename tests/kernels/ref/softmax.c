/* tests/kernels/ref/softmax.c — float64 row softmax and softmax
 * cross-entropy (see ref.h). */
#include <math.h>

#include "ref.h"

void ref_softmax(const double *x, int64_t rows, int64_t cols, double *y)
{
	for (int64_t r = 0; r < rows; r++) {
		const double *xr = x + r * cols;
		double mx = -INFINITY, s = 0;
		for (int64_t i = 0; i < cols; i++)
			mx = fmax(mx, xr[i]);
		for (int64_t i = 0; i < cols; i++)
			s += exp(xr[i] - mx);
		for (int64_t i = 0; i < cols; i++)
			y[r * cols + i] = exp(xr[i] - mx) / s;
	}
}

double ref_cross_entropy_row(const double *x, int64_t cols, int32_t target)
{
	double mx = -INFINITY, s = 0;
	if (target < 0)
		return 0;
	for (int64_t i = 0; i < cols; i++)
		mx = fmax(mx, x[i]);
	for (int64_t i = 0; i < cols; i++)
		s += exp(x[i] - mx);
	return mx + log(s) - x[target];
}
