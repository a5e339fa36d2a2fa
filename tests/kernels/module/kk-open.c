/* tests/kernels/module/kk-open.c — opens a kk backend the way the programs
 * do (kk_backend_open_why) and says what happened, for
 * tests/kernels/test-kk-module.sh:
 *     kk-open [NAME]     NAME: cpu, cuda, auto (default auto)
 * Prints "opened BACKEND" and, when there is one, "why: MESSAGE"; exits 0
 * when a backend opened, 1 with "error: ERRNO-NAME: MESSAGE" when not. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kk.h"

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "auto";
	char why[KK_WHY_MAX];
	kk_backend *be = NULL;
	int r = kk_backend_open_why(name, &be, why, sizeof(why));

	if (r < 0) {
		printf("error: %s: %s\n", strerrorname_np(-r), why);
		return 1;
	}
	printf("opened %s\n", kk_backend_name(be));
	if (why[0])
		printf("why: %s\n", why);
	kk_backend_free(be);
	return 0;
}
