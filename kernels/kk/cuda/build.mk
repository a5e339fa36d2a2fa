# kernels/kk/cuda/: the "cuda" backend of libkk (cuBLASLt GEMM, custom kernels,
# NCCL), its GPU test (tests/gpu/) and benchmark (kernels/bench/).
# With CUDA=1 the .cu objects become the CUDA module $(B)/lib/kiln/kk-cuda.so,
# the only thing that links libcudart, libcublasLt and libnccl: libkk.a and
# the programs do not, and kernels/kk/kk_module.c dlopen()s the module for
# "cuda" and "auto" (it exports one symbol, kk-cuda.map).  With CUDA=0
# nothing here is built and the test/bench scripts report "no CUDA device".
KK_CUDA_SRCS := kernels/kk/cuda/backend.cu kernels/kk/cuda/core.cu kernels/kk/cuda/elementwise.cu \
	kernels/kk/cuda/gemm.cu kernels/kk/cuda/quant.cu kernels/kk/cuda/attention.cu kernels/kk/cuda/norm.cu \
	kernels/kk/cuda/attention-bwd.cu \
	kernels/kk/cuda/rope.cu kernels/kk/cuda/softmax.cu kernels/kk/cuda/embedding.cu \
	kernels/kk/cuda/optim.cu kernels/kk/cuda/sample.cu kernels/kk/cuda/nccl.cu
KK_CUDA_MODULE := $(B)/lib/kiln/kk-cuda.so
# What the module may need (DT_NEEDED), checked by tests/kernels/test-kk-module.sh.
# nvcc's stubs for template kernels use C++ static guards: -lstdc++.
KK_CUDA_LDLIBS := $(CUDA_LDLIBS) -lcublasLt -lnccl -lstdc++ -lm -lpthread

ifeq ($(CUDA),1)
$(KK_CUDA_MODULE): $(call kiln_objs,$(KK_CUDA_SRCS)) kernels/kk/cuda/kk-cuda.map
	@mkdir -p $(@D)
	$(CC) $(KILN_LDFLAGS) -shared -o $@ $(call kiln_objs,$(KK_CUDA_SRCS)) \
		-Wl,--version-script=kernels/kk/cuda/kk-cuda.map -Wl,-z,defs -Wl,--as-needed \
		$(KK_CUDA_LDLIBS)
ALL_LIBS += $(KK_CUDA_MODULE)
-include $(patsubst %.o,%.d,$(call kiln_objs,$(KK_CUDA_SRCS)))
endif

# The GPU parity test (every op, cuda vs cpu and f64) and the benchmark.
# Both are built with CUDA=0 too: they then report "no CUDA device".
$(eval $(call kiln_tool,test-kk-cuda,tests/gpu/test-kk-cuda.c,kkref kk common,$$(KK_LDLIBS)))
TEST_GPU_SCRIPTS += tests/gpu/test-kk-cuda.sh
TEST_SCRIPTS += tests/gpu/test-kk-cuda.sh
$(eval $(call kiln_tool,cuda-bench,kernels/bench/cuda-bench.c,kk common,$$(KK_LDLIBS)))
BENCH_SCRIPTS += kernels/bench/bench-cuda.sh
# The same parity test on a CPU emulation of CUDA (kernels/kk/cuda/*.cu compiled
# as host C++): verifies the kernels without a GPU; minutes, so test-full.
TEST_FULL_SCRIPTS += tests/gpu/emu/test-emu.sh tests/gpu/emu/test-emu-suite.sh
# The emulation under AddressSanitizer+UBSan and ThreadSanitizer (a subset
# of families each), and the planted bugs it must catch (a missing barrier,
# a partial shuffle mask, unwritten shared memory, a misaligned vector load,
# a wrong cp.async wait count, a wrong fragment index in the backward).
TEST_FULL_SCRIPTS += tests/gpu/emu/test-emu-asan.sh tests/gpu/emu/test-emu-tsan.sh \
	tests/gpu/emu/test-emu-plant.sh
# The tensor-core attention forward and backward under both sanitizers
# (two small GQA 8/1 cases; scripts of their own for the suite timeout).
TEST_FULL_SCRIPTS += tests/gpu/emu/test-emu-asan-attn.sh tests/gpu/emu/test-emu-tsan-attn.sh
