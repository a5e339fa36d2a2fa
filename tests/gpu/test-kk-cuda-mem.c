/* tests/gpu/test-kk-cuda-mem.c — the memory-bound ops of the kk cuda
 * backend (kernels/kk/cuda/elementwise.cu, rope.cu, softmax.cu, embedding.cu,
 * attention.cu's KV-cache write, norm.cu, optim.cu, quant.cu) at
 * the shapes and alignments that decide between their 16-byte vector paths
 * and their scalar paths, checked against the cpu backend.  Prints TAP.
 *
 * The vector paths need every array 16-byte aligned at the same element
 * and row lengths that are multiples of the vector width (4 f32, 8
 * bf16/f16); this test feeds sizes that are not (1, 7, 33, 1000, 4097 ...),
 * views at odd element offsets (kk_buffer_view), arrays misaligned alike
 * (the kernels then peel a scalar head) and differently (scalar path),
 * and rows longer than the register-resident norm kernels hold.  Inputs
 * are fresh random data in [-1, 1) (never zeros), outputs are poisoned
 * (0xFF bytes: NaN) before every run so an unwritten element fails.
 * A check passes when |cuda - cpu| <= atol + rtol * |cpu| everywhere.
 * Without a usable CUDA device every test is "ok N # SKIP".
 * KILN_TEST_SELF=1 puts the cpu backend on both sides (checks this file). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kk.h"

#define PARITY_SEED 0x9E3779B97F4A7C15ull
#define PARITY_ZERO 0.25f
#include "../kernels/ref/ref.h"
#include "parity.h"
#include "qcheck.h"
#include "../../kernels/bench/kk-desc.h"

/* TAP lines printed (for the skip path). */
#define N_TESTS 15

static const kk_dtype DTS[] = { KK_F32, KK_BF16, KK_F16 };
#define N_DTS 3
/* Lengths around the vector widths and block sizes. */
static const size_t LENS[] = { 1, 7, 33, 1000, 4097 };
#define N_LENS 5
/* View offsets of (input, output): aligned, misaligned alike (a scalar
 * head, then vectors), misaligned differently (scalar throughout). */
static const size_t OFFS[][2] = { { 0, 0 }, { 1, 1 }, { 0, 3 } };
#define N_OFFS 3

/* ---- elementwise ------------------------------------------------------------ */

static void test_elementwise(kk_dtype dt)
{
	int ok = 1;
	char what[96];
	for (int li = 0; li < N_LENS; li++)
		for (int oi = 0; oi < N_OFFS; oi++) {
			size_t n = LENS[li], oa = OFFS[oi][0], ob = OFFS[oi][1];
			pair x = mk_rand(dt, n, oa, 4), u = mk_rand(dt, n, oa, 2),
			     dy = mk_rand(dt, n, ob, 1), y = mk_at(dt, n, ob, NULL),
			     d2 = mk_at(dt, n, oa, NULL);
			int r = 0;
			for (int a = 0; a < 2; a++) {
				poison(&y);
				BOTH(r, kk_act_fwd(be, NULL, (kk_act) a, S(y), S(x), n));
				snprintf(what, sizeof(what), "act %d fwd n=%zu off=%zu/%zu", a, n,
					 oa, ob);
				ok = ok && r >= 0 && parity(&y, tol_of(dt), what);
				poison(&y);
				BOTH(r, kk_act_bwd(be, NULL, (kk_act) a, S(y), S(dy), S(x), n));
				snprintf(what, sizeof(what), "act %d bwd n=%zu off=%zu/%zu", a, n,
					 oa, ob);
				ok = ok && r >= 0 && parity(&y, tol_of(dt), what);
			}
			poison(&y);
			BOTH(r, kk_swiglu_fwd(be, NULL, S(y), S(x), S(u), n));
			snprintf(what, sizeof(what), "swiglu fwd n=%zu off=%zu/%zu", n, oa, ob);
			ok = ok && r >= 0 && parity(&y, tol_of(dt), what);
			poison(&y), poison(&d2);
			BOTH(r, kk_swiglu_bwd(be, NULL, S(y), S(d2), S(dy), S(x), S(u), n));
			snprintf(what, sizeof(what), "swiglu bwd n=%zu off=%zu/%zu", n, oa, ob);
			ok = ok && r >= 0 && parity(&y, tol_of(dt), what) &&
			     parity(&d2, tol_of(dt), what);
			/* in place: x *= -0.37 */
			BOTH(r, kk_scale(be, NULL, S(x), -0.37f, n));
			snprintf(what, sizeof(what), "scale n=%zu off=%zu", n, oa);
			ok = ok && r >= 0 && parity(&x, tol_of(dt), what);
			unpair(&x), unpair(&u), unpair(&dy), unpair(&y), unpair(&d2);
		}
	tap(ok, "silu/gelu/swiglu fwd+bwd, scale %s: lengths 1..4097, aligned/odd views vs cpu",
	    kk_dtype_name(dt));
}

