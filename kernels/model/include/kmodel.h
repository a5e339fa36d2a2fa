/* kmodel.h — a Llama-architecture model on the kk kernel library.
 *
 * The ground kiln-inferd (continuous batching over a paged KV cache) and
 * kiln-train stand on: a model configuration (km_config), weights uploaded
 * once to a kk backend in a chosen dtype (km_model), a paged KV cache with a
 * host-side block allocator (km_kvcache), and one batched forward step over
 * several sequences at once, each contributing either its whole prompt
 * (prefill, from position 0) or one new token (decode), mixed in the same
 * step (km_forward), followed by sampling (km_sample).
 *
 * Weights reach km_model_new through a small interface (km_weight_source:
 * a callback that fills host f32 arrays by canonical tensor name), so any
 * checkpoint reader can feed it; km_file_* (below) reads every model file
 * libkmf knows (llama2.c, safetensors, GGUF).  docs/model.md has the long
 * form.
 *
 * A model and its caches are used by one thread at a time (they hold the
 * step's scratch).
 *
 * Conventions: 0 or a negative errno; functions that can fail for a reason
 * a user must see take a kiln_error that receives one line (what, where, what
 * to do).  Nothing here prints or exits. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

/* A kiln_error (kiln/error.h) receives the line: code and msg, cut at
 * KM_ERROR_MAX bytes (with its NUL: the engine keeps one per request);
 * no file or offset, the message names them. */
#define KM_ERROR_MAX 320

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */

/* Limits on values that come from untrusted checkpoint headers, so a
 * corrupt header fails validation instead of asking for terabytes. */
#define KM_DIM_MAX     65536		  /* model width (Llama 3 405B: 16384) */
#define KM_HIDDEN_MAX  262144		  /* FFN width */
#define KM_LAYERS_MAX  1024		  /* transformer blocks */
#define KM_HEADS_MAX   1024		  /* attention heads (kk's own limit) */
#define KM_VOCAB_MAX   (1 << 21)	  /* vocabulary (largest in use: ~256K) */
#define KM_SEQ_LEN_MAX (1 << 20)	  /* context length */
#define KM_PARAMS_MAX  (INT64_C(1) << 37) /* 137 G parameters in all */
/* RoPE pairs of a head: head_dim / 2 at kk's largest attention head. */
#define KM_ROPE_PAIRS_MAX (KK_ATTN_HEAD_DIM_MAX / 2)
/* Largest RoPE frequency divisor accepted (Llama 3.1's is 8, linear
 * scaling's the context multiple): beyond it a pair hardly turns. */
#define KM_ROPE_DIV_MAX 1e6

typedef struct km_config {
	int dim;	/* model width */
	int hidden_dim; /* SwiGLU FFN width */
	int n_layers;
	int n_heads;
	int n_kv_heads; /* divides n_heads (grouped-query attention) */
	int head_dim;	/* n_heads * head_dim == dim */
	int vocab_size;
	int max_seq_len;
	float norm_eps;		/* RMSNorm epsilon (llama2.c: 1e-5) */
	float rope_theta;	/* RoPE base (llama2.c: 10000) */
	kk_rope_mode rope_mode; /* KK_ROPE_INTERLEAVED (llama2.c/Meta), KK_ROPE_HALF (HF) */
	bool shared_classifier; /* logits use the token embedding table */
	/* Scaled RoPE: pair i (< head_dim / 2) of every head turns by pos *
	 * rope_theta^(-2i / head_dim) / rope_freq_div[i].  Llama 3.1's
	 * rope_scaling "llama3" (and the GGUF rope_freqs tensor llama.cpp's
	 * converter makes of it) divides the low frequencies by its factor,
	 * the high ones by 1 and blends between; linear scaling divides all by
	 * its factor.  false: plain RoPE, rope_freq_div unused. */
	bool rope_scaled;
	float rope_freq_div[KM_ROPE_PAIRS_MAX];
} km_config;

/* Checks every field and that they agree.  -EINVAL with err (NULL allowed)
 * naming the field, its value and the rule it breaks. */
int km_config_validate(const km_config *c, kiln_error *err);

/* ------------------------------------------------------------------------ */
/* Weights                                                                   */

