# tests/image: the node image.  test-image-init runs in make test (no qemu,
# no network beyond 127.0.0.1, ~10 s); test-image-boot builds an image and
# PXE-boots it in qemu (minutes, root, make image-deps): make test-full.
TEST_SCRIPTS += tests/image/test-image-init.sh
TEST_FULL_SCRIPTS += tests/image/test-image-boot.sh
# the GPU-node image (image.nvidia) booted the same way; slower (driver, CUDA)
TEST_FULL_SCRIPTS += tests/image/test-image-gpu.sh
