#!/bin/bash
# test-inferd-service.sh — kiln-inferd as the cluster file and systemd run
# it (the tiny260K fixture, curl, jq, python3 for a fake $NOTIFY_SOCKET):
#   - the inference section of a cluster file configures it on the node
#     inference.nodes names (name, context_length, drain_grace ...), a flag
#     wins over the file, another node is refused with the reason, and
#     without a file the defaults are the schema's (kiln show --defaults);
#   - the notify protocol: READY=1 with STATUS= naming what is served, and
#     WATCHDOG=1 pings that follow the engine scheduler's tick;
#   - the drain: SIGTERM answers new requests 503 + Retry-After, lets those
#     in flight finish (a stream ends with its finish_reason and [DONE]),
#     then exits 0; past drain_grace the rest is cancelled, still exit 0.
# Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
inferd_suite service curl jq python3
LPID=
# shellcheck disable=SC2034 # run by inferd_cleanup
INFERD_CLEANUP='[ -n "$LPID" ] && kill "$LPID" 2>/dev/null'
MODEL=$(readlink -f "$MODEL")
KILN=$B/bin/kiln


# cfg FILE INFERENCE-LINES...: node01-02 train, node03 infers.
cfg() {
	local f=$1; shift
	cat >"$f" <<EOF
cluster = { name = "demo"; };
network = { subnet = "10.77.0.0/24"; };
head = { hostname = "head"; address = "10.77.0.1"; };
node_groups = ( {
  name = "gpu"; hosts = "node[01-03]"; addresses = "10.77.0.11-10.77.0.13";
  macs = [ "52:54:00:77:00:11", "52:54:00:77:00:12", "52:54:00:77:00:13" ];
  gpus = { count = 1; };
} );
slurm = { partitions = ( { name = "train"; nodes = "node[01-02]"; default = true; } ); };
inference = {
  enabled = true; nodes = "node03"; model = "$MODEL";
$(printf '  %s\n' "$@")
};
EOF
}

# notify_listen SOCK OUT: a fake systemd notify socket, one "TIME LINE" per
# received line; sets LPID.
notify_listen() {
	python3 - "$1" "$2" <<'PYEOF' &
import os, socket, sys, time
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
with open(out, "a", buffering=1) as f:
    while True:
        for line in s.recv(4096).decode(errors="replace").split("\n"):
            if line:
                f.write("%.6f %s\n" % (time.time(), line))
PYEOF
	LPID=$!
	for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
	return 1
}
# start ARGS...: the server (stderr to $W/log); sets PID, URL.
start() { inferd_start "$@"; }
stop() { inferd_stop; }
model_is() { curl -s "$URL/v1/models" | jq -e --arg m "$1" '.data[0].id == $m' >/dev/null; }

# ---- the cluster file drives it
cfg "$W/c.cfg" 'name = "stories";' 'context_length = 256;' 'drain_grace = "20s";' 'max_waiting = 500;'
ok "kiln check accepts the file" rc_is 0 "$KILN" check -c "$W/c.cfg"
ok "  ... without a warning about the model (the file exists)" bash -c "! grep -q 'inference\.\(model\|tokenizer\): warning' '$W/err'"
cfg "$W/nomodel.cfg" "tokenizer = \"$W/nope.json\";"
sed -i "s|model = \"$MODEL\"|model = \"$W/nope.bin\"|" "$W/nomodel.cfg"
ok "a model file missing on this host: kiln check still exits 0 (the head node)" rc_is 0 "$KILN" check -c "$W/nomodel.cfg"
ok "  ... with a warning naming the key and the file" grep -q "^$W/nomodel.cfg: inference.model: warning: $W/nope.bin does not exist on this host" "$W/err"
ok "  ... and the tokenizer's" grep -q "inference.tokenizer: warning: $W/nope.json does not exist" "$W/err"
ok "  ... on the node kiln-inferd refuses to start: exit 1" rc_is 1 "$BIN" -c "$W/nomodel.cfg" --node node03 -p 0
ok "on node03 (inference.nodes) it serves the file's model" start -c "$W/c.cfg" --node node03
ok "  ... under the file's name" model_is stories
ok "  ... with the file's context_length" bash -c "curl -s '$URL/v1/models' | jq -e '.data[0].max_model_len == 256' >/dev/null"
stop
ok "a flag wins over the file (--name)" start -c "$W/c.cfg" --node node03 --name other
ok "  ... /v1/models says so" model_is other
stop
export KILN_CONFIG=$W/c.cfg SLURMD_NODENAME=node03
ok "\$KILN_CONFIG and \$SLURMD_NODENAME find the file and the node" start
ok "  ... the file's model" model_is stories
stop
unset KILN_CONFIG SLURMD_NODENAME
ok "node01 (not in inference.nodes) is refused: exit 2" rc_is 2 "$BIN" -c "$W/c.cfg" --node node01
ok "  ... saying why and what to do" grep -q "node01 (--node) serves no model in $W/c.cfg: it is not one of inference.nodes; run kiln-inferd on a node of inference.nodes" "$W/err"
cfg "$W/off.cfg" 'name = "x";'
sed -i 's/enabled = true;/enabled = false;/' "$W/off.cfg"
ok "inference.enabled = false: refused, exit 2" rc_is 2 "$BIN" -c "$W/off.cfg" --node node03
ok "  ... saying so" grep -q "inference.enabled is false" "$W/err"
ok "a node not in the file: refused, exit 2" rc_is 2 "$BIN" -c "$W/c.cfg" --node elsewhere
ok "  ... saying so" grep -q "it is not a node of the file" "$W/err"
ok "a bad file: exit 2 with its errors" rc_is 2 "$BIN" -c "$KILN" --node node03
ok "--context-length longer than the model's: exit 2" rc_is 2 "$BIN" -m "$MODEL" --context-length 100000
ok "  ... with the numbers" grep -q "longer than .* own context (512 tokens)" "$W/err"
# without a file the defaults are the schema's: the address and port
addr=$("$KILN" show --defaults 2>/dev/null | awk '$1 == "inference.address" { gsub(/"/, "", $3); print $3 }')
ok "the schema's default address is loopback ($addr)" test "$addr" = 127.0.0.1
ok "without a cluster file it binds the schema's address" bash -c "
	env -u KILN_CONFIG '$BIN' -m '$MODEL' -p 0 >'$W/d.log' 2>&1 & p=\$!
	for _ in \$(seq 100); do grep -q Serving '$W/d.log' && break; sleep 0.05; done
	kill \$p; wait \$p; grep -q 'on http://$addr:' '$W/d.log'"