/* Canonical tensor names (Meta's), all f32 row-major [out][in]:
 *   "tok_embeddings.weight" [vocab, dim]      "norm.weight" [dim]
 *   "output.weight" [vocab, dim] (only without shared_classifier)
 *   "layers.N.attention_norm.weight" [dim]    "layers.N.ffn_norm.weight" [dim]
 *   "layers.N.attention.wq.weight" [dim, dim] ".wk"/".wv" [kv_dim, dim]
 *   "layers.N.attention.wo.weight" [dim, dim]
 *   "layers.N.feed_forward.w1.weight" [hidden, dim] (gate)
 *   "layers.N.feed_forward.w3.weight" [hidden, dim] (up)
 *   "layers.N.feed_forward.w2.weight" [dim, hidden] (down)
 * read() fills dst with exactly `count` floats of the named tensor and
 * returns 0, or a negative errno with err filled (-ENOENT unknown name,
 * -EINVAL count does not match, -EIO read failure). */
typedef struct km_weight_source {
	void *userdata;
	int (*read)(void *userdata, const char *name, float *dst, size_t count, kiln_error *err);
	/* Optional (NULL: every tensor is read): the named tensor as stored,
	 * when it is `count` elements of f32, bf16 or f16 in the canonical
	 * layout, aligned to its element size, in memory that is read-only
	 * and stays valid while a hold() is kept.  Returns the data and sets
	 * *dtype, or NULL (read() it then).  A model whose backend computes on
	 * host memory (cpu) and wants that dtype uses it in place instead of
	 * copying (kiln's weights on a model file's mapping). */
	const void *(*view)(void *userdata, const char *name, size_t count, kk_dtype *dtype);
	/* Keeps what view() returned valid until drop(the returned handle);
	 * NULL on failure (out of memory: the model copies instead). */
	void *(*hold)(void *userdata);
	void (*drop)(void *handle);
	/* Optional (NULL: never): a weight [n, k] served in kk's quantized
	 * form without an f32 round trip, when the file stores it that way:
	 * qt KK_I8 from GGUF Q8_0 (group 32), KK_Q4 from Q4_0 (group 32).
	 * Fills data (kk_dtype_size(qt, n * k) bytes) and f16 scales [n, k /
	 * 32] and returns 1; returns 0 when the tensor is stored otherwise
	 * (the caller then reads f32 and quantizes), or a negative errno as
	 * read() does. */
	int (*read_quant)(void *userdata, const char *name, kk_dtype qt, int64_t n, int64_t k,
			  void *data, uint16_t *scales, kiln_error *err);
} km_weight_source;

/* ------------------------------------------------------------------------ */
/* Model                                                                     */

typedef struct km_model km_model;

typedef struct km_model_opts {
	/* Storage of the linear layers (q, k, v, o, w1, w2, w3): KK_F32,
	 * KK_BF16, KK_F16 (then activations, norms, embedding and KV cache
	 * use the same dtype), or KK_I8 / KK_Q4 weight-only (the embedding
	 * and classifier quantized too; activations, norms and KV cache stay
	 * f32; GGUF Q8_0 / Q4_0 weights are taken as stored, in blocks of 32,
	 * through the source's read_quant).  Logits are f32. */
	kk_dtype weight_dtype;
	int q4_group;	/* KK_Q4 group: 32 (0), 64 or 128 */
	int max_tokens; /* tokens per step, all sequences together */
	int max_seqs;	/* sequences per step */
} km_model_opts;

/* Uploads the weights and allocates every activation buffer once.
 * Errors (err filled): -EINVAL (config, opts), -ENOENT/-EIO from the
 * source, -ENOMEM, -EOPNOTSUPP (the backend lacks attention for this head
 * dim, e.g. cuda with head_dim 8), other kk errors. */
int km_model_new(kk_backend *be, const km_config *cfg, const km_model_opts *opts,
		 const km_weight_source *src, km_model **ret, kiln_error *err);
km_model *km_model_free(km_model *m);
const km_config *km_model_config(const km_model *m);
/* The dtype of activations and of the KV cache km_kvcache_new must use. */
kk_dtype km_model_act_dtype(const km_model *m);
/* Bytes of device memory held by weights. */
size_t km_model_weight_bytes(const km_model *m);
/* Of those, the bytes used in place in the weight source's memory (a model
 * file's mapping; see km_weight_source.view), not copied. */
