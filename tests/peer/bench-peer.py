#!/usr/bin/env python3
"""tests/peer/bench-peer.py: kiln's CPU backend against llama.cpp in the same
run, on the same GGUF files (issue 15's table; docs/bench-peer.md).

Runs under the bench virtual environment (tests/peer/bench-peer.sh makes it:
llama-cpp-python compiled from source, and the gguf writer).  For each
model shape x weight format x thread count it runs peer-kiln and
peer-llamacpp.py alternately (--runs each, interleaved so drifting machine
load hits both), keeps each engine's best run, and prints one table with
the ratios kiln / llama.cpp.  Then the decode rate as a share of this
machine's memory roofline, and the greedy check: on the f32 files both
engines must produce the same first 20 token ids from the same prompt ids.

Exit 0; 1 when the greedy check fails or a run fails; 2 (skip) when the
gguf writer is missing.  llama.cpp missing: kiln's rows alone, said so."""
import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ["s15m", "s110m"]
DTYPES = ["f32", "f16", "q8_0", "q4_0"]
# kiln's weight storage for each file format: f16/q8_0/q4_0 files are
# loaded into kiln's own f16 / int8 / 4-bit layouts (docs/model.md).
KILN_DTYPE = {"f32": "f32", "f16": "f16", "q8_0": "i8", "q4_0": "q4"}


def gguf_bytes_per_token(path):
    """Bytes of weights one decode step must read: every tensor, but of the
    token embedding only one row unless it is also the classifier (no
    output.weight)."""
    import gguf
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    total = 0
    for t in r.tensors:
        if t.name != "token_embd.weight" or "output.weight" not in names:
            total += int(t.n_bytes)
    return total


def run(cmd, env, timeout):
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (os.path.basename(cmd[0] if cmd[0] != sys.executable else cmd[1]),
                                                  p.returncode, p.stderr.strip()[-600:]))
    line = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not line:
        raise RuntimeError("no JSON from %s: %s" % (cmd, p.stdout[-300:]))
    d = json.loads(line[-1])
    d["wall_s"] = time.perf_counter() - t
    return d


