#!/bin/bash
# test-image-init.sh — the fast checks of the node image (no qemu, no
# network beyond 127.0.0.1): kiln-node-init against a fake /proc/cmdline, a
# real HTTP server on 127.0.0.1 and a scratch root holding the head's public
# key (every served file is signed; unsigned, tampered and other-key files
# and code paths others can change are refused); its unit under
# `systemd-analyze verify`; `make install` placing it; shellcheck on every
# image script.  The image build and boot are tests/image/test-image-boot.sh
# (make test-full).  Prints TAP.
set -uo pipefail
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
INIT=$top/image/kiln-node-init
W=$(mktemp -d /tmp/kiln-image-init.XXXXXX)
http_pid=''
trap '[ -n "$http_pid" ] && kill "$http_pid" 2>/dev/null; rm -rf "$W"' EXIT

# ---- a real HTTP server on 127.0.0.1, on a port the kernel picks -------------
mkdir -p "$W/srv"
cp config/examples/demo.cfg "$W/srv/cluster.cfg"
mkdir -p "$W/srv/bad" "$W/srv/q"
cp "$here/qemu.cfg" "$W/srv/q/cluster.cfg" # its MAC has hex letters: case matters
# inference on node03, which leaves the Slurm partition (kiln check refuses
# an inference node's GPUs in a Slurm partition)
mkdir -p "$W/srv/inf"
sed -e 's/partitions = \[ "gpu" \];//' -e 's/nodes = "node\[01-03\]"; default = true;/nodes = "node[01-02]"; default = true;/' \
	config/examples/demo.cfg >"$W/srv/inf/cluster.cfg"
printf 'inference = { enabled = true; nodes = "node03"; model = "/srv/models/m.bin"; };\n' >>"$W/srv/inf/cluster.cfg"
# journal forwarding and time sync: one file with its own URL and servers,
# one with both off
mkdir -p "$W/srv/logcustom" "$W/srv/logoff"
{ cat config/examples/demo.cfg
  printf 'logging = { url = "https://head.demo.kiln:19532"; };\ntime = { servers = [ "ntp1.example.org", "10.77.0.5" ]; };\n'; } >"$W/srv/logcustom/cluster.cfg"
{ cat config/examples/demo.cfg
  printf 'logging = { forward = false; };\ntime = { sync = false; };\n'; } >"$W/srv/logoff/cluster.cfg"
