#!/bin/bash
# tests/gpu/emu/test-emu.sh — runs the GPU parity test
# (tests/gpu/test-kk-cuda.c) against the cuda backend's own source
# (kernels/kk/cuda/*.cu) compiled as host C++ on a CPU emulation of CUDA
# (include/ + emu.cpp: one OS thread per CUDA thread, real barriers and warp
# shuffles, a naive cuBLASLt, single-rank NCCL).  It checks the kernels'
# arithmetic, indexing, masking, reductions and launch code on a machine
# without a GPU; it cannot check GPU timing or the GPU memory model.
# With --suite (test-emu-suite.sh) it runs the cmocka kernels suite
# (tests/kernels/kernels-suite.h: float64 references) on the same emulated
# backend through suite-emu.c instead, minus its sampling test (too many
# launches to emulate).  With --mem (test-emu-mem.sh) it runs the
# shape/alignment sweep of the memory-bound ops
# (tests/gpu/test-kk-cuda-mem.c) instead, built under
# $KILN_BUILD/emu-mem so it can run beside the others.  Each mode takes
# several minutes.
# First it checks the emulated tensor-core instructions (mma-check.cpp).
# KILN_TEST_FILTER=WORD runs only the parity tests whose name holds WORD
# (e.g. attn).
# Grid-stride kernels get at most 4 blocks here (KC_GRID_CAP), which keeps
# thread creation affordable and exercises their striding.
# KILN_EMU_SAN=asan (AddressSanitizer + UBSan) or tsan (ThreadSanitizer)
# builds everything but kernels/kk/cpu/simd.c (its IFUNC resolvers run before
# the sanitizer runtime is up) instrumented, under $KILN_BUILD/emu-SAN; with
# one OS thread per CUDA thread, TSan reports a missing __syncthreads as a
# data race.  KILN_EMU_PLANT='FILE.cu|SED' compiles FILE.cu through the sed
# script SED (a planted bug; the other objects are reused) and runs that
# instead: test-emu-plant.sh uses it to check that the emulator catches bugs.
# Prints TAP.  Needs g++ and python3; builds under $KILN_BUILD/emu.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$root/$B ;; esac
san=${KILN_EMU_SAN:-}
plant=${KILN_EMU_PLANT:-}
mode=${1:-}
test=test-kk-cuda
[ "$mode" = --mem ] && test=test-kk-cuda-mem
out=$B/emu${plant:+-plant}${san:+-$san}
[ "$mode" = --mem ] && out=$B/emu-mem
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
SANFLAGS=
case $san in
'') ;;
asan) SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
tsan) SANFLAGS="-fsanitize=thread" ;;
*)
	echo "test-emu.sh: KILN_EMU_SAN must be asan or tsan" >&2
	exit 2
	;;
