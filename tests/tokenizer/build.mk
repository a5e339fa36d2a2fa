# tests/tokenizer: libktok suite (golden cases from HF tokenizers and
# sentencepiece, streaming decode, injection, malformed files, chat
# templates), the live comparison against the pinned PyPI packages, the
# CLI checks, the loader fuzzer and the benchmark.
$(eval $(call kiln_test,test-tokenizer,tests/tokenizer/test-tokenizer.c,ktok kmf kk common,$(KTOK_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,tok-tool,tests/tokenizer/tok-tool.c,ktok kmf kk common,$(KTOK_LDLIBS) $(KK_LDLIBS)))
TEST_SCRIPTS += tests/tokenizer/test-tokenizer-live.sh
BENCH_SCRIPTS += tests/tokenizer/bench-tok.sh

# libFuzzer target for the loaders + encoder (clang only, every object
# instrumented, like fuzz-modelfile); part of `all` when clang exists, its
# suite runs in make test-full and SKIPs otherwise.
KILN_CLANG ?= $(shell command -v clang-14 || command -v clang)
FUZZ_KTOK := $(B)/tests/fuzz-tokenizer
FUZZ_KTOK_SRCS := tests/tokenizer/fuzz-tokenizer.c $(KTOK_SRCS) $(KMF_SRCS) kernels/kk_dtype.c \
	common/strbuf.c
ifneq ($(KILN_CLANG),)
EXTRA_ALL += $(FUZZ_KTOK)
endif
TEST_FULL_SCRIPTS += tests/tokenizer/fuzz-tokenizer.sh
fuzz-tokenizer: $(FUZZ_KTOK)
$(FUZZ_KTOK): $(FUZZ_KTOK_SRCS) kernels/include/ktok.h kernels/include/kmf.h \
		kernels/tokenizer/ktok_internal.h $(wildcard common/include/kiln/*.h)
	@mkdir -p $(@D)
	@if [ -z "$(KILN_CLANG)" ]; then echo "fuzz-tokenizer: clang not found, skipping" >&2; exit 1; fi
	$(KILN_CLANG) -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Icommon/include -Ikernels/include \
		$(FUZZ_KTOK_SRCS) $(KMF_LDLIBS) -lm -o $@
.PHONY: fuzz-tokenizer
TEST_SCRIPTS += tests/tokenizer/test-kiln-tokenize.sh
