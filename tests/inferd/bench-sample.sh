#!/bin/bash
# The sampler benchmark (make bench): microseconds per token at 32k and 128k
# vocabularies for each sampling parameter combination, against the sampler
# before, and the share of a 110M-shaped model's decode step, as TAP (the
# table lines are TAP comments).  --quick: fewer tokens; --cpu-time: the
# process CPU clock (a busy machine).  Two threads, as issue 24 measured.
set -u
export KK_CPU_THREADS=${KK_CPU_THREADS:-2} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# shellcheck source=tests/lib/bench.sh
. "$(dirname "$0")/../lib/bench.sh"
bench_bin bench-sample
bench_run "sampler benchmark" "" "$@"
