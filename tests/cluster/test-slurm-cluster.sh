#!/bin/bash
# test-slurm-cluster.sh — kiln's rendered Slurm configs against the real
# slurmctld/slurmd from Debian: both example cluster files are accepted by
# slurmctld (scontrol show config / show nodes agree with the cluster file),
# and the demo cluster comes up in network namespaces and runs srun and
# sbatch jobs on all three nodes.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
export KILN_BUILD=$B
work=$(mktemp -d /tmp/kiln-slurm-test.XXXXXX)
cleanup() {
	for d in "$work"/*/; do [ -f "$d/ns" ] && "$here/cluster.sh" down "$d" >/dev/null 2>&1; done
	rm -rf "$work"
}
trap cleanup EXIT

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
	skip "slurmctld/munged not installed (make deps)"; tap_done; exit
fi

# --- slurmctld accepts the rendered slurm.conf/gres.conf/cgroup.conf ---
for ex in demo dgx-pod; do
	cfg=$top/config/examples/$ex.cfg
	d=$work/ctld-$ex
	KILN_CLUSTER_KEEP_HEALTH=1 "$here/cluster.sh" ctld "$d" "$cfg" >"$work/ctld-$ex.log" 2>&1
	check "$ex: slurmctld starts on kiln's rendered configs" $?
	. "$d/env.sh"
	conf=$($KC_HUB scontrol show config 2>&1)
	nodes=$($KC_HUB scontrol show nodes 2>&1)
	want_cluster=$(sed -nE 's/^ClusterName=//Ip' "$d/etc/slurm.conf.rendered" | head -1)
	echo "$conf" | grep -qE "^ClusterName += $want_cluster\$"
	check "$ex: scontrol show config reports ClusterName=$want_cluster" $?
	echo "$conf" | grep -qE '^GresTypes += gpu$'
	check "$ex: GresTypes = gpu" $?
	# the GPU-site defaults kiln renders, as slurmctld read them
	echo "$conf" | grep -qE '^PrologFlags += Alloc' &&
		echo "$conf" | grep -qE '^RebootProgram += /usr/sbin/reboot$'
	check "$ex: PrologFlags = Alloc, RebootProgram = /usr/sbin/reboot" $?
	want_mpg=$(sed -nE 's/^DefMemPerGPU=//p' "$d/etc/slurm.conf.rendered")
	[ -n "$want_mpg" ] && echo "$conf" | grep -qiE "DefMemPerGPU[ =:]+$want_mpg\b"
	r=$?; [ $r = 0 ] || diag "$(echo "$conf" | grep -iE 'PerGPU|DefMem|JobDefaults')"
	check "$ex: DefMemPerGPU = $want_mpg" $r
	want_cpg=$(sed -nE 's/^DefCpuPerGPU=//p' "$d/etc/slurm.conf.rendered")
	if [ -n "$want_cpg" ]; then
		echo "$conf" | grep -qiE "DefCpuPerGPU[ =:]+$want_cpg\b"
		check "$ex: DefCpuPerGPU = $want_cpg" $?
	fi
	want_nodes=$(grep -iE '^NodeName=' "$d/etc/slurm.conf.rendered" | grep -vi 'NodeName=DEFAULT' |
		sed -E 's/^NodeName=([^ ]+).*/\1/I' | xargs -n1 scontrol show hostnames | wc -l)
	got_nodes=$(echo "$nodes" | grep -c '^NodeName=')
	[ "$got_nodes" -gt 0 ] && [ "$got_nodes" = "$want_nodes" ]
	check "$ex: scontrol show nodes lists all $want_nodes nodes (got $got_nodes)" $?
	# every node's CPU count and GPU gres as the cluster file says
	bad=0
	while read -r line; do
		spec=$(echo "$line" | sed -E 's/^NodeName=([^ ]+).*/\1/I')
		cpus=$(echo "$line" | sed -nE 's/.* CPUs=([0-9]+).*/\1/Ip')
		gres=$(echo "$line" | sed -nE 's/.* Gres=([^ ]+).*/\1/Ip')
		for n in $(scontrol show hostnames "$spec"); do
			info=$($KC_HUB scontrol show node "$n")
			[ -z "$cpus" ] || echo "$info" | grep -q "CPUTot=$cpus " || { diag "$n: CPUTot != $cpus"; bad=1; }
			[ -z "$gres" ] || echo "$info" | grep -q "Gres=$gres" || { diag "$n: Gres != $gres"; bad=1; }
		done
	done < <(grep -iE '^NodeName=' "$d/etc/slurm.conf.rendered" | grep -vi 'NodeName=DEFAULT')
	check "$ex: every node's CPUs and GPUs match the cluster file" $bad
	# topology.conf: the switch tree, as slurmctld built it
	if grep -q '^TopologyPlugin=topology/tree$' "$d/etc/slurm.conf.rendered"; then
		echo "$conf" | grep -qE '^TopologyPlugin += topology/tree$'
		check "$ex: TopologyPlugin = topology/tree" $?
		topo=$($KC_HUB scontrol show topology 2>&1)
		want_sw=$(grep -c '^SwitchName=' "$d/etc/topology.conf")
		got_sw=$(echo "$topo" | grep -c '^SwitchName=')
		echo "$topo" | grep -qE '^SwitchName=spine Level=1 .*Switches=leaf\[1-4\]' &&
			echo "$topo" | grep -qE '^SwitchName=leaf1 Level=0 .*Nodes=dgx\[01-08\]' &&
			[ "$got_sw" = "$want_sw" ]
		r=$?; [ $r = 0 ] || diag "$topo"
		check "$ex: scontrol show topology: the $want_sw switches of topology.conf, spine above the leaves" $r
	fi
	parts=$($KC_HUB scontrol show partitions -o | sed -nE 's/^PartitionName=([^ ]+).*/\1/p' | sort | xargs)
	want_parts=$(sed -nE 's/^PartitionName=([^ ]+).*/\1/Ip' "$d/etc/slurm.conf.rendered" | sort | xargs)
	[ -n "$parts" ] && [ "$parts" = "$want_parts" ]
	check "$ex: partitions are '$want_parts' (got '$parts')" $?
	grep -q 'error' "$d/log/slurmctld.log" && diag "$(grep error "$d/log/slurmctld.log" | head -5)"
	"$here/cluster.sh" down "$d" >/dev/null 2>&1
done

# --- the demo cluster, with slurmd on every node ---
d=$work/demo
"$here/cluster.sh" up "$d" "$top/config/examples/demo.cfg" >"$work/up.log" 2>&1
check "demo cluster comes up with every node idle" $?
[ $? -eq 0 ] || sed 's/^/# /' "$work/up.log"
. "$d/env.sh"
out=$($KC_HUB timeout 60 srun --immediate=20 -N3 hostname 2>&1 | sort | xargs)
want=$(echo $KC_NODES | xargs -n1 | sort | xargs)
[ "$out" = "$want" ]
check "srun -N3 hostname runs on '$want' (got '$out')" $?
out=$($KC_HUB timeout 60 srun --immediate=20 -N1 --gres=gpu:4 true 2>&1)
check "srun --gres=gpu:4 fits a node with 4 GPUs" $?
out=$($KC_HUB timeout 30 srun --immediate=5 -N1 --gres=gpu:5 true 2>&1)
[ $? -ne 0 ]
check "srun --gres=gpu:5 is refused (nodes have 4)" $?
jid=$($KC_HUB sbatch --parsable -N3 -o "$d/job-%j.out" --wrap 'srun hostname | sort; echo job-done' 2>&1)
check "sbatch -N3 accepted (job $jid)" $?
for _ in $(seq 1 100); do [ -f "$d/job-$jid.out" ] && grep -q job-done "$d/job-$jid.out" && break; sleep 0.2; done
grep -q job-done "$d/job-$jid.out" 2>/dev/null && [ "$(grep -c '^node' "$d/job-$jid.out")" = 3 ]
check "the batch job ran a step on all three nodes" $?
first=${KC_NODES%% *}
"$here/cluster.sh" kill-node "$d" "$first" >/dev/null
ip netns pids "$(cat "$d/ns")-$first" | grep -q .
[ $? -ne 0 ]
check "kill-node leaves no process in $first's namespace" $?
"$here/cluster.sh" down "$d" >/dev/null 2>&1
ns=$(cat "$d/ns")
ip netns list | grep -q "^$ns"
[ $? -ne 0 ]
check "down removes every namespace" $?
tap_done
