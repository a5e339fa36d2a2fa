#!/bin/bash
# test-store-auth.sh — who may use a job's store on a shared node (issue 31,
# item 4), against kiln-store-server run the way kiln-run runs it:
# --require-auth, the job secret, a relay in front (--relay-port-file).
#
# As `nobody` (setpriv; the suite runs as root, like a root job): the store
# port and the relay port both close the connection at accept, even when
# nobody presents the right secret, and the server logs the peer's uid.  As
# the job's uid: an unauthenticated connection may PING but not touch a key;
# a wrong secret and a wrong relay hello are refused; a relay hello opens the
# worker key space and never the control keys; a second hello is a protocol
# error.  Unmodified torch 1.13 clients work through the relay (every
# TCPStore call, and a 2-process gloo all_reduce with init_method env:// and
# TORCHELASTIC_USE_AGENT_STORE=True), and are refused talking to the store
# directly.  The relay holds at most its cap of connections.  Before this change the store admitted every loopback peer and
# left the worker key space open (test 1 and 2 fail on it).  Prints TAP.
set -u
B=${KILN_BUILD:-build}
PY=${KILN_TORCH_PYTHON:-/usr/bin/python3}
SRV=$B/tests/kiln-store-server
tmp=$(mktemp -d)
chmod 755 "$tmp"
srv_pid=
cleanup() { [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

if [ ! -x "$SRV" ]; then echo "1..0 # SKIP $SRV not built"; exit 0; fi
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
	echo "1..0 # SKIP needs root and setpriv (to play another user)"; exit 0
fi
NOBODY=$(id -u nobody)
SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
"$SRV" --bind 127.0.0.1 --port 0 --port-file "$tmp/port" --relay-port-file "$tmp/relay" \
	--secret "$SECRET" --require-auth --dump-keys >"$tmp/srv.out" 2>"$tmp/srv.err" &
srv_pid=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && [ -s "$tmp/relay" ] && break; sleep 0.1; done
port=$(cat "$tmp/port" 2>/dev/null)
relay=$(cat "$tmp/relay" 2>/dev/null)
if [ -z "$port" ] || [ -z "$relay" ]; then echo "Bail out! kiln-store-server did not start: $(cat "$tmp/srv.err")"; exit 1; fi

# The raw-protocol client both users run.
cat >"$tmp/raw.py" <<'PYEOF'
import socket, struct
MAGIC = struct.pack("<BI", 0, 0x3C85F7CE)
def s_(b):
    return struct.pack("<Q", len(b)) + b
def hello(secret):
    return b"K" + struct.pack("<I", 0x574E4C4B) + s_(secret)
def conn(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
def recvn(s, k):
    b = b""
    while len(b) < k:
        d = s.recv(k - len(b))
        if not d:
            raise ConnectionError("closed")
        b += d
    return b
def closed(s):
    """True when the server closed the connection (EOF or reset) instead of answering."""
    try:
        return s.recv(1) == b""
    except (ConnectionError, socket.timeout):
        return True
def ping(s, nonce=7):
    s.sendall(bytes([13]) + struct.pack("<I", nonce))
    return struct.unpack("<I", recvn(s, 4))[0] == nonce
def auth(s, secret):
    s.sendall(bytes([2]) + s_(b"/kiln/.auth") + s_(secret) + s_(b""))
    n = struct.unpack("<Q", recvn(s, 8))[0]
    return recvn(s, n) == b"ok"
def set_(s, k, v):
    s.sendall(bytes([1]) + s_(k) + s_(v))
def get(s, k):
    s.sendall(bytes([3]) + s_(k))
    n = struct.unpack("<Q", recvn(s, 8))[0]
    return recvn(s, n)
PYEOF

# What `nobody` tries: read the job's NCCL id, end the job with a false
# success (what kiln-run's agents read as the end), through the store port
# and through the relay, with and without the job's secret.
cat >"$tmp/attack.py" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
from raw import *
port, relay, secret = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
res = []
for name, p, pre in (("store", port, b""), ("store+secret", port, b""), ("relay", relay, b"")):
    try:
        s = conn(p)
        s.sendall(MAGIC)
        if name == "store+secret":
            ok = auth(s, secret)
        else:
            ok = ping(s)
        set_(s, b"/kiln/result", b"0 pwned")
        v = get(s, b"kiln/round_1/comm_id")
        res.append("%s:open" % name)
    except Exception as e:
        res.append("%s:refused" % name)
print(" ".join(res))
PYEOF

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else nok "$name" "command: $*"; fi; }
echo "1..9"

# The job's own worker key and a control key, set the way the job would.
"$PY" - "$tmp" "$port" "$SECRET" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
from raw import *
s = conn(int(sys.argv[2])); s.sendall(MAGIC); assert auth(s, sys.argv[3].encode())
set_(s, b"/kiln/round_1/comm_id", b"the-nccl-id"); set_(s, b"/kiln/closed", b"0")
assert get(s, b"/kiln/round_1/comm_id") == b"the-nccl-id"
PYEOF

out=$(setpriv --reuid="$NOBODY" --regid="$(id -g nobody)" --clear-groups "$PY" "$tmp/attack.py" "$tmp" "$port" "$relay" "$SECRET" 2>&1)
check "nobody: the store port closes at accept, even with the job's secret (got: $out)" \
	test "$(echo "$out" | tr ' ' '\n' | grep -c ':refused$')" -ge 2 -a "$(echo "$out" | grep -c 'store:refused store+secret:refused')" = 1
check "nobody: the relay port (workers' MASTER_PORT) closes at accept" grep -q "relay:refused" <<<"$out"
check "the refusals are logged with the peer's uid ($NOBODY)" \
	bash -c "grep -q 'refused: 127.0.0.1:[0-9]*: a process of uid $NOBODY on this node' '$tmp/srv.err' && grep -q 'refused: relay: 127.0.0.1:[0-9]*: a process of uid $NOBODY' '$tmp/srv.err'"

"$PY" - "$tmp" "$port" "$relay" "$SECRET" >"$tmp/same.log" 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
from raw import *
port, relay, secret = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
# no secret: PING yes, any key no
s = conn(port); s.sendall(MAGIC); assert ping(s)
s.sendall(bytes([3]) + s_(b"some/worker/key")); assert closed(s), "worker key without auth"
# the old derived secret, and any wrong one
s = conn(port); s.sendall(MAGIC)
s.sendall(bytes([2]) + s_(b"/kiln/.auth") + s_(b"kiln-job-sim-0-uid-0") + s_(b""))
n = struct.unpack("<Q", recvn(s, 8))[0]; assert recvn(s, n) == b"denied"; assert closed(s)
# relay hellos straight to the store: wrong secret, twice, then a control key
s = conn(port); s.sendall(hello(b"wrong") + MAGIC); assert closed(s), "wrong hello"
s = conn(port); s.sendall(hello(secret) + hello(secret)); assert closed(s), "second hello"
s = conn(port); s.sendall(hello(secret) + MAGIC); assert ping(s)
s.sendall(bytes([3]) + s_(b"/kiln/round_1/comm_id")); assert closed(s), "control key after hello"
# a hello leaves the dialect to the worker: torch 1.13 numbering (GET = 2)
s = conn(port); s.sendall(hello(secret))
s.sendall(bytes([0]) + s_(b"/w/k") + s_(b"v1"))
s.sendall(bytes([2]) + s_(b"/w/k")); n = struct.unpack("<Q", recvn(s, 8))[0]; assert recvn(s, n) == b"v1"
# through the relay, as the job's uid: worker keys yes, control keys no
s = conn(relay); s.sendall(MAGIC); assert ping(s)
set_(s, b"/w/r", b"x"); assert get(s, b"/w/r") == b"x"
s.sendall(bytes([3]) + s_(b"/kiln/result")); assert closed(s), "control key through the relay"
print("same-uid ok")
PYEOF
r=$?
check "job's uid: no secret = PING only; wrong secret, wrong/second hello, control key after a hello: closed; a hello keeps torch 1.13 numbering; the relay serves worker keys only" test $r -eq 0
[ $r -eq 0 ] || sed 's/^/# /' "$tmp/same.log"

# The relay's connection cap: 1100 connections from the job's uid, each
# PINGing the store through the relay: KILN_STORE_RELAY_CONN_MAX (1024) are
# served, the rest closed; once they close, the relay serves a new one.
"$PY" - "$tmp" "$relay" >"$tmp/flood.log" 2>&1 <<'PYEOF'
import resource, sys
sys.path.insert(0, sys.argv[1])
from raw import *
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20000), hard))
relay = int(sys.argv[2])
conns, served = [], 0
for i in range(1100):
    s = conn(relay)
    conns.append(s)
