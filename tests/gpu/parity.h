/* tests/gpu/parity.h — the harness the cuda parity tests share
 * (test-kk-cuda.c, test-kk-cuda-mem.c): the cpu backend on side 0 and the
 * cuda backend on side 1, each tensor on both sides, random host data, TAP
 * output and the per-dtype tolerances.  The float64 references live in
 * tests/kernels/ref.
 *
 * Define PARITY_SEED (the xorshift state) and PARITY_ZERO (what frand()
 * returns instead of an exact 0) before including it. */
#pragma once

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kk.h"

static kk_backend *be_side[2]; /* 0 cpu, 1 cuda */
static int n_test, n_fail;
static int setup_failed; /* a tensor could not be allocated */

static inline void tap(int ok, const char *fmt, ...)
{
	va_list ap;
	n_test++;
	if (!ok)
		n_fail++;
	printf("%s %d - ", ok ? "ok" : "not ok", n_test);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* Runs `call` once per side with `be` that side's backend; r gets the last
 * error.  S(p) is tensor p on the current side. */
#define BOTH(r, call)                                                           \
	do {                                                                    \
		for (int side = 0; side < 2; side++) {                          \
			kk_backend *be = be_side[side];                         \
			int _r = (call);                                        \
			(void) be;                                              \
			if (_r < 0) {                                           \
				printf("# side %d: %s\n", side, strerror(-_r)); \
				r = _r;                                         \
			}                                                       \
		}                                                               \
	} while (0)
#define S(p) ((p).b[side])

/* ---- random data --------------------------------------------------------- */

static uint64_t rng_state = PARITY_SEED;
static inline float frand(void) /* uniform in [-1, 1), never exactly 0 */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	float f = (float) ((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
	return f == 0.0f ? PARITY_ZERO : f;
}
static inline float *rand_vec(size_t n, float scale)
{
	float *v = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; v && i < n; i++)
		v[i] = frand() * scale;
	return v;
}

/* ---- tensors: the same data on cpu (b[0]) and cuda (b[1]) ---------------- */

/* b[s] is a view of n elements at element offset `off` of the allocation
 * par[s] (off 0: b[s] is the allocation and par[s] is NULL). */
typedef struct pair {
	kk_buffer *par[2], *b[2];
	kk_dtype dt;
	size_t n;
} pair;

/* host: n floats converted to dt (raw int32/int8/int4 bytes for KK_I32,
 * KK_I8, KK_Q4), or NULL to poison (0xFF bytes: NaN in every float dtype). */
static inline pair mk_at(kk_dtype dt, size_t n, size_t off, const void *host)
{
	pair p = { { NULL, NULL }, { NULL, NULL }, dt, n };
	size_t bytes = kk_dtype_size(dt, n);
	void *tmp = malloc(bytes + 1);
	for (int s = 0; s < 2; s++) {
		kk_buffer *all = NULL;
		if (kk_buffer_alloc(be_side[s], dt, n + off, &all) < 0 ||
		    (off && kk_buffer_view(all, off, n, &p.b[s]) < 0)) {
			kk_buffer_free(all);
			setup_failed = 1;
			continue;
		}
		if (off)
			p.par[s] = all;
		else
			p.b[s] = all;
		if (!host) {
			kk_buffer_memset(be_side[s], NULL, all, 0xff, 0, kk_buffer_bytes(all));
			continue;
		}
		if (off)
			kk_buffer_memset(be_side[s], NULL, all, 0xff, 0, kk_buffer_bytes(all));
		if (dt == KK_I32 || dt == KK_I8 || dt == KK_Q4)
			memcpy(tmp, host, bytes);
		else
			kk_convert_host(dt, tmp, KK_F32, host, n);
		kk_buffer_upload(be_side[s], NULL, p.b[s], 0, tmp, bytes);
	}
	free(tmp);
	return p;
}
static inline pair mk(kk_dtype dt, size_t n, const void *host)
{
	return mk_at(dt, n, 0, host);
}
/* Random data in [-scale, scale), at element offset off. */
static inline pair mk_rand(kk_dtype dt, size_t n, size_t off, float scale)
{
	float *h = rand_vec(n, scale);
	pair p = mk_at(dt, n, off, h);
	free(h);
	return p;
}
static inline void fill_bytes(pair *p, int byte)
{
	for (int s = 0; s < 2; s++)
		if (p->b[s])
			kk_buffer_memset(be_side[s], NULL, p->b[s], byte, 0,
					 kk_buffer_bytes(p->b[s]));
}
static inline void poison(pair *p)
{
	fill_bytes(p, 0xff);
}
static inline void fill0(pair *p)
{
	fill_bytes(p, 0);
}
static inline void unpair(pair *p)
{
	for (int s = 0; s < 2; s++) {
		p->b[s] = kk_buffer_free(p->b[s]);
		p->par[s] = kk_buffer_free(p->par[s]);
	}
}
/* Side s downloaded as floats (malloc'ed; NaN where it could not be read). */
static inline float *get(const pair *p, int s)
{
	float *out = calloc(p->n ? p->n : 1, sizeof(float));
	void *tmp = malloc(kk_dtype_size(p->dt, p->n) + 1);
	if (!p->b[s] || kk_backend_sync(be_side[s]) < 0 ||
	    kk_buffer_download(be_side[s], NULL, p->b[s], 0, tmp, kk_dtype_size(p->dt, p->n)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			out[i] = NAN;
	} else if (p->dt == KK_I32) {
		for (size_t i = 0; i < p->n; i++)
			out[i] = (float) ((int32_t *) tmp)[i];
	} else {
		kk_convert_host(KK_F32, out, p->dt, tmp, p->n);
	}
	free(tmp);
	return out;
}

/* ---- tolerances and checks ----------------------------------------------- */

typedef struct tol {
	double atol, rtol;
} tol;
static inline tol tol_of(kk_dtype dt)
{
	switch (dt) {
	case KK_BF16:
		return (tol){ 2e-2, 2e-2 }; /* ~2.5 ulp of an 8-bit mantissa */
	case KK_F16:
		return (tol){ 2e-3, 2e-3 }; /* ~2 ulp of an 11-bit mantissa */
	default:
		return (tol){ 1e-4, 1e-4 }; /* f32, differing summation order */
	}
}
static inline tol tscale(tol t, double f)
{
	return (tol){ t.atol * f, t.rtol * f };
}

/* 1 when got matches want within t everywhere (NaN fails); prints the worst
 * element as a TAP comment otherwise. */
static inline int close_enough(const float *got, const double *want, size_t n, tol t,
			       const char *what)
{
	size_t bad = 0, worst = 0;
	double worst_ex = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double) got[i] - want[i]);
		double lim = t.atol + t.rtol * fabs(want[i]);
		if (!(d <= lim)) {
			double ex = isnan(d) ? INFINITY : d / lim;
			if (!bad || ex > worst_ex) {
				worst_ex = ex;
				worst = i;
			}
			bad++;
		}
	}
	if (bad)
		printf("# %s: %zu of %zu elements off; worst [%zu] got %g want %g\n", what, bad, n,
		       worst, got[worst], want[worst]);
	return bad == 0;
}
/* The cuda side of p vs its cpu side. */
static inline int parity(const pair *p, tol t, const char *what)
{
	float *c = get(p, 0), *g = get(p, 1);
	double *w = malloc(p->n * sizeof(double) + 1);
	for (size_t i = 0; i < p->n; i++)
		w[i] = c[i];
	int ok = close_enough(g, w, p->n, t, what);
	free(c);
	free(g);
	free(w);
	return ok;
}
/* The cuda side of p vs a float64 reference. */
static inline int vs_ref(const pair *p, const double *ref, tol t, const char *what)
{
	float *g = get(p, 1);
	int ok = close_enough(g, ref, p->n, t, what);
	free(g);
	return ok;
}

