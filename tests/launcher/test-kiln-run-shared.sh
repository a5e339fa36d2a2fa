#!/bin/bash
# kiln-run on a node shared with other users (issue 31, item 4): the
# exploit that ended a root job with a false success, as a test.
#
# Two agents on loopback play a 2-node job (KILN_RUN_SIM_NODES) whose
# workers run ~6 s and then exit 3 (--max-restarts 0: the job must exit 3).
# While it runs, `nobody` (setpriv; the suite runs as root) tries what the
# old store allowed: connect to the store port and to every port kiln-run
# listens on, present the secret the old kiln-run derived without
# KILN_RUN_SECRET ("kiln-job-<jobid>-uid-<uid>"), read
# kiln/round_1/comm_id, write /kiln/result = "0 ..." and bump /kiln/closed.
# Every connection must be closed at accept, each refusal logged with uid
# 65534, and the job must still end with the workers' 3 (not 0, early).
# The old kiln-run, with no KILN_RUN_SECRET, served all of it: both agents
# exited 0 within a second.  Now a multi-node job without KILN_RUN_SECRET
# gets its secret through MUNGE, or, where munged does not answer, refuses
# to start (exit 2, saying what, why and how to fix); a single-node run
# makes a random secret.  MUNGE runs as a private munged (throwaway key)
# that each agent sees at /run/munge through its own mount namespace, as
# tests/cluster/cluster.sh gives each slurmd; an empty /run/munge plays a
# node without munged.  TAP.
set -u
# shellcheck source=tests/launcher/local-env.sh
. "$(dirname "$0")/local-env.sh" kiln-run-shared
PY=/usr/bin/python3
if [ -e /etc/kiln/cluster.cfg ]; then echo "1..0 # SKIP /etc/kiln/cluster.cfg exists; these tests need no cluster file"; exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null || ! command -v ss >/dev/null; then
	echo "1..0 # SKIP needs root, setpriv and ss (to play another user)"; exit 0
fi
chmod 755 "$T"
NOBODY=$(id -u nobody)
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else nok "$name" "command: $*"; fi; }
port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# start_agent DIR ID PORT ARGS...: with $MUNGE_DIR (if set) at /run/munge
start_agent() {
	local dir=$1 id=$2 p=$3; shift 3
	KILN_RUN_SIM_NODES='sim[1-2]' KILN_RUN_SIM_NODE_ID=$id setsid unshare -m sh -c \
		'mount --bind "$1" /run/munge && shift && exec "$@"' sh "$MUNGE_DIR" "$KR" --port "$p" "$@" \
		>"$dir/a$id.out" 2>"$dir/a$id.err" </dev/null &
	echo $! >"$dir/a$id.pid"
	pids+=($!)
}
mkdir -p /run/munge "$T/nomunge"
# a private munged, stopped at exit
M=$T/munge
mkdir -p "$M"; chmod 755 "$M"
mungekey -c -k "$M/munge.key" 2>/dev/null || dd if=/dev/urandom of="$M/munge.key" bs=1024 count=1 status=none
chmod 600 "$M/munge.key"
if command -v munged >/dev/null && munged --key-file="$M/munge.key" --socket="$M/munge.socket.2" \
	--pid-file="$M/munged.pid" --log-file="$M/munged.log" --seed-file="$M/munged.seed" --force; then
	trap 'kill "$(cat "$M/munged.pid")" 2>/dev/null; cleanup' EXIT
	have_munge=1
else
	have_munge=0
fi
echo "1..10"

# The attack: every port given, with no secret and with the old derived one.
cat >"$T/attack.py" <<'PYEOF'
import socket, struct, sys, threading
MAGIC = struct.pack("<BI", 0, 0x3C85F7CE)
def s_(b): return struct.pack("<Q", len(b)) + b
def recvn(s, k):
    b = b""
    while len(b) < k:
        d = s.recv(k - len(b))
        if not d: raise ConnectionError("closed")
        b += d
    return b
def vec(s): return recvn(s, struct.unpack("<Q", recvn(s, 8))[0])
served = []
def attack(p):
    # (a) no secret: the worker key space (the job's NCCL id)
    try:
        s = socket.create_connection(("127.0.0.1", int(p)), timeout=2)
        s.sendall(MAGIC + bytes([3]) + s_(b"kiln/round_1/comm_id")); vec(s)
        served.append(p + ":comm_id")
    except Exception:
        pass
    # (b) the secret the old kiln-run derived: end the job with "success"
    try:
        s = socket.create_connection(("127.0.0.1", int(p)), timeout=2)
        s.sendall(MAGIC + bytes([2]) + s_(b"/kiln/.auth") + s_(sys.argv[1].encode()) + s_(b""))
        vec(s)
        s.sendall(bytes([1]) + s_(b"/kiln/result") + s_(b"0 pwned"))
        s.sendall(bytes([4]) + s_(b"/kiln/closed") + struct.pack("<q", 1)); recvn(s, 8)
        served.append(p + ":result")
    except Exception:
        pass
