/* ref.c — the float64 reference forward pass (see ref.h).
 *
 * Per token at position p, with x the residual stream:
 *   for each layer:
 *     h = rmsnorm(x) * g_att;  q = Wq h, k = Wk h, v = Wv h
 *     rotate each (q[2i], q[2i+1]) and (k[2i], k[2i+1]) within a head by
 *       angle p * f_i, f_i = 10000^(-2i / head_size) (or ref_set_rope's
 *       theta and scaling)
 *     store k, v at position p; for query head j use kv head
 *       j / (n_heads / n_kv_heads); softmax(q.k / sqrt(head_size)) over
 *       positions 0..p; x += Wo (sum of weights * v)
 *     h = rmsnorm(x) * g_ffn;  x += W2 (silu(W1 h) * (W3 h))
 *   logits = Wcls (rmsnorm(x) * g_final) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

struct ref_model {
	int dim, hidden, layers, heads, kv_heads, vocab, seq_len, hs, kvd;
	double *emb, *g_att, *wq, *wk, *wv, *wo, *g_ffn, *w1, *w2, *w3, *g_fin, *cls;
	double *kc, *vc; /* [layers][seq_len][kvd] */
	int pos, half_rope;
	ref_rope rope;
	double *x, *h, *q, *k, *v, *att, *o, *a, *b, *sc;
	double *all; /* every weight array above points into it */
};

static double *take(double **cur, long n)
{
	double *p = *cur;
	*cur += n;
	return p;
}

ref_model *ref_load(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	int32_t hd[7];
	ref_model *m = calloc(1, sizeof(*m));
	if (!m || fread(hd, sizeof(int32_t), 7, f) != 7) {
		fclose(f);
		free(m);
		return NULL;
	}
	m->dim = hd[0];
	m->hidden = hd[1];
	m->layers = hd[2];
	m->heads = hd[3];
	m->kv_heads = hd[4];
	int shared = hd[5] > 0;
	m->vocab = abs(hd[5]);
	m->seq_len = hd[6];
	m->hs = m->dim / m->heads;
	m->kvd = m->kv_heads * m->hs;
	long D = m->dim, H = m->hidden, L = m->layers, V = m->vocab, K = m->kvd;
	long n = V * D + L * (D + D * D + 2 * K * D + D * D + D + 3 * H * D) + D +
		 (long) m->seq_len * m->hs + (shared ? 0 : V * D);
	float *raw = malloc(sizeof(float) * (size_t) n);
	m->all = malloc(sizeof(double) * (size_t) n);
	if (!raw || !m->all || fread(raw, sizeof(float), (size_t) n, f) != (size_t) n) {
		free(raw);
		fclose(f);
		ref_free(m);
		return NULL;
	}
	fclose(f);
	for (long i = 0; i < n; i++)
		m->all[i] = raw[i];
	free(raw);
	double *c = m->all;
	m->emb = take(&c, V * D);
	m->g_att = take(&c, L * D);
	m->wq = take(&c, L * D * D);
	m->wk = take(&c, L * K * D);
	m->wv = take(&c, L * K * D);
	m->wo = take(&c, L * D * D);
	m->g_ffn = take(&c, L * D);
	m->w1 = take(&c, L * H * D);
	m->w2 = take(&c, L * D * H);
	m->w3 = take(&c, L * H * D);
	m->g_fin = take(&c, D);
	take(&c, (long) m->seq_len * m->hs); /* precomputed RoPE tables: unused */
	m->cls = shared ? m->emb : take(&c, V * D);
	m->kc = calloc((size_t) (L * m->seq_len * K), sizeof(double));
	m->vc = calloc((size_t) (L * m->seq_len * K), sizeof(double));
	m->x = calloc((size_t) D, sizeof(double));
	m->h = calloc((size_t) D, sizeof(double));
	m->q = calloc((size_t) D, sizeof(double));
	m->k = calloc((size_t) K, sizeof(double));
	m->v = calloc((size_t) K, sizeof(double));
	m->att = calloc((size_t) D, sizeof(double));
	m->o = calloc((size_t) D, sizeof(double));
	m->a = calloc((size_t) H, sizeof(double));
	m->b = calloc((size_t) H, sizeof(double));
	m->sc = calloc((size_t) m->seq_len, sizeof(double));
	m->rope = (ref_rope){ .theta = 10000.0 };
	return m;
}

