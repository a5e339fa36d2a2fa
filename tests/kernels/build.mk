# tests/kernels: the kk op suite, once per backend (the cuda binary skips
# with a reason where no GPU is usable), and the cpu benchmark tool.
# ref/: the float64 references per op family (libkkref.a), shared by the
# suite, the cuda parity tests (tests/gpu/) and their emulator runs.
KKREF_SRCS := $(wildcard tests/kernels/ref/*.c)
$(eval $(call kiln_lib,kkref,$(KKREF_SRCS)))
$(eval $(call kiln_test,test-kernels-cpu,tests/kernels/test-kernels-cpu.c,kkref kk,$(KK_LDLIBS)))
# The cpu sampler draw for draw against the one that sorts whole rows, and
# its draws against kk.h's distribution (chi-square, fixed seeds).
$(eval $(call kiln_test,test-kk-sample,tests/kernels/test-kk-sample.c,kk,$(KK_LDLIBS)))
$(eval $(call kiln_test,test-kernels-cuda,tests/gpu/test-kernels-cuda.c,kkref kk,$(KK_LDLIBS)))
# The paged decode's split plan (kernels/kk/cuda/kc_plan.h, host C only).
$(eval $(call kiln_test,test-decode-plan,tests/kernels/test-decode-plan.c,,))
$(B)/obj/tests/kernels/test-decode-plan.o: EXTRA_CFLAGS += -Ikernels/kk/cuda
$(eval $(call kiln_tool,bench-kernels-cpu,tests/kernels/bench-kernels-cpu.c,kk,$(KK_LDLIBS)))
BENCH_SCRIPTS += tests/kernels/bench-kernels-cpu.sh
# The ptxas gate: registers, spills and static shared memory of every CUDA
# kernel for sm_90 against kernels/kk/cuda/ptxas-budget.tsv (skips without nvcc).
TEST_SCRIPTS += tests/kernels/test-ptxas-gate.sh
# clang's CUDA frontend over every kernels/kk/cuda/*.cu, -Wall -Wextra -Werror
# (skips with the reason when no clang can target sm_90 with this toolkit).
TEST_SCRIPTS += tests/kernels/test-clang-cuda.sh
# The CUDA module's loader (kernels/kk/kk_module.c): kk-open opens a backend
# and prints why; test-kk-module.sh runs it and the programs with the module
# and the CUDA libraries hidden, against fake modules (fake-kk-cuda.c: a
# wrong ABI, an old driver, no device, a working one) and checks every
# program's and the module's DT_NEEDED.
$(eval $(call kiln_tool,kk-open,tests/kernels/module/kk-open.c,kk,$(KK_LDLIBS)))
$(eval $(call kiln_shlib,tests/fake-kk-cuda/kk-cuda.so,tests/kernels/module/fake-kk-cuda.c,,))
# The same source as another kiln version's module and as one with another
# op table (one object per variant, built here).
$(B)/tests/fake-kk-cuda/oldver.so $(B)/tests/fake-kk-cuda/badabi.so: tests/kernels/module/fake-kk-cuda.c
	@mkdir -p $(@D)
	$(CC) $(KILN_CFLAGS) -shared -o $@ $< \
		$(if $(findstring oldver,$@),-DFAKE_VERSION=\"0.0.1\",-DFAKE_SLOTS)
ALL_LIBS += $(B)/tests/fake-kk-cuda/oldver.so $(B)/tests/fake-kk-cuda/badabi.so
TEST_SCRIPTS += tests/kernels/test-kk-module.sh