# every port at once: a port that hangs (the live socket waits for a line)
# must not delay the others past the job's end
ts = [threading.Thread(target=attack, args=(p,)) for p in sys.argv[2:]]
for t in ts: t.start()
for t in ts: t.join()
print("served:", " ".join(served) if served else "none")
PYEOF

# 1. The exploit as reported: no KILN_RUN_SECRET, two nodes, nobody attacks
# while the workers run.  The old kiln-run started with a secret derived from
# the job id and uid, and nobody's /kiln/result ended it at once with exit 0.
# Now both agents refuse to start, exit 2, saying what, why and how to fix.
d=$T/nosecret; mkdir -p "$d"; p=$(port)
unset KILN_RUN_SECRET
MUNGE_DIR=$T/nomunge
for i in 0 1; do start_agent "$d" $i "$p" --max-restarts 0 --no-prefix-output -- sh -c 'echo started; sleep 6; exit 3'; done
for _ in $(seq 50); do
	[ "$(grep -c started "$d"/a*.out 2>/dev/null | awk -F: '{s += $2} END {print s + 0}')" -ge 2 ] && break
	kill -0 "$(cat "$d/a0.pid")" 2>/dev/null || kill -0 "$(cat "$d/a1.pid")" 2>/dev/null || break
	sleep 0.1
done
ports=$(ss -Hltnp | grep -E "pid=($(cat "$d/a0.pid")|$(cat "$d/a1.pid"))," | awk '{n = split($4, a, ":"); print a[n]}' | sort -u | tr '\n' ' ')
[ -n "$ports" ] && setpriv --reuid="$NOBODY" --regid="$(id -g nobody)" --clear-groups "$PY" "$T/attack.py" "kiln-job-sim-$(id -u)-uid-$(id -u)" $ports >"$d/attack.out" 2>&1
rcs=""
for i in 0 1; do wait "$(cat "$d/a$i.pid")"; rcs="$rcs$?"; done
check "no KILN_RUN_SECRET on a 2-node job: both agents refuse to start, exit 2; never a false 0 ($rcs; attack: $(cat "$d/attack.out" 2>/dev/null || echo 'nothing to attack'))" test "$rcs" = 22
check "the message says what, why and how (kiln-run --make-secret)" \
	bash -c "grep -q 'KILN_RUN_SECRET is not set, this job has 2 nodes, and MUNGE cannot hand out a secret here' '$d/a0.err' && grep -q 'other users on these nodes' '$d/a0.err' && grep -q 'kiln-run --make-secret' '$d/a0.err'"

# 2. The attack on a running job, now with a secret.
d=$T/attack; mkdir -p "$d"; p=$(port)
export KILN_RUN_SECRET=$("$KR" --make-secret)
MUNGE_DIR=$T/nomunge
t0=$(date +%s.%N)
for i in 0 1; do start_agent "$d" $i "$p" --max-restarts 0 --no-prefix-output -- sh -c 'echo started; sleep 6; exit 3'; done
for _ in $(seq 100); do [ "$(grep -c started "$d"/a*.out 2>/dev/null | awk -F: '{s += $2} END {print s + 0}')" -ge 2 ] && break; sleep 0.1; done
# every TCP port the two agents listen on: the store, the live socket, the relays
ports=$(ss -Hltnp | grep -E "pid=($(cat "$d/a0.pid")|$(cat "$d/a1.pid"))," | awk '{n = split($4, a, ":"); print a[n]}' | sort -u | tr '\n' ' ')
out=$(setpriv --reuid="$NOBODY" --regid="$(id -g nobody)" --clear-groups "$PY" "$T/attack.py" "kiln-job-sim-$(id -u)-uid-$(id -u)" $ports 2>&1)
rcs=""
for i in 0 1; do wait "$(cat "$d/a$i.pid")"; rcs="$rcs$?"; done
t1=$(date +%s.%N)
check "nobody reached none of the job's ports ($(echo $ports | wc -w) tried: $out)" test "$out" = "served: none" -a "$(echo $ports | wc -w)" -ge 3
check "the job was not ended by the attacker: both agents exit 3, the workers' code, after they ran (got $rcs after $(echo "$t0 $t1" | awk '{printf "%.1f", $2 - $1}') s)" \
	awk -v rcs="$rcs" -v t="$(echo "$t0 $t1" | awk '{print $2 - $1}')" 'BEGIN { exit !(rcs == "33" && t >= 5) }'
