#!/bin/bash
# test-healthd-cli.sh — kiln-healthd's command line without a cluster:
# --help/--version, exit codes (0 healthy, 1 unhealthy, 2 usage or config
# error) of the one-shot --check and its JSON, the GPU count check, a
# missing driver, an old driver's missing symbols (one warning each), the
# active checks without a GPU ("skipped", never "passed"), the Slurm
# prolog/epilog/health-check scripts' exit codes, and `systemd-analyze
# verify` of the unit.  Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
for f in "$HEALTHD" "$FAKE"; do
	[ -e "$f" ] || { echo "1..1"; echo "ok 1 # SKIP $f not built"; exit 0; }
done
W=$(mktemp -d /tmp/kiln-healthd-cli.XXXXXX)
trap 'rm -rf "$W"' EXIT
write_cfg "$W/c.cfg"
export KILN_CONFIG=$W/c.cfg
scn() { printf '%s\n' "$2" >"$W/$1.scn"; echo "$W/$1.scn"; }
hd() { local s=$1; shift; KILN_FAKE_NVML_SCENARIO=$s "$HEALTHD" "$@"; }
rc_is() { local want=$1; shift; "$@" >"$W/out" 2>"$W/err"; local rc=$?; [ "$rc" = "$want" ] || { echo "# rc $rc, want $want"; diag <"$W/err"; return 1; }; }

healthy=$(scn healthy 'gpus = ( { }, { }, { }, { } );')
sick=$(scn sick 'gpus = ( { }, { remap_failure = true; }, { }, { } );')
three=$(scn three 'gpus = ( { }, { }, { } );')
warm=$(scn warm 'gpus = ( { temperature = 86; }, { }, { }, { } );')

check "--help exits 0 and shows usage" rc_is 0 "$HEALTHD" --help
check "--help mentions --check" grep -q -- "--check" "$W/out"
check "--version prints the version" bash -c "'$HEALTHD' --version | grep -q '^kiln-healthd [0-9]'"
check "an unknown option exits 2" rc_is 2 "$HEALTHD" --bogus
check "--json without --check exits 2" rc_is 2 "$HEALTHD" --json
check "a missing cluster file given with -c exits 2" rc_is 2 "$HEALTHD" -c "$W/nope.cfg" --check
printf 'health = { intervall = "1s"; };\n' >"$W/bad.cfg"
check "a cluster file with errors exits 2" rc_is 2 "$HEALTHD" -c "$W/bad.cfg" --check
check "  ... and names file:line" grep -q "bad.cfg:1" "$W/err"
check "--node not in the cluster file exits 2" rc_is 2 hd "$healthy" --check --node nodeXX

check "--check: 4 healthy GPUs exit 0" rc_is 0 hd "$healthy" --check --node node01
check "  ... and the table lists 4 GPUs" bash -c "[ \$(grep -c ' healthy' '$W/out') -ge 4 ]"
check "--check: a failed row remap exits 1" rc_is 1 hd "$sick" --check --node node01
check "  ... with the reason in the table" grep -q "unhealthy  row remapping failed" "$W/out"
check "--check: degraded (86 C) still exits 0" rc_is 0 hd "$warm" --check --node node01
check "  ... and says why" grep -q "degraded   temperature 86 C above the warning threshold 85 C" "$W/out"
check "--check: 3 GPUs where the cluster file says 4 exits 1" rc_is 1 hd "$three" --check --node node01
check "  ... node reason" grep -q "3 GPUs found, the cluster file says 4" "$W/out"
check "--check --json is valid JSON with the drain reason" bash -c \
	"KILN_FAKE_NVML_SCENARIO='$sick' '$HEALTHD' --check --json --node node01 2>/dev/null |
	 $PY -c 'import json,sys; d=json.load(sys.stdin); assert d[\"state\"]==\"unhealthy\", d; assert d[\"drain_reason\"]==\"kiln: gpu1 row remapping failed\", d; assert len(d[\"gpus\"])==4'"

