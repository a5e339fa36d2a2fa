/* kernels/bench/kk-desc.h — the kk call descriptions that the kernel
 * benchmarks (kernels/bench, tests/kernels/bench-kernels-cpu.c) and the kk
 * tests (tests/kernels) make again and again, written once: a packed GEMM,
 * a linear layer's, packed and paged attention, and AdamW with the hyperparameters they train with.
 * Header-only, so a program linked with kk alone can use it; a caller sets
 * the fields its case differs in (batch, padding, bias ...) afterwards. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kk.h"

/* c [m, n] = op(a) op(b) over packed row-major operands (op(a) [m, k],
 * op(b) [k, n]; ta / tb: a or b stored transposed), alpha 1, no beta,
 * bias, epilogue or batch. */
static inline kk_gemm_desc kiln_test_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
					  kk_buffer *a, kk_buffer *b, kk_buffer *c)
{
	kk_gemm_desc d = { .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .alpha = 1 };
	d.a = a, d.lda = ta ? m : k;
	d.b = b, d.ldb = tb ? k : n;
	d.c = c, d.ldc = n;
	return d;
}

/* A linear layer: y [m, n] = x [m, k] W^T with W [n, k] as a model stores
 * it. */
static inline kk_gemm_desc kiln_test_linear(int64_t m, int64_t n, int64_t k, kk_buffer *x,
					    kk_buffer *w, kk_buffer *y)
{
	return kiln_test_gemm(false, true, m, n, k, x, w, y);
}

/* Packed attention (kk_attention_fwd/_bwd) over n_seqs sequences of
 * total_tokens rows in all (cu_seqlens [n_seqs + 1] on the device, the
 * longest max_seqlen), GQA hq / hkv heads of d, the default scale. */
static inline kk_attn_desc kiln_test_attn(int hq, int hkv, int d, bool causal, int n_seqs,
					  int64_t total_tokens, int max_seqlen,
					  const kk_buffer *cu_seqlens)
{
	kk_attn_desc a = { .n_heads = hq, .n_kv_heads = hkv, .head_dim = d, .causal = causal };
	a.n_seqs = n_seqs, a.total_tokens = total_tokens, a.max_seqlen = max_seqlen;
	a.cu_seqlens = cu_seqlens;
	return a;
}

/* Paged attention's decode (kk_attention_decode; kk_attention_paged: set
 * cu_q and total_q too) over n_seqs sequences, GQA hq / hkv heads of d, the
 * default scale: a cache of num_blocks blocks, at most max_blocks and
 * max_context_len tokens a sequence, its block tables [n_seqs, max_blocks]
 * and context lengths [n_seqs] on the device. */
static inline kk_paged_desc kiln_test_paged(int hq, int hkv, int d, int n_seqs, int num_blocks,
					    int max_blocks, int max_context_len,
					    const kk_buffer *block_tables,
					    const kk_buffer *context_lens)
{
	kk_paged_desc p = { .n_heads = hq, .n_kv_heads = hkv, .head_dim = d, .n_seqs = n_seqs };
	p.num_blocks = num_blocks, p.max_blocks_per_seq = max_blocks;
	p.max_context_len = max_context_len;
	p.block_tables = block_tables, p.context_lens = context_lens;
	return p;
}

/* AdamW as the tests and benchmarks run it: betas 0.9 / 0.95, eps 1e-8,
 * weight decay 0.1, at learning rate lr, step `step` (1 is the first) and
 * gradient scale grad_scale. */
static inline kk_adamw_params kiln_test_adamw(float lr, int64_t step, float grad_scale)
{
	kk_adamw_params p = { .lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f };
	p.weight_decay = 0.1f, p.step = step, p.grad_scale = grad_scale;
	return p;
}
