# tests/inferd: the inference engine suite (cpu backend, stories260K) and
# its benchmark.
$(eval $(call kiln_test,test-engine,tests/inferd/test-engine.c tests/model/ref.c,inferd-engine kmodel kk common,$(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-engine,tests/inferd/bench-engine.c,inferd-engine kmodel kk common,$(KK_LDLIBS)))
BENCH_SCRIPTS += tests/inferd/bench-engine.sh
TEST_SCRIPTS += tests/inferd/test-inferd.sh
# The request layer and the pure parts of the streaming layer, without an
# engine or a socket (test-openai.c).
$(eval $(call kiln_test,test-openai,tests/inferd/test-openai.c $(INFERD_SRCS),inferd-engine kmodel ktok kmf kk common,$$(INFERD_LDLIBS)))
