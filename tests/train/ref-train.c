/* ref-train.c — the float64 training-loss reference (see ref-train.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref-train.h"

static void add(rt_model *m, const char *name, size_t n)
{
	rt_tensor *t = &m->t[m->n_t++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->n = n;
	t->w = calloc(n, sizeof(double));
}

rt_model *rt_new(const rt_config *c)
{
	rt_model *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->c = *c;
	size_t d = (size_t) c->dim, hd = d / (size_t) c->heads, kvd = hd * (size_t) c->kv_heads,
	       h = (size_t) c->hidden, V = (size_t) c->vocab;
	m->t = calloc(3 + 9 * (size_t) c->layers, sizeof(rt_tensor));
	add(m, "tok_embeddings.weight", V * d);
	if (!c->shared)
		add(m, "output.weight", V * d);
	add(m, "norm.weight", d);
	char name[64];
	const struct {
		const char *s;
		size_t n;
	} lt[] = { { "attention_norm.weight", d },	{ "ffn_norm.weight", d },
		   { "attention.wq.weight", d * d },	{ "attention.wk.weight", kvd * d },
		   { "attention.wv.weight", kvd * d },	{ "attention.wo.weight", d * d },
		   { "feed_forward.w1.weight", h * d }, { "feed_forward.w2.weight", d * h },
		   { "feed_forward.w3.weight", h * d } };
	for (int l = 0; l < c->layers; l++)
		for (size_t i = 0; i < sizeof(lt) / sizeof(lt[0]); i++) {
			snprintf(name, sizeof(name), "layers.%d.%s", l, lt[i].s);
			add(m, name, lt[i].n);
		}
	/* One sequence's activations; T is bounded by the callers (<= 512). */
	size_t T = 512;
	m->x = calloc(T * d, sizeof(double));
	m->xn = calloc(T * d, sizeof(double));
	m->q = calloc(T * d, sizeof(double));
	m->k = calloc(T * kvd, sizeof(double));
	m->v = calloc(T * kvd, sizeof(double));
	m->att = calloc(T * d, sizeof(double));
	m->tmp = calloc(T + d, sizeof(double));
	m->g = calloc(h, sizeof(double));
	m->u = calloc(h, sizeof(double));
	m->logits = calloc(V, sizeof(double));
	return m;
}

void rt_free(rt_model *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_t; i++)
		free(m->t[i].w);
	free(m->t);
	free(m->x);
	free(m->xn);
	free(m->q);
	free(m->k);
	free(m->v);
	free(m->att);
	free(m->tmp);
	free(m->g);
	free(m->u);
	free(m->logits);
	free(m);
}

rt_tensor *rt_find(rt_model *m, const char *name)
{
	for (int i = 0; i < m->n_t; i++)
		if (!strcmp(m->t[i].name, name))
			return &m->t[i];
	return NULL;
}

static const double *W(rt_model *m, int layer, const char *s)
{
	char name[64];
	if (layer >= 0)
		snprintf(name, sizeof(name), "layers.%d.%s", layer, s);
	else
		snprintf(name, sizeof(name), "%s", s);
	return rt_find(m, name)->w;
}

/* y[n] = W[n][k] x[k] */
static void matvec(double *y, const double *w, const double *x, int n, int k)
{
	for (int i = 0; i < n; i++) {
		double s = 0;
		for (int j = 0; j < k; j++)
			s += w[(size_t) i * k + j] * x[j];
		y[i] = s;
	}
}

static void rmsnorm(double *y, const double *x, const double *g, int d, double eps)
{
	double ss = 0;
	for (int i = 0; i < d; i++)
		ss += x[i] * x[i];
	double r = 1.0 / sqrt(ss / d + eps);
	for (int i = 0; i < d; i++)
		y[i] = x[i] * r * g[i];
}

static void rope(double *x, int heads, int hd, int pos, double theta, int half)
{
	for (int h = 0; h < heads; h++) {
		double *v = x + (size_t) h * hd;
		for (int i = 0; i < hd / 2; i++) {
			double a = pos * pow(theta, -2.0 * i / hd);
			int i0 = half ? i : 2 * i, i1 = half ? i + hd / 2 : 2 * i + 1;
			double x0 = v[i0], x1 = v[i1];
			v[i0] = x0 * cos(a) - x1 * sin(a);
			v[i1] = x0 * sin(a) + x1 * cos(a);
		}
	}
}

