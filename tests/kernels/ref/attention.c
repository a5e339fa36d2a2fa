/* tests/kernels/ref/attention.c — float64 attention: packed varlen
 * (causal or not, GQA), paged decode/prefill over a block table, and the
 * KV-cache write (see ref.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

/* One query row against n keys: keys j at k + koff[j], values likewise. */
static void attend(const double *q, const double *k, const double *v, const size_t *koff, int n,
		   int D, double *out, double *lse)
{
	double scale = 1 / sqrt((double) D), mx = -INFINITY, sum = 0;
	double *s = malloc((n ? n : 1) * sizeof(double));
	for (int j = 0; j < n; j++) {
		double d = 0;
		for (int x = 0; x < D; x++)
			d += q[x] * k[koff[j] + x];
		s[j] = d * scale;
		mx = fmax(mx, s[j]);
	}
	for (int j = 0; j < n; j++)
		sum += exp(s[j] - mx);
	for (int x = 0; x < D; x++) {
		double o = 0;
		for (int j = 0; j < n; j++)
			o += exp(s[j] - mx) / sum * v[koff[j] + x];
		out[x] = o;
	}
	if (lse)
		*lse = mx + log(sum);
	free(s);
}

void ref_attention(const double *q, const double *k, const double *v, const int32_t *cu, int n_seqs,
		   int H, int Hkv, int D, bool causal, double *out, double *lse)
{
	int grp = H / Hkv, T = cu[n_seqs];
	size_t *koff = malloc((T ? T : 1) * sizeof(size_t));
	for (int sq = 0; sq < n_seqs; sq++)
		for (int t = cu[sq]; t < cu[sq + 1]; t++)
			for (int h = 0; h < H; h++) {
				int j1 = causal ? t + 1 : cu[sq + 1];
				for (int j = cu[sq]; j < j1; j++)
					koff[j - cu[sq]] = ((size_t) j * Hkv + h / grp) * D;
				attend(q + ((size_t) t * H + h) * D, k, v, koff, j1 - cu[sq], D,
				       out + ((size_t) t * H + h) * D,
				       lse ? lse + (size_t) t * H + h : NULL);
			}
	free(koff);
}

void ref_attention_paged(const double *q, const double *k_cache, const double *v_cache,
			 const int32_t *block_tables, int max_blocks, const int32_t *context_lens,
			 const int32_t *cu_q, int n_seqs, int H, int Hkv, int D, double *out)
{
	int grp = H / Hkv, row = 0;
	for (int s = 0; s < n_seqs; s++) {
		int rows = cu_q ? cu_q[s + 1] - cu_q[s] : 1, L = context_lens[s];
		size_t *koff = malloc((L ? L : 1) * sizeof(size_t));
		for (int r = 0; r < rows; r++, row++)
			for (int h = 0; h < H; h++) {
				int vis = L - rows + r + 1; /* this row's context */
				for (int t = 0; t < vis; t++)
					koff[t] = (((size_t) block_tables[s * max_blocks +
									  t / KK_KV_BLOCK_SIZE] *
							    KK_KV_BLOCK_SIZE +
						    t % KK_KV_BLOCK_SIZE) *
							   Hkv +
						   h / grp) *
						  D;
				attend(q + ((size_t) row * H + h) * D, k_cache, v_cache, koff, vis,
				       D, out + ((size_t) row * H + h) * D, NULL);
			}
		free(koff);
	}
}

void ref_kv_cache_write(double *k_cache, double *v_cache, const double *k, const double *v,
			const int32_t *slots, int64_t n_tokens, size_t row)
{
	for (int64_t t = 0; t < n_tokens; t++)
		if (slots[t] >= 0) {
			memcpy(k_cache + (size_t) slots[t] * row, k + t * row,
			       row * sizeof(double));
			memcpy(v_cache + (size_t) slots[t] * row, v + t * row,
			       row * sizeof(double));
		}
}

void ref_attention_bwd(const double *q, const double *k, const double *v, const double *dout,
		       const int32_t *cu, int n_seqs, int H, int Hkv, int D, bool causal,
		       double *dq, double *dk, double *dv)
{
	int grp = H / Hkv, T = cu[n_seqs];
	double scale = 1 / sqrt((double) D);
	memset(dk, 0, (size_t) T * Hkv * D * sizeof(double));
	memset(dv, 0, (size_t) T * Hkv * D * sizeof(double));
	double *p = malloc((T ? T : 1) * sizeof(double)),
	       *dp = malloc((T ? T : 1) * sizeof(double));
	for (int sq = 0; sq < n_seqs; sq++)
		for (int t = cu[sq]; t < cu[sq + 1]; t++)
			for (int h = 0; h < H; h++) {
				const double *qr = q + ((size_t) t * H + h) * D;
				const double *gr = dout + ((size_t) t * H + h) * D;
				double *dqr = dq + ((size_t) t * H + h) * D;
				int j0 = cu[sq], n = (causal ? t + 1 : cu[sq + 1]) - j0;
				double mx = -INFINITY, sum = 0, delta = 0;
				for (int j = 0; j < n; j++) {
					const double *kr =
						k + ((size_t) (j0 + j) * Hkv + h / grp) * D;
					const double *vr =
						v + ((size_t) (j0 + j) * Hkv + h / grp) * D;
					double s = 0, g = 0;
					for (int x = 0; x < D; x++) {
						s += qr[x] * kr[x];
						g += gr[x] * vr[x];
					}
					p[j] = s * scale;
					dp[j] = g;
					mx = fmax(mx, p[j]);
				}
				for (int j = 0; j < n; j++)
					sum += p[j] = exp(p[j] - mx);
				for (int j = 0; j < n; j++) {
					p[j] /= sum;
					delta += p[j] * dp[j];
				}
				for (int x = 0; x < D; x++)
					dqr[x] = 0;
				for (int j = 0; j < n; j++) {
					size_t kv = ((size_t) (j0 + j) * Hkv + h / grp) * D;
					double ds = p[j] * (dp[j] - delta);
					for (int x = 0; x < D; x++) {
						dqr[x] += scale * ds * k[kv + x];
						dk[kv + x] += scale * ds * qr[x];
						dv[kv + x] += p[j] * gr[x];
					}
				}
			}
	free(p);
	free(dp);
}
