#!/bin/bash
# Benchmarks for kiln-run, side by side with torchrun (Debian's torch 1.13,
# /usr/bin/python3 -m torch.distributed.run) on the same machine:
#
#  1. rendezvous time for 64, 256 and 1024 simulated agents on loopback: a real
#     kiln-run hosts the store and leads, kiln-run-bench plays the other
#     agents (one thread + one store connection each, the agent's protocol);
#     time from "all connected, start joining" to every agent past the round's
#     barrier.  Target: 1024 agents < 2 s.
#  2. rendezvous with N real launcher processes on loopback (kiln-run and
#     torchrun --rdzv_backend c10d, the same trivial worker): launch to every
#     worker running.
#  3. node loss: 4 loopback "nodes", 1 PyTorch worker each (the same
#     torch-steps.py under both launchers), SIGKILL one node's agent and
#     worker by PID after step 10; time until every survivor runs a new
#     worker with WORLD_SIZE 3.  Target: < 5 s.
# Prints a markdown table.  Writes nothing outside a temp dir.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/launcher/local-env.sh
. "$(dirname "$0")/local-env.sh" kiln-run-bench
BENCH=$(realpath "$B/tests/kiln-run-bench")
PY=/usr/bin/python3
export KILN_RUN_SECRET=bench-$$-$RANDOM
port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
# torchrun through a wrapper that fixes torch 1.13's launcher under Python 3.11.
TORCHRUN="$PY $here/torchrun-compat.py"
have_torchrun=0
$PY -c 'import torch.distributed.run' 2>/dev/null && have_torchrun=1
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 |"); }

# ---- 1. simulated agents --------------------------------------------------
for N in 64 256 1024; do
	p=$(port)
	KILN_RUN_SIM_NODES="sim[0000-$(printf %04d $((N - 1)))]" KILN_RUN_SIM_NODE_ID=0 \
		setsid "$KR" -q --port "$p" --nnodes "$N:$N" -- true 2>"$T/lead-$N.err" &
	lp=$!; pids+=($lp)
	out=$("$BENCH" "$p" "$N" 2>&1)
	wait $lp
	ms=$(echo "$out" | sed -nE 's/.*barrier_ms ([0-9.]+).*/\1/p')
	echo "# kiln-run $N simulated agents: $out" >&2
	verdict=""; [ "$N" = 1024 ] && verdict=$(awk -v m="${ms:-99999}" 'BEGIN { print (m < 2000) ? "target < 2 s: met" : "target < 2 s: MISSED" }')
	row "rendezvous, $N simulated agents (loopback)" "${ms:-failed} ms" "n/a (no simulated-agent mode)" "$verdict"
done

# ---- 2. real launcher processes -------------------------------------------
for N in 4 8; do
	d=$T/rdzv-$N; mkdir -p "$d"; p=$(port)
	t0=$(now)
	for i in $(seq 0 $((N - 1))); do
		KILN_RUN_SIM_NODES="sim[1-$N]" KILN_RUN_SIM_NODE_ID=$i setsid "$KR" -q --port "$p" --nnodes "$N:$N" \
			-- sh -c "date +%s.%N >>$d/kiln" >/dev/null 2>&1 &
		pids+=($!)
	done
	for _ in $(seq 600); do { [ -f "$d/kiln" ] && [ "$(wc -l <"$d/kiln")" -ge "$N" ]; } && break; sleep 0.05; done
	k=$(awk -v a="$t0" 'BEGIN { m = 0 } { if ($1 - a > m) m = $1 - a } END { printf "%.2f s", m }' "$d/kiln" 2>/dev/null)
	tr="not run (no torch)"
	if [ $have_torchrun = 1 ]; then
		p=$(port)
		t0=$(now)
		for i in $(seq 0 $((N - 1))); do
			setsid $TORCHRUN --nnodes "$N:$N" --nproc_per_node 1 --rdzv_backend c10d \
				--rdzv_endpoint "127.0.0.1:$p" --rdzv_id "b$p" --no_python \
				sh -c "date +%s.%N >>$d/torch" >/dev/null 2>&1 &
			pids+=($!)
		done
		for _ in $(seq 900); do { [ -f "$d/torch" ] && [ "$(wc -l <"$d/torch")" -ge "$N" ]; } && break; sleep 0.05; done
		tr=$(awk -v a="$t0" 'BEGIN { m = 0 } { if ($1 - a > m) m = $1 - a } END { printf "%.2f s", m }' "$d/torch" 2>/dev/null)
		{ [ -f "$d/torch" ] && [ "$(wc -l <"$d/torch")" -ge "$N" ]; } || tr="did not finish in 45 s"
	fi
	row "launch to all workers running, $N launcher processes (loopback)" "$k" "$tr" "includes each launcher's start-up (torchrun: Python + torch import)"
	for p in "${pids[@]}"; do for q in $(ps -o pid= -s "$p" 2>/dev/null); do kill -9 "$q" 2>/dev/null; done; done
	wait 2>/dev/null
