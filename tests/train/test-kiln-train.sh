#!/bin/bash
# test-kiln-train.sh — kiln-train end to end, printing TAP: --help lists
# every option the program parses; usage and input errors exit 2 with a
# message; fine-tuning the tiny260K fixture on a learnable shard lowers the loss;
# save + resume gives a checkpoint byte-identical to training straight
# through; --model also takes the safetensors checkpoint --save wrote; and
# two ranks under kiln-run (standalone, kk cpu collectives)
# train like one process with the doubled batch and write the same
# checkpoint to within rounding.
set -u
cd "$(dirname "$0")/../.."
B=${KILN_BUILD:-build}
case $B in /*) ;; *) B=$PWD/$B ;; esac
. tests/lib/tap.sh
KT=$B/bin/kiln-train
KR=$B/bin/kiln-run
. tests/lib/fixture.sh
MODEL=$(kiln_fixture_path)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_LOG_PREFIX=0 KK_CPU_THREADS=1 OPENBLAS_NUM_THREADS=1
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT

# --help names every long option of the option table (--dump-options).
opts=$("$KT" --dump-options | awk -F'\t' '$1 == "option" { sub(/^--/, "", $2); print $2 }')
missing=""
help=$("$KT" --help)
for o in $opts; do grep -q -- "--$o" <<<"$help" || missing="$missing $o"; done
check "--help lists every option (missing:${missing:- none})" $([ -z "$missing" ] && [ -n "$opts" ]; echo $?)
ok "--version" bash -c "'$KT' --version | grep -q '^kiln-train [0-9]'"

out=$("$KT" --data x 2>&1); rc=$?
check "no --model: exit 2 and says what is required" $([ $rc -eq 2 ] && grep -q -- 'Give either --model FILE or --init SPEC' <<<"$out"; echo $?)
out=$("$KT" -m x -d y --steps 0 2>&1); rc=$?
check "--steps 0: exit 2" $([ $rc -eq 2 ] && grep -q -- "--steps '0': must be 1" <<<"$out"; echo $?)

# --init: from scratch, no model file
SPEC=dim=64,hidden=172,layers=5,heads=8,kv_heads=4,vocab=512,seq=512
python3 tests/train/mk-shard.py "$tmp/data.tok" 20000 || exit 1
out=$("$KT" --init "$SPEC,colour=red" -d "$tmp/data.tok" 2>&1); rc=$?
check "--init with an unknown key: exit 2 naming it" $([ $rc -eq 2 ] && grep -q "unknown key 'colour' at offset 64" <<<"$out"; echo $?)
out=$("$KT" --init dim=64,hidden=172,layers=5,heads=8,vocab=512 -d "$tmp/data.tok" 2>&1); rc=$?
check "--init without seq: exit 2 saying what is missing" $([ $rc -eq 2 ] && grep -q "'seq' is missing" <<<"$out"; echo $?)
out=$("$KT" --init "${SPEC/dim=64/dim=60}" -d "$tmp/data.tok" 2>&1); rc=$?
check "--init dim 60 over 8 heads: exit 2" $([ $rc -eq 2 ] && grep -q "dim 60 is not a multiple of heads 8" <<<"$out"; echo $?)
out=$("$KT" --init "$SPEC" -m x -d "$tmp/data.tok" 2>&1); rc=$?
check "--init and --model together: exit 2" $([ $rc -eq 2 ] && grep -q "not both" <<<"$out"; echo $?)
iargs=(--init "$SPEC" -d "$tmp/data.tok" -b 4 --seq 32 --lr 1e-2 --warmup 3 --steps 30)
"$KT" "${iargs[@]}" --seed 3 -s "$tmp/init3.st" >"$tmp/init3.log" 2>&1; rc=$?
first=$(awk '/^kiln-train: step 1\/30 /{ print $5 }' "$tmp/init3.log")
last=$(awk '/^kiln-train: step 30\/30 /{ print $5 }' "$tmp/init3.log")
diag "from scratch: loss step 1 $first, step 30 $last (ln 512 = 6.238)"
check "--init: starts at the uniform loss ln(512) and learns" $([ $rc -eq 0 ] && [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 6.1 && a < 6.4 && b < a - 1) }'; echo $?)
"$KT" "${iargs[@]}" --steps 3 --seed 3 -s "$tmp/init3b.st" >/dev/null 2>&1
"$KT" "${iargs[@]}" --steps 3 --seed 3 -s "$tmp/init3c.st" >/dev/null 2>&1
"$KT" "${iargs[@]}" --steps 3 --seed 4 -s "$tmp/init4.st" >/dev/null 2>&1
check "--init: the same --seed gives the same checkpoint, another seed another" $(cmp -s "$tmp/init3b.st" "$tmp/init3c.st" && [ -s "$tmp/init4.st" ] && ! cmp -s "$tmp/init3b.st" "$tmp/init4.st"; echo $?)
out=$("$B/bin/kiln" model inspect "$tmp/init3.st" 2>&1)
check "--init: its checkpoint has the shape asked for" $(grep -q "dim 64, hidden 172, 5 layers, 8 heads (4 kv, head_dim 8), vocab 512, context 512" <<<"$out"; echo $?)

if [ ! -r "$MODEL" ]; then
	check "model fixture $MODEL is not readable: $KILN_FIXTURE_HINT" 1
	tap_done; exit 1
fi
printf 'KILNTOX1garbagegarbagegarbagegarbage' >"$tmp/bad.tok"
out=$("$KT" -m "$MODEL" -d "$tmp/bad.tok" 2>&1); rc=$?
check "a corrupt shard: exit 2 naming file and byte" $([ $rc -eq 2 ] && grep -q "$tmp/bad.tok: byte 0: bad magic" <<<"$out"; echo $?)
out=$("$KT" -m "$MODEL" -d "$tmp/data.tok" --seq 600 2>&1); rc=$?
check "--seq beyond the context: exit 2" $([ $rc -eq 2 ] && grep -q "longer than the model's context (512)" <<<"$out"; echo $?)

args=(-m "$MODEL" -d "$tmp/data.tok" -b 4 --seq 32 --lr 3e-3 --warmup 3 --seed 5)
"$KT" "${args[@]}" --steps 30 -s "$tmp/straight.st" >"$tmp/straight.log" 2>&1; rc=$?
first=$(awk '/^kiln-train: step 1\/30 /{ print $5 }' "$tmp/straight.log")
last=$(awk '/^kiln-train: step 30\/30 /{ print $5 }' "$tmp/straight.log")
diag "fine-tuning loss: step 1 $first, step 30 $last"
check "30 steps: exit 0, the loss halves" $([ $rc -eq 0 ] && [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 2) }'; echo $?)

"$KT" "${args[@]}" --steps 30 --stop-at 12 -s "$tmp/at12.st" >"$tmp/part.log" 2>&1
"$KT" "${args[@]}" --steps 30 -r "$tmp/at12.st" -s "$tmp/resumed.st" >"$tmp/resumed.log" 2>&1; rc=$?
check "resumed at step 12 and ran to 30" $([ $rc -eq 0 ] && grep -q 'resumed .* at step 12 (epoch 0, batch 12)' "$tmp/resumed.log" && grep -q '^kiln-train: step 13/30' "$tmp/resumed.log"; echo $?)
check "the resumed checkpoint is byte-identical to the straight one" $(cmp -s "$tmp/straight.st" "$tmp/resumed.st"; echo $?)

# --model takes what --save wrote (safetensors, through km_file): training
# goes on from the trained weights, so its first loss is already low.
"$KT" -m "$tmp/straight.st" -d "$tmp/data.tok" -b 4 --seq 32 --lr 3e-3 --warmup 3 --seed 5 \
	--steps 3 >"$tmp/from-st.log" 2>&1; rc=$?
again=$(awk '/^kiln-train: step 1\/3 /{ print $5 }' "$tmp/from-st.log")
diag "from the safetensors checkpoint: step 1 loss $again (from llama2.c: $first)"
check "--model FILE.safetensors (a kiln-train checkpoint) trains on from its weights" $([ $rc -eq 0 ] && [ -n "$again" ] && [ -n "$first" ] && awk -v a="$first" -v b="$again" 'BEGIN { exit !(b < a / 2) }'; echo $?)
[ $rc -eq 0 ] || sed 's/^/# /' "$tmp/from-st.log" | tail -5

# Preemption: SIGUSR1 writes a checkpoint and training goes on; SIGTERM
# writes one and stops with status 1; the run resumes from it.
"$KT" "${args[@]}" --steps 100000 -s "$tmp/sig.st" >"$tmp/sig.log" 2>&1 &
pid=$!
waitfor() { for _ in $(seq 1200); do grep -qE "$1" "$tmp/sig.log" && return 0; sleep 0.05; done; return 1; }
waitfor '^kiln-train: step 3/' && kill -USR1 $pid
waitfor 'checkpoint .*sig.st written' && kill -TERM $pid
wait $pid; rc=$?
n=$(sed -nE 's/^kiln-train: stopped by a signal after step ([0-9]+).*/\1/p' "$tmp/sig.log")
saves=$(grep -c 'checkpoint .*sig.st written' "$tmp/sig.log")
diag "signals: status $rc, $saves checkpoints, stopped after step ${n:-?}"
check "SIGUSR1 checkpoints and goes on; SIGTERM checkpoints and exits 1" $([ $rc -eq 1 ] && [ "$saves" -eq 2 ] && [ -n "$n" ] && grep -q "^kiln-train: step $n: checkpoint" "$tmp/sig.log"; echo $?)
out=$("$KT" "${args[@]}" --steps $((${n:-0} + 1)) -r "$tmp/sig.st" 2>&1); rc=$?
check "the run resumes from the SIGTERM checkpoint" $([ $rc -eq 0 ] && grep -q "at step ${n:-x} " <<<"$out" && grep -q "step $((${n:-0} + 1))/" <<<"$out"; echo $?)

