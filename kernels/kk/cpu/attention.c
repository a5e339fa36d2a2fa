/* kernels/kk/cpu/attention.c — the cpu backend's attention: varlen causal/GQA
 * prefill forward with online softmax, its backward, paged-KV decode and
 * the KV-cache write.
 *
 * The forward walks keys once per (token, head) with a running max and sum
 * (the same online softmax the GPU kernels use), so no T x T matrix exists
 * here either; it saves the row log-sum-exp for the backward, which
 * recomputes probabilities from it.  The backward runs one task per
 * (sequence, kv head) so the dk/dv sums of a GQA group stay in one thread
 * and need no locks.  Index tensors are validated here because only the
 * backend can read them (-EINVAL for bad cu_seqlens/context lengths,
 * -ERANGE for a block or slot outside the cache). */
#include <cblas.h>
#include <errno.h>
#include <stdlib.h>

#include "cpu.h"
#include "kiln/macro.h"

static int check_cu_seqlens(const kk_attn_desc *d)
{
	const int32_t *cu = d->cu_seqlens->ptr;
	if (cu[0] != 0 || cu[d->n_seqs] != d->total_tokens)
		return -EINVAL;
	for (int s = 0; s < d->n_seqs; s++)
		if (cu[s + 1] < cu[s] || cu[s + 1] - cu[s] > d->max_seqlen)
			return -EINVAL;
	return 0;
}

/* Tiles of the prefill forward and of the backward: 64 queries x 128 keys.
 * Their products (S = Q K^T, O += P V, and the backward's five) are
 * one-thread sgemm calls on the tensors in place (rows of one head are
 * H * D apart: sgemm's leading dimension), and the softmax between them
 * runs on whole score rows with the 16-lane exp of simd.c.  The
 * dot/axpy-per-key loops this replaced ran the benchmark model's attention
 * (T = 128, head_dim 32) at ~9 GFLOP/s forward, ~16 backward (issue 15).
 * OpenBLAS is held to one thread (cpu.c), so each pool thread's call runs
 * on that thread alone, as gemm.c's chunks do. */
#define CPU_ATTN_HEAD_DIM_MAX KK_ATTN_HEAD_DIM_LARGE
#define ATT_BQ		      64
#define ATT_BK		      128

static inline float dot(const float *a, const float *b, int n)
{
	return kk__dot(a, b, (size_t) n);
}

