/* model.c — km_model: Llama weights on a kk backend and the batched forward
 * step (prefill and decode mixed, continuous batching) with sampling.
 *
 * One step packs the tokens of every input into one batch of T rows:
 * prefill inputs first (their whole prompts, positions 0..n-1), then the
 * inputs that continue a cached context (decode: one token each; or a
 * chunk of several: chunked prefill, a prompt after a shared prefix).
 * Every layer runs the projections and the FFN over all T rows at once;
 * attention splits: the prefill rows go through kk_attention_fwd over the
 * packed varlen batch (causal, cu_seqlens), the others over the block
 * tables through kk_attention_decode when each brings one token, else
 * kk_attention_paged; every row's K/V is written to the paged cache first.  Logits are computed for
 * the last row of each input only.  All index data of a step (token ids,
 * positions, cache slots, cu_seqlens, context lengths, block tables) goes
 * to the device in one upload. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kmodel.h"

#include "model-internal.h"

/* Largest step the options may ask for, a bound on activation buffers. */
#define KM_MAX_TOKENS_LIMIT (1 << 20)

typedef struct km_linear {
	int64_t n, k;  /* W [n, k] */
	kk_buffer *w;  /* float weights, or */
	kk_qmatrix *q; /* weight-only quantized */
} km_linear;

typedef struct km_layer {
	kk_buffer *attn_norm, *ffn_norm;
	km_linear wq, wk, wv, wo, w1, w2, w3;
} km_layer;

struct km_model {
	kk_backend *be;
	km_config cfg;
	km_model_opts opts;
	kk_dtype adt; /* activations, norms, embedding, KV cache */
	int hidden;   /* FFN width as stored (padded for Q4 groups) */
	size_t weight_bytes;
	size_t mapped_bytes; /* of weight_bytes, computed on in the source's memory */
	void *hold;	     /* the source's hold on that memory (NULL: none) */
	void (*drop)(void *hold);

	kk_buffer *emb, *cls, *final_norm; /* cls == emb when shared */
	kk_buffer *rope_div;		   /* F32 [head_dim / 2] (km__rope_div), or NULL */
	/* i8/q4 models: the embedding and classifier quantized like the
	 * layers (emb and cls NULL); qcls == qemb when shared.  The classifier
	 * is most of a small quantized model's bytes per token. */
	kk_qmatrix *qemb, *qcls;
	km_layer *layers;

	/* Activations, sized for opts.max_tokens rows (max_seqs for last_*). */
	kk_buffer *x, *resid, *xb, *q, *k, *v, *att, *h1, *h2, *h3;
	kk_buffer *last_x, *last_r, *logits, *ids;
	kk_buffer *meta; /* I32 index data of one step */
	int32_t *hmeta;
	size_t meta_count;
	int *order, *old_len; /* [max_seqs], per step */
	int last_n;	      /* rows of logits the last step produced */
};

static void linear_free(km_linear *l)
{
	kk_buffer_free(l->w);
	kk_qmatrix_free(l->q);
}

km_model *km_model_free(km_model *m)
{
	if (!m)
		return NULL;
	for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
		km_layer *L = &m->layers[l];
		kk_buffer_free(L->attn_norm);
		kk_buffer_free(L->ffn_norm);
		km_linear *lin[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3 };
		for (size_t i = 0; i < ARRAY_SIZE(lin); i++)
			linear_free(lin[i]);
	}
	free(m->layers);
	if (m->cls != m->emb)
		kk_buffer_free(m->cls);
	if (m->qcls != m->qemb)
		kk_qmatrix_free(m->qcls);
	kk_qmatrix_free(m->qemb);
	kk_buffer *bufs[] = { m->emb,	 m->final_norm, m->x,	   m->resid, m->xb,   m->q,
			      m->k,	 m->v,		m->att,	   m->h1,    m->h2,   m->h3,
			      m->last_x, m->last_r,	m->logits, m->ids,   m->meta, m->rope_div };
	for (size_t i = 0; i < ARRAY_SIZE(bufs); i++)
		kk_buffer_free(bufs[i]);
	FREE_ALL(m->hmeta, m->order, m->old_len);
	if (m->hold) /* after every buffer over the source's memory is gone */
		m->drop(m->hold);
	free(m);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(km_model *, km_model_free);

const km_config *km_model_config(const km_model *m)
{
	return m ? &m->cfg : NULL;
}

kk_dtype km_model_act_dtype(const km_model *m)
{
	return m ? m->adt : KK_DTYPE_MAX;
}

size_t km_model_weight_bytes(const km_model *m)
{
	return m ? m->weight_bytes : 0;
}

size_t km_model_mapped_bytes(const km_model *m)
{
	return m ? m->mapped_bytes : 0;
}

int km__kk_fail(kiln_error *err, int r, const char *what, const kk_backend *be, int head_dim,
		const char *dtype, const char *verb)
{
	char dt[32] = "";
	if (r != -EOPNOTSUPP)
		return km_errorf(err, r, "%s on backend '%s' failed: %s", what, kk_backend_name(be),
				 strerror(-r));
	if (dtype)
		snprintf(dt, sizeof(dt), ", dtype %s", dtype);
	return km_errorf(err, r,
			 "%s: backend '%s' has no kernel for this model (head_dim %d%s); kk "
			 "attention takes head dims 1..128 on cpu, 64 and 128 on cuda: %s it on a "
			 "backend that has it (KILN_BACKEND=cpu)",
			 what, kk_backend_name(be), head_dim, dt, verb);
}

