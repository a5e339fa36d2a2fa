#!/bin/bash
# test-image-gpu.sh — the GPU-node image's boot test: test-image-boot.sh with
# tests/image/qemu-gpu.cfg (image.nvidia, 8 GPUs expected).  qemu has no GPU:
# the image must boot, load no driver without failing a unit, and
# kiln-healthd must drain the node with "0 GPUs found, the cluster file
# says 8".  Slow (image with the driver and CUDA: minutes): make test-image
# and make test-full only.
KILN_IMAGE_TEST_GPU=1 exec "$(dirname "$0")/test-image-boot.sh" "$@"
