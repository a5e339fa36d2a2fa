# slurm/adapter/: libkiln-slurm, the one Slurm adapter (kiln/slurm.h).  The
# kiln CLI (status, reboot), kiln-healthd and kiln-run link it with -lslurm.
KILN_SLURM_SRCS := slurm/adapter/slurm.c
$(eval $(call kiln_lib,kiln-slurm,$(KILN_SLURM_SRCS)))

# Its unit tests: states, hostlists, the configuration search and the step's
# environment (no slurmctld needed; tests/cluster drives the rest).
$(eval $(call kiln_test,test-slurm-adapter,tests/slurm/test-slurm-adapter.c,kiln-slurm common,-lslurm))
