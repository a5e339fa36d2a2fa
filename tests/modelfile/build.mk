# tests/modelfile: libkmf suite (readers against gen.py's files, conversions
# against f64 references and kk_quantize, writer round trip and SIGKILL
# crash test, hostile files), its fuzzer and its benchmark.
$(eval $(call kiln_test,test-modelfile,tests/modelfile/test-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))

# libFuzzer target for the readers (mk/rules.mk's kiln_fuzz); its suite
# runs in make test-full.
FUZZ_KMF_SRCS := tests/fuzz/fuzz-modelfile.c $(KMF_SRCS) kernels/kk/kk_dtype.c common/error.c common/strbuf.c
$(eval $(call kiln_fuzz,fuzz-modelfile,$(FUZZ_KMF_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Ikernels/kk/include -Ikernels/modelfile/include,$(KMF_LDLIBS) -lm,kernels/modelfile/include/kmf.h kernels/modelfile/kmf_internal.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-modelfile.sh

$(eval $(call kiln_tool,bench-modelfile,tests/modelfile/bench-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/modelfile/bench-modelfile.sh
TEST_SCRIPTS += tests/modelfile/test-kiln-model.sh
