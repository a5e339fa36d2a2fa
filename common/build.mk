# common/: the small C base every kiln module links (libcommon.a).
# http.c needs -lmicrohttpd -ljansson, json.c -ljansson, metrics.c only
# libm/pthread: programs that use them add KILN_HTTP_LDLIBS (a static
# library pulls in only the objects a program references).
COMMON_SRCS := common/log.c common/parse.c common/strbuf.c common/hostlist.c common/prog.c \
	common/http.c common/json.c common/metrics.c
KILN_HTTP_LDLIBS := -lmicrohttpd -ljansson
$(eval $(call kiln_lib,common,$(COMMON_SRCS)))

# libFuzzer target for the JSON glue (tests/fuzz/fuzz-json.c), built like
# fuzz-config (config/build.mk): clang only, every object instrumented; part
# of `all` when clang exists, its suite (make test-full) SKIPs otherwise.
KILN_CLANG ?= $(shell command -v clang-14 || command -v clang)
FUZZ_JSON := $(B)/tests/fuzz-json
FUZZ_JSON_SRCS := tests/fuzz/fuzz-json.c common/json.c
ifneq ($(KILN_CLANG),)
EXTRA_ALL += $(FUZZ_JSON)
endif
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-json.sh
fuzz-json: $(FUZZ_JSON)
$(FUZZ_JSON): $(FUZZ_JSON_SRCS) common/include/kiln/json.h common/include/kiln/macro.h
	@mkdir -p $(@D)
	@if [ -z "$(KILN_CLANG)" ]; then echo "fuzz-json: clang not found, skipping" >&2; exit 1; fi
	$(KILN_CLANG) -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Icommon/include $(FUZZ_JSON_SRCS) -ljansson -o $@
.PHONY: fuzz-json
