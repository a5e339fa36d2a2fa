/* kmf_internal.h — what the format readers of kernels/modelfile share.
 *
 * The opened file (mapping, tensor table, metadata table), the error
 * helper every reader reports through, bounded little-endian readers, and
 * the per-format parse entry points called by kmf.c.  Not installed. */
#pragma once

#include <stdarg.h>

#include "kmf.h"
#include "kiln/macro.h"

struct kmf_file {
	const uint8_t *base; /* the mapping or the caller's buffer */
	size_t size;
	bool mapped; /* base came from mmap */
	kmf_format format;
	int version;
	kmf_tensor *tensors;
	size_t n_tensors;
	uint32_t *sorted; /* tensor indices sorted by name, for lookup */
	kmf_meta *meta;
	size_t n_meta, cap_meta;
	/* Every string and array allocated for names and metadata: freed at close. */
	void **allocs;
	size_t n_allocs, cap_allocs;
};

/* The longest message text kmf__fail writes (the "tensor 'T': " before
 * it aside). */
#define KMF_MSG_MAX 384
/* Fills err (if not NULL; its file set by kmf__error_reset) and returns
 * code.  offset -1: none; tensor NULL: none. */
int kmf__fail(kiln_error *err, int code, int64_t offset, const char *tensor, const char *fmt, ...)
	_printf_(5, 6);
/* Empties err (if not NULL) for the file called name (NULL or "":
 * "(memory)"). */
void kmf__error_reset(kiln_error *err, const char *name);

/* Allocation tracked by the file (freed by kmf_close). */
void *kmf__alloc(kmf_file *f, size_t bytes);
char *kmf__strndup(kmf_file *f, const char *s, size_t len);
/* Appends a metadata entry (key copied) and returns it zeroed but for
 * key; NULL on -ENOMEM. */
kmf_meta *kmf__meta_add(kmf_file *f, const char *key, size_t key_len);

/* Fills the tensor's derived fields from dtype/shape: nelem and nbytes.
 * allow_empty: a dimension may be 0 (safetensors allows empty tensors).
 * Returns 0, or -EBADMSG (a zero (unless allowed) or negative dim, product overflow, nelem
 * not a whole number of blocks) / -E2BIG (over KMF_MAX_TENSOR_BYTES) with
 * a message in err. */
int kmf__tensor_size(kmf_tensor *t, int64_t at, bool allow_empty, kiln_error *err);

bool kmf__utf8_valid(const char *s, size_t len);

/* Format readers: 0 if f->base/size is that format and valid, the
 * format's error otherwise.  probe: whether the content looks like the
 * format (checked by kmf.c before calling parse). */
bool kmf__st_probe(const uint8_t *p, size_t n);
int kmf__st_parse(kmf_file *f, kiln_error *err);
bool kmf__gguf_probe(const uint8_t *p, size_t n);
int kmf__gguf_parse(kmf_file *f, kiln_error *err);
bool kmf__l2c_probe(const uint8_t *p, size_t n);
int kmf__l2c_parse(kmf_file *f, kiln_error *err);

static inline uint16_t kmf__ld16(const uint8_t *p)
{
	return (uint16_t) (p[0] | (p[1] << 8));
}
static inline uint32_t kmf__ld32(const uint8_t *p)
{
	return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) |
	       ((uint32_t) p[3] << 24);
}
static inline uint64_t kmf__ld64(const uint8_t *p)
{
	return (uint64_t) kmf__ld32(p) | ((uint64_t) kmf__ld32(p + 4) << 32);
}
static inline float kmf__ldf32(const uint8_t *p)
{
	uint32_t u = kmf__ld32(p);
	float f;
	memcpy(&f, &u, 4);
	return f;
}
/* IEEE half -> float, exact. */
float kmf__f16_to_f32(uint16_t h);
