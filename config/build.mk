# config/: libkiln-config (parse + validate + render the cluster file) and the
# `kiln` admin CLI.
CONFIG_SRCS := config/lib/schema.c config/lib/errors.c config/lib/values.c config/lib/load.c \
	config/lib/names.c config/lib/check-network.c config/lib/check-nodes.c config/lib/check-partitions.c \
	config/lib/check-services.c config/lib/derive.c config/lib/lookup.c config/lib/render.c config/lib/program.c \
	config/lib/diff.c config/lib/check-topology.c config/lib/check-accounting.c config/lib/sign.c \
	config/lib/check-users.c
$(eval $(call kiln_lib,config,$(CONFIG_SRCS)))
$(eval $(call kiln_bin,kiln,config/cli/kiln.c config/cli/kiln-model.c config/cli/kiln-tokenize.c config/cli/status.c config/cli/reboot.c config/cli/apply.c config/cli/serve.c config/cli/serve-request.c config/cli/sign.c,config kiln-slurm ktok kmodel kmf kk common,-lconfig -ljansson -lslurm -lmicrohttpd -lsystemd -lsodium -lpthread))
