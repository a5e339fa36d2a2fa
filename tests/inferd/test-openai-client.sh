#!/bin/bash
# test-openai-client.sh — kiln-inferd against the official openai Python
# client (tests/inferd/test-openai-client.py: completions, chat, streaming,
# models, the client's own error classes, a stream cut by SIGTERM).  Skips
# when the pinned openai package (make deps) is missing.  Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
if ! /usr/bin/python3 -c 'import openai' 2>/dev/null; then
	echo "1..1"; echo "ok 1 # SKIP the openai Python package is not installed (make deps)"; exit 0
fi
exec /usr/bin/python3 "$(dirname "$0")/test-openai-client.py" "$BIN" "$MODEL" tests/tokenizer/data/tok512.bin
