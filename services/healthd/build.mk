# services/healthd: kiln-healthd, the GPU health daemon.
HEALTHD_SRCS := services/healthd/check.c services/healthd/nvml.c services/healthd/output.c \
	services/healthd/slurm.c services/healthd/active.c \
	services/healthd/xidstate.c services/healthd/jobs.c services/healthd/mounts.c
HEALTHD_LDLIBS := -lconfig -lmicrohttpd -ljansson -lsystemd -lslurm -ldl
$(eval $(call kiln_lib,healthd,$(HEALTHD_SRCS)))
# The program: main.c is the daemon's skeleton; daemon-xid.c and
# daemon-active.c its XID and active-check sides (manager.h).
KILN_HEALTHD_SRCS := services/healthd/main.c services/healthd/daemon-xid.c \
	services/healthd/daemon-active.c
$(eval $(call kiln_bin,kiln-healthd,$(KILN_HEALTHD_SRCS),healthd kiln-slurm config common,$$(HEALTHD_LDLIBS)))
# The active checks run on the kernel library's CUDA backend in a program of
# their own (a faulting GPU must not take the daemon down).
$(eval $(call kiln_bin,kiln-healthd-active,services/healthd/active-main.c,kk common,$$(KK_LDLIBS)))
