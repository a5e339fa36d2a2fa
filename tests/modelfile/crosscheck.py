#!/usr/bin/python3
"""crosscheck.py — optional, manual: libkmf against the reference Python
packages `gguf` (llama.cpp's gguf-py) and `safetensors` (Hugging Face).

Not part of make test (CI must not depend on PyPI).  Run from the repo root:

    /usr/bin/pip3 install --target /tmp/kmf-py gguf safetensors --no-deps
    PYTHONPATH=/tmp/kmf-py /usr/bin/python3 tests/modelfile/crosscheck.py

It compiles libkmf into a temporary shared object, then:
  1. writes a GGUF with gguf.GGUFWriter (F32, F16, Q8_0 and Q4_0 quantized
     by gguf.quants, Q4_1, raw Q4_K/Q6_K blocks, a string array) and checks
     that kmf reads the same shapes, metadata and values as
     gguf.quants.dequantize;
  2. writes safetensors with safetensors.torch (when torch imports; BF16 too)
     or safetensors.numpy and checks kmf reads the same values;
  3. writes a checkpoint with kmf_writer and checks safetensors reads it back.
Prints one line per check and exits 1 on any mismatch.
"""
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
fails = 0


def report(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += 0 if ok else 1


def build_lib(tmp):
    so = os.path.join(tmp, "libkmf.so")
    srcs = [os.path.join(ROOT, "kernels/modelfile", f) for f in
            ("kmf.c", "safetensors.c", "gguf.c", "llama2c.c", "convert.c", "writer.c")]
    srcs.append(os.path.join(ROOT, "kernels/kk/kk_dtype.c"))
    subprocess.check_call(["gcc", "-std=gnu11", "-O2", "-shared", "-fPIC", "-D_GNU_SOURCE",
                           "-I" + os.path.join(ROOT, "common/include"),
                           "-I" + os.path.join(ROOT, "kernels/kk/include"),
                           "-I" + os.path.join(ROOT, "kernels/modelfile/include"), *srcs,
                           "-ljansson", "-lm", "-o", so])
    lib = ctypes.CDLL(so)
    lib.kmf_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    lib.kmf_tensor_find.restype = ctypes.c_void_p
    lib.kmf_tensor_find.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.kmf_tensor_to_float.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.kmf_close.argtypes = [ctypes.c_void_p]
    lib.kmf_error_format.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.kmf_error_format.restype = ctypes.c_char_p
    lib.kmf_meta_get_str.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
    lib.kmf_writer_new.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.kmf_writer_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_uint64]
    lib.kmf_writer_set_meta.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.kmf_writer_commit.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p]
    lib.kmf_writer_free.argtypes = [ctypes.c_void_p]
    return lib


class File:
    """kmf_open + tensor lookups through ctypes (kmf_tensor: name, dtype,
    ndim, shape[8], nelem ... as laid out in kmf.h)."""

    def __init__(self, lib, path):
        self.lib, self.f = lib, ctypes.c_void_p()
        err = ctypes.create_string_buffer(4096)
        if lib.kmf_open(path.encode(), ctypes.byref(self.f), err) < 0:
            line = ctypes.create_string_buffer(1024)
            raise RuntimeError(lib.kmf_error_format(err, line, 1024).decode())

    def tensor(self, name):
        t = self.lib.kmf_tensor_find(self.f, name.encode())
        if not t:
            raise KeyError(name)
        ndim = ctypes.c_int.from_address(t + 12).value
        shape = [ctypes.c_int64.from_address(t + 16 + 8 * d).value for d in range(ndim)]
        nelem = ctypes.c_int64.from_address(t + 80).value
        out = np.empty(nelem, dtype=np.float32)
        r = self.lib.kmf_tensor_to_float(t, 0, out.ctypes.data, nelem)
        if r < 0:
            raise RuntimeError(f"kmf_tensor_to_float({name}) = {r}")
        return out.reshape(shape)

    def close(self):
        self.lib.kmf_close(self.f)