# valid libconfig, invalid cluster file: line 3 has a typo'd key
printf 'cluster = { name = "demo"; };\n# a comment\nnetwrk = { subnet = "10.77.0.0/24"; };\n' >"$W/srv/bad/cluster.cfg"
# The head's signing key; every served file is signed with it (kiln sign),
# and each scratch root gets its public half as /etc/kiln/head.pub, as the
# image build puts it there.
"$KILN" -q keygen --key "$W/head.key" >/dev/null
"$KILN" -q keygen --key "$W/other.key" >/dev/null
for f in "$W"/srv/cluster.cfg "$W"/srv/*/cluster.cfg; do
	"$KILN" -q sign --key "$W/head.key" "$f" >/dev/null || echo "# kiln sign $f failed"
done
# unsigned, tampered after signing, signed by another key, a garbage signature
for d in unsigned tampered otherkey garbage; do mkdir -p "$W/srv/$d" && cp config/examples/demo.cfg "$W/srv/$d/cluster.cfg"; done
"$KILN" -q sign --key "$W/head.key" "$W/srv/tampered/cluster.cfg" >/dev/null
sed -i 's/10.77.0.1"/10.77.0.66"/' "$W/srv/tampered/cluster.cfg" # the head's address, as an attacker would
"$KILN" -q sign --key "$W/other.key" "$W/srv/otherkey/cluster.cfg" >/dev/null
head -c 200 /dev/urandom >"$W/srv/garbage/cluster.cfg.sig"
# kiln apply caught between renaming the file and its signature: the first
# signature fetched is the old file's; the server then puts the new one in
# place (cluster.cfg.sig.next, below)
mkdir -p "$W/srv/race"
cp config/examples/demo.cfg "$W/srv/race/cluster.cfg"
"$KILN" -q sign --key "$W/head.key" "$W/srv/race/cluster.cfg" >/dev/null
mv "$W/srv/race/cluster.cfg.sig" "$W/race.sig.good"
sed -i 's/^# /## /' "$W/srv/race/cluster.cfg" && "$KILN" -q sign --key "$W/head.key" "$W/srv/race/cluster.cfg" >/dev/null
mv "$W/srv/race/cluster.cfg.sig" "$W/race.sig.stale"
cp config/examples/demo.cfg "$W/srv/race/cluster.cfg"
python3 - "$W/srv" "$W/port" >"$W/http.log" 2>&1 <<'PY' &
import functools, http.server, os, sys
class H(http.server.SimpleHTTPRequestHandler):
    # after serving race/cluster.cfg.sig, the next one takes its place
    def do_GET(self):
        super().do_GET()
        if self.path.endswith("/race/cluster.cfg.sig"):
            nxt = os.path.join(sys.argv[1], "race", "cluster.cfg.sig.next")
            if os.path.exists(nxt):
                os.replace(nxt, nxt[:-len(".next")])
h = functools.partial(H, directory=sys.argv[1])
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), h)
open(sys.argv[2], "w").write(str(s.server_address[1]))
s.serve_forever()
PY
http_pid=$!
for _ in $(seq 50); do [ -s "$W/port" ] && break; sleep 0.1; done
P=$(cat "$W/port")
URL=http://127.0.0.1:$P

# run NAME CMDLINE [extra options]: a fresh scratch root holding the head's
# public key (as the image does) and a munge key (as an earlier boot's
# kiln serve left it: no kiln serve answers here, so kiln-node-init keeps
# it; docs/serve.md, test-serve fetches it for real), kiln-node-init's exit
# status in $rc, stderr in $W/NAME.err
run() {
	local name=$1 cmdline=$2; shift 2
	R=$W/root-$name
	mkdir -p "$R/etc/kiln" "$R/etc/munge"
	cp "$W/head.pub" "$R/etc/kiln/head.pub"
	echo "test munge key" >"$R/etc/munge/munge.key"
	printf '%s\n' "$cmdline" >"$W/cmdline-$name"
	"$INIT" --root "$R" --cmdline "$W/cmdline-$name" --kiln "$KILN" --attempts 2 --delay 0 "$@" \
		>"$W/$name.out" 2>"$W/$name.err"
	rc=$?
}
# the files kiln-node-init writes, relative to the root
FILES=(etc/kiln/cluster.cfg etc/kiln/node.env etc/slurm/slurm.conf etc/slurm/gres.conf etc/slurm/cgroup.conf etc/hosts etc/hostname etc/default/slurmd
	etc/systemd/journal-upload.conf.d/kiln.conf etc/systemd/timesyncd.conf.d/kiln.conf
	etc/systemd/system/kiln-healthd.socket.d/kiln.conf etc/systemd/system/kiln-inferd.socket.d/kiln.conf)
nothing_written() { # ROOT: only the image's public key, the old munge key (and directories)
	[ "$(find "$1" -type f | grep -vc -e '/etc/kiln/head.pub$' -e '/etc/munge/munge.key$')" = 0 ]
}
expect_render() { # ROOT TARGET FILE [--node N]: FILE is kiln's rendering, header naming the URL
	local root=$1 t=$2 f=$3; shift 3
	"$KILN" -q -c "$W/srv/cluster.cfg" render "$t" "$@" | sed "s|$W/srv/cluster.cfg|$URL/cluster.cfg|" |
		cmp -s - "$root/$f"
}

# ---- the good path: kiln's boot.ipxe command line --------------------------------
run good "BOOT_IMAGE=vmlinuz initrd=initrd.img ip=10.77.0.12::10.77.0.1:255.255.255.0:node02::off kiln.node=node02 kiln.url=$URL console=ttyS0"
ok "kiln.node= + kiln.url=: exit 0" test "$rc" = 0
for f in "${FILES[@]}"; do
	ok "  ... wrote /$f" test -s "$R/$f"
done
ok "  ... cluster.cfg is the served file, byte for byte" cmp -s "$W/srv/cluster.cfg" "$R/etc/kiln/cluster.cfg"
ok "  ... slurm.conf is kiln render slurm.conf" expect_render "$R" slurm.conf etc/slurm/slurm.conf
ok "  ... gres.conf is kiln render gres.conf" expect_render "$R" gres.conf etc/slurm/gres.conf
ok "  ... cgroup.conf is kiln render cgroup.conf" expect_render "$R" cgroup.conf etc/slurm/cgroup.conf
ok "  ... /etc/hosts is kiln render hosts" expect_render "$R" hosts etc/hosts
ok "  ... node.env is kiln render node-env for node02" expect_render "$R" node-env etc/kiln/node.env --node node02
ok "  ... the sockets' drop-ins are kiln render kiln-healthd.socket.conf / kiln-inferd.socket.conf" \
	bash -c "$(declare -f expect_render); W='$W' KILN='$KILN' URL='$URL'; expect_render '$R' kiln-healthd.socket.conf etc/systemd/system/kiln-healthd.socket.d/kiln.conf && expect_render '$R' kiln-inferd.socket.conf etc/systemd/system/kiln-inferd.socket.d/kiln.conf"
ok "  ... headers name the URL, not a temporary file" grep -q "generated by kiln from $URL/cluster.cfg;" "$R/etc/slurm/slurm.conf"
ok "  ... hostname is node02" test "$(cat "$R/etc/hostname")" = node02
ok "  ... node.env: KILN_NODE=node02, KILN_ADDRESS=10.77.0.12" \
	bash -c "grep -qx KILN_NODE=node02 '$R/etc/kiln/node.env' && grep -qx KILN_ADDRESS=10.77.0.12 '$R/etc/kiln/node.env'"
ok "  ... files are mode 0644, no leftovers" \
	bash -c "[ \"\$(stat -c %a '$R/etc/slurm/slurm.conf' '$R/etc/kiln/node.env' | sort -u)\" = 644 ] && ! find '$R' -name '*.kiln-new' | grep -q ."
ok "  ... says what it did" grep -q "node node02 configured from $URL/cluster.cfg" "$W/good.err"
# configless Slurm (demo.cfg leaves slurm.configless at its default, true)
ok "  ... journal-upload drop-in: [Upload] URL=http://10.77.0.1:19532 (the head by default)" \
	bash -c "grep -qx '\[Upload\]' '$R/etc/systemd/journal-upload.conf.d/kiln.conf' && grep -qx 'URL=http://10.77.0.1:19532' '$R/etc/systemd/journal-upload.conf.d/kiln.conf'"
ok "  ... timesyncd drop-in: [Time] NTP=10.77.0.1 (the head by default)" \
	bash -c "grep -qx '\[Time\]' '$R/etc/systemd/timesyncd.conf.d/kiln.conf' && grep -qx 'NTP=10.77.0.1' '$R/etc/systemd/timesyncd.conf.d/kiln.conf'"
ok "  ... /etc/default/slurmd: slurmd fetches its config from the head (--conf-server 10.77.0.1:6817)" \
	grep -qx 'SLURMD_OPTIONS="--conf-server 10.77.0.1:6817"' "$R/etc/default/slurmd"
ok "  ... which Debian's slurmd.service reads" \
	bash -c "[ ! -f /lib/systemd/system/slurmd.service ] || grep -q 'EnvironmentFile=-/etc/default/slurmd' /lib/systemd/system/slurmd.service"

run full "cluster.node=node01 cluster.config=$URL/cluster.cfg"
ok "cluster.node= + cluster.config=URL: exit 0, hostname node01" \
	test "$rc" = 0 -a "$(cat "$R/etc/hostname" 2>/dev/null)" = node01

# ---- no node name: found by MAC -------------------------------------------------
mkdir -p "$W/net/lo" "$W/net/enp1s0" "$W/net/enp2s0"
echo 00:00:00:00:00:00 >"$W/net/lo/address"
echo 02:00:00:00:00:99 >"$W/net/enp1s0/address"
echo 52:54:00:4B:11:01 >"$W/net/enp2s0/address"
run mac "kiln.url=$URL/q" --sys-net "$W/net"
ok "no kiln.node=: node found by a MAC (the second NIC, upper case)" \
	test "$rc" = 0 -a "$(cat "$R/etc/hostname" 2>/dev/null)" = vnode01
ok "  ... and says so" grep -q "found node vnode01 by MAC 52:54:00:4b:11:01 (enp2s0)" "$W/mac.err"
ok "  ... qemu.cfg sets slurm.configless = false: slurmd gets no --conf-server" \
	grep -qx 'SLURMD_OPTIONS=""' "$R/etc/default/slurmd"
rm "$W/net/enp2s0/address"
run nomac "kiln.url=$URL/q" --sys-net "$W/net"
ok "unknown MACs: exit 2, names the MACs and what to do, nothing written" \
	bash -c "[ $rc = 2 ] && grep -q '02:00:00:00:00:99' '$W/nomac.err' && grep -q 'node_groups\[\].macs' '$W/nomac.err'" 
ok "  ... nothing written" nothing_written "$R"

# ---- failures: clear error, non-zero exit, nothing written --------------------------
run unknown "kiln.node=node09 kiln.url=$URL"
ok "unknown node: exit 2" test "$rc" = 2
ok "  ... names the node and the URL" grep -q "node 'node09' is not in the cluster file $URL/cluster.cfg" "$W/unknown.err"
ok "  ... nothing written" nothing_written "$R"

run notfound "kiln.node=node02 kiln.url=$URL/nothing-here"
ok "HTTP 404: exit 1 after the attempts" test "$rc" = 1
ok "  ... retried, then named the URL" \
	bash -c "grep -q 'attempt 1 of 2' '$W/notfound.err' && grep -q 'cannot fetch the cluster file from $URL/nothing-here/cluster.cfg after 2 attempts' '$W/notfound.err'"
ok "  ... nothing written" nothing_written "$R"

# a port nobody listens on: bind one, close it
dead=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run refused "kiln.node=node02 kiln.url=http://127.0.0.1:$dead"
ok "connection refused: exit 1, nothing written" bash -c "[ $rc = 1 ] && grep -q 'cannot fetch' '$W/refused.err'"
ok "  ... nothing written" nothing_written "$R"

run badcfg "kiln.node=node02 kiln.url=$URL/bad"
ok "invalid cluster file: exit 2" test "$rc" = 2
ok "  ... the error names the URL and cluster.cfg:LINE of the bad key" \
	bash -c "grep -q 'cluster file from $URL/bad/cluster.cfg is not valid' '$W/badcfg.err' && grep -q 'cluster.cfg:3: netwrk' '$W/badcfg.err'"
ok "  ... nothing written" nothing_written "$R"

run nourl "BOOT_IMAGE=vmlinuz kiln.node=node02"
ok "no URL on the command line: exit 2, says how to fix" \
	bash -c "[ $rc = 2 ] && grep -q 'no cluster.config=URL or kiln.url=URL' '$W/nourl.err'"
run ftp "kiln.node=node02 cluster.config=ftp://127.0.0.1/cluster.cfg"
ok "non-HTTP URL: exit 2" test "$rc" = 2
run badname "kiln.node=node02;reboot kiln.url=$URL"
ok "node name with shell characters: exit 2" test "$rc" = 2

# a previous good configuration survives a failed run untouched
run keep "kiln.node=node02 kiln.url=$URL"
sum_before=$(cd "$R" && md5sum "${FILES[@]}")
printf '%s\n' "kiln.node=node02 kiln.url=$URL/bad" >"$W/cmdline-keep"
"$INIT" --root "$R" --cmdline "$W/cmdline-keep" --kiln "$KILN" --attempts 1 >/dev/null 2>&1
rc=$?
ok "failed re-run (bad file): exit 2 and the previous files are unchanged" \
	bash -c "[ $rc = 2 ] && [ \"\$(cd '$R' && md5sum ${FILES[*]})\" = '$sum_before' ]"

# ---- the signed cluster file (issue 31): refused unless the head's key signed it ------
ok "  ... the good file verified against the image's head.pub, and says so" \
	grep -q "cluster file from $URL/cluster.cfg: good signature by key $(cut -d' ' -f4 "$W/head.pub")" "$W/good.err"
run unsigned "kiln.node=node02 kiln.url=$URL/unsigned"
ok "unsigned file (no cluster.cfg.sig, HTTP 404): exit 2, says so and how to sign" \
	bash -c "[ $rc = 2 ] && grep -q 'it is not signed (no $URL/unsigned/cluster.cfg.sig' '$W/unsigned.err' && grep -q 'kiln sign' '$W/unsigned.err'"
ok "  ... nothing written" nothing_written "$R"
run tampered "kiln.node=node02 kiln.url=$URL/tampered"
ok "tampered file (the head's address changed after signing): exit 2, names the URL" \
	bash -c "[ $rc = 2 ] && grep -q 'refusing the cluster file from $URL/tampered/cluster.cfg: its signature' '$W/tampered.err' && grep -q 'altered' '$W/tampered.err'"
ok "  ... nothing written" nothing_written "$R"
run otherkey "kiln.node=node02 kiln.url=$URL/otherkey"
ok "file signed by another key: exit 2, names both keys" \
	bash -c "[ $rc = 2 ] && grep -q \"signed by key \$(cut -d' ' -f4 '$W/other.pub'), not by the trusted key\" '$W/otherkey.err'"
ok "  ... nothing written" nothing_written "$R"
run garbage "kiln.node=node02 kiln.url=$URL/garbage"
ok "garbage signature: exit 2" bash -c "[ $rc = 2 ] && grep -q 'bad signature' '$W/garbage.err'"
ok "  ... nothing written" nothing_written "$R"
# a fetch between kiln apply's two renames: fetched once more, then accepted
cp "$W/race.sig.stale" "$W/srv/race/cluster.cfg.sig" && cp "$W/race.sig.good" "$W/srv/race/cluster.cfg.sig.next"
run race "kiln.node=node02 kiln.url=$URL/race"
ok "a signature of the previous file (kiln apply in progress): fetched once more, then configured (exit 0)" \
	bash -c "[ $rc = 0 ] && grep -q 'fetching $URL/race/cluster.cfg and its signature once more' '$W/race.err'"
cp "$W/race.sig.stale" "$W/srv/race/cluster.cfg.sig" && cp "$W/race.sig.good" "$W/srv/race/cluster.cfg.sig.next"
run race1 "kiln.node=node02 kiln.url=$URL/race" --attempts 1
ok "  ... with --attempts 1: refused (exit 2), nothing written" nothing_written "$R"
rm -f "$W/srv/race/cluster.cfg.sig.next"
# a previous good configuration survives a refused file untouched
run keep2 "kiln.node=node02 kiln.url=$URL"
sum_before=$(cd "$R" && md5sum "${FILES[@]}")
"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL/tampered") --kiln "$KILN" --attempts 1 >/dev/null 2>&1
rc=$?
ok "refused re-run (tampered, as after kiln apply): exit 2 and the previous files are unchanged" \
	bash -c "[ $rc = 2 ] && [ \"\$(cd '$R' && md5sum ${FILES[*]})\" = '$sum_before' ]"
# no public key in the image: nothing can be trusted
R=$W/root-nopub
mkdir -p "$R"
"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL") --kiln "$KILN" --attempts 1 >/dev/null 2>"$W/nopub.err"
rc=$?
ok "no /etc/kiln/head.pub in the image: exit 2, says rebuild the image, nothing written" \
	bash -c "[ $rc = 2 ] && grep -q 'no head public key at $R/etc/kiln/head.pub' '$W/nopub.err' && [ -z \"\$(find '$R' -type f)\" ]"

# ---- code paths the file names: root's alone, in the node's tree ----------------------
# Issue 31: a .so written by nobody ran its constructor as uid 0 in kiln-healthd.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
	mkdir -p "$W/srv/evil"
	sed 's|^health = {|health = { nvml_library = "/opt/nv/libnvidia-ml.so.1";|' config/examples/demo.cfg >"$W/srv/evil/cluster.cfg"
	"$KILN" -q sign --key "$W/head.key" "$W/srv/evil/cluster.cfg" >/dev/null
	R=$W/root-evil
	mkdir -p "$R/etc/kiln" "$R/etc/munge" "$R/opt/nv" && cp "$W/head.pub" "$R/etc/kiln/" && chmod 755 "$R" "$R/opt" "$R/opt/nv"
	echo "test munge key" >"$R/etc/munge/munge.key"
	: >"$R/opt/nv/libnvidia-ml.so.1" && chown nobody "$R/opt/nv/libnvidia-ml.so.1"
	"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL/evil") --kiln "$KILN" --attempts 1 >/dev/null 2>"$W/evil.err"
	rc=$?
	ok "signed file naming a library owned by nobody in the node's tree: exit 2, names key, file, owner" \
		bash -c "[ $rc = 2 ] && grep -q 'health.nvml_library = \"/opt/nv/libnvidia-ml.so.1\": refused' '$W/evil.err' && grep -q 'owned by nobody' '$W/evil.err'"
	ok "  ... nothing written" bash -c "[ \"\$(find '$R' -type f | grep -vc -e /etc/kiln/head.pub -e /etc/munge/munge.key -e /opt/nv/)\" = 0 ]"
	chown root "$R/opt/nv/libnvidia-ml.so.1" && chmod 0777 "$R/opt/nv"
	"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL/evil") --kiln "$KILN" --attempts 1 >/dev/null 2>"$W/evil.err"
	rc=$?
	ok "  ... root's library in a world-writable directory: exit 2" \
		bash -c "[ $rc = 2 ] && grep -q 'directory /opt/nv is writable by every user' '$W/evil.err'"
	chmod 0755 "$R/opt/nv"
	"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL/evil") --kiln "$KILN" --attempts 1 >/dev/null 2>"$W/evil.err"
	ok "  ... made root's alone: exit 0" test $? = 0
else
	skip "code paths owned by nobody: needs root (chown) and the user nobody"
fi

"$INIT" --attempts 0 >/dev/null 2>"$W/usage.err"
ok "--attempts 0: usage error, exit 2" test $? = 2
# --help documents exactly the options the code parses
parsed=$(grep -oE '^\s+--[a-z-]+\)' "$INIT" | tr -d ' \t)' | sort | paste -sd' ')
helped=$("$INIT" --help | grep -oE '^  --[a-z-]+' | tr -d ' ' | sort | paste -sd' ')
ok "--help lists every option parsed ($parsed)" test "$parsed" = "$helped"

# ---- journal forwarding and time sync from the cluster file ------------------------
printf '#!/bin/sh\necho "$*" >>"%s"\n' "$W/systemctl.calls" >"$W/systemctl"
chmod +x "$W/systemctl"
rm -f "$W/systemctl.calls"
run logcustom "kiln.node=node02 kiln.url=$URL/logcustom" --systemctl "$W/systemctl"
ok "logging.url, time.servers: exit 0" test "$rc" = 0
ok "  ... URL=https://head.demo.kiln:19532" grep -qx 'URL=https://head.demo.kiln:19532' "$R/etc/systemd/journal-upload.conf.d/kiln.conf"
ok "  ... NTP=ntp1.example.org 10.77.0.5" grep -qx 'NTP=ntp1.example.org 10.77.0.5' "$R/etc/systemd/timesyncd.conf.d/kiln.conf"
ok "  ... restarts systemd-journal-upload and systemd-timesyncd without blocking the boot" \
	bash -c "grep -qx -- '--no-block restart systemd-journal-upload.service' '$W/systemctl.calls' && grep -qx -- '--no-block restart systemd-timesyncd.service' '$W/systemctl.calls'"
ok "  ... and says so" bash -c "grep -q 'journal: forwarded to https://head.demo.kiln:19532' '$W/logcustom.err' && grep -q 'time: systemd-timesyncd against ntp1.example.org 10.77.0.5' '$W/logcustom.err'"
rm -f "$W/systemctl.calls"
mkdir -p "$R/etc/systemd/journal-upload.conf.d" && echo stale >"$R/etc/systemd/journal-upload.conf.d/kiln.conf"
"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL/logoff") --kiln "$KILN" --attempts 2 --delay 0 \
	--systemctl "$W/systemctl" >/dev/null 2>"$W/logoff.err"
rc=$?
ok "logging.forward = false, time.sync = false (a second run, as kiln apply does): exit 0" test "$rc" = 0
ok "  ... both drop-ins gone" bash -c "[ ! -e '$R/etc/systemd/journal-upload.conf.d/kiln.conf' ] && [ ! -e '$R/etc/systemd/timesyncd.conf.d/kiln.conf' ]"
ok "  ... systemd-journal-upload stopped, nothing restarted" \
	bash -c "grep -qx -- '--no-block stop systemd-journal-upload.service' '$W/systemctl.calls' && ! grep -q restart '$W/systemctl.calls'"
ok "  ... /etc/default/slurmd still written (configless)" grep -q -- '--conf-server' "$R/etc/default/slurmd"

# ---- kiln-inferd: started on the nodes inference.nodes names, only there ----------
ok "the inference cluster file passes kiln check" "$KILN" -q check -c "$W/srv/inf/cluster.cfg"
rm -f "$W/systemctl.calls"
run inf3 "kiln.node=node03 kiln.url=$URL/inf" --systemctl "$W/systemctl"
ok "inference node03: exit 0, kiln-inferd started without blocking the boot" \
	bash -c "[ $rc = 0 ] && [ \"\$(grep -c kiln-inferd '$W/systemctl.calls')\" = 1 ] && grep -qx -- '--no-block start kiln-inferd.service' '$W/systemctl.calls'"
ok "  ... and says so" grep -q "kiln-inferd: started (this node is one of inference.nodes)" "$W/inf3.err"
rm -f "$W/systemctl.calls"
run inf1 "kiln.node=node01 kiln.url=$URL/inf" --systemctl "$W/systemctl"
ok "node01, not in inference.nodes: exit 0, kiln-inferd not started" \
	bash -c "[ $rc = 0 ] && ! grep -q kiln-inferd '$W/systemctl.calls' && grep -q 'kiln-inferd: not started' '$W/inf1.err'"
printf '#!/bin/sh\nexit 1\n' >"$W/systemctl-bad"
chmod +x "$W/systemctl-bad"
run inf3bad "kiln.node=node03 kiln.url=$URL/inf" --systemctl "$W/systemctl-bad"
ok "systemctl failing on an inference node: exit 1, says what to look at" \
	bash -c "[ $rc = 1 ] && grep -q 'see systemctl status kiln-inferd' '$W/inf3bad.err'"

# ---- users, groups and shared mounts (users[], groups[], mounts[]) ---------------
mkdir -p "$W/srv/acct" "$W/srv/acct2"
{ cat config/examples/demo.cfg
  printf 'groups = ( { name = "research"; gid = 3000; } );\n'
  printf 'users = ( { name = "alice"; uid = 2001; groups = [ "research" ]; }, { name = "bob"; uid = 2002; gid = 3000; } );\n'
  printf 'mounts = ( { what = "head:/home"; where = "/home"; options = "vers=4.2,hard"; },\n'
  printf '  { what = "scratch"; where = "/srv/scratch-1"; type = "tmpfs"; required = false; } );\n'; } >"$W/srv/acct/cluster.cfg"
{ cat config/examples/demo.cfg
  printf 'mounts = ( { what = "head:/home"; where = "/home"; } );\n'; } >"$W/srv/acct2/cluster.cfg"
for f in "$W"/srv/acct*/cluster.cfg; do "$KILN" -q sign --key "$W/head.key" "$f" >/dev/null; done
rm -f "$W/systemctl.calls"
run acct "kiln.node=node02 kiln.url=$URL/acct" --systemctl "$W/systemctl"
ok "users, groups and mounts: exit 0" test "$rc" = 0
ok "  ... /etc/sysusers.d/kiln-users.conf is kiln render sysusers, header naming the URL" \
	bash -c "'$KILN' -q -c '$W/srv/acct/cluster.cfg' render sysusers | sed 's|$W/srv/acct/cluster.cfg|$URL/acct/cluster.cfg|' | cmp -s - '$R/etc/sysusers.d/kiln-users.conf'"
