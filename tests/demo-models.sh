#!/bin/bash
# demo-models.sh — the model half of `make demo` (tests/demo.sh runs it):
# how the model fixture was made — kiln-train --init trained it from
# scratch at build time on stories the project writes itself
# (tests/fixtures) — then kiln-train fine-tunes it data-parallel (2 ranks
# under kiln-run, kk's cpu collectives), and kiln-inferd serves the
# checkpoint it wrote on 127.0.0.1 and streams a story over SSE.  Then the
# admin path: the demo cluster file turns inference on for node03 (its own
# partition, an inference section with two models and a keys file),
# kiln check accepts it, and kiln-inferd starts from it as the unit would
# (-c FILE --node node03) serving both; a chat request with a key succeeds,
# one without gets 401.  Prints what it does; exits 1 when a step fails or
# the fixture is missing (`make demo` builds it first).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
DIR=${1:-/tmp/kiln-demo}/models
. "$top/tests/lib/fixture.sh"
MODEL=$(KILN_BUILD=$B kiln_fixture_path)
if [ ! -r "$MODEL" ]; then
	echo "  model fixture $MODEL is not readable: $KILN_FIXTURE_HINT"
	exit 1
fi
TOK=$top/tests/tokenizer/data/tok512.bin
mkdir -p "$DIR"
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; true' EXIT

echo "  the model fixture $(basename "$MODEL"): trained from scratch when the tree was built (tests/fixtures/build.mk)"
python3 "$top/tests/fixtures/make-stories.py" "$DIR/stories.txt"
printf '$ python3 tests/fixtures/make-stories.py stories.txt   # %s KB of simple stories from a small grammar\n' \
	"$(($(wc -c <"$DIR/stories.txt") / 1024))"
sed -n 1p "$DIR/stories.txt" | cut -c1-150 | sed 's/^/  | /;s/$/ .../'
printf '$ text-shard tok512.bin stories.txt stories.tok   # kiln'"'"'s tokenizer (libktok), BOS before each story\n'
"$B/tests/text-shard" "$TOK" "$DIR/stories.txt" "$DIR/stories.tok" | sed 's/^/  | /'
log=$(dirname "$MODEL")/train.log
if [ -r "$log" ]; then
	printf '$ kiln-train --init dim=64,hidden=172,layers=5,heads=8,kv_heads=4,vocab=512,seq=512 -d stories.tok -s tiny260K.st ...\n'
	grep -E 'training|step (1|[0-9]*00)/' "$log" | sed 's/^kiln-train: /  | /'
fi

printf '\n$ kiln-run --standalone --nproc-per-node 2 -- kiln-train -m %s -d stories.tok --steps 30 -b 4 --seq 64 -s tuned.st\n' "$(basename "$MODEL")"
timeout 300 "$B/bin/kiln-run" --standalone --nproc-per-node 2 -- "$B/bin/kiln-train" -m "$MODEL" \
	-d "$DIR/stories.tok" --steps 30 -b 4 --seq 64 --lr 5e-4 --warmup 3 -s "$DIR/tuned.st" >"$DIR/train.log" 2>&1
grep -E 'step (1|10|20|30)/30 ' "$DIR/train.log" | sed 's/^/  | /'
grep -E 'checkpoint .* written' "$DIR/train.log" | tail -1 | sed 's/^/  | /'

printf '\n$ kiln-inferd -m tuned.st --tokenizer tok512.bin -p 0 &   # the checkpoint just written; OpenAI-compatible, on 127.0.0.1\n'
"$B/bin/kiln-inferd" -m "$DIR/tuned.st" --name tuned --tokenizer "$TOK" -p 0 >"$DIR/inferd.log" 2>&1 &
PID=$!
port=
for _ in $(seq 100); do
	port=$(grep -o 'http://127.0.0.1:[0-9]*' "$DIR/inferd.log" | head -1 | sed 's/.*://') || true
	[ -n "$port" ] && break
	sleep 0.1
done
[ -n "$port" ] || { echo "kiln-inferd did not start:"; cat "$DIR/inferd.log"; exit 1; }
req='{"model":"tuned","prompt":"Once upon a time","max_tokens":64,"temperature":0,"stream":true}'
printf "\$ curl -N http://127.0.0.1:%s/v1/completions -d '%s'\n" "$port" "$req"
curl -sN --max-time 30 "http://127.0.0.1:$port/v1/completions" -d "$req" >"$DIR/sse.txt"
grep -m 2 '^data: ' "$DIR/sse.txt" | sed 's/^/  | /'
echo "  | ... ($(grep -c '^data: {' "$DIR/sse.txt") events, then $(grep -c '^data: \[DONE\]' "$DIR/sse.txt") [DONE])"
text=$(grep '^data: {' "$DIR/sse.txt" | sed 's/^data: //' | jq -j '.choices[0].text // empty')
[ -n "$text" ] || { echo "the completion streamed no text"; exit 1; }
echo "  the story: Once upon a time$text" | fold -s -w 100 | sed '2,$s/^/    /'
printf '$ curl http://127.0.0.1:%s/metrics | grep generation_tokens\n' "$port"
curl -s --max-time 10 "http://127.0.0.1:$port/metrics" >"$DIR/metrics.txt"
grep -E '^vllm:generation_tokens' "$DIR/metrics.txt" | sed 's/^/  | /' || true
kill -TERM "$PID"
wait "$PID"
PID=
echo "  kiln-inferd stopped cleanly (SIGTERM)"

