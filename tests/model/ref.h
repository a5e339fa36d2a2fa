/* ref.h — an independent float64 reference of the Llama architecture for
 * the km_ tests and benchmark.
 *
 * Written from the architecture description (llama2.c's, docs/modelfile.md:
 * RMSNorm, RoPE on adjacent pairs, grouped-query attention, SwiGLU)
 * and sharing no code with kernels/model/ or kk: it reads a llama2.c
 * checkpoint itself, keeps every weight in double, and runs one token at a
 * time over a plain contiguous KV history, the way the math is written. */
#pragma once

#include <stdint.h>

typedef struct ref_model ref_model;

/* Loads a llama2.c checkpoint; NULL on any problem (tests only). */
ref_model *ref_load(const char *path);
void ref_free(ref_model *m);
int ref_vocab(const ref_model *m);
int ref_seq_len(const ref_model *m);
/* Forgets the history (a new sequence from position 0). */
void ref_reset(ref_model *m);
/* Feeds one token at the next position; logits[vocab] receives the
 * next-token logits.  Returns 0, or -1 past seq_len. */
int ref_step(ref_model *m, int token, double *logits);
/* Rotate (x[i], x[i + hs/2]) pairs (Hugging Face) instead of adjacent
 * ones (llama2.c), for checking KK_ROPE_HALF. */
void ref_set_half_rope(ref_model *m, int on);
/* RoPE's frequencies (default: theta 10000, no scaling), as transformers'
 * modeling_rope_utils defines them: REF_ROPE_LINEAR divides every
 * frequency by factor; REF_ROPE_LLAMA3 is Llama 3.1's rope_type "llama3"
 * (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings). */
typedef enum { REF_ROPE_NONE, REF_ROPE_LINEAR, REF_ROPE_LLAMA3 } ref_rope_kind;
typedef struct ref_rope {
	double theta;
	ref_rope_kind kind;
	double factor, low_freq_factor, high_freq_factor, original_max_pos;
} ref_rope;
void ref_set_rope(ref_model *m, const ref_rope *r);
/* Pair j's frequency (of a head of hs) under r. */
double ref_rope_freq(const ref_rope *r, int j, int hs);
/* Writes a llama2.c checkpoint of random weights (shared classifier):
 * matrices uniform in +-1/sqrt(fan_in), norm gains 1 +- 0.1, embedding
 * +-0.5.  Returns 0 or -1. */
int ref_write_random(const char *path, int dim, int hidden, int layers, int heads, int kv_heads,
		     int vocab, int seq_len, unsigned seed);
/* The same with Wq and Wk scaled by qk_gain: sharper attention, where
 * positions (RoPE) matter more. */
int ref_write_random_qk(const char *path, int dim, int hidden, int layers, int heads, int kv_heads,
			int vocab, int seq_len, unsigned seed, double qk_gain);
/* Index of the largest logit (lowest on ties). */
int ref_argmax(const double *logits, int n);