static void test_cast(void)
{
	int ok = 1;
	char what[96];
	for (int a = 0; a < N_DTS; a++)
		for (int b = 0; b < N_DTS; b++)
			for (int li = 0; li < N_LENS; li++)
				for (int oi = 0; oi < N_OFFS; oi++) {
					size_t n = LENS[li];
					pair s = mk_rand(DTS[a], n, OFFS[oi][0], 3),
					     d = mk_at(DTS[b], n, OFFS[oi][1], NULL);
					int r = 0;
					BOTH(r, kk_cast(be, NULL, S(d), S(s), n));
					snprintf(what, sizeof(what),
						 "cast %s->%s n=%zu off=%zu/%zu",
						 kk_dtype_name(DTS[a]), kk_dtype_name(DTS[b]), n,
						 OFFS[oi][0], OFFS[oi][1]);
					ok = ok && r >= 0 && parity(&d, (tol){ 0, 0 }, what);
					unpair(&s), unpair(&d);
				}
	tap(ok, "cast every dtype pair, lengths 1..4097, aligned/odd views (exact) vs cpu");
}

/* ---- rows: softmax, cross-entropy, norms -------------------------------------- */

static void test_softmax_xent(kk_dtype dt)
{
	const int64_t rows = 3;
	const int64_t colsv[] = { 1, 7, 33, 1000, 4097, 33000 };
	int ok = 1;
	char what[96];
	for (int ci = 0; ci < 6; ci++)
		for (size_t off = 0; off < 2; off++) {
			int64_t cols = colsv[ci];
			size_t n = (size_t) (rows * cols);
			int32_t tg[3] = { (int32_t) (cols - 1), -1, (int32_t) (cols / 2) };
			pair x = mk_rand(dt, n, off, 8), y = mk_at(dt, n, off, NULL),
			     t = mk_at(KK_I32, 3, 0, tg), loss = mk_at(KK_F32, 3, 0, NULL);
			int r = 0;
			tol tp = tol_of(dt);
			tp.atol *= 0.01; /* probabilities are ~1/cols */
			BOTH(r, kk_softmax(be, NULL, S(y), S(x), rows, cols));
			snprintf(what, sizeof(what), "softmax cols=%lld off=%zu", (long long) cols,
				 off);
			ok = ok && r >= 0 && parity(&y, tp, what);
			BOTH(r, kk_cross_entropy_fwd(be, NULL, S(loss), S(x), S(t), rows, cols));
			snprintf(what, sizeof(what), "xent fwd cols=%lld off=%zu", (long long) cols,
				 off);
			ok = ok && r >= 0 && parity(&loss, tol_of(KK_F32), what);
			poison(&y);
			BOTH(r, kk_cross_entropy_bwd(be, NULL, S(y), S(x), S(t), rows, cols, 0.5f));
			snprintf(what, sizeof(what), "xent bwd cols=%lld off=%zu", (long long) cols,
				 off);
			ok = ok && r >= 0 && parity(&y, tp, what);
			/* in place: y aliases x */
			BOTH(r, kk_softmax(be, NULL, S(x), S(x), rows, cols));
			snprintf(what, sizeof(what), "softmax in place cols=%lld off=%zu",
				 (long long) cols, off);
			ok = ok && r >= 0 && parity(&x, tp, what);
			unpair(&x), unpair(&y), unpair(&t), unpair(&loss);
		}
	tap(ok,
	    "softmax (also in place), cross-entropy fwd/bwd %s: cols 1..33000, odd views vs cpu",
	    kk_dtype_name(dt));
}

