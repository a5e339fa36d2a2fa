#!/bin/bash
# tests/kernels/test-kk-module.sh — the CUDA backend is loaded, not linked
# (kernels/kk/kk_module.c, kernels/kk/cuda/build.mk).  Prints TAP.  Checks:
#  - no program or test binary of the build has libcudart, libcublasLt,
#    libnccl or libcuda in its DT_NEEDED; the module's DT_NEEDED are exactly
#    the expected set, each resolved by ldd; it exports one symbol;
#  - kk-open (tests/kernels/module/kk-open.c) with the real module: here it
#    loads (libcudart is present) and finds no driver; with the module moved
#    away; with $KILN_KK_CUDA wrong; with the CUDA libraries hidden (bind
#    mounts in a private mount namespace: unshare -rm); against fake
#    modules of another kiln version, another op table, no module symbol, an
#    old driver, no device, and a working one;
#  - kiln-train (3 steps), kiln-inferd (one completion on the model fixture) and
#    the kernels' cpu suite with the module moved and the CUDA libraries
#    hidden: --backend auto runs on the cpu and logs why once, --backend
#    cuda fails naming what is missing.
# On a machine with a GPU the no-driver expectations are skipped.
set -u
cd "$(dirname "$0")/../.."
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
. tests/lib/tap.sh
MOD=$B/lib/kiln/kk-cuda.so
OPEN=$B/tests/kk-open
FAKE=$B/tests/fake-kk-cuda
. tests/lib/fixture.sh
MODEL=$(kiln_fixture_path)
if [ ! -x "$OPEN" ]; then
	echo "1..1"
	echo "ok 1 # SKIP $OPEN not built"
	exit 0
fi
tmp=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$tmp"' EXIT
export KILN_LOG_PREFIX=0 KK_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1
unset KILN_BACKEND KILN_KK_CUDA RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
gpu=0
nvidia-smi -L >/dev/null 2>&1 && gpu=1
# has FILE WORD... : FILE holds every WORD (fixed strings); else shows FILE
# as TAP comments (on fd 3, the script's stdout: has runs inside $(...)).
exec 3>&1
has() {
	local f=$1 w
	shift
	for w in "$@"; do
		grep -qF -- "$w" "$f" || {
			echo "# no '$w' in:" >&3
			sed 's/^/#   /' "$f" >&3
			return 1
		}
	done
}

# ---- link-time dependencies
bad=
for f in "$B"/bin/* "$B"/tests/*; do
	[ -f "$f" ] && [ -x "$f" ] && head -c 4 "$f" | grep -q ELF || continue
	readelf -d "$f" 2>/dev/null | grep NEEDED | grep -qE 'lib(cudart|cublas|cublasLt|nccl|cuda)\.so' &&
		bad="$bad ${f#"$B"/}"
done
check "no program or test binary links a CUDA library${bad:+ (linked:$bad)}" $([ -z "$bad" ]; echo $?)

if [ ! -f "$MOD" ]; then
	skip "no $MOD (CUDA=0 build): its DT_NEEDED"
	skip "no $MOD: its exports"
else
	readelf -d "$MOD" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort >"$tmp/needed"
	# CUDA's three (any soname version), then the C++ and C runtimes.
	want='^(libcudart\.so\.[0-9]+|libcublasLt\.so\.[0-9]+|libnccl\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libm\.so\.6|libc\.so\.6|ld-linux-x86-64\.so\.2)$'
	extra=$(grep -vE "$want" "$tmp/needed" | tr '\n' ' ')
	miss=
	for l in libcudart libcublasLt libnccl; do grep -q "^$l\.so\." "$tmp/needed" || miss="$miss $l"; done
	# ldd: every DT_NEEDED entry resolves to a file.
	unres=
	ldd "$MOD" >"$tmp/ldd" 2>&1
	while read -r n; do
		grep -qE "^[[:space:]]*$(sed 's/[.+]/\\&/g' <<<"$n") => /" "$tmp/ldd" ||
			[[ $n == ld-linux* ]] || unres="$unres $n"
	done <"$tmp/needed"
	check "the module's DT_NEEDED are exactly CUDA's three and the C/C++ runtimes ($(tr '\n' ' ' <"$tmp/needed"| sed 's/ $//'))${extra:+; unexpected: $extra}${miss:+; missing:$miss}${unres:+; ldd cannot resolve:$unres}" \
		$([ -z "$extra$miss$unres" ]; echo $?)
	syms=$(nm -D --defined-only "$MOD" | awk '{ print $3 }' | tr '\n' ' ')
	check "the module exports one symbol, kk_cuda_module_v1 (exports: $syms)" $([ "$syms" = "kk_cuda_module_v1 " ]; echo $?)
fi

# ---- the loader, through kk-open
# A copy of kk-open (and the programs) away from the build tree: no
# ../lib/kiln/kk-cuda.so next to it.
mkdir -p "$tmp/bin"
cp "$OPEN" "$B/bin/kiln-train" "$B/bin/kiln-inferd" "$tmp/bin/"
installed=
for d in $(strings "$B/bin/kiln-train" | grep -E '^/.*/lib/kiln$' | head -1); do
	[ -e "$d/kk-cuda.so" ] && installed=$d/kk-cuda.so
