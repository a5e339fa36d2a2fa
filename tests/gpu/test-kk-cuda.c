/* tests/gpu/test-kk-cuda.c — every kk op on the cuda backend,
 * checked against the cpu backend (parity) and, for the core ops, against a
 * plain float64 reference.  Prints TAP.
 *
 * Inputs are fresh random data (uniform in [-1, 1], never zeros), uploaded
 * identically to both backends; every output is poisoned (all bytes 0xFF, a
 * NaN in every float dtype) before each run so unwritten elements fail.
 * A check passes when |got - want| <= atol + rtol * |want| everywhere, with
 * the tolerances of tol_of() per dtype (scaled per op where stated).
 * Without a usable CUDA device (or in a CUDA=0 build) every test is
 * reported as "ok N # SKIP no CUDA device" and the exit status is 0.
 * KILN_TEST_SELF=1 puts the cpu backend on both sides (see main());
 * KILN_TEST_SMALL=1 shrinks the sampling test (for the CPU emulation);
 * KILN_TEST_FILTER=WORD runs only the tests whose name holds WORD. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kk.h"
#include "../kernels/ref/ref.h"

#define PARITY_SEED 0x243F6A8885A308D3ull
#define PARITY_ZERO 0.5f
#include "parity.h"
#include "qcheck.h"
#include "../../kernels/bench/kk-desc.h"

/* Number of TAP lines this program prints (for the skip path). */
#define N_TESTS 62

/* Rounds host data to dt in place, so f64 references see what the device sees. */
static void round_to(kk_dtype dt, float *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (dt == KK_BF16)
			v[i] = kk_bf16_to_f32(kk_f32_to_bf16(v[i]));
		else if (dt == KK_F16)
			v[i] = kk_f16_to_f32(kk_f32_to_f16(v[i]));
	}
}

static const kk_dtype FLOAT_DTS[] = { KK_F32, KK_BF16, KK_F16 };

/* ---- GEMM ---------------------------------------------------------------- */

/* with_bias: 0 none, 1 in C's dtype, 2 f32 (kk_gemm takes either). */
static void test_gemm(kk_dtype dt, kk_dtype cdt, bool ta, bool tb, int64_t batch, kk_epilogue epi,
		      int with_bias)
{
	kk_dtype bdt = with_bias == 2 ? KK_F32 : cdt;
	const int64_t m = 67, n = 96, k = 160;
	int64_t nb = batch ? batch : 1;
	size_t na = (size_t) (m * k * nb), nbb = (size_t) (k * n * nb), nc = (size_t) (m * n * nb);
	float *ha = rand_vec(na, 1), *hb = rand_vec(nbb, 1), *hc = rand_vec(nc, 1),
	      *hbias = rand_vec((size_t) n, 1);
	round_to(dt, ha, na);
	round_to(dt, hb, nbb);
	round_to(cdt, hc, nc);
	round_to(bdt, hbias, (size_t) n);
	pair a = mk(dt, na, ha), b = mk(dt, nbb, hb), c = mk(cdt, nc, hc),
	     bias = mk(bdt, (size_t) n, hbias);
	float alpha = 0.75f, beta = 0.5f;
	int r = 0;
	kk_gemm_desc gd = kiln_test_gemm(ta, tb, m, n, k, NULL, NULL, NULL);
	gd.batch = batch, gd.alpha = alpha, gd.beta = beta, gd.epilogue = epi;
	gd.stride_a = m * k, gd.stride_b = k * n, gd.stride_c = m * n;
	BOTH(r, (gd.a = S(a), gd.b = S(b), gd.c = S(c), gd.bias = with_bias ? S(bias) : NULL,
		 kk_gemm(be, NULL, &gd)));
	double *ref = malloc(nc * sizeof(double)), *da = ref_widen(ha, na),
	       *db = ref_widen(hb, nbb), *dc = ref_widen(hc, nc),
	       *dbias = ref_widen(hbias, (size_t) n);
	ref_gemm(&gd, da, db, dc, with_bias ? dbias : NULL, ref);
	free(da), free(db), free(dc), free(dbias);
	/* Sums of k=160 products of [-1,1] values: |C| ~ 7, so scale atol. */
	tol t = tscale(tol_of(cdt), cdt == KK_F32 ? 10 : 4);
	int ok = r >= 0 && vs_ref(&c, ref, t, "gemm vs f64") && parity(&c, t, "gemm vs cpu");
	if (ok && with_bias) {
		/* The same GEMM again (same A, B, C buffers: the same cache key
		 * whatever the allocator's alignment) with another bias buffer: the
		 * cuda backend now runs its cached cuBLASLt descriptors and
		 * algorithm, and must point them at the new bias. */
		for (int64_t i = 0; i < n; i++)
			hbias[i] = -hbias[i];
		size_t cb = kk_buffer_bytes(c.b[0]);
		void *tmp = malloc(cb);
		kk_convert_host(cdt, tmp, KK_F32, hc, nc);
		for (int s2 = 0; s2 < 2; s2++)
			kk_buffer_upload(be_side[s2], NULL, c.b[s2], 0, tmp, cb);
		free(tmp);
		pair bias2 = mk(bdt, (size_t) n, hbias);
		BOTH(r, (gd.a = S(a), gd.b = S(b), gd.c = S(c), gd.bias = S(bias2),
			 kk_gemm(be, NULL, &gd)));
		da = ref_widen(ha, na), db = ref_widen(hb, nbb), dc = ref_widen(hc, nc);
		dbias = ref_widen(hbias, (size_t) n);
		ref_gemm(&gd, da, db, dc, dbias, ref);
		free(da), free(db), free(dc), free(dbias);
		ok = r >= 0 && vs_ref(&c, ref, t, "gemm again (cached) vs f64") &&
		     parity(&c, t, "gemm again (cached) vs cpu");
		unpair(&bias2);
	}
	tap(ok, "gemm %s->%s ta=%d tb=%d batch=%lld epi=%d bias=%d (vs f64 and cpu%s)",
	    kk_dtype_name(dt), kk_dtype_name(cdt), ta, tb, (long long) batch, epi, with_bias,
	    with_bias ? "; again with a new bias" : "");
	free(ha), free(hb), free(hc), free(hbias), free(ref);
	unpair(&a), unpair(&b), unpair(&c), unpair(&bias);
}