static void test_norms(kk_dtype dt, bool layer)
{
	const int64_t rows = 5;
	/* 8192 is the longest register-resident row; 8200 takes the
	 * multi-pass kernels (and 4097 too, misaligned). */
	const int64_t dims[] = { 1, 7, 33, 768, 1000, 4097, 8192, 8200 };
	int ok = 1;
	char what[128];
	for (int di = 0; di < 8; di++)
		for (size_t off = 0; off < 2; off++) {
			int64_t dim = dims[di];
			size_t n = (size_t) (rows * dim);
			pair x = mk_rand(dt, n, off, 1), res = mk_rand(dt, n, 0, 1),
			     w = mk_rand(dt, (size_t) dim, off, 1),
			     b = mk_rand(dt, (size_t) dim, 0, 1), y = mk_at(dt, n, off, NULL),
			     h = mk_at(dt, n, off, NULL),
			     mean = mk_at(KK_F32, (size_t) rows, 0, NULL),
			     rstd = mk_at(KK_F32, (size_t) rows, 0, NULL),
			     dy = mk_rand(dt, n, off, 1), dres = mk_rand(dt, n, 0, 1),
			     dx = mk_at(dt, n, off, NULL),
			     dw = mk_at(KK_F32, (size_t) dim, off, NULL),
			     db = mk_at(KK_F32, (size_t) dim, 0, NULL);
			fill0(&dw), fill0(&db);
			int r = 0;
			if (layer)
				BOTH(r,
				     kk_layernorm_fwd(be, NULL, S(y), S(h), S(mean), S(rstd), S(x),
						      S(res), S(w), S(b), rows, dim, 1e-5f));
			else
				BOTH(r, kk_rmsnorm_fwd(be, NULL, S(y), S(h), S(rstd), S(x), S(res),
						       S(w), rows, dim, 1e-5f));
			snprintf(what, sizeof(what), "%s fwd dim=%lld off=%zu",
				 layer ? "ln" : "rms", (long long) dim, off);
			ok = ok && r >= 0 && parity(&y, tscale(tol_of(dt), 2), what) &&
			     parity(&h, tol_of(dt), what) && parity(&rstd, tol_of(KK_F32), what) &&
			     (!layer || parity(&mean, tol_of(KK_F32), what));
			/* Backward twice: dweight/dbias accumulate. */
			for (int rep = 0; rep < 2; rep++) {
				poison(&dx);
				if (layer)
					BOTH(r, kk_layernorm_bwd(be, NULL, S(dx), S(dw), S(db),
								 S(dy), S(dres), S(h), S(w),
								 S(mean), S(rstd), rows, dim));
				else
					BOTH(r,
					     kk_rmsnorm_bwd(be, NULL, S(dx), S(dw), S(dy), S(dres),
							    S(h), S(w), S(rstd), rows, dim));
			}
			snprintf(what, sizeof(what), "%s bwd dim=%lld off=%zu",
				 layer ? "ln" : "rms", (long long) dim, off);
			ok = ok && r >= 0 && parity(&dx, tscale(tol_of(dt), 2), what) &&
			     parity(&dw, tscale(tol_of(dt), 10), what) &&
			     (!layer || parity(&db, tscale(tol_of(dt), 10), what));
			/* Forward without residual, y aliasing x. */
			if (layer)
				BOTH(r, kk_layernorm_fwd(be, NULL, S(x), NULL, NULL, NULL, S(x),
							 NULL, S(w), NULL, rows, dim, 1e-5f));
			else
				BOTH(r, kk_rmsnorm_fwd(be, NULL, S(x), NULL, NULL, S(x), NULL, S(w),
						       rows, dim, 1e-5f));
			snprintf(what, sizeof(what), "%s fwd in place dim=%lld off=%zu",
				 layer ? "ln" : "rms", (long long) dim, off);
			ok = ok && r >= 0 && parity(&x, tscale(tol_of(dt), 2), what);
			unpair(&x), unpair(&res), unpair(&w), unpair(&b), unpair(&y), unpair(&h),
				unpair(&mean);
			unpair(&rstd), unpair(&dy), unpair(&dres), unpair(&dx), unpair(&dw),
				unpair(&db);
		}
	tap(ok, "%s fwd/bwd %s: dims 1..8200, odd views, in place, dweight accumulated vs cpu",
	    layer ? "layernorm" : "rmsnorm", kk_dtype_name(dt));
}

