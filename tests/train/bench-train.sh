#!/bin/bash
# The kmt_ training benchmark (make bench): ms per training step and
# training tokens/s of kmt_step on the cpu backend for a 0.8M-parameter
# Llama (batch 4 x 128 tokens), against two baselines measured in the same
# run: the model's own forward pass (step / forward; textbook ~3x), and
# PyTorch 1.13 on the CPU training the same model for the same steps
# (/usr/bin/python3 has Debian's python3-torch; its row is skipped with a
# reason where torch is missing).  Output is TAP with the table as comments.
# --quick: 4 steps; --cpu-time: process CPU time (for a busy machine).
# 1 and 2 threads for both unless KK_CPU_THREADS names one count.
set -u
PY=${KILN_TORCH_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
# shellcheck source=tests/lib/bench.sh
. "$here/../lib/bench.sh"
bench_bin bench-train
# One run per thread count: KK_CPU_THREADS if set, else 1 and 2 (issue 15:
# the training step against torch's at both).
threads=${KK_CPU_THREADS:-1 2}
have_torch=1
if ! "$PY" -c 'import torch' 2>/dev/null; then
	have_torch=0
	echo "# torch baseline skipped: $PY has no torch (apt-get install python3-torch)"
fi
for t in $threads; do
	export KK_CPU_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t
	kiln=$("$bin" "$@" 2>&1) || { sed 's/^/# /' <<<"$kiln"; echo "not ok 1 - bench-train failed ($t threads)"; exit 1; }
	torch=""
	if [ $have_torch = 1 ]; then
		torch=$("$PY" "$here/bench_torch.py" "$@" 2>&1) || { sed 's/^/# /' <<<"$torch"; torch=""; }
	fi
	fwd_ms=$(awk '$1 == "kiln-forward" { print $2 }' <<<"$kiln")
	head -1 <<<"$kiln" | sed "s/^/# $t thread(s): /"
	printf '# %-28s %12s %12s %14s\n' implementation ms/step tokens/s "x kiln fwd"
	{ tail -n +2 <<<"$kiln"; [ -n "$torch" ] && cat <<<"$torch"; } |
		awk -v f="$fwd_ms" '{ printf "# %-28s %12.2f %12.0f %14.2f\n", $1, $2, $3, $2 / f }'
	if [ -n "$torch" ]; then
		k=$(awk '$1 == "kiln-train-step" { print $2 }' <<<"$kiln")
		p=$(awk '$1 ~ /-train-step$/ { print $2 }' <<<"$torch")
		awk -v k="$k" -v p="$p" -v t="$t" 'BEGIN { printf "# training step, %d thread(s): kiln %.2f ms, torch %.2f ms: kiln at %.2fx torch'"'"'s speed\n", t, k, p, p / k }'
	fi
done
echo "ok 1 - kmt training benchmark"