int km__rope_div(kk_backend *be, const km_config *c, kk_buffer **ret)
{
	kk_buffer *b = NULL;
	size_t bytes = sizeof(float) * (size_t) (c->head_dim / 2);
	int r = 0;
	if (c->rope_scaled && (r = kk_buffer_alloc(be, KK_F32, bytes / sizeof(float), &b)) >= 0)
		r = kk_buffer_upload(be, NULL, b, 0, c->rope_freq_div, bytes);
	if (r < 0) {
		kk_buffer_free(b);
		return r;
	}
	*ret = b;
	return 0;
}

int km__rope_qk(kk_backend *be, const km_config *c, const kk_buffer *div, kk_buffer *q,
		kk_buffer *k, const kk_buffer *pos, int64_t T, bool backward)
{
	int r = kk_rope(be, NULL, q, pos, T, c->n_heads, c->head_dim, 0, c->rope_theta, div,
			c->rope_mode, backward);
	return r < 0 ? r
		     : kk_rope(be, NULL, k, pos, T, c->n_kv_heads, c->head_dim, 0, c->rope_theta,
			       div, c->rope_mode, backward);
}

static int kk_fail(kiln_error *err, int r, const char *what, const km_model *m)
{
	return km__kk_fail(err, r, what, m->be, m->cfg.head_dim, kk_dtype_name(m->adt), "run");
}

/* Reads one tensor of `count` floats from the source into a fresh array. */
static int read_tensor(const km_weight_source *src, const char *name, size_t count, float **ret,
		       kiln_error *err)
{
	_cleanup_free_ float *h = malloc(count * sizeof(float));
	if (!h)
		return km_errorf(err, -ENOMEM, "weights: out of memory for '%s'", name);
	int r = src->read(src->userdata, name, h, count, err);
	if (r < 0)
		return r;
	*ret = TAKE_PTR(h);
	return 0;
}

/* Uploads host f32 data as a buffer of dtype dt. */
static int upload_as(km_model *m, kk_dtype dt, const float *h, size_t count, kk_buffer **ret,
		     kiln_error *err)
{
	kk_buffer *b = NULL;
	int r = kk_buffer_alloc(m->be, dt, count, &b);
	if (r < 0)
		return kk_fail(err, r, "allocating weights", m);
	const void *src = h;
	_cleanup_free_ void *conv = NULL;
	if (dt != KK_F32) {
		conv = malloc(kk_dtype_size(dt, count));
		if (!conv || kk_convert_host(dt, conv, KK_F32, h, count) < 0) {
			kk_buffer_free(b);
			return km_errorf(err, -ENOMEM, "weights: out of memory converting");
		}
		src = conv;
	}
	r = kk_buffer_upload(m->be, NULL, b, 0, src, kk_dtype_size(dt, count));
	if (r < 0) {
		kk_buffer_free(b);
		return kk_fail(err, r, "uploading weights", m);
	}
	m->weight_bytes += kk_dtype_size(dt, count);
	*ret = b;
	return 0;
}

/* The tensor in the source's own memory as a buffer of dtype dt, when the
 * source stores it so and the backend computes on host memory: nothing is
 * copied, the weights stay in the file's page cache (shared, and dropped
 * under memory pressure instead of swapped).  0 and *ret NULL otherwise. */
static int map_tensor(km_model *m, const km_weight_source *src, const char *name, kk_dtype dt,
		      size_t count, kk_buffer **ret)
{
	kk_dtype sdt;
	const void *p;
	*ret = NULL;
	if (!src->view || !src->hold || !src->drop ||
	    !(p = src->view(src->userdata, name, count, &sdt)) || sdt != dt)
		return 0;
	if (kk_buffer_wrap_host(m->be, dt, p, count, ret) < 0)
		return 0; /* a device backend, or unaligned: copy */
	if (!m->hold) {
		m->hold = src->hold(src->userdata);
		m->drop = src->drop;
		if (!m->hold) {
			*ret = kk_buffer_free(*ret);
			return 0;
		}
	}
	m->weight_bytes += kk_dtype_size(dt, count);
	m->mapped_bytes += kk_dtype_size(dt, count);
	return 0;
}

static int load_vector(km_model *m, const km_weight_source *src, const char *name, size_t count,
		       kk_buffer **ret, kiln_error *err)
{
	_cleanup_free_ float *h = NULL;
	map_tensor(m, src, name, m->adt, count, ret);
	if (*ret)
		return 0;
	int r = read_tensor(src, name, count, &h, err);
	if (r < 0)
		return r;
	return upload_as(m, m->adt, h, count, ret, err);
}

/* An i8/q4 weight the source stores in kk's blocks of 32 (GGUF Q8_0 /
 * Q4_0): uploaded as it is, f16 scales and all.  1 when it was, 0 when the
 * source has it in another form. */