def gguf_check(lib, tmp):
    import gguf
    from gguf.quants import dequantize, quantize
    rng = np.random.default_rng(7)
    path = os.path.join(tmp, "ref.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a\u00e9"])
    want = {}
    f32 = rng.standard_normal((3, 64)).astype(np.float32)
    w.add_tensor("f32", f32)
    want["f32"] = f32
    f16 = rng.standard_normal((2, 32)).astype(np.float16)
    w.add_tensor("f16", f16)
    want["f16"] = f16.astype(np.float32)
    for qt in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
               gguf.GGMLQuantizationType.Q4_1):
        x = rng.standard_normal((4, 128)).astype(np.float32)
        q = quantize(x, qt)
        w.add_tensor(qt.name, q, raw_dtype=qt)
        want[qt.name] = dequantize(q, qt).reshape(4, 128)
    for qt, bsz in ((gguf.GGMLQuantizationType.Q4_K, 144), (gguf.GGMLQuantizationType.Q6_K, 210)):
        raw = rng.integers(0, 256, (2, 2 * bsz), dtype=np.uint8)
        for b in range(4):  # finite f16 scales: d (and dmin) at their spec offsets
            row, blk = divmod(b, 2)
            offs = (0, 2) if qt.name == "Q4_K" else (208,)
            for o in offs:
                raw[row, blk * bsz + o:blk * bsz + o + 2] = np.frombuffer(
                    np.float16(rng.uniform(0, 0.01)).tobytes(), np.uint8)
        w.add_tensor(qt.name, raw, raw_dtype=qt)
        want[qt.name] = dequantize(raw, qt).reshape(2, 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = File(lib, path)
    for name, v in want.items():
        got = f.tensor(name)
        report(got.shape == v.shape and np.array_equal(got, v.astype(np.float32)),
               f"gguf-py GGUFWriter {name} {list(v.shape)}: kmf == gguf.quants.dequantize "
               f"(max diff {np.max(np.abs(got - v)) if got.shape == v.shape else 'shape'})")
    f.close()


def safetensors_check(lib, tmp):
    rng = np.random.default_rng(8)
    path = os.path.join(tmp, "ref.safetensors")
    try:
        import torch
        from safetensors.torch import save_file
        t = {"a": torch.randn(5, 7), "b": torch.randn(3, 9).to(torch.bfloat16),
             "c": torch.randn(4).to(torch.float16), "d": torch.randn(2, 2, dtype=torch.float64)}
        save_file(t, path, metadata={"step": "7"})
        want = {k: v.to(torch.float32).numpy() for k, v in t.items()}
        how = "safetensors.torch"
    except ImportError:
        from safetensors.numpy import save_file
        want = {"a": rng.standard_normal((5, 7)).astype(np.float32),
                "c": rng.standard_normal(4).astype(np.float16)}
        save_file(want, path, metadata={"step": "7"})
        want = {k: v.astype(np.float32) for k, v in want.items()}
        how = "safetensors.numpy"
    f = File(lib, path)
    for k, v in want.items():
        got = f.tensor(k)
        report(np.array_equal(got, v), f"{how} save_file {k} {list(v.shape)}: kmf reads the same values")
    s = ctypes.c_char_p()
    report(lib.kmf_meta_get_str(f.f, b"step", ctypes.byref(s)) == 0 and s.value == b"7",
           f"{how} __metadata__ read by kmf")
    f.close()

    # kmf_writer -> safetensors
    out = os.path.join(tmp, "kmf.safetensors")
    w = ctypes.c_void_p()
    lib.kmf_writer_new(ctypes.byref(w))
    x = rng.standard_normal((3, 5)).astype(np.float32)
    shape = (ctypes.c_int64 * 2)(3, 5)
    lib.kmf_writer_add(w, b"x", 0, 2, shape, x.ctypes.data, x.nbytes)  # KMF_F32 = 0
    lib.kmf_writer_set_meta(w, b"step", b"9")
    err = ctypes.create_string_buffer(4096)
    r = lib.kmf_writer_commit(w, out.encode(), 0o644, err)
    lib.kmf_writer_free(w)
    from safetensors import safe_open
    with safe_open(out, "np") as fh:
        got = fh.get_tensor("x")
        report(r == 0 and np.array_equal(got, x) and fh.metadata() == {"step": "9"},
               "kmf_writer checkpoint read by safetensors.safe_open")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_lib(tmp)
        try:
            gguf_check(lib, tmp)
        except ImportError as e:
            print(f"skip gguf checks: {e}")
        try:
            safetensors_check(lib, tmp)
        except ImportError as e:
            print(f"skip safetensors checks: {e}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
