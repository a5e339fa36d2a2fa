/* tests/kernels/ref/ref.h — float64 references of the kk ops, one file per
 * op family (ref/<family>.c, the families of kernels/kk/include/kk_ops.def),
 * shared by the kernels suite (tests/kernels/kernels-suite.h), the cuda
 * parity tests (tests/gpu/test-kk-cuda*.c) and their emulator runs.
 *
 * Plain loops in double over host arrays, written for clarity, not speed:
 * the same layouts and conventions as kk.h (row-major, "[a, b, c]" with c
 * fastest, parameter gradients accumulated).  Inputs are what the device
 * sees (callers round them to the buffer's dtype first). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kk.h"

/* A malloc'ed double copy of n floats (NULL when out of memory). */
double *ref_widen(const float *x, size_t n);

/* ---- elementwise.c ------------------------------------------------------ */

double ref_silu(double x);
/* The tanh approximation, as kk's GELU. */
double ref_gelu(double x);

/* ---- gemm.c ------------------------------------------------------------- */

/* kk_gemm's C = epilogue(alpha op(A) op(B) + beta C0 + bias) for the shape,
 * strides, batch, alpha/beta and epilogue of d (its buffers are not used):
 * a, b, c0 (NULL: no beta term) and bias (NULL or [n]) are the host
 * operands laid out as d says; writes only the m x n elements of each C
 * (c[b * stride_c + i * ldc + j]). */
void ref_gemm(const kk_gemm_desc *d, const double *a, const double *b, const double *c0,
	      const double *bias, double *c);

/* ---- quant.c ------------------------------------------------------------ */

/* The scale of a group of n weights: max |w| / 127 (KK_I8) or / 7 (KK_Q4). */
double ref_quant_scale(const double *w, size_t n, kk_dtype qt);
/* The stored level of weight w at scale s: round-to-nearest-even of w / s,
 * clamped to [-127, 127] (KK_I8) or [-8, 7] (KK_Q4). */
double ref_quant_level(double w, double s, kk_dtype qt);
/* The most activation quantization (blocks of 32 along k, scale
 * max|x_block| / 127, round to nearest: each x off by at most half a step,
 * max|x_block| / 254) can move Y = X W^T: bound[i * n + j] =
 * sum over blocks b of max|x_i,b| / 254 * sum over l in b of |w_j,l|
 * (x [m, k], w [n, k] dequantized). */
void ref_qact_bound(const double *x, const double *w, int64_t m, int64_t n, int64_t k,
		    double *bound);

/* ---- attention.c -------------------------------------------------------- */

/* Attention over packed sequences (cu [n_seqs + 1]), GQA H / Hkv heads of
 * D, scale 1/sqrt(D): out [T, H, D] and, when lse is not NULL, the row
 * log-sum-exp of the scaled scores lse [T, H]. */
void ref_attention(const double *q, const double *k, const double *v, const int32_t *cu, int n_seqs,
		   int H, int Hkv, int D, bool causal, double *out, double *lse);
/* The gradients of sum(out * dout) for ref_attention's out: dq [T, H, D],
 * dk and dv [T, Hkv, D] (summed over each kv head's GQA group). */
void ref_attention_bwd(const double *q, const double *k, const double *v, const double *dout,
		       const int32_t *cu, int n_seqs, int H, int Hkv, int D, bool causal,
		       double *dq, double *dk, double *dv);
/* Attention over a paged KV cache ([blocks * KK_KV_BLOCK_SIZE, Hkv, D]):
 * sequence s has context_lens[s] tokens in the blocks of its row of
 * block_tables ([n_seqs, max_blocks]) and brings the last cu_q[s + 1] -
 * cu_q[s] of them as query rows (cu_q NULL: one row per sequence, the
 * decode case), each seeing the context up to itself.  out [rows, H, D]. */
void ref_attention_paged(const double *q, const double *k_cache, const double *v_cache,
			 const int32_t *block_tables, int max_blocks, const int32_t *context_lens,
			 const int32_t *cu_q, int n_seqs, int H, int Hkv, int D, double *out);
/* Token t's row (row elements) of k and v into cache slot slots[t]; a
 * negative slot is skipped. */
void ref_kv_cache_write(double *k_cache, double *v_cache, const double *k, const double *v,
			const int32_t *slots, int64_t n_tokens, size_t row);

/* ---- norm.c ------------------------------------------------------------- */

/* y = (h - mean) / sqrt(var + eps) * w (+ b) per row of h [rows, dim]; mean
 * 0 for RMSNorm (layer false), b NULL for none.  h is x + residual. */
void ref_norm_fwd(bool layer, int64_t rows, int64_t dim, double eps, const double *h,
		  const double *w, const double *b, double *y);
/* The parameter gradients of the above: dw += sum over rows of dy * (h -
 * mean) / sqrt(var + eps), db += sum of dy (db may be NULL). */
void ref_norm_dparams(bool layer, int64_t rows, int64_t dim, double eps, const double *h,
		      const double *dy, double *dw, double *db);

/* ---- rope.c ------------------------------------------------------------- */

/* y = RoPE(x) forward for x [tokens, H, D] at positions pos: pair i of the
 * first rot dims (rot 0: D) turns by pos * inv_freq[i] (plain RoPE:
 * theta^(-2i/rot)); y may be x. */
void ref_rope(double *y, const double *x, const int32_t *pos, int64_t tokens, int H, int D, int rot,
	      const double *inv_freq, kk_rope_mode mode);

/* ---- softmax.c ---------------------------------------------------------- */

void ref_softmax(const double *x, int64_t rows, int64_t cols, double *y);
/* -log softmax(x)[target] of one row of cols logits; 0 for target < 0. */
double ref_cross_entropy_row(const double *x, int64_t cols, int32_t target);

/* ---- embedding.c -------------------------------------------------------- */

void ref_embedding_fwd(const double *table, const int32_t *ids, int64_t tokens, int64_t dim,
		       double *out);
/* dtable[ids[t]] += dout[t] (accumulated). */
void ref_embedding_bwd(double *dtable, const double *dout, const int32_t *ids, int64_t tokens,
		       int64_t dim);

/* ---- optim.c ------------------------------------------------------------ */

/* One kk_adamw step on master/m/v (n elements) with gradients g. */
void ref_adamw(double *master, double *m, double *v, const double *g, size_t n,
	       const kk_adamw_params *p);
/* sqrt of the sum of squares over n_bufs arrays of sizes[i] elements. */
double ref_grad_norm(const double *const *bufs, const size_t *sizes, size_t n_bufs);

/* ---- sample.c ----------------------------------------------------------- */

/* The token kk_sample draws for row `row` of V logits (kk.h's algorithm). */
int ref_sample(const double *logits, int V, const kk_sampling *p, uint64_t row);