void ref_free(ref_model *m)
{
	if (!m)
		return;
	double *p[] = { m->all, m->kc,	m->vc, m->x, m->h, m->q, m->k,
			m->v,	m->att, m->o,  m->a, m->b, m->sc };
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		free(p[i]);
	free(m);
}

int ref_vocab(const ref_model *m)
{
	return m->vocab;
}

int ref_seq_len(const ref_model *m)
{
	return m->seq_len;
}

void ref_reset(ref_model *m)
{
	m->pos = 0;
}

/* out[r] = sum_c w[r*cols + c] in[c] */
static void matvec(double *out, const double *w, const double *in, int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		double s = 0;
		for (int c = 0; c < cols; c++)
			s += w[(long) r * cols + c] * in[c];
		out[r] = s;
	}
}

static void rmsnorm(double *out, const double *in, const double *g, int n)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += in[i] * in[i];
	double inv = 1.0 / sqrt(ss / n + 1e-5);
	for (int i = 0; i < n; i++)
		out[i] = in[i] * inv * g[i];
}

void ref_set_half_rope(ref_model *m, int on)
{
	m->half_rope = on;
}

void ref_set_rope(ref_model *m, const ref_rope *r)
{
	m->rope = *r;
}

/* Pair j's frequency: theta^(-2j/hs), then transformers'
 * _compute_linear_scaling_rope_parameters (inv_freq / factor) or
 * _compute_llama3_parameters: with wavelen = 2 pi / f, low_freq_wavelen =
 * L / low_freq_factor and high_freq_wavelen = L / high_freq_factor, f /
 * factor where wavelen > low_freq_wavelen, f where wavelen <
 * high_freq_wavelen, and in between (1 - s) * f / factor + s * f with s =
 * (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor). */
