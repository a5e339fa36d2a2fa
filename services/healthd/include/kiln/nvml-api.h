/* kiln/nvml-api.h — our own declarations of the few NVML types and functions
 * kiln-healthd uses.
 *
 * kiln never includes NVIDIA's nvml.h: the daemon loads libnvidia-ml.so.1
 * with dlopen at run time (so one binary runs on machines with and without a
 * driver), and the fake NVML in tests/fake-nvml implements the same symbols.
 * Names, enum values, struct layouts and return codes follow nvml.h (CUDA
 * 12/13); only what kiln calls is declared here. */
#pragma once

#include <stdint.h>

typedef enum nvmlReturn_enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NO_PERMISSION = 4,
	NVML_ERROR_ALREADY_INITIALIZED = 5,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_INSUFFICIENT_POWER = 8,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_IRQ_ISSUE = 11,
	NVML_ERROR_LIBRARY_NOT_FOUND = 12,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
	NVML_ERROR_CORRUPTED_INFOROM = 14,
	NVML_ERROR_GPU_IS_LOST = 15,
	NVML_ERROR_RESET_REQUIRED = 16,
	NVML_ERROR_OPERATING_SYSTEM = 17,
	NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
	NVML_ERROR_IN_USE = 19,
	NVML_ERROR_MEMORY = 20,
	NVML_ERROR_NO_DATA = 21,
	NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef enum nvmlEnableState_enum {
	NVML_FEATURE_DISABLED = 0,
	NVML_FEATURE_ENABLED = 1,
} nvmlEnableState_t;

#define NVML_DEVICE_NAME_V2_BUFFER_SIZE	       96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE	       96
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE     32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE  16
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_NVLINK_MAX_LINKS		       18

typedef struct nvmlPciInfo_st {
	char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
	unsigned long long total, free, used;
} nvmlMemory_t;

/* The layout of nvmlProcessInfo_t used by the _v2 and _v3 entry points. */
typedef struct nvmlProcessInfo_st {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct nvmlEventData_st {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlEventData_t;

#define NVML_TEMPERATURE_GPU		    0
#define NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0
#define NVML_TEMPERATURE_THRESHOLD_SLOWDOWN 1

#define NVML_MEMORY_ERROR_TYPE_CORRECTED   0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC		   0
#define NVML_AGGREGATE_ECC		   1

#define NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS 0
#define NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR		  1

#define NVML_NVLINK_ERROR_DL_REPLAY   0
#define NVML_NVLINK_ERROR_DL_RECOVERY 1
#define NVML_NVLINK_ERROR_DL_CRC_FLIT 2
#define NVML_NVLINK_ERROR_DL_CRC_DATA 3
#define NVML_NVLINK_ERROR_COUNT	      4 /* the counters kiln reads */

#define nvmlEventTypeXidCriticalError 0x0000000000000008LL

/* Clock event ("throttle") reasons, a bit mask. */
#define nvmlClocksEventReasonGpuIdle		     0x0000000000000001ULL
#define nvmlClocksEventReasonSwPowerCap		     0x0000000000000004ULL
#define nvmlClocksThrottleReasonHwSlowdown	     0x0000000000000008ULL
#define nvmlClocksEventReasonSwThermalSlowdown	     0x0000000000000020ULL
#define nvmlClocksThrottleReasonHwThermalSlowdown    0x0000000000000040ULL
#define nvmlClocksThrottleReasonHwPowerBrakeSlowdown 0x0000000000000080ULL
