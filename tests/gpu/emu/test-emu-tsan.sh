#!/bin/bash
# tests/gpu/emu/test-emu-tsan.sh — the parity test on the CPU emulation
# of the cuda backend under ThreadSanitizer, on a subset of
# families (see test-emu-san.sh).  Prints TAP.
exec "$(dirname "$0")/test-emu-san.sh" tsan