if [ ! -x "$KR" ]; then
	skip "kiln-run not built"
else
	timeout 120 "$KR" --standalone --nproc-per-node 2 -- "$KT" -m "$MODEL" -d "$tmp/data.tok" \
		-b 2 --seq 32 --lr 3e-3 --warmup 3 --seed 5 --steps 4 -s "$tmp/dp.st" >"$tmp/dp.log" 2>&1
	rc=$?
	"$KT" "${args[@]}" --steps 4 -s "$tmp/one.st" >"$tmp/one.log" 2>&1
	# Same global batches: rank r of 2 with B 2 takes what one rank with
	# B 4 takes in its r-th half, so the losses agree (sum order aside).
	l2=$(grep -oE 'step 4/4 loss [0-9.]+' "$tmp/dp.log" | awk '{ print $4 }')
	l1=$(grep -oE 'step 4/4 loss [0-9.]+' "$tmp/one.log" | awk '{ print $4 }')
	diag "step 4 loss: 2 ranks x batch 2 $l2, 1 rank x batch 4 $l1"
	check "2 ranks under kiln-run train like one rank with the doubled batch" $([ $rc -eq 0 ] && [ -n "$l2" ] && [ -n "$l1" ] && awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; exit !(d < 1e-3 * a && -d < 1e-3 * a) }'; echo $?)
	[ $rc -eq 0 ] || sed 's/^/# /' "$tmp/dp.log" | tail -20
