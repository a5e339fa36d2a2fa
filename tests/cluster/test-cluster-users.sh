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
#   - a required shared mount: every node mounts what `kiln render mounts`
#     says (What=, Where=, Type=, Options=), and kiln-healthd (fake NVML,
#     real drain through slurmctld) drains node02 with "kiln: mount /home
#     (...) missing" when it goes, and resumes it when it is back.
# The mount is a tmpfs, not NFS: this machine's kernel has no NFS client
# (no nfs in /proc/filesystems, no modules to load), so no NFS server, in a
# namespace or not, could be mounted here; a tmpfs is a real mount that can
# go missing, which is all the check looks at (the mount point in the
# node's mount table).  Prints TAP.
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
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	[ -f "$W/c/ns" ] && "$here/cluster.sh" down "$W/c" >/dev/null 2>&1
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ]; then skip "needs root (network and mount namespaces)"; tap_done; exit; fi
for t in slurmctld munged nsenter unshare setpriv systemd-sysusers; do
	command -v $t >/dev/null || { skip "$t not installed (make deps)"; tap_done; exit; }
done
[ -x "$HEALTHD" ] && [ -f "$FAKE" ] || { skip "kiln-healthd or the fake NVML not built"; tap_done; exit; }
# the users' processes (srun, the job) must reach the scratch folder
chmod 755 "$W"

# The demo cluster: node[01-02] in "gpu", node03 the inference node in
# "infer"; two users, two groups, a required /home.
CFG=$W/cluster.cfg
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
  metrics_port = 0;
  active_on_start = false;
  watchdog = "0";
};
inference = { enabled = true; nodes = "infer"; model = "/dev/null"; allow_groups = [ "root", "inferops" ]; };
groups = ( { name = "research"; gid = 3000; }, { name = "inferops"; gid = 3001; } );
users = (
  { name = "alice"; uid = 2001; groups = [ "research" ]; },
  { name = "bob"; uid = 2002; groups = [ "inferops" ]; }
);
mounts = ( { what = "kilnhome"; where = "/home"; type = "tmpfs"; options = "size=16m,mode=0755"; } );
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

# --- a required shared mount ---
"$KILN" -q -c "$CFG" render mounts -o "$W/units"
# mount NODE: what the rendered unit says, in NODE's mount namespace
unit_val() { sed -n "s/^$1=//p" "$W/units/home.mount"; }
mount_home() {
	exec_on "$1" mount -t "$(unit_val Type)" -o "$(unit_val Options)" "$(unit_val What)" "$(unit_val Where)"
}
ok=0
for n in $KC_NODES; do mount_home "$n" 2>>"$W/mount.err" || ok=1; done
[ $ok = 0 ] || diag "$(cat "$W/mount.err")"
exec_on node02 grep -q ' /home .* - tmpfs kilnhome ' /proc/self/mountinfo && ! grep -q ' /home .* kilnhome ' /proc/self/mountinfo
check "every node mounts home.mount's What=/Where=/Type=/Options= in its own mount namespace (not the machine's)" $((ok || $?))

node_state() { $KC_HUB scontrol show node "$1" | tr ' ' '\n' | sed -n 's/^State=//p' | head -1; }
node_reason() { $KC_HUB scontrol show node "$1" | sed -n 's/^ *Reason=//p'; }
printf 'gpus = ( { }, { }, { }, { } );\n' >"$W/healthy.scn"
KILN_FAKE_NVML_SCENARIO=$W/healthy.scn KILN_HEALTHD_XID_STATE=$W/node02.xid SLURM_CONF=$SLURM_CONF \
	exec_on node02 "$HEALTHD" -c "$CFG" >"$W/healthd.log" 2>&1 &
PIDS+=($!)
sleep 2
[[ "$(node_state node02)" != *DRAIN* ]]
check "node02 with /home mounted: kiln-healthd leaves it in service ($(node_state node02))" $?
t0=$(date +%s.%N)
exec_on node02 umount /home
for _ in $(seq 100); do [[ "$(node_state node02)" == *DRAIN* ]] && break; sleep 0.1; done
t1=$(date +%s.%N)
reason=$(node_reason node02)
[[ "$(node_state node02)" == *DRAIN* ]] && [[ "$reason" == "kiln: mount /home (kilnhome tmpfs) missing"* ]]
r=$?; [ $r = 0 ] || diag "state $(node_state node02) reason '$reason'; $(tail -5 "$W/healthd.log")"
check "/home unmounted on node02: drained in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s with '$reason'" $r
out=$(as alice timeout 20 srun --immediate=5 -p gpu -w node02 true 2>&1)
[ $? -ne 0 ]
check "no job lands on the drained node02" $?
mount_home node02
t0=$(date +%s.%N)
for _ in $(seq 150); do [[ "$(node_state node02)" != *DRAIN* ]] && break; sleep 0.1; done
t1=$(date +%s.%N)
[[ "$(node_state node02)" != *DRAIN* ]]
r=$?; [ $r = 0 ] || diag "state $(node_state node02); $(tail -5 "$W/healthd.log")"
check "/home back: node02 resumed $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s later (recover_after 2 s)" $r
out=$(as alice timeout 60 srun --immediate=20 -p gpu -w node02 sh -c 'id -u; stat -c %m /home' 2>"$W/err" | xargs)
[ "$out" = "2001 /home" ]
check "alice's job on node02 sees /home mounted again (got '$out')" $?
tap_done
