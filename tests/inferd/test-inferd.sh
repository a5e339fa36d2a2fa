#!/bin/bash
# test-inferd.sh — kiln-inferd over real HTTP on 127.0.0.1 (curl, jq) with
# the tiny260K model fixture: --help lists every option the code parses, exit
# codes (0, 1 failure, 2 usage), a greedy completion streamed and not
# streamed giving the same token ids, a stop token, usage counts, OpenAI-
# shaped 400/404 errors with the field named, 429 with Retry-After when the
# queue is full, a client that hangs up mid-stream cancelling its request,
# /v1/models, /metrics, and SIGTERM with a stream in flight.  Then text,
# with tests/tokenizer/data/tok512.bin (a 512-token sentencepiece BPE, the
# tokenizer the fixture was trained with: tests/fixtures): a text prompt answered as its token ids (from `kiln
# tokenize`), replies decoded as ktok decodes them, stop strings cut and
# absent, streamed text (complete UTF-8 per event) joining to the
# non-streamed text, batches, echo, chat completions with the ChatML prompt
# counted as `kiln tokenize` counts it, chat chunks in OpenAI's order,
# 400s for bad messages and over-long prompts, and a tokenizer larger than
# the model refused with exit 2.  Stock clients' neutral fields accepted,
# unsupported ones refused by name, prompt + max_tokens past the context,
# GET /v1/models/{id}; a stream cut by SIGTERM ending with an error event
# and [DONE]; stop-string finishes counted as stop; 100 idle sockets from
# one client (hostile-conns.py), a dribbled header, --max-body-bytes.
# Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
inferd_suite test curl jq

# start ARGS...: runs the server on an ephemeral port; sets PID and URL.
start() { inferd_start -m "$MODEL" --name m "$@"; }
stop() { inferd_stop; }
post() { curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/completions" -d "$1"; }
json_is() { jq -e "$1" "$W/body" >/dev/null || { echo "# $(head -c 400 "$W/body")"; return 1; }; }

# ---- command line
ok "--help exits 0" rc_is 0 "$BIN" --help
missing=
# the option table's entries: { "long", 'x' or OPT_..., ...
for o in $(grep -oE "\{ \"[a-z-]+\", ('[a-z]'|OPT_[A-Z_]+)," services/inferd/main.c | sed 's/{ "\([a-z-]*\)".*/\1/'); do
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
curl -sN "$URL/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' >"$W/sse"
ok "the same streamed ends with data: [DONE]" bash -c "tail -n 2 '$W/sse' | grep -qx 'data: \[DONE\]'"
sed -n 's/^data: \({.*\)/\1/p' "$W/sse" | jq -s -c '[.[].choices[]?.token_ids[]]' >"$W/sids"
ok "  ... one event per token, the same token ids" cmp -s "$W/ids" "$W/sids"
ok "  ... then finish_reason, then (include_usage) a usage chunk without choices" bash -c "sed -n 's/^data: \({.*\)/\1/p' '$W/sse' | tail -2 | jq -s -e '.[0].choices[0].finish_reason == \"length\" and .[1].choices == [] and .[1].usage.completion_tokens == 24' >/dev/null"
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
ok "a text prompt without a tokenizer: 400 naming prompt and --tokenizer" bash -c "[ $code = 400 ] && jq -e '.error.param == \"prompt\" and (.error.message | test(\"--tokenizer\"))' '$W/body' >/dev/null"
code=$(curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}')
ok "  ... and a chat request: 400 naming messages and --tokenizer" bash -c "[ $code = 400 ] && jq -e '.error.param == \"messages\" and (.error.message | test(\"--tokenizer\"))' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":[1,512]}')
ok "a token outside the vocabulary: 400 naming prompt[1]" bash -c "[ $code = 400 ] && jq -e '.error.param == \"prompt[1]\"' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":[1],"temprature":0}')
ok "an unknown field: 400 with a hint" bash -c "[ $code = 400 ] && jq -e '.error.message | test(\"did you mean\")' '$W/body' >/dev/null"
code=$(post "{\"model\":\"m\",\"prompt\":[$(yes 5 | head -513 | paste -sd,)]}")
ok "a prompt past the context: 400 from the engine" bash -c "[ $code = 400 ] && jq -e '.error.message | test(\"more than the model.s context of 512\")' '$W/body' >/dev/null"
code=$(post '{"model":"m","prompt":[1],"n":65}')
ok "n over 64: 400" test "$code" = 400

