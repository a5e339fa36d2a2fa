# inferd-env.sh — what the kiln-inferd shell suites share (source it after
# tests/lib/tap.sh): B, BIN, MODEL (stories260K.bin, or $KM_TEST_MODEL);
# prints a SKIP plan and exits when the binary or the model is missing.
B=${KILN_BUILD:-build}
BIN=$B/bin/kiln-inferd
MODEL=${KM_TEST_MODEL:-}
for c in tests/fixtures/stories260K.bin ../shared/fixtures/stories260K.bin; do
	[ -z "$MODEL" ] && [ -r "$c" ] && MODEL=$c
done
if [ ! -x "$BIN" ]; then echo "1..1"; echo "ok 1 # SKIP $BIN not built"; exit 0; fi
if [ -z "$MODEL" ]; then echo "1..1"; echo "ok 1 # SKIP stories260K.bin not found (set KM_TEST_MODEL)"; exit 0; fi
