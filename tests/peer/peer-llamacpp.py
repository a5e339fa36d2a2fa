#!/usr/bin/env python3
"""tests/peer/peer-llamacpp.py: llama.cpp's side of the peer benchmark, the
same measurements as tests/peer/peer-kiln.c through llama-cpp-python's
low-level API (llama_decode on llama_batch, as llama.cpp's own server
batches sequences), one process per row.

usage: peer-llamacpp.py --model F.gguf --prompt IDS --threads N
                        [--decode N] [--seqs S] [--batch-prompt N]
                        [--reps R] [--greedy N]
Prints one JSON object like peer-kiln's ("engine": "llama.cpp"), plus
"py_step_us": the Python bookkeeping of one decode step measured without
llama_decode (batch filling and the argmax), which the decode rates
include and llama.cpp's C++ server would not pay.  KILN_PEER_CLOCK=cpu times
with the process CPU clock instead of the wall clock."""
import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np
import llama_cpp as L


# The benchmark's clock: wall time, or this process's CPU time (all its
# threads) with KILN_PEER_CLOCK=cpu, as peer-kiln.
clock = time.process_time if os.environ.get("KILN_PEER_CLOCK") == "cpu" else time.perf_counter


def peak_rss_mb():
    """This process's peak resident memory (VmHWM), MiB: not ru_maxrss, which
    Linux carries across exec from the parent (the driver)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def fn(*names):
    """The first of names that this llama-cpp-python has (the API was renamed
    across llama.cpp versions)."""
    for n in names:
        f = getattr(L, n, None)
        if f is not None:
            return f
    sys.exit("peer-llamacpp: llama_cpp lacks %s" % " / ".join(names))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--batch-prompt", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--greedy", type=int, default=20)
    a = ap.parse_args()
    prompt = [int(x) for x in a.prompt.split(",")]
    n_prompt = len(prompt)
    if a.seqs * a.batch_prompt > n_prompt:
        sys.exit("peer-llamacpp: --prompt shorter than --seqs x --batch-prompt")

    t0 = clock()
    L.llama_backend_init()
    if hasattr(L, "llama_log_set") and hasattr(L, "llama_log_callback"):
        global _quiet  # the callback must outlive the call
        _quiet = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(_quiet, ctypes.c_void_p())
    mp = L.llama_model_default_params()
    model = fn("llama_model_load_from_file", "llama_load_model_from_file")(a.model.encode(), mp)
    if not model:
        sys.exit("peer-llamacpp: %s: llama.cpp could not load it" % a.model)
    cp = L.llama_context_default_params()
    per_seq = n_prompt + a.decode + 8
    cp.n_ctx = per_seq * max(a.seqs, 1)
    cp.n_batch = max(n_prompt, a.seqs)
    cp.n_ubatch = cp.n_batch
    cp.n_seq_max = a.seqs
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    if hasattr(cp, "kv_unified"):
        cp.kv_unified = True
    ctx = fn("llama_init_from_model", "llama_new_context_with_model")(model, cp)
    if not ctx:
        sys.exit("peer-llamacpp: llama.cpp could not make a context")
    vocab = L.llama_model_get_vocab(model) if hasattr(L, "llama_model_get_vocab") else None
    n_vocab = L.llama_vocab_n_tokens(vocab) if vocab is not None else L.llama_n_vocab(model)
    load_s = clock() - t0

    if hasattr(L, "llama_get_memory"):
        mem = L.llama_get_memory(ctx)

        def clear():
            L.llama_memory_clear(mem, True)
    else:
        def clear():
            fn("llama_kv_self_clear", "llama_kv_cache_clear")(ctx)

    batch = L.llama_batch_init(max(n_prompt, a.seqs), 0, a.seqs)

    def fill(entries):
        """entries: (token, pos, seq, want_logits) tuples."""
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0
        batch.n_tokens = len(entries)

    def decode():
        r = L.llama_decode(ctx, batch)
        if r != 0:
            sys.exit("peer-llamacpp: llama_decode returned %d" % r)

    def argmax(i):
        p = L.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(p, shape=(n_vocab,))))

    # Prefill: the whole prompt in one batch, an empty cache each rep.
    times = []
    for _ in range(a.reps):
        clear()
        fill([(t, i, 0, i == n_prompt - 1) for i, t in enumerate(prompt)])
        t = clock()
        decode()
        argmax(n_prompt - 1)
        times.append(clock() - t)
    times.sort()
    prefill_tps = n_prompt / times[len(times) // 2]

    # Single stream: the prompt, then greedy steps (timed).
    clear()
    fill([(t, i, 0, i == n_prompt - 1) for i, t in enumerate(prompt)])
    decode()
    tok = argmax(n_prompt - 1)
    ids = []
    t = clock()
    for i in range(a.decode):
        ids.append(tok)
        fill([(tok, n_prompt + i, 0, True)])
        decode()
        tok = argmax(0)
    decode_tps = a.decode / (clock() - t)

    # The Python share of one step: the same filling and argmax, no decode.
    t = clock()
    for i in range(a.decode):
        fill([(tok, n_prompt + i, 0, True)])
        argmax(0)
    py_step_us = (clock() - t) / a.decode * 1e6

    # S sequences of batch_prompt tokens, then steps of one token each.
    clear()
    toks = []
    for q in range(a.seqs):
        sl = prompt[q * a.batch_prompt:(q + 1) * a.batch_prompt]
        fill([(tk, i, q, i == len(sl) - 1) for i, tk in enumerate(sl)])
        decode()
        toks.append(argmax(len(sl) - 1))
    t = clock()
    for i in range(a.decode):
        fill([(toks[q], a.batch_prompt + i, q, True) for q in range(a.seqs)])
        decode()
        toks = [argmax(q) for q in range(a.seqs)]
    batch_tps = a.seqs * a.decode / (clock() - t)

    L.llama_batch_free(batch)
    print(json.dumps({
        "engine": "llama.cpp",
        "version": getattr(L, "__version__", "?"),
        "load_s": round(load_s, 3),
        "prefill_tps": round(prefill_tps, 2),
        "decode_tps": round(decode_tps, 2),
        "batch_tps": round(batch_tps, 2),
        "rss_mb": round(peak_rss_mb(), 1),
        "py_step_us": round(py_step_us, 1),
        "greedy": ids[:a.greedy],
    }))
    sys.stdout.flush()
    L.llama_free(ctx)
    fn("llama_model_free", "llama_free_model")(model)


if __name__ == "__main__":
    main()
