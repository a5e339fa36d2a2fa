/* kernels/kk/cuda/core.cu — error mapping and small device queries shared by
 * every CUDA kernel file.
 *
 * CUDA, cuBLAS and NCCL each have their own status enum; kiln's convention is
 * -errno, so this file folds all three into a handful of errno values that a
 * caller can act on (out of memory, bad argument, no device, unsupported,
 * generic I/O failure).  Nothing here aborts or logs. */
#include <errno.h>

#include <cublasLt.h>
#include <nccl.h>

#include "kc.h"

extern "C" size_t kc_dtype_size(kc_dtype t)
{
	switch (t) {
	case KC_F32:
		return 4;
	case KC_BF16:
	case KC_F16:
		return 2;
	}
	return 0;
}

extern "C" int kc_errno_cuda(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidMemcpyDirection:
	case cudaErrorInvalidConfiguration:
	case cudaErrorInvalidResourceHandle:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice:
		return -ENODEV;
	case cudaErrorNotSupported:
	case cudaErrorNoKernelImageForDevice:
	case cudaErrorInvalidDeviceFunction:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

extern "C" int kc_errno_cublas(int status)
{
	switch ((cublasStatus_t) status) {
	case CUBLAS_STATUS_SUCCESS:
		return 0;
	case CUBLAS_STATUS_ALLOC_FAILED:
		return -ENOMEM;
	case CUBLAS_STATUS_INVALID_VALUE:
		return -EINVAL;
	case CUBLAS_STATUS_NOT_SUPPORTED:
	case CUBLAS_STATUS_ARCH_MISMATCH:
		return -EOPNOTSUPP;
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return -ENODEV;
	default:
		return -EIO;
	}
}

extern "C" int kc_errno_nccl(int result)
{
	switch ((ncclResult_t) result) {
	case ncclSuccess:
		return 0;
	case ncclInvalidArgument:
	case ncclInvalidUsage:
		return -EINVAL;
	case ncclRemoteError:
		return -ECONNRESET;
	case ncclSystemError:
	case ncclUnhandledCudaError:
	case ncclInternalError:
	default:
		return -EIO;
	}
}

extern "C" int kc_check_launch(void)
{
	return kc_errno_cuda(cudaGetLastError());
}

extern "C" int kc_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		/* Clear the sticky "no device" error so later calls start clean. */
		(void) cudaGetLastError();
		return 0;
	}
	return n;
}
