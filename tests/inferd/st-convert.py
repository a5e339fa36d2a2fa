#!/usr/bin/env python3
"""tests/inferd/st-convert.py: a kiln safetensors model (the tiny260K
fixture) rewritten with its 2-D weights in bf16 or f16, the optimizer state
left out, for test-inferd-models.sh's --dtype auto cases (stdlib only:
struct's 'e' is IEEE half, bf16 is the rounded top half of an f32).

usage: st-convert.py IN.st bf16|f16 OUT.st"""
import json
import struct
import sys


def main():
    src, dt, out = sys.argv[1], sys.argv[2], sys.argv[3]
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    new_head, blobs, off = {"__metadata__": head["__metadata__"]}, [], 0
    for name, t in head.items():
        if name == "__metadata__" or name.startswith("optim."):
            continue
        b, e = t["data_offsets"]
        buf, dtype = data[b:e], t["dtype"]
        if dtype == "F32" and len(t["shape"]) >= 2:
            vals = struct.unpack("<%df" % (len(buf) // 4), buf)
            if dt == "f16":
                buf, dtype = struct.pack("<%de" % len(vals), *vals), "F16"
            else:
                words = struct.unpack("<%dI" % len(vals), buf)
                # round to nearest even
                words = [((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF for w in words]
                buf, dtype = struct.pack("<%dH" % len(words), *words), "BF16"
        new_head[name] = {"dtype": dtype, "shape": t["shape"],
                          "data_offsets": [off, off + len(buf)]}
        blobs.append(buf)
        off += len(buf)
    hj = json.dumps(new_head).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


if __name__ == "__main__":
    main()