/* ---- RoPE, embedding ------------------------------------------------------------- */

static void test_rope_embed(kk_dtype dt)
{
	int ok = 1;
	char what[128];
	const int shapes[][3] = { { 5, 64, 64 }, { 3, 128, 96 }, { 2, 40, 24 }, { 1, 6, 2 } };
	int32_t pos[7] = { 0, 1, 4095, 77, 9001, 3, 12 };
	for (int si = 0; si < 4; si++)
		for (size_t off = 0; off < 2; off++)
			for (int mode = 0; mode < 2; mode++) {
				int heads = shapes[si][0], hd = shapes[si][1], rot = shapes[si][2];
				const int64_t tokens = 7;
				size_t n = (size_t) tokens * heads * hd;
				pair x = mk_rand(dt, n, off, 1), p = mk_at(KK_I32, 7, 0, pos);
				int r = 0;
				BOTH(r,
				     kk_rope(be, NULL, S(x), S(p), tokens, heads, hd, rot, 10000.0f,
					     NULL, (kk_rope_mode) mode, mode == 1 && si == 1));
				snprintf(what, sizeof(what),
					 "rope mode=%d h=%d hd=%d rot=%d off=%zu", mode, heads, hd,
					 rot, off);
				ok = ok && r >= 0 && parity(&x, tscale(tol_of(dt), 2), what);
				unpair(&x), unpair(&p);
			}
	const int64_t dims[] = { 7, 64, 1000 };
	int32_t ids[9] = { 3, 0, 19, 3, 25, 3, 7, 0, 12 }; /* 25: outside vocab 20 -> zero row */
	for (int di = 0; di < 3; di++)
		for (size_t off = 0; off < 2; off++) {
			const int64_t vocab = 20, tokens = 9, dim = dims[di];
			pair tab = mk_rand(dt, (size_t) (vocab * dim), off, 1),
			     id = mk_at(KK_I32, 9, 0, ids),
			     out = mk_at(dt, (size_t) (tokens * dim), off, NULL),
			     dout = mk_rand(dt, (size_t) (tokens * dim), off, 1),
			     dtab = mk_at(KK_F32, (size_t) (vocab * dim), off, NULL);
			fill0(&dtab);
			int r = 0;
			/* The cpu backend rejects the out-of-range id (-ERANGE);
			 * check the in-range tokens only: the first 4. */
			for (int side = 0; side < 2; side++) {
				int rr = kk_embedding_fwd(be_side[side], NULL, out.b[side],
							  tab.b[side], id.b[side], 4, vocab, dim);
				rr = rr < 0 ? rr
					    : kk_embedding_bwd(be_side[side], NULL, dtab.b[side],
							       dout.b[side], id.b[side], 4, vocab,
							       dim);
				if (rr < 0)
					r = rr;
			}
			out.n = (size_t) (4 * dim);
			snprintf(what, sizeof(what), "embedding dim=%lld off=%zu", (long long) dim,
				 off);
			ok = ok && r >= 0 && parity(&out, (tol){ 0, 0 }, what) &&
			     parity(&dtab, tol_of(KK_F32), what);
			unpair(&tab), unpair(&id), unpair(&out), unpair(&dout), unpair(&dtab);
		}
	tap(ok,
	    "rope both modes (partial rotary, large positions), embedding fwd/bwd %s: odd views vs "
	    "cpu",
	    kk_dtype_name(dt));
}

/* ---- optimizer ---------------------------------------------------------------------- */

