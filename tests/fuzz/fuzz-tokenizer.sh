#!/bin/bash
# fuzz-tokenizer.sh — runs the libktok loader and encoder fuzzer (libFuzzer + ASan +
# UBSan) for KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/tokenizer/data (the fixtures).  TAP; skips when the target was not built
# (no clang).
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
fuzz_seed() {
	cp "$dir"/../tokenizer/data/*.json "$dir"/../tokenizer/data/*.gguf "$dir"/../tokenizer/data/*.bin "$dir"/../tokenizer/data/bad/* "$1"/ 2>/dev/null
	rm -f "$1"/golden-*.json "$1"/files.json
}
echo "1..1"
fuzz_run 1 fuzz-tokenizer fuzz-tokenizer -max_len=65536 -timeout=5
