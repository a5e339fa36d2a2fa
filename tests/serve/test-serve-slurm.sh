#!/bin/bash
# test-serve-slurm.sh — kiln serve's image.secrets_only_when_down against a
# real Slurm (tests/cluster/cluster.sh: slurmctld in the head's namespace,
# one slurmd per node in its own namespace with the cluster file's
# address).  kiln serve runs on the head's address and asks slurmctld
# through libkiln-slurm; each node asks as root (a privileged source port)
# from its own namespace, as kiln-node-init does:
#   node01 idle in Slurm:                  refused (403), logged with its state;
#   node02 set down by the admin:          its munge key;
#   node03 after `scontrol reboot`:        its munge key (rebooting counts as down).
# Prints TAP.
set -u
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
export KILN_BUILD=$B
W=$(mktemp -d /tmp/kiln-serve-slurm.XXXXXX)
serve_pid=''
cleanup() {
	[ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null
	wait 2>/dev/null
	[ -f "$W/c/ns" ] && "$top/tests/cluster/cluster.sh" down "$W/c" >/dev/null 2>&1
	rm -rf "$W"
}
trap cleanup EXIT
for t in slurmctld slurmd munged curl; do
	command -v $t >/dev/null || { skip "$t not installed (make deps)"; tap_done; exit; }
done
[ "$(id -u)" = 0 ] || { skip "needs root (namespaces, privileged ports)"; tap_done; exit; }

mkdir -p "$W/img"
printf 'k\n' >"$W/img/vmlinuz"
(umask 077 && head -c 1024 /dev/urandom >"$W/munge.key")
CFG=$W/cluster.cfg
sed '/^health = {/,$d' "$top/config/examples/demo.cfg" >"$CFG"
cat >>"$CFG" <<EOF
image = { output_dir = "$W/img"; http_url = "http://10.77.0.1:8080/kiln"; munge_key = "$W/munge.key";
          secrets_only_when_down = true; };
EOF
"$top/tests/cluster/cluster.sh" up "$W/c" "$CFG" >"$W/up.log" 2>&1
r=$?
check "the test cluster comes up (3 nodes)" $r
[ $r -eq 0 ] || { sed 's/^/# /' "$W/up.log"; tap_done; exit; }
# shellcheck disable=SC1091
. "$W/c/env.sh"
for _ in $(seq 100); do
	[ "$($KC_HUB sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = 3 ] && break
	sleep 0.1
done
diag "Slurm: $($KC_HUB sinfo -h -N -o '%N %t' | tr '\n' ' ')"

$KC_HUB "$KILN" -c "$CFG" serve >"$W/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 100); do
	$KC_HUB curl -s -o /dev/null http://10.77.0.1:8080/kiln/boot.ipxe && break
	sleep 0.05
done
ask() { # NODE: root on NODE asks for the munge key; body in $W/NODE.body, status printed
	local v=KC_EXEC_$1
	${!v} curl -s --local-port 600-1023 -o "$W/$1.body" -w '%{http_code}' http://10.77.0.1:8080/kiln/secret/munge.key
}
c=$(ask node01)
ok "node01, idle in Slurm: 403" test "$c" = 403
ok "  ... the answer and the log say Slurm lists it up (idle)" bash -c \
	"grep -q 'Slurm lists the node as up (idle' '$W/node01.body' && grep -q 'secret refused: 10.77.0.11:[0-9]* (node node01) GET /kiln/secret/munge.key: Slurm lists the node as up (idle' '$W/serve.log'"
# A slurmd that registers just after the cluster came up returns an admin's
# DOWN to idle (ReturnToService=2); set it again until Slurm keeps it down.
for i in $(seq 20); do
	$KC_HUB scontrol update nodename=node02 state=down reason="serve-test: reprovision"
	case $($KC_HUB sinfo -h -n node02 -N -o '%t' 2>/dev/null) in down*) ;; *) sleep 0.3; continue ;; esac
	c=$(ask node02)
	[ "$c" = 200 ] && break
	sleep 0.3
done
[ "$i" = 1 ] || diag "node02 set down $i times (slurmd's registration returned it to service)"
ok "node02, set down by the admin: 200 and the key" bash -c "[ '$c' = 200 ] && cmp -s '$W/node02.body' '$W/munge.key'"
$KC_HUB scontrol reboot nextstate=resume reason="serve-test" node03 >/dev/null 2>&1
c=$(ask node03)
ok "node03, reboot requested (scontrol reboot): 200 and the key" bash -c "[ '$c' = 200 ] && cmp -s '$W/node03.body' '$W/munge.key'"
diag "Slurm: $($KC_HUB sinfo -h -N -o '%N %t' | tr '\n' ' ')"
kill "$serve_pid"
wait "$serve_pid"
ok "SIGTERM: exit 0" test $? = 0
serve_pid=''
tap_done
