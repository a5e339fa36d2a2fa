/* fake-nvml.c — a fake libnvidia-ml.so.1 that plays a scripted scenario.
 *
 * kiln-healthd loads libnvidia-ml.so.1 with dlopen; tests point it at this
 * library instead (LD_LIBRARY_PATH or health.nvml_library) so the real daemon
 * runs unchanged on machines without a GPU.  The scenario is a libconfig file
 * named by KILN_FAKE_NVML_SCENARIO:
 *
 *   gpus = ( { model = "NVIDIA H100 80GB HBM3"; uuid = "GPU-..."; pci_bus_id = "...";
 *              temperature = 45; power_w = 310.0; ... }, ... );
 *   events = ( { at = 2.0; gpu = 1; xid = 79; },
 *              { at = 3.0; gpu = 0; set = { temperature = 95; }; },
 *              { at = 4.0; gpu = 2; lost = true; },
 *              { at = 5.0; gpu = 3; hang = "nvmlDeviceGetPowerUsage"; } );
 *
 * `at` is seconds since nvmlInit.  Events fire lazily: every API entry point
 * (and nvmlEventSetWait_v2 while it waits) applies the events that are due.
 * A "hang" makes that function (or "*" = every function) on that GPU block
 * until the process exits, as a wedged driver does.  If KILN_FAKE_NVML_LOG
 * names a file, nvmlInit and every fired event append a line with the
 * CLOCK_REALTIME time, so tests can measure latency from injection.
 * KILN_FAKE_NVML_HANG_INIT=1 makes nvmlInit itself hang.  If
 * KILN_FAKE_NVML_CONSTRUCTOR_MARK names a file, the library's constructor
 * writes "uid N" there as soon as it is loaded: what a planted .so could
 * do as root (the path-trust tests show it never runs).  An nvmlInit that
 * finds KILN_FAKE_NVML_SCENARIO naming another file than the loaded one
 * loads that one (and its clock starts again).
 *
 * The GPU fields are the knobs kiln-healthd's checks react to: every row of
 * its check table (services/healthd/check.c) names the setting here that
 * trips it ("temperature = 95;", "remap_failure = true;", "lost = true;",
 * "hang = ...;"), and tests/healthd/test-healthd.c runs each one through the
 * real sampler.  A new check that reads a new NVML value adds its field to
 * struct fake_gpu and fields[], and the entry point that returns it.
 *
 * Built twice: the normal library, and with FAKE_NVML_OLD an "old driver"
 * that lacks the newest symbol names (callers must fall back) and
 * nvmlDeviceGetRemappedRows (callers must disable that one check).  Names,
 * signatures and return codes are NVML's. */
#include <libconfig.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/nvml-api.h"

/* Runs at dlopen, before any NVML call: the code a hostile library gets to
 * run in whoever loads it. */
__attribute__((constructor)) static void fake_nvml_loaded(void)
{
	const char *mark = getenv("KILN_FAKE_NVML_CONSTRUCTOR_MARK");
	FILE *f = mark && *mark ? fopen(mark, "w") : NULL;
	if (f) {
		fprintf(f, "uid %u\n", (unsigned) geteuid());
		fclose(f);
	}
}

#define EXPORT		__attribute__((visibility("default")))
#define FAKE_MAX_GPUS	64
#define FAKE_MAX_EVENTS 256
#define FAKE_MAX_PROCS	16
#define FAKE_QUEUE	256

