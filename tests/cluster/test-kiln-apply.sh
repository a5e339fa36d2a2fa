#!/bin/bash
# test-kiln-apply.sh — `kiln apply` on a real configless Slurm cluster
# (cluster.sh with KILN_CLUSTER_CONFIGLESS=1: slurmctld serves the files,
# every slurmd runs with --conf-server): a file slurmctld refuses changes
# nothing; a partition change is a reconfigure that reaches the slurmds; a
# node added or removed restarts slurmctld and every slurmd; a health
# threshold only publishes the file and restarts kiln-healthd on the nodes;
# users and groups re-run kiln-node-init and are applied on the head node
# (systemd-sysusers into a scratch root);
# an apply whose restart failed is finished by the next one; the published
# file is signed by image.signing_key (and nothing changes without the
# key); and a job that runs through all of it survives.  Prints TAP.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
export KILN_BUILD=$B
W=$(mktemp -d /tmp/kiln-apply-test.XXXXXX)
D=$W/c
trap '"$here/cluster.sh" down "$D" >/dev/null 2>&1; rm -rf "$W"' EXIT

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
	skip "slurmctld/munged not installed (make deps)"; tap_done; exit
fi

CFG=$W/cluster.cfg
mkdir -p "$D"
sed "s|@DIR@|$D|g" "$here/apply.cfg.in" >"$CFG"
"$KILN" -q keygen --key "$D/head.key" >/dev/null # image.signing_key

# the head node's accounts go to a scratch root (systemd-sysusers --root)
mkdir -p "$W/sysroot/etc" # (sysusers.d/ made by apply, as on a Debian head node)
# apply [OPTIONS]: kiln apply in the head node's namespace against the test
# cluster; output in $W/out, exit status in $rc
apply() {
	$KC_HUB env SLURM_CONF="$D/etc/slurm.conf" "$KILN" apply -c "$CFG" --slurm-dir "$D/etc" \
		--publish "$D/pub/cluster.cfg" --restart-slurmctld "$here/cluster.sh restart-ctld $D" \
		--on-nodes "$here/on-nodes.sh $D" --sysusers-conf "$W/sysroot/etc/sysusers.d/kiln-users.conf" \
		--sysusers "systemd-sysusers --root=$W/sysroot" "$@" >"$W/out" 2>&1
	rc=$?
	sed 's/^/#   /' "$W/out"
}
said() { grep -qF -- "$1" "$W/out"; }
ctld_pid() { cat "$D/run/%n/slurmctld.pid"; }
job_running() { [ "$($KC_HUB squeue -h -j "$jid" -o %T 2>/dev/null)" = RUNNING ]; }
hub() { $KC_HUB env SLURM_CONF="$D/etc/slurm.conf" "$@"; }

KILN_CLUSTER_CONFIGLESS=1 "$here/cluster.sh" up "$D" "$CFG" >"$W/up.log" 2>&1
check "configless test cluster comes up (3 slurmds with --conf-server)" $?
. "$D/env.sh"
grep -q '^SlurmctldParameters=enable_configless$' "$D/etc/slurm.conf" &&
	[ -s "$D/spool/node01/conf-cache/slurm.conf" ]
check "slurm.conf enables configless; node01's slurmd fetched its conf-cache" $?

apply
ok "the same file again: exit 0, nothing to do" test "$rc" = 0
ok "  ... says so" said "Nothing to do"
ok "  ... but signs the published copy, which had no signature (cluster.sh copied it)" \
	bash -c "said() { grep -qF -- \"\$1\" '$W/out'; }; said 'signed: $D/pub/cluster.cfg.sig (it had no signature)' &&
		'$KILN' -q verify --key '$D/head.pub' '$D/pub/cluster.cfg'"

jid=$(hub sbatch --parsable -N1 -w node01 -o /dev/null --wrap 'sleep 600')
for _ in $(seq 50); do job_running && break; sleep 0.2; done
ok "a sleep job runs on node01 (job $jid)" job_running