# ---- metrics and models
curl -s "$URL/metrics" >"$W/metrics"
ok "/metrics: generation tokens counted (24 + 24 + $first + 8 + 8)" grep -qx "vllm:generation_tokens_total{model_name=\"m\"} $((64 + first))" "$W/metrics"
ok "/metrics: finishes by reason" grep -qx 'vllm:request_success_total{model_name="m",finished_reason="stop"} 1' "$W/metrics"
if command -v promtool >/dev/null; then
	# vLLM's names hold a colon (vllm:...), which promtool's linter reserves
	# for recording rules: that lint alone is expected, nothing else.
	ok "/metrics passes promtool check metrics (but for vLLM's colons)" bash -c "promtool check metrics <'$W/metrics' 2>&1 | grep -v \"should not contain ':'\" | grep -q . && exit 1; promtool check metrics <'$W/metrics' 2>&1 | grep -q 'vllm:num_requests_running'"
else
	skip "promtool not installed"
fi
curl -s "$URL/v1/models" >"$W/body"
ok "/v1/models lists the model and its context" json_is '.data[0].id == "m" and .data[0].max_model_len == 512'
code=$(curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/models/m")
ok "GET /v1/models/m: the model" bash -c "[ $code = 200 ] && jq -e '.id == \"m\" and .object == \"model\"' '$W/body' >/dev/null"
code=$(curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/models/gpt-4")
ok "GET /v1/models/gpt-4: 404 model_not_found" bash -c "[ $code = 404 ] && jq -e '.error.code == \"model_not_found\"' '$W/body' >/dev/null"
# What a stock client sends at neutral values is never refused.
code=$(post '{"model":"m","prompt":[1,2],"max_tokens":2,"logprobs":null,"presence_penalty":0,"frequency_penalty":0,"logit_bias":{},"n":1,"user":"u","store":false,"metadata":{}}')
ok "completions with a stock client's neutral fields: 200" test "$code" = 200
code=$(post '{"model":"m","prompt":[1,2],"presence_penalty":2.5}')
ok "presence_penalty 2.5: 400 naming it and its range" bash -c "[ $code = 400 ] && jq -e '.error.param == \"presence_penalty\" and (.error.message | test(\"between -2 and 2\"))' '$W/body' >/dev/null"
code=$(post "{\"model\":\"m\",\"max_tokens\":20,\"prompt\":[$(seq -s, 1 500)]}")
ok "prompt + max_tokens past the context: 400 context_length_exceeded, not cut" bash -c "[ $code = 400 ] && jq -e '.error.code == \"context_length_exceeded\" and (.error.message | test(\"500 in the prompt, 20 in the completion\"))' '$W/body' >/dev/null"

# ---- a client that hangs up mid-stream
curl -sN "$URL/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":511,"ignore_eos":true,"stream":true}' | head -c 300 >/dev/null
cancelled=0
for _ in $(seq 50); do
	curl -s "$URL/metrics" | grep -qx 'vllm:request_success_total{model_name="m",finished_reason="abort"} 1' && { cancelled=1; break; }
	sleep 0.1
done
ok "a client hanging up mid-stream cancels its request" test $cancelled = 1
ok "  ... and its KV blocks are free again" bash -c "curl -s '$URL/metrics' | grep -qx 'kiln_inferd_kv_cache_blocks{model_name=\"m\",state=\"used\"} 0'"
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
ok "  ... with Retry-After and rate_limit_error" bash -c "grep -qi '^Retry-After: 1' '$h' && jq -e '.error.type == \"rate_limit_error\"' '${h%/h*}/b${h##*/h}' >/dev/null"
ok "  ... counted in kiln_inferd_http_responses_total{code=\"429\"} ($n429) and 200s ($n200)" bash -c "curl -s '$URL/metrics' >'$W/m429'; grep -qx 'kiln_inferd_http_responses_total{code=\"429\"} $n429' '$W/m429' && grep -qx 'kiln_inferd_http_responses_total{code=\"200\"} $n200' '$W/m429'"
ok "  ... and the queue time of each admitted request in vllm:request_queue_time_seconds" grep -qx "vllm:request_queue_time_seconds_count{model_name=\"m\"} $n200" "$W/m429"
# SIGTERM with a stream in flight: the stream ends, the server exits 0.
curl -sN "$URL/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":511,"ignore_eos":true,"stream":true}' >"$W/late" &
cpid=$!
sleep 0.05
t0=$EPOCHREALTIME
ok "SIGTERM with a stream in flight: exit 0" stop
wait $cpid
ok "  ... within 5 s" awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a < 5) }'
if sed -n 's/^data: \({.*\)/\1/p' "$W/late" | tail -1 | jq -e '.choices[0].finish_reason == "length"' >/dev/null 2>&1; then
	skip "the stream finished before SIGTERM reached it"
