#!/bin/bash
# test-inferd.sh — kiln-inferd over real HTTP on 127.0.0.1 (curl, jq) with
# the stories260K fixture: --help lists every option the code parses, exit
# codes (0, 1 failure, 2 usage), a greedy completion streamed and not
# streamed giving the same token ids, a stop token, usage counts, OpenAI-
# shaped 400/404 errors with the field named, 429 with Retry-After when the
# queue is full, a client that hangs up mid-stream cancelling its request,
# /v1/models, /metrics, and SIGTERM with a stream in flight.  Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
B=${KILN_BUILD:-build}
BIN=$B/bin/kiln-inferd
export KK_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1
MODEL=${KM_TEST_MODEL:-}
for c in tests/fixtures/stories260K.bin ../shared/fixtures/stories260K.bin; do
	[ -z "$MODEL" ] && [ -r "$c" ] && MODEL=$c
done
if [ ! -x "$BIN" ]; then echo "1..1"; echo "ok 1 # SKIP $BIN not built"; exit 0; fi
if [ -z "$MODEL" ]; then echo "1..1"; echo "ok 1 # SKIP stories260K.bin not found (set KM_TEST_MODEL)"; exit 0; fi
for t in curl jq; do
	command -v $t >/dev/null || { echo "1..1"; echo "ok 1 # SKIP $t not installed"; exit 0; }
done
W=$(mktemp -d /tmp/kiln-inferd-test.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

rc_is() { local want=$1; shift; "$@" >"$W/out" 2>"$W/err"; local rc=$?; [ "$rc" = "$want" ] || { echo "# rc $rc, want $want"; sed 's/^/# /' "$W/err"; return 1; }; }
# start ARGS...: runs the server on an ephemeral port; sets PID and URL.
start() {
	"$BIN" -m "$MODEL" --name m -p 0 "$@" >"$W/log" 2>&1 &
	PID=$!
	for _ in $(seq 100); do
		port=$(grep -o 'http://127.0.0.1:[0-9]*' "$W/log" | head -1 | sed 's/.*://')
		[ -n "$port" ] && break
		sleep 0.1
	done
	URL=http://127.0.0.1:$port
}
stop() { kill -TERM "$PID"; wait "$PID"; local rc=$?; PID=; return $rc; }
post() { curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/completions" -d "$1"; }
json_is() { jq -e "$1" "$W/body" >/dev/null || { echo "# $(head -c 400 "$W/body")"; return 1; }; }

# ---- command line
ok "--help exits 0" rc_is 0 "$BIN" --help
missing=
for o in $(grep -o '{ "[a-z-]*", [a-z_]*_argument' services/inferd/main.c | sed 's/{ "\([a-z-]*\)".*/\1/'); do
	grep -q -- "--$o" "$W/out" || missing="$missing $o"
done
ok "--help lists every long option main.c parses${missing:+ (missing:$missing)}" test -z "$missing"
ok "--version prints the version" bash -c "'$BIN' --version | grep -q '^kiln-inferd [0-9]'"
ok "an unknown option exits 2" rc_is 2 "$BIN" --bogus
ok "no --model exits 2" rc_is 2 "$BIN"
ok "a bad --dtype exits 2" rc_is 2 "$BIN" -m "$MODEL" --dtype f64
ok "a missing model file exits 1" rc_is 1 "$BIN" -m "$W/nope.bin"
ok "  ... and says why" grep -q "nope.bin: cannot open" "$W/err"

# ---- completions
start --max-running 4
ok "the server logs its address" test -n "$port"
code=$(post '{"model":"m","prompt":[1],"max_tokens":24,"temperature":0}')
ok "a greedy completion: 200" test "$code" = 200
ok "  ... 24 token ids, finish_reason length, usage 1+24" json_is \
	'(.choices[0].token_ids | length) == 24 and .choices[0].finish_reason == "length" and .usage.prompt_tokens == 1 and .usage.completion_tokens == 24 and .usage.total_tokens == 25 and .object == "text_completion" and .model == "m"'
jq -c '.choices[0].token_ids' "$W/body" >"$W/ids"
curl -sN "$URL/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":24,"temperature":0,"stream":true}' >"$W/sse"
ok "the same streamed ends with data: [DONE]" bash -c "tail -n 2 '$W/sse' | grep -qx 'data: \[DONE\]'"
sed -n 's/^data: \({.*\)/\1/p' "$W/sse" | jq -s -c '[.[].choices[0].token_ids[]]' >"$W/sids"
ok "  ... one event per token, the same token ids" cmp -s "$W/ids" "$W/sids"
ok "  ... the last event has finish_reason and usage" bash -c "sed -n 's/^data: \({.*\)/\1/p' '$W/sse' | tail -1 | jq -e '.choices[0].finish_reason == \"length\" and .usage.completion_tokens == 24' >/dev/null"
# A stop id: the 6th token (the server's reply stops before it, reason stop)
stop_id=$(jq '.[5]' "$W/ids")
first=$(jq --argjson s "$stop_id" 'index($s)' "$W/ids")
code=$(post "{\"model\":\"m\",\"prompt\":[1],\"max_tokens\":24,\"temperature\":0,\"stop_token_ids\":[$stop_id]}")
ok "stop_token_ids: finish_reason stop, the tokens before the stop id" json_is \
	"(.choices[0].token_ids | length) == $first and .choices[0].finish_reason == \"stop\""
code=$(post '{"model":"m","prompt":[1,5,9],"max_tokens":8,"temperature":0.8,"seed":42}')
cp "$W/body" "$W/s1"
code=$(post '{"model":"m","prompt":[1,5,9],"max_tokens":8,"temperature":0.8,"seed":42}')
ok "a seeded request is reproducible" bash -c "[ \"\$(jq -c .choices[0].token_ids '$W/s1')\" = \"\$(jq -c .choices[0].token_ids '$W/body')\" ]"

# ---- errors
code=$(post '{"model":"other","prompt":[1]}')
ok "an unknown model: 404 model_not_found" bash -c "[ $code = 404 ] && jq -e '.error.code == \"model_not_found\"' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":"Once upon a time"}')
ok "a text prompt: 400 naming prompt" bash -c "[ $code = 400 ] && jq -e '.error.param == \"prompt\" and (.error.message | test(\"tokenizer\"))' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":[1,512]}')
ok "a token outside the vocabulary: 400 naming prompt[1]" bash -c "[ $code = 400 ] && jq -e '.error.param == \"prompt[1]\"' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":[1],"temprature":0}')
ok "an unknown field: 400 with a hint" bash -c "[ $code = 400 ] && jq -e '.error.message | test(\"did you mean\")' '$W/body' >/dev/null"
code=$(post "{\"model\":\"m\",\"prompt\":[$(yes 5 | head -513 | paste -sd,)]}")
ok "a prompt past the context: 400 from the engine" bash -c "[ $code = 400 ] && jq -e '.error.message | test(\"more than the model.s context of 512\")' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":[1],"n":2}')
ok "n other than 1: 400" test "$code" = 400

