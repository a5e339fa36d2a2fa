#!/usr/bin/env python3
"""tests/peer/mk-gguf.py: random-weight Llama models as GGUF files, written
with the `gguf` package (llama.cpp's own writer), for the peer benchmark.

usage: mk-gguf.py SHAPE DTYPE OUT.gguf
  SHAPE  s15m (the stories15M shape: dim 288, 6 layers, 6 heads, FFN 768)
         s110m (dim 768, 12 layers, 12 heads, FFN 2048)
         both with vocab 32000
  DTYPE  f32, f16, q8_0 or q4_0: the 2-D weights (token embedding, every
         linear layer, the classifier); norms stay f32 as llama.cpp's own
         converter writes them

The classifier is the token embedding (no output.weight), as in the
stories models.  Weights are N(0, 1/sqrt(fan_in)) so activations stay O(1) through the
layers and the logits are well separated (greedy choices do not hinge on
rounding).  The vocabulary is a SentencePiece-style list (<unk> <s> </s>,
256 byte tokens, then "\u2581w<i>") that llama.cpp's loader accepts; the
benchmark feeds token ids, never text.  Same seed, same file."""
import sys

import numpy as np
import gguf

SHAPES = {
    # dim, hidden, layers, heads, kv heads, context
    "s15m": (288, 768, 6, 6, 6, 256),
    "s110m": (768, 2048, 12, 12, 12, 1024),
}
VOCAB = 32000
QTYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2}  # llama_ftype


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES or sys.argv[2] not in QTYPES:
        sys.exit("usage: mk-gguf.py {%s} {%s} OUT.gguf" % ("|".join(SHAPES), "|".join(QTYPES)))
    shape, dtype, out = sys.argv[1], sys.argv[2], sys.argv[3]
    dim, hidden, n_layers, n_heads, n_kv, ctx = SHAPES[shape]
    qtype = QTYPES[dtype]
    rng = np.random.default_rng(20261126)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("kiln-peer-%s-%s" % (shape, dtype))
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(hidden)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(dim // n_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(FILE_TYPES[dtype])

    tokens = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)]
    tokens += [("\u2581w%d" % i).encode() for i in range(VOCAB - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259)  # unknown, control, byte, normal
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(VOCAB - 259)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def mat(name, rows, cols, std):
        a = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    def norm(name):
        a = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
        w.add_tensor(name, a)

    head_dim = dim // n_heads
    # std 1: rows are embeddings (O(1) activations) and, shared, the
    # classifier: logits of std sqrt(dim), far apart next to rounding.
    mat("token_embd.weight", VOCAB, dim, 1.0)
    for l in range(n_layers):
        p = "blk.%d." % l
        norm(p + "attn_norm.weight")
        mat(p + "attn_q.weight", dim, dim, dim**-0.5)
        mat(p + "attn_k.weight", n_kv * head_dim, dim, dim**-0.5)
        mat(p + "attn_v.weight", n_kv * head_dim, dim, dim**-0.5)
        mat(p + "attn_output.weight", dim, dim, dim**-0.5)
        norm(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", hidden, dim, dim**-0.5)
        mat(p + "ffn_up.weight", hidden, dim, dim**-0.5)
        mat(p + "ffn_down.weight", dim, hidden, hidden**-0.5)
    norm("output_norm.weight")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
