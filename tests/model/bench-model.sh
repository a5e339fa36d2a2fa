#!/bin/bash
# The km_ model benchmark (make bench): the tiny260K fixture's decode tokens/s on the
# cpu backend, single stream and batch 8, next to the float64 reference
# baseline, as TAP (the table lines are TAP comments).  --quick: 32 steps;
# --cpu-time: rates per CPU-second (use it on a busy machine).  One thread
# unless the environment says otherwise: a 64-wide model's ops are far too
# small for kk's or OpenBLAS's threads, whose hand-offs dominate (10x
# slower on a loaded 2-core machine).
set -u
export KK_CPU_THREADS=${KK_CPU_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# shellcheck source=tests/lib/bench.sh
. "$(dirname "$0")/../lib/bench.sh"
bench_bin bench-model
# no skip reason: the fixture is the build's own, its absence a failure
bench_run "km model benchmark" "" "$@"
