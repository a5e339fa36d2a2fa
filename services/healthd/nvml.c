/* nvml.c — libnvidia-ml loaded with dlopen, every call under a timeout.
 *
 * Why dlopen: one kiln-healthd binary must start (and report "no driver")
 * on machines without the NVIDIA driver, and tests swap in the fake NVML.
 * Each entry point is looked up newest name first (nvmlDeviceGetCount_v2,
 * then nvmlDeviceGetCount); an optional one that is missing disables only
 * its check, with one warning at load.
 *
 * Why a worker thread: a wedged driver blocks NVML calls for minutes, and
 * the daemon must keep answering /metrics and feeding the systemd watchdog.
 * Polls run on a worker thread; the caller waits while the current call is
 * younger than the timeout.  A call older than that is abandoned: its
 * thread is left to finish on its own (it owns its memory), a new worker
 * takes over, the GPU is reported as "NVML call X hung" and not polled again
 * until the hung call returns, so a wedged GPU costs at most one thread. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "healthd.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/pathtrust.h"

typedef nvmlReturn_t (*fn_void)(void);
typedef const char *(*fn_errstr)(nvmlReturn_t);
typedef nvmlReturn_t (*fn_uint_p)(unsigned *);
typedef nvmlReturn_t (*fn_handle)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*fn_dev_str)(nvmlDevice_t, char *, unsigned);
typedef nvmlReturn_t (*fn_dev_uint)(nvmlDevice_t, unsigned *);
typedef nvmlReturn_t (*fn_dev_int_uint)(nvmlDevice_t, int, unsigned *);
typedef nvmlReturn_t (*fn_dev_ull)(nvmlDevice_t, unsigned long long *);
typedef nvmlReturn_t (*fn_dev_pci)(nvmlDevice_t, nvmlPciInfo_t *);
typedef nvmlReturn_t (*fn_ecc)(nvmlDevice_t, int, int, unsigned long long *);
typedef nvmlReturn_t (*fn_retired_v2)(nvmlDevice_t, int, unsigned *, unsigned long long *,
				      unsigned long long *);
typedef nvmlReturn_t (*fn_retired)(nvmlDevice_t, int, unsigned *, unsigned long long *);
typedef nvmlReturn_t (*fn_dev_enable)(nvmlDevice_t, nvmlEnableState_t *);
typedef nvmlReturn_t (*fn_remap)(nvmlDevice_t, unsigned *, unsigned *, unsigned *, unsigned *);
typedef nvmlReturn_t (*fn_link_state)(nvmlDevice_t, unsigned, nvmlEnableState_t *);
typedef nvmlReturn_t (*fn_link_err)(nvmlDevice_t, unsigned, int, unsigned long long *);
typedef nvmlReturn_t (*fn_mem)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*fn_procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
typedef nvmlReturn_t (*fn_set_create)(nvmlEventSet_t *);
typedef nvmlReturn_t (*fn_register)(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
typedef nvmlReturn_t (*fn_wait)(nvmlEventSet_t, nvmlEventData_t *, unsigned);
typedef nvmlReturn_t (*fn_set_free)(nvmlEventSet_t);

struct api {
	fn_void init, shutdown;
	fn_errstr error_string;
	fn_uint_p count;
	fn_handle handle;
	fn_dev_str name, uuid;
	fn_dev_pci pci;
	fn_dev_uint minor, power, power_limit, pcie_gen, pcie_gen_max, pcie_width, pcie_width_max,
		replay;
	fn_dev_int_uint temp, temp_threshold;
	fn_dev_ull clocks;
	fn_ecc ecc;
	fn_retired_v2 retired_v2;
	fn_retired retired;
	fn_dev_enable retired_pending, persistence;
	fn_remap remap;
	fn_link_state link_state;
	fn_link_err link_err;
	fn_mem mem;
	fn_procs procs;
	fn_set_create set_create;
	fn_register reg;
	fn_wait wait;
	fn_set_free set_free;
};

/* Where each entry point lives in struct api, its names newest first,
 * whether the daemon can run without it, and what is lost without it: NULL
 * for the entry points a check needs (the check table's nvml column names
 * the check), else these words. */
