#!/bin/bash
# demo-status.sh — `make demo`'s last step: `kiln status` of the demo cluster.
#
#   tests/cluster/demo-status.sh CLUSTER/env.sh      (KILN_BUILD = the build dir)
#
# Starts kiln-healthd on every node of the running demo cluster against the
# fake NVML (node02's GPU 2 runs hot, so healthd drains node02), a batch job
# on node01, then shows `kiln status` and its --json summary as the admin
# sees them from the head node, and stops what it started.
set -u
. "$(dirname "$0")/../healthd/lib.sh"
envsh=${1:?usage: demo-status.sh CLUSTER/env.sh}
. "$envsh"
KILN=$B/bin/kiln
demo_scratch kiln-status-demo
write_cfg "$W/cluster.cfg" 'interval = "500ms";'
printf 'gpus = ( { }, { }, { temperature = 96; }, { } );\n' >"$W/hot.scn"
demo_start_healthd "$W/hot.scn"
jid=$($KC_HUB sbatch --parsable -w node01 -o /dev/null --wrap 'sleep 30')
echo "kiln-healthd on $KC_NODES (node02's gpu2 at 96 C); batch job $jid on node01"
# until healthd has drained node02 and the job runs (10 s at most)
for _ in $(seq 100); do
	[[ "$($KC_HUB sinfo -h -N -n node02 -o %T 2>/dev/null)" == drain* ]] &&
		[ "$($KC_HUB squeue -h -j "$jid" -o %T 2>/dev/null)" = RUNNING ] && break
	sleep 0.1
done
printf '$ kiln status\n'
$KC_HUB "$KILN" -c "$W/cluster.cfg" status
echo "(exit status $?: 1 = something needs the admin)"
printf '$ kiln status --json | jq -c .summary\n'
$KC_HUB "$KILN" -c "$W/cluster.cfg" status --json | jq -c .summary
$KC_HUB scancel "$jid"
