#!/usr/bin/env python3
"""make-fixtures.py — trains small tokenizers with the independent reference
implementations (Hugging Face `tokenizers`, Google `sentencepiece`, pinned in
mk/deps.sh) on kiln's own documentation plus tricky strings, and writes the
files and golden cases that tests/tokenizer/test-tokenizer.c checks libktok
against without Python:

  data/hf-bytelevel.json   HF BPE, GPT-2 byte-level pre-tokenizer, added tokens
  data/hf-llama3.json      the same merges behind the Llama 3 split regex
                           (ignore_merges on, as Llama 3's file has)
  data/hf-qwen2.json       the same merges behind Qwen2's split (single digits)
  data/hf-spm.json         HF BPE SentencePiece-like: byte_fallback, <0xNN>
                           tokens, Prepend+Replace normalizer, <s> post-processor
  data/hf-metaspace.json   the same model behind a Metaspace pre-tokenizer
                           (prepend_scheme "first", split)
  data/sp.model            sentencepiece BPE (byte_fallback, identity normalizer)
  data/sp-llama.gguf       its vocabulary as GGUF tokenizer.ggml.model "llama"
  data/sp-tokenizer.bin    its vocabulary as a llama2.c tokenizer.bin
  data/tok512.bin          a 512-token sentencepiece BPE as a llama2.c
                           tokenizer.bin: the vocabulary size of the
                           stories260K model (whose own tok512 is not
                           shipped), so kiln-inferd's tests speak text
  data/bpe-gpt2.gguf       hf-bytelevel as GGUF "gpt2", pre "gpt2"
  data/bpe-llama3.gguf     hf-llama3 as GGUF "gpt2", pre "llama-bpe"
  data/bpe-qwen2.gguf      hf-qwen2 as GGUF "gpt2", pre "qwen2"
  data/golden-*.json       [{text, ids, ids_special, decoded}] from the reference

GGUF files are written by the tiny writer below (GGUF v3 from the spec, no
tensors).  Everything is deterministic for a given package version.

Also importable: tests/tokenizer/live-check.py uses reference() and
random_text() to compare against the packages on fresh random strings.

Usage: python3 tests/tokenizer/make-fixtures.py [OUTDIR]   (default: data/)
"""
import glob
import io
import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TRICKY = [
    "Hello world", "  leading spaces", "trailing   ", "tabs\tand\nnewlines\r\n",
    "multiple\n\n\nnewlines", "x  \n  y", "héllo wörld", "日本語のテキスト", "中文字符测试",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧", "combining e\u0301 and n\u0303", "Zalgo t̸̢e̵x̷t", "<s> literal",
    "</s> and <|im_end|> injection", "<|im_start|>user\nhi<|im_end|>", "it's don't I'LL we've THEY'RE",
    "numbers 1234567 3.14159 0x1F", "mixed123abc", " ", "\n", "a", "ΑΒΓ δεζ", "Привет мир",
    "العربية", "हिन्दी", "🤖 kiln", "the kiln-node answers", "\u00a0nbsp", "\u3000ideographic space",
    "tab\t\tx", "<0x41> literal byte token", "\u2581 literal marker", "a\u2581b",
    "!!!??? ... ---", "  \n\n  indented\n    code();", "URL https://example.com/a?b=c&d=e",
    "kiln check -c /etc/kiln/cluster.cfg", "ﬁ ligature ½ ² ①", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "\U0001F600" * 3,
    "한국어 텍스트", "ไทย", "a\r\nb\rc", "1234567890123", "'s", "'", "word'", "  '  ",
]

PIECES = ["the", " kiln", " node", "GPU", " ", "  ", "\n", "\t", "é", "ü", "ß", "日本", "中", "😀",
          "🎉", "👍🏽", "e\u0301", "123", "4", "'s", "'LL", ".", ",", "!", "?", "-", "_", "(", ")",
          "Ω", "ж", "ع", "한", "\u00a0", "<s>", "</s>", "<|im_end|>", "<0x41>", "\u2581", "x", "Y",
          "slurm", " srun", "0", "\r\n", "€", "™", "🤖"]


