#!/bin/bash
# test-kiln-status.sh — `kiln status` against the real Slurm test cluster
# (cluster.sh: slurmctld + one slurmd per node in network namespaces), run
# from the head node's namespace as an admin would:
#   node01  idle, the real kiln-healthd (fake NVML, 4 healthy GPUs), and a
#           stand-in kiln-inferd serving /v1/models (an inference node, in no
#           partition);
#   node02  drained by an admin with a reason, the real kiln-healthd with
#           GPU 2 overheating (unhealthy);
#   node03  runs a batch job; its healthd port is closed (unreachable), then
#           blackholed (a listening socket that never answers): bounded by
#           --timeout.
# Then slurmctld is stopped: reported, still bounded.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
export KILN_BUILD=$B
HEALTHD=$B/bin/kiln-healthd
FAKE=$B/lib/fake-nvml/libnvidia-ml.so.1
W=$(mktemp -d /tmp/kiln-status-test.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	[ -f "$W/c/ns" ] && "$here/cluster.sh" down "$W/c" >/dev/null 2>&1
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

for t in slurmctld munged jq python3 script; do
	command -v $t >/dev/null || { skip "$t not installed (make deps)"; tap_done; exit; }
done
[ -x "$HEALTHD" ] && [ -f "$FAKE" ] || { skip "kiln-healthd or the fake NVML not built"; tap_done; exit; }

# The demo cluster, node01 serving inference (so in no partition), the
# healthd settings of tests/healthd (fast, fake NVML, no Slurm drains).
CFG=$W/cluster.cfg
sed '/^health = {/,$d' "$top/config/examples/demo.cfg" |
	sed 's/partitions = \[ "gpu" \];/partitions = [ ];/; s/nodes = "node\[01-03\]"; default/nodes = "node[02-03]"; default/' >"$CFG"
cat >>"$CFG" <<EOF
health = {
  interval = "200ms";
  nvml_library = "$FAKE";
  metrics_port = 9400;
  active_on_start = false;
  drain = false;
};
inference = {
  enabled = true;
  nodes = "node01";
  address = "0.0.0.0";
  port = 8000;
  model = "$W/tiny.gguf";
  name = "tiny";
};
EOF
"$here/cluster.sh" up "$W/c" "$CFG" >"$W/up.log" 2>&1
r=$?
check "the test cluster comes up (node01 in no partition)" $r
[ $r -eq 0 ] || { sed 's/^/# /' "$W/up.log"; tap_done; exit; }
. "$W/c/env.sh"

printf 'gpus = ( { }, { }, { }, { } );\n' >"$W/healthy.scn"
printf 'gpus = ( { }, { }, { temperature = 96; }, { } );\n' >"$W/hot.scn"
start_healthd() { # NODE SCENARIO
	local v=KC_EXEC_$1
	KILN_FAKE_NVML_SCENARIO=$2 KILN_HEALTHD_XID_STATE=$W/$1.xid ${!v} "$HEALTHD" -c "$CFG" \
		>"$W/healthd-$1.log" 2>&1 &
	PIDS+=($!)
}
start_healthd node01 "$W/healthy.scn"
start_healthd node02 "$W/hot.scn"
# a stand-in for kiln-inferd's GET /v1/models on node01
$KC_EXEC_node01 python3 -c '
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()' &
PIDS+=($!)
$KC_HUB scontrol update nodename=node02 state=drain reason="status-test: bad DIMM"
jid=$($KC_HUB sbatch --parsable -w node03 -o /dev/null --wrap 'sleep 60')
# wait for both healthds to serve /health with their verdict, and the job to run
for _ in $(seq 100); do
	$KC_EXEC_node01 curl -sf --max-time 1 http://10.77.0.11:9400/health 2>/dev/null | grep -q '"healthy"' &&
		$KC_EXEC_node02 curl -sf --max-time 1 http://10.77.0.12:9400/health 2>/dev/null | grep -q '"unhealthy"' &&
		$KC_EXEC_node01 ss -ltn 2>/dev/null | grep -q ':8000 ' &&
		[ "$($KC_HUB squeue -h -j "$jid" -o %T 2>/dev/null)" = RUNNING ] && break
	sleep 0.1
done

# st ARGS...: kiln status from the head node; sets out, rc, ms
st() {
	local t0 t1
	t0=$(date +%s%N)
	out=$($KC_HUB env -u NO_COLOR "$KILN" -c "$CFG" status "$@" 2>"$W/err")
	rc=$?
	t1=$(date +%s%N)
	ms=$(((t1 - t0) / 1000000))
}
jq_ok() { echo "$out" | jq -e "$1" >/dev/null 2>&1; }

# --- node03's port closed ---
st --json --timeout 2
check "exit status 1: a node is drained, unhealthy, unreachable (rc $rc)" $([ $rc = 1 ]; echo $?)
echo "$out" | jq -e . >/dev/null 2>&1
r=$?; check "--json is one JSON document" $r
[ $r = 0 ] || diag "$out $(cat "$W/err")"
jq_ok '.cluster == "demo" and .ok == false and .slurm.reachable == true and
	.summary == {"nodes": 3, "ok": 1, "problems": 2} and ([.nodes[].name] == ["node01","node02","node03"])'
check "top level: cluster, ok false, slurm reachable, summary 3/1/2" $?
jq_ok '.nodes[0] | .ok and .address == "10.77.0.11" and .slurm.state == "idle" and .slurm.jobs == 0 and
	.health.state == "healthy" and .health.gpus == 4 and .health.healthy == 4 and .health.unhealthy == 0 and
	.inference.reachable and .inference.models == ["tiny"]'
r=$?; check "node01: idle, 4/4 GPUs healthy, serves model tiny" $r
[ $r = 0 ] || diag "$(echo "$out" | jq -c '.nodes[0]')"
jq_ok '.nodes[1] | (.ok | not) and .slurm.state == "drained" and .slurm.reason == "status-test: bad DIMM" and
	.health.state == "unhealthy" and .health.unhealthy == 1 and .health.healthy == 3 and
	(.health.reasons | length) >= 1 and (.health.reasons[0] | startswith("gpu2: ")) and .inference == null'
r=$?; check "node02: drained with the admin's reason, 1 unhealthy GPU with its reason" $r
[ $r = 0 ] || diag "$(echo "$out" | jq -c '.nodes[1]')"
jq_ok ".nodes[2] | (.ok | not) and (.slurm.state == \"allocated\" or .slurm.state == \"mixed\") and
	.slurm.jobs == 1 and .slurm.job_ids == [$jid] and .health.reachable == false and
	.health.state == \"unreachable\" and .health.error == \"Connection refused\""
r=$?; check "node03: running job $jid, healthd port closed -> unreachable (Connection refused)" $r
[ $r = 0 ] || diag "$(echo "$out" | jq -c '.nodes[2]')"
[ "$ms" -lt 2000 ]
check "a closed port costs nothing: answered in ${ms} ms (< 2000)" $?

# --- text: no colour into a pipe, colour on a terminal unless NO_COLOR ---
st
echo "$out" | grep -qE '^node02 +10\.77\.0\.12 +drained +0 +3/4 ok,1 bad +unhealthy +"status-test: bad DIMM"'
r=$?; check "text: node02's row (drained, 3/4 ok,1 bad, unhealthy, the reason)" $r
[ $r = 0 ] || diag "$out"
echo "$out" | grep -qE '^node03 .* unreachable +healthd: Connection refused' &&
	echo "$out" | grep -qE '^node01 .* idle .* 4/4 ok +healthy +tiny' &&
	echo "$out" | grep -q '^3 nodes: 1 ok, 2 with problems$'
r=$?; check "text: node01 serves tiny, node03 unreachable, the summary line" $r
[ $r = 0 ] || diag "$out"
echo "$out" | grep -q $'\033'
check "text into a pipe has no escape codes" $([ $? = 1 ]; echo $?)
$KC_HUB env -u NO_COLOR TERM=xterm script -qec "'$KILN' -c '$CFG' status" /dev/null >"$W/tty.out" 2>&1
grep -q $'\033\[1;31munhealthy' "$W/tty.out" && grep -q $'\033\[32mhealthy' "$W/tty.out"
check "on a terminal: unhealthy in red, healthy in green" $?
$KC_HUB env NO_COLOR=1 TERM=xterm script -qec "'$KILN' -c '$CFG' status" /dev/null >"$W/tty.out" 2>&1
grep -q $'\033\[' "$W/tty.out"
check "on a terminal with NO_COLOR set: no colour" $([ $? = 1 ]; echo $?)

# --- text a node supplies is shown, not obeyed by the terminal ---
# (a drain reason anyone with scontrol can set: clear screen, C1 CSI, UTF-8)
$KC_HUB scontrol update nodename=node02 reason="$(printf 'x\033[2J\302\2331m caf\303\251')"
st node02
echo "$out" | grep -q $'\033\|\302\233'
r=$([ $? = 1 ]; echo $?)
echo "$out" | grep -qF '"x\x1b[2J\xc2\x9b1m caf'$'\303\251''"' || r=1
check "text: ESC and C1 in a Slurm reason shown as \\x1b, \\xc2\\x9b; UTF-8 kept" $r
[ $r = 0 ] || diag "$(echo "$out" | od -c | head -20)"
st --json node02
jq_ok '.nodes[0].slurm.reason == "x\u001b[2J\u009b1m caf\u00e9"' && ! echo "$out" | grep -q $'\033'
r=$?; check "--json: the reason as it is, the ESC escaped by JSON" $r
[ $r = 0 ] || diag "$out"
$KC_HUB scontrol update nodename=node02 reason="status-test: bad DIMM"

# --- NODES ---
st --json node01
check "status node01: exit 0 (that node is fine)" $rc
jq_ok '.ok and ([.nodes[].name] == ["node01"])'
check "status node01 lists node01 only" $?
st 'node[01-02]'
[ $rc = 1 ] && [ "$(echo "$out" | grep -c '^node0')" = 2 ]
check "status 'node[01-02]': two rows, exit 1" $?
st node09
[ $rc = 2 ] && grep -q "No node 'node09'" "$W/err"
check "an unknown node: exit 2 and says so" $?
st --timeout 0
[ $rc = 2 ] && grep -q -- "--timeout '0'" "$W/err"
check "--timeout 0: exit 2 with the reason" $?
st node01 node02
[ $rc = 2 ] && grep -q "one hostlist" "$W/err"
check "two NODES arguments: exit 2" $?

# --- a degraded GPU is a warning: the node stays ok ---
printf 'gpus = ( { }, { temperature = 87; }, { }, { } );\n' >"$W/warm.scn"
start_healthd node03 "$W/warm.scn"
hd3=${PIDS[-1]}
for _ in $(seq 100); do
	$KC_EXEC_node03 curl -sf --max-time 1 http://10.77.0.13:9400/health 2>/dev/null | grep -q '"degraded"' && break
	sleep 0.1
done
st --json node03
jq_ok '.ok and .nodes[0].ok and .nodes[0].health.state == "degraded" and .nodes[0].health.degraded == 1 and
	.nodes[0].health.healthy == 3'
r=$([ $? = 0 ] && [ $rc = 0 ]; echo $?); check "node03 with a degraded GPU (87 C): ok, exit $rc" $r
[ $r = 0 ] || diag "$(echo "$out" | jq -c '.nodes[0].health')"
kill "$hd3"; wait "$hd3" 2>/dev/null

# --- a node in the file that Slurm does not know (not rendered/applied yet) ---
sed 's/node\[01-03\]/node[01-04]/; s/10.77.0.11-10.77.0.13/10.77.0.11-10.77.0.14/; s/"52:54:00:77:00:13" \]/"52:54:00:77:00:13", "52:54:00:77:00:14" ]/' "$CFG" >"$W/more.cfg"
out=$($KC_HUB "$KILN" -c "$W/more.cfg" status --json --timeout 1 node04 2>"$W/err")
rc=$?
jq_ok '(.ok | not) and .nodes[0].name == "node04" and .nodes[0].slurm.state == "not-in-slurm" and
	.nodes[0].health.reachable == false'
r=$([ $? = 0 ] && [ $rc = 1 ]; echo $?); check "a node Slurm does not know: not-in-slurm, exit $rc" $r
[ $r = 0 ] || diag "$out $(cat "$W/err")"

# --- node03 blackholed: accepts, never answers ---
$KC_EXEC_node03 python3 -c '
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9400)); s.listen(16)
while True: time.sleep(60)' &
PIDS+=($!)
for _ in $(seq 50); do $KC_EXEC_node03 ss -ltn 2>/dev/null | grep -q ':9400 ' && break; sleep 0.1; done
st --json --timeout 1
jq_ok '.nodes[2].health.reachable == false and .nodes[2].health.error == "no answer within 1s"' &&
	jq_ok '.nodes[0].health.state == "healthy" and .nodes[1].health.state == "unhealthy"'