/* C[m, n] = alpha op(A) op(B) + beta C, row-major, one thread. */
static void mm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
	       const float *b, int ldb, float beta, float *c, int ldc)
{
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		    m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

struct attn_ctx {
	const kk_attn_desc *d;
	float scale;
	const float *q, *k, *v, *out, *dout;
	kk_buffer *o, *lse, *dq, *dk, *dv;
	const int64_t *tasks; /* forward: seq << 32 | query block, one per block */
};

/* Keys of the tile starting at j0 (nk of them) that query row i sees:
 * all, or under the causal mask those at or before i (may be <= 0). */
static inline int visible(const kk_attn_desc *d, int64_t i, int64_t j0, int nk)
{
	return d->causal ? (int) MIN((int64_t) nk, i - j0 + 1) : nk;
}

/* One task = one (query block, head): flash-style online softmax over key
 * tiles, S = scale Q K^T then O += P V, never more than one tile of
 * scores. */
static int fwd_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct attn_ctx *c = p;
	const kk_attn_desc *d = c->d;
	const int32_t *cu = d->cu_seqlens->ptr;
	const int D = d->head_dim, H = d->n_heads, Hkv = d->n_kv_heads, grp = H / Hkv;
	_cleanup_free_ float *S = malloc(sizeof(float) * ATT_BQ * (ATT_BK + D));
	float m[ATT_BQ], l[ATT_BQ], *acc;

	if (!S)
		return -ENOMEM;
	acc = S + ATT_BQ * ATT_BK;
	for (int64_t it = b; it < e; it++) {
		int64_t task = c->tasks[it / H];
		int h = (int) (it % H), kvh = h / grp, s = (int) (task >> 32);
		int64_t i0 = cu[s] + (task & 0xffffffff) * ATT_BQ;
		int nq = (int) MIN((int64_t) ATT_BQ, cu[s + 1] - i0);
		int64_t kv_end = d->causal ? i0 + nq : cu[s + 1];
		const float *Q = c->q + ((size_t) i0 * H + h) * D;

		for (int r = 0; r < nq; r++)
			m[r] = -INFINITY, l[r] = 0;
		memset(acc, 0, sizeof(float) * nq * D);
		for (int64_t j0 = cu[s]; j0 < kv_end; j0 += ATT_BK) {
			int nk = (int) MIN((int64_t) ATT_BK, kv_end - j0);
			size_t kv = ((size_t) j0 * Hkv + kvh) * D;

			mm(false, true, nq, nk, D, c->scale, Q, H * D, c->k + kv, Hkv * D, 0, S,
			   ATT_BK);
			for (int r = 0; r < nq; r++) {
				float *sr = S + r * ATT_BK, mx, corr;
				int jn = visible(d, i0 + r, j0, nk);
				if (jn <= 0) { /* the whole tile is in this row's future */
					memset(sr, 0, sizeof(float) * nk);
					continue;
				}
				/* Masked keys: -inf, which the exp makes 0, so the row
				 * is exponentiated whole (no ragged tail per row). */
				for (int j = jn; j < nk; j++)
					sr[j] = -INFINITY;
				mx = fmaxf(m[r], kk__max(sr, jn));
				corr = expf(m[r] - mx);
				l[r] = l[r] * corr + kk__exp_sum(sr, mx, nk);
				m[r] = mx;
				if (corr != 1.0f)
					kk__scal(acc + r * D, corr, D);
			}
			mm(false, false, nq, D, nk, 1, S, ATT_BK, c->v + kv, Hkv * D, 1, acc, D);
		}
		for (int r = 0; r < nq; r++) {
			kk__scal(acc + r * D, 1.0f / l[r], D);
			kk__row_store(c->o->ptr, c->o->dtype, ((size_t) (i0 + r) * H + h) * D,
				      acc + r * D, D);
			if (c->lse)
				((float *) c->lse->ptr)[(i0 + r) * H + h] = m[r] + logf(l[r]);
		}
	}
	return 0;
}

int kk__cpu_attention_fwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d, kk_buffer *out,
			  kk_buffer *lse, const kk_buffer *q, const kk_buffer *k,
			  const kk_buffer *v)
{
	_cleanup_free_ float *qo = NULL, *ko = NULL, *vo = NULL;
	_cleanup_free_ int64_t *tasks = NULL;
	const int32_t *cu = d->cu_seqlens->ptr;
	size_t T = (size_t) d->total_tokens;

	if (d->head_dim > CPU_ATTN_HEAD_DIM_MAX)
		return -EOPNOTSUPP;
	struct attn_ctx c = { .d = d,
			      .o = out,
			      .lse = lse,
			      .scale =
				      d->scale > 0 ? d->scale : 1.0f / sqrtf((float) d->head_dim) };
	int64_t n = 0;
	int r = check_cu_seqlens(d);

	if (r < 0)
		return r;
	tasks = malloc(sizeof(int64_t) * (T / ATT_BQ + d->n_seqs + 1));
	if (!tasks)
		return -ENOMEM;
	for (int s = 0; s < d->n_seqs; s++)
		for (int64_t blk = 0; blk * ATT_BQ < cu[s + 1] - cu[s]; blk++)
			tasks[n++] = (int64_t) s << 32 | blk;
	c.tasks = tasks;
	if ((r = kk__widen(q, T * d->n_heads * d->head_dim, (float **) &c.q, &qo)) < 0 ||
	    (r = kk__widen(k, T * d->n_kv_heads * d->head_dim, (float **) &c.k, &ko)) < 0 ||
	    (r = kk__widen(v, T * d->n_kv_heads * d->head_dim, (float **) &c.v, &vo)) < 0)
		return r;
	return kk__parallel_for(n * d->n_heads,
				(double) ATT_BQ * d->max_seqlen * d->head_dim * (d->causal ? 2 : 4),
				fwd_range, &c);
}

/* One task = one (sequence, kv head), so the dk/dv sums of the GQA group
 * stay in one thread.  Per query head and block of ATT_BQ queries, per key
 * tile: P = exp(scale Q K^T - lse), dV += P^T dO, dP = dO V^T, dS = P (dP
 * - rowsum(dO o O)) scale, dQ += dS K, dK += dS^T Q. */
