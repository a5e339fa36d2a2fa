# services/inferd: the inference engine (continuous-batching scheduler on
# libkmodel), the core of kiln-inferd.  Link it as `inferd-engine kmodel kk
# common` with $(KK_LDLIBS).
$(eval $(call kiln_lib,inferd-engine,services/inferd/engine.c))
# kiln-inferd: a minimal OpenAI-compatible completion server (token ids in
# and out until a tokenizer lands) on the engine and kiln/http.h.
$(eval $(call kiln_bin,kiln-inferd,services/inferd/main.c,inferd-engine kmodel kk common,$$(KK_LDLIBS) $$(KILN_HTTP_LDLIBS)))
