#!/bin/bash
# kiln-run on one machine, no Slurm (standalone mode, like torchrun
# --standalone): worker environment, exit codes, restarts, output prefixes,
# process groups, signal forwarding and the grace period, the C worker's
# store + kk all-reduce, and an unmodified PyTorch gloo worker.  TAP output.
set -u
B=${KILN_BUILD:-build}
KR=$B/bin/kiln-run
W=$B/tests/kiln-run-worker
T=$(mktemp -d /tmp/kiln-run-local.XXXXXX)
trap 'rm -rf "$T"' EXIT
unset SLURM_JOB_ID KILN_RUN_SIM_NODES KILN_CONFIG
# No cluster file: built-in defaults.  An empty $KILN_CONFIG means "not
# set" (the default path); a $KILN_CONFIG naming a missing file is an error
# (kiln_cfg_open), so the default path must not exist either.
export KILN_CONFIG=
if [ -e /etc/kiln/cluster.cfg ]; then echo "1..0 # SKIP /etc/kiln/cluster.cfg exists; these tests need no cluster file"; exit 0; fi
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else nok "$name" "command: $*"; fi; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }

if [ ! -x "$KR" ] || [ ! -x "$W" ]; then
	echo "1..1"; echo "not ok 1 - $KR or $W not built"; exit 1
fi

# 1. torchrun-compatible environment, one line per worker.
$KR --nproc-per-node 3 --no-prefix-output -- sh -c 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $ROLE_RANK $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_USE_AGENT_STORE $TORCHELASTIC_RUN_ID ${KILN_RUN_SECRET:-nosecret}"' >"$T/env.out" 2>"$T/env.err"
rc=$?
check "standalone run exits 0" test $rc -eq 0
sort "$T/env.out" >"$T/env.sorted"
check "three workers, ranks 0..2, WORLD_SIZE 3" \
	test "$(awk '{print $1, $2, $3, $4, $5, $6}' "$T/env.sorted" | tr '\n' ';')" = "0 0 3 3 0 0;1 1 3 3 0 1;2 2 3 3 0 2;"
check "MASTER_ADDR/PORT, restart count 0, agent store True, run id" \
	test "$(awk '{print $7, ($8 > 0), $9, $10, $11}' "$T/env.sorted" | sort -u)" = "127.0.0.1 1 0 True standalone"
check "the job secret is not passed to workers" test "$(awk '{print $12}' "$T/env.sorted" | sort -u)" = nosecret

# 1b. Standalone listens on 127.0.0.1 only (docs/kiln-run.md): the store,
# the leader's live socket and the workers' relay on MASTER_PORT, seen by the
# worker while the run is up (the worker's parent is the agent).
if command -v ss >/dev/null; then
	$KR --nproc-per-node 1 --no-prefix-output -- sh -c 'ss -Hltnp | grep "pid=$PPID," | awk "{print \$4}"; echo "store $MASTER_PORT"' >"$T/listen.out" 2>"$T/listen.err"
	port=$(awk '$1 == "store" {print $2}' "$T/listen.out")
	check "standalone: the relay listens on 127.0.0.1:MASTER_PORT" grep -qx "127.0.0.1:$port" "$T/listen.out"
	check "standalone: kiln-run listens on no other address (three sockets, all 127.0.0.1)" \
		test "$(grep -v '^store ' "$T/listen.out" | grep -c '^127\.0\.0\.1:')" = 3 -a "$(grep -vc '^store ' "$T/listen.out")" = 3
else
	skip "ss not installed"
	skip "ss not installed"
fi

# 2. Output prefixes host:rank.
$KR --nproc-per-node 2 -- sh -c 'echo "hello from $RANK"; echo "err $RANK" >&2; printf "partial"' >"$T/pre.out" 2>"$T/pre.err"
h=$(hostname)
check "stdout lines prefixed host:rank" grep -qx "$h:1: hello from 1" "$T/pre.out"
check "stderr lines prefixed host:rank" grep -qx "$h:0: err 0" "$T/pre.err"
check "an unterminated last line is flushed" grep -qx "$h:1: partial" "$T/pre.out"

