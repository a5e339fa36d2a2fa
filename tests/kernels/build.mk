# tests/kernels: the kk op suite, once per backend (the cuda binary skips
# with a reason where no GPU is usable), and the cpu benchmark tool.
$(eval $(call kiln_test,test-kernels-cpu,tests/kernels/test-kernels-cpu.c,kk,$(KK_LDLIBS)))
$(eval $(call kiln_test,test-kernels-cuda,tests/kernels/test-kernels-cuda.c,kk,$(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-kernels-cpu,tests/kernels/bench-kernels-cpu.c,kk,$(KK_LDLIBS)))
BENCH_SCRIPTS += tests/kernels/bench-kernels-cpu.sh
