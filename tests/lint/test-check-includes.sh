#!/bin/bash
# test-check-includes.sh — mk/check-includes.py, the layering check of
# `make lint`, run by `make test` too: first on a small tree made here with
# a crossing include it must report (and a folder without a README it must
# name), then on kiln's own tree, which must be clean.  TAP.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
check=$top/mk/check-includes.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }

# A two-module tree: low/ may include nothing, high/ may include low.
mkdir -p "$tmp/t/low/include" "$tmp/t/high"
(
	cd "$tmp/t" && git init -q .
	printf '# low\n\nMay include: nothing\n' >low/README.md
	printf '# high\n\nMay include: low\n' >high/README.md
	printf 'int low(void);\n' >low/include/low.h
	printf '#include "high.h"\nint low(void) { return 0; }\n' >low/low.c
	printf '#include "low.h"\nint high(void);\n' >high/high.h
	printf '#include "high.h"\nint high(void) { return low(); }\n' >high/high.c
)
out=$(cd "$tmp/t" && python3 "$check" -Ilow/include -Ihigh 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q '^low/low.c:1: includes high/high.h (module high)' <<<"$out"; then
	ok "a crossing include is reported with file:line and the modules"
else
	nok "a crossing include is reported (rc $rc): $out"
fi
if ! grep -q '^high/high' <<<"$out"; then
	ok "an allowed include (high -> low) is not reported"
else
	nok "an allowed include was reported: $out"
fi
(cd "$tmp/t" && sed -i '1d' low/low.c && mkdir -p orphan && printf 'int o;\n' >orphan/o.c)
out=$(cd "$tmp/t" && python3 "$check" -Ilow/include -Ihigh 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q '^orphan/o.c: no module owns this folder' <<<"$out"; then
	ok "a source folder without a README is reported"
else
	nok "a source folder without a README is reported (rc $rc): $out"
fi

# kiln's own tree, with the compiler's include folders.
incs=$(make -s -C "$top" --no-print-directory print-includes 2>/dev/null)
out=$(cd "$top" && python3 "$check" $incs 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
	ok "kiln's tree: $out"
else
	nok "kiln's tree has includes that cross its folders' READMEs:"
	sed 's/^/# /' <<<"$out"
fi
echo "1..$n"
[ $fails -eq 0 ]
