#!/bin/bash
# test-store-hostile.sh — hostile and heavy clients against kiln-store-server.
#
# Random bytes, lengths of 2^63 in every length field, a request that stops
# half-way, the wrong job secret, bad relay hellos, 1000 idle connections and 4096 concurrent
# clients doing a rendezvous (ADD a counter, WAIT on a key).  After each the
# store must still answer a PING promptly, and its peak RSS (VmHWM) must stay
# under a bound.  Prints TAP.
set -u
B=${KILN_BUILD:-build}
PY=/usr/bin/python3
SRV=$B/tests/kiln-store-server
tmp=$(mktemp -d)
srv_pid=
cleanup() { [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

if [ ! -x "$SRV" ]; then echo "1..0 # SKIP $SRV not built"; exit 0; fi
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
"$SRV" --bind 127.0.0.1 --port 0 --port-file "$tmp/port" --secret "right-secret" >"$tmp/srv.out" 2>"$tmp/srv.err" &
srv_pid=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port" 2>/dev/null)
if [ -z "$port" ]; then echo "Bail out! kiln-store-server did not start: $(cat "$tmp/srv.err")"; exit 1; fi

# RSS bounds mean nothing under ASan (freed memory sits in its quarantine)
asan=0
grep -q __asan_init "$SRV" && asan=1
"$PY" - "$port" "$srv_pid" "$asan" <<'PYEOF'
import os, random, resource, socket, struct, sys, time
port, pid, asan = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20000), hard))
RSS_LIMIT_MB = 160  # the store's own caps: 256 MiB of buffers in all; these tests stay far below
MAGIC = struct.pack("<BI", 0, 0x3C85F7CE)
n = 0
def tap(ok, name, diag="", rss=False):
    global n
    n += 1
    if rss and asan:
        print("ok", n, "# SKIP", name, "(ASan build)", flush=True)
        return
    print(("ok" if ok else "not ok"), n, "-", name, flush=True)
    if not ok and diag:
        print("# " + str(diag).replace("\n", "\n# "), flush=True)
def status(field):
    for l in open("/proc/%d/status" % pid):
        if l.startswith(field):
            return int(l.split()[1]) // 1024
def conn():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
def s_(b):
    return struct.pack("<Q", len(b)) + b
def recvn(s, k):
    b = b""
    while len(b) < k:
        d = s.recv(k - len(b))
        if not d:
            raise ConnectionError("closed")
        b += d
    return b
def closed(s):
    try:
        s.settimeout(5)
        while True:
            d = s.recv(65536)
            if not d:
                return True
    except socket.timeout:
        return False
    except OSError:
        return True
        return False
def ping():
    s = conn()
    t = time.time()
    s.sendall(MAGIC + struct.pack("<BI", 13, 0x1234abcd))
    ok = recvn(s, 4) == struct.pack("<I", 0x1234abcd)
    dt = time.time() - t
    s.close()
    return ok and dt < 1.0, dt
def alive(name):
    ok, dt = ping()
    tap(ok, "%s: store still answers (ping %.1f ms)" % (name, dt * 1e3))

print("1..16", flush=True)
base = status("VmRSS")
random.seed(1)

# 1. random bytes, both dialects' first bytes, many connections
dropped = 0
for i in range(300):
    s = conn()
    blob = os.urandom(random.choice([1, 7, 64, 4096, 65536]))
    if i % 2:
        blob = MAGIC + blob
    try:
        s.sendall(blob)
        s.shutdown(socket.SHUT_WR)
        dropped += closed(s)
    except OSError:  # the store closed first: reset, broken pipe, not connected
        dropped += 1
    s.close()
tap(dropped == 300, "300 connections of random bytes: each rejected or ended by the store, none left hanging", dropped)
alive("random bytes")

# 2. 2^63 in every length field of every request type, 1.13 and 2.x numbering
huge = struct.pack("<Q", 1 << 63)
cases = []
for op in (1, 2, 3, 4, 8, 9):  # 2.x: SET COMPARE_SET GET ADD DELETE_KEY APPEND: key length
    cases.append(MAGIC + bytes([op]) + huge)
for op in (5, 6, 10, 11):      # 2.x: CHECK WAIT MULTI_GET MULTI_SET: count, then key length
    cases.append(MAGIC + bytes([op]) + huge)
    cases.append(MAGIC + bytes([op]) + struct.pack("<Q", 1) + huge)
cases.append(MAGIC + bytes([1]) + s_(b"k") + huge)          # SET value length
cases.append(MAGIC + bytes([2]) + s_(b"k") + s_(b"") + huge) # COMPARE_SET desired length
for op in (0, 1, 2, 3, 8):     # 1.13: SET COMPARE_SET GET ADD DELETE_KEY
    cases.append(bytes([op]) + huge)
for op in (4, 5):              # 1.13: CHECK WAIT
    cases.append(bytes([op]) + huge)
ok = 0
for c in cases:
    s = conn()
    try:
        s.sendall(c)
    except OSError:
        pass
    ok += closed(s)
    s.close()
tap(ok == len(cases), "length 2^63 in %d request shapes: every connection closed at once" % len(cases), ok)
alive("2^63 lengths")

# 3. a request that declares a 4 MiB value and stops half-way, on 8 connections
half = []
for i in range(8):
    s = conn()
    s.sendall(MAGIC + bytes([1]) + s_(b"/worker/big%d" % i) + struct.pack("<Q", 4 << 20) + b"x" * (2 << 20))
    half.append(s)