fi
# kiln-inferd serves the checkpoint kiln-train wrote (safetensors through
# km_file): a greedy completion over HTTP.
KI=$B/bin/kiln-inferd
if [ -x "$KI" ] && command -v curl >/dev/null; then
	"$KI" -m "$tmp/straight.st" --name tuned -p 0 >"$tmp/inferd.log" 2>&1 &
	ipid=$!
	port=
	for _ in $(seq 100); do
		port=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/inferd.log" | head -1 | sed 's/.*://')
		[ -n "$port" ] && break
		sleep 0.1
	done
	body=$(curl -s --max-time 30 "http://127.0.0.1:${port:-1}/v1/completions" \
		-d '{"model":"tuned","prompt":[1],"max_tokens":8,"temperature":0}')
	kill -TERM $ipid 2>/dev/null; wait $ipid 2>/dev/null
	n=$(grep -o '"token_ids":\[[0-9,]*\]' <<<"$body" | grep -o '[0-9]\+' | wc -l)
	check "kiln-inferd serves the trained checkpoint (8 greedy tokens over HTTP)" $([ "$n" -eq 8 ]; echo $?)
	[ "$n" -eq 8 ] || { sed 's/^/# /' "$tmp/inferd.log"; echo "# $body"; }
else
	skip "kiln-inferd or curl missing"
fi
# Two micro-batches of 2 accumulate to one batch of 4 (the same windows).
[ -f "$tmp/one.log" ] || "$KT" "${args[@]}" --steps 4 >"$tmp/one.log" 2>&1
"$KT" "${args[@]}" -b 2 --accum 2 --steps 4 >"$tmp/acc.log" 2>&1; rc=$?
la=$(grep -oE 'step 4/4 loss [0-9.]+' "$tmp/acc.log" | awk '{ print $4 }')
l1=$(grep -oE 'step 4/4 loss [0-9.]+' "$tmp/one.log" | awk '{ print $4 }')
diag "step 4 loss: --accum 2 x batch 2 $la, batch 4 $l1"
check "--accum 2 -b 2 trains like -b 4" $([ $rc -eq 0 ] && [ -n "$la" ] && [ -n "$l1" ] && awk -v a="$l1" -v b="$la" 'BEGIN { d = a - b; exit !(d < 1e-3 * a && -d < 1e-3 * a) }'; echo $?)
tap_done
