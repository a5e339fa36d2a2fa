#!/bin/bash
# test-inferd-models.sh — one kiln-inferd serving several models
# (the tiny260K fixture under two names, each its own engine; curl, jq):
#   - repeatable --model FILE[,KEY=VALUE...]: READY=1 and STATUS= name both
#     (a fake $NOTIFY_SOCKET), /v1/models lists both,
#     GET /v1/models/{id}, requests routed by "model" (each model's metrics
#     count only its own tokens), an unknown model 404 model_not_found naming
#     what is served, the log naming both;
#   - refused at start (exit 2): two models with one name, --name with
#     several, a bad KEY, a set over --memory-budget (with the numbers of
#     each model); kv-cache-mb sizes a cache in blocks;
#   - the cluster file's inference.models (the flat keys as defaults,
#     element keys winning), kiln check's warning for a missing model path.
# Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
inferd_suite models curl jq
MODEL=$(readlink -f "$MODEL")
KILN=$B/bin/kiln

# start ARGS...: the server on an ephemeral port; sets PID, URL.
start() { inferd_start "$@"; }
# log_has PATTERN: the server's log has it; else the log as TAP comments.
log_has() { grep -q "$1" "$W/log" || { sed 's/^/# log: /' "$W/log"; false; }; }
stop() { inferd_stop; }
post() { curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/completions" -d "$1"; }
metric() { curl -s "$URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

# ---- two models from the command line
# a fake systemd notify socket: what kiln-inferd sends, until READY=1
LPID=
if command -v python3 >/dev/null; then
	python3 - "$W/notify.sock" "$W/notify" <<'PYEOF' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(60)
with open(sys.argv[2], "w") as f:
    while True:
        m = s.recv(4096).decode(errors="replace")
        f.write(m + "\n")
        f.flush()
        if "READY=1" in m:
            break
PYEOF
	LPID=$!
	for _ in $(seq 100); do [ -S "$W/notify.sock" ] && break; sleep 0.05; done
fi
export NOTIFY_SOCKET=$W/notify.sock
ok "two --model: both load" start -m "$MODEL,name=a" -m "$MODEL,name=b,kv-blocks=64"
unset NOTIFY_SOCKET
if [ -n "$LPID" ]; then
	wait "$LPID"
	ok "  ... READY=1 once both are loaded, STATUS= naming both" bash -c "grep -qx 'READY=1' '$W/notify' && grep -q '^STATUS=Serving 2 models on http://127.0.0.1:[0-9]* (cpu): a (f32, context 512, 1024 KV blocks), b (f32, context 512, 64 KV blocks)\$' '$W/notify'"
else
	skip "python3 not installed: no notify socket"
fi
ok "  ... the log names both, with their KV caches" grep -q "Serving 2 models on http://127.0.0.1:[0-9]* (cpu): a (f32, context 512, 1024 KV blocks), b (f32, context 512, 64 KV blocks)" "$W/log"
ok "/v1/models lists both, in order" bash -c "curl -s '$URL/v1/models' | jq -e '.object == \"list\" and ([.data[].id] == [\"a\", \"b\"]) and (.data | all(.object == \"model\"))' >/dev/null"
ok "GET /v1/models/b: the model" bash -c "curl -s '$URL/v1/models/b' | jq -e '.id == \"b\" and .max_model_len == 512' >/dev/null"
code=$(curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/models/c")
ok "GET /v1/models/c: 404 model_not_found naming both" bash -c "[ $code = 404 ] && jq -e '.error.code == \"model_not_found\" and (.error.message | test(\"this server has .a., .b.\"))' '$W/body' >/dev/null"
code=$(post '{"model":"a","prompt":[1],"max_tokens":7,"temperature":0}')
ok "a completion for a: 200, answered as a" bash -c "[ $code = 200 ] && jq -e '.model == \"a\" and (.choices[0].token_ids | length) == 7' '$W/body' >/dev/null"
cp "$W/body" "$W/a.json"
code=$(post '{"model":"b","prompt":[1],"max_tokens":5,"temperature":0}')
ok "a completion for b: 200, answered as b" bash -c "[ $code = 200 ] && jq -e '.model == \"b\" and (.choices[0].token_ids | length) == 5' '$W/body' >/dev/null"
code=$(post '{"model":"b","prompt":[1],"max_tokens":7,"temperature":0}')
ok "  ... the same weights: b's greedy tokens are a's" bash -c "jq -e --slurpfile a '$W/a.json' '.choices[0].token_ids == \$a[0].choices[0].token_ids' '$W/body' >/dev/null"
ok "routing: a's engine generated 7 tokens" test "$(metric 'vllm:generation_tokens_total{model_name="a"}')" = 7
ok "  ... b's 12" test "$(metric 'vllm:generation_tokens_total{model_name="b"}')" = 12
ok "  ... each engine's KV cache in its own series" test "$(metric 'kiln_inferd_kv_cache_blocks{model_name="b",state="free"}')" = 64
code=$(post '{"model":"c","prompt":[1]}')
ok "an unknown model: 404 model_not_found" bash -c "[ $code = 404 ] && jq -e '.error.code == \"model_not_found\" and .error.param == \"model\" and (.error.message | test(\"this server has .a., .b.\"))' '$W/body' >/dev/null"
code=$(curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/chat/completions" -d '{"model":"zz","messages":[{"role":"user","content":"hi"}]}')
ok "  ... on chat too" test "$code" = 404
code=$(post '{"prompt":[1]}')
ok "no model: 400 naming model" bash -c "[ $code = 400 ] && jq -e '.error.param == \"model\"' '$W/body' >/dev/null"
ok "SIGTERM: exit 0" stop

# ---- refused at start
ok "two models named alike: exit 2" rc_is 2 "$BIN" -m "$MODEL,name=x" -m "$MODEL,name=x"
ok "  ... naming the name and both files" grep -q "Two models are named 'x' ($MODEL and $MODEL)" "$W/err"
ok "two models with the same base name (no name=): exit 2" rc_is 2 "$BIN" -m "$MODEL" -m "$MODEL"
ok "--name with two --model: exit 2" rc_is 2 "$BIN" -m "$MODEL" -m "$MODEL,name=b" --name x
ok "  ... saying to name each" grep -q "name each: --model FILE,name=NAME" "$W/err"
ok "an unknown --model key: exit 2" rc_is 2 "$BIN" -m "$MODEL,colour=red"
ok "  ... listing the keys" grep -q "unknown key 'colour' (keys: name, tokenizer, dtype" "$W/err"
ok "a bad --model value: exit 2" rc_is 2 "$BIN" -m "$MODEL,dtype=f64"
ok "kv-blocks and kv-cache-mb both: exit 2" rc_is 2 "$BIN" -m "$MODEL,kv-blocks=8,kv-cache-mb=1"
ok "two models over --memory-budget 30M: exit 2" rc_is 2 "$BIN" -m "$MODEL,name=a" -m "$MODEL,name=b" --memory-budget 30M
ok "  ... with the total and the budget" grep -q "The models do not fit: 45.[0-9] MiB estimated, more than the 30.0 MiB of --memory-budget" "$W/err"
ok "  ... and each model's weights and KV cache" bash -c "grep -q '  a: 22.[0-9] MiB = weights 1.0 (f32) + KV cache 20.0 (1024 blocks) + buffers' '$W/err' && grep -q '  b: 22.[0-9] MiB' '$W/err'"
ok "  ... before loading any (no engine started)" bash -c "! grep -q 'loaded' '$W/err'"
ok "one of them fits the same budget" start -m "$MODEL,name=a" --memory-budget 30M
ok "  ... logging the estimate" grep -q "Memory: 22.[0-9] MiB estimated for 1 model, of 30.0 MiB (--memory-budget)" "$W/log"
stop
ok "kv-cache-mb=1: as many 20 KiB blocks as fit in 1 MiB (51)" start -m "$MODEL,name=s,kv-cache-mb=1"
ok "  ... the engine has 51 blocks" test "$(metric 'kiln_inferd_kv_cache_blocks{model_name="s",state="free"}')" = 51
stop

# ---- the cluster file's inference.models
cfg() {
	cat >"$1" <<EOF
cluster = { name = "demo"; };
network = { subnet = "10.77.0.0/24"; };
head = { hostname = "head"; address = "10.77.0.1"; };
node_groups = ( {
  name = "cpu"; hosts = "node[01-02]"; addresses = "10.77.0.11-10.77.0.12";
  macs = [ "52:54:00:77:00:11", "52:54:00:77:00:12" ];
} );
slurm = { partitions = ( { name = "batch"; nodes = "node01"; default = true; } ); };
inference = {
  enabled = true; nodes = "node02"; context_length = 128; kv_blocks = 32;
  models = (
    { name = "small"; path = "$MODEL"; },
    { name = "big"; path = "$2"; context_length = 256; kv_cache_mb = "2M"; }
  );
};
EOF
}
cfg "$W/c.cfg" "$MODEL"
ok "kiln check accepts a file with two models" rc_is 0 "$KILN" check -c "$W/c.cfg"
ok "the node serves both from the file" start -c "$W/c.cfg" --node node02
ok "  ... the flat keys are defaults (small: context 128, 32 blocks), element keys win (big: 256, 2 MiB = 102 blocks)" log_has "2 models on http://127.0.0.1:[0-9]* (cpu): small (f32, context 128, 32 KV blocks), big (f32, context 256, 102 KV blocks)"
ok "  ... /v1/models says the same" bash -c "curl -s '$URL/v1/models' | jq -e '[.data[] | [.id, .max_model_len]] == [[\"small\", 128], [\"big\", 256]]' >/dev/null"
stop
ok "a flag wins over every model of the file (--kv-blocks 16)" start -c "$W/c.cfg" --node node02 --kv-blocks 16
ok "  ... both have 16 blocks" grep -q "small (f32, context 128, 16 KV blocks), big (f32, context 256, 16 KV blocks)" "$W/log"
stop
ok "--model replaces the file's models" start -c "$W/c.cfg" --node node02 -m "$MODEL,name=only"
ok "  ... one model served" bash -c "curl -s '$URL/v1/models' | jq -e '[.data[].id] == [\"only\"]' >/dev/null"
stop
cfg "$W/missing.cfg" "$W/nope.bin"
ok "a model file missing on this host: kiln check exits 0" rc_is 0 "$KILN" check -c "$W/missing.cfg"
ok "  ... warning about inference.models[1].path" grep -q "^$W/missing.cfg: inference.models\[1\].path: warning: $W/nope.bin does not exist on this host" "$W/err"
ok "  ... kiln check --strict fails on it" rc_is 2 "$KILN" check --strict -c "$W/missing.cfg"
ok "  ... on the node kiln-inferd refuses to start: exit 1" rc_is 1 "$BIN" -c "$W/missing.cfg" --node node02 -p 0
# ---- --dtype auto (the default): what the file holds, logged with why
ok "--dtype auto is the default: the llama2.c fixture is served as f32" start -m "$MODEL"
ok "  ... the log says what and why" log_has "tiny260K.bin: dtype auto: f32 ($MODEL holds 100% of its weight matrices' elements as F32, cpu backend): as stored (F32)"
stop
if command -v python3 >/dev/null && [ -r "${MODEL%.bin}.st" ]; then
	for dt in bf16 f16; do
		python3 "$(dirname "$0")/st-convert.py" "${MODEL%.bin}.st" $dt "$W/m-$dt.st"
		DT=$(echo $dt | tr a-z A-Z)
		ok "a safetensors file in $dt: served as $dt" start -m "$W/m-$dt.st"
		ok "  ... logged: as stored ($DT)" log_has "m-$dt.st: dtype auto: $dt ($W/m-$dt.st holds 100% of its weight matrices' elements as $DT, cpu backend): as stored ($DT)"
		ok "  ... and it answers" bash -c "[ \$(curl -s -o /dev/null -w '%{http_code}' '$URL/v1/completions' -d '{\"model\": \"m-$dt.st\", \"prompt\": [1, 2, 3], \"max_tokens\": 4}') = 200 ]"
		ok "  ... the model line says $dt" log_has "Serving m-$dt.st on http://127.0.0.1:[0-9]* (cpu, $dt, "
		stop
	done
	ok "--dtype i8 overrides auto: no auto line, served as i8" start -m "$W/m-bf16.st" --dtype i8
	ok "  ... served as i8" bash -c "grep -q 'Serving m-bf16.st on .*(cpu, i8, ' '$W/log' && ! grep -q 'dtype auto' '$W/log'"
	stop
	ok "--model FILE,dtype=auto wins over --dtype f32" start -m "$W/m-f16.st,dtype=auto" --dtype f32
	ok "  ... served as f16" log_has "(cpu, f16, "
	stop
else
	for _ in $(seq 12); do skip "python3 or ${MODEL%.bin}.st missing: no bf16/f16 files"; done
fi
cat >"$W/auto.cfg" <<EOF
cluster = { name = "demo"; };
network = { subnet = "10.77.0.0/24"; };
head = { hostname = "head"; address = "10.77.0.1"; };
node_groups = ( {
  name = "cpu"; hosts = "node[01-02]"; addresses = "10.77.0.11-10.77.0.12";
  macs = [ "52:54:00:77:00:11", "52:54:00:77:00:12" ];
} );
slurm = { partitions = ( { name = "batch"; nodes = "node01"; default = true; } ); };
inference = { enabled = true; nodes = "node02"; model = "$MODEL"; dtype = "q4"; kv_blocks = 32; };
EOF
ok "inference.dtype = \"q4\" is served as q4" start -c "$W/auto.cfg" --node node02
ok "  ... no auto line" bash -c "grep -q '(cpu, q4, ' '$W/log' && ! grep -q 'dtype auto' '$W/log'"
stop
sed -i 's/dtype = "q4"; //' "$W/auto.cfg"
ok "inference.dtype unset: auto, the schema's default" start -c "$W/auto.cfg" --node node02
ok "  ... logged" log_has "dtype auto: f32 "
stop
ok "kiln show --defaults says auto" bash -c "'$KILN' show --defaults 2>/dev/null | grep -q 'dtype.*auto'"
ok "--help names auto as the default" bash -c "'$BIN' --help | grep -q 'default auto'"
ok "a bad --dtype names auto among the words" bash -c "! '$BIN' -m '$MODEL' --dtype f64 2>'$W/err'; grep -q 'expected auto, f32, bf16, f16, i8 or q4' '$W/err'"
sed -i "s|enabled = true;|enabled = true; model = \"$MODEL\";|" "$W/c.cfg"
ok "inference.model beside inference.models: kiln-inferd refuses the file, exit 2" rc_is 2 "$BIN" -c "$W/c.cfg" --node node02 -p 0
ok "  ... saying both are set" grep -q "both inference.models and inference.model are set" "$W/err"
tap_done
