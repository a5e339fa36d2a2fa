#!/bin/bash
# kernels/bench/sass-mix.sh — the instruction mix of hand-written CUDA
# kernels from their sm_90 SASS, without a GPU: compiles one kernels/kk/cuda
# file to a cubin (the ptxas gate's flags), disassembles it with cuobjdump
# and prints, per kernel whose name holds PATTERN, the counts of
# HMMA.16816 (mma.sync), LDSM (ldmatrix), LDGSTS (cp.async; in brackets
# those inside the loop), MUFU.EX2, LDL/STL (local memory: spills), and the
# length in instructions of the loop that holds the HMMAs (the longest
# backward branch around the first one).  docs/kernels-cuda.md's performance estimate of the tensor-core
# attention backward is built from this table.
#   kernels/bench/sass-mix.sh [FILE.cu [PATTERN]]
# Defaults: kernels/kk/cuda/attention-bwd.cu, "tc_kernel".
# cuobjdump and nvdisasm come from the toolkit, PATH, or PyPI's
# nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (mk/deps.sh; this toolkit
# ships neither); CUOBJDUMP overrides.  Without them it says so and exits 0.
set -u
cd "$(dirname "$0")/../.." || exit 1
src=${1:-kernels/kk/cuda/attention-bwd.cu}
pat=${2:-tc_kernel}
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
[ -x "$NVCC" ] || { echo "sass-mix: skipped: no nvcc at $NVCC (set NVCC or CUDA_HOME)"; exit 0; }
[ -f "$src" ] || { echo "sass-mix: no file $src" >&2; exit 2; }

mapfile -t pipbin < <(/usr/bin/python3 -c 'import nvidia, os
for p in nvidia.__path__: print(os.path.join(p, "cu13", "bin"))' 2>/dev/null)
dirs=("${CUDA_HOME:-/usr/local/cuda}/bin" "${pipbin[@]}")
CUOBJDUMP=${CUOBJDUMP:-}
if [ -z "$CUOBJDUMP" ]; then
	for d in "${dirs[@]}"; do
		[ -x "$d/cuobjdump" ] && { CUOBJDUMP=$d/cuobjdump; break; }
	done
	[ -n "$CUOBJDUMP" ] || CUOBJDUMP=$(command -v cuobjdump || true)
fi
if [ -z "$CUOBJDUMP" ]; then
	echo "sass-mix: skipped: no cuobjdump (the toolkit's, on PATH, or PyPI nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm: make deps)"
	exit 0
fi
# cuobjdump -sass runs nvdisasm from PATH.
for d in "$(dirname "$CUOBJDUMP")" "${dirs[@]}"; do
	[ -x "$d/nvdisasm" ] && { PATH=$d:$PATH; break; }
done
command -v nvdisasm >/dev/null || { echo "sass-mix: skipped: cuobjdump needs nvdisasm, not found"; exit 0; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Icommon/include -Iconfig/lib/include \
	-Ikernels/kk/include -DKILN_VERSION=\"sass\" -cubin -o "$tmp/k.cubin" "$src" >"$tmp/nvcc.log" 2>&1 ||
	{ cat "$tmp/nvcc.log" >&2; echo "sass-mix: $src does not compile" >&2; exit 1; }
"$CUOBJDUMP" -sass "$tmp/k.cubin" >"$tmp/k.sass" 2>"$tmp/cuobjdump.log" ||
	{ cat "$tmp/cuobjdump.log" >&2; exit 1; }
DEMANGLE=$(command -v cu++filt || command -v c++filt || echo cat)
python3 - "$tmp/k.sass" "$pat" "$DEMANGLE" <<'EOF'
import re, subprocess, sys
sass, pat, dem = sys.argv[1:4]
parts = re.split(r'\n\s*Function : (\S+)\n', open(sass).read())
print(f"{'kernel':44} {'HMMA':>5} {'LDSM':>5} {'LDGSTS(loop)':>10} {'EX2':>4} {'LDL/STL':>7} {'loop':>5}")
for i in range(1, len(parts), 2):
    name = subprocess.run([dem, parts[i]], capture_output=True, text=True).stdout.strip()
    name = re.sub(r'^void ', '', name.split('(')[0])
    if pat not in name:
        continue
    ins = []
    for l in parts[i + 1].split('\n'):
        m = re.search(r'/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    cnt = lambda p: sum(1 for _, t in ins if re.search(p, t))
    hm = [a for a, t in ins if 'HMMA' in t]
    lo = hi = -1
    for a, t in ins:
        m = re.search(r'\bBRA\b.*?0x([0-9a-f]+)', t)
        if m and hm and int(m.group(1), 16) <= hm[0] <= a and a - int(m.group(1), 16) > hi - lo:
            lo, hi = int(m.group(1), 16), a
    inloop = sum(1 for a, t in ins if lo <= a <= hi and 'LDGSTS' in t)
    c = [cnt(p) for p in (r'HMMA\.16816', r'\bLDSM', r'\bLDGSTS', r'MUFU\.EX2', r'\b(LDL|STL)\b')]
    print(f"{name:44} {c[0]:5} {c[1]:5} {f'{c[2]} ({inloop})':>10} {c[3]:4} {c[4]:7} "
          f"{(hi - lo) // 16 + 1 if lo >= 0 else 0:5}")
EOF