write_cfg "$W/nodrv.cfg" 'nvml_library = "/nonexistent/libnvidia-ml.so.1";'
check "--check: no NVIDIA driver on a node with 4 GPUs exits 1" rc_is 1 "$HEALTHD" -c "$W/nodrv.cfg" --check --node node01
check "  ... NVML unavailable" grep -q "NVML unavailable (no NVIDIA driver)" "$W/out"

write_cfg "$W/old.cfg"
sed -i "s|lib/fake-nvml/|lib/fake-nvml-old/|" "$W/old.cfg"
check "old driver: --check still works (fallback names)" rc_is 0 hd "$healthy" -c "$W/old.cfg" --check --node node01
check "old driver: one warning for the missing nvmlDeviceGetRemappedRows" \
	bash -c "[ \$(grep -c 'lacks nvmlDeviceGetRemappedRows' '$W/err') = 1 ]"
check "old driver: no warning for symbols that have an older name" bash -c "! grep -q 'lacks nvmlDeviceGetCount\|lacks nvmlDeviceGetCurrentClocksEventReasons' '$W/err'"

check "--active without a GPU exits 0" rc_is 0 "$HEALTHD" -c "$W/nodrv.cfg" --node node01 --active
check "  ... every check skipped, none passed" bash -c "[ \$(grep -c ' skipped ' '$W/out') = 3 ] && ! grep -q passed '$W/out'"

write_cfg "$W/off.cfg" 'enabled = false;'
check "health.enabled = false: the daemon exits 0 at once" rc_is 0 timeout 5 "$HEALTHD" -c "$W/off.cfg" --node node01
check "  ... and says why" grep -q "health.enabled is false" "$W/err"

# a driver that shows up after the daemon started is picked up
write_cfg "$W/late.cfg" "nvml_library = \"$W/late/libnvidia-ml.so.1\";" 'interval = "200ms";' 'drain = false;'
KILN_FAKE_NVML_SCENARIO=$healthy "$HEALTHD" -c "$W/late.cfg" --node node01 --metrics-port 0 >"$W/late.log" 2>&1 &
lpid=$!
sleep 0.7
mkdir -p "$W/late" && cp "$FAKE" "$W/late/"
wait_until 5 grep -q "node node01 healthy again" "$W/late.log" >/dev/null
kill $lpid; wait $lpid 2>/dev/null
check "no driver at start: unhealthy with the reason" grep -q "unhealthy: 0 GPUs found, the cluster file says 4; NVML unavailable (no NVIDIA driver)" "$W/late.log"
check "the driver appears later: picked up, node healthy again" \
	bash -c "grep -q 'NVML is available now' '$W/late.log' && grep -q 'node node01 healthy again' '$W/late.log'"

