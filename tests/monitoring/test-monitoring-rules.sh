#!/bin/bash
# test-monitoring-rules.sh — kiln's Prometheus side, printing TAP:
# services/monitoring/prometheus/kiln-alerts.yml passes `promtool check
# rules` and its unit tests (kiln-alerts.test.yml: every alert fires and
# stays quiet where it should), every alert has both kinds of case, the
# checked-in file is what `kiln render kiln-alerts.yml` writes for the demo
# cluster, `kiln render prometheus -o DIR` writes a configuration `promtool
# check config` accepts (rules included) for both examples, with one
# kiln-healthd target per node and one kiln-inferd target per inference
# node, and the monitoring section's thresholds reach the rules (a changed
# threshold makes the unit tests fail where they should).
set -u
. "$(dirname "$0")/../lib/suite.sh"
. "$here/../lib/tap.sh"
RULES=services/monitoring/prometheus/kiln-alerts.yml
UNIT=services/monitoring/prometheus/kiln-alerts.test.yml
PROMTOOL=${PROMTOOL:-promtool}
if ! command -v "$PROMTOOL" >/dev/null; then
	echo "1..1"
	echo "ok 1 # SKIP promtool not installed (Debian: prometheus; make deps)"
	exit 0
fi
if [ ! -x "$KILN" ]; then
	echo "1..1"
	echo "ok 1 # SKIP $KILN not built"
	exit 0
fi
W=$(mktemp -d /tmp/kiln-monitoring-rules.XXXXXX)
trap 'rm -rf "$W"' EXIT
export KILN_LOG_PREFIX=0
unset KILN_CONFIG
# quiet CMD...: runs CMD, its output shown as TAP comments only on failure
quiet() { "$@" >"$W/out" 2>&1 || { sed 's/^/# /' "$W/out" | head -40; return 1; }; }
# fails CMD...: CMD must fail
fails() { ! "$@" >"$W/out" 2>&1; }
# yq FILE PYTHON-EXPRESSION-ON-y: a YAML file's content tested in Python
yq() {
	python3 -c 'import sys, yaml; y = yaml.safe_load(open(sys.argv[1])); r = eval(sys.argv[2]); print("#", r) if not r else None; sys.exit(0 if r else 1)' "$1" "$2"
}

# ---- the rules file and its unit tests
ok "promtool check rules $RULES" quiet "$PROMTOOL" check rules "$RULES"
ok "promtool test rules $UNIT" quiet "$PROMTOOL" test rules "$UNIT"
python3 - "$RULES" "$UNIT" >"$W/cover" 2>&1 <<'EOF'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
unit = yaml.safe_load(open(sys.argv[2]))
alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
fire, quiet = set(), set()
for t in unit["tests"]:
    for c in t.get("alert_rule_test", []):
        (fire if c.get("exp_alerts") else quiet).add(c["alertname"])
missing = [a for a in alerts if a not in fire or a not in quiet]
print("# alerts:", len(alerts), "missing a firing or a quiet case:", missing)
sys.exit(1 if missing or len(alerts) < 8 else 0)
EOF
check "every alert has a firing and a not-firing unit test ($(head -1 "$W/cover" | sed 's/^# //'))" $?

"$KILN" -c config/examples/demo.cfg render kiln-alerts.yml >"$W/demo-alerts.yml" 2>"$W/err"
cmp -s "$W/demo-alerts.yml" "$RULES"
check "$RULES is kiln render kiln-alerts.yml of the demo cluster (regenerate it when render.c changes)" $?

# ---- render prometheus -o DIR for both examples
for ex in demo dgx-pod; do
	d=$W/$ex
	if "$KILN" -q -c "config/examples/$ex.cfg" render prometheus -o "$d" && [ -s "$d/prometheus.yml" ] && [ -s "$d/kiln-alerts.yml" ]; then
		ok "$ex: render prometheus -o DIR writes prometheus.yml and kiln-alerts.yml" true
	else
		ok "$ex: render prometheus -o DIR writes prometheus.yml and kiln-alerts.yml" false
	fi
	ok "$ex: promtool check config (the rules it names included)" quiet "$PROMTOOL" check config "$d/prometheus.yml"
done
job() { echo "[c for c in y['scrape_configs'] if c['job_name'] == '$1']"; }
ok "dgx-pod: one kiln-healthd target per node (32) on health.metrics_port" yq "$W/dgx-pod/prometheus.yml" \
	"[t for c in $(job kiln-healthd)[0]['static_configs'] for t in c['targets']] == ['10.40.1.%d:9400' % i for i in range(1, 33)]"
ok "dgx-pod: one kiln-inferd target per inference node (dgx25-32), labelled node and model" yq "$W/dgx-pod/prometheus.yml" \
	"[(c['targets'], c['labels']) for c in $(job kiln-inferd)[0]['static_configs']] == [(['10.40.1.%d:8000' % i], {'node': 'dgx%02d' % i, 'model': 'llama-3-8b'}) for i in range(25, 33)]"
