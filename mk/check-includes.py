#!/usr/bin/env python3
"""check-includes.py — no #include crosses a folder's stated dependencies
(make lint).

Every folder that holds C, CUDA or C++ sources belongs to a module: the
nearest folder at or above it whose README.md has a line

    May include: common, kernels/kk, ...        (or: May include: nothing)

naming, relative to the repository root, the modules whose headers its
files may include.  A module's own files and those of the folders below it
(that have no README.md of their own with such a line) are always allowed.
Each quoted or angled #include is resolved as the compiler would (the
including file's folder, then the -I folders given on the command line); a
header that resolves to a file of another module that is not listed is an
error: file:line, the header, the two modules, and what to do.  A source
folder with no module above it is an error too (write its README.md).

Usage: mk/check-includes.py [-I DIR ...]   (from the repository root)
Exits 0 when clean, 1 with one line per crossing.
"""
import os
import re
import subprocess
import sys

SRC = re.compile(r"\.(c|h|cu|cuh|cpp|def)$")
INC = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
MAY = re.compile(r"^May include:\s*(.*?)\s*$", re.M)


def module_of(path, modules):
    d = os.path.dirname(path)
    while True:
        if d in modules:
            return d
        if not d:
            return None
        d = os.path.dirname(d)


def main(argv):
    incdirs = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-I":
            incdirs.append(argv[i + 1])
            i += 2
        elif a.startswith("-I"):
            incdirs.append(a[2:])
            i += 1
        else:
            sys.exit("check-includes: unknown argument %r (usage: check-includes.py [-I DIR ...])" % a)
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], capture_output=True, text=True, check=True).stdout.split()
    modules = {}
    for f in files:
        if os.path.basename(f) != "README.md":
            continue
        with open(f, encoding="utf-8") as fh:
            m = MAY.search(fh.read())
        if not m:
            continue
        deps = [x.strip() for x in m.group(1).split(",") if x.strip()]
        if deps == ["nothing"]:
            deps = []
        modules[os.path.dirname(f)] = set(deps)
    bad = 0
    for mod, deps in sorted(modules.items()):
        for d in deps:
            if d not in modules:
                print("%s/README.md: 'May include' names %s, which is no module (no README.md "
                      "with a 'May include:' line there); fix the name or write that README" % (mod, d))
                bad += 1
    srcs = [f for f in files if SRC.search(f) and os.path.isfile(f)]
    for f in srcs:
        own = module_of(f, modules)
        if own is None:
            print("%s: no module owns this folder: write %s/README.md with what it holds and a "
                  "'May include:' line" % (f, os.path.dirname(f) or "."))
            bad += 1
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INC.match(line)
                if not m:
                    continue
                kind, name = m.groups()
                cands = ([os.path.dirname(f)] if kind == '"' else []) + incdirs
                hit = None
                for c in cands:
                    p = os.path.normpath(os.path.join(c, name))
                    if os.path.isfile(p) and not p.startswith(".."):
                        hit = p
                        break
                if hit is None:
                    continue  # a system or toolkit header
                other = module_of(hit, modules)
                if other is None or other == own or other in modules[own]:
                    continue
                print("%s:%d: includes %s (module %s), which %s/README.md does not list under "
                      "'May include' (%s); depend through a public header of an allowed module, "
                      "or add the dependency to the README if the layering allows it"
                      % (f, n, hit, other, own, ", ".join(sorted(modules[own])) or "nothing"))
                bad += 1
    if bad:
        print("check-includes: %d problem(s) in %d source files" % (bad, len(srcs)))
        return 1
    print("check-includes: %d source files in %d modules, no include crosses a stated dependency"
          % (len(srcs), len(modules)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
