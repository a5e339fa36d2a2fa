# shellcheck shell=bash
# local-env.sh — what kiln-run's suites on loopback share (source it with
# the scratch folder's name): B (the build folder), KR (kiln-run there), T
# (a scratch folder, removed at exit), pids (add each background job started
# with setsid: every process of its session is killed at exit), no Slurm job
# and no cluster file.  An empty $KILN_CONFIG means "not set" (the default
# path); a $KILN_CONFIG naming a missing file is an error (kiln_cfg_open), so
# the default path must not exist either: the caller checks.
B=${KILN_BUILD:-build}
KR=$(realpath "$B/bin/kiln-run")
T=$(mktemp -d "/tmp/$1.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		for q in $(ps -o pid= -s "$p" 2>/dev/null); do kill -9 "$q" 2>/dev/null; done
	done
	rm -rf "$T"
}
trap cleanup EXIT
unset SLURM_JOB_ID
export KILN_CONFIG=
