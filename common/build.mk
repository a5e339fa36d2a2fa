# common/: the small C base every kiln module links (libcommon.a).
# http.c needs -lmicrohttpd -ljansson, json.c -ljansson, metrics.c only
# libm/pthread: programs that use them add KILN_HTTP_LDLIBS (a static
# library pulls in only the objects a program references).
COMMON_SRCS := common/log.c common/parse.c common/strbuf.c common/hostlist.c common/prog.c common/error.c \
	common/http.c common/json.c common/metrics.c common/net.c
KILN_HTTP_LDLIBS := -lmicrohttpd -ljansson
$(eval $(call kiln_lib,common,$(COMMON_SRCS)))

# libFuzzer target for the JSON glue (tests/fuzz/fuzz-json.c), by
# mk/rules.mk's kiln_fuzz; its suite runs in make test-full.
$(eval $(call kiln_fuzz,fuzz-json,tests/fuzz/fuzz-json.c common/json.c common/error.c common/parse.c,$(KILN_FUZZ_STRICT) -Icommon/include,-ljansson,common/include/kiln/json.h common/include/kiln/error.h common/include/kiln/macro.h common/include/kiln/parse.h))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-json.sh
