# config/: libkiln-config (parse + validate + render the cluster file) and the
# `kiln` admin CLI.
CONFIG_SRCS := config/schema.c config/errors.c config/values.c config/load.c \
	config/names.c config/check-network.c config/check-nodes.c config/check-partitions.c \
	config/check-services.c config/derive.c config/lookup.c config/render.c config/program.c
$(eval $(call kiln_lib,config,$(CONFIG_SRCS)))
$(eval $(call kiln_bin,kiln,config/kiln.c config/kiln-model.c config/kiln-tokenize.c,config ktok kmodel kmf kk common,-lconfig -ljansson))

# libFuzzer target for parse + validate + render (tests/fuzz/fuzz-config.c):
# clang only, built from source with its own rule (sanitizers and coverage
# need every object instrumented); part of `all` when clang exists, and its
# suite (make test-full) SKIPs otherwise.
KILN_CLANG ?= $(shell command -v clang-14 || command -v clang)
FUZZ_CONFIG := $(B)/tests/fuzz-config
FUZZ_CONFIG_SRCS := tests/fuzz/fuzz-config.c $(CONFIG_SRCS) common/parse.c common/strbuf.c common/hostlist.c common/log.c
ifneq ($(KILN_CLANG),)
EXTRA_ALL += $(FUZZ_CONFIG)
endif
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-config.sh
fuzz-config: $(FUZZ_CONFIG)
$(FUZZ_CONFIG): $(FUZZ_CONFIG_SRCS) config/include/kiln/config.h config/config-internal.h \
		$(wildcard common/include/kiln/*.h)
	@mkdir -p $(@D)
	@if [ -z "$(KILN_CLANG)" ]; then echo "fuzz-config: clang not found, skipping" >&2; exit 1; fi
	$(KILN_CLANG) -g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Icommon/include -Iconfig/include \
		$(FUZZ_CONFIG_SRCS) -lconfig -o $@
.PHONY: fuzz-config