done

if [ -f "$MOD" ] && [ $gpu = 0 ]; then
	"$OPEN" cuda >"$tmp/o" 2>&1
	rc=$?
	check "cuda, the module loads, no driver here: exit 1, ENODEV, what to install" \
		$([ $rc = 1 ] && has "$tmp/o" "error: ENODEV: no NVIDIA driver: the CUDA runtime found no libcuda.so.1; install the NVIDIA driver >= 580.65.06" "needs CUDA 13.0"; echo $?)
	"$OPEN" auto >"$tmp/o" 2>&1
	rc=$?
	check "auto: the cpu, and one line saying there is no driver" \
		$([ $rc = 0 ] && has "$tmp/o" "opened cpu" "why: backend auto: no cuda (no NVIDIA driver" && [ "$(grep -c why "$tmp/o")" = 1 ]; echo $?)
	KILN_KK_CUDA=$MOD "$tmp/bin/kk-open" cuda >"$tmp/o" 2>&1
	check "KILN_KK_CUDA finds a module that is not next to the binary" $(has "$tmp/o" "no NVIDIA driver"; echo $?)
else
	for i in 1 2 3; do skip "no module or a GPU here: the no-driver answers"; done
fi

if [ -n "$installed" ]; then
	skip "$installed exists: the moved-module answer"
	skip "$installed exists: the moved-module auto answer"
else
	"$tmp/bin/kk-open" cuda >"$tmp/o" 2>&1
	rc=$?
	check "cuda, module moved away: exit 1, EOPNOTSUPP, where it looked, what to do" \
		$([ $rc = 1 ] && has "$tmp/o" "error: EOPNOTSUPP: the CUDA module is not installed (no $tmp/lib/kiln/kk-cuda.so nor " "install the kiln-cuda package, or set KILN_KK_CUDA"; echo $?)
	"$tmp/bin/kk-open" >"$tmp/o" 2>&1
	rc=$?
	check "auto, module moved away: the cpu, saying why" \
		$([ $rc = 0 ] && has "$tmp/o" "opened cpu" "why: backend auto: no cuda (the CUDA module is not installed"; echo $?)
fi
KILN_KK_CUDA=$tmp/nope.so "$OPEN" cuda >"$tmp/o" 2>&1
rc=$?
check "KILN_KK_CUDA naming no file: exit 1, names it" \
	$([ $rc = 1 ] && has "$tmp/o" "the CUDA module $tmp/nope.so (KILN_KK_CUDA) does not exist"; echo $?)
"$OPEN" tpu >"$tmp/o" 2>&1
rc=$?
check "an unknown backend: EINVAL, the names to use" $([ $rc = 1 ] && has "$tmp/o" "EINVAL: unknown kk backend 'tpu': use cpu, cuda or auto"; echo $?)

# hide CMD...: runs CMD with every file of libcudart, libcublasLt, libcublas,
# libnccl and libcuda that ldd or ldconfig knows replaced by /dev/null (a
# private mount namespace) and LD_LIBRARY_PATH empty.
cuda_files=$({
	[ -f "$MOD" ] && ldd "$MOD"
	ldconfig -p
} 2>/dev/null | grep -oE '/[^ ]*/lib(cudart|cublasLt|cublas|nccl|cuda)\.so[^ ]*' | xargs -r readlink -f | sort -u | tr '\n' ' ')
hide() {
	unshare -rm bash -c 'for f in $HIDE; do mount --bind /dev/null "$f" || exit 97; done; export LD_LIBRARY_PATH=; exec "$@"' hide "$@"
}
export HIDE=$cuda_files
can_hide=0
unshare -rm true 2>/dev/null && can_hide=1
if [ -f "$MOD" ] && [ $can_hide = 1 ] && [ -n "$cuda_files" ]; then
	hide "$OPEN" cuda >"$tmp/o" 2>&1
	rc=$?
	check "cuda, CUDA libraries hidden: exit 1, ELIBACC, dlerror names the library, what to do" \
		$([ $rc = 1 ] && has "$tmp/o" "error: ELIBACC: cannot load the CUDA module $MOD: " "install them, or add their directory to LD_LIBRARY_PATH" && grep -qE 'lib(cudart|cublasLt|nccl)\.so' "$tmp/o"; echo $?)
	hide "$OPEN" auto >"$tmp/o" 2>&1
	rc=$?
	check "auto, CUDA libraries hidden: the cpu, saying the module cannot load" \
		$([ $rc = 0 ] && has "$tmp/o" "opened cpu" "why: backend auto: no cuda (cannot load the CUDA module"; echo $?)
