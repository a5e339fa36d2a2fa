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

# 1. bad files
for cfg in tests/config/bad/*.cfg; do
	name=$(basename "$cfg" .cfg)
	exp=${cfg%.cfg}.expected
	"$KILN" -c "$cfg" check >"$tmp/out" 2>"$tmp/err"
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
	for t in slurm.conf gres.conf cgroup.conf dnsmasq.conf boot.ipxe hosts; do
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
[ $rc -eq 2 ] && grep -q "node-env only" "$tmp/err" && ok "--node with another target exits 2" ||
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
