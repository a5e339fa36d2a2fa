#!/bin/bash
# test-kiln-model.sh — `kiln model inspect` end to end, printing TAP: every
# generated file is listed with its format, tensors and metadata (text and
# --json, checked with jq; skipped without it), a corrupt file exits 1 with FILE: byte N: and
# the reason, and usage errors exit 2.  The derived model config (km_file)
# is shown for a loadable model and the reason for a file that is not one.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
D=tests/modelfile/data
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
fail() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
check() { # NAME COMMAND...: ok when the command succeeds (JSON checks need jq)
	local name=$1; shift
	if ! command -v jq >/dev/null; then
		n=$((n + 1)); echo "ok $n # SKIP $name: jq not installed (apt-get install jq)"; return
	fi
	if out=$("$@" 2>&1); then ok "$name"; else fail "$name" "$out"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_LOG_PREFIX=0
echo "1..11"

out=$("$KILN" model inspect $D/types-v3.gguf 2>&1)
if [ $? -eq 0 ] && grep -q '^tests/modelfile/data/types-v3.gguf: gguf v3, 8 tensors' <<<"$out" &&
	grep -qE '^blk\.0\.ffn_down\.weight +Q6_K +\[2, 256\]' <<<"$out" &&
	grep -q 'tokenizer.ggml.tokens = \[7 x string: "<unk>"' <<<"$out"; then
	ok "inspect GGUF: format, Q6_K row-major shape, token array"
else
	fail "inspect GGUF" "$out"
fi
check "inspect --json GGUF: metadata types and shapes" \
	bash -c "'$KILN' model inspect $D/types-v3.gguf --json | jq -e '.format == \"gguf\" and .version == 3 and .metadata[\"test.i8\"] == -100 and .metadata[\"tokenizer.ggml.tokens\"][3] == \"\u2581the\" and (.tensors | length) == 8 and .tensors[3].shape == [3, 64] and .tensors[3].dtype == \"Q8_0\"'"
check "inspect --json safetensors: __metadata__ and an empty tensor" \
	bash -c "'$KILN' model inspect --json $D/basic.safetensors | jq -e '.metadata.\"kiln.step\" == \"42\" and ([.tensors[] | select(.name == \"empty\")][0].shape == [0, 3])'"
check "inspect --json llama2.c: config as metadata, HF names" \
	bash -c "'$KILN' model inspect --json $D/tiny.llama2c.bin | jq -e '.format == \"llama2.c\" and .metadata.vocab_size == 10 and .metadata.shared_classifier == false and ([.tensors[].name] | index(\"model.layers.1.mlp.down_proj.weight\")) != null'"

# corrupt: data truncated by one byte
head -c $(($(stat -c %s $D/basic.safetensors) - 1)) $D/basic.safetensors >"$tmp/cut.safetensors"
out=$("$KILN" model inspect "$tmp/cut.safetensors" 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q "cut.safetensors: byte [0-9]*: tensor '[a-z]*': data_offsets .* truncated" <<<"$out"; then
	ok "truncated safetensors: exit 1, file, byte, tensor and reason"
else
	fail "truncated safetensors (rc $rc)" "$out"
fi
printf 'GGUF\x01\x00\x00\x00' >"$tmp/v1.gguf"
out=$("$KILN" model inspect "$tmp/v1.gguf" 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q "v1.gguf: byte 4: GGUF version 1 is not supported" <<<"$out"; then
	ok "GGUF v1: exit 1 with the version"
else
	fail "GGUF v1 (rc $rc)" "$out"
fi
out=$("$KILN" model inspect "$tmp/missing" 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q "missing: cannot open: No such file" <<<"$out"; then
	ok "missing file: exit 1"
else
	fail "missing file (rc $rc)" "$out"
fi
"$KILN" model inspect >/dev/null 2>&1
rc=$?
if [ $rc -eq 2 ]; then ok "no FILE: exit 2"; else fail "no FILE: exit $rc"; fi
"$KILN" model frobnicate x >/dev/null 2>&1
rc=$?
if [ $rc -eq 2 ]; then ok "unknown verb: exit 2"; else fail "unknown verb: exit $rc"; fi

# the km_config km_file_open derives (docs/model.md "Model files")
out=$("$KILN" model inspect $D/types-v3.gguf 2>&1)
if grep -q "^model: not loadable: $D/types-v3.gguf: GGUF metadata 'llama.embedding_length' is missing" <<<"$out"; then
	ok "inspect: a GGUF that is no llama model says why"
else
	fail "inspect: not loadable" "$out"
fi
. tests/lib/fixture.sh
FIX=$(kiln_fixture_path)
out=$("$KILN" model inspect "$FIX" 2>&1)
if grep -q "^model: llama2.c: dim 64, hidden 172, 5 layers, 8 heads (4 kv, head_dim 8), vocab 512, context 512, norm_eps 1e-05, rope_theta 10000, rope interleaved, shared classifier" <<<"$out"; then
	ok "inspect the model fixture: the derived model config"
elif [ ! -r "$FIX" ]; then
	fail "model fixture $FIX is not readable: $KILN_FIXTURE_HINT" ""
else
	fail "inspect the model fixture" "$out"
fi
