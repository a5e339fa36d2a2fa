# tests/serve/: kiln serve, the head's provisioning server (config/cli/serve.c):
# the pure request/Range/URL parsing (cmocka), the server over real loopback
# HTTP with kiln-node-init fetching its secrets from it, hostile clients, and
# image.secrets_only_when_down against a real Slurm (tests/cluster/cluster.sh).
$(eval $(call kiln_test,test-serve-request,tests/serve/test-serve-request.c config/cli/serve-request.c,common,))
$(B)/obj/tests/serve/test-serve-request.o: EXTRA_CFLAGS += -Iconfig/cli
TEST_SCRIPTS += tests/serve/test-serve.sh tests/serve/test-serve-hostile.sh tests/serve/test-serve-slurm.sh
