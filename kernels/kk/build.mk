# kernels/: the kk kernel library (libkk.a): the cpu backend, always built,
# and the loader of the CUDA module (kk_module.c; kernels/kk/cuda/build.mk
# builds the module).  libkk.a has no CUDA dependency: programs linking kk
# pass $(KK_LDLIBS) as their LDLIBS, which never names a CUDA library.
KK_SRCS := kernels/kk/kk.c kernels/kk/kk_dtype.c kernels/kk/kk_module.c kernels/kk/cpu/cpu.c kernels/kk/cpu/simd.c \
	kernels/kk/cpu/elementwise.c kernels/kk/cpu/gemm.c kernels/kk/cpu/quant.c kernels/kk/cpu/attention.c \
	kernels/kk/cpu/norm.c kernels/kk/cpu/rope.c kernels/kk/cpu/softmax.c kernels/kk/cpu/embedding.c \
	kernels/kk/cpu/optim.c kernels/kk/cpu/sample.c kernels/kk/cpu/comm.c
# f16/bf16 loops, one variant per ISA level (kernels/kk/cpu/half.c).
KK_SRCS += kernels/kk/cpu/half.c
KK_SRCS += kernels/kk/cpu/qdot.c
KK_LDLIBS := -lopenblas
$(eval $(call kiln_lib,kk,$(KK_SRCS)))
# The inner loops: vector reductions (omp simd pragmas only, no runtime).
$(B)/obj/kernels/kk/cpu/simd.o: EXTRA_CFLAGS += -O3 -fopenmp-simd
# The int8 dot tiles: their register tiles need complete unrolling (-O3).
$(B)/obj/kernels/kk/cpu/qdot.o: EXTRA_CFLAGS += -O3
# Where the loader looks for an installed kk-cuda.so (after $KILN_KK_CUDA
# and ../lib/kiln next to the binary): the install rule's module dir.  A
# stamp holding it rebuilds kk_module.o when PREFIX changes.
KK_CUDA_MODULE_DIR := $(PREFIX)/lib/kiln
$(B)/obj/kernels/kk/kk_module.o: EXTRA_CFLAGS += -DKK_CUDA_MODULE_DIR=\"$(KK_CUDA_MODULE_DIR)\"
$(B)/obj/kernels/kk/kk_module.o: $(B)/obj/kernels/kk-module-dir.stamp
$(B)/obj/kernels/kk-module-dir.stamp: FORCE
	@mkdir -p $(@D)
	@echo '$(KK_CUDA_MODULE_DIR)' | cmp -s - $@ || echo '$(KK_CUDA_MODULE_DIR)' >$@
FORCE:
.PHONY: FORCE
# simd.c's loops never read errno: sqrtf (AdamW) vectorizes without it.
$(B)/obj/kernels/kk/cpu/simd.o: EXTRA_CFLAGS += -fno-math-errno
