#!/bin/bash
# kiln-run on a real Slurm cluster: slurmctld + 4 slurmd, each node in its
# own network namespace (tests/cluster/cluster.sh, tests/launcher/four.cfg).
#   - sbatch -N4, kiln-run --nnodes 2:4: consistent RANK/WORLD_SIZE; the C
#     worker exchanges the kk id through the store and all-reduces;
#   - an unmodified PyTorch worker (gloo, init_method env://) all-reduces
#     through kiln's store;
#   - 3 of 4 nodes start, the 4th joins later: the job scales up;
#   - SIGKILL one node's agent and workers (cluster.sh kill-node, by PID)
#     mid-run: survivors start a new round within 10 s with a smaller
#     WORLD_SIZE, resume from the checkpoint, and the job exits 0;
#   - kiln-run in the batch script without srun starts itself on every node;
#   - your own srun without KILN_RUN_SECRET: the secret comes through MUNGE;
#   - --requeue: Slurm's SIGUSR1 warning requeues the job through libslurm;
#   - SIGKILL the store host (node01): the store moves to node02, a new
#     round on the survivors resumes from the checkpoint, agents exit 0.
# Needs root (network namespaces), slurmctld/slurmd/munged.  TAP output.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
export KILN_BUILD=$B
KR=$B/bin/kiln-run
W=$B/tests/kiln-run-worker
CFG=$here/four.cfg
work=$(mktemp -d /tmp/kiln-run-slurm.XXXXXX)
chmod 755 "$work"
d=$work/cluster
cleanup() {
	[ -f "$d/ns" ] && "$top/tests/cluster/cluster.sh" down "$d" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "$l" | sed 's/^/# /'; done; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else nok "$name" "command: $*"; fi; }
skip_all() { echo "1..0 # SKIP $1"; exit 0; }

[ "$(id -u)" = 0 ] || skip_all "needs root for network namespaces"
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null ||
	skip_all "slurmctld/slurmd/munged not installed (make deps)"
[ -x "$top/tests/cluster/cluster.sh" ] || skip_all "tests/cluster/cluster.sh missing"
[ -x "$KR" ] && [ -x "$W" ] && [ -x "$B/bin/kiln" ] || { echo "1..1"; echo "not ok 1 - $KR, $W or $B/bin/kiln not built"; exit 1; }

export KILN_CLUSTER_NS=kr$(printf '%04x' $((RANDOM % 65536)))
if ! "$top/tests/cluster/cluster.sh" up "$d" "$CFG" >"$work/up.log" 2>&1; then
	echo "1..1"; echo "not ok 1 - 4-node cluster comes up"; sed 's/^/# /' "$work/up.log" | tail -20; exit 1
fi
ok "4-node Slurm cluster is up"
. "$d/env.sh"

# submit NAME SBATCH_ARGS... -- BODY: writes a batch script, submits it, echoes the job id.
submit() {
	local name=$1; shift
	local args=()
	while [ "$1" != -- ]; do args+=("$1"); shift; done; shift
	{
		echo "#!/bin/bash"
		echo "export KILN_RUN_SECRET=\$($KR --make-secret)"
		echo "KR='$KR -c $CFG'"
		echo "W=$W"
		echo "D=$work/$name"
		echo "$*"
		echo 'echo "job-exit $?"'
	} >"$work/$name.sh"
	mkdir -p "$work/$name"
	chmod 755 "$work/$name.sh"
	$KC_HUB sbatch --parsable "${args[@]}" -o "$work/$name.out" "$work/$name.sh"
}
wait_job() { # NAME SECONDS
	for _ in $(seq $(($2 * 5))); do grep -q '^job-exit' "$work/$1.out" 2>/dev/null && return 0; sleep 0.2; done
	return 1
}
SRUN='srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1'

