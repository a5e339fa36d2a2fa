#!/bin/bash
# The inference engine benchmark (make bench): tiny260K tokens/s and
# time to first token with 1, 8 and 32 clients against the baseline
# "sequential" (the same requests one at a time through km_forward), as TAP
# (the table lines are TAP comments).  --quick: 32 requests instead of 128.
# One thread, as in tests/model/bench-model.sh: a 64-wide model's ops are
# far too small for kk's or OpenBLAS's threads, whose hand-offs dominate.
set -u
export KK_CPU_THREADS=${KK_CPU_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# shellcheck source=tests/lib/bench.sh
. "$(dirname "$0")/../lib/bench.sh"
bench_bin bench-engine
# no skip reason: the fixture is the build's own, its absence a failure
bench_run "engine benchmark" "" "$@"
