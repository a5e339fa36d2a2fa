# common/: the small C base every kiln module links (libcommon.a).
COMMON_SRCS := common/log.c common/parse.c common/strbuf.c common/hostlist.c
$(eval $(call kiln_lib,common,$(COMMON_SRCS)))