else
	ok "  ... the cut stream ends with an error event (server_shutdown), then data: [DONE]" bash -c "sed -n 's/^data: \\({.*\\)/\\1/p' '$W/late' | tail -1 | jq -e '.error.code == \"server_shutdown\" and .error.type == \"server_error\"' >/dev/null && tail -n 2 '$W/late' | grep -qx 'data: \\[DONE\\]'"
fi
# ---- text: a tokenizer that fits the model
TOK=tests/tokenizer/data/tok512.bin
KILN=$B/bin/kiln
ok "a tokenizer larger than the model: exit 2" rc_is 2 "$BIN" -m "$MODEL" --tokenizer tests/tokenizer/data/sp-tokenizer.bin
ok "  ... saying both sizes" grep -q "has 1000 tokens but the model .* only 512" "$W/err"
ok "an unreadable tokenizer: exit 1" rc_is 1 "$BIN" -m "$MODEL" --tokenizer "$W/nope.json"
ok "an unknown --chat-template: exit 2" rc_is 2 "$BIN" -m "$MODEL" --tokenizer "$TOK" --chat-template jinja
start --tokenizer "$TOK"
ok "no template in the file: ChatML, with a notice" grep -q "chat completions use ChatML" "$W/log"
# The fixture (stories full of accented names and words: Zoë, José,
# café, château ...) continues a story about Zoë by naming her again:
# multi-byte characters for the UTF-8 checks below.  Its weights differ a
# little between CPUs, so the first of a few such prompts whose greedy
# reply holds a multi-byte character is used; with none, the check
# "the reply holds multi-byte characters" below fails and says so.
has_multibyte() { [ "$(printf %s "$1" | LC_ALL=C.UTF-8 wc -c)" -gt "$(printf %s "$1" | LC_ALL=C.UTF-8 wc -m)" ]; }
P=
for cand in "Once upon a time, there was a kiln named Zoë." "Once upon a time, there was a boy named José." \
	"Once upon a time, there was a girl named Chloé." "One day, Renée went to the café." \
	"Once upon a time, there was a little cat named Noël." "André and Zoë went to the château."; do
	post "{\"model\":\"m\",\"prompt\":\"$cand\",\"max_tokens\":40,\"temperature\":0}" >/dev/null
	[ -z "$P" ] && P=$cand
	if has_multibyte "$(jq -r '.choices[0].text' "$W/body")"; then P=$cand; break; fi
done
diag "prompt with a multi-byte reply: $P"
ids=$("$KILN" tokenize "$TOK" --text "$P" --json | jq -c .ids)
n_ids=$(jq length <<<"$ids")
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0}")
cp "$W/body" "$W/text"
ok "a text prompt: 200, usage counts the prompt as kiln tokenize does ($n_ids)" json_is \
	".usage.prompt_tokens == $n_ids and .usage.completion_tokens == 40 and .usage.total_tokens == $((n_ids + 40)) and (.choices[0].token_ids | length) == 40"
