/* tests/kernels/module/fake-kk-cuda.c — a stand-in for kk-cuda.so, so that
 * test-kk-module.sh can play every answer of a module without CUDA or a
 * GPU.  It exports the module symbol with this build's ABI, unless built
 * with -DFAKE_VERSION="x" (another kiln version) or -DFAKE_SLOTS (another op
 * table); at run time
 *   KK_FAKE_DRIVER=N   what cudaDriverGetVersion() says (default 13000)
 *   KK_FAKE_NODEV=1    the probe finds no device
 * Its backend is named "cuda" and has no op slots (opening it is all the
 * test does). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../../kernels/kk/kk_internal.h"

#ifndef FAKE_VERSION
#define FAKE_VERSION KILN_VERSION
#endif

#ifdef FAKE_SLOTS
static const char slots[] = "cast(kk_backend *be);";
#else
#define KK_OP	KK_MODULE_SLOT_OP
#define KK_SLOT KK_MODULE_SLOT_FN
static const char slots[] = ""
#include "kk_ops.def"
	;
#endif

static int fake_driver(void)
{
	const char *e = getenv("KK_FAKE_DRIVER");
	return e ? atoi(e) : 13000;
}

static int fake_probe(char *msg, size_t len)
{
	const char *e = getenv("KK_FAKE_NODEV");
	if (e && *e == '1') {
		snprintf(msg, len, "no CUDA device: the driver reports 0 GPUs; check nvidia-smi");
		return -ENODEV;
	}
	return 0;
}

static const struct kk_backend_ops fake_ops = { .name = "cuda" };

static const struct kk_backend_ops *fake_get_ops(void)
{
	return &fake_ops;
}

const struct kk_module KK_MODULE_SYMBOL = {
	.abi = KK_MODULE_ABI,
	.kiln_version = FAKE_VERSION,
	.slots = slots,
	.sizes = KK_MODULE_SIZES,
	.cuda_version = 13000,
	.cuda_needed = 13000,
	.driver_version = fake_driver,
	.probe = fake_probe,
	.ops = fake_get_ops,
};
