/* active-main.c — kiln-healthd-active: the active GPU checks of kiln-healthd.
 *
 * A separate program, run by kiln-healthd (and `kiln-healthd --active`) once
 * per GPU with CUDA_VISIBLE_DEVICES naming that GPU, because:
 *  - a GPU that faults mid-check can take its CUDA context, or the process,
 *    down with it: the daemon must survive that (and kill a hung check);
 *  - the daemon itself then needs no CUDA libraries to start on a node
 *    whose driver is broken, which is when it matters most.
 *
 * Checks, on the shared kernel library's CUDA backend:
 *  gemm       BF16 GEMM burn (8192^3, f32 accumulate) for --gemm-seconds;
 *             sampled outputs are checked against a float64 host reference
 *             and the last result must equal the first bit for bit (silent
 *             data corruption shows up as either); reports TFLOP/s.
 *  bandwidth  device-to-device copies of 1 GiB; GB/s counts read + write.
 *  memtest    fills --memtest-bytes of device memory with 0x00, 0xff, 0x55,
 *             0xaa and reads every byte back.
 * Figures are compared with the expected ones for the GPU model (table
 * below).  Without a usable CUDA device every check is "skipped".
 *
 * Output: one line per check, tab separated:
 *   NAME STATUS VALUE EXPECTED DETAIL      (STATUS passed|failed|skipped)
 * Exit 0 when nothing failed, 1 when a check failed, 2 on a usage error.
 * Options: -m/--model NAME, -g/--gemm-seconds N, --memtest-bytes SIZE. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kk.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/prog.h"

#define GEMM_N 8192
/* Sampled outputs checked against the float64 reference. */
#define GEMM_SAMPLES  512
#define BW_BYTES      (1ULL << 30)
#define BW_ITERS      20
#define MEMTEST_CHUNK (64ULL << 20)
/* Pass when a measured figure reaches this share of the model's spec:
 * cuBLASLt reaches ~70% of dense BF16 peak on 8192^3, a copy kernel ~85%
 * of HBM bandwidth (read + write), so these leave margin for clocks. */
#define GEMM_MIN_SHARE 0.45
#define BW_MIN_SHARE   0.65

static const struct expected {
	const char *match; /* substring of the NVML model name */
	double tflops;	   /* dense BF16 tensor peak */
	double gbps;	   /* memory bandwidth spec */
} expected[] = {
	{ "GH200", 989, 4000 },	    { "H200", 989, 4800 },  { "H100 NVL", 835, 3900 },
	{ "H100 PCIe", 756, 2000 }, { "H100", 989, 3350 },  { "H800", 989, 3350 },
	{ "B200", 2250, 8000 },	    { "B100", 1750, 8000 }, { "A100-SXM4-80GB", 312, 2039 },
	{ "A100 80GB", 312, 1935 }, { "A100", 312, 1555 },  { "L40S", 362, 864 },
	{ "L40", 181, 864 },	    { "A10", 125, 600 },    { "L4", 121, 300 },
};

static const struct expected *lookup(const char *model)
{
	for (size_t i = 0; model && i < ARRAY_SIZE(expected); i++)
		if (strstr(model, expected[i].match))
			return &expected[i];
	return NULL;
}

static void result(const char *name, const char *status, double value, double exp, const char *fmt,
		   ...) _printf_(5, 6);
