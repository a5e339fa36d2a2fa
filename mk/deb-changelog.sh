#!/bin/bash
# deb-changelog.sh CHANGELOG VERSION SHA — put VERSION at the top of a copy
# of debian/changelog (make deb's build tree) unless it is there already.
# The entry's date is the commit's (or a minute after the last entry), so a rebuild of one commit is the same
# package (dpkg takes SOURCE_DATE_EPOCH from it).
set -euo pipefail
f=$1 v=$2 sha=$3
[ -f "$f" ] || { echo "deb-changelog: $f does not exist" >&2; exit 1; }
top=$(sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' "$f")
[ "$top" = "$v" ] && exit 0
maint=$(sed -n 's/^ -- \(.*>\)  .*/\1/p' "$f" | head -1)
date=$(git log -1 --format=%cD 2>/dev/null || date -R)
# dpkg and lintian want the newest entry newest: a commit older than the
# last committed entry (the changelog itself not yet committed) gets a
# minute after it.
prev=$(date -d "$(sed -n 's/^ -- .*>  //p' "$f" | head -1)" +%s)
[ "$(date -d "$date" +%s)" -gt "$prev" ] || date=$(date -R -u -d "@$((prev + 60))")
{
	printf 'kiln (%s) unstable; urgency=medium\n\n' "$v"
	printf '  * Snapshot of git commit %s.\n\n' "${sha:-unknown}"
	printf ' -- %s  %s\n\n' "$maint" "$date"
	cat "$f"
} >"$f.new"
mv "$f.new" "$f"
