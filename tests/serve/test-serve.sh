#!/bin/bash
# test-serve.sh — kiln serve over real loopback HTTP (docs/serve.md): the
# start-up checks (unsafe secret files, https, no image directory: exit 2),
# the image files (whole, HEAD, byte ranges, 416, what is never served),
# boot.ipxe and the per-MAC scripts (an unknown MAC: 404 and a log line),
# the secrets rule (a privileged source port at a node's address;
# inferd-keys to inference nodes only; each refusal a 403 and a log line
# naming who asked), SIGHUP, and kiln-node-init --root fetching its secrets
# from the running server.  Nodes are 127.0.0.11-13: curl --interface picks
# the source address, --local-port a privileged port (the suite runs as
# root).  Prints TAP.
set -uo pipefail
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
# shellcheck source=tests/serve/serve-env.sh
. "$here/serve-env.sh"
if [ "$(id -u)" != 0 ]; then
	skip "needs root: privileged source ports and root-owned secret files"
	tap_done
	exit 0
fi
W=$(mktemp -d /tmp/kiln-serve-test.XXXXXX)
trap 'serve_stop >/dev/null 2>&1; rm -rf "$W"' EXIT
D=$W/site
serve_site "$D"
LOG=$D/serve.log
INIT=$top/image/kiln-node-init
# as root on node n (127.0.0.1N): a privileged source port at its address
as_node() { local a=$1; shift; curl -s --interface "$a" --local-port 600-1023 "$@"; }

# ---- start-up checks ---------------------------------------------------------
"$KILN" serve --help >"$W/help" 2>&1
ok "--help: exit 0, names the secrets rule" bash -c "[ $? = 0 ] && grep -q 'source port < 1024' '$W/help'"
start_fails() { # DESC PATTERN: kiln serve exits 2 with PATTERN in its log
	timeout 10 "$KILN" -c "$D/cluster.cfg" serve >"$W/start.log" 2>&1
	local rc=$?
	if [ "$rc" = 2 ] && grep -q -- "$2" "$W/start.log"; then check "$1" 0; else
		check "$1" 1; diag "exit $rc: $(head -3 "$W/start.log")"; fi
}
chmod 640 "$D/munge.key"
start_fails "munge key readable by its group: exit 2 with the fix (chmod 600)" "chmod 600 $D/munge.key"
chmod 600 "$D/munge.key"
chown nobody "$D/inferd-keys"
start_fails "API keys owned by nobody: exit 2 with the fix (chown root:)" "chown root: $D/inferd-keys"
chown root "$D/inferd-keys"
mv "$D/root-hash" "$D/root-hash.away"
start_fails "root password file missing: exit 2 naming image.root_password_file" "image.root_password_file"
mv "$D/root-hash.away" "$D/root-hash"
ln -s "$D/munge.key" "$D/munge.link"
sed -i "s|munge_key = \"$D/munge.key\"|munge_key = \"$D/munge.link\"|" "$D/cluster.cfg"
start_fails "munge key a symlink: exit 2 (not a regular file)" "not a regular file"
sed -i "s|munge_key = \"$D/munge.link\"|munge_key = \"$D/munge.key\"|" "$D/cluster.cfg"
sed -i "s|http_url = \"http://|http_url = \"https://|" "$D/cluster.cfg"
start_fails "https:// image.http_url: exit 2 (plain HTTP only)" "is not http://"
sed -i "s|http_url = \"https://|http_url = \"http://|" "$D/cluster.cfg"
mv "$D/img" "$D/img.away"
start_fails "no image.output_dir: exit 2 naming it" "image.output_dir '$D/img'"
mv "$D/img.away" "$D/img"

ok "kiln serve starts" serve_start "$D"

