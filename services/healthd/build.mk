# services/healthd: kiln-healthd, the GPU health daemon.
HEALTHD_SRCS := services/healthd/check.c services/healthd/nvml.c services/healthd/output.c \
	services/healthd/slurm.c services/healthd/active.c \
	services/healthd/xidstate.c
HEALTHD_LDLIBS := -lconfig -lmicrohttpd -ljansson -lsystemd -lslurm -ldl
$(eval $(call kiln_lib,healthd,$(HEALTHD_SRCS)))
$(eval $(call kiln_bin,kiln-healthd,services/healthd/main.c,healthd kiln-slurm config common,$$(HEALTHD_LDLIBS)))
# The active checks run on the kernel library's CUDA backend in a program of
# their own (a faulting GPU must not take the daemon down).
$(eval $(call kiln_bin,kiln-healthd-active,services/healthd/active-main.c,kk common,$$(KK_LDLIBS)))