# ---- health.nvml_library is dlopened as root: only a library root alone can change --
# Issue 31's exploit: a .so written by nobody ran its constructor as uid 0
# inside kiln-healthd.  The fake NVML's constructor writes "uid N" to
# KILN_FAKE_NVML_CONSTRUCTOR_MARK: it must never run from such a path.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
	mark=$W/constructor-ran
	# trusted (the build tree is root's): loads, and the constructor runs as it should
	rm -f "$mark"
	check "nvml_library root's (the build tree): --check exits 0" \
		rc_is 0 env KILN_FAKE_NVML_CONSTRUCTOR_MARK="$mark" KILN_FAKE_NVML_SCENARIO="$healthy" "$HEALTHD" --check --node node01
	check "  ... its constructor ran (the mark proves the probe works)" grep -qx 'uid 0' "$mark"
	# evil_case NAME WHAT SETUP MESSAGE: a copy of the fake NVML in $W/NAME/lib
	# made untrusted by the function SETUP; refused with MESSAGE
	evil_case() {
		local name=$1 what=$2 setup=$3 msg=$4
		local dir=$W/$name  # (not d: write_cfg loops over d)
		mkdir -p "$dir/lib" && chmod 755 "$dir" "$dir/lib" && cp "$FAKE" "$dir/lib/" && chmod 755 "$dir/lib/libnvidia-ml.so.1"
		"$setup" "$dir"
		write_cfg "$W/$name.cfg" "nvml_library = \"$dir/lib/libnvidia-ml.so.1\";"
		rm -f "$mark"
		for mode in --check ''; do
			KILN_FAKE_NVML_CONSTRUCTOR_MARK=$mark KILN_FAKE_NVML_SCENARIO=$healthy timeout 10 \
				"$HEALTHD" -c "$W/$name.cfg" --node node01 --metrics-port 0 $mode >"$W/out" 2>"$W/err"
			local rc=$?
			check "$what${mode:+ ($mode)}: refused, exit 2" test "$rc" = 2
			check "  ... never loaded: its constructor did not run as root" test ! -e "$mark"
		done
		check "  ... the error names the key, the file and the fix" \
			bash -c "grep -q 'health.nvml_library = \"$dir/lib/libnvidia-ml.so.1\": refusing to load it as root' '$W/err' && grep -q '$msg' '$W/err'"
	}
	own_nobody() { chown nobody "$1/lib/libnvidia-ml.so.1"; }
	evil_case nobody "a library owned by nobody" own_nobody "owned by nobody"
	dir_nobody() { chown nobody "$1/lib"; }
	evil_case nobodydir "a library in a directory owned by nobody" dir_nobody "directory $W/nobodydir/lib is owned by nobody"
	world_w() { chmod 0757 "$1/lib/libnvidia-ml.so.1"; }
	evil_case worldw "a world-writable library" world_w "writable by every user"
	group_w() { chmod 0775 "$1/lib"; }
	evil_case groupw "a library in a group-writable directory" group_w "writable by its group"
	# a root-owned link in a root-only directory to a nobody-owned file
	link_nobody() { mkdir -p "$1/real" && mv "$1/lib/libnvidia-ml.so.1" "$1/real/" && chown nobody "$1/real/libnvidia-ml.so.1" && ln -s ../real/libnvidia-ml.so.1 "$1/lib/libnvidia-ml.so.1"; }
	evil_case link "a root's link to a library owned by nobody" link_nobody "owned by nobody"
	# (the check at the dlopen itself, for a file changed after the start:
	# test-healthd's test_nvml_untrusted)
else
	skip "nvml_library trust: needs root and the user nobody (chown)"
fi

# no Slurm configuration: libslurm would exit the process from slurm_init();
# the daemon must keep running (metrics, logs) and say what is missing
write_cfg "$W/noslurm.cfg"
SLURM_CONF=$W/nope/slurm.conf KILN_FAKE_NVML_SCENARIO=$healthy "$HEALTHD" -c "$W/noslurm.cfg" --node node01 --metrics-port 0 >"$W/noslurm.log" 2>&1 &
npid=$!
wait_until 10 grep -q "kiln-healthd .* on node01: 4 GPU" "$W/noslurm.log" >/dev/null
sleep 0.5
check "no slurm.conf: the daemon keeps running" kill -0 $npid
kill $npid 2>/dev/null; wait $npid 2>/dev/null
check "  ... and says what is missing and what to do" grep -q "No Slurm configuration (\$SLURM_CONF names $W/nope/slurm.conf, which does not exist): Slurm drain/resume disabled; install slurm.conf" "$W/noslurm.log"
check "  ... without libslurm's fatal()" bash -c "! grep -q 'fatal' '$W/noslurm.log'"

