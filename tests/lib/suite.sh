# shellcheck shell=bash
# suite.sh — the start every end-to-end suite of kiln shares (source it
# first): sets here (the suite's folder), top (the repository root, which
# becomes the working directory), B (the build folder, made absolute) and
# KILN (the kiln CLI there).
# shellcheck disable=SC2034 # set for the sourcing script
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top" || exit 1
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
# shellcheck disable=SC2034
KILN=$B/bin/kiln
