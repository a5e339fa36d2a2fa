#!/bin/bash
# bench-modelfile.sh — libkmf benchmark: open + index a 1 GiB safetensors
# checkpoint (8192 tensors of 128 KiB), against Python's `safetensors`
# (safe_open + every key, the reference implementation) when /usr/bin/python3
# can import it (KILN_PYTHONPATH may point at a pip --target directory), and
# the write throughput of a checkpoint (kmf_writer: temp file, fsync, rename,
# directory fsync) against `dd conv=fsync` and `cp` + `sync` of the same
# size.  Files go to KILN_BENCH_DIR (default /tmp) and are deleted after.
set -u
B=${KILN_BUILD:-build}
T=$B/tests/bench-modelfile
dir=${KILN_BENCH_DIR:-/tmp}
n=${KILN_BENCH_TENSORS:-8192}
each=${KILN_BENCH_TENSOR_BYTES:-131072}
bytes=$((n * each))
mib=$((bytes >> 20))
if [ ! -x "$T" ]; then
	echo "bench-modelfile: $T not built (make $T)" >&2
	exit 1
fi
work=$(mktemp -d "$dir/kmf-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
f=$work/ckpt.safetensors
sec() { sed -n 's/.*seconds=\([0-9.]*\).*/\1/p'; }
rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { if (s > 0) printf "%.0f", b / s / 1048576; else print "-" }'; }

w_kmf=$("$T" write "$f" "$n" "$each" | sec) || exit 1
t0=$EPOCHREALTIME
dd if="$f" of="$work/dd.bin" bs=4M conv=fsync status=none
w_dd=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }')
rm -f "$work/dd.bin"
t0=$EPOCHREALTIME
cp "$f" "$work/cp.bin" && sync "$work/cp.bin"
w_cp=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }')
rm -f "$work/cp.bin"

o_out=$("$T" open "$f" 9) || exit 1
o_kmf=$(echo "$o_out" | sec)
o_kmf_cpu=$(echo "$o_out" | sed -n 's/.*cpu=\([0-9.]*\).*/\1/p')
o_py=$(PYTHONPATH=${KILN_PYTHONPATH:-} /usr/bin/python3 - "$f" 2>/dev/null <<'PY'
import sys, time
from safetensors import safe_open
ts, cs = [], []
for _ in range(9):
    t0, c0 = time.perf_counter(), time.process_time()
    with safe_open(sys.argv[1], "np") as fh:
        keys = list(fh.keys())
    ts.append(time.perf_counter() - t0)
    cs.append(time.process_time() - c0)
ts.sort()
cs.sort()
print(f"seconds={ts[4]:.6f} cpu={cs[4]:.6f}")
PY
)
o_py_cpu=$(echo "$o_py" | sed -n 's/.*cpu=\([0-9.]*\).*/\1/p')
o_py=$(echo "$o_py" | sec)

printf '\nlibkmf, %d MiB safetensors checkpoint, %d tensors (%s)\n' "$mib" "$n" "$(uname -n)"
printf '%-44s %12s %12s\n' "operation" "seconds" "MiB/s"
printf '%-44s %12s %12s\n' "write: kmf_writer_commit (fsync+rename)" "$w_kmf" "$(rate "$w_kmf")"
printf '%-44s %12s %12s\n' "write: baseline dd bs=4M conv=fsync" "$w_dd" "$(rate "$w_dd")"
printf '%-44s %12s %12s\n' "write: baseline cp + sync" "$w_cp" "$(rate "$w_cp")"
printf '%-44s %12s %12s\n' "" "wall s" "cpu s"
printf '%-44s %12s %12s\n' "open+index: kmf_open + every lookup" "$o_kmf" "$o_kmf_cpu"
if [ -n "$o_py" ]; then
	printf '%-44s %12s %12s\n' "open+index: baseline python safetensors" "$o_py" "$o_py_cpu"
else
	printf '%-44s %12s\n' "open+index: baseline python safetensors" "n/a (not importable by /usr/bin/python3)"
fi
