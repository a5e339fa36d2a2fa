#!/bin/bash
# fuzz-store.sh — runs the store's two libFuzzer targets (ASan + UBSan), each
# for KILN_FUZZ_SECONDS (default 60) from its seed corpus:
#   fuzz-store         the protocol parser alone (pure function, fast);
#   fuzz-store-server  the whole server over loopback sockets.
# TAP; a target that was not built (no clang) is skipped.
set -u
# shellcheck source=tests/lib/fuzz.sh
. "$(dirname "$0")/../lib/fuzz.sh"
echo "1..2"
st=0
n=0
for t in fuzz-store fuzz-store-server; do
	n=$((n + 1))
	fuzz_seed() { cp "$dir/$t-corpus"/* "$1"/ 2>/dev/null; }
	fuzz_run $n $t fuzz-store -max_len=8192 -timeout=10 || st=1
done
exit $st
