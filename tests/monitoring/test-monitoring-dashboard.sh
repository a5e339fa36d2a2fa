#!/bin/bash
# test-monitoring-dashboard.sh — the Grafana dashboard without Grafana
# (neither Debian 12 nor PyPI ships one), printing TAP: check-dashboard.py
# finds every query parsing (promtool) and every metric exported by kiln (the
# captured exposition) or dcgm-exporter, and it catches what it is for: a
# misspelt metric, a query that does not parse and a misspelt label planted
# in a copy.  The dashboard covers what issue 16 asks for (a query on each
# of those metrics, the node and model variables), and the provisioning
# files are valid YAML of the shape Grafana reads.
set -u
. "$(dirname "$0")/../lib/suite.sh"
. "$here/../lib/tap.sh"
DASH=services/monitoring/grafana/kiln-cluster.json
NAMES=services/monitoring/dcgm-exporter-metrics.txt
PROV=services/monitoring/grafana/provisioning
PROMTOOL=${PROMTOOL:-promtool}
if ! command -v "$PROMTOOL" >/dev/null; then
	echo "1..1"
	echo "ok 1 # SKIP promtool not installed (Debian: prometheus; make deps)"
	exit 0
fi
W=$(mktemp -d /tmp/kiln-monitoring-dash.XXXXXX)
trap 'rm -rf "$W"' EXIT
checker() { python3 "$here/check-dashboard.py" --promtool "$PROMTOOL" "$1" "$NAMES" "$here"/*.prom; }

checker "$DASH" >"$W/out" 2>&1
rc=$?
[ $rc -ne 0 ] && sed 's/^/# /' "$W/out"
check "$DASH: every query parses, every metric and label is exported ($(tail -1 "$W/out" | sed 's/^# //'))" $rc

# plant one mistake at a time in a copy: the check must fail and name it
plant() { # NAME SED-EXPRESSION EXPECTED-TEXT
	sed "$2" "$DASH" >"$W/$1.json"
	cmp -s "$W/$1.json" "$DASH" && { echo "# the sed changed nothing"; return 1; }
	checker "$W/$1.json" >"$W/$1.out" 2>&1 && { echo "# the check passed"; return 1; }
	grep -q -- "$3" "$W/$1.out" || { sed 's/^/# /' "$W/$1.out"; return 1; }
}
ok "a misspelt metric fails the check, named" plant metric \
	's/vllm:generation_tokens_total/kiln_inferd_generated_tokens_total/' \
	"metric kiln_inferd_generated_tokens_total is exported neither"
ok "a query that does not parse fails the check (promtool)" plant syntax \
	's/sum by (xid) (increase(/sum by (xid) (increase((/' "could not parse expression"
ok "a misspelt label fails the check, named" plant label \
	's/kiln_gpu_health{Hostname=~/kiln_gpu_health{hostname=~/' "kiln_gpu_health has no label hostname"
ok "a panel off the \$datasource variable fails the check" plant ds \
	'0,/"uid": "${datasource}"/s//"uid": "prometheus"/' "datasource is not the"

# what the dashboard shows: issue 16's list, by the metrics it queries
missing=
for m in kiln_gpu_health kiln_node_drain kiln_xid_total DCGM_FI_DEV_GPU_UTIL DCGM_FI_DEV_FB_USED \
	DCGM_FI_DEV_GPU_TEMP DCGM_FI_DEV_POWER_USAGE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL \
	DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS DCGM_FI_DEV_XID_ERRORS DCGM_FI_DEV_CLOCK_THROTTLE_REASONS \
	kiln_gpu_slurm_job vllm:request_success_total vllm:generation_tokens_total \
	vllm:time_to_first_token_seconds_bucket vllm:inter_token_latency_seconds_bucket \
	vllm:num_requests_waiting kiln_inferd_num_requests_rejected_total \
	vllm:kv_cache_usage_perc vllm:prefix_cache_hits_total; do
	jq -e --arg m "$m" '[.. | .expr? // empty | select(contains($m))] | length > 0' "$DASH" >/dev/null || missing="$missing $m"
done
ok "a panel for each of GPU state, drains, XIDs, utilisation, memory, temperature, power, ECC, remapped rows, throttling, jobs, requests, tokens, TTFT, ITL, queue, 429s, KV cache, prefix cache${missing:+ (missing:$missing)}" test -z "$missing"
ok "TTFT and ITL as p50 and p99 through histogram_quantile" bash -c \
	"[ \$(jq '[.. | .expr? // empty | select(test(\"histogram_quantile\\\\((0.5|0.99), .*(time_to_first_token|inter_token_latency)\"))] | length' '$DASH') -eq 4 ]"
jqt() { jq -e "$@" >/dev/null; }
ok "node and model variables, and the datasource one" jqt \
	'[.templating.list[].name] | contains(["datasource", "node", "model"])' "$DASH"
ok "inference panels filter on \$model (vLLM's model_name label), GPU panels on \$node" jqt \
	'[.. | .expr? // empty] | (map(select(test("kiln_inferd_|vllm:"))) | all(test("model_name=~\"\\$model\""))) and (map(select(test("^(kiln_gpu|DCGM_FI|sum by \\(state\\) \\(kiln_gpu)"))) | all(test("Hostname=~\"\\$node\"")))' "$DASH"

# provisioning files: the shape Grafana's provisioning reads
yq() {
	python3 -c 'import sys, yaml; y = yaml.safe_load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2"
}
ok "dashboard provisioning: apiVersion 1, one file provider with a path" yq "$PROV/dashboards/kiln.yml" \
	"y['apiVersion'] == 1 and [p['type'] for p in y['providers']] == ['file'] and y['providers'][0]['options']['path'].startswith('/')"
ok "datasource provisioning: a Prometheus datasource" yq "$PROV/datasources/kiln.yml" \
	"y['apiVersion'] == 1 and y['datasources'][0]['type'] == 'prometheus' and y['datasources'][0]['url'].startswith('http')"
tap_done
