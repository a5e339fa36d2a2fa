#!/bin/bash
# pack-initrd.sh ROOT OUTDIR — pack the image root as OUTDIR/initrd.img (the
# whole tree, sorted and with fixed times, as a zstd-compressed newc cpio:
# the kernel unpacks it into RAM and starts systemd from it).  /boot is left
# out: vmlinuz is served on its own and would only waste RAM.
#
# The initrd holds no secret (the munge key and root's password hash come
# from kiln serve at boot, docs/image.md), but an image.packages addition
# is the admin's to judge, so it is still never readable by others on the
# build machine while it is written: initrd.img.new is created under umask
# 077 (zstd makes it 0600) and only gets its final mode, 0640, when it is
# complete and renamed over initrd.img.  A stale .new from an
# interrupted build is removed first: zstd -f would keep its old mode.
#
# Environment: ZSTD_LEVEL (default 9).  Called by build-image.sh; the fast
# image test runs it on a tiny root.
set -euo pipefail
[ $# = 2 ] || { echo "usage: pack-initrd.sh ROOT OUTDIR" >&2; exit 2; }
ROOT=$1 OUT=$2
new=$OUT/initrd.img.new
rm -f "$new"
(
	umask 077
	cd "$ROOT"
	find . -path ./boot -prune -o -print0 | LC_ALL=C sort -z |
		cpio --null --create --format=newc --quiet --reproducible |
		nice -n 5 zstd -q -T0 "-${ZSTD_LEVEL:-9}" -f -o "$new"
)
chmod 0640 "$new"
mv -f "$new" "$OUT/initrd.img"