static void result(const char *name, const char *status, double value, double exp, const char *fmt,
		   ...)
{
	char detail[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	printf("%s\t%s\t%.2f\t%.0f\t%s\n", name, status, value, exp, detail);
	fflush(stdout);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static float frand(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (float) ((rng >> 40) / (double) (1ULL << 24)) * 2.0f - 1.0f;
}

static int check_gemm(kk_backend *be, int seconds, const struct expected *e, bool *failed)
{
	const size_t n = GEMM_N, nn = n * n;
	_cleanup_free_ uint16_t *a = malloc(nn * 2);
	_cleanup_free_ uint16_t *b = malloc(nn * 2);
	_cleanup_free_ float *c0 = malloc(nn * 4);
	_cleanup_free_ float *c1 = malloc(nn * 4);
	kk_buffer *da = NULL, *db = NULL, *dc = NULL;
	int r = -ENOMEM;
	if (!a || !b || !c0 || !c1)
		goto out;
	for (size_t i = 0; i < nn; i++)
		a[i] = kk_f32_to_bf16(frand()), b[i] = kk_f32_to_bf16(frand());
	if ((r = kk_buffer_alloc(be, KK_BF16, nn, &da)) < 0 ||
	    (r = kk_buffer_alloc(be, KK_BF16, nn, &db)) < 0 ||
	    (r = kk_buffer_alloc(be, KK_F32, nn, &dc)) < 0 ||
	    (r = kk_buffer_upload(be, NULL, da, 0, a, nn * 2)) < 0 ||
	    (r = kk_buffer_upload(be, NULL, db, 0, b, nn * 2)) < 0)
		goto out;
	kk_gemm_desc d = { .m = (int64_t) n,
			   .n = (int64_t) n,
			   .k = (int64_t) n,
			   .alpha = 1.0f,
			   .beta = 0.0f,
			   .a = da,
			   .lda = (int64_t) n,
			   .b = db,
			   .ldb = (int64_t) n,
			   .c = dc,
			   .ldc = (int64_t) n };
	if ((r = kk_gemm(be, NULL, &d)) < 0 || (r = kk_backend_sync(be)) < 0 ||
	    (r = kk_buffer_download(be, NULL, dc, 0, c0, nn * 4)) < 0)
		goto out;
	uint64_t t0 = kiln_now_usec(), budget = (uint64_t) seconds * KILN_USEC_PER_SEC;
	long iters = 0;
	while (kiln_now_usec() - t0 < budget) {
		for (int k = 0; k < 10; k++)
			if ((r = kk_gemm(be, NULL, &d)) < 0)
				goto out;
		if ((r = kk_backend_sync(be)) < 0)
			goto out;
		iters += 10;
	}
	double secs = (kiln_now_usec() - t0) / 1e6;
	if ((r = kk_buffer_download(be, NULL, dc, 0, c1, nn * 4)) < 0)
		goto out;
	double tflops = 2.0 * n * n * n * iters / secs / 1e12;
	/* float64 reference on sampled entries; tolerance for bf16 inputs with
	 * f32 accumulation: relative to sum |a||b| */
	int bad = 0;
	double worst = 0;
	for (int s = 0; s < GEMM_SAMPLES; s++) {
		frand();
		size_t i = (size_t) (rng % n);
		frand();
		size_t j = (size_t) (rng % n);
		double ref = 0, mag = 0;
		for (size_t k = 0; k < n; k++) {
			double x = kk_bf16_to_f32(a[i * n + k]), y = kk_bf16_to_f32(b[k * n + j]);
			ref += x * y, mag += fabs(x * y);
		}
		double err = fabs(c0[i * n + j] - ref) / (mag + 1e-30);
		worst = MAX(worst, err);
		bad += err > 1e-3;
	}
	size_t differ = 0;
	for (size_t i = 0; i < nn; i++)
		differ += memcmp(&c0[i], &c1[i], 4) != 0;
	double exp = e ? e->tflops : 0;
	if (bad || differ) {
		*failed = true;
		result("gemm", "failed", tflops, exp,
		       "silent data corruption: %d of %d sampled outputs off the float64 reference "
		       "(worst rel %.2g), "
		       "%zu outputs changed between identical runs",
		       bad, GEMM_SAMPLES, worst, differ);
	} else if (e && tflops < GEMM_MIN_SHARE * exp) {
		*failed = true;
		result("gemm", "failed", tflops, exp,
		       "%.0f TFLOP/s is below %.0f%% of the %s's %.0f", tflops,
		       GEMM_MIN_SHARE * 100, e->match, exp);
	} else
		result("gemm", "passed", tflops, exp,
		       "%ld GEMMs of %zu^3 in %.1fs, results exact and repeatable (worst rel err "
		       "%.1g)",
		       iters, n, secs, worst);
	r = 0;
out:
	kk_buffer_free(da);
	kk_buffer_free(db);
	kk_buffer_free(dc);
	return r;
}

static int check_bandwidth(kk_backend *be, const struct expected *e, bool *failed)
{
	kk_buffer *src = NULL, *dst = NULL;
	int r;
	if ((r = kk_buffer_alloc(be, KK_F32, BW_BYTES / 4, &src)) < 0 ||
	    (r = kk_buffer_alloc(be, KK_F32, BW_BYTES / 4, &dst)) < 0 ||
	    (r = kk_buffer_memset(be, NULL, src, 0x3c, 0, BW_BYTES)) < 0 ||
	    (r = kk_buffer_copy(be, NULL, dst, 0, src, 0, BW_BYTES)) < 0 ||
	    (r = kk_backend_sync(be)) < 0)
		goto out;
	uint64_t t0 = kiln_now_usec();
	for (int i = 0; i < BW_ITERS; i++)
		if ((r = kk_buffer_copy(be, NULL, i % 2 ? src : dst, 0, i % 2 ? dst : src, 0,
					BW_BYTES)) < 0)
			goto out;
	if ((r = kk_backend_sync(be)) < 0)
		goto out;
	double gbps = 2.0 * BW_BYTES * BW_ITERS / ((kiln_now_usec() - t0) / 1e6) / 1e9;
	double exp = e ? e->gbps : 0;
	if (e && gbps < BW_MIN_SHARE * exp) {
		*failed = true;
		result("bandwidth", "failed", gbps, exp,
		       "%.0f GB/s is below %.0f%% of the %s's %.0f GB/s", gbps, BW_MIN_SHARE * 100,
		       e->match, exp);
	} else
		result("bandwidth", "passed", gbps, exp,
		       "%d device copies of 1 GiB (read + write counted)", BW_ITERS);
out:
	kk_buffer_free(src);
	kk_buffer_free(dst);
	return r;
}

static int check_memtest(kk_backend *be, uint64_t bytes, bool *failed)
{
	bytes = bytes / MEMTEST_CHUNK * MEMTEST_CHUNK;
	if (bytes == 0)
		bytes = MEMTEST_CHUNK;
	kk_buffer *m = NULL;
	uint8_t *host = malloc(MEMTEST_CHUNK);
	uint8_t *want = malloc(MEMTEST_CHUNK);
	int r = -ENOMEM;
	if (!host || !want || (r = kk_buffer_alloc(be, KK_I8, bytes, &m)) < 0)
		goto out;
	static const int patterns[] = { 0x00, 0xff, 0x55, 0xaa };
	uint64_t bad = 0, t0 = kiln_now_usec();
	for (size_t p = 0; p < ARRAY_SIZE(patterns); p++) {
		if ((r = kk_buffer_memset(be, NULL, m, patterns[p], 0, bytes)) < 0)
			goto out;
		memset(want, patterns[p], MEMTEST_CHUNK);
		for (uint64_t off = 0; off < bytes; off += MEMTEST_CHUNK) {
			if ((r = kk_buffer_download(be, NULL, m, off, host, MEMTEST_CHUNK)) < 0)
				goto out;
			if (memcmp(host, want, MEMTEST_CHUNK) != 0)
				for (size_t i = 0; i < MEMTEST_CHUNK; i++)
					bad += host[i] != want[i];
		}
	}
	double gib = bytes / (double) (1ULL << 30);
	if (bad) {
		*failed = true;
		result("memtest", "failed", gib, 0, "%llu bytes read back wrong over %.1f GiB",
		       (unsigned long long) bad, gib);
	} else
		result("memtest", "passed", gib, 0,
		       "%.1f GiB x 4 patterns in %.1fs, every byte read back", gib,
		       (kiln_now_usec() - t0) / 1e6);
out:
	kk_buffer_free(m);
	free(host);
	free(want);
	return r;
}

static const char *arg_model;
static int arg_gemm_seconds = 10;
static uint64_t arg_memtest_bytes = 1ULL << 30;

enum {
	OPT_MEMTEST_BYTES = KILN_OPT_FIRST,
};

static const kiln_option options[] = {
	{ "model", 'm', "NAME", "the GPU model as NVML names it (for the expected figures)", NULL,
	  .str = &arg_model },
	{ "gemm-seconds", 'g', "N", "how long the GEMM burn runs (1..3600, default 10)", NULL },
	{ "memtest-bytes", OPT_MEMTEST_BYTES, "SIZE",
	  "device memory the memtest covers (default 1G)", NULL },
	KILN_OPTIONS_COMMON,
	{},
};

static int parse_option(int key, const char *arg);

static const kiln_prog prog = {
	.name = "kiln-healthd-active",
	.summary = "the active GPU checks of kiln-healthd (GEMM, bandwidth, memtest)",
	.usage = "kiln-healthd-active [--model NAME] [--gemm-seconds N] [--memtest-bytes SIZE]",
	.options = options,
	.option = parse_option,
	.no_args = true,
	.epilog = "Run by kiln-healthd with CUDA_VISIBLE_DEVICES set to one GPU.  Prints one\n"
		  "line per check: NAME STATUS VALUE EXPECTED DETAIL (tab separated).\n"
		  "Exit status: 0 nothing failed, 1 a check failed, 2 usage error.\n",
};

static int parse_option(int key, const char *arg)
{
	switch (key) {
	case 'g':
		if (kiln_parse_int(arg, 1, 3600, &arg_gemm_seconds) < 0)
			return kiln_usage_error(&prog, "--gemm-seconds wants 1..3600, not '%s'.",
						arg);
		return 0;
	case OPT_MEMTEST_BYTES:
		if (kiln_parse_size(arg, 1, &arg_memtest_bytes) < 0)
			return kiln_usage_error(&prog, "--memtest-bytes wants a size, not '%s'.",
						arg);
		return 0;
	default:
		return 1;
	}
}

static int parse_argv(int argc, char **argv)
{
	return kiln_parse_options(&prog, argc, argv);
}

static int run(int argc, char **argv)
{
	const char *model = arg_model;
	int seconds = arg_gemm_seconds;
	uint64_t mbytes = arg_memtest_bytes;
	const struct expected *e = lookup(model);
	kk_backend *be = NULL;
	char why[KK_WHY_MAX];
	int r = kk_backend_open_why("cuda", &be, why, sizeof(why));
	if (r < 0) {
		if (!why[0])
			snprintf(why, sizeof(why), "CUDA initialisation failed: %s", strerror(-r));
		result("gemm", "skipped", 0, e ? e->tflops : 0, "%s", why);
		result("bandwidth", "skipped", 0, e ? e->gbps : 0, "%s", why);
		result("memtest", "skipped", 0, 0, "%s", why);
		return KILN_EXIT_OK;
	}
	bool failed = false;
	if ((r = check_gemm(be, seconds, e, &failed)) < 0) {
		failed = true;
		result("gemm", "failed", 0, e ? e->tflops : 0, "the GEMM check could not run: %s",
		       strerror(-r));
	}
	if ((r = check_bandwidth(be, e, &failed)) < 0) {
		failed = true;
		result("bandwidth", "failed", 0, e ? e->gbps : 0,
		       "the bandwidth check could not run: %s", strerror(-r));
	}
	if ((r = check_memtest(be, mbytes, &failed)) < 0) {
		failed = true;
		result("memtest", "failed", 0, 0, "the memtest could not run: %s", strerror(-r));
	}
	kk_backend_free(be);
	return failed ? KILN_EXIT_FAILURE : KILN_EXIT_OK;
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
