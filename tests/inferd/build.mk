# tests/inferd: the inference engine suite (cpu backend, the tiny260K fixture) and
# its benchmark.
$(eval $(call kiln_test,test-engine,tests/inferd/test-engine.c tests/model/ref.c,inferd-engine kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
$(eval $(call kiln_tool,bench-engine,tests/inferd/bench-engine.c,inferd-engine kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/inferd/bench-engine.sh
# The sampler alone at 32k and 128k vocabularies against the sampler before.
$(eval $(call kiln_tool,bench-sample,tests/inferd/bench-sample.c,inferd-engine kmodel kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
BENCH_SCRIPTS += tests/inferd/bench-sample.sh
TEST_SCRIPTS += tests/inferd/test-inferd.sh tests/inferd/test-inferd-signals.sh \
	tests/inferd/test-inferd-service.sh tests/inferd/test-inferd-models.sh \
	tests/inferd/test-inferd-keys.sh tests/inferd/test-openai-client.sh tests/inferd/test-inferd-hostile.sh
# The request layer and the pure parts of the streaming layer, without an
# engine or a socket (test-openai.c).
$(eval $(call kiln_test,test-openai,tests/inferd/test-openai.c $(INFERD_SRCS),inferd-engine kmodel ktok kmf kk common,$$(INFERD_LDLIBS)))
# --dtype auto (dtype.c): each model file type's stored dtype and the
# dtype served for it on backends that compute on it or not.
$(eval $(call kiln_test,test-inferd-dtype,tests/inferd/test-inferd-dtype.c services/inferd/dtype.c,kmf kk common,$(KMF_LDLIBS) $(KK_LDLIBS)))
# Server-Sent Events (sse.c) on kiln/http.h's streams, real sockets on
# 127.0.0.1 through tests/lib/http-client.c.
$(eval $(call kiln_test,test-sse,tests/inferd/test-sse.c tests/lib/http-client.c services/inferd/sse.c,common,$$(KILN_HTTP_LDLIBS)))
