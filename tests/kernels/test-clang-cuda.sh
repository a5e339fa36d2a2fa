#!/usr/bin/env bash
# test-clang-cuda.sh — a second compiler over the CUDA backend.
#
# clang's CUDA frontend compiles every kernels/kk/cuda/*.cu warning-free
# (-Wall -Wextra -Werror): the device side to PTX for sm_90 (--cuda-device-only
# -S: parsing, template instantiation and NVPTX codegen, libdevice included)
# and the host side to a syntax check (--cuda-host-only -fsyntax-only).  It
# catches code only nvcc accepts (nvcc's host min/max overloads, its laxer
# templates) and warnings nvcc's front end does not give.
#
# The first clang that compiles kernels/kk/cuda/core.cu for sm_90 against the
# toolkit is used (KILN_CLANG, else clang-19 ... clang-15, clang); none: SKIP
# with each candidate's error.  clang-14 (Debian 12's default) cannot: it has
# no sm_90.  clang-16 (mk/deps.sh) works with CUDA 13's headers given one
# empty stub, tests/kernels/clang-cuda/texture_fetch_functions.h (see there).
# -Wno-unknown-cuda-version: clang 16 knows CUDA up to 11.8 and warns on 13.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/lib/tap.sh

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
	skip "no CUDA toolkit at $CUDA_HOME (set CUDA_HOME)"
	tap_done
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

FLAGS=(-x cuda "--cuda-path=$CUDA_HOME" --cuda-gpu-arch=sm_90 -std=c++17
	-isystem tests/kernels/clang-cuda -Icommon/include -Iconfig/lib/include -Ikernels/kk/include
	-Wall -Wextra -Werror -Wno-unknown-cuda-version)

CLANG='' why=''
for c in ${KILN_CLANG:-clang-19 clang-18 clang-17 clang-16 clang-15 clang clang-14}; do
	command -v "$c" >/dev/null 2>&1 || continue
	if "$c" "${FLAGS[@]}" --cuda-device-only -S kernels/kk/cuda/core.cu -o "$tmp/probe.ptx" \
		>"$tmp/probe.log" 2>&1; then
		CLANG=$c
		break
	fi
	why="$why; $c: $(grep -m1 -E 'error' "$tmp/probe.log" | sed 's/^.*error: //')"
done
if [ -z "$CLANG" ]; then
	skip "no clang compiles CUDA for sm_90 here${why:+ (${why#; })}; mk/deps.sh installs clang-16"
	tap_done
	exit 0
fi
diag "$("$CLANG" --version | head -1), CUDA at $CUDA_HOME"

for f in kernels/kk/cuda/*.cu; do
	n=$(basename "$f")
	"$CLANG" "${FLAGS[@]}" --cuda-device-only -S "$f" -o "$tmp/$n.ptx" >"$tmp/$n.dev" 2>&1
	rd=$?
	[ $rd = 0 ] && ! grep -q '^\s*\.entry\|^\s*\.func\|^\s*\.visible\|^\s*\.version' "$tmp/$n.ptx" && rd=1
	"$CLANG" "${FLAGS[@]}" --cuda-host-only -fsyntax-only "$f" >"$tmp/$n.host" 2>&1
	rh=$?
	[ $rd = 0 ] || sed 's/^/# /' "$tmp/$n.dev" | head -20
	[ $rh = 0 ] || sed 's/^/# /' "$tmp/$n.host" | head -20
	check "$n: device PTX for sm_90 and host code, no warnings" $((rd | rh))
done
tap_done
