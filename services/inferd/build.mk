# kiln-inferd: an OpenAI-compatible completions and chat completions server
# on the engine, libktok (text <-> ids, chat templates), kiln/http.h and
# sd-event (libsystemd): the program (main.c, options.c, keys.c,
# routes.c, models.c; program.h) on openai.c (the request layer),
# stream.c (streaming and stop strings) and sse.c (Server-Sent Events on
# kiln/http.h's byte streams).
INFERD_SRCS := services/inferd/openai.c services/inferd/stream.c services/inferd/sse.c \
	services/inferd/dtype.c
INFERD_LDLIBS := $(KMF_LDLIBS) $(KK_LDLIBS) $(KTOK_LDLIBS) $(KILN_HTTP_LDLIBS)
INFERD_PROG_SRCS := services/inferd/main.c services/inferd/options.c services/inferd/keys.c \
	services/inferd/routes.c services/inferd/models.c
$(eval $(call kiln_bin,kiln-inferd,$(INFERD_PROG_SRCS) $(INFERD_SRCS),inferd-engine kmodel ktok kmf kk config common,$$(INFERD_LDLIBS) -lconfig -lsystemd))