if command -v systemd-sysusers >/dev/null; then
	ok "  ... systemd-sysusers made alice 2001 (own group) and bob 2002 (gid 3000), in research" \
		bash -c "grep -q '^alice:x:2001:2001:' '$R/etc/passwd' && grep -q '^bob:x:2002:3000:' '$R/etc/passwd' && grep -qx 'research:x:3000:alice' '$R/etc/group'"
else
	skip "  ... systemd-sysusers made the users (not installed)"
fi
ok "  ... home.mount, srv-scratch\\x2d1.mount and slurmd's drop-in in /etc/systemd/system" \
	bash -c "grep -qx 'Where=/home' '$R/etc/systemd/system/home.mount' && grep -qx 'Where=/srv/scratch-1' '$R/etc/systemd/system/srv-scratch\\x2d1.mount' && grep -q '^After=home.mount' '$R/etc/systemd/system/slurmd.service.d/kiln-mounts.conf'"
ok "  ... daemon-reload, then each mount started without blocking the boot" \
	bash -c "grep -n . '$W/systemctl.calls' | grep -q '^[0-9]*:daemon-reload' && grep -qx -- '--no-block start home.mount' '$W/systemctl.calls' && grep -qxF -- '--no-block start srv-scratch\\x2d1.mount' '$W/systemctl.calls'"
