#!/bin/bash
# tests/gpu/emu/test-emu-tsan-attn.sh — the tensor-core attention
# forward and backward (the two GQA 8/1 cases of test-kk-cuda, filter word
# gqa8: d=128 non-causal over 17 and 63 tokens, d=64 causal over 130, 1 and
# 65, so tiles are double-buffered and reused) on the CPU emulation under
# ThreadSanitizer.  A script of its own: the attention tiles are
# the slowest thing to emulate, and with the families of test-emu-tsan.sh
# one run would pass the 900 s suite timeout.  Prints TAP.
export KILN_EMU_SAN_FILTERS=${KILN_EMU_SAN_FILTERS:-gqa8}
exec "$(dirname "$0")/test-emu-san.sh" tsan
