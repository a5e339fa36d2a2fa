#!/bin/bash
# fake-reboot.sh — the RebootProgram of the test cluster (cluster.sh): a node
# "reboots" by restarting its slurmd.  slurmd runs this in the node's
# namespaces with KILN_CLUSTER_DIR in its environment; the hostname is the
# node's name.  The restart is detached, so slurmd can answer slurmctld
# first; the new slurmd reports a boot time after the reboot request
# (fake-uptime.so: sysinfo()'s uptime counts from the restart), as a real
# boot would, else slurmctld would wait for a boot that never comes.
# A file DIR/no-boot-NODE makes the node's "reboot" never come back.
set -u
n=$(hostname)
P=${KILN_CLUSTER_DIR:?not started by cluster.sh}
echo "$(date +%s.%N) $n" >>"$P/reboots.log"
setsid bash -c "
	sleep 0.5
	pid=\$(cat '$P/run/slurmd-$n.pid' 2>/dev/null)
	[ -n \"\$pid\" ] && kill \"\$pid\"
	for _ in \$(seq 50); do kill -0 \"\$pid\" 2>/dev/null || break; sleep 0.1; done
	[ -e '$P/no-boot-$n' ] && exit 0
	sleep \${KILN_FAKE_REBOOT_SECONDS:-1}
	KILN_FAKE_BOOT=\$(date +%s) LD_PRELOAD='$P/fake-uptime.so' slurmd -f '$P/etc/slurm.conf' -N '$n'
" </dev/null >>"$P/reboots.log" 2>&1 &
exit 0
