#!/bin/bash
# test-daemon-ports.sh — issue 31's port squatting, as an exploit that
# worked and now fails.  A user (nobody, through setpriv) binds a daemon's
# port first and answers its clients (squatter.py: fake /health and
# /metrics, and every Authorization header written down).
#   kiln-inferd by hand: it binds BEFORE loading its model, so it finds a
#     squatter at once (exit 1 in well under 2 s, the port and "user nobody"
#     named, no model loaded) and, once it holds the port, the squatter is
#     refused while the model loads (a FIFO as the model: a load that never
#     ends); /health answers 503 "loading" and the API 503 model_loading
#     meanwhile, and SIGTERM then stops it at once.  (The old kiln-inferd
#     loaded the model first: "loaded" was logged before it found the port
#     taken, and while it loaded the squatter bound the port.)
#   kiln-inferd socket-activated (systemd-socket-activate, as systemd does
#     with kiln-inferd.socket), running as nobody: the port is held from the
#     start, the squatter is refused, the passed socket serves /health and a
#     completion, and the squatter's key file stays empty.  (The old
#     kiln-inferd ignored the passed socket and exited: port in use.)
#   kiln-healthd the same on the fake NVML: a squatter makes it exit 1 at
#     once naming nobody; socket-activated, it serves the passed socket and
#     the squatter is refused.
# KILN_INFERD_BIN / KILN_HEALTHD_BIN run the suite against other binaries
# (an older build, to see the exploit work).  Root (setpriv to nobody),
# python3, curl, systemd-socket-activate.  Prints TAP.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
# shellcheck source=tests/lib/fixture.sh
. "$top/tests/lib/fixture.sh"
INFERD=${KILN_INFERD_BIN:-$B/bin/kiln-inferd}
HEALTHD=${KILN_HEALTHD_BIN:-$B/bin/kiln-healthd}
FAKE=$B/lib/fake-nvml/libnvidia-ml.so.1
for t in /usr/bin/python3 curl setpriv systemd-socket-activate; do
	command -v "$t" >/dev/null || { echo "1..1"; echo "ok 1 # SKIP $t not installed"; exit 0; }
done
for f in "$INFERD" "$HEALTHD" "$FAKE"; do
	[ -e "$f" ] || { echo "1..1"; echo "ok 1 # SKIP $f not built"; exit 0; }
done
[ "$(id -u)" = 0 ] || { echo "1..1"; echo "ok 1 # SKIP needs root (setpriv to nobody)"; exit 0; }
kiln_need_fixture
MODEL=$(readlink -f "$MODEL")
export KK_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1
W=$(mktemp -d /tmp/kiln-daemon-ports.XXXXXX)
chmod 755 "$W"
cp "$here/squatter.py" "$W/"
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# until SECONDS CMD...: CMD every 50 ms until it succeeds
until_ok() {
	local n=$(($1 * 20)) i
	shift
	for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.05; done
	return 1
}

# squat NAME PORT: squatter.py as nobody on 127.0.0.1:PORT (0: any);
# waits for its verdict in $W/NAME.status ("bound P" / "refused E"); sets
# SQ_PORT on success.  Returns 0 when it bound.
squat() {
	local name=$1 port=$2
	: >"$W/$name.status"
	: >"$W/$name.keys"
	chmod 666 "$W/$name.status" "$W/$name.keys"
	(cd "$W" && exec "${NOBODY[@]}" /usr/bin/python3 "$W/squatter.py" 127.0.0.1 "$port" "$W/$name.status" "$W/$name.keys") &
	PIDS+=($!)
	SQ_PID=$!
	until_ok 10 test -s "$W/$name.status" || return 2
	read -r verdict SQ_PORT <"$W/$name.status"
	diag "squatter $name (nobody) on port $port: $verdict $SQ_PORT"
	[ "$verdict" = bound ]
}
# fails CMD...: CMD fails
fails() { ! "$@"; }

# ---- kiln-inferd started by hand, a squatter first ---------------------------
squat inferd1 0
check "a user (nobody) binds a free port first (the exploit's first step)" $?
P=$SQ_PORT
t0=$(now)
"$INFERD" -l 127.0.0.1 -p "$P" --model "$MODEL" >"$W/inferd1.log" 2>&1
rc=$?
t=$(elapsed "$t0")
diag "kiln-inferd exited $rc after ${t}s:"
sed 's/^/#   /' "$W/inferd1.log"
check "kiln-inferd exits 1 on the taken port" "$([ $rc = 1 ]; echo $?)"
ok "... at once (${t}s < 2s)" awk -v t="$t" 'BEGIN { exit !(t < 2) }'
ok "... naming the port and who holds it (user nobody, uid 65534)" \
	grep -q "Port $P (127.0.0.1) is already in use, held by user nobody (uid 65534)" "$W/inferd1.log"
ok "... before loading any model (no 'loaded' line)" fails grep -q ': loaded ' "$W/inferd1.log"
kill "$SQ_PID" 2>/dev/null

