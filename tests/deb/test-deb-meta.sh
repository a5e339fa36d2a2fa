#!/bin/bash
# test-deb-meta.sh — the fast checks of kiln's Debian packaging (seconds; no
# package build, no chroot): every file `make install` puts is claimed by
# exactly one debian/*.install and every claim matches a file; the unit
# files' Exec lines name installed programs and debian/rules enables each
# the documented way; every program has a man page in its package; the
# build profile leaves kiln-cuda out; kiln-node asks for no CUDA; make deb's
# changelog entry is newest and read by dpkg.  The build, install into a
# chroot and purge are tests/deb/test-deb.sh (make test-full).  Prints TAP.
set -uo pipefail
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
D=$top/debian
W=$(mktemp -d /tmp/kiln-deb-meta.XXXXXX)
trap 'rm -rf "$W"' EXIT

# ---- what make install puts, as the package build lays it out ---------------
# PREFIX=/usr as debian/rules has it; KILN_LIBEXECDIR pinned to the default
# PREFIX's, or schema.o of this build folder would be rebuilt for /usr under
# the other suites' feet.
if make --no-print-directory -s install B="$B" DESTDIR="$W/dest" PREFIX=/usr \
	UNITDIR=/lib/systemd/system KILN_LIBEXECDIR=/usr/local/libexec/kiln >"$W/install.log" 2>&1; then
	check "make install UNITDIR=/lib/systemd/system" 0
else
	check "make install UNITDIR=/lib/systemd/system (see $W/install.log)" 1
	cat "$W/install.log"
fi
(cd "$W/dest" && find . -type f -o -type l) | sed -e 's|^\./||' |
	grep -v '^etc/' | sort >"$W/files"
diag "$(wc -l <"$W/files") files installed"

pkgs=$(sed -n 's/^Package: //p' "$D/control")
# claims FILE: the packages whose .install lists FILE (a path, a folder above
# it or a glob), one per line
claims() {
	local f=$1 p e
	for p in $pkgs; do
		[ -f "$D/$p.install" ] || continue
		while read -r e _; do
			[ -n "$e" ] || continue
			# shellcheck disable=SC2053 # e is a glob on purpose
			if [ "$f" = "$e" ] || [[ "$f" == "$e"/* ]] || [[ "$f" == $e ]]; then
				echo "$p"
				break
			fi
		done <"$D/$p.install"
	done
}
bad=0
while read -r f; do
	n=$(claims "$f" | wc -l)
	[ "$n" -eq 1 ] || { diag "$f is claimed by $n packages ($(claims "$f" | paste -sd' ' -)); it needs one debian/PKG.install line"; bad=1; }
	echo "$f $(claims "$f")" >>"$W/owners"
done <"$W/files"
check "every installed file is in exactly one package" $bad
bad=0
for p in $pkgs; do
	[ -f "$D/$p.install" ] || continue
	while read -r e _; do
		[ -n "$e" ] || continue
		# shellcheck disable=SC2053
		if ! awk '{print $1}' "$W/files" | while read -r f; do
			{ [ "$f" = "$e" ] || [[ "$f" == "$e"/* ]] || [[ "$f" == $e ]]; } && exit 0
		done; then
			if [ "$p" = kiln-cuda ]; then
				diag "kiln-cuda: $e is not in this build (the CUDA module, h-cudamod); make deb builds without kiln-cuda"
			else
				diag "debian/$p.install: $e matches no installed file"
				bad=1
			fi
		fi
	done <"$D/$p.install"
done
check "every debian/*.install line matches an installed file" $bad

# ---- units -------------------------------------------------------------------
bad=0
for u in "$W"/dest/lib/systemd/system/*.service; do
	while read -r exe; do
		[ -x "$W/dest$exe" ] ||
			{ diag "${u##*/}: ExecStart names $exe, which the install does not put there"; bad=1; }
	done < <(sed -n 's/^ExecStart=[-@!+]*\([^ ]*\).*/\1/p' "$u")
done
check "the installed units' ExecStart programs are installed (PREFIX in the Exec lines)" $bad
rules_line() { grep -E "^[[:space:]]*dh_installsystemd .*[[:space:]]$1\.service\$" "$D/rules"; }
bad=0
for u in services/units/*.service; do
	n=${u##*/}; n=${n%.service}
	[ "$(rules_line "$n" | wc -l)" -eq 1 ] || { diag "debian/rules: no (or more than one) dh_installsystemd line names $n.service"; bad=1; }
done
check "debian/rules has one dh_installsystemd line per unit" $bad
bad=0
for u in services/units/*.socket; do
	n=${u##*/}; n=${n%.socket}
	rules_line "$n" | grep -q "[[:space:]]$n\.socket[[:space:]]" ||
		{ diag "debian/rules: $n.socket is not on $n.service's dh_installsystemd line (the port and its daemon go together)"; bad=1; }
	[ -f "$W/dest/lib/systemd/system/$n.socket" ] || { diag "make install puts no $n.socket"; bad=1; }
done
check "each socket unit is installed and handled with its service" $bad
ok "the kiln-inferd system user: sysusers.d/kiln.conf installed, dh_installsysusers creates it" \
	bash -c "grep -qx 'u kiln-inferd - .*' '$W/dest/usr/lib/sysusers.d/kiln.conf' && grep -qx '[[:space:]]dh_installsysusers' '$D/rules'"