time.sleep(0.3)
mid = status("VmRSS")
alive("half-sent 4 MiB values")
for s in half:
    s.close()

# 4. the wrong secret
denied = 0
for i in range(100):
    s = conn()
    s.sendall(MAGIC + bytes([2]) + s_(b"/kiln/.auth") + s_(b"wrong-secret-%d" % i) + s_(b""))
    try:
        r = recvn(s, 8 + 6)
        denied += r[8:] == b"denied" and closed(s)
    except ConnectionError:
        pass
    s.close()
s = conn()
s.sendall(MAGIC + bytes([2]) + s_(b"/kiln/.auth") + s_(b"right-secret") + s_(b""))
good = recvn(s, 10)[8:] == b"ok"
s.sendall(bytes([1]) + s_(b"/kiln/ctl") + s_(b"1") + bytes([7]))
good = good and struct.unpack("<q", recvn(s, 8))[0] >= 1
s.close()
tap(denied == 100 and good, "100 wrong secrets denied and closed; the right one unlocks control keys", (denied, good))
alive("wrong secrets")

# 4b. relay hellos (WORKER_HELLO, 'K'): 100 with wrong secrets, a hello
# whose secret length is 2^63, one with a bad magic, a second hello, a hello
# after VALIDATE, and a right hello followed by a control key: each closed;
# a right hello then serves the worker key space in either dialect.
def hello(sec, magic=0x574E4C4B):
    return b"K" + struct.pack("<I", magic) + s_(sec)
bad = 0
for i in range(100):
    s = conn()
    s.sendall(hello(b"wrong-secret-%d" % i) + MAGIC + bytes([13]) + struct.pack("<I", 1))
    bad += closed(s)
    s.close()
cases = [b"K" + struct.pack("<I", 0x574E4C4B) + struct.pack("<Q", 1 << 63),
         hello(b"right-secret", magic=0x12345678),
         hello(b"right-secret") + hello(b"right-secret"),
         MAGIC + hello(b"right-secret"),
         hello(b"right-secret") + MAGIC + bytes([3]) + s_(b"/kiln/ctl")]
for c in cases:
    s = conn()
    s.sendall(c)
    bad += closed(s)
    s.close()
s = conn()
s.sendall(hello(b"right-secret") + bytes([0]) + s_(b"/w/h") + s_(b"v") + bytes([2]) + s_(b"/w/h"))
served = recvn(s, 9) == struct.pack("<Q", 1) + b"v"
s.close()
tap(bad == 105 and served, "100 wrong relay hellos, a 2^63 secret, a bad magic, a second or late hello, a control key after a hello: all closed; a right hello serves worker keys", (bad, served))
alive("relay hellos")

# 5. a client that pipelines GETs of a 1 MiB value and never reads the replies
s = conn()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
s.sendall(MAGIC + bytes([1]) + s_(b"/worker/mib") + s_(b"m" * (1 << 20)))
req = bytes([3]) + s_(b"/worker/mib")
try:
    for _ in range(200):
        s.sendall(req)
except OSError:
    pass
time.sleep(0.5)
ok = closed(s)
s.close()
tap(ok, "a client that never reads 200 MiB of replies is closed at its output cap")
alive("non-reading client")

# 6. 1000 idle connections held open
pre_idle = status("VmRSS")
idle = [conn() for _ in range(1000)]
time.sleep(0.2)
ok, dt = ping()
tap(ok, "1000 idle connections open: store answers in %.1f ms" % (dt * 1e3))
rss_idle = status("VmRSS")
tap(rss_idle - pre_idle < 32, "1000 idle connections cost %d MiB of RSS (< 32)" % (rss_idle - pre_idle), rss=True)

# 7. 4096 concurrent clients (on top of the 1000 idle): ADD a counter, WAIT
t0 = time.time()
cl = [conn() for _ in range(4096)]
for s in cl:
    s.sendall(MAGIC + bytes([4]) + s_(b"/worker/rdzv/count") + struct.pack("<q", 1))
vals = sorted(struct.unpack("<q", recvn(s, 8))[0] for s in cl)
for s in cl:
    s.sendall(bytes([6]) + struct.pack("<Q", 1) + s_(b"/worker/rdzv/go"))
g = conn()
g.sendall(MAGIC + bytes([1]) + s_(b"/worker/rdzv/go") + s_(b"1"))
woke = sum(recvn(s, 1) == b"\x00" for s in cl)
dt = time.time() - t0
tap(vals == list(range(1, 4097)) and woke == 4096,
    "4096 concurrent clients: counter 1..4096 exact, all 4096 woken by one SET (%.2f s)" % dt, (vals[:3], vals[-3:], woke))
for s in cl + idle + [g]:
    s.close()
alive("4096 clients")

hwm = status("VmHWM")
tap(hwm < RSS_LIMIT_MB, "peak RSS %d MiB < %d MiB (base %d, with 16 MiB half-sent %d)" % (hwm, RSS_LIMIT_MB, base, mid), rss=True)
PYEOF
rc=$?
kill "$srv_pid"; wait "$srv_pid" 2>/dev/null; srv_pid=
sed 's/^/# /' "$tmp/srv.err"
exit $rc
