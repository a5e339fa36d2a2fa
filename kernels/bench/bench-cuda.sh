#!/bin/bash
# kernels/bench/bench-cuda.sh — `make bench` entry for the kk cuda backend:
# runs the PyTorch baselines (kernels/bench/cuda_torch.py) when a python with
# torch and CUDA is found, then kernels/bench/cuda-bench with them, which
# prints the table (or "skipped: no CUDA device").  KILN_BENCH_QUICK=1 runs
# the short version.
set -u
B=${KILN_BUILD:-build}
here=$(cd "$(dirname "$0")" && pwd)
bin=$B/tests/cuda-bench
if [ ! -x "$bin" ]; then
	echo "skipped: no CUDA device ($bin not built)"
	exit 0
fi
quick=()
[ "${KILN_BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
torch_file=$(mktemp)
trap 'rm -f "$torch_file"' EXIT
torch_args=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
	for py in python3 /usr/bin/python3; do
		if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
			"$py" "$here/cuda_torch.py" "${quick[@]}" >"$torch_file" || true
			echo "torch baselines: $("$py" -c 'import torch; print(torch.__version__)') ($py)"
			torch_args=(--torch "$torch_file")
			break
		fi
	done
	[ ${#torch_args[@]} -eq 0 ] && echo "torch baselines: none (no python with torch + CUDA)"
fi
exec "$bin" "${torch_args[@]}" "${quick[@]}"
