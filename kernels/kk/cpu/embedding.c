/* kernels/kk/cpu/embedding.c — the cpu backend's token embedding: the row
 * gather (forward) and the f32 scatter-add into the table gradient
 * (backward).  Ids outside [0, vocab) are -ERANGE (only the backend can read
 * them). */
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

/* ---- embedding --------------------------------------------------------- */

static int ids_ok(const kk_buffer *ids, int64_t tokens, int64_t vocab)
{
	const int32_t *t = ids->ptr;
	for (int64_t i = 0; i < tokens; i++)
		if (t[i] < 0 || t[i] >= vocab)
			return -ERANGE;
	return 0;
}

int kk__cpu_embedding_fwd(kk_backend *be, kk_stream *st, kk_buffer *out, const kk_buffer *table,
			  const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim)
{
	const int32_t *id = ids->ptr;
	size_t el = kk_dtype_size(table->dtype, 1);
	int r = ids_ok(ids, tokens, vocab);
	if (r < 0)
		return r;
	for (int64_t t = 0; t < tokens; t++)
		memcpy((char *) out->ptr + (size_t) t * dim * el,
		       (const char *) table->ptr + (size_t) id[t] * dim * el, dim * el);
	return 0;
}

int kk__cpu_embedding_bwd(kk_backend *be, kk_stream *st, kk_buffer *dtable, const kk_buffer *dout,
			  const kk_buffer *ids, int64_t tokens, int64_t vocab, int64_t dim)
{
	const int32_t *id = ids->ptr;
	float *dt = dtable->ptr;
	int r = ids_ok(ids, tokens, vocab);
	if (r < 0)
		return r;
	for (int64_t t = 0; t < tokens; t++)
		for (int64_t i = 0; i < dim; i++)
			dt[(size_t) id[t] * dim + i] += LD(dout, (size_t) t * dim + i);
	return 0;
}
