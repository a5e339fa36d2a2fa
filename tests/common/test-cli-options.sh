#!/bin/bash
# test-cli-options.sh — one command-line language across kiln's programs, printing TAP.
#
# Every program in $KILN_BUILD/bin is asked for its option table
# (--dump-options, kiln/prog.h); a program not on the skeleton yet does not
# answer and is SKIPped.  Fails when one short letter stands for two long
# names anywhere (two programs, or two verbs of kiln), or when a shared
# letter (-c -v -q -h) means anything but --config --verbose --quiet
# --help; checks that --help exits 0 and --version prints "NAME VERSION";
# and checks the bash completion mk/gen-completion.sh built from the same
# tables (COMPREPLY for `kiln re<TAB>`, `kiln render <TAB>` ...).
set -u
cd "$(dirname "$0")/../.."
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
# shellcheck source=../lib/tap.sh
. tests/lib/tap.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_LOG_PREFIX=0
unset KILN_CONFIG

# letters PROG DUMPFILE: "LETTER LONG PROG[ VERB]" for every short option.
letters() {
	awk -F'\t' -v prog="$1" '
		$1 == "option" && $3 != "" { print substr($3, 2), $2, prog }
		$2 == "option" && $4 != "" { print substr($4, 2), $3, prog " " $1 }' "$2"
}

# conflicts LETTERS-FILE: prints one line per letter with two meanings, or
# per shared letter with another meaning; exits 1 if any.
conflicts() {
	awk '
		BEGIN { shared["c"] = "--config"; shared["v"] = "--verbose"
			shared["q"] = "--quiet"; shared["h"] = "--help" }
		{
			where = $3 (NF > 3 ? " " $4 : "")
			if (($1 in shared) && $2 != shared[$1] && !seen["s" $1 $2]++) {
				print "-" $1 " is " shared[$1] " everywhere, but " $2 " in " where; bad = 1
			}
			if (($1 in first) && first[$1] != $2 && !seen[$1 $2]++) {
				print "-" $1 " is " first[$1] " in " firstwhere[$1] " but " $2 " in " where; bad = 1
			}
			if (!($1 in first)) { first[$1] = $2; firstwhere[$1] = where }
		}
		END { exit bad }' "$1"
}

# 1. the option tables
: >"$tmp/letters"
answered=()
for prog in "$B"/bin/*; do
	[ -f "$prog" ] && [ -x "$prog" ] || continue
	name=${prog##*/}
	if timeout 10 "$prog" --help </dev/null >"$tmp/help" 2>&1; then
		check "$name --help exits 0" 0
	else
		check "$name --help exits 0" 1
		diag "$(head -5 "$tmp/help")"
	fi
	if ! timeout 10 "$prog" --dump-options </dev/null >"$tmp/$name.dump" 2>/dev/null ||
		! grep -q $'^option\t--help\t-h\t' "$tmp/$name.dump"; then
		skip "$name does not answer --dump-options yet (not on kiln/prog.h)"
		continue
	fi
	answered+=("$name")
	v=$(timeout 10 "$prog" --version </dev/null 2>&1)
	if [[ $v =~ ^$name\ [0-9][0-9.]*[^\ ]*$ ]]; then
		check "$name --version prints '$v'" 0
	else
		check "$name --version prints \"$name VERSION\"" 1
		diag "got: $v"
	fi
	letters "$name" "$tmp/$name.dump" >>"$tmp/letters"
	# every verb has its own --help
	for verb in $(awk -F'\t' '$1 == "verb" { print $2 }' "$tmp/$name.dump"); do
		timeout 10 "$prog" "$verb" --help </dev/null >/dev/null 2>&1
		check "$name $verb --help exits 0" $?
	done
