/* kvcache.c — the paged KV cache: block pools on the backend, allocator on
 * the host.
 *
 * Device side: per layer one K and one V pool [num_blocks, 16, n_kv_heads,
 * head_dim] (kk's paged layout).  Host side: a stack of free block ids, a
 * refcount per block, and per live sequence its length and block-table row
 * (ceil(max_seq_len / 16) entries).  A block is free when its refcount is
 * 0; fork shares full prefix blocks by raising their counts, and since a
 * sequence only ever writes at its end, shared (full) blocks are never
 * written again: no copy-on-write is needed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kmodel.h"

#include "model-internal.h"

struct km_kvcache {
	kk_backend *be;
	km_config cfg;
	kk_dtype dtype;
	int num_blocks, max_seqs, bps;
	kk_buffer **k, **v; /* [n_layers] */
	int *refs;	    /* [num_blocks] */
	int *free_stack;    /* [num_blocks], n_free used */
	int n_free;
	bool *live; /* [max_seqs] */
	int *len;   /* [max_seqs] tokens */
	int *nblk;  /* [max_seqs] blocks in the row */
	int32_t **rows;
};

km_kvcache *km_kvcache_free(km_kvcache *c)
{
	if (!c)
		return NULL;
	for (int l = 0; c->k && l < c->cfg.n_layers; l++) {
		kk_buffer_free(c->k[l]);
		kk_buffer_free(c->v[l]);
	}
	for (int s = 0; c->rows && s < c->max_seqs; s++)
		free(c->rows[s]);
	FREE_ALL(c->rows, c->k, c->v, c->refs, c->free_stack, c->live, c->len, c->nblk, c);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(km_kvcache *, km_kvcache_free);

int km_kvcache_new(kk_backend *be, const km_config *cfg, kk_dtype dtype, int num_blocks,
		   int max_seqs, km_kvcache **ret)
{
	assert_return(be && cfg && ret, -EINVAL);
	assert_return(km_config_validate(cfg, NULL) == 0, -EINVAL);
	assert_return(num_blocks > 0 && num_blocks <= KM_KV_BLOCKS_MAX, -EINVAL);
	assert_return(max_seqs > 0 && max_seqs <= KM_KV_SEQS_MAX, -EINVAL);
	assert_return(dtype == KK_F32 || dtype == KK_BF16 || dtype == KK_F16, -EINVAL);

	_cleanup_(km_kvcache_freep) km_kvcache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->be = be;
	c->cfg = *cfg;
	c->dtype = dtype;
	c->num_blocks = num_blocks;
	c->max_seqs = max_seqs;
	c->bps = DIV_ROUND_UP(cfg->max_seq_len, KK_KV_BLOCK_SIZE);
	c->k = calloc((size_t) cfg->n_layers, sizeof(*c->k));
	c->v = calloc((size_t) cfg->n_layers, sizeof(*c->v));
	c->refs = calloc((size_t) num_blocks, sizeof(int));
	c->free_stack = calloc((size_t) num_blocks, sizeof(int));
	c->live = calloc((size_t) max_seqs, sizeof(bool));
	c->len = calloc((size_t) max_seqs, sizeof(int));
	c->nblk = calloc((size_t) max_seqs, sizeof(int));
	c->rows = calloc((size_t) max_seqs, sizeof(*c->rows));
	if (!c->k || !c->v || !c->refs || !c->free_stack || !c->live || !c->len || !c->nblk ||
	    !c->rows)
		return -ENOMEM;
	size_t per_layer = (size_t) num_blocks * KK_KV_BLOCK_SIZE * (size_t) cfg->n_kv_heads *
			   (size_t) cfg->head_dim;
	for (int l = 0; l < cfg->n_layers; l++) {
		int r = kk_buffer_alloc(be, dtype, per_layer, &c->k[l]);
		if (r >= 0)
			r = kk_buffer_alloc(be, dtype, per_layer, &c->v[l]);
		if (r < 0)
			return r;
	}
	/* Lowest ids on top, so a fresh cache hands out 0, 1, 2 ... */
	for (int b = 0; b < num_blocks; b++)
		c->free_stack[b] = num_blocks - 1 - b;
	c->n_free = num_blocks;
	*ret = TAKE_PTR(c);
	return 0;
}

static bool seq_ok(const km_kvcache *c, int seq)
{
	return c && seq >= 0 && seq < c->max_seqs && c->live[seq];
}

int km_kvcache_seq_new(km_kvcache *c)
{
	assert_return(c, -EINVAL);
	for (int s = 0; s < c->max_seqs; s++) {
		if (c->live[s])
			continue;
		if (!c->rows[s] && !(c->rows[s] = calloc((size_t) c->bps, sizeof(int32_t))))
			return -ENOMEM;
		c->live[s] = true;
		c->len[s] = 0;
		c->nblk[s] = 0;
		return s;
	}
	return -ENOSPC;
}

static void release_blocks(km_kvcache *c, int seq, int keep)
{
	for (int i = keep; i < c->nblk[seq]; i++) {
		int b = c->rows[seq][i];
		if (--c->refs[b] == 0)
			c->free_stack[c->n_free++] = b;
		c->rows[seq][i] = 0;
	}
	c->nblk[seq] = MIN(c->nblk[seq], keep);
}

int km_kvcache_seq_free(km_kvcache *c, int seq)
{
	assert_return(seq_ok(c, seq), -EINVAL);
	release_blocks(c, seq, 0);
	c->live[seq] = false;
	c->len[seq] = 0;
	return 0;
}

int km_kvcache_seq_fork(km_kvcache *c, int seq, int n_tokens)
{
	assert_return(seq_ok(c, seq), -EINVAL);
	assert_return(n_tokens >= 0 && n_tokens <= c->len[seq], -EINVAL);
	assert_return(n_tokens % KK_KV_BLOCK_SIZE == 0, -EINVAL);
	int s = km_kvcache_seq_new(c);
	if (s < 0)
		return s;
	int n = n_tokens / KK_KV_BLOCK_SIZE;
	for (int i = 0; i < n; i++) {
		c->rows[s][i] = c->rows[seq][i];
		c->refs[c->rows[s][i]]++;
	}
	c->nblk[s] = n;
	c->len[s] = n_tokens;
	return s;
}

int km_kvcache_can_append(const km_kvcache *c, int seq, int n)
{
	assert_return(seq_ok(c, seq) && n >= 0, -EINVAL);
	if ((int64_t) c->len[seq] + n > c->cfg.max_seq_len)
		return 0;
	int need = DIV_ROUND_UP(c->len[seq] + n, KK_KV_BLOCK_SIZE) - c->nblk[seq];
	return need <= c->n_free;
}

int km_kvcache_append(km_kvcache *c, int seq, int n, int32_t *slots)
{
	assert_return(seq_ok(c, seq) && n >= 0, -EINVAL);
	if ((int64_t) c->len[seq] + n > c->cfg.max_seq_len)
		return -EFBIG;
	int need = DIV_ROUND_UP(c->len[seq] + n, KK_KV_BLOCK_SIZE) - c->nblk[seq];
	if (need > c->n_free)
		return -ENOSPC;
	for (int i = 0; i < need; i++) {
		int b = c->free_stack[--c->n_free];
		c->refs[b] = 1;
		c->rows[seq][c->nblk[seq]++] = b;
	}
	for (int i = 0; i < n && slots; i++) {
		int t = c->len[seq] + i;
		slots[i] = c->rows[seq][t / KK_KV_BLOCK_SIZE] * KK_KV_BLOCK_SIZE +
			   t % KK_KV_BLOCK_SIZE;
	}
	c->len[seq] += n;
	return 0;
}

int km_kvcache_seq_len(const km_kvcache *c, int seq)
{
	assert_return(seq_ok(c, seq), -EINVAL);
	return c->len[seq];
}

int km_kvcache_free_blocks(const km_kvcache *c)
{
	assert_return(c, -EINVAL);
	return c->n_free;
}

int km_kvcache_num_blocks(const km_kvcache *c)
{
	assert_return(c, -EINVAL);
	return c->num_blocks;
}

int km_kvcache_blocks_per_seq(const km_kvcache *c)
{
	assert_return(c, -EINVAL);
	return c->bps;
}

int km_kvcache_seq_blocks(const km_kvcache *c, int seq, int32_t *blocks, int max)
{
	assert_return(seq_ok(c, seq) && (blocks || max == 0) && max >= 0, -EINVAL);
	int n = c->nblk[seq];
	memcpy(blocks, c->rows[seq], sizeof(int32_t) * (size_t) MIN(n, max));
	return n;
}

int km_kvcache_block_refs(const km_kvcache *c, int block)
{
	assert_return(c && block >= 0 && block < c->num_blocks, -EINVAL);
	return c->refs[block];
}

kk_buffer *km__kvcache_k(km_kvcache *c, int layer)
{
	return c->k[layer];
}

kk_buffer *km__kvcache_v(km_kvcache *c, int layer)
{
	return c->v[layer];
}

void km__kvcache_row(const km_kvcache *c, int seq, int32_t *row)
{
	memcpy(row, c->rows[seq], sizeof(int32_t) * (size_t) c->bps);
}

void km__kvcache_truncate(km_kvcache *c, int seq, int n)
{
	c->len[seq] = n;
	release_blocks(c, seq, DIV_ROUND_UP(n, KK_KV_BLOCK_SIZE));
}

kk_backend *km__kvcache_backend(const km_kvcache *c)
{
	return c->be;
}

kk_dtype km__kvcache_dtype(const km_kvcache *c)
{
	return c->dtype;
}

const km_config *km__kvcache_config(const km_kvcache *c)
{
	return &c->cfg;
}
