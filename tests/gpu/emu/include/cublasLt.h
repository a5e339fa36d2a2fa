/* tests/gpu/emu/include/cublasLt.h — a naive reference cuBLASLt for
 * the CPU emulation of kernels/kk/cuda/: column-major D = act(alpha op(A) op(B)
 * + beta C + bias) with the layouts, transposes, strided batches and BIAS /
 * GELU epilogues gemm.cu sets.  It checks that the layouts are
 * consistent (rows/cols against the transposes) and returns
 * CUBLAS_STATUS_INVALID_VALUE when they are not, which is the point: the
 * row-major to column-major mapping of gemm.cu is exercised for real. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime.h"

typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_ARCH_MISMATCH = 8,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum {
	CUBLASLT_EPILOGUE_DEFAULT = 1,
	CUBLASLT_EPILOGUE_BIAS = 4,
	CUBLASLT_EPILOGUE_GELU = 32,
	CUBLASLT_EPILOGUE_GELU_BIAS = 36,
} cublasLtEpilogue_t;
typedef enum {
	CUBLASLT_MATMUL_DESC_TRANSA,
	CUBLASLT_MATMUL_DESC_TRANSB,
	CUBLASLT_MATMUL_DESC_EPILOGUE,
	CUBLASLT_MATMUL_DESC_BIAS_POINTER,
	CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
} cublasLtMatmulDescAttributes_t;
typedef enum {
	CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
	CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
} cublasLtMatrixLayoutAttribute_t;
typedef enum {
	CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
} cublasLtMatmulPreferenceAttributes_t;

typedef struct kc_emu_lt *cublasLtHandle_t;
typedef struct kc_emu_desc *cublasLtMatmulDesc_t;
typedef struct kc_emu_layout *cublasLtMatrixLayout_t;
typedef struct kc_emu_pref *cublasLtMatmulPreference_t;
typedef struct {
	int id;
} cublasLtMatmulAlgo_t;
typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
} cublasLtMatmulHeuristicResult_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c,
					cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
					      cublasLtMatmulDescAttributes_t a, const void *v,
					      size_t n);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t,
					  uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
						cublasLtMatrixLayoutAttribute_t a, const void *v,
						size_t n);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
						    cublasLtMatmulPreferenceAttributes_t a,
						    const void *v, size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
					      cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
					      cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
					      cublasLtMatmulPreference_t p, int req,
					      cublasLtMatmulHeuristicResult_t *res, int *count);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
			      const void *a, cublasLtMatrixLayout_t la, const void *b,
			      cublasLtMatrixLayout_t lb, const void *beta, const void *c,
			      cublasLtMatrixLayout_t lc, void *dd, cublasLtMatrixLayout_t ld,
			      const cublasLtMatmulAlgo_t *algo, void *ws, size_t wss,
			      cudaStream_t s);
