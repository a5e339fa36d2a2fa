# lib.sh — shared helpers of the kiln-healthd TAP suites (sourced).
#
# TAP output (ok/not ok/skip with a running number), waiting for a condition
# with a deadline, scenario and cluster-file writers, and a reader for the
# sd_notify socket so tests can see READY=1, STATUS= and WATCHDOG=1.
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
HEALTHD=$B/bin/kiln-healthd
FAKE=$B/lib/fake-nvml/libnvidia-ml.so.1
PY=/usr/bin/python3
# the suites grep the daemon's "<N>" journal prefixes in its log files, which
# it writes only when stderr is the journal unless told to
export KILN_LOG_PREFIX=1

tap_n=0 tap_failed=0
ok() { tap_n=$((tap_n + 1)); echo "ok $tap_n - $*"; }
not_ok() { tap_n=$((tap_n + 1)); tap_failed=$((tap_failed + 1)); echo "not ok $tap_n - $*"; }
skip() { tap_n=$((tap_n + 1)); echo "ok $tap_n # SKIP $*"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }
diag() { sed 's/^/# /'; }

now() { date +%s.%N; }
# wait_until SECONDS CMD...: runs CMD every 50 ms until it succeeds; prints the
# time it first succeeded; fails after SECONDS.
wait_until() {
	local limit=$1; shift
	local end; end=$(awk -v n="$(now)" -v l="$limit" 'BEGIN { printf "%.3f", n + l }')
	while :; do
		if "$@" >/dev/null 2>&1; then now; return 0; fi
		awk -v n="$(now)" -v e="$end" 'BEGIN { exit !(n > e) }' && return 1
		sleep 0.05
	done
}
# fsub A B: A - B with 3 decimals
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
flt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# event_time LOG N: CLOCK_REALTIME at which the fake NVML fired event N
event_time() { awk -v n="$2" '$3 == "event" && $4 == n { print $1; exit }' "$1"; }

# write_cfg FILE [key = value; ...]: the demo cluster with fast test
# settings; extra keys replace the defaults of the same name.
write_cfg() {
	local f=$1; shift
	sed '/^health = {/,$d' "$top/config/examples/demo.cfg" >"$f"
	local defaults=('interval = "200ms";' 'recover_after = "2s";' 'nvml_timeout = "1s";'
		"nvml_library = \"$FAKE\";" 'metrics_port = 9400;' 'active_on_start = false;'
		'watchdog = "3s";')
	{
		echo 'health = {'
		for d in "${defaults[@]}"; do
			local k=${d%% *} skip=
			for e in "$@"; do [ "${e%% *}" = "$k" ] && skip=1; done
			[ -n "$skip" ] || echo "  $d"
		done
		for e in "$@"; do echo "  $e"; done
		echo '};'
	} >>"$f"
}

# demo_scratch NAME: the `make demo` scripts' scratch folder W (removed at
# exit, after killing every pid they add to PIDS).
demo_scratch() {
	W=$(mktemp -d "/tmp/$1.XXXXXX")
	PIDS=()
	trap demo_cleanup EXIT
}
demo_cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$W"
}

# demo_start_healthd SCENARIO: kiln-healthd with $W/cluster.cfg on every
# node of the demo cluster (env.sh sourced) against the fake NVML, 4 healthy
# GPUs each, node02 with SCENARIO; each node its own XID state file (the
# demo nodes share one /run) and log $W/NODE.log.
demo_start_healthd() {
	local n scn v
	printf 'gpus = ( { }, { }, { }, { } );\n' >"$W/healthy.scn"
	for n in $KC_NODES; do
		scn=$W/healthy.scn; [ "$n" = node02 ] && scn=$1
		v=KC_EXEC_$n
		KILN_FAKE_NVML_SCENARIO=$scn KILN_HEALTHD_XID_STATE=$W/$n.xid.state ${!v} "$HEALTHD" -c "$W/cluster.cfg" >"$W/$n.log" 2>&1 &
		PIDS+=($!)
	done
}

# notify_listen SOCKET OUT: collects sd_notify datagrams ("<time> <message>"
# per line) until killed.  Sets NOTIFY_PID (no $(...): the listener would
# hold the substitution's pipe open).
notify_listen() {
	"$PY" - "$1" "$2" >/dev/null 2>&1 <<'PYEOF' &
import socket, sys, time, os
path, out = sys.argv[1], sys.argv[2]
try: os.unlink(path)
except FileNotFoundError: pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
with open(out, "a", buffering=1) as f:
    while True:
        msg = s.recv(4096).decode(errors="replace")
        for line in msg.split("\n"):
            if line:
                f.write("%.6f %s\n" % (time.time(), line))
PYEOF
	NOTIFY_PID=$!
}
