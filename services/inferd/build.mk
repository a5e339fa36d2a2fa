# services/inferd: the inference engine (continuous-batching scheduler on
# libkmodel), the core of kiln-inferd.  Link it as `inferd-engine kmodel kk
# common` with $(KK_LDLIBS).
$(eval $(call kiln_lib,inferd-engine,services/inferd/engine.c))
