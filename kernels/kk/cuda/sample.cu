/* kernels/kk/cuda/sample.cu — token sampling on the CUDA backend: greedy,
 * temperature, top-k, top-p, reproducible for a given seed.
 *
 * kk.h defines sampling over the tokens SORTED by probability (ties: lower
 * id first): keep the top_k, then the smallest prefix reaching top_p, then
 * inverse CDF with u = kk_sample_uniform(seed, row).  Instead of sorting a
 * 100k-entry row, this kernel finds every cut by bisection on the logits'
 * order-preserving 32-bit keys (a float's bits, sign-flipped): "the largest
 * key c such that count/mass of tokens with key >= c reaches X" takes 32
 * block-wide reductions, and the sorted order is never materialized.  Ties
 * at a cut share one probability, so how many of them are kept follows
 * from one division.  A kept set is (c, lim): every token with key > c,
 * plus the lim lowest-id tokens with key == c.  The draw then walks the
 * kept set in id order: per-thread kept masses, a scan over the threads,
 * and one thread's walk over its chunk.
 *
 * Launch: one block of KC_SAMPLE_THREADS per row, each thread owning a
 * contiguous chunk of the vocabulary (so "lower id first" is a scan over
 * threads).  About 100 passes over the row: a few hundred microseconds for a
 * 128k vocabulary, fine for decode, not tuned.  Temperature 0 is a plain
 * arg-max reduction.  Probabilities are exp((l - max) / T), unnormalized
 * (the cuts only need ratios).
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <math.h>

#include "kc.h"

#define KC_SAMPLE_THREADS 512

static __device__ __forceinline__ uint32_t kc_key(float f)
{
	uint32_t u = __float_as_uint(f);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float kc_unkey(uint32_t c)
{
	return __uint_as_float((c & 0x80000000u) ? (c & 0x7fffffffu) : ~c);
}

/* kk_sample_uniform() of kk.h, on the device. */
static __device__ __forceinline__ float kc_uniform(uint64_t seed, uint64_t row)
{
	uint64_t z = seed + (row + 1) * 0x9E3779B97F4A7C15ull;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	z ^= z >> 31;
	return (float) (z >> 40) * (1.0f / 16777216.0f);
}

typedef struct kc_srow {
	int64_t lo, hi; /* this thread's chunk [lo, hi) */
	float lmax, inv_t;
} kc_srow;

static __device__ __forceinline__ float kc_p(float l, const kc_srow *r)
{
	return expf((l - r->lmax) * r->inv_t);
}

static __device__ __forceinline__ unsigned long long kc_block_sum_u(unsigned long long v,
								    unsigned long long *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	unsigned long long t = 0;
	for (int w = 0; w < (int) (blockDim.x >> 5); w++)
		t += sh[w];
	__syncthreads();
	return t;
}

/* Count (and mass) of tokens with key >= c (ge) or == c (!ge). */
template <typename T>
static __device__ void kc_count_mass(const T *x, const kc_srow *r, uint32_t c, int ge,
				     unsigned long long *cnt, float *mass, float *shf,
				     unsigned long long *shu)
{
	unsigned long long n = 0;
	float m = 0.0f;
	for (int64_t i = r->lo; i < r->hi; i++) {
		float l = kc_ld(x, i);
		uint32_t k = kc_key(l);
		if (ge ? k >= c : k == c) {
			n++;
			if (mass)
				m += kc_p(l, r);
		}
	}
	if (cnt)
		*cnt = kc_block_sum_u(n, shu);
	if (mass)
		*mass = kc_block_sum(m, shf);
}

template <typename T>
static __device__ float kc_mass_ge(const T *x, const kc_srow *r, uint32_t c, float *shf,
				   unsigned long long *shu)
{
	float m;
	kc_count_mass(x, r, c, 1, NULL, &m, shf, shu);
	return m;
}

/* Mass of the kept set (c, lim) restricted to keys >= x (x >= c). */
template <typename T>
static __device__ float kc_kept_mass_ge(const T *xs, const kc_srow *r, uint32_t c,
					unsigned long long lim, uint32_t x, float *shf,
					unsigned long long *shu)
{
	if (x > c)
		return kc_mass_ge(xs, r, x, shf, shu);
	float above = c == 0xffffffffu ? 0.0f : kc_mass_ge(xs, r, c + 1, shf, shu);
	/* lim == 0: no ties kept (and c may not even be a finite float's key). */
	return lim ? above + (float) lim * kc_p(kc_unkey(c), r) : above;
}

