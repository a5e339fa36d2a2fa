# tests/inferd: the inference engine suite (cpu backend, stories260K) and
# its benchmark.
$(eval $(call kiln_test,test-engine,tests/inferd/test-engine.c tests/model/ref.c,inferd-engine kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-engine,tests/inferd/bench-engine.c,inferd-engine kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/inferd/bench-engine.sh
TEST_SCRIPTS += tests/inferd/test-inferd.sh