/* ---- norms --------------------------------------------------------------- */

static void test_norm(kk_dtype dt, bool layer)
{
	const int64_t rows = 37, dim = 1000;
	size_t n = (size_t) (rows * dim);
	float *hx = rand_vec(n, 1), *hr = rand_vec(n, 1), *hw = rand_vec((size_t) dim, 1),
	      *hb = rand_vec((size_t) dim, 1), *hdy = rand_vec(n, 1), *hdr = rand_vec(n, 1);
	round_to(dt, hx, n);
	round_to(dt, hr, n);
	round_to(dt, hw, (size_t) dim);
	round_to(dt, hb, (size_t) dim);
	pair x = mk(dt, n, hx), res = mk(dt, n, hr), w = mk(dt, (size_t) dim, hw),
	     b = mk(dt, (size_t) dim, hb), y = mk(dt, n, NULL), h = mk(dt, n, NULL),
	     mean = mk(KK_F32, (size_t) rows, NULL), rstd = mk(KK_F32, (size_t) rows, NULL),
	     dy = mk(dt, n, hdy), dres = mk(dt, n, hdr), dx = mk(dt, n, NULL);
	float zeros[1000] = { 0 };
	pair dw = mk(KK_F32, (size_t) dim, zeros), db = mk(KK_F32, (size_t) dim, zeros);
	int r = 0;
	if (layer)
		BOTH(r, kk_layernorm_fwd(be, NULL, S(y), S(h), S(mean), S(rstd), S(x), S(res), S(w),
					 S(b), rows, dim, 1e-5f));
	else
		BOTH(r, kk_rmsnorm_fwd(be, NULL, S(y), S(h), S(rstd), S(x), S(res), S(w), rows, dim,
				       1e-5f));
	/* f64 reference of the forward. */
	double *ref = malloc(n * sizeof(double)), *dh = malloc(n * sizeof(double)),
	       *dw_ = ref_widen(hw, (size_t) dim), *db_ = ref_widen(hb, (size_t) dim);
	for (size_t i = 0; i < n; i++)
		dh[i] = (double) hx[i] + hr[i];
	ref_norm_fwd(layer, rows, dim, 1e-5, dh, dw_, db_, ref);
	free(dh), free(dw_), free(db_);
	tol t = tscale(tol_of(dt), 2);
	int ok = r >= 0 && vs_ref(&y, ref, t, "y vs f64") && parity(&y, t, "y") &&
		 parity(&h, tol_of(dt), "residual_out") && parity(&rstd, tol_of(KK_F32), "rstd") &&
		 (!layer || parity(&mean, tol_of(KK_F32), "mean"));
	tap(ok, "%s forward %s with residual (vs f64 and cpu)", layer ? "layernorm" : "rmsnorm",
	    kk_dtype_name(dt));

	r = 0;
	if (layer)
		BOTH(r, kk_layernorm_bwd(be, NULL, S(dx), S(dw), S(db), S(dy), S(dres), S(h), S(w),
					 S(mean), S(rstd), rows, dim));
	else
		BOTH(r, kk_rmsnorm_bwd(be, NULL, S(dx), S(dw), S(dy), S(dres), S(h), S(w), S(rstd),
				       rows, dim));
	ok = r >= 0 && parity(&dx, tscale(tol_of(dt), 2), "dx") &&
	     parity(&dw, tscale(tol_of(dt), 10), "dweight") &&
	     (!layer || parity(&db, tscale(tol_of(dt), 10), "dbias"));
	tap(ok, "%s backward %s (dx, dweight%s vs cpu)", layer ? "layernorm" : "rmsnorm",
	    kk_dtype_name(dt), layer ? ", dbias" : "");
	free(hx), free(hr), free(hw), free(hb), free(hdy), free(hdr), free(ref);
	unpair(&x), unpair(&res), unpair(&w), unpair(&b), unpair(&y), unpair(&h), unpair(&mean);
	unpair(&rstd), unpair(&dy), unpair(&dres), unpair(&dx), unpair(&dw), unpair(&db);
}

/* ---- RoPE, activations, softmax, embedding, cross-entropy ---------------- */

static void test_rope(kk_dtype dt, kk_rope_mode mode)
{
	const int64_t tokens = 50;
	const int heads = 4, hd = 64, rot = 48;
	size_t n = (size_t) tokens * heads * hd;
	float *hx = rand_vec(n, 1);
	int32_t pos[50];
	for (int i = 0; i < 50; i++)
		pos[i] = (i * 977) % 9000; /* large positions: angle precision matters */
	/* Llama 3.1-style divisors (1, a blend, 8) at theta 500000 */
	float div[24];
	for (int i = 0; i < 24; i++)
		div[i] = i < 6 ? 1.0f : i > 15 ? 8.0f : 1.0f + 7.0f * (float) (i - 6) / 10;
	pair x = mk(dt, n, hx), p = mk(KK_I32, 50, pos), f = mk(KK_F32, 24, div);
	int r = 0;
	BOTH(r,
	     kk_rope(be, NULL, S(x), S(p), tokens, heads, hd, rot, 500000.0f, S(f), mode, false));
	int ok = r >= 0 && parity(&x, tscale(tol_of(dt), 2), "rope fwd");
	BOTH(r, kk_rope(be, NULL, S(x), S(p), tokens, heads, hd, rot, 500000.0f, S(f), mode, true));
	/* backward(forward(x)) == x */
	round_to(dt, hx, n);
	double *ref = malloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++)
		ref[i] = hx[i];
	ok = ok && r >= 0 && vs_ref(&x, ref, tscale(tol_of(dt), 3), "rope round trip");
	tap(ok, "rope %s %s, scaled: forward vs cpu, backward(forward(x)) == x",
	    mode == KK_ROPE_HALF ? "half-split" : "interleaved", kk_dtype_name(dt));
	free(hx), free(ref);
	unpair(&x), unpair(&p), unpair(&f);
}

