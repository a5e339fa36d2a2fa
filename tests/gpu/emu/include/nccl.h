/* tests/gpu/emu/include/nccl.h — single-rank NCCL for the CPU
 * emulation of kernels/kk/cuda/ (every collective of one rank is a copy). */
#pragma once
#include <stddef.h>

#include "cuda_runtime.h"

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
} ncclResult_t;
typedef struct {
	char internal[128];
} ncclUniqueId;
typedef struct kc_emu_comm *ncclComm_t;
typedef enum { ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclMax = 3, ncclAvg = 4 } ncclRedOp_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int world, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t c);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o,
			   ncclComm_t c, cudaStream_t st);
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o,
			       ncclComm_t c, cudaStream_t st);
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c,
			   cudaStream_t st);
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
			   ncclComm_t c, cudaStream_t st);