static int bwd_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct attn_ctx *c = p;
	const kk_attn_desc *d = c->d;
	const int32_t *cu = d->cu_seqlens->ptr;
	const int D = d->head_dim, H = d->n_heads, Hkv = d->n_kv_heads, grp = H / Hkv;
	const float *lse = c->lse->ptr;
	const size_t tile = (size_t) ATT_BQ * ATT_BK;
	_cleanup_free_ float *dk = NULL, *dv = NULL, *P = NULL;
	float Di[ATT_BQ], *dP, *dq;

	dk = malloc((size_t) d->max_seqlen * D * sizeof(float));
	dv = malloc((size_t) d->max_seqlen * D * sizeof(float));
	P = malloc((2 * tile + (size_t) ATT_BQ * D) * sizeof(float));
	if (!dk || !dv || !P)
		return -ENOMEM;
	dP = P + tile;
	dq = dP + tile;

	for (int64_t it = b; it < e; it++) {
		int s = (int) (it / Hkv), kvh = (int) (it % Hkv);
		int64_t s0 = cu[s], s1 = cu[s + 1], len = s1 - s0;

		memset(dk, 0, (size_t) len * D * sizeof(float));
		memset(dv, 0, (size_t) len * D * sizeof(float));
		for (int h = kvh * grp; h < (kvh + 1) * grp; h++)
			for (int64_t i0 = s0; i0 < s1; i0 += ATT_BQ) {
				int nq = (int) MIN((int64_t) ATT_BQ, s1 - i0);
				int64_t kv_end = d->causal ? i0 + nq : s1;
				size_t qi = ((size_t) i0 * H + h) * D;
				const float *Q = c->q + qi, *dO = c->dout + qi;

				for (int r = 0; r < nq; r++)
					Di[r] = dot(dO + (size_t) r * H * D,
						    c->out + qi + (size_t) r * H * D, D);
				memset(dq, 0, sizeof(float) * nq * D);
				for (int64_t j0 = s0; j0 < kv_end; j0 += ATT_BK) {
					int nk = (int) MIN((int64_t) ATT_BK, kv_end - j0);
					size_t kv = ((size_t) j0 * Hkv + kvh) * D;
					const float *K = c->k + kv, *V = c->v + kv;

					mm(false, true, nq, nk, D, c->scale, Q, H * D, K, Hkv * D,
					   0, P, ATT_BK);
					mm(false, true, nq, nk, D, 1, dO, H * D, V, Hkv * D, 0, dP,
					   ATT_BK);
					for (int r = 0; r < nq; r++) {
						float *pr = P + r * ATT_BK, *dpr = dP + r * ATT_BK;
						int jn = MAX(visible(d, i0 + r, j0, nk), 0);
						/* masked: -inf -> P = 0 -> dS = 0 */
						for (int j = jn; j < nk; j++)
							pr[j] = -INFINITY;
						kk__exp_sum(pr, lse[(i0 + r) * H + h], nk);
						kk__attn_ds(dpr, pr, Di[r], c->scale, nk);
					}
					mm(true, false, nk, D, nq, 1, P, ATT_BK, dO, H * D, 1,
					   dv + (j0 - s0) * D, D);
					mm(false, false, nq, D, nk, 1, dP, ATT_BK, K, Hkv * D, 1,
					   dq, D);
					mm(true, false, nk, D, nq, 1, dP, ATT_BK, Q, H * D, 1,
					   dk + (j0 - s0) * D, D);
				}
				for (int r = 0; r < nq; r++)
					kk__row_store(c->dq->ptr, c->dq->dtype,
						      qi + (size_t) r * H * D, dq + r * D, D);
			}
		for (int64_t j = s0; j < s1; j++) {
			size_t kv = ((size_t) j * Hkv + kvh) * D;
			kk__row_store(c->dk->ptr, c->dk->dtype, kv, dk + (j - s0) * D, D);
			kk__row_store(c->dv->ptr, c->dv->dtype, kv, dv + (j - s0) * D, D);
		}
	}
	return 0;
}