code=$(post "{\"model\":\"m\",\"prompt\":$ids,\"max_tokens\":40,\"temperature\":0}")
ok "  ... the same reply as its token ids" bash -c "[ \"\$(jq -c '.choices[0] | [.text, .token_ids]' '$W/text')\" = \"\$(jq -c '.choices[0] | [.text, .token_ids]' '$W/body')\" ]"
full=$(jq -r '.choices[0].text' "$W/text")
want=$("$KILN" tokenize "$TOK" --skip-special --json --ids "$(jq -r '.choices[0].token_ids | join(",")' "$W/text")" | jq -r .text)
ok "  ... its text is ktok's decode of its token ids" test "$full" = "$want"
diag "greedy text: $(jq -c .choices[0].text "$W/text")"

# Stop strings: a piece from the middle of the greedy text; the reply is
# the text before its first occurrence, and the stop string is not in it.
stop=$(jq -c '.choices[0].text | .[12:14]' "$W/text")
stop2=$(jq -c '.choices[0].text | .[20:21]' "$W/text")
before=$(jq -c --argjson s "$stop" --argjson t "$stop2" '.choices[0].text | [split($s)[0], split($t)[0]] | min_by(length)' "$W/text")
req="{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0,\"stop\":[$stop,$stop2]}"
code=$(post "$req")
cp "$W/body" "$W/stopped"
ok "stop [$stop,$stop2]: the text before the first one, finish_reason stop" json_is \
	".choices[0].text == $before and .choices[0].finish_reason == \"stop\""
ok "  ... neither stop string is in the reply" json_is \
	"(.choices[0].text | contains($stop) or contains($stop2)) | not"
ok "  ... usage counts the tokens generated up to the stop" json_is \
	".usage.completion_tokens == (.choices[0].token_ids | length) and .usage.completion_tokens < 40"
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0,\"stop\":$stop}")
ok "  ... a single string works the same" json_is ".choices[0].text == ($(jq -c .choices[0].text "$W/text") | split($stop)[0])"

# Streaming: every event is valid UTF-8 JSON; the texts join to the reply.
sse_texts() { sed -n 's/^data: \({.*\)/\1/p' "$1" | jq -j "$2"; }
utf8_events() { sed -n 's/^data: \({.*\)/\1/p' "$1" | jq -r "$2" | iconv -f UTF-8 -t UTF-8 >/dev/null; }
curl -sN "$URL/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}" >"$W/tsse"
ok "streamed text joins to the non-streamed text" test "$(sse_texts "$W/tsse" '.choices[0].text')" = "$full"
ok "  ... each event's text is complete UTF-8" utf8_events "$W/tsse" '.choices[0].text'
ok "  ... and the reply holds multi-byte characters (the test means something)" has_multibyte "$full"
curl -sN "$URL/v1/completions" -d "${req%\}},\"stream\":true}" >"$W/tsse2"
ok "streamed with stop strings: joins to the non-streamed stopped text" test "$(sse_texts "$W/tsse2" '.choices[0].text')" = "$(jq -r .choices[0].text "$W/stopped")"
ok "  ... finish_reason stop in the last event, then [DONE]" bash -c "sed -n 's/^data: \\({.*\\)/\\1/p' '$W/tsse2' | tail -1 | jq -e '.choices[0].finish_reason == \"stop\"' >/dev/null && tail -n 2 '$W/tsse2' | grep -qx 'data: \\[DONE\\]'"
# Stop-string finishes are stops in the metrics, never cancels.
curl -s "$URL/metrics" >"$W/metrics2"
ok "/metrics: stop-string finishes counted as stop, none as cancelled" bash -c "! grep -q 'vllm:request_success_total{model_name=\"m\",finished_reason=\"abort\"} [1-9]' '$W/metrics2' && grep -q 'vllm:request_success_total{model_name=\"m\",finished_reason=\"stop\"} [1-9]' '$W/metrics2'"
# A stop string never seen: the stream holds back its length - 1 bytes and
# must still cut only between characters.
curl -sN "$URL/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0,\"stream\":true,\"stop\":\"QQQQQQ\"}" >"$W/tsse3"
ok "streamed with an unmatched 6-byte stop string: still joins to the full text" test "$(sse_texts "$W/tsse3" '.choices[0].text')" = "$full"
ok "  ... each event's text is complete UTF-8" utf8_events "$W/tsse3" '.choices[0].text'

