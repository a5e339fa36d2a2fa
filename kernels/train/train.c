/* train.c — kmt_model: the Llama model of kmodel.h for training on kk.
 *
 * Parameters, gradients and AdamW moments each live in ONE flat f32 buffer
 * on the backend; every tensor is a view into it at the same offset.  The
 * flat gradient buffer is what makes data-parallel training one
 * kk_all_reduce, and the order (decayed tensors first, norm gains last)
 * what makes AdamW two kk_adamw calls (with and without weight decay).
 *
 * A step packs B sequences of T tokens into N = B * T rows (no KV cache):
 * every layer keeps what its backward needs (its input on the residual
 * stream, both normed inputs with their rstd, q and k after RoPE, v, the
 * attention output and its log-sum-exp, the mid residual, the FFN's gate,
 * up and product), then logits [N, vocab] and the per-token losses.  The
 * backward walks the layers in reverse with two ping-pong residual
 * gradients; parameter gradients accumulate (kk's convention) into the
 * zeroed flat buffer, so a shared classifier simply adds its gradient to
 * the embedding's.  RoPE's backward is the inverse rotation applied to dq
 * and dk (kk_rope with backward = true). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/macro.h"
#include "kmtrain.h"

#include "train-internal.h"

/* The per-layer matrices and gains, in table order. */
enum { W_Q, W_K, W_V, W_O, W_1, W_2, W_3, N_ATT, N_FFN, LAYER_TENSORS };

typedef struct kmt_act {
	kk_buffer *xn1, *rstd1, *q, *k, *v, *att, *lse, *hmid, *xn2, *rstd2, *g, *u, *s;
} kmt_act;

struct kmt_model {
	kk_backend *be;
	km_config cfg;
	kmt_opts opts;
	int64_t step;

	kmt_tensor *tensors;
	size_t n_tensors, n_params, n_decay;
	int emb, cls, final_norm; /* tensor indices; cls == emb when shared */
	int (*lidx)[LAYER_TENSORS];
	kk_buffer *params, *grads, *adam_m, *adam_v;
	kk_buffer **pv, **gv; /* per-tensor views of params and grads */
	/* [0, n_decay) and [n_decay, n_params) of each flat buffer */
	kk_buffer *split[4][2];

	/* Activations for N = B * T rows. */
	kk_buffer **hin; /* [n_layers + 1]: each layer's input, then the final one */
	kmt_act *act;
	kk_buffer *xf, *rstdf, *logits, *losses;
	/* Backward scratch. */
	kk_buffer *dcur, *dnext, *dxn, *datt, *dq, *dk, *dv, *dg, *du, *ds;
	/* I32 index data: tokens [N], targets [N], positions [N], cu [B + 1]. */
	kk_buffer *meta, *tok_v, *tgt_v, *pos_v, *cu_v;
	kk_buffer *scalar;   /* F32 [1]: the global target count */
	kk_buffer *rope_div; /* F32 [head_dim / 2]: scaled RoPE's divisors, or NULL */
	float *hloss;
	int32_t *hbuf; /* host staging of tokens/targets */
};

static void act_free(kmt_act *a)
{
	kk_buffer *all[] = { a->xn1,  a->rstd1, a->q,	  a->k, a->v, a->att, a->lse,
			     a->hmid, a->xn2,	a->rstd2, a->g, a->u, a->s };
	for (size_t i = 0; i < ARRAY_SIZE(all); i++)
		kk_buffer_free(all[i]);
}

static void prof_dump(void);

