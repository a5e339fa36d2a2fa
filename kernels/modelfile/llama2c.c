/* llama2c.c — the llama2.c legacy checkpoint reader.
 *
 * The format (karpathy/llama2.c run.c, "legacy" export) has no magic: 7
 * little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len; a negative vocab_size means the classifier is NOT
 * shared with the token embedding) followed by f32 arrays.  It is
 * therefore recognised only when the file size is exactly the size that
 * header implies — nothing else in kiln's formats can pass that test by
 * accident except a crafted file.
 *
 * The weights are exposed under Hugging Face llama names (docs/modelfile.md
 * has the table), in llama2.c's own layout: q_proj/k_proj rows are in the
 * interleaved-pair RoPE order of Meta's checkpoints, not the rotate-half
 * permutation of HF transformers checkpoints (metadata
 * "rope_layout" = "interleaved" says so).  The RoPE tables stored after
 * the weights are skipped. */
#include <stdio.h>

#include "kmf_internal.h"

/* Each header field of a real llama2.c model is far below this; the cap
 * keeps every size product below 2^63. */
#define L2C_MAX_FIELD (1 << 20)
#define L2C_HEADER    28

struct l2c_cfg {
	int64_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
	bool shared;
	int64_t kv_dim, head_size;
};

/* The floats the checkpoint holds for cfg (without the header). */
static bool l2c_floats(const uint8_t *p, struct l2c_cfg *c, uint64_t *floats)
{
	int32_t h[7];
	uint64_t n;
	for (int i = 0; i < 7; i++)
		h[i] = (int32_t) kmf__ld32(p + 4 * i);
	c->dim = h[0], c->hidden = h[1], c->layers = h[2], c->heads = h[3], c->kv_heads = h[4];
	c->shared = h[5] > 0;
	c->vocab = h[5] > 0 ? h[5] : -(int64_t) h[5];
	c->seq_len = h[6];
	if (c->dim <= 0 || c->hidden <= 0 || c->layers <= 0 || c->heads <= 0 || c->kv_heads <= 0 ||
	    c->vocab <= 0 || c->seq_len <= 0)
		return false;
	if (c->dim > L2C_MAX_FIELD || c->hidden > L2C_MAX_FIELD || c->layers > 4096 ||
	    c->heads > 4096 || c->kv_heads > c->heads || c->vocab > L2C_MAX_FIELD ||
	    c->seq_len > L2C_MAX_FIELD)
		return false;
	if (c->dim % c->heads || c->heads % c->kv_heads)
		return false;
	c->head_size = c->dim / c->heads;
	c->kv_dim = c->dim * c->kv_heads / c->heads;
	n = (uint64_t) (c->vocab * c->dim);		     /* token embedding */
	n += (uint64_t) c->layers * c->dim * 2;		     /* rms_att, rms_ffn */
	n += (uint64_t) c->layers * c->dim * c->dim * 2;     /* wq, wo */
	n += (uint64_t) c->layers * c->dim * c->kv_dim * 2;  /* wk, wv */
	n += (uint64_t) c->layers * c->dim * c->hidden * 3;  /* w1, w2, w3 */
	n += (uint64_t) c->dim;				     /* rms_final */
	n += (uint64_t) (c->seq_len * c->head_size / 2) * 2; /* RoPE tables */
	if (!c->shared)
		n += (uint64_t) (c->vocab * c->dim); /* wcls */
	*floats = n;
	return true;
}

bool kmf__l2c_probe(const uint8_t *p, size_t n)
{
	struct l2c_cfg c;
	uint64_t floats;
	if (n < L2C_HEADER || !l2c_floats(p, &c, &floats))
		return false;
	return floats <= (UINT64_MAX - L2C_HEADER) / 4 && L2C_HEADER + floats * 4 == n;
}

struct builder {
	kmf_file *f;
	uint64_t pos; /* file offset of the next array */
	kiln_error *err;
};

static int add(struct builder *b, const char *name, int64_t rows, int64_t cols, uint64_t at)
{
	kmf_tensor *t = &b->f->tensors[b->f->n_tensors];
	t->name = kmf__strndup(b->f, name, strlen(name));
	if (!t->name)
		return kmf__fail(b->err, -ENOMEM, -1, NULL, "out of memory");
	t->dtype = KMF_F32;
	t->ndim = cols ? 2 : 1;
	t->shape[0] = rows;
	t->shape[1] = cols;
	t->offset = at;
	t->data = b->f->base + at;
	b->f->n_tensors++;
	return kmf__tensor_size(t, (int64_t) at, false, b->err);
}