# Batches, echo.
code=$(post "{\"model\":\"m\",\"prompt\":[\"$P\",\"Hello\"],\"max_tokens\":40,\"temperature\":0}")
ok "a batch of 2 text prompts: choices 0 and 1, the first as the single reply" json_is \
	"(.choices | map(.index)) == [0,1] and .choices[0].text == $(jq -c .choices[0].text "$W/text") and .usage.completion_tokens == 80"
code=$(post "{\"model\":\"m\",\"prompt\":[$ids,[1]],\"max_tokens\":40,\"temperature\":0}")
ok "a batch of token-id lists: the same first choice" json_is ".choices[0].token_ids == $(jq -c .choices[0].token_ids "$W/text") and (.choices | length) == 2"
code=$(post "{\"model\":\"m\",\"prompt\":[\"$P\",[1]]}")
ok "a batch mixing text and ids: 400 naming prompt[1]" bash -c "[ $code = 400 ] && jq -e '.error.param == \"prompt[1]\"' '$W/body' >/dev/null"
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":40,\"temperature\":0,\"echo\":true}")
ok "echo: the prompt, then the completion" json_is ".choices[0].text == \"$P\" + $(jq -c .choices[0].text "$W/text")"
# Echo with logprobs: the prompt's tokens first (the first one's null), as
# OpenAI's legacy API and vLLM return them; max_tokens 0 scores the prompt
# (lm-eval-harness's loglikelihood requests).
n_p=$(jq length <<<"$ids")
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":0,\"echo\":true,\"logprobs\":2,\"temperature\":0}")
cp "$W/body" "$W/score"
ok "echo, logprobs 2, max_tokens 0: the prompt's $n_p tokens scored, the first null, nothing generated" json_is \
	".choices[0].text == \"$P\" and .choices[0].finish_reason == \"length\" and .usage.completion_tokens == 0 and .usage.prompt_tokens == $n_p and (.choices[0].logprobs | (.tokens | length) == $n_p and .token_logprobs[0] == null and .top_logprobs[0] == null and (.token_logprobs[1:] | all(. < 0)) and (.top_logprobs[1:] | all(length == 2)) and .text_offset[0] == 0 and (.text_offset | . == sort))"
# The decode path against the prompt path: greedy tokens generated with
# their logprobs, then prompt + those tokens scored as a prompt (token ids)
# give the same logprobs, each the best alternative's.
code=$(post "{\"model\":\"m\",\"prompt\":$ids,\"max_tokens\":12,\"logprobs\":1,\"temperature\":0}")
cp "$W/body" "$W/gen"
all=$(jq -c "$ids + .choices[0].token_ids" "$W/gen")
code=$(post "{\"model\":\"m\",\"prompt\":$all,\"max_tokens\":0,\"echo\":true,\"logprobs\":1}")
ok "  ... prompt + 12 greedy tokens scored: their logprobs are the generating run's (to 1e-4), each the best" \
	bash -c "jq -e --slurpfile g '$W/gen' '(.choices[0].logprobs.token_logprobs[$n_p:]) as \$s | (\$g[0].choices[0].logprobs.token_logprobs) as \$t | (\$s | length) == 12 and ([range(12) | ((\$s[.] - \$t[.]) | fabs) < 1e-4] | all) and ([range($n_p; $n_p + 12) as \$i | .choices[0].logprobs | (.top_logprobs[\$i] | to_entries[0].value) == .token_logprobs[\$i]] | all)' '$W/body' >/dev/null"
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":6,\"echo\":true,\"logprobs\":2,\"temperature\":0}")
ok "  ... with 6 tokens generated: $n_p + 6 entries, the prompt's as scored, offsets into the echoed text" json_is \
	"(.choices[0].logprobs | (.tokens | length) == $n_p + 6 and .token_logprobs[:$n_p] == $(jq -c .choices[0].logprobs.token_logprobs "$W/score") and .text_offset[$n_p] == $(printf %s "$P" | wc -c)) and (.choices[0].text | startswith(\"$P\"))"
cp "$W/body" "$W/echo6"
curl -sN "$URL/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":6,\"echo\":true,\"logprobs\":2,\"temperature\":0,\"stream\":true}" >"$W/esse"
ok "  ... streamed: the prompt's logprobs in the first event, the same tokens in all" test \
	"$(sse_texts "$W/esse" '.choices[0].logprobs.tokens // [] | .[]' | tr -d '\n')" = "$(jq -j '.choices[0].logprobs.tokens[]' "$W/echo6" | tr -d '\n')"
