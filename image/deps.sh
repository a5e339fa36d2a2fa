#!/bin/bash
# image/deps.sh — the Debian 12 packages `make image` and `make test-image`
# need, kept apart from mk/deps.sh so a build/test machine that never builds
# images stays lean.  Idempotent.
set -euo pipefail
PKGS=(
	mmdebstrap          # builds the image's root filesystem from Debian packages
	cpio                # packs the root as an initramfs (newc format)
	zstd                # compresses it (the kernel unpacks zstd initramfs)
	qemu-system-x86     # test-image: boots the image under software emulation
	ipxe-qemu           # test-image: the iPXE option ROM, the real PXE path
	netcat-openbsd      # test-image: checks slurmd's port from the head's namespace
	dnsmasq-base        # test-image: DHCP for the booting node (kiln render dnsmasq.conf)
)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "image-deps: all ${#PKGS[@]} packages present"
	exit 0
fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q
$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
