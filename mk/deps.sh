#!/bin/bash
# Installs every package kiln's build, tests, demo and benchmarks need, from
# Debian 12's archive.  Idempotent: does nothing when all are present.
# The CUDA toolkit is expected at /usr/local/cuda (not a Debian package);
# without it CUDA code is skipped (CUDA=0) and everything else still builds.
set -euo pipefail
PKGS=(
	# build
	build-essential pkg-config clang libclang-rt-14-dev clang-format cppcheck
	# libraries kiln links
	libconfig-dev       # the cluster file parser
	libcmocka-dev       # unit tests
	libsystemd-dev      # sd_notify READY/STATUS/WATCHDOG
	libjansson-dev      # JSON (healthd --json, inferd API)
	libmicrohttpd-dev   # HTTP (/metrics, inferd)
	libopenblas-dev     # CPU GEMM
	libslurm-dev        # drain/resume, hostlists, requeue
	libmunge-dev
	libhwloc-dev        # CPU/NUMA binding of workers
	# real parts the tests start
	slurmctld slurmd slurm-client munge
	dnsmasq-base        # dnsmasq --test on rendered configs
	prometheus          # promtool check metrics
	python3-torch python3-numpy  # PyTorch workers against kiln's store (torch 1.13, CPU)
	iproute2 util-linux procps psmisc curl systemd
	jq                  # kiln model inspect --json checks; test-inferd.sh replies
	shellcheck          # lint of the image scripts and kiln-node-init (tests/image)
)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: all ${#PKGS[@]} packages present"
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
echo "deps: done"
