# services/inferd: the inference engine (continuous-batching scheduler on
# libkmodel), the core of kiln-inferd.  Link it as `inferd-engine kmodel kk
# common` with $(KK_LDLIBS).
$(eval $(call kiln_lib,inferd-engine,services/engine/engine.c))
# kiln-inferd: an OpenAI-compatible completions and chat completions server
# on the engine, libktok (text <-> ids, chat templates), kiln/http.h and
# sd-event (libsystemd): main.c (the program) on openai.c (the request
# layer) and stream.c (streaming and stop strings).
INFERD_SRCS := services/inferd/openai.c services/inferd/stream.c
INFERD_LDLIBS := $(KMF_LDLIBS) $(KK_LDLIBS) $(KTOK_LDLIBS) $(KILN_HTTP_LDLIBS)
$(eval $(call kiln_bin,kiln-inferd,services/inferd/main.c $(INFERD_SRCS),inferd-engine kmodel ktok kmf kk config common,$$(INFERD_LDLIBS) -lconfig -lsystemd))
