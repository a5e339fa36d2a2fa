#!/bin/bash
# test-monitoring-exposition.sh — the captured /metrics text the dashboard
# check trusts (tests/monitoring/{healthd,inferd}.prom) is still what the
# programs serve, printing TAP: capture-metrics.sh runs the real kiln-healthd
# (fake NVML) and kiln-inferd (the tiny260K model fixture) again, and the metric names and
# each metric's label names must equal the checked-in capture's (when they
# differ: tests/monitoring/capture-metrics.sh tests/monitoring, and look at
# what the dashboard and rules use).  The captures parse as Prometheus text
# (`promtool check metrics` finds nothing but the lint that dcgm-exporter's
# names and labels draw), and show what the rules need: a drain reason,
# XIDs by number, clock event reasons, the 429 counter.
set -u
. "$(dirname "$0")/../lib/suite.sh"
. "$here/../lib/tap.sh"
PROMTOOL=${PROMTOOL:-promtool}
W=$(mktemp -d /tmp/kiln-monitoring-expo.XXXXXX)
trap 'rm -rf "$W"' EXIT

# the metric and label names of an exposition, one "name label,label" a line
shape() {
	python3 - "$1" <<'EOF'
import re, sys
seen = {}
for line in open(sys.argv[1]):
    if line.startswith("# TYPE "):
        seen.setdefault(line.split()[2], set())
        continue
    m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s", line)
    if m and not line.startswith("#"):
        base = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
        name = base if base in seen else m.group(1)
        seen.setdefault(name, set()).update(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(3) or ""))
for k in sorted(seen):
    print(k, ",".join(sorted(seen[k])))
EOF
}

for f in healthd inferd; do
	if [ -s "$here/$f.prom" ]; then
		ok "$f.prom is checked in" true
	else
		ok "$f.prom is checked in" false
	fi
	# every complaint is a lint of the names dcgm-exporter and vLLM chose
	# (and kiln keeps for their dashboards): camelCase labels, "counter" in
	# a name, vLLM's "vllm:" prefix (promtool keeps colons for recording
	# rules)
	"$PROMTOOL" check metrics <"$here/$f.prom" >"$W/$f.lint" 2>&1
	other=$(grep -v -e "label names should be written in 'snake_case' not 'camelCase'" \
		-e "metric name should not include type 'counter'" \
		-e "^vllm:[a-z0-9_]* metric names should not contain ':'" "$W/$f.lint")
	[ -z "$other" ] || echo "$other" | head -10 | sed 's/^/# /'
	check "$f.prom parses as Prometheus text (promtool check metrics: only dcgm-exporter's and vLLM's naming lint)" "$([ -z "$other" ]; echo $?)"
done
ok "healthd.prom: a drain reason, an XID by number, a thermal clock event reason" bash -c \
	"grep -q '^kiln_node_drain{Hostname=\"node01\",reason=\"kiln: gpu1 XID 79' '$here/healthd.prom' &&
	 grep -q '^kiln_xid_total{.*xid=\"79\"} 1' '$here/healthd.prom' &&
	 grep -q '^DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu=\"0\".* 32$' '$here/healthd.prom'"
ok "inferd.prom: the 429 counter, TTFT/ITL/e2e histograms" bash -c \
	"grep -q '^kiln_inferd_num_requests_rejected_total{model_name=' '$here/inferd.prom' &&
	 [ \$(grep -cE '^# TYPE vllm:(time_to_first_token|inter_token_latency|e2e_request_latency|request_queue_time)_seconds histogram' '$here/inferd.prom') = 4 ]"

"$here/capture-metrics.sh" "$W/now" >"$W/capture.log" 2>&1
rc=$?
if [ $rc -eq 77 ]; then
	skip "capture again: $(tail -1 "$W/capture.log")"
	skip "capture again: $(tail -1 "$W/capture.log")"
else
	[ $rc -ne 0 ] && sed 's/^/# /' "$W/capture.log"
	for f in healthd inferd; do
		if [ $rc -eq 0 ] && diff -u <(shape "$here/$f.prom") <(shape "$W/now/$f.prom") >"$W/$f.diff"; then
			ok "$f: today's /metrics has the checked-in capture's metrics and labels" true
		else
			sed 's/^/# /' "$W/$f.diff" | head -30
			ok "$f: today's /metrics has the checked-in capture's metrics and labels (re-capture: tests/monitoring/capture-metrics.sh tests/monitoring)" false
		fi
	done
fi
tap_done
