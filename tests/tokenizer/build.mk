# tests/tokenizer: libktok suite (golden cases from HF tokenizers and
# sentencepiece, streaming decode, injection, malformed files, chat
# templates), the live comparison against the pinned PyPI packages, the
# CLI checks, the loader fuzzer and the benchmark.
$(eval $(call kiln_test,test-tokenizer,tests/tokenizer/test-tokenizer.c,ktok kmf kk common,$(KTOK_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,tok-tool,tests/tokenizer/tok-tool.c,ktok kmf kk common,$(KTOK_LDLIBS) $(KK_LDLIBS)))
TEST_SCRIPTS += tests/tokenizer/test-tokenizer-live.sh
BENCH_SCRIPTS += tests/tokenizer/bench-tok.sh

TEST_SCRIPTS += tests/tokenizer/test-kiln-tokenize.sh