# ---- image files ---------------------------------------------------------------
curl -s -o "$W/initrd" "$SERVE_URL/initrd.img"
ok "GET initrd.img: the file, byte for byte" cmp -s "$W/initrd" "$D/img/initrd.img"
curl -s -I "$SERVE_URL/initrd.img" | tr -d '\r' >"$W/head"
ok "HEAD initrd.img: 200, Content-Length 4194304, Accept-Ranges: bytes" \
	bash -c "grep -q '^HTTP/1.1 200' '$W/head' && grep -qx 'Content-Length: 4194304' '$W/head' && grep -qx 'Accept-Ranges: bytes' '$W/head'"
ok "HEAD: no body" test "$(curl -s --head "$SERVE_URL/initrd.img" -o /dev/null -w '%{size_download}')" = 0
range_is() { # RANGE OFF LEN: a 206 with exactly those bytes
	curl -s -D "$W/rh" -o "$W/part" -H "Range: bytes=$1" "$SERVE_URL/initrd.img"
	grep -q '^HTTP/1.1 206' "$W/rh" && cmp -s "$W/part" <(tail -c +$(($2 + 1)) "$D/img/initrd.img" | head -c "$3")
}
ok "Range: bytes=100-199: 206, those 100 bytes" range_is 100-199 100 100
ok "  ... with Content-Range: bytes 100-199/4194304" grep -q '^Content-Range: bytes 100-199/4194304' "$W/rh"
ok "Range: bytes=4194000-: 206, the last 304 bytes" range_is 4194000- 4194000 304
ok "Range: bytes=-1000: 206, the last 1000 bytes" range_is -1000 4193304 1000
ok "Range: bytes=4000000-9999999: 206, cut at the end" range_is 4000000-9999999 4000000 194304
curl -s -D - -o /dev/null -H 'Range: bytes=5000000-' "$SERVE_URL/initrd.img" | tr -d '\r' >"$W/416"
ok "Range past the end (bytes=5000000-): 416, Content-Range: bytes */4194304" bash -c \
	"grep -q '^HTTP/1.1 416' '$W/416' && grep -qx 'Content-Range: bytes \*/4194304' '$W/416'"
ok "several ranges (bytes=0-1,5-6): ignored, 200 with the whole file" \
	test "$(curl -s -o /dev/null -w '%{http_code} %{size_download}' -H 'Range: bytes=0-1,5-6' "$SERVE_URL/initrd.img")" = "200 4194304"
ok "If-Range (no validator given): 200 with the whole file" \
	test "$(code "$SERVE_URL/initrd.img" -H 'Range: bytes=0-9' -H 'If-Range: "x"')" = 200
ok "GET cluster.cfg: the published file" bash -c "curl -s '$SERVE_URL/cluster.cfg' | cmp -s - '$D/img/cluster.cfg'"
ok "a missing file: 404" test "$(code "$SERVE_URL/nope.img")" = 404
printf 'x\n' >"$D/img/.hidden"
mkdir -p "$D/img/sub" && printf 'x\n' >"$D/img/sub/f"
ln -sf /etc/passwd "$D/img/passwd"
(umask 077 && printf 'secret\n' >"$D/img/slurmdbd.conf")
ok "a dotfile: 404" test "$(code "$SERVE_URL/.hidden")" = 404
ok "a file in a subdirectory: 404" test "$(code "$SERVE_URL/sub/f")" = 404
ok "a symlink (to /etc/passwd): 404" test "$(code "$SERVE_URL/passwd")" = 404
ok "a file only its owner may read (0600 slurmdbd.conf): 404" test "$(code "$SERVE_URL/slurmdbd.conf")" = 404
ok "  ... and a warning in the log" grep -q "slurmdbd.conf is readable by its owner only" "$LOG"
ok "outside the URL's path (/other/vmlinuz): 404" test "$(code "http://127.0.0.1:$SERVE_PORT/other/vmlinuz")" = 404
ok "POST: 405" test "$(code "$SERVE_URL/vmlinuz" -X POST)" = 405

