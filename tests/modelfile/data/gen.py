#!/usr/bin/python3
"""gen.py — writes the small model files the libkmf tests read, and the
values a correct reader must find in them.

This is the independent side of the check: the files are packed here by
hand with struct from the format specs (safetensors docs, ggml
docs/gguf.md, llama2.c run.c), quantized blocks are built from known
random codes and scales, and the expected f32 values are computed with
numpy from the same specs, never by kiln's C code.  Expected values go into
NAME.expect.safetensors (F32, same tensor names).  Deterministic (fixed
seed); the outputs are committed so tests need no Python:

    /usr/bin/python3 tests/modelfile/data/gen.py   # from the repo root
"""
import json
import os
import struct
import sys

import numpy as np

OUT = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261122)


# ---------------------------------------------------------------- safetensors
def write_safetensors(path, tensors, metadata=None, pad_to=8):
    """tensors: list of (name, dtype string, shape, raw bytes)."""
    header, off, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-(8 + len(h))) % pad_to)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def expect(path, named_f32):
    write_safetensors(path, [(n, "F32", v.shape, v.astype("<f4").tobytes()) for n, v in named_f32])


def bf16_bytes(x):
    """Round f32 to bf16 (nearest even) and return (bytes, the f32 values)."""
    u = np.asarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    back = (r.astype("<u4") << 16).view("<f4")
    return r.tobytes(), back


def gen_safetensors():
    a = rng.standard_normal((3, 4)).astype("<f4")
    h = rng.standard_normal((2, 8)).astype("<f2")
    braw, bvals = bf16_bytes(rng.standard_normal(5))
    d = rng.standard_normal((2, 2)).astype("<f8")
    i32 = np.array([[1, -2], [3, 2147483647]], dtype="<i4")
    u8 = np.array([0, 7, 255], dtype="u1")
    tensors = [
        ("model.embed.weight", "F32", (3, 4), a.tobytes()),
        ("half", "F16", (2, 8), h.tobytes()),
        ("brain", "BF16", (5,), braw),
        ("dbl", "F64", (2, 2), d.tobytes()),
        ("ids", "I32", (2, 2), i32.tobytes()),
        ("bytes", "U8", (3,), u8.tobytes()),
        ("flag", "BOOL", (), b"\x01"),
        ("empty", "F32", (0, 3), b""),
    ]
    write_safetensors(os.path.join(OUT, "basic.safetensors"), tensors,
                      {"format": "pt", "kiln.step": "42", "note": "h\u00e9llo"})
    expect(os.path.join(OUT, "basic.expect.safetensors"),
           [("model.embed.weight", a), ("half", h.astype("<f4")), ("brain", bvals),
            ("dbl", d.astype("<f4"))])


# ----------------------------------------------------------------------- GGUF
def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
          T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}


def gkv(key, t, v, et=None):
    out = gstr(key) + struct.pack("<I", t)
    if t == T_STR:
        return out + gstr(v)
    if t == T_ARR:
        out += struct.pack("<IQ", et, len(v))
        for x in v:
            out += gstr(x) if et == T_STR else struct.pack(SCALAR[et], x)
        return out
    return out + struct.pack(SCALAR[t], v)


GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14,
        "I8": 24, "I32": 26, "BF16": 30}


def f16(x):
    return np.float16(x)