# 3. Exit code: the first failing worker's code, restarts counted.
$KR --nproc-per-node 2 --max-restarts 0 -- sh -c '[ "$RANK" = 1 ] && exit 7; sleep 5' >/dev/null 2>"$T/fail.err"
rc=$?
check "exit code is the failing worker's (7)" test $rc -eq 7
$KR --nproc-per-node 1 --max-restarts 2 --backoff 50ms --exclude-after 0 --no-prefix-output -- sh -c 'echo "attempt $TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ] && exit 9; exit 0' >"$T/restart.out" 2>"$T/restart.err"
rc=$?
check "restarts within the budget end in success" test $rc -eq 0
check "TORCHELASTIC_RESTART_COUNT counts 0,1,2" test "$(tr '\n' ' ' <"$T/restart.out")" = "attempt 0 attempt 1 attempt 2 "
$KR --nproc-per-node 1 --max-restarts 2 --backoff 100ms --exclude-after 0 -- sh -c 'exit 9' >/dev/null 2>"$T/budget.err"
rc=$?
check "budget spent: exit with the worker's code" test $rc -eq 9
check "budget spent: the message says so" grep -q "restart budget of 2 spent" "$T/budget.err"
start=$EPOCHREALTIME
$KR --nproc-per-node 1 --max-restarts 3 --backoff 200ms --exclude-after 0 -- sh -c 'exit 4' >/dev/null 2>&1
dur=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
# backoffs 200 + 400 + 800 ms = 1.4 s at least
check "exponential backoff between restarts (took ${dur}s >= 1.4s)" awk -v d="$dur" 'BEGIN { exit !(d >= 1.4) }'

# 4. Program that cannot run.
$KR --nproc-per-node 1 --max-restarts 0 -- /nonexistent/prog >/dev/null 2>"$T/noexec.err"
rc=$?
check "missing program exits 127 with a message" bash -c "[ $rc -eq 127 ] && grep -q 'cannot execute' '$T/noexec.err'"

# 5. Usage errors exit 2 with a clear message.
$KR --nnodes 3:2 -- true 2>"$T/u1.err"; rc1=$?
$KR --nproc-per-node 0 -- true 2>"$T/u2.err"; rc2=$?
$KR 2>"$T/u3.err"; rc3=$?
check "bad --nnodes/--nproc-per-node/no program exit 2" test "$rc1$rc2$rc3" = 222
check "usage messages name the option" bash -c "grep -q -- '--nnodes' '$T/u1.err' && grep -q -- '--nproc-per-node' '$T/u2.err' && grep -q 'No program' '$T/u3.err'"
$KR --help >/dev/null && $KR --version | grep -q kiln-run
check "--help and --version" test $? -eq 0

# 6. Signals: SIGTERM forwarded to every worker's process group; grace.
cat >"$T/trap.sh" <<'EOS'
#!/bin/bash
sleep 1000 &
echo $! >"$DIR/child.$RANK"
trap 'echo "term $RANK" >>"$DIR/sig"; exit 0' TERM
trap 'echo "usr1 $RANK" >>"$DIR/sig"' USR1
trap 'echo "usr2 $RANK" >>"$DIR/sig"' USR2
touch "$DIR/ready.$RANK"
while :; do sleep 0.1; done
EOS
chmod +x "$T/trap.sh"
DIR=$T $KR --nproc-per-node 2 -- "$T/trap.sh" >/dev/null 2>"$T/sig.err" &
kp=$!
for i in $(seq 50); do [ -e "$T/ready.0" ] && [ -e "$T/ready.1" ] && break; sleep 0.1; done
kill -USR1 $kp; sleep 0.5; kill -USR2 $kp; sleep 0.5; kill -TERM $kp
wait $kp; rc=$?
check "SIGUSR1 and SIGUSR2 forwarded to every worker" bash -c "grep -c 'usr1' '$T/sig' | grep -qx 2 && grep -c 'usr2' '$T/sig' | grep -qx 2"
check "SIGTERM forwarded; workers that exit 0 make kiln-run exit 0" bash -c "[ $rc -eq 0 ] && grep -c term '$T/sig' | grep -qx 2"
sleep 0.2
alive=0; for f in "$T"/child.*; do kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
check "workers' children got the signal too (own process group)" test $alive -eq 0
check "SIGUSR1 is logged as a checkpoint-now request" grep -q "checkpoint now" "$T/sig.err"

