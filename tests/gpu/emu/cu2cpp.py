"""tests/gpu/emu/cu2cpp.py — rewrites a kernels/kk/cuda/*.cu file into
host C++ for the CPU emulation (see include/cuda_runtime.h): kernel launches
`k<<<g, b, smem, s>>>(args)` become `kc_emu_launch(kc_cfg(g, b, smem, s), k,
args)`, the dynamic shared-memory declaration becomes a pointer into the
emulator's per-launch buffer, and each static `__shared__` declaration gets a
kc_emu_shreg beside it so the emulator poisons it before every block.
Usage: cu2cpp.py IN.cu OUT.cpp"""
import re
import sys

src = open(sys.argv[1]).read()
src = re.sub(r"extern\s+__shared__\s+float\s+(\w+)\[\];",
             r"float *\1 = (float *)kc_emu_dyn_smem();", src)


def shared(m):
    """`__shared__ T a[N], b;` -> the same plus one registration per name."""
    decls, regs, depth, cur = [], [], 0, ""
    for ch in m.group(1):
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            decls.append(cur)
            cur = ""
        else:
            cur += ch
    decls.append(cur)
    for i, d in enumerate(decls):
        d = d.split("[")[0].split("=")[0].strip()
        name = re.findall(r"\w+", d)[-1] if i == 0 else d
        regs.append(f"static kc_emu_shreg kc_emu_shreg_{name}(&{name}, sizeof {name});")
    return m.group(0) + " " + " ".join(regs)


src = re.sub(r"(?<!extern )\b__shared__\s+([^;]*);", shared, src)
launch = re.compile(r"([A-Za-z_]\w*(?:\s*<[^;<>()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
src, n = launch.subn(lambda m: f"kc_emu_launch(kc_cfg({m.group(2)}), {m.group(1)}, ", src)
if "<<<" in src:
    sys.exit(f"{sys.argv[1]}: a launch was not rewritten")
open(sys.argv[2], "w").write(f'#line 1 "{sys.argv[1]}"\n' + src)