# ---- iPXE --------------------------------------------------------------------------
ok "boot.ipxe: kiln render boot.ipxe" bash -c "curl -s '$SERVE_URL/boot.ipxe' | cmp -s - <('$KILN' -q -c '$D/cluster.cfg' render boot.ipxe)"
ok "boot.ipxe names no node" bash -c "! curl -s '$SERVE_URL/boot.ipxe' | grep -q 'n1\|127.0.0.11'"
ok "ipxe/52-54-00-5e-00-01: n1's script (kiln render node.ipxe --node n1)" bash -c \
	"curl -s '$SERVE_URL/ipxe/52-54-00-5e-00-01' | cmp -s - <('$KILN' -q -c '$D/cluster.cfg' render node.ipxe --node n1)"
curl -s "$SERVE_URL/ipxe/52:54:00:5E:00:0A" >"$W/n3.ipxe"
ok "ipxe/52:54:00:5E:00:0A (colons, upper case): n3's, with kiln.node=n3 and its address" \
	bash -c "grep -q ' kiln.node=n3 ' '$W/n3.ipxe' && grep -q ' ip=127.0.0.13::' '$W/n3.ipxe' && grep -q '^initrd \${base}/initrd.img' '$W/n3.ipxe'"
ok "an unknown MAC: 404" test "$(code "$SERVE_URL/ipxe/52-54-00-99-99-99")" = 404
ok "  ... logged with the MAC and who asked" grep -q "127.0.0.1:[0-9]*: GET /kiln/ipxe/52-54-00-99-99-99: 404: no node of .* has MAC 52:54:00:99:99:99" "$LOG"
ok "not a MAC (ipxe/zz): 404" test "$(code "$SERVE_URL/ipxe/zz")" = 404

# ---- secrets -------------------------------------------------------------------------
as_node 127.0.0.11 -o "$W/mk" -D "$W/mkh" "$SERVE_URL/secret/munge.key"
ok "munge.key to root on n1 (127.0.0.11, privileged port): the key" cmp -s "$W/mk" "$D/munge.key"
ok "  ... with Cache-Control: no-store" bash -c "tr -d '\r' <'$W/mkh' | grep -qx 'Cache-Control: no-store'"
ok "  ... and an info line naming the node" grep -q "127.0.0.11:[0-9]* (node n1): handed munge.key" "$LOG"
refused() { # DESC ADDR PORTARGS PATH PATTERN: 403 and a log line with the address, node and reason
	local desc=$1 a=$2 ports=$3 p=$4 pat=$5
	local c
	# shellcheck disable=SC2086
	c=$(curl -s -o "$W/body" -w '%{http_code}' --interface "$a" $ports "$SERVE_URL/secret/$p")
	sleep 0.1
	if [ "$c" = 403 ] && grep -q "refused" "$W/body" && grep -q "secret refused: $a:[0-9]* .* GET /kiln/secret/$p: .*$pat" "$LOG"; then
		check "$desc" 0
	else
		check "$desc" 1; diag "HTTP $c: $(cat "$W/body"); log: $(grep 'secret refused' "$LOG" | tail -1)"
	fi
}
refused "munge.key from n1's address, unprivileged port: 403, logged" 127.0.0.11 "" munge.key "not privileged"
refused "munge.key from a non-node address (127.0.0.99), privileged port: 403, logged" 127.0.0.99 "--local-port 600-1023" munge.key "not one the cluster file gives a node"
refused "munge.key from the head's own address (127.0.0.1), privileged port: 403" 127.0.0.1 "--local-port 600-1023" munge.key "not one the cluster file gives a node"
refused "inferd-keys to n1 (not an inference node): 403, logged" 127.0.0.11 "--local-port 600-1023" inferd-keys "not an inference node"
ok "  ... the refusal names the node" grep -q "secret refused: 127.0.0.11:[0-9]* (node n1) GET /kiln/secret/inferd-keys" "$LOG"
# a user (nobody) on n1 cannot meet the rule: no privileged port to bind
setpriv --reuid=nobody --regid=nogroup --clear-groups curl -s -o /dev/null --interface 127.0.0.11 \
	--local-port 600-1023 "$SERVE_URL/secret/munge.key" 2>/dev/null
