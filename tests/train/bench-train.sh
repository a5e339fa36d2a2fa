#!/bin/bash
# The kmt_ training benchmark (make bench): ms per training step and
# training tokens/s of kmt_step on the cpu backend for a 0.8M-parameter
# Llama (batch 4 x 128 tokens), against two baselines measured in the same
# run: the model's own forward pass (step / forward; textbook ~3x), and
# PyTorch 1.13 on the CPU training the same model for the same steps
# (/usr/bin/python3 has Debian's python3-torch; its row is skipped with a
# reason where torch is missing).  Output is TAP with the table as comments.
# --quick: 4 steps; --cpu-time: process CPU time (for a busy machine; it
# counts idle threads that spin too, so torch then runs with
# OMP_WAIT_POLICY=PASSIVE unless the environment sets a policy: its OpenMP
# threads otherwise spin for milliseconds between ops, where kk's pool
# spins 200 us and sleeps); --rounds N: N interleaved kiln/torch runs per
# thread count, each row's best kept (default 1).
# 1 and 2 threads for both unless KK_CPU_THREADS names one count.
set -u
PY=${KILN_TORCH_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
rounds=1
args=()
while [ $# -gt 0 ]; do
	case $1 in
	--rounds)
		rounds=${2:-}
		shift $(($# > 1 ? 2 : 1))
		;;
	*)
		args+=("$1")
		shift
		;;
	esac
done
omp_policy=${OMP_WAIT_POLICY:-}
for a in "${args[@]}"; do
	[ "$a" = --cpu-time ] && omp_policy=${OMP_WAIT_POLICY:-PASSIVE}
done
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
	echo "bench-train.sh: --rounds '$rounds': give a count of runs, 1 or more" >&2
	exit 2
fi
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
# The best (lowest ms) row of each implementation over the rounds.
best() { awk '!($1 in ms) || $2 < ms[$1] { ms[$1] = $2; row[$1] = $0; if (!($1 in seen)) { seen[$1] = 1; order[n++] = $1 } }
	END { for (i = 0; i < n; i++) print row[order[i]] }'; }
for t in $threads; do
	export KK_CPU_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t
	kiln_rows="" torch_rows="" config=""
	for ((r = 0; r < rounds; r++)); do
		kiln=$("$bin" "${args[@]}" 2>&1) || { sed 's/^/# /' <<<"$kiln"; echo "not ok 1 - bench-train failed ($t threads)"; exit 1; }
		config=$(head -1 <<<"$kiln")
		kiln_rows+=$(tail -n +2 <<<"$kiln")$'\n'
		if [ $have_torch = 1 ]; then
			torch=$(OMP_WAIT_POLICY=$omp_policy "$PY" "$here/bench_torch.py" "${args[@]}" 2>&1) || { sed 's/^/# /' <<<"$torch"; torch=""; }
			[ -n "$torch" ] && torch_rows+=$torch$'\n'
		fi
	done
	kiln=$(best <<<"$kiln_rows")
	torch=$(grep . <<<"$torch_rows" | best)
	fwd_ms=$(awk '$1 == "kiln-forward" { print $2 }' <<<"$kiln")
	sed "s/^/# $t thread(s): /" <<<"$config"
	[ "$rounds" -gt 1 ] && echo "# best of $rounds interleaved runs each"
	printf '# %-28s %12s %12s %14s\n' implementation ms/step tokens/s "x kiln fwd"
	{ cat <<<"$kiln"; [ -n "$torch" ] && cat <<<"$torch"; } |
		awk -v f="$fwd_ms" '{ printf "# %-28s %12.2f %12.0f %14.2f\n", $1, $2, $3, $2 / f }'
	if [ -n "$torch" ]; then
		k=$(awk '$1 == "kiln-train-step" { print $2 }' <<<"$kiln")
		p=$(awk '$1 ~ /-train-step$/ { print $2 }' <<<"$torch")
		awk -v k="$k" -v p="$p" -v t="$t" 'BEGIN { printf "# training step, %d thread(s): kiln %.2f ms, torch %.2f ms: kiln at %.2fx torch'"'"'s speed\n", t, k, p, p / k }'
	fi
done
echo "ok 1 - kmt training benchmark"