# ---- the admin path: inference from the cluster file, two models, a key
CFG=$DIR/cluster.cfg
KEYS=$DIR/inferd-keys
printf '\n$ # the demo cluster file, inference on for node03: its own partition (its GPUs\n'
printf '$ # are kiln-inferd'"'"'s, never Slurm jobs'"'"'), two models, API keys in a file only root reads\n'
sed -e '/^    partitions = \[ "gpu" \];$/d' \
	-e 's|{ name = "gpu"; nodes = "node\[01-03\]"; default = true; }|{ name = "gpu"; nodes = "node[01-02]"; default = true; },\n    { name = "infer"; nodes = "node03"; }|' \
	"$top/config/examples/demo.cfg" >"$CFG"
cat >>"$CFG" <<EOF

inference = {
  enabled = true;
  nodes = "infer";
  api_keys_file = "$KEYS";
  tokenizer = "$TOK";
  kv_blocks = 128;
  models = (
    { name = "stories"; path = "$MODEL"; },
    { name = "tuned"; path = "$DIR/tuned.st"; context_length = 256; }
  );
};
EOF
(umask 077; printf '# kiln-inferd API keys, one a line\nsk-demo-%s\n' "$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')" >"$KEYS")
KEY=$(grep -v '^#' "$KEYS")
diff -u "$top/config/examples/demo.cfg" "$CFG" | tail -n +3 | grep '^[-+]' | sed 's/^/  | /' || true
printf '$ kiln check -c cluster.cfg\n'
"$B/bin/kiln" check -c "$CFG" | sed 's/^/  | /'
printf '$ kiln-inferd -c cluster.cfg --node node03 -p 0 &   # what kiln-inferd.service runs on node03\n'
"$B/bin/kiln-inferd" -c "$CFG" --node node03 -p 0 >"$DIR/inferd-cfg.log" 2>&1 &
PID=$!
port=
for _ in $(seq 100); do
	port=$(grep -o 'http://127.0.0.1:[0-9]*' "$DIR/inferd-cfg.log" | head -1 | sed 's/.*://') || true
	[ -n "$port" ] && break
	sleep 0.1
done
[ -n "$port" ] || { echo "kiln-inferd did not start:"; cat "$DIR/inferd-cfg.log"; exit 1; }
grep -E 'API keys|Serving' "$DIR/inferd-cfg.log" | sed 's/^/  | /'
U=http://127.0.0.1:$port
printf '$ curl %s/v1/models -H "Authorization: Bearer $KEY"\n' "$U"
curl -s --max-time 10 "$U/v1/models" -H "Authorization: Bearer $KEY" | jq -c '[.data[].id]' | sed 's/^/  | /'
chat='{"model":"tuned","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":16,"temperature":0}'
printf "\$ curl %s/v1/chat/completions -H \"Authorization: Bearer \$KEY\" -d '%s'\n" "$U" "$chat"
code=$(curl -s --max-time 30 -o "$DIR/chat.json" -w '%{http_code}' "$U/v1/chat/completions" -H "Authorization: Bearer $KEY" -d "$chat")
echo "  | HTTP $code: $(jq -c '{model, finish: .choices[0].finish_reason, usage}' "$DIR/chat.json")"
[ "$code" = 200 ] || { echo "the chat request with a key failed"; exit 1; }
printf "\$ curl %s/v1/chat/completions -d '...'   # the same, no key\n" "$U"
code=$(curl -s --max-time 10 -o "$DIR/nokey.json" -w '%{http_code}' "$U/v1/chat/completions" -d "$chat")
echo "  | HTTP $code: $(jq -c .error "$DIR/nokey.json")"
[ "$code" = 401 ] || { echo "the chat request without a key was not refused"; exit 1; }
printf '$ curl %s/metrics | grep generation_tokens   # open; inference.metrics_auth closes it\n' "$U"
curl -s --max-time 10 "$U/metrics" | grep -E '^vllm:generation_tokens' | sed 's/^/  | /' || true
kill -TERM "$PID"
wait "$PID"
PID=
echo "  kiln-inferd stopped cleanly (SIGTERM)"
