# tests/modelfile: libkmf suite (readers against gen.py's files, conversions
# against f64 references and kk_quantize, writer round trip and SIGKILL
# crash test, hostile files), its fuzzer and its benchmark.
$(eval $(call kiln_test,test-modelfile,tests/modelfile/test-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))

# libFuzzer target for the readers (clang only, every object instrumented,
# like fuzz-config); part of `all` when clang exists, its suite runs in
# make test-full and SKIPs otherwise.
KILN_CLANG ?= $(shell command -v clang-14 || command -v clang)
FUZZ_KMF := $(B)/tests/fuzz-modelfile
FUZZ_KMF_SRCS := tests/modelfile/fuzz-modelfile.c $(KMF_SRCS) kernels/kk_dtype.c
ifneq ($(KILN_CLANG),)
EXTRA_ALL += $(FUZZ_KMF)
endif
TEST_FULL_SCRIPTS += tests/modelfile/fuzz-modelfile.sh
fuzz-modelfile: $(FUZZ_KMF)
$(FUZZ_KMF): $(FUZZ_KMF_SRCS) kernels/include/kmf.h kernels/modelfile/kmf_internal.h \
		$(wildcard common/include/kiln/*.h)
	@mkdir -p $(@D)
	@if [ -z "$(KILN_CLANG)" ]; then echo "fuzz-modelfile: clang not found, skipping" >&2; exit 1; fi
	$(KILN_CLANG) -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Icommon/include -Ikernels/include \
		$(FUZZ_KMF_SRCS) $(KMF_LDLIBS) -lm -o $@
.PHONY: fuzz-modelfile

$(eval $(call kiln_tool,bench-modelfile,tests/modelfile/bench-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/modelfile/bench-modelfile.sh
TEST_SCRIPTS += tests/modelfile/test-kiln-model.sh
