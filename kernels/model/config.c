/* config.c — km_config validation, parameter counts and km_errorf.
 *
 * Every model file reader (source.c, on libkmf) derives a km_config from
 * the file's metadata and checks it here, so a corrupt or hostile header
 * fails with one message naming the field instead of asking for terabytes. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "kiln/macro.h"
#include "kmodel.h"

#include "model-internal.h"

int km_errorf(kiln_error *err, int r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_error_vset(err, NULL, r, KM_ERROR_MAX, fmt, ap);
	va_end(ap);
	return r;
}

#define BAD(field, val, rule) \
	km_errorf(err, -EINVAL, "model config: %s = %d, " rule, field, (int) (val))

int km_config_validate(const km_config *c, kiln_error *err)
{
	if (!c)
		return km_errorf(err, -EINVAL, "model config: missing");
	if (c->dim < 1 || c->dim > KM_DIM_MAX)
		return BAD("dim", c->dim, "must be 1..65536");
	if (c->hidden_dim < 1 || c->hidden_dim > KM_HIDDEN_MAX)
		return BAD("hidden_dim", c->hidden_dim, "must be 1..262144");
	if (c->n_layers < 1 || c->n_layers > KM_LAYERS_MAX)
		return BAD("n_layers", c->n_layers, "must be 1..1024");
	if (c->n_heads < 1 || c->n_heads > KM_HEADS_MAX)
		return BAD("n_heads", c->n_heads, "must be 1..1024");
	if (c->dim % c->n_heads)
		return km_errorf(err, -EINVAL,
				 "model config: n_heads = %d does not divide dim = %d", c->n_heads,
				 c->dim);
	if (c->n_kv_heads < 1 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
		return km_errorf(err, -EINVAL,
				 "model config: n_kv_heads = %d must divide n_heads = %d",
				 c->n_kv_heads, c->n_heads);
	if (c->head_dim != c->dim / c->n_heads)
		return km_errorf(err, -EINVAL,
				 "model config: head_dim = %d, must be dim / n_heads = %d",
				 c->head_dim, c->dim / c->n_heads);
	if (c->head_dim % 2 || c->head_dim > KK_ATTN_HEAD_DIM_MAX)
		return BAD("head_dim", c->head_dim, "must be even and at most 256 (RoPE, kk)");
	if (c->vocab_size < 1 || c->vocab_size > KM_VOCAB_MAX)
		return BAD("vocab_size", c->vocab_size, "must be 1..2097152");
	if (c->max_seq_len < 1 || c->max_seq_len > KM_SEQ_LEN_MAX)
		return BAD("max_seq_len", c->max_seq_len, "must be 1..1048576");
	if (!(c->norm_eps > 0 && c->norm_eps < 1))
		return km_errorf(err, -EINVAL, "model config: norm_eps = %g, must be in (0, 1)",
				 (double) c->norm_eps);
	if (!(c->rope_theta > 1 && c->rope_theta < 1e12f))
		return km_errorf(err, -EINVAL,
				 "model config: rope_theta = %g, must be in (1, 1e12)",
				 (double) c->rope_theta);
	if (c->rope_mode != KK_ROPE_INTERLEAVED && c->rope_mode != KK_ROPE_HALF)
		return BAD("rope_mode", c->rope_mode, "must be interleaved (0) or half (1)");
	for (int i = 0; c->rope_scaled && i < c->head_dim / 2; i++)
		if (!(c->rope_freq_div[i] > 0 && c->rope_freq_div[i] <= KM_ROPE_DIV_MAX))
			return km_errorf(err, -EINVAL,
					 "model config: rope_freq_div[%d] = %g, must be in (0, %g]",
					 i, (double) c->rope_freq_div[i], KM_ROPE_DIV_MAX);
	if (km_param_count(c) > KM_PARAMS_MAX)
		return km_errorf(err, -EINVAL,
				 "model config: %lld parameters, more than the %lld accepted",
				 (long long) km_param_count(c), (long long) KM_PARAMS_MAX);
	return 0;
}

int64_t km_param_count(const km_config *c)
{
	int64_t d = c->dim, h = c->hidden_dim, kv = (int64_t) c->n_kv_heads * c->head_dim;
	int64_t layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * h * d;
	int64_t emb = (int64_t) c->vocab_size * d * (c->shared_classifier ? 1 : 2);
	return emb + c->n_layers * layer + d;
}
