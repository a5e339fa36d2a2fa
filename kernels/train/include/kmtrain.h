/* kmtrain.h — training the Llama model of kmodel.h on the kk kernel library.
 *
 * The ground kiln-train stands on: a training model (kmt_model) with f32
 * parameters, gradients and AdamW moments in three flat buffers on a kk
 * backend (one flat gradient buffer, so data-parallel training is a single
 * all-reduce), activations kept for a batch of B packed sequences of T
 * tokens, a forward pass to the mean cross-entropy over the target tokens,
 * the full backward pass, global-norm clipping and AdamW with a linear
 * warmup + cosine decay schedule (kmt_step).  Around it: a token-shard file
 * format and a deterministic, restartable, rank-disjoint batch sampler
 * (kmt_shard, kmt_sampler), and crash-safe safetensors checkpoints that the
 * inference side loads by the canonical tensor names (kmt_save, kmt_load).
 *
 * Same architecture, tensor names and km_config as kmodel.h; initial
 * weights come through a km_weight_source (e.g. km_file_source) or a seeded
 * random init.  docs/train.md has the long form.
 *
 * A model is used by one thread at a time.  Conventions as kmodel.h: 0 or a
 * negative errno; a kiln_error (NULL allowed) receives one line saying what,
 * where and what to do; nothing here prints or exits; out parameters are
 * untouched on failure. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kk.h"
#include "kmodel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Model                                                                     */

/* Largest B * T a model may be built for: a bound on activation memory
 * (each layer keeps ~(8 dim + 3 hidden) floats per token). */
#define KMT_MAX_TOKENS (1 << 20)

typedef struct kmt_opts {
	int batch;   /* B: sequences per step (per rank) */
	int seq_len; /* T: tokens per sequence, <= cfg->max_seq_len */
	/* Random init (src NULL): seed, and the standard deviation of the
	 * matrices (0 means 0.02); wo and w2 get std / sqrt(2 n_layers),
	 * norm gains are 1 (the GPT-2 / llm.c scheme). */
	uint64_t init_seed;
	float init_std;
} kmt_opts;

typedef struct kmt_model kmt_model;

/* Builds a model: parameters from src (NULL: seeded random init), every
 * activation and gradient buffer allocated once, gradients and moments 0,
 * step 0.  Errors (err filled): -EINVAL (config, opts), -ENOENT/-EIO from
 * the source, -ENOMEM, -EOPNOTSUPP (the backend lacks a kernel, e.g.
 * attention for this head dim), other kk errors. */
int kmt_model_new(kk_backend *be, const km_config *cfg, const kmt_opts *opts,
		  const km_weight_source *src, kmt_model **ret, kiln_error *err);
kmt_model *kmt_model_free(kmt_model *m);
/* A model shape for a randomly initialized model (kiln-train --init):
 * comma-separated KEY=VALUE pairs, e.g.
 *   "dim=64,hidden=172,layers=5,heads=8,kv_heads=4,vocab=512,seq=512"
 * dim, hidden, layers, heads, vocab and seq are required; kv_heads defaults
 * to heads; the rest is llama2.c's unless given: norm_eps (1e-5),
 * rope_theta (10000), shared (1: the classifier is the token embedding);
 * RoPE on interleaved pairs; head_dim = dim / heads.  *ret is checked by
 * km_config_validate.  Errors: -EINVAL (err names the key, its value and
 * the rule; an unknown, repeated or missing key). */
int kmt_config_parse(const char *spec, km_config *ret, kiln_error *err);
const km_config *kmt_model_config(const kmt_model *m);
const kmt_opts *kmt_model_opts(const kmt_model *m);
/* Optimizer steps taken (0 for a new model; restored by kmt_load). */
int64_t kmt_model_step(const kmt_model *m);

/* Parameter tensors, in the flat buffer's order: every tensor that takes
 * weight decay first (embedding, classifier, the layers' matrices), then
 * the RMSNorm gains (no weight decay). */
size_t kmt_tensor_count(const kmt_model *m);
/* Name (canonical, as kmodel.h) and element count of tensor i; NULL / 0
 * when i is out of range. */
const char *kmt_tensor_name(const kmt_model *m, size_t i);
size_t kmt_tensor_numel(const kmt_model *m, size_t i);
/* All parameters together. */
size_t kmt_param_count(const kmt_model *m);

/* Host copies of one tensor's parameters / gradient / AdamW moments
 * (count must equal its numel), and setting parameters.
 * Errors: -ENOENT unknown name, -EINVAL count, kk errors. */
typedef enum kmt_which {
	KMT_PARAM = 0,
	KMT_GRAD = 1,
	KMT_ADAM_M = 2,
	KMT_ADAM_V = 3,
} kmt_which;
int kmt_tensor_get(kmt_model *m, kmt_which which, const char *name, float *dst, size_t count);
int kmt_tensor_set(kmt_model *m, const char *name, const float *src, size_t count);
/* A weight source serving the model's current parameters, for km_model_new
 * (an inference model of the trained weights).  Valid while m lives. */
