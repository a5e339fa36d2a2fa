#!/bin/bash
# tests/gpu/emu/test-emu-suite.sh — the cmocka kernels suite on the
# CPU emulation of the cuda backend (see test-emu.sh --suite).  Prints TAP.
exec "$(dirname "$0")/test-emu.sh" --suite
