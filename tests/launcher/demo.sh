#!/bin/bash
# demo.sh — kiln-run's part of `make demo`: on a running test cluster, submit
# an elastic job (sbatch over every node, kiln-run --nnodes 2:N, the C test
# worker training for 60 steps with checkpoints), SIGKILL the last node's
# agent and workers in the middle, and show the job carry on with the
# survivors, resume from its checkpoint and finish with exit 0.
#
#   tests/launcher/demo.sh CLUSTER_DIR/env.sh      (KILN_BUILD = build dir)
#
# The cluster comes from tests/cluster/cluster.sh up; the killed node is
# restarted at the end (cluster.sh start-node) so the cluster stays usable.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
export KILN_BUILD=$B
envsh=${1:?usage: demo.sh CLUSTER_DIR/env.sh}
. "$envsh"
KR=$B/bin/kiln-run
W=$B/tests/kiln-run-worker
nodes=($KC_NODES)
N=${#nodes[@]}
victim=${nodes[$((N - 1))]}
d=$(mktemp -d "$KC_DIR/kiln-run-demo.XXXXXX")
chmod 755 "$d"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
[ -x "$KR" ] && [ -x "$W" ] || { echo "demo.sh: build $KR and $W first (make)" >&2; exit 1; }

cat >"$d/job.sh" <<EOS
#!/bin/bash
export KILN_RUN_SECRET=\$($KR --make-secret)
srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1 \\
	$KR --nnodes 2:$N --nproc-per-node 2 --last-call 2s --grace 10s -- \\
	$W --steps 60 --step-ms 100 --ckpt $d/checkpoint --log $d/train.log
echo "batch job exit status: \$?"
EOS
chmod 755 "$d/job.sh"

say "Submitting an elastic job on $N nodes (${nodes[*]}): kiln-run --nnodes 2:$N --nproc-per-node 2"
jid=$($KC_HUB sbatch --parsable --no-kill -N"$N" -o "$d/job.out" "$d/job.sh") || exit 1
echo "job $jid"
for _ in $(seq 600); do grep -q '^step 15 ' "$d/train.log" 2>/dev/null && break; sleep 0.1; done
say "Training runs (WORLD_SIZE $((2 * N))):"
grep '^start round 1' "$d/train.log" | sort -k5 -n
tail -n 3 "$d/train.log"

say "SIGKILL of $victim: its slurmd, kiln-run agent and workers (by PID)"
t0=$(date +%s.%N)
"$top/tests/cluster/cluster.sh" kill-node "$KC_DIR" "$victim"
for _ in $(seq 300); do grep -q "^start round [2-9] rank 0 world $((2 * (N - 1)))" "$d/train.log" 2>/dev/null && break; sleep 0.05; done
t1=$(date +%s.%N)
say "Survivors started a new round after $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s:"
grep -E '^start round [2-9]' "$d/train.log" | sort -k5 -n

for _ in $(seq 600); do grep -q 'batch job exit status' "$d/job.out" 2>/dev/null && break; sleep 0.2; done
say "What kiln-run said (the job's output, workers' lines prefixed host:rank):"
grep -vE ': step [0-9]+ world' "$d/job.out"
say "Steps: $(grep -c '^step ' "$d/train.log") run for 60 needed (resumed from checkpoint $(grep -E '^start round [2-9] rank 0' "$d/train.log" | awk '{print $NF}'))"

say "Restarting $victim's slurmd"
"$top/tests/cluster/cluster.sh" start-node "$KC_DIR" "$victim" >/dev/null 2>&1 && echo "$victim is back"
grep -q 'batch job exit status: 0' "$d/job.out"