def random_text(rng, n_pieces=None):
    n = n_pieces if n_pieces is not None else rng.randint(1, 24)
    return "".join(rng.choice(PIECES) for _ in range(n))


def corpus():
    files = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
    files = [f for f in files if not f.endswith("tokenizer.md")]  # stable across this page's edits
    lines = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            lines += [l for l in fh.read().split("\n") if l.strip()]
    rng = random.Random(7)
    lines += TRICKY * 3 + [random_text(rng) for _ in range(300)]
    return lines


# ---------------------------------------------------------------- training

def train_hf(lines):
    from tokenizers import Tokenizer, AddedToken, decoders, models, pre_tokenizers, trainers
    # Byte-level, GPT-2 style.
    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=1000, min_frequency=2,
                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bl.train_from_iterator(lines, tr)
    bl.add_tokens([AddedToken("kiln-node", special=False, normalized=False)])
    j = json.loads(bl.to_str())
    bytelevel = json.dumps(j, ensure_ascii=False)
    # Llama 3 split in front of the same merges.
    j3 = json.loads(bytelevel)
    j3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j3["model"]["ignore_merges"] = True
    llama3 = json.dumps(j3, ensure_ascii=False)
    jq = json.loads(bytelevel)
    jq["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    qwen2 = json.dumps(jq, ensure_ascii=False)

    # SentencePiece-like: train under Metaspace, then lay out like Llama's file.
    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=900, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                             show_progress=False)
    sp.train_from_iterator(lines, tr)
    js = json.loads(sp.to_str())
    old = js["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for tok, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if tok not in vocab:
            vocab[tok] = len(vocab)
    js["model"]["vocab"] = vocab
    for a in js["added_tokens"]:
        a["id"] = vocab[a["content"]]
    js["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    js["pre_tokenizer"] = None
    js["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    js["post_processor"] = {"type": "TemplateProcessing",
                            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                     {"Sequence": {"id": "A", "type_id": 0}},
                                     {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                     {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    spm = json.dumps(js, ensure_ascii=False)
    jm = json.loads(spm)
    jm["normalizer"] = None
    jm["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                           "split": True}
    jm["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    meta = json.dumps(jm, ensure_ascii=False)
    return {"hf-bytelevel": bytelevel, "hf-llama3": llama3, "hf-qwen2": qwen2, "hf-spm": spm,
            "hf-metaspace": meta}


def train_sp(lines, vocab_size=1000):
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, allow_whitespace_only_pieces=True, split_digits=True,
        character_coverage=0.9995, num_threads=1, minloglevel=2)
    return buf.getvalue()


# ---------------------------------------------------------------- writers

def gguf_bytes(kv):
    """GGUF v3 with metadata only. kv: list of (key, type, value); type is a
    GGUF value type name; arrays as ("arr", elem_type, list)."""
    T = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8,
         "arr": 9, "u64": 10, "i64": 11, "f64": 12}
    F = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f",
         "bool": "<?", "u64": "<Q", "i64": "<q", "f64": "<d"}

    def s(x):
        b = x if isinstance(x, bytes) else x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(kv))]
    for key, typ, val in kv:
        out.append(s(key))
        if typ == "arr":
            et, items = val
            out.append(struct.pack("<II", T["arr"], T[et]) + struct.pack("<Q", len(items)))
            out += [s(x) if et == "str" else struct.pack(F[et], x) for x in items]
        else:
            out.append(struct.pack("<I", T[typ]))
            out.append(s(val) if typ == "str" else struct.pack(F[typ], val))
    data = b"".join(out)
    return data + b"\0" * ((-len(data)) % 32)


def sp_gguf(model_bytes, chat_template):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    toks, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        toks.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 1)
    kv = [("general.architecture", "str", "llama"),
          ("tokenizer.ggml.model", "str", "llama"),
          ("tokenizer.ggml.tokens", "arr", ("str", toks)),
          ("tokenizer.ggml.scores", "arr", ("f32", scores)),
          ("tokenizer.ggml.token_type", "arr", ("i32", types)),
          ("tokenizer.ggml.bos_token_id", "u32", sp.bos_id()),
          ("tokenizer.ggml.eos_token_id", "u32", sp.eos_id()),
          ("tokenizer.ggml.unknown_token_id", "u32", sp.unk_id()),
          ("tokenizer.ggml.add_bos_token", "bool", True),
          ("tokenizer.ggml.add_eos_token", "bool", False),
          ("tokenizer.chat_template", "str", chat_template)]
    return gguf_bytes(kv)


def sp_llama2c(model_bytes):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    toks = []
    for i in range(sp.get_piece_size()):
        t = sp.id_to_piece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        toks.append((t.replace("\u2581", " ").encode("utf-8"), sp.get_score(i)))
    out = [struct.pack("<i", max(len(b) for b, _ in toks))]
    for b, sc in toks:
        out.append(struct.pack("<fi", sc, len(b)) + b)
    return b"".join(out)


def hf_gguf(tok_json, pre, chat_template):
    j = json.loads(tok_json)
    vocab = j["model"]["vocab"]
    n = max(max(vocab.values()), max(a["id"] for a in j["added_tokens"])) + 1
    toks = [None] * n
    types = [1] * n
    for t, i in vocab.items():
        toks[i] = t
    for a in j["added_tokens"]:
        toks[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    kv = [("general.architecture", "str", "llama"),
          ("tokenizer.ggml.model", "str", "gpt2"),
          ("tokenizer.ggml.pre", "str", pre),
          ("tokenizer.ggml.tokens", "arr", ("str", toks)),
          ("tokenizer.ggml.token_type", "arr", ("i32", types)),
          ("tokenizer.ggml.merges", "arr", ("str", merges)),
          ("tokenizer.ggml.bos_token_id", "u32", toks.index("<|endoftext|>")),
          ("tokenizer.ggml.eos_token_id", "u32", toks.index("<|im_end|>")),
          ("tokenizer.ggml.add_bos_token", "bool", False),
          ("tokenizer.chat_template", "str", chat_template)]
    return gguf_bytes(kv)


# ---------------------------------------------------------------- reference

class Reference:
    """Encode/decode with the reference package for one fixture name."""

    def __init__(self, name, outdir):
        self.name = name
        if name.startswith("hf-"):
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(os.path.join(outdir, name + ".json"))
        else:
            import sentencepiece as spm
            self.sp = spm.SentencePieceProcessor(model_file=os.path.join(outdir, "sp.model"))

    def encode(self, text, special):
        if self.name.startswith("hf-"):
            return self.tok.encode(text, add_special_tokens=special).ids
        ids = self.sp.encode(text)
        return ([self.sp.bos_id()] if special else []) + ids

    def decode(self, ids):
        if self.name.startswith("hf-"):
            return self.tok.decode(ids, skip_special_tokens=True)
        return self.sp.decode(ids)


# What each C-side file is checked against (file -> reference name).
FILES = {"hf-bytelevel.json": "hf-bytelevel", "hf-llama3.json": "hf-llama3", "hf-spm.json": "hf-spm",
         "hf-metaspace.json": "hf-metaspace", "sp-llama.gguf": "sp", "sp-tokenizer.bin": "sp",
         "bpe-gpt2.gguf": "hf-bytelevel", "bpe-llama3.gguf": "hf-llama3", "hf-qwen2.json": "hf-qwen2",
         "bpe-qwen2.gguf": "hf-qwen2"}


def golden(ref, texts):
    out = []
    for t in texts:
        ids = ref.encode(t, False)
        out.append({"text": t, "ids": ids, "ids_special": ref.encode(t, True), "decoded": ref.decode(ids)})
    return out


def bad_files(outdir, hf, model):
    """Malformed inputs, each with the errno and a piece of the message the
    loader must give (bad/expect.json)."""
    import sentencepiece as spm
    bad = os.path.join(outdir, "bad")
    os.makedirs(bad, exist_ok=True)
    exp = {}
    sp = spm.SentencePieceProcessor(model_proto=model)
    n = sp.get_piece_size()
    toks = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(n)]

    def llama(tk=toks, sc=scores, ty=types, extra=()):
        return gguf_bytes([("tokenizer.ggml.model", "str", "llama"), ("tokenizer.ggml.tokens", "arr", ("str", tk)),
                           ("tokenizer.ggml.scores", "arr", ("f32", sc)),
                           ("tokenizer.ggml.token_type", "arr", ("i32", ty))] + list(extra))

    def put(name, data, code, msg):
        with open(os.path.join(bad, name), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        exp[name] = [code, msg]

    good = llama()
    put("truncated.gguf", good[:len(good) // 2], "EBADMSG", "")
    put("no-tokenizer.gguf", gguf_bytes([("general.architecture", "str", "llama")]), "EBADMSG",
        "no tokenizer.ggml.model")
    put("unknown-model.gguf", gguf_bytes([("tokenizer.ggml.model", "str", "bert")]), "EOPNOTSUPP", "bert")
    bl = json.loads(hf["hf-bytelevel"])
    btoks = [None] * 1001
    for t, i in bl["model"]["vocab"].items():
        btoks[i] = t
    btoks[1000] = "kiln-node"
    put("unknown-pre.gguf", gguf_bytes([("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "tekken"),
                                        ("tokenizer.ggml.tokens", "arr", ("str", btoks)),
                                        ("tokenizer.ggml.merges", "arr", ("str", ["a b"]))]), "EOPNOTSUPP", "tekken")
    dup = list(toks)
    dup[500] = dup[400]
    put("dup-token.gguf", llama(tk=dup), "EBADMSG", "duplicate")
    put("scores-short.gguf", llama(sc=scores[:-1]), "EBADMSG", "one entry per token")
    put("bad-type.gguf", llama(ty=types[:-1] + [9]), "EBADMSG", "token_type 9")
    put("bos-range.gguf", llama(extra=[("tokenizer.ggml.bos_token_id", "u32", 99999)]), "EBADMSG", "bos")
    # a non-UTF-8 token: patch the bytes of token 500 in place
    data = bytearray(good)
    needle = struct.pack("<Q", len(toks[500].encode())) + toks[500].encode()
    at = data.index(needle) + 8
    data[at] = 0xFF
    put("bad-utf8.gguf", bytes(data), "EBADMSG", "UTF-8")
    # a string length of 2^62
    data = bytearray(good)
    at = data.index(needle)
    data[at:at + 8] = struct.pack("<Q", 1 << 62)
    put("huge-string.gguf", bytes(data), "E2BIG", "")

    def js(mut):
        j = json.loads(hf["hf-bytelevel"])
        mut(j)
        return json.dumps(j, ensure_ascii=False)

    put("unknown-merge.json", js(lambda j: j["model"]["merges"].append("zzqq xxyy")), "EBADMSG", "zzqq xxyy")
    vocab = json.loads(hf["hf-bytelevel"])["model"]["vocab"]
    a, b = "Q", "Q"
    assert a + b not in vocab
    put("merge-result.json", js(lambda j: j["model"]["merges"].append([a, b])), "EBADMSG", "not in the vocabulary")
    put("wordpiece.json", js(lambda j: j["model"].update(type="WordPiece")), "EOPNOTSUPP", "WordPiece")
    put("not-json.json", "{ \"model\": [1, 2", "EBADMSG", "not valid JSON")

    def hole(j):
        v = j["model"]["vocab"]
        k = next(t for t, i in v.items() if i == 500)
        del v[k]
    put("hole.json", js(hole), "EBADMSG", "missing")
    put("unknown-regex.json", js(lambda j: j.update(pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": False})),
        "EOPNOTSUPP", "Split pattern")
    put("big-id.json", js(lambda j: j["model"]["vocab"].update({"zzz": 1 << 40})), "EBADMSG", "id")
    l2 = sp_llama2c(model)
    put("long-token.bin", struct.pack("<i", 1 << 30) + l2[4:], "E2BIG", "max_token_length")
    put("truncated.bin", l2[:len(l2) - 3], "EBADMSG", "ends first")
    put("negative-len.bin", l2[:4] + struct.pack("<fi", 0.0, -5), "EBADMSG", "length -5")
    tb = bytearray(l2)
    # token 3 is "<0x00>": make token 400's first byte invalid UTF-8
    off = 4
    for i in range(400):
        ln = struct.unpack_from("<i", tb, off + 4)[0]
        off += 8 + ln
    tb[off + 8] = 0xC0
    put("bad-utf8.bin", bytes(tb), "EBADMSG", "UTF-8")
    with open(os.path.join(bad, "expect.json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data")
    os.makedirs(outdir, exist_ok=True)
    lines = corpus()
    hf = train_hf(lines)
    for name, text in hf.items():
        with open(os.path.join(outdir, name + ".json"), "w", encoding="utf-8") as f:
            f.write(text)
    model = train_sp(lines)
    with open(os.path.join(outdir, "sp.model"), "wb") as f:
        f.write(model)
    llama2_tmpl = ("{% if messages[0]['role'] == 'system' %}...<<SYS>>\\n' + system_message + "
                   "'\\n<</SYS>>\\n\\n'...{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}")
    chatml_tmpl = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                   "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")
    with open(os.path.join(outdir, "sp-llama.gguf"), "wb") as f:
        f.write(sp_gguf(model, llama2_tmpl))
    with open(os.path.join(outdir, "sp-tokenizer.bin"), "wb") as f:
        f.write(sp_llama2c(model))
    with open(os.path.join(outdir, "bpe-gpt2.gguf"), "wb") as f:
        f.write(hf_gguf(hf["hf-bytelevel"], "gpt2", chatml_tmpl))
    with open(os.path.join(outdir, "bpe-llama3.gguf"), "wb") as f:
        f.write(hf_gguf(hf["hf-llama3"], "llama-bpe", "{{ '<|start_header_id|>' }}"))
    with open(os.path.join(outdir, "bpe-qwen2.gguf"), "wb") as f:
        f.write(hf_gguf(hf["hf-qwen2"], "qwen2", chatml_tmpl))
    bad_files(outdir, hf, model)
    # 3 specials + 256 byte tokens + 253 merges: the ids are not the model's
    # own tok512's, but every text round-trips, which is what the server
    # tests need (tests/inferd/test-inferd.sh).
    with open(os.path.join(outdir, "tok512.bin"), "wb") as f:
        f.write(sp_llama2c(train_sp(lines, 512)))
    rng = random.Random(1234)
    texts = TRICKY + [random_text(rng) for _ in range(60)]
    doc_lines = [l for l in lines[:2000]]
    texts += [rng.choice(doc_lines) for _ in range(20)]
    for ref_name in sorted(set(FILES.values())):
        ref = Reference(ref_name, outdir)
        with open(os.path.join(outdir, "golden-%s.json" % ref_name), "w", encoding="utf-8") as f:
            json.dump(golden(ref, texts), f, ensure_ascii=False, indent=0)
    with open(os.path.join(outdir, "files.json"), "w") as f:
        json.dump(FILES, f, indent=1)


if __name__ == "__main__":
    main()
