#!/bin/bash
# fuzz-serve.sh — runs kiln serve's request-parsing fuzzer (config/cli/serve.h:
# paths, Range headers, URLs) (libFuzzer + ASan + UBSan) for
# KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/fuzz/fuzz-serve-corpus.  TAP; skips when the target was not built
# (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() { cp "$dir"/fuzz-serve-corpus/* "$1"/ 2>/dev/null; }
echo "1..1"
fuzz_run 1 fuzz-serve fuzz-serve -dict="$dir/fuzz-serve.dict" -max_len=4096 -timeout=5
