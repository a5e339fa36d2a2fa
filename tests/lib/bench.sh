# shellcheck shell=bash
# bench.sh — runs a benchmark program of tests/ as a one-test TAP suite
# (make bench; source it).
#   bench_bin NAME
#       prints the plan "1..1" and sets bin=$B/tests/NAME; when it was not
#       built, prints "ok 1 # SKIP" and exits the script (status 0).
#   bench_run DESCRIPTION SKIP2 [ARG...]
#       runs $bin ARG..., prints its output (the table) as TAP comments, then
#       "ok 1 - DESCRIPTION" when it exits 0, "ok 1 # SKIP SKIP2" when it
#       exits 2 and SKIP2 is not "", else "not ok 1 - DESCRIPTION (exit N)"
#       and exits the script with status 1.
# Sets B (the build folder).
B=${KILN_BUILD:-build}

bench_bin() {
	bin=$B/tests/$1
	echo "1..1"
	if [ ! -x "$bin" ]; then
		echo "ok 1 # SKIP $bin not built (make B=$B $bin)"
		exit 0
	fi
}

bench_run() {
	local desc=$1 skip2=$2 out rc
	shift 2
	out=$("$bin" "$@" 2>&1)
	rc=$?
	sed 's/^/# /' <<<"$out"
	if [ $rc -eq 0 ]; then
		echo "ok 1 - $desc"
	elif [ $rc -eq 2 ] && [ -n "$skip2" ]; then
		echo "ok 1 # SKIP $skip2"
	else
		echo "not ok 1 - $desc (exit $rc)"
		exit 1
	fi
}