n_h=$("$KILN" tokenize "$TOK" --text Hello --json | jq .count)
code=$(post "{\"model\":\"m\",\"prompt\":[\"$P\",\"Hello\"],\"n\":2,\"max_tokens\":0,\"echo\":true,\"logprobs\":0}")
ok "  ... a batch of 2 prompts, n 2: 4 choices, each its own prompt's logprobs" json_is \
	"(.choices | length) == 4 and (.choices | map(.logprobs.token_logprobs[0]) | all(. == null)) and (.choices | map(.logprobs.tokens | length)) == [$n_p, $n_p, $n_h, $n_h] and .choices[2].text == \"Hello\" and .usage.completion_tokens == 0 and ([range(1; $n_p) as \$i | (.choices[0].logprobs.token_logprobs[\$i] - .choices[1].logprobs.token_logprobs[\$i]) | fabs < 1e-4] | all)"
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"max_tokens\":0}")
ok "max_tokens 0 without echo: 400 naming max_tokens" bash -c "[ $code = 400 ] && jq -e '.error.param == \"max_tokens\" and (.error.message | test(\"echo\"))' '$W/body' >/dev/null"
long=$(yes "the kiln" | head -400 | paste -sd' ')
code=$(post "{\"model\":\"m\",\"prompt\":\"$long\"}")
# (3600 bytes: over the context by the byte bound already, "at least N
# tokens", refused before tokenizing; shorter texts are counted exactly)
ok "a text prompt past the context: 400 context_length_exceeded with both counts" bash -c "[ $code = 400 ] && jq -e '.error.param == \"prompt\" and .error.code == \"context_length_exceeded\" and (.error.message | test(\"[0-9]+ tokens.*more than the model.s context of 512\"))' '$W/body' >/dev/null"
code=$(post "{\"model\":\"m\",\"prompt\":\"$P\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}")
ok "5 stop strings: 400 naming stop" bash -c "[ $code = 400 ] && jq -e '.error.param == \"stop\"' '$W/body' >/dev/null"

# Chat: the ChatML prompt, counted as kiln tokenize counts the rendered text.
chat() { curl -s -o "$W/body" -w '%{http_code}' "$URL/v1/chat/completions" -d "$1"; }
msgs='[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me a story."}]'
rendered=$'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n'
n_chat=$("$KILN" tokenize "$TOK" --parse-special --text "$rendered" --json | jq .count)
code=$(chat "{\"model\":\"m\",\"messages\":$msgs,\"max_tokens\":30,\"temperature\":0}")
cp "$W/body" "$W/chat"
ok "chat: a chat.completion, assistant message, usage.prompt_tokens = the ChatML prompt's $n_chat tokens" json_is \
	".object == \"chat.completion\" and .choices[0].message.role == \"assistant\" and (.choices[0].message.content | type) == \"string\" and .choices[0].finish_reason == \"length\" and .usage.prompt_tokens == $n_chat and .usage.completion_tokens == 30 and (.id | startswith(\"chatcmpl-\"))"