# health.watchdog replaces the unit's WatchdogSec (WATCHDOG_USEC= to systemd)
wd() { # wd NAME WATCHDOG-SETTING: runs the daemon 2 s under a fake systemd watchdog of 30 s
	write_cfg "$W/$1.cfg" "watchdog = $2;" 'nvml_timeout = "200ms";' 'drain = false;'
	notify_listen "$W/$1.sock" "$W/$1.notify"
	local lp=$NOTIFY_PID
	wait_until 10 test -S "$W/$1.sock" >/dev/null
	NOTIFY_SOCKET=$W/$1.sock WATCHDOG_USEC=30000000 KILN_FAKE_NVML_SCENARIO=$healthy \
		"$HEALTHD" -c "$W/$1.cfg" --node node01 --metrics-port 0 >"$W/$1.log" 2>&1 &
	local dp=$!
	sleep 2.5
	kill $dp; wait $dp 2>/dev/null
	echo $? >"$W/$1.rc"
	sleep 0.2
	kill $lp; wait $lp 2>/dev/null
}
wd wd1 '"900ms"'
check "health.watchdog 900ms: tells systemd WATCHDOG_USEC=900000" grep -q " WATCHDOG_USEC=900000$" "$W/wd1.notify"
check "  ... and pings at a third of it (longest gap < 0.9 s, >= 4 pings)" bash -c \
	"awk '\$2 == \"WATCHDOG=1\" { if (p) { g = \$1 - p; if (g > m) m = g }; p = \$1; n++ } END { exit !(n >= 4 && m < 0.9) }' '$W/wd1.notify'"
check "SIGTERM: clean stop, exit 0, STOPPING=1, logged" bash -c \
	"[ \$(cat '$W/wd1.rc') = 0 ] && grep -q ' STOPPING=1\$' '$W/wd1.notify' && grep -q '^<6>Received Terminated, shutting down' '$W/wd1.log'"
wd wd0 0
check "health.watchdog 0: turns systemd's watchdog off (WATCHDOG_USEC=0), no pings" bash -c \
	"grep -q ' WATCHDOG_USEC=0\$' '$W/wd0.notify' && ! grep -q 'WATCHDOG=1' '$W/wd0.notify'"

if [ -x "$B/bin/kiln-healthd-active" ]; then
	check "--active with 4 (fake) GPUs and no CUDA device exits 0" rc_is 0 hd "$healthy" --node node01 --active
	check "  ... 12 checks skipped, none passed" bash -c "[ \$(grep -c ' skipped ' '$W/out') = 12 ] && ! grep -q passed '$W/out'"
else
	skip "kiln-healthd-active not built"; skip "kiln-healthd-active not built"
fi

# XID state file: an XID 79 drain survives a restart, --clear-xid lifts it,
# a corrupt file keeps the node unhealthy without stopping the daemon.
# health.metrics_port = 0 from the cluster file (no --metrics-port): no HTTP.
XS=$W/xs/xid.state
wu() { wait_until "$@" >/dev/null; }
write_cfg "$W/xs.cfg" 'metrics_port = 0;' 'drain = false;' 'interval = "100ms";'
xs_daemon() { # xs_daemon NAME SCENARIO: starts the daemon, sets xpid
	KILN_HEALTHD_XID_STATE=$XS KILN_FAKE_NVML_SCENARIO=$2 "$HEALTHD" -c "$W/xs.cfg" --node node01 >"$W/$1.log" 2>&1 &
	xpid=$!
}
xid79=$(scn xid79 'gpus = ( { }, { }, { }, { } ); events = ( { at = 0.2; gpu = 1; xid = 79; } );')
xs_daemon xs1 "$xid79"
wait_until 10 grep -q "gpu1 (GPU-00000000-0000-4000-8000-000000000001) unhealthy: XID 79" "$W/xs1.log" >/dev/null
wait_until 2 test -s "$XS" >/dev/null
kill $xpid; wait $xpid 2>/dev/null
check "metrics_port = 0 in the cluster file: no HTTP server" bash -c "grep -q 'on node01: 4 GPU' '$W/xs1.log' && ! grep -q 'Serving /metrics' '$W/xs1.log'"
check "XID 79 is saved to the XID state file (its directory created)" \
	grep -Eq "^1 GPU-00000000-0000-4000-8000-000000000001 79 reboot [0-9]{10}$" "$XS"
