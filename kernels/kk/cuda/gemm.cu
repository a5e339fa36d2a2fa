/* kernels/kk/cuda/gemm.cu — GEMM on the CUDA backend through cuBLASLt.
 *
 * kiln's matrices are row-major; cuBLASLt is column-major.  A row-major
 * M x N matrix is the column-major N x M matrix with the same leading
 * dimension, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the
 * operands swap places and M/N swap roles, with no copy.  The bias (per
 * column of row-major C) then lies along cuBLASLt's rows, which is what its
 * BIAS epilogue adds.
 *
 * Epilogues: BIAS, GELU and GELU_BIAS (tanh-approximated GELU) come from
 * cuBLASLt; SiLU has no cuBLASLt epilogue, so a small bias+activation kernel
 * runs after the GEMM on the same stream.  The same kernel is the fallback
 * when cuBLASLt's heuristic finds no algorithm for a requested epilogue.
 * The activation applies to alpha*AB + beta*C + bias.
 *
 * Accumulation is f32 for every input type (CUBLAS_COMPUTE_32F, no TF32).
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "kc.h"

/* Workspace for cuBLASLt's split-K and stream-K algorithms; 32 MiB is what
 * cuBLAS recommends for Hopper. */
#define KC_BLAS_WORKSPACE (32u << 20)

/* Matmul descriptors, layouts and the heuristic's algorithm per shape
 * (kc_lt_key), so a repeated GEMM skips ~10 descriptor calls and the
 * heuristic (a few us each on small shapes).  A model has a few dozen
 * distinct GEMMs; beyond KC_LT_CACHE entries the oldest is replaced. */
#define KC_LT_CACHE 64

typedef struct kc_lt_descs {
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulPreference_t pref;
} kc_lt_descs;

/* Everything the descriptors and the algorithm depend on (zeroed first, so
 * memcmp sees no padding).  The bias pointer is not in it: it is set on the
 * cached descriptor per call. */
typedef struct kc_lt_key {
	int abt, ct, ta, tb, epi, has_bias, bias_t;
	uint32_t al_a, al_b, al_c;
	int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
} kc_lt_key;

typedef struct kc_lt_entry {
	bool valid;
	kc_lt_key key;
	kc_lt_descs d;
	cublasLtMatmulAlgo_t algo;
} kc_lt_entry;

struct kc_blas {
	cublasLtHandle_t lt;
	void *ws;
	size_t ws_size;
	pthread_mutex_t lock; /* the cache, and a cached descriptor's bias pointer until enqueued */
	unsigned next;	      /* round-robin replacement */
	kc_lt_entry cache[KC_LT_CACHE];
};

static void kc_lt_descs_free(kc_lt_descs *d);

extern "C" int kc_blas_new(kc_blas **ret)
{
	kc_blas *b = (kc_blas *) calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	int r = kc_errno_cublas(cublasLtCreate(&b->lt));
	if (r < 0) {
		free(b);
		return r;
	}
	r = kc_errno_cuda(cudaMalloc(&b->ws, KC_BLAS_WORKSPACE));
	if (r < 0) {
		cublasLtDestroy(b->lt);
		free(b);
		return r;
	}
	b->ws_size = KC_BLAS_WORKSPACE;
	pthread_mutex_init(&b->lock, NULL);
	*ret = b;
	return 0;
}

extern "C" void kc_blas_free(kc_blas *b)
{
	if (!b)
		return;
	for (int i = 0; i < KC_LT_CACHE; i++)
		if (b->cache[i].valid)
			kc_lt_descs_free(&b->cache[i].d);
	pthread_mutex_destroy(&b->lock);
	cudaFree(b->ws);
	cublasLtDestroy(b->lt);
	free(b);
}

/* ---- kernels ------------------------------------------------------------ */

static __device__ __forceinline__ float kc_gelu_tanh(float x)
{
	const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
	return 0.5f * x * (1.0f + tanhf(k0 * (x + 0.044715f * x * x * x)));
}

/* y = act(pre * y + bias) over a batch of row-major m x n matrices.  pre is
 * beta on the k == 0 path (cuBLASLt rejects k = 0), else 1; with pre == 0
 * y is not read. */