size_t km_model_mapped_bytes(const km_model *m);

/* What a model will hold on its backend, estimated from its config before
 * anything is loaded (kiln-inferd's memory budget): the weights in
 * opts->weight_dtype (i8: a f32 scale per row; q4: one per 32 weights; the
 * embedding, norms and classifier in the activation dtype), the KV cache
 * of num_blocks blocks (K and V, every layer, in the activation dtype) and
 * the step's buffers (activations of opts->max_tokens tokens, the f32
 * logits of opts->max_seqs rows).  An estimate: allocator rounding and the
 * backend's own workspace are not in it. */
typedef struct km_memory {
	uint64_t weights, kv, buffers;
} km_memory;

/* -EINVAL: c, opts or ret NULL, or a negative count. */
int km_memory_estimate(const km_config *c, const km_model_opts *opts, int num_blocks,
		       km_memory *ret);
/* Bytes of one KV cache block (KK_KV_BLOCK_SIZE tokens, K and V, every
 * layer) of a model with these weights; 0 for NULL c. */
uint64_t km_kv_block_bytes(const km_config *c, kk_dtype weight_dtype);

/* ------------------------------------------------------------------------ */
/* Paged KV cache                                                            */

/* Blocks of KK_KV_BLOCK_SIZE tokens, per layer one K and one V pool
 * [num_blocks, 16, n_kv_heads, head_dim] on the backend; the host side
 * keeps per-sequence block tables and a free list.  Blocks are refcounted
 * so a forked sequence shares its parent's full prefix blocks. */
typedef struct km_kvcache km_kvcache;

/* Limits on the pool so a size computation error fails early. */
#define KM_KV_BLOCKS_MAX (1 << 24)
#define KM_KV_SEQS_MAX	 65536

/* Errors: -EINVAL (num_blocks, max_seqs, dtype), -ENOMEM. */
int km_kvcache_new(kk_backend *be, const km_config *cfg, kk_dtype dtype, int num_blocks,
		   int max_seqs, km_kvcache **ret);
km_kvcache *km_kvcache_free(km_kvcache *c);

/* A new empty sequence id in [0, max_seqs).  -ENOSPC: all ids in use;
 * -ENOMEM. */
int km_kvcache_seq_new(km_kvcache *c);
/* Drops the sequence, returning the blocks nobody else holds.  -EINVAL:
 * not a live id. */
int km_kvcache_seq_free(km_kvcache *c, int seq);
/* A new sequence sharing the first n_tokens of seq (n_tokens a multiple of
 * KK_KV_BLOCK_SIZE and <= its length: only full blocks are shared, never
 * written again).  Returns the id; -EINVAL, -ENOSPC (no free id). */
int km_kvcache_seq_fork(km_kvcache *c, int seq, int n_tokens);
/* Grows seq by n tokens and writes their flat cache slots (block * 16 +
 * offset) to slots (NULL allowed).  All or nothing: -ENOSPC when the free
 * blocks do not suffice (nothing changed), -EFBIG when the sequence would
 * outgrow its block-table row (max_seq_len tokens), -EINVAL. */
int km_kvcache_append(km_kvcache *c, int seq, int n, int32_t *slots);
/* Whether `n` more tokens for seq would fit now (1/0), or -EINVAL. */
int km_kvcache_can_append(const km_kvcache *c, int seq, int n);
int km_kvcache_seq_len(const km_kvcache *c, int seq); /* tokens, or -EINVAL */
int km_kvcache_free_blocks(const km_kvcache *c);
int km_kvcache_num_blocks(const km_kvcache *c);
/* Blocks per block-table row: ceil(max_seq_len / 16). */
int km_kvcache_blocks_per_seq(const km_kvcache *c);
/* Block ids of seq (n = its block count) into blocks[max]; returns n. */
int km_kvcache_seq_blocks(const km_kvcache *c, int seq, int32_t *blocks, int max);
/* Refcount of a block (0 = free), or -EINVAL. */
int km_kvcache_block_refs(const km_kvcache *c, int block);

