/* fake-uptime.c — LD_PRELOAD shim for the test cluster's simulated reboots
 * (fake-reboot.sh): sysinfo() reports the uptime as counted from
 * $KILN_FAKE_BOOT (epoch seconds), so a restarted slurmd tells slurmctld it
 * booted after the reboot request, as a node that really rebooted does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include <time.h>

int sysinfo(struct sysinfo *info)
{
	int (*real)(struct sysinfo *) = (int (*)(struct sysinfo *)) dlsym(RTLD_NEXT, "sysinfo");
	int r = real(info);
	const char *b = getenv("KILN_FAKE_BOOT");
	if (r == 0 && b) {
		long up = (long) time(NULL) - atol(b);
		info->uptime = up > 0 ? up : 1;
	}
	return r;
}