ok "kiln-healthd: enabled and started by the package" \
	bash -c "rules_line() { grep -E \"^[[:space:]]*dh_installsystemd .*[[:space:]]\$1\\.service\\\$\" '$D/rules'; }
		l=\$(rules_line kiln-healthd); [[ \$l != *--no-enable* && \$l != *--no-start* ]]"
ok "kiln-inferd: neither enabled nor started by the package (kiln-node-init decides)" \
	bash -c "grep -qE '^[[:space:]]*dh_installsystemd .*--no-enable .*--no-start .*kiln-inferd\\.service\$|^[[:space:]]*dh_installsystemd .*--no-start .*--no-enable .*kiln-inferd\\.service\$' '$D/rules'"
ok "kiln-node-init: enabled, not started (it runs at boot)" \
	bash -c "l=\$(grep -E '^[[:space:]]*dh_installsystemd .*kiln-node-init\\.service\$' '$D/rules'); [[ \$l == *--no-start* && \$l != *--no-enable* ]]"

# ---- man pages ---------------------------------------------------------------
bad=0
while read -r f p; do
	case $f in usr/bin/* | usr/sbin/*) ;; *) continue ;; esac
	prog=${f##*/}
	# shellcheck disable=SC2094 # grep only reads it
	grep -qE "^usr/share/man/man[18]/$prog\\.[18] $p\$" "$W/owners" ||
		{ diag "$prog ($p) has no man page in $p (docs/man/$prog.1 or .8)"; bad=1; }
done <"$W/owners"
check "every program has a man page in its own package" $bad

# ---- control -----------------------------------------------------------------
# stanza PKG: that package's paragraph of debian/control
stanza() { awk -v p="$1" '/^Package: /{on = ($2 == p)} on' "$D/control"; }
ok "kiln-node: no CUDA and no kiln-cuda in Depends/Pre-Depends/Recommends" \
	bash -c "! sed -n '/^Package: kiln-node\$/,/^\$/p' '$D/control' | grep -iE '^(Depends|Pre-Depends|Recommends):.*(cuda|nvidia)|^ .*(cuda|nvidia).*,'"
check "kiln-cuda: Build-Profiles <!pkg.kiln.nocuda>" "$(stanza kiln-cuda | grep -qx 'Build-Profiles: <!pkg.kiln.nocuda>'; echo $?)"
if command -v dh_listpackages >/dev/null; then
	ok "dh_listpackages: kiln kiln-node kiln-cuda" \
		bash -c "[ \"\$(dh_listpackages 2>/dev/null | sort | paste -sd' ')\" = 'kiln kiln-cuda kiln-node' ]"
	ok "dh_listpackages -P pkg.kiln.nocuda: kiln kiln-node" \
		bash -c "[ \"\$(DEB_BUILD_PROFILES=pkg.kiln.nocuda dh_listpackages 2>/dev/null | sort | paste -sd' ')\" = 'kiln kiln-node' ]"
else
	skip "debhelper not installed (make deps)"
	skip "debhelper not installed (make deps)"
fi
ok "debian/rules is executable" test -x "$D/rules"
bad=0
for o in "$D"/*.lintian-overrides; do
	[ -e "$o" ] || continue
	p=${o##*/}; p=${p%.lintian-overrides}
	grep -qx "Package: $p" "$D/control" || { diag "$o: no package $p"; bad=1; }
	# every tag line follows a comment that gives the reason
	awk '/^#/{c=1; next} /^[^#[:space:]]/{if (!c) {print FILENAME": "$0" has no reason above it"; bad=1}; next} {c=0} END{exit bad}' "$o" ||
		bad=1
done
check "lintian overrides: known packages, each tag with its reason" $bad

# ---- version and changelog ---------------------------------------------------
mkv=$(sed -n 's/^VERSION *:= *//p' Makefile)
chv=$(dpkg-parsechangelog -l "$D/changelog" -S Version 2>/dev/null)
check "debian/changelog's version ($chv) is the Makefile's VERSION ($mkv)" "$([ "${chv%%+*}" = "$mkv" ]; echo $?)"
# the last entry dated after HEAD's commit (a changelog edited before it is
# committed): the snapshot must still come out newest
sed '0,/^ -- /s/^\( -- .*>  \).*/\1Thu, 01 Jan 2099 00:00:00 +0000/' "$D/changelog" >"$W/changelog"
mk/deb-changelog.sh "$W/changelog" "$mkv+git9999.abcdef12" abcdef12 &&
	mk/deb-changelog.sh "$W/changelog" "$mkv+git9999.abcdef12" abcdef12
check "deb-changelog.sh: the snapshot's version on top, once" \
	"$([ "$(dpkg-parsechangelog -l "$W/changelog" -S Version)" = "$mkv+git9999.abcdef12" ] &&
		[ "$(grep -c '^kiln (' "$W/changelog")" -eq $(($(grep -c '^kiln (' "$D/changelog") + 1)) ]; echo $?)"
t0=$(dpkg-parsechangelog -l "$W/changelog" -S Timestamp)
t1=$(dpkg-parsechangelog -l "$W/changelog" -S Timestamp -o 1 -c 1)
check "deb-changelog.sh: the snapshot's date is after the last entry's ($t0 > $t1)" "$([ "$t0" -gt "$t1" ]; echo $?)"
tap_done
