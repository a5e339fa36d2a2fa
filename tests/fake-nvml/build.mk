# tests/fake-nvml: a fake libnvidia-ml.so.1 driven by a libconfig scenario
# (KILN_FAKE_NVML_SCENARIO), and an "old driver" variant without the newest
# symbols.  Used by the kiln-healthd tests and `make demo`.
FAKE_NVML_LDLIBS := -lconfig -lpthread -Wl,-soname,libnvidia-ml.so.1
$(eval $(call kiln_shlib,lib/fake-nvml/libnvidia-ml.so.1,tests/fake-nvml/fake-nvml.c,,$$(FAKE_NVML_LDLIBS)))
$(eval $(call kiln_shlib,lib/fake-nvml-old/libnvidia-ml.so.1,tests/fake-nvml/fake-nvml-old.c,,$$(FAKE_NVML_LDLIBS)))
