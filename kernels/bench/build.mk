# kernels/bench/build.mk: the shape/alignment sweep of the cuda backend's
# memory-bound ops (tests/gpu/test-kk-cuda-mem.c), next to the
# benchmark that times the same ops (kernels/kk/cuda/build.mk builds
# cuda-bench).  Like test-kk-cuda it is built with CUDA=0 too and then
# reports "no CUDA device"; on the CPU emulation it runs in test-full.
$(eval $(call kiln_tool,test-kk-cuda-mem,tests/gpu/test-kk-cuda-mem.c,kkref kk common,$$(KK_LDLIBS)))
TEST_GPU_SCRIPTS += tests/gpu/test-kk-cuda-mem.sh
TEST_SCRIPTS += tests/gpu/test-kk-cuda-mem.sh
TEST_FULL_SCRIPTS += tests/gpu/emu/test-emu-mem.sh
# bench-decode-cpu: prefill, single-stream and batched decode of a model
# shape (random weights) on the cpu backend per thread count, decode as a
# % of the copy-bandwidth roofline (kernels/bench/cpu-decode.c).
$(eval $(call kiln_tool,bench-decode-cpu,kernels/bench/cpu-decode.c,kmodel kmf kk common,$$(KMF_LDLIBS) $$(KK_LDLIBS)))