int kk__cpu_attention_bwd(kk_backend *be, kk_stream *st, const kk_attn_desc *d, kk_buffer *dq,
			  kk_buffer *dk, kk_buffer *dv, const kk_buffer *dout, const kk_buffer *q,
			  const kk_buffer *k, const kk_buffer *v, const kk_buffer *out,
			  const kk_buffer *lse)
{
	_cleanup_free_ float *qo = NULL, *ko = NULL, *vo = NULL, *oo = NULL, *doo = NULL;

	if (d->head_dim > CPU_ATTN_HEAD_DIM_MAX)
		return -EOPNOTSUPP;
	size_t T = (size_t) d->total_tokens, nq = T * d->n_heads * d->head_dim,
	       nk = T * d->n_kv_heads * d->head_dim;
	struct attn_ctx c = { .d = d,
			      .lse = (kk_buffer *) lse,
			      .dq = dq,
			      .dk = dk,
			      .dv = dv,
			      .scale =
				      d->scale > 0 ? d->scale : 1.0f / sqrtf((float) d->head_dim) };
	int r = check_cu_seqlens(d);

	if (r < 0)
		return r;
	if ((r = kk__widen(q, nq, (float **) &c.q, &qo)) < 0 ||
	    (r = kk__widen(k, nk, (float **) &c.k, &ko)) < 0 ||
	    (r = kk__widen(v, nk, (float **) &c.v, &vo)) < 0 ||
	    (r = kk__widen(out, nq, (float **) &c.out, &oo)) < 0 ||
	    (r = kk__widen(dout, nq, (float **) &c.dout, &doo)) < 0)
		return r;
	/* Sequences with no tokens leave nothing to write; dq/dk/dv cover all
	 * T tokens because cu_seqlens partitions [0, T). */
	return kk__parallel_for((int64_t) d->n_seqs * d->n_kv_heads,
				(double) d->max_seqlen * d->max_seqlen * d->head_dim *
					(d->n_heads / d->n_kv_heads) * 4,
				bwd_range, &c);
}

/* ---- paged decode ------------------------------------------------------ */

struct decode_ctx {
	const kk_paged_desc *d;
	float scale;
	kk_buffer *out;
	const kk_buffer *q, *kc, *vc;
	/* Per query row: its sequence and how many context tokens it sees
	 * (decode: row s is sequence s and sees all of it). */
	const int32_t *row_seq, *row_len;
};

/* The decode tasks' cache blocks, in the order decode_range reads them
 * (task by task, block by block), each brought toward L1 KK_KV_PF_AHEAD
 * blocks before it is scored.  A head's K and V rows are 256 bytes (D =
 * 64) spaced Hkv * D elements apart: short strided reads the hardware
 * prefetcher does not follow, and the cache comes from DRAM (a decode
 * step streams every weight through L3 between two visits of a layer's
 * cache).  s110m q4_0, 1 thread: the scores and P V were 38 % of a decode
 * step at context 128-192, most of it waiting on these loads
 * (docs/kernels.md, "Decode's cache reads"). */
#define KK_KV_PF_AHEAD 2
struct kv_pf {
	int64_t it, e; /* the next task to prefetch from, and the end */
	int t0;	       /* its next block's first token */
};

static void kv_pf_next(const struct decode_ctx *c, struct kv_pf *f)
{
	const kk_paged_desc *d = c->d;
	const int Hkv = d->n_kv_heads, D = d->head_dim;
	if (f->it >= f->e)
		return;
	int64_t row = f->it / Hkv;
	int kvh = (int) (f->it % Hkv), s = c->row_seq[row], len = c->row_len[row];
	int blk = ((const int32_t *) d->block_tables->ptr)[(size_t) s * d->max_blocks_per_seq +
							    f->t0 / KK_KV_BLOCK_SIZE];
	int nt = MIN(len - f->t0, KK_KV_BLOCK_SIZE);
	const size_t es = kk_dtype_size(c->kc->dtype, 1), rowb = es * (size_t) D;
	for (int j = 0; j < nt; j++) {
		size_t off = (((size_t) blk * KK_KV_BLOCK_SIZE + j) * Hkv + kvh) * rowb;
		for (size_t l = 0; l < rowb; l += 64) {
			__builtin_prefetch((const char *) c->kc->ptr + off + l);
			__builtin_prefetch((const char *) c->vc->ptr + off + l);
		}
	}
	f->t0 += KK_KV_BLOCK_SIZE;
	if (f->t0 >= len)
		f->it++, f->t0 = 0;
}

