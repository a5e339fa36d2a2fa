# tests/monitoring: the Prometheus rules and their unit tests, kiln render
# prometheus, the Grafana dashboard's queries against the metrics kiln
# exports, and the captured exposition against what the programs serve now.
TEST_SCRIPTS += tests/monitoring/test-monitoring-rules.sh
TEST_SCRIPTS += tests/monitoring/test-monitoring-dashboard.sh
TEST_SCRIPTS += tests/monitoring/test-monitoring-exposition.sh