done

# ---- 3. node loss -----------------------------------------------------------
# loss LAUNCHER VICTIM: prints "seconds" (or a failure note)
loss() {
	local which=$1 victim=$2 d=$T/loss-$1-$2 p; p=$(port)
	mkdir -p "$d"
	local steps=1000 dt=0.1
	for i in 0 1 2 3; do
		if [ "$which" = kiln ]; then
			KILN_RUN_SIM_NODES='sim[1-4]' KILN_RUN_SIM_NODE_ID=$i setsid "$KR" --port "$p" --nnodes 2:4 \
				--last-call 3s -- $PY "$here/torch-steps.py" "$d/log" "$d/ck" $steps $dt >"$d/a$i.out" 2>&1 &
		else
			setsid $TORCHRUN --nnodes 2:4 --nproc_per_node 1 --rdzv_backend c10d \
				--rdzv_endpoint "127.0.0.1:$p" --rdzv_id "l$p" --max_restarts 3 --monitor_interval 0.1 \
				--rdzv_conf last_call_timeout=3 \
				"$here/torch-steps.py" "$d/log" "$d/ck" $steps $dt >"$d/a$i.out" 2>&1 &
		fi
		echo $! >"$d/a$i.pid"; pids+=($!)
		[ $i = 0 ] && sleep 2   # node 0 hosts the store in both launchers
	done
	for _ in $(seq 1200); do [ "$(cat "$d/ck" 2>/dev/null || echo 0)" -ge 10 ] && break; sleep 0.05; done
	if [ "$(cat "$d/ck" 2>/dev/null || echo 0)" -lt 10 ]; then echo "did not start"; return; fi
	local t0; t0=$(now)
	for q in $(ps -o pid= -s "$(cat "$d/a$victim.pid")"); do kill -9 "$q" 2>/dev/null; done
	for _ in $(seq 1200); do
		[ "$(grep -c '^start .* world 3 ' "$d/log" 2>/dev/null)" -ge 3 ] && break
		sleep 0.05
	done
	for i in 0 1 2 3; do for q in $(ps -o pid= -s "$(cat "$d/a$i.pid")" 2>/dev/null); do kill -9 "$q" 2>/dev/null; done; done
	# Last survivor's new worker spawned / ready (after init_process_group).
	local sp rd
	sp=$(awk -v a="$t0" '$1 == "spawned" && $4 == 3 { n++; if ($2 - a > m) m = $2 - a } END { if (n >= 3) printf "%.2f s", m; else printf "none in 60 s" }' "$d/log")
	rd=$(awk -v a="$t0" '$1 == "start" && $4 == 3 { n++; if ($2 - a > m) m = $2 - a } END { if (n >= 3) printf "%.2f s", m; else printf "none in 60 s" }' "$d/log")
	echo "$sp / $rd"
}
if $PY -c 'import torch.distributed' 2>/dev/null; then
	k=$(loss kiln 2)
	kh=$(loss kiln 0)
	tr="not run (no torchrun)"
	[ $have_torchrun = 1 ] && tr=$(loss torch 2)
	verdict=$(echo "$k" | awk '{ print ($1 + 0 < 5) ? "target < 5 s (spawned): met" : "target < 5 s: MISSED" }')
	row "SIGKILL of a node -> survivors' new workers spawned / ready (WORLD_SIZE 3, after init_process_group)" "$k" "$tr" "$verdict; same torch-steps.py worker"
	row "SIGKILL of the store host -> new workers spawned / ready" "$kh" "n/a (torchrun's c10d store dies with its host)" "the store moves to the next node"
else
	row "SIGKILL of a node -> new workers running" "not run (no torch)" "not run" ""
fi

echo
echo "kiln-run benchmarks ($(nproc) CPUs, $(uname -r); baseline: torchrun from torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '-'))"
echo
echo "| measurement | kiln-run | torchrun | note |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
