# config/: libkiln-config (parse + validate + render the cluster file) and the
# `kiln` admin CLI.
CONFIG_SRCS := config/schema.c config/errors.c config/values.c config/load.c \
	config/names.c config/check-network.c config/check-nodes.c config/check-partitions.c \
	config/check-services.c config/derive.c config/lookup.c config/render.c config/program.c \
	config/diff.c config/check-topology.c config/check-accounting.c
$(eval $(call kiln_lib,config,$(CONFIG_SRCS)))
$(eval $(call kiln_bin,kiln,config/kiln.c config/kiln-model.c config/kiln-tokenize.c config/status.c config/reboot.c config/apply.c,config ktok kmodel kmf kk common,-lconfig -ljansson -lslurm -lpthread))

# libFuzzer target for parse + validate + render (tests/fuzz/fuzz-config.c),
# by mk/rules.mk's kiln_fuzz; its suite runs in make test-full.
FUZZ_CONFIG_SRCS := tests/fuzz/fuzz-config.c $(CONFIG_SRCS) common/parse.c common/strbuf.c common/hostlist.c common/log.c
$(eval $(call kiln_fuzz,fuzz-config,$(FUZZ_CONFIG_SRCS),$(KILN_FUZZ_STRICT) -Icommon/include -Iconfig/include,-lconfig,config/include/kiln/config.h config/config-internal.h $(wildcard common/include/kiln/*.h)))
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-config.sh
