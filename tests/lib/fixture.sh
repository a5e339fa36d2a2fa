# fixture.sh — the shell side of tests/lib/fixture.h (source it): where the
# suites find the model fixture, tiny260K.bin, the llama2.c checkpoint the
# build trains itself (tests/fixtures/build.mk).  $KM_TEST_MODEL when set
# (make test, bench and demo export it), else $KILN_BUILD/fixtures/ (build/
# by default; relative to the repository root).  Nothing outside the tree.
#
# The project makes the file, so a suite that needs it fails when it is
# missing; it never skips for it.
#   kiln_fixture_path        prints the path the fixture should be at
#   kiln_need_fixture        MODEL=that path; when it is not readable, a
#                            failing TAP plan naming it and exit 1
KILN_FIXTURE_HINT="make test builds it (make fixture builds only it), or set KM_TEST_MODEL to a llama2.c checkpoint of that shape"
kiln_fixture_path() { echo "${KM_TEST_MODEL:-${KILN_BUILD:-build}/fixtures/tiny260K.bin}"; }
kiln_need_fixture() {
	MODEL=$(kiln_fixture_path)
	[ -r "$MODEL" ] && return 0
	echo "1..1"
	echo "not ok 1 - model fixture $MODEL is not readable: $KILN_FIXTURE_HINT"
	exit 1
}
