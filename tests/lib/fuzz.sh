# shellcheck shell=bash
# fuzz.sh — runs a libFuzzer target for kiln's fuzz suites, as TAP (source
# it).  The targets are built by mk/rules.mk's kiln_fuzz (clang only).
#   fuzz_run N TARGET MAKE_TARGET [FLAG...]
#       runs $B/tests/TARGET (libFuzzer + ASan + UBSan) for
#       KILN_FUZZ_SECONDS (default 60) on a fresh corpus folder, which the
#       caller's `fuzz_seed DIR` fills first, with FLAGS (-dict, -max_len,
#       -timeout ...) added.  Prints "ok N - ...", or "not ok N" with the
#       log's tail and the artifacts (crash, leak, timeout) in hex and
#       returns 1, or "ok N # SKIP" when the target was not built (make
#       MAKE_TARGET).  Environment set on the call (LSAN_OPTIONS=...) reaches
#       the target.
# Sets B (the build folder), secs and dir (the sourcing script's folder).
B=${KILN_BUILD:-build}
secs=${KILN_FUZZ_SECONDS:-60}
# shellcheck disable=SC2034 # dir: for the sourcing script's fuzz_seed
dir=$(cd "$(dirname "$0")" && pwd)
_fuzz_work=
trap '[ -n "$_fuzz_work" ] && rm -rf "$_fuzz_work"' EXIT

fuzz_run() {
	local n=$1 t=$2 make_target=$3
	shift 3
	local F=$B/tests/$t rc runs a
	if [ ! -x "$F" ]; then
		echo "ok $n # SKIP $F not built (needs clang with libFuzzer: make $make_target)"
		return 0
	fi
	_fuzz_work=$(mktemp -d)
	local work=$_fuzz_work
	fuzz_seed "$work"
	"$F" "$@" -max_total_time="$secs" -rss_limit_mb=1024 \
		-artifact_prefix="$work/" "$work" >"$work/log" 2>&1
	rc=$?
	runs=$(grep -oE 'Done [0-9]+ runs' "$work/log" | grep -oE '[0-9]+')
	if [ $rc -eq 0 ]; then
		echo "ok $n - $t: ${runs:-?} inputs in ${secs}s, no crash, leak or assertion"
	else
		echo "not ok $n - $t crashed (rc $rc)"
		tail -n 40 "$work/log" | sed 's/^/# /'
		for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-*; do
			[ -e "$a" ] && echo "# artifact $(basename "$a"): $(od -An -tx1 "$a" | head -c 400 | tr -s ' \n' ' ')"
		done
	fi
	rm -rf "$work"
	_fuzz_work=
	[ $rc -eq 0 ]
}
