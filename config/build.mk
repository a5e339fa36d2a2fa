# config/: libkiln-config (parse + validate + render the cluster file) and the
# `kiln` admin CLI.
CONFIG_SRCS := config/schema.c config/config.c config/render.c
$(eval $(call kiln_lib,config,$(CONFIG_SRCS)))
$(eval $(call kiln_bin,kiln,config/kiln.c,config common,-lconfig))
