# tests/modelfile: libkmf suite (readers against gen.py's files, conversions
# against f64 references and kk_quantize, writer round trip and SIGKILL
# crash test, hostile files), its fuzzer and its benchmark.
$(eval $(call kiln_test,test-modelfile,tests/modelfile/test-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))

$(eval $(call kiln_tool,bench-modelfile,tests/modelfile/bench-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/modelfile/bench-modelfile.sh
TEST_SCRIPTS += tests/modelfile/test-kiln-model.sh
