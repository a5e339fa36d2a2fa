# slurm/store/: libkilnstore, the rendezvous store (TCPStore-compatible):
# library, tools, tests, fuzzer, bench.  kiln-run serves it; kiln-train and
# the workers are its clients.

KILN_STORE_SRCS := slurm/store/store-proto.c slurm/store/store-map.c slurm/store/store-peer.c \
	slurm/store/store-server.c slurm/store/store-relay.c \
	slurm/store/store-client.c
$(eval $(call kiln_lib,kilnstore,$(KILN_STORE_SRCS)))

$(B)/obj/tests/store/%.o: EXTRA_CFLAGS += -Islurm/store
$(eval $(call kiln_tool,kiln-store-server,tests/store/store-server-tool.c,kilnstore common,))
$(eval $(call kiln_tool,kiln-store-bench,tests/store/bench-store.c,kilnstore common,))
$(eval $(call kiln_test,test-store,tests/store/test-store.c,kilnstore common,))
# The store's hash map alone (store-map.c): insert, find, delete, growth,
# keys built to collide.
$(eval $(call kiln_test,test-store-map,tests/store/test-store-map.c,kilnstore common,))

TEST_SCRIPTS += tests/store/test-store-torch.sh tests/store/test-store-hostile.sh tests/store/test-store-auth.sh
BENCH_SCRIPTS += tests/store/bench-store.sh
