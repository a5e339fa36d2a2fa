#!/bin/bash
# test-kiln-cli.sh — the `kiln` CLI end to end, printing TAP.
#
# Every tests/config/bad/NAME.cfg must make `kiln check` exit 2 and print
# exactly the lines of NAME.expected on stderr; both examples must pass;
# `kiln render` must reproduce the golden files in tests/config/golden/ for
# every target; the rendered dnsmasq.conf must pass `dnsmasq --test`; every
# key of the schema must be documented in docs/config.md.
set -u
cd "$(dirname "$0")/../.."
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
KILN=$B/bin/kiln
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
fail() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_LOG_PREFIX=0
unset KILN_CONFIG

if [ ! -x "$KILN" ]; then
	echo "1..1"
	fail "kiln binary at $KILN" "build it first: make B=$B $KILN"
	exit 1
fi

# 1. bad files; warn-*.cfg hold only warnings: `check` prints the same
# lines but exits 0, `check --strict` exits 2
for cfg in tests/config/bad/*.cfg; do
	name=$(basename "$cfg" .cfg)
	exp=${cfg%.cfg}.expected
	strict=
	case $name in warn-*)
		strict=--strict
		"$KILN" -c "$cfg" check >"$tmp/out" 2>"$tmp/err"
		rc=$?
		if [ $rc -ne 0 ]; then
			fail "bad/$name: warnings only: exit 0 without --strict" "got exit $rc" "$(cat "$tmp/err")"
		elif ! grep -q ': warning: ' "$tmp/err" || ! diff -u "$exp" "$tmp/err" >"$tmp/diff"; then
			fail "bad/$name: without --strict: the same warning lines" "$(cat "$tmp/err")"
		elif ! grep -q 'OK .*warnings above' "$tmp/out"; then
			fail "bad/$name: without --strict: OK, warnings above" "$(cat "$tmp/out")"
		else
			ok "bad/$name: without --strict: exit 0 with the warning lines"
		fi
		;;
	esac
	"$KILN" -c "$cfg" check $strict >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ ! -f "$exp" ]; then
		fail "bad/$name: has an .expected file"
	elif [ $rc -ne 2 ]; then
		fail "bad/$name: exit 2" "got exit $rc" "$(cat "$tmp/err")"
	elif ! diff -u "$exp" "$tmp/err" >"$tmp/diff"; then
		fail "bad/$name: exact error lines" "$(cat "$tmp/diff")"
	elif ! grep -qE "^$cfg:[0-9]+: " "$tmp/err"; then
		fail "bad/$name: FILE:LINE: prefix" "$(cat "$tmp/err")"
	else
		ok "bad/$name: exit 2 with the expected lines"
	fi
done
nbad=$(ls tests/config/bad/*.cfg | wc -l)
if [ "$nbad" -ge 30 ]; then ok "at least 30 bad files ($nbad)"; else fail "at least 30 bad files (only $nbad)"; fi

# gpus.socket_map: gres.conf gets one line per run of GPUs on a socket
sed -e 's/socket_map = "0,1,2,1"/socket_map = "1,0,0,1"/' -e 's/socket_map = "0,0,1"/socket_map = "0,0,0,0"/' \
	tests/config/bad/gpu-socket-map.cfg >"$tmp/smap.cfg"
"$KILN" -c "$tmp/smap.cfg" render gres.conf >"$tmp/gres" 2>"$tmp/err"
if [ $? -eq 0 ] && [ "$(grep -c '^NodeName=node\[01-02\]' "$tmp/gres")" = 3 ] &&
	grep -qx 'NodeName=node\[01-02\] Name=gpu Type=h100 File=/dev/nvidia\[1-2\] Cores=0-7' "$tmp/gres" &&
	grep -qx 'NodeName=node\[01-02\] Name=gpu Type=h100 File=/dev/nvidia3 Cores=8-15' "$tmp/gres" &&
	grep -qx 'NodeName=node\[03-04\] Name=gpu Type=h100 File=/dev/nvidia\[0-3\] Cores=0-7' "$tmp/gres"; then
	ok "gpus.socket_map: Cores= per run of GPUs on one socket"
else
	fail "gpus.socket_map: Cores= per run of GPUs on one socket" "$(cat "$tmp/gres" "$tmp/err")"
fi

# 2. the examples
for ex in demo dgx-pod; do
	cfg=config/examples/$ex.cfg
	if "$KILN" -c "$cfg" check >"$tmp/out" 2>"$tmp/err"; then
		ok "$ex.cfg: check exits 0"
	else
		fail "$ex.cfg: check exits 0" "$(cat "$tmp/err")"
	fi
	if KILN_CONFIG=$cfg "$KILN" -q check 2>"$tmp/err"; then
		ok "$ex.cfg: \$KILN_CONFIG is honoured"
	else
		fail "$ex.cfg: \$KILN_CONFIG is honoured" "$(cat "$tmp/err")"
	fi

	# 3. golden files, every target (render all) and one by one (stdout)
	rm -rf "$tmp/r"
	if "$KILN" -q -c "$cfg" render all -o "$tmp/r" && diff -ru "tests/config/golden/$ex" "$tmp/r" >"$tmp/diff"; then
		ok "$ex.cfg: render all matches tests/config/golden/$ex"
	else
		fail "$ex.cfg: render all matches tests/config/golden/$ex" "$(head -40 "$tmp/diff")"
	fi
	for t in slurm.conf gres.conf cgroup.conf dnsmasq.conf boot.ipxe hosts prometheus.yml kiln-alerts.yml; do
		if "$KILN" -c "$cfg" render "$t" >"$tmp/one" && cmp -s "$tmp/one" "tests/config/golden/$ex/$t"; then
			ok "$ex.cfg: render $t to stdout matches golden"
		else
			fail "$ex.cfg: render $t to stdout matches golden"
		fi
	done
	node=$("$KILN" -c "$cfg" show nodes | awk 'NR == 2 { print $1 }')
	if "$KILN" -c "$cfg" render node-env --node "$node" -o "$tmp/env" &&
		cmp -s "$tmp/env" "tests/config/golden/$ex/node-env/$node"; then
		ok "$ex.cfg: render node-env --node $node -o FILE matches golden"
	else
		fail "$ex.cfg: render node-env --node $node -o FILE matches golden"
	fi
	if (set -a; . "$tmp/env"; [ "$KILN_NODE" = "$node" ] && [ -n "$KILN_SERVICES" ]); then
		ok "$ex.cfg: node-env is valid shell"
	else
		fail "$ex.cfg: node-env is valid shell"
	fi

	# 3b. systemd takes the socket drop-ins over the shipped socket units
	if command -v systemd-analyze >/dev/null; then
		rm -rf "$tmp/u"
		for d in kiln-healthd kiln-inferd; do
			mkdir -p "$tmp/u/$d.socket.d"
			cp "services/units/$d.socket" "$tmp/u/"
			sed "s|^ExecStart=.*|ExecStart=/bin/true|" "services/units/$d.service" >"$tmp/u/$d.service"
			cp "$tmp/r/$d.socket.conf" "$tmp/u/$d.socket.d/kiln.conf"
		done
		if SYSTEMD_UNIT_PATH=$tmp/u: systemd-analyze verify --man=no "$tmp/u/kiln-healthd.socket" \
			"$tmp/u/kiln-inferd.socket" >"$tmp/out" 2>&1; then
			ok "$ex.cfg: systemd-analyze verify accepts the socket drop-ins"
		else
			fail "$ex.cfg: systemd-analyze verify accepts the socket drop-ins" "$(cat "$tmp/out")"
		fi
	else
		skip "$ex.cfg: systemd-analyze not installed"
	fi

	# 4. dnsmasq accepts what we render (with a TFTP root that exists)
	if [ -x /usr/sbin/dnsmasq ]; then
		mkdir -p "$tmp/tftp"
		sed "s|^tftp-root=.*|tftp-root=$tmp/tftp|" "$tmp/r/dnsmasq.conf" >"$tmp/dnsmasq.conf"
		if /usr/sbin/dnsmasq --test -C "$tmp/dnsmasq.conf" >"$tmp/out" 2>&1; then
			ok "$ex.cfg: dnsmasq --test accepts dnsmasq.conf"
		else
			fail "$ex.cfg: dnsmasq --test accepts dnsmasq.conf" "$(cat "$tmp/out")"
		fi
	else
		skip "$ex.cfg: dnsmasq --test (no /usr/sbin/dnsmasq; apt-get install dnsmasq-base)"
	fi
done

# 5. usage errors and exit codes
"$KILN" -c config/examples/demo.cfg render nope.conf 2>/dev/null
[ $? -eq 2 ] && ok "unknown render target exits 2" || fail "unknown render target exits 2"
"$KILN" -c config/examples/demo.cfg render node-env --node node99 2>/dev/null
[ $? -eq 2 ] && ok "node-env for an unknown node exits 2" || fail "node-env for an unknown node exits 2"
"$KILN" -c "$tmp/does-not-exist.cfg" check 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "does-not-exist.cfg" "$tmp/err" && ok "missing cluster file exits 2 and names it" ||
	fail "missing cluster file exits 2 and names it" "rc=$rc" "$(cat "$tmp/err")"
head -c $((17 * 1024 * 1024)) /dev/zero | tr '\0' '#' >"$tmp/huge.cfg"
"$KILN" -c "$tmp/huge.cfg" check 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "huge.cfg' is larger than 16 MiB" "$tmp/err" && ok "a cluster file over 16 MiB exits 2 and says so" ||
	fail "a cluster file over 16 MiB exits 2 and says so" "rc=$rc" "$(cat "$tmp/err")"
rm -f "$tmp/huge.cfg"
"$KILN" -c config/examples/demo.cfg render slurm.conf --node node01 >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "node-env and node.ipxe only" "$tmp/err" && ok "--node with another target exits 2" ||
	fail "--node with another target exits 2" "rc=$rc" "$(cat "$tmp/err")"
"$KILN" frobnicate 2>/dev/null
[ $? -eq 2 ] && ok "unknown command exits 2" || fail "unknown command exits 2"
"$KILN" --help | grep -q "render TARGET" && ok "--help" || fail "--help"
"$KILN" --version | grep -qE '^kiln [0-9]' && ok "--version" || fail "--version"
"$KILN" -c config/examples/demo.cfg show node node02 | grep -q "10.77.0.12" && ok "show node node02" ||
	fail "show node node02"
"$KILN" -c config/examples/demo.cfg show node head >"$tmp/head" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && grep -qx "name: *head" "$tmp/head" && grep -qx "role: *head" "$tmp/head" &&
	grep -qx "address: *10.77.0.1/24" "$tmp/head" && grep -q "slurmctld" "$tmp/head" &&
	ok "show node head (the head node)" ||
	fail "show node head (the head node)" "rc=$rc" "$(cat "$tmp/head" "$tmp/err")"
"$KILN" -c config/examples/demo.cfg show node nosuch 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "No node 'nosuch'" "$tmp/err" && ok "show node with an unknown name exits 2" ||
	fail "show node with an unknown name exits 2" "rc=$rc" "$(cat "$tmp/err")"
[ "$("$KILN" -c config/examples/dgx-pod.cfg show nodes | wc -l)" -eq 33 ] && ok "show nodes lists 32 nodes" ||
	fail "show nodes lists 32 nodes"

# 5b. the command line on kiln/prog.h: verbs, their --help, options after the verb
"$KILN" frobnicate 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "Unknown command 'frobnicate'" "$tmp/err" &&
	[ "$(grep -cE '^  (check|show|render|model|tokenize) ' "$tmp/err")" -eq 5 ] &&
	ok "unknown command lists every command" || fail "unknown command lists every command" "rc=$rc" "$(cat "$tmp/err")"
"$KILN" render --help >"$tmp/out" 2>&1
rc=$?
missing=""
for t in slurm.conf gres.conf cgroup.conf dnsmasq.conf boot.ipxe hosts node-env image-env prometheus.yml kiln-alerts.yml prometheus all; do
	grep -qE "^  $t " "$tmp/out" || missing="$missing $t"
done
[ $rc -eq 0 ] && [ -z "$missing" ] && grep -q -- "--output" "$tmp/out" && ok "render --help lists the targets and render's options" ||
	fail "render --help lists the targets and render's options" "rc=$rc missing:$missing" "$(cat "$tmp/out")"
for v in check show model tokenize; do
	"$KILN" "$v" --help >"$tmp/out" 2>&1 && grep -q "^kiln $v — " "$tmp/out" && grep -q -- "--help" "$tmp/out" &&
		ok "$v --help" || fail "$v --help" "$(cat "$tmp/out")"
done
"$KILN" check -c config/examples/demo.cfg -q >"$tmp/out" 2>&1 && [ ! -s "$tmp/out" ] &&
	ok "-c and -q after the verb (kiln check -c FILE -q)" || fail "-c and -q after the verb" "$(cat "$tmp/out")"
"$KILN" -c config/examples/demo.cfg render slurm.conf -n node01 >/dev/null 2>&1
[ $? -eq 2 ] && ok "-n is no longer render's --node (exit 2)" || fail "-n is no longer render's --node (exit 2)"

# 5c. --json: check (valid, invalid, missing) and show
json() { # FILE PYTHON-EXPRESSION-ON-j
	python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2" 2>"$tmp/pyerr"
}
"$KILN" -c config/examples/dgx-pod.cfg check --json >"$tmp/json" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && json "$tmp/json" 'j == {"file": "config/examples/dgx-pod.cfg", "ok": True, "nodes": 32, "groups": 1, "partitions": 2, "warnings": []}' &&
	ok "check --json on a valid file" || fail "check --json on a valid file" "rc=$rc" "$(cat "$tmp/json" "$tmp/err" "$tmp/pyerr")"
"$KILN" -c tests/config/bad/warn-gpu-type-case.cfg check --json >"$tmp/json" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && json "$tmp/json" 'j["ok"] and len(j["warnings"]) == 1 and j["warnings"][0]["path"] == "node_groups[1].gpus.type"' &&
	ok "check --json with a warning: ok, the warning listed" || fail "check --json with a warning" "rc=$rc" "$(cat "$tmp/json" "$tmp/err" "$tmp/pyerr")"
"$KILN" -c tests/config/bad/warn-gpu-type-case.cfg check --json --strict >"$tmp/json" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && json "$tmp/json" 'not j["ok"] and len(j["errors"]) == 1' &&
	ok "check --json --strict: the warning is an error, exit 2" || fail "check --json --strict" "rc=$rc" "$(cat "$tmp/json" "$tmp/err" "$tmp/pyerr")"
# every bad file (with --strict: warn-* too): exit 2 and, as objects, the
# errors its .expected file lists
rcs=""
for cfg in tests/config/bad/*.cfg; do
	"$KILN" -c "$cfg" check --json --strict >"$tmp/$(basename "$cfg").json" 2>/dev/null
	rc=$?
	[ $rc -eq 2 ] || rcs="$rcs $(basename "$cfg"):$rc"
done
python3 - "$tmp" tests/config/bad/*.cfg <<'PY' >"$tmp/pyerr" 2>&1
import json, os, sys
for cfg in sys.argv[2:]:
    j = json.load(open(os.path.join(sys.argv[1], os.path.basename(cfg) + ".json")))
    got = []
    for e in j["errors"]:
        line = e["file"] + ":" + (str(e["line"]) + ":" if e["line"] else "")
        line += " " + (e["path"] + ": " if e["path"] else "")
        line += ("warning: " if e.get("warning") else "") + e["message"]
        if e["hint"] is not None:
            line += "; " + e["hint"]
        got.append(line)
    want = open(cfg[:-4] + ".expected").read().splitlines()
    if j["ok"] is not False or j["file"] != cfg or got != want:
        print(cfg, "got", got, "want", want)
PY
[ -z "$rcs" ] && [ ! -s "$tmp/pyerr" ] && ok "check --json on every bad file: exit 2, the .expected errors as objects" ||
	fail "check --json on every bad file" "exit codes:$rcs" "$(head -20 "$tmp/pyerr")"
"$KILN" -c "$tmp/nope.cfg" check --json >"$tmp/json" 2>/dev/null
rc=$?
[ $rc -eq 2 ] && json "$tmp/json" 'not j["ok"] and j["errors"][0]["file"].endswith("nope.cfg") and "does not exist" in j["errors"][0]["message"]' &&
	ok "check --json on a missing file: exit 2, one error" || fail "check --json on a missing file" "rc=$rc" "$(cat "$tmp/json")"
"$KILN" -c config/examples/demo.cfg show nodes --json >"$tmp/json" &&
	json "$tmp/json" '[n["name"] for n in j["nodes"]] == ["node01", "node02", "node03"] and j["nodes"][1] == {"name": "node02", "group": "gpu", "address": "10.77.0.12", "mac": "52:54:00:77:00:12", "gpus": 4, "gpu_type": "h100", "partitions": ["gpu"]}' &&
	ok "show nodes --json" || fail "show nodes --json" "$(cat "$tmp/json" "$tmp/pyerr")"
"$KILN" -c config/examples/demo.cfg show node node02 --json >"$tmp/json" &&
	json "$tmp/json" 'j["name"] == "node02" and j["role"] == "compute" and j["address"] == "10.77.0.12" and j["prefix"] == 24 and j["gpus"] == 4 and j["partitions"] == ["gpu"] and j["services"][:2] == ["munge", "slurmd"]' &&
	ok "show node NAME --json" || fail "show node NAME --json" "$(cat "$tmp/json" "$tmp/pyerr")"
"$KILN" -c config/examples/demo.cfg --json show node head >/dev/null 2>&1
[ $? -eq 2 ] && ok "--json is the verb's option (before it: exit 2)" || fail "--json before the verb exits 2"
"$KILN" -c config/examples/demo.cfg show node head --json >"$tmp/json" &&
	json "$tmp/json" 'j["role"] == "head" and j["address"] == "10.77.0.1" and "slurmctld" in j["services"]' &&
	ok "show node HEAD --json" || fail "show node HEAD --json" "$(cat "$tmp/json" "$tmp/pyerr")"

# output that cannot be written (disk full) must not exit 0
if [ -w /dev/full ]; then
	for a in "show nodes" "show --defaults" "check" "render slurm.conf"; do
		# shellcheck disable=SC2086
		"$KILN" -c config/examples/demo.cfg $a >/dev/full 2>"$tmp/err"
		rc=$?
		[ $rc -eq 1 ] && grep -q "standard output" "$tmp/err" && ok "$a to a full disk exits 1" ||
			fail "$a to a full disk exits 1" "rc=$rc" "$(cat "$tmp/err")"
	done
else
	skip "writes to a full disk (no /dev/full)"
fi

# 5b. users, groups and mounts through their consumers: systemd-sysusers
# creates the accounts with the file's ids, and systemd-analyze verify takes
# every mount unit (it refuses a unit whose name is not its Where=, so the
# escaping of /srv/scratch-1 is checked) and slurmd's drop-in
cat config/examples/demo.cfg - >"$tmp/users.cfg" <<'EOF'
groups = ( { name = "research"; gid = 3000; }, { name = "inferops"; gid = 3001; } );
users = (
  { name = "alice"; uid = 2001; groups = [ "research" ]; comment = "Alice Liddell"; },
  { name = "bob"; uid = 2002; gid = 3000; groups = [ "inferops", "research" ]; shell = "/bin/sh"; }
);
mounts = (
  { what = "head:/home"; where = "/home"; options = "vers=4.2,hard"; },
  { what = "scratch"; where = "/srv/scratch-1"; type = "tmpfs"; options = "size=1G"; required = false; }
);
EOF
if command -v systemd-sysusers >/dev/null; then
	mkdir -p "$tmp/sysroot/etc/sysusers.d"
	if "$KILN" -c "$tmp/users.cfg" render sysusers -o "$tmp/sysroot/etc/sysusers.d/kiln-users.conf" &&
		systemd-sysusers --root="$tmp/sysroot" >"$tmp/out" 2>&1 &&
		grep -qx 'alice:x:2001:2001:Alice Liddell:/home/alice:/bin/bash' "$tmp/sysroot/etc/passwd" &&
		grep -qx 'bob:x:2002:3000:bob:/home/bob:/bin/sh' "$tmp/sysroot/etc/passwd" &&
		grep -qx 'research:x:3000:alice,bob' "$tmp/sysroot/etc/group" &&
		grep -qx 'inferops:x:3001:bob' "$tmp/sysroot/etc/group" &&
		grep -qx 'alice:x:2001:' "$tmp/sysroot/etc/group" &&
		grep -q '^alice:!' "$tmp/sysroot/etc/shadow"; then
		ok "render sysusers: systemd-sysusers creates the users and groups with their ids, passwords locked"
	else
		fail "render sysusers: systemd-sysusers creates the users and groups with their ids, passwords locked" \
			"$(cat "$tmp/out" "$tmp/sysroot/etc/passwd" "$tmp/sysroot/etc/group" 2>&1)"
	fi
else
	skip "render sysusers through systemd-sysusers (not installed)"
fi
if "$KILN" -c "$tmp/users.cfg" render mounts -o "$tmp/units" &&
	[ "$(cd "$tmp/units" && find . -type f | sort | tr '\n' ' ')" = './home.mount ./slurmd.service.d/kiln-mounts.conf ./srv-scratch\x2d1.mount ' ]; then
	ok "render mounts -o DIR: a unit per mount named by systemd's escaping, and slurmd's drop-in"
else
	fail "render mounts -o DIR: a unit per mount named by systemd's escaping, and slurmd's drop-in" "$(find "$tmp/units")"
fi
if command -v systemd-analyze >/dev/null; then
	if (cd "$tmp/units" && systemd-analyze verify --man=no home.mount 'srv-scratch\x2d1.mount') >"$tmp/out" 2>&1 &&
		grep -qxF 'Wants=home.mount srv-scratch\x2d1.mount' "$tmp/units/slurmd.service.d/kiln-mounts.conf" &&
		grep -qx 'Before=slurmd.service' "$tmp/units/home.mount" &&
		grep -qx 'Options=vers=4.2,hard' "$tmp/units/home.mount" &&
		grep -qx 'Type=nfs' "$tmp/units/home.mount"; then
		ok "the mount units pass systemd-analyze verify (name = Where=), ordered before slurmd"
	else
		fail "the mount units pass systemd-analyze verify (name = Where=), ordered before slurmd" "$(cat "$tmp/out")"
	fi
	cp "$tmp/units/home.mount" "$tmp/units/wrong.mount"
	if ! (cd "$tmp/units" && systemd-analyze verify --man=no wrong.mount) >/dev/null 2>&1; then
		ok "systemd-analyze verify refuses a mount unit not named after its Where= (the check can fail)"
	else
		fail "systemd-analyze verify refuses a mount unit not named after its Where= (the check can fail)"
	fi
else
	skip "mount units through systemd-analyze verify (not installed)"
fi
"$KILN" -c config/examples/demo.cfg render mounts -o "$tmp/nounits" && [ -z "$(ls -A "$tmp/nounits")" ] &&
	ok "render mounts without mounts: an empty directory" || fail "render mounts without mounts: an empty directory"

# 6. every key of the schema is documented
"$KILN" show --defaults >"$tmp/defaults"
missing=()
while read -r key _; do
	[ "$key" = KEY ] && continue
	grep -qF "\`$key\`" docs/config.md 2>/dev/null || missing+=("$key")
done <"$tmp/defaults"
if [ "$(wc -l <"$tmp/defaults")" -gt 50 ] && [ ${#missing[@]} -eq 0 ]; then
	ok "docs/config.md documents every key of show --defaults"
else
	fail "docs/config.md documents every key of show --defaults" "missing: ${missing[*]}"
fi

echo "1..$n"
