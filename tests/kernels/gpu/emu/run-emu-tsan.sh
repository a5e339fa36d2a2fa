#!/bin/bash
# tests/kernels/gpu/emu/run-emu-tsan.sh — the parity test on the CPU emulation
# of the cuda backend under ThreadSanitizer, on a subset of
# families (see run-emu-san.sh).  Prints TAP.
exec "$(dirname "$0")/run-emu-san.sh" tsan
