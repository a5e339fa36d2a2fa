/* tests/kernels/ref/optim.c — float64 AdamW step and global gradient norm
 * (see ref.h). */
#include <math.h>

#include "ref.h"

void ref_adamw(double *master, double *m, double *v, const double *g, size_t n,
	       const kk_adamw_params *p)
{
	double b1 = p->beta1, b2 = p->beta2, gs = p->grad_scale != 0 ? p->grad_scale : 1;
	for (size_t i = 0; i < n; i++) {
		double gi = g[i] * gs;
		m[i] = b1 * m[i] + (1 - b1) * gi;
		v[i] = b2 * v[i] + (1 - b2) * gi * gi;
		double mh = m[i] / (1 - pow(b1, p->step)), vh = v[i] / (1 - pow(b2, p->step));
		master[i] -= p->lr * (mh / (sqrt(vh) + p->eps) + p->weight_decay * master[i]);
	}
}

double ref_grad_norm(const double *const *bufs, const size_t *sizes, size_t n_bufs)
{
	double sum = 0;
	for (size_t b = 0; b < n_bufs; b++)
		for (size_t i = 0; i < sizes[b]; i++)
			sum += bufs[b][i] * bufs[b][i];
	return sqrt(sum);
}
