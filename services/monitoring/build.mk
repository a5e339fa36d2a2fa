# services/monitoring: nothing to build — the Grafana dashboard with its
# provisioning files and the default-threshold Prometheus rules, installed
# under PREFIX/share/kiln/monitoring (docs/monitoring.md).  The rules a
# cluster runs with come from `kiln render prometheus -o DIR`.
MONITORING_SHARE = $(DESTDIR)$(PREFIX)/share/kiln/monitoring

install: install-monitoring
install-monitoring:
	install -d $(MONITORING_SHARE)/grafana/provisioning/dashboards \
		$(MONITORING_SHARE)/grafana/provisioning/datasources $(MONITORING_SHARE)/prometheus
	install -m 644 services/monitoring/grafana/kiln-cluster.json $(MONITORING_SHARE)/grafana/
	install -m 644 services/monitoring/grafana/provisioning/dashboards/kiln.yml \
		$(MONITORING_SHARE)/grafana/provisioning/dashboards/
	install -m 644 services/monitoring/grafana/provisioning/datasources/kiln.yml \
		$(MONITORING_SHARE)/grafana/provisioning/datasources/
	install -m 644 services/monitoring/prometheus/kiln-alerts.yml \
		services/monitoring/prometheus/kiln-alerts.test.yml $(MONITORING_SHARE)/prometheus/
.PHONY: install-monitoring