rc=$?
ok "a user (nobody) on n1 asking from a privileged port: curl cannot bind one (exit $rc)" test "$rc" = 45
c=$(setpriv --reuid=nobody --regid=nogroup --clear-groups curl -s -o "$W/nobody" -w '%{http_code}' \
	--interface 127.0.0.11 "$SERVE_URL/secret/munge.key")
ok "  ... and from the port it can have: 403, no key" bash -c "[ '$c' = 403 ] && ! cmp -s '$W/nobody' '$D/munge.key'"
ok "inferd-keys to n2 (the inference node): the keys file" bash -c "as_node() { curl -s --interface \"\$1\" --local-port 600-1023 \"\${@:2}\"; }; as_node 127.0.0.12 '$SERVE_URL/secret/inferd-keys' | cmp -s - '$D/inferd-keys'"
ok "root-password-hash to n3: the hash" bash -c "curl -s --interface 127.0.0.13 --local-port 600-1023 '$SERVE_URL/secret/root-password-hash' | cmp -s - '$D/root-hash'"
ok "an unknown secret (secret/shadow): 404" test "$(code "$SERVE_URL/secret/shadow" --interface 127.0.0.11 --local-port 600-1023)" = 404
chmod 644 "$D/munge.key"
ok "munge key made world-readable while running: 503, not handed out" \
	test "$(code "$SERVE_URL/secret/munge.key" --interface 127.0.0.11 --local-port 600-1023)" = 503
ok "  ... and logged with the fix" grep -q "not handed out: .*chmod 600" "$LOG"
chmod 600 "$D/munge.key"

# ---- SIGHUP -------------------------------------------------------------------------
cp "$D/cluster.cfg" "$D/cluster.cfg.orig"
sed -i 's|root_password_file = |kernel_cmdline = "console=ttyS0"; root_password_file = |' "$D/cluster.cfg"
kill -HUP "$SERVE_PID"; sleep 0.5
ok "SIGHUP: the new file's command line in n1's script" bash -c "curl -s '$SERVE_URL/ipxe/52-54-00-5e-00-01' | grep -q 'console=ttyS0'"
printf 'nonsense = 1;\n' >>"$D/cluster.cfg"
kill -HUP "$SERVE_PID"; sleep 0.5
ok "SIGHUP with a bad file: still serving the one before, and says so" \
	bash -c "curl -s '$SERVE_URL/ipxe/52-54-00-5e-00-01' | grep -q 'console=ttyS0' && grep -q 'not reloaded' '$LOG'"
cp "$D/cluster.cfg.orig" "$D/cluster.cfg"
kill -HUP "$SERVE_PID"; sleep 0.5

# ---- kiln-node-init --root against the running server ---------------------------------
R=$W/root
mkdir -p "$R/etc/kiln"
cp "$D/head.pub" "$R/etc/kiln/" # the image's public key: the served cluster.cfg is signed
printf 'root:x:0:0::/root:/bin/sh\nmunge:x:4242:4343::/nonexistent:/usr/sbin/nologin\n' >"$R/etc/passwd"
printf 'root:*:19000:0:99999:7:::\nmunge:!:19000::::::\n' >"$R/etc/shadow" && chmod 640 "$R/etc/shadow"
printf 'root:x:0:\nkiln-inferd:x:995:\n' >"$R/etc/group" # sysusers.d/kiln.conf's group
printf 'kiln.node=n2 kiln.url=%s\n' "$SERVE_URL" >"$W/cmdline"
"$INIT" --root "$R" --cmdline "$W/cmdline" --kiln "$KILN" --attempts 2 --delay 0 >"$W/init.out" 2>"$W/init.err"
rc=$?
ok "kiln-node-init on n2: exit 0" test "$rc" = 0 || sed 's/^/# /' "$W/init.err"
ok "  ... the munge key from kiln serve, munge's (4242:4343), 0400" bash -c \
	"cmp -s '$R/etc/munge/munge.key' '$D/munge.key' && [ \"\$(stat -c '%u:%g %a' '$R/etc/munge/munge.key')\" = '4242:4343 400' ]"