for s in conns:
    try:
        s.sendall(MAGIC)
        served += ping(s)
    except Exception:
        pass
for s in conns:
    s.close()
import time
time.sleep(0.5)
s = conn(relay); s.sendall(MAGIC); again = ping(s)
print("served", served, "again", again)
assert served == 1024 and again, (served, again)
PYEOF
r=$?
check "relay: 1100 connections, 1024 (its cap) served and the rest closed; after they close a new one is served ($(tail -1 "$tmp/flood.log"))" test $r -eq 0

if ! "$PY" -c 'import torch.distributed' 2>/dev/null; then
	for t in "torch through the relay" "torch direct refused" "gloo all_reduce through the relay"; do
		n=$((n + 1)); echo "ok $n # SKIP $PY has no torch.distributed ($t)"
	done
else
	cat >"$tmp/ops.py" <<'PYEOF'
import datetime, sys
import torch.distributed as dist
port = int(sys.argv[1])
s = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=10))
s.set("k", "v1")
assert s.get("k") == b"v1", s.get("k")
assert s.add("ctr", 5) == 5
s.wait(["k", "ctr"])
assert s.compare_set("k", "v1", "v2") == b"v2"
assert s.delete_key("k") is True
assert s.num_keys() >= 1
try:
    s.wait(["never"], datetime.timedelta(milliseconds=300))
    raise SystemExit("wait on a missing key returned")