struct fake_gpu {
	char model[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	char pci_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
	long long temperature, slowdown_temperature, shutdown_temperature;
	double power_w, power_limit_w;
	long long clock_event_reasons;
	long long ecc_sbe_volatile, ecc_dbe_volatile, ecc_sbe_aggregate, ecc_dbe_aggregate;
	long long retired_sbe, retired_dbe;
	bool retired_pending;
	long long remapped_correctable, remapped_uncorrectable;
	bool remap_pending, remap_failure;
	long long pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pcie_replay;
	long long nvlinks, nvlinks_down;
	long long nvlink_replay, nvlink_recovery, nvlink_crc_flit, nvlink_crc_data;
	bool persistence, ecc_supported;
	long long memory_total_mib, memory_used_mib;
	long long processes[FAKE_MAX_PROCS];
	int n_processes;
	/* scripted faults */
	bool lost;
	char hang[96];
};

enum { T_INT, T_DOUBLE, T_BOOL, T_STR };
struct field {
	const char *name;
	int type;
	size_t off, size;
};
#define F(n, t)                                                                         \
	{                                                                               \
#n, t, offsetof(struct fake_gpu, n), sizeof(((struct fake_gpu *) 0)->n) \
	}
static const struct field fields[] = {
	F(model, T_STR),
	F(uuid, T_STR),
	F(pci_bus_id, T_STR),
	F(temperature, T_INT),
	F(slowdown_temperature, T_INT),
	F(shutdown_temperature, T_INT),
	F(power_w, T_DOUBLE),
	F(power_limit_w, T_DOUBLE),
	F(clock_event_reasons, T_INT),
	F(ecc_sbe_volatile, T_INT),
	F(ecc_dbe_volatile, T_INT),
	F(ecc_sbe_aggregate, T_INT),
	F(ecc_dbe_aggregate, T_INT),
	F(retired_sbe, T_INT),
	F(retired_dbe, T_INT),
	F(retired_pending, T_BOOL),
	F(remapped_correctable, T_INT),
	F(remapped_uncorrectable, T_INT),
	F(remap_pending, T_BOOL),
	F(remap_failure, T_BOOL),
	F(pcie_gen, T_INT),
	F(pcie_gen_max, T_INT),
	F(pcie_width, T_INT),
	F(pcie_width_max, T_INT),
	F(pcie_replay, T_INT),
	F(nvlinks, T_INT),
	F(nvlinks_down, T_INT),
	F(nvlink_replay, T_INT),
	F(nvlink_recovery, T_INT),
	F(nvlink_crc_flit, T_INT),
	F(nvlink_crc_data, T_INT),
	F(persistence, T_BOOL),
	F(ecc_supported, T_BOOL),
	F(memory_total_mib, T_INT),
	F(memory_used_mib, T_INT),
	F(lost, T_BOOL),
	F(hang, T_STR),
};

struct fake_event {
	double at;
	int gpu;
	int xid;	       /* > 0: deliver an XID event */
	config_setting_t *set; /* fields to change (owned by cfg) */
	bool lost;
	char hang[96];
	bool fired;
};

struct fake_eventset {
	unsigned long long mask[FAKE_MAX_GPUS];
	struct {
		int gpu;
		int xid;
	} q[FAKE_QUEUE];
	unsigned head, tail;
	struct fake_eventset *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static config_t cfg;
static bool loaded, cfg_inited;
static char loaded_path[4096];
static int init_count;
static double t0;
static struct fake_gpu gpus[FAKE_MAX_GPUS];
static int n_gpus;
static struct fake_event events[FAKE_MAX_EVENTS];
static int n_events;
static struct fake_eventset *eventsets;

static const char *strempty_(const char *s)
{
	return s ? s : "";
}

static double now_s(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...)
{
	const char *p = getenv("KILN_FAKE_NVML_LOG");
	if (!p || !*p)
		return;
	FILE *f = fopen(p, "ae");
	if (!f)
		return;
	fprintf(f, "%.6f %d ", now_s(CLOCK_REALTIME), (int) getpid());
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

static void set_defaults(struct fake_gpu *g, int i)
{
	memset(g, 0, sizeof(*g));
	snprintf(g->model, sizeof(g->model), "NVIDIA H100 80GB HBM3");
	snprintf(g->uuid, sizeof(g->uuid), "GPU-00000000-0000-4000-8000-%012d", i);
	snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "00000000:%02X:00.0", 0x18 + i * 0x10);
	g->temperature = 40;
	g->slowdown_temperature = 90;
	g->shutdown_temperature = 92 + 3;
	g->power_w = 120.0;
	g->power_limit_w = 700.0;
	g->pcie_gen = g->pcie_gen_max = 5;
	g->pcie_width = g->pcie_width_max = 16;
	g->nvlinks = 18;
	g->persistence = true;
	g->ecc_supported = true;
	g->memory_total_mib = 81559;
}

static void apply_setting(struct fake_gpu *g, config_setting_t *s)
{
	for (int i = 0; i < config_setting_length(s); i++) {
		config_setting_t *e = config_setting_get_elem(s, i);
		const char *name = config_setting_name(e);
		if (name && strcmp(name, "processes") == 0) {
			g->n_processes = 0;
			for (int k = 0; k < config_setting_length(e) && k < FAKE_MAX_PROCS; k++)
				g->processes[g->n_processes++] =
					config_setting_get_int64_elem(e, k);
			continue;
		}
		const struct field *f = NULL;
		for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
			if (name && strcmp(fields[k].name, name) == 0)
				f = &fields[k];
		if (!f) {
			fprintf(stderr, "fake-nvml: %s:%d: unknown GPU field '%s', ignoring\n",
				strempty_(config_setting_source_file(e)),
				config_setting_source_line(e), name ? name : "?");
			continue;
		}
		char *p = (char *) g + f->off;
		switch (f->type) {
		case T_INT:
			*(long long *) p = config_setting_type(e) == CONFIG_TYPE_FLOAT
						   ? (long long) config_setting_get_float(e)
						   : config_setting_get_int64(e);
			break;
		case T_DOUBLE: {
			double d = config_setting_type(e) == CONFIG_TYPE_FLOAT
					   ? config_setting_get_float(e)
					   : (double) config_setting_get_int64(e);
			memcpy(p, &d, sizeof(d));
			break;
		}
		case T_BOOL:
			*(bool *) p = config_setting_get_bool(e);
			break;
		case T_STR:
			snprintf(p, f->size, "%s", config_setting_get_string(e) ?: "");
			break;
		}
	}
}

static int load_scenario(void)
{
	const char *path = getenv("KILN_FAKE_NVML_SCENARIO");
	if (cfg_inited)
		config_destroy(&cfg);
	config_init(&cfg);
	cfg_inited = true;
	n_gpus = 0;
	n_events = 0;
	if (!path || !*path) {
		/* No scenario: one healthy GPU, so a bare LD_LIBRARY_PATH run works. */
		set_defaults(&gpus[0], 0);
		n_gpus = 1;
		return 0;
	}
	if (!config_read_file(&cfg, path)) {
		fprintf(stderr, "fake-nvml: %s:%d: %s\n", path, config_error_line(&cfg),
			config_error_text(&cfg));
		return -1;
	}
	config_setting_t *gs = config_lookup(&cfg, "gpus");
	for (int i = 0; gs && i < config_setting_length(gs) && i < FAKE_MAX_GPUS; i++) {
		set_defaults(&gpus[i], i);
		apply_setting(&gpus[i], config_setting_get_elem(gs, i));
		n_gpus++;
	}
	config_setting_t *es = config_lookup(&cfg, "events");
	for (int i = 0; es && i < config_setting_length(es) && i < FAKE_MAX_EVENTS; i++) {
		config_setting_t *e = config_setting_get_elem(es, i);
		struct fake_event *ev = &events[n_events++];
		memset(ev, 0, sizeof(*ev));
		int iv = 0;
		double dv = 0;
		if (config_setting_lookup_float(e, "at", &dv))
			ev->at = dv;
		else if (config_setting_lookup_int(e, "at", &iv))
			ev->at = iv;
		config_setting_lookup_int(e, "gpu", &ev->gpu);
		config_setting_lookup_int(e, "xid", &ev->xid);
		int b = 0;
		if (config_setting_lookup_bool(e, "lost", &b))
			ev->lost = b;
		const char *h = NULL;
		if (config_setting_lookup_string(e, "hang", &h))
			snprintf(ev->hang, sizeof(ev->hang), "%s", h);
		ev->set = config_setting_get_member(e, "set");
		if (ev->gpu < 0 || ev->gpu >= n_gpus) {
			fprintf(stderr, "fake-nvml: %s: event %d names gpu %d, only %d exist\n",
				path, i, ev->gpu, n_gpus);
			return -1;
		}
	}
	return 0;
}

/* The scenario lives as long as the library is loaded. */
__attribute__((destructor)) static void unload(void)
{
	if (cfg_inited)
		config_destroy(&cfg);
	for (struct fake_eventset *e = eventsets, *next; e; e = next) {
		next = e->next;
		free(e);
	}
}

/* Fires every due event.  Called with the lock held. */
static void apply_events(void)
{
	double t = now_s(CLOCK_MONOTONIC) - t0;
	for (int i = 0; i < n_events; i++) {
		struct fake_event *ev = &events[i];
		if (ev->fired || ev->at > t)
			continue;
		ev->fired = true;
		struct fake_gpu *g = &gpus[ev->gpu];
		if (ev->set)
			apply_setting(g, ev->set);
		if (ev->lost)
			g->lost = true;
		if (ev->hang[0])
			snprintf(g->hang, sizeof(g->hang), "%s", ev->hang);
		if (ev->xid > 0)
			for (struct fake_eventset *s = eventsets; s; s = s->next)
				if ((s->mask[ev->gpu] & nvmlEventTypeXidCriticalError) &&
				    s->tail - s->head < FAKE_QUEUE) {
					s->q[s->tail % FAKE_QUEUE].gpu = ev->gpu;
					s->q[s->tail % FAKE_QUEUE].xid = ev->xid;
					s->tail++;
				}
		log_line("event %d at=%.3f gpu=%d%s%s%s%s", i, ev->at, ev->gpu,
			 ev->xid ? " xid" : "", ev->set ? " set" : "", ev->lost ? " lost" : "",
			 ev->hang[0] ? " hang" : "");
	}
}

static int gpu_index(nvmlDevice_t d)
{
	intptr_t i = (struct fake_gpu *) (void *) d - gpus;
	return (i >= 0 && i < n_gpus) ? (int) i : -1;
}

/* Entry of every device call: applies due events, then blocks forever if the
 * scenario hung this function on this GPU, fails if the GPU is lost.  Returns
 * with the lock held on NVML_SUCCESS. */
static nvmlReturn_t enter(nvmlDevice_t d, const char *fn, struct fake_gpu **ret)
{
	pthread_mutex_lock(&lock);
	if (init_count <= 0) {
		pthread_mutex_unlock(&lock);
		return NVML_ERROR_UNINITIALIZED;
	}
	apply_events();
	int i = gpu_index(d);
	if (i < 0) {
		pthread_mutex_unlock(&lock);
		return NVML_ERROR_INVALID_ARGUMENT;
	}
	struct fake_gpu *g = &gpus[i];
	if (g->hang[0] && (strcmp(g->hang, "*") == 0 || strcmp(g->hang, fn) == 0)) {
		pthread_mutex_unlock(&lock);
		for (;;)
			pause(); /* a wedged driver call never returns */
	}
	if (g->lost) {
		pthread_mutex_unlock(&lock);
		return NVML_ERROR_GPU_IS_LOST;
	}
	*ret = g;
	return NVML_SUCCESS;
}

#define ENTER(d)                                  \
	struct fake_gpu *g;                       \
	nvmlReturn_t r_ = enter(d, __func__, &g); \
	if (r_ != NVML_SUCCESS)                   \
		return r_;
#define LEAVE(r)                             \
	do {                                 \
		pthread_mutex_unlock(&lock); \
		return (r);                  \
	} while (0)

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	/* a driver so broken that nvmlInit itself never returns */
	const char *h = getenv("KILN_FAKE_NVML_HANG_INIT");
	if (h && *h && *h != '0')
		for (;;)
			pause();
	pthread_mutex_lock(&lock);
	/* a new scenario file starts over (a unit test walks the check table
	 * in one process: one scenario per check) */
	const char *path = strempty_(getenv("KILN_FAKE_NVML_SCENARIO"));
	if (!loaded || strcmp(loaded_path, path) != 0) {
		snprintf(loaded_path, sizeof(loaded_path), "%s", path);
		if (load_scenario() < 0) {
			pthread_mutex_unlock(&lock);
			return NVML_ERROR_UNKNOWN;
		}
		loaded = true;
		t0 = now_s(CLOCK_MONOTONIC);
		log_line("init gpus=%d events=%d", n_gpus, n_events);
	}
	init_count++;
	pthread_mutex_unlock(&lock);
	return NVML_SUCCESS;
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void) flags;
	return nvmlInit_v2();
}
#endif
EXPORT nvmlReturn_t nvmlInit(void)
{
	return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
	pthread_mutex_lock(&lock);
	nvmlReturn_t r = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
	if (init_count > 0)
		init_count--;
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED:
		return "Not Supported";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case NVML_ERROR_TIMEOUT:
		return "Timeout";
	case NVML_ERROR_GPU_IS_LOST:
		return "GPU is lost";
	case NVML_ERROR_NOT_FOUND:
		return "Not Found";
	default:
		return "Unknown Error";
	}
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
	if (!v || len < 8)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	snprintf(v, len, "999.99-fake");
	return NVML_SUCCESS;
}

