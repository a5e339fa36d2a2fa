# store.mk — kiln-run's rendezvous store: library, tools, tests, fuzzer, bench.
#
# Not picked up by the top Makefile's build.mk glob on its own (the store
# lives in slurm/launcher next to kiln-run); slurm/launcher/build.mk includes
# it.  Guarded so a second include is harmless.
ifndef KILN_STORE_MK
KILN_STORE_MK := 1

KILN_STORE_SRCS := slurm/launcher/store-proto.c slurm/launcher/store-map.c slurm/launcher/store-server.c \
	slurm/launcher/store-client.c
$(eval $(call kiln_lib,kilnstore,$(KILN_STORE_SRCS)))

$(B)/obj/tests/launcher/%.o: EXTRA_CFLAGS += -Islurm/launcher
$(eval $(call kiln_tool,kiln-store-server,tests/launcher/store-server-tool.c,kilnstore common,))
$(eval $(call kiln_tool,kiln-store-bench,tests/launcher/store-bench.c,kilnstore common,))
$(eval $(call kiln_test,test-store,tests/launcher/store-test.c,kilnstore common,))
# The store's hash map alone (store-map.c): insert, find, delete, growth,
# keys built to collide.
$(eval $(call kiln_test,test-store-map,tests/launcher/test-store-map.c,kilnstore common,))

TEST_SCRIPTS += tests/launcher/store-torch.sh tests/launcher/store-hostile.sh
TEST_FULL_SCRIPTS += tests/fuzz/fuzz-store.sh
BENCH_SCRIPTS += tests/launcher/store-bench.sh

# libFuzzer targets (mk/rules.mk's kiln_fuzz): the protocol parser alone,
# and the whole server (request handling, waiters, limits) over loopback
# sockets; `make fuzz-store` builds both.
KILN_STORE_FUZZ_CFLAGS := -Icommon/include -Islurm/launcher/include -Islurm/launcher
$(eval $(call kiln_fuzz,fuzz-store,tests/fuzz/fuzz-store.c slurm/launcher/store-proto.c,$(KILN_STORE_FUZZ_CFLAGS),,slurm/launcher/store-proto.h))
$(eval $(call kiln_fuzz,fuzz-store-server,tests/fuzz/fuzz-store-server.c $(KILN_STORE_SRCS) common/log.c common/parse.c common/net.c,$(KILN_STORE_FUZZ_CFLAGS),-lpthread,slurm/launcher/store-proto.h slurm/launcher/store-map.h slurm/launcher/include/kiln/store.h))
fuzz-store: fuzz-store-server
endif
