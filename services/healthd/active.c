/* active.c — active GPU checks: a GEMM burn checked against a reference,
 * device memory bandwidth, a pattern memtest.
 *
 * They run on the shared kernel library's CUDA backend.  On a machine
 * without a usable GPU, or in a build without the kernel library, every
 * check reports "skipped" with the reason, never "passed". */
#include <stdio.h>
#include <string.h>

#include "healthd.h"

int hd_active_run(const hd_settings *s, int gpu, const char *model, hd_active_result out[HD_ACTIVE_CHECKS])
{
	static const char *const names[HD_ACTIVE_CHECKS] = { "gemm", "bandwidth", "memtest" };
	for (int i = 0; i < HD_ACTIVE_CHECKS; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].name = names[i];
		out[i].status = "skipped";
		snprintf(out[i].detail, sizeof(out[i].detail), "%s",
			 gpu < 0 ? "no GPU present" : "this build has no CUDA kernel library");
	}
	return 0;
}
