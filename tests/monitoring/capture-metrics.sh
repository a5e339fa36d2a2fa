#!/bin/bash
# capture-metrics.sh DIR — runs the real kiln-healthd (on the fake NVML) and
# kiln-inferd (on the tiny260K fixture) and writes what their /metrics
# serve to DIR/healthd.prom and DIR/inferd.prom.
#
# The checked-in tests/monitoring/{healthd,inferd}.prom came from
#   tests/monitoring/capture-metrics.sh tests/monitoring
# and are what the dashboard check holds the dashboard's queries against;
# test-monitoring-exposition.sh captures again and fails when the metric
# names the programs serve today differ from them (then run the line above).
#
# The scenario shows every family a node can have: one GPU thermally
# throttled (clock event reasons 0x20), one with XID 79 (so kiln_xid_total,
# an unhealthy GPU and kiln_node_drain with its reason), and a kiln-inferd
# whose one-place queue answers some requests with 429.  Exit 0 when both
# files were written, 77 when a program or the model is missing (skip), 1
# otherwise.
set -u
out=${1:?usage: capture-metrics.sh DIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${KILN_BUILD:-build}
case "$B" in /*) ;; *) B=$top/$B ;; esac
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
cd "$top" || exit 1
HEALTHD=$B/bin/kiln-healthd
INFERD=$B/bin/kiln-inferd
FAKE=$B/lib/fake-nvml/libnvidia-ml.so.1
. tests/lib/fixture.sh
MODEL=$(kiln_fixture_path)
for f in "$HEALTHD" "$INFERD" "$FAKE"; do
	[ -e "$f" ] || { echo "capture-metrics: $f missing" >&2; exit 77; }
done
# the fixture is the build's own: missing is an error, not a reason to skip
[ -r "$MODEL" ] || { echo "capture-metrics: model fixture $MODEL is not readable: $KILN_FIXTURE_HINT" >&2; exit 1; }
command -v curl >/dev/null || { echo "capture-metrics: curl missing" >&2; exit 77; }
export KK_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1 KILN_LOG_PREFIX=0
unset NOTIFY_SOCKET WATCHDOG_USEC
W=$(mktemp -d /tmp/kiln-capture.XXXXXX)
HPID= IPID=
cleanup() {
	[ -n "$HPID" ] && kill "$HPID" 2>/dev/null
	[ -n "$IPID" ] && kill "$IPID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$out"

# ---- kiln-healthd on four fake GPUs
port=$((20000 + RANDOM % 20000))
sed '/^health = {/,$d' config/examples/demo.cfg >"$W/c.cfg"
cat >>"$W/c.cfg" <<EOF
health = {
  interval = "200ms";
  nvml_library = "$FAKE";
  metrics_port = $port;
  metrics_address = "127.0.0.1";
  active_on_start = false;
  drain = false;
  watchdog = 0;
};
EOF
cat >"$W/gpus.scn" <<'EOF'
gpus = ( { clock_event_reasons = 32; }, { }, { }, { } );
events = ( { at = 0.2; gpu = 1; xid = 79; } );
EOF
KILN_FAKE_NVML_SCENARIO=$W/gpus.scn KILN_HEALTHD_XID_STATE=$W/xid.state \
	"$HEALTHD" -c "$W/c.cfg" --node node01 >"$W/healthd.log" 2>&1 &
HPID=$!
got=
for _ in $(seq 100); do
	if curl -sf --max-time 2 "http://127.0.0.1:$port/metrics" >"$W/h.prom" 2>/dev/null &&
		grep -q '^kiln_xid_total{' "$W/h.prom" && grep -q '^kiln_node_drain{' "$W/h.prom"; then
		got=1
		break
	fi
	sleep 0.1
done
if [ -z "$got" ]; then
	echo "capture-metrics: kiln-healthd served no XID on port $port" >&2
	sed 's/^/  /' "$W/healthd.log" >&2
	exit 1
fi
cp "$W/h.prom" "$out/healthd.prom"

# ---- kiln-inferd: a few completions, and 429s from a one-place queue
"$INFERD" -m "$MODEL" --name tiny260K -p 0 --max-running 1 --max-waiting 1 >"$W/inferd.log" 2>&1 &
IPID=$!
iport=
for _ in $(seq 100); do
	iport=$(grep -o 'http://127.0.0.1:[0-9]*' "$W/inferd.log" | head -1 | sed 's/.*://')
	[ -n "$iport" ] && break
	sleep 0.1
done
if [ -z "$iport" ]; then
	echo "capture-metrics: kiln-inferd did not start" >&2
	sed 's/^/  /' "$W/inferd.log" >&2
	exit 1
fi
URL=http://127.0.0.1:$iport
for i in 1 2 3 4 5 6; do
	curl -s -o /dev/null --max-time 30 "$URL/v1/completions" \
		-d '{"model": "tiny260K", "prompt": [1, 2, 3], "max_tokens": 24, "temperature": 0}' &
done
wait $(jobs -p | grep -v -e "^$HPID\$" -e "^$IPID\$") 2>/dev/null
curl -sf --max-time 5 "$URL/metrics" >"$out/inferd.prom" || exit 1
grep -q '^kiln_inferd_num_requests_rejected_total{model_name="tiny260K"} [1-9]' "$out/inferd.prom" ||
	echo "capture-metrics: note: no request was refused with 429 this time" >&2
exit 0