r=$?; check "node03 blackholed: 'no answer within 1s', the others still answered" $r
[ $r = 0 ] || diag "$(echo "$out" | jq -c '.nodes[2]')"
[ "$ms" -ge 900 ] && [ "$ms" -lt 2500 ]
check "a blackholed node is bounded by --timeout 1: ${ms} ms (900..2500)" $?

# --- slurmctld gone ---
$KC_HUB scancel "$jid" 2>/dev/null
kill "$(cat "$W/c/run/slurmctld.pid")" 2>/dev/null
for _ in $(seq 50); do $KC_HUB scontrol ping 2>/dev/null | grep -q UP || break; sleep 0.1; done
st --json --timeout 1
jq_ok '.ok == false and .slurm.reachable == false and (.slurm.error | length) > 0 and .nodes[0].slurm == null and
	.nodes[0].health.state == "healthy"'
r=$([ $? = 0 ] && [ $rc = 1 ]; echo $?); check "slurmctld down: reported (slurm.reachable false), health still shown, exit $rc" $r
[ $r = 0 ] || diag "$(echo "$out" | jq -c '.slurm, .nodes[0]')"
[ "$ms" -lt 2500 ]
check "slurmctld down is bounded too: ${ms} ms (< 2500)" $?
st
echo "$out" | grep -q '^Slurm: '
check "text names the Slurm problem" $?
tap_done
