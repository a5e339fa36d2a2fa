/* memory.c — km_memory_estimate: what a model will hold on its backend,
 * computed from its config alone, before anything is loaded.
 *
 * A server that loads several models (kiln-inferd) refuses a set that does
 * not fit its memory budget up front, with the numbers of each, instead of
 * failing halfway through loading with an allocation error.  The sizes
 * follow what km_model_new and km_kvcache_new allocate (kmodel.h), so the
 * estimate lives here, next to them. */
#include <errno.h>

#include "kiln/macro.h"
#include "kmodel.h"

/* Bytes of one activation (and KV cache) element for weight dtype dt:
 * bf16/f16 models compute in their dtype, the others in f32 (kmodel.h). */
static uint64_t act_bytes(kk_dtype dt)
{
	return dt == KK_BF16 || dt == KK_F16 ? 2 : 4;
}

uint64_t km_kv_block_bytes(const km_config *c, kk_dtype weight_dtype)
{
	if (!c)
		return 0;
	return 2 * (uint64_t) c->n_layers * KK_KV_BLOCK_SIZE * (uint64_t) c->n_kv_heads *
	       (uint64_t) c->head_dim * act_bytes(weight_dtype);
}

int km_memory_estimate(const km_config *c, const km_model_opts *o, int num_blocks, km_memory *ret)
{
	assert_return(c && o && ret && num_blocks >= 0 && o->max_tokens >= 0 && o->max_seqs >= 0,
		      -EINVAL);
	const kk_dtype dt = o->weight_dtype;
	uint64_t dim = (uint64_t) c->dim, hid = (uint64_t) c->hidden_dim,
		 kv = (uint64_t) c->n_kv_heads * (uint64_t) c->head_dim, L = (uint64_t) c->n_layers,
		 V = (uint64_t) c->vocab_size, act = act_bytes(dt);
	/* the linear layers in their dtype (i8: a f32 scale per row, q4: one
	 * per 32 weights); the embedding, norms and classifier in the
	 * activation dtype */
	uint64_t lin = L * (2 * dim * dim + 2 * kv * dim + 3 * hid * dim);
	uint64_t rows = L * (3 * dim + 2 * kv + 2 * hid);
	uint64_t lin_bytes = dt == KK_F32  ? lin * 4
			     : dt == KK_I8 ? lin + rows * 4
			     : dt == KK_Q4 ? lin / 2 + lin / 32 * 4
					   : lin * 2;
	uint64_t other = V * dim * (c->shared_classifier ? 1 : 2) + L * 2 * dim + dim;
	*ret = (km_memory){
		.weights = lin_bytes + other * act,
		.kv = (uint64_t) num_blocks * km_kv_block_bytes(c, dt),
		/* the activations of max_tokens tokens, the f32 logits of
		 * max_seqs rows */
		.buffers = (uint64_t) o->max_tokens * (4 * dim + 2 * kv + 3 * hid) * act +
			   (uint64_t) o->max_seqs * V * 4,
	};
	return 0;
}
