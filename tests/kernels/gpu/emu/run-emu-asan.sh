#!/bin/bash
# tests/kernels/gpu/emu/run-emu-asan.sh — the parity test on the CPU emulation
# of the cuda backend under AddressSanitizer + UBSan, on a subset of
# families (see run-emu-san.sh).  Prints TAP.
exec "$(dirname "$0")/run-emu-san.sh" asan