rm -f "$W/systemctl.calls"
"$INIT" --root "$R" --cmdline <(echo "kiln.node=node02 kiln.url=$URL/acct2") --kiln "$KILN" --attempts 2 --delay 0 \
	--systemctl "$W/systemctl" >/dev/null 2>"$W/acct2.err"
rc=$?
ok "a second run with /srv/scratch-1 gone from the file (kiln apply): exit 0" test "$rc" = 0
ok "  ... its unit removed, home.mount kept, mounts.list updated" \
	bash -c "[ ! -e '$R/etc/systemd/system/srv-scratch\\x2d1.mount' ] && [ -s '$R/etc/systemd/system/home.mount' ] && ! grep -q scratch '$R/etc/kiln/mounts.list'"
printf '#!/bin/sh\nexit 3\n' >"$W/sysusers-bad"
chmod +x "$W/sysusers-bad"
KILN_SYSUSERS=$W/sysusers-bad run acctbad "kiln.node=node02 kiln.url=$URL/acct"
ok "systemd-sysusers failing: exit 1, says so" \
	bash -c "[ $rc = 1 ] && grep -q 'failed to create the cluster.s users and groups' '$W/acctbad.err'"

# ---- the unit ------------------------------------------------------------------
unit=services/units/kiln-node-init.service
ok "unit: oneshot, RemainAfterExit, after network-online" \
	bash -c "grep -qx 'Type=oneshot' $unit && grep -qx 'RemainAfterExit=yes' $unit && grep -qx 'After=network-online.target' $unit"
