/* tests/lib/clock.h — the seconds of a clock as a double, for the
 * benchmarks' timings (CLOCK_MONOTONIC for wall time; the process CPU
 * clock on a busy shared machine). */
#pragma once

#include <time.h>

static inline double kiln_test_clock(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}
