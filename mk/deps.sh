#!/bin/bash
# Installs every package kiln's build, tests, demo and benchmarks need, from
# Debian 12's archive.  Idempotent: does nothing when all are present.
# The CUDA toolkit is expected at /usr/local/cuda (not a Debian package);
# without it CUDA code is skipped (CUDA=0) and everything else still builds.
set -euo pipefail
PKGS=(
	# build
	build-essential pkg-config clang libclang-rt-14-dev clang-format cppcheck
	clang-16            # second CUDA compiler (tests/kernels/test-clang-cuda.sh): clang-14
	                    # has no sm_90; 16 reads CUDA 13's headers (with one stub header)
	# libraries kiln links
	libconfig-dev       # the cluster file parser
	libcmocka-dev       # unit tests
	libsystemd-dev      # sd_notify READY/STATUS/WATCHDOG
	libjansson-dev      # JSON (healthd --json, inferd API)
	libmicrohttpd-dev   # HTTP (/metrics, inferd)
	libopenblas-dev     # CPU GEMM
	libslurm-dev        # drain/resume, hostlists, requeue
	libmunge-dev
	libsodium-dev       # ed25519 signatures of the cluster file (kiln sign/verify)
	libhwloc-dev        # CPU/NUMA binding of workers
	# real parts the tests start
	slurmctld slurmd slurm-client munge
	dnsmasq-base        # dnsmasq --test on rendered configs
	prometheus          # promtool: check metrics, check/test rules, check config (tests/monitoring)
	python3-yaml        # tests/monitoring reads the rendered Prometheus files
	python3-torch python3-numpy  # PyTorch workers against kiln's store (torch 1.13, CPU)
	iproute2 util-linux procps psmisc curl systemd
	jq                  # kiln model inspect --json checks; test-inferd.sh replies
	shellcheck          # lint of the image scripts and kiln-node-init (tests/image)
	cpio zstd           # tests/image/test-image-init.sh packs a tiny initrd (image/pack-initrd.sh)
	sshfs openssh-sftp-server socat  # tests/cluster/test-cluster-users.sh: a network share served
	                    # from the head's namespace (sftp-server behind socat), mounted by
	                    # the nodes (this kernel has no NFS client to mount an NFS export)
	python3-pip         # installs the pinned PyPI references below
	cmake python3-venv  # make bench only: tests/peer compiles llama-cpp-python (the llama.cpp
	                    # peer) into a venv of its own, never a kiln dependency
	debhelper lintian   # make deb: dpkg-buildpackage with dh, the lintian check
	mmdebstrap          # make test-deb: the chroot the packages are installed into
)
# PyPI packages, exact pins: the independent reference implementations the
# tokenizer tests (tests/tokenizer/test-tokenizer-live.sh) and benchmark
# (bench-tok.sh) compare libktok with, and that make-fixtures.py trains the
# committed fixtures with.  Installed into Debian's /usr/bin/python3 with
# --break-system-packages (Debian 12's pip refuses plain system installs,
# PEP 668): the tests already use that interpreter for python3-torch, and a
# venv would have to live somewhere every build dir (B=) can find.  Tests
# that need them SKIP with the reason when they are missing.
PIP_PKGS=(
	tokenizers==0.23.3     # Hugging Face tokenizers: BPE byte-level/byte-fallback reference
	sentencepiece==0.2.3   # Google sentencepiece: the SentencePiece BPE reference
	openai==3.57.0         # the official OpenAI client: kiln-inferd conformance (test-openai-client)
	nvidia-cuda-cuobjdump==13.2.78 # cuobjdump: SASS of the kernels (kernels/bench/sass-mix.sh), which the toolkit here lacks
	nvidia-cuda-nvdisasm==13.2.78  # nvdisasm, which cuobjdump -sass runs
)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
pip_deps() {
	local need=0 spec
	for spec in "${PIP_PKGS[@]}"; do
		/usr/bin/python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('${spec%%==*}') != '${spec##*==}')" \
			2>/dev/null || need=1
	done
	[ $need -eq 0 ] && return 0
	echo "deps: pip installing ${PIP_PKGS[*]}"
	# $SUDO: set below, before the apt path calls this; empty when root.
	${SUDO:-} /usr/bin/python3 -m pip install -q --break-system-packages "${PIP_PKGS[@]}" ||
		echo "deps: pip install failed; the live tokenizer tests, the HF column of bench-tok and test-openai-client will skip" >&2
}
if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: all ${#PKGS[@]} packages present"
	pip_deps
	exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q
$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
# Debian starts no daemons here (no systemd as PID 1); stop any that a
# package's postinst started anyway so tests own their ports.
for d in munged slurmctld slurmd prometheus; do pkill -x "$d" 2>/dev/null || true; done
pip_deps
echo "deps: done"
