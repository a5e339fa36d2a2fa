#!/bin/bash
# test-inferd-signals.sh — kiln-inferd stops in order on SIGTERM and SIGINT
# ("Got ..., stopping", exit 0) also when OpenBLAS runs its own thread pool:
# OpenBLAS starts it before main(), with the signals unblocked, so a
# process-directed signal may land on one of its threads, which must pass
# it on to the event loop's signalfd instead of dying with it (exit 143).
# The server starts through `env --default-signal` (a script's background
# job would otherwise ignore SIGINT).  Prints TAP.
set -u
. "$(dirname "$0")/../lib/tap.sh"
. "$(dirname "$0")/inferd-env.sh"
W=$(mktemp -d /tmp/kiln-inferd-signals.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
# stops_on SIG: starts the server with 4 OpenBLAS threads, signals it as
# soon as it serves; 0 when it exits 0 having said so.
stops_on() {
	OPENBLAS_NUM_THREADS=4 KK_CPU_THREADS=1 env --default-signal=INT,TERM \
		"$BIN" -m "$MODEL" -p 0 >"$W/log" 2>&1 &
	PID=$!
	# a loaded machine may take seconds to load the model: signal only once
	# it serves (the handlers are in place by then)
	for _ in $(seq 1200); do grep -q Serving "$W/log" && break; sleep 0.05; done
	grep -q Serving "$W/log" || { echo "# not serving after 60 s"; sed 's/^/# /' "$W/log"; return 1; }
	kill -"$1" "$PID"
	wait "$PID"
	local rc=$?
	PID=
	[ "$rc" = 0 ] && grep -q "Got .*, stopping" "$W/log" || { echo "# rc $rc"; sed 's/^/# /' "$W/log"; return 1; }
}
for i in 1 2 3; do
	ok "SIGTERM with OpenBLAS threads: an orderly stop, exit 0 ($i)" stops_on TERM
done
ok "SIGINT with OpenBLAS threads: an orderly stop, exit 0" stops_on INT
tap_done
