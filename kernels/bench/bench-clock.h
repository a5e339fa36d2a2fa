/* kernels/bench/bench-clock.h — the benchmarks' clock reading (kernels/bench,
 * tests/kernels/bench-kernels-cpu.c, tests/model/bench-model.c,
 * tests/train/bench-train.c): each times on CLOCK_MONOTONIC (wall time) or,
 * with --cpu-time, on CLOCK_PROCESS_CPUTIME_ID (rates per CPU-second, which
 * a busy shared machine disturbs far less). */
#pragma once

#include <time.h>

/* Seconds on clock id. */
static inline double kiln_clock_seconds(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}
