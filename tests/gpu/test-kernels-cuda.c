/* tests/gpu/test-kernels-cuda.c — the kk op suite on the cuda backend
 * (kernels-suite.h has the tests and their tolerances).
 * Every test is a skip, with the reason, where no GPU/CUDA backend exists;
 * on a GPU machine it checks the cuda backend against the same float64
 * references the cpu backend passes. */
#define KK_TEST_BACKEND "cuda"
#include "../kernels/kernels-suite.h"

int main(void)
{
	return run_suite();
}
