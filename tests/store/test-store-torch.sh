#!/bin/bash
# test-store-torch.sh — unmodified PyTorch clients against the kiln store.
#
# Starts kiln-store-server on loopback and drives it with Debian's torch 1.13
# (/usr/bin/python3; the pyenv python on PATH has no torch): every TCPStore
# operation torch 1.13 exposes, then a 2-process gloo all_reduce whose
# process group rendezvous goes through the kiln store, once with
# store=TCPStore(...) and once the way a kiln-run worker does it
# (init_method env://, TORCHELASTIC_USE_AGENT_STORE=True, so torch prefixes
# its keys with /worker/attempt_N).  Prints TAP; skips when torch is missing.
set -u
B=${KILN_BUILD:-build}
PY=${KILN_TORCH_PYTHON:-/usr/bin/python3}
SRV=$B/tests/kiln-store-server
tmp=$(mktemp -d)
srv_pid=
cleanup() { [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

echo "1..4"
if ! "$PY" -c 'import torch.distributed' 2>/dev/null; then
	for i in 1 2 3 4; do echo "ok $i # SKIP $PY has no torch.distributed"; done
	exit 0
fi
if [ ! -x "$SRV" ]; then
	echo "Bail out! $SRV not built" ; exit 1
fi
"$SRV" --bind 127.0.0.1 --port 0 --port-file "$tmp/port" --secret "test-secret" --dump-keys >"$tmp/srv.out" 2>"$tmp/srv.err" &
srv_pid=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port" 2>/dev/null)
if [ -z "$port" ]; then echo "Bail out! kiln-store-server did not start: $(cat "$tmp/srv.err")"; exit 1; fi

cat >"$tmp/ops.py" <<'PYEOF'
import datetime, sys
import torch.distributed as dist
port = int(sys.argv[1])
s = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=10))
s.set("k", "v1")
assert s.get("k") == b"v1", s.get("k")
assert s.add("ctr", 5) == 5
assert s.add("ctr", -2) == 3
assert s.get("ctr") == b"3"
s.wait(["k", "ctr"])
assert s.compare_set("k", "v1", "v2") == b"v2"
assert s.compare_set("k", "nope", "v3") == b"v2"
assert s.compare_set("fresh", "", "new") == b"new"
n = s.num_keys()
assert s.delete_key("fresh") is True
assert s.delete_key("fresh") is False
assert s.num_keys() == n - 1
if hasattr(s, "check"):
    assert s.check(["k"]) and not s.check(["missing"])
t0 = datetime.datetime.now()
try:
    s.wait(["never"], datetime.timedelta(milliseconds=300))
    raise SystemExit("wait on a missing key returned")
except RuntimeError:
    pass
# a control key is out of reach for a client without the job secret: the
# store closes the connection
try:
    s2 = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=5))
    s2.set("kiln/secret-stuff", "x")   # torch 1.13 sends "/kiln/secret-stuff"
    s2.get("kiln/secret-stuff")
    raise SystemExit("control key reachable without the secret")
except RuntimeError:
    pass
print("ops ok")
PYEOF

cat >"$tmp/allreduce.py" <<'PYEOF'
import datetime, os, sys
import torch, torch.distributed as dist
mode, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
if mode == "store":
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
else:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="3")
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=30))
t = torch.arange(4, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
exp = torch.arange(4, dtype=torch.float32) * 3
assert torch.equal(t, exp), (t, exp)
dist.barrier()
dist.destroy_process_group()
print("rank", rank, "ok", t.tolist())
PYEOF

n=0
tap() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; sed 's/^/# /' "$3"; fi; }

timeout 60 "$PY" "$tmp/ops.py" "$port" >"$tmp/ops.log" 2>&1
tap $? "torch $("$PY" -c 'import torch; print(torch.__version__)') TCPStore set/get/add/wait/compare_set/delete_key/num_keys against the kiln store" "$tmp/ops.log"

for mode in store env; do
	timeout 90 "$PY" "$tmp/allreduce.py" $mode 0 "$port" >"$tmp/ar0.log" 2>&1 &
	p0=$!
	timeout 90 "$PY" "$tmp/allreduce.py" $mode 1 "$port" >"$tmp/ar1.log" 2>&1
	r1=$?
	wait $p0
	r0=$?
	cat "$tmp/ar0.log" "$tmp/ar1.log" >"$tmp/ar.log"
	if [ $mode = store ]; then
		tap $((r0 | r1)) "gloo all_reduce between 2 processes, init_process_group(store=TCPStore(kiln store))" "$tmp/ar.log"
	else
		tap $((r0 | r1)) "gloo all_reduce, init_method env:// with TORCHELASTIC_USE_AGENT_STORE=True" "$tmp/ar.log"
	fi
done

# The agent-store run must have used torch's /worker/attempt_N prefix: ask
# the store over the wire (a PyTorch client can read worker keys).
"$PY" - "$port" >"$tmp/prefix.log" 2>&1 <<'PYEOF'
import datetime, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, False, timeout=datetime.timedelta(seconds=5))
n = s.num_keys()
assert n > 5, n
print("keys", n)
PYEOF
r=$?
kill "$srv_pid"; wait "$srv_pid" 2>/dev/null; srv_pid=
grep -q "dropped_auth=1" "$tmp/srv.err" && grep -q "^key .*/worker/attempt_3/" "$tmp/srv.err"
r2=$?
cat "$tmp/srv.err" >>"$tmp/prefix.log"; grep -m3 "^key .*/worker/" "$tmp/srv.err" | sed "s/^/# /"
tap $((r | r2)) "store kept serving; one connection dropped for a control key; agent-store keys carry /worker/attempt_3" "$tmp/prefix.log"