done
if [ ${#answered[@]} -gt 0 ]; then
	conflicts "$tmp/letters" >"$tmp/conflicts"
	rc=$?
	check "one meaning per short letter in ${answered[*]} ($(cut -d' ' -f1 "$tmp/letters" | sort -u | tr -d '\n'))" $rc
	while read -r l; do diag "$l"; done <"$tmp/conflicts"
else
	skip "no program answers --dump-options"
fi

# The check itself catches a planted conflict: kiln-x uses -c for --color
# and -o for --once where kiln has -o --output.
printf 'c --config kiln\no --output kiln render\nc --color kiln-x\no --once kiln-x\n' >"$tmp/planted"
conflicts "$tmp/planted" >"$tmp/conflicts"
[ $? -ne 0 ] && [ "$(wc -l <"$tmp/conflicts")" -eq 3 ]
check "a planted conflict is found (-c --color, -o --once)" $?

# 2. bash completion, from the same tables
comp=$B/share/bash-completion/completions
for name in "${answered[@]}"; do
	if [ -f "$comp/$name" ] && bash -n "$comp/$name"; then
		check "$name: completion generated ($comp/$name)" 0
	else
		check "$name: completion generated ($comp/$name)" 1
	fi
done
if [ -f "$comp/kiln" ]; then
	# complete WORDS...: COMPREPLY for the last word, as bash would ask.
	cat >"$tmp/complete.sh" <<-EOF
		. "$comp/kiln"
		PATH="$B/bin:\$PATH"
		COMP_WORDS=("\$@")
		COMP_CWORD=\$((\${#COMP_WORDS[@]} - 1))
		_kiln
		printf '%s\n' "\${COMPREPLY[@]}" | sort | tr '\n' ' '
	EOF
	expect() { # DESCRIPTION WANT WORDS...
		local desc=$1 want=$2 got
		shift 2
		got=$(bash "$tmp/complete.sh" "$@" 2>&1)
		got=${got% }
		if [ "$got" = "$want" ]; then check "completion: $desc" 0; else
			check "completion: $desc" 1
			diag "want: $want"
			diag "got:  $got"
		fi
	}
	targets=$("$B/bin/kiln" --dump-options | awk -F'\t' '$1 == "render" && $2 == "args" { print $3 }' | tr ' ' '\n' | sort | tr '\n' ' ')
	expect "kiln ren<TAB> -> render" "render" kiln ren
	expect "kiln <TAB> -> the verbs" "apply check help keygen model reboot render serve show sign status tokenize verify" kiln ""
	expect "kiln render <TAB> -> the targets" "${targets% }" kiln render ""
	expect "kiln render n<TAB> -> node-env node.ipxe" "node-env node.ipxe" kiln render n
	expect "kiln -c <file>: files" "config/examples/demo.cfg config/examples/dgx-pod.cfg" kiln -c config/examples/d
	expect "kiln --config=<file>: files" "config/examples/demo.cfg config/examples/dgx-pod.cfg" kiln --config = config/examples/d
	expect "kiln -c FILE render node-env --node <TAB>: the file's nodes" "node01 node02 node03" \
		kiln -c config/examples/demo.cfg render node-env --node ""
	expect "kiln -c FILE show node <TAB>: the file's nodes" "node01 node02 node03" \
		kiln -c config/examples/demo.cfg show node ""
	expect "kiln check --j<TAB> -> --json" "--json" kiln check --j
	expect "kiln render --<TAB>: render's options" "--config --help --node --output --quiet --verbose --version" kiln render --
	expect "kiln model <TAB> -> inspect" "inspect" kiln model ""
	expect "kiln check <TAB>: nothing" "" kiln check ""
	# the targets completion offers are the ones render takes
	bad=""
	for t in $targets; do
		"$B/bin/kiln" -c config/examples/demo.cfg render "$t" -o "$tmp/render-$t" 2>&1 | grep -q "Unknown render target" && bad="$bad $t"
	done
	"$B/bin/kiln" -c config/examples/demo.cfg render nope 2>&1 | grep -q "Unknown render target" || bad="$bad (nope accepted)"
	[ -z "$bad" ] && [ -n "$targets" ]
	check "completion's render targets are render's ($targets)" $?
	[ -z "$bad" ] || diag "refused:$bad"
else
	skip "no $comp/kiln (make builds it)"
fi

tap_done