static nvmlReturn_t get_count(unsigned int *n)
{
	if (!n)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	if (init_count <= 0) {
		pthread_mutex_unlock(&lock);
		return NVML_ERROR_UNINITIALIZED;
	}
	apply_events();
	*n = (unsigned) n_gpus;
	pthread_mutex_unlock(&lock);
	return NVML_SUCCESS;
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
	return get_count(n);
}
#endif
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n)
{
	return get_count(n);
}

static nvmlReturn_t get_handle(unsigned int i, nvmlDevice_t *d)
{
	if (!d)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	nvmlReturn_t r = init_count <= 0	  ? NVML_ERROR_UNINITIALIZED
			 : i >= (unsigned) n_gpus ? NVML_ERROR_INVALID_ARGUMENT
						  : NVML_SUCCESS;
	if (r == NVML_SUCCESS) {
		apply_events();
		*d = (nvmlDevice_t) (void *) &gpus[i];
		if (gpus[i].lost)
			r = NVML_ERROR_GPU_IS_LOST;
	}
	pthread_mutex_unlock(&lock);
	return r;
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
	return get_handle(i, d);
}
#endif
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d)
{
	return get_handle(i, d);
}

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src)
{
	if (!dst)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(src) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(dst, src, strlen(src) + 1);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
	ENTER(d);
	LEAVE(copy_str(name, len, g->model));
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
	ENTER(d);
	LEAVE(copy_str(uuid, len, g->uuid));
}
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
	ENTER(d);
	*minor = (unsigned) gpu_index(d);
	LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t pci_info(nvmlDevice_t d, nvmlPciInfo_t *p, const char *fn)
{
	struct fake_gpu *g;
	nvmlReturn_t r = enter(d, fn, &g);
	if (r != NVML_SUCCESS)
		return r;
	memset(p, 0, sizeof(*p));
	snprintf(p->busId, sizeof(p->busId), "%s", g->pci_bus_id);
	snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "%s",
		 g->pci_bus_id + (strlen(g->pci_bus_id) > 12 ? 4 : 0));
	unsigned dom = 0, bus = 0, dev = 0;
	sscanf(g->pci_bus_id, "%x:%x:%x", &dom, &bus, &dev);
	p->domain = dom;
	p->bus = bus;
	p->device = dev;
	p->pciDeviceId = 0x233010de;
	LEAVE(NVML_SUCCESS);
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p)
{
	return pci_info(d, p, __func__);
}
#endif
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p)
{
	return pci_info(d, p, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t)
{
	ENTER(d);
	if (sensor != NVML_TEMPERATURE_GPU || !t)
		LEAVE(NVML_ERROR_INVALID_ARGUMENT);
	*t = (unsigned) g->temperature;
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, int which, unsigned int *t)
{
	ENTER(d);
	if (!t)
		LEAVE(NVML_ERROR_INVALID_ARGUMENT);
	if (which == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
		*t = (unsigned) g->slowdown_temperature;
	else if (which == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
		*t = (unsigned) g->shutdown_temperature;
	else
		LEAVE(NVML_ERROR_NOT_SUPPORTED);
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw)
{
	ENTER(d);
	*mw = (unsigned) (g->power_w * 1000.0);
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw)
{
	ENTER(d);
	*mw = (unsigned) (g->power_limit_w * 1000.0);
	LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t clocks(nvmlDevice_t d, unsigned long long *r, const char *fn)
{
	struct fake_gpu *g;
	nvmlReturn_t e = enter(d, fn, &g);
	if (e != NVML_SUCCESS)
		return e;
	*r = (unsigned long long) g->clock_event_reasons;
	LEAVE(NVML_SUCCESS);
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r)
{
	return clocks(d, r, __func__);
}
#endif
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r)
{
	return clocks(d, r, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
						unsigned long long *n)
{
	ENTER(d);
	if (!g->ecc_supported)
		LEAVE(NVML_ERROR_NOT_SUPPORTED);
	bool dbe = type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
	if (counter == NVML_VOLATILE_ECC)
		*n = (unsigned long long) (dbe ? g->ecc_dbe_volatile : g->ecc_sbe_volatile);
	else
		*n = (unsigned long long) (dbe ? g->ecc_dbe_aggregate : g->ecc_sbe_aggregate);
	LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t retired(nvmlDevice_t d, int cause, unsigned int *count,
			    unsigned long long *addr, unsigned long long *ts, const char *fn)
{
	struct fake_gpu *g;
	nvmlReturn_t e = enter(d, fn, &g);
	if (e != NVML_SUCCESS)
		return e;
	unsigned n = (unsigned) (cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
					 ? g->retired_dbe
					 : g->retired_sbe);
	if (*count < n || (!addr && *count)) {
		*count = n;
		LEAVE(n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
	}
	for (unsigned i = 0; i < n; i++) {
		addr[i] = 0x1000ULL * (i + 1);
		if (ts)
			ts[i] = 1700000000ULL + i;
	}
	*count = n;
	LEAVE(NVML_SUCCESS);
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, int cause, unsigned int *count,
						 unsigned long long *addr, unsigned long long *ts)
{
	return retired(d, cause, count, addr, ts, __func__);
}
#endif
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count,
					      unsigned long long *addr)
{
	return retired(d, cause, count, addr, NULL, __func__);
}
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t *p)
{
	ENTER(d);
	*p = g->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	LEAVE(NVML_SUCCESS);
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
					      unsigned int *pending, unsigned int *failure)
{
	ENTER(d);
	*corr = (unsigned) g->remapped_correctable;
	*unc = (unsigned) g->remapped_uncorrectable;
	*pending = g->remap_pending;
	*failure = g->remap_failure;
	LEAVE(NVML_SUCCESS);
}
#endif

#define GETTER(fn, field)                                       \
	EXPORT nvmlReturn_t fn(nvmlDevice_t d, unsigned int *v) \
	{                                                       \
		ENTER(d);                                       \
		*v = (unsigned) g->field;                       \
		LEAVE(NVML_SUCCESS);                            \
	}
GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_gen_max)
#ifndef FAKE_NVML_OLD
GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gen_max)
#endif
GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_width_max)
GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replay)

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link,
					     nvmlEnableState_t *active)
{
	ENTER(d);
	if (link >= NVML_NVLINK_MAX_LINKS)
		LEAVE(NVML_ERROR_INVALID_ARGUMENT);
	if (link >= g->nvlinks)
		LEAVE(NVML_ERROR_NOT_SUPPORTED);
	/* the last nvlinks_down links are down */
	*active =
		link < g->nvlinks - g->nvlinks_down ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter,
						    unsigned long long *v)
{
	ENTER(d);
	if (link >= g->nvlinks)
		LEAVE(NVML_ERROR_NOT_SUPPORTED);
	/* the scenario's counters are totals, all on link 0 */
	long long x = counter == NVML_NVLINK_ERROR_DL_REPLAY	 ? g->nvlink_replay
		      : counter == NVML_NVLINK_ERROR_DL_RECOVERY ? g->nvlink_recovery
		      : counter == NVML_NVLINK_ERROR_DL_CRC_FLIT ? g->nvlink_crc_flit
		      : counter == NVML_NVLINK_ERROR_DL_CRC_DATA ? g->nvlink_crc_data
								 : 0;
	*v = link == 0 ? (unsigned long long) x : 0;
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *m)
{
	ENTER(d);
	*m = g->persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	ENTER(d);
	m->total = (unsigned long long) g->memory_total_mib << 20;
	m->used = (unsigned long long) g->memory_used_mib << 20;
	m->free = m->total - m->used;
	LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t procs(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *p, const char *fn)
{
	struct fake_gpu *g;
	nvmlReturn_t e = enter(d, fn, &g);
	if (e != NVML_SUCCESS)
		return e;
	unsigned n = (unsigned) g->n_processes;
	if (*count < n) {
		*count = n;
		LEAVE(NVML_ERROR_INSUFFICIENT_SIZE);
	}
	for (unsigned i = 0; i < n; i++) {
		memset(&p[i], 0, sizeof(p[i]));
		p[i].pid = (unsigned) g->processes[i];
		p[i].usedGpuMemory = 1ULL << 30;
	}
	*count = n;
	LEAVE(NVML_SUCCESS);
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c,
							    nvmlProcessInfo_t *p)
{
	return procs(d, c, p, __func__);
}
#endif
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c,
							    nvmlProcessInfo_t *p)
{
	return procs(d, c, p, __func__);
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	struct fake_eventset *s = calloc(1, sizeof(*s));
	if (!s)
		return NVML_ERROR_MEMORY;
	pthread_mutex_lock(&lock);
	s->next = eventsets;
	eventsets = s;
	pthread_mutex_unlock(&lock);
	*set = (nvmlEventSet_t) (void *) s;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
					     nvmlEventSet_t set)
{
	ENTER(d);
	((struct fake_eventset *) (void *) set)->mask[gpu_index(d)] |= types;
	LEAVE(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
	ENTER(d);
	*types = nvmlEventTypeXidCriticalError;
	LEAVE(NVML_SUCCESS);
}

static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
	struct fake_eventset *s = (struct fake_eventset *) (void *) set;
	double deadline = now_s(CLOCK_MONOTONIC) + timeout_ms / 1000.0;
	for (;;) {
		pthread_mutex_lock(&lock);
		apply_events();
		if (s->head != s->tail) {
			memset(data, 0, sizeof(*data));
			data->device =
				(nvmlDevice_t) (void *) &gpus[s->q[s->head % FAKE_QUEUE].gpu];
			data->eventType = nvmlEventTypeXidCriticalError;
			data->eventData = (unsigned long long) s->q[s->head % FAKE_QUEUE].xid;
			s->head++;
			pthread_mutex_unlock(&lock);
			return NVML_SUCCESS;
		}
		pthread_mutex_unlock(&lock);
		if (now_s(CLOCK_MONOTONIC) >= deadline)
			return NVML_ERROR_TIMEOUT;
		usleep(10000);
	}
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
					unsigned int timeout_ms)
{
	return event_wait(set, data, timeout_ms);
}
#endif
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
				     unsigned int timeout_ms)
{
	return event_wait(set, data, timeout_ms);
}
EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	struct fake_eventset *s = (struct fake_eventset *) (void *) set;
	pthread_mutex_lock(&lock);
	for (struct fake_eventset **p = &eventsets; *p; p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			break;
		}
	pthread_mutex_unlock(&lock);
	free(s);
	return NVML_SUCCESS;
}
