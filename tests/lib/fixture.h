/* tests/lib/fixture.h — where the C tests and benchmarks find the model
 * fixture, tiny260K.bin: the llama2.c checkpoint the build trains itself
 * (tests/fixtures/build.mk).  $KM_TEST_MODEL when set (make test, bench
 * and demo export it), else $KILN_BUILD/fixtures/tiny260K.bin (build/ by
 * default), run from the repository root.  Nothing outside the tree.
 *
 * The project makes this file, so a suite that needs it FAILS when it is
 * missing (KILN_NEED_FIXTURE) instead of skipping: a skip would hide a
 * broken fixture rule. */
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define KILN_TEST_FIXTURE "tiny260K.bin"
#define KILN_TEST_FIXTURE_HINT                                                     \
	"make test builds it (make fixture builds only it), or set KM_TEST_MODEL " \
	"to a llama2.c checkpoint of that shape"

/* The path the fixture should be at (never NULL). */
static inline const char *kiln_test_model_path(void)
{
	static char buf[4096];
	const char *env = getenv("KM_TEST_MODEL");
	const char *b = getenv("KILN_BUILD");

	if (env && *env)
		return env;
	snprintf(buf, sizeof(buf), "%s/fixtures/" KILN_TEST_FIXTURE, b && *b ? b : "build");
	return buf;
}

/* The path when the file is readable, else NULL. */
static inline const char *kiln_test_model_fixture(void)
{
	const char *p = kiln_test_model_path();
	return access(p, R_OK) == 0 ? p : NULL;
}

/* cmocka: fails the running test, naming the file and what to do, unless
 * `have` (the fixture, or what the group setup loaded from it). */
#define KILN_NEED_FIXTURE(have)                                                               \
	do {                                                                                  \
		if (!(have))                                                                  \
			fail_msg("model fixture %s is not readable: " KILN_TEST_FIXTURE_HINT, \
				 kiln_test_model_path());                                     \
	} while (0)
