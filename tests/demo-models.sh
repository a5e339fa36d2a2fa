#!/bin/bash
# demo-models.sh — the model half of `make demo` (tests/demo.sh runs it):
# kiln-train fine-tunes the stories260K fixture data-parallel (2 ranks under
# kiln-run, kk's cpu collectives), then kiln-inferd serves the checkpoint
# it wrote on 127.0.0.1 and streams a completion over SSE.  Prints what it does; exits
# 0 when the fixture is missing (nothing to show), 1 when a step fails.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
DIR=${1:-/tmp/kiln-demo}/models
MODEL=${KM_TEST_MODEL:-}
for c in "$top/tests/fixtures/stories260K.bin" "$top/../shared/fixtures/stories260K.bin"; do
	[ -z "$MODEL" ] && [ -r "$c" ] && MODEL=$c
done
if [ -z "$MODEL" ]; then
	echo "  (stories260K.bin not found: set KM_TEST_MODEL to show training and serving)"
	exit 0
fi
mkdir -p "$DIR"
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; true' EXIT

echo "  a token shard of 20000 tokens: $DIR/data.tok"
python3 "$top/tests/train/mk-shard.py" "$DIR/data.tok" 20000
printf '$ kiln-run --standalone --nproc-per-node 2 -- kiln-train -m stories260K.bin -d data.tok --steps 30 -b 4 --seq 32 -s tuned.st\n'
timeout 300 "$B/bin/kiln-run" --standalone --nproc-per-node 2 -- "$B/bin/kiln-train" -m "$MODEL" \
	-d "$DIR/data.tok" --steps 30 -b 4 --seq 32 --lr 3e-3 --warmup 3 -s "$DIR/tuned.st" >"$DIR/train.log" 2>&1
grep -E 'step (1|10|20|30)/30 ' "$DIR/train.log" | sed 's/^/  | /'
grep -E 'checkpoint .* written' "$DIR/train.log" | tail -1 | sed 's/^/  | /'

printf '\n$ kiln-inferd -m tuned.st -p 0 &   # the checkpoint just written; OpenAI-compatible, on 127.0.0.1\n'
"$B/bin/kiln-inferd" -m "$DIR/tuned.st" --name tuned -p 0 >"$DIR/inferd.log" 2>&1 &
PID=$!
port=
for _ in $(seq 100); do
	port=$(grep -o 'http://127.0.0.1:[0-9]*' "$DIR/inferd.log" | head -1 | sed 's/.*://') || true
	[ -n "$port" ] && break
	sleep 0.1
done
[ -n "$port" ] || { echo "kiln-inferd did not start:"; cat "$DIR/inferd.log"; exit 1; }
req='{"model":"tuned","prompt":[1],"max_tokens":12,"temperature":0,"stream":true}'
printf "\$ curl -N http://127.0.0.1:%s/v1/completions -d '%s'\n" "$port" "$req"
curl -sN --max-time 30 "http://127.0.0.1:$port/v1/completions" -d "$req" >"$DIR/sse.txt"
grep '^data: ' "$DIR/sse.txt" | head -2 | sed 's/^/  | /'
echo "  | ... ($(grep -c '^data: {' "$DIR/sse.txt") events, then $(grep -c '^data: \[DONE\]' "$DIR/sse.txt") [DONE])"
echo "  token ids: $(grep -o '"token_ids":\[[0-9,]*\]' "$DIR/sse.txt" | grep -o '[0-9][0-9,]*' | paste -sd, -)"
printf '$ curl http://127.0.0.1:%s/metrics | grep generation_tokens\n' "$port"
curl -s --max-time 10 "http://127.0.0.1:$port/metrics" >"$DIR/metrics.txt"
grep -E '^kiln_inferd_generation_tokens' "$DIR/metrics.txt" | sed 's/^/  | /' || true
kill -TERM "$PID"
wait "$PID"
PID=
echo "  kiln-inferd stopped cleanly (SIGTERM)"
