/* kernels/kk/kk_module.c — the loader of the CUDA module (kk-cuda.so).
 *
 * The cuda backend is a shared object of its own so that libkk.a, and every
 * program linking it, runs on a node without the CUDA runtime: only the
 * module links libcudart, libcublasLt and libnccl, and it is dlopen()ed the
 * first time "cuda" or "auto" is asked for.  Where it is looked for, in
 * order (the first file that exists is the one used):
 *   1. $KILN_KK_CUDA, an explicit path (only that one when set);
 *   2. ../lib/kiln/kk-cuda.so next to the running binary (the build tree:
 *      build/bin and build/tests find build/lib/kiln; an install: PREFIX/bin
 *      finds PREFIX/lib/kiln);
 *   3. KK_CUDA_MODULE_DIR/kk-cuda.so, the install dir the build was
 *      configured with ($(PREFIX)/lib/kiln).
 * The module's one symbol, KK_MODULE_SYMBOL, is a struct kk_module; its ABI
 * (kiln version, the text of every vtable slot, the struct sizes) must equal
 * this build's, and the driver must support the CUDA version it was built
 * for, before anything in it is called.  Every refusal says what is missing
 * and what to do, in the caller's buffer: library code never logs.
 *
 * A binary that links the cuda objects itself (the CPU emulation of CUDA,
 * tests/gpu/emu/) defines KK_MODULE_SYMBOL, which this file refers
 * to weakly: it is then used as is, nothing is loaded. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kk_internal.h"

#ifndef KK_CUDA_MODULE_DIR
#define KK_CUDA_MODULE_DIR "/usr/local/lib/kiln"
#endif
#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

extern const struct kk_module KK_MODULE_SYMBOL __attribute__((weak));

/* This build's side of the ABI. */
#define KK_OP	KK_MODULE_SLOT_OP
#define KK_SLOT KK_MODULE_SLOT_FN
static const char kk_slots[] = ""
#include "kk_ops.def"
	;
static const size_t kk_sizes[KK_MODULE_NSIZES] = KK_MODULE_SIZES;

/* The outcome of the one load, kept for the life of the process (the module
 * is never unloaded: CUDA's libraries do not survive dlclose well). */