# ---- kiln-inferd by hand, the squatter second: bind before load --------------
rm -f "$W/model.fifo"
mkfifo "$W/model.fifo"
P=$(free_port)
"$INFERD" -l 127.0.0.1 -p "$P" --model "$W/model.fifo" >"$W/inferd2.log" 2>&1 &
IPID=$!
PIDS+=($IPID)
# the model's open() blocks on the FIFO: a load that does not end
until_ok 10 grep -q "Listening on port $P" "$W/inferd2.log"
check "kiln-inferd listens while its model loads" $?
squat inferd2 "$P"
check "the squatter cannot bind the port while the model loads" "$([ "$(cat "$W/inferd2.status")" = "refused EADDRINUSE" ]; echo $?)"
code=$(curl -s -o "$W/h" -w '%{http_code}' "http://127.0.0.1:$P/health")
check "/health while loading: 503 loading" "$([ "$code" = 503 ] && grep -qx loading "$W/h"; echo $?)"
code=$(curl -s -o "$W/c" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d '{"model":"x","prompt":"a"}' "http://127.0.0.1:$P/v1/completions")
check "/v1/completions while loading: 503 model_loading" "$([ "$code" = 503 ] && grep -q '"code":"model_loading"' "$W/c"; echo $?)"
t0=$(now)
kill -TERM "$IPID"
until_ok 5 fails kill -0 "$IPID" 2>/dev/null
kill -KILL "$IPID" 2>/dev/null # still loading: the stop did not work
wait "$IPID"
rc=$?
t=$(elapsed "$t0")
check "SIGTERM while loading: exit 0 at once (${t}s)" "$([ $rc = 0 ] && awk -v t="$t" 'BEGIN { exit !(t < 2) }'; echo $?)"

# ---- kiln-inferd socket-activated, as nobody ----------------------------------
P=$(free_port)
systemd-socket-activate -l "127.0.0.1:$P" "${NOBODY[@]}" "$INFERD" -l 127.0.0.1 -p "$P" \
	--model "$MODEL" --name tiny >"$W/inferd3.log" 2>&1 &
IPID=$!
PIDS+=($IPID)
until_ok 10 grep -q "Listening on 127.0.0.1:$P" "$W/inferd3.log"
squat inferd3 "$P"
check "socket-activated: the squatter cannot bind the port" "$([ "$(cat "$W/inferd3.status")" = "refused EADDRINUSE" ]; echo $?)"
until_ok 20 bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$P/health)\" = 200 ]"
check "socket-activated: kiln-inferd serves /health on the passed socket" $?
ok "... and says so" grep -q "Serving on the socket systemd passed" "$W/inferd3.log"
ok "... running as nobody (it needs no privilege)" \
	bash -c "[ \"\$(ps -o user= -p $IPID | tr -d ' ')\" = nobody ]"
curl -s -H 'Authorization: Bearer sk-kiln-test-key' -H 'Content-Type: application/json' \
	-d '{"model":"tiny","prompt":[1,2,3],"max_tokens":4}' "http://127.0.0.1:$P/v1/completions" >"$W/comp"
ok "... a completion is answered by kiln-inferd" grep -q '"object":"text_completion"' "$W/comp"
ok "... and the squatter got no key" test ! -s "$W/inferd3.keys"
kill -TERM "$IPID" 2>/dev/null
wait "$IPID" 2>/dev/null

# ---- kiln-healthd ----------------------------------------------------------------
# the demo cluster with a 127.0.0.1 /metrics on PORT, no Slurm, the fake NVML
healthd_cfg() {
	sed '/^health = {/,$d' config/examples/demo.cfg >"$W/h.cfg"
	cat >>"$W/h.cfg" <<EOC
health = {
  interval = "200ms"; nvml_timeout = "1s"; nvml_library = "$FAKE";
  metrics_address = "127.0.0.1"; metrics_port = $1; drain = false; active_on_start = false;
};
EOC
}
printf 'gpus = ( { }, { }, { }, { } );\n' >"$W/two.scn"
export KILN_FAKE_NVML_SCENARIO=$W/two.scn KILN_HEALTHD_XID_STATE=$W/xid.state
squat healthd1 0
P=$SQ_PORT
healthd_cfg "$P"
t0=$(now)
timeout 20 "$HEALTHD" -c "$W/h.cfg" --node node01 >"$W/healthd1.log" 2>&1
rc=$?
t=$(elapsed "$t0")
diag "kiln-healthd exited $rc after ${t}s:"
sed 's/^/#   /' "$W/healthd1.log"
check "kiln-healthd exits 1 on a squatted /metrics port, at once (${t}s < 2s)" \
	"$([ $rc = 1 ] && awk -v t="$t" 'BEGIN { exit !(t < 2) }'; echo $?)"
ok "... naming the port and who holds it (user nobody)" \
	grep -q "Port $P (127.0.0.1) for /metrics is already in use, held by user nobody (uid 65534)" "$W/healthd1.log"
kill "$SQ_PID" 2>/dev/null

P=$(free_port)
healthd_cfg "$P"
systemd-socket-activate -l "127.0.0.1:$P" "$HEALTHD" -c "$W/h.cfg" --node node01 >"$W/healthd2.log" 2>&1 &
HPID=$!
PIDS+=($HPID)
until_ok 10 grep -q "Listening on 127.0.0.1:$P" "$W/healthd2.log"
squat healthd2 "$P"
check "socket-activated kiln-healthd: the squatter cannot bind the port" "$([ "$(cat "$W/healthd2.status")" = "refused EADDRINUSE" ]; echo $?)"
until_ok 20 bash -c "curl -sf http://127.0.0.1:$P/metrics | grep -q '^kiln_nvml_hung_calls'"
check "... and serves the fake GPUs' /metrics on the passed socket" $?
ok "... and says so" grep -q "socket systemd passed (kiln-healthd.socket)" "$W/healthd2.log"
kill -TERM "$HPID" 2>/dev/null
wait "$HPID" 2>/dev/null
tap_done
