#!/bin/bash
# test-kiln-reboot.sh — `kiln reboot` on the real Slurm test cluster.  The
# cluster file's slurm.reboot_program is fake-reboot.sh, which "reboots" a
# node by restarting its slurmd with a fresh boot time, so slurmctld sees the
# whole `scontrol reboot ASAP nextstate=RESUME` cycle: drain, wait for jobs,
# reboot issued, node registers again, resumed.
#   - --dry-run prints the waves and changes nothing; usage errors exit 2;
#   - node[01-03] with --wave 2: never more than 2 nodes out of service, the
#     second wave starts only when the first is back, a running job delays
#     its node's reboot until it ends, every node idle at the end;
#   - a node that never comes back: exit 1 at --timeout, later waves not
#     started;
#   - a reboot pending elsewhere counts towards --wave: refused.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
export KILN_BUILD=$B
W=$(mktemp -d /tmp/kiln-reboot-test.XXXXXX)
MON=
cleanup() {
	[ -n "$MON" ] && kill "$MON" 2>/dev/null
	[ -f "$W/c/ns" ] && "$here/cluster.sh" down "$W/c" >/dev/null 2>&1
	[ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
for t in slurmctld munged gcc; do
	command -v $t >/dev/null || { skip "$t not installed (make deps)"; tap_done; exit; }
done

CFG=$W/cluster.cfg
sed "/^slurm = {/a\\  reboot_program = \"$here/fake-reboot.sh\";" "$top/config/examples/demo.cfg" >"$CFG"
"$here/cluster.sh" up "$W/c" "$CFG" >"$W/up.log" 2>&1
r=$?
check "the test cluster comes up with RebootProgram=fake-reboot.sh" $r
[ $r -eq 0 ] || { sed 's/^/# /' "$W/up.log"; tap_done; exit; }
. "$W/c/env.sh"
gcc -shared -fPIC -O2 -o "$W/c/fake-uptime.so" "$here/fake-uptime.c" -ldl
$KC_HUB scontrol show config | grep -q "^RebootProgram *= $here/fake-reboot.sh"
check "slurmctld runs with kiln's RebootProgram" $?

kr() { $KC_HUB "$KILN" -c "$CFG" reboot "$@"; }
reboots() { awk 'NF == 2 && $2 ~ /^node/' "$W/c/reboots.log" 2>/dev/null; }

# --- dry run and usage ---
out=$(kr --dry-run --wave 2 --reason "kernel 6.1.99" 'node[01-03]' 2>&1)
rc=$?
[ $rc = 0 ] && echo "$out" | grep -q '^3 nodes in 2 waves of at most 2' &&
	echo "$out" | grep -q '^wave 1/2: scontrol reboot ASAP nextstate=RESUME reason="kiln reboot: kernel 6.1.99" node\[01-02\]$' &&
	echo "$out" | grep -q '^wave 2/2: .* node03$' && [ -z "$(reboots)" ]
r=$?; check "--dry-run prints both waves, reboots nothing" $r
[ $r = 0 ] || diag "$out"
kr --dry-run node09 >/dev/null 2>"$W/err"
[ $? = 2 ] && grep -q "No node 'node09'" "$W/err"
check "an unknown node: exit 2" $?
kr >/dev/null 2>"$W/err"
[ $? = 2 ] && grep -q "reboot needs NODES" "$W/err"
check "no NODES: exit 2" $?
kr --wave 0 node01 >/dev/null 2>"$W/err"
[ $? = 2 ] && grep -q -- "--wave '0'" "$W/err"
check "--wave 0: exit 2" $?

# --- a rolling reboot of node[01-03], waves of 2, a job on node02 ---
jid=$($KC_HUB sbatch --parsable -w node02 -o /dev/null --wrap 'sleep 4')
for _ in $(seq 50); do [ "$($KC_HUB squeue -h -j "$jid" -o %T)" = RUNNING ] && break; sleep 0.1; done
# sample how many nodes are out of service, every 0.1 s
(while :; do
	echo "$(date +%s.%N) $($KC_HUB sinfo -h -N -o %T 2>/dev/null | grep -cv '^idle$\|^mixed$\|^allocated$')"
	sleep 0.1
done) >"$W/mon" 2>/dev/null &
MON=$!
t0=$(date +%s.%N)
kr --wave 2 --reason test --timeout 60 'node[01-03]' >"$W/out" 2>&1
rc=$?
kill $MON; MON=
check "reboot --wave 2 node[01-03]: exit 0" $rc
[ $rc = 0 ] || diag "$(cat "$W/out")"
grep -q '^rebooted 3 nodes in 2 waves' "$W/out"
check "it says so: rebooted 3 nodes in 2 waves" $?
[ "$(reboots | awk '{print $2}' | xargs)" = "node01 node02 node03" ] ||
	[ "$(reboots | awk '{print $2}' | xargs)" = "node02 node01 node03" ]
r=$?; check "RebootProgram ran once per node, node03 last" $r
[ $r = 0 ] || diag "$(reboots)"
max=$(awk '{ if ($2 > m) m = $2 } END { print m + 0 }' "$W/mon")
[ "$max" -le 2 ] && [ "$max" -ge 1 ]
check "never more than 2 nodes out of service at once (max seen $max)" $?
# node03's reboot starts after node01 and node02 are back: after the job ended
end=$(reboots | awk '$2 == "node02" { print $1 }')
n3=$(reboots | awk '$2 == "node03" { print $1 }')
awk -v a="$end" -v b="$n3" -v t="$t0" 'BEGIN { exit !(a - t >= 3.5 && b > a) }'
check "node02 waited for its job (rebooted $(awk -v a="$end" -v t="$t0" 'BEGIN { printf "%.1f", a - t }') s in), node03 only after" $?
$KC_HUB sinfo -h -N -o '%N %T' | grep -v ' idle$' >"$W/notidle"
check "every node idle again (nextstate=RESUME)" $([ -s "$W/notidle" ]; [ $? = 1 ]; echo $?)
[ -s "$W/notidle" ] && diag "$(cat "$W/notidle")"
grep -qE '^ +[0-9.]+s +node03 +rebooting' "$W/out" || grep -qE '^ +[0-9.]+s +node03 +(reboot-pending|down)' "$W/out"
check "progress lines show node03 going through its reboot" $?

# --- a node that never comes back ---
touch "$W/c/no-boot-node01"
before=$(reboots | wc -l)
t0=$(date +%s%N)
kr --timeout 4 'node[01-02]' >"$W/out" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc = 1 ] && grep -q "node01 is not back within 4s" "$W/out" && grep -q "waves 2..2 not started" "$W/out"
r=$?; check "a node that does not come back: exit 1, named, wave 2 not started" $r
[ $r = 0 ] || diag "$(cat "$W/out")"
[ "$(reboots | tail -n +$((before + 1)) | awk '{print $2}' | xargs)" = node01 ]
check "node02 was not rebooted" $?
[ "$ms" -ge 4000 ] && [ "$ms" -lt 9000 ]
check "bounded by --timeout 4s (${ms} ms)" $?

# --- a pending reboot elsewhere counts towards --wave ---
# node01 is still "rebooting" (never came back): a wave of 1 on node03 would
# make it two nodes down
kr --wave 1 node03 >"$W/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "Refusing to reboot node03: node01 already has a reboot pending" "$W/out" &&
	grep -q "scontrol cancel_reboot node01" "$W/out"
r=$?; check "a reboot pending on node01 + a wave of 1: refused, exit 1, says how to cancel" $r
[ $r = 0 ] || diag "$(cat "$W/out")"
[ "$(reboots | awk '$2 == "node03"' | wc -l)" = 1 ]
check "node03 not rebooted again" $?
# the message's advice: node01's issued reboot cleared (resume), node01 set
# down; node03's wave may go
$KC_HUB scontrol update nodename=node01 state=resume
$KC_HUB scontrol update nodename=node01 state=down reason="dead board"
kr --wave 1 --timeout 30 node03 >"$W/out" 2>&1
rc=$?
check "after node01 state=resume, state=down: node03 reboots (exit $rc)" $rc
[ $rc = 0 ] || diag "$(cat "$W/out")"
tap_done