static void test_act(kk_dtype dt)
{
	const size_t n = 10007;
	float *hx = rand_vec(n, 4), *hu = rand_vec(n, 2), *hdy = rand_vec(n, 1);
	pair x = mk(dt, n, hx), u = mk(dt, n, hu), dy = mk(dt, n, hdy), y = mk(dt, n, NULL),
	     dx = mk(dt, n, NULL);
	int ok = 1;
	for (int a = 0; a < 2; a++) {
		int r = 0;
		poison(&y), poison(&dx);
		BOTH(r, kk_act_fwd(be, NULL, (kk_act) a, S(y), S(x), n));
		BOTH(r, kk_act_bwd(be, NULL, (kk_act) a, S(dx), S(dy), S(x), n));
		ok = ok && r >= 0 && parity(&y, tol_of(dt), "act fwd") &&
		     parity(&dx, tol_of(dt), "act bwd");
	}
	tap(ok, "silu and gelu forward/backward %s vs cpu", kk_dtype_name(dt));

	int r = 0;
	poison(&y), poison(&dx);
	pair du = mk(dt, n, NULL);
	BOTH(r, kk_swiglu_fwd(be, NULL, S(y), S(x), S(u), n));
	BOTH(r, kk_swiglu_bwd(be, NULL, S(dx), S(du), S(dy), S(x), S(u), n));
	tap(r >= 0 && parity(&y, tol_of(dt), "swiglu fwd") && parity(&dx, tol_of(dt), "dgate") &&
		    parity(&du, tol_of(dt), "dup"),
	    "swiglu forward/backward %s vs cpu", kk_dtype_name(dt));
	free(hx), free(hu), free(hdy);
	unpair(&x), unpair(&u), unpair(&dy), unpair(&y), unpair(&dx), unpair(&du);
}

static void test_softmax_xent(kk_dtype dt)
{
	const int64_t rows = 33, cols = 5003;
	size_t n = (size_t) (rows * cols);
	float *hx = rand_vec(n, 8);
	round_to(dt, hx, n);
	int32_t tg[33];
	for (int i = 0; i < 33; i++)
		tg[i] = i == 5 ? -1 : (i * 7919) % (int) cols; /* row 5 ignored */
	pair x = mk(dt, n, hx), y = mk(dt, n, NULL), t = mk(KK_I32, 33, tg),
	     loss = mk(KK_F32, 33, NULL);
	int r = 0;
	BOTH(r, kk_softmax(be, NULL, S(y), S(x), rows, cols));
	double *ref = malloc(n * sizeof(double)), lref[33], *dx = ref_widen(hx, n);
	ref_softmax(dx, rows, cols, ref);
	for (int64_t i = 0; i < rows; i++)
		lref[i] = ref_cross_entropy_row(dx + i * cols, cols, tg[i]);
	free(dx);
	tol ts = { tol_of(dt).atol * 0.01, tol_of(dt).rtol }; /* probabilities ~1/cols */
	tap(r >= 0 && vs_ref(&y, ref, ts, "softmax vs f64") && parity(&y, ts, "softmax"),
	    "softmax %s (vs f64 and cpu)", kk_dtype_name(dt));
	r = 0;
	BOTH(r, kk_cross_entropy_fwd(be, NULL, S(loss), S(x), S(t), rows, cols));
	int ok = r >= 0 && vs_ref(&loss, lref, tol_of(KK_F32), "xent vs f64") &&
		 parity(&loss, tol_of(KK_F32), "xent");
	r = 0;
	poison(&y);
	BOTH(r, kk_cross_entropy_bwd(be, NULL, S(y), S(x), S(t), rows, cols, 1.0f / 32));
	ok = ok && r >= 0 && parity(&y, ts, "xent bwd");
	tap(ok, "cross-entropy forward (vs f64) and backward %s vs cpu, ignored target",
	    kk_dtype_name(dt));
	free(hx), free(ref);
	unpair(&x), unpair(&y), unpair(&t), unpair(&loss);
}

static void test_embedding(kk_dtype dt)
{
	const int64_t vocab = 300, dim = 96, tokens = 77;
	float *ht = rand_vec((size_t) (vocab * dim), 1), *hd = rand_vec((size_t) (tokens * dim), 1);
	int32_t ids[77];
	for (int i = 0; i < 77; i++)
		ids[i] = (i * 31) % 40; /* repeats: the backward must accumulate */
	float *zeros = calloc((size_t) (vocab * dim), sizeof(float));
	pair tab = mk(dt, (size_t) (vocab * dim), ht), id = mk(KK_I32, 77, ids),
	     out = mk(dt, (size_t) (tokens * dim), NULL),
	     dout = mk(dt, (size_t) (tokens * dim), hd),
	     dtab = mk(KK_F32, (size_t) (vocab * dim), zeros);
	int r = 0;
	BOTH(r, kk_embedding_fwd(be, NULL, S(out), S(tab), S(id), tokens, vocab, dim));
	BOTH(r, kk_embedding_bwd(be, NULL, S(dtab), S(dout), S(id), tokens, vocab, dim));
	tap(r >= 0 && parity(&out, (tol){ 0, 0 }, "embedding fwd") &&
		    parity(&dtab, tol_of(KK_F32), "embedding bwd"),
	    "embedding forward (exact) and backward (accumulated) %s vs cpu", kk_dtype_name(dt));
	free(ht), free(hd), free(zeros);
	unpair(&tab), unpair(&id), unpair(&out), unpair(&dout), unpair(&dtab);
}

/* ---- optimizer ----------------------------------------------------------- */