check "each refusal is logged in the job's output with uid $NOBODY" \
	bash -c "cat '$d'/a*.err | grep -q 'Refused a connection to this job.s store: .*a process of uid $NOBODY'"

# 3. A single node without KILN_RUN_SECRET makes a random one (no
# fallback, no warning) and the workers never see it.
unset KILN_RUN_SECRET
"$KR" --nproc-per-node 1 --no-prefix-output -- sh -c 'echo "${KILN_RUN_SECRET:-nosecret} $MASTER_ADDR"' >"$T/single.out" 2>"$T/single.err"
check "single node without KILN_RUN_SECRET: runs (random secret), workers get no secret and the relay on 127.0.0.1" \
	bash -c "test \$? = 0 && grep -qx 'nosecret 127.0.0.1' '$T/single.out' && ! grep -qi 'secret' '$T/single.err'"

# 4. MUNGE: no KILN_RUN_SECRET, two nodes, munged up.  The store host makes
# the secret and hands it to the other agent; nobody is still refused
# everywhere; the job ends with its workers' 3.  A credential made by
# nobody (as if taken off the network) or for another job, presented to the
# store by the job's own uid, is refused, and so logged.
if [ "$have_munge" = 1 ]; then
	d=$T/munge-job; mkdir -p "$d"; p=$(port)
	unset KILN_RUN_SECRET
	MUNGE_DIR=$M
	for i in 0 1; do start_agent "$d" $i "$p" --max-restarts 0 --no-prefix-output -- sh -c 'echo started; sleep 6; exit 3'; done
	for _ in $(seq 100); do [ "$(grep -c started "$d"/a*.out 2>/dev/null | awk -F: '{s += $2} END {print s + 0}')" -ge 2 ] && break; sleep 0.1; done
	ports=$(ss -Hltnp | grep -E "pid=($(cat "$d/a0.pid")|$(cat "$d/a1.pid"))," | awk '{n = split($4, a, ":"); print a[n]}' | sort -u | tr '\n' ' ')
	out=$(setpriv --reuid="$NOBODY" --regid="$(id -g nobody)" --clear-groups "$PY" "$T/attack.py" "kiln-job-sim-$(id -u)-uid-$(id -u)" $ports 2>&1)
	# stolen and foreign credentials, presented as the job's uid
	cat >"$T/token.py" <<'PYEOF'
import socket, struct, sys
MAGIC = struct.pack("<BI", 0, 0x3C85F7CE)
def s_(b): return struct.pack("<Q", len(b)) + b
res = []
for cred in sys.argv[2:]:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    s.sendall(MAGIC + bytes([2]) + s_(b"/kiln/.token") + s_(cred.encode()) + s_(b""))
    b = b""
    while True:
        d = s.recv(4096)
        if not d: break
        b += d
    res.append("denied" if b[8:] == b"denied" else "accepted")
print(" ".join(res))
PYEOF
	c_nobody=$(setpriv --reuid="$NOBODY" --regid="$(id -g nobody)" --clear-groups munge -S "$M/munge.socket.2" -s "kiln-run agent of job sim-$(id -u)")
	c_other=$(munge -S "$M/munge.socket.2" -s "kiln-run agent of job 4242")
	tok=$("$PY" "$T/token.py" "$p" "$c_nobody" "$c_other" 2>&1)
	rcs=""
	for i in 0 1; do wait "$(cat "$d/a$i.pid")"; rcs="$rcs$?"; done
	check "MUNGE: no KILN_RUN_SECRET on 2 nodes: the second agent got the secret from the store host" \
		grep -q 'Got the job secret from the store host through MUNGE' "$d/a1.err"
	grep -q 'Got the job secret' "$d/a1.err" || sed 's/^/# /' "$d/a0.err" "$d/a1.err" "$M/munged.log"
	check "MUNGE: nobody reached none of the job's $(echo $ports | wc -w) ports ($out); the job exits 3, its workers' code (got $rcs)" \
		test "$out" = "served: none" -a "$rcs" = 33 -a "$(echo $ports | wc -w)" -ge 3
	check "MUNGE: a credential made by nobody, and one made for another job, are refused ($tok)" \
		test "$tok" = "denied denied"
	check "MUNGE: the store host logs why (uid $NOBODY; another job)" \
		bash -c "grep -q 'Refused an agent.s MUNGE credential: made by uid $NOBODY' '$d/a0.err' && grep -q 'Refused a MUNGE credential made for something else than this job' '$d/a0.err'"
else
	for t in 1 2 3 4; do n=$((n + 1)); echo "ok $n # SKIP munged not installed or does not start"; done
fi
