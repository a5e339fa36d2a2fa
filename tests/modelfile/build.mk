# tests/modelfile: libkmf suite (readers against gen.py's files, conversions
# against f64 references and kk_quantize, writer round trip and SIGKILL
# crash test, hostile files), its fuzzer and its benchmark.
$(eval $(call kiln_test,test-modelfile,tests/modelfile/test-modelfile.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
