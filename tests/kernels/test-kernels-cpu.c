/* tests/kernels/test-kernels-cpu.c — the kk op suite on the cpu backend
 * (kernels-suite.h has the tests and their tolerances), then what only the
 * cpu backend has: its thread count (kk_backend_set_threads, the affinity
 * mask and cgroup quota default) and its thread pool (results independent
 * of the thread count, several callers at once). */
#define KK_TEST_BACKEND "cpu"
#include "kernels-suite.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

/* The cpu backend's internals (in libkk.a): the cgroup quota reader, the
 * int8 dot product variants, kk__half_* (half.c) and the inline element
 * conversions kk__h2f ... */
#include "../../kernels/kk/cpu/cpu.h"

static void test_threads_option(void **state)
{
	cpu_set_t old, one;
	char *env = getenv("KK_CPU_THREADS") ? strdup(getenv("KK_CPU_THREADS")) : NULL;

	assert_int_equal(kk_backend_set_threads(be, -1), -EINVAL);
	assert_int_equal(kk_backend_set_threads(be, KK_THREADS_MAX + 1), -EINVAL);
	assert_int_equal(kk_backend_set_threads(NULL, 1), -EINVAL);
	assert_int_equal(kk_backend_threads(NULL), -EINVAL);
	assert_int_equal(kk_backend_set_threads(be, 3), 0);
	assert_int_equal(kk_backend_threads(be), 3);

	/* The default: KK_CPU_THREADS, else the affinity mask. */
	setenv("KK_CPU_THREADS", "5", 1);
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
	assert_int_equal(kk_backend_threads(be), 5);
	setenv("KK_CPU_THREADS", "lots", 1); /* not a count: ignored */
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
	unsetenv("KK_CPU_THREADS");
	assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &old)) {
			CPU_SET(c, &one);
			break;
		}
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
	assert_int_equal(kk_backend_threads(be), 1);
	assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
	int q = kk__cpu_cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup");
	assert_int_equal(kk_backend_threads(be), MIN(CPU_COUNT(&old), q > 0 ? q : CPU_COUNT(&old)));
	if (env)
		setenv("KK_CPU_THREADS", env, 1);
	free(env);
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* cpu.max of a fake cgroup tree: the tightest quota of the group and its
 * ancestors, rounded up; "max" and v1-only files mean no quota. */