def q8_0(rows, k):
    """Random Q8_0 blocks; returns raw bytes and the f32 values."""
    raw, vals = b"", []
    for _ in range(rows * k // 32):
        d = f16(rng.uniform(0.001, 0.05))
        q = rng.integers(-128, 128, 32).astype(np.int8)
        raw += d.tobytes() + q.tobytes()
        vals.append(np.float32(d) * q.astype(np.float32))
    return raw, np.concatenate(vals).reshape(rows, k)


def q4_0(rows, k):
    raw, vals = b"", []
    for _ in range(rows * k // 32):
        d = f16(rng.uniform(-0.1, 0.1))
        nib = rng.integers(0, 16, 32).astype(np.uint8)
        qs = (nib[:16] | (nib[16:] << 4)).astype(np.uint8)  # x[i] low, x[i+16] high
        raw += d.tobytes() + qs.tobytes()
        vals.append(np.float32(d) * (nib.astype(np.float32) - 8))
    return raw, np.concatenate(vals).reshape(rows, k)


def q4_1(rows, k):
    raw, vals = b"", []
    for _ in range(rows * k // 32):
        d, m = f16(rng.uniform(0, 0.1)), f16(rng.uniform(-1, 1))
        nib = rng.integers(0, 16, 32).astype(np.uint8)
        qs = (nib[:16] | (nib[16:] << 4)).astype(np.uint8)
        raw += d.tobytes() + m.tobytes() + qs.tobytes()
        vals.append(np.float32(d) * nib.astype(np.float32) + np.float32(m))
    return raw, np.concatenate(vals).reshape(rows, k)


def q4_k(rows, k):
    """Super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale and
    6-bit min: y = d * sc[j] * q - dmin * m[j]."""
    raw, vals = b"", []
    for _ in range(rows * k // 256):
        d, dmin = f16(rng.uniform(0, 0.01)), f16(rng.uniform(0, 0.01))
        sc = rng.integers(0, 64, 8)
        mn = rng.integers(0, 64, 8)
        packed = np.zeros(12, dtype=np.uint8)
        for j in range(4):
            packed[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
            packed[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
            packed[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
        q = rng.integers(0, 16, 256).astype(np.uint8)  # sub-block j = q[32j:32j+32]
        qs = np.zeros(128, dtype=np.uint8)
        for c in range(4):  # 32 bytes hold sub-block 2c (low) and 2c+1 (high)
            qs[32 * c:32 * c + 32] = q[64 * c:64 * c + 32] | (q[64 * c + 32:64 * c + 64] << 4)
        raw += d.tobytes() + dmin.tobytes() + packed.tobytes() + qs.tobytes()
        y = np.empty(256, dtype=np.float32)
        for j in range(8):
            y[32 * j:32 * j + 32] = (np.float32(d) * np.float32(sc[j])) * q[32 * j:32 * j + 32].astype(
                np.float32) - np.float32(dmin) * np.float32(mn[j])
        vals.append(y)
    return raw, np.concatenate(vals).reshape(rows, k)


def q6_k(rows, k):
    """256 values of 6 bits (q - 32), 16 int8 scales of 16 values, f16 d."""
    raw, vals = b"", []
    for _ in range(rows * k // 256):
        d = f16(rng.uniform(0, 0.01))
        sc = rng.integers(-128, 128, 16).astype(np.int8)
        q = rng.integers(0, 64, 256).astype(np.uint8)
        ql = np.zeros(128, dtype=np.uint8)
        qh = np.zeros(64, dtype=np.uint8)
        for h in range(2):  # value index 128h + 32*s + l, s = 0..3
            for l in range(32):
                v = [q[128 * h + 32 * s + l] for s in range(4)]
                ql[64 * h + l] = (v[0] & 15) | ((v[2] & 15) << 4)
                ql[64 * h + 32 + l] = (v[1] & 15) | ((v[3] & 15) << 4)
                qh[32 * h + l] = (v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6)
        raw += ql.tobytes() + qh.tobytes() + sc.tobytes() + d.tobytes()
        y = np.empty(256, dtype=np.float32)
        for i in range(256):  # scale index: 16 consecutive values share one
            y[i] = np.float32(d) * np.float32(sc[i // 16]) * np.float32(int(q[i]) - 32)
        vals.append(y)
    return raw, np.concatenate(vals).reshape(rows, k)


def write_gguf(path, version, kvs, tensors, align=32):
    """tensors: list of (name, ggml type name, row-major shape, raw bytes)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    off, data = 0, b""
    for name, tn, shape, raw in tensors:
        ne = list(reversed(shape))  # ne[0] is the fastest dimension
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", GGML[tn], off)
        pad = (-len(raw)) % align
        data += raw + b"\0" * pad
        off += len(raw) + pad
    out += b"\0" * ((-len(out)) % align)
    with open(path, "wb") as f:
        f.write(out + data)


def gen_gguf():
    f32 = rng.standard_normal((3, 8)).astype("<f4")
    h = rng.standard_normal((2, 4)).astype("<f2")
    braw, bvals = bf16_bytes(rng.standard_normal((2, 3)))
    q8raw, q8 = q8_0(3, 64)
    q40raw, q40 = q4_0(4, 64)
    q41raw, q41 = q4_1(2, 32)
    q4kraw, q4k = q4_k(2, 256)
    q6kraw, q6k = q6_k(2, 256)
    tokens = ["<unk>", "<s>", "</s>", "\u2581the", "\u00e9t\u00e9", "<0x0A>", ""]
    kvs = [
        gkv("general.architecture", T_STR, "llama"),
        gkv("general.alignment", T_U32, 64),
        gkv("test.u8", T_U8, 200), gkv("test.i8", T_I8, -100),
        gkv("test.u16", T_U16, 65000), gkv("test.i16", T_I16, -32000),
        gkv("test.u32", T_U32, 4000000000), gkv("test.i32", T_I32, -2000000000),
        gkv("test.f32", T_F32, 0.5), gkv("test.bool", T_BOOL, True),
        gkv("test.u64", T_U64, 2 ** 63 + 5), gkv("test.i64", T_I64, -(2 ** 62)),
        gkv("test.f64", T_F64, 3.25),
        gkv("tokenizer.ggml.tokens", T_ARR, tokens, T_STR),
        gkv("tokenizer.ggml.scores", T_ARR, [0.0, -1.5, 2.25], T_F32),
        gkv("test.i32s", T_ARR, [1, -2, 3], T_I32),
    ]
    tensors = [
        ("token_embd.weight", "F32", (3, 8), f32.tobytes()),
        ("half", "F16", (2, 4), h.tobytes()),
        ("brain", "BF16", (2, 3), braw),
        ("blk.0.attn_q.weight", "Q8_0", (3, 64), q8raw),
        ("blk.0.attn_k.weight", "Q4_0", (4, 64), q40raw),
        ("blk.0.attn_v.weight", "Q4_1", (2, 32), q41raw),
        ("blk.0.ffn_up.weight", "Q4_K", (2, 256), q4kraw),
        ("blk.0.ffn_down.weight", "Q6_K", (2, 256), q6kraw),
    ]
    write_gguf(os.path.join(OUT, "types-v3.gguf"), 3, kvs, tensors, align=64)
    exp = [("token_embd.weight", f32), ("half", h.astype("<f4")), ("brain", bvals),
           ("blk.0.attn_q.weight", q8), ("blk.0.attn_k.weight", q40),
           ("blk.0.attn_v.weight", q41), ("blk.0.ffn_up.weight", q4k),
           ("blk.0.ffn_down.weight", q6k)]
    expect(os.path.join(OUT, "types-v3.expect.safetensors"), exp)
    # v2, default alignment, a 3-D tensor.
    cube = rng.standard_normal((2, 3, 4)).astype("<f4")
    write_gguf(os.path.join(OUT, "small-v2.gguf"), 2,
               [gkv("general.architecture", T_STR, "llama"), gkv("llama.block_count", T_U32, 1)],
               [("cube", "F32", (2, 3, 4), cube.tobytes()), ("blk.0.attn_k.weight", "Q4_0", (4, 64), q40raw)])
    expect(os.path.join(OUT, "small-v2.expect.safetensors"), [("cube", cube), ("blk.0.attn_k.weight", q40)])


# ------------------------------------------------------------------- llama2.c
def gen_llama2c():
    """A tiny llama2.c checkpoint with an unshared classifier (negative
    vocab_size in the header): every float is its own index * 1e-3 so the
    test can check each tensor's position."""
    dim, hidden, layers, heads, kv_heads, vocab, seq = 8, 12, 2, 4, 2, 10, 4
    kv_dim, hs = dim * kv_heads // heads, dim // heads
    n = (vocab * dim + layers * dim * 2 + layers * dim * dim * 2 + layers * dim * kv_dim * 2
         + layers * dim * hidden * 3 + dim + seq * hs + vocab * dim)
    vals = (np.arange(n) * 1e-3).astype("<f4")
    with open(os.path.join(OUT, "tiny.llama2c.bin"), "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, -vocab, seq) + vals.tobytes())


if __name__ == "__main__":
    gen_safetensors()
    gen_gguf()
    gen_llama2c()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT) if not f.endswith(".py"))
    print(f"wrote {OUT} ({total} bytes)", file=sys.stderr)
