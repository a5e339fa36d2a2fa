#!/bin/bash
# tests/kernels/gpu/emu/run-emu-suite.sh — the cmocka kernels suite on the
# CPU emulation of the cuda backend (see run-emu.sh --suite).  Prints TAP.
exec "$(dirname "$0")/run-emu.sh" --suite