# ---- a file slurmctld refuses ------------------------------------------------
cp "$CFG" "$W/good.cfg"
sed -i 's|"MailProg=/bin/true"|"MailProg=/bin/true", "NoSuchKey=1"|' "$CFG"
cp "$D/etc/slurm.conf" "$W/live-before"
apply
ok "slurm.extra with a key slurmctld does not know: exit 2" test "$rc" = 2
ok "  ... slurmctld's own words: unrecognized key NoSuchKey" said "unrecognized key: NoSuchKey"
ok "  ... the live slurm.conf is untouched" cmp -s "$W/live-before" "$D/etc/slurm.conf"
cp "$W/good.cfg" "$CFG"

# ---- change a partition -------------------------------------------------------
pid0=$(ctld_pid)
sed -i 's/max_time = "1h"/max_time = "2h"/' "$CFG"
apply --dry-run
ok "partition max_time, --dry-run: exit 0" test "$rc" = 0
ok "  ... says: partition batch changed -> scontrol reconfigure" said "partition batch changed (now: PartitionName=batch Nodes=node[01-03] Default=YES MaxTime=0-02:00:00 State=UP) -> scontrol reconfigure"
ok "  ... and changes nothing (slurmctld still says 1:00:00)" sh -c "$KC_HUB scontrol show partition batch | grep -q 'MaxTime=01:00:00'"
apply
ok "partition max_time: applied (exit 0)" test "$rc" = 0
ok "  ... slurmctld says MaxTime=02:00:00" sh -c "$KC_HUB scontrol show partition batch | grep -q 'MaxTime=02:00:00'"
ok "  ... the reconfigure reached node02's slurmd (its conf-cache)" grep -q 'MaxTime=0-02:00:00' "$D/spool/node02/conf-cache/slurm.conf"
ok "  ... slurmctld was not restarted" test "$(ctld_pid)" = "$pid0"
ok "  ... the job still runs" job_running

# ---- add a node ------------------------------------------------------------------
sed -i 's/node\[01-03\]/node[01-04]/; s/10.78.0.11-10.78.0.13/10.78.0.11-10.78.0.14/; s/"52:54:00:78:00:13" \]/"52:54:00:78:00:13", "52:54:00:78:00:14" ]/' "$CFG"
: >"$D/on-nodes.log"
apply
ok "add node04: applied (exit 0)" test "$rc" = 0
ok "  ... says: node node04 added -> restart slurmctld, then every slurmd" said "node node04 added -> restart slurmctld, then every slurmd"
ok "  ... and that dnsmasq.conf is the admin's to reload" said "dnsmasq.conf (node addresses, MACs or names) -> by hand"
ok "  ... slurmctld was restarted" test "$(ctld_pid)" != "$pid0"
ok "  ... every running slurmd was restarted" grep -qx 'node03: systemctl restart slurmd' "$D/on-nodes.log"
ok "  ... node04 (not booted yet) gets no command; apply says to power it on" \
	sh -c "! grep -q node04 '$D/on-nodes.log' && grep -qF 'to do: power on node04' '$W/out'"
"$here/cluster.sh" add-node "$D" node04 >/dev/null # its PXE boot: slurmd, configless
up4() { [ "$($KC_HUB sinfo -h -N -o '%N %t' | grep -cE ' (idle|alloc|mix)$')" = 4 ]; }
for _ in $(seq 100); do up4 && break; sleep 0.2; done
ok "  ... 4 nodes up in sinfo" up4
ok "  ... the job survived both restarts" job_running
out=$($KC_HUB timeout 30 srun --immediate=20 -w node04 hostname 2>&1)
ok "  ... a job runs on node04 ($out)" test "$out" = node04