static void test_adamw(kk_dtype gdt)
{
	const size_t n = 5000;
	float *hm = rand_vec(n, 1), *hg = rand_vec(n, 1), *hmm = rand_vec(n, 0.1f),
	      *hv = rand_vec(n, 0.1f);
	for (size_t i = 0; i < n; i++)
		hv[i] = fabsf(hv[i]);
	pair master = mk(KK_F32, n, hm), g = mk(gdt, n, hg), m = mk(KK_F32, n, hmm),
	     v = mk(KK_F32, n, hv), p = mk(KK_BF16, n, NULL);
	kk_adamw_params ap = kiln_test_adamw(1e-2f, 3, 0.5f);
	int r = 0;
	BOTH(r, kk_adamw(be, NULL, S(master), S(p), S(g), S(m), S(v), n, &ap));
	tap(r >= 0 && parity(&master, tol_of(KK_F32), "master") &&
		    parity(&m, tol_of(KK_F32), "m") && parity(&v, tol_of(KK_F32), "v") &&
		    parity(&p, tol_of(KK_BF16), "bf16 copy"),
	    "adamw step (grads %s, bf16 copy) vs cpu", kk_dtype_name(gdt));

	/* grad norm over three buffers of mixed dtypes, then clipping. */
	pair g2 = mk(KK_BF16, 777, hg), g3 = mk(KK_F16, 4096, hm), out = mk(KK_F32, 1, NULL);
	r = 0;
	BOTH(r, kk_grad_norm(be, NULL, S(out), (kk_buffer *[]){ S(g), S(g2), S(g3) }, 3));
	int ok = r >= 0 && parity(&out, tol_of(KK_F32), "grad norm");
	float norms[2] = { 0, 0 };
	for (int side = 0; side < 2; side++) {
		int rr = kk_grad_clip(be_side[side], NULL, (kk_buffer *[]){ g.b[side], g2.b[side] },
				      2, 1.0f, &norms[side]);
		if (rr < 0)
			ok = 0;
	}
	ok = ok && fabsf(norms[0] - norms[1]) <= 1e-4f * norms[0] &&
	     parity(&g, tol_of(gdt), "clipped") && parity(&g2, tol_of(KK_BF16), "clipped bf16");
	tap(ok, "grad norm (mixed dtypes) and clip vs cpu");
	free(hm), free(hg), free(hmm), free(hv);
	unpair(&master), unpair(&g), unpair(&m), unpair(&v), unpair(&p), unpair(&g2), unpair(&g3);
	unpair(&out);
}

/* ---- sampling ------------------------------------------------------------ */

static void test_sample(kk_dtype dt)
{
	/* KILN_TEST_SMALL=1 (the CPU emulation, tests/gpu/emu) samples
	 * 8 rows instead of 64: each row is ~100 block-wide passes there. */
	const char *small = getenv("KILN_TEST_SMALL");
	const int64_t rows = small && streq(small, "1") ? 8 : 64, vocab = 32003;
	size_t n = (size_t) (rows * vocab);
	float *hl = rand_vec(n, 6);
	pair l = mk(dt, n, hl), ids = mk(KK_I32, (size_t) rows, NULL);
	const kk_sampling cases[] = {
		{ .temperature = 0, .seed = 1 },
		{ .temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 42 },
		{ .temperature = 1.0f, .top_k = 50, .top_p = 1.0f, .seed = 7 },
		{ .temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .seed = 9 },
		{ .temperature = 1.2f, .top_k = 1024, .top_p = 0.5f, .seed = 11 },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int r = 0;
		poison(&ids);
		BOTH(r, kk_sample(be, NULL, S(ids), S(l), rows, vocab, &cases[c]));
		float *a = get(&ids, 0), *b = get(&ids, 1);
		/* Repeat on cuda: the same seed must give the same tokens. */
		int rr = kk_sample(be_side[1], NULL, ids.b[1], l.b[1], rows, vocab, &cases[c]);
		float *b2 = get(&ids, 1);
		int same = 0, repro = rr >= 0, valid = 1;
		for (int64_t i = 0; i < rows; i++) {
			same += a[i] == b[i];
			repro = repro && b[i] == b2[i];
			valid = valid && b[i] >= 0 && b[i] < vocab;
		}
		/* Rounding may move a draw that lands on a boundary; allow 2 rows. */
		int need = cases[c].temperature == 0 ? (int) rows : (int) rows - 2;
		if (same < need)
			printf("# %d of %lld rows equal to cpu\n", same, (long long) rows);
		tap(r >= 0 && valid && repro && same >= need,
		    "sample %s T=%.1f top_k=%d top_p=%.2f: reproducible, matches cpu",
		    kk_dtype_name(dt), cases[c].temperature, cases[c].top_k, cases[c].top_p);
		free(a), free(b), free(b2);
	}
	free(hl);
	unpair(&l), unpair(&ids);
}

/* ---- quantization -------------------------------------------------------- */

static void test_quant(kk_dtype qt, int group, kk_dtype xdt)
{
	const int64_t n = 200, k = 512;
	float *hw = rand_vec((size_t) (n * k), 1), *hb = rand_vec((size_t) n, 1);
	pair w = mk(xdt, (size_t) (n * k), hw), wd = mk(xdt, (size_t) (n * k), NULL),
	     bias = mk(KK_F32, (size_t) n, hb);
	kk_qmatrix *q[2] = { NULL, NULL };
	int r = 0;
	for (int s = 0; s < 2; s++) {
		int rr = kk_qmatrix_alloc(be_side[s], qt, n, k, group, KK_F32, &q[s]);
		if (rr >= 0)
			rr = kk_quantize(be_side[s], NULL, q[s], w.b[s]);
		if (rr >= 0)
			rr = kk_dequantize(be_side[s], NULL, wd.b[s], q[s]);
		if (rr < 0) {
			printf("# %s side: quantize/dequantize: %s\n", kk_backend_name(be_side[s]),
			       strerror(-rr));
			r = rr;
		}
	}
	/* Dequantized weights agree with cpu up to one quantization step on a
	 * rounding tie; the scale step is max|w|/127 or /7. */
	double step = qt == KK_I8 ? 1.0 / 127 : 1.0 / 7;
	int ok = r >= 0 && parity(&wd, (tol){ step * 1.01 + tol_of(xdt).atol, tol_of(xdt).rtol },
				  "dequantized");
	for (int64_t m = 1; ok && m <= 33; m += 31) {
		float *hx = rand_vec((size_t) (m * k), 1);
		pair x = mk(xdt, (size_t) (m * k), hx), y = mk(xdt, (size_t) (m * n), NULL);
		for (int s = 0; s < 2; s++) {
			int rr = kk_qgemm(be_side[s], NULL, y.b[s], x.b[s], q[s], bias.b[s], m);
			if (rr < 0) {
				printf("# %s side: qgemm m=%ld: %s\n", kk_backend_name(be_side[s]),
				       (long) m, strerror(-rr));
				r = rr;
			}
		}
		ok = r >= 0 && qgemm_check(&y, &x, &wd, hb, m, n, k, tscale(tol_of(xdt), 20),
					   m == 1 ? "qgemv" : "qgemm");
		free(hx);
		unpair(&x), unpair(&y);
	}
	tap(ok, "%s%s quantize/dequantize/qgemm (m=1, m=32) x %s vs cpu", kk_dtype_name(qt),
	    qt == KK_Q4 ? (group == 32	 ? "/g32"
			   : group == 64 ? "/g64"
					 : "/g128")
			: "",
	    kk_dtype_name(xdt));
	for (int s = 0; s < 2; s++)
		kk_qmatrix_free(q[s]);
	free(hw), free(hb);
	unpair(&w), unpair(&wd), unpair(&bias);
}

