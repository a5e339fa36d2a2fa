#!/bin/bash
# demo.sh — `make demo` step: kiln-healthd on the demo nodes, one GPU fails,
# the node is drained in Slurm with kiln's reason, then resumed.
#
#   tests/healthd/demo.sh CLUSTER/env.sh      (KILN_BUILD = the build dir)
#
# Runs kiln-healthd on every node of the running demo cluster against the
# fake NVML (4 H100s per node).  On node02, GPU 2 overheats 3 s after start
# (96 C, above its 90 C slowdown limit) and cools down at 10 s; with
# recover_after = 4s the node comes back ~14 s in.  The demo's own cluster
# file copy only shortens the health timings.
set -u
. "$(dirname "$0")/lib.sh"
envsh=${1:?usage: demo.sh CLUSTER/env.sh}
. "$envsh"
demo_scratch kiln-healthd-demo
write_cfg "$W/cluster.cfg" 'interval = "1s";' 'recover_after = "4s";'
printf 'gpus = ( { }, { }, { temperature = 96; }, { } );\n' >"$W/node02-hot.scn"
printf 'gpus = ( { }, { }, { }, { } );\nevents = ( { at = 3.0; gpu = 2; set = { temperature = 96; }; },\n           { at = 10.0; gpu = 2; set = { temperature = 50; }; } );\n' >"$W/node02.scn"
demo_start_healthd "$W/node02.scn"
echo "kiln-healthd started on: $KC_NODES (fake NVML, 4 GPUs each; node02 gpu2 overheats at 3 s, cools at 10 s)"
start=$(date +%s.%N)
last=""
while :; do
	t=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%5.1f", b - a }')
	line=$($KC_HUB sinfo -h -N -n node02 -o '%T %E' 2>/dev/null)
	if [ "$line" != "$last" ]; then echo "  t=${t}s  sinfo node02: $line"; last=$line; fi
	if [ -z "${shown:-}" ] && [[ "$line" == drain* ]]; then
		shown=1
		echo "  node02 /metrics:"
		$KC_EXEC_node02 curl -s --max-time 2 http://127.0.0.1:9400/metrics |
			grep -E '^(kiln_gpu_health.*} 1|DCGM_FI_DEV_GPU_TEMP)' | grep 'gpu="2"' | sed 's/^/    /'
		echo "  node02 kiln-healthd --check:"
		# a one-shot check starts its own (fake) NVML: give it the hot GPU
		KILN_FAKE_NVML_SCENARIO=$W/node02-hot.scn $KC_EXEC_node02 "$HEALTHD" -c "$W/cluster.cfg" --check --quiet 2>/dev/null |
			sed 's/^/    /'
	fi
	if awk -v t="$t" 'BEGIN { exit !(t > 25) }'; then echo "  (gave up waiting at 25 s)"; break; fi
	[ -n "${shown:-}" ] && [[ "$line" == idle* || "$line" == mix* || "$line" == alloc* ]] && break
	sleep 0.5
done
echo "  node02 kiln-healthd journal:"
grep -E '^<[0-5]>' "$W/node02.log" | sed 's/^/    /'
