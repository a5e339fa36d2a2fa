#!/bin/bash
# demo.sh — `make demo`: kiln's main job on the built-in example cluster.
#
# Validates config/examples/demo.cfg, renders every file kiln generates from
# it, brings the 3-node cluster up for real (slurmctld + a slurmd per node,
# each node in its own network namespace), runs an srun and an sbatch job,
# then the parts later issues add (kiln-healthd draining and resuming a node
# on a failed GPU, kiln-run surviving a lost node, kiln-train and
# kiln-inferd on the tiny260K model fixture the build trained), and tears it all down.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
export KILN_BUILD=$B
CFG=$top/config/examples/demo.cfg
KILN=$B/bin/kiln
DEMO=${KILN_DEMO_DIR:-/tmp/kiln-demo}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

[ "$(id -u)" -eq 0 ] || { echo "make demo needs root (network namespaces, slurmd)"; exit 1; }
"$top/tests/cluster/cluster.sh" down "$DEMO/cluster" >/dev/null 2>&1 || true
rm -rf "$DEMO"; mkdir -p "$DEMO"
trap '"$top/tests/cluster/cluster.sh" down "$DEMO/cluster" >/dev/null 2>&1 || true' EXIT

say "1. validate the cluster file"
run "$KILN" -c "$CFG" check
run "$KILN" -c "$CFG" show nodes

say "2. render what Slurm, dnsmasq and iPXE read"
for t in slurm.conf gres.conf cgroup.conf dnsmasq.conf boot.ipxe hosts; do
	"$KILN" -c "$CFG" render "$t" -o "$DEMO/$t"
	printf '  %-14s %4d lines\n' "$t" "$(wc -l <"$DEMO/$t")"
done
echo "  (in $DEMO)"
sed -n '1,12p' "$DEMO/slurm.conf" | sed 's/^/  | /'
if command -v dnsmasq >/dev/null; then
	mkdir -p "$DEMO/tftp"
	run dnsmasq --test -C "$DEMO/dnsmasq.conf" 2>&1 | sed 's/^/  /' || true
fi

say "3. bring the demo cluster up (real slurmctld + 3 slurmd in network namespaces)"
run "$top/tests/cluster/cluster.sh" up "$DEMO/cluster" "$CFG"
. "$DEMO/cluster/env.sh"
$KC_HUB sinfo -N -o '%N %P %T %G'

say "4. a 3-node srun"
printf '$ srun -N3 hostname\n'
$KC_HUB timeout 60 srun --immediate=20 -N3 -l hostname | sort

say "5. an sbatch job"
jid=$($KC_HUB sbatch --parsable -N3 -o "$DEMO/job-%j.out" --wrap 'echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"; srun -l hostname | sort')
echo "submitted batch job $jid"
for _ in $(seq 1 100); do grep -q node "$DEMO/job-$jid.out" 2>/dev/null && [ "$(grep -c ': node' "$DEMO/job-$jid.out")" -ge 3 ] && break; sleep 0.2; done
sed 's/^/  | /' "$DEMO/job-$jid.out"

if [ -x "$top/tests/healthd/demo.sh" ] && [ -x "$B/bin/kiln-healthd" ]; then
	say "6. kiln-healthd: a GPU fails, the node is drained, then resumed"
	"$top/tests/healthd/demo.sh" "$DEMO/cluster/env.sh"
fi
if [ -x "$top/tests/launcher/demo.sh" ] && [ -x "$B/bin/kiln-run" ]; then
	say "7. kiln-run: an elastic job loses a node and carries on"
	"$top/tests/launcher/demo.sh" "$DEMO/cluster/env.sh"
fi

if [ -x "$B/bin/kiln-train" ] && [ -x "$B/bin/kiln-inferd" ]; then
	say "8. kiln-train fine-tunes a model data-parallel; kiln-inferd serves it, then two models from the cluster file (node03), API keys"
	"$top/tests/demo-models.sh" "$DEMO"
fi

if [ -x "$top/tests/cluster/demo-status.sh" ] && [ -x "$B/bin/kiln-healthd" ]; then
	say "9. kiln status: the cluster at a glance from the head node"
	"$top/tests/cluster/demo-status.sh" "$DEMO/cluster/env.sh"
fi

say "tear down"
"$top/tests/cluster/cluster.sh" down "$DEMO/cluster"
trap - EXIT
echo "demo done"