/* ---- attention ----------------------------------------------------------- */

/* Range of the random queries of the attention tests (see test_attention). */
#define ATTN_Q_SCALE 6.0f

/* The f64 reference of packed attention over float inputs. */
static void attn_ref(const float *q, const float *k, const float *v, const int32_t *cu, int ns,
		     int hq, int hkv, int d, bool causal, double *o)
{
	size_t nq = (size_t) cu[ns] * hq * d, nk = (size_t) cu[ns] * hkv * d;
	double *dq = ref_widen(q, nq), *dk = ref_widen(k, nk), *dv = ref_widen(v, nk);
	ref_attention(dq, dk, dv, cu, ns, hq, hkv, d, causal, o, NULL);
	free(dq), free(dk), free(dv);
}

/* The f64 gradients of packed attention over float inputs (dout included). */
static void attn_bwd_ref(const float *q, const float *k, const float *v, const float *dout,
			 const int32_t *cu, int ns, int hq, int hkv, int d, bool causal, double *gq,
			 double *gk, double *gv)
{
	size_t nq = (size_t) cu[ns] * hq * d, nk = (size_t) cu[ns] * hkv * d;
	double *dq = ref_widen(q, nq), *dk = ref_widen(k, nk), *dv = ref_widen(v, nk),
	       *dd = ref_widen(dout, nq);
	ref_attention_bwd(dq, dk, dv, dd, cu, ns, hq, hkv, d, causal, gq, gk, gv);
	free(dq), free(dk), free(dv), free(dd);
}

/* Tolerance of a gradient against its f64 value: twice the dtype's rtol,
 * and an atol of that rtol times the tensor's largest |value| (the 16-bit
 * kernels round P and dS to the input type before their products, as
 * FlashAttention-2 does, so the error follows the gradient's scale). */
static tol attn_bwd_tol(kk_dtype dt, const double *ref, size_t n)
{
	double mx = 0;
	for (size_t i = 0; i < n; i++)
		mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
	tol t = tscale(tol_of(dt), 2);
	t.atol = t.rtol * (mx > 1 ? mx : 1);
	return t;
}

/* The f64 reference of paged attention over float inputs: n_seqs
 * sequences in the cache's blocks, with query rows cu_q (NULL: one each). */
static void paged_ref(const float *q, size_t nq, const float *kc, const float *vc, size_t ncache,
		      const int32_t *bt, int maxb, const int32_t *lens, const int32_t *cu_q, int ns,
		      int hq, int hkv, int d, double *o)
{
	double *dq = ref_widen(q, nq), *dk = ref_widen(kc, ncache), *dv = ref_widen(vc, ncache);
	ref_attention_paged(dq, dk, dv, bt, maxb, lens, cu_q, ns, hq, hkv, d, o);
	free(dq), free(dk), free(dv);
}

/* Attention over packed sequences of the given lengths (at most 8), GQA
 * hq/hkv; the backward too when bwd.  Lengths that are not multiples of the
 * kernels' 64-row tiles (1, 15, 17, 63, 65, 130 ...) test the edge masking. */
