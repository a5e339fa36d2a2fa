/* fake-nvml-old.c — the fake NVML as an older driver would export it: no
 * _v2/_v3 entry points, no nvmlDeviceGetCurrentClocksEventReasons, no
 * nvmlDeviceGetRemappedRows.  Tests use it to check that kiln-healthd falls
 * back to older symbol names and disables only the check it cannot run. */
#define FAKE_NVML_OLD 1
#include "fake-nvml.c"