ok "unit: before munge/slurmd/kiln-healthd; slurmd requires it" \
	bash -c "grep -q '^Before=munge.service slurmd.service kiln-healthd.service' $unit && grep -qx 'RequiredBy=slurmd.service' $unit"
# kiln-healthd is socket-activated: with Requires= on node-init, any user's
# connection to its port on a node whose node-init failed made systemd run
# node-init as root again; Requisite= fails the start instead
ok "unit: kiln-healthd is Requisite= (not Requires=) on it, ordered after it" \
	bash -c "h=services/units/kiln-healthd.service; grep -qx 'Requisite=kiln-node-init.service' \$h && grep -q '^After=.*kiln-node-init.service' \$h && ! grep -q '^Requires=.*kiln-node-init' \$h"
if command -v systemd-analyze >/dev/null; then
	mkdir -p "$W/units" "$W/man/man1"
	ln -s "$top/docs/man/kiln.1" "$W/man/man1/"
	sed "s|^ExecStart=.*|ExecStart=$INIT|" "$unit" >"$W/units/kiln-node-init.service"
	sed "s|^ExecStart=.*|ExecStart=$here/probe/usr/local/sbin/kiln-probe|" \
		"$here/probe/etc/systemd/system/kiln-probe.service" >"$W/units/kiln-probe.service"
	for u in kiln-node-init kiln-probe; do
		if MANPATH=$W/man systemd-analyze verify "$W/units/$u.service" >"$W/verify.txt" 2>&1; then
			ok "systemd-analyze verify $u.service" true
		elif grep -qiE "Failed to (connect|initialize)|System has not been booted|Failed to setup" "$W/verify.txt"; then
			skip "systemd-analyze cannot run here: $(head -1 "$W/verify.txt")"
		else
			ok "systemd-analyze verify $u.service" false
			sed 's/^/# /' "$W/verify.txt"
		fi
	done