ok "  ... root's hash in /etc/shadow, the file still 0640" bash -c \
	"grep -qxF 'root:$(cat "$D/root-hash"):19000:0:99999:7:::' '$R/etc/shadow' && [ \"\$(stat -c %a '$R/etc/shadow')\" = 640 ]"
ok "  ... the API keys at inference.api_keys_file, root:kiln-inferd 0640 (kiln-inferd's user reads them)" bash -c \
	"cmp -s '$R$D/inferd-keys' '$D/inferd-keys' && [ \"\$(stat -c '%u:%g %a' '$R$D/inferd-keys')\" = '0:995 640' ]"
ok "  ... kiln serve logged each, from a privileged port at n2's address" bash -c \
	"grep -q '127.0.0.12:[0-9]\{3\} (node n2): handed munge.key' '$LOG' && grep -q '127.0.0.12:[0-9]\{3\} (node n2): handed inferd-keys' '$LOG'"
ok "  ... no secret left readable in a staging or .kiln-new file" bash -c "! find '$R' -name '*.kiln-new' | grep -q ."
R1=$W/root1
mkdir -p "$R1/etc/kiln"
cp "$R/etc/passwd" "$R/etc/shadow" "$R1/etc/" && cp "$D/head.pub" "$R1/etc/kiln/"
printf 'kiln.node=n1 kiln.url=%s\n' "$SERVE_URL" >"$W/cmdline1"
"$INIT" --root "$R1" --cmdline "$W/cmdline1" --kiln "$KILN" --attempts 2 --delay 0 >/dev/null 2>"$W/init1.err"
ok "kiln-node-init on n1 (not an inference node): exit 0, no keys file" bash -c \
	"[ $? = 0 ] && [ -s '$R1/etc/munge/munge.key' ] && [ ! -e '$R1$D/inferd-keys' ]"
serve_stop >/dev/null
# a static server of the image directory (no kiln serve): the cluster file
# is there, the secrets are not
SP=$(free_port)
python3 -m http.server --bind 127.0.0.1 --directory "$D/img" "$SP" >/dev/null 2>&1 &
static_pid=$!
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$SP/cluster.cfg" && break; sleep 0.1; done
R2=$W/root2
mkdir -p "$R2/etc/kiln"
cp "$R/etc/passwd" "$R/etc/shadow" "$R2/etc/" && cp "$D/head.pub" "$R2/etc/kiln/"
printf 'kiln.node=n1 kiln.url=http://127.0.0.1:%s\n' "$SP" >"$W/cmdline2"
"$INIT" --root "$R2" --cmdline "$W/cmdline2" --kiln "$KILN" --attempts 1 --delay 0 >/dev/null 2>"$W/init2.err"
rc=$?
kill "$static_pid"
wait "$static_pid" 2>/dev/null
ok "no kiln serve (a static server) and no key: exit 1, 'no munge key' naming kiln serve" bash -c \
	"[ $rc = 1 ] && grep -q 'no munge key: cannot fetch it from kiln serve at http://127.0.0.1:$SP/secret/munge.key' '$W/init2.err'"
ok "  ... nothing installed" bash -c "[ ! -e '$R2/etc/munge/munge.key' ] && [ ! -e '$R2/etc/slurm/slurm.conf' ]"

# ---- secrets only while Slurm lists the node down ------------------------------------
# Without a Slurm to ask the rule fails closed: every secret refused.
sed -i 's|root_password_file = |secrets_only_when_down = true; root_password_file = |' "$D/cluster.cfg"
SLURM_CONF=$W/no-slurm.conf serve_start "$D" || diag "$(tail -3 "$LOG")"
refused "secrets_only_when_down, no slurmctld to ask: 403 (fails closed), logged" 127.0.0.11 "--local-port 600-1023" munge.key "cannot ask Slurm"
ok "SIGTERM: exit 0" serve_stop