template <typename T, typename TB>
__global__ void kc_bias_act_kernel(T *y, const TB *bias, float pre, int act, int64_t m, int64_t n,
				   int64_t ldy, int64_t stride, int64_t batch)
{
	size_t total = (size_t) batch * m * n;
	for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < total;
	     i += (size_t) gridDim.x * blockDim.x) {
		size_t col = i % n, row = (i / n) % m, b = i / ((size_t) m * n);
		size_t off = b * stride + row * ldy + col;
		float v = pre == 0.0f ? 0.0f : pre * kc_ld(y, off);
		if (bias)
			v += kc_ld(bias, col);
		if (act == KC_ACT_GELU)
			v = kc_gelu_tanh(v);
		else if (act == KC_ACT_SILU)
			v = v / (1.0f + expf(-v));
		kc_st(y, off, v);
	}
}

template <typename T>
static int kc_bias_act(cudaStream_t s, void *y, const void *bias, kc_dtype bias_dt, float pre,
		       int act, int64_t m, int64_t n, int64_t ldy, int64_t stride, int64_t batch)
{
	size_t total = (size_t) batch * m * n;
	unsigned g = kc_grid(total, 256);
	if (bias && bias_dt == KC_F32)
		kc_bias_act_kernel<T, float><<<g, 256, 0, s>>>((T *) y, (const float *) bias, pre,
							       act, m, n, ldy, stride, batch);
	else
		kc_bias_act_kernel<T, T><<<g, 256, 0, s>>>((T *) y, (const T *) bias, pre, act, m,
							   n, ldy, stride, batch);
	return kc_check_launch();
}

/* ---- launcher ----------------------------------------------------------- */

static unsigned kc_align_of(const void *p)
{
	uintptr_t a = (uintptr_t) p;
	unsigned al = 256;
	while (al > 1 && (a & (al - 1)))
		al >>= 1;
	return al;
}

static void kc_lt_descs_free(kc_lt_descs *d)
{
	if (d->pref)
		cublasLtMatmulPreferenceDestroy(d->pref);
	if (d->lc)
		cublasLtMatrixLayoutDestroy(d->lc);
	if (d->lb)
		cublasLtMatrixLayoutDestroy(d->lb);
	if (d->la)
		cublasLtMatrixLayoutDestroy(d->la);
	if (d->op)
		cublasLtMatmulDescDestroy(d->op);
}

