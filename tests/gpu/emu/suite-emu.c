/* tests/gpu/emu/suite-emu.c — the kernels suite
 * (tests/kernels/kernels-suite.h: float64 references, the cpu-helper's
 * tolerances) on the cuda backend as built by test-emu.sh, i.e. on the CPU
 * emulation of CUDA.  test_sample is skipped here: its 20000-row launches
 * (one block of 512 emulated threads per row) would take hours; the
 * sampling kernel is covered by test-kk-cuda's sampling cases instead. */
#define KK_TEST_BACKEND "cuda"
#include "kernels-suite.h"

int main(void)
{
	cmocka_set_skip_filter("test_sample");
	return run_suite();
}
