#!/bin/bash
# gen-completion.sh — bash completion for kiln's programs, from their option tables.
#
#   mk/gen-completion.sh OUTDIR PROGRAM...
#
# Runs each PROGRAM with --dump-options (common/prog.c dump_options():
# "option\t--LONG\t-S\tARG\tCOMPLETE", "args\tCOMPLETE...", "verb\tNAME\tSUMMARY",
# a verb's own lines prefixed "VERB\t") and writes
# OUTDIR/bash-completion/completions/NAME, which bash-completion loads on
# the first <TAB> after NAME (or source it by hand).  The option tables are
# the only source: a program that gains an option completes it after the
# next `make`.  A program that does not answer --dump-options (not on the
# kiln/prog.h skeleton yet) is skipped with a note on stderr.
#
# What completes: options of the current verb (or of the program), verbs,
# then a verb's positional arguments; an option's or argument's value by its
# COMPLETE field: "file", "dir", "host", "node" (the names `kiln show nodes`
# prints, with the -c FILE of the command line), or a list of words.  The
# generated files need bash >= 4 and nothing else (not bash-completion's
# helpers), so the tests can source them anywhere.
set -euo pipefail

if [ $# -lt 2 ]; then
	echo "usage: $0 OUTDIR PROGRAM..." >&2
	exit 2
fi
out=$1/bash-completion/completions
shift
mkdir -p "$out"

# The engine every generated file carries (each file must stand alone:
# bash-completion sources only the one for the command being completed).
# $1 is the program's data function:
#   DATA opts SCOPE        REPLY = the option words of SCOPE ("" or a verb)
#   DATA arg "SCOPE OPT"   REPLY = OPT's COMPLETE value; 1 if OPT takes no argument
#   DATA verbs             REPLY = the verbs; 1 if none
#   DATA args "SCOPE N"    REPLY = COMPLETE of positional N; 1: no list (files), 2: none
engine() {
	cat <<'EOF'
__kiln_nodes() {
	local k=kiln
	if [[ ${COMP_WORDS[0]} == */* ]] && [ -x "${COMP_WORDS[0]%/*}/kiln" ]; then
		k=${COMP_WORDS[0]%/*}/kiln
	fi
	"$k" "$@" show nodes 2>/dev/null | awk 'NR > 1 { print $1 }'
}

__kiln_words() { # KIND CUR [kiln -c FILE]
	local kind=$1 cur=$2
	shift 2
	case $kind in
	file)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
	dir)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
	host) mapfile -t COMPREPLY < <(compgen -A hostname -- "$cur") ;;
	node) mapfile -t COMPREPLY < <(compgen -W "$(__kiln_nodes "$@")" -- "$cur") ;;
	"") COMPREPLY=() ;;
	*) mapfile -t COMPREPLY < <(compgen -W "$kind" -- "$cur") ;;
	esac
}

__kiln_complete() { # DATA
	local data=$1 cur=${COMP_WORDS[COMP_CWORD]} scope="" want="" w i n=0 r REPLY
	local -a cfg=()
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		[[ $w == "~/"* ]] && w=$HOME/${w#"~/"}
		if [ -n "$want" ]; then
			# "--config=FILE": bash splits at '=' (COMP_WORDBREAKS)
			[ "$w" = "=" ] && continue
			case $want in -c | --config) cfg=(-c "$w") ;; esac
			want=""
			continue
		fi
		case $w in
		--*=*) [ "${w%%=*}" = --config ] && cfg=(-c "${w#*=}") ;;
		-?*) "$data" arg "$scope $w" && want=$w ;;
		*)
			if [ -z "$scope" ] && "$data" verbs && [[ " $REPLY " == *" $w "* ]]; then
				scope=$w
			else
				n=$((n + 1))
			fi ;;
		esac
	done
	[ "$cur" = "=" ] && cur=""
	COMPREPLY=()
	if [ -n "$want" ]; then
		"$data" arg "$scope $want"
		__kiln_words "$REPLY" "$cur" "${cfg[@]}"
	elif [[ $cur == -* ]]; then
		"$data" opts "$scope"
		mapfile -t COMPREPLY < <(compgen -W "$REPLY" -- "$cur")
	elif [ -z "$scope" ] && "$data" verbs; then
		mapfile -t COMPREPLY < <(compgen -W "$REPLY" -- "$cur")
	else
		"$data" args "$scope $n" && r=0 || r=$?
		case $r in
		0) __kiln_words "$REPLY" "$cur" "${cfg[@]}" ;;
		1) __kiln_words file "$cur" ;;
		esac
	fi
	return 0
}
EOF
}

# The data function of one program, from its --dump-options on stdin.
# Exits 3 on a line it does not know (not a dump, or a newer format).
data_function() { # FUNCTION-NAME
	awk -F'\t' -v fn="$1" '
	function q(s) { gsub(/\047/, "\047\\\047\047", s); return "\047" s "\047" }
	{
		scope = ""; f = 1
		if (!($1 in known)) {
			if (!($1 in isverb)) { bad = 1; exit }
			scope = $1; f = 2
		}
		if ($f == "option") {
			if ($(f + 1) !~ /^--[A-Za-z0-9][A-Za-z0-9_-]*$/ || $(f + 2) !~ /^(-[A-Za-z0-9])?$/) { bad = 1; exit }
			if (!(scope in opts)) order[++nscopes] = scope
			opts[scope] = opts[scope] (opts[scope] == "" ? "" : " ") $(f + 1) ($(f + 2) == "" ? "" : " " $(f + 2))
			if ($(f + 3) != "") {
				pat = q(scope " " $(f + 1)) ($(f + 2) == "" ? "" : " | " q(scope " " $(f + 2)))
				arg = arg "\t\t" pat ") REPLY=" q($(f + 4)) " ;;\n"
			}
			if ($(f + 1) == "--help") help = 1
		} else if ($f == "args") {
			for (i = f + 1; i <= NF; i++)
				args = args "\t\t" q(scope " " (i - f - 1)) ") REPLY=" q($i) " ;;\n"
			rest = rest "\t\t" q(scope " ") "*) return 2 ;;\n"
		} else if ($f == "verb" && scope == "") {
			isverb[$2] = 1
			verbs = verbs (verbs == "" ? "" : " ") $2
		} else { bad = 1; exit }
	}
	BEGIN { known["option"] = known["args"] = known["verb"] = 1 }
	END {
		if (bad || !help) exit 3
		print fn "() {"
		print "\tcase $1 in"
		print "\topts)"
		print "\t\tcase $2 in"
		for (i = 1; i <= nscopes; i++)
			print "\t\t" q(order[i]) ") REPLY=" q(opts[order[i]]) " ;;"
		print "\t\t*) REPLY= ;;"
		print "\t\tesac ;;"
		print "\targ)"
		print "\t\tcase $2 in"
		printf "%s", arg
		print "\t\t*) return 1 ;;"
		print "\t\tesac ;;"
		print "\tverbs)"
		print (verbs == "" ? "\t\treturn 1 ;;" : "\t\tREPLY=" q(verbs) " ;;")
		print "\targs)"
		print "\t\tcase $2 in"
		printf "%s%s", args, rest
		print "\t\t*) return 1 ;;"
		print "\t\tesac ;;"
		print "\tesac"
		print "}"
	}'
}

status=0
for prog in "$@"; do
	name=${prog##*/}
	fn=_$(tr -c 'A-Za-z0-9_\n' '_' <<<"$name")
	rm -f "$out/$name"
	if ! dump=$(timeout 10 "$prog" --dump-options 2>/dev/null </dev/null) || [ -z "$dump" ]; then
		echo "gen-completion: $name does not answer --dump-options (not on kiln/prog.h yet); no completion for it" >&2
		continue
	fi
	if ! data=$(data_function "${fn}_data" <<<"$dump"); then
		echo "gen-completion: $name --dump-options printed something else than option tables; no completion for it" >&2
		continue
	fi
	{
		echo "# bash completion for $name, generated by mk/gen-completion.sh from"
		echo "# \`$name --dump-options\` (its option table); do not edit."
		echo
		engine
		echo
		echo "$data"
		echo
		echo "$fn() { __kiln_complete ${fn}_data; }"
		echo "complete -F $fn $name"
	} >"$out/$name.tmp"
	if ! bash -n "$out/$name.tmp"; then
		echo "gen-completion: the completion generated for $name is not valid bash" >&2
		status=1
		rm -f "$out/$name.tmp"
		continue
	fi
	mv "$out/$name.tmp" "$out/$name"
done
exit $status
