/* tests/gpu/test-train-cuda-self.c — test-train-cuda's checks run on the
 * cpu backend against itself, to check the test (a tool, not a suite). */
#define KMT_TEST_BACKEND "cpu"
#include "test-train-cuda.c"
