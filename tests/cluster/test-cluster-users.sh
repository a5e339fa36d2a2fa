#!/bin/bash
# test-cluster-users.sh — a cluster many people share, on the real Slurm
# test cluster (cluster.sh with KILN_CLUSTER_ACCOUNTS=1: every host has the
# cluster file's users, made by systemd-sysusers from `kiln render
# sysusers`, in a mount namespace of its own):
#   - a job of a user from users[] runs as that uid, with its groups;
#   - the inference partition (node03 serves inference) is closed: alice's
#     `srun -p infer`, with or without the node's GPUs, is refused by
#     slurmctld; bob (in inference.allow_groups) and root get in; opened by
#     hand (AllowGroups=ALL, what kiln rendered before) alice gets the GPUs
#     kiln-inferd uses, so the refusal is the rendered AllowGroups's doing;
#   - a required shared mount, over the network: the head node's namespace
#     serves W/export (OpenSSH's sftp-server behind socat, a user-space file
#     server from Debian), every node mounts what `kiln render mounts` says
#     (What=, Where=, Type=fuse.sshfs, Options=) in its own namespace, and a
#     file written on node01 is read by alice's job on node02; kiln-healthd
#     (fake NVML, real drain through slurmctld) drains node02 with "kiln:
#     mount /home (...) not responding" when its server hangs (SIGSTOP:
#     statfs() blocks, as on a dead hard NFS mount) and "... missing" when
#     the server dies (sshfs exits, the mount goes), and resumes it each
#     time the share is back.
# Not NFS: this machine's kernel has no NFS client (no nfs in
# /proc/filesystems, no modules to load), so an NFS export (nfs-ganesha
# would serve one from a namespace) could not be mounted here.  The check
# and the units do not depend on the type: healthd looks at the mount
# table and statfs().  Prints TAP.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
export KILN_BUILD=$B
HEALTHD=$B/bin/kiln-healthd
FAKE=$B/lib/fake-nvml/libnvidia-ml.so.1
W=$(mktemp -d /tmp/kiln-users-test.XXXXXX)
PIDS=()
cleanup() {
	# a stopped file server would leave the nodes' statfs() hanging
	for p in $(pgrep -x sftp-server); do kill -CONT "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	[ -f "$W/c/ns" ] && "$here/cluster.sh" down "$W/c" >/dev/null 2>&1
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ]; then skip "needs root (network and mount namespaces)"; tap_done; exit; fi
SFTP=/usr/lib/openssh/sftp-server
for t in slurmctld munged nsenter unshare setpriv systemd-sysusers sshfs socat "$SFTP"; do
	command -v $t >/dev/null || { skip "$t not installed (make deps)"; tap_done; exit; }
done
[ -x "$HEALTHD" ] && [ -f "$FAKE" ] || { skip "kiln-healthd or the fake NVML not built"; tap_done; exit; }
# the users' processes (srun, the job) must reach the scratch folder
chmod 755 "$W"

# The demo cluster: node[01-02] in "gpu", node03 the inference node in
# "infer"; two users, two groups, a required /home.
CFG=$W/cluster.cfg
SPORT=$((20000 + RANDOM % 20000)) # the file server's port on the head node
mkdir -p "$W/export" && chmod 755 "$W/export"
sed '/^slurm = {/,$d' "$top/config/examples/demo.cfg" | sed 's/partitions = \[ "gpu" \];/partitions = [ ];/' >"$CFG"
cat >>"$CFG" <<EOF
slurm = {
  partitions = (
    { name = "gpu"; nodes = "node[01-02]"; default = true; },
    { name = "infer"; nodes = "node03"; }
  );
};
health = {
  interval = "200ms";
  recover_after = "2s";
  nvml_library = "$FAKE";
  metrics_port = 9400;
  active_on_start = false;
  watchdog = "0";
};
inference = { enabled = true; nodes = "infer"; model = "/dev/null"; allow_groups = [ "root", "inferops" ]; };
groups = ( { name = "research"; gid = 3000; }, { name = "inferops"; gid = 3001; } );
users = (
  { name = "alice"; uid = 2001; groups = [ "research" ]; },
  { name = "bob"; uid = 2002; groups = [ "inferops" ]; }
);
mounts = ( { what = "10.77.0.1:$W/export"; where = "/home"; type = "fuse.sshfs";
             options = "directport=$SPORT,allow_other"; timeout = "1s"; } );