static void test_attention(kk_dtype dt, int d, bool causal, int hq, int hkv, const int *lens,
			   int ns, bool bwd)
{
	int32_t cu[9] = { 0 };
	int T = 0, maxlen = 1;
	for (int i = 0; i < ns; i++) {
		cu[i + 1] = cu[i] + lens[i];
		maxlen = lens[i] > maxlen ? lens[i] : maxlen;
	}
	T = cu[ns];
	size_t nq = (size_t) T * hq * d, nk = (size_t) T * hkv * d;
	/* q in [-6, 6]: scaled scores spread over a few units, so the softmax
	 * is peaked and outputs are O(0.3), well above the bf16 atol (with q in
	 * [-1, 1] it is nearly uniform and outputs shrink toward 0 as lengths
	 * grow, which would hide mis-weighted tiles). */
	float *hq_ = rand_vec(nq, ATTN_Q_SCALE), *hk = rand_vec(nk, 1), *hv = rand_vec(nk, 1),
	      *hdo = rand_vec(nq, 1);
	round_to(dt, hq_, nq), round_to(dt, hk, nk), round_to(dt, hv, nk), round_to(dt, hdo, nq);
	pair q = mk(dt, nq, hq_), k = mk(dt, nk, hk), v = mk(dt, nk, hv), o = mk(dt, nq, NULL),
	     lse = mk(KK_F32, (size_t) T * hq, NULL), cus = mk(KK_I32, (size_t) ns + 1, cu),
	     dout = mk(dt, nq, hdo), dq = mk(dt, nq, NULL), dk = mk(dt, nk, NULL),
	     dv = mk(dt, nk, NULL);
	int r = 0;
	kk_attn_desc ad = kiln_test_attn(hq, hkv, d, causal, ns, T, maxlen, NULL);
	BOTH(r, (ad.cu_seqlens = S(cus),
		 kk_attention_fwd(be, NULL, &ad, S(o), S(lse), S(q), S(k), S(v))));
	double *ref = malloc(nq * sizeof(double));
	attn_ref(hq_, hk, hv, cu, ns, hq, hkv, d, causal, ref);
	tol t = tscale(tol_of(dt), 2);
	tap(r >= 0 && vs_ref(&o, ref, t, "attention vs f64") && parity(&o, t, "attention") &&
		    parity(&lse, tol_of(KK_F32), "lse"),
	    "attention forward %s d=%d %s varlen (%d seqs, max %d) GQA %d/%d (vs f64 and cpu)",
	    kk_dtype_name(dt), d, causal ? "causal" : "non-causal", ns, maxlen, hq, hkv);
	r = 0;
	if (bwd)
		BOTH(r, (ad.cu_seqlens = S(cus),
			 kk_attention_bwd(be, NULL, &ad, S(dq), S(dk), S(dv), S(dout), S(q), S(k),
					  S(v), S(o), S(lse))));
	t = tscale(tol_of(dt), 5);
	if (bwd) {
		/* The f64 gradients: dq, dk, dv against them with an atol scaled
		 * by each tensor's largest |gradient| (dk grows with |q| = 6). */
		double *rq = malloc(nq * sizeof(double)), *rk = malloc(nk * sizeof(double)),
		       *rv = malloc(nk * sizeof(double));
		attn_bwd_ref(hq_, hk, hv, hdo, cu, ns, hq, hkv, d, causal, rq, rk, rv);
		bool okr = r >= 0 && vs_ref(&dq, rq, attn_bwd_tol(dt, rq, nq), "dq vs f64") &&
			   vs_ref(&dk, rk, attn_bwd_tol(dt, rk, nk), "dk vs f64") &&
			   vs_ref(&dv, rv, attn_bwd_tol(dt, rv, nk), "dv vs f64");
		tap(okr && parity(&dq, t, "dq") && parity(&dk, t, "dk") && parity(&dv, t, "dv"),
		    "attention backward %s d=%d %s varlen (%d seqs, max %d) GQA %d/%d (dq, dk, dv "
		    "vs f64 and cpu)",
		    kk_dtype_name(dt), d, causal ? "causal" : "non-causal", ns, maxlen, hq, hkv);
		free(rq), free(rk), free(rv);
	}
	free(hq_), free(hk), free(hv), free(hdo), free(ref);
	unpair(&q), unpair(&k), unpair(&v), unpair(&o), unpair(&lse), unpair(&cus);
	unpair(&dout), unpair(&dq), unpair(&dk), unpair(&dv);
}

/* Paged prefill (kk_attention_paged): 3 sequences with contexts lens[s]
 * (at most 320) bringing the last qlens[s] of them as query rows. */
static void test_paged(kk_dtype dt, int d, int hq, int hkv, const int32_t *lens,
		       const int32_t *qlens)
{
	const int ns = 3, nblocks = 64, maxb = 20;
	int maxlen = 1;
	int32_t cu[4] = { 0 };
	for (int i = 0; i < ns; i++) {
		maxlen = lens[i] > maxlen ? lens[i] : maxlen;
		cu[i + 1] = cu[i] + qlens[i];
	}
	size_t row = (size_t) hkv * d, ncache = (size_t) nblocks * KK_KV_BLOCK_SIZE * row;
	size_t nq = (size_t) cu[ns] * hq * d;
	float *hkc = rand_vec(ncache, 1), *hvc = rand_vec(ncache, 1),
	      *hq_ = rand_vec(nq, ATTN_Q_SCALE);
	round_to(dt, hkc, ncache), round_to(dt, hvc, ncache), round_to(dt, hq_, nq);
	int32_t bt[3 * 20];
	for (int i = 0; i < 3 * 20; i++)
		bt[i] = (i * 11 + 5) % nblocks;
	pair kc = mk(dt, ncache, hkc), vc = mk(dt, ncache, hvc), q = mk(dt, nq, hq_),
	     o = mk(dt, nq, NULL), bts = mk(KK_I32, 60, bt), ls = mk(KK_I32, 3, lens),
	     cus = mk(KK_I32, 4, cu);
	int r = 0;
	kk_paged_desc pd = kiln_test_paged(hq, hkv, d, ns, nblocks, maxb, maxlen, NULL, NULL);
	pd.total_q = cu[ns];
	BOTH(r, (pd.block_tables = S(bts), pd.context_lens = S(ls), pd.cu_q = S(cus),
		 kk_attention_paged(be, NULL, &pd, S(o), S(q), S(kc), S(vc))));
	double *ref = malloc(nq * sizeof(double));
	paged_ref(hq_, nq, hkc, hvc, ncache, bt, maxb, lens, cu, ns, hq, hkv, d, ref);
	tol t = tscale(tol_of(dt), 2);
	tap(r >= 0 && vs_ref(&o, ref, t, "paged vs f64") && parity(&o, t, "paged"),
	    "paged prefill attention %s d=%d GQA %d/%d contexts %d, %d, %d, query rows %d, %d, "
	    "%d (vs f64 and cpu)",
	    kk_dtype_name(dt), d, hq, hkv, lens[0], lens[1], lens[2], qlens[0], qlens[1], qlens[2]);
	free(hkc), free(hvc), free(hq_), free(ref);
	unpair(&kc), unpair(&vc), unpair(&q), unpair(&o), unpair(&bts), unpair(&ls), unpair(&cus);
}

/* Paged decode of 3 sequences of the given context lengths (at most 320),
 * GQA hq/hkv; with cache_write, the kv cache write test too.  Contexts past
 * 64 tokens make the cuda backend split the keys (and combine).  The cache is
 * never cleared in service, so the slots of each last page past the context
 * hold NaN here (K and V), and the block table's entries past each context
 * are -1 (gaps no kernel may read). */