xs_daemon xs2 "$healthy"
wait_until 10 grep -q "unhealthy: XID 79 GPU has fallen off the bus (reboot needed)" "$W/xs2.log" >/dev/null
check "after a restart: gpu1 still unhealthy with the same reason" \
	grep -q "gpu1 (GPU-00000000-0000-4000-8000-000000000001) unhealthy: XID 79 GPU has fallen off the bus (reboot needed)" "$W/xs2.log"
check "  ... and the log says where it came from" grep -q "XID state file $XS: 1 XID(s) keep GPUs drained (from before a restart)" "$W/xs2.log"
# --check (the prolog, HealthCheckProgram) reads the same file: one NVML
# poll sees a healthy gpu1, the file says it fell off the bus
check "--check with XID 79 in the state file exits 1" rc_is 1 env KILN_HEALTHD_XID_STATE="$XS" KILN_FAKE_NVML_SCENARIO="$healthy" "$HEALTHD" -c "$W/xs.cfg" --check --node node01
check "  ... gpu1 unhealthy with the daemon's reason" grep -Eq "^ *1 .*unhealthy +XID 79 GPU has fallen off the bus \(reboot needed\)" "$W/out"
check "  ... --json: the daemon's drain reason" bash -c \
	"KILN_HEALTHD_XID_STATE='$XS' KILN_FAKE_NVML_SCENARIO='$healthy' '$HEALTHD' -c '$W/xs.cfg' --check --json --node node01 2>/dev/null |
	 $PY -c 'import json,sys; d=json.load(sys.stdin); assert d[\"drain_reason\"]==\"kiln: gpu1 XID 79 GPU has fallen off the bus (reboot needed)\", d'"
mkdir -p "$W/bin" && printf '#!/bin/sh\necho "$@" >>%s/scontrol.calls\n' "$W" >"$W/bin/scontrol" && chmod +x "$W/bin/scontrol"
check "  ... prolog refuses the job and drains with that reason" bash -c \
	"env PATH='$W/bin:$PATH' KILN_CONFIG='$W/xs.cfg' KILN_HEALTHD='$HEALTHD' SLURMD_NODENAME=node01 KILN_HEALTHD_XID_STATE='$XS' KILN_FAKE_NVML_SCENARIO='$healthy' '$top/slurm/scripts/prolog' 2>/dev/null; [ \$? = 1 ] && grep -q 'state=drain reason=kiln: gpu1 XID 79 GPU has fallen off the bus (reboot needed)' '$W/scontrol.calls'"
