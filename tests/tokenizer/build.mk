# tests/tokenizer: libktok suite (golden cases from HF tokenizers and
# sentencepiece, streaming decode, injection, malformed files, chat
# templates), the live comparison against the pinned PyPI packages, the
# CLI checks, the loader fuzzer and the benchmark.
$(eval $(call kiln_test,test-tokenizer,tests/tokenizer/test-tokenizer.c,ktok kmf kk common,$(KTOK_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,tok-tool,tests/tokenizer/tok-tool.c,ktok kmf kk common,$(KTOK_LDLIBS) $(KK_LDLIBS)))
TEST_SCRIPTS += tests/tokenizer/test-tokenizer-live.sh
BENCH_SCRIPTS += tests/tokenizer/bench-tok.sh

# libFuzzer target for the loaders + encoder (mk/rules.mk's kiln_fuzz); its
# suite runs in make test-full.
FUZZ_KTOK_SRCS := tests/fuzz/fuzz-tokenizer.c $(KTOK_SRCS) $(KMF_SRCS) kernels/kk/kk_dtype.c \
	common/strbuf.c common/error.c
$(eval $(call kiln_fuzz,fuzz-tokenizer,$(FUZZ_KTOK_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Ikernels/kk/include -Ikernels/modelfile/include -Ikernels/tokenizer/include,$(KMF_LDLIBS) -lm,kernels/tokenizer/include/ktok.h kernels/modelfile/include/kmf.h kernels/tokenizer/ktok_internal.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-tokenizer.sh
TEST_SCRIPTS += tests/tokenizer/test-kiln-tokenize.sh