# 1. sbatch -N4 --nnodes 2:4, C worker: ranks, world, all-reduce.
submit cworker -N4 --no-kill -- "$SRUN \$KR --nnodes 2:4 -- \$W --steps 10 --step-ms 20 --ckpt \$D/ck --log \$D/w.log" >/dev/null
if wait_job cworker 60; then
	check "C worker: job exits 0" grep -qx 'job-exit 0' "$work/cworker.out"
	got=$(grep '^start round 1 ' "$work/cworker/w.log" | awk '{print $5 "/" $7}' | sort -n | tr '\n' ' ')
	check "C worker: RANK 0..7 once each, WORLD_SIZE 8 everywhere" test "$got" = "0/8 1/8 2/8 3/8 4/8 5/8 6/8 7/8 "
	# Ranks follow Slurm node order: node01 has ranks 0,1 ... node04 has 6,7.
	got=$(grep '^start round 1 ' "$work/cworker/w.log" | awk '{print $5 ":" $13}' | sort -n | tr '\n' ' ')
	check "C worker: ranks in Slurm node order" test "$got" = "0:node01 1:node01 2:node02 3:node02 4:node03 5:node03 6:node04 7:node04 "
	check "C worker: all 8 ranks all-reduced 10 steps through kk" test "$(grep -c '^finish round 1 .* steps 10' "$work/cworker/w.log")" -eq 8
	check "C worker: the store is hosted on the first node" grep -q 'Hosting the store on node01' "$work/cworker.out"
else
	nok "C worker job finished within 60 s" "$(tail -n 20 "$work/cworker.out")"
fi

# 1b. In the batch script without srun: kiln-run makes the secret and starts
# itself on every node (srun --no-kill --ntasks-per-node=1).
{
	echo "#!/bin/bash"
	echo "$KR -c $CFG --nnodes 2:4 -- $W --steps 5 --step-ms 20 --log $work/batch/w.log"
	echo 'echo "job-exit $?"'
} >"$work/batch.sh"
mkdir -p "$work/batch"; chmod 755 "$work/batch.sh"
$KC_HUB sbatch --parsable -N4 --no-kill -o "$work/batch.out" "$work/batch.sh" >/dev/null
if wait_job batch 60; then
	check "batch-script mode: one agent per node, 8 ranks finish, job exits 0" bash -c \
		"grep -qx 'job-exit 0' '$work/batch.out' && [ \$(grep -c '^finish round 1 .* world 8 steps 5' '$work/batch/w.log') -eq 8 ]"
	check "batch-script mode: a generated job secret (no fallback warning)" bash -c "! grep -q 'is not set' '$work/batch.out'"
else
	nok "batch-script mode job finished within 60 s" "$(tail -n 20 "$work/batch.out")"
fi

# 1c. Your own srun and no KILN_RUN_SECRET: the agents get the secret from
# the store host through the nodes' munged (docs/kiln-run.md).
# The test cluster's munged listens on DIR/munge/munge.sock (slurm.conf's
# AuthInfo=socket=), not munge's default socket: KILN_RUN_MUNGE_SOCKET.
submit munge -N4 --no-kill -- "unset KILN_RUN_SECRET; export KILN_RUN_MUNGE_SOCKET=$d/munge/munge.sock; $SRUN \$KR --nnodes 2:4 -- \$W --steps 5 --step-ms 20 --log \$D/w.log" >/dev/null
if wait_job munge 60; then
	check "no KILN_RUN_SECRET: 8 ranks finish, job exits 0; 3 agents got the secret through MUNGE" bash -c \
		"grep -qx 'job-exit 0' '$work/munge.out' && [ \$(grep -c '^finish round 1 .* world 8 steps 5' '$work/munge/w.log') -eq 8 ] && [ \$(grep -c 'Got the job secret from the store host through MUNGE' '$work/munge.out') -eq 3 ]"
	grep -qx 'job-exit 0' "$work/munge.out" || tail -n 20 "$work/munge.out" | sed 's/^/# /'
else
	nok "MUNGE job finished within 60 s" "$(tail -n 20 "$work/munge.out")"
fi