double ref_rope_freq(const ref_rope *r, int j, int hs)
{
	double f = pow(r->theta, -2.0 * j / hs);
	if (r->kind == REF_ROPE_LINEAR)
		return f / r->factor;
	if (r->kind != REF_ROPE_LLAMA3)
		return f;
	double L = r->original_max_pos, wavelen = 2 * M_PI / f;
	double low_wl = L / r->low_freq_factor, high_wl = L / r->high_freq_factor;
	if (wavelen > low_wl)
		return f / r->factor;
	if (wavelen < high_wl)
		return f;
	double s = (L / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
	return (1 - s) * f / r->factor + s * f;
}

/* Pair j of a head (j < hs/2) rotates by pos * ref_rope_freq(j); its two
 * elements are (2j, 2j+1) for llama2.c, (j, j + hs/2) for HF. */
static void rotate(double *vec, int n_heads, int hs, int pos, int half, const ref_rope *r)
{
	for (int hd = 0; hd < n_heads; hd++)
		for (int j = 0; j < hs / 2; j++) {
			double ang = pos * ref_rope_freq(r, j, hs);
			double c = cos(ang), s = sin(ang);
			double *e0 = vec + hd * hs + (half ? j : 2 * j);
			double *e1 = half ? e0 + hs / 2 : e0 + 1;
			double a = *e0, b = *e1;
			*e0 = a * c - b * s;
			*e1 = a * s + b * c;
		}
}

int ref_step(ref_model *m, int token, double *logits)
{
	if (m->pos >= m->seq_len || token < 0 || token >= m->vocab)
		return -1;
	const int D = m->dim, H = m->hidden, K = m->kvd, hs = m->hs, p = m->pos;
	memcpy(m->x, m->emb + (long) token * D, sizeof(double) * (size_t) D);
	for (int l = 0; l < m->layers; l++) {
		rmsnorm(m->h, m->x, m->g_att + (long) l * D, D);
		matvec(m->q, m->wq + (long) l * D * D, m->h, D, D);
		matvec(m->k, m->wk + (long) l * K * D, m->h, K, D);
		matvec(m->v, m->wv + (long) l * K * D, m->h, K, D);
		rotate(m->q, m->heads, hs, p, m->half_rope, &m->rope);
		rotate(m->k, m->kv_heads, hs, p, m->half_rope, &m->rope);
		double *kl = m->kc + (long) l * m->seq_len * K,
		       *vl = m->vc + (long) l * m->seq_len * K;
		memcpy(kl + (long) p * K, m->k, sizeof(double) * (size_t) K);
		memcpy(vl + (long) p * K, m->v, sizeof(double) * (size_t) K);
		int group = m->heads / m->kv_heads;
		for (int hd = 0; hd < m->heads; hd++) {
			const double *qh = m->q + hd * hs;
			int kvh = hd / group;
			double mx = -INFINITY;
			for (int t = 0; t <= p; t++) {
				double s = 0;
				for (int i = 0; i < hs; i++)
					s += qh[i] * kl[(long) t * K + kvh * hs + i];
				m->sc[t] = s / sqrt((double) hs);
				mx = fmax(mx, m->sc[t]);
			}
			double z = 0;
			for (int t = 0; t <= p; t++)
				z += m->sc[t] = exp(m->sc[t] - mx);
			double *oh = m->att + hd * hs;
			for (int i = 0; i < hs; i++) {
				double s = 0;
				for (int t = 0; t <= p; t++)
					s += m->sc[t] / z * vl[(long) t * K + kvh * hs + i];
				oh[i] = s;
			}
		}
		matvec(m->o, m->wo + (long) l * D * D, m->att, D, D);
		for (int i = 0; i < D; i++)
			m->x[i] += m->o[i];
		rmsnorm(m->h, m->x, m->g_ffn + (long) l * D, D);
		matvec(m->a, m->w1 + (long) l * H * D, m->h, H, D);
		matvec(m->b, m->w3 + (long) l * H * D, m->h, H, D);
		for (int i = 0; i < H; i++)
			m->a[i] = m->a[i] / (1.0 + exp(-m->a[i])) * m->b[i];
		matvec(m->o, m->w2 + (long) l * D * H, m->a, D, H);
		for (int i = 0; i < D; i++)
			m->x[i] += m->o[i];
	}
	rmsnorm(m->h, m->x, m->g_fin, D);
	matvec(logits, m->cls, m->h, m->vocab, D);
	m->pos++;
	return 0;
}

int ref_argmax(const double *logits, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

static unsigned rs_next(unsigned *rs)
{
	*rs = *rs * 1664525u + 1013904223u;
	return *rs >> 8;
}

/* count values uniform in center +- half_width. */
static int put_random(FILE *f, long count, double center, double half_width, unsigned *rs)
{
	for (long i = 0; i < count; i++) {
		float v = (float) (center + half_width * (rs_next(rs) / 8388608.0 - 1.0));
		if (fwrite(&v, sizeof(v), 1, f) != 1)
			return -1;
	}
	return 0;
}

int ref_write_random(const char *path, int dim, int hidden, int layers, int heads, int kv_heads,
		     int vocab, int seq_len, unsigned seed)
{
	return ref_write_random_qk(path, dim, hidden, layers, heads, kv_heads, vocab, seq_len, seed,
				   1.0);
}

int ref_write_random_qk(const char *path, int dim, int hidden, int layers, int heads, int kv_heads,
			int vocab, int seq_len, unsigned seed, double qk_gain)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	int32_t hd[7] = { dim, hidden, layers, heads, kv_heads, vocab, seq_len };
	long D = dim, H = hidden, L = layers, K = (long) kv_heads * (dim / heads);
	double wd = 1.0 / sqrt((double) D), wh = 1.0 / sqrt((double) H);
	unsigned rs = seed;
	int r = fwrite(hd, sizeof(hd), 1, f) == 1 ? 0 : -1;
	r |= put_random(f, (long) vocab * D, 0, 0.5, &rs);
	r |= put_random(f, L * D, 1, 0.1, &rs);
	r |= put_random(f, L * D * D, 0, wd * qk_gain, &rs);
	r |= put_random(f, L * K * D, 0, wd * qk_gain, &rs);
	r |= put_random(f, L * K * D, 0, wd, &rs);
	r |= put_random(f, L * D * D, 0, wd, &rs);
	r |= put_random(f, L * D, 1, 0.1, &rs);
	r |= put_random(f, L * H * D, 0, wd, &rs);
	r |= put_random(f, L * D * H, 0, wh, &rs);
	r |= put_random(f, L * H * D, 0, wd, &rs);
	r |= put_random(f, D, 1, 0.1, &rs);
	r |= put_random(f, (long) seq_len * (dim / heads), 0, 0, &rs); /* RoPE tables */
	return (fclose(f) == 0 && r == 0) ? 0 : -1;
}