static int load_native(km_model *m, const km_weight_source *src, const char *name, int64_t n,
		       int64_t k, km_linear *out, kiln_error *err)
{
	kk_dtype wdt = m->opts.weight_dtype;
	if (!src->read_quant || k % 32 || (wdt == KK_Q4 && m->opts.q4_group != 32))
		return 0;
	/* int8 in groups of 32 only where the backend takes it (the cpu's;
	 * cuda's kernels take per-channel scales): elsewhere the tensor is
	 * read as f32 and quantized per channel, as before. */
	if (wdt == KK_I8 && !kk_backend_has(m->be, KK_CAP_I8_GROUP32))
		return 0;
	size_t nb = kk_dtype_size(wdt, (size_t) (n * k)), ns = (size_t) (n * k / 32);
	_cleanup_free_ void *data = malloc(nb);
	_cleanup_free_ uint16_t *sc = malloc(ns * sizeof(uint16_t));
	if (!data || !sc)
		return km_errorf(err, -ENOMEM, "weights: out of memory for '%s'", name);
	int r = src->read_quant(src->userdata, name, wdt, n, k, data, sc, err);
	if (r <= 0)
		return r;
	r = kk_qmatrix_alloc(m->be, wdt, n, k, 32, KK_F16, &out->q);
	if (r < 0)
		return kk_fail(err, r, "allocating a quantized matrix", m);
	if ((r = kk_buffer_upload(m->be, NULL, out->q->data, 0, data, nb)) < 0 ||
	    (r = kk_buffer_upload(m->be, NULL, out->q->scales, 0, sc, ns * 2)) < 0)
		return kk_fail(err, r, "uploading weights", m);
	out->n = n;
	out->k = k;
	m->weight_bytes += nb + ns * 2;
	return 1;
}

/* The cpu backend's packed rows (kk_qmatrix_pack: 8 rows interleaved,
 * the same bytes); other backends have one layout. */
static int pack_linear(km_model *m, km_linear *out, kiln_error *err)
{
	int r = kk_qmatrix_pack(m->be, out->q);
	if (r < 0 && r != -EOPNOTSUPP)
		return kk_fail(err, r, "packing quantized weights", m);
	return 0;
}

/* Loads W [n, k] from the source into a linear layer stored [np, kp]
 * (np >= n, kp >= k; the padding is zero, which adds nothing to y). */
static int load_linear(km_model *m, const km_weight_source *src, const char *name, int64_t n,
		       int64_t k, int64_t np, int64_t kp, km_linear *out, kiln_error *err)
{
	_cleanup_free_ float *h = NULL;
	kk_dtype wdt = m->opts.weight_dtype;
	int r;
	if ((wdt == KK_I8 || wdt == KK_Q4) && np == n && kp == k &&
	    (r = load_native(m, src, name, n, k, out, err)) != 0)
		return r < 0 ? r : pack_linear(m, out, err);
	if (np == n && kp == k && wdt != KK_I8 && wdt != KK_Q4) {
		map_tensor(m, src, name, wdt, (size_t) (n * k), &out->w);
		if (out->w) {
			out->n = n;
			out->k = k;
			return 0;
		}
	}
	r = read_tensor(src, name, (size_t) (n * k), &h, err);
	if (r < 0)
		return r;
	if (np != n || kp != k) {
		float *p = calloc((size_t) (np * kp), sizeof(float));
		if (!p)
			return km_errorf(err, -ENOMEM, "weights: out of memory for '%s'", name);
		for (int64_t i = 0; i < n; i++)
			memcpy(p + i * kp, h + i * k, (size_t) k * sizeof(float));
		free(h);
		h = p;
	}
	out->n = np;
	out->k = kp;
	if (wdt != KK_I8 && wdt != KK_Q4)
		return upload_as(m, wdt, h, (size_t) (np * kp), &out->w, err);

	_cleanup_(kk_buffer_freep) kk_buffer *tmp = NULL;
	size_t wb = m->weight_bytes;
	r = upload_as(m, KK_F32, h, (size_t) (np * kp), &tmp, err);
	m->weight_bytes = wb;
	if (r < 0)
		return r;
	r = kk_qmatrix_alloc(m->be, wdt, np, kp, wdt == KK_Q4 ? m->opts.q4_group : 0, KK_F32,
			     &out->q);
	if (r < 0)
		return kk_fail(err, r, "allocating a quantized matrix", m);
	r = kk_quantize(m->be, NULL, out->q, tmp);
	if (r < 0)
		return kk_fail(err, r, "quantizing weights", m);
	m->weight_bytes += kk_buffer_bytes(out->q->data) + kk_buffer_bytes(out->q->scales);
	return pack_linear(m, out, err);
}

static int alloc_act(km_model *m, kk_dtype dt, size_t count, kk_buffer **ret, kiln_error *err)
{
	int r = kk_buffer_alloc(m->be, dt, count, ret);
	return r < 0 ? kk_fail(err, r, "allocating activations", m) : 0;
}

/* alloc_act for each buffer of the array bufs (n of them). */
static int alloc_acts(km_model *m, kk_dtype dt, size_t count, kk_buffer **const *bufs, size_t n,
		      kiln_error *err)
{
	int r = 0;
	for (size_t i = 0; r >= 0 && i < n; i++)
		r = alloc_act(m, dt, count, bufs[i], err);
	return r;
}
#define ALLOC_ACTS(m, dt, count, bufs, err) alloc_acts(m, dt, count, bufs, ARRAY_SIZE(bufs), err)

static int probe_attention(km_model *m, kiln_error *err);

