# tap.sh — tiny TAP helpers for kiln's shell test suites (source it).
#   ok "description" command args...    runs the command; ok/not ok by its status
#   check "description" <condition rc>  records a result from a status you computed
#   skip "reason"                       a skipped test
#   diag "text"                         a comment line
#   tap_done                            prints the plan; exit status 1 on any failure
_tap_n=0
_tap_failed=0
ok() {
	local desc=$1; shift
	_tap_n=$((_tap_n + 1))
	if "$@"; then echo "ok $_tap_n - $desc"; else echo "not ok $_tap_n - $desc"; _tap_failed=$((_tap_failed + 1)); fi
}
check() {
	_tap_n=$((_tap_n + 1))
	if [ "$2" -eq 0 ]; then echo "ok $_tap_n - $1"; else echo "not ok $_tap_n - $1"; _tap_failed=$((_tap_failed + 1)); fi
}
skip() { _tap_n=$((_tap_n + 1)); echo "ok $_tap_n # SKIP $1"; }
diag() { echo "# $*"; }
tap_done() { echo "1..$_tap_n"; [ "$_tap_failed" -eq 0 ]; }