else
	skip "systemd-analyze not installed"
fi

# ---- each node's kernel command line, read by the image's network generator -------
# For each node of dgx-pod.cfg (many nodes, several DNS servers, MTU 9000 or
# not): the kernel line of its boot script (node.ipxe, what kiln serve
# answers at ipxe/MAC once boot.ipxe chained there), through
# systemd-network-generator (the image enables it), must name the port with
# the node's MAC boot0 and give boot0 the node's address, gateway, netmask,
# DNS and MTU from the cluster file.
GEN=/lib/systemd/systemd-network-generator
if [ -x "$GEN" ]; then
	for ex in dgx-pod demo; do
		cfg=config/examples/$ex.cfg
		n=0 bad=''
		while read -r node addr mac; do
			"$KILN" -q -c "$cfg" render node.ipxe --node "$node" >"$W/$ex-$node.ipxe"
			# shellcheck disable=SC2016 # iPXE's ${base}, not the shell's
			line=$(sed -n 's/^kernel //p' "$W/$ex-$node.ipxe" | sed 's|\${base}|http://h|g')
			g=$W/gen-$ex-$node
			# (word splitting is the kernel's: the line has no quotes)
			# shellcheck disable=SC2086
			"$GEN" --root="$g" -- $line 2>"$g.err" || { bad+=" $node(generator: $(head -1 "$g.err"))"; continue; }
			d=$g/run/systemd/network
			gw=$(sed -n 's/^ *gateway *= *"\([^"]*\)".*/\1/p' "$cfg")
			grep -qx "MACAddress=$mac" "$d/90-boot0.link" && grep -qx 'Name=boot0' "$d/90-boot0.link" &&
				grep -qx 'Name=boot0' "$d/90-boot0.network" &&
				grep -q "^Address=$addr/" "$d/90-boot0.network" &&
				grep -qx "Gateway=$gw" "$d/90-boot0.network" &&
				grep -q " kiln.node=$node " "$W/$ex-$node.ipxe" || bad+=" $node"
			n=$((n + 1))
		done < <("$KILN" -q -c "$cfg" show nodes | awk 'NR > 1 { print $1, $3, tolower($4) }')
		ok "$ex.cfg: each of $n nodes' kernel line (node.ipxe) gives boot0 = its MAC with its address (systemd-network-generator)" \
			test -z "$bad" -a "$n" -gt 0
		[ -z "$bad" ] || diag "wrong for:$bad"
	done
	f=$(find "$W" -path "*/gen-dgx-pod-*/run/systemd/network/90-boot0.network" | head -1)
	ok "  ... dgx-pod.cfg's DNS server and MTU 9000 on boot0" \
		bash -c "grep -qx 'MTUBytes=9000' '$f' && grep -qx 'DNS=10.40.0.1' '$f'"
