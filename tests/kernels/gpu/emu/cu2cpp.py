"""tests/kernels/gpu/emu/cu2cpp.py — rewrites a kernels/cuda/*.cu file into
host C++ for the CPU emulation (see include/cuda_runtime.h): kernel launches
`k<<<g, b, smem, s>>>(args)` become `kc_emu_launch(kc_cfg(g, b, smem, s), k,
args)`, and the dynamic shared-memory declaration becomes a pointer into the
emulator's per-launch buffer.  Usage: cu2cpp.py IN.cu OUT.cpp"""
import re
import sys

src = open(sys.argv[1]).read()
src = re.sub(r"extern\s+__shared__\s+float\s+(\w+)\[\];",
             r"float *\1 = (float *)kc_emu_dyn_smem();", src)
launch = re.compile(r"([A-Za-z_]\w*(?:\s*<[^;<>()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
src, n = launch.subn(lambda m: f"kc_emu_launch(kc_cfg({m.group(2)}), {m.group(1)}, ", src)
if "<<<" in src:
    sys.exit(f"{sys.argv[1]}: a launch was not rewritten")
open(sys.argv[2], "w").write(f'#line 1 "{sys.argv[1]}"\n' + src)
