#!/bin/bash
# on-nodes.sh — `kiln apply --on-nodes` for the test cluster of cluster.sh:
#
#   on-nodes.sh DIR HOSTLIST COMMAND
#
# plays COMMAND on every node of HOSTLIST the way it would run there:
# "systemctl restart slurmd" / "systemctl stop slurmd" restart or stop the
# node's slurmd in its namespace (its jobs stay); anything else (kiln-node-init,
# kiln-healthd: not run by the test cluster) is only recorded.  Every node
# and command goes to DIR/on-nodes.log, one "NODE: COMMAND" line each.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
P=${1:?DIR} hl=${2:?HOSTLIST} cmd=${3:?COMMAND}
for n in $(scontrol show hostnames "$hl"); do
	echo "$n: $cmd" >>"$P/on-nodes.log"
	case $cmd in
	"systemctl restart slurmd") "$here/cluster.sh" restart-slurmd "$P" "$n" ;;
	"systemctl stop slurmd") "$here/cluster.sh" stop-slurmd "$P" "$n" ;;
	esac
done