rm -f "$W/scontrol.calls"
check "--clear-xid with a bad GPU exits 2" rc_is 2 env KILN_HEALTHD_XID_STATE="$XS" "$HEALTHD" --clear-xid bogus
check "--clear-xid 1 clears gpu1's XID" rc_is 0 env KILN_HEALTHD_XID_STATE="$XS" "$HEALTHD" --clear-xid 1
check "  ... and says so" grep -q "Cleared 1 XID entry for 1 in $XS (0 left)" "$W/out"
check "  ... the running daemon picks it up: gpu1 healthy again" wu 5 grep -q "gpu1 (GPU-00000000-0000-4000-8000-000000000001) healthy again" "$W/xs2.log"
check "--check after --clear-xid 1: healthy, exit 0" rc_is 0 env KILN_HEALTHD_XID_STATE="$XS" KILN_FAKE_NVML_SCENARIO="$healthy" "$HEALTHD" -c "$W/xs.cfg" --check --node node01
printf 'this is not a state file\n' >"$XS"
check "a corrupt XID state file: a clear error line with file:line" wu 5 grep -q "XID state file $XS:1 is corrupt: keeping the node drained" "$W/xs2.log"
check "  ... the node is unhealthy (stays drained)" wu 5 grep -q "node node01 unhealthy: XID state file $XS unreadable" "$W/xs2.log"
check "  ... and the daemon keeps running" kill -0 $xpid
check "--check with a corrupt XID state file exits 1 (kept drained)" rc_is 1 env KILN_HEALTHD_XID_STATE="$XS" KILN_FAKE_NVML_SCENARIO="$healthy" "$HEALTHD" -c "$W/xs.cfg" --check --node node01
check "  ... and says which file" grep -q "XID state file $XS unreadable" "$W/out"
check "--clear-xid 2 on a corrupt file exits 1" rc_is 1 env KILN_HEALTHD_XID_STATE="$XS" "$HEALTHD" --clear-xid 2
check "--clear-xid all replaces a corrupt file" rc_is 0 "$HEALTHD" --xid-state "$XS" --clear-xid all
check "  ... and the node is healthy again" wu 5 grep -q "node node01 healthy again" "$W/xs2.log"
kill $xpid; wait $xpid 2>/dev/null
# an XID while the file is corrupt: the file is left as it is (it may hold
# what it cannot tell), the XID still drains
printf 'garbage\n' >"$XS"
xs_daemon xs4 "$xid79"
wu 5 grep -q "XID 79 of gpu1 is not saved: $XS is unreadable" "$W/xs4.log"
kill $xpid; wait $xpid 2>/dev/null
check "an XID while the state file is corrupt: logged, the file left as it is" \
	bash -c "grep -q 'XID 79 of gpu1 is not saved' '$W/xs4.log' && [ \"\$(cat '$XS')\" = garbage ]"
check "  ... and gpu1 unhealthy all the same" grep -q "gpu1 (GPU-00000000-0000-4000-8000-000000000001) unhealthy: XID 79" "$W/xs4.log"
rm -f "$XS"
check "--clear-xid without a state file: nothing to clear, exit 0" rc_is 0 "$HEALTHD" --xid-state "$XS" --clear-xid all
write_cfg "$W/xs3.cfg" "metrics_port = $((30000 + RANDOM % 20000));" 'drain = false;'
KILN_HEALTHD_XID_STATE=$XS KILN_FAKE_NVML_SCENARIO=$healthy "$HEALTHD" -c "$W/xs3.cfg" --node node01 >"$W/xs3.log" 2>&1 &
xpid=$!
check "  (control: a non-zero metrics_port does serve /metrics)" wu 5 grep -q "Serving /metrics on" "$W/xs3.log"
kill $xpid; wait $xpid 2>/dev/null

# One address holding idle connections (64: the daemon's every slot, far
# past the per-client cap of 8) must not stop a scrape from another address
# (127.0.0.2: Linux routes all of 127/8 to lo).
port=$((30000 + RANDOM % 20000))
write_cfg "$W/cap.cfg" "metrics_port = $port;" 'metrics_address = "127.0.0.1";' 'drain = false;'
KILN_FAKE_NVML_SCENARIO=$healthy "$HEALTHD" -c "$W/cap.cfg" --node node01 >"$W/cap.log" 2>&1 &
cpid=$!
wu 5 grep -q "Serving /metrics on" "$W/cap.log"
bash -c "for i in \$(seq 64); do exec {fd}<>/dev/tcp/127.0.0.1/$port || exit 1; done; sleep 6" 2>/dev/null &
hold=$!
sleep 0.5
check "64 idle connections from 127.0.0.1: a scrape from 127.0.0.2 still succeeds within 1 s" \
	curl -sf -o /dev/null --max-time 1 --interface 127.0.0.2 "http://127.0.0.1:$port/metrics"
