/* train_spec.c — a model shape written on a command line, for training from
 * scratch.
 *
 * kiln-train --init takes "dim=64,hidden=172,layers=5,heads=8,kv_heads=4,
 * vocab=512,seq=512" instead of a model file; kmt_config_parse turns that
 * into the km_config kmt_model_new builds a randomly initialized model of.
 * The rest of the architecture is llama2.c's (RMSNorm eps 1e-5, RoPE theta
 * 10000 on interleaved pairs, a classifier shared with the embedding) unless
 * the spec says otherwise, so a model trained from it can be written as a
 * llama2.c checkpoint.  Every key is checked: an unknown, repeated or
 * missing one is refused by name, as is a value out of range. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/parse.h"
#include "train-internal.h"

/* Bounds on each integer key: a typo must fail here, not as a terabyte
 * allocation (KMT_MAX_TOKENS already bounds seq). */
#define SPEC_INT_MAX (1 << 20)

enum { K_DIM, K_HIDDEN, K_LAYERS, K_HEADS, K_KV_HEADS, K_VOCAB, K_SEQ, K_SHARED, K_EPS, K_THETA };

static const struct spec_key {
	const char *name;
	bool required;
} keys[] = {
	[K_DIM] = { "dim", true },
	[K_HIDDEN] = { "hidden", true },
	[K_LAYERS] = { "layers", true },
	[K_HEADS] = { "heads", true },
	[K_KV_HEADS] = { "kv_heads", false },
	[K_VOCAB] = { "vocab", true },
	[K_SEQ] = { "seq", true },
	[K_SHARED] = { "shared", false },
	[K_EPS] = { "norm_eps", false },
	[K_THETA] = { "rope_theta", false },
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

#define SPEC_HINT                                          \
	"write KEY=VALUE pairs separated by commas, e.g. " \
	"dim=64,hidden=172,layers=5,heads=8,kv_heads=4,vocab=512,seq=512"

static int find_key(const char *k, size_t len)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (strlen(keys[i].name) == len && memcmp(keys[i].name, k, len) == 0)
			return (int) i;
	return -1;
}

static int set_value(km_config *c, int key, const char *v, kiln_error *err)
{
	int *ints[] = {
		[K_DIM] = &c->dim,	  [K_HIDDEN] = &c->hidden_dim,	 [K_LAYERS] = &c->n_layers,
		[K_HEADS] = &c->n_heads,  [K_KV_HEADS] = &c->n_kv_heads, [K_VOCAB] = &c->vocab_size,
		[K_SEQ] = &c->max_seq_len
	};
	double d;
	int i;
	switch (key) {
	case K_SHARED:
		if (kiln_parse_int(v, 0, 1, &i) < 0)
			return km_errorf(err, -EINVAL, "model spec: shared '%s': must be 0 or 1",
					 v);
		c->shared_classifier = i;
		return 0;
	case K_EPS:
	case K_THETA:
		if (kiln_parse_double(v, &d) < 0 || !(d > 0) || !isfinite(d) || d > 1e30)
			return km_errorf(err, -EINVAL, "model spec: %s '%s': must be a number > 0",
					 keys[key].name, v);
		*(key == K_EPS ? &c->norm_eps : &c->rope_theta) = (float) d;
		return 0;
	default:
		if (kiln_parse_int(v, 1, SPEC_INT_MAX, ints[key]) < 0)
			return km_errorf(err, -EINVAL, "model spec: %s '%s': must be 1..%d",
					 keys[key].name, v, SPEC_INT_MAX);
		return 0;
	}
}

int kmt_config_parse(const char *spec, km_config *ret, kiln_error *err)
{
	if (!spec || !ret)
		return km_errorf(err, -EINVAL, "kmt_config_parse: missing argument");
	km_config c = { .norm_eps = 1e-5f,
			.rope_theta = 10000.0f,
			.rope_mode = KK_ROPE_INTERLEAVED,
			.shared_classifier = true };
	bool seen[N_KEYS] = { false };
	const char *p = spec;
	if (!*p)
		return km_errorf(err, -EINVAL, "model spec is empty; " SPEC_HINT);
	for (;;) {
		const char *end = p + strcspn(p, ",");
		const char *eq = memchr(p, '=', (size_t) (end - p));
		if (!eq || eq == p)
			return km_errorf(err, -EINVAL,
					 "model spec '%s': '%.*s' at offset %td is not "
					 "KEY=VALUE; " SPEC_HINT,
					 spec, (int) (end - p), p, p - spec);
		int k = find_key(p, (size_t) (eq - p));
		if (k < 0)
			return km_errorf(
				err, -EINVAL,
				"model spec '%s': unknown key '%.*s' at offset %td (keys: "
				"dim, hidden, layers, heads, kv_heads, vocab, seq, shared, "
				"norm_eps, rope_theta)",
				spec, (int) (eq - p), p, p - spec);
		if (seen[k])
			return km_errorf(err, -EINVAL, "model spec '%s': '%s' given twice", spec,
					 keys[k].name);
		seen[k] = true;
		char v[64];
		size_t vl = (size_t) (end - eq - 1);
		if (vl >= sizeof(v))
			return km_errorf(err, -EINVAL, "model spec: %s: value too long",
					 keys[k].name);
		memcpy(v, eq + 1, vl);
		v[vl] = 0;
		int r = set_value(&c, k, v, err);
		if (r < 0)
			return r;
		if (!*end)
			break;
		p = end + 1;
	}
	for (size_t i = 0; i < N_KEYS; i++)
		if (keys[i].required && !seen[i])
			return km_errorf(err, -EINVAL,
					 "model spec '%s': '%s' is missing; " SPEC_HINT, spec,
					 keys[i].name);
	if (!seen[K_KV_HEADS])
		c.n_kv_heads = c.n_heads;
	if (c.dim % c.n_heads)
		return km_errorf(err, -EINVAL,
				 "model spec '%s': dim %d is not a multiple of heads %d", spec,
				 c.dim, c.n_heads);
	c.head_dim = c.dim / c.n_heads;
	int r = km_config_validate(&c, err);
	if (r < 0)
		return r;
	*ret = c;
	return 0;
}
