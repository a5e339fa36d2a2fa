#!/bin/bash
# The kk cpu backend benchmark table (make bench), as TAP: the table lines
# are TAP comments, then one result line.  Pass --quick for tiny shapes,
# --cpu-time to time with the process CPU clock on a busy machine.
set -u
# shellcheck source=tests/lib/bench.sh
. "$(dirname "$0")/../lib/bench.sh"
bench_bin bench-kernels-cpu
bench_run "kk cpu benchmark" "" "$@"
