#!/bin/bash
# fuzz-modelfile.sh — runs the libkmf model-file reader fuzzer (libFuzzer + ASan +
# UBSan) for KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/fuzz/fuzz-modelfile-corpus.  TAP; skips when the target was not built
# (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() { cp "$dir"/fuzz-modelfile-corpus/* "$1"/ 2>/dev/null; }
echo "1..1"
fuzz_run 1 fuzz-modelfile fuzz-modelfile -dict="$dir/fuzz-modelfile.dict" -max_len=65536 -timeout=5