int km_model_new(kk_backend *be, const km_config *cfg, const km_model_opts *opts,
		 const km_weight_source *src, km_model **ret, kiln_error *err)
{
	int r;
	if (!be || !cfg || !opts || !src || !src->read || !ret)
		return km_errorf(err, -EINVAL, "km_model_new: missing argument");
	r = km_config_validate(cfg, err);
	if (r < 0)
		return r;
	kk_dtype wdt = opts->weight_dtype;
	if (wdt != KK_F32 && wdt != KK_BF16 && wdt != KK_F16 && wdt != KK_I8 && wdt != KK_Q4)
		return km_errorf(err, -EINVAL,
				 "model options: weight dtype %d, must be f32, bf16, f16, i8 or q4",
				 (int) wdt);
	int group = opts->q4_group ? opts->q4_group : 32;
	if (wdt == KK_Q4 && group != 32 && group != 64 && group != 128)
		return km_errorf(err, -EINVAL, "model options: q4 group %d, must be 32, 64 or 128",
				 group);
	if (wdt == KK_Q4 && cfg->dim % group)
		return km_errorf(err, -EINVAL,
				 "model options: q4 needs dim (%d) to be a multiple of the group "
				 "(%d); use i8 or a smaller group",
				 cfg->dim, group);
	if (opts->max_tokens < 1 || opts->max_tokens > KM_MAX_TOKENS_LIMIT)
		return km_errorf(err, -EINVAL, "model options: max_tokens %d, must be 1..%d",
				 opts->max_tokens, KM_MAX_TOKENS_LIMIT);
	if (opts->max_seqs < 1 || opts->max_seqs > opts->max_tokens ||
	    opts->max_seqs > KM_KV_SEQS_MAX)
		return km_errorf(err, -EINVAL,
				 "model options: max_seqs %d, must be 1..max_tokens (%d)",
				 opts->max_seqs, opts->max_tokens);

	_cleanup_(km_model_freep) km_model *m = calloc(1, sizeof(*m));
	if (!m)
		return km_errorf(err, -ENOMEM, "model: out of memory");
	m->be = be;
	m->cfg = *cfg;
	m->opts = *opts;
	m->opts.q4_group = group;
	m->adt = (wdt == KK_I8 || wdt == KK_Q4) ? KK_F32 : wdt;
	/* Q4 groups must divide k; w2's k is the FFN width, so pad it (zero
	 * rows in w1/w3 give silu(0) * 0 = 0 in the padded columns). */
	m->hidden =
		wdt == KK_Q4 ? (int) DIV_ROUND_UP(cfg->hidden_dim, group) * group : cfg->hidden_dim;

	const int64_t d = cfg->dim, kvd = (int64_t) cfg->n_kv_heads * cfg->head_dim,
		      hid = cfg->hidden_dim, hp = m->hidden, V = cfg->vocab_size;
	if (wdt == KK_I8 || wdt == KK_Q4) {
		km_linear e = {}, o = {};
		r = load_linear(m, src, "tok_embeddings.weight", V, d, V, d, &e, err);
		m->qemb = e.q;
		if (r < 0)
			return r;
		m->qcls = m->qemb;
		if (!cfg->shared_classifier) {
			r = load_linear(m, src, "output.weight", V, d, V, d, &o, err);
			m->qcls = o.q;
			if (r < 0)
				return r;
		}
	} else {
		r = load_vector(m, src, "tok_embeddings.weight", (size_t) (V * d), &m->emb, err);
		if (r < 0)
			return r;
		if (cfg->shared_classifier)
			m->cls = m->emb;
		else if ((r = load_vector(m, src, "output.weight", (size_t) (V * d), &m->cls,
					  err)) < 0)
			return r;
	}
	r = load_vector(m, src, "norm.weight", (size_t) d, &m->final_norm, err);
	if (r < 0)
		return r;
	if ((r = km__rope_div(m->be, cfg, &m->rope_div)) < 0)
		return kk_fail(err, r, "uploading the RoPE frequency divisors", m);
	m->layers = calloc((size_t) cfg->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return km_errorf(err, -ENOMEM, "model: out of memory");
	for (int l = 0; l < cfg->n_layers; l++) {
		km_layer *L = &m->layers[l];
		char name[96];
#define NAME(s) (snprintf(name, sizeof(name), "layers.%d.%s", l, s), name)
		if ((r = load_vector(m, src, NAME("attention_norm.weight"), (size_t) d,
				     &L->attn_norm, err)) < 0 ||
		    (r = load_vector(m, src, NAME("ffn_norm.weight"), (size_t) d, &L->ffn_norm,
				     err)) < 0)
			return r;
		/* Each W [n, k], stored [np, kp]. */
		const struct {
			const char *name;
			km_linear *out;
			int64_t n, k, np, kp;
		} lin[] = {
			{ "attention.wq.weight", &L->wq, d, d, d, d },
			{ "attention.wk.weight", &L->wk, kvd, d, kvd, d },
			{ "attention.wv.weight", &L->wv, kvd, d, kvd, d },
			{ "attention.wo.weight", &L->wo, d, d, d, d },
			{ "feed_forward.w1.weight", &L->w1, hid, d, hp, d },
			{ "feed_forward.w3.weight", &L->w3, hid, d, hp, d },
			{ "feed_forward.w2.weight", &L->w2, d, hid, d, hp },
		};
		for (size_t i = 0; i < ARRAY_SIZE(lin); i++)
			if ((r = load_linear(m, src, NAME(lin[i].name), lin[i].n, lin[i].k,
					     lin[i].np, lin[i].kp, lin[i].out, err)) < 0)
				return r;
#undef NAME
	}

	const size_t T = (size_t) opts->max_tokens, S = (size_t) opts->max_seqs;
	const kk_dtype a = m->adt;
	/* The activations, by size: [T, d], [T, kv dim], [T, padded hidden],
	 * [S, d] in the activation dtype, then the logits and sampled ids. */
	kk_buffer **td[] = { &m->x, &m->resid, &m->xb, &m->q, &m->att };
	kk_buffer **tkv[] = { &m->k, &m->v }, **th[] = { &m->h1, &m->h2, &m->h3 };
	kk_buffer **sd[] = { &m->last_x, &m->last_r };
	if ((r = ALLOC_ACTS(m, a, T * d, td, err)) < 0 ||
	    (r = ALLOC_ACTS(m, a, T * kvd, tkv, err)) < 0 ||
	    (r = ALLOC_ACTS(m, a, T * hp, th, err)) < 0 ||
	    (r = ALLOC_ACTS(m, a, S * d, sd, err)) < 0 ||
	    (r = alloc_act(m, KK_F32, S * V, &m->logits, err)) < 0 ||
	    (r = alloc_act(m, KK_I32, S, &m->ids, err)) < 0)
		return r;
	/* tokens, positions, slots [T]; cu_seqlens [S+1]; context lengths
	 * [S]; last rows [S]; query rows of the cached inputs [S+1]; block
	 * tables [S, blocks per sequence]. */
	size_t bps = (size_t) DIV_ROUND_UP(cfg->max_seq_len, KK_KV_BLOCK_SIZE);
	m->meta_count = 3 * T + 4 * S + 2 + S * bps;
	m->hmeta = calloc(m->meta_count, sizeof(int32_t));
	m->order = calloc(S, sizeof(int));
	m->old_len = calloc(S, sizeof(int));
	if (!m->hmeta || !m->order || !m->old_len)
		return km_errorf(err, -ENOMEM, "model: out of memory");
	if ((r = alloc_act(m, KK_I32, m->meta_count, &m->meta, err)) < 0)
		return r;
	if ((r = probe_attention(m, err)) < 0)
		return r;
	*ret = TAKE_PTR(m);
	return 0;
}

/* Runs attention once on one token so a backend without a kernel for this
 * head dim is reported when the model is loaded, not at the first request. */
static int probe_attention(km_model *m, kiln_error *err)
{
	const int32_t cu[2] = { 0, 1 };
	int r = kk_buffer_upload(m->be, NULL, m->meta, 0, cu, sizeof(cu));
	if (r < 0)
		return kk_fail(err, r, "uploading", m);
	size_t qn = (size_t) m->cfg.dim, kn = (size_t) m->cfg.n_kv_heads * m->cfg.head_dim;
	if ((r = kk_buffer_memset(m->be, NULL, m->q, 0, 0, kk_dtype_size(m->adt, qn))) < 0 ||
	    (r = kk_buffer_memset(m->be, NULL, m->k, 0, 0, kk_dtype_size(m->adt, kn))) < 0 ||
	    (r = kk_buffer_memset(m->be, NULL, m->v, 0, 0, kk_dtype_size(m->adt, kn))) < 0)
		return kk_fail(err, r, "clearing", m);
	kk_attn_desc ad = {
		.n_heads = m->cfg.n_heads,
		.n_kv_heads = m->cfg.n_kv_heads,
		.head_dim = m->cfg.head_dim,
		.causal = true,
		.n_seqs = 1,
		.total_tokens = 1,
		.max_seqlen = 1,
		.cu_seqlens = m->meta,
	};
	r = kk_attention_fwd(m->be, NULL, &ad, m->att, NULL, m->q, m->k, m->v);
	if (r < 0)
		return kk_fail(err, r, "attention", m);
	return kk_backend_sync(m->be) < 0 ? kk_fail(err, -EIO, "attention", m) : 0;
}

static int linear(km_model *m, kk_buffer *y, const kk_buffer *x, const km_linear *w, int64_t rows)
{
	if (w->q)
		return kk_qgemm(m->be, NULL, y, x, w->q, NULL, rows);
	kk_gemm_desc g = {
		.trans_b = true,
		.m = rows,
		.n = w->n,
		.k = w->k,
		.alpha = 1.0f,
		.a = x,
		.lda = w->k,
		.b = w->w,
		.ldb = w->k,
		.c = y,
		.ldc = w->n,
	};
	return kk_gemm(m->be, NULL, &g);
}

/* out[t] = row ids[t] of the quantized table q (ids on the host, checked
 * against the vocabulary by check_inputs): one kk_dequantize of a one-row
 * view per token, so only the rows used are read, on any backend.  A
 * packed table's row lies across its group of KK_QPACK rows: the group's
 * view is dequantized into grp (KK_QPACK rows) and the row copied out. */
static int qembedding(km_model *m, kk_buffer *out, const kk_qmatrix *q, const int32_t *ids,
		      int64_t n)
{
	const int64_t k = q->k, g = q->group ? k / q->group : 1;
	const int64_t packed = q->pack ? q->n / KK_QPACK * KK_QPACK : 0;
	const size_t es = kk_dtype_size(kk_buffer_dtype(out), 1);
	_cleanup_(kk_buffer_freep) kk_buffer *grp = NULL;
	int r = 0;
	if (packed &&
	    (r = kk_buffer_alloc(m->be, kk_buffer_dtype(out), (size_t) (KK_QPACK * k), &grp)) < 0)
		return r;
	for (int64_t t = 0; t < n && r >= 0; t++) {
		bool in_group = ids[t] < packed;
		int64_t r0 = in_group ? ids[t] / KK_QPACK * KK_QPACK : ids[t];
		int64_t rows = in_group ? KK_QPACK : 1;
		kk_qmatrix row = { .qtype = q->qtype,
				   .n = rows,
				   .k = k,
				   .group = q->group,
				   .pack = in_group ? q->pack : 0 };
		kk_buffer *o = NULL;
		r = kk_buffer_view(q->data, (size_t) (r0 * k), (size_t) (rows * k), &row.data);
		if (r >= 0)
			r = kk_buffer_view(q->scales, (size_t) (r0 * g), (size_t) (rows * g),
					   &row.scales);
		if (r >= 0 && !in_group)
			r = kk_buffer_view(out, (size_t) (t * k), (size_t) k, &o);
		if (r >= 0)
			r = kk_dequantize(m->be, NULL, in_group ? grp : o, &row);
		if (r >= 0 && in_group)
			r = kk_buffer_copy(m->be, NULL, out, (size_t) t * k * es, grp,
					   (size_t) (ids[t] - r0) * k * es, (size_t) k * es);
		kk_buffer_free(o);
		kk_buffer_free(row.scales);
		kk_buffer_free(row.data);
	}
	return r;
}

/* The views of one step, freed together. */
typedef struct step_views {
	kk_buffer *tokens, *pos, *slots, *cu, *ctx, *last, *bt, *q_d, *att_d;
	kk_buffer *cuq; /* set when a cached input brings several tokens */
} step_views;

static void step_views_free(step_views *v)
{
	kk_buffer *all[] = { v->tokens, v->pos, v->slots, v->cu,    v->ctx,
			     v->last,	v->bt,	v->q_d,	  v->att_d, v->cuq };
	for (size_t i = 0; i < ARRAY_SIZE(all); i++)
		kk_buffer_free(all[i]);
}

/* The layers, final norm and classifier over the packed batch. */
static int run_layers(km_model *m, km_kvcache *c, step_views *v, int64_t T, int np, int64_t Tp,
		      int max_prompt, int nd, int max_ctx, int n, kiln_error *err)
{
	const km_config *cfg = &m->cfg;
	const int64_t d = cfg->dim, hp = m->hidden;
	int r;
#define TRY(call, what)                                  \
	do {                                             \
		if ((r = (call)) < 0)                    \
			return kk_fail(err, r, what, m); \
	} while (0)

	if (m->qemb)
		TRY(qembedding(m, m->x, m->qemb, m->hmeta, T), "embedding");
	else
		TRY(kk_embedding_fwd(m->be, NULL, m->x, m->emb, v->tokens, T, cfg->vocab_size, d),
		    "embedding");
	for (int l = 0; l < cfg->n_layers; l++) {
		km_layer *L = &m->layers[l];
		TRY(kk_rmsnorm_fwd(m->be, NULL, m->xb, m->resid, NULL, m->x, l ? m->resid : NULL,
				   L->attn_norm, T, d, cfg->norm_eps),
		    "rmsnorm");
		TRY(linear(m, m->q, m->xb, &L->wq, T), "q projection");
		TRY(linear(m, m->k, m->xb, &L->wk, T), "k projection");
		TRY(linear(m, m->v, m->xb, &L->wv, T), "v projection");
		TRY(km__rope_qk(m->be, cfg, m->rope_div, m->q, m->k, v->pos, T, false), "rope");
		kk_buffer *kc = km__kvcache_k(c, l), *vc = km__kvcache_v(c, l);
		TRY(kk_kv_cache_write(m->be, NULL, kc, vc, m->k, m->v, v->slots, T, cfg->n_kv_heads,
				      cfg->head_dim, km_kvcache_num_blocks(c)),
		    "kv cache write");
		if (np > 0) {
			kk_attn_desc ad = {
				.n_heads = cfg->n_heads,
				.n_kv_heads = cfg->n_kv_heads,
				.head_dim = cfg->head_dim,
				.causal = true,
				.n_seqs = np,
				.total_tokens = Tp,
				.max_seqlen = max_prompt,
				.cu_seqlens = v->cu,
			};
			TRY(kk_attention_fwd(m->be, NULL, &ad, m->att, NULL, m->q, m->k, m->v),
			    "prefill attention");
		}
		if (nd > 0) {
			kk_paged_desc pd = {
				.n_heads = cfg->n_heads,
				.n_kv_heads = cfg->n_kv_heads,
				.head_dim = cfg->head_dim,
				.n_seqs = nd,
				.num_blocks = km_kvcache_num_blocks(c),
				.max_blocks_per_seq = km_kvcache_blocks_per_seq(c),
				.max_context_len = max_ctx,
				.block_tables = v->bt,
				.context_lens = v->ctx,
				.cu_q = v->cuq,
				.total_q = v->cuq ? T - Tp : 0,
			};
			if (v->cuq)
				TRY(kk_attention_paged(m->be, NULL, &pd, v->att_d, v->q_d, kc, vc),
				    "paged attention");
			else
				TRY(kk_attention_decode(m->be, NULL, &pd, v->att_d, v->q_d, kc, vc),
				    "decode attention");
		}
		TRY(linear(m, m->x, m->att, &L->wo, T), "o projection");
		TRY(kk_rmsnorm_fwd(m->be, NULL, m->xb, m->resid, NULL, m->x, m->resid, L->ffn_norm,
				   T, d, cfg->norm_eps),
		    "rmsnorm");
		TRY(linear(m, m->h1, m->xb, &L->w1, T), "ffn gate projection");
		TRY(linear(m, m->h3, m->xb, &L->w3, T), "ffn up projection");
		TRY(kk_swiglu_fwd(m->be, NULL, m->h2, m->h1, m->h3, (size_t) (T * hp)), "swiglu");
		TRY(linear(m, m->x, m->h2, &L->w2, T), "ffn down projection");
	}
	/* Only the last row of each input needs the final norm and logits:
	 * gather those rows of the stream and its residual (an embedding
	 * lookup with the batch as the table), add and normalize them. */
	TRY(kk_embedding_fwd(m->be, NULL, m->last_x, m->x, v->last, n, T, d), "gather");
	TRY(kk_embedding_fwd(m->be, NULL, m->last_r, m->resid, v->last, n, T, d), "gather");
	TRY(kk_rmsnorm_fwd(m->be, NULL, m->last_x, NULL, NULL, m->last_x, m->last_r, m->final_norm,
			   n, d, cfg->norm_eps),
	    "final rmsnorm");
	kk_gemm_desc g = {
		.trans_b = true,
		.m = n,
		.n = cfg->vocab_size,
		.k = d,
		.alpha = 1.0f,
		.a = m->last_x,
		.lda = d,
		.b = m->cls,
		.ldb = d,
		.c = m->logits,
		.ldc = cfg->vocab_size,
	};
	if (m->qcls)
		TRY(kk_qgemm(m->be, NULL, m->logits, m->last_x, m->qcls, NULL, n), "classifier");
	else
		TRY(kk_gemm(m->be, NULL, &g), "classifier");
#undef TRY
	return 0;
}

/* Validates the inputs; fills order[] (prefill inputs first) and counts. */
static int check_inputs(km_model *m, km_kvcache *c, const km_seq_input *in, int n, int *order,
			int *ret_np, int64_t *ret_T, kiln_error *err)
{
	const km_config *cfg = &m->cfg, *cc = km__kvcache_config(c);
	if (cc->n_layers != cfg->n_layers || cc->n_kv_heads != cfg->n_kv_heads ||
	    cc->head_dim != cfg->head_dim || cc->max_seq_len != cfg->max_seq_len ||
	    km__kvcache_dtype(c) != m->adt || km__kvcache_backend(c) != m->be)
		return km_errorf(err, -EINVAL,
				 "step: the KV cache was made for another model, dtype (want "
				 "%s) or backend",
				 kk_dtype_name(m->adt));
	if (n < 1 || n > m->opts.max_seqs)
		return km_errorf(err, -EINVAL, "step: %d sequences, must be 1..%d (max_seqs)", n,
				 m->opts.max_seqs);
	int64_t T = 0;
	int np = 0;
	for (int i = 0; i < n; i++) {
		int len = km_kvcache_seq_len(c, in[i].seq);
		if (len < 0)
			return km_errorf(err, -EINVAL, "step: input %d: sequence %d is not live", i,
					 in[i].seq);
		for (int j = 0; j < i; j++)
			if (in[j].seq == in[i].seq)
				return km_errorf(err, -EINVAL,
						 "step: sequence %d appears twice in one step",
						 in[i].seq);
		if (!in[i].tokens || in[i].n_tokens < 1)
			return km_errorf(err, -EINVAL, "step: input %d has no tokens", i);
		for (int t = 0; t < in[i].n_tokens; t++)
			if (in[i].tokens[t] < 0 || in[i].tokens[t] >= cfg->vocab_size)
				return km_errorf(err, -EINVAL,
						 "step: sequence %d: token id %d outside the "
						 "vocabulary (0..%d)",
						 in[i].seq, in[i].tokens[t], cfg->vocab_size - 1);
		T += in[i].n_tokens;
		np += len == 0;
	}
	if (T > m->opts.max_tokens)
		return km_errorf(err, -EINVAL, "step: %lld tokens, more than max_tokens %d",
				 (long long) T, m->opts.max_tokens);
	int a = 0, b = np;
	for (int i = 0; i < n; i++) {
		if (km_kvcache_seq_len(c, in[i].seq) == 0)
			order[a++] = i;
		else
			order[b++] = i;
	}
	*ret_np = np;
	*ret_T = T;
	return 0;
}

int km_forward(km_model *m, km_kvcache *c, const km_seq_input *in, int n, float *logits_out,
	       kiln_error *err)
{
	if (!m || !c || !in)
		return km_errorf(err, -EINVAL, "km_forward: missing argument");
	m->last_n = 0;
	int *order = m->order, *old_len = m->old_len;
	int np = 0, r;
	int64_t T = 0;
	r = check_inputs(m, c, in, n, order, &np, &T, err);
	if (r < 0)
		return r;
	const int nd = n - np, bps = km_kvcache_blocks_per_seq(c);
	const size_t MT = (size_t) m->opts.max_tokens;
	/* Host layout: tokens, positions, slots (max_tokens each), then
	 * cu_seqlens, context lengths, last rows, block tables, packed. */
	int32_t *tok = m->hmeta, *pos = tok + MT, *slots = pos + MT, *cu = slots + MT;
	int32_t *ctx = cu + np + 1, *last = ctx + nd, *cuq = last + n, *bt = cuq + nd + 1;

	/* Append every input to the cache, all or nothing. */
	int64_t row = 0, Tp = 0;
	int max_prompt = 0, max_ctx = 0;
	bool multi = false;
	cu[0] = 0;
	cuq[0] = 0;
	for (int oi = 0; oi < n; oi++) {
		const km_seq_input *s = &in[order[oi]];
		old_len[oi] = km_kvcache_seq_len(c, s->seq);
		r = km_kvcache_append(c, s->seq, s->n_tokens, slots + row);
		if (r < 0) {
			int n_free = km_kvcache_free_blocks(c);
			for (int j = 0; j < oi; j++)
				km__kvcache_truncate(c, in[order[j]].seq, old_len[j]);
			if (r == -ENOSPC)
				return km_errorf(err, r,
						 "step: the KV cache is out of blocks for "
						 "sequence %d (%d free); free or preempt a "
						 "sequence",
						 s->seq, n_free);
			if (r == -EFBIG)
				return km_errorf(err, r,
						 "step: sequence %d would pass max_seq_len %d",
						 s->seq, m->cfg.max_seq_len);
			return km_errorf(err, r, "step: kv cache append failed");
		}
		for (int t = 0; t < s->n_tokens; t++) {
			tok[row + t] = s->tokens[t];
			pos[row + t] = old_len[oi] + t;
		}
		row += s->n_tokens;
		last[order[oi]] = (int32_t) (row - 1);
		if (oi < np) {
			cu[oi + 1] = (int32_t) row;
			max_prompt = MAX(max_prompt, s->n_tokens);
			Tp = row;
		} else {
			int di = oi - np;
			ctx[di] = old_len[oi] + s->n_tokens;
			cuq[di + 1] = cuq[di] + s->n_tokens;
			multi |= s->n_tokens > 1;
			max_ctx = MAX(max_ctx, ctx[di]);
			km__kvcache_row(c, s->seq, bt + (size_t) di * bps);
		}
	}

	/* One upload: the fixed [T] arrays up to T, then the packed tail. */
	step_views v = {};
	size_t tail = (size_t) (np + 1 + nd + n + nd + 1) + (size_t) nd * bps;
	/* Moving down in this order never overwrites what is still to move. */
	memmove(tok + T, pos, (size_t) T * sizeof(int32_t));
	memmove(tok + 2 * T, slots, (size_t) T * sizeof(int32_t));
	memmove(tok + 3 * T, cu, tail * sizeof(int32_t));
	size_t off_cu = 3 * (size_t) T, off_ctx = off_cu + np + 1, off_last = off_ctx + nd,
	       off_cuq = off_last + n, off_bt = off_cuq + nd + 1;
	r = kk_buffer_upload(m->be, NULL, m->meta, 0, m->hmeta, (off_bt + (size_t) nd * bps) * 4);
	if (r >= 0)
		r = kk_buffer_view(m->meta, 0, (size_t) T, &v.tokens);
	if (r >= 0)
		r = kk_buffer_view(m->meta, (size_t) T, (size_t) T, &v.pos);
	if (r >= 0)
		r = kk_buffer_view(m->meta, 2 * (size_t) T, (size_t) T, &v.slots);
	if (r >= 0)
		r = kk_buffer_view(m->meta, off_cu, (size_t) np + 1, &v.cu);
	if (r >= 0)
		r = kk_buffer_view(m->meta, off_last, (size_t) n, &v.last);
	if (r >= 0 && nd > 0) {
		const size_t d = (size_t) m->cfg.dim;
		r = kk_buffer_view(m->meta, off_ctx, (size_t) nd, &v.ctx);
		if (r >= 0)
			r = kk_buffer_view(m->meta, off_bt, (size_t) nd * bps, &v.bt);
		if (r >= 0)
			r = kk_buffer_view(m->q, (size_t) Tp * d, (size_t) (T - Tp) * d, &v.q_d);
		if (r >= 0)
			r = kk_buffer_view(m->att, (size_t) Tp * d, (size_t) (T - Tp) * d,
					   &v.att_d);
		if (r >= 0 && multi)
			r = kk_buffer_view(m->meta, off_cuq, (size_t) nd + 1, &v.cuq);
	}
	if (r < 0)
		r = kk_fail(err, r, "preparing the step", m);
	else
		r = run_layers(m, c, &v, T, np, Tp, max_prompt, nd, max_ctx, n, err);
	step_views_free(&v);
	if (r >= 0 && logits_out) {
		r = kk_buffer_download(m->be, NULL, m->logits, 0, logits_out,
				       (size_t) n * m->cfg.vocab_size * sizeof(float));
		if (r < 0)
			r = kk_fail(err, r, "downloading logits", m);
	}
	if (r < 0) {
		/* The cache holds no valid K/V for this step's tokens. */
		for (int j = 0; j < n; j++)
			km__kvcache_truncate(c, in[order[j]].seq, old_len[j]);
		return r;
	}
	m->last_n = n;
	return 0;
}

int km_sample(km_model *m, int row, int n_rows, const kk_sampling *p, int32_t *ids)
{
	assert_return(m && p && ids, -EINVAL);
	assert_return(row >= 0 && n_rows >= 1 && row + n_rows <= m->last_n, -EINVAL);
	const size_t V = (size_t) m->cfg.vocab_size;
	_cleanup_(kk_buffer_freep) kk_buffer *lv = NULL;
	int r = kk_buffer_view(m->logits, (size_t) row * V, (size_t) n_rows * V, &lv);
	if (r < 0)
		return r;
	r = kk_sample(m->be, NULL, m->ids, lv, n_rows, (int64_t) V, p);
	if (r < 0)
		return r;
	return kk_buffer_download(m->be, NULL, m->ids, 0, ids, (size_t) n_rows * sizeof(int32_t));
}
