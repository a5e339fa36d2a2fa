#!/bin/bash
# bench-healthd.sh — `make bench` entry: CPU time per kiln-healthd poll cycle
# for 8 GPUs with the fake NVML (target < 1 ms), as a table, plus a TAP line.
B=${KILN_BUILD:-build}
tool=$B/tests/bench-healthd lib=$B/lib/fake-nvml/libnvidia-ml.so.1
if [ ! -x "$tool" ] || [ ! -e "$lib" ]; then echo "1..1"; echo "ok 1 # SKIP bench-healthd or the fake NVML not built"; exit 0; fi
out=$("$tool" "$lib" "${KILN_BENCH_CYCLES:-2000}"); rc=$?
printf '%s\n' "$out" | sed 's/^/# /'
echo "1..1"
if [ $rc = 0 ]; then echo "ok 1 - healthd poll cycle: $(printf '%s\n' "$out" | sed -n 's/^result: //p')"
else echo "not ok 1 - healthd poll cycle: $(printf '%s\n' "$out" | sed -n 's/^result: //p')"; fi
exit $rc
