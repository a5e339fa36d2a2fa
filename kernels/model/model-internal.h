/* model-internal.h — helpers shared by the km_ sources (not installed). */
#pragma once

#include <stdint.h>

#include "kmodel.h"

/* Formats err (NULL allowed) and returns r. */
int km_errorf(kiln_error *err, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failed kk call on be as err's message, returning r: for -EOPNOTSUPP
 * the missing kernel (head_dim, and the dtype when not NULL) and what to
 * do (`verb` it on a backend that has it), else what failed and why. */
int km__kk_fail(kiln_error *err, int r, const char *what, const kk_backend *be, int head_dim,
		const char *dtype, const char *verb);
/* c's RoPE frequency divisors (rope_freq_div) as the F32 [head_dim / 2]
 * table kk_rope takes, on be, uploaded once when a model is made; *ret
 * NULL when c's RoPE is not scaled.  0, or a negative errno (kk's). */
int km__rope_div(kk_backend *be, const km_config *c, kk_buffer **ret);
/* RoPE on q [T, n_heads] and k [T, n_kv_heads] at positions pos (I32
 * [T]) as c says, div its divisors (km__rope_div); backward: the inverse
 * rotation, on their gradients. */
int km__rope_qk(kk_backend *be, const km_config *c, const kk_buffer *div, kk_buffer *q,
		kk_buffer *k, const kk_buffer *pos, int64_t T, bool backward);
/* Parameters a config describes (for the size limit). */
int64_t km_param_count(const km_config *c);

/* What km_forward needs from the cache beyond the public calls. */
kk_buffer *km__kvcache_k(km_kvcache *c, int layer);
kk_buffer *km__kvcache_v(km_kvcache *c, int layer);
/* Copies seq's block table row (blocks_per_seq entries, unused ones 0). */
void km__kvcache_row(const km_kvcache *c, int seq, int32_t *row);
/* Shrinks seq back to n tokens (undoing an append of this step),
 * returning blocks it no longer needs. */
void km__kvcache_truncate(km_kvcache *c, int seq, int n);
kk_backend *km__kvcache_backend(const km_kvcache *c);
kk_dtype km__kvcache_dtype(const km_kvcache *c);
const km_config *km__kvcache_config(const km_kvcache *c);

#include "kiln/macro.h"
DEFINE_TRIVIAL_CLEANUP_FUNC(kk_buffer *, kk_buffer_free);