/* One task = one (query row, kv head): every query head of the GQA group
 * is processed together so each cached K/V row is widened and read once. */
static int decode_range(void *p, int64_t b, int64_t e, int chunk)
{
	struct decode_ctx *c = p;
	const kk_paged_desc *d = c->d;
	const int32_t *bt = d->block_tables->ptr;
	int D = d->head_dim, H = d->n_heads, Hkv = d->n_kv_heads, grp = H / Hkv;
	/* A block's K and V rows widened (16-bit caches only: f32 rows are read
	 * in place). */
	enum { BS = KK_KV_BLOCK_SIZE };
	bool f32 = c->kc->dtype == KK_F32 && c->vc->dtype == KK_F32;
	_cleanup_free_ float *qr = malloc(sizeof(float) * grp * D),
			     *acc = malloc(sizeof(float) * grp * D),
			     *ml = malloc(sizeof(float) * grp * 2),
			     *kv = f32 ? NULL : malloc(sizeof(float) * 2 * BS * D);

	if (!qr || !acc || !ml || (!f32 && !kv))
		return -ENOMEM;
	struct kv_pf pf = { .it = b, .e = e, .t0 = 0 };
	for (int i = 0; i < KK_KV_PF_AHEAD; i++)
		kv_pf_next(c, &pf);
	for (int64_t it = b; it < e; it++) {
		int64_t row = it / Hkv;
		int kvh = (int) (it % Hkv), s = c->row_seq[row], len = c->row_len[row];

		kk__row_f32(qr, c->q->ptr, c->q->dtype, ((size_t) row * H + kvh * grp) * D,
			    (size_t) grp * D);
		memset(acc, 0, sizeof(float) * grp * D);
		for (int g = 0; g < grp; g++)
			ml[2 * g] = -INFINITY, ml[2 * g + 1] = 0;
		/* A cache block (16 tokens) at a time: its scores first, then one
		 * rescale of the running sum per head when the block raises the
		 * maximum, instead of one per token. */
		for (int t0 = 0; t0 < len; t0 += BS) {
			int blk = bt[(size_t) s * d->max_blocks_per_seq + t0 / BS];
			int nt = len - t0 < BS ? len - t0 : BS;
			const float *kr[BS], *vr[BS];
			kv_pf_next(c, &pf);
			for (int j = 0; j < nt; j++) {
				size_t off = (((size_t) blk * BS + j) * Hkv + kvh) * D;
				if (f32) {
					kr[j] = (const float *) c->kc->ptr + off;
					vr[j] = (const float *) c->vc->ptr + off;
				} else {
					kk__row_f32(kv + (size_t) j * D, c->kc->ptr, c->kc->dtype,
						    off, D);
					kk__row_f32(kv + (size_t) (BS + j) * D, c->vc->ptr,
						    c->vc->dtype, off, D);
					kr[j] = kv + (size_t) j * D;
					vr[j] = kv + (size_t) (BS + j) * D;
				}
			}
			/* One call per block for the scores, the exps (16 lanes)
			 * and P V: per-token calls were a third of stories260K's
			 * engine profile (docs/kernels.md). */
			for (int g = 0; g < grp; g++) {
				float sc[BS], *m = &ml[2 * g], mx = *m;
				kk__dot_rows(sc, qr + g * D, kr, nt, D, c->scale);
				for (int j = 0; j < nt; j++)
					if (sc[j] > mx)
						mx = sc[j];
				if (mx > *m) {
					float corr = expf(*m - mx);
					m[1] *= corr;
					kk__scal(acc + g * D, corr, D);
					*m = mx;
				}
				m[1] += kk__exp_sum(sc, *m, (size_t) nt);
				kk__axpy_rows(acc + g * D, sc, vr, nt, D);
			}
		}
		for (int g = 0; g < grp; g++)
			kk__scal(acc + g * D, 1.0f / ml[2 * g + 1], D);
		kk__row_store(c->out->ptr, c->out->dtype, ((size_t) row * H + kvh * grp) * D, acc,
			      (size_t) grp * D);
	}
	return 0;
}

