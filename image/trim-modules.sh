#!/bin/bash
# trim-modules.sh ROOT — drop kernel module trees a headless GPU compute node
# never loads (sound, video capture, wireless, bluetooth, other vendors'
# GPUs, staging), then depmod.  The whole root lives in RAM on every node,
# so every MiB here is a MiB less for jobs.  Network, storage, InfiniBand,
# and DRM core (which the NVIDIA driver uses) stay.
set -euo pipefail
R=${1:?usage: trim-modules.sh ROOT}
for kd in "$R"/usr/lib/modules/*/; do
	[ -d "$kd/kernel" ] || continue
	K=$kd/kernel v=$(basename "$kd")
	rm -rf "$K"/sound "$K"/drivers/media "$K"/drivers/net/wireless "$K"/net/wireless \
		"$K"/net/mac80211 "$K"/drivers/bluetooth "$K"/net/bluetooth \
		"$K"/drivers/gpu/drm/amd "$K"/drivers/gpu/drm/radeon "$K"/drivers/gpu/drm/nouveau \
		"$K"/drivers/gpu/drm/i915 "$K"/drivers/iio "$K"/drivers/staging "$K"/drivers/isdn \
		"$K"/drivers/input/joystick "$K"/drivers/input/touchscreen "$K"/drivers/net/can \
		"$K"/drivers/net/usb "$K"/drivers/comedi "$K"/drivers/usb/gadget "$K"/drivers/usb/serial \
		"$K"/drivers/video/fbdev "$K"/drivers/net/hamradio "$K"/drivers/net/wan "$K"/drivers/atm
	# in-kernel self tests (test_bpf alone is 4.6 MB)
	rm -f "$K"/lib/test_*.ko
	chroot "$R" depmod -a "$v"
done
du -sh "$R"/usr/lib/modules >&2
