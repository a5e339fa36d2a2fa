# services/inferd: the inference engine (continuous-batching scheduler on
# libkmodel), the core of kiln-inferd.  Link it as `inferd-engine kmodel kk
# common` with $(KK_LDLIBS).
$(eval $(call kiln_lib,inferd-engine,services/inferd/engine.c))
# kiln-inferd: an OpenAI-compatible completions and chat completions server
# on the engine, libktok (text <-> ids, chat templates) and kiln/http.h.
$(eval $(call kiln_bin,kiln-inferd,services/inferd/main.c,inferd-engine kmodel ktok kmf kk common,$$(KMF_LDLIBS) $$(KK_LDLIBS) $$(KTOK_LDLIBS) $$(KILN_HTTP_LDLIBS)))