check "  ... while 127.0.0.1, past its cap, gets no more" \
	bash -c "! curl -sf -o /dev/null --max-time 1 'http://127.0.0.1:$port/metrics'"
kill $hold $cpid; wait $hold $cpid 2>/dev/null

S=$top/slurm/scripts
export KILN_HEALTHD=$HEALTHD SLURMD_NODENAME=node01
PATH_NOSCONTROL=$W/bin; mkdir -p "$PATH_NOSCONTROL"
printf '#!/bin/sh\necho "$@" >>%s/scontrol.calls\n' "$W" >"$PATH_NOSCONTROL/scontrol"; chmod +x "$PATH_NOSCONTROL/scontrol"
check "prolog: healthy node exits 0" rc_is 0 env PATH="$PATH_NOSCONTROL:$PATH" KILN_FAKE_NVML_SCENARIO="$healthy" "$S/prolog"
check "prolog: unhealthy node exits 1 (job refused)" rc_is 1 env PATH="$PATH_NOSCONTROL:$PATH" KILN_FAKE_NVML_SCENARIO="$sick" "$S/prolog"
check "  ... and drains with kiln's reason" grep -q 'update nodename=node01 state=drain reason=kiln: gpu1 row remapping failed' "$W/scontrol.calls"
rm -f "$W/scontrol.calls"
check "epilog: unhealthy node exits 0 but drains" rc_is 0 env PATH="$PATH_NOSCONTROL:$PATH" KILN_FAKE_NVML_SCENARIO="$sick" "$S/epilog"
check "  ... with kiln's reason" grep -q 'state=drain reason=kiln: gpu1 row remapping failed' "$W/scontrol.calls"
rm -f "$W/scontrol.calls"
check "health-check: healthy node: no drain" bash -c "env PATH='$PATH_NOSCONTROL:$PATH' KILN_FAKE_NVML_SCENARIO='$healthy' '$S/health-check' && ! grep -q drain '$W/scontrol.calls' 2>/dev/null"
check "health-check: unhealthy node drains" bash -c "env PATH='$PATH_NOSCONTROL:$PATH' KILN_FAKE_NVML_SCENARIO='$sick' '$S/health-check' && grep -q 'state=drain reason=kiln: gpu1' '$W/scontrol.calls'"

unit=$top/services/units/kiln-healthd.service
if command -v systemd-analyze >/dev/null; then
	# verify checks ExecStart exists: point it at the build
	sed "s|^ExecStart=.*|ExecStart=$HEALTHD|" "$unit" >"$W/kiln-healthd.service"
	cp "${unit%.service}.socket" "$W/kiln-healthd.socket"
	# Requisite=kiln-node-init.service: the unit must be found beside it
	sed "s|^ExecStart=.*|ExecStart=$top/image/kiln-node-init|" "$top/services/units/kiln-node-init.service" >"$W/kiln-node-init.service"
	mkdir -p "$W/man/man8" && ln -s "$top/docs/man/kiln-healthd.8" "$W/man/man8/"
	if MANPATH=$W/man systemd-analyze verify "$W/kiln-healthd.service" "$W/kiln-healthd.socket" >"$W/verify.txt" 2>&1; then
		ok "systemd-analyze verify kiln-healthd.service kiln-healthd.socket"
	elif grep -qiE "Failed to (connect|initialize)|System has not been booted|Failed to setup" "$W/verify.txt"; then
		skip "systemd-analyze cannot run here: $(head -1 "$W/verify.txt")"
	else
		not_ok "systemd-analyze verify kiln-healthd.service"; diag <"$W/verify.txt"
	fi
else
	skip "systemd-analyze not installed"
fi
check "unit: Type=notify, WatchdogSec, journal" bash -c "grep -q '^Type=notify' '$unit' && grep -q '^WatchdogSec=' '$unit' && grep -q '^StandardError=journal' '$unit'"
echo "1..$tap_n"
exit $((tap_failed > 0))