static void test_cgroup_quota(void **state)
{
	char dir[] = "/tmp/kk-cgroup-XXXXXX", p[256], pc[256];
	assert_non_null(mkdtemp(dir));
	snprintf(pc, sizeof(pc), "%s/proc-cgroup", dir);
	snprintf(p, sizeof(p), "%s/a", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/a/b", dir);
	assert_int_equal(mkdir(p, 0755), 0);

	write_file(pc, "1:cpu:/\n0::/a/b\n");
	assert_int_equal(kk__cpu_cgroup_cpus(pc, dir), 0); /* no cpu.max anywhere */
	snprintf(p, sizeof(p), "%s/a/b/cpu.max", dir);
	write_file(p, "max 100000\n");
	assert_int_equal(kk__cpu_cgroup_cpus(pc, dir), 0);
	write_file(p, "250000 100000\n");
	assert_int_equal(kk__cpu_cgroup_cpus(pc, dir), 3); /* 2.5 CPUs: 3 threads */
	snprintf(p, sizeof(p), "%s/a/cpu.max", dir);
	write_file(p, "150000 100000\n");
	assert_int_equal(kk__cpu_cgroup_cpus(pc, dir), 2); /* the parent's is tighter */
	write_file(p, "5000 100000\n");
	assert_int_equal(kk__cpu_cgroup_cpus(pc, dir), 1); /* never 0 */
	write_file(pc, "4:memory:/x\n");		   /* cgroup v1 only */
	assert_int_equal(kk__cpu_cgroup_cpus(pc, dir), 0);
	snprintf(p, sizeof(p), "%s/nonexistent", dir);
	assert_int_equal(kk__cpu_cgroup_cpus(p, dir), 0);

	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* y = x W^T for a linear layer at decode sizes (m <= 16 for f32 weights,
 * 8 for 16-bit ones: the GEMV, rows of
 * W split over threads): y from 1, 2 and 5 threads must be bit-identical,
 * since every output is one dot product whatever the split.  At prefill
 * sizes (sgemm on column blocks) OpenBLAS's edge kernels sum a block's
 * last columns in another order, so there the bar is the float64
 * reference's tolerance, for every thread count. */
static void linear_run(kk_dtype dt, int64_t m, int64_t n, int64_t k, kk_buffer *x, kk_buffer *w,
		       int threads, float *out)
{
	kk_buffer *y = out_buf(KK_F32, (size_t) (m * n));
	kk_gemm_desc d = kiln_test_linear(m, n, k, x, w, y);
	assert_int_equal(kk_backend_set_threads(be, threads), 0);
	assert_int_equal(kk_gemm(be, NULL, &d), 0);
	assert_int_equal(kk_buffer_download(be, NULL, y, 0, out, (size_t) (m * n) * 4), 0);
}

static void test_threads_deterministic(void **state)
{
	const int64_t ms[] = { 1, 3, 4, 8, 13, 16, 64 };
	for (size_t di = 0; di < 2; di++)
		for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++) {
			kk_dtype dt = di ? KK_BF16 : KK_F32;
			int64_t m = ms[mi], n = irand(300, 700), k = irand(200, 400);
			double *hx, *hw;
			kk_buffer *x = up_rand(dt, (size_t) (m * k), -1, 1, &hx);
			kk_buffer *w = up_rand(dt, (size_t) (n * k), -1, 1, &hw);
			float *y1 = hmalloc((size_t) (m * n) * 4),
			      *y2 = hmalloc((size_t) (m * n) * 4);
			double *ref = hmalloc((size_t) (m * n) * 8),
			       *got = hmalloc((size_t) (m * n) * 8);
			for (int64_t i = 0; i < m; i++)
				for (int64_t j = 0; j < n; j++) {
					double acc = 0;
					for (int64_t l = 0; l < k; l++)
						acc += hx[i * k + l] * hw[j * k + l];
					ref[i * n + j] = acc;
				}
			linear_run(dt, m, n, k, x, w, 1, y1);
			for (int t = 2; t <= 5; t += 3) {
				linear_run(dt, m, n, k, x, w, t, y2);
				/* the GEMV's rows: 16 for f32 weights, 8 else (gemm.c) */
				if (m <= (dt == KK_F32 ? 16 : 8) &&
				    memcmp(y1, y2, (size_t) (m * n) * 4))
					fail_msg("%s m=%ld n=%ld k=%ld: 1 and %d threads differ",
						 kk_dtype_name(dt), (long) m, (long) n, (long) k,
						 t);
				for (int64_t i = 0; i < m * n; i++)
					got[i] = y2[i];
				expect_close("linear", got, ref, (size_t) (m * n), 4 * TOL(dt),
					     2 * TOL(dt));
			}
			teardown(NULL);
		}
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* The f32 GEMV's bias and GELU/SiLU epilogue (m = 1 applies it once per
 * chunk of columns, the tiles per pair of them) against the float64
 * reference, at 1 and 2 threads: test_gemm's shapes (m >= 5) never reach
 * the one-row path. */
static void test_gemv_epilogue(void **state)
{
	const int64_t ms[] = { 1, 3, 13 };
	for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++)
		for (int e = 1; e <= 2; e++)
			for (int t = 1; t <= 2; t++) {
				int64_t m = ms[mi], n = irand(300, 700), k = irand(200, 400);
				double *hx, *hw, *hb, *ref = hmalloc((size_t) (m * n) * 8);
				kk_buffer *x = up_rand(KK_F32, (size_t) (m * k), -1, 1, &hx);
				kk_buffer *w = up_rand(KK_F32, (size_t) (n * k), -1, 1, &hw);
				kk_buffer *bias = up_rand(KK_F32, (size_t) n, -1, 1, &hb);
				kk_buffer *y = out_buf(KK_F32, (size_t) (m * n));
				kk_gemm_desc d = kiln_test_linear(m, n, k, x, w, y);
				d.alpha = 0.75f;
				d.bias = bias;
				d.epilogue = (kk_epilogue) e;
				assert_int_equal(kk_backend_set_threads(be, t), 0);
				assert_int_equal(kk_gemm(be, NULL, &d), 0);
				ref_gemm(&d, hx, hw, NULL, hb, ref);
				expect_close("gemv epilogue", down(y, (size_t) (m * n)), ref,
					     (size_t) (m * n), 4 * TOL(KK_F32), 2 * TOL(KK_F32));
				teardown(NULL);
			}
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* The quantized product (int8 and int4 rows split over threads; GEMV
 * sizes and a prefill-sized m) is bit-identical for 1, 2 and 5 threads
 * too. */
static void test_threads_qgemv(void **state)
{
	/* 64: enough work for kk__parallel_for_fine's finer chunks at 2
	 * threads (packed rows: one or two groups a chunk). */
	const int64_t ms[] = { 1, 3, 8, 21, 64 };
	const kk_dtype qts[] = { KK_I8, KK_Q4 };
	for (size_t qi = 0; qi < ARRAY_SIZE(qts); qi++)
		for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++) {
			int64_t m = ms[mi], n = irand(300, 700), k = 32 * irand(8, 12);
			double *hx, *hw;
			kk_buffer *x = up_rand(KK_F32, (size_t) (m * k), -1, 1, &hx);
			kk_buffer *w = up_rand(KK_F32, (size_t) (n * k), -1, 1, &hw);
			kk_buffer *y = out_buf(KK_F32, (size_t) (m * n));
			float *y1 = hmalloc((size_t) (m * n) * 4),
			      *y2 = hmalloc((size_t) (m * n) * 4);
			kk_qmatrix *q = NULL;
			assert_int_equal(kk_qmatrix_alloc(be, qts[qi], n, k,
							  qts[qi] == KK_Q4 ? 32 : 0, KK_F16, &q),
					 0);
			assert_int_equal(kk_quantize(be, NULL, q, w), 0);
			if (mi != 1) /* packed rows: groups of 8 split over threads */
				assert_int_equal(kk_qmatrix_pack(be, q), 1);
			for (int t = 1; t <= 5; t += t == 1 ? 1 : 3) {
				/* NaN first: an output a split leaves out must not
				 * keep the previous run's value. */
				for (int64_t i = 0; i < m * n; i++)
					y2[i] = NAN;
				assert_int_equal(
					kk_buffer_upload(be, NULL, y, 0, y2, (size_t) (m * n) * 4),
					0);
				assert_int_equal(kk_backend_set_threads(be, t), 0);
				assert_int_equal(kk_qgemm(be, NULL, y, x, q, NULL, m), 0);
				assert_int_equal(kk_buffer_download(be, NULL, y, 0,
								    t == 1 ? y1 : y2,
								    (size_t) (m * n) * 4),
						 0);
				if (t > 1 && memcmp(y1, y2, (size_t) (m * n) * 4))
					fail_msg("%s m=%ld n=%ld: 1 and %d threads differ",
						 kk_dtype_name(qts[qi]), (long) m, (long) n, t);
			}
			kk_qmatrix_free(q);
			teardown(NULL);
		}
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* kk_qgemm's int8 activations, every dot product variant of this build
 * (forced in turn; a variant this CPU cannot run is skipped, said so):
 * against a float64 product of X quantized by the same rule (d =
 * max|block| / 127 in f32, q = rint(x * (127 / max|block|))) and the
 * stored weights, to f32 rounding of the sum of |terms|: the integer block
 * sums must be exact.  Then against the float64 product of the unquantized
 * X within the activation bound (ref_qact_bound).  Shapes: int8 per channel
 * with k not a multiple of 32 (a partial last block; k < 32: nothing
 * but), int8 per 32-block (GGUF Q8_0's layout, some codes -128), int4
 * groups 32/64/128, m from 1
 * (GEMV) to 21 (prefill tiles with a ragged edge), f32 and bf16 X. */
static void qdot_case_p(kk_dtype qt, int group, kk_dtype sdt, kk_dtype xdt, int64_t m, int64_t n,
			int64_t k, bool pack)
{
	double *hx, *hw, *hb, *wd = hmalloc((size_t) (n * k) * sizeof(double));
	double *exact = hmalloc((size_t) (m * n) * sizeof(double));
	double *mag = hmalloc((size_t) (m * n) * sizeof(double));
	double *ref = hmalloc((size_t) (m * n) * sizeof(double));
	kk_buffer *x = up_rand(xdt, (size_t) (m * k), -1, 1, &hx);
	kk_buffer *w = up_rand(KK_F32, (size_t) (n * k), -1, 1, &hw);
	kk_buffer *bias = up_rand(KK_F32, (size_t) n, -1, 1, &hb);
	kk_buffer *y = out_buf(xdt, (size_t) (m * n)), *wdb = out_buf(KK_F32, (size_t) (n * k));
	kk_qmatrix *q = NULL;
	double *xq = hmalloc((size_t) k * sizeof(double));

	assert_int_equal(kk_qmatrix_alloc(be, qt, n, k, group, sdt, &q), 0);
	assert_int_equal(kk_quantize(be, NULL, q, w), 0);
	if (qt == KK_I8 && group == 32) {
		/* GGUF Q8_0 blocks may hold -128 (kk_quantize never writes it):
		 * |w| = 128 must still go through the u8 x s8 products. */
		int8_t *raw = hmalloc((size_t) (n * k));
		assert_int_equal(kk_buffer_download(be, NULL, q->data, 0, raw, (size_t) (n * k)),
				 0);
		for (int64_t i = 0; i < n * k; i += 7)
			raw[i] = -128;
		assert_int_equal(kk_buffer_upload(be, NULL, q->data, 0, raw, (size_t) (n * k)), 0);
	}
	assert_int_equal(kk_dequantize(be, NULL, wdb, q), 0);
	memcpy(wd, down(wdb, (size_t) (n * k)), (size_t) (n * k) * sizeof(double));
	if (pack) {
		/* Packed (n >= 8): the same matrix, so the same dequantized
		 * values, read back from the interleaved layout. */
		assert_int_equal(kk_qmatrix_pack(be, q), 1);
		assert_int_equal(q->pack, KK_QPACK);
		assert_int_equal(kk_dequantize(be, NULL, wdb, q), 0);
		double *wp = down(wdb, (size_t) (n * k));
		for (int64_t i = 0; i < n * k; i++)
			if (wp[i] != wd[i])
				fail_msg("packed %s g%d n=%ld k=%ld: dequantized [%ld] %g, "
					 "before packing %g",
					 kk_dtype_name(qt), group, (long) n, (long) k, (long) i,
					 wp[i], wd[i]);
	}
	assert_int_equal(kk_qgemm(be, NULL, y, x, q, bias, m), 0);
	for (int64_t i = 0; i < m; i++) {
		/* X row i as kk quantizes it, dequantized. */
		for (int64_t b = 0; b < k; b += 32) {
			float amax = 0;
			int64_t e = MIN(k, b + 32);
			for (int64_t l = b; l < e; l++)
				amax = fmaxf(amax, fabsf((float) hx[i * k + l]));
			float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
			for (int64_t l = b; l < e; l++)
				xq[l] = (double) rintf((float) hx[i * k + l] * inv) * d;
		}
		for (int64_t j = 0; j < n; j++) {
			double s = 0, a = 0;
			for (int64_t l = 0; l < k; l++) {
				s += xq[l] * wd[j * k + l];
				a += fabs(xq[l] * wd[j * k + l]);
			}
			exact[i * n + j] = s + hb[j];
			mag[i * n + j] = a + fabs(hb[j]);
		}
	}
	double *got = down(y, (size_t) (m * n));
	for (int64_t i = 0; i < m * n; i++) {
		/* f32 accumulation over k terms, then the output's rounding. */
		double tol = 2e-6 * mag[i] + TOL(xdt) * fabs(exact[i]);
		if (!(fabs(got[i] - exact[i]) <= tol))
			fail_msg("%s%s %s g%d x %s m=%ld n=%ld k=%ld: [%ld] got %.9g, the exactly "
				 "quantized product is %.9g (tolerance %g)",
				 pack ? "packed " : "", kk__qdot()->name, kk_dtype_name(qt), group,
				 kk_dtype_name(xdt), (long) m, (long) n, (long) k, (long) i, got[i],
				 exact[i], tol);
	}
	kk_gemm_desc ld = kiln_test_linear(m, n, k, NULL, NULL, NULL);
	ref_gemm(&ld, hx, wd, NULL, hb, ref);
	expect_qact("qgemm vs unquantized x", got, hx, wd, ref, m, n, k, 4 * TOL(xdt),
		    2 * TOL(xdt));
	kk_qmatrix_free(q);
}

static void qdot_case(kk_dtype qt, int group, kk_dtype xdt, int64_t m, int64_t n, int64_t k)
{
	qdot_case_p(qt, group, KK_F16, xdt, m, n, k, false);
}

static void test_qdot_variants(void **state)
{
	const char *const *names = kk__qdot_names();
	const int64_t ms[] = { 1, 2, 5, 8, 21 };
	int ran = 0;

	assert_int_equal(kk__qdot_force("no-such-variant"), -EINVAL);
	for (int v = 0; names[v]; v++) {
		int r = kk__qdot_force(names[v]);
		if (r == -EOPNOTSUPP) {
			print_message("# variant %s: this CPU cannot run it, skipped\n", names[v]);
			continue;
		}
		assert_int_equal(r, 0);
		assert_string_equal(kk__qdot()->name, names[v]);
		ran++;
		for (size_t mi = 0; mi < ARRAY_SIZE(ms); mi++) {
			int64_t m = ms[mi], n = irand(5, 40);
			qdot_case(KK_I8, 0, KK_F32, m, n, 32 * irand(2, 9));
			qdot_case(KK_I8, 0, KK_BF16, m, n, 32 * irand(1, 6) + irand(1, 31));
			qdot_case(KK_I8, 32, KK_F32, m, n, 32 * irand(1, 9));
			qdot_case(KK_I8, 0, KK_F32, m, n, irand(1, 31)); /* tail only */
			qdot_case(KK_Q4, 32, KK_F32, m, n, 32 * irand(1, 9));
			qdot_case(KK_Q4, 64, KK_BF16, m, n, 64 * irand(1, 5));
			qdot_case(KK_Q4, 128, KK_F32, m, n, 128 * irand(1, 3));
			teardown(NULL);
		}
	}
	assert_true(ran >= 1); /* scalar always runs */
	/* KK_CPU_QDOT picks the variant; one this CPU cannot run (or no such
	 * name) leaves the automatic choice. */
	assert_int_equal(kk__qdot_force(NULL), 0);
	const char *best = kk__qdot()->name;
	setenv("KK_CPU_QDOT", "scalar", 1);
	assert_int_equal(kk__qdot_force(NULL), 0);
	assert_string_equal(kk__qdot()->name, "scalar");
	setenv("KK_CPU_QDOT", "bogus", 1);
	assert_int_equal(kk__qdot_force(NULL), 0);
	assert_string_equal(kk__qdot()->name, best);
	unsetenv("KK_CPU_QDOT");
	assert_int_equal(kk__qdot_force(NULL), 0);
	print_message("# int8 dot products: %s\n", best);
}

/* Packed rows (kk_qmatrix_pack), every variant of this build: m = 1..9
 * (every tile height and a ragged edge), n with and without rows past the
 * last group of 8, int8 per channel (f16 and f32 scales) and per 32-block,
 * int4 groups 32/64/128 with f16 or f32 scales; the same two checks as
 * qdot_case, and the packed matrix dequantizes to the same values. */
static void test_qdot_packed(void **state)
{
	const char *const *names = kk__qdot_names();
	int ran = 0;
	for (int v = 0; names[v]; v++) {
		if (kk__qdot_force(names[v]) == -EOPNOTSUPP)
			continue;
		ran++;
		for (int64_t m = 1; m <= 9; m++) {
			int64_t n = m % 2 ? 8 * irand(1, 5) : irand(9, 45);
			qdot_case_p(KK_I8, 0, KK_F16, KK_F32, m, n, 32 * irand(1, 9), true);
			qdot_case_p(KK_I8, 0, KK_F32, KK_BF16, m, n, 32 * irand(1, 9), true);
			qdot_case_p(KK_I8, 32, KK_F16, KK_F32, m, n, 32 * irand(1, 9), true);
			qdot_case_p(KK_Q4, 32, KK_F16, KK_F32, m, n, 32 * irand(1, 9), true);
			qdot_case_p(KK_Q4, 32, KK_F32, KK_F32, m, n, 32 * irand(1, 9), true);
			qdot_case_p(KK_Q4, 64, KK_F32, KK_BF16, m, n, 64 * irand(1, 5), true);
			qdot_case_p(KK_Q4, 128, KK_F16, KK_F32, m, n, 128 * irand(1, 3), true);
			teardown(NULL);
		}
	}
	assert_true(ran >= 1);
	assert_int_equal(kk__qdot_force(NULL), 0);
	/* Packing split over 4 threads (chunks of groups, each with its own
	 * scratch), then checked the same way. */
	assert_int_equal(kk_backend_set_threads(be, 4), 0);
	qdot_case_p(KK_Q4, 32, KK_F16, KK_F32, 3, 331, 384, true);
	qdot_case_p(KK_I8, 32, KK_F16, KK_F32, 2, 320, 384, true);
	assert_int_equal(kk_backend_set_threads(be, 0), 0);

	/* What is left as it is: fewer than 8 rows, k not a multiple of 32,
	 * KK_CPU_QPACK=0; kk_quantize writes the plain layout again. */
	kk_qmatrix *q = NULL;
	kk_buffer *w = up_rand(KK_F32, 8 * 96, -1, 1, NULL);
	assert_int_equal(kk_qmatrix_alloc(be, KK_I8, 7, 64, 0, KK_F16, &q), 0);
	assert_int_equal(kk_qmatrix_pack(be, q), 0);
	assert_int_equal(q->pack, 0);
	q = kk_qmatrix_free(q);
	assert_int_equal(kk_qmatrix_alloc(be, KK_I8, 8, 72, 0, KK_F16, &q), 0);
	assert_int_equal(kk_qmatrix_pack(be, q), 0);
	q = kk_qmatrix_free(q);
	assert_int_equal(kk_qmatrix_alloc(be, KK_Q4, 8, 96, 32, KK_F16, &q), 0);
	setenv("KK_CPU_QPACK", "0", 1);
	assert_int_equal(kk_qmatrix_pack(be, q), 0);
	unsetenv("KK_CPU_QPACK");
	assert_int_equal(kk_qmatrix_pack(be, q), 1);
	assert_int_equal(kk_qmatrix_pack(be, q), 1);
	assert_int_equal(kk_quantize(be, NULL, q, w), 0);
	assert_int_equal(q->pack, 0);
	q->pack = 3; /* not a layout */
	assert_int_equal(kk_qmatrix_pack(be, q), -EINVAL);
	q->pack = 0;
	assert_int_equal(kk_qmatrix_pack(NULL, q), -EINVAL);
	kk_qmatrix_free(q);
}

/* Two caller threads using the pool at once (one finds it busy and runs
 * its chunks itself): both get the same answer as alone. */
struct caller {
	kk_gemm_desc d;
	int r, rounds;
};

static void *caller_main(void *p)
{
	struct caller *c = p;
	for (int i = 0; i < c->rounds && c->r == 0; i++)
		c->r = kk_gemm(be, NULL, &c->d);
	return NULL;
}

static void test_threads_concurrent(void **state)
{
	const int64_t m = 4, n = 512, k = 256;
	double *hx, *hw;
	kk_buffer *x = up_rand(KK_F32, m * k, -1, 1, &hx), *w = up_rand(KK_F32, n * k, -1, 1, &hw);
	float *want = hmalloc(m * n * 4), *got = hmalloc(m * n * 4);
	struct caller c[2];
	pthread_t t[2];

	linear_run(KK_F32, m, n, k, x, w, 2, want);
	for (int i = 0; i < 2; i++) {
		c[i] = (struct caller){
			.d = kiln_test_linear(m, n, k, x, w, out_buf(KK_F32, m * n)), .rounds = 200
		};
		assert_int_equal(pthread_create(&t[i], NULL, caller_main, &c[i]), 0);
	}
	for (int i = 0; i < 2; i++) {
		assert_int_equal(pthread_join(t[i], NULL), 0);
		assert_int_equal(c[i].r, 0);
		assert_int_equal(kk_buffer_download(be, NULL, c[i].d.c, 0, got, m * n * 4), 0);
		assert_memory_equal(got, want, m * n * 4);
	}
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* The paged decode's block loops (simd.c) against float64 for head dims
 * of each path: multiples of 16, 8, and the rest (the suite's paged tests
 * use 8, 64, 96 and 128 only). */
static void test_block_loops(void **state)
{
	const size_t ns[] = { 8, 12, 16, 40, 48, 64, 96 };
	for (size_t ni = 0; ni < ARRAY_SIZE(ns); ni++) {
		size_t n = ns[ni];
		int nt = irand(1, 16);
		float q[128], y[128], p[16], s[16], rows[16][128];
		const float *r[16];
		double want_y[128];
		for (size_t i = 0; i < n; i++) {
			q[i] = (float) (rand() % 2001 - 1000) / 1000.0f;
			y[i] = (float) (rand() % 2001 - 1000) / 1000.0f;
			want_y[i] = y[i];
		}
		for (int j = 0; j < nt; j++) {
			for (size_t i = 0; i < n; i++)
				rows[j][i] = (float) (rand() % 2001 - 1000) / 1000.0f;
			p[j] = (float) (rand() % 1001) / 1000.0f;
			r[j] = rows[j];
		}
		kk__dot_rows(s, q, r, nt, n, 0.5f);
		kk__axpy_rows(y, p, r, nt, n);
		for (int j = 0; j < nt; j++) {
			double d = 0;
			for (size_t i = 0; i < n; i++) {
				d += (double) q[i] * rows[j][i];
				want_y[i] += (double) p[j] * rows[j][i];
			}
			if (fabs(s[j] - 0.5 * d) > 1e-5 * (1 + fabs(d)))
				fail_msg("dot_rows n=%zu row %d: %g, want %g", n, j, s[j], 0.5 * d);
		}
		for (size_t i = 0; i < n; i++)
			if (fabs(y[i] - want_y[i]) > 1e-5 * (1 + fabs(want_y[i])))
				fail_msg("axpy_rows n=%zu [%zu]: %g, want %g", n, i, y[i],
					 want_y[i]);
	}
}

/* Chunks that outlast the publisher's join spin (KK_CPU_JOIN_SPIN_NS):
 * it sleeps on the futex and the worker finishing the last chunk must wake
 * it.  A lost wake-up hangs the call, so an alarm turns that into a
 * failure; every chunk must run exactly once, over its own range. */
#define SLOW_CHUNKS KK_CPU_CHUNKS_MAX

struct slow_job {
	int runs[SLOW_CHUNKS];
	int64_t covered;
};

static int slow_chunk(void *ctx, int64_t b, int64_t e, int chunk)
{
	struct slow_job *j = ctx;
	struct timespec ts = { 0, 4 * KK_CPU_JOIN_SPIN_NS };
	__atomic_fetch_add(&j->runs[chunk], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&j->covered, e - b, __ATOMIC_RELAXED);
	nanosleep(&ts, NULL);
	return chunk == 1 ? -EBADMSG : 0;
}

static void test_pool_join_sleeps(void **state)
{
	assert_int_equal(kk_backend_set_threads(be, 2), 0);
	alarm(20);
	for (int job = 0; job < 20; job++) {
		struct slow_job j = { 0 };
		int chunks = kk__parallel_chunks(64, 1e9);
		assert_true(chunks > 1 && chunks <= SLOW_CHUNKS);
		assert_int_equal(kk__parallel_for(64, 1e9, slow_chunk, &j), -EBADMSG);
		assert_int_equal(j.covered, 64);
		for (int i = 0; i < chunks; i++)
			if (j.runs[i] != 1)
				fail_msg("job %d: chunk %d ran %d times", job, i, j.runs[i]);
	}
	alarm(0);
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* Opening the backend ends the threads OpenBLAS started when it loaded
 * (cpu.c openblas_stop_threads): blas_server_avail, OpenBLAS's "threads
 * are running", is 0 after it.  They are started again first (asking for
 * two: a fork, as the suite's tests do, ends them too); skipped for a BLAS
 * without the symbol or a one-CPU machine, where none start. */
static void test_openblas_threads_stopped(void **state)
{
	const int *avail = dlsym(RTLD_DEFAULT, "blas_server_avail");
	kk_backend *b2 = NULL;

	if (!avail)
		skip();
	openblas_set_num_threads(2);
	if (!*avail)
		skip();
	assert_int_equal(kk_backend_open("cpu", &b2), 0);
	assert_int_equal(*avail, 0);
	assert_int_equal(openblas_get_num_threads(), 1);
	kk_backend_free(b2);
}

/* ---- f16/bf16 loops, every variant (kernels/kk/cpu/half.c) ----------------
 *
 * Each variant this CPU runs (forced through kk__half_force) against the
 * scalar kk_f16_to_f32/kk_f32_to_f16 bit for bit (every f16 pattern; f32
 * values across the normal, subnormal and overflow ranges, ties included)
 * and against a float64 reference: the dot product at lengths around the
 * vector widths, and kk_gemm with f16/bf16 operands (half_gemm_check). */
static const char *const half_variants[] = { "avx512bf16", "avx512", "f16c", "portable" };

static bool same_f32(float a, float b)
{
	return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

static void half_convert_check(const char *v)
{
	size_t n = 65536 + 13; /* every pattern, then a tail past a full vector */
	uint16_t *h = hmalloc(n * 2), *h2 = hmalloc(n * 2);
	float *f = hmalloc(n * 4);
	for (size_t i = 0; i < n; i++)
		h[i] = (uint16_t) i;
	for (size_t len = 0; len <= 40; len += len < 20 ? 1 : 20) /* tails */
		kk__half_widen_f16(f, h + 3, len);
	kk__half_widen_f16(f, h, n);
	for (size_t i = 0; i < n; i++)
		if (!same_f32(f[i], kk_f16_to_f32(h[i])))
			fail_msg("%s: widen 0x%04x gave %a, want %a", v, h[i], f[i],
				 kk_f16_to_f32(h[i]));
	for (size_t i = 0; i < n; i++) { /* normals, subnormals, overflow, ties */
		switch (i % 4) {
		case 0:
			f[i] = (float) urand(-70000, 70000);
			break;
		case 1:
			f[i] = (float) urand(-1e-4, 1e-4);
			break;
		case 2: /* halfway between two f16 neighbours */
			f[i] = (kk_f16_to_f32((uint16_t) (i & 0x7bfe)) +
				kk_f16_to_f32((uint16_t) ((i & 0x7bfe) + 1))) /
			       2;
			break;
		default:
			f[i] = (float) urand(-2, 2);
		}
	}
	f[0] = NAN, f[1] = INFINITY, f[2] = -0.0f, f[3] = 65519.0f, f[5] = 65520.0f;
	for (size_t len = 1; len <= 40; len++) { /* tails must not write past len */
		memset(h2, 0xab, 2 * 41);
		kk__half_narrow_f16(h2, f + 7, len);
		if (h2[len] != 0xabab)
			fail_msg("%s: narrow of %zu elements wrote past the end", v, len);
	}
	kk__half_narrow_f16(h2, f, n);
	for (size_t i = 0; i < n; i++) {
		uint16_t want = kk_f32_to_f16(f[i]);
		if (isnan(f[i]) ? !isnan(kk_f16_to_f32(h2[i])) : h2[i] != want)
			fail_msg("%s: narrow %a gave 0x%04x, want 0x%04x", v, f[i], h2[i], want);
	}
}

static void half_dot_check(const char *v)
{
	const size_t ns[] = { 1, 7, 8, 15, 16, 17, 31, 63, 64, 65, 100, 768, 2049 };
	for (size_t di = 0; di < 2; di++) {
		kk_dtype dt = di ? KK_BF16 : KK_F16;
		for (size_t ni = 0; ni < ARRAY_SIZE(ns); ni++) {
			size_t n = ns[ni];
			float *x = hmalloc(n * 4);
			uint16_t *w = hmalloc(n * 2);
			double ref = 0, mag = 0;
			for (size_t i = 0; i < n; i++) {
				float wf = (float) urand(-1, 1);
				x[i] = (float) urand(-1, 1);
				w[i] = dt == KK_F16 ? kk_f32_to_f16(wf) : kk_f32_to_bf16(wf);
				wf = dt == KK_F16 ? kk_f16_to_f32(w[i]) : kk_bf16_to_f32(w[i]);
				ref += (double) x[i] * wf;
				mag += fabs((double) x[i] * wf);
			}
			double got = kk__half_dot(dt, x, w, n);
			/* f32 accumulation: a few ulps of the sum of magnitudes */
			if (fabs(got - ref) > 4e-6 * mag + 1e-7)
				fail_msg("%s: %s dot n=%zu: %.9g, want %.9g", v, kk_dtype_name(dt),
					 n, got, ref);
		}
	}
}

/* One random kk_gemm case of half_gemm_check and f32_tiles_check: X and W
 * of dtype dt with `pad` extra elements per row of A, B and C, C read back
 * (alpha 0.5, beta 0.25) or not, a bias or not, an epilogue; its float64
 * reference, whose padding columns keep C's values.  Buffers live until
 * teardown(NULL). */
typedef struct tile_case {
	kk_gemm_desc d;
	kk_buffer *c0; /* C before the product */
	size_t nc;
	double *ref, *got;
	float *y1, *y2; /* the 1-thread result, the latest other one */
} tile_case;

static void tile_case_make(tile_case *g, kk_dtype dt, int64_t m, int64_t n, int64_t k, int64_t pad,
			   bool ta, bool tb, bool beta, bool with_bias, kk_epilogue epi)
{
	int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
	double *hx, *hw, *hc, *hb;
	g->nc = (size_t) (m * ldc);
	g->ref = hmalloc(g->nc * 8);
	g->got = hmalloc(g->nc * 8);
	kk_buffer *x = up_rand(dt, (size_t) ((ta ? k : m) * lda), -1, 1, &hx);
	kk_buffer *w = up_rand(dt, (size_t) ((tb ? n : k) * ldb), -1, 1, &hw);
	g->c0 = up_rand(KK_F32, g->nc, -1, 1, &hc);
	kk_buffer *bias = up_rand(KK_F32, (size_t) n, -1, 1, &hb);
	g->y1 = hmalloc(g->nc * 4);
	g->y2 = hmalloc(g->nc * 4);
	g->d = kiln_test_gemm(ta, tb, m, n, k, x, w, out_buf(KK_F32, g->nc));
	g->d.alpha = beta ? 0.5f : 1, g->d.beta = beta ? 0.25f : 0;
	g->d.lda = lda, g->d.ldb = ldb, g->d.ldc = ldc;
	g->d.bias = with_bias ? bias : NULL, g->d.epilogue = epi;
	ref_gemm(&g->d, hx, hw, beta ? hc : NULL, with_bias ? hb : NULL, g->ref);
	for (int64_t i = 0; i < m; i++)
		for (int64_t j = n; j < ldc; j++)
			g->ref[i * ldc + j] = hc[i * ldc + j];
}

/* Runs the case on t threads from C's first values: within 4 tol + 2 tol
 * relative of the reference, and when `same`, bit-identical to the
 * 1-thread result (t = 1 must come first). */
static void tile_case_run(tile_case *g, const char *what, int t, bool same, double tol)
{
	float *y = t == 1 ? g->y1 : g->y2;
	assert_int_equal(kk_backend_set_threads(be, t), 0);
	assert_int_equal(kk_buffer_copy(be, NULL, g->d.c, 0, g->c0, 0, g->nc * 4), 0);
	assert_int_equal(kk_gemm(be, NULL, &g->d), 0);
	assert_int_equal(kk_buffer_download(be, NULL, g->d.c, 0, y, g->nc * 4), 0);
	if (t > 1 && same && memcmp(g->y1, g->y2, g->nc * 4))
		fail_msg("%s: 1 and %d threads differ", what, t);
	for (size_t i = 0; i < g->nc; i++)
		g->got[i] = y[i];
	expect_close(what, g->got, g->ref, g->nc, 4 * tol, 2 * tol);
}

/* kk_gemm with f16/bf16 operands under variant v.  x W^T (B transposed:
 * kk__half_gemm) at every m from 1 to 9 (each X-row tile size and its
 * edges) and beyond, n and k odd or past a vector, W wider than one
 * L2 block (half.c's HALF_GEMM_WBLOCK: 256 KiB of rows), padded leading
 * dimensions, alpha/beta with C read back, a bias and an epilogue; each
 * bit-identical for 1, 2 and 5 threads.  B not transposed (panels widened
 * for sgemm) at m = 40 and 130, held to the tolerance only. */
static void half_gemm_check(const char *v)
{
	static const struct {
		int64_t m, n, k, pad; /* pad: extra elements per row of A, B and C */
		bool tb, beta, bias;
		kk_epilogue epi;
	} cs[] = {
		{ 1, 301, 17, 0, 1, 0, 0, KK_EPI_NONE },
		{ 1, 700, 333, 3, 1, 1, 1, KK_EPI_SILU },
		{ 2, 67, 100, 0, 1, 0, 0, KK_EPI_NONE },
		{ 3, 300, 257, 1, 1, 1, 0, KK_EPI_NONE },
		{ 4, 33, 64, 0, 1, 0, 1, KK_EPI_GELU },
		{ 5, 129, 200, 2, 1, 0, 0, KK_EPI_NONE },
		{ 6, 258, 15, 0, 1, 1, 0, KK_EPI_NONE },
		{ 7, 31, 768, 0, 1, 0, 0, KK_EPI_NONE },
		{ 8, 515, 301, 0, 1, 0, 0, KK_EPI_NONE },
		{ 9, 5, 33, 5, 1, 1, 1, KK_EPI_SILU },
		{ 13, 1000, 300, 0, 1, 0, 0, KK_EPI_NONE }, /* 3 W blocks */
		{ 130, 515, 383, 1, 1, 0, 0, KK_EPI_NONE },
		{ 40, 300, 200, 0, 0, 0, 0, KK_EPI_NONE },
		{ 130, 333, 97, 0, 0, 0, 0, KK_EPI_NONE },
	};
	for (size_t di = 0; di < 2; di++)
		for (size_t ci = 0; ci < ARRAY_SIZE(cs); ci++) {
			kk_dtype dt = di ? KK_BF16 : KK_F16;
			tile_case g;
			tile_case_make(&g, dt, cs[ci].m, cs[ci].n, cs[ci].k, cs[ci].pad, false,
				       cs[ci].tb, cs[ci].beta, cs[ci].bias, cs[ci].epi);
			char what[96];
			snprintf(what, sizeof(what), "%s: %s m=%ld n=%ld k=%ld%s", v,
				 kk_dtype_name(dt), (long) cs[ci].m, (long) cs[ci].n,
				 (long) cs[ci].k, cs[ci].tb ? "" : " B not transposed");
			for (int t = 1; t <= 5; t += t == 1 ? 1 : 3)
				tile_case_run(&g, what, t, cs[ci].tb, TOL(dt));
			teardown(NULL);
		}
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* kk_gemm's f32 x W^T through half.c's f32 tiles (kk__half_gemm_f32,
 * forced with kk__gemm_f32_route(1)) under variant v, against float64:
 * m past the GEMV's 16 rows with every last-tile size (17..20 rows: 1, 2,
 * 3 and 4 in the last tile of four), n odd (an edge tile of W rows), k odd
 * and around a vector (the masked or scalar tail), k over two of half.c's
 * k blocks, W wider than one L2 block, padded leading dimensions, alpha/beta with C read back, a
 * bias, GELU and SiLU; A transposed and B not (training's backward: the operands copied
 * transposed); each bit-identical for 1, 2 and 5 threads.  Then the same products through sgemm
 * (route -1) must agree to the tolerance. */
static void f32_tiles_check(const char *v)
{
	static const struct {
		int64_t m, n, k, pad;
		bool beta, bias;
		kk_epilogue epi;
		bool ta, nb; /* A transposed; B not transposed (copied transposed) */
	} cs[] = {
		{ 17, 301, 17, 0, 0, 0, KK_EPI_NONE, 0, 0 },
		{ 18, 67, 100, 3, 1, 1, KK_EPI_SILU, 0, 0 },
		{ 19, 300, 257, 1, 1, 0, KK_EPI_NONE, 0, 0 },
		{ 20, 33, 64, 0, 0, 1, KK_EPI_GELU, 0, 0 },
		{ 21, 129, 15, 2, 0, 0, KK_EPI_NONE, 0, 0 },
		{ 33, 1000, 300, 0, 0, 0, KK_EPI_NONE, 0, 0 },
		{ 130, 515, 383, 1, 1, 1, KK_EPI_GELU, 0, 0 },
		{ 64, 77, 768, 0, 0, 0, KK_EPI_NONE, 0, 0 },
		{ 5, 70, 33, 1, 1, 1, KK_EPI_SILU, 0, 1 },
		{ 67, 45, 130, 0, 0, 0, KK_EPI_NONE, 1, 0 },
		{ 40, 37, 99, 2, 1, 0, KK_EPI_NONE, 1, 1 },
		{ 18, 41, 2100, 1, 1, 1, KK_EPI_GELU, 0, 0 }, /* 3 k blocks (half.c) */
	};
	for (size_t ci = 0; ci < ARRAY_SIZE(cs); ci++) {
		bool ta = cs[ci].ta, tb = !cs[ci].nb;
		tile_case g;
		tile_case_make(&g, KK_F32, cs[ci].m, cs[ci].n, cs[ci].k, cs[ci].pad, ta, tb,
			       cs[ci].beta, cs[ci].bias, cs[ci].epi);
		char what[96];
		for (int route = 1; route >= -1; route -= 2) {
			kk__gemm_f32_route(route);
			for (int t = 1; t <= 5; t += t == 1 ? 1 : 3) {
				snprintf(what, sizeof(what),
					 "%s: f32 %s %s m=%ld n=%ld k=%ld, %d threads", v,
					 route > 0 ? "tiles" : "sgemm",
					 ta   ? "A^T B"
					 : tb ? "A B^T"
					      : "A B",
					 (long) cs[ci].m, (long) cs[ci].n, (long) cs[ci].k, t);
				/* m < 17 with B transposed is the GEMV's (its own test) */
				tile_case_run(&g, what, t, route > 0, TOL(KK_F32));
			}
		}
		kk__gemm_f32_route(0);
		teardown(NULL);
	}
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* cpu.h's inline element conversions (kk__ld/kk__st/kk__round) against
 * kk.h's out-of-line ones, bit for bit: every f16 and bf16 pattern, and f32
 * values of every exponent with random mantissas, ties included. */
static void test_half_inline(void **state)
{
	for (uint32_t h = 0; h < 65536; h++) {
		if (!same_f32(kk__h2f((uint16_t) h), kk_f16_to_f32((uint16_t) h)))
			fail_msg("kk__h2f(0x%04x) = %a, want %a", h, kk__h2f((uint16_t) h),
				 kk_f16_to_f32((uint16_t) h));
		if (!same_f32(kk__b2f((uint16_t) h), kk_bf16_to_f32((uint16_t) h)))
			fail_msg("kk__b2f(0x%04x)", h);
	}
	for (uint32_t e = 0; e < 256; e++)
		for (int i = 0; i < 2000; i++) {
			uint32_t man = (uint32_t) next_u64() & 0x7fffff;
			if (i % 4 == 1) /* an f16 tie */
				man = (man & ~0x1fffu) | 0x1000;
			else if (i % 4 == 2) /* a bf16 tie */
				man = (man & ~0xffffu) | 0x8000;
			uint32_t u = (uint32_t) (i & 8) << 28 | e << 23 | man;
			float f;
			memcpy(&f, &u, 4);
			if (kk__f2h(f) != kk_f32_to_f16(f) && !isnan(f))
				fail_msg("kk__f2h(%a) = 0x%04x, want 0x%04x", f, kk__f2h(f),
					 kk_f32_to_f16(f));
			if (kk__f2b(f) != kk_f32_to_bf16(f))
				fail_msg("kk__f2b(%a) = 0x%04x, want 0x%04x", f, kk__f2b(f),
					 kk_f32_to_bf16(f));
		}
}

/* kk_buffer_wrap_host: the ops read the caller's memory in place (a
 * product over a wrapped W equals the one over an uploaded copy); bad
 * arguments are -EINVAL, and freeing the buffer leaves the memory alone. */
/* Buffers from 8 MiB up start on a 2 MiB boundary (cpu.c asks for
 * transparent huge pages there; not with KK_CPU_THP=0), smaller ones on
 * 64 bytes; both hold what is written to them end to end. */
static void test_alloc_align(void **state)
{
	const size_t sizes[] = { 100, (8u << 20) / 4 - 1, (8u << 20) / 4, (11u << 20) / 4 + 3 };
	const char *thp = getenv("KK_CPU_THP");
	const bool huge = !(thp && streq(thp, "0"));
	for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
		kk_buffer *b = NULL;
		size_t n = sizes[i];
		assert_int_equal(kk_buffer_alloc(be, KK_F32, n, &b), 0);
		uintptr_t a = (uintptr_t) b->ptr;
		if (huge && n * 4 >= (8u << 20) && a % (2u << 20))
			fail_msg("%zu bytes at %#lx: not on a 2 MiB boundary", n * 4,
				 (unsigned long) a);
		assert_true(a % 64 == 0);
		memset(b->ptr, 0x5a, n * 4);
		assert_int_equal(((unsigned char *) b->ptr)[n * 4 - 1], 0x5a);
		kk_buffer_free(b);
	}
}

static void test_wrap_host(void **state)
{
	const int64_t m = 3, n = 40, k = 64;
	double *hx, *hw;
	kk_buffer *x = up_rand(KK_F32, m * k, -1, 1, &hx), *w = up_rand(KK_F32, n * k, -1, 1, &hw);
	float *wh = hmalloc(n * k * 4 + 4), *want = hmalloc(m * n * 4), *got = hmalloc(m * n * 4);
	kk_buffer *wr = NULL;

	assert_int_equal(kk_buffer_download(be, NULL, w, 0, wh, n * k * 4), 0);
	assert_int_equal(kk_buffer_wrap_host(be, KK_F32, wh, 0, &wr), -EINVAL);
	assert_int_equal(kk_buffer_wrap_host(be, KK_F32, (char *) wh + 2, n * k, &wr), -EINVAL);
	assert_int_equal(kk_buffer_wrap_host(be, KK_F16, (char *) wh + 1, n * k, &wr), -EINVAL);
	assert_int_equal(kk_buffer_wrap_host(NULL, KK_F32, wh, n * k, &wr), -EINVAL);
	assert_int_equal(kk_buffer_wrap_host(be, KK_F16, (char *) wh + 2, n * k, &wr), 0);
	kk_buffer_free(wr);
	assert_int_equal(kk_buffer_wrap_host(be, KK_F32, wh, n * k, &wr), 0);
	assert_int_equal(kk_buffer_count(wr), n * k);
	assert_int_equal(kk_buffer_dtype(wr), KK_F32);
	linear_run(KK_F32, m, n, k, x, w, 1, want);
	linear_run(KK_F32, m, n, k, x, wr, 1, got);
	assert_memory_equal(got, want, m * n * 4);
	kk_buffer_free(wr);
	wh[0] = 1; /* still ours */
	assert_int_equal(kk_backend_set_threads(be, 0), 0);
}

/* The suite's GEMM cases (every trans combination, batches with strides,
 * beta, bias, epilogues; random m, n, k) with every f32 product forced
 * through the f32 tiles, then through sgemm. */
static void test_gemm_f32_routes(void **state)
{
	for (int route = 1; route >= -1; route -= 2) {
		kk__gemm_f32_route(route);
		for (int rep = 0; rep < 4; rep++)
			test_gemm(state);
	}
	kk__gemm_f32_route(0);
}

static void test_half_variants(void **state)
{
	int ran = 0;
	assert_int_equal(kk__half_force("no-such-isa"), -ENOENT);
	for (size_t i = 0; i < ARRAY_SIZE(half_variants); i++) {
		const char *v = half_variants[i];
		int r = kk__half_force(v);
		if (r == -EOPNOTSUPP) {
			print_message("# half variant %s: not on this CPU, not tested\n", v);
			continue;
		}
		assert_int_equal(r, 0);
		assert_string_equal(kk__half_variant(), v);
		half_convert_check(v);
		half_dot_check(v);
		half_gemm_check(v);
		f32_tiles_check(v);
		teardown(NULL);
		ran++;
	}
	assert_int_equal(kk__half_force(NULL), 0);
	print_message("# half variants tested: %d, in use: %s\n", ran, kk__half_variant());
	assert_true(ran >= 1);
}

int main(void)
{
	int r = run_suite();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_threads_option, teardown),
		cmocka_unit_test_teardown(test_cgroup_quota, teardown),
		cmocka_unit_test_teardown(test_threads_deterministic, teardown),
		cmocka_unit_test_teardown(test_threads_qgemv, teardown),
		cmocka_unit_test_teardown(test_gemv_epilogue, teardown),
		cmocka_unit_test_teardown(test_qdot_variants, teardown),
		cmocka_unit_test_teardown(test_qdot_packed, teardown),
		cmocka_unit_test_teardown(test_threads_concurrent, teardown),
		cmocka_unit_test_teardown(test_block_loops, teardown),
		cmocka_unit_test_teardown(test_pool_join_sleeps, teardown),
		cmocka_unit_test_teardown(test_openblas_threads_stopped, teardown),
		cmocka_unit_test_teardown(test_gemm_f32_routes, teardown),
		cmocka_unit_test_teardown(test_half_variants, teardown),
		cmocka_unit_test_teardown(test_half_inline, teardown),
		cmocka_unit_test_teardown(test_wrap_host, teardown),
		cmocka_unit_test_teardown(test_alloc_align, teardown),
	};
	if (kk_backend_open("cpu", &be) < 0)
		return 1;
	r |= cmocka_run_group_tests_name("kernels-cpu-threads", tests, NULL, NULL);
	kk_backend_free(be);
	return r;
}
