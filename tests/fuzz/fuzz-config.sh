#!/bin/bash
# fuzz-config.sh — runs the libkiln-config parse+validate fuzzer (libFuzzer + ASan +
# UBSan) for KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/fuzz/fuzz-config-corpus.  TAP; skips when the target was not built
# (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() { cp "$dir"/fuzz-config-corpus/* "$1"/ 2>/dev/null; }
echo "1..1"
LSAN_OPTIONS=suppressions=$dir/fuzz-config.supp:print_suppressions=0 \
	fuzz_run 1 fuzz-config fuzz-config -dict="$dir/fuzz-config.dict" -max_len=16384 -timeout=5
