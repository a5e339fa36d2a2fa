#!/bin/bash
# test-deb.sh — kiln's Debian packages end to end: `make deb` (build and
# lintian), then install them with dpkg into a fresh Debian 12 chroot that
# holds minbase and the packages' declared Depends only (mmdebstrap from the
# mirror, cached under $B/deb-cache so reruns need no network), run kiln
# there (--version, check and render of an example file, every program's
# --help, ldd), look at the units the package enabled, then purge and
# compare the tree with the one before the install.  Root, the Debian mirror
# the first time, minutes: make test-full (make test-deb runs it alone).
# Environment: KILN_DEB_MIRROR (default http://deb.debian.org/debian).  TAP.
set -uo pipefail
# shellcheck source=tests/lib/suite.sh
. "$(dirname "$0")/../lib/suite.sh"
# shellcheck source=tests/lib/tap.sh
. "$top/tests/lib/tap.sh"
MIRROR=${KILN_DEB_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm

if [ "$(id -u)" != 0 ]; then skip "not root (dpkg in a chroot)"; tap_done; exit; fi
for t in mmdebstrap dpkg-buildpackage dh lintian; do
	command -v "$t" >/dev/null || { skip "$t is not installed (make deps)"; tap_done; exit; }
done
W=$(mktemp -d /tmp/kiln-deb.XXXXXX)
trap 'rm -rf "$W"' EXIT
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'; }

# ---- build -------------------------------------------------------------------
t=$EPOCHREALTIME
make --no-print-directory deb B="$B" >"$W/deb.log" 2>&1
rc=$?
diag "make deb: $(secs "$t") s"
check "make deb (dpkg-buildpackage, lintian --fail-on error,warning)" $rc
[ $rc -eq 0 ] || { tail -30 "$W/deb.log"; tap_done; exit; }
debs=()
for p in kiln kiln-node kiln-cuda; do
	f=$(find "$B/deb" -maxdepth 1 -name "${p}_*.deb" | head -1)
	[ -n "$f" ] && debs+=("$f")
done
names=$(for f in "${debs[@]}"; do dpkg-deb -f "$f" Package; done | paste -sd' ' -)
diag "packages: $names"
check "kiln and kiln-node were built" "$([[ " $names " == *" kiln "* && " $names " == *" kiln-node "* ]]; echo $?)"
cuda=0; [[ " $names " == *" kiln-cuda "* ]] && cuda=1
[ $cuda = 1 ] || diag "no kiln-cuda: this tree has no CUDA module (build/lib/kiln/kk-cuda.so, h-cudamod) or no nvcc"
ver=$(dpkg-deb -f "${debs[0]}" Version)

# ---- the chroot: minbase + the declared Depends, cached ------------------------
# Only what the packages declare: a library shlibs missed shows up below as
# "not found".  Version constraints are left to dpkg -i to check.
deps=$(for f in "${debs[@]}"; do dpkg-deb -f "$f" Depends; done | tr ',' '\n' |
	sed -e 's/|.*//' -e 's/(.*)//' -e 's/[[:space:]]//g' | grep -v '^kiln' | grep . | sort -u | paste -sd, -)
diag "Depends: $deps"
key=$(printf '%s %s %s' "$SUITE" "$MIRROR" "$deps" | sha256sum | cut -c1-12)
mkdir -p "$B/deb-cache"
base=$B/deb-cache/$SUITE-minbase-$key.tar
# mmdebstrap picks its output format from the name: the temporary one ends
# in .tar too
tmp=$B/deb-cache/.partial-$key.tar
if [ ! -s "$base" ]; then
	t=$EPOCHREALTIME
	if nice -n 5 mmdebstrap --variant=minbase --include="$deps" --skip=cleanup/apt/lists "$SUITE" "$tmp" \
		"deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
		"deb http://deb.debian.org/debian-security $SUITE-security main" >"$W/mmdebstrap.log" 2>&1; then
		mv "$tmp" "$base"
		# older tarballs of other dependency sets are not needed any more
		find "$B/deb-cache" -name "$SUITE-minbase-*.tar" ! -name "${base##*/}" -delete
	else
		rm -rf "$tmp"
		tail -20 "$W/mmdebstrap.log"
		skip "mmdebstrap failed (is $MIRROR reachable?); see the log above"
		tap_done
		exit
	fi
	diag "mmdebstrap (minbase + Depends, cached as ${base#"$top"/}): $(secs "$t") s"
else
	diag "chroot from the cache: ${base#"$top"/}"
fi
R=$W/root
mkdir -p "$R"
tar -xf "$base" -C "$R"
# snapshot: every path but the kernel's and scratch trees, with a checksum
# of every file under /etc
snap() {
	(cd "$R" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp -o -path ./run \) -prune \
		-o -print | sed 's|^\.||' | sort)
	(cd "$R" && find ./etc -type f -print0 | sort -z | xargs -0 md5sum)
}
snap >"$W/before"
in_root() { chroot "$R" "$@"; }

# ---- install -------------------------------------------------------------------
mkdir -p "$R/tmp/debs"
cp "${debs[@]}" "$R/tmp/debs/"
if in_root sh -c 'dpkg -i /tmp/debs/*.deb' >"$W/dpkg-i.log" 2>&1; then
	check "dpkg -i $names (no network: every dependency is in the chroot)" 0