template <typename T>
__global__ void __launch_bounds__(KC_SAMPLE_THREADS)
	kc_sample_kernel(const T *logits, int64_t ld, int64_t vocab, float temperature, int top_k,
			 float top_p, uint64_t seed, int32_t *ids)
{
	__shared__ float shf[33];
	__shared__ unsigned long long shu[32];
	__shared__ float s_bv[32];
	__shared__ int64_t s_bi[32];
	const T *x = logits + (size_t) blockIdx.x * ld;
	kc_srow r;
	int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
	r.lo = min((int64_t) threadIdx.x * chunk, vocab);
	r.hi = min(r.lo + chunk, vocab);

	/* Arg-max (lowest id on ties): needed by greedy, and lmax by the rest. */
	float bv = -INFINITY;
	int64_t bi = vocab;
	for (int64_t i = r.lo; i < r.hi; i++) {
		float l = kc_ld(x, i);
		if (bi == vocab || l > bv) {
			bv = l;
			bi = i;
		}
	}
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (ov > bv || (ov == bv && oi < bi)) {
			bv = ov;
			bi = oi;
		}
	}
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	if (lane == 0) {
		s_bv[wid] = bv;
		s_bi[wid] = bi;
	}
	__syncthreads();
	bv = s_bv[0];
	bi = s_bi[0];
	for (int w = 1; w < (int) (blockDim.x >> 5); w++)
		if (s_bv[w] > bv || (s_bv[w] == bv && s_bi[w] < bi)) {
			bv = s_bv[w];
			bi = s_bi[w];
		}
	if (temperature == 0.0f || top_k == 1) {
		if (threadIdx.x == 0)
			ids[blockIdx.x] = (int32_t) (bi < vocab ? bi : 0);
		return;
	}
	r.lmax = bv;
	r.inv_t = 1.0f / temperature;

	/* S0: everything. */
	unsigned long long lim, cnt;
	uint32_t c = 0;
	kc_count_mass(x, &r, 0, 0, &lim, NULL, shf, shu);
	float z = kc_kept_mass_ge(x, &r, c, lim, c, shf, shu);

	/* Top-k: the largest key c with count(key >= c) >= K. */
	if (top_k > 0 && top_k < vocab) {
		uint32_t lo = 0, hi = 0xffffffffu;
		while (lo < hi) {
			uint32_t mid = (uint32_t) (((uint64_t) lo + hi + 1) / 2);
			kc_count_mass(x, &r, mid, 1, &cnt, NULL, shf, shu);
			if (cnt >= (unsigned long long) top_k)
				lo = mid;
			else
				hi = mid - 1;
		}
		c = lo;
		unsigned long long above = 0;
		if (c != 0xffffffffu)
			kc_count_mass(x, &r, c + 1, 1, &above, NULL, shf, shu);
		lim = (unsigned long long) top_k - above;
		z = kc_kept_mass_ge(x, &r, c, lim, c, shf, shu);
	}

	/* Top-p: the largest key c' >= c whose kept mass at or above reaches
	 * top_p * z; then as many ties at c' as needed. */
	if (top_p > 0.0f && top_p < 1.0f) {
		float target = top_p * z;
		uint32_t lo = c, hi = 0xffffffffu;
		while (lo < hi) {
			uint32_t mid = (uint32_t) (((uint64_t) lo + hi + 1) / 2);
			if (kc_kept_mass_ge(x, &r, c, lim, mid, shf, shu) >= target)
				lo = mid;
			else
				hi = mid - 1;
		}
		uint32_t cp = lo;
		unsigned long long avail = lim;
		if (cp != c)
			kc_count_mass(x, &r, cp, 0, &avail, NULL, shf, shu);
		float above = cp == 0xffffffffu ? 0.0f : kc_mass_ge(x, &r, cp + 1, shf, shu);
		float pc = avail ? kc_p(kc_unkey(cp), &r) : 0.0f;
		float need = pc > 0.0f ? ceilf((target - above) / pc) : 1.0f;
		unsigned long long m = need < 1.0f ? 1ull : (unsigned long long) need;
		c = cp;
		lim = m < avail ? m : avail;
		z = above + (float) lim * pc;
	}

	/* Inverse CDF in id order (kk.h says why): each thread's kept mass
	 * over its chunk (a tie at c is kept while its rank by id is below
	 * lim), an exclusive scan over the threads (they hold the ids in
	 * order), then the one thread whose interval holds u * total walks its
	 * chunk again.  The scan's own sums bound the intervals, so exactly
	 * one thread owns the draw; rounding past the total takes the last
	 * kept token, as the cpu backend does. */
	__shared__ unsigned long long s_cnt[KC_SAMPLE_THREADS];
	__shared__ float s_mass[KC_SAMPLE_THREADS];
	__shared__ int64_t s_last[KC_SAMPLE_THREADS];
	__shared__ float s_total;
	__shared__ int64_t s_lastk;
	unsigned long long ties = 0;
	for (int64_t i = r.lo; i < r.hi; i++)
		ties += kc_key(kc_ld(x, i)) == c;
	s_cnt[threadIdx.x] = ties;
	__syncthreads();
	if (threadIdx.x == 0) {
		unsigned long long run = 0;
		for (int t = 0; t < (int) blockDim.x; t++) {
			unsigned long long v = s_cnt[t];
			s_cnt[t] = run;
			run += v;
		}
	}
	__syncthreads();
	const unsigned long long rank0 = s_cnt[threadIdx.x];
	unsigned long long rank = rank0;
	float m = 0.0f;
	int64_t last = -1;
	for (int64_t i = r.lo; i < r.hi; i++) {
		float l = kc_ld(x, i);
		uint32_t k = kc_key(l);
		if (k > c || (k == c && rank++ < lim)) {
			m += kc_p(l, &r);
			last = i;
		}
	}
	s_mass[threadIdx.x] = m;
	s_last[threadIdx.x] = last;
	__syncthreads();
	if (threadIdx.x == 0) {
		float run = 0.0f;
		int64_t lk = -1;
		for (int t = 0; t < (int) blockDim.x; t++) {
			float v = s_mass[t];
			s_mass[t] = run;
			run += v;
			if (s_last[t] >= 0)
				lk = s_last[t];
		}
		s_total = run;
		s_lastk = lk;
	}
	__syncthreads();
	const float target = kc_uniform(seed, blockIdx.x) * s_total;
	const float base = s_mass[threadIdx.x];
	if (threadIdx.x == 0 && !(target < s_total))
		ids[blockIdx.x] = (int32_t) (s_lastk >= 0 ? s_lastk : 0);
	if (m > 0.0f && target >= base && target < base + m) {
		float cum = base;
		int64_t pick = last;
		rank = rank0;
		for (int64_t i = r.lo; i < r.hi; i++) {
			float l = kc_ld(x, i);
			uint32_t k = kc_key(l);
			if (k > c || (k == c && rank++ < lim)) {
				cum += kc_p(l, &r);
				if (cum > target) {
					pick = i;
					break;
				}
			}
		}
		ids[blockIdx.x] = (int32_t) pick;
	}
}

template <typename T>
static int kc_sample_t(cudaStream_t s, int32_t *ids, const void *logits, int64_t rows,
		       int64_t vocab, const kk_sampling *p)
{
	if (rows > INT32_MAX)
		return -EOPNOTSUPP;
	kc_sample_kernel<T><<<(unsigned) rows, KC_SAMPLE_THREADS, 0, s>>>(
		(const T *) logits, vocab, vocab, p->temperature, p->top_k, p->top_p, p->seed, ids);
	return kc_check_launch();
}

extern "C" int kc_op_sample(kk_backend *be, kk_stream *st, kk_buffer *ids, const kk_buffer *logits,
			    int64_t rows, int64_t vocab, const kk_sampling *p)
{
	if (rows == 0)
		return 0;
	return KC_DISPATCH(kc_dt(logits->dtype), kc_sample_t, kc_stream(be, st),
			   (int32_t *) ids->ptr, logits->ptr, rows, vocab, p);
}
