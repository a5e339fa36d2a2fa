/* train-internal.h — what the kmt_ sources share (not installed): the
 * parameter table of a training model, so the checkpoint code can walk the
 * flat buffers without a public accessor per buffer. */
#pragma once

#include <stdint.h>

#include "kmtrain.h"

#include "../model/model-internal.h"

/* Longest canonical tensor name ("layers.1023.feed_forward.w1.weight"). */
#define KMT_NAME_MAX 64

typedef struct kmt_tensor {
	char name[KMT_NAME_MAX];
	size_t off, n; /* elements into the flat buffers */
	int ndim;      /* 1 (norm gains) or 2 */
	int64_t shape[2];
	bool decay; /* takes weight decay */
} kmt_tensor;

/* The tensor table (kmt_tensor_count entries). */
const kmt_tensor *kmt__tensors(const kmt_model *m);
/* Index of name, or -ENOENT. */
int kmt__tensor_find(const kmt_model *m, const char *name);
/* The flat device buffers: parameters, AdamW m and v (f32, kmt_param_count
 * elements each). */
kk_buffer *kmt__flat(kmt_model *m, kmt_which which);
kk_backend *kmt__backend(kmt_model *m);
void kmt__set_step(kmt_model *m, int64_t step);

/* SplitMix64: the generator behind random init and the sampler's
 * permutations (small, fast, and fully determined by its 64-bit state). */
static inline uint64_t kmt__splitmix(uint64_t *s)
{
	uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}