EOF
"$KILN" -q -c "$CFG" check >"$W/check.log" 2>&1
r=$?
check "the cluster file passes kiln check" $r
[ $r -eq 0 ] || { sed 's/^/# /' "$W/check.log"; tap_done; exit; }
grep -q '^PartitionName=infer .* AllowGroups=root,inferops' <("$KILN" -q -c "$CFG" render slurm.conf)
check "slurm.conf: the infer partition has AllowGroups=root,inferops" $?

export KILN_CLUSTER_ACCOUNTS=1
export KILN_CLUSTER_NS=ku$((RANDOM % 100000))
export KILN_CLUSTER_PORT=$((20000 + RANDOM % 20000))
"$here/cluster.sh" up "$W/c" "$CFG" >"$W/up.log" 2>&1
r=$?
check "the test cluster comes up, every host with the cluster's users" $r
[ $r -eq 0 ] || { sed 's/^/# /' "$W/up.log"; tap_done; exit; }
. "$W/c/env.sh"
chmod 755 "$W/c"
exec_on() { local v=KC_EXEC_$1; shift; ${!v} "$@"; }
# every host in a mount namespace of its own: the mounts below must never
# land on the machine's /home
for n in $KC_NODES; do
	v=KC_EXEC_$n
	[[ "${!v}" == *" --mount="* ]] || { check "node $n has a mount namespace of its own" 1; tap_done; exit 1; }
done
# as USER CMD...: a command of USER (uid, gid and groups from the hub's
# passwd/group, which systemd-sysusers wrote) on the head node
as() {
	local u=$1; shift
	# shellcheck disable=SC2086 # KC_HUB is a command line
	(cd /tmp && $KC_HUB setpriv --reuid="$u" --regid="$u" --init-groups env HOME=/tmp "$@")
}

$KC_HUB getent passwd alice | grep -q '^alice:x:2001:2001:' && $KC_HUB id -Gn bob | grep -qw inferops
check "systemd-sysusers made alice (2001) and bob (in inferops) on the head node" $?

# --- a user's job runs as the user ---
out=$(as alice timeout 60 srun --immediate=20 -p gpu -N1 sh -c 'echo "$(id -u) $(id -g) $(id -G)"' 2>"$W/err")
set -- $out
[ "${1:-}" = 2001 ] && [ "${2:-}" = 2001 ] && [[ " $out " == *" 3000 "* ]]
r=$?; [ $r = 0 ] || diag "$out"
check "alice's srun -p gpu runs as uid 2001, gid 2001, in research (3000): '$out'" $r
out=$(as bob timeout 60 srun --immediate=20 -p gpu -N2 id -un 2>"$W/err" | sort -u | xargs)
[ "$out" = bob ]
check "bob's srun -N2 runs as bob on both nodes (got '$out')" $?

