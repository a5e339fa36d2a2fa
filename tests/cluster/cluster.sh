#!/bin/bash
# cluster.sh — start and stop a real Slurm cluster (Debian's slurmctld,
# slurmd and munge) from kiln's rendered configuration, on one machine.
#
#   cluster.sh up DIR [CLUSTER.cfg]     munged + slurmctld + one slurmd per node
#   cluster.sh ctld DIR [CLUSTER.cfg]   munged + slurmctld only (config acceptance)
#   cluster.sh down DIR                 stop everything by PID, delete namespaces
#   cluster.sh kill-node DIR NODE       SIGKILL every process in NODE's namespace
#   cluster.sh start-node DIR NODE      (re)start NODE's slurmd
#   cluster.sh restart-slurmd DIR NODE  stop NODE's slurmd (not its jobs), start it
#   cluster.sh stop-slurmd DIR NODE     stop NODE's slurmd (not its jobs)
#   cluster.sh restart-ctld DIR         stop slurmctld, start it on its saved state
#   cluster.sh add-node DIR NODE        a namespace for a node slurm.conf gained, its slurmd
#
# Every slurmd runs in its own network namespace with the address the cluster
# file gives it, on a bridge inside a hub namespace that holds slurmctld at
# the head node's address.  The root namespace gets no addresses or routes,
# so two clusters (even with the same addresses) never collide.  slurm.conf,
# gres.conf, cgroup.conf and topology.conf come from `kiln render`; only what a test run
# must own (paths, ports, users, plugins that need a real node) is replaced.
#
# Environment: KILN_BUILD (build dir holding bin/kiln, default build),
# KILN_CLUSTER_NS (namespace prefix, <= 8 chars; default from DIR),
# KILN_CLUSTER_PORT (slurmctld port, slurmd = +1; default 6817),
# KILN_CLUSTER_KEEP_HEALTH=1 keeps HealthCheckProgram/Prolog/Epilog lines.
# KILN_CLUSTER_CONFIGLESS=1: the cluster file is written for this harness
# (its slurm section points paths, user and plugins into DIR, as
# tests/cluster/apply.cfg.in does), so slurm.conf is kiln's rendering byte
# for byte, in DIR/etc where `kiln apply --slurm-dir DIR/etc` finds it, and
# every slurmd runs configless (--conf-server): what `kiln apply` changes
# reaches them the way it reaches real nodes.
# KILN_CLUSTER_ACCOUNTS=1: every host (the hub and each node) also gets a
# mount namespace of its own, in which /etc/passwd and /etc/group are the
# machine's plus the cluster file's users and groups, made by the real
# systemd-sysusers from `kiln render sysusers` (as kiln-node-init does on a
# node): slurmctld resolves AllowGroups=, slurmd runs jobs as those uids,
# and a test can mount and unmount a node's shares without touching the
# machine's.  KC_HUB and KC_EXEC_<node> enter it.
# DIR/env.sh afterwards defines SLURM_CONF, KC_HUB, KC_NODES, KC_EXEC_<node>,
# KC_ADDR_<node>, KC_HEAD_ADDR and KC_DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
KILN=$B/bin/kiln

die() { echo "cluster.sh: $*" >&2; exit 1; }

cmd=${1:-}; P=${2:-}
[ -n "$cmd" ] && [ -n "$P" ] || die "usage: cluster.sh up|ctld|down|kill-node|start-node|restart-slurmd|stop-slurmd|restart-ctld|add-node DIR [CFG|NODE]"
mkdir -p "$P"; P=$(cd "$P" && pwd)

