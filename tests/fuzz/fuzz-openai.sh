#!/bin/bash
# fuzz-openai.sh — runs kiln-inferd's request-layer fuzzer
# (services/inferd/openai.c; libFuzzer + ASan + UBSan) for
# KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/fuzz/fuzz-openai-corpus, from the repository root (it reads
# tests/tokenizer/data/tok512.bin).  TAP; skips when the target was not
# built (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() { cp "$dir"/fuzz-openai-corpus/* "$1"/ 2>/dev/null; }
echo "1..1"
fuzz_run 1 fuzz-openai fuzz-openai -dict="$dir/fuzz-openai.dict" -max_len=8192 -timeout=5
