#!/bin/bash
# tests/gpu/emu/test-emu-mem.sh — runs the shape/alignment sweep of
# the memory-bound cuda ops (tests/gpu/test-kk-cuda-mem.c) against
# kernels/kk/cuda/*.cu compiled as host C++ on the CPU emulation of CUDA
# (test-emu.sh --mem: its build, under $KILN_BUILD/emu-mem so the two can run
# side by side).  Checks every vector and scalar path of
# kernels/kk/cuda/kc_vec.cuh's users without a GPU; takes a few minutes.
# Prints TAP.  Needs g++ and python3.
exec "$(dirname "$0")/test-emu.sh" --mem