static const struct sym {
	size_t off;
	const char *field;
	bool required;
	const char *lost; /* what is lost without it, if not a check */
	const char *names[3];
} syms[] = {
#define S(field, req, check, ...)                                \
	{                                                        \
		offsetof(struct api, field), #field, req, check, \
		{                                                \
			__VA_ARGS__                              \
		}                                                \
	}
	S(init, true, NULL, "nvmlInit_v2", "nvmlInit"),
	S(shutdown, true, NULL, "nvmlShutdown"),
	S(error_string, true, NULL, "nvmlErrorString"),
	S(count, true, NULL, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"),
	S(handle, true, NULL, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
	S(name, false, "GPU model names", "nvmlDeviceGetName"),
	S(uuid, false, "GPU UUIDs", "nvmlDeviceGetUUID"),
	S(pci, false, "PCI bus ids", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"),
	S(minor, false, "device names", "nvmlDeviceGetMinorNumber"),
	S(temp, false, NULL, "nvmlDeviceGetTemperature"),
	S(temp_threshold, false, "the slowdown temperature", "nvmlDeviceGetTemperatureThreshold"),
	S(power, false, NULL, "nvmlDeviceGetPowerUsage"),
	S(power_limit, false, "the power limit", "nvmlDeviceGetEnforcedPowerLimit"),
	S(clocks, false, NULL, "nvmlDeviceGetCurrentClocksEventReasons",
	  "nvmlDeviceGetCurrentClocksThrottleReasons"),
	S(ecc, false, NULL, "nvmlDeviceGetTotalEccErrors"),
	S(retired_v2, false, NULL, "nvmlDeviceGetRetiredPages_v2"),
	S(retired, false, NULL, "nvmlDeviceGetRetiredPages"),
	S(retired_pending, false, NULL, "nvmlDeviceGetRetiredPagesPendingStatus"),
	S(remap, false, NULL, "nvmlDeviceGetRemappedRows"),
	S(pcie_gen, false, NULL, "nvmlDeviceGetCurrPcieLinkGeneration"),
	S(pcie_gen_max, false, NULL, "nvmlDeviceGetGpuMaxPcieLinkGeneration",
	  "nvmlDeviceGetMaxPcieLinkGeneration"),
	S(pcie_width, false, NULL, "nvmlDeviceGetCurrPcieLinkWidth"),
	S(pcie_width_max, false, NULL, "nvmlDeviceGetMaxPcieLinkWidth"),
	S(replay, false, NULL, "nvmlDeviceGetPcieReplayCounter"),
	S(link_state, false, NULL, "nvmlDeviceGetNvLinkState"),
	S(link_err, false, "the NVLink error counters", "nvmlDeviceGetNvLinkErrorCounter"),
	S(persistence, false, NULL, "nvmlDeviceGetPersistenceMode"),
	S(mem, false, "memory sizes", "nvmlDeviceGetMemoryInfo"),
	S(procs, false, "Slurm job ids per GPU", "nvmlDeviceGetComputeRunningProcesses_v3",
	  "nvmlDeviceGetComputeRunningProcesses_v2"),
	S(set_create, false, "XID events", "nvmlEventSetCreate"),
	S(reg, false, "XID events", "nvmlDeviceRegisterEvents"),
	S(wait, false, "XID events", "nvmlEventSetWait_v2", "nvmlEventSetWait"),
	S(set_free, false, "XID events", "nvmlEventSetFree"),
#undef S
};

enum job_kind { JOB_INIT, JOB_COUNT, JOB_POLL };

typedef struct worker {
	pthread_t thread;
	hd_nvml *m;
	bool has_job, done, abandoned, quit;
	enum job_kind kind;
	int gpu;
	hd_sample sample; /* written by the worker only while it owns a job */
	int count, result;
	const char *call; /* the NVML function running now, NULL between calls */
	uint64_t call_start;
} worker;

struct hd_nvml {
	void *dl;
	struct api api;
	uint64_t timeout_usec;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* worker state changed (CLOCK_MONOTONIC) */
	worker *w;
	const char *used[ARRAY_SIZE(syms)]; /* the name each entry point resolved to */
	char hung[HD_GPUS_MAX][64];
	atomic_int abandoned;
	/* events */
	pthread_t ev_thread;
	bool ev_started;
	atomic_bool ev_stop, ev_exited;
	hd_xid_cb ev_cb;
	void *ev_data;
};

static void *worker_main(void *p);

static int worker_new(hd_nvml *m, worker **ret)
{
	worker *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->m = m;
	int r = pthread_create(&w->thread, NULL, worker_main, w);
	if (r != 0) {
		free(w);
		return -r;
	}
	/* joinable: hd_nvml_close() waits for the current worker; an abandoned
	 * one is detached when it is given up */
	*ret = w;
	return 0;
}

static void call_begin(worker *w, const char *name)
{
	pthread_mutex_lock(&w->m->lock);
	w->call = name;
	w->call_start = kiln_now_usec();
	pthread_mutex_unlock(&w->m->lock);
}

static void call_end(worker *w)
{
	pthread_mutex_lock(&w->m->lock);
	w->call = NULL;
	pthread_mutex_unlock(&w->m->lock);
}

/* Runs one NVML call, recording which one so that a hang can be named. */
#define CALL(w, field, ...)                                       \
	({                                                        \
		call_begin(w, #field);                            \
		nvmlReturn_t _r = (w)->m->api.field(__VA_ARGS__); \
		call_end(w);                                      \
		_r;                                               \
	})

/* The NVML name of the entry point behind a struct api field, for logs. */
static const char *call_name(const hd_nvml *m, const char *field)
{
	for (size_t i = 0; i < ARRAY_SIZE(syms); i++)
		if (streq(syms[i].field, field) && m->used[i])
			return m->used[i];
	return field;
}

/* Marks a lost GPU and tells the caller to stop polling it. */
#define LOST_OR(r, s)                        \
	if ((r) == NVML_ERROR_GPU_IS_LOST) { \
		(s)->lost = true;            \
		return;                      \
	}

static void poll_gpu(worker *w, hd_sample *s)
{
	const struct api *a = &w->m->api;
	nvmlDevice_t d;
	nvmlReturn_t r = CALL(w, handle, (unsigned) w->gpu, &d);
	LOST_OR(r, s);
	if (r != NVML_SUCCESS)
		return;
	s->present = true;
	if (a->name)
		CALL(w, name, d, s->name, sizeof(s->name));
	if (a->uuid)
		CALL(w, uuid, d, s->uuid, sizeof(s->uuid));
	if (a->pci) {
		nvmlPciInfo_t pci;
		if (CALL(w, pci, d, &pci) == NVML_SUCCESS)
			snprintf(s->pci_bus_id, sizeof(s->pci_bus_id), "%s", pci.busId);
	}
	if (a->minor && CALL(w, minor, d, &s->minor) != NVML_SUCCESS)
		s->minor = (unsigned) w->gpu;
	if (a->temp) {
		r = CALL(w, temp, d, NVML_TEMPERATURE_GPU, &s->temp_c);
		LOST_OR(r, s);
		s->has_temp = r == NVML_SUCCESS;
	}
	if (a->temp_threshold)
		s->has_slowdown = CALL(w, temp_threshold, d, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
				       &s->slowdown_c) == NVML_SUCCESS;
	unsigned mw = 0;
	if (a->power) {
		r = CALL(w, power, d, &mw);
		LOST_OR(r, s);
		if ((s->has_power = r == NVML_SUCCESS))
			s->power_w = mw / 1000.0;
	}
	if (a->power_limit && CALL(w, power_limit, d, &mw) == NVML_SUCCESS) {
		s->has_power_limit = true;
		s->power_limit_w = mw / 1000.0;
	}
	if (a->clocks) {
		unsigned long long v = 0;
		if ((s->has_clocks = CALL(w, clocks, d, &v) == NVML_SUCCESS))
			s->clock_reasons = v;
	}
	if (a->ecc) {
		unsigned long long v[4] = { 0, 0, 0, 0 };
		r = CALL(w, ecc, d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &v[0]);
		LOST_OR(r, s);
		if (r == NVML_SUCCESS &&
		    CALL(w, ecc, d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &v[1]) ==
			    NVML_SUCCESS &&
		    CALL(w, ecc, d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, &v[2]) ==
			    NVML_SUCCESS &&
		    CALL(w, ecc, d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC,
			 &v[3]) == NVML_SUCCESS) {
			s->has_ecc = true;
			s->sbe_vol = v[0], s->dbe_vol = v[1], s->sbe_agg = v[2], s->dbe_agg = v[3];
		}
	}
	if (a->retired_v2 || a->retired) {
		unsigned n[2] = { 0, 0 };
		bool ok = true;
		for (int c = 0; c < 2; c++) {
			r = a->retired_v2 ? CALL(w, retired_v2, d, c, &n[c], NULL, NULL)
					  : CALL(w, retired, d, c, &n[c], NULL);
			ok = ok && (r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE);
		}
		if ((s->has_retired = ok)) {
			s->retired_sbe =
				n[NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS];
			s->retired_dbe = n[NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR];
		}
	}
	nvmlEnableState_t en = NVML_FEATURE_DISABLED;
	if (a->retired_pending && CALL(w, retired_pending, d, &en) == NVML_SUCCESS) {
		s->has_retired_pending = true;
		s->retired_pending = en == NVML_FEATURE_ENABLED;
	}
	if (a->remap) {
		unsigned c = 0, u = 0, p = 0, f = 0;
		if (CALL(w, remap, d, &c, &u, &p, &f) == NVML_SUCCESS) {
			s->has_remap = true;
			s->remap_corr = c, s->remap_unc = u, s->remap_pending = p,
			s->remap_failure = f;
		}
	}
	if (a->pcie_gen && a->pcie_gen_max)
		s->has_pcie_gen = CALL(w, pcie_gen, d, &s->pcie_gen) == NVML_SUCCESS &&
				  CALL(w, pcie_gen_max, d, &s->pcie_gen_max) == NVML_SUCCESS;
	if (a->pcie_width && a->pcie_width_max)
		s->has_pcie_width = CALL(w, pcie_width, d, &s->pcie_width) == NVML_SUCCESS &&
				    CALL(w, pcie_width_max, d, &s->pcie_width_max) == NVML_SUCCESS;
	if (a->replay)
		s->has_replay = CALL(w, replay, d, &s->pcie_replay) == NVML_SUCCESS;
	if (a->link_state) {
		for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
			if (CALL(w, link_state, d, l, &en) != NVML_SUCCESS)
				continue; /* not supported: no such link */
			s->nvlink_total++;
			if (en != NVML_FEATURE_ENABLED)
				s->nvlink_down++;
			for (int k = 0; a->link_err && k < NVML_NVLINK_ERROR_COUNT; k++) {
				unsigned long long v = 0;
				if (CALL(w, link_err, d, l, k, &v) == NVML_SUCCESS)
					s->nvlink_err[k] += v;
			}
		}
		s->has_nvlink = s->nvlink_total > 0;
	}
	if (a->persistence && CALL(w, persistence, d, &en) == NVML_SUCCESS) {
		s->has_persistence = true;
		s->persistence = en == NVML_FEATURE_ENABLED;
	}
	if (a->mem) {
		nvmlMemory_t mem = { 0, 0, 0 };
		if ((s->has_mem = CALL(w, mem, d, &mem) == NVML_SUCCESS))
			s->mem_total = mem.total, s->mem_used = mem.used,
			s->mem_free = mem.total - mem.used;
	}
	if (a->procs) {
		nvmlProcessInfo_t p[HD_PIDS_MAX] = { { 0, 0, 0, 0 } };
		unsigned n = HD_PIDS_MAX;
		if ((s->has_pids = CALL(w, procs, d, &n, p) == NVML_SUCCESS)) {
			s->n_pids = MIN(n, (unsigned) HD_PIDS_MAX);
			for (unsigned i = 0; i < s->n_pids; i++)
				s->pids[i] = p[i].pid;
		}
	}
}

static void *worker_main(void *p)
{
	worker *w = p;
	hd_nvml *m = w->m;
	pthread_mutex_lock(&m->lock);
	for (;;) {
		while (!w->has_job && !w->quit)
			pthread_cond_wait(&m->cond, &m->lock);
		if (w->quit)
			break;
		pthread_mutex_unlock(&m->lock);
		if (w->kind == JOB_INIT) {
			nvmlReturn_t r = CALL(w, init);
			w->count = (int) r; /* the NVML status, for the error message */
			w->result = r == NVML_SUCCESS ? 0 : -EIO;
		} else if (w->kind == JOB_COUNT) {
			unsigned n = 0;
			nvmlReturn_t r = CALL(w, count, &n);
			w->count = (int) n;
			w->result = r == NVML_SUCCESS ? 0 : -EIO;
		} else {
			memset(&w->sample, 0, sizeof(w->sample));
			poll_gpu(w, &w->sample);
			w->result = 0;
		}
		pthread_mutex_lock(&m->lock);
		if (w->abandoned) {
			/* the hung call came back: the GPU may be polled again */
			if (w->kind == JOB_POLL && w->gpu >= 0 && w->gpu < HD_GPUS_MAX)
				m->hung[w->gpu][0] = 0;
			atomic_fetch_sub(&m->abandoned, 1);
			break;
		}
		w->has_job = false;
		w->done = true;
		pthread_cond_broadcast(&m->cond);
	}
	pthread_mutex_unlock(&m->lock);
	free(w);
	return NULL;
}

/* Hands a job to the worker and waits while its current call is younger
 * than the timeout.  Returns 0, or -ETIMEDOUT with the hung call's name. */
static int run_job(hd_nvml *m, enum job_kind kind, int gpu, hd_sample *out, int *ret_count,
		   char *hung, size_t hunglen)
{
	int r = 0;
	pthread_mutex_lock(&m->lock);
	if (!m->w) {
		r = worker_new(m, &m->w);
		if (r < 0) {
			pthread_mutex_unlock(&m->lock);
			return r;
		}
	}
	worker *w = m->w;
	w->kind = kind;
	w->gpu = gpu;
	w->done = false;
	w->has_job = true;
	w->call = NULL;
	pthread_cond_broadcast(&m->cond);
	while (!w->done) {
		uint64_t now = kiln_now_usec();
		if (w->call && now - w->call_start >= m->timeout_usec) {
			snprintf(hung, hunglen, "%s", call_name(m, w->call));
			w->abandoned = true;
			atomic_fetch_add(&m->abandoned, 1);
			pthread_detach(w->thread);
			m->w = NULL; /* the next job starts a fresh worker */
			r = -ETIMEDOUT;
			break;
		}
		uint64_t until = w->call ? w->call_start + m->timeout_usec : now + m->timeout_usec;
		struct timespec ts = { .tv_sec = until / KILN_USEC_PER_SEC,
				       .tv_nsec = (until % KILN_USEC_PER_SEC) * 1000 };
		pthread_cond_timedwait(&m->cond, &m->lock, &ts);
	}
	if (r == 0) {
		if (kind == JOB_POLL)
			*out = w->sample;
		else
			*ret_count = w->count;
		r = w->result;
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}

/* The check that needs entry point name (by its newest name), or NULL. */
static const hd_check *check_needing(const char *name)
{
	size_t n, len = strlen(name);
	const hd_check *c = hd_checks(&n);
	for (size_t i = 0; i < n; i++)
		for (const char *w = c[i].nvml; w && *w; w += strspn(w, " ")) {
			size_t k = strcspn(w, " ");
			if (k == len && strncmp(w, name, k) == 0)
				return &c[i];
			w += k;
		}
	return NULL;
}

/* "the temperature check", "GPU UUIDs" ...; false when nothing worth a
 * warning is lost (a fallback covers it). */
static bool lost_without(const struct sym *sym, char *buf, size_t len)
{
	const hd_check *c = check_needing(sym->names[0]);
	if (c)
		snprintf(buf, len, "the %s check", c->name);
	else if (sym->lost)
		snprintf(buf, len, "%s", sym->lost);
	return c || sym->lost;
}

int hd_nvml_open(const char *library, uint64_t timeout_usec, hd_nvml **ret, char *err,
		 size_t errlen)
{
	assert_return(library && ret, -EINVAL);
	hd_nvml *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->timeout_usec = timeout_usec ? timeout_usec : 5 * KILN_USEC_PER_SEC;
	pthread_mutex_init(&m->lock, NULL);
	kiln_cond_init_monotonic(&m->cond);

	/* dlopen runs the library's constructors as root: a path (not a
	 * soname, which ld.so finds in the system's directories) must be one
	 * no user but root can change (issue 31: a .so written by nobody ran
	 * its constructor inside kiln-healthd) */
	if (strchr(library, '/')) {
		char why[384];
		/* root's, or this daemon's own user's (not root in a test) */
		int t = kiln_path_trusted(NULL, library, geteuid(), why, sizeof(why));
		if (t < 0 && t != -ENOENT) {
			snprintf(err, errlen, "refusing to load %s: %s", library, why);
			free(m);
			return t == -EPERM ? -EPERM : t;
		}
	}
	m->dl = dlopen(library, RTLD_NOW | RTLD_LOCAL);
	if (!m->dl) {
		snprintf(err, errlen, "%s", dlerror());
		free(m);
		return -ENOENT;
	}
	for (size_t i = 0; i < ARRAY_SIZE(syms); i++) {
		void *sym = NULL;
		for (int k = 0; k < 3 && syms[i].names[k] && !sym; k++)
			if ((sym = dlsym(m->dl, syms[i].names[k])))
				m->used[i] = syms[i].names[k];
		if (sym)
			memcpy((char *) &m->api + syms[i].off, &sym, sizeof(sym));
		else if (syms[i].required) {
			snprintf(err, errlen, "%s has no %s", library, syms[i].names[0]);
			dlclose(m->dl);
			free(m);
			return -ENOTSUP;
		} else {
			char what[96];
			if (lost_without(&syms[i], what, sizeof(what)))
				log_warning("NVML library %s lacks %s: %s disabled", library,
					    syms[i].names[0], what);
		}
	}
	if (!m->api.retired_v2 && !m->api.retired)
		log_warning("NVML library %s lacks nvmlDeviceGetRetiredPages: the retired pages "
			    "check disabled",
			    library);
	/* nvmlInit touches the driver too: same timeout as every other call */
	int status = 0;
	char hung[64];
	int r = run_job(m, JOB_INIT, -1, NULL, &status, hung, sizeof(hung));
	if (r == -ETIMEDOUT) {
		/* the abandoned thread still uses m and the library: leave both */
		snprintf(err, errlen, "nvmlInit did not return within %.1fs (hung driver?)",
			 m->timeout_usec / 1e6);
		return -ETIMEDOUT;
	}
	if (r < 0) {
		snprintf(err, errlen, "nvmlInit failed: %s",
			 r == -EIO ? m->api.error_string((nvmlReturn_t) status) : strerror(-r));
		hd_nvml_close(m);
		return r == -EIO ? -EIO : r;
	}
	*ret = m;
	return 0;
}

void hd_nvml_close(hd_nvml *m)
{
	if (!m)
		return;
	if (m->ev_started) {
		m->ev_stop = true;
		/* the event wait returns every 500 ms; a hung one is left behind */
		for (int i = 0; i < 40 && !m->ev_exited; i++)
			usleep(50000);
		if (m->ev_exited)
			pthread_join(m->ev_thread, NULL);
		else
			pthread_detach(m->ev_thread);
	}
	pthread_mutex_lock(&m->lock);
	worker *w = TAKE_PTR(m->w);
	pthread_t wt = w ? w->thread : 0; /* w frees itself when it quits */
	if (w) {
		w->quit = true;
		pthread_cond_broadcast(&m->cond);
	}
	int left = m->abandoned;
	pthread_mutex_unlock(&m->lock);
	if (w)
		pthread_join(wt, NULL); /* idle between jobs: returns at once */
	if (left > 0 || (m->ev_started && !m->ev_exited))
		return; /* abandoned threads may still touch m and the library: leave both */
	m->api.shutdown();
	dlclose(m->dl);
	pthread_cond_destroy(&m->cond);
	pthread_mutex_destroy(&m->lock);
	free(m);
}

int hd_nvml_count(hd_nvml *m, int *ret)
{
	char hung[64];
	return run_job(m, JOB_COUNT, -1, NULL, ret, hung, sizeof(hung));
}

int hd_nvml_poll(hd_nvml *m, int i, hd_sample *out)
{
	assert_return(m && out && i >= 0 && i < HD_GPUS_MAX, -EINVAL);
	pthread_mutex_lock(&m->lock);
	bool hung = m->hung[i][0] != 0;
	if (hung)
		snprintf(out->hung_call, sizeof(out->hung_call), "%s", m->hung[i]);
	pthread_mutex_unlock(&m->lock);
	if (hung) {
		out->at_usec = kiln_now_usec();
		return -ETIMEDOUT;
	}
	hd_sample s;
	char name[64] = "";
	int r = run_job(m, JOB_POLL, i, &s, NULL, name, sizeof(name));
	if (r == -ETIMEDOUT) {
		pthread_mutex_lock(&m->lock);
		snprintf(m->hung[i], sizeof(m->hung[i]), "%s", name);
		pthread_mutex_unlock(&m->lock);
		snprintf(out->hung_call, sizeof(out->hung_call), "%s", name);
		out->at_usec = kiln_now_usec();
		return r;
	}
	if (r < 0)
		return r;
	if (!s.present) {
		/* keep the identity we knew for the metrics labels */
		memcpy(s.name, out->name, sizeof(s.name));
		memcpy(s.uuid, out->uuid, sizeof(s.uuid));
		memcpy(s.pci_bus_id, out->pci_bus_id, sizeof(s.pci_bus_id));
		s.minor = out->minor;
	}
	s.at_usec = kiln_now_usec();
	*out = s;
	return 0;
}

int hd_nvml_abandoned(hd_nvml *m)
{
	return m->abandoned;
}

static void *events_main(void *p)
{
	hd_nvml *m = p;
	const struct api *a = &m->api;
	nvmlEventSet_t set = NULL;
	nvmlDevice_t devs[HD_GPUS_MAX];
	unsigned n = 0;
	if (a->set_create(&set) != NVML_SUCCESS || a->count(&n) != NVML_SUCCESS)
		goto out;
	n = MIN(n, (unsigned) HD_GPUS_MAX);
	for (unsigned i = 0; i < n; i++) {
		devs[i] = NULL;
		if (a->handle(i, &devs[i]) != NVML_SUCCESS)
			continue;
		nvmlReturn_t r = a->reg(devs[i], nvmlEventTypeXidCriticalError, set);
		if (r != NVML_SUCCESS)
			log_debug("gpu%u: cannot register for XID events: %s", i,
				  a->error_string(r));
	}
	while (!m->ev_stop) {
		nvmlEventData_t d;
		nvmlReturn_t r = a->wait(set, &d, 500);
		if (r == NVML_ERROR_TIMEOUT)
			continue;
		if (r != NVML_SUCCESS) {
			usleep(500000); /* e.g. GPU_IS_LOST on one GPU: keep listening */
			continue;
		}
		if (!(d.eventType & nvmlEventTypeXidCriticalError))
			continue;
		int gpu = -1;
		for (unsigned i = 0; i < n; i++)
			if (devs[i] == d.device)
				gpu = (int) i;
		m->ev_cb(gpu, (int) d.eventData, m->ev_data);
	}
	a->set_free(set);
out:
	m->ev_exited = true;
	return NULL;
}

int hd_nvml_start_events(hd_nvml *m, hd_xid_cb cb, void *data)
{
	if (!m->api.set_create || !m->api.reg || !m->api.wait || !m->api.set_free)
		return -ENOTSUP;
	m->ev_cb = cb;
	m->ev_data = data;
	int r = pthread_create(&m->ev_thread, NULL, events_main, m);
	if (r != 0)
		return -r;
	m->ev_started = true;
	return 0;
}
