# slurm/launcher/: kiln-run, the elastic launcher (library kilnrun + the
# kiln-run program), its tests, tools and benchmarks.  The rendezvous store
# (library kilnstore) is slurm/store/.

# tests/launcher reaches kiln-run's private headers (launcher.h, rdzv.h).
$(B)/obj/tests/launcher/%.o: EXTRA_CFLAGS += -Islurm/launcher

KILN_RUN_SRCS := slurm/launcher/rdzv.c slurm/launcher/agent.c slurm/launcher/workers.c \
	slurm/launcher/slurmenv.c slurm/launcher/munge.c
$(eval $(call kiln_lib,kilnrun,$(KILN_RUN_SRCS)))

# hwloc binds workers to CPUs/NUMA nodes when its headers are installed
# (libhwloc-dev); without them workers run unbound.  The agent loop is
# sd-event (libsystemd); libmunge hands out the job secret when
# KILN_RUN_SECRET is not set (munge.c).
KILN_RUN_HWLOC := $(if $(wildcard /usr/include/hwloc.h),1,)
ifeq ($(KILN_RUN_HWLOC),1)
$(B)/obj/slurm/launcher/workers.o: EXTRA_CFLAGS += -DKILN_HAVE_HWLOC=1
KILN_RUN_LDLIBS := -lslurm -lhwloc -lconfig -lsystemd -lmunge
else
KILN_RUN_LDLIBS := -lslurm -lconfig -lsystemd -lmunge
endif

$(eval $(call kiln_bin,kiln-run,slurm/launcher/kiln-run.c,kilnrun kilnstore kiln-slurm config common,$(KILN_RUN_LDLIBS)))

# Unit tests of the rendezvous state machine (no sockets).
$(eval $(call kiln_test,test-rdzv,tests/launcher/test-rdzv.c,kilnrun common,))
# Rendezvous benchmark: N simulated agents on loopback.
$(eval $(call kiln_tool,kiln-run-bench,tests/launcher/rdzv-bench.c,kilnrun kilnstore common,-lpthread))
# The C test worker: env -> store -> kk CPU all-reduce, checkpointed steps.
$(eval $(call kiln_tool,kiln-run-worker,tests/launcher/kr-worker.c,kk kilnstore common,$$(KK_LDLIBS)))

# TAP suites: standalone mode (no Slurm), elasticity on loopback agents.
TEST_SCRIPTS += tests/launcher/test-kiln-run-local.sh tests/launcher/test-kiln-run-elastic.sh
# Shared nodes: another user against a running job's store (issue 31).
TEST_SCRIPTS += tests/launcher/test-kiln-run-shared.sh
# The real Slurm cluster (4 slurmd in network namespaces, tests/launcher/four.cfg).
TEST_SCRIPTS += tests/launcher/test-kiln-run-slurm.sh

# Benchmarks: rendezvous (simulated agents), node loss, torchrun side by side.
BENCH_SCRIPTS += tests/launcher/bench-kiln-run.sh
