#!/bin/bash
# test-tokenizer-live.sh — libktok against the pinned reference packages
# (HF tokenizers, sentencepiece; mk/deps.sh installs them) on fresh random
# strings every run (the seed is printed; KILN_TOK_SEED=N replays one).
# SKIPs with the reason when the packages or /usr/bin/python3 are missing.
set -u
B=${KILN_BUILD:-build}
here=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
if ! $PY -c 'import tokenizers, sentencepiece' 2>/dev/null; then
	echo "1..1"
	echo "ok 1 # SKIP $PY has no tokenizers/sentencepiece (make deps installs the pinned versions)"
	exit 0
fi
if [ ! -x "$B/tests/tok-tool" ]; then
	echo "1..1"
	echo "not ok 1 - $B/tests/tok-tool not built"
	exit 1
fi
exec $PY "$here/live-check.py" "$B/tests/tok-tool" "${KILN_TOK_LIVE_N:-300}" ${KILN_TOK_SEED:-}
