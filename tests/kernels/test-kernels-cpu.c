/* tests/kernels/test-kernels-cpu.c — the kk op suite on the cpu backend
 * (kernels-suite.h has the tests and their tolerances). */
#define KK_TEST_BACKEND "cpu"
#include "kernels-suite.h"

int main(void)
{
	return run_suite();
}