# --- the inference partition is closed ---
out=$(as alice timeout 30 srun --immediate=10 -p infer -N1 true 2>&1)
r=$?
[ $r -ne 0 ] && echo "$out" | grep -qi 'not permitted\|not available\|AllowGroups\|Invalid'
r2=$?; [ $r2 = 0 ] || diag "rc=$r: $out"
check "alice's srun -p infer is refused by slurmctld" $r2
out=$(as alice timeout 30 srun --immediate=10 -p infer --gres=gpu:h100:4 nvidia-smi 2>&1)
r=$?
[ $r -ne 0 ]
check "alice's srun -p infer --gres=gpu:h100:4 (the GPUs kiln-inferd uses) is refused" $?
out=$(as alice timeout 30 sbatch -p infer --wrap true 2>&1)
[ $? -ne 0 ]
check "alice's sbatch -p infer is refused at submission ($out)" $?
out=$(as bob timeout 60 srun --immediate=20 -p infer -N1 sh -c 'echo $(id -u) $(hostname)' 2>"$W/err")
[ "$out" = "2002 node03" ]
check "bob (inferops, in inference.allow_groups) runs on node03 (got '$out')" $?
out=$($KC_HUB timeout 60 srun --immediate=20 -p infer -N1 hostname 2>"$W/err")
[ "$out" = node03 ]
check "root runs on the infer partition (got '$out')" $?
# the exploit as it was: the partition open (no AllowGroups, as kiln
# rendered it before) hands alice node03's GPUs
$KC_HUB scontrol update partitionname=infer allowgroups=ALL
out=$(as alice timeout 60 srun --immediate=20 -p infer --gres=gpu:h100:4 sh -c 'id -u; hostname' 2>"$W/err" | xargs)
[ "$out" = "2001 node03" ]
check "with AllowGroups=ALL (the old rendering) alice gets node03's 4 GPUs: the refusal above is AllowGroups's (got '$out')" $?
$KC_HUB scontrol update partitionname=infer allowgroups=root,inferops

# --- a required shared mount, served by the head node ---
# the file server in the head node's namespace; one sftp-server per
# connection (socat's fork), each knowing its node by SOCAT_PEERADDR
$KC_HUB socat "TCP-LISTEN:$SPORT,bind=$KC_HEAD_ADDR,reuseaddr,fork" "EXEC:$SFTP" 2>"$W/socat.log" &
PIDS+=($!)
for _ in $(seq 50); do $KC_HUB ss -ltn 2>/dev/null | grep -q ":$SPORT " && break; sleep 0.1; done
"$KILN" -q -c "$CFG" render mounts -o "$W/units"
# mount_home NODE: what the rendered unit says, in NODE's namespaces
unit_val() { sed -n "s/^$1=//p" "$W/units/home.mount"; }
mount_home() {
	exec_on "$1" mount -t "$(unit_val Type)" -o "$(unit_val Options)" "$(unit_val What)" "$(unit_val Where)"
}
ok=0
for n in $KC_NODES; do mount_home "$n" 2>>"$W/mount.err" || ok=1; done
[ $ok = 0 ] || diag "$(cat "$W/mount.err")"
exec_on node02 grep -q ' /home .* - fuse.sshfs 10.77.0.1:' /proc/self/mountinfo && ! grep -q ' /home .* fuse.sshfs ' /proc/self/mountinfo
check "every node mounts home.mount (Type=$(unit_val Type), What=$(unit_val What)) in its own namespace, not the machine's" $((ok || $?))
exec_on node01 sh -c 'echo "written on node01" >/home/probe'
out=$(as alice timeout 60 srun --immediate=20 -p gpu -w node02 cat /home/probe 2>"$W/err")
[ "$out" = "written on node01" ]
check "a file node01 wrote to the share is read by alice's job on node02 (got '$out')" $?

