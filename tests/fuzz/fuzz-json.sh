#!/bin/bash
# fuzz-json.sh — runs the JSON glue fuzzer (kiln/json.h) (libFuzzer + ASan +
# UBSan) for KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/fuzz/fuzz-json-corpus.  TAP; skips when the target was not built
# (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() { cp "$dir"/fuzz-json-corpus/* "$1"/ 2>/dev/null; }
echo "1..1"
fuzz_run 1 fuzz-json fuzz-json -dict="$dir/fuzz-json.dict" -max_len=8192 -timeout=5