rids=$("$KILN" tokenize "$TOK" --parse-special --text "$rendered" --json | jq -c .ids)
code=$(post "{\"model\":\"m\",\"prompt\":$rids,\"max_tokens\":30,\"temperature\":0}")
ok "  ... the same text as a completion of the rendered prompt's ids" bash -c "[ \"\$(jq -c .choices[0].text '$W/body')\" = \"\$(jq -c .choices[0].message.content '$W/chat')\" ]"
curl -sN "$URL/v1/chat/completions" -d "{\"model\":\"m\",\"messages\":$msgs,\"max_tokens\":30,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$W/csse"
sed -n 's/^data: \({.*\)/\1/p' "$W/csse" >"$W/cev"
ok "chat streamed: chunks, the first with role assistant only" bash -c "jq -s -e 'all(.[]; .object == \"chat.completion.chunk\") and .[0].choices[0].delta == {\"role\":\"assistant\",\"content\":\"\"}' '$W/cev' >/dev/null"
ok "  ... content deltas join to the non-streamed content" test "$(jq -j '.choices[0].delta.content // empty' "$W/cev")" = "$(jq -r .choices[0].message.content "$W/chat")"
ok "  ... each delta is complete UTF-8" utf8_events "$W/csse" '.choices[0].delta.content // empty'
ok "  ... a final chunk with finish_reason and an empty delta, a usage chunk, [DONE]" bash -c "jq -s -e '.[-2].choices[0].finish_reason == \"length\" and .[-2].choices[0].delta == {} and .[-1].choices == [] and .[-1].usage.prompt_tokens == $n_chat' '$W/cev' >/dev/null && tail -n 2 '$W/csse' | grep -qx 'data: \\[DONE\\]'"
code=$(chat '{"model":"m","max_tokens":2,"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":false,"top_logprobs":0,"presence_penalty":0,"frequency_penalty":0,"logit_bias":{},"store":false,"metadata":{},"user":"u","n":1,"response_format":{"type":"text"}}')
ok "chat: a stock client's body (developer role, content parts, neutral fields): 200" bash -c "[ $code = 200 ] && jq -e '.choices[0].message.role == \"assistant\"' '$W/body' >/dev/null"
code=$(chat '{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}')
ok "chat: tools: 400 naming tools, saying kiln does not support them" bash -c "[ $code = 400 ] && jq -e '.error.param == \"tools\" and (.error.message | test(\"does not support tool calls\"))' '$W/body' >/dev/null"
code=$(chat '{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}')
ok "chat: an image part: 400 naming messages[0].content[0].type" bash -c "[ $code = 400 ] && jq -e '.error.param == \"messages[0].content[0].type\"' '$W/body' >/dev/null"
code=$(chat '{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"tool","content":"x"}]}')
ok "chat: role tool: 400 naming messages[1].role" bash -c "[ $code = 400 ] && jq -e '.error.param == \"messages[1].role\"' '$W/body' >/dev/null"
code=$(chat '{"model":"m","messages":[{"role":"user"}]}')
ok "chat: no content: 400 naming messages[0].content" bash -c "[ $code = 400 ] && jq -e '.error.param == \"messages[0].content\"' '$W/body' >/dev/null"
code=$(chat '{"model":"m","messages":[]}')
ok "chat: no messages: 400 naming messages" bash -c "[ $code = 400 ] && jq -e '.error.param == \"messages\"' '$W/body' >/dev/null"
code=$(chat '{"model":"m","messages":"hi"}')
ok "chat: messages as a string: 400 naming messages" bash -c "[ $code = 400 ] && jq -e '.error.param == \"messages\"' '$W/body' >/dev/null"
ok "SIGTERM: exit 0" stop
start --tokenizer "$TOK" --chat-template llama2
code=$(chat '{"model":"m","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":4,"temperature":0}')
n_l2=$("$KILN" tokenize "$TOK" --parse-special --no-special --text $'\n<s>\n[INST] Tell me a story. [/INST]' --json | jq .count)
ok "--chat-template llama2: the prompt counted as kiln tokenize counts [INST] ... [/INST] ($n_l2)" json_is ".usage.prompt_tokens == $n_l2"
ok "SIGTERM: exit 0" stop

# ---- connections: idle sockets from one client, a dribbled header
start --max-connections-per-client 8 --idle-timeout 2
ok "100 idle sockets from one client: at most 8 held, another client still answered" python3 tests/inferd/hostile-conns.py idle "$port" 100 8
ok "a header that stops coming: cut by the idle timeout (2 s)" python3 tests/inferd/hostile-conns.py dribble "$port" 4
ok "  ... and the server still answers" bash -c "[ \$(curl -s -o /dev/null -w '%{http_code}' '$URL/health') = 200 ]"
ok "SIGTERM: exit 0" stop
start --max-body-bytes 2048
code=$(post "{\"model\":\"m\",\"prompt\":\"$(python3 -c 'print("a" * 4000)')\"}")
ok "--max-body-bytes 2048: a 4 KB body gets 413 request_too_large" bash -c "[ $code = 413 ] && jq -e '.error.code == \"request_too_large\"' '$W/body' >/dev/null"
ok "SIGTERM: exit 0" stop
tap_done
