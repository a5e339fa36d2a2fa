#!/bin/bash
# kiln-run's elasticity on loopback, no Slurm: several agents on this machine
# play the nodes of an allocation (KILN_RUN_SIM_NODES / KILN_RUN_SIM_NODE_ID,
# every "node" at 127.0.0.1).  SIGKILL one node's agent and workers by PID
# mid-run (a plain node and the store host): survivors start a new round
# within 10 s with a smaller WORLD_SIZE, resume from the checkpoint, exit 0.
# A fourth node joining later scales the job up.  Too few nodes: exit 75
# naming who is missing; a node arriving after the job is full and done:
# exit 76 (rendezvous closed).  The real Slurm version is test-kiln-run-slurm.sh.  TAP.
set -u
# No cluster file: built-in defaults.
# shellcheck source=tests/launcher/local-env.sh
. "$(dirname "$0")/local-env.sh" kiln-run-elastic
W=$(realpath "$B/tests/kiln-run-worker")
export KILN_RUN_SECRET=test-$$-$RANDOM
if [ -e /etc/kiln/cluster.cfg ]; then echo "1..0 # SKIP /etc/kiln/cluster.cfg exists; these tests need no cluster file"; exit 0; fi
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else nok "$name" "command: $*"; fi; }

# A port nobody listens on now (the kernel's pick), so parallel suites do not collide.
port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_agent DIR ID NODES PORT ARGS... -> runs in its own session; pid in DIR/a$ID.pid
start_agent() {
	local dir=$1 id=$2 nodes=$3 p=$4; shift 4
	KILN_RUN_SIM_NODES=$nodes KILN_RUN_SIM_NODE_ID=$id setsid "$KR" --port "$p" "$@" \
		>"$dir/a$id.out" 2>"$dir/a$id.err" </dev/null &
	echo $! >"$dir/a$id.pid"
	pids+=($!)
}
# kill_node DIR ID: SIGKILL the agent and every worker of that "node", by PID.
kill_node() {
	local sid; sid=$(cat "$1/a$2.pid")
	for q in $(ps -o pid= -s "$sid"); do kill -9 "$q" 2>/dev/null; done
}
# wait_rc DIR ID: appends the agent's exit code to $rcs (must run in this shell).
wait_rc() { wait "$(cat "$1/a$2.pid")"; rcs="$rcs$?"; }
now() { date +%s.%N; }

# scenario NAME VICTIM: 4 nodes, --nnodes 2:4, C worker 40 steps of 100 ms.
scenario() {
	local name=$1 victim=$2 d=$T/$1 p; p=$(port)
	mkdir -p "$d"
	for i in 0 1 2 3; do
		start_agent "$d" $i 'sim[1-4]' "$p" --nnodes 2:4 --last-call 2s --nproc-per-node 2 -- \
			"$W" --steps 40 --step-ms 100 --ckpt "$d/ck" --log "$d/w.log"
	done
	# Wait for step 10, then SIGKILL the victim node.
	for i in $(seq 200); do grep -q '^step 10 ' "$d/w.log" 2>/dev/null && break; sleep 0.05; done
	local t0; t0=$(now)
	kill_node "$d" "$victim" 2>/dev/null
	local t1=""
	for i in $(seq 300); do
		if grep -q '^start round [2-9] rank 0 world 6' "$d/w.log" 2>/dev/null; then t1=$(now); break; fi
		sleep 0.05
	done
	rcs=""
	for i in 0 1 2 3; do [ "$i" = "$victim" ] && continue; wait_rc "$d" $i; done
	check "$name: round 1 had WORLD_SIZE 8 with consistent ranks" \
		test "$(grep '^start round 1 ' "$d/w.log" | awk '{print $5}' | sort -n | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 "
	if [ -n "$t1" ]; then
		local dt; dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
		check "$name: survivors started a new round with WORLD_SIZE 6 in ${dt}s (< 10 s)" \
			awk -v d="$dt" 'BEGIN { exit !(d < 10) }'
	else
		nok "$name: survivors started a new round with WORLD_SIZE 6" "$(tail -n 5 "$d"/a*.err)"
	fi
	local last; last=$(grep '^start round' "$d/w.log" | tail -1 | awk '{print $3}')
	check "$name: final round has ranks 0..5 of 6" \
		test "$(grep "^start round $last " "$d/w.log" | awk '{print $5 "/" $7}' | sort -n | tr '\n' ' ')" = "0/6 1/6 2/6 3/6 4/6 5/6 "
	if [ "$rcs" = 000 ]; then ok "$name: the three survivors exit 0"; else
		nok "$name: the three survivors exit 0 (got $rcs)" "$(tail -n 8 "$d"/a*.err)"; fi
	local resumed; resumed=$(grep "^start round $last rank 0 " "$d/w.log" | awk '{print $NF}')
	check "$name: workers resumed from the checkpoint (step $resumed, not 0)" test "${resumed:-0}" -ge 10
	check "$name: every step 0..39 ran, all 40 finished" bash -c \
		"[ \$(grep '^step ' '$d/w.log' | awk '{print \$2}' | sort -un | wc -l) -eq 40 ] && [ \$(grep -c '^finish round $last .* steps 40' '$d/w.log') -eq 6 ]"
	if [ "$victim" = 0 ]; then
		check "$name: the store moved to the next node" grep -q 'Hosting the store on sim2' "$d/a1.err"
	fi
}