static int kc_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols,
		     int64_t ld, int batch, int64_t stride)
{
	int r = kc_errno_cublas(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
	if (r < 0)
		return r;
	if (batch > 1) {
		int32_t bc = batch;
		r = kc_errno_cublas(cublasLtMatrixLayoutSetAttribute(
			*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
		if (r < 0)
			return r;
		r = kc_errno_cublas(cublasLtMatrixLayoutSetAttribute(
			*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
	}
	return r;
}

/* One cuBLASLt matmul with the given epilogue; -EOPNOTSUPP when the
 * heuristic has no algorithm for it (the caller then falls back). */
static int kc_lt_run(kc_blas *h, cudaStream_t s, cudaDataType_t abt, cudaDataType_t ct, int trans_a,
		     int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
		     int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
		     float beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch,
		     cublasLtEpilogue_t epi, const void *bias, cudaDataType_t bias_t)
{
	kc_lt_descs d = {};
	int r;
	/* cuBLASLt's operand 1 is our B, operand 2 our A (see the top). */
	cublasOperation_t t1 = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t t2 = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;

	kc_lt_key key;
	memset(&key, 0, sizeof(key));
	key.abt = abt;
	key.ct = ct;
	key.ta = trans_a;
	key.tb = trans_b;
	key.epi = epi;
	key.has_bias = bias != NULL;
	key.bias_t = bias ? bias_t : 0;
	key.al_a = kc_align_of(b);
	key.al_b = kc_align_of(a);
	key.al_c = kc_align_of(c);
	key.m = m;
	key.n = n;
	key.k = k;
	key.lda = lda;
	key.ldb = ldb;
	key.ldc = ldc;
	key.sa = stride_a;
	key.sb = stride_b;
	key.sc = stride_c;
	key.batch = batch;

	pthread_mutex_lock(&h->lock);
	for (int i = 0; i < KC_LT_CACHE; i++) {
		kc_lt_entry *e = &h->cache[i];
		if (!e->valid || memcmp(&e->key, &key, sizeof(key)) != 0)
			continue;
		r = 0;
		if (bias)
			r = kc_errno_cublas(cublasLtMatmulDescSetAttribute(
				e->d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
		if (r >= 0)
			r = kc_errno_cublas(cublasLtMatmul(h->lt, e->d.op, &alpha, b, e->d.la, a,
							   e->d.lb, &beta, c, e->d.lc, c, e->d.lc,
							   &e->algo, h->ws, h->ws_size, s));
		pthread_mutex_unlock(&h->lock);
		return r;
	}

	r = kc_errno_cublas(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	if (r < 0)
		goto out;
	r = kc_errno_cublas(
		cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &t1, sizeof(t1)));
	if (r < 0)
		goto out;
	r = kc_errno_cublas(
		cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &t2, sizeof(t2)));
	if (r < 0)
		goto out;
	if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
		r = kc_errno_cublas(cublasLtMatmulDescSetAttribute(
			d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
		if (r < 0)
			goto out;
	}
	if (bias) {
		r = kc_errno_cublas(cublasLtMatmulDescSetAttribute(
			d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
		if (r < 0)
			goto out;
		r = kc_errno_cublas(cublasLtMatmulDescSetAttribute(
			d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof(bias_t)));
		if (r < 0)
			goto out;
	}
	/* Operand 1 = B: rows N (trans_b 0) or K (trans_b 1) of its
	 * column-major view; operand 2 = A likewise; D is N x M. */
	r = kc_layout(&d.la, abt, trans_b ? k : n, trans_b ? n : k, ldb, batch, stride_b);
	if (r < 0)
		goto out;
	r = kc_layout(&d.lb, abt, trans_a ? m : k, trans_a ? k : m, lda, batch, stride_a);
	if (r < 0)
		goto out;
	r = kc_layout(&d.lc, ct, n, m, ldc, batch, stride_c);
	if (r < 0)
		goto out;

	r = kc_errno_cublas(cublasLtMatmulPreferenceCreate(&d.pref));
	if (r < 0)
		goto out;
	{
		uint64_t ws = h->ws_size;
		uint32_t al_a = kc_align_of(b), al_b = kc_align_of(a), al_c = kc_align_of(c);
		cublasLtMatmulPreferenceSetAttribute(
			d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
		cublasLtMatmulPreferenceSetAttribute(
			d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
		cublasLtMatmulPreferenceSetAttribute(
			d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
		cublasLtMatmulPreferenceSetAttribute(
			d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
		cublasLtMatmulPreferenceSetAttribute(
			d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));

		cublasLtMatmulHeuristicResult_t res = {};
		int count = 0;
		cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h->lt, d.op, d.la, d.lb, d.lc,
								   d.lc, d.pref, 1, &res, &count);
		if (st == CUBLAS_STATUS_NOT_SUPPORTED ||
		    (st == CUBLAS_STATUS_SUCCESS && count == 0)) {
			r = -EOPNOTSUPP;
			goto out;
		}
		r = kc_errno_cublas(st);
		if (r < 0)
			goto out;
		r = kc_errno_cublas(cublasLtMatmul(h->lt, d.op, &alpha, b, d.la, a, d.lb, &beta, c,
						   d.lc, c, d.lc, &res.algo, h->ws, h->ws_size, s));
		if (r >= 0) {
			kc_lt_entry *e = &h->cache[h->next++ % KC_LT_CACHE];
			if (e->valid)
				kc_lt_descs_free(&e->d);
			e->key = key;
			e->d = d;
			e->algo = res.algo;
			e->valid = true;
			memset(&d, 0, sizeof(d)); /* the cache owns them now */
		}
	}
out:
	kc_lt_descs_free(&d);
	pthread_mutex_unlock(&h->lock);
	return r;
}

static int kc_cuda_type(kc_dtype t, cudaDataType_t *ret)
{
	if (t != KC_F32 && t != KC_BF16 && t != KC_F16)
		return -EOPNOTSUPP;
	*ret = t == KC_F32 ? CUDA_R_32F : t == KC_BF16 ? CUDA_R_16BF : CUDA_R_16F;
	return 0;
}

extern "C" int kc_gemm(kc_blas *h, cudaStream_t s, kc_dtype ab_dt, kc_dtype c_dt, int trans_a,
		       int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
		       int64_t lda, int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
		       float beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch,
		       const void *bias, kc_dtype bias_dt, int act)
{
	cudaDataType_t abt, ct, bt = CUDA_R_32F;
	int r;

	if (!h || m < 0 || n < 0 || k < 0 || !c)
		return -EINVAL;
	if (batch < 1)
		batch = 1;
	if (act != KC_ACT_NONE && act != KC_ACT_GELU && act != KC_ACT_SILU)
		return -EINVAL;
	r = kc_cuda_type(ab_dt, &abt);
	if (r < 0)
		return r;
	r = kc_cuda_type(c_dt, &ct);
	if (r < 0)
		return r;
	if (bias) {
		r = kc_cuda_type(bias_dt, &bt);
		if (r < 0)
			return r;
	}
	if (m == 0 || n == 0)
		return 0;
	if (k == 0) /* cuBLASLt rejects k = 0: C = act(beta C + bias). */
		return KC_DISPATCH(c_dt, kc_bias_act, s, c, bias, bias_dt, beta, act, m, n, ldc,
				   stride_c, batch);

	/* The bias is fused into cuBLASLt's epilogue only in D's type.  An
	 * f32 bias on a bf16/f16 D (kk_qgemm's f32 bias on 16-bit
	 * activations) failed there on an H100 (cuBLASLt 13.0) with -EINVAL;
	 * it is added with the activation by kc_bias_act after a plain GEMM,
	 * as is any epilogue cuBLASLt has no algorithm for. */
	bool unfused = bias && bias_dt != c_dt;
	cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
	if (!unfused && act == KC_ACT_GELU)
		epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
	else if (!unfused && bias)
		epi = CUBLASLT_EPILOGUE_BIAS; /* SiLU: bias fused here, SiLU after */

	r = kc_lt_run(h, s, abt, ct, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
		      stride_b, beta, c, ldc, stride_c, batch, epi, unfused ? NULL : bias, bt);
	if (r == -EOPNOTSUPP && epi != CUBLASLT_EPILOGUE_DEFAULT) {
		r = kc_lt_run(h, s, abt, ct, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b,
			      ldb, stride_b, beta, c, ldc, stride_c, batch,
			      CUBLASLT_EPILOGUE_DEFAULT, NULL, bt);
		unfused = true;
	}
	if (r < 0)
		return r;
	if (unfused)
		return KC_DISPATCH(c_dt, kc_bias_act, s, c, bias, bias_dt, 1.0f, act, m, n, ldc,
				   stride_c, batch);
	if (act == KC_ACT_SILU)
		return KC_DISPATCH(c_dt, kc_bias_act, s, c, NULL, bias_dt, 1.0f, KC_ACT_SILU, m, n,
				   ldc, stride_c, batch);
	return 0;
}

extern "C" int kc_op_gemm(kk_backend *be, kk_stream *st, const kk_gemm_desc *d)
{
	kc_ctx *ctx = (kc_ctx *) be->ctx;
	int act = d->epilogue == KK_EPI_GELU   ? KC_ACT_GELU
		  : d->epilogue == KK_EPI_SILU ? KC_ACT_SILU
					       : KC_ACT_NONE;
	return kc_gemm(ctx->blas, kc_stream(be, st), kc_dt(d->a->dtype), kc_dt(d->c->dtype),
		       d->trans_a, d->trans_b, d->m, d->n, d->k, d->alpha, d->a->ptr, d->lda,
		       d->stride_a, d->b->ptr, d->ldb, d->stride_b, d->beta, d->c->ptr, d->ldc,
		       d->stride_c, d->batch, d->bias ? d->bias->ptr : NULL,
		       d->bias ? kc_dt(d->bias->dtype) : KC_F32, act);
}