# 2. An unmodified PyTorch worker, gloo backend, init_method env://.
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
	submit torch -N4 --no-kill -- "$SRUN \$KR --nnodes 2:4 --nproc-per-node 1 -- /usr/bin/python3 $here/torch-worker.py" >/dev/null
	if wait_job torch 120; then
		check "PyTorch gloo all_reduce on 4 nodes through kiln's store" bash -c \
			"grep -qx 'job-exit 0' '$work/torch.out' && [ \$(grep -c 'torch-ok rank . world 4 sum 10' '$work/torch.out') -eq 4 ]"
	else
		nok "PyTorch job finished within 120 s" "$(tail -n 20 "$work/torch.out")"
	fi
else
	n=$((n + 1)); echo "ok $n # SKIP /usr/bin/python3 has no torch.distributed"
fi

# 3. Scale up: node01-03 start, node04 joins once training runs.
submit scale -N4 --no-kill -- "
$SRUN -N3 -w node[01-03] \$KR --nnodes 2:4 -- \$W --steps 60 --step-ms 100 --ckpt \$D/ck --log \$D/w.log &
for i in \$(seq 300); do grep -q '^step 5 ' \$D/w.log 2>/dev/null && break; sleep 0.1; done
$SRUN -N1 -w node04 \$KR --nnodes 2:4 -- \$W --steps 60 --step-ms 100 --ckpt \$D/ck --log \$D/w.log
wait %1" >/dev/null
if wait_job scale 90; then
	check "scale-up: first round on 3 nodes (WORLD_SIZE 6)" grep -q '^start round 1 rank 0 world 6' "$work/scale/w.log"
	check "scale-up: a later round on all 4 nodes (WORLD_SIZE 8, node04 has ranks 6-7)" \
		grep -qE '^start round [2-9] rank 7 world 8 .*host node04' "$work/scale/w.log"
	check "scale-up: job exits 0" grep -qx 'job-exit 0' "$work/scale.out"
else
	nok "scale-up job finished within 90 s" "$(tail -n 20 "$work/scale.out")"
fi

# 4. SIGKILL node03's agent and workers mid-run.
submit kill -N4 --no-kill -- "$SRUN \$KR --nnodes 2:4 -- \$W --steps 50 --step-ms 100 --ckpt \$D/ck --log \$D/w.log" >/dev/null
for _ in $(seq 600); do grep -q '^step 10 ' "$work/kill/w.log" 2>/dev/null && break; sleep 0.05; done
t0=$(date +%s.%N)
"$top/tests/cluster/cluster.sh" kill-node "$d" node03 >"$work/kill-node.log" 2>&1
t1=""
for _ in $(seq 400); do
	grep -q '^start round [2-9] rank 0 world 6' "$work/kill/w.log" 2>/dev/null && { t1=$(date +%s.%N); break; }
	sleep 0.05
done
if [ -n "$t1" ]; then
	dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
	echo "# SIGKILL of node03 -> new workers running: ${dt}s"
	check "node loss: survivors run a new round with WORLD_SIZE 6 after ${dt}s (< 10 s)" awk -v d="$dt" 'BEGIN { exit !(d < 10) }'
else
	nok "node loss: survivors run a new round with WORLD_SIZE 6" "$(tail -n 20 "$work/kill.out")"
fi
if wait_job kill 90; then
	last=$(grep '^start round' "$work/kill/w.log" | tail -1 | awk '{print $3}')
	check "node loss: the final round has ranks 0..5 of 6 on node01, node02, node04" test \
		"$(grep "^start round $last " "$work/kill/w.log" | awk '{print $5 "/" $7 ":" $13}' | sort -n | tr '\n' ' ')" = \
		"0/6:node01 1/6:node01 2/6:node02 3/6:node02 4/6:node04 5/6:node04 "
	check "node loss: every surviving agent exits 0" bash -c \
		"[ \$(grep -cE 'node0[124]: exiting with status 0' '$work/kill.out') -eq 3 ]"
	check "node loss: the batch job exits 0" grep -qx 'job-exit 0' "$work/kill.out"
	resumed=$(grep "^start round $last rank 0 " "$work/kill/w.log" | awk '{print $NF}')
	check "node loss: workers resumed from the checkpoint at step $resumed (>= 10)" test "${resumed:-0}" -ge 10
	check "node loss: steps 0..49 each ran, all 6 ranks finished 50" bash -c \
		"[ \$(grep '^step ' '$work/kill/w.log' | awk '{print \$2}' | sort -un | wc -l) -eq 50 ] && [ \$(grep -c '^finish round $last .* steps 50' '$work/kill/w.log') -eq 6 ]"
	redone=$(( $(grep -c '^step ' "$work/kill/w.log") - 50 ))
	echo "# steps redone after the loss: $redone"