esac
CFLAGS="$CFLAGS $SANFLAGS"
CXXFLAGS="$CXXFLAGS $SANFLAGS"
objs=()
fail() {
	echo "1..1"
	echo "not ok 1 - emulated cuda backend: $*"
	exit 1
}
# An object is rebuilt when its rewritten source changed or an emulator or
# kernels header is newer.
deps=(kernels/kk/cuda/*.h kernels/kk/cuda/*.cuh kernels/kk/include/* kernels/kk/*.h "$here/include" "$here/cu2cpp.py")
compile_cu() { # SRC.cu OUTBASE
	"$py" "$here/cu2cpp.py" "$1" "$2.cpp.new" || fail "rewrite $1"
	if [ ! -e "$2.o" ] || ! cmp -s "$2.cpp.new" "$2.cpp" ||
		[ -n "$(find "${deps[@]}" -newer "$2.o" 2>/dev/null)" ]; then
		mv "$2.cpp.new" "$2.cpp"
		g++ $CXXFLAGS -c "$2.cpp" -o "$2.o" || fail "compile $1"
	fi
	rm -f "$2.cpp.new"
}
pfile=${plant%%|*}
for f in kernels/kk/cuda/*.cu; do
	base=$(basename "$f" .cu)
	if [ -n "$plant" ] && [ "$f" = "$pfile" ]; then
		sed -e "${plant#*|}" "$f" >"$out/plant-$base.cu" || fail "plant: sed on $f"
		cmp -s "$f" "$out/plant-$base.cu" && fail "plant: '${plant#*|}' changes nothing in $f"
		# #line keeps the real file name in messages; the copy sits in $out,
		# so its includes are found through -Ikernels/kk/cuda.
		compile_cu "$out/plant-$base.cu" "$out/plant-$base"
		objs+=("$out/plant-$base.o")
		continue
	fi
	compile_cu "$f" "$out/$base"
	objs+=("$out/$base.o")
done
[ -z "$plant" ] || [ -e "$pfile" ] || fail "plant: no file $pfile"
if [ ! -e "$out/emu.o" ] || [ -n "$(find "$here/emu.cpp" "${deps[@]}" -newer "$out/emu.o" 2>/dev/null)" ]; then
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
hdrs=(kernels/kk/include/* kernels/kk/*.h kernels/kk/cpu/*.h tests/kernels/ref/*.h kernels/bench/*.h)
for f in kernels/kk/kk.c kernels/kk/kk_dtype.c kernels/kk/kk_module.c kernels/kk/cpu/*.c tests/kernels/ref/*.c tests/gpu/$test.c; do
	o=$out/c_$(echo "$f" | tr / _).o
	if [ ! -e "$o" ] || [ "$f" -nt "$o" ] || [ -n "$(find "${hdrs[@]}" -newer "$o" 2>/dev/null)" ]; then
		fl=$CFLAGS
		# simd.c's target_clones resolvers (IFUNC) run during relocation,
		# before any sanitizer runtime exists: never instrument them.
		[ "$f" = kernels/kk/cpu/simd.c ] && fl=${CFLAGS/$SANFLAGS/}
		gcc $fl -c "$f" -o "$o" || fail "compile $f"
	fi
	objs+=("$o")
done
exe=$out/$test-emu${plant:+-plant}
g++ -pthread $SANFLAGS -o "$exe" "${objs[@]}" "$out/libcommon-emu.a" -lopenblas -lm || fail "link"
if [ "$mode" = --mem ]; then
	export KILN_TEST_SMALL=1
	exec "$exe"
fi
# The emulated mma.sync/ldmatrix must match the PTX ISA's fragment layouts
# (mma-check.cpp) before the tensor-core kernels are judged on them.
g++ $CXXFLAGS -c "$here/mma-check.cpp" -o "$out/mma-check.o" || fail "compile mma-check.cpp"
g++ -pthread $SANFLAGS -o "$out/mma-check" "$out/mma-check.o" "$out/emu.o" "$out/c_kernels_kk_kk_dtype.c.o" -lm ||
	fail "link mma-check"
"$out/mma-check" >"$out/mma-check.log" 2>&1 || fail "mma/ldmatrix emulation disagrees with the PTX ISA layouts ($(grep -c FAILED "$out/mma-check.log") checks, see $out/mma-check.log)"
export KILN_TEST_SMALL=1
# The cpu backend's BLAS stays single-threaded: its threads are not
# instrumented and would only add noise to TSan.
export OPENBLAS_NUM_THREADS=1
if [ "$mode" != --suite ]; then
	exec "$exe"
fi
rc=0
# The kernels suite (tests/kernels/kernels-suite.h, float64 references and
# finite differences, cmocka) on the same emulated backend, when present.
suite=$here/suite-emu.c
if [ -f tests/kernels/kernels-suite.h ]; then
	lib=()
	for o in "${objs[@]}"; do
		[[ $o == *test-kk-cuda.c.o ]] || lib+=("$o")
	done
	so=$out/c_suite.o
	if gcc $CFLAGS -Itests/kernels -c "$suite" -o "$so" &&
		g++ -pthread $SANFLAGS -o "$out/test-kernels-cuda-emu" "$so" "${lib[@]}" "$out/libcommon-emu.a" -lcmocka -lopenblas -lm; then
		CMOCKA_MESSAGE_OUTPUT=${CMOCKA_MESSAGE_OUTPUT:-TAP} "$out/test-kernels-cuda-emu" || rc=1
	else
		echo "not ok - build the kernels suite against the emulated backend"
		rc=1
	fi
else
	echo "1..1"
	echo "ok 1 # SKIP tests/kernels/kernels-suite.h not present"
fi
exit $rc