cat >"$T/stubborn.sh" <<'EOS'
#!/bin/bash
trap '' TERM
touch "$DIR/stub.$RANK"
while :; do sleep 0.1; done
EOS
chmod +x "$T/stubborn.sh"
DIR=$T $KR --nproc-per-node 1 --grace 1s -- "$T/stubborn.sh" >/dev/null 2>"$T/grace.err" &
kp=$!
for i in $(seq 50); do [ -e "$T/stub.0" ] && break; sleep 0.1; done
start=$EPOCHREALTIME
kill -TERM $kp; wait $kp; rc=$?
dur=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
check "a worker ignoring SIGTERM is killed after --grace 1s (rc $rc, ${dur}s)" \
	awk -v d="$dur" -v rc=$rc 'BEGIN { exit !(rc == 137 && d >= 0.9 && d < 5) }'

# 7. The C worker: id through the store, kk all-reduce, checkpointed steps.
$KR --nproc-per-node 4 -- "$W" --steps 20 --step-ms 5 --ckpt "$T/ck" --log "$T/w.log" >"$T/w.out" 2>&1
rc=$?
check "C worker: 4 ranks all-reduce through kk CPU backend" \
	bash -c "[ $rc -eq 0 ] && [ \$(grep -c '^finish round 1 rank . world 4 steps 20' '$T/w.log') -eq 4 ]"
check "C worker: checkpoint holds 20 steps" test "$(cat "$T/ck")" = 20

# 7b. SIGUSR1: the workers get the signal and see the store key.
$KR --nproc-per-node 2 -- "$W" --steps 40 --step-ms 50 --log "$T/ck.log" >/dev/null 2>&1 &
kp=$!
for i in $(seq 100); do grep -q '^step 3 ' "$T/ck.log" 2>/dev/null && break; sleep 0.05; done
kill -USR1 $kp; wait $kp; rc=$?
check "SIGUSR1: both workers told to checkpoint, store key kiln/checkpoint_now = 1" \
	bash -c "[ $rc -eq 0 ] && [ \$(grep -c '^checkpoint-now rank . step [0-9]* key 1\$' '$T/ck.log') -eq 2 ]"

# 7c. --health-check: an unhealthy node stays out (here: the only one).
$KR --nproc-per-node 1 --health-check --healthd /bin/true -- true 2>/dev/null
check "--health-check with a healthy node runs the job" test $? -eq 0
$KR --nproc-per-node 1 --health-check --healthd /bin/false --join-timeout 1s -- true 2>"$T/hc.err"
rc=$?
check "--health-check: an unhealthy node is left out (rendezvous timeout 75, says why)" \
	bash -c "[ $rc -eq 75 ] && grep -q 'Health check failed' '$T/hc.err'"

# 8. An unmodified PyTorch worker (gloo, env://) through kiln's store.
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
	timeout 120 $KR --nproc-per-node 2 -- /usr/bin/python3 "$(dirname "$0")/torch-worker.py" >"$T/torch.out" 2>&1
	rc=$?
	check "PyTorch gloo all_reduce through kiln's store (2 ranks)" \
		bash -c "[ $rc -eq 0 ] && [ \$(grep -c 'torch-ok rank . world 2 sum 3' '$T/torch.out') -eq 2 ]"
else
	skip "/usr/bin/python3 has no torch.distributed"
fi

# 9. --nproc-per-node gpu on a machine without GPUs is a clear error.
$KR --nproc-per-node gpu -- true 2>"$T/gpu.err"; rc=$?
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
	skip "this machine has GPUs"
else
	check "--nproc-per-node gpu without GPUs fails clearly" bash -c "[ $rc -ne 0 ] && grep -q 'no GPUs' '$T/gpu.err'"
fi

echo "1..$n"