else
	skip "systemd-network-generator not installed (Debian 12's systemd has it)"
fi

# ---- make install puts kiln-node-init and its unit where the unit says --------------
if make --no-print-directory -s install B="$B" DESTDIR="$W/dest" PREFIX=/usr/local >"$W/install.log" 2>&1; then
	ok "make install: /usr/local/sbin/kiln-node-init (executable) and the unit" \
		bash -c "[ -x '$W/dest/usr/local/sbin/kiln-node-init' ] && [ -f '$W/dest/usr/local/lib/systemd/system/kiln-node-init.service' ] && grep -qx 'ExecStart=/usr/local/sbin/kiln-node-init' $unit"
else
	ok "make install" false
	tail -5 "$W/install.log" | sed 's/^/# /'
fi

# ---- pack-initrd.sh: the initrd never readable by others while written ----
# (It holds no secret any more; an image built before that did, and so may
# an image.packages addition: it stays 0600 while written, 0640 after.)
# A zstd in front of the real one records the mode of its output as soon as
# it is written, before pack-initrd.sh renames it into place.
mkdir -p "$W/pack/root/etc/kiln" "$W/pack/root/boot" "$W/pack/out" "$W/pack/bin"
cp "$W/head.pub" "$W/pack/root/etc/kiln/head.pub"
printf 'kernel\n' >"$W/pack/root/boot/vmlinuz-x"
printf '0644 stale\n' >"$W/pack/out/initrd.img.new" && chmod 0644 "$W/pack/out/initrd.img.new"
cat >"$W/pack/bin/zstd" <<ZSTD
#!/bin/bash
$(command -v zstd) "\$@" || exit
while [ \$# -gt 1 ] && [ "\$1" != -o ]; do shift; done
stat -c %a "\$2" >'$W/pack/mode-while-written'
ZSTD
chmod +x "$W/pack/bin/zstd"
if command -v zstd >/dev/null && command -v cpio >/dev/null; then
	(umask 022 && PATH=$W/pack/bin:$PATH ZSTD_LEVEL=1 image/pack-initrd.sh "$W/pack/root" "$W/pack/out") 2>"$W/pack/err"
	ok "pack-initrd.sh: exit 0" test $? = 0
	ok "  ... initrd.img.new is 0600 while written (umask 022 around it; a stale 0644 .new is not reused)" \
		test "$(cat "$W/pack/mode-while-written" 2>/dev/null)" = 600
	ok "  ... initrd.img is 0640 once in place, no .new left" \
		bash -c "[ \$(stat -c %a '$W/pack/out/initrd.img') = 640 ] && [ ! -e '$W/pack/out/initrd.img.new' ]"
	ok "  ... it unpacks to the root without /boot" bash -c \
		"zstd -dc '$W/pack/out/initrd.img' | cpio -it --quiet | grep -qx etc/kiln/head.pub && ! zstd -dc '$W/pack/out/initrd.img' | cpio -it --quiet | grep -q '^boot'"
else
	skip "zstd or cpio not installed (make image-deps)"
fi

# ---- build-image.sh: no image without the head's signing key pair --------------------
# (the checks before mmdebstrap: no network, no root filesystem)
mkdir -p "$W/bi/staging/usr/local/bin" "$W/bi/keys"
sed "s|signing_key = \"/etc/kiln/head.key\"|signing_key = \"$W/bi/keys/head.key\"|" config/examples/dgx-pod.cfg >"$W/bi/c.cfg"
KILN=$KILN image/build-image.sh "$W/bi/c.cfg" "$W/bi/out" "$W/bi/staging" >/dev/null 2>"$W/bi/nokey.err"
rc=$?
ok "build-image.sh without image.signing_key's pair: exit 1, says kiln keygen" \
	bash -c "[ $rc = 1 ] && grep -q \"no signing key pair at '$W/bi/keys/head.key'\" '$W/bi/nokey.err' && grep -q 'kiln keygen' '$W/bi/nokey.err'"
"$KILN" -q keygen --key "$W/bi/keys/head.key" >/dev/null
cp "$W/other.pub" "$W/bi/keys/head.pub"
KILN=$KILN image/build-image.sh "$W/bi/c.cfg" "$W/bi/out" "$W/bi/staging" >/dev/null 2>"$W/bi/mismatch.err"
rc=$?
ok "build-image.sh with a .pub that is not the key's half: exit 1, says so (every node would refuse)" \
	bash -c "[ $rc = 1 ] && grep -q 'is not the public half of $W/bi/keys/head.key' '$W/bi/mismatch.err'"
ok "  ... and wrote no signature next to the cluster file" test ! -e "$W/bi/c.cfg.sig"
ok "build-image.sh bakes no munge key or password hash: no upload of either" \
	bash -c "! grep -nE 'upload .*munge|chpasswd|ROOT_PASSWORD' image/build-image.sh"

# ---- shellcheck ------------------------------------------------------------------
if command -v shellcheck >/dev/null; then
	for s in image/kiln-node-init image/build-image.sh image/pack-initrd.sh image/trim-modules.sh image/deps.sh \
		image/nvidia-install.sh tests/image/test-image-gpu.sh \
		tests/image/test-image-init.sh tests/image/test-image-boot.sh \
		tests/image/probe/usr/local/sbin/kiln-probe; do
		ok "shellcheck $s" shellcheck -x "$s"
	done
else
	skip "shellcheck not installed"
fi
tap_done
