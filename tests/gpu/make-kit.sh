#!/bin/bash
# tests/gpu/make-kit.sh BUILD KIT — packs a finished build for a GPU machine
# (see build.mk here): KIT/build gets BUILD's bin/ and tests/ (the binaries
# only), KIT/lib every shared library they need that is neither glibc's nor
# CUDA's (the GPU machine brings libcudart, libcublasLt, libnccl and the
# driver's libnvidia-ml; it lacks libconfig, jansson, OpenBLAS ...).  The
# binaries are built on Debian 12 (glibc 2.36) and run on any newer glibc.
# The CUDA backend is the module build/lib/kiln/kk-cuda.so (the binaries
# find it at ../lib/kiln); the second attention tiling's module goes in as
# build/lib/kiln/kk-cuda-mt1.so, which run.sh names through KILN_KK_CUDA.
set -eu
B=${1:?usage: make-kit.sh BUILD KIT}
KIT=${2:?usage: make-kit.sh BUILD KIT}
# What a kit may weigh: the device tool carries at most 64 MiB with the tree.
max_kib=$((40 * 1024))
[ -x "$B/tests/test-kk-cuda" ] || {
	echo "make-kit: $B/tests/test-kk-cuda is missing; run 'make gpu-kit' (it builds first)" >&2
	exit 1
}
[ -f "$B/lib/kiln/kk-cuda.so" ] && grep -q libcublasLt <(readelf -d "$B/lib/kiln/kk-cuda.so") || {
	echo "make-kit: $B/lib/kiln/kk-cuda.so is missing: $B was built without CUDA (no nvcc?), and a kit without the cuda backend is useless" >&2
	exit 1
}
# Staged in a temporary folder, carried as one xz'd tar (OpenBLAS alone
# is 35 MiB unpacked); run.sh unpacks it on the GPU machine.  xz -9 (its
# 64 MiB dictionary spans whole binaries); the CUDA fatbins are in the two
# modules only.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
rm -rf "$KIT"
mkdir -p "$KIT"
KIT_OUT=$KIT
KIT=$stage
mkdir -p "$KIT/build/bin" "$KIT/build/tests" "$KIT/build/lib/kiln" "$KIT/lib"
cp -p "$B"/bin/* "$KIT/build/bin/"
cp -p "$B/lib/kiln/kk-cuda.so" "$KIT/build/lib/kiln/"
[ -f "$B/mt1/lib/kiln/kk-cuda.so" ] && cp -p "$B/mt1/lib/kiln/kk-cuda.so" "$KIT/build/lib/kiln/kk-cuda-mt1.so"
for t in test-kk-cuda test-kk-cuda-mem test-kernels-cuda test-kernels-cpu test-model-cuda test-train-cuda \
	cuda-bench bench-kernels-cpu kk-open; do
	[ -x "$B/tests/$t" ] && cp -p "$B/tests/$t" "$KIT/build/tests/"
done
# The other attention tiling (tests/gpu/build.mk), when built.
for t in test-kk-cuda cuda-bench; do
	[ -x "$B/mt1/tests/$t" ] && cp -p "$B/mt1/tests/$t" "$KIT/build/tests/$t-mt1"
done
# The model fixture the build trained (the tests find it through
# KM_TEST_MODEL): make it first when it is not there yet.
fixture=${KM_TEST_MODEL:-$B/fixtures/tiny260K.bin}
[ -f "$fixture" ] || make -s B="$B" fixture >/dev/null || exit 1
mkdir -p "$KIT/fixtures"
cp "$fixture" "$KIT/fixtures/tiny260K.bin"
# Shared libraries: everything ldd resolves, minus the C runtime (the GPU
# machine's own is newer and must be used) and CUDA's (too big to carry,
# and the GPU machine's match its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libgcc_s|libstdc\+\+|libcuda|libcublas|libcudart|libnccl|libnvidia)'
for f in "$KIT"/build/bin/* "$KIT"/build/tests/* "$KIT"/build/lib/kiln/*; do
	ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
	[[ $name =~ $skip ]] && continue
	cp -L "$path" "$KIT/lib/$name"
done
strip --strip-debug "$KIT"/build/bin/* "$KIT"/build/tests/* "$KIT"/build/lib/kiln/*
# The libraries libslurm loads at run time are not needed: the kit never
# talks to a slurmctld (--check and --active only).
XZ_OPT="-9 -T1" tar -C "$KIT" -cJf "$KIT_OUT/kit.txz" build lib fixtures
nlib=$(ls "$KIT/lib" | wc -l)
nbin=$(ls "$KIT"/build/bin "$KIT"/build/tests | grep -vc ':$\|^$')
KIT=$KIT_OUT
cat >"$KIT/README" <<EOT
kiln GPU kit, made $(date -u +%Y-%m-%dT%H:%MZ) from $(git rev-parse --short HEAD 2>/dev/null || echo "?")$(git diff --quiet 2>/dev/null || echo "+dirty").
Run on the GPU machine from the repository root: tests/gpu/run.sh [STEP ...]
EOT
git rev-parse HEAD >"$KIT/commit" 2>/dev/null || true
kib=$(du -sk "$KIT" | cut -f1)
echo "gpu kit: $KIT/kit.txz, $((kib / 1024)) MiB ($nlib libraries, $nbin binaries)"
if [ "$kib" -gt "$max_kib" ]; then
	echo "make-kit: the kit is $((kib / 1024)) MiB, over the $((max_kib / 1024)) MiB that can travel" >&2
	exit 1
fi