node_state() { $KC_HUB scontrol show node "$1" | tr ' ' '\n' | sed -n 's/^State=//p' | head -1; }
node_reason() { $KC_HUB scontrol show node "$1" | sed -n 's/^ *Reason=//p'; }
# server_of NODE: the sftp-server serving NODE's mount
server_of() {
	local a v=KC_ADDR_$1 p
	a=${!v}
	for p in $(pgrep -x sftp-server); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SOCAT_PEERADDR=$a" && { echo "$p"; return; }
	done
}
# wait_state NODE drained|resumed SECONDS: sets took (seconds)
wait_state() {
	local t0 i
	t0=$(date +%s.%N)
	for ((i = 0; i < $3 * 10; i++)); do
		case $2 in
		drained) [[ "$(node_state "$1")" == *DRAIN* ]] && break ;;
		resumed) [[ "$(node_state "$1")" != *DRAIN* ]] && break ;;
		esac
		sleep 0.1
	done
	took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	[ $i -lt $(($3 * 10)) ]
}
printf 'gpus = ( { }, { }, { }, { } );\n' >"$W/healthy.scn"
# the daemon runs in node02's namespaces, and PID 1 here is the machine's: it reads
# its own mount table, not PID 1's (its default on a node)
KILN_FAKE_NVML_SCENARIO=$W/healthy.scn KILN_HEALTHD_XID_STATE=$W/node02.xid SLURM_CONF=$SLURM_CONF \
	KILN_HEALTHD_MOUNTINFO=/proc/self/mountinfo \
	exec_on node02 "$HEALTHD" -c "$CFG" >"$W/healthd.log" 2>&1 &
PIDS+=($!)
sleep 2
[[ "$(node_state node02)" != *DRAIN* ]]
check "node02 with /home mounted and answering: kiln-healthd leaves it in service ($(node_state node02))" $?
mount_up() { exec_on node02 curl -s --max-time 2 http://127.0.0.1:9400/metrics | sed -n 's/^kiln_mount_up{.*mountpoint="\/home".*} //p'; }
[ "$(mount_up)" = 1 ]
check "  ... its /metrics says kiln_mount_up{mountpoint=\"/home\",type=\"fuse.sshfs\"} 1" $?

# the server hangs: statfs() on node02's /home blocks
srv=$(server_of node02)
[ -n "$srv" ] && kill -STOP "$srv"
wait_state node02 drained 10
r=$?
reason=$(node_reason node02)
[ $r = 0 ] && [[ "$reason" == "kiln: mount /home (10.77.0.1:$W/export fuse.sshfs) not responding"* ]]
r=$?; [ $r = 0 ] || diag "server '$srv'; state $(node_state node02) reason '$reason'; $(tail -5 "$W/healthd.log")"
check "node02's file server stopped: drained in $took s (timeout 1 s) with '${reason%% \[*}'" $r
[ -n "$srv" ] && kill -CONT "$srv"
wait_state node02 resumed 15
check "the server answers again: node02 resumed $took s later (recover_after 2 s)" $?

# the server dies: sshfs on node02 exits and its mount goes
srv=$(server_of node02)
[ -n "$srv" ] && kill "$srv"
wait_state node02 drained 10
r=$?
reason=$(node_reason node02)
[ $r = 0 ] && [[ "$reason" == "kiln: mount /home (10.77.0.1:$W/export fuse.sshfs) missing"* ]]
r=$?; [ $r = 0 ] || diag "server '$srv'; state $(node_state node02) reason '$reason'; $(tail -5 "$W/healthd.log")"
check "node02's file server killed: the mount is gone, drained in $took s with '${reason%% \[*}'" $r
[ "$(mount_up)" = 0 ]
check "  ... kiln_mount_up for /home is 0" $?
out=$(as alice timeout 20 srun --immediate=5 -p gpu -w node02 true 2>&1)
[ $? -ne 0 ]
check "no job lands on the drained node02" $?
mount_home node02 2>>"$W/mount.err"
wait_state node02 resumed 15
r=$?; [ $r = 0 ] || diag "state $(node_state node02); $(cat "$W/mount.err"; tail -5 "$W/healthd.log")"
check "/home mounted again: node02 resumed $took s later (recover_after 2 s)" $r
out=$(as alice timeout 60 srun --immediate=20 -p gpu -w node02 sh -c 'id -u; cat /home/probe' 2>"$W/err" | xargs)
[ "$out" = "2001 written on node01" ]
check "alice's job on node02 reads the share again (got '$out')" $?
tap_done