else
	skip "CUDA libraries cannot be hidden here (no module, no unshare -rm, or none found)"
	skip "CUDA libraries cannot be hidden here"
fi

# ---- fake modules: every answer a module can give
if [ -f "$FAKE/kk-cuda.so" ]; then
	fo() { KILN_KK_CUDA=$1 "$OPEN" "${2:-cuda}" >"$tmp/o" 2>&1; }
	fo "$FAKE/oldver.so"
	check "another kiln version's module: ELIBBAD, both versions, what to install" \
		$([ $? = 1 ] && has "$tmp/o" "ELIBBAD: $FAKE/oldver.so is the CUDA module of kiln 0.0.1, this program is kiln " "install the kiln-cuda package of kiln"; echo $?)
	fo "$FAKE/badabi.so"
	check "a module with another op table: ELIBBAD, rebuild or install the matching one" \
		$([ $? = 1 ] && has "$tmp/o" "ELIBBAD: $FAKE/badabi.so was built from other kk headers than this program"; echo $?)
	notmod=$(ls "$B"/lib/fake-nvml/libnvidia-ml.so.1 2>/dev/null)
	if [ -n "$notmod" ]; then
		fo "$notmod"
		check "a shared object that is no module: ELIBBAD, no kk_cuda_module_v1" \
			$([ $? = 1 ] && has "$tmp/o" "is not a kiln CUDA module of ABI 1 (no symbol kk_cuda_module_v1)"; echo $?)
	else
		skip "no other shared object built (fake-nvml)"
	fi
	KK_FAKE_DRIVER=12040 fo "$FAKE/kk-cuda.so"
	check "a driver for CUDA 12.4: ENODEV, 'driver supports CUDA 12.4, ... needs 13.0: install driver >= 580.65.06'" \
		$([ $? = 1 ] && has "$tmp/o" "error: ENODEV: the NVIDIA driver supports CUDA 12.4, kiln's CUDA module needs 13.0: install driver >= 580.65.06"; echo $?)
	KK_FAKE_DRIVER=0 fo "$FAKE/kk-cuda.so"
	check "no driver: ENODEV, no libcuda.so.1" $([ $? = 1 ] && has "$tmp/o" "ENODEV: no NVIDIA driver: the CUDA runtime found no libcuda.so.1"; echo $?)
	KK_FAKE_NODEV=1 fo "$FAKE/kk-cuda.so"
	check "no device: ENODEV, the probe's message" $([ $? = 1 ] && has "$tmp/o" "ENODEV: no CUDA device: the driver reports 0 GPUs"; echo $?)
	KK_FAKE_NODEV=1 fo "$FAKE/kk-cuda.so" auto
	check "  ... auto: the cpu, with that message" $([ $? = 0 ] && has "$tmp/o" "opened cpu" "no cuda (no CUDA device: the driver reports 0 GPUs"; echo $?)
	KK_FAKE_DRIVER=13020 fo "$FAKE/kk-cuda.so"
	check "a driver for CUDA 13.2 and a device: cuda opens" $([ $? = 0 ] && has "$tmp/o" "opened cuda"; echo $?)
	fo "$FAKE/kk-cuda.so" auto
	check "  ... and auto picks it, saying nothing" $([ $? = 0 ] && has "$tmp/o" "opened cuda" && ! grep -q why "$tmp/o"; echo $?)
else
	for i in $(seq 9); do skip "$FAKE/kk-cuda.so not built"; done
fi