static void test_adamw_norm(void)
{
	int ok = 1;
	char what[128];
	kk_adamw_params ap = kiln_test_adamw(1e-2f, 2, 0.5f);
	for (int gi = 0; gi < N_DTS; gi++)
		for (int pi = -1; pi < N_DTS; pi++)
			for (int li = 0; li < N_LENS; li++)
				for (int oi = 0; oi < N_OFFS; oi++) {
					size_t n = LENS[li], oa = OFFS[oi][0], ob = OFFS[oi][1];
					pair ms = mk_rand(KK_F32, n, oa, 1),
					     g = mk_rand(DTS[gi], n, ob, 1),
					     m = mk_rand(KK_F32, n, oa, 0.1f),
					     v = mk_rand(KK_F32, n, oa, 0.1f),
					     p = mk_at(pi < 0 ? KK_F32 : DTS[pi], n, ob, NULL);
					float *hv = get(&v, 0);
					for (size_t i = 0; i < n; i++)
						hv[i] = fabsf(hv[i]);
					for (int s = 0; s < 2; s++)
						kk_buffer_upload(be_side[s], NULL, v.b[s], 0, hv,
								 n * sizeof(float));
					free(hv);
					int r = 0;
					BOTH(r, kk_adamw(be, NULL, S(ms), pi < 0 ? NULL : S(p),
							 S(g), S(m), S(v), n, &ap));
					snprintf(what, sizeof(what),
						 "adamw g=%s p=%s n=%zu off=%zu/%zu",
						 kk_dtype_name(DTS[gi]),
						 pi < 0 ? "none" : kk_dtype_name(DTS[pi]), n, oa,
						 ob);
					ok = ok && r >= 0 && parity(&ms, tol_of(KK_F32), what) &&
					     parity(&m, tol_of(KK_F32), what) &&
					     parity(&v, tol_of(KK_F32), what) &&
					     (pi < 0 || parity(&p, tol_of(DTS[pi]), what));
					unpair(&ms), unpair(&g), unpair(&m), unpair(&v), unpair(&p);
				}
	tap(ok, "adamw every grad/copy dtype (and no copy), lengths 1..4097, odd views vs cpu");

	/* grad norm over views of every dtype and odd length: parity, and the
	 * same bits on a second run (the cuda reduction is deterministic). */
	pair bufs[N_DTS * N_LENS];
	kk_buffer *list[2][N_DTS * N_LENS];
	int nb = 0;
	for (int d = 0; d < N_DTS; d++)
		for (int li = 0; li < N_LENS; li++, nb++) {
			bufs[nb] = mk_rand(DTS[d], LENS[li] * 37, (size_t) li, 1);
			for (int s = 0; s < 2; s++)
				list[s][nb] = bufs[nb].b[s];
		}
	pair out = mk_at(KK_F32, 1, 0, NULL);
	int r = 0;
	for (int s = 0; s < 2; s++)
		if (kk_grad_norm(be_side[s], NULL, out.b[s], list[s], (size_t) nb) < 0)
			r = -1;
	float first = 0, again = -1;
	float *g1 = get(&out, 1);
	first = g1[0];
	free(g1);
	if (kk_grad_norm(be_side[1], NULL, out.b[1], list[1], (size_t) nb) < 0)
		r = -1;
	g1 = get(&out, 1);
	again = g1[0];
	free(g1);
	int ok2 = r >= 0 && parity(&out, tol_of(KK_F32), "grad norm") &&
		  memcmp(&first, &again, sizeof(float)) == 0;
	tap(ok2,
	    "grad norm over %d views (3 dtypes, odd lengths and offsets) vs cpu, bitwise "
	    "repeatable",
	    nb);
	for (int i = 0; i < nb; i++)
		unpair(&bufs[i]);
	unpair(&out);
}

/* ---- quantized GEMV ------------------------------------------------------------------- */