kmt_model *kmt_model_free(kmt_model *m)
{
	if (!m)
		return NULL;
	prof_dump();
	for (size_t i = 0; m->pv && i < m->n_tensors; i++)
		kk_buffer_free(m->pv[i]);
	for (size_t i = 0; m->gv && i < m->n_tensors; i++)
		kk_buffer_free(m->gv[i]);
	for (int w = 0; w < 4; w++)
		for (int h = 0; h < 2; h++)
			kk_buffer_free(m->split[w][h]);
	for (int l = 0; m->act && l < m->cfg.n_layers; l++)
		act_free(&m->act[l]);
	for (int l = 0; m->hin && l <= m->cfg.n_layers; l++)
		kk_buffer_free(m->hin[l]);
	kk_buffer *bufs[] = { m->xf,   m->rstdf,  m->logits, m->losses, m->dcur,   m->dnext,
			      m->dxn,  m->datt,	  m->dq,     m->dk,	m->dv,	   m->dg,
			      m->du,   m->ds,	  m->tok_v,  m->tgt_v,	m->pos_v,  m->cu_v,
			      m->meta, m->scalar, m->params, m->grads,	m->adam_m, m->adam_v };
	kk_buffer_free(m->rope_div);
	for (size_t i = 0; i < ARRAY_SIZE(bufs); i++)
		kk_buffer_free(bufs[i]);
	FREE_ALL(m->pv, m->gv, m->act, m->hin, m->lidx, m->tensors, m->hloss, m->hbuf, m);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(kmt_model *, kmt_model_free);

const km_config *kmt_model_config(const kmt_model *m)
{
	return m ? &m->cfg : NULL;
}

const kmt_opts *kmt_model_opts(const kmt_model *m)
{
	return m ? &m->opts : NULL;
}

int64_t kmt_model_step(const kmt_model *m)
{
	return m ? m->step : 0;
}

size_t kmt_tensor_count(const kmt_model *m)
{
	return m ? m->n_tensors : 0;
}

const char *kmt_tensor_name(const kmt_model *m, size_t i)
{
	return m && i < m->n_tensors ? m->tensors[i].name : NULL;
}

size_t kmt_tensor_numel(const kmt_model *m, size_t i)
{
	return m && i < m->n_tensors ? m->tensors[i].n : 0;
}

size_t kmt_param_count(const kmt_model *m)
{
	return m ? m->n_params : 0;
}

const kmt_tensor *kmt__tensors(const kmt_model *m)
{
	return m->tensors;
}

int kmt__tensor_find(const kmt_model *m, const char *name)
{
	for (size_t i = 0; i < m->n_tensors; i++)
		if (streq(m->tensors[i].name, name))
			return (int) i;
	return -ENOENT;
}

kk_buffer *kmt__flat(kmt_model *m, kmt_which which)
{
	switch (which) {
	case KMT_PARAM:
		return m->params;
	case KMT_GRAD:
		return m->grads;
	case KMT_ADAM_M:
		return m->adam_m;
	case KMT_ADAM_V:
		return m->adam_v;
	}
	return NULL;
}

kk_backend *kmt__backend(kmt_model *m)
{
	return m->be;
}

void kmt__set_step(kmt_model *m, int64_t step)
{
	m->step = step;
}

static int kk_fail(kiln_error *err, int r, const char *what, const kmt_model *m)
{
	return km__kk_fail(err, r, what, m->be, m->cfg.head_dim, NULL, "train");
}

/* Appends a tensor to the table (sized in advance). */
static void add_tensor(kmt_model *m, const char *name, int64_t rows, int64_t cols, bool decay)
{
	kmt_tensor *t = &m->tensors[m->n_tensors++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->off = m->n_params;
	t->ndim = cols ? 2 : 1;
	t->shape[0] = rows;
	t->shape[1] = cols;
	t->n = (size_t) (cols ? rows * cols : rows);
	t->decay = decay;
	m->n_params += t->n;
	if (decay)
		m->n_decay = m->n_params;
}

/* The table: decayed tensors (embedding, classifier, per layer q k v o w1
 * w2 w3), then the gains (per layer attention and ffn norms, final norm). */
static int build_table(kmt_model *m)
{
	const km_config *c = &m->cfg;
	const int64_t d = c->dim, kvd = (int64_t) c->n_kv_heads * c->head_dim, h = c->hidden_dim,
		      V = c->vocab_size;
	size_t n = 3 + (size_t) c->n_layers * LAYER_TENSORS;
	m->tensors = calloc(n, sizeof(*m->tensors));
	m->lidx = calloc((size_t) c->n_layers, sizeof(*m->lidx));
	if (!m->tensors || !m->lidx)
		return -ENOMEM;
	char name[KMT_NAME_MAX];
	m->emb = (int) m->n_tensors;
	add_tensor(m, "tok_embeddings.weight", V, d, true);
	m->cls = m->emb;
	if (!c->shared_classifier) {
		m->cls = (int) m->n_tensors;
		add_tensor(m, "output.weight", V, d, true);
	}
	static const char *const mats[] = {
		"attention.wq.weight",	  "attention.wk.weight",    "attention.wv.weight",
		"attention.wo.weight",	  "feed_forward.w1.weight", "feed_forward.w2.weight",
		"feed_forward.w3.weight",
	};
	const int64_t shapes[][2] = { { d, d }, { kvd, d }, { kvd, d }, { d, d },
				      { h, d }, { d, h },   { h, d } };
	for (int l = 0; l < c->n_layers; l++)
		for (int w = W_Q; w <= W_3; w++) {
			snprintf(name, sizeof(name), "layers.%d.%s", l, mats[w]);
			m->lidx[l][w] = (int) m->n_tensors;
			add_tensor(m, name, shapes[w][0], shapes[w][1], true);
		}
	for (int l = 0; l < c->n_layers; l++) {
		snprintf(name, sizeof(name), "layers.%d.attention_norm.weight", l);
		m->lidx[l][N_ATT] = (int) m->n_tensors;
		add_tensor(m, name, d, 0, false);
		snprintf(name, sizeof(name), "layers.%d.ffn_norm.weight", l);
		m->lidx[l][N_FFN] = (int) m->n_tensors;
		add_tensor(m, name, d, 0, false);
	}
	m->final_norm = (int) m->n_tensors;
	add_tensor(m, "norm.weight", d, 0, false);
	return 0;
}

/* A standard normal draw (Box-Muller on two SplitMix64 uniforms). */
static double normal(uint64_t *s)
{
	double u1 = ((double) (kmt__splitmix(s) >> 11) + 0.5) * 0x1.0p-53;
	double u2 = (double) (kmt__splitmix(s) >> 11) * 0x1.0p-53;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Fills tensor i with its initial values: N(0, std) for matrices, with
 * the residual projections (wo, w2) scaled by 1/sqrt(2 L) so the residual
 * stream's variance does not grow with depth; gains 1.  Each tensor has its
 * own stream (seed, index) so the values do not depend on the order. */
static void init_tensor(const kmt_model *m, size_t i, float *h)
{
	const kmt_tensor *t = &m->tensors[i];
	if (!t->decay) {
		for (size_t j = 0; j < t->n; j++)
			h[j] = 1.0f;
		return;
	}
	double std = m->opts.init_std > 0 ? m->opts.init_std : 0.02;
	if (strstr(t->name, ".wo.") || strstr(t->name, ".w2."))
		std /= sqrt(2.0 * m->cfg.n_layers);
	uint64_t s = m->opts.init_seed ^ ((uint64_t) (i + 1) * UINT64_C(0xD1B54A32D192ED03));
	for (size_t j = 0; j < t->n; j++)
		h[j] = (float) (normal(&s) * std);
}

static int alloc(kmt_model *m, kk_dtype dt, size_t count, kk_buffer **ret, kiln_error *err)
{
	int r = kk_buffer_alloc(m->be, dt, count, ret);
	return r < 0 ? kk_fail(err, r, "allocating training buffers", m) : 0;
}

static int alloc_all(kmt_model *m, kiln_error *err)
{
	const km_config *c = &m->cfg;
	const size_t N = (size_t) m->opts.batch * m->opts.seq_len, B = (size_t) m->opts.batch;
	const size_t d = (size_t) c->dim, kvd = (size_t) c->n_kv_heads * c->head_dim,
		     h = (size_t) c->hidden_dim, V = (size_t) c->vocab_size;
	int r;
	kk_buffer **flat[] = { &m->params, &m->grads, &m->adam_m, &m->adam_v };
	for (int w = 0; w < 4; w++) {
		if ((r = alloc(m, KK_F32, m->n_params, flat[w], err)) < 0)
			return r;
		if (w >= 2 && (r = kk_buffer_memset(m->be, NULL, *flat[w], 0, 0,
						    m->n_params * sizeof(float))) < 0)
			return kk_fail(err, r, "clearing the optimizer state", m);
		if ((r = kk_buffer_view(*flat[w], 0, m->n_decay, &m->split[w][0])) < 0)
			return kk_fail(err, r, "viewing", m);
		if (m->n_params > m->n_decay &&
		    (r = kk_buffer_view(*flat[w], m->n_decay, m->n_params - m->n_decay,
					&m->split[w][1])) < 0)
			return kk_fail(err, r, "viewing", m);
	}
	m->pv = calloc(m->n_tensors, sizeof(*m->pv));
	m->gv = calloc(m->n_tensors, sizeof(*m->gv));
	m->act = calloc((size_t) c->n_layers, sizeof(*m->act));
	m->hin = calloc((size_t) c->n_layers + 1, sizeof(*m->hin));
	m->hloss = calloc(N, sizeof(float));
	m->hbuf = calloc(2 * N, sizeof(int32_t));
	if (!m->pv || !m->gv || !m->act || !m->hin || !m->hloss || !m->hbuf)
		return km_errorf(err, -ENOMEM, "training model: out of memory");
	for (size_t i = 0; i < m->n_tensors; i++) {
		const kmt_tensor *t = &m->tensors[i];
		if ((r = kk_buffer_view(m->params, t->off, t->n, &m->pv[i])) < 0 ||
		    (r = kk_buffer_view(m->grads, t->off, t->n, &m->gv[i])) < 0)
			return kk_fail(err, r, "viewing", m);
	}
	for (int l = 0; l <= c->n_layers; l++)
		if ((r = alloc(m, KK_F32, N * d, &m->hin[l], err)) < 0)
			return r;
	for (int l = 0; l < c->n_layers; l++) {
		kmt_act *a = &m->act[l];
		if ((r = alloc(m, KK_F32, N * d, &a->xn1, err)) < 0 ||
		    (r = alloc(m, KK_F32, N, &a->rstd1, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * d, &a->q, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * kvd, &a->k, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * kvd, &a->v, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * d, &a->att, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * (size_t) c->n_heads, &a->lse, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * d, &a->hmid, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * d, &a->xn2, err)) < 0 ||
		    (r = alloc(m, KK_F32, N, &a->rstd2, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * h, &a->g, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * h, &a->u, err)) < 0 ||
		    (r = alloc(m, KK_F32, N * h, &a->s, err)) < 0)
			return r;
	}
	if ((r = alloc(m, KK_F32, N * d, &m->xf, err)) < 0 ||
	    (r = alloc(m, KK_F32, N, &m->rstdf, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * V, &m->logits, err)) < 0 ||
	    (r = alloc(m, KK_F32, N, &m->losses, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * d, &m->dcur, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * d, &m->dnext, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * d, &m->dxn, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * d, &m->datt, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * d, &m->dq, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * kvd, &m->dk, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * kvd, &m->dv, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * h, &m->dg, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * h, &m->du, err)) < 0 ||
	    (r = alloc(m, KK_F32, N * h, &m->ds, err)) < 0 ||
	    (r = alloc(m, KK_F32, 1, &m->scalar, err)) < 0 ||
	    (r = alloc(m, KK_I32, 3 * N + B + 1, &m->meta, err)) < 0)
		return r;
	if ((r = kk_buffer_view(m->meta, 0, N, &m->tok_v)) < 0 ||
	    (r = kk_buffer_view(m->meta, N, N, &m->tgt_v)) < 0 ||
	    (r = kk_buffer_view(m->meta, 2 * N, N, &m->pos_v)) < 0 ||
	    (r = kk_buffer_view(m->meta, 3 * N, B + 1, &m->cu_v)) < 0)
		return kk_fail(err, r, "viewing", m);
	/* Positions and sequence boundaries never change: every sequence is
	 * T tokens from position 0. */
	_cleanup_free_ int32_t *idx = calloc(N + B + 1, sizeof(int32_t));
	if (!idx)
		return km_errorf(err, -ENOMEM, "training model: out of memory");
	for (size_t i = 0; i < N; i++)
		idx[i] = (int32_t) (i % (size_t) m->opts.seq_len);
	for (size_t s = 0; s <= B; s++)
		idx[N + s] = (int32_t) (s * (size_t) m->opts.seq_len);
	r = kk_buffer_upload(m->be, NULL, m->meta, 2 * N * sizeof(int32_t), idx,
			     (N + B + 1) * sizeof(int32_t));
	if (r < 0)
		return kk_fail(err, r, "uploading positions", m);
	r = km__rope_div(m->be, &m->cfg, &m->rope_div);
	return r < 0 ? kk_fail(err, r, "uploading the RoPE frequency divisors", m) : 0;
}

int kmt_model_new(kk_backend *be, const km_config *cfg, const kmt_opts *opts,
		  const km_weight_source *src, kmt_model **ret, kiln_error *err)
{
	int r;
	if (!be || !cfg || !opts || !ret || (src && !src->read))
		return km_errorf(err, -EINVAL, "kmt_model_new: missing argument");
	if ((r = km_config_validate(cfg, err)) < 0)
		return r;
	if (opts->seq_len < 1 || opts->seq_len > cfg->max_seq_len)
		return km_errorf(err, -EINVAL,
				 "training options: seq_len %d, must be 1..max_seq_len (%d)",
				 opts->seq_len, cfg->max_seq_len);
	if (opts->batch < 1 || (int64_t) opts->batch * opts->seq_len > KMT_MAX_TOKENS)
		return km_errorf(err, -EINVAL,
				 "training options: batch %d x seq_len %d, must be 1..%d tokens "
				 "per step",
				 opts->batch, opts->seq_len, KMT_MAX_TOKENS);
	if (!(opts->init_std >= 0 && opts->init_std < 10))
		return km_errorf(err, -EINVAL, "training options: init_std %g, must be in [0, 10)",
				 (double) opts->init_std);

	_cleanup_(kmt_model_freep) kmt_model *m = calloc(1, sizeof(*m));
	if (!m)
		return km_errorf(err, -ENOMEM, "training model: out of memory");
	m->be = be;
	m->cfg = *cfg;
	m->opts = *opts;
	if (build_table(m) < 0)
		return km_errorf(err, -ENOMEM, "training model: out of memory");
	if ((r = alloc_all(m, err)) < 0)
		return r;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const kmt_tensor *t = &m->tensors[i];
		_cleanup_free_ float *h = malloc(t->n * sizeof(float));
		if (!h)
			return km_errorf(err, -ENOMEM, "weights: out of memory for '%s'", t->name);
		if (src) {
			if ((r = src->read(src->userdata, t->name, h, t->n, err)) < 0)
				return r;
		} else {
			init_tensor(m, i, h);
		}
		r = kk_buffer_upload(be, NULL, m->params, t->off * sizeof(float), h,
				     t->n * sizeof(float));
		if (r < 0)
			return kk_fail(err, r, "uploading weights", m);
	}
	*ret = TAKE_PTR(m);
	return 0;
}

/* The tensor `name`, which must have `count` elements: 0 and *ret, the
 * lookup's error, or -EINVAL for another count. */
static int tensor_sized(kmt_model *m, const char *name, size_t count, const kmt_tensor **ret)
{
	int i = kmt__tensor_find(m, name);
	if (i < 0)
		return i;
	if (count != m->tensors[i].n)
		return -EINVAL;
	*ret = &m->tensors[i];
	return 0;
}

int kmt_tensor_get(kmt_model *m, kmt_which which, const char *name, float *dst, size_t count)
{
	const kmt_tensor *t;
	assert_return(m && name && dst, -EINVAL);
	kk_buffer *flat = (unsigned) which <= KMT_ADAM_V ? kmt__flat(m, which) : NULL;
	assert_return(flat, -EINVAL);
	int r = tensor_sized(m, name, count, &t);
	return r < 0 ? r
		     : kk_buffer_download(m->be, NULL, flat, t->off * sizeof(float), dst,
					  t->n * sizeof(float));
}

int kmt_tensor_set(kmt_model *m, const char *name, const float *src, size_t count)
{
	const kmt_tensor *t;
	assert_return(m && name && src, -EINVAL);
	int r = tensor_sized(m, name, count, &t);
	return r < 0 ? r
		     : kk_buffer_upload(m->be, NULL, m->params, t->off * sizeof(float), src,
					t->n * sizeof(float));
}

static int source_read(void *userdata, const char *name, float *dst, size_t count, kiln_error *err)
{
	kmt_model *m = userdata;
	int i = kmt__tensor_find(m, name);
	if (i < 0)
		return km_errorf(err, -ENOENT, "training model: no tensor '%s'", name);
	if (count != m->tensors[i].n)
		return km_errorf(err, -EINVAL,
				 "training model: tensor '%s' has %zu values, not %zu", name,
				 m->tensors[i].n, count);
	int r = kmt_tensor_get(m, KMT_PARAM, name, dst, count);
	return r < 0 ? kk_fail(err, r, "downloading weights", m) : 0;
}

km_weight_source kmt_weight_source(kmt_model *m)
{
	return (km_weight_source){ .userdata = m, .read = source_read };
}

/* ---- forward and backward ---------------------------------------------- */

/* C[M, N] = op(A) op(B) + beta C, row-major, leading dims = stored widths. */
static int gemm(kmt_model *m, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const kk_buffer *a,
		const kk_buffer *b, kk_buffer *c, float beta)
{
	kk_gemm_desc g = {
		.trans_a = ta,
		.trans_b = tb,
		.m = M,
		.n = N,
		.k = K,
		.alpha = 1.0f,
		.beta = beta,
		.a = a,
		.lda = ta ? M : K,
		.b = b,
		.ldb = tb ? K : N,
		.c = c,
		.ldc = N,
	};
	return kk_gemm(m->be, NULL, &g);
}

/* y[rows, out] = x[rows, in] W^T (+ y when acc): the nn.Linear forward. */
static int linear_fwd(kmt_model *m, kk_buffer *y, const kk_buffer *x, int ti, int64_t rows,
		      bool acc)
{
	const kmt_tensor *t = &m->tensors[ti];
	return gemm(m, false, true, rows, t->shape[0], t->shape[1], x, m->pv[ti], y,
		    acc ? 1.0f : 0.0f);
}

/* dW += dy^T x, then dx (+)= dy W. */
static int linear_bwd(kmt_model *m, kk_buffer *dx, const kk_buffer *dy, const kk_buffer *x, int ti,
		      int64_t rows, bool acc)
{
	const kmt_tensor *t = &m->tensors[ti];
	int r = gemm(m, true, false, t->shape[0], t->shape[1], rows, dy, x, m->gv[ti], 1.0f);
	if (r < 0)
		return r;
	return gemm(m, false, false, rows, t->shape[1], t->shape[0], dy, m->pv[ti], dx,
		    acc ? 1.0f : 0.0f);
}

/* Checks and uploads a batch; *n_targets gets the count of its targets. */
static int upload_batch(kmt_model *m, const kmt_batch *b, int64_t *n_targets, kiln_error *err)
{
	if (!b || !b->tokens || !b->targets)
		return km_errorf(err, -EINVAL, "training batch: missing tokens or targets");
	if (b->n_seqs < 1 || b->n_seqs > m->opts.batch)
		return km_errorf(err, -EINVAL,
				 "training batch: %d sequences, the model takes 1..%d", b->n_seqs,
				 m->opts.batch);
	const size_t N = (size_t) b->n_seqs * m->opts.seq_len,
		     Nmax = (size_t) m->opts.batch * m->opts.seq_len;
	int64_t n = 0;
	for (size_t i = 0; i < N; i++) {
		int32_t tok = b->tokens[i], tgt = b->targets[i];
		if (tok < 0 || tok >= m->cfg.vocab_size)
			return km_errorf(err, -EINVAL,
					 "training batch: token %d at sequence %zu position %zu is "
					 "outside the vocabulary (0..%d)",
					 tok, i / m->opts.seq_len, i % m->opts.seq_len,
					 m->cfg.vocab_size - 1);
		if (tgt >= m->cfg.vocab_size)
			return km_errorf(
				err, -EINVAL,
				"training batch: target %d at sequence %zu position %zu is "
				"outside the vocabulary (0..%d; negative = ignored)",
				tgt, i / m->opts.seq_len, i % m->opts.seq_len,
				m->cfg.vocab_size - 1);
		n += tgt >= 0;
		m->hbuf[i] = tok;
		m->hbuf[Nmax + i] = tgt < 0 ? KMT_IGNORE : tgt;
	}
	int r = kk_buffer_upload(m->be, NULL, m->meta, 0, m->hbuf, N * sizeof(int32_t));
	if (r >= 0)
		r = kk_buffer_upload(m->be, NULL, m->meta, Nmax * sizeof(int32_t), m->hbuf + Nmax,
				     N * sizeof(int32_t));
	if (r < 0)
		return kk_fail(err, r, "uploading the batch", m);
	*n_targets = n;
	return 0;
}

static kk_attn_desc attn_desc(const kmt_model *m, int n_seqs)
{
	return (kk_attn_desc){
		.n_heads = m->cfg.n_heads,
		.n_kv_heads = m->cfg.n_kv_heads,
		.head_dim = m->cfg.head_dim,
		.causal = true,
		.n_seqs = n_seqs,
		.total_tokens = (int64_t) n_seqs * m->opts.seq_len,
		.max_seqlen = m->opts.seq_len,
		.cu_seqlens = m->cu_v,
	};
}

/* KMT_PROFILE=1 in the environment: process CPU time per op name (the
 * TRY labels; on a shared machine CPU time is what the load disturbs
 * least, and at one thread it is the op's own time), summed over the
 * process and printed to stderr when the model is freed.  The backend is
 * synced after each op so a GPU backend's host time lands on the op that
 * queued it.  Off (one getenv per op) otherwise.  One table for the
 * process, unlocked: a diagnostic for one model stepping on one thread
 * (bench-train --profile, kiln-train), not for concurrent models. */
#define PROF_MAX 64
static struct prof {
	int n;
	struct {
		const char *what;
		double s;
		long calls;
	} op[PROF_MAX];
} prof;

static double prof_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Read at every op (tens per step, against milliseconds of work), so a
 * program may turn it on after its warm-up. */
static bool prof_on(void)
{
	const char *e = getenv("KMT_PROFILE");
	return e && *e && !streq(e, "0");
}

static void prof_add(kmt_model *m, const char *what, double t0)
{
	(void) kk_backend_sync(m->be);
	double dt = prof_now() - t0;
	int i = 0;
	while (i < prof.n && !streq(prof.op[i].what, what))
		i++;
	if (i == PROF_MAX)
		return;
	if (i == prof.n)
		prof.op[prof.n++].what = what;
	prof.op[i].s += dt;
	prof.op[i].calls++;
}

static void prof_dump(void)
{
	double total = 0;
	for (int i = 0; i < prof.n; i++)
		total += prof.op[i].s;
	if (!prof.n)
		return;
	fprintf(stderr, "kmt profile: %-26s %10s %8s %6s\n", "op", "ms total", "calls", "%");
	for (int i = 0; i < prof.n; i++)
		fprintf(stderr, "kmt profile: %-26s %10.2f %8ld %6.1f\n", prof.op[i].what,
			prof.op[i].s * 1e3, prof.op[i].calls, 100 * prof.op[i].s / total);
	fprintf(stderr, "kmt profile: %-26s %10.2f\n", "total", total * 1e3);
	prof.n = 0;
}

#define TRY(expr, what)                                   \
	do {                                              \
		double _t0 = prof_on() ? prof_now() : 0;  \
		int _r = (expr);                          \
		if (_r < 0)                               \
			return kk_fail(err, _r, what, m); \
		if (_t0 > 0)                              \
			prof_add(m, what, _t0);           \
	} while (0)

/* Forward over the uploaded batch to the per-token losses (summed into
 * *sum on the host). */
static int forward(kmt_model *m, int n_seqs, double *sum, kiln_error *err)
{
	const km_config *c = &m->cfg;
	const int64_t N = (int64_t) n_seqs * m->opts.seq_len, d = c->dim, h = c->hidden_dim;
	const kk_attn_desc ad = attn_desc(m, n_seqs);
	kk_backend *be = m->be;

	TRY(kk_embedding_fwd(be, NULL, m->hin[0], m->pv[m->emb], m->tok_v, N, c->vocab_size, d),
	    "embedding");
	for (int l = 0; l < c->n_layers; l++) {
		kmt_act *a = &m->act[l];
		const int *li = m->lidx[l];
		TRY(kk_rmsnorm_fwd(be, NULL, a->xn1, NULL, a->rstd1, m->hin[l], NULL,
				   m->pv[li[N_ATT]], N, d, c->norm_eps),
		    "attention norm");
		TRY(linear_fwd(m, a->q, a->xn1, li[W_Q], N, false), "q projection");
		TRY(linear_fwd(m, a->k, a->xn1, li[W_K], N, false), "k projection");
		TRY(linear_fwd(m, a->v, a->xn1, li[W_V], N, false), "v projection");
		TRY(km__rope_qk(be, c, m->rope_div, a->q, a->k, m->pos_v, N, false), "rope");
		TRY(kk_attention_fwd(be, NULL, &ad, a->att, a->lse, a->q, a->k, a->v), "attention");
		TRY(kk_buffer_copy(be, NULL, a->hmid, 0, m->hin[l], 0, (size_t) (N * d) * 4),
		    "residual");
		TRY(linear_fwd(m, a->hmid, a->att, li[W_O], N, true), "o projection");
		TRY(kk_rmsnorm_fwd(be, NULL, a->xn2, NULL, a->rstd2, a->hmid, NULL,
				   m->pv[li[N_FFN]], N, d, c->norm_eps),
		    "ffn norm");
		TRY(linear_fwd(m, a->g, a->xn2, li[W_1], N, false), "w1 projection");
		TRY(linear_fwd(m, a->u, a->xn2, li[W_3], N, false), "w3 projection");
		TRY(kk_swiglu_fwd(be, NULL, a->s, a->g, a->u, (size_t) (N * h)), "swiglu");
		TRY(kk_buffer_copy(be, NULL, m->hin[l + 1], 0, a->hmid, 0, (size_t) (N * d) * 4),
		    "residual");
		TRY(linear_fwd(m, m->hin[l + 1], a->s, li[W_2], N, true), "w2 projection");
	}
	TRY(kk_rmsnorm_fwd(be, NULL, m->xf, NULL, m->rstdf, m->hin[c->n_layers], NULL,
			   m->pv[m->final_norm], N, d, c->norm_eps),
	    "final norm");
	TRY(linear_fwd(m, m->logits, m->xf, m->cls, N, false), "classifier");
	TRY(kk_cross_entropy_fwd(be, NULL, m->losses, m->logits, m->tgt_v, N, c->vocab_size),
	    "cross-entropy");
	TRY(kk_buffer_download(be, NULL, m->losses, 0, m->hloss, (size_t) N * sizeof(float)),
	    "downloading losses");
	/* In token order, in double: the same sum on every run. */
	double s = 0;
	for (int64_t i = 0; i < N; i++)
		s += m->hloss[i];
	*sum = s;
	return 0;
}

/* Backward from the losses (scaled by grad_scale) into the zeroed
 * gradients. */
static int backward(kmt_model *m, int n_seqs, float grad_scale, kiln_error *err)
{
	const km_config *c = &m->cfg;
	const int64_t N = (int64_t) n_seqs * m->opts.seq_len, d = c->dim, h = c->hidden_dim;
	const kk_attn_desc ad = attn_desc(m, n_seqs);
	kk_backend *be = m->be;
	kk_buffer *dcur = m->dcur, *dnext = m->dnext, *tmp;

	TRY(kk_cross_entropy_bwd(be, NULL, m->logits, m->logits, m->tgt_v, N, c->vocab_size,
				 grad_scale),
	    "cross-entropy backward");
	TRY(linear_bwd(m, m->dxn, m->logits, m->xf, m->cls, N, false), "classifier backward");
	TRY(kk_rmsnorm_bwd(be, NULL, dcur, m->gv[m->final_norm], m->dxn, NULL, m->hin[c->n_layers],
			   m->pv[m->final_norm], m->rstdf, N, d),
	    "final norm backward");
	for (int l = c->n_layers - 1; l >= 0; l--) {
		kmt_act *a = &m->act[l];
		const int *li = m->lidx[l];
		/* dcur: the gradient of this layer's output (hin[l + 1]). */
		TRY(linear_bwd(m, m->ds, dcur, a->s, li[W_2], N, false), "w2 backward");
		TRY(kk_swiglu_bwd(be, NULL, m->dg, m->du, m->ds, a->g, a->u, (size_t) (N * h)),
		    "swiglu backward");
		TRY(linear_bwd(m, m->dxn, m->dg, a->xn2, li[W_1], N, false), "w1 backward");
		TRY(linear_bwd(m, m->dxn, m->du, a->xn2, li[W_3], N, true), "w3 backward");
		TRY(kk_rmsnorm_bwd(be, NULL, dnext, m->gv[li[N_FFN]], m->dxn, dcur, a->hmid,
				   m->pv[li[N_FFN]], a->rstd2, N, d),
		    "ffn norm backward");
		tmp = dcur, dcur = dnext, dnext = tmp;
		/* dcur: the gradient of hmid. */
		TRY(linear_bwd(m, m->datt, dcur, a->att, li[W_O], N, false), "o backward");
		TRY(kk_attention_bwd(be, NULL, &ad, m->dq, m->dk, m->dv, m->datt, a->q, a->k, a->v,
				     a->att, a->lse),
		    "attention backward");
		TRY(km__rope_qk(be, c, m->rope_div, m->dq, m->dk, m->pos_v, N, true),
		    "rope backward");
		TRY(linear_bwd(m, m->dxn, m->dq, a->xn1, li[W_Q], N, false), "q backward");
		TRY(linear_bwd(m, m->dxn, m->dk, a->xn1, li[W_K], N, true), "k backward");
		TRY(linear_bwd(m, m->dxn, m->dv, a->xn1, li[W_V], N, true), "v backward");
		TRY(kk_rmsnorm_bwd(be, NULL, dnext, m->gv[li[N_ATT]], m->dxn, dcur, m->hin[l],
				   m->pv[li[N_ATT]], a->rstd1, N, d),
		    "attention norm backward");
		tmp = dcur, dcur = dnext, dnext = tmp;
	}
	TRY(kk_embedding_bwd(be, NULL, m->gv[m->emb], dcur, m->tok_v, N, c->vocab_size, d),
	    "embedding backward");
	return 0;
}

int kmt_forward(kmt_model *m, const kmt_batch *b, kmt_stats *out, kiln_error *err)
{
	if (!m)
		return km_errorf(err, -EINVAL, "kmt_forward: missing model");
	int64_t n;
	double sum;
	int r = upload_batch(m, b, &n, err);
	if (r < 0)
		return r;
	if (n == 0)
		return km_errorf(err, -EINVAL, "training batch: every target is ignored");
	if ((r = forward(m, b->n_seqs, &sum, err)) < 0)
		return r;
	if (out) {
		*out = (kmt_stats){ .loss = sum / (double) n, .n_targets = n, .step = m->step };
	}
	return 0;
}

int kmt_forward_backward_accum(kmt_model *m, const kmt_batch *b, int n_micro, kk_comm *comm,
			       kmt_stats *out, kiln_error *err)
{
	if (!m || !b || n_micro < 1 || n_micro > KMT_MAX_MICRO)
		return km_errorf(
			err, -EINVAL,
			"kmt_forward_backward: missing model or batch, or %d micro-batches "
			"(1..%d)",
			n_micro, KMT_MAX_MICRO);
	/* Every micro-batch is checked and counted before any work, so the
	 * scale is 1 / the targets of the whole step. */
	int64_t n_all = 0, n;
	int r;
	for (int i = 0; i < n_micro; i++) {
		if ((r = upload_batch(m, &b[i], &n, err)) < 0)
			return r;
		n_all += n;
	}
	if (comm) {
		/* The global target count, so every rank scales by the same
		 * 1/n and the sum over ranks is the global-batch mean.  Exact
		 * in f32 below 2^24 targets per step. */
		float f = (float) n_all;
		TRY(kk_buffer_upload(m->be, NULL, m->scalar, 0, &f, sizeof(f)), "uploading");
		TRY(kk_all_reduce(comm, NULL, m->scalar, m->scalar, 1, KK_SUM),
		    "all-reduce of the target count");
		TRY(kk_buffer_download(m->be, NULL, m->scalar, 0, &f, sizeof(f)), "downloading");
		n_all = (int64_t) f;
	}
	if (n_all == 0)
		return km_errorf(err, -EINVAL, "training batch: every target is ignored");
	TRY(kk_buffer_memset(m->be, NULL, m->grads, 0, 0, m->n_params * sizeof(float)),
	    "clearing gradients");
	double sum = 0;
	for (int i = 0; i < n_micro; i++) {
		double part;
		/* A single batch is on the device since the count. */
		if (n_micro > 1 && (r = upload_batch(m, &b[i], &n, err)) < 0)
			return r;
		if ((r = forward(m, b[i].n_seqs, &part, err)) < 0)
			return r;
		/* Gradients accumulate (kk's convention for parameter grads). */
		if ((r = backward(m, b[i].n_seqs, (float) (1.0 / (double) n_all), err)) < 0)
			return r;
		sum += part;
	}
	if (comm) {
		/* The whole flat gradient in one collective (no bucketing:
		 * the cpu backend gains nothing from overlap, and the cuda
		 * backend's NCCL call chunks internally). */
		TRY(kk_all_reduce(comm, NULL, m->grads, m->grads, m->n_params, KK_SUM),
		    "all-reduce of the gradients");
		/* The loss too, for the log line every rank prints alike. */
		float f = (float) sum;
		TRY(kk_buffer_upload(m->be, NULL, m->scalar, 0, &f, sizeof(f)), "uploading");
		TRY(kk_all_reduce(comm, NULL, m->scalar, m->scalar, 1, KK_SUM),
		    "all-reduce of the loss");
		TRY(kk_buffer_download(m->be, NULL, m->scalar, 0, &f, sizeof(f)), "downloading");
		sum = f;
	}
	TRY(kk_backend_sync(m->be), "backward");
	if (out)
		*out = (kmt_stats){ .loss = sum / (double) n_all,
				    .n_targets = n_all,
				    .step = m->step };
	return 0;
}

int kmt_forward_backward(kmt_model *m, const kmt_batch *b, kk_comm *comm, kmt_stats *out,
			 kiln_error *err)
{
	return kmt_forward_backward_accum(m, b, 1, comm, out, err);
}

int kmt_sync_from(kmt_model *m, kk_comm *comm, int root, kiln_error *err)
{
	if (!m || !comm || root < 0 || root >= kk_comm_world(comm))
		return km_errorf(err, -EINVAL, "kmt_sync_from: missing argument or bad root %d",
				 root);
	/* MAX of step and of -step: equal steps give max == -(-max).  Exact
	 * in f32 up to 2^24 steps. */
	float st[2] = { (float) m->step, -(float) m->step };
	kk_buffer *two = NULL;
	int r = kk_buffer_alloc(m->be, KK_F32, 2, &two);
	if (r >= 0)
		r = kk_buffer_upload(m->be, NULL, two, 0, st, sizeof(st));
	if (r >= 0)
		r = kk_all_reduce(comm, NULL, two, two, 2, KK_MAX);
	if (r >= 0)
		r = kk_buffer_download(m->be, NULL, two, 0, st, sizeof(st));
	kk_buffer_free(two);
	if (r < 0)
		return kk_fail(err, r, "comparing the ranks' steps", m);
	if (st[0] != -st[1])
		return km_errorf(err, -EINVAL,
				 "ranks are at different steps (%.0f to %.0f): every rank must "
				 "resume from the same checkpoint",
				 (double) -st[1], (double) st[0]);
	kk_buffer *flat[] = { m->params, m->adam_m, m->adam_v };
	for (size_t i = 0; i < ARRAY_SIZE(flat); i++)
		TRY(kk_broadcast(comm, NULL, flat[i], m->n_params, root), "broadcast");
	TRY(kk_backend_sync(m->be), "broadcast");
	return 0;
}

float kmt_lr(const kmt_optim *o, int64_t step)
{
	if (!o)
		return 0;
	if (step < 1)
		step = 1;
	if (o->warmup_steps > 0 && step <= o->warmup_steps)
		return (float) ((double) o->lr_max * (double) step / (double) o->warmup_steps);
	if (o->total_steps <= o->warmup_steps)
		return o->total_steps > 0 && step > o->total_steps ? o->lr_min : o->lr_max;
	if (step >= o->total_steps)
		return o->lr_min;
	double p = (double) (step - o->warmup_steps) / (double) (o->total_steps - o->warmup_steps);
	return (float) (o->lr_min + 0.5 * (o->lr_max - o->lr_min) * (1.0 + cos(M_PI * p)));
}

int kmt_optimizer_step(kmt_model *m, const kmt_optim *o, kmt_stats *out, kiln_error *err)
{
	if (!m || !o)
		return km_errorf(err, -EINVAL, "kmt_optimizer_step: missing argument");
	if (!(o->lr_max >= 0) || !(o->lr_min >= 0) || o->warmup_steps < 0 || o->total_steps < 0 ||
	    !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps > 0) ||
	    !(o->weight_decay >= 0) || !(o->clip >= 0))
		return km_errorf(err, -EINVAL,
				 "optimizer: lr_max %g, lr_min %g, warmup %lld, total %lld, betas "
				 "%g/%g, eps %g, weight decay %g, clip %g: rates, decay and clip "
				 "must be >= 0, betas in [0, 1), eps > 0",
				 (double) o->lr_max, (double) o->lr_min,
				 (long long) o->warmup_steps, (long long) o->total_steps,
				 (double) o->beta1, (double) o->beta2, (double) o->eps,
				 (double) o->weight_decay, (double) o->clip);
	/* Clipping is AdamW's grad_scale (kk_grad_clip's coefficient) rather
	 * than a pass that rescales the gradients in place: one pass over the
	 * flat buffers fewer.  A coefficient of 0 (an infinite norm) would
	 * read as "no scale", so that case scales the gradients itself. */
	float norm = 0, coef = 1;
	kk_buffer *g[1] = { m->grads };
	TRY(kk_grad_norm(m->be, NULL, m->scalar, g, 1), "gradient norm");
	TRY(kk_buffer_download(m->be, NULL, m->scalar, 0, &norm, sizeof(norm)), "downloading");
	if (o->clip > 0 && norm > o->clip) {
		coef = o->clip / (norm + 1e-6f);
		if (!(coef > 0)) {
			TRY(kk_scale(m->be, NULL, m->grads, coef, m->n_params),
			    "gradient clipping");
			coef = 1;
		}
	}
	int64_t step = m->step + 1;
	kk_adamw_params p = {
		.lr = kmt_lr(o, step),
		.beta1 = o->beta1,
		.beta2 = o->beta2,
		.eps = o->eps,
		.weight_decay = o->weight_decay,
		.step = step,
		.grad_scale = coef,
	};
	TRY(kk_adamw(m->be, NULL, m->split[KMT_PARAM][0], NULL, m->split[KMT_GRAD][0],
		     m->split[KMT_ADAM_M][0], m->split[KMT_ADAM_V][0], m->n_decay, &p),
	    "AdamW");
	if (m->n_params > m->n_decay) {
		p.weight_decay = 0;
		TRY(kk_adamw(m->be, NULL, m->split[KMT_PARAM][1], NULL, m->split[KMT_GRAD][1],
			     m->split[KMT_ADAM_M][1], m->split[KMT_ADAM_V][1],
			     m->n_params - m->n_decay, &p),
		    "AdamW");
	}
	TRY(kk_backend_sync(m->be), "AdamW");
	m->step = step;
	if (out) {
		out->grad_norm = norm;
		out->lr = p.lr;
		out->step = step;
	}
	return 0;
}

int kmt_step(kmt_model *m, const kmt_batch *b, kk_comm *comm, const kmt_optim *o, kmt_stats *out,
	     kiln_error *err)
{
	kmt_stats s = { 0 };
	int r = kmt_forward_backward(m, b, comm, &s, err);
	if (r < 0)
		return r;
	if ((r = kmt_optimizer_step(m, o, &s, err)) < 0)
		return r;
	if (out)
		*out = s;
	return 0;
}