ok "dgx-pod: the rules file is named, scrape interval 15s, cluster label" yq "$W/dgx-pod/prometheus.yml" \
	"y['rule_files'] == ['kiln-alerts.yml'] and y['global']['scrape_interval'] == '15s' and y['global']['external_labels'] == {'cluster': 'pod1'}"
ok "demo (no inference node): no kiln-inferd job" yq "$W/demo/prometheus.yml" \
	"[c['job_name'] for c in y['scrape_configs']] == ['kiln-healthd']"
"$KILN" -c config/examples/demo.cfg render prometheus >/dev/null 2>"$W/err"
rc=$?
[ $rc -eq 2 ] && grep -q "needs -o DIR" "$W/err"
check "render prometheus without -o DIR exits 2 and says so" $?

# ---- thresholds from the cluster file
cp config/examples/demo.cfg "$W/t.cfg"
cat >>"$W/t.cfg" <<'EOF'
monitoring = {
  scrape_interval = "30s";
  drained_for = "1h";
  throttle_for = "90s";
  healthd_down_for = "2m";
  queue_waiting = 500;
  ttft_p99 = "500ms";
};
EOF
if "$KILN" -q -c "$W/t.cfg" render prometheus -o "$W/t"; then
	ok "thresholds: promtool check config accepts the rendered files" quiet "$PROMTOOL" check config "$W/t/prometheus.yml"
	ok "thresholds: every one reaches its alert" yq "$W/t/kiln-alerts.yml" \
		"{r['alert']: (r.get('for'), r['expr'].split()[-1]) for g in y['groups'] for r in g['rules']} == {
		'KilnGPUUnhealthy': ('1m', '1'), 'KilnGPUDrainingXID': (None, '1'),
		'KilnGPUThermalThrottling': ('90s', '0'), 'KilnNodeDrained': ('1h', '1'),
		'KilnHealthdDown': ('2m', '0'), 'KilnInferenceRejecting': (None, '0'),
		'KilnInferenceQueueSaturated': ('5m', '500'), 'KilnInferenceTTFTHigh': ('10m', '0.5')}"
	ok "thresholds: scrape_interval = 30s" yq "$W/t/prometheus.yml" "y['global']['scrape_interval'] == '30s'"
	# the unit tests pin the defaults: with queue_waiting 500 the queue at
	# 512 now fires, with throttle_for 90s the 5-minute throttle does
	cp "$UNIT" "$W/t/"
	"$PROMTOOL" test rules "$W/t/kiln-alerts.test.yml" >"$W/t/unit.out" 2>&1
	rc=$?
	[ $rc -ne 0 ] && grep -q "KilnInferenceQueueSaturated" "$W/t/unit.out" && grep -q "KilnGPUThermalThrottling" "$W/t/unit.out"
	check "thresholds: the unit tests fail on the changed queue and throttle thresholds (they test the numbers)" $?
else
	for t in config rules scrape unit; do ok "thresholds: $t (render failed)" false; done
fi
sed 's/^health = {/health = {\n  enabled = false;/' config/examples/demo.cfg >"$W/off.cfg"
"$KILN" -q -c "$W/off.cfg" render prometheus -o "$W/off" 2>"$W/err"
ok "health.enabled = false: no kiln-healthd job, scrape_configs empty, promtool accepts it" bash -c \
	"grep -q '^scrape_configs: \[\]' '$W/off/prometheus.yml' && '$PROMTOOL' check config '$W/off/prometheus.yml' >/dev/null 2>&1"
sed 's/^  interval = "10s";/  interval = "10s";\n  drain = false;/' config/examples/dgx-pod.cfg >"$W/nodrain.cfg"
"$KILN" -c "$W/nodrain.cfg" render kiln-alerts.yml >"$W/nodrain.yml" 2>"$W/err"
ok "health.drain = false: no KilnNodeDrained, the rest still valid" bash -c \
	"! grep -q 'alert: KilnNodeDrained' '$W/nodrain.yml' && grep -q 'alert: KilnGPUUnhealthy' '$W/nodrain.yml' && '$PROMTOOL' check rules '$W/nodrain.yml' >/dev/null 2>&1"
printf 'monitoring = { queue_waiting = 0; ttft_p99 = "fast"; };\n' | cat config/examples/demo.cfg - >"$W/bad.cfg"
"$KILN" -c "$W/bad.cfg" check >/dev/null 2>"$W/err"
rc=$?
[ $rc -eq 2 ] && grep -q "monitoring.queue_waiting" "$W/err" && grep -q "monitoring.ttft_p99" "$W/err"
check "bad monitoring values are cluster-file errors (exit 2, both named)" $?
tap_done
