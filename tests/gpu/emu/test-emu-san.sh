#!/bin/bash
# tests/gpu/emu/test-emu-san.sh asan|tsan — the GPU parity test on
# the CPU emulation of the cuda backend (test-emu.sh) built with
# AddressSanitizer + UBSan (asan) or ThreadSanitizer (tsan).
#   asan: out-of-bounds and use-after-free in kernels and launchers, and,
#         because the emulated vector types carry CUDA's alignment, any
#         uint4/float4/float2 access through a misaligned pointer (UBSan).
#   tsan: every CUDA thread is an OS thread, so a shared-memory access not
#         ordered by a __syncthreads (or a warp collective) is a data race.
# The emulation is 3-20 times slower under a sanitizer, so each mode runs a
# subset of the parity test (KILN_TEST_FILTER words, one run each, one TAP
# line each; logs under $KILN_BUILD/emu-MODE/):
#   asan: norm rope act softmax embedding adamw quant decode paged
#   tsan: norm softmax quant decode paged
# (every family with static or dynamic shared memory, warp shuffles or
# cp.async but the attention forward/backward, whose tensor-core tiles are
# the slowest thing to emulate: test-emu-asan-attn.sh and test-emu-tsan-attn.sh
# run two small cases of them, KILN_EMU_SAN_FILTERS=gqa8).
# KILN_EMU_SAN_FILTERS='w1 w2 ...' overrides the subset.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$root/$B ;; esac
mode=${1:-}
case $mode in
asan) words="norm rope act softmax embedding adamw quant decode paged" ;;
tsan) words="norm softmax quant decode paged" ;;
*)
	echo "usage: test-emu-san.sh asan|tsan" >&2
	exit 2
	;;
esac
words=${KILN_EMU_SAN_FILTERS:-$words}
# Sanitizer reports end the run with a failing status.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1}
mkdir -p "$B/emu-$mode"
set -- $words
echo "1..$#"
n=0 rc=0
for w in "$@"; do
	n=$((n + 1))
	log=$B/emu-$mode/parity-$w.log
	t0=$(date +%s)
	KILN_EMU_SAN=$mode KILN_TEST_FILTER=$w "$here/test-emu.sh" >"$log" 2>&1
	r=$?
	secs=$(($(date +%s) - t0))
	if [ $r -eq 0 ] && ! grep -q '^not ok' "$log" && ! grep -q 'Sanitizer' "$log"; then
		echo "ok $n - $mode: parity tests '$w' on the emulated cuda backend ($(grep -c '^ok' "$log") ok, ${secs}s)"
	else
		echo "not ok $n - $mode: parity tests '$w' on the emulated cuda backend (exit $r, ${secs}s; $log)"
		grep -m5 -E 'Sanitizer|runtime error|^not ok|emu:' "$log" | sed 's/^/# /'
		rc=1
	fi
done
exit $rc
