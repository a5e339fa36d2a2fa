# kernels/: the kk kernel library (libkk.a): the cpu backend, always built,
# and the loader of the CUDA module (kk_module.c; kernels/cuda/build.mk
# builds the module).  libkk.a has no CUDA dependency: programs linking kk
# pass $(KK_LDLIBS) as their LDLIBS, which never names a CUDA library.
KK_SRCS := kernels/kk.c kernels/kk_dtype.c kernels/kk_module.c kernels/cpu/cpu.c kernels/cpu/simd.c \
	kernels/cpu/elementwise.c kernels/cpu/gemm.c kernels/cpu/quant.c kernels/cpu/attention.c \
	kernels/cpu/norm.c kernels/cpu/rope.c kernels/cpu/softmax.c kernels/cpu/embedding.c \
	kernels/cpu/optim.c kernels/cpu/sample.c kernels/cpu/comm.c
# f16/bf16 loops, one variant per ISA level (kernels/cpu/half.c).
KK_SRCS += kernels/cpu/half.c
KK_SRCS += kernels/cpu/qdot.c
KK_LDLIBS := -lopenblas
$(eval $(call kiln_lib,kk,$(KK_SRCS)))
# The inner loops: vector reductions (omp simd pragmas only, no runtime).
$(B)/obj/kernels/cpu/simd.o: EXTRA_CFLAGS += -O3 -fopenmp-simd
# The int8 dot tiles: their register tiles need complete unrolling (-O3).
$(B)/obj/kernels/cpu/qdot.o: EXTRA_CFLAGS += -O3
# Where the loader looks for an installed kk-cuda.so (after $KILN_KK_CUDA
# and ../lib/kiln next to the binary): the install rule's module dir.  A
# stamp holding it rebuilds kk_module.o when PREFIX changes.
KK_CUDA_MODULE_DIR := $(PREFIX)/lib/kiln
$(B)/obj/kernels/kk_module.o: EXTRA_CFLAGS += -DKK_CUDA_MODULE_DIR=\"$(KK_CUDA_MODULE_DIR)\"
$(B)/obj/kernels/kk_module.o: $(B)/obj/kernels/kk-module-dir.stamp
$(B)/obj/kernels/kk-module-dir.stamp: FORCE
	@mkdir -p $(@D)
	@echo '$(KK_CUDA_MODULE_DIR)' | cmp -s - $@ || echo '$(KK_CUDA_MODULE_DIR)' >$@
FORCE:
.PHONY: FORCE
# simd.c's loops never read errno: sqrtf (AdamW) vectorizes without it.
$(B)/obj/kernels/cpu/simd.o: EXTRA_CFLAGS += -fno-math-errno
