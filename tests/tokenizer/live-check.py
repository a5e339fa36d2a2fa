#!/usr/bin/env python3
"""live-check.py — compares libktok (through tok-tool) with the pinned
reference packages (HF `tokenizers`, `sentencepiece`) on fresh random
strings, for every fixture in data/files.json.  TAP on stdout.

Usage: live-check.py TOK_TOOL [N] [SEED]   (seed: random unless given; printed)"""
import importlib.util
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("mkfix", os.path.join(HERE, "make-fixtures.py"))
mkfix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mkfix)

# Code point ranges for random text: common scripts, marks, symbols, emoji.
RANGES = [(0x20, 0x7E), (0xA0, 0xFF), (0x370, 0x3FF), (0x400, 0x4FF), (0x300, 0x36F), (0x3040, 0x30FF),
          (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x2000, 0x206F), (0x1F300, 0x1F64F), (0x600, 0x6FF),
          (0x900, 0x97F), (0x9, 0xD)]


def wild(rng):
    out = []
    for _ in range(rng.randint(1, 40)):
        lo, hi = rng.choice(RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def main():
    tool = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        texts.append(wild(rng) if i % 2 else mkfix.random_text(rng))
    data = os.path.join(HERE, "data")
    with open(os.path.join(data, "files.json")) as f:
        files = json.load(f)
    print("1..%d" % len(files))
    print("# seed %d, %d random strings per file" % (seed, n))
    failed = 0
    refs = {}
    for k, (fname, refname) in enumerate(sorted(files.items()), 1):
        if refname not in refs:
            refs[refname] = mkfix.Reference(refname, data)
        ref = refs[refname]
        mode = "hf" if refname.startswith("hf-") else "sp"
        inp = "".join(json.dumps(t) + "\n" for t in texts)
        p = subprocess.run([tool, "encode", os.path.join(data, fname), mode], input=inp.encode(),
                           capture_output=True, timeout=120)
        if p.returncode != 0:
            print("not ok %d - %s: tok-tool failed: %s" % (k, fname, p.stderr.decode()[:300]))
            failed += 1
            continue
        got = [json.loads(l) for l in p.stdout.decode().splitlines()]
        bad = []
        for t, g in zip(texts, got):
            want = {"ids": ref.encode(t, False), "ids_special": ref.encode(t, True)}
            want["decoded"] = ref.decode(want["ids"])
            for key in ("ids", "ids_special", "decoded"):
                if g[key] != want[key]:
                    bad.append((t, key, g[key], want[key]))
        if len(got) != len(texts) or bad:
            failed += 1
            print("not ok %d - %s vs %s: %d of %d strings differ" % (k, fname, refname, len(bad), len(texts)))
            for t, key, g, w in bad[:5]:
                print("# %s %r\n#   ktok %r\n#   ref  %r" % (key, t, g, w))
        else:
            print("ok %d - %s vs %s: %d random strings agree (ids, ids with BOS, decode)"
                  % (k, fname, refname, len(texts)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
