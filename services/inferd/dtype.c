/* dtype.c — --dtype auto (the default, inference.dtype = "auto"): serve a
 * model's weights as its file stores them.
 *
 * The stored dtype is the one holding the most elements among the file's
 * tensors of two or more dimensions (the linear layers, embedding and
 * classifier; a GGUF file may keep its classifier in another type, Q6_K
 * beside Q4_0, and norms are f32 everywhere; a kiln-train checkpoint's
 * optimizer state is not counted).  Each stored dtype has a list
 * of kk dtypes, the one that holds it as stored first, then the closest
 * that holds it without loss or with the least, and the first the backend
 * computes on wins (asked with kk_supports, never the backend's name):
 *   F32 -> f32;  BF16 -> bf16, f32;  F16 -> f16, f32 (exact);
 *   Q8_0 -> i8, f32;  Q4_0 -> q4, i8, f32;
 *   Q4_1, Q4_K -> q4, i8, f32 (requantized);  Q6_K -> i8, f32;
 *   F8 -> f16, bf16, f32;  F64 and anything else -> f32.
 * Kept apart from models.c so the choice is a pure function that
 * tests/inferd/test-openai.c runs for every file type on both backends'
 * answers, without a GPU. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "inferd.h"
#include "kiln/macro.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_file *, kmf_close)

int inferd_file_weight_dtype(const char *path, kmf_dtype *ret, double *share, kiln_error *err)
{
	assert_return(path && ret && share, -EINVAL);
	_cleanup_(kmf_closep) kmf_file *f = NULL;
	int r = kmf_open(path, &f, err);
	if (r < 0)
		return r;
	double elems[KMF_DTYPE_MAX] = { 0 }, total = 0;
	for (size_t i = 0; i < kmf_tensor_count(f); i++) {
		const kmf_tensor *t = kmf_tensor_at(f, i);
		/* kiln-train's checkpoints carry AdamW's moments beside the
		 * weights (optim.m.*, optim.v.*, f32): not served. */
		if (t->ndim < 2 || (unsigned) t->dtype >= KMF_DTYPE_MAX ||
		    strncmp(t->name, "optim.", 6) == 0)
			continue;
		elems[t->dtype] += (double) t->nelem;
		total += (double) t->nelem;
	}
	if (total == 0)
		return kiln_error_setf(err, -EINVAL, "%s: no weight matrix in the file", path);
	kmf_dtype best = KMF_F32;
	for (int d = 0; d < KMF_DTYPE_MAX; d++)
		if (elems[d] > elems[best])
			best = (kmf_dtype) d;
	*ret = best;
	*share = elems[best] / total;
	return 0;
}

bool inferd_backend_computes(const void *ctx, kk_dtype dt)
{
	const kk_backend *be = ctx;
	if (dt == KK_I8 || dt == KK_Q4)
		return kk_supports(be, KK_OP_QGEMM, dt);
	return kk_supports(be, KK_OP_GEMM, dt) && kk_supports(be, KK_OP_ATTENTION_PAGED, dt) &&
	       kk_supports(be, KK_OP_RMSNORM_FWD, dt);
}

kk_dtype inferd_dtype_auto(kmf_dtype stored, inferd_dtype_ok ok, const void *ctx, char *why,
			   size_t len)
{
	/* Per stored dtype: kk dtypes in order of preference, the first one
	 * "as stored" when `exact`, else already a conversion. */
	static const struct {
		kmf_dtype stored;
		bool exact;
		kk_dtype pick[3];
		int n;
	} table[] = {
		{ KMF_F32, true, { KK_F32 }, 1 },
		{ KMF_BF16, true, { KK_BF16, KK_F32 }, 2 },
		{ KMF_F16, true, { KK_F16, KK_F32 }, 2 },
		{ KMF_Q8_0, true, { KK_I8, KK_F32 }, 2 },
		{ KMF_Q4_0, true, { KK_Q4, KK_I8, KK_F32 }, 3 },
		{ KMF_Q4_1, false, { KK_Q4, KK_I8, KK_F32 }, 3 },
		{ KMF_Q4_K, false, { KK_Q4, KK_I8, KK_F32 }, 3 },
		{ KMF_Q6_K, false, { KK_I8, KK_F32 }, 2 },
		{ KMF_F8_E4M3, false, { KK_F16, KK_BF16, KK_F32 }, 3 },
		{ KMF_F8_E5M2, false, { KK_F16, KK_BF16, KK_F32 }, 3 },
	};
	const char *name = kmf_dtype_name(stored) ? kmf_dtype_name(stored) : "an unknown type";
	for (size_t i = 0; i < ARRAY_SIZE(table); i++) {
		if (table[i].stored != stored)
			continue;
		for (int j = 0; j < table[i].n; j++) {
			const kk_dtype dt = table[i].pick[j];
			if (!ok(ctx, dt))
				continue;
			if (j == 0 && table[i].exact)
				snprintf(why, len, "as stored (%s)", name);
			else if (j == 0)
				snprintf(why, len, "%s converted to %s: kiln computes on no %s",
					 name, kk_dtype_name(dt), name);
			else
				snprintf(why, len,
					 "%s converted to %s: the backend computes on no %s", name,
					 kk_dtype_name(dt), kk_dtype_name(table[i].pick[0]));
			return dt;
		}
	}
	snprintf(why, len, "%s converted to f32: the closest dtype the backend computes on", name);
	return KK_F32;
}
