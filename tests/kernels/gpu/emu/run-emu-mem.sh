#!/bin/bash
# tests/kernels/gpu/emu/run-emu-mem.sh — runs the shape/alignment sweep of
# the memory-bound cuda ops (tests/kernels/gpu/test-kk-cuda-mem.c) against
# kernels/kk/cuda/*.cu compiled as host C++ on the CPU emulation of CUDA
# (include/ + emu.cpp; see run-emu.sh, whose build this repeats under
# $KILN_BUILD/emu-mem so the two can run side by side).  Checks every vector
# and scalar path of kernels/kk/cuda/kc_vec.cuh's users without a GPU; takes a
# few minutes.  Prints TAP.  Needs g++ and python3.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$root/$B ;; esac
out=$B/emu-mem
mkdir -p "$out"
cd "$root" || exit 1
py=python3
command -v g++ >/dev/null && command -v "$py" >/dev/null || {
	echo "1..1"
	echo "ok 1 # SKIP g++ or python3 missing"
	exit 0
}
CFLAGS="-std=gnu11 -O2 -g -D_GNU_SOURCE -DKILN_HAVE_CUDA=1 -Icommon/include -Ikernels/kk/include -DKILN_VERSION=\"emu\""
CXXFLAGS="-std=c++17 -O2 -g -pthread -D__CUDACC__ -DKC_GRID_CAP=4u -I$here/include -Ikernels/kk/include -Icommon/include -Ikernels/kk/cuda -w"
fail() {
	echo "1..1"
	echo "not ok 1 - emulated cuda backend: $*"
	exit 1
}
objs=()
for f in kernels/kk/cuda/*.cu; do
	base=$(basename "$f" .cu)
	"$py" "$here/cu2cpp.py" "$f" "$out/$base.cpp.new" || fail "rewrite $f"
	# Recompile only what changed (the headers count as a change).
	if [ ! -e "$out/$base.o" ] || ! cmp -s "$out/$base.cpp.new" "$out/$base.cpp" ||
		[ -n "$(find kernels/kk/cuda/*.h kernels/kk/cuda/*.cuh kernels/kk/include/* kernels/kk/*.h "$here/include" -newer "$out/$base.o" 2>/dev/null)" ]; then
		mv "$out/$base.cpp.new" "$out/$base.cpp"
		g++ $CXXFLAGS -c "$out/$base.cpp" -o "$out/$base.o" || fail "compile $f"
	fi
	rm -f "$out/$base.cpp.new"
	objs+=("$out/$base.o")
done
if [ ! -e "$out/emu.o" ] || [ -n "$(find "$here/emu.cpp" "$here/include" -newer "$out/emu.o" 2>/dev/null)" ]; then
	g++ $CXXFLAGS -c "$here/emu.cpp" -o "$out/emu.o" || fail "compile emu.cpp"
fi
objs+=("$out/emu.o")
# common/ goes in as an archive so only what kk uses is linked (its HTTP
# and JSON glue would otherwise need libmicrohttpd and jansson).
cobjs=()
for f in common/*.c; do
	o=$out/c_$(echo "$f" | tr / _).o
	if [ ! -e "$o" ] || [ "$f" -nt "$o" ]; then
		gcc $CFLAGS -c "$f" -o "$o" || fail "compile $f"
	fi
	cobjs+=("$o")
done
rm -f "$out/libcommon-emu.a" && ar rcs "$out/libcommon-emu.a" "${cobjs[@]}" || fail "archive common"
# The C side: kk, the cpu backend, the float64 references (tests/kernels/ref)
# and the test; an object is rebuilt when its source or a header is newer.
hdrs=(kernels/kk/include/* kernels/kk/*.h kernels/kk/cpu/*.h tests/kernels/ref/*.h)
for f in kernels/kk/kk.c kernels/kk/kk_dtype.c kernels/kk/kk_module.c kernels/kk/cpu/*.c tests/kernels/ref/*.c tests/kernels/gpu/test-kk-cuda-mem.c; do
	o=$out/c_$(echo "$f" | tr / _).o
	if [ ! -e "$o" ] || [ "$f" -nt "$o" ] || [ -n "$(find "${hdrs[@]}" -newer "$o" 2>/dev/null)" ]; then
		gcc $CFLAGS -c "$f" -o "$o" || fail "compile $f"
	fi
	objs+=("$o")
done
g++ -pthread -o "$out/test-kk-cuda-mem-emu" "${objs[@]}" "$out/libcommon-emu.a" -lopenblas -lm || fail "link"
export KILN_TEST_SMALL=1
exec "$out/test-kk-cuda-mem-emu"
