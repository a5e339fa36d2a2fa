#!/bin/bash
# bench-store.sh — kiln store benchmarks on loopback (make bench).
#
# 1. SET/GET throughput and GET latency from 1, 16 and 64 C clients
#    (kiln-store-bench ops; a GET is CHECK+GET, two round trips, as torch's
#    get is WAIT+GET).
# 2. Rendezvous pattern (every client ADDs a counter, the last SETs "go",
#    all WAIT on it) for 64, 256 and 1024 C clients: median of 5 rounds.
# 3. The same rendezvous with unmodified torch 1.13 TCPStore clients (Python
#    threads), against the kiln store and against torch's own TCPStore
#    server, side by side.  Skipped when /usr/bin/python3 has no torch.
# 4. Through the relay kiln-run puts in front of the store on each node
#    (workers' MASTER_PORT): SET/GET from 1 and 16 C clients, and the
#    C-client rendezvous of 1024, to show what the extra hop costs.
# Prints a markdown table; exit 1 if a run fails.
set -u
B=${KILN_BUILD:-build}
SRV=$B/tests/kiln-store-server
BENCH=$B/tests/kiln-store-bench
PY=/usr/bin/python3
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
ulimit -n 20000 2>/dev/null || true

"$SRV" --bind 127.0.0.1 --port 0 --port-file "$tmp/port" --secret bench-secret \
	--relay-port-file "$tmp/relay" >/dev/null 2>"$tmp/srv.err" &
pids+=($!)
for _ in $(seq 50); do [ -s "$tmp/port" ] && [ -s "$tmp/relay" ] && break; sleep 0.1; done
port=$(cat "$tmp/port") || exit 1
relay=$(cat "$tmp/relay") || exit 1

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "n/a" }'; }

echo "## kiln store on loopback ($(nproc) cores, $(uname -r))"
echo
echo "| benchmark | clients | result |"
echo "|---|---|---|"
for n in 1 16 64; do
	out=$("$BENCH" ops --port "$port" --clients $n --seconds 2) || exit 1
	ops=$(sed -n 's/.*ops_per_sec=\([0-9]*\).*/\1/p' <<<"$out")
	p50=$(sed -n 's/.*p50_us=\([0-9]*\).*/\1/p' <<<"$out")
	p99=$(sed -n 's/.*p99_us=\([0-9]*\).*/\1/p' <<<"$out")
	echo "| SET/GET ops/s (C client) | $n | $ops ops/s, GET p50 ${p50} us, p99 ${p99} us |"
done
for n in 64 256 1024; do
	out=$("$BENCH" rdzv --port "$port" --clients $n --rounds 5) || exit 1
	med=$(grep -o 'ms=[0-9.]*' <<<"$out" | cut -d= -f2 | median)
	conn=$(sed -n 's/.*connect_ms=\([0-9]*\).*/\1/p' <<<"$out")
	echo "| rendezvous ADD+WAIT (C client), kiln | $n | ${med} ms (connect ${conn} ms); target < 2000 ms |"
done
for n in 1 16; do
	out=$("$BENCH" ops --port "$relay" --clients $n --seconds 2) || exit 1
	ops=$(sed -n 's/.*ops_per_sec=\([0-9]*\).*/\1/p' <<<"$out")
	p50=$(sed -n 's/.*p50_us=\([0-9]*\).*/\1/p' <<<"$out")
	p99=$(sed -n 's/.*p99_us=\([0-9]*\).*/\1/p' <<<"$out")
	echo "| SET/GET ops/s (C client) through the relay | $n | $ops ops/s, GET p50 ${p50} us, p99 ${p99} us |"
done
out=$("$BENCH" rdzv --port "$relay" --clients 1024 --rounds 5) || exit 1
med=$(grep -o 'ms=[0-9.]*' <<<"$out" | cut -d= -f2 | median)
conn=$(sed -n 's/.*connect_ms=\([0-9]*\).*/\1/p' <<<"$out")
echo "| rendezvous ADD+WAIT (C client) through the relay | 1024 | ${med} ms (connect ${conn} ms) |"

if "$PY" -c 'import torch.distributed' 2>/dev/null; then
	cat >"$tmp/rdzv.py" <<'PYEOF'
import datetime, statistics, sys, threading, time
import torch.distributed as dist
port, n, rounds = int(sys.argv[1]), int(sys.argv[2]), 3
T = datetime.timedelta(seconds=120)
stores = [dist.TCPStore("127.0.0.1", port, n, False, timeout=T) for _ in range(n)]
times = []
for r in range(rounds):
    bar = threading.Barrier(n + 1)
    done = []
    def agent(s):
        bar.wait()
        if s.add("rdzv/%d/count" % r, 1) == n:
            s.set("rdzv/%d/go" % r, "1")
        s.wait(["rdzv/%d/go" % r])
        done.append(time.time())
    ts = [threading.Thread(target=agent, args=(s,)) for s in stores]
    for t in ts: t.start()
    t0 = time.time(); bar.wait()
    for t in ts: t.join()
    times.append((max(done) - t0) * 1e3)
print("%.1f" % statistics.median(times))
PYEOF
	# torch's own server: a master TCPStore in its own process
	"$PY" -c '
import datetime, sys, time, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=600), wait_for_workers=False)
print(s.port, flush=True); time.sleep(3600)' >"$tmp/tport" 2>"$tmp/torch.err" &
	pids+=($!)
	for _ in $(seq 100); do [ -s "$tmp/tport" ] && break; sleep 0.1; done
	tport=$(cat "$tmp/tport")
	for n in 64 256 1024; do
		k=$(timeout 300 "$PY" "$tmp/rdzv.py" "$port" $n 2>"$tmp/py.err") || k="failed"
		t=$(timeout 300 "$PY" "$tmp/rdzv.py" "$tport" $n 2>>"$tmp/py.err") || t="failed"
		echo "| rendezvous ADD+WAIT (torch $("$PY" -c 'import torch; print(torch.__version__)') Python clients) | $n | kiln ${k} ms vs torch TCPStore server ${t} ms |"
	done
else
	echo "| rendezvous with torch clients | - | skipped: $PY has no torch |"
fi
