#!/bin/bash
# fuzz-sign.sh — runs the signature/key parser fuzzer (kiln/sign.h)
# (libFuzzer + ASan + UBSan) for KILN_FUZZ_SECONDS (default 60) from the
# seed corpus in tests/fuzz/fuzz-sign-corpus.  TAP; skips when the target
# was not built (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() { cp "$dir"/fuzz-sign-corpus/* "$1"/ 2>/dev/null; }
echo "1..1"
fuzz_run 1 fuzz-sign fuzz-sign -max_len=4096 -timeout=5
