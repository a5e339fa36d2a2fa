#!/bin/bash
# The km_ model benchmark (make bench): stories260K decode tokens/s on the
# cpu backend, single stream and batch 8, next to the float64 reference
# baseline, as TAP (the table lines are TAP comments).  --quick: 32 steps;
# --cpu-time: rates per CPU-second (use it on a busy machine).  One thread
# unless the environment says otherwise: a 64-wide model's ops are far too
# small for kk's or OpenBLAS's threads, whose hand-offs dominate (10x
# slower on a loaded 2-core machine).
set -u
export KK_CPU_THREADS=${KK_CPU_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
B=${KILN_BUILD:-build}
bin=$B/tests/bench-model
echo "1..1"
if [ ! -x "$bin" ]; then
	echo "ok 1 # SKIP $bin not built (make B=$B $bin)"
	exit 0
fi
out=$("$bin" "$@" 2>&1)
rc=$?
sed 's/^/# /' <<<"$out"
if [ $rc -eq 0 ]; then
	echo "ok 1 - km model benchmark"
elif [ $rc -eq 2 ]; then
	echo "ok 1 # SKIP stories260K.bin not found (set KM_TEST_MODEL)"
else
	echo "not ok 1 - km model benchmark (exit $rc)"
	exit 1
fi
