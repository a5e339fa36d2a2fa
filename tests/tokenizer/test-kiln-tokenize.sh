#!/bin/bash
# test-kiln-tokenize.sh — `kiln tokenize` end to end, printing TAP: describe,
# encode and decode round trips on the fixtures (text and --json checked
# with jq, skipped without it), special-token flags, refused files exit 1
# with the file and the reason, usage errors exit 2, and --help lists every
# option the code accepts.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
D=tests/tokenizer/data
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
fail() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
export KILN_LOG_PREFIX=0
have_jq=1; command -v jq >/dev/null || have_jq=0
echo "1..8"

out=$("$KILN" tokenize $D/sp-llama.gguf 2>&1)
if [ $? -eq 0 ] && grep -q '^model: *sentencepiece-bpe' <<<"$out" && grep -q '^vocab size: *1000' <<<"$out" &&
	grep -q '^chat template: *llama2' <<<"$out"; then ok "describe a GGUF llama tokenizer"; else fail "describe" "$out"; fi

text='Héllo kiln 😀 — it'"'"'s 123'
okc=0
for f in hf-bytelevel.json hf-spm.json sp-llama.gguf sp-tokenizer.bin bpe-gpt2.gguf bpe-llama3.gguf; do
	ids=$("$KILN" tokenize $D/$f --text "$text" --no-special | awk '$1 ~ /^[0-9]+$/ && $2 != "tokens" {printf "%s%s", s, $1; s=","}')
	back=$("$KILN" tokenize $D/$f --ids "$ids")
	[ "$back" = "$text" ] && okc=$((okc + 1)) || echo "# $f: ids $ids decode to '$back'"
done
[ $okc = 6 ] && ok "encode/decode round trip through the CLI on 6 files" || fail "round trip ($okc of 6)"

if [ $have_jq = 1 ]; then
	j=$("$KILN" tokenize $D/sp-llama.gguf --text "Hello" --json)
	if jq -e '.ids[0] == 1 and .count == (.ids | length) and (.tokens | length) == .count' <<<"$j" >/dev/null; then
		ok "--json encode: BOS first, counts agree"
	else fail "--json encode" "$j"; fi
	j=$("$KILN" tokenize $D/hf-bytelevel.json --json)
	if jq -e '.vocab_size == 1001 and .pre == "gpt2" and .model == "bpe"' <<<"$j" >/dev/null; then
		ok "--json describe"; else fail "--json describe" "$j"; fi
else
	n=$((n + 1)); echo "ok $n # SKIP jq not installed"
	n=$((n + 1)); echo "ok $n # SKIP jq not installed"
fi

a=$("$KILN" tokenize $D/bpe-gpt2.gguf --text "x<|im_end|>" --no-special | grep -c '"<|im_end|>"')
b=$("$KILN" tokenize $D/bpe-gpt2.gguf --text "x<|im_end|>" --no-special --parse-special | grep -c '"<|im_end|>"')
[ "$a" = 0 ] && [ "$b" = 1 ] && ok "special tokens only with --parse-special" || fail "--parse-special ($a, $b)"

out=$("$KILN" tokenize $D/bad/merge-result.json 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "tests/tokenizer/data/bad/merge-result.json: merge .* not in the vocabulary" <<<"$out"; then
	ok "a corrupt tokenizer exits 1 naming file and fault"; else fail "corrupt file (rc $rc)" "$out"; fi

"$KILN" tokenize >/dev/null 2>&1; r1=$?
"$KILN" tokenize $D/sp-llama.gguf --text a --ids 1 >/dev/null 2>&1; r2=$?
"$KILN" tokenize $D/sp-llama.gguf --ids 1,x >/dev/null 2>&1; r3=$?
[ $r1 = 2 ] && [ $r2 = 2 ] && [ $r3 = 2 ] && ok "usage errors exit 2" || fail "usage errors ($r1 $r2 $r3)"

# --help names every long option of the code (its option table, as
# --dump-options prints it), and kiln --help names tokenize.
help=$("$KILN" tokenize --help)
opts=$("$KILN" tokenize --dump-options | awk -F'\t' '$1 == "option" { print substr($2, 3) }')
missing=""
[ -n "$opts" ] || missing=" (no options from --dump-options)"
for o in $opts; do
	grep -q -- "--$o" <<<"$help" || missing="$missing $o"
done
if [ -z "$missing" ] && "$KILN" --help | grep -q "kiln tokenize FILE"; then ok "--help lists every option"
else fail "--help misses:$missing"; fi
