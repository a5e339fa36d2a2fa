#!/bin/bash
# fuzz-openai.sh — runs kiln-inferd's request-layer fuzzer
# (services/inferd/openai.c; libFuzzer + ASan + UBSan) for
# KILN_FUZZ_SECONDS (default 60) from the seed corpus in
# tests/inferd/fuzz-openai-corpus, from the repository root (it reads
# tests/tokenizer/data/tok512.bin).  TAP; skips when the target was not
# built (no clang).
set -u
B=${KILN_BUILD:-build}
F=$B/tests/fuzz-openai
secs=${KILN_FUZZ_SECONDS:-60}
echo "1..1"
if [ ! -x "$F" ]; then
	echo "ok 1 # SKIP $F not built (needs clang with libFuzzer: make fuzz-openai)"
	exit 0
fi
dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$dir"/fuzz-openai-corpus/* "$work"/ 2>/dev/null
"$F" -dict="$dir/fuzz-openai.dict" -max_total_time="$secs" -max_len=8192 -timeout=5 -rss_limit_mb=1024 \
	-artifact_prefix="$work/" "$work" >"$work/log" 2>&1
rc=$?
runs=$(grep -oE 'Done [0-9]+ runs' "$work/log" | grep -oE '[0-9]+')
if [ $rc -eq 0 ]; then
	echo "ok 1 - fuzz-openai: ${runs:-?} inputs in ${secs}s, no crash, leak or assertion"
else
	echo "not ok 1 - fuzz-openai crashed (rc $rc)"
	tail -n 40 "$work/log" | sed 's/^/# /'
	for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-*; do
		[ -e "$a" ] && echo "# artifact $(basename "$a"): $(od -An -tx1 "$a" | head -c 400 | tr -s ' \n' ' ')"
	done
	exit 1
fi
