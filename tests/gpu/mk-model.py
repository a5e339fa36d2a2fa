#!/usr/bin/env python3
"""tests/gpu/mk-model.py OUT.bin — a random-weight llama2.c model for run.sh's
`inferd` step: the fixture's head_dim of 8 has no cuda attention kernel, so
this one has dim 256, 4 heads of 64, 2 KV heads (GQA), 4 layers, hidden 688,
vocab 512, context 512.  Weights ~ N(0, 1/fan_in), the shared embedding
~ N(0, 0.2^2): logits spread about 3, so greedy decoding rarely meets a near
tie.  numpy only (there is no network on the GPU machine); seed 1."""
import struct
import sys

import numpy as np

dim, hidden, layers, heads, kv_heads, vocab, seq = 256, 688, 4, 4, 2, 512, 512
hd = dim // heads
rng = np.random.default_rng(1)


def mat(rows, cols, fan_in):
    return rng.normal(0, fan_in ** -0.5, (rows, cols)).astype(np.float32)


parts = [rng.normal(0, 0.2, (vocab, dim)).astype(np.float32),
         np.ones((layers, dim), np.float32)]
parts += [np.stack([mat(dim, dim, dim) for _ in range(layers)]),
          np.stack([mat(kv_heads * hd, dim, dim) for _ in range(layers)]),
          np.stack([mat(kv_heads * hd, dim, dim) for _ in range(layers)]),
          np.stack([mat(dim, dim, dim) for _ in range(layers)]),
          np.ones((layers, dim), np.float32),
          np.stack([mat(hidden, dim, dim) for _ in range(layers)]),
          np.stack([mat(dim, hidden, hidden) for _ in range(layers)]),
          np.stack([mat(hidden, dim, dim) for _ in range(layers)]),
          np.ones(dim, np.float32),
          np.zeros(seq * hd // 2, np.float32), np.zeros(seq * hd // 2, np.float32)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq))
    for p in parts:
        f.write(np.ascontiguousarray(p).tobytes())