# ---- systemd: READY, STATUS, WATCHDOG
notify_listen "$W/n.sock" "$W/n.notify"
NOTIFY_SOCKET=$W/n.sock WATCHDOG_USEC=1000000 start -c "$W/c.cfg" --node node03
sleep 2.2
CPIDS=
# 40 x 250 tokens keep the engine busy for about a second on the 2-core
# machine (20 were over in well under one after the issue-15 speedups).
for i in $(seq 40); do
	curl -s -o /dev/null "$URL/v1/completions" -d '{"model":"stories","prompt":[1],"max_tokens":250,"ignore_eos":true}' &
	CPIDS="$CPIDS $!"
done
wait $CPIDS
sleep 0.5
stop
check "exit 0 after SIGTERM" $?
sleep 0.2
kill "$LPID"; wait "$LPID" 2>/dev/null; LPID=
ok "READY=1 once the model is loaded" grep -q " READY=1$" "$W/n.notify"
ok "STATUS= names the model, the address and the context" grep -q " STATUS=Serving stories on http://127.0.0.1:[0-9]* (cpu, f32, context 256" "$W/n.notify"
wd=$(awk '$2 == "WATCHDOG=1" { if (p) { g = $1 - p; if (g > m) { m = g; at = p } }; p = $1; n++ } END { printf "%d %.3f %.3f", n, m, at }' "$W/n.notify")
echo "# watchdog pings, longest gap, gap start: $wd"
ok "WATCHDOG=1 pings, idle and busy, never 1 s apart (WatchdogSec=1s)" \
	awk -v wd="$wd" 'BEGIN { split(wd, a, " "); exit !(a[1] >= 6 && a[2] < 0.9) }' 
ok "STOPPING=1 on SIGTERM" grep -q " STOPPING=1$" "$W/n.notify"

# ---- the drain
# burst N BODY: N requests in the background, each reply in $W/r.I (code
# on its last line).
burst() {
	CPIDS=
	for i in $(seq "$1"); do
		curl -s -w '\n%{http_code}\n' -o - "$URL/v1/completions" -d "$2" >"$W/r.$i" 2>&1 &
		CPIDS="$CPIDS $!"
	done
}
# 1 + 500 tokens fit the model's own context (512; the flag overrides the
# file's 256): 61 x 500 tokens one at a time, work that outlasts the curls'
# start on a loaded machine
BODY='{"model":"stories","prompt":[1],"max_tokens":500,"ignore_eos":true}'
# a grace no loaded test machine runs out of
start -c "$W/c.cfg" --node node03 --context-length 512 --max-running 1 --drain-grace 5m
curl -sN "$URL/v1/completions" -d '{"model":"stories","prompt":[1],"max_tokens":500,"ignore_eos":true,"stream":true}' >"$W/stream" &
SPID=$!
sleep 0.1
burst 60 "$BODY"
# SIGTERM once all 61 are in the engine (a curl still starting would
# rightly get 503)
for _ in $(seq 200); do
	# accepted so far: one prompt token each (running + waiting would fall
	# again as the first ones finish)
	n=$(curl -s "$URL/metrics" | awk '/^vllm:prompt_tokens_total[{]/ { s += $2 } END { print s + 0 }')
	[ "$n" -ge 61 ] && break
	sleep 0.02
