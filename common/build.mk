# common/: the small C base every kiln module links (libcommon.a).
# http.c needs -lmicrohttpd -ljansson -lsystemd (sd_listen_fds), json.c -ljansson, metrics.c only
# libm/pthread: programs that use them add KILN_HTTP_LDLIBS (a static
# library pulls in only the objects a program references).
COMMON_SRCS := common/log.c common/parse.c common/strbuf.c common/hostlist.c common/prog.c common/error.c \
	common/http.c common/json.c common/metrics.c common/net.c common/pathtrust.c
KILN_HTTP_LDLIBS := -lmicrohttpd -ljansson -lsystemd
$(eval $(call kiln_lib,common,$(COMMON_SRCS)))
