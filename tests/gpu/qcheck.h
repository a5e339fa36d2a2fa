/* qgemm_check: a quantized GEMM's result on each side of a parity pair
 * against a float64 reference (tests/gpu/test-kk-cuda.c and
 * test-kk-cuda-mem.c; needs parity.h and ../ref/ref.h, links kkref). */
#ifndef KILN_TESTS_QCHECK_H
#define KILN_TESTS_QCHECK_H

#include "../../kernels/bench/kk-desc.h"

/* kk_qgemm's contract lets a backend quantize X to int8 per 32-block (the
 * cpu backend does; cuda keeps f32 activations).  So each side is checked
 * against the float64 product of its own dequantized weights and X as
 * stored, plus bias (NULL: none): within t, plus the int8-activation bound
 * (ref_qact_bound) for a side on the cpu backend. */
static inline int qgemm_check(const pair *y, const pair *x, const pair *wd, const float *bias,
			      int64_t m, int64_t n, int64_t k, tol t, const char *what)
{
	int ok = 1;
	for (int s = 0; s < 2 && ok; s++) {
		float *hy = get(y, s), *hx = get(x, s), *hw = get(wd, s);
		double *dx = ref_widen(hx, (size_t) (m * k)), *dw = ref_widen(hw, (size_t) (n * k)),
		       *db = bias ? ref_widen(bias, (size_t) n) : NULL,
		       *ref = malloc((size_t) (m * n) * sizeof(double)),
		       *bound = malloc((size_t) (m * n) * sizeof(double));
		kk_gemm_desc d = kiln_test_linear(m, n, k, NULL, NULL, NULL);
		ref_gemm(&d, dx, dw, NULL, db, ref);
		bool cpu = strcmp(kk_backend_name(be_side[s]), "cpu") == 0;
		if (cpu)
			ref_qact_bound(dx, dw, m, n, k, bound);
		for (int64_t i = 0; i < m * n && ok; i++) {
			double lim = t.atol + t.rtol * fabs(ref[i]) + (cpu ? bound[i] : 0);
			if (!(fabs(hy[i] - ref[i]) <= lim)) {
				printf("# %s (%s side): [%ld] got %.7g want %.7g, limit %g\n", what,
				       kk_backend_name(be_side[s]), (long) i, hy[i], ref[i], lim);
				ok = 0;
			}
		}
		free(hy), free(hx), free(hw), free(dx), free(dw), free(db), free(ref), free(bound);
	}
	return ok;
}

#endif