# ---- remove it again -----------------------------------------------------------------
pid1=$(ctld_pid)
sed -i 's/node\[01-04\]/node[01-03]/; s/10.78.0.11-10.78.0.14/10.78.0.11-10.78.0.13/; s/, "52:54:00:78:00:14" \]/ ]/' "$CFG"
: >"$D/on-nodes.log"
apply
ok "remove node04: applied (exit 0)" test "$rc" = 0
ok "  ... says: node node04 removed -> restart slurmctld, then every slurmd" said "node node04 removed -> restart slurmctld, then every slurmd"
ok "  ... node04's slurmd stopped, the others restarted" sh -c "grep -qx 'node04: systemctl stop slurmd' '$D/on-nodes.log' && grep -qx 'node03: systemctl restart slurmd' '$D/on-nodes.log' && ! grep -q 'node04: systemctl restart' '$D/on-nodes.log'"
ok "  ... slurmctld was restarted" test "$(ctld_pid)" != "$pid1"
ok "  ... sinfo lists node[01-03]" test "$($KC_HUB sinfo -h -N -o %N | sort -u | xargs)" = "node01 node02 node03"
ok "  ... the job still runs" job_running

# ---- a health threshold: kiln's own key -------------------------------------------
pid2=$(ctld_pid)
sed -i 's/^health = { enabled = false; };/health = { enabled = false; thresholds = { temp_warn_c = 80; }; };/' "$CFG"
: >"$D/on-nodes.log"
apply
ok "health.thresholds.temp_warn_c: applied (exit 0)" test "$rc" = 0
ok "  ... says: restart kiln-healthd on every node" said "cluster file: health.thresholds.temp_warn_c -> publish cluster.cfg, re-run kiln-node-init and restart kiln-healthd on every node"
ok "  ... Slurm needs nothing" said "plan: Slurm: nothing"
ok "  ... the nodes re-run kiln-node-init and restart kiln-healthd" grep -qx 'node02: kiln-node-init && systemctl restart kiln-healthd' "$D/on-nodes.log"
ok "  ... no slurmd touched" sh -c "! grep -q slurmd '$D/on-nodes.log'"
ok "  ... the published cluster.cfg is the new file" cmp -s "$CFG" "$D/pub/cluster.cfg"
ok "  ... signed: cluster.cfg.sig verifies against head.pub (kiln-node-init accepts it)" \
	"$KILN" -q verify --key "$D/head.pub" "$D/pub/cluster.cfg"
ok "  ... slurmctld was not restarted" test "$(ctld_pid)" = "$pid2"

# ---- a restart that fails is owed by the next apply -----------------------------------
sed -i 's/cpus = 1;/cpus = 1; features = [ "ssd" ];/' "$CFG"
$KC_HUB env SLURM_CONF="$D/etc/slurm.conf" "$KILN" apply -c "$CFG" --slurm-dir "$D/etc" \
	--publish "$D/pub/cluster.cfg" --restart-slurmctld false --on-nodes "$here/on-nodes.sh $D" >"$W/out" 2>&1
rc=$?
sed 's/^/#   /' "$W/out"
ok "a node feature with a failing slurmctld restart: exit 1" test "$rc" = 1
ok "  ... the plan is kept in .kiln-apply-pending" test -s "$D/etc/.kiln-apply-pending"
apply
ok "the next apply: exit 0" test "$rc" = 0
ok "  ... finishes it (restart slurmctld, then every slurmd)" said "a previous kiln apply did not finish"
ok "  ... slurmctld has the feature" sh -c "$KC_HUB scontrol show node node02 | grep -q 'AvailableFeatures=ssd'"
ok "  ... and nothing is pending" test ! -e "$D/etc/.kiln-apply-pending"
# ---- without --on-nodes the node commands are printed, not run --------------------
sed -i 's/temp_warn_c = 80;/temp_warn_c = 75;/' "$CFG"
: >"$D/on-nodes.log"
$KC_HUB env SLURM_CONF="$D/etc/slurm.conf" "$KILN" apply -c "$CFG" --slurm-dir "$D/etc" \
	--publish "$D/pub/cluster.cfg" >"$W/out" 2>&1
