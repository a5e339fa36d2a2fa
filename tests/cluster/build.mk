# The real-Slurm suites.  The harness (cluster.sh) is used by other suites too.
TEST_SCRIPTS += tests/cluster/test-slurm-cluster.sh
TEST_SCRIPTS += tests/cluster/test-kiln-status.sh
TEST_SCRIPTS += tests/cluster/test-kiln-reboot.sh
TEST_SCRIPTS += tests/cluster/test-kiln-apply.sh
TEST_SCRIPTS += tests/cluster/test-cluster-users.sh