/* Checks the contexts and block tables, maps query rows to sequences and
 * visible lengths, and runs decode_range over (row, kv head). */
static int paged_run(const kk_paged_desc *d, kk_buffer *out, const kk_buffer *q,
		     const kk_buffer *k_cache, const kk_buffer *v_cache, const int32_t *cu,
		     int64_t rows)
{
	if (d->head_dim > CPU_ATTN_HEAD_DIM_MAX)
		return -EOPNOTSUPP;
	const int32_t *bt = d->block_tables->ptr, *cl = d->context_lens->ptr;

	if (cu && (cu[0] != 0 || cu[d->n_seqs] != rows))
		return -EINVAL;
	for (int s = 0; s < d->n_seqs; s++) {
		int64_t b = cu ? cu[s] : s, e = cu ? cu[s + 1] : s + 1;
		if (cl[s] < 1 || cl[s] > d->max_context_len || b < 0 || e < b || e > rows ||
		    e - b > cl[s])
			return -EINVAL;
		for (int bi = 0; bi < DIV_ROUND_UP(cl[s], KK_KV_BLOCK_SIZE); bi++) {
			int blk = bt[(size_t) s * d->max_blocks_per_seq + bi];
			if (blk < 0 || blk >= d->num_blocks)
				return -ERANGE;
		}
	}
	/* Checked: fill the row maps (no failure past this point). */
	_cleanup_free_ int32_t *row_seq = malloc(sizeof(int32_t) * (size_t) rows);
	_cleanup_free_ int32_t *row_len = malloc(sizeof(int32_t) * (size_t) rows);
	if (!row_seq || !row_len)
		return -ENOMEM;
	for (int s = 0; s < d->n_seqs; s++) {
		int64_t b = cu ? cu[s] : s, e = cu ? cu[s + 1] : s + 1;
		for (int64_t r = b; r < e; r++) {
			row_seq[r] = s;
			row_len[r] = (int32_t) (cl[s] - (e - b) + (r - b) + 1);
		}
	}
	struct decode_ctx c = { .d = d,
				.out = out,
				.q = q,
				.kc = k_cache,
				.vc = v_cache,
				.row_seq = row_seq,
				.row_len = row_len,
				.scale = d->scale > 0 ? d->scale
						      : 1.0f / sqrtf((float) d->head_dim) };
	return kk__parallel_for(rows * d->n_kv_heads,
				(double) d->max_context_len * d->head_dim * 6 *
					(d->n_heads / d->n_kv_heads),
				decode_range, &c);
}

int kk__cpu_attention_decode(kk_backend *be, kk_stream *st, const kk_paged_desc *d, kk_buffer *out,
			     const kk_buffer *q, const kk_buffer *k_cache, const kk_buffer *v_cache)
{
	return paged_run(d, out, q, k_cache, v_cache, NULL, d->n_seqs);
}

int kk__cpu_attention_paged(kk_backend *be, kk_stream *st, const kk_paged_desc *d, kk_buffer *out,
			    const kk_buffer *q, const kk_buffer *k_cache, const kk_buffer *v_cache)
{
	return paged_run(d, out, q, k_cache, v_cache, d->cu_q->ptr, d->total_q);
}

int kk__cpu_kv_cache_write(kk_backend *be, kk_stream *st, kk_buffer *k_cache, kk_buffer *v_cache,
			   const kk_buffer *k, const kk_buffer *v, const kk_buffer *slot_mapping,
			   int64_t n_tokens, int n_kv_heads, int head_dim, int num_blocks)
{
	const int32_t *sm = slot_mapping->ptr;
	size_t row = kk_dtype_size(k->dtype, (size_t) n_kv_heads * head_dim);

	for (int64_t i = 0; i < n_tokens; i++)
		if (sm[i] >= (int64_t) num_blocks * KK_KV_BLOCK_SIZE)
			return -ERANGE;
	for (int64_t i = 0; i < n_tokens; i++) {
		if (sm[i] < 0)
			continue;
		memcpy((char *) k_cache->ptr + (size_t) sm[i] * row,
		       (const char *) k->ptr + i * row, row);
		memcpy((char *) v_cache->ptr + (size_t) sm[i] * row,
		       (const char *) v->ptr + i * row, row);
	}
	return 0;
}
