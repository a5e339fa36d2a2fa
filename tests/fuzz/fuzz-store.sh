#!/bin/bash
# fuzz-store.sh — runs the store's two libFuzzer targets (ASan + UBSan), each
# for KILN_FUZZ_SECONDS (default 60) from its seed corpus:
#   fuzz-store         the protocol parser alone (pure function, fast);
#   fuzz-store-server  the whole server over loopback sockets.
# TAP; a target that was not built (no clang) is skipped.
set -u
B=${KILN_BUILD:-build}
secs=${KILN_FUZZ_SECONDS:-60}
dir=$(cd "$(dirname "$0")" && pwd)
echo "1..2"
n=0
for t in fuzz-store fuzz-store-server; do
	n=$((n + 1))
	F=$B/tests/$t
	if [ ! -x "$F" ]; then
		echo "ok $n # SKIP $F not built (needs clang with libFuzzer: make fuzz-store)"
		continue
	fi
	work=$(mktemp -d)
	cp "$dir/$t-corpus"/* "$work"/ 2>/dev/null
	"$F" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=1024 \
		-artifact_prefix="$work/" "$work" >"$work/log" 2>&1
	rc=$?
	runs=$(grep -oE 'Done [0-9]+ runs' "$work/log" | grep -oE '[0-9]+')
	if [ $rc -eq 0 ]; then
		echo "ok $n - $t: ${runs:-?} inputs in ${secs}s, no crash, leak or assertion"
	else
		echo "not ok $n - $t crashed (rc $rc)"
		tail -n 40 "$work/log" | sed 's/^/# /'
		for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-*; do
			[ -e "$a" ] && echo "# artifact $(basename "$a"): $(od -An -tx1 "$a" | head -c 400 | tr -s ' \n' ' ')"
		done
	fi
	rm -rf "$work"
done
