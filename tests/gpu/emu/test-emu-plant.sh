#!/bin/bash
# tests/gpu/emu/test-emu-plant.sh — checks that the CPU emulation of
# the cuda backend (test-emu.sh) catches the bugs it claims to: each case
# compiles one kernels/kk/cuda/*.cu file through a sed script that plants a bug
# (KILN_EMU_PLANT), runs the parity tests of that family, and passes only if
# the run fails with the expected report.  A case whose sed no longer
# matches the source fails too (update the pattern when the kernel moves).
#   barrier  softmax.cu's block merge without its first __syncthreads,
#            under ThreadSanitizer: a data race on the shared partials.
#   mask     a shuffle in the same merge with lane 31 left out of its mask:
#            the emulator reports the lane that reaches it unnamed.
#   poison   the second stage of that merge reads all 32 partials instead of
#            the nw that were written: NaN from the poisoned static shared
#            memory (zero-filled memory would hide it: the merge of an
#            extra (0, 0) pair is exact).
#   align    the softmax vector path taken for rows whose length is not a
#            multiple of the vector width: a misaligned 16-byte load.
#   cpwait   attention.cu's forward waits for one cp.async group too few
#            (wait_group 2): the tiles are read before they land.
#   decfrag  attention.cu's decode mma kernel addresses K's ldmatrix rows
#            and chunks swapped (a wrong B fragment): wrong scores.
#   decnan   the decode mma kernel stages the slots past the context too:
#            the NaN the test leaves there reaches P V (0 x NaN).
#   bwdfrag  attention-bwd.cu's tensor-core backward builds the third A
#            register of P and dS from the wrong n-tile (a wrong fragment
#            index): dq, dk and dv off against f64 and cpu.
# Prints TAP; logs under $KILN_BUILD/emu-plant*/NAME.log.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$root/$B ;; esac
mkdir -p "$B"
export TSAN_OPTIONS=halt_on_error=1:exitcode=66
n=0 rc=0
echo "1..8"
# plant NAME SAN FILTER EXPECT(ERE) FILE SED
plant() {
	n=$((n + 1))
	local log=$B/emu-plant${2:+-$2}/$1.log t0 r secs
	mkdir -p "$B/emu-plant${2:+-$2}"
	t0=$(date +%s)
	# In the background, so the run can be stopped as soon as the expected
	# report is in the log (the other tests of the family add nothing).
	KILN_EMU_SAN=$2 KILN_TEST_FILTER=$3 KILN_EMU_PLANT="$5|$6" "$here/test-emu.sh" >"$log" 2>&1 &
	local pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		if grep -Eq -- "$4" "$log" && ! grep -q 'not ok 1 - emulated cuda backend' "$log"; then
			sleep 1 # let a sanitizer finish its report
			kill "$pid" 2>/dev/null
			break
		fi
		sleep 1
	done
	wait "$pid" 2>/dev/null # (no "Aborted" notice in the TAP)
	r=$?
	secs=$(($(date +%s) - t0))
	if [ $r -ne 0 ] && ! grep -q 'not ok 1 - emulated cuda backend' "$log" && grep -Eq -- "$4" "$log"; then
		echo "ok $n - planted $1 bug in $5 caught (${secs}s)"
	else
		echo "not ok $n - planted $1 bug in $5 not caught as /$4/ (exit $r, ${secs}s; $log)"
		tail -n 5 "$log" | sed 's/^/# /'
		rc=1
	fi
}
sm=kernels/kk/cuda/softmax.cu
plant barrier tsan softmax 'ThreadSanitizer: data race' $sm '0,/__syncthreads();/s/__syncthreads();//'
plant mask "" softmax 'is not in the mask' $sm '0,/__shfl_xor_sync(0xffffffffu, m, o)/s//__shfl_xor_sync(0x7fffffffu, m, o)/'
plant poison "" softmax '^not ok' $sm 's/lane < nw ? sh\[lane\] : -INFINITY/lane < 32 ? sh[lane] : -INFINITY/'
plant align "" softmax 'not 16-byte aligned' $sm 's/bool vec = cols % W == 0 \&\& /bool vec = /'
plant cpwait "" attn '^not ok' kernels/kk/cuda/attention.cu 's/kc_cp_wait<1>();/kc_cp_wait<2>();/'
plant decfrag "" decode '^not ok' kernels/kk/cuda/attention.cu 's/kc_sw<D>((mi >> 1) \* 8 + mr, 2 \* kk + (mi \& 1))/kc_sw<D>((mi \& 1) * 8 + mr, 2 * kk + (mi >> 1))/'
plant decnan "" decode 'got nan' kernels/kk/cuda/attention.cu 's/bool ok = r < valid;/bool ok = true;/'
plant bwdfrag "" "attn bwd" '^not ok' kernels/kk/cuda/attention-bwd.cu \
	's/a\[kk\]\[2\] = kc_pack2<BF>(c\[2 \* kk + 1\]\[0\], c\[2 \* kk + 1\]\[1\])/a[kk][2] = kc_pack2<BF>(c[2 * kk][0], c[2 * kk][1])/'
exit $rc