double rt_loss(rt_model *m, const int32_t *tokens, const int32_t *targets, int n_seqs, int T,
	       int *count)
{
	const rt_config *c = &m->c;
	const int d = c->dim, hd = d / c->heads, kvd = hd * c->kv_heads, H = c->hidden,
		  V = c->vocab, grp = c->heads / c->kv_heads;
	double total = 0;
	int n = 0;
	for (int s = 0; s < n_seqs; s++) {
		const int32_t *tok = tokens + (size_t) s * T, *tgt = targets + (size_t) s * T;
		for (int t = 0; t < T; t++)
			memcpy(m->x + (size_t) t * d,
			       W(m, -1, "tok_embeddings.weight") + (size_t) tok[t] * d,
			       (size_t) d * sizeof(double));
		for (int l = 0; l < c->layers; l++) {
			for (int t = 0; t < T; t++) {
				double *xn = m->xn + (size_t) t * d;
				rmsnorm(xn, m->x + (size_t) t * d, W(m, l, "attention_norm.weight"),
					d, c->eps);
				matvec(m->q + (size_t) t * d, W(m, l, "attention.wq.weight"), xn, d,
				       d);
				matvec(m->k + (size_t) t * kvd, W(m, l, "attention.wk.weight"), xn,
				       kvd, d);
				matvec(m->v + (size_t) t * kvd, W(m, l, "attention.wv.weight"), xn,
				       kvd, d);
				rope(m->q + (size_t) t * d, c->heads, hd, t, c->theta,
				     c->half_rope);
				rope(m->k + (size_t) t * kvd, c->kv_heads, hd, t, c->theta,
				     c->half_rope);
			}
			for (int t = 0; t < T; t++)
				for (int h = 0; h < c->heads; h++) {
					const double *q = m->q + (size_t) t * d + h * hd;
					int kh = h / grp;
					double mx = -INFINITY, sum = 0;
					for (int u = 0; u <= t; u++) {
						const double *k = m->k + (size_t) u * kvd + kh * hd;
						double sc = 0;
						for (int i = 0; i < hd; i++)
							sc += q[i] * k[i];
						m->tmp[u] = sc / sqrt((double) hd);
						if (m->tmp[u] > mx)
							mx = m->tmp[u];
					}
					for (int u = 0; u <= t; u++)
						sum += (m->tmp[u] = exp(m->tmp[u] - mx));
					double *o = m->att + (size_t) t * d + h * hd;
					for (int i = 0; i < hd; i++)
						o[i] = 0;
					for (int u = 0; u <= t; u++)
						for (int i = 0; i < hd; i++)
							o[i] += m->tmp[u] / sum *
								m->v[(size_t) u * kvd + kh * hd +
								     i];
				}
			for (int t = 0; t < T; t++) {
				double *x = m->x + (size_t) t * d, *o = m->tmp;
				matvec(o, W(m, l, "attention.wo.weight"), m->att + (size_t) t * d,
				       d, d);
				for (int i = 0; i < d; i++)
					x[i] += o[i];
				double *xn = m->xn + (size_t) t * d;
				rmsnorm(xn, x, W(m, l, "ffn_norm.weight"), d, c->eps);
				matvec(m->g, W(m, l, "feed_forward.w1.weight"), xn, H, d);
				matvec(m->u, W(m, l, "feed_forward.w3.weight"), xn, H, d);
				for (int i = 0; i < H; i++)
					m->g[i] = m->g[i] / (1.0 + exp(-m->g[i])) * m->u[i];
				matvec(o, W(m, l, "feed_forward.w2.weight"), m->g, d, H);
				for (int i = 0; i < d; i++)
					x[i] += o[i];
			}
		}
		const double *cls = W(m, -1, c->shared ? "tok_embeddings.weight" : "output.weight");
		for (int t = 0; t < T; t++) {
			if (tgt[t] < 0)
				continue;
			rmsnorm(m->xn, m->x + (size_t) t * d, W(m, -1, "norm.weight"), d, c->eps);
			matvec(m->logits, cls, m->xn, V, d);
			double mx = m->logits[0], sum = 0;
			for (int i = 1; i < V; i++)
				mx = m->logits[i] > mx ? m->logits[i] : mx;
			for (int i = 0; i < V; i++)
				sum += exp(m->logits[i] - mx);
			/* sum >= 1 (the largest logit adds exp(0)); fmax tells
			 * cppcheck, which cannot see it. */
			total += mx + log(fmax(sum, 1.0)) - m->logits[tgt[t]];
			n++;
		}
	}
	if (count)
		*count = n;
	return n ? total / n : 0;
}