km_weight_source kmt_weight_source(kmt_model *m);

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */

/* One batch: n_seqs (1..opts.batch) sequences of opts.seq_len tokens,
 * packed row-major [n_seqs, seq_len].  Token t of a sequence predicts
 * targets[t]; a negative target (padding) is ignored (KMT_IGNORE). */
#define KMT_IGNORE (-1)
typedef struct kmt_batch {
	const int32_t *tokens;
	const int32_t *targets;
	int n_seqs;
} kmt_batch;

/* The optimizer and its schedule.  lr(step), step counted from 1:
 * step <= warmup: lr_max * step / warmup; then cosine from lr_max down to
 * lr_min at total_steps; lr_min after.  warmup 0: no warmup; total_steps
 * 0: constant lr_max after the warmup. */
typedef struct kmt_optim {
	float lr_max, lr_min;
	int64_t warmup_steps, total_steps;
	float beta1, beta2, eps; /* torch defaults: 0.9, 0.999, 1e-8 */
	float weight_decay;	 /* decoupled; not applied to the norm gains */
	float clip;		 /* global gradient-norm clip; 0: none */
} kmt_optim;

/* The learning rate of step (>= 1) under o. */
float kmt_lr(const kmt_optim *o, int64_t step);

typedef struct kmt_stats {
	double loss;	   /* mean cross-entropy over the target tokens (all ranks) */
	int64_t n_targets; /* target tokens counted (all ranks) */
	float grad_norm;   /* global gradient norm before clipping */
	float lr;	   /* learning rate used */
	int64_t step;	   /* the step just taken (1 for the first) */
} kmt_stats;

/* Forward only: the mean loss over b's targets (evaluation, and the
 * benchmark's baseline).  -EINVAL (err filled): bad batch (token id
 * outside the vocabulary, target >= vocab, n_seqs out of range), or no
 * target at all. */
int kmt_forward(kmt_model *m, const kmt_batch *b, kmt_stats *out, kiln_error *err);

/* Zeroes the gradients, runs forward and backward on b, and (comm not NULL)
 * sums the gradients over the ranks: each rank scales its loss by 1 / the
 * target count of ALL ranks (one 1-float all-reduce first), so the result
 * is the gradient of the global-batch mean, exactly as one process on the
 * concatenated batch.  The gradient buffer is one flat f32 buffer and goes
 * out in ONE kk_all_reduce (no bucketing).  out gets loss and n_targets
 * (global).  Errors as kmt_forward, plus collective errors. */
int kmt_forward_backward(kmt_model *m, const kmt_batch *b, kk_comm *comm, kmt_stats *out,
			 kiln_error *err);
/* Most micro-batches one step accumulates (a bound on a caller's typo, not
 * on memory: micro-batches run one after another). */
#define KMT_MAX_MICRO 65536
/* Gradient accumulation: the same over b[0..n_micro) run one after another
 * into the same gradients, scaled by 1 / the targets of all of them (and of
 * all ranks): exactly the gradient of one batch holding them all, at the
 * activation memory of one.  Every micro-batch is checked before any runs.
 * kmt_forward_backward is this with n_micro 1. */
int kmt_forward_backward_accum(kmt_model *m, const kmt_batch *b, int n_micro, kk_comm *comm,
			       kmt_stats *out, kiln_error *err);
/* Makes every rank's parameters and AdamW moments rank root's (three
 * kk_broadcast calls over the flat buffers), as DDP does at start, so
 * ranks that loaded or initialized differently still train one model.
 * Every rank must be at the same step (they resume from one checkpoint):
 * -EINVAL (err filled) when they are not, checked before anything moves.
 * Errors: collective errors. */
int kmt_sync_from(kmt_model *m, kk_comm *comm, int root, kiln_error *err);
/* Clips (o->clip > 0) and applies one AdamW step with lr = kmt_lr(step);
 * increments the step.  out gets grad_norm, lr, step (NULL allowed). */
int kmt_optimizer_step(kmt_model *m, const kmt_optim *o, kmt_stats *out, kiln_error *err);
/* kmt_forward_backward then kmt_optimizer_step. */
int kmt_step(kmt_model *m, const kmt_batch *b, kk_comm *comm, const kmt_optim *o, kmt_stats *out,
	     kiln_error *err);

/* ------------------------------------------------------------------------ */
/* Token shards                                                              */

/* A token shard file, little-endian:
 *   0  char[8]  magic "KILNTOK1"
 *   8  u32      version (1)
 *  12  u32      bytes per token id: 2 (u16) or 4 (u32)
 *  16  u64      token count n
 *  24  u32      vocabulary size the ids were made for (every id < it)
 *  28  u32      reserved, 0
 *  32  n ids
 * The file is exactly 32 + n * width bytes. */
#define KMT_SHARD_MAGIC	       "KILNTOK1"
#define KMT_SHARD_VERSION      1
#define KMT_SHARD_HEADER_BYTES 32
/* Largest shard accepted: 2^40 tokens, a bound on what a header may claim
 * (larger corpora are split into shards). */