# ---- the unit's capabilities: enough for Debian's munge:munge 0400 key ------------------
# kiln-serve.service keeps CAP_NET_BIND_SERVICE and CAP_DAC_READ_SEARCH only;
# setpriv gives kiln serve that bounding set (and no_new_privs) here.
if command -v setpriv >/dev/null && getent passwd munge >/dev/null; then
	sed -i 's|secrets_only_when_down = true; ||' "$D/cluster.cfg"
	chown munge:munge "$D/munge.key" && chmod 400 "$D/munge.key"
	caps_serve() { # CAPS: kiln serve with only CAPS; the munge key's HTTP status
		setpriv --bounding-set=-all,"$1" --inh-caps=-all --no-new-privs -- \
			"$KILN" -c "$D/cluster.cfg" serve >"$D/caps.log" 2>&1 &
		local pid=$!
		for _ in $(seq 100); do curl -s -o /dev/null "$SERVE_URL/boot.ipxe" && break; sleep 0.05; done
		curl -s -o "$W/capkey" -w '%{http_code}' --interface 127.0.0.11 --local-port 600-1023 \
			"$SERVE_URL/secret/munge.key"
		kill "$pid"
		wait "$pid" 2>/dev/null
	}
	c=$(caps_serve +net_bind_service,+dac_read_search)
	ok "the unit's capabilities (net_bind_service, dac_read_search): a munge:munge 0400 key is handed out" \
		bash -c "[ '$c' = 200 ] && cmp -s '$W/capkey' '$D/munge.key'"
	c=$(caps_serve +net_bind_service)
	ok "  ... without dac_read_search it cannot read it: 503, logged" \
		bash -c "[ '$c' = 503 ] && grep -q 'cannot read .*Permission denied' '$D/caps.log'"
	chown root:root "$D/munge.key" && chmod 600 "$D/munge.key"
else
	skip "setpriv or the munge user missing"
fi

# ---- the unit ---------------------------------------------------------------------------
unit=$top/services/units/kiln-serve.service
ok "unit: Type=notify, reload by SIGHUP, a watchdog" bash -c \
	"grep -qx 'Type=notify' $unit && grep -qx 'ExecReload=/bin/kill -HUP \$MAINPID' $unit && grep -q '^WatchdogSec=' $unit"
if command -v systemd-analyze >/dev/null; then
	mkdir -p "$W/units" "$W/man/man1"
	ln -s "$top/docs/man/kiln.1" "$W/man/man1/"
	sed "s|^ExecStart=/usr/local/bin/kiln |ExecStart=$KILN |" "$unit" >"$W/units/kiln-serve.service"
	if MANPATH=$W/man systemd-analyze verify "$W/units/kiln-serve.service" >"$W/verify.txt" 2>&1; then
		ok "systemd-analyze verify kiln-serve.service" true
	elif grep -qiE "Failed to (connect|initialize)|System has not been booted|Failed to setup" "$W/verify.txt"; then
		skip "systemd-analyze cannot run here: $(head -1 "$W/verify.txt")"
	else
		ok "systemd-analyze verify kiln-serve.service" false
		sed 's/^/# /' "$W/verify.txt"
	fi
	score=$(systemd-analyze security --offline=yes "$W/units/kiln-serve.service" 2>/dev/null |
		sed -n 's/.*Overall exposure level for kiln-serve.service: \([0-9.]*\).*/\1/p')
	diag "systemd-analyze security --offline=yes kiln-serve.service: ${score:-none}"
	ok "unit: systemd-analyze security below 4 (${score:-none})" \
		awk -v s="${score:-99}" 'BEGIN { exit !(s < 4) }'
else
	skip "systemd-analyze not installed"
fi
tap_done