ns_prefix() {
	if [ -f "$P/ns" ]; then cat "$P/ns"; return; fi
	local ns=${KILN_CLUSTER_NS:-kc$(echo -n "$P" | md5sum | cut -c1-6)}
	[ ${#ns} -le 8 ] || die "KILN_CLUSTER_NS '$ns' is longer than 8 characters"
	echo "$ns" >"$P/ns"; echo "$ns"
}

# Runs a command inside a host's namespaces (network, and a UTS namespace
# whose hostname is the host's name: slurmctld insists on being the host
# SlurmctldHost names, and kiln-healthd takes its node name from it).
# nsenter, not `ip netns exec`: that remounts /sys, hiding /sys/fs/cgroup.
in_ns() {
	local ns=$1; shift
	if [ -e "$P/mnt/$ns" ]; then
		nsenter --net="/run/netns/$ns" --uts="$P/uts/$ns" --mount="$P/mnt/$ns" "$@"
	else
		nsenter --net="/run/netns/$ns" --uts="$P/uts/$ns" "$@"
	fi
}
# How env.sh's KC_HUB and KC_EXEC_<node> enter a host: in_ns's nsenter.
ns_enter() { # (env.sh is written before the nodes' namespaces exist)
	local m=""
	[ -e "$P/accounts" ] && m=" --mount=$P/mnt/$1"
	echo "nsenter --net=/run/netns/$1 --uts=$P/uts/$1$m"
}

# ---- KILN_CLUSTER_ACCOUNTS: the cluster file's users on every host ----------
# DIR/root/etc holds the machine's passwd and group files plus what
# systemd-sysusers made of `kiln render sysusers`; each host's mount
# namespace (DIR/mnt/NS, kept by a bind mount on a private mount of
# DIR/mnt) sees them as /etc/passwd and /etc/group.
make_accounts() {
	local cfg=$1 f
	mkdir -p "$P/root/etc/sysusers.d"
	for f in passwd group shadow gshadow; do
		[ -f "/etc/$f" ] && cp "/etc/$f" "$P/root/etc/$f"
	done
	"$KILN" -c "$cfg" render sysusers -o "$P/root/etc/sysusers.d/kiln-users.conf" || die "kiln render sysusers failed"
	systemd-sysusers --root="$P/root" >"$P/log/sysusers.log" 2>&1 || die "systemd-sysusers failed: $(cat "$P/log/sysusers.log")"
	chmod 644 "$P/root/etc/passwd" "$P/root/etc/group"
	touch "$P/accounts"
	mkdir -p "$P/mnt"
	mountpoint -q "$P/mnt" || { mount --bind "$P/mnt" "$P/mnt" && mount --make-private "$P/mnt"; } ||
		die "cannot make $P/mnt a private mount (needs root)"
}
make_mnt() { # NS: a mount namespace for host NS with the accounts
	[ "${KILN_CLUSTER_ACCOUNTS:-0}" = 1 ] || return 0
	touch "$P/mnt/$1"
	# shellcheck disable=SC2016 # $1, $2 are the inner shell's
	unshare --mount="$P/mnt/$1" --propagation private sh -c \
		'mount --bind "$1/etc/passwd" /etc/passwd && mount --bind "$1/etc/group" /etc/group' sh "$P/root" ||
		die "cannot make a mount namespace for $1"
}

# Creates a persistent UTS namespace for ns with the given hostname.
make_uts() {
	mkdir -p "$P/uts"; touch "$P/uts/$1"
	unshare --uts="$P/uts/$1" hostname "$2"
}

render() {
	local cfg=$1 out=$P/etc
	mkdir -p "$out"
	[ -x "$KILN" ] || die "$KILN not built (run make)"
	local t
	for t in slurm.conf gres.conf cgroup.conf topology.conf hosts; do
		"$KILN" -c "$cfg" render "$t" -o "$out/$t.rendered" || die "kiln render $t failed"
	done
	cp "$out/gres.conf.rendered" "$out/gres.conf"
	cp "$out/cgroup.conf.rendered" "$out/cgroup.conf"
	cp "$out/topology.conf.rendered" "$out/topology.conf"
	if [ "${KILN_CLUSTER_CONFIGLESS:-0}" = 1 ]; then
		cp "$out/slurm.conf.rendered" "$out/slurm.conf"
		mkdir -p "$P/pub" && cp "$cfg" "$P/pub/cluster.cfg"
	fi
}

# Keys a test run must own.  Everything else stays as kiln rendered it.
OWN_KEYS="slurmctldhost slurmctldport slurmdport slurmuser slurmduser authtype credtype authinfo
statesavelocation slurmdspooldir slurmctldpidfile slurmdpidfile slurmctldlogfile slurmdlogfile
slurmdparameters proctracktype taskplugin jobacctgathertype accountingstoragetype
accountingstoragehost jobcomptype mpidefault mailprog returntoservice slurmdtimeout
messagetimeout killwait include plugstackconfig"
HEALTH_KEYS="healthcheckprogram healthcheckinterval healthchecknodestate prolog epilog
prologflags"

patch_conf() {
	local head_name=$1 head_addr=$2 port=$3 conf=$P/etc/slurm.conf
	local drop="$OWN_KEYS"
	[ "${KILN_CLUSTER_KEEP_HEALTH:-0}" = 1 ] || drop="$drop $HEALTH_KEYS"
	awk -v drop="$drop" '
		BEGIN { n = split(drop, k, /[ \n]+/); for (i = 1; i <= n; i++) if (k[i] != "") d[k[i]] = 1 }
		{
			line = $0; key = line; sub(/=.*/, "", key); gsub(/[ \t]/, "", key)
			if (tolower(key) in d) next
			print line
		}' "$P/etc/slurm.conf.rendered" >"$conf.tmp"
	cat >>"$conf.tmp" <<CONF

# ---- test cluster overrides (tests/cluster/cluster.sh) ----
SlurmctldHost=$head_name($head_addr)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$P/munge/munge.sock
StateSaveLocation=$P/state
SlurmdSpoolDir=$P/spool/%n
SlurmctldPidFile=$P/run/slurmctld.pid
SlurmdPidFile=$P/run/slurmd-%n.pid
SlurmctldLogFile=$P/log/slurmctld.log
SlurmdLogFile=$P/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=${SLURMD_TIMEOUT:-5}
MessageTimeout=${MESSAGE_TIMEOUT:-5}
KillWait=2
CONF
	mv "$conf.tmp" "$conf"
}

# node names, one per line, from the NodeName= lines of the rendered conf
node_names() {
	local spec
	grep -iE '^[[:space:]]*NodeName=' "$P/etc/slurm.conf" | sed -E 's/^[[:space:]]*NodeName=([^ ]+).*/\1/I' |
		grep -v '^DEFAULT$' | while read -r spec; do
		scontrol show hostnames "$spec"
	done
}

node_addr() { # from the rendered hosts file: "ADDR name..."
	awk -v n="$1" '!/^#/ { for (i = 2; i <= NF; i++) if ($i == n) { print $1; exit } }' "$P/etc/hosts.rendered"
}

start_munge() {
	mkdir -p "$P/munge"; chmod 755 "$P/munge"   # munged wants a world-executable socket dir
	[ -f "$P/munge/munge.key" ] || mungekey -c -k "$P/munge/munge.key" 2>/dev/null ||
		dd if=/dev/urandom of="$P/munge/munge.key" bs=1024 count=1 status=none
	chmod 600 "$P/munge/munge.key"
	munged --key-file="$P/munge/munge.key" --socket="$P/munge/munge.sock" \
		--pid-file="$P/munge/munged.pid" --log-file="$P/munge/munged.log" \
		--seed-file="$P/munge/munged.seed" --force
}

setup_hub() {
	local ns=$1 head_addr=$2
	ip netns add "${ns}hub"
	make_uts "${ns}hub" "$HEAD_NAME"
	make_mnt "${ns}hub"
	ip -n "${ns}hub" link set lo up
	ip -n "${ns}hub" link add "${ns}br" type bridge
	ip -n "${ns}hub" addr add "$head_addr/8" dev "${ns}br"
	ip -n "${ns}hub" link set "${ns}br" up
}

setup_node_ns() {
	local ns=$1 i=$2 node=$3 addr=$4
	ip netns add "${ns}-$node"
	make_uts "${ns}-$node" "$node"
	make_mnt "${ns}-$node"
	ip -n "${ns}-$node" link set lo up
	ip link add "${ns}v$i" netns "${ns}hub" type veth peer name "${ns}e$i" netns "${ns}-$node"
	ip -n "${ns}hub" link set "${ns}v$i" master "${ns}br" up
	ip -n "${ns}-$node" addr add "$addr/8" dev "${ns}e$i"
	ip -n "${ns}-$node" link set "${ns}e$i" up
}

write_env() {
	local ns=$1; shift
	{
		echo "export SLURM_CONF=$P/etc/slurm.conf"
		echo "KC_DIR=$P"
		echo "KC_HUB=\"$(ns_enter "${ns}hub")\""
		echo "KC_HEAD_ADDR=$HEAD_ADDR"
		echo "HEAD_ADDR=$HEAD_ADDR"
		echo "KC_NODES=\"$*\""
		local n v
		for n in "$@"; do
			v=${n//[^A-Za-z0-9_]/_}
			echo "KC_EXEC_$v=\"$(ns_enter "${ns}-$n")\""
			echo "KC_ADDR_$v=$(node_addr "$n")"
		done
	} >"$P/env.sh"
}

start_slurmd() {
	local ns=$1 node=$2
	mkdir -p "$P/spool/$node"
	if [ "${KILN_CLUSTER_CONFIGLESS:-0}" = 1 ] || [ -f "$P/configless" ]; then
		# Configless: slurmd fetches its files from slurmctld before it has
		# an AuthInfo, so through munge's default socket; a private mount
		# namespace puts DIR's munged there.
		local port
		port=$(sed -nE 's/^SlurmctldPort=//Ip' "$P/etc/slurm.conf" | tail -1)
		mkdir -p /run/munge "$P/run/$node"
		ln -sf munge.sock "$P/munge/munge.socket.2"
		# shellcheck disable=SC2016 # $1..$3 are the inner shell's
		in_ns "${ns}-$node" env -u SLURM_CONF KILN_CLUSTER_DIR="$P" unshare -m --propagation private \
			sh -c 'mount --bind "$1" /run/munge && exec slurmd --conf-server "$2" -N "$3"' \
			sh "$P/munge" "$HEAD_ADDR:${port:-6817}" "$node"
		return
	fi
	in_ns "${ns}-$node" env KILN_CLUSTER_DIR="$P" slurmd -f "$P/etc/slurm.conf" -N "$node"
}

# The PID of a daemon, from its pid file (kiln's rendering puts them under
# run_dir; the patched configuration under DIR/run).
daemon_pid() { # slurmctld|slurmd [NODE]
	local f
	for f in "$P/run/${2:-%n}/$1.pid" "$P/run/$1-${2:-}.pid" "$P/run/$1.pid"; do
		[ -s "$f" ] && { cat "$f"; return; }
	done
}

stop_daemon() { # slurmctld|slurmd [NODE]: SIGTERM, wait for it to go (its jobs stay)
	local pid
	pid=$(daemon_pid "$@")
	[ -n "$pid" ] || die "no pid file for $1 ${2:-} in $P/run"
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	die "$1 ${2:-} (pid $pid) did not stop in 10 s"
}

add_node() {
	local ns node=$1 addr i
	ns=$(cat "$P/ns")
	# shellcheck source=/dev/null # written by up
	. "$P/env.sh"
	addr=$(grep -iE "^NodeName=$node " "$P/etc/slurm.conf" | sed -nE 's/.* NodeAddr=([0-9.]+).*/\1/Ip')
	[ -n "$addr" ] || die "no NodeName=$node with a NodeAddr in $P/etc/slurm.conf"
	i=$(($(ip netns list | grep -c "^${ns}-") + 1))
	setup_node_ns "$ns" "$i" "$node" "$addr"
	v=${node//[^A-Za-z0-9_]/_}
	{
		echo "KC_NODES=\"\$KC_NODES $node\""
		echo "KC_EXEC_$v=\"$(ns_enter "${ns}-$node")\""
		echo "KC_ADDR_$v=$addr"
	} >>"$P/env.sh"
	start_slurmd "$ns" "$node"
}

restart_ctld() {
	local ns
	ns=$(cat "$P/ns")
	# shellcheck source=/dev/null # written by up
	. "$P/env.sh"
	stop_daemon slurmctld
	(cd "$P" && in_ns "${ns}hub" slurmctld -f "$P/etc/slurm.conf")
	wait_ctld "$ns"
}

wait_ctld() {
	local ns=$1
	for _ in $(seq 1 200); do
		in_ns "${ns}hub" scontrol ping 2>/dev/null | grep -q UP && return 0
		sleep 0.1
	done
	die "slurmctld did not answer; see $P/log/slurmctld.log"
}

up() {
	local mode=$1 cfg=${2:-$top/config/examples/demo.cfg}
	local ns port
	ns=$(ns_prefix)
	port=${KILN_CLUSTER_PORT:-6817}
	[ -f "$cfg" ] || die "no cluster file $cfg"
	ip netns list 2>/dev/null | grep -q "^${ns}hub" && die "namespace ${ns}hub exists: run 'cluster.sh down $P' first"
	rm -rf "$P/state" "$P/spool" "$P/log" "$P/run"
	mkdir -p "$P"/{etc,state,spool,log,run}
	export SLURM_CONF=$P/etc/slurm.conf
	render "$cfg"
	rm -f "$P/accounts"
	[ "${KILN_CLUSTER_ACCOUNTS:-0}" = 1 ] && make_accounts "$cfg"
	local head_spec head_name
	head_spec=$(grep -iE '^[[:space:]]*SlurmctldHost=' "$P/etc/slurm.conf.rendered" | head -1 | sed -E 's/^[^=]*=//')
	head_name=${head_spec%%(*}
	HEAD_NAME=$head_name
	HEAD_ADDR=$(echo "$head_spec" | sed -nE 's/.*\(([0-9.]+)\).*/\1/p')
	[ -n "$HEAD_ADDR" ] || HEAD_ADDR=$(node_addr "$head_name")
	[ -n "$HEAD_ADDR" ] || die "cannot find the head node's address in the rendered slurm.conf/hosts"
	[ "${KILN_CLUSTER_CONFIGLESS:-0}" = 1 ] || patch_conf "$head_name" "$HEAD_ADDR" "$port"
	mapfile -t nodes < <(node_names)
	[ ${#nodes[@]} -gt 0 ] || die "no NodeName lines in the rendered slurm.conf"
	if [ "$mode" = full ]; then
		# No GPUs here: slurmd counts GPUs by their device files, so point the
		# rendered File= at stand-in character devices (NVIDIA's major 195)
		# under DIR/dev; nothing opens them.
		fake_gpu_devices
	fi
	setup_hub "$ns" "$HEAD_ADDR"
	start_munge
	write_env "$ns" "${nodes[@]}"
	if [ "${KILN_CLUSTER_CONFIGLESS:-0}" = 1 ]; then
		touch "$P/configless"
		mkdir -p "$P/run/%n"
	fi
	(cd "$P" && in_ns "${ns}hub" slurmctld -f "$P/etc/slurm.conf")
	wait_ctld "$ns"
	[ "$mode" = full ] || { echo "slurmctld up in $P (${#nodes[@]} nodes configured)"; return 0; }
	local i=0 n addr
	for n in "${nodes[@]}"; do
		i=$((i + 1))
		addr=$(node_addr "$n")
		[ -n "$addr" ] || die "no address for node $n in the rendered hosts file"
		setup_node_ns "$ns" "$i" "$n" "$addr"
		start_slurmd "$ns" "$n"
	done
	# up to 30 s until every node is idle (scontrol, not sinfo: sinfo leaves
	# out nodes in no partition, such as inference-only nodes)
	for _ in $(seq 1 300); do
		if [ "$(in_ns "${ns}hub" scontrol -o show nodes 2>/dev/null | grep -cE ' State=IDLE ')" = "${#nodes[@]}" ]; then
			echo "cluster up: ${#nodes[@]} nodes (${nodes[*]}) in $P"
			return 0
		fi
		sleep 0.1
	done
	in_ns "${ns}hub" sinfo -N >&2 || true
	die "cluster did not come up; see $P/log"
}

fake_gpu_devices() {
	local f
	mkdir -p "$P/dev"
	for f in $(grep -oiE 'File=/dev/nvidia[^[:space:]]*' "$P/etc/gres.conf" | sed 's/^File=//I'); do
		for d in $(scontrol show hostnames "$f" 2>/dev/null || echo "$f"); do
			[ -e "$P$d" ] || mknod "$P$d" c 195 "${d##*[!0-9]}" 2>/dev/null || touch "$P$d"
		done
	done
	sed -E -i "s|File=/dev/|File=$P/dev/|I" "$P/etc/gres.conf"
}

down() {
	local ns pids="" pid f
	ns=$(cat "$P/ns" 2>/dev/null) || ns=""
	export SLURM_CONF=$P/etc/slurm.conf
	# every process in our namespaces (slurmd, slurmstepd, job tasks, helpers)
	if [ -n "$ns" ]; then
		for n in $(ip netns list 2>/dev/null | awk -v p="$ns" 'index($1, p) == 1 { print $1 }'); do
			pids+=" $(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')"
		done
	fi
	for f in "$P"/run/*.pid "$P/munge/munged.pid"; do
		pid=$(cat "$f" 2>/dev/null) && pids+=" $pid"
	done
	for pid in $pids; do kill "$pid" 2>/dev/null || true; done
	for _ in $(seq 30); do
		local alive=""
		for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive+=" $pid"; done
		[ -z "$alive" ] && break
		sleep 0.2
	done
	for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
	if [ -n "$ns" ]; then
		for n in $(ip netns list 2>/dev/null | awk -v p="$ns" 'index($1, p) == 1 { print $1 }'); do
			ip netns del "$n" 2>/dev/null || true
		done
	fi
	for f in "$P"/uts/*; do
		[ -e "$f" ] || continue
		umount "$f" 2>/dev/null || true
		rm -f "$f"
	done
	for f in "$P"/mnt/*; do
		[ -e "$f" ] || continue
		umount "$f" 2>/dev/null || true
		rm -f "$f"
	done
	if mountpoint -q "$P/mnt" 2>/dev/null; then umount "$P/mnt" 2>/dev/null || true; fi
	rm -f "$P"/run/*.pid
	echo "cluster down ($P)"
}

kill_node() {
	local ns node=$1 pids
	ns=$(cat "$P/ns")
	pids=$(ip netns pids "${ns}-$node" 2>/dev/null | tr '\n' ' ')
	[ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
	echo "killed node $node (pids:${pids:+ }$pids)"
}

case "$cmd" in
up) up full "${3:-}" ;;
ctld) up ctld "${3:-}" ;;
down) down ;;
kill-node) kill_node "${3:?node name}" ;;
start-node) . "$P/env.sh"; start_slurmd "$(cat "$P/ns")" "${3:?node name}" ;;
restart-slurmd) . "$P/env.sh"; stop_daemon slurmd "${3:?node name}"; start_slurmd "$(cat "$P/ns")" "$3" ;;
stop-slurmd) stop_daemon slurmd "${3:?node name}" ;;
restart-ctld) restart_ctld ;;
add-node) add_node "${3:?node name}" ;;
*) die "unknown command '$cmd'" ;;
esac