static void test_qgemv(void)
{
	/* qtype, group, n, k: k % 16 (I8) or % 32 (Q4) selects the vector
	 * path; k = 4096 with m = 8 stages too much X for shared memory and
	 * reads it from global memory instead. */
	const struct {
		kk_dtype qt;
		int group;
		int64_t n, k;
	} cs[] = { { KK_I8, 0, 37, 256 }, { KK_I8, 0, 37, 40 },	  { KK_I8, 0, 40, 4096 },
		   { KK_Q4, 32, 37, 96 }, { KK_Q4, 64, 33, 192 }, { KK_Q4, 128, 40, 4096 },
		   { KK_Q4, 32, 5, 32 } };
	const int64_t ms[] = { 1, 3, 8 };
	int ok = 1;
	char what[128];
	for (int c = 0; c < 7; c++)
		for (int d = 0; d < N_DTS; d++)
			for (int mi = 0; mi < 3; mi++) {
				kk_dtype xdt = DTS[d];
				int64_t n = cs[c].n, k = cs[c].k, m = ms[mi];
				if (k == 4096 && m != 8)
					continue; /* keep the emulation affordable */
				pair w = mk_rand(xdt, (size_t) (n * k), 0, 1),
				     wd = mk_at(xdt, (size_t) (n * k), 0, NULL),
				     /* m = 8 reads X from global memory for k = 4096:
				      * keep that view aligned so the vector path runs. */
					x = mk_rand(xdt, (size_t) (m * k), mi == 1 ? 1 : 0, 1),
				     y = mk_at(xdt, (size_t) (m * n), (size_t) mi, NULL),
				     bias = mk_rand(mi == 1 ? xdt : KK_F32, (size_t) n, 0, 1);
				kk_qmatrix *q[2] = { NULL, NULL };
				int r = 0;
				for (int s = 0; s < 2; s++) {
					int rr = kk_qmatrix_alloc(be_side[s], cs[c].qt, n, k,
								  cs[c].group,
								  d == 2 ? KK_F16 : KK_F32, &q[s]);
					rr = rr < 0 ? rr
						    : kk_quantize(be_side[s], NULL, q[s], w.b[s]);
					rr = rr < 0 ? rr
						    : kk_dequantize(be_side[s], NULL, wd.b[s],
								    q[s]);
					rr = rr < 0 ? rr
						    : kk_qgemm(be_side[s], NULL, y.b[s], x.b[s],
							       q[s], mi == 2 ? NULL : bias.b[s], m);
					if (rr < 0)
						r = rr;
				}
				float *hb = mi == 2 ? NULL : get(&bias, 0);
				snprintf(what, sizeof(what), "%s g%d n=%lld k=%lld m=%lld x %s",
					 kk_dtype_name(cs[c].qt), cs[c].group, (long long) n,
					 (long long) k, (long long) m, kk_dtype_name(xdt));
				/* One quantization step apart on a rounding tie. */
				double step = cs[c].qt == KK_I8 ? 1.0 / 127 : 1.0 / 7;
				tol tq = tscale(tol_of(xdt), 20);
				tq.atol *= sqrt((double) k / 512);
				ok = ok && r >= 0 &&
				     parity(&wd,
					    (tol){ step * 1.01 + tol_of(xdt).atol,
						   tol_of(xdt).rtol },
					    what) &&
				     qgemm_check(&y, &x, &wd, hb, m, n, k, tq, what);
				free(hb);
				for (int s = 0; s < 2; s++)
					kk_qmatrix_free(q[s]);
				unpair(&w), unpair(&wd), unpair(&x), unpair(&y), unpair(&bias);
			}
	tap(ok, "int8 and int4 (g32/64/128) quantize/dequantize/qgemv m=1,3,8, vector and scalar "
		"shapes, odd X views vs cpu");
}

int main(void)
{
	int r = parity_open(N_TESTS);
	if (r <= 0)
		return -r;
	for (int d = 0; d < N_DTS; d++)
		test_elementwise(DTS[d]); /* 1-3 */
	test_cast();			  /* 4 */
	test_softmax_xent(KK_F32);	  /* 5 */
	test_softmax_xent(KK_BF16);	  /* 6 */
	test_norms(KK_F32, false);	  /* 7 */
	test_norms(KK_BF16, false);	  /* 8 */
	test_norms(KK_F16, true);	  /* 9 */
	test_norms(KK_BF16, true);	  /* 10 */
	test_rope_embed(KK_F32);	  /* 11 */
	test_rope_embed(KK_BF16);	  /* 12 */
	test_adamw_norm();		  /* 13, 14 */
	test_qgemv();			  /* 15 */
	return parity_close();
}