scenario plain-node 2
scenario store-host 0

# Scale up: 3 of 4 nodes start, the 4th joins later.
d=$T/scale; mkdir -p "$d"; p=$(port)
for i in 0 1 2; do
	start_agent "$d" $i 'sim[1-4]' "$p" --nnodes 2:4 --last-call 1s -- "$W" --steps 40 --step-ms 100 --ckpt "$d/ck" --log "$d/w.log"
done
for i in $(seq 200); do grep -q '^step 5 ' "$d/w.log" 2>/dev/null && break; sleep 0.05; done
start_agent "$d" 3 'sim[1-4]' "$p" --nnodes 2:4 --last-call 1s -- "$W" --steps 40 --step-ms 100 --ckpt "$d/ck" --log "$d/w.log"
rcs=""; for i in 0 1 2 3; do wait_rc "$d" $i; done
check "scale-up: first round with 3 nodes" grep -q '^start round 1 rank 0 world 3' "$d/w.log"
check "scale-up: a later round with all 4 nodes (WORLD_SIZE 4)" grep -qE '^start round [2-9] rank 3 world 4 .*host sim4' "$d/w.log"
check "scale-up: all agents exit 0" test "$rcs" = 0000

# A worker failure on one node restarts every node; with --exclude-after 1
# that node is left out of the next round.
d=$T/fail; mkdir -p "$d"; p=$(port)
for i in 0 1 2; do
	start_agent "$d" $i 'sim[1-3]' "$p" --nnodes 2:3 --last-call 5s --backoff 100ms --exclude-after 1 -- \
		sh -c 'echo "$TORCHELASTIC_RESTART_COUNT $RANK $WORLD_SIZE $KILN_HOST" >>'"$d"'/env; [ "$KILN_HOST" = sim2 ] && exit 3; sleep 1'
done
rcs=""; for i in 0 1 2; do wait_rc "$d" $i; done
check "worker failure: round 1 ran on 3 nodes" test "$(grep -c '^0 . 3 ' "$d/env")" -eq 3
check "worker failure: every node restarted; sim2 excluded, round 2 on sim1+sim3 (WORLD_SIZE 2)" \
	test "$(grep '^1 ' "$d/env" | sort | tr '\n' ' ')" = "1 0 2 sim1 1 1 2 sim3 "
check "worker failure: the agents exit 0 (sim2's too: the job succeeded without it)" test "$rcs" = 000
check "worker failure: the leader logs the exclusion" grep -q 'Restart 1 of 3' "$d/a0.err"

# Too few nodes: rendezvous timeout, exit 75, names the missing node.
d=$T/timeout; mkdir -p "$d"; p=$(port)
for i in 0 1; do
	start_agent "$d" $i 'sim[1-3]' "$p" --nnodes 3:3 --join-timeout 2s -- true
done
rcs=""; for i in 0 1; do wait_rc "$d" $i; rcs="$rcs "; done
check "join timeout: both agents exit 75" test "$rcs" = "75 75 "
check "join timeout: the message names the missing node" grep -q 'missing:.*node#2' "$d/a1.err"

# A node that arrives while the job already runs at --nnodes MAX never gets a
# round; when the job ends it exits 76 (rendezvous closed) and says why.
d=$T/closed; mkdir -p "$d"; p=$(port)
for i in 0 1; do
	start_agent "$d" $i 'sim[1-3]' "$p" --nnodes 2:2 --last-call 1s -- \
		sh -c 'echo "$RANK $WORLD_SIZE $KILN_HOST" >>'"$d"'/env; sleep 2'
done
for i in $(seq 200); do [ "$(cat "$d/env" 2>/dev/null | wc -l)" = 2 ] && break; sleep 0.05; done
start_agent "$d" 2 'sim[1-3]' "$p" --nnodes 2:2 --last-call 1s -- \
	sh -c 'echo "$RANK $WORLD_SIZE $KILN_HOST" >>'"$d"'/env'
rcs=""; for i in 0 1 2; do wait_rc "$d" $i; rcs="$rcs "; done
check "closed rendezvous: the two members exit 0, the late node exits 76" test "$rcs" = "0 0 76 "
check "closed rendezvous: only sim1 and sim2 ran workers" test "$(sort "$d/env" | tr '\n' ' ')" = "0 2 sim1 1 2 sim2 "
if grep -q 'rendezvous closed before this node got a round' "$d/a2.err"; then
	ok "closed rendezvous: the late node says the rendezvous closed before it got a round"
else
	nok "closed rendezvous: the late node says the rendezvous closed before it got a round" "$(tail -n 5 "$d/a2.err")"
fi

echo "1..$n"
