# tests/inferd: the inference engine suite (cpu backend, stories260K) and
# its benchmark.
$(eval $(call kiln_test,test-engine,tests/inferd/test-engine.c tests/model/ref.c,inferd-engine kmodel kk common,$(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-engine,tests/inferd/bench-engine.c,inferd-engine kmodel kk common,$(KK_LDLIBS)))
BENCH_SCRIPTS += tests/inferd/bench-engine.sh
TEST_SCRIPTS += tests/inferd/test-inferd.sh tests/inferd/test-inferd-signals.sh
# The request layer and the pure parts of the streaming layer, without an
# engine or a socket (test-openai.c).
$(eval $(call kiln_test,test-openai,tests/inferd/test-openai.c $(INFERD_SRCS),inferd-engine kmodel ktok kmf kk common,$$(INFERD_LDLIBS)))

# libFuzzer target for the request layer (tests/inferd/fuzz-openai.c),
# built like fuzz-json (common/build.mk): clang only, every object
# instrumented; part of `all` when clang exists, its suite (make test-full)
# SKIPs otherwise.
KILN_CLANG ?= $(shell command -v clang-14 || command -v clang)
FUZZ_OPENAI := $(B)/tests/fuzz-openai
FUZZ_OPENAI_SRCS := tests/inferd/fuzz-openai.c services/inferd/openai.c common/json.c \
	common/strbuf.c $(KTOK_SRCS) $(KMF_SRCS) kernels/kk_dtype.c
ifneq ($(KILN_CLANG),)
EXTRA_ALL += $(FUZZ_OPENAI)
endif
TEST_FULL_SCRIPTS += tests/inferd/fuzz-openai.sh
fuzz-openai: $(FUZZ_OPENAI)
$(FUZZ_OPENAI): $(FUZZ_OPENAI_SRCS) services/inferd/inferd.h kernels/include/ktok.h \
		$(wildcard common/include/kiln/*.h)
	@mkdir -p $(@D)
	@if [ -z "$(KILN_CLANG)" ]; then echo "fuzz-openai: clang not found, skipping" >&2; exit 1; fi
	$(KILN_CLANG) -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Icommon/include -Ikernels/include -Iservices/include \
		$(FUZZ_OPENAI_SRCS) $(KMF_LDLIBS) -lm -o $@
.PHONY: fuzz-openai