def best(rows):
    out = dict(rows[0])
    for k in ("prefill_tps", "decode_tps", "batch_tps"):
        out[k] = max(r[k] for r in rows)
    out["rss_mb"] = min(r["rss_mb"] for r in rows)
    return out


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("KILN_BUILD", "build"))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--no-llama", action="store_true", help="kiln's rows only")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with each process's CPU clock (rates per CPU-second; the copy "
                         "bandwidth too): a busy, shared machine disturbs it least")
    a = ap.parse_args()
    B = a.build
    kiln = os.path.join(B, "tests", "peer-kiln")
    if not os.access(kiln, os.X_OK):
        print("SKIP: %s not built" % kiln)
        return 2
    try:
        import gguf  # noqa: F401
    except ImportError:
        print("SKIP: the gguf package is missing (tests/peer/bench-peer.sh installs it)")
        return 2
    have_llama = not a.no_llama
    why_no_llama = "--no-llama"
    if have_llama:
        try:
            import llama_cpp
            llama_version = llama_cpp.__version__
        except Exception as e:  # an ImportError, or a broken build's OSError
            have_llama, why_no_llama = False, "llama_cpp does not import: %s" % e
    if a.cpu_time:
        os.environ["KILN_PEER_CLOCK"] = "cpu"
    print("# kiln vs llama.cpp%s, %d-token prompt, %d decode steps, %d sequences, best of %d"
          " interleaved runs, %s time" % (
              " (llama-cpp-python %s)" % llama_version if have_llama else "", a.prompt_len,
              a.decode, a.seqs, a.runs, "process CPU" if a.cpu_time else "wall"))
    if not have_llama:
        print("# llama.cpp column skipped: %s" % why_no_llama)

    gdir = os.path.join(B, "peer")
    os.makedirs(gdir, exist_ok=True)
    rng = random.Random(15)
    prompt = [rng.randrange(259, 32000) for _ in range(a.prompt_len)]
    prompt_s = ",".join(map(str, prompt))
    bw = {}
    for t in [int(x) for x in a.threads.split(",")]:
        bw[t] = run([kiln, "--bandwidth", str(t)], dict(os.environ), 120)["copy_gbs"]
    print("# copy bandwidth (STREAM copy: read + write bytes / s): " +
          ", ".join("%d thread%s %.1f GB/s" % (t, "s" if t > 1 else "", g) for t, g in bw.items()))
    # kiln's f32/f16 prefill is OpenBLAS's sgemm: say which kernels it ran
    # (OPENBLAS_CORETYPE=Haswell on an AVX-512 machine halves it;
    # docs/bench-peer.md).  llama.cpp does not use OpenBLAS.
    core = run([kiln, "--blas-core"], dict(os.environ), 60)
    print("# kiln's OpenBLAS kernels: %s%s" % (
        core["blas_core"], " (forced by OPENBLAS_CORETYPE=%s in the environment)" % os.environ[
            "OPENBLAS_CORETYPE"] if core["forced"] else " (OpenBLAS's own choice for this CPU)"))

    rows, failures, greedy_lines = [], [], []
    for shape in a.shapes.split(","):
        for dt in a.dtypes.split(","):
            path = os.path.join(gdir, "%s-%s.gguf" % (shape, dt))
            if not os.path.exists(path) or os.path.getmtime(path) < os.path.getmtime(
                    os.path.join(HERE, "mk-gguf.py")):
                subprocess.run([sys.executable, os.path.join(HERE, "mk-gguf.py"), shape, dt,
                                path + ".tmp"], check=True)
                os.replace(path + ".tmp", path)
            bpt = gguf_bytes_per_token(path)
            for t in [int(x) for x in a.threads.split(",")]:
                env = dict(os.environ, KK_CPU_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                           OMP_NUM_THREADS=str(t))
                common = ["--prompt", prompt_s, "--decode", str(a.decode), "--seqs", str(a.seqs)]
                kr, lr = [], []
                try:
                    for _ in range(a.runs):
                        kr.append(run([kiln, "--model", path, "--dtype", KILN_DTYPE[dt]] + common,
                                      env, 1800))
                        if have_llama:
                            lr.append(run([sys.executable, os.path.join(HERE, "peer-llamacpp.py"),
                                           "--model", path, "--threads", str(t)] + common, env, 1800))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failures.append("%s %s %d threads: %s" % (shape, dt, t, e))
                    continue
                k = best(kr)
                l = best(lr) if lr else None
                rows.append((shape, dt, t, k, l, bpt))
                if dt == "f32" and l is not None:
                    same = sum(1 for x, y in zip(k["greedy"], l["greedy"]) if x == y)
                    first_diff = next((i for i, (x, y) in enumerate(zip(k["greedy"], l["greedy"]))
                                       if x != y), None)
                    ok = first_diff is None and len(k["greedy"]) == len(l["greedy"])
                    greedy_lines.append("# greedy %s f32 %d thread%s: %s (%d/%d ids equal%s)" % (
                        shape, t, "s" if t > 1 else "", "same" if ok else "DIFFERENT", same,
                        len(k["greedy"]), "" if ok else ", first at %d: kiln %s, llama.cpp %s" % (
                            first_diff, k["greedy"][first_diff:first_diff + 3],
                            l["greedy"][first_diff:first_diff + 3])))
                    if not ok:
                        failures.append("greedy ids differ on %s f32 (%d threads)" % (shape, t))

    hdr = ("| model | weights | thr | prefill kiln | llama.cpp | ratio | decode kiln | llama.cpp |"
           " ratio | %d-seq kiln | llama.cpp | ratio | RSS MB kiln | llama.cpp | roofline kiln | llama.cpp |"
           % a.seqs)
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for shape, dt, t, k, l, bpt in rows:
        def f(d, key):
            return "%.0f" % d[key] if d else "-"

        def roof(d):
            return "%.0f%%" % (100.0 * d["decode_tps"] * bpt / (bw[t] * 1e9)) if d else "-"
        print("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            shape, dt, t, f(k, "prefill_tps"), f(l, "prefill_tps"),
            ratio(k["prefill_tps"], l and l["prefill_tps"]), f(k, "decode_tps"), f(l, "decode_tps"),
            ratio(k["decode_tps"], l and l["decode_tps"]), f(k, "batch_tps"), f(l, "batch_tps"),
            ratio(k["batch_tps"], l and l["batch_tps"]), f(k, "rss_mb"), f(l, "rss_mb"), roof(k), roof(l)))
    print("# tok/s; ratio = kiln / llama.cpp (>1: kiln faster).  roofline: decode tok/s x the file's"
          " bytes per token (every weight read once) / the copy bandwidth (memory traffic per second, as STREAM counts it)")
    if any(l for *_, l, _ in rows):
        py = max(l["py_step_us"] for *_, l, _ in rows if l)
        print("# llama.cpp's decode rates include llama-cpp-python's Python per step: at most %.0f us" % py)
    for g in greedy_lines:
        print(g)
    for f in failures:
        print("# FAILED: %s" % f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
