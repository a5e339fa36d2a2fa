#!/bin/bash
# kiln against llama.cpp on the same GGUF files, same run (make bench), as
# a one-test TAP suite whose table lines are TAP comments.
#
# llama.cpp comes from PyPI's llama-cpp-python, pinned and compiled from
# source here for this benchmark only (never a kiln dependency), with the
# gguf writer, into a virtual environment kept across builds:
#   $KILN_BENCH_CACHE (default ~/.cache/kiln/bench)/venv-llama-$LLAMA_CPP_PYTHON
# The first build takes minutes (about 15 on the 2-core CI machine); its log
# is build.log there.  When it cannot be built the llama.cpp column is
# skipped with the reason and kiln's rows still print.
# Arguments go to tests/peer/bench-peer.py (--shapes s15m --threads 1 ...);
# KILN_BENCH_PEER_ARGS adds more (make bench passes none).
set -u
B=${KILN_BUILD:-build}
LLAMA_CPP_PYTHON=0.3.36
GGUF=0.19.0
cache=${KILN_BENCH_CACHE:-$HOME/.cache/kiln/bench}
venv=$cache/venv-llama-$LLAMA_CPP_PYTHON
here=$(dirname "$0")
echo "1..1"

if [ ! -x "$B/tests/peer-kiln" ]; then
	echo "ok 1 # SKIP $B/tests/peer-kiln not built"
	exit 0
fi
py=$venv/bin/python
if [ ! -e "$venv/.complete" ]; then
	mkdir -p "$cache"
	echo "# building llama-cpp-python $LLAMA_CPP_PYTHON from source into $venv (log: $cache/build.log)"
	rm -rf "$venv"
	if /usr/bin/python3 -m venv --system-site-packages "$venv" >"$cache/build.log" 2>&1 &&
		CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF" \
			"$venv/bin/pip" install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON" "gguf==$GGUF" \
			>>"$cache/build.log" 2>&1; then
		touch "$venv/.complete"
	else
		echo "# llama-cpp-python did not build: $(tail -3 "$cache/build.log" | tr '\n' ' ')"
		# the gguf writer alone, so kiln's rows still run
		if [ -x "$venv/bin/pip" ] && "$venv/bin/pip" install -q "gguf==$GGUF" >>"$cache/build.log" 2>&1; then
			set -- --no-llama "$@"
		else
			echo "ok 1 # SKIP neither llama-cpp-python nor gguf installs here (see $cache/build.log)"
			exit 0
		fi
	fi
fi
# shellcheck disable=SC2086  # KILN_BENCH_PEER_ARGS: words on purpose
out=$("$py" "$here/bench-peer.py" --build "$B" ${KILN_BENCH_PEER_ARGS:-} "$@" 2>&1)
rc=$?
sed 's/^/# /; s/^# # /# /' <<<"$out"
case $rc in
0) echo "ok 1 - kiln vs llama.cpp" ;;
2) echo "ok 1 # SKIP $(grep -m1 '^SKIP' <<<"$out")" ;;
*)
	echo "not ok 1 - kiln vs llama.cpp (exit $rc)"
	exit 1
	;;
esac