static struct {
	pthread_once_t once;
	int r;
	const struct kk_module *mod;
	char why[KK_MODULE_MSG_MAX];
} loaded = { .once = PTHREAD_ONCE_INIT };

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;
	if (!why || len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

/* The driver release that first supports CUDA major.0 (NVIDIA's CUDA
 * release notes, Linux x86_64), for the "install driver >= N" advice. */
static const char *min_driver(int needed)
{
	static const struct {
		int cuda;
		const char *driver;
	} table[] = {
		{ 11000, "450.36.06" },
		{ 12000, "525.60.13" },
		{ 13000, "580.65.06" },
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (table[i].cuda == needed)
			return table[i].driver;
	return NULL;
}

int kk__cuda_driver_check(int driver, int needed, char *why, size_t len)
{
	const char *d = min_driver(needed);
	char need[64];

	if (needed <= 0 || driver >= needed)
		return 0;
	if (d)
		snprintf(need, sizeof(need), "driver >= %s", d);
	else
		snprintf(need, sizeof(need), "a driver for CUDA %d.%d or newer", needed / 1000,
			 needed % 1000 / 10);
	if (driver <= 0)
		say(why, len,
		    "no NVIDIA driver: the CUDA runtime found no libcuda.so.1; install the NVIDIA "
		    "%s (kiln's CUDA module needs CUDA %d.%d)",
		    need, needed / 1000, needed % 1000 / 10);
	else
		say(why, len,
		    "the NVIDIA driver supports CUDA %d.%d, kiln's CUDA module needs %d.%d: "
		    "install %s",
		    driver / 1000, driver % 1000 / 10, needed / 1000, needed % 1000 / 10, need);
	return -ENODEV;
}

/* The candidate files, in lookup order; returns how many. */
static int candidates(char paths[2][PATH_MAX])
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int k = 0;

	if (n > 0) {
		char *s;
		int up = 0;
		exe[n] = '\0';
		/* /x/bin/prog -> /x */
		for (; up < 2 && (s = strrchr(exe, '/')); up++)
			*s = '\0';
		if (up == 2 && (size_t) snprintf(paths[k], PATH_MAX, "%s/lib/kiln/%s", exe,
						 KK_MODULE_FILE) < PATH_MAX)
			k++;
	}
	snprintf(paths[k], PATH_MAX, "%s/%s", KK_CUDA_MODULE_DIR, KK_MODULE_FILE);
	if (k == 0 || strcmp(paths[0], paths[k]) != 0)
		k++;
	return k;
}

/* 0 when mod is of this build, else -ELIBBAD and why. */
static int check_abi(const struct kk_module *mod, const char *path)
{
	char *why = loaded.why;
	size_t len = sizeof(loaded.why);

	if (mod->abi != KK_MODULE_ABI) {
		say(why, len, "%s has module ABI %u, this program needs %u: %s", path, mod->abi,
		    KK_MODULE_ABI, "install the kiln-cuda package of the same kiln version");
		return -ELIBBAD;
	}
	if (!mod->kiln_version || strcmp(mod->kiln_version, KILN_VERSION) != 0) {
		say(why, len,
		    "%s is the CUDA module of kiln %s, this program is kiln %s: install the "
		    "kiln-cuda package of kiln %s (or rebuild both from one tree)",
		    path, mod->kiln_version ? mod->kiln_version : "(none)", KILN_VERSION,
		    KILN_VERSION);
		return -ELIBBAD;
	}
	if (!mod->slots || strcmp(mod->slots, kk_slots) != 0 ||
	    memcmp(mod->sizes, kk_sizes, sizeof(kk_sizes)) != 0 || !mod->ops || !mod->probe ||
	    !mod->driver_version) {
		say(why, len,
		    "%s was built from other kk headers than this program (its op table or "
		    "structs differ): rebuild both from one tree, or install the matching "
		    "kiln-cuda package",
		    path);
		return -ELIBBAD;
	}
	return 0;
}

static int load_module(void)
{
	char paths[2][PATH_MAX], *why = loaded.why;
	size_t len = sizeof(loaded.why);
	const char *env = getenv("KILN_KK_CUDA"), *path = NULL;
	const struct kk_module *mod;
	void *h;
	int n, r;

	if (&KK_MODULE_SYMBOL) { /* linked in: the emulator */
		loaded.mod = &KK_MODULE_SYMBOL;
		return 0;
	}
	if (env && *env) {
		if (access(env, F_OK) < 0) {
			say(why, len,
			    "the CUDA module %s (KILN_KK_CUDA) does not exist: point KILN_KK_CUDA "
			    "at kk-cuda.so, or unset it to use the installed one",
			    env);
			return -EOPNOTSUPP;
		}
		path = env;
	} else {
		n = candidates(paths);
		for (int i = 0; i < n && !path; i++)
			if (access(paths[i], F_OK) == 0)
				path = paths[i];
		if (!path) {
			say(why, len,
			    "the CUDA module is not installed (no %s%s%s): install the kiln-cuda "
			    "package, or set KILN_KK_CUDA to the path of kk-cuda.so",
			    paths[0], n > 1 ? " nor " : "", n > 1 ? paths[1] : "");
			return -EOPNOTSUPP;
		}
	}
	/* RTLD_LOCAL: the module's CUDA symbols stay its own. */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		say(why, len,
		    "cannot load the CUDA module %s: %s; it needs CUDA's libcudart, libcublasLt "
		    "and libnccl: install them, or add their directory to LD_LIBRARY_PATH",
		    path, e ? e : "unknown error");
		return -ELIBACC;
	}
	mod = dlsym(h, KK_MODULE_SYMBOL_NAME);
	if (!mod) {
		say(why, len,
		    "%s is not a kiln CUDA module of ABI %d (no symbol %s): install the "
		    "kiln-cuda package of kiln %s",
		    path, KK_MODULE_ABI, KK_MODULE_SYMBOL_NAME, KILN_VERSION);
		dlclose(h);
		return -ELIBBAD;
	}
	r = check_abi(mod, path);
	if (r < 0) {
		dlclose(h);
		return r;
	}
	r = kk__cuda_driver_check(mod->driver_version(), mod->cuda_needed, why, len);
	if (r < 0)
		return r; /* kept loaded: libcudart may not unload cleanly */
	loaded.mod = mod;
	return 0;
}

static void load_once(void)
{
	loaded.r = load_module();
}

int kk__cuda_ops(const struct kk_backend_ops **ret, char *why, size_t len)
{
	const struct kk_backend_ops *ops;
	int r;

	assert_return(ret, -EINVAL);
	pthread_once(&loaded.once, load_once);
	if (loaded.r < 0) {
		say(why, len, "%s", loaded.why);
		return loaded.r;
	}
	r = loaded.mod->probe(why, len);
	if (r < 0)
		return r;
	ops = loaded.mod->ops();
	if (!ops) {
		say(why, len, "the CUDA module returned no backend");
		return -ELIBBAD;
	}
	*ret = ops;
	return 0;
}
