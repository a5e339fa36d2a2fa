/* tests/lib/fixture.h — where the C tests and benchmarks find the
 * stories260K model fixture: $KM_TEST_MODEL when set, else the places a
 * checkout has it (tests/fixtures/ in the tree, ../shared/fixtures/ beside
 * it, as CI lays them out), run from the repository root.  NULL when none
 * is readable: the caller skips with the reason. */
#pragma once

#include <stdlib.h>
#include <unistd.h>

static inline const char *kiln_test_model_fixture(void)
{
	static const char *const where[] = { "tests/fixtures/stories260K.bin",
					     "../shared/fixtures/stories260K.bin",
					     "../../shared/fixtures/stories260K.bin" };
	const char *env = getenv("KM_TEST_MODEL");

	if (env && *env)
		return env;
	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++)
		if (access(where[i], R_OK) == 0)
			return where[i];
	return NULL;
}