/* Opens side 0 (cpu) and side 1 (cuda; cpu too with KILN_TEST_SELF=1,
 * which checks the references and tolerances of a test on a machine
 * without a GPU, the parity half then being trivially true).  Returns 1 to
 * run the tests; otherwise the TAP has been printed and the return value is
 * the exit status minus one (-1: no cpu backend, exit 1; 0: no usable cuda
 * device, every one of n_tests skipped, exit 0). */
static inline int parity_open(int n_tests)
{
	const char *self = getenv("KILN_TEST_SELF");
	int r = kk_backend_open("cpu", &be_side[0]);
	if (r < 0) {
		printf("1..1\nnot ok 1 - cpu backend: %s\n", strerror(-r));
		return -1;
	}
	unsetenv("KILN_BACKEND");
	char why[KK_WHY_MAX];
	r = kk_backend_open_why(self && strcmp(self, "1") == 0 ? "cpu" : "cuda", &be_side[1], why,
				sizeof(why));
	if (r < 0) {
		printf("1..%d\n", n_tests);
		for (int i = 1; i <= n_tests; i++)
			printf("ok %d # SKIP no CUDA device (%s)\n", i,
			       why[0] ? why : strerror(-r));
		kk_backend_free(be_side[0]);
		return 0;
	}
	return 1;
}

/* After the tests: a failed allocation as one more failure, the plan, both
 * sides closed.  Returns the exit status (1 when a test failed). */
static inline int parity_close(void)
{
	if (setup_failed)
		tap(0, "every test buffer could be allocated");
	printf("1..%d\n", n_test);
	kk_backend_free(be_side[1]);
	kk_backend_free(be_side[0]);
	return n_fail ? 1 : 0;
}
