#!/bin/bash
# test-serve-hostile.sh — kiln serve against hostile clients, on loopback
# (issue 31): path traversal in every encoding MHD decodes (%2e%2e, %2f,
# %00, double encoding) never leaves the image directory nor reaches a
# secret; an oversized header gets 431; a dribbling client is cut at the
# idle timeout; 1,000 idle sockets (from 250 addresses, past the per-client
# cap) while a real client is still served; 200 parallel image downloads,
# each from its own address, with the throughput and kiln serve's RSS
# printed.  Prints TAP.
set -uo pipefail
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
# shellcheck source=tests/serve/serve-env.sh
. "$here/serve-env.sh"
if [ "$(id -u)" != 0 ]; then
	skip "needs root: root-owned secret files"
	tap_done
	exit 0
fi
W=$(mktemp -d /tmp/kiln-serve-hostile.XXXXXX)
trap 'serve_stop >/dev/null 2>&1; rm -rf "$W"' EXIT
D=$W/site
serve_site "$D"
# the image for the parallel downloads: 32 MB x 200 = 6.4 GB through loopback
SIZE=$((32 * 1024 * 1024))
head -c "$SIZE" /dev/urandom >"$D/img/big.img" && chmod 644 "$D/img/big.img"
printf 'OUTSIDE-MARKER\n' >"$D/outside.txt"
ulimit -n 8192
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$SERVE_PID/status"; }
hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$SERVE_PID/status"; }
alive() { [ "$(code "$SERVE_URL/boot.ipxe")" = 200 ]; }

ok "kiln serve starts (idle timeout 3 s)" serve_start "$D" --idle-timeout 3

# ---- path traversal: raw, encoded, double-encoded, NUL -----------------------
leak=0 n=0 codes=''
for p in '/kiln/../outside.txt' '/kiln/../../etc/passwd' '/kiln/%2e%2e/outside.txt' \
	'/kiln/%2E%2E/%2E%2E/etc/passwd' '/kiln/..%2foutside.txt' '/kiln/%2e%2e%2f%2e%2e%2fetc%2fpasswd' \
	'/kiln/%252e%252e%252foutside.txt' '/kiln/.%2e/outside.txt' '/kiln/secret/..%2f..%2fmunge.key' \
	'/kiln/ipxe/..%2f..%2fsecret%2fmunge.key' '/kiln/vmlinuz%00/../../etc/passwd' \
	'/kiln/%2fetc%2fpasswd' '/kiln//etc/passwd' '/kiln/\..\outside.txt' '/kiln/..%5coutside.txt' \
	'/kiln/%c0%ae%c0%ae/outside.txt' '/kiln/munge.key' '/munge.key' '/kiln/secret%2fmunge.key'; do
	n=$((n + 1))
	c=$(curl -s --path-as-is -o "$W/t" -w '%{http_code}' "http://127.0.0.1:$SERVE_PORT$p")
	codes+=" $c"
	if [ "$c" = 200 ] || grep -q -e OUTSIDE-MARKER -e 'root:x:0:0' "$W/t" || cmp -s "$W/t" "$D/munge.key"; then
		leak=$((leak + 1)); diag "$p: HTTP $c"
	fi
done
ok "$n traversal paths (%2e%2e, %2f, %00, %252e, \\, overlong UTF-8): none answered 200 or leaked" test "$leak" = 0
diag "answers:$codes"
# shellcheck disable=SC2086 # one code a word
bad_codes=$(printf '%s\n' $codes | grep -v -x -e 404 -e 400 -e 403)
ok "  ... each a 404 or 400 (403 for the one that decodes to secret/munge.key: refused)" test -z "$bad_codes"
ok "  ... and the server answers" alive

# ---- oversized headers ----------------------------------------------------------
ok "a 100 KiB header: 431 or closed, no 200" python3 "$here/hostile-serve.py" bigheader "$SERVE_PORT" 100
ok "a 1 MiB header: 431 or closed, no 200" python3 "$here/hostile-serve.py" bigheader "$SERVE_PORT" 1024
ok "  ... and the server answers" alive

# ---- slow clients -----------------------------------------------------------------
ok "a dribbling client: cut at the idle timeout (3 s)" python3 "$here/hostile-serve.py" dribble "$SERVE_PORT" 3
ok "SIGTERM: exit 0" serve_stop
# the rest with the default idle timeout (20 s): opening 1,000 sockets and
# 200 downloads on a loaded machine must not look idle
ok "kiln serve starts again (default idle timeout)" serve_start "$D"
rss0=$(rss_kb)
ok "1,000 idle sockets (250 addresses): all held, and another client is answered within 2 s" \
	python3 "$here/hostile-serve.py" idle "$SERVE_PORT" 1000
ok "  ... and the server answers" alive
ok "17 sockets from one address: the per-client cap (16) refuses the 17th" python3 - "$SERVE_PORT" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
socks = []
for _ in range(17):
    s = socket.socket()
    s.bind(("127.0.0.7", 0))
    s.connect(("127.0.0.1", port))
    socks.append(s)
time.sleep(0.3)
closed = 0
for s in socks:
    s.settimeout(0.05)
    try:
        closed += s.recv(1) == b""
    except socket.timeout:
        pass
    except OSError:
        closed += 1
print(f"# 17 sockets from 127.0.0.7: {closed} closed by the server")
sys.exit(0 if closed == 1 else 1)
PY

# ---- 200 parallel downloads ---------------------------------------------------------
crc=$(python3 -c 'import sys, zlib; print(zlib.crc32(open(sys.argv[1], "rb").read()))' "$D/img/big.img")
python3 "$here/hostile-serve.py" parallel "$SERVE_PORT" /kiln/big.img 200 "$SIZE" "$crc" >"$W/par" 2>&1
rc=$?
diag "$(cat "$W/par")"
ok "200 parallel 32 MB downloads, one per address: all complete and whole" test "$rc" = 0
rss1=$(rss_kb) hwm=$(hwm_kb)
diag "kiln serve RSS: $((rss0 / 1024)) MiB at start, $((rss1 / 1024)) MiB after, peak $((hwm / 1024)) MiB (sendfile: the image is never copied through the server)"
ok "  ... peak RSS under 64 MiB (200 x 32 MB sent)" test "$hwm" -lt 65536
ok "  ... and the server answers" alive
ok "SIGTERM: exit 0" serve_stop
tap_done