done
kill -TERM "$PID"
sleep 0.2
code=$(curl -s -D "$W/h503" -o "$W/b503" -w '%{http_code}' "$URL/v1/completions" -d "$BODY")
ok "during the drain a new request gets 503" test "$code" = 503
ok "  ... with Retry-After" grep -qi "^Retry-After: [0-9]" "$W/h503"
ok "  ... in OpenAI's error shape, saying why" bash -c "jq -e '.error.message | test(\"shutting down\")' '$W/b503' >/dev/null"
wait "$PID"; rc=$?; PID=
ok "exit 0 once drained" test "$rc" = 0
wait "$SPID" $CPIDS
n200=$(tail -qn1 "$W"/r.* | grep -c '^200$')
ok "every request in flight finished (60 x 200, got $n200)" test "$n200" = 60
ok "the stream in flight ended with finish_reason length and [DONE]" bash -c \
	"grep -q '\"finish_reason\":\"length\"' '$W/stream' && tail -n 3 '$W/stream' | grep -q 'data: \[DONE\]'"
ok "the log says drain, then drained" bash -c \
	"grep -n 'Got .*, stopping: draining' '$W/log' | cut -d: -f1 >'$W/l1'; grep -n 'Drained: every request' '$W/log' | cut -d: -f1 >'$W/l2'; [ -s '$W/l1' ] && [ -s '$W/l2' ] && [ \$(cat '$W/l1') -lt \$(cat '$W/l2') ]"

# past drain_grace the rest is cancelled
rm -f "$W"/r.*
start -c "$W/c.cfg" --node node03 --context-length 512 --max-running 1 --drain-grace 300ms
burst 60 "$BODY"
sleep 0.3
t0=$(date +%s%N)
kill -TERM "$PID"
wait "$PID"; rc=$?; PID=
t1=$(date +%s%N)
wait $CPIDS
ok "drain grace over: exit 0" test "$rc" = 0
ok "  ... within the grace, not after every request ($(( (t1 - t0) / 1000000 )) ms)" test $(( (t1 - t0) / 1000000 )) -lt 1500
ok "  ... the log says how many were cancelled" grep -q "Drain grace over: cancelling [0-9]* running and [1-9][0-9]* waiting" "$W/log"
n200=$(tail -qn1 "$W"/r.* | grep -c '^200$')
ok "  ... not every request finished ($n200 of 60)" test "$n200" -lt 60

# ---- the unit
unit=services/units/kiln-inferd.service
ok "unit: Type=notify, WatchdogSec, sandboxed as kiln-healthd's" bash -c "grep -qx 'Type=notify' $unit && grep -q '^WatchdogSec=' $unit && for k in NoNewPrivileges ProtectSystem ProtectHome PrivateTmp; do grep -q \"^\$k=\" $unit || exit 1; done"
ok "unit: TimeoutStopSec above the default drain_grace" bash -c "
	g=\$('$KILN' show --defaults | awk '\$1 == \"inference.drain_grace\" { gsub(/[\"s]/, \"\", \$3); print \$3 }')
	t=\$(sed -n 's/^TimeoutStopSec=\\([0-9]*\\)s\$/\\1/p' $unit); [ -n \"\$g\" ] && [ -n \"\$t\" ] && [ \$t -gt \$g ]"
if command -v systemd-analyze >/dev/null; then
	mkdir -p "$W/units" "$W/man/man8"
	ln -s "$PWD/docs/man/kiln-inferd.8" "$W/man/man8/"
	sed "s|^ExecStart=.*|ExecStart=$PWD/$BIN|" "$unit" >"$W/units/kiln-inferd.service"
	cp "${unit%.service}.socket" "$W/units/kiln-inferd.socket"
	if MANPATH=$W/man systemd-analyze verify "$W/units/kiln-inferd.service" "$W/units/kiln-inferd.socket" >"$W/verify.txt" 2>&1; then
		ok "systemd-analyze verify kiln-inferd.service kiln-inferd.socket" true
	elif grep -qiE "Failed to (connect|initialize)|System has not been booted|Failed to setup" "$W/verify.txt"; then
		skip "systemd-analyze cannot run here: $(head -1 "$W/verify.txt")"
	else
		ok "systemd-analyze verify kiln-inferd.service" false
		sed 's/^/# /' "$W/verify.txt"
	fi
else
	skip "systemd-analyze not installed"
fi
tap_done