except RuntimeError:
    pass
try:
    s.set("kiln/result", "0 pwned")   # torch 1.13 sends "/kiln/result"
    s.get("kiln/result")
    raise SystemExit("control key reachable through the relay")
except RuntimeError:
    pass
print("ops ok")
PYEOF
	timeout 60 "$PY" "$tmp/ops.py" "$relay" >"$tmp/ops.log" 2>&1
	r=$?
	check "torch $("$PY" -c 'import torch; print(torch.__version__)') TCPStore through the relay: set/get/add/wait/compare_set/delete_key/num_keys; control keys refused" test $r -eq 0
	[ $r -eq 0 ] || sed 's/^/# /' "$tmp/ops.log"
	timeout 30 "$PY" - "$port" >"$tmp/direct.log" 2>&1 <<'PYEOF'
import datetime, sys
import torch.distributed as dist
try:
    s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, False, timeout=datetime.timedelta(seconds=3))
    s.set("k", "v")
    s.get("k")
except RuntimeError:
    print("refused"); raise SystemExit(0)
raise SystemExit("a torch client reached the worker key space without the relay")
PYEOF
	r=$?
	check "torch straight to a --require-auth store (no relay): refused" test $r -eq 0
	[ $r -eq 0 ] || sed 's/^/# /' "$tmp/direct.log"
	cat >"$tmp/allreduce.py" <<'PYEOF'
import datetime, os, sys
import torch, torch.distributed as dist
rank, port = int(sys.argv[1]), int(sys.argv[2])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                  TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="1",
                  GLOO_SOCKET_IFNAME="lo")
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=30))
t = torch.arange(4, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
assert torch.equal(t, torch.arange(4, dtype=torch.float32) * 3), t
dist.barrier()
dist.destroy_process_group()
print("rank", rank, "ok")
PYEOF
	timeout 90 "$PY" "$tmp/allreduce.py" 0 "$relay" >"$tmp/ar0.log" 2>&1 &
	p0=$!
	timeout 90 "$PY" "$tmp/allreduce.py" 1 "$relay" >"$tmp/ar1.log" 2>&1
	r1=$?
	wait $p0
	r0=$?
	check "gloo all_reduce between 2 processes through the relay (env://, TORCHELASTIC_USE_AGENT_STORE=True)" test $((r0 | r1)) -eq 0
	[ $((r0 | r1)) -eq 0 ] || sed 's/^/# /' "$tmp/ar0.log" "$tmp/ar1.log"
fi

kill "$srv_pid"; wait "$srv_pid" 2>/dev/null; srv_pid=
check "the store kept serving: the job's keys intact, /kiln/result never set, refused_uid counted" \
	bash -c "grep -q '^key /kiln/round_1/comm_id' '$tmp/srv.err' && ! grep -q '^key /kiln/result' '$tmp/srv.err' && grep -q 'refused_uid=[1-9]' '$tmp/srv.err'"
[ "$(grep -c '' "$tmp/srv.err")" -gt 0 ] && grep -E '^(stats|refused)' "$tmp/srv.err" | head -5 | sed 's/^/# /'
exit 0