# ---- metrics and models
curl -s "$URL/metrics" >"$W/metrics"
ok "/metrics: generation tokens counted (24 + 24 + $first + 8 + 8)" grep -qx "kiln_inferd_generation_tokens_total $((64 + first))" "$W/metrics"
ok "/metrics: finishes by reason" grep -qx 'kiln_inferd_request_success_total{finished_reason="stop"} 1' "$W/metrics"
if command -v promtool >/dev/null; then
	ok "/metrics passes promtool check metrics" bash -c "promtool check metrics <'$W/metrics' >/dev/null 2>&1"
else
	skip "promtool not installed"
fi
curl -s "$URL/v1/models" >"$W/body"
ok "/v1/models lists the model and its context" json_is '.data[0].id == "m" and .data[0].max_model_len == 512'

# ---- a client that hangs up mid-stream
curl -sN "$URL/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":511,"ignore_eos":true,"stream":true}' | head -c 300 >/dev/null
cancelled=0
for _ in $(seq 50); do
	curl -s "$URL/metrics" | grep -qx 'kiln_inferd_request_success_total{finished_reason="cancelled"} 1' && { cancelled=1; break; }
	sleep 0.1
done
ok "a client hanging up mid-stream cancels its request" test $cancelled = 1
ok "  ... and its KV blocks are free again" bash -c "curl -s '$URL/metrics' | grep -qx 'kiln_inferd_kv_cache_blocks{state=\"used\"} 0'"
ok "SIGTERM: exit 0" stop

# ---- 429 when the queue is full
start --max-running 1 --max-waiting 1
for i in 1 2 3 4 5 6; do
	curl -s -D "$W/h$i" -o "$W/b$i" -w '%{http_code}\n' "$URL/v1/completions" \
		-d '{"model":"m","prompt":[1],"max_tokens":511,"ignore_eos":true}' >"$W/c$i" &
done
wait $(jobs -p | grep -v "^$PID\$") 2>/dev/null
n429=$(cat "$W"/c? | grep -c 429)
n200=$(cat "$W"/c? | grep -c 200)
diag "6 concurrent requests, 1 slot, 1 queue place: $n200 x 200, $n429 x 429"
ok "a full queue answers 429 (and the rest 200)" test "$n429" -ge 1 -a $((n429 + n200)) = 6
h=$(grep -l '^HTTP/1.1 429' "$W"/h? | head -1)
ok "  ... with Retry-After and rate_limit_error" bash -c "grep -qi '^Retry-After: 1' '$h' && jq -e '.error.type == \"rate_limit_error\"' '${h/h/b}' >/dev/null"
# SIGTERM with a stream in flight: the stream ends, the server exits 0.
curl -sN "$URL/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":511,"ignore_eos":true,"stream":true}' >"$W/late" &
cpid=$!
sleep 0.05
t0=$EPOCHREALTIME
ok "SIGTERM with a stream in flight: exit 0" stop
wait $cpid
ok "  ... within 5 s" awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a < 5) }'
tap_done
