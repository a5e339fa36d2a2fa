# tests/gpu/: the GPU kit — everything a GPU machine (which has the CUDA
# toolkit and driver but none of Debian's -dev libraries, and no network)
# needs to run kiln's GPU checks: `make gpu-kit` builds into $(B) and packs the
# binaries plus the non-CUDA shared libraries they load into .gpukit/
# (ignored by git, under the device tool's 64 MiB carry limit); on the GPU
# machine `tests/gpu/run.sh` runs the parity tests, the kernels suite on the
# cuda backend, kiln-healthd --check/--active on the real driver, the
# benchmark and compute-sanitizer, each into its own log.  docs/gpu-kit.md.
GPU_KIT ?= .gpukit
# The second head-dim-128 attention tiling (KC_TC_MT128=1, see
# kernels/bench/attn-variants.sh) is built too, so that the GPU machine can
# time both without building.
gpu-kit: all
	@$(MAKE) --no-print-directory B=$(B)/mt1 CUDA=1 EXTRA_NVFLAGS=-DKC_TC_MT128=1 \
		$(B)/mt1/tests/test-kk-cuda $(B)/mt1/tests/cuda-bench $(B)/mt1/lib/kiln/kk-cuda.so
	@tests/gpu/make-kit.sh $(B) $(GPU_KIT)
.PHONY: gpu-kit
