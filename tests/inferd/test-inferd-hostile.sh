#!/bin/bash
# test-inferd-hostile.sh — kiln-inferd against hostile clients, bounded and
# on loopback (issue 11's list; the idle-socket and slowloris cases are in
# test-inferd.sh, requests during a drain in test-inferd-service.sh):
#   - 200 streams whose clients leave right after the first event: their
#     sequences are cancelled (counted as vLLM's "abort"), nothing stays
#     running or waiting, every KV block is free again, RSS comes back to
#     within 32 MiB of its level before the burst, and the server answers;
#   - a 100 MB body: refused (413) without the server holding it, RSS bounded;
#   - a 3.4 MB chat (under the body cap): refused by its bytes before it is
#     tokenized (context_length_exceeded), RSS bounded;
#   - JSON nested 100000 deep, invalid UTF-8 in a prompt: 400 each.
# Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
inferd_suite hostile curl jq python3
port='' # set by inferd_start

# metric PREFIX: the sum of the samples whose line starts with PREFIX
metric() { curl -s "$URL/metrics" | awk -v k="$1" 'index($0, k) == 1 { s += $NF } END { print s + 0 }'; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$PID/status"; }
alive() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; }
in_flight() { echo $(($(metric 'vllm:num_requests_running{') + $(metric 'vllm:num_requests_waiting{'))); }
# settle: until nothing runs or waits (at most 60 s)
settle() { for _ in $(seq 600); do [ "$(in_flight)" = 0 ] && return 0; sleep 0.1; done; return 1; }
# rss_near BEFORE: RSS now within 32 MiB of BEFORE (kB), both printed
rss_near() {
	local now
	now=$(rss_kb)
	echo "# RSS $(($1 / 1024)) MiB before, $((now / 1024)) MiB after"
	[ "$now" -le $(($1 + 32768)) ]
}

ok "the server starts (256 connections per client, 64 running)" \
	inferd_start -m "$MODEL" --name m --tokenizer tests/tokenizer/data/tok512.bin \
	--max-connections-per-client 256 --max-running 64
# warm up with the same burst: the engine's buffers and the allocator's arenas
# are touched once, so growth in the measured burst would be a leak
python3 tests/inferd/hostile-conns.py streams "$port" 200 >/dev/null
settle
rss0=$(rss_kb)
abort0=$(metric 'vllm:request_success_total{model_name="m",finished_reason="abort"}')
length0=$(metric 'vllm:request_success_total{model_name="m",finished_reason="length"}')

# ---- 200 streams that leave mid-stream
ok "200 streams, each client gone after its first event" python3 tests/inferd/hostile-conns.py streams "$port" 200
ok "  ... then nothing runs or waits" settle
aborts=$(($(metric 'vllm:request_success_total{model_name="m",finished_reason="abort"}') - abort0))
lengths=$(($(metric 'vllm:request_success_total{model_name="m",finished_reason="length"}') - length0))
# a stream may finish its 400 tokens before its client is read and leaves
# (more of them on a loaded machine); the rest must be cancelled
ok "  ... each cancelled (abort: $aborts) or already finished (length: $lengths)" \
	test "$aborts" -ge 1 -a $((aborts + lengths)) = 200
ok "  ... every KV block free again" \
	test "$(metric 'kiln_inferd_kv_cache_blocks{model_name="m",state="used"}')" = 0
ok "  ... RSS back near its level before the burst" rss_near "$rss0"
ok "  ... and the server answers" alive

# ---- a 100 MB body
truncate -s 100M "$W/big"
rss1=$(rss_kb)
code=$(curl -s -o "$W/body" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
	--data-binary @"$W/big" "$URL/v1/completions")
# 413 when curl reads the reply; 000 when the server closed on it mid-send
ok "a 100 MB body: refused (HTTP $code)" bash -c "[ '$code' = 413 ] || [ '$code' = 000 ]"
ok "  ... RSS stays near its level before" rss_near "$rss1"
ok "  ... and the server answers" alive

# ---- a 3.4 MB chat, under the 4 MiB body cap: its bytes alone are over
# the context, so it is refused before tokenizing (a million tokens, ~150 MB)
python3 -c 'import sys; sys.stdout.write("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + "the kiln " * 380000 + "\"}]}")' >"$W/chat"
rss2=$(rss_kb)
code=$(curl -s -o "$W/body" -w '%{http_code}' --data-binary @"$W/chat" "$URL/v1/chat/completions")
ok "a 3.4 MB chat: 400 context_length_exceeded before tokenizing" bash -c \
	"[ '$code' = 400 ] && jq -e '.error.code == \"context_length_exceeded\" and (.error.message | test(\"at least\"))' '$W/body' >/dev/null"
ok "  ... RSS stays near its level before" rss_near "$rss2"

# ---- malformed JSON
python3 -c 'import sys; n = 100000; sys.stdout.write("{\"model\":\"m\",\"prompt\":" + "[" * n + "]" * n + "}")' >"$W/deep"
code=$(curl -s -o "$W/body" -w '%{http_code}' --data-binary @"$W/deep" "$URL/v1/completions")
ok "JSON nested 100000 deep: 400" bash -c "[ '$code' = 400 ] && jq -e '.error.message' '$W/body' >/dev/null"
printf '{"model":"m","prompt":"caf\xc3 \xff\xfe","max_tokens":2}' >"$W/utf8"
code=$(curl -s -o "$W/body" -w '%{http_code}' --data-binary @"$W/utf8" "$URL/v1/completions")
ok "invalid UTF-8 in a prompt: 400" bash -c "[ '$code' = 400 ] && jq -e '.error.message' '$W/body' >/dev/null"
ok "  ... and the server answers" alive
ok "SIGTERM: exit 0" inferd_stop
tap_done