static void test_decode(kk_dtype dt, int d, int hq, int hkv, const int32_t *lens, bool cache_write)
{
	const int ns = 3, nblocks = 64, maxb = 20;
	int maxlen = 1;
	for (int i = 0; i < ns; i++)
		maxlen = lens[i] > maxlen ? lens[i] : maxlen;
	size_t row = (size_t) hkv * d, ncache = (size_t) nblocks * KK_KV_BLOCK_SIZE * row;
	float *hkc = rand_vec(ncache, 1), *hvc = rand_vec(ncache, 1),
	      *hq_ = rand_vec((size_t) ns * hq * d, ATTN_Q_SCALE); /* see test_attention */
	round_to(dt, hkc, ncache), round_to(dt, hvc, ncache),
		round_to(dt, hq_, (size_t) ns * hq * d);
	int32_t bt[3 * 20];
	for (int i = 0; i < 3 * 20; i++)
		bt[i] = (i * 7 + 3) % nblocks; /* scattered, distinct blocks */
	float *pkc = malloc(ncache * sizeof(float)), *pvc = malloc(ncache * sizeof(float));
	memcpy(pkc, hkc, ncache * sizeof(float)), memcpy(pvc, hvc, ncache * sizeof(float));
	for (int sq = 0; sq < ns; sq++) {
		int pages = (lens[sq] + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE;
		size_t page = (size_t) bt[sq * maxb + pages - 1];
		for (size_t e = (page * KK_KV_BLOCK_SIZE +
				 (size_t) (lens[sq] - (pages - 1) * KK_KV_BLOCK_SIZE)) *
				row;
		     e < (page + 1) * KK_KV_BLOCK_SIZE * row; e++)
			pkc[e] = pvc[e] = NAN;
		for (int b = pages; b < maxb; b++)
			bt[sq * maxb + b] = -1;
	}
	pair kc = mk(dt, ncache, pkc), vc = mk(dt, ncache, pvc),
	     q = mk(dt, (size_t) ns * hq * d, hq_), o = mk(dt, (size_t) ns * hq * d, NULL),
	     bts = mk(KK_I32, 60, bt), ls = mk(KK_I32, 3, lens);
	int r = 0;
	kk_paged_desc pd = kiln_test_paged(hq, hkv, d, ns, nblocks, maxb, maxlen, NULL, NULL);
	BOTH(r, (pd.block_tables = S(bts), pd.context_lens = S(ls),
		 kk_attention_decode(be, NULL, &pd, S(o), S(q), S(kc), S(vc))));
	double *ref = malloc((size_t) ns * hq * d * sizeof(double));
	paged_ref(hq_, (size_t) ns * hq * d, hkc, hvc, ncache, bt, maxb, lens, NULL, ns, hq, hkv, d,
		  ref);
	tol t = tscale(tol_of(dt), 2);
	tap(r >= 0 && vs_ref(&o, ref, t, "decode vs f64") && parity(&o, t, "decode"),
	    "paged decode attention %s d=%d GQA %d/%d contexts %d, %d, %d (vs f64 and cpu)",
	    kk_dtype_name(dt), d, hq, hkv, lens[0], lens[1], lens[2]);
	free(pkc), free(pvc), free(hq_), free(ref);
	unpair(&kc), unpair(&vc);
	if (!cache_write) {
		free(hkc), free(hvc);
		unpair(&q), unpair(&o), unpair(&bts), unpair(&ls);
		return;
	}
	kc = mk(dt, ncache, hkc), vc = mk(dt, ncache, hvc); /* no NaN: compared exactly */
	free(hkc), free(hvc);

	/* kv_cache_write: 5 tokens into chosen slots, one skipped. */
	int32_t slots[5] = { 17, -1, 3 * 16 + 5, 600, 2 };
	float *hk5 = rand_vec(5 * row, 1), *hv5 = rand_vec(5 * row, 1);
	pair k5 = mk(dt, 5 * row, hk5), v5 = mk(dt, 5 * row, hv5), sl = mk(KK_I32, 5, slots);
	r = 0;
	BOTH(r, kk_kv_cache_write(be, NULL, S(kc), S(vc), S(k5), S(v5), S(sl), 5, hkv, d, nblocks));
	tap(r >= 0 && parity(&kc, (tol){ 0, 0 }, "k cache") &&
		    parity(&vc, (tol){ 0, 0 }, "v cache"),
	    "kv cache write %s d=%d (exact, negative slot skipped)", kk_dtype_name(dt), d);
	free(hk5), free(hv5);
	unpair(&kc), unpair(&vc), unpair(&q), unpair(&o), unpair(&bts), unpair(&ls);
	unpair(&k5), unpair(&v5), unpair(&sl);
}

/* ---- cast/scale and collectives ------------------------------------------ */

static void test_cast_scale(void)
{
	const size_t n = 3001;
	float *h = rand_vec(n, 3);
	pair a = mk(KK_F32, n, h), b = mk(KK_BF16, n, NULL), c = mk(KK_F16, n, NULL);
	int r = 0;
	BOTH(r, kk_cast(be, NULL, S(b), S(a), n));
	BOTH(r, kk_cast(be, NULL, S(c), S(b), n));
	BOTH(r, kk_scale(be, NULL, S(c), -0.37f, n));
	tap(r >= 0 && parity(&b, (tol){ 0, 0 }, "cast") && parity(&c, tol_of(KK_F16), "scale"),
	    "cast f32->bf16 (exact) ->f16, scale vs cpu");
	free(h);
	unpair(&a), unpair(&b), unpair(&c);
}

static void test_comm(void)
{
	char id[KK_COMM_ID_BYTES];
	kk_comm *c = NULL;
	const size_t n = 1000;
	float *h = rand_vec(n, 1);
	kk_buffer *send = NULL, *recv = NULL;
	int r = kk_comm_get_id(be_side[1], id, sizeof(id));
	if (r >= 0)
		r = kk_comm_init(be_side[1], 0, 1, id, sizeof(id), &c);
	if (r >= 0)
		r = kk_buffer_alloc(be_side[1], KK_F32, n, &send);
	if (r >= 0)
		r = kk_buffer_alloc(be_side[1], KK_F32, n, &recv);
	if (r >= 0)
		r = kk_buffer_upload(be_side[1], NULL, send, 0, h, n * sizeof(float));
	if (r >= 0)
		r = kk_all_reduce(c, NULL, recv, send, n, KK_SUM);
	if (r >= 0)
		r = kk_broadcast(c, NULL, recv, n, 0);
	float *back = calloc(n, sizeof(float));
	if (r >= 0)
		r = kk_buffer_download(be_side[1], NULL, recv, 0, back, n * sizeof(float));
	int ok = r >= 0 && memcmp(back, h, n * sizeof(float)) == 0;
	if (r < 0)
		printf("# nccl: %s\n", strerror(-r));
	tap(ok, "nccl single-rank all-reduce + broadcast round trip");
	kk_buffer_free(send), kk_buffer_free(recv), kk_comm_free(c);
	free(h), free(back);
}

int main(void)
{
	int r = parity_open(N_TESTS);
	if (r <= 0)
		return -r;
	/* KILN_TEST_FILTER=WORD: only the tests whose name holds WORD (e.g.
	 * "attn" for the attention ones; the CPU emulation is slow). */
	const char *flt = getenv("KILN_TEST_FILTER");
#define RUN(name, call)                                 \
	do {                                            \
		if (!flt || !*flt || strstr(name, flt)) \
			call;                           \
	} while (0)
	static const int L1[] = { 1, 69, 37, 93 }, L2[] = { 15, 17, 63, 65, 130 },
			 L3[] = { 130, 1, 65 }, L4[] = { 17, 63 };
	static const int32_t D1[] = { 1, 77, 190 }, D2[] = { 16, 17, 300 }, D3[] = { 1, 300, 64 },
			     D4[] = { 15, 300, 17 }, D5[] = { 190, 15, 77 }, D6[] = { 300, 1, 17 };
	static const int32_t P1[] = { 40, 100, 33 }, PQ1[] = { 1, 7, 33 }, P2[] = { 17, 300, 64 },
			     PQ2[] = { 17, 16, 2 };
	RUN("cast", test_cast_scale());						     /* 1 */
	RUN("gemm", test_gemm(KK_F32, KK_F32, false, false, 0, KK_EPI_NONE, false)); /* 2 */
	RUN("gemm", test_gemm(KK_BF16, KK_BF16, false, true, 0, KK_EPI_NONE, true)); /* 3 */
	RUN("gemm", test_gemm(KK_F16, KK_F16, true, false, 3, KK_EPI_NONE, false));  /* 4 */
	RUN("gemm", test_gemm(KK_BF16, KK_F32, true, true, 2, KK_EPI_GELU, true));   /* 5 */
	RUN("gemm", test_gemm(KK_BF16, KK_BF16, false, false, 0, KK_EPI_SILU, 2));   /* 6 */
	RUN("gemm", test_gemm(KK_F32, KK_F32, false, true, 0, KK_EPI_GELU, false));  /* 7 */
	RUN("norm", test_norm(KK_F32, false));					     /* 8, 9 */
	RUN("norm", test_norm(KK_BF16, false));					     /* 10, 11 */
	RUN("norm", test_norm(KK_BF16, true));					     /* 12, 13 */
	RUN("rope", test_rope(KK_F32, KK_ROPE_INTERLEAVED));			     /* 14 */
	RUN("rope", test_rope(KK_BF16, KK_ROPE_HALF));				     /* 15 */
	for (size_t i = 0; i < 2; i++)
		RUN("act", test_act(FLOAT_DTS[i]));    /* 16-19 */
	RUN("softmax", test_softmax_xent(KK_F32));     /* 20, 21 */
	RUN("softmax", test_softmax_xent(KK_BF16));    /* 22, 23 */
	RUN("embedding", test_embedding(KK_BF16));     /* 24 */
	RUN("adamw", test_adamw(KK_BF16));	       /* 25, 26 */
	RUN("quant", test_quant(KK_I8, 0, KK_BF16));   /* 27 */
	RUN("quant", test_quant(KK_Q4, 32, KK_F16));   /* 28 */
	RUN("quant", test_quant(KK_Q4, 128, KK_BF16)); /* 29 */
	/* 30-44: attention forward and backward (bf16/f16 on the tensor-core
	 * kernels, f32 on the FMA ones) */
	RUN("attn bwd", test_attention(KK_BF16, 128, true, 8, 2, L1, 4, true));
	RUN("attn bwd", test_attention(KK_F32, 64, false, 8, 2, L1, 4, true));
	RUN("attn bwd", test_attention(KK_F16, 64, true, 8, 2, L2, 5, true));
	RUN("attn bwd", test_attention(KK_BF16, 64, false, 4, 1, L3, 3, true));
	RUN("attn bwd", test_attention(KK_F16, 128, false, 2, 2, L4, 2, true));
	RUN("attn", test_attention(KK_BF16, 128, true, 6, 3, L3, 3, false));
	RUN("attn bwd gqa8", test_attention(KK_F16, 128, false, 8, 1, L4, 2, true));
	RUN("attn bwd gqa8", test_attention(KK_BF16, 64, true, 8, 1, L3, 3, true));
	/* 45-53: paged decode (16-bit: split over the context, then combined;
	 * GQA groups of 4 or more heads on the mma kernel, 1 and 2 on the
	 * CUDA-core one) */
	RUN("attn decode", test_decode(KK_BF16, 128, 8, 2, D1, true));
	RUN("attn decode", test_decode(KK_F16, 64, 8, 1, D2, false));
	RUN("attn decode", test_decode(KK_BF16, 64, 16, 1, D3, false));
	RUN("attn decode", test_decode(KK_F32, 128, 4, 2, D2, false));
	RUN("attn decode", test_decode(KK_BF16, 128, 32, 8, D4, false));
	RUN("attn decode", test_decode(KK_F16, 64, 32, 1, D5, false)); /* two 16-head slices */
	RUN("attn decode", test_decode(KK_F16, 128, 4, 4, D5, false));
	RUN("attn decode", test_decode(KK_BF16, 64, 8, 4, D6, false));
	RUN("sample", test_sample(KK_F32)); /* 54-58 */
	RUN("comm", test_comm());	    /* 59 */
	/* 60-62: paged prefill (query rows continuing a cached context) */
	RUN("attn paged", test_paged(KK_BF16, 128, 8, 2, P1, PQ1));
	RUN("attn paged", test_paged(KK_F16, 64, 4, 4, P2, PQ2));
	RUN("attn paged", test_paged(KK_F32, 64, 8, 1, P1, PQ2));
#undef RUN
	return parity_close();
}
