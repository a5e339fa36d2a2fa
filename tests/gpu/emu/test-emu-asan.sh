#!/bin/bash
# tests/gpu/emu/test-emu-asan.sh — the parity test on the CPU emulation
# of the cuda backend under AddressSanitizer + UBSan, on a subset of
# families (see test-emu-san.sh).  Prints TAP.
exec "$(dirname "$0")/test-emu-san.sh" asan