/* Adds one tensor per layer from a layer-major array of [rows, cols]. */
static int add_layers(struct builder *b, const struct l2c_cfg *c, const char *suffix, int64_t rows,
		      int64_t cols)
{
	uint64_t per = (uint64_t) rows * (cols ? cols : 1) * 4;
	for (int64_t l = 0; l < c->layers; l++) {
		char name[128];
		int r;
		snprintf(name, sizeof(name), "model.layers.%d.%s", (int) l, suffix);
		r = add(b, name, rows, cols, b->pos + (uint64_t) l * per);
		if (r < 0)
			return r;
	}
	b->pos += (uint64_t) c->layers * per;
	return 0;
}

static int meta_int(kmf_file *f, const char *key, int64_t v)
{
	kmf_meta *m = kmf__meta_add(f, key, strlen(key));
	if (!m)
		return -ENOMEM;
	m->type = KMF_V_I32;
	m->i = v;
	return 0;
}

int kmf__l2c_parse(kmf_file *f, kiln_error *err)
{
	struct l2c_cfg c;
	uint64_t floats;
	struct builder b = { .f = f, .pos = L2C_HEADER, .err = err };
	kmf_meta *m;
	size_t nt;
	int r = 0;

	f->format = KMF_FORMAT_LLAMA2C;
	if (!l2c_floats(f->base, &c, &floats))
		return kmf__fail(err, -EBADMSG, 0, NULL, "llama2.c header is not valid");
	nt = 3 + (size_t) c.layers * 9 + 1;
	f->tensors = calloc(nt, sizeof(*f->tensors));
	if (!f->tensors)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");

	r = add(&b, "model.embed_tokens.weight", c.vocab, c.dim, b.pos);
	b.pos += (uint64_t) (c.vocab * c.dim) * 4;
	/* The layer-major arrays in the file's order: [rows, cols] (0: a
	 * vector). */
	const struct {
		const char *suffix;
		int64_t rows, cols;
	} layers[] = {
		{ "input_layernorm.weight", c.dim, 0 },
		{ "self_attn.q_proj.weight", c.dim, c.dim },
		{ "self_attn.k_proj.weight", c.kv_dim, c.dim },
		{ "self_attn.v_proj.weight", c.kv_dim, c.dim },
		{ "self_attn.o_proj.weight", c.dim, c.dim },
		{ "post_attention_layernorm.weight", c.dim, 0 },
		{ "mlp.gate_proj.weight", c.hidden, c.dim },
		{ "mlp.down_proj.weight", c.dim, c.hidden },
		{ "mlp.up_proj.weight", c.hidden, c.dim },
	};
	for (size_t i = 0; r >= 0 && i < ARRAY_SIZE(layers); i++)
		r = add_layers(&b, &c, layers[i].suffix, layers[i].rows, layers[i].cols);
	if (r >= 0)
		r = add(&b, "model.norm.weight", c.dim, 0, b.pos);
	b.pos += (uint64_t) c.dim * 4;
	b.pos += (uint64_t) (c.seq_len * c.head_size / 2) * 2 * 4;
	/* lm_head: its own array after the RoPE tables, or the embedding. */
	if (r >= 0)
		r = add(&b, "lm_head.weight", c.vocab, c.dim, c.shared ? L2C_HEADER : b.pos);
	if (r < 0)
		return r;

	if (meta_int(f, "dim", c.dim) < 0 || meta_int(f, "hidden_dim", c.hidden) < 0 ||
	    meta_int(f, "n_layers", c.layers) < 0 || meta_int(f, "n_heads", c.heads) < 0 ||
	    meta_int(f, "n_kv_heads", c.kv_heads) < 0 || meta_int(f, "vocab_size", c.vocab) < 0 ||
	    meta_int(f, "seq_len", c.seq_len) < 0)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	m = kmf__meta_add(f, "shared_classifier", strlen("shared_classifier"));
	if (!m)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	m->type = KMF_V_BOOL;
	m->b = c.shared;
	m = kmf__meta_add(f, "rope_layout", strlen("rope_layout"));
	if (!m)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	m->type = KMF_V_STRING;
	m->str.s = "interleaved";
	m->str.len = strlen(m->str.s);
	return 0;
}