rc=$?
sed 's/^/#   /' "$W/out"
ok "no --on-nodes: exit 0, prints what to run on which nodes" \
	bash -c "[ $rc = 0 ] && grep -qxF 'to do: on node[01-03] run: kiln-node-init && systemctl restart kiln-healthd' '$W/out'"
ok "  ... and runs nothing there" test ! -s "$D/on-nodes.log"

# ---- no signing key: nothing changes ---------------------------------------------------
mv "$D/head.key" "$D/head.key.away"
cp "$D/pub/cluster.cfg" "$W/pub-before" && cp "$D/etc/slurm.conf" "$W/live-before"
sed -i 's/temp_warn_c = 75;/temp_warn_c = 70;/' "$CFG"
apply
ok "no image.signing_key: exit 2, says kiln keygen and that nothing was changed" \
	bash -c "[ $rc = 2 ] && grep -qF 'kiln keygen' '$W/out' && grep -qF 'Nothing was changed' '$W/out'"
ok "  ... the published file and the live slurm.conf are untouched" \
	bash -c "cmp -s '$W/pub-before' '$D/pub/cluster.cfg' && cmp -s '$W/live-before' '$D/etc/slurm.conf'"
mv "$D/head.key.away" "$D/head.key"
apply
ok "  ... with the key back: applied (exit 0), signed" \
	bash -c "[ $rc = 0 ] && '$KILN' -q verify --key '$D/head.pub' '$D/pub/cluster.cfg'"

# ---- users and groups: the nodes and the head node -----------------------------------
cat >>"$CFG" <<'USERS'
groups = ( { name = "research"; gid = 3000; } );
users = ( { name = "alice"; uid = 2001; groups = [ "research" ]; } );
USERS
: >"$D/on-nodes.log"
apply
ok "users and groups added: applied (exit 0)" test "$rc" = 0
ok "  ... says: the nodes re-run kiln-node-init" said "cluster file: users -> publish cluster.cfg and re-run kiln-node-init on every node"
ok "  ... and the head node's accounts are written and applied" \
	bash -c "grep -qF 'users and groups: $W/sysroot/etc/sysusers.d/kiln-users.conf -> write it and run systemd-sysusers' '$W/out' && grep -q '^done: systemd-sysusers' '$W/out'"
if command -v systemd-sysusers >/dev/null; then
	ok "  ... systemd-sysusers made alice (2001) in research (3000) on the head node" \
		bash -c "grep -q '^alice:x:2001:2001:' '$W/sysroot/etc/passwd' && grep -qx 'research:x:3000:alice' '$W/sysroot/etc/group'"
else
	skip "  ... systemd-sysusers made the accounts (not installed)"
fi
ok "  ... Slurm needs nothing, the nodes run kiln-node-init" \
	bash -c "grep -q 'plan: Slurm: nothing' '$W/out' && grep -qx 'node02: kiln-node-init' '$D/on-nodes.log'"
apply --dry-run
ok "the same file again: nothing to do (the head node's accounts are current)" said "Nothing to do"
rm -f "$W/sysroot/etc/sysusers.d/kiln-users.conf"
apply --dry-run
ok "the head node's accounts file gone: apply writes it again" said "users and groups: $W/sysroot/etc/sysusers.d/kiln-users.conf"
apply

# ---- a switch tree (dry run) ---------------------------------------------------------
cat >>"$CFG" <<'TOPO'
topology = { switches = ( { name = "leaf1"; nodes = "node[01-03]"; } ); };
TOPO
apply --dry-run
ok "topology.switches, --dry-run: exit 0, slurmctld accepts topology/tree" \
	bash -c "[ $rc = 0 ] && grep -q '^validated: slurmctld accepts' '$W/out'"
ok "  ... TopologyPlugin needs slurmctld restarted, the tree a reconfigure" \
	bash -c "grep -qF 'slurm.conf: TopologyPlugin=topology/tree added -> restart slurmctld, then every slurmd' '$W/out' && grep -qF 'topology.conf changed -> scontrol reconfigure' '$W/out'"
ok "the job ran through every change" job_running
hub scancel "$jid"
tap_done
