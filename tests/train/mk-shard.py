#!/usr/bin/env python3
"""Writes a kmtrain token shard for the kiln-train tests: N ids (vocab 512,
u16) made of six fixed random "phrases" in random order, each run starting
with BOS (1), so a model can learn it.  Writes the format of docs/train.md
itself (struct only), so the program's reader is checked against an
independent writer.  usage: mk-shard.py OUT [N] [SEED]"""
import random
import struct
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
phrases = [[rng.randrange(2, 512) for _ in range(rng.randrange(5, 12))] for _ in range(6)]
ids = []
while len(ids) < n:
    ids.append(1)
    for _ in range(rng.randrange(2, 5)):
        ids += rng.choice(phrases)
ids = ids[:n]
with open(out, "wb") as f:
    f.write(b"KILNTOK1" + struct.pack("<IIQII", 1, 2, n, 512, 0))
    f.write(struct.pack("<%dH" % n, *ids))
