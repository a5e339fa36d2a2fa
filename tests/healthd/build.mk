# tests/healthd: unit tests of kiln-healthd (cmocka) and its integration
# suites against the fake NVML and the real Slurm test cluster.
$(eval $(call kiln_test,test-healthd,tests/healthd/test-healthd.c,healthd kiln-slurm config common,$$(HEALTHD_LDLIBS)))
# the NVML tests load the fake libraries
$(B)/tests/test-healthd: | $(B)/lib/fake-nvml/libnvidia-ml.so.1 $(B)/lib/fake-nvml-old/libnvidia-ml.so.1
TEST_SCRIPTS += tests/healthd/test-healthd-slurm.sh
TEST_SCRIPTS += tests/healthd/test-healthd-cli.sh
$(eval $(call kiln_tool,bench-healthd,tests/healthd/bench-healthd.c,healthd kiln-slurm config common,$$(HEALTHD_LDLIBS)))
BENCH_SCRIPTS += tests/healthd/bench-healthd.sh
