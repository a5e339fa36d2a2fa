# slurm/store/: libkilnstore, the rendezvous store (TCPStore-compatible):
# library, tools, tests, fuzzer, bench.  kiln-run serves it; kiln-train and
# the workers are its clients.

KILN_STORE_SRCS := slurm/store/store-proto.c slurm/store/store-map.c slurm/store/store-server.c \
	slurm/store/store-client.c
$(eval $(call kiln_lib,kilnstore,$(KILN_STORE_SRCS)))

$(B)/obj/tests/launcher/%.o: EXTRA_CFLAGS += -Islurm/store
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
KILN_STORE_FUZZ_CFLAGS := -Icommon/include -Islurm/store/include -Islurm/store
$(eval $(call kiln_fuzz,fuzz-store,tests/fuzz/fuzz-store.c slurm/store/store-proto.c,$(KILN_STORE_FUZZ_CFLAGS),,slurm/store/store-proto.h))
$(eval $(call kiln_fuzz,fuzz-store-server,tests/fuzz/fuzz-store-server.c $(KILN_STORE_SRCS) common/log.c common/parse.c common/net.c,$(KILN_STORE_FUZZ_CFLAGS),-lpthread,slurm/store/store-proto.h slurm/store/store-map.h slurm/store/include/kiln/store.h))
fuzz-store: fuzz-store-server
