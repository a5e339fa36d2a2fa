#!/bin/bash
# kernels/bench/attn-variants.sh — one call for a machine with an H100/H200:
# builds the cuda backend twice, with the head-dim-128 prefill kernel at 32
# query rows per warp (KC_TC_MT128=2, the default: FlashAttention-2's tiling,
# Q re-read from shared memory) and at 16 (KC_TC_MT128=1: Q in registers),
# runs the attention parity tests of each (test-kk-cuda, KILN_TEST_FILTER=attn)
# and times the attention and decode rows of cuda-bench next to torch SDPA
# (kernels/bench/cuda_torch.py, when a python with torch + CUDA is found).
#   kernels/bench/attn-variants.sh [OUTDIR]
# Logs go under OUTDIR (default /tmp/attn-variants); the summary is printed
# last.  Exit 0 when every build and parity run passed, 1 otherwise.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-/tmp/attn-variants}
mkdir -p "$out"
cd "$root" || exit 1
torch_args=()
for py in python3 /usr/bin/python3; do
	if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		"$py" "$here/cuda_torch.py" >"$out/torch.txt" 2>"$out/torch.err" || true
		torch_args=(--torch "$out/torch.txt")
		break
	fi
done
rc=0
summary=()
for mt in 2 1; do
	b=build/attn-mt$mt
	if ! make -j"$(nproc)" B="$b" CUDA=1 EXTRA_NVFLAGS="-DKC_TC_MT128=$mt -Xptxas -v" \
		"$b/tests/test-kk-cuda" "$b/tests/cuda-bench" >"$out/make-mt$mt.log" 2>&1; then
		summary+=("MT=$mt: build failed, see $out/make-mt$mt.log")
		rc=1
		continue
	fi
	KILN_TEST_FILTER=attn "$b/tests/test-kk-cuda" >"$out/test-mt$mt.log" 2>&1 || rc=1
	summary+=("MT=$mt parity: $(grep -c '^ok' "$out/test-mt$mt.log") ok, $(grep -c '^not ok' "$out/test-mt$mt.log") not ok ($out/test-mt$mt.log)")
	"$b/tests/cuda-bench" --only attn "${torch_args[@]}" >"$out/bench-mt$mt.log" 2>&1 || rc=1
	summary+=("$(grep -E '^(op|attention|paged)' "$out/bench-mt$mt.log" | sed "s/^/MT=$mt  /")")
done
printf '%s\n' "${summary[@]}"
exit $rc