else
	check "dpkg -i $names (no network: every dependency is in the chroot)" 1
	cat "$W/dpkg-i.log"
fi
rm -rf "$R/tmp/debs"
ok "kiln --version says ${ver%%+*}" bash -c "chroot '$R' kiln --version | grep -qw -- '${ver%%+*}'"
ok "kiln check on the example cluster file" in_root kiln -c /usr/share/kiln/examples/demo.cfg check
ok "kiln-healthd --help" bash -c "chroot '$R' kiln-healthd --help >/dev/null"
bad=0
for p in kiln-inferd kiln-run kiln-train kiln-healthd-active kiln-node-init; do
	in_root "$p" --help >/dev/null 2>&1 || { diag "$p --help failed in the chroot"; bad=1; }
done
check "every other program's --help" $bad
# shellcheck disable=SC2016 # expanded in the chroot
in_root sh -c 'for f in /usr/bin/kiln* /usr/lib/kiln/*.so; do [ -e "$f" ] && echo "$f:" && ldd "$f"; done' >"$W/ldd" 2>&1
n=$(grep -c '^/usr/bin/kiln.*:$' "$W/ldd")
# "not found" per file: the programs must resolve everything; kk-cuda.so
# only NVIDIA's runtime (no Debian package: the node image or the admin
# installs it, docs/install.md), nothing else
awk '/:$/ { f = $1 } /not found/ { print f, $1 }' "$W/ldd" >"$W/nf"
check "every library the $n programs link is installed (no 'not found' in ldd)" \
	"$([ "$n" -ge 6 ] && ! grep -v '^/usr/lib/kiln/kk-cuda.so:' "$W/nf" | grep -q .; echo $?)"
check "kk-cuda.so lacks only NVIDIA's runtime here (libcudart, libcublasLt, libnccl)" \
	"$(! grep '^/usr/lib/kiln/kk-cuda.so:' "$W/nf" | grep -vE ' (libcudart\.so\.13|libcublasLt\.so\.13|libnccl\.so\.2)$' | grep -q .; echo $?)"
sed 's/^/# not found: /' "$W/nf"
if [ $cuda = 0 ]; then
	check "no CUDA library linked (a CPU-only node)" "$([ "$n" -ge 6 ] && ! grep -qiE 'cuda|cublas|nccl' "$W/ldd"; echo $?)"
else
	check "only kk-cuda.so links CUDA" "$(! awk '/:$/{f=$1} /cuda|cublas|nccl/ && f !~ /kk-cuda/' "$W/ldd" | grep -q .; echo $?)"
fi
in_root kiln -c /usr/share/kiln/examples/demo.cfg render slurm.conf >"$W/slurm.conf" 2>&1
bad=0
for k in Prolog Epilog HealthCheckProgram; do
	v=$(sed -n "s/^$k=//p" "$W/slurm.conf")
	{ [[ $v == /usr/libexec/kiln/* ]] && [ -x "$R$v" ]; } || { diag "slurm.conf: $k=$v is not a script kiln-node installed"; bad=1; }
done
check "kiln render slurm.conf: Prolog, Epilog, HealthCheckProgram are /usr/libexec/kiln's scripts" $bad
wants=$R/etc/systemd/system/multi-user.target.wants
ok "kiln-healthd.service enabled" test "$(readlink "$wants/kiln-healthd.service")" = /lib/systemd/system/kiln-healthd.service
ok "kiln-node-init.service enabled" test -L "$wants/kiln-node-init.service"
ok "kiln-inferd.service not enabled (kiln-node-init starts it where the file says)" \
	bash -c "! find '$R/etc/systemd' -name kiln-inferd.service | grep -q ."
ok "ExecStart of kiln-healthd.service is /usr/bin/kiln-healthd" grep -qx 'ExecStart=/usr/bin/kiln-healthd' "$R/lib/systemd/system/kiln-healthd.service"

# ---- purge -----------------------------------------------------------------------
# what kiln-node-init would have written on a node
mkdir -p "$R/etc/kiln" && printf 'KILN_NODE=node01\n' >"$R/etc/kiln/node.env"
pkgs=$(echo "$names" | tr ' ' '\n' | tac | paste -sd' ' -)
# shellcheck disable=SC2086 # a list of package names
ok "dpkg --purge $pkgs" in_root dpkg --purge $pkgs
snap >"$W/after"
# dpkg's own database and logs change on any install; nothing else may
diff "$W/before" "$W/after" | grep '^[<>]' |
	grep -vE '^[<>] ([0-9a-f]{32}  \./etc/ld\.so\.cache|/var/lib/dpkg/|/var/log/)' >"$W/diff"
check "purge leaves the tree as it was (but dpkg's database and logs)" "$([ ! -s "$W/diff" ]; echo $?)"
sed 's/^/# /' "$W/diff" | head -20
ok "dpkg knows no kiln package any more" bash -c "chroot '$R' dpkg -l >'$W/dpkg-l' && ! grep -q ' kiln' '$W/dpkg-l'"
tap_done
