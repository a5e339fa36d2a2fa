# inferd-env.sh — what the kiln-inferd shell suites share (source it after
# tests/lib/tap.sh): B, BIN, MODEL (the model fixture, tests/lib/fixture.sh);
# prints a SKIP plan and exits when the binary is missing, a failing plan
# (exit 1) when the fixture is: the build makes it.
# inferd_suite sets up a suite's work folder and cleanup, inferd_start /
# inferd_stop run servers, rc_is checks a command's exit status.
B=${KILN_BUILD:-build}
BIN=$B/bin/kiln-inferd
if [ ! -x "$BIN" ]; then echo "1..1"; echo "ok 1 # SKIP $BIN not built"; exit 0; fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/fixture.sh"
kiln_need_fixture

# inferd_start ARGS...: kiln-inferd with ARGS on an ephemeral port of
# 127.0.0.1, its log in $W/log; sets PID, port and URL.  Fails, with the log
# as TAP comments, when it exits or names no port within 20 s.  The old log
# goes first: `>"$W/log"` truncates in the child, after the fork, so a
# reader racing it could take the previous server's port for this one's.
inferd_start() {
	rm -f "$W/log"
	"$BIN" -p 0 "$@" >"$W/log" 2>&1 &
	PID=$!
	port=
	for _ in $(seq 400); do
		port=$(grep -o 'http://127.0.0.1:[0-9]*' "$W/log" 2>/dev/null | head -1 | sed 's/.*://')
		[ -n "$port" ] && break
		kill -0 "$PID" 2>/dev/null || break
		sleep 0.05
	done
	URL=http://127.0.0.1:$port
	[ -n "$port" ] || { sed 's/^/# /' "$W/log" 2>/dev/null; return 1; }
}
# inferd_stop: SIGTERM, and kiln-inferd's exit status.
inferd_stop() { kill -TERM "$PID"; wait "$PID"; local rc=$?; PID=; return $rc; }

# inferd_suite NAME [TOOL...]: the start the suites share: one CPU thread
# (kk's and OpenBLAS's: deterministic batches), a SKIP plan when a TOOL is
# missing, the work folder $W (/tmp/kiln-inferd-NAME.XXXXXX), PID empty,
# and an EXIT trap that runs $INFERD_CLEANUP (a suite's own, if set), kills
# a server still running and removes $W.
inferd_suite() {
	local name=$1 t
	shift
	export KK_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1
	for t in "$@"; do
		command -v "$t" >/dev/null || { echo "1..1"; echo "ok 1 # SKIP $t not installed"; exit 0; }
	done
	W=$(mktemp -d "/tmp/kiln-inferd-$name.XXXXXX")
	PID=
	trap inferd_cleanup EXIT
}
inferd_cleanup() {
	[ -n "${INFERD_CLEANUP:-}" ] && eval "$INFERD_CLEANUP"
	[ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null
	rm -rf "$W"
}
# rc_is RC CMD...: CMD exits with RC (its stdout in $W/out, stderr in
# $W/err); else says both statuses and the stderr as TAP comments.
rc_is() {
	local want=$1
	shift
	"$@" >"$W/out" 2>"$W/err"
	local rc=$?
	[ "$rc" = "$want" ] || { echo "# rc $rc, want $want"; sed 's/^/# /' "$W/err"; return 1; }
}
