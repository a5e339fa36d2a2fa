# kernels/: the kk kernel library (libkk.a).  The cpu backend is always
# built; kernels/cuda/build.mk adds the cuda objects to libkk.a and appends
# its libraries to KK_LDLIBS when CUDA=1 (see kernels/kk_internal.h).
# Programs linking kk pass $(KK_LDLIBS) as their LDLIBS.
KK_SRCS := kernels/kk.c kernels/kk_dtype.c kernels/cpu/cpu.c kernels/cpu/simd.c \
	kernels/cpu/elementwise.c kernels/cpu/gemm.c kernels/cpu/quant.c kernels/cpu/attention.c \
	kernels/cpu/norm.c kernels/cpu/rope.c kernels/cpu/softmax.c kernels/cpu/embedding.c \
	kernels/cpu/optim.c kernels/cpu/sample.c kernels/cpu/comm.c
KK_LDLIBS := -lopenblas
$(eval $(call kiln_lib,kk,$(KK_SRCS)))
# The inner loops: vector reductions (omp simd pragmas only, no runtime).
$(B)/obj/kernels/cpu/simd.o: EXTRA_CFLAGS += -O3 -fopenmp-simd
