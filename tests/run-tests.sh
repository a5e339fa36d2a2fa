#!/bin/bash
# Run kiln's test suites and sum their TAP output.
#
# Every suite is an executable (a cmocka binary, or a script) that prints TAP:
# "ok N - name", "not ok N - name", and skips as "ok N # SKIP reason" (or
# cmocka 1.1's "not ok N # SKIP name").  A suite that exits non-zero without
# reporting a failure (a crash, a timeout) counts as one failure.
# The last line is "N passed, N failed, N skipped"; exit 1 on any failure.
#
#   tests/run-tests.sh [--filter 'SUBSTR...'] SUITE...
# --filter: only the suites whose name contains one of the (space-separated)
# substrings (make test T='model train').
set -u
filter=""
if [ "${1:-}" = --filter ]; then filter=$2; shift 2; fi
B=${KILN_BUILD:-build}
logdir=$B/test-logs
mkdir -p "$logdir"
timeout_s=${KILN_SUITE_TIMEOUT:-900}
export CMOCKA_MESSAGE_OUTPUT=TAP
export KILN_BUILD=$B
total_pass=0 total_fail=0 total_skip=0
failed_suites=()
for suite in "$@"; do
	name=$(basename "$suite")
	name=${name%.sh}
	if [ -n "$filter" ]; then
		hit=0
		for f in $filter; do [[ "$name" == *"$f"* ]] && hit=1; done
		[ $hit = 1 ] || continue
	fi
	log=$logdir/$name.log
	start=$EPOCHREALTIME
	timeout -k 10 "$timeout_s" "$suite" >"$log" 2>&1 </dev/null
	rc=$?
	dur=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
	pass=$(grep -cE '^ok [0-9]+' "$log" | head -1)
	skip=$(grep -cE '^(not )?ok [0-9]+.*# (SKIP|skip)' "$log" | head -1)
	okskip=$(grep -cE '^ok [0-9]+.*# (SKIP|skip)' "$log" | head -1)
	fail=$(grep -E '^not ok [0-9]+' "$log" | grep -cvE '# (SKIP|skip)' | head -1)
	pass=$((pass - okskip))
	if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
		fail=1
		echo "not ok - $name exited with status $rc (crash or timeout)" >>"$log"
	fi
	total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail)); total_skip=$((total_skip + skip))
	status=PASS; [ "$fail" -gt 0 ] && status=FAIL
	printf '%-4s %-28s %4d passed %3d failed %3d skipped  %6ss\n' "$status" "$name" "$pass" "$fail" "$skip" "$dur"
	if [ "$fail" -gt 0 ]; then
		failed_suites+=("$name")
		grep -E '^not ok' "$log" | grep -vE '# (SKIP|skip)' | sed 's/^/     /' | head -20
		echo "     --- last lines of $log:"
		tail -n 25 "$log" | sed 's/^/     | /'
	fi
	if [ "$skip" -gt 0 ]; then
		# the distinct reasons, not every line; cmocka puts the reason on a
		# "# SKIP reason" comment line and only the test's name on the result
		reasons=$(grep -E '^# (SKIP|skip) ' "$log" | sed -E 's/^# (SKIP|skip) //' |
			awk '!seen[$0]++' | head -3 | paste -sd ';' -)
		[ -n "$reasons" ] || reasons=$(grep -E '^(not )?ok [0-9]+.*# (SKIP|skip)' "$log" |
			sed -E 's/.*# (SKIP|skip) ?//' | awk '!seen[$0]++' | head -3 | paste -sd ';' -)
		echo "     skipped: $reasons"
	fi
done
[ ${#failed_suites[@]} -gt 0 ] && echo "failed suites: ${failed_suites[*]}"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
