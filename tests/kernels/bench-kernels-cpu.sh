#!/bin/bash
# The kk cpu backend benchmark table (make bench), as TAP: the table lines
# are TAP comments, then one result line.  Pass --quick for tiny shapes,
# --cpu-time to time with the process CPU clock on a busy machine.
set -u
B=${KILN_BUILD:-build}
bin=$B/tests/bench-kernels-cpu
echo "1..1"
if [ ! -x "$bin" ]; then
	echo "ok 1 # SKIP $bin not built (make B=$B $bin)"
	exit 0
fi
out=$("$bin" "$@" 2>&1)
rc=$?
sed 's/^/# /' <<<"$out"
if [ $rc -eq 0 ]; then
	echo "ok 1 - kk cpu benchmark"
else
	echo "not ok 1 - kk cpu benchmark (exit $rc)"
	exit 1
fi