else
	nok "node-loss job finished within 90 s" "$(tail -n 20 "$work/kill.out")"
fi

# 5. --requeue: Slurm's SIGUSR1 warning requeues the job through libslurm.
jid=$(submit requeue -N2 --no-kill --requeue -- "$SRUN \$KR --nnodes 2:2 --requeue -- sleep 60")
for _ in $(seq 200); do grep -q 'started ranks' "$work/requeue.out" 2>/dev/null && break; sleep 0.1; done
sleep 1
$KC_HUB scancel -s USR1 "$jid"
restarts=""
for _ in $(seq 100); do
	restarts=$($KC_HUB scontrol show job "$jid" 2>/dev/null | sed -nE 's/.*Restarts=([0-9]+).*/\1/p')
	[ "${restarts:-0}" -ge 1 ] && break
	sleep 0.1
done
check "--requeue: SIGUSR1 requeues the job (Restarts=${restarts:-?})" test "${restarts:-0}" -ge 1
check "--requeue: workers were told to checkpoint first" grep -q 'telling workers to checkpoint now' "$work/requeue.out"
$KC_HUB scancel "$jid" 2>/dev/null

# 6. SIGKILL the store host (node01) mid-run.  The batch script would run on
# node01 and die with it, so salloc runs the srun from the hub instead.
# node03 is dead since step 4: node01, node02, node04.  Last, because node01
# stays dead.
mkdir -p "$work/store"
KILN_RUN_SECRET=$($KR --make-secret) timeout 120 $KC_HUB salloc -N3 -w node01,node02,node04 --no-kill --immediate=30 bash -c \
	"$SRUN $KR -c $CFG --nnodes 2:3 -- $W --steps 50 --step-ms 100 --ckpt $work/store/ck --log $work/store/w.log; echo job-exit \$?" \
	>"$work/store.out" 2>&1 &
for _ in $(seq 600); do grep -q '^step 10 ' "$work/store/w.log" 2>/dev/null && break; sleep 0.05; done
check "store-host loss: round 1 on node01, node02, node04 (WORLD_SIZE 6)" grep -q '^start round 1 rank 0 world 6 .*host node01' "$work/store/w.log"
"$top/tests/cluster/cluster.sh" kill-node "$d" node01 >"$work/kill-node01.log" 2>&1
wait_job store 90 || nok "store-host loss: job finished within 90 s" "$(tail -n 20 "$work/store.out")"
last=$(grep '^start round' "$work/store/w.log" | tail -1 | awk '{print $3}')
check "store-host loss: node02 hosts the store now" grep -q 'Hosting the store on node02' "$work/store.out"
check "store-host loss: a new round $last has ranks 0..3 of 4 on node02, node04" test \
	"$(grep "^start round ${last:-0} " "$work/store/w.log" | awk '{print $5 "/" $7 ":" $13}' | sort -n | tr '\n' ' ')" = \
	"0/4:node02 1/4:node02 2/4:node04 3/4:node04 "
check "store-host loss: both surviving agents exit 0" bash -c \
	"[ \$(grep -cE 'node0[24]: exiting with status 0' '$work/store.out') -eq 2 ]"
resumed=$(grep "^start round ${last:-0} rank 0 " "$work/store/w.log" | awk '{print $NF}')
check "store-host loss: workers resumed from the checkpoint at step ${resumed:-?} (>= 10)" test "${resumed:-0}" -ge 10
check "store-host loss: srun exits 0" grep -qx 'job-exit 0' "$work/store.out"
check "store-host loss: all 4 ranks finished 50 steps" test "$(grep -c "^finish round ${last:-0} .* steps 50" "$work/store/w.log")" -eq 4

echo "1..$n"