/* ------------------------------------------------------------------------ */
/* Forward step and sampling                                                 */

/* One sequence's part of a step: n_tokens >= 1 tokens at the positions
 * after its cached context.  An empty cache: the prompt, positions
 * 0..n-1 (prefill).  A cached context: one token (decode), or several —
 * the next chunk of a long prompt (chunked prefill), a prompt continuing a
 * forked prefix, tokens recomputed after preemption. */
typedef struct km_seq_input {
	int seq;
	const int32_t *tokens;
	int n_tokens;
} km_seq_input;

/* Runs one step over n inputs (distinct sequences): appends their tokens
 * to the cache, runs every layer, and computes logits for the last token
 * of each input into row i of the model's logits (f32 [max_seqs, vocab]);
 * logits_out (NULL allowed) receives a host copy [n, vocab].
 * Errors (err filled): -EINVAL (bad input: token id outside the
 * vocabulary, repeated sequence, more than max_tokens/max_seqs), -ENOSPC (cache out of blocks:
 * nothing was appended, the caller preempts or waits), -EFBIG (a sequence would pass max_seq_len),
 * -EOPNOTSUPP and other kk errors. */
int km_forward(km_model *m, km_kvcache *c, const km_seq_input *in, int n, float *logits_out,
	       kiln_error *err);
/* Samples rows [row, row + n_rows) of the last step's logits into ids
 * (host).  kk draws from (seed, row): sample one row at a time with each
 * sequence's own seed and its tokens do not depend on the batch.
 * Errors: -EINVAL (rows outside the last step, bad sampling parameters),
 * kk errors. */
int km_sample(km_model *m, int row, int n_rows, const kk_sampling *p, int32_t *ids);

/* ------------------------------------------------------------------------ */
/* Model files (any file libkmf reads)                                       */

/* A model file opened through libkmf (kmf.h): its dialect is recognised by
 * content, its km_config derived from its own metadata, and every tensor
 * the config needs checked (present, float or GGUF block dtype, shape)
 * before km_file_open returns.  docs/model.md "Model files" has the name
 * mappings and RoPE conventions. */
typedef struct km_file km_file;

typedef enum km_file_kind {
	KM_FILE_LLAMA2C = 0, /* llama2.c legacy checkpoint (7 int32 header, f32 arrays) */
	KM_FILE_KILN = 1,    /* safetensors, canonical names, kiln.config.* metadata (kmt_save) */
	KM_FILE_HF = 2,	     /* safetensors, LlamaForCausalLM names, config.json beside it */
	KM_FILE_GGUF = 3,    /* GGUF, general.architecture "llama" */
} km_file_kind;

/* Largest config.json read beside Hugging Face weights: real ones are a
 * few KiB; the bound stops a stray huge file from being parsed. */
#define KM_FILE_CONFIG_JSON_MAX (1 << 20)

/* Opens path.  Errors (err names the file and the tensor or key, expected
 * vs found): the kmf_open errors (-ENOENT, -EBADMSG, -E2BIG ...),
 * -EOPNOTSUPP (an architecture, dtype or feature kiln does not run: GGUF
 * other than "llama", MoE, partial RoPE, RoPE scaling other than Llama
 * 3.1's and linear (YaRN, LongRoPE, dynamic NTK), integer tensors, a
 * safetensors file with neither kiln nor HF names), -ENOENT (a missing
 * tensor), -EINVAL (missing or inconsistent metadata, a wrong shape,
 * no config.json for HF weights), -ENOMEM. */
int km_file_open(const char *path, km_file **ret, kiln_error *err);
km_file *km_file_free(km_file *f);
const km_config *km_file_config(const km_file *f);
km_file_kind km_file_kind_of(const km_file *f);
/* "llama2.c", "kiln safetensors", "Hugging Face safetensors", "GGUF llama";
 * NULL for a bad value. */
const char *km_file_kind_name(km_file_kind k);
/* A weight source serving canonical names from the open file (converted
 * to f32); valid while f lives.  Its view() serves f32/bf16/f16 tensors
 * from the file's read-only mapping: a model computing on them holds the
 * mapping (km_file_free then leaves it to the model's free). */
km_weight_source km_file_source(km_file *f);

#ifdef __cplusplus
}
#endif