# ---- the programs on a node without CUDA: module moved away, CUDA's
# libraries hidden (where unshare can), LD_LIBRARY_PATH empty.
run_bare() {
	if [ $can_hide = 1 ] && [ -n "$cuda_files" ]; then hide "$@"; else LD_LIBRARY_PATH= "$@"; fi
}
if [ ! -r "$MODEL" ]; then
	check "model fixture $MODEL is not readable: $KILN_FIXTURE_HINT" 1
elif [ -n "$installed" ]; then
	for i in $(seq 6); do skip "$installed exists: the programs without CUDA"; done
else
	python3 tests/train/mk-shard.py "$tmp/data.tok" 4000 >/dev/null || exit 1
	targs=(-m "$MODEL" -d "$tmp/data.tok" -b 2 --seq 16 --steps 3)
	run_bare "$tmp/bin/kiln-train" "${targs[@]}" --backend auto >"$tmp/o" 2>&1
	rc=$?
	check "kiln-train --backend auto, no CUDA: 3 steps on the cpu, the reason logged once" \
		$([ $rc = 0 ] && has "$tmp/o" "step 3/3" "backend auto: no cuda (the CUDA module is not installed" && [ "$(grep -c 'backend auto' "$tmp/o")" = 1 ]; echo $?)
	run_bare "$tmp/bin/kiln-train" "${targs[@]}" --backend cuda >"$tmp/o" 2>&1
	rc=$?
	check "kiln-train --backend cuda, no CUDA: exit $rc, what is missing and what to do" \
		$([ $rc != 0 ] && has "$tmp/o" "Cannot open the kk backend 'cuda': the CUDA module is not installed" "install the kiln-cuda package"; echo $?)
	if command -v curl >/dev/null; then
		# exec all the way down (unshare and bash -c exec too): $! is the server
		(
			if [ $can_hide = 1 ] && [ -n "$cuda_files" ]; then
				exec unshare -rm bash -c 'for f in $HIDE; do mount --bind /dev/null "$f" || exit 97; done; export LD_LIBRARY_PATH=; exec "$@"' hide "$tmp/bin/kiln-inferd" -m "$MODEL" --name m -p 0 --backend auto
			fi
			LD_LIBRARY_PATH= exec "$tmp/bin/kiln-inferd" -m "$MODEL" --name m -p 0 --backend auto
		) >"$tmp/log" 2>&1 &
		PID=$!
		port=
		for _ in $(seq 100); do
			port=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/log" 2>/dev/null | head -1 | sed 's/.*://')
			[ -n "$port" ] && break
			sleep 0.1
		done
		code=$(curl -s -o "$tmp/body" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
			-d '{"model":"m","prompt":[1],"max_tokens":8,"temperature":0}')
		kill -TERM "$PID" 2>/dev/null
		wait "$PID" 2>/dev/null
		PID=
		check "kiln-inferd --backend auto, no CUDA: serves on the cpu (HTTP $code), the reason logged once" \
			$([ "$code" = 200 ] && has "$tmp/log" "(cpu, " "backend auto: no cuda (the CUDA module is not installed" && [ "$(grep -c 'backend auto' "$tmp/log")" = 1 ]; echo $?)
	else
		skip "curl not installed"
	fi
	run_bare "$tmp/bin/kiln-inferd" -m "$MODEL" -p 0 --backend cuda >"$tmp/o" 2>&1
	rc=$?
	check "kiln-inferd --backend cuda, no CUDA: exit 1, what is missing" \
		$([ $rc = 1 ] && has "$tmp/o" "Failed to open the cuda backend: the CUDA module is not installed"; echo $?)
	if [ -f "$MOD" ] && [ $gpu = 0 ]; then
		"$B/bin/kiln-train" "${targs[@]}" --backend cuda >"$tmp/o" 2>&1
		rc=$?
		check "kiln-train --backend cuda, module found, no driver: exit $rc, install the driver" \
			$([ $rc != 0 ] && has "$tmp/o" "Cannot open the kk backend 'cuda': no NVIDIA driver" "install the NVIDIA driver >= "; echo $?)
	else
		skip "no module or a GPU here: kiln-train's no-driver message"
	fi
	if [ -x "$B/tests/test-kernels-cpu" ]; then
		CMOCKA_MESSAGE_OUTPUT=TAP run_bare "$B/tests/test-kernels-cpu" >"$tmp/o" 2>&1
		rc=$?
		check "the kernels' cpu suite, CUDA libraries hidden: passes ($(grep -c '^ok' "$tmp/o") ok)" $([ $rc = 0 ]; echo $?)
	else
		skip "test-kernels-cpu not built"
	fi
fi
tap_done
