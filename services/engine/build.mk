# services/engine: the inference engine (continuous-batching scheduler on
# libkmodel), the core of kiln-inferd: engine.c (the API and the step
# loop), sched.c (admission, chunked prefill, preemption), prefix.c (the
# prefix cache), logits.c (the host path) and metrics.c.  Link it as
# `inferd-engine kmodel kk common` with $(KK_LDLIBS).
ENGINE_SRCS := services/engine/engine.c services/engine/sched.c services/engine/prefix.c \
	services/engine/logits.c services/engine/metrics.c
$(eval $(call kiln_lib,inferd-engine,$(ENGINE_SRCS)))