#define KMT_SHARD_MAX_TOKENS (INT64_C(1) << 40)

typedef struct kmt_shard kmt_shard;

/* Opens (mmap) and validates path: magic, version, width, the size the
 * header implies, the header's vocabulary against `vocab` (the model's;
 * it must not be larger), and every id < vocab.
 * Errors (err names the file and the byte offset): -ENOENT/-EACCES...,
 * -EBADMSG (bad magic, version, width, size, reserved), -ERANGE (an id or
 * the header's vocabulary too large for the model), -ENOMEM. */
int kmt_shard_open(const char *path, int vocab, kmt_shard **ret, kiln_error *err);
kmt_shard *kmt_shard_free(kmt_shard *s);
int64_t kmt_shard_tokens(const kmt_shard *s);
/* Token i (0 <= i < n; not checked). */
int32_t kmt_shard_token(const kmt_shard *s, int64_t i);
/* Writes a shard of n ids (each < vocab) atomically (temp file, fsync,
 * rename).  width 2 needs vocab <= 65536.  Errors: -EINVAL, -ERANGE (an
 * id >= vocab), the errno of open/write/fsync/rename. */
int kmt_shard_write(const char *path, const uint32_t *ids, int64_t n, int vocab, int width,
		    kiln_error *err);

/* ------------------------------------------------------------------------ */
/* Sampler                                                                   */

/* Where a sampler stands: the batch it returns next.  Saved in
 * checkpoints; a sampler made from it continues exactly. */
typedef struct kmt_cursor {
	uint64_t seed;
	int64_t epoch;
	int64_t batch; /* global batch index within the epoch */
} kmt_cursor;

/* The shard is cut into W = (n - 1) / T windows of T + 1 tokens (window w
 * starts at token w * T; inputs are its first T tokens, targets its last
 * T).  Each epoch permutes the windows (Fisher-Yates driven by SplitMix64
 * of seed and epoch); global batch g of the epoch is permutation slots
 * [g * world * B, (g + 1) * world * B) and rank r takes the r-th B of them:
 * ranks never share a window within an epoch, and world ranks of batch B
 * see exactly what one rank of batch world * B sees.  W / (world * B)
 * batches per epoch (the rest of the windows wait for another epoch). */
typedef struct kmt_sampler kmt_sampler;

/* Errors: -EINVAL (batch, seq_len, rank/world, cursor), -ERANGE (the shard
 * has fewer than world * batch windows: err says how many tokens it
 * needs), -ENOMEM. */
int kmt_sampler_new(const kmt_shard *s, int batch, int seq_len, int rank, int world,
		    const kmt_cursor *start, kmt_sampler **ret, kiln_error *err);
kmt_sampler *kmt_sampler_free(kmt_sampler *s);
int64_t kmt_sampler_batches_per_epoch(const kmt_sampler *s);
/* Fills tokens and targets [batch * seq_len] with this rank's next batch
 * (starts, NULL allowed, gets the B window starts) and advances the
 * cursor.  Errors: -EINVAL (a NULL argument). */
int kmt_sampler_next(kmt_sampler *s, int32_t *tokens, int32_t *targets, int64_t *starts);
void kmt_sampler_cursor(const kmt_sampler *s, kmt_cursor *ret);

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                               */

/* What a checkpoint holds beside the model: the data cursor and the
 * caller's RNG state (kmt_load returns them). */
typedef struct kmt_ckpt_state {
	kmt_cursor cursor;
	uint64_t rng;
} kmt_ckpt_state;

/* Writes a safetensors checkpoint through kmf_writer (temp file, fsync,
 * rename: a crash leaves the old file or the new one): every parameter
 * under its canonical name (F32, so km_ readers load it), the AdamW
 * moments as "optim.m.NAME" / "optim.v.NAME", and __metadata__ strings
 * "kiln.format" = "kmtrain-1", the config ("kiln.config.dim" ...),
 * "kiln.step", "kiln.data.seed" / ".epoch" / ".batch", "kiln.rng".
 * Errors (err filled): -ENOMEM, kk errors, the writer's errno. */
int kmt_save(kmt_model *m, const char *path, const kmt_ckpt_state *st, kiln_error *err);
/* Loads a checkpoint written by kmt_save into m: every tensor and value is
 * read and checked (format, config equal to m's, names, shapes, dtypes,
 * finite numbers) before anything in m changes, so a corrupt or truncated
 * file fails with err saying why and leaves m untouched.  Restores
 * parameters, moments and the step; st (NULL allowed) gets cursor and rng.
 * Errors: the open errno, -EBADMSG (corrupt/truncated/not a kmtrain
 * checkpoint), -EINVAL (a config other than m's), -ENOMEM, kk errors. */
int kmt_load(kmt_model *m, const char *path, kmt_ckpt_state *st, kiln_error *err);

#ifdef __cplusplus
}
#endif
