#!/bin/bash
# bench-tok.sh — libktok encode/decode throughput (MB/s, one thread) on
# ~4 MB of text (kiln's docs repeated, plus random multilingual lines),
# cut into 64 KiB chunks at newlines, for a GPT-2-style byte-level BPE and a
# SentencePiece-like BPE (the test fixtures).  Baseline, in the same run on
# the same chunks and tokenizer: Hugging Face `tokenizers` (PyPI, pinned in
# mk/deps.sh; RAYON_NUM_THREADS=1) when /usr/bin/python3 has it, else
# ktok's naive O(n^2) reference BPE (tok-tool bench ... naive, byte-level only).
set -euo pipefail
B=${KILN_BUILD:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
TOOL=$B/tests/tok-tool
PY=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
MB=${KILN_TOK_BENCH_MB:-4}
$PY - "$root" "$work/text" "$MB" <<'PYEOF'
import glob, random, sys
root, out, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = "".join(open(f, encoding="utf-8").read() for f in sorted(glob.glob(root + "/docs/*.md")))
# No special-token literals (HF always parses them, so the two sides would
# tokenize differently) and no literal U+2581 (SentencePiece reads it as a
# space, so the round-trip check would fail by design).
docs = docs.replace("<", "(").replace("\u2581", "_")
rng = random.Random(5)
alpha = "abcdefghij klmnop éüß 日本語中文 Привет 😀🎉 ,.;!? 0123456789\n"
parts, size = [], 0
while size < mb * 1000 * 1000:
    parts.append(docs)
    parts.append("".join(rng.choice(alpha) for _ in range(20000)) + "\n")
    size += len(parts[-2].encode()) + len(parts[-1].encode())
open(out, "w", encoding="utf-8").write("".join(parts))
PYEOF
have_hf=0
$PY -c 'import tokenizers' 2>/dev/null && have_hf=1
printf "%-18s %-22s %12s %12s %10s\n" tokenizer implementation "encode MB/s" "decode MB/s" tokens
for tok in hf-bytelevel hf-spm; do
	file=$here/data/$tok.json
	read -r enc dec n < <("$TOOL" bench "$file" "$work/text")
	printf "%-18s %-22s %12.2f %12.2f %10d\n" "$tok" "ktok" "$enc" "$dec" "$n"
	if [ $have_hf = 1 ]; then
		read -r benc bdec bn < <(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false $PY - "$file" "$work/text" <<'PYEOF'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
CHUNK = 64 * 1024
chunks, off = [], 0
while off < len(data):  # the same cut as tok-tool: at a newline
    end = min(len(data), off + CHUNK)
    while end < len(data) and end > off + 1 and data[end - 1] != 0x0A:
        end -= 1
    chunks.append(data[off:end].decode("utf-8"))
    off = end
te = td = 0.0
n = 0
for c in chunks:
    t0 = time.perf_counter()
    ids = tok.encode(c, add_special_tokens=False).ids
    t1 = time.perf_counter()
    tok.decode(ids, skip_special_tokens=False)
    td += time.perf_counter() - t1
    te += t1 - t0
    n += len(ids)
print("%.2f %.2f %d" % (len(data) / te / 1e6, len(data) / td / 1e6, n))
PYEOF
)
		printf "%-18s %-22s %12.2f %12.2f %10d\n" "$tok" "baseline: HF tokenizers" "$benc" "$bdec" "$bn"
		[ "$bn" = "$n" ] || echo "WARNING: token counts differ ($n vs $bn)"
		printf "%-18s %-22s %11.2fx %11.2fx\n" "" "ktok / baseline" \
			"$(awk "BEGIN{print $enc / $benc}")" "$(awk "BEGIN{print $dec / $bdec}")"
	elif [ $tok = hf-bytelevel ]; then
		read -r benc bdec bn < <("$TOOL" bench "$file" "$work/text" naive)
		printf "%-18s %-22s %12.2f %12s %10d\n" "$tok" "baseline: naive O(n^2)" "$benc" "-" "$bn"
		printf "%-18s %-22s %11.2fx\n" "" "ktok / baseline" "$(awk "BEGIN{print $enc / $benc}")"
	fi
done
