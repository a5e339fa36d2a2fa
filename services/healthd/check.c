/* check.c — from NVML samples and XIDs to health states with reasons.
 *
 * Pure functions (no NVML, no I/O) so the unit tests can drive every
 * threshold.  Defaults follow NVIDIA's and DCGM's guidance:
 *  - a double-bit ECC error, a failed row remap, a lost GPU, a hung driver
 *    call, or a hardware slowdown make the GPU unhealthy (drain);
 *  - heat above the warning threshold, many single-bit errors, a PCIe link
 *    trained below its maximum, PCIe replays, NVLink errors, persistence mode
 *    off make it degraded (warn, keep scheduling);
 *  - XIDs act by the table below (NVIDIA's XID catalog), overridable in the
 *    cluster file's health.xid list. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "healthd.h"

const char *hd_state_to_string(hd_state s)
{
	switch (s) {
	case HD_HEALTHY:
		return "healthy";
	case HD_DEGRADED:
		return "degraded";
	case HD_UNHEALTHY:
		return "unhealthy";
	}
	return "unknown";
}

int hd_settings_defaults(hd_settings *s)
{
	/* The health section as a file without one leaves it: the schema's
	 * defaults (kiln show --defaults), never a second copy of them here. */
	_cleanup_(kiln_cfg_freep) kiln_cfg *d = NULL;
	memset(s, 0, sizeof(*s));
	s->expected_gpus = -1;
	int r = kiln_cfg_defaults(&d);
	if (r < 0)
		return r;
	hd_settings_from_cfg(s, d, NULL);
	return 0;
}

void hd_settings_from_cfg(hd_settings *s, const kiln_cfg *cfg, const kiln_cfg_node *node)
{
	const kiln_cfg_health *h = &cfg->health;
	s->interval_usec = h->interval_usec;
	s->recover_after_usec = h->recover_after_usec;
	s->nvml_timeout_usec = h->nvml_timeout_usec;
	s->watchdog_usec = h->watchdog_usec;
	s->metrics_port = h->metrics_port;
	if (h->metrics_address)
		snprintf(s->metrics_address, sizeof(s->metrics_address), "%s", h->metrics_address);
	if (h->nvml_library)
		snprintf(s->nvml_library, sizeof(s->nvml_library), "%s", h->nvml_library);
	s->enabled = h->enabled;
	s->drain = h->drain;
	s->th = h->thresholds;
	s->xids = h->xids;
	s->n_xids = h->n_xids;
	s->active_on_start = h->active_on_start;
	s->active_interval_usec = h->active_interval_usec;
	s->gemm_seconds = h->gemm_seconds;
	s->memtest_fraction = h->memtest_fraction;
	if (node && node->group)
		s->expected_gpus = node->group->gpu_count;
	/* shared mounts: on the nodes of the file (mounts.c) */
	s->mounts = node ? cfg->mounts : NULL;
	s->n_mounts = node ? cfg->n_mounts : 0;
}

/* NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors), the XIDs a
 * datacenter sees.  APP: the application's fault, the GPU is fine.  RESET:
 * the GPU needs a reset (drain, reset when idle).  REBOOT: the node needs a
 * reboot. */
static const hd_xid_info xid_table[] = {
	{ 13, KILN_ACTION_APP, "graphics engine exception" },
	{ 31, KILN_ACTION_APP, "GPU memory page fault" },
	{ 32, KILN_ACTION_APP, "invalid or corrupted push buffer stream" },
	{ 38, KILN_ACTION_APP, "driver firmware error" },
	{ 43, KILN_ACTION_APP, "GPU stopped processing" },
	{ 45, KILN_ACTION_APP, "preemptive cleanup, due to previous errors" },
	{ 48, KILN_ACTION_RESET, "double bit ECC error" },
	{ 61, KILN_ACTION_RESET, "internal micro-controller breakpoint/warning" },
	{ 62, KILN_ACTION_RESET, "internal micro-controller halt" },
	{ 63, KILN_ACTION_RESET, "ECC page retirement or row remapping recorded, reset when idle" },
	{ 64, KILN_ACTION_RESET, "ECC page retirement or row remapper recording failure" },
	{ 68, KILN_ACTION_APP, "video processor exception" },
	{ 69, KILN_ACTION_APP, "graphics engine class error" },
	{ 74, KILN_ACTION_RESET, "NVLink error" },
	{ 79, KILN_ACTION_REBOOT, "GPU has fallen off the bus" },
	{ 92, KILN_ACTION_IGNORE, "high single-bit ECC error rate" },
	{ 94, KILN_ACTION_RESET, "contained ECC error, reset when idle" },
	{ 95, KILN_ACTION_RESET, "uncontained ECC error" },
	{ 109, KILN_ACTION_APP, "context switch timeout" },
	{ 119, KILN_ACTION_RESET, "GSP RPC timeout" },
	{ 120, KILN_ACTION_RESET, "GSP error" },
	{ 121, KILN_ACTION_RESET, "C2C link error" },
	{ 123, KILN_ACTION_RESET, "SPDM failure" },
	{ 136, KILN_ACTION_RESET, "link training failure" },
	{ 140, KILN_ACTION_RESET, "unrecovered ECC error" },
	{ 143, KILN_ACTION_REBOOT, "GPU initialization failure" },
	{ 154, KILN_ACTION_REBOOT, "GPU recovery action changed" },
};

const hd_xid_info *hd_xid_table(size_t *ret_n)
{
	*ret_n = ARRAY_SIZE(xid_table);
	return xid_table;
}

static const hd_xid_info *xid_find(int xid)
{
	for (size_t i = 0; i < ARRAY_SIZE(xid_table); i++)
		if (xid_table[i].xid == xid)
			return &xid_table[i];
	return NULL;
}

kiln_cfg_action hd_xid_action(const hd_settings *s, int xid)
{
	for (size_t i = 0; i < s->n_xids; i++)
		if (s->xids[i].xid == xid)
			return s->xids[i].action;
	const hd_xid_info *x = xid_find(xid);
	return x ? x->action : KILN_ACTION_APP;
}

const char *hd_xid_what(int xid)
{
	const hd_xid_info *x = xid_find(xid);
	return x ? x->what : "unknown XID";
}

void hd_reasons_add(hd_reasons *r, hd_state sev, const char *fmt, ...)
{
	if (r->n >= HD_REASONS_MAX)
		return;
	hd_reason *x = &r->v[r->n++];
	x->severity = sev;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->text, sizeof(x->text), fmt, ap);
	va_end(ap);
}

hd_state hd_reasons_state(const hd_reasons *r)
{
	hd_state s = HD_HEALTHY;
	for (int i = 0; i < r->n; i++)
		s = MAX(s, r->v[i].severity);
	return s;
}

static hd_state action_severity(kiln_cfg_action a)
{
	switch (a) {
	case KILN_ACTION_DRAIN:
	case KILN_ACTION_RESET:
	case KILN_ACTION_REBOOT:
		return HD_UNHEALTHY;
	case KILN_ACTION_APP:
		return HD_DEGRADED;
	default:
		return HD_HEALTHY;
	}
}

/* ---- the checks --------------------------------------------------------
 *
 * One function per check, one row per check in the table below.  A check
 * function looks at one sample (and the previous one, for rates) and adds
 * its reasons; the row says what the check shows (metrics, JSON keys), which
 * NVML entry points it needs, and which fake NVML fault trips it (the unit
 * test runs every row's fault through the real sampler).  docs/kiln-healthd.md
 * "Adding a check" walks through it. */

static void check_lost(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
		       hd_reasons *out)
{
	if (cur->lost)
		hd_reasons_add(out, HD_UNHEALTHY, "fell off the bus (GPU_IS_LOST)");
}

static void check_hung(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
		       hd_reasons *out)
{
	if (cur->hung_call[0])
		hd_reasons_add(out, HD_UNHEALTHY, "NVML call %s hung", cur->hung_call);
}

static void check_present(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			  hd_reasons *out)
{
	if (!cur->present)
		hd_reasons_add(out, HD_UNHEALTHY, "not accessible through NVML");
}

static void check_temperature(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			      hd_reasons *out)
{
	const kiln_cfg_thresholds *th = &s->th;
	if (!cur->has_temp)
		return;
	unsigned max = th->temp_max_c > 0  ? (unsigned) th->temp_max_c
		       : cur->has_slowdown ? cur->slowdown_c
					   : 0;
	if (max > 0 && cur->temp_c >= max)
		hd_reasons_add(out, HD_UNHEALTHY, "temperature %u C at or above the %s %u C",
			       cur->temp_c, th->temp_max_c > 0 ? "limit" : "slowdown limit", max);
	else if (th->temp_warn_c > 0 && cur->temp_c >= (unsigned) th->temp_warn_c)
		hd_reasons_add(out, HD_DEGRADED,
			       "temperature %u C above the warning threshold %d C", cur->temp_c,
			       th->temp_warn_c);
}

static void check_power(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			hd_reasons *out)
{
	int pct = s->th.power_warn_pct;
	if (cur->has_power && cur->has_power_limit && cur->power_limit_w > 0 && pct > 0 &&
	    cur->power_w > cur->power_limit_w * pct / 100.0)
		hd_reasons_add(out, HD_DEGRADED, "power %.0f W above %d%% of the %.0f W limit",
			       cur->power_w, pct, cur->power_limit_w);
}

static void check_clocks(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			 hd_reasons *out)
{
	static const struct {
		uint64_t bit;
		hd_state severity;
		const char *text;
	} reasons[] = {
		{ nvmlClocksThrottleReasonHwSlowdown, HD_UNHEALTHY,
		  "clocks slowed by hardware (HW slowdown)" },
		{ nvmlClocksThrottleReasonHwThermalSlowdown, HD_UNHEALTHY,
		  "clocks slowed by hardware thermal protection" },
		{ nvmlClocksThrottleReasonHwPowerBrakeSlowdown, HD_UNHEALTHY,
		  "clocks slowed by the external power brake" },
		{ nvmlClocksEventReasonSwThermalSlowdown, HD_DEGRADED,
		  "clocks slowed by software thermal control" },
	};
	if (!cur->has_clocks)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(reasons); i++)
		if (cur->clock_reasons & reasons[i].bit)
			hd_reasons_add(out, reasons[i].severity, "%s", reasons[i].text);
}

static void check_ecc(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
		      hd_reasons *out)
{
	if (!cur->has_ecc)
		return;
	if (cur->dbe_vol > 0)
		hd_reasons_add(out, HD_UNHEALTHY, "%llu double-bit ECC errors since the last reset",
			       (unsigned long long) cur->dbe_vol);
	else if (cur->dbe_agg > 0)
		hd_reasons_add(out, HD_DEGRADED,
			       "%llu double-bit ECC errors over the GPU's lifetime",
			       (unsigned long long) cur->dbe_agg);
	if (s->th.ecc_sbe_warn > 0 && cur->sbe_vol >= (uint64_t) s->th.ecc_sbe_warn)
		hd_reasons_add(out, HD_DEGRADED, "%llu single-bit ECC errors since the last reset",
			       (unsigned long long) cur->sbe_vol);
}

/* NVIDIA's RMA criterion for page retirement: 60 or more retired pages. */
#define HD_RETIRED_PAGES_RMA 60

static void check_retired(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			  hd_reasons *out)
{
	if (cur->has_retired && cur->retired_sbe + cur->retired_dbe >= HD_RETIRED_PAGES_RMA)
		hd_reasons_add(out, HD_UNHEALTHY, "%u retired pages (RMA threshold %d)",
			       cur->retired_sbe + cur->retired_dbe, HD_RETIRED_PAGES_RMA);
	if (cur->has_retired_pending && cur->retired_pending)
		hd_reasons_add(out, HD_UNHEALTHY, "page retirement pending, reset needed");
}

static void check_remap(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			hd_reasons *out)
{
	if (!cur->has_remap)
		return;
	if (cur->remap_failure)
		hd_reasons_add(out, action_severity(s->th.remap_failure), "row remapping failed");
	else if (cur->remap_pending)
		hd_reasons_add(out, action_severity(s->th.remap_pending),
			       "row remapping pending, reset needed");
}

static void check_pcie(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
		       hd_reasons *out)
{
	int replay_warn = s->th.pcie_replay_warn_per_min;
	if (cur->has_pcie_width && cur->pcie_width_max > 0 && cur->pcie_width < cur->pcie_width_max)
		hd_reasons_add(out, HD_DEGRADED, "PCIe link x%u below its maximum x%u",
			       cur->pcie_width, cur->pcie_width_max);
	/* An idle GPU lowers its link speed to save power; only a busy one
	 * (with processes) must run at full generation. */
	if (cur->has_pcie_gen && cur->has_pids && cur->n_pids > 0 && cur->pcie_gen_max > 0 &&
	    cur->pcie_gen < cur->pcie_gen_max)
		hd_reasons_add(out, HD_DEGRADED,
			       "PCIe link gen%u below its maximum gen%u under load", cur->pcie_gen,
			       cur->pcie_gen_max);
	if (prev && prev->has_replay && cur->has_replay && replay_warn > 0 &&
	    cur->at_usec > prev->at_usec && cur->pcie_replay >= prev->pcie_replay) {
		double per_min = (cur->pcie_replay - prev->pcie_replay) * 60.0 * KILN_USEC_PER_SEC /
				 (double) (cur->at_usec - prev->at_usec);
		if (per_min >= replay_warn)
			hd_reasons_add(out, HD_DEGRADED, "PCIe replay rate %.0f/min above %d/min",
				       per_min, replay_warn);
	}
}

static void check_nvlink(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			 hd_reasons *out)
{
	static const char *const names[NVML_NVLINK_ERROR_COUNT] = { "replay", "recovery",
								    "CRC flit", "CRC data" };
	if (!cur->has_nvlink)
		return;
	if (cur->nvlink_down > 0)
		hd_reasons_add(out, HD_UNHEALTHY, "%d of %d NVLink links down", cur->nvlink_down,
			       cur->nvlink_total);
	if (!prev || !prev->has_nvlink)
		return;
	for (int k = 0; k < NVML_NVLINK_ERROR_COUNT; k++)
		if (cur->nvlink_err[k] > prev->nvlink_err[k])
			hd_reasons_add(
				out, HD_DEGRADED, "%llu new NVLink %s errors",
				(unsigned long long) (cur->nvlink_err[k] - prev->nvlink_err[k]),
				names[k]);
}

static void check_persistence(const hd_settings *s, const hd_sample *prev, const hd_sample *cur,
			      hd_reasons *out)
{
	if (cur->has_persistence && !cur->persistence)
		hd_reasons_add(out, HD_DEGRADED, "persistence mode is off");
}

/* A value of the GPU's current sample, read when has_<flag> is set. */
#define V(metric_, json_, type_, field, flag, help_)                                        \
	{                                                                                   \
		.metric = metric_, .help = help_, .json = json_, .type = HD_VALUE_##type_,  \
		.off = offsetof(hd_gpu, cur.field), .has = offsetof(hd_gpu, cur.has_##flag) \
	}
#define DCGM(name) "DCGM_FI_DEV_" name

static const hd_check checks[] = {
	/* the three gates: without them nothing else about the GPU can be read */
	{ .name = "lost",
	  .evaluate = check_lost,
	  .gate = true,
	  .fault = "lost = true;",
	  .reason = "fell off the bus (GPU_IS_LOST)" },
	{ .name = "hung NVML call",
	  .evaluate = check_hung,
	  .gate = true,
	  .fault = "hang = \"nvmlDeviceGetTemperature\";",
	  .reason = "NVML call nvmlDeviceGetTemperature hung" },
	{ .name = "present", .evaluate = check_present, .gate = true },

	{ .name = "temperature",
	  .evaluate = check_temperature,
	  .nvml = "nvmlDeviceGetTemperature",
	  .fault = "temperature = 95;",
	  .reason = "temperature 95 C at or above the slowdown limit 90 C",
	  .values = { V(DCGM("GPU_TEMP"), "temperature_c", UINT, temp_c, temp,
			"GPU temperature (in C)."),
		      V(DCGM("SLOWDOWN_TEMP"), "slowdown_c", UINT, slowdown_c, slowdown,
			"Slowdown temperature (in C).") } },
	{ .name = "power",
	  .evaluate = check_power,
	  .nvml = "nvmlDeviceGetPowerUsage",
	  .fault = "power_w = 800.0;",
	  .reason = "power 800 W above 105% of the 700 W limit",
	  .values = { V(DCGM("POWER_USAGE"), "power_w", DOUBLE, power_w, power,
			"Power draw (in W)."),
		      V(DCGM("ENFORCED_POWER_LIMIT"), "power_limit_w", DOUBLE, power_limit_w,
			power_limit, "Enforced power limit (in W).") } },
	{ .name = "clock event reasons",
	  .evaluate = check_clocks,
	  .nvml = "nvmlDeviceGetCurrentClocksEventReasons",
	  .fault = "clock_event_reasons = 8;", /* nvmlClocksThrottleReasonHwSlowdown */
	  .reason = "clocks slowed by hardware (HW slowdown)",
	  .values = { V(DCGM("CLOCK_THROTTLE_REASONS"), NULL, U64, clock_reasons, clocks,
			"Current clock event reasons (bit mask).") } },
	{ .name = "ECC",
	  .evaluate = check_ecc,
	  .nvml = "nvmlDeviceGetTotalEccErrors",
	  .fault = "ecc_dbe_volatile = 2;",
	  .reason = "2 double-bit ECC errors since the last reset",
	  .values = { V(DCGM("ECC_SBE_VOL_TOTAL"), "ecc_sbe_volatile", U64, sbe_vol, ecc,
			"Total number of single-bit volatile ECC errors."),
		      V(DCGM("ECC_DBE_VOL_TOTAL"), "ecc_dbe_volatile", U64, dbe_vol, ecc,
			"Total number of double-bit volatile ECC errors."),
		      V(DCGM("ECC_SBE_AGG_TOTAL"), NULL, U64, sbe_agg, ecc,
			"Total number of single-bit persistent ECC errors."),
		      V(DCGM("ECC_DBE_AGG_TOTAL"), NULL, U64, dbe_agg, ecc,
			"Total number of double-bit persistent ECC errors.") } },
	{ .name = "page retirement",
	  .evaluate = check_retired,
	  .nvml = "nvmlDeviceGetRetiredPagesPendingStatus",
	  .fault = "retired_pending = true;",
	  .reason = "page retirement pending, reset needed",
	  .values = { V(DCGM("RETIRED_SBE"), NULL, UINT, retired_sbe, retired,
			"Total number of retired pages due to single-bit errors."),
		      V(DCGM("RETIRED_DBE"), NULL, UINT, retired_dbe, retired,
			"Total number of retired pages due to double-bit errors."),
		      V(DCGM("RETIRED_PENDING"), NULL, BOOL, retired_pending, retired_pending,
			"Whether a page retirement is pending (1) or not (0).") } },
	{ .name = "row remapping",
	  .evaluate = check_remap,
	  .nvml = "nvmlDeviceGetRemappedRows",
	  .fault = "remap_failure = true;",
	  .reason = "row remapping failed",
	  .values = { V(DCGM("CORRECTABLE_REMAPPED_ROWS"), NULL, UINT, remap_corr, remap,
			"Number of remapped rows for correctable errors."),
		      V(DCGM("UNCORRECTABLE_REMAPPED_ROWS"), NULL, UINT, remap_unc, remap,
			"Number of remapped rows for uncorrectable errors."),
		      V(DCGM("ROW_REMAP_FAILURE"), "remap_failure", BOOL, remap_failure, remap,
			"Whether remapping of rows has failed."),
		      V(DCGM("ROW_REMAP_PENDING"), "remap_pending", BOOL, remap_pending, remap,
			"Whether a row remapping is pending (reset needed).") } },
	{ .name = "PCIe",
	  .evaluate = check_pcie,
	  .nvml = "nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetMaxPcieLinkWidth "
		  "nvmlDeviceGetCurrPcieLinkGeneration nvmlDeviceGetGpuMaxPcieLinkGeneration "
		  "nvmlDeviceGetPcieReplayCounter",
	  .fault = "pcie_width = 8;",
	  .reason = "PCIe link x8 below its maximum x16",
	  .values = { V(DCGM("PCIE_LINK_GEN"), "pcie_link_gen", UINT, pcie_gen, pcie_gen,
			"PCIe current link generation."),
		      V(DCGM("PCIE_MAX_LINK_GEN"), NULL, UINT, pcie_gen_max, pcie_gen,
			"PCIe maximum link generation."),
		      V(DCGM("PCIE_LINK_WIDTH"), "pcie_link_width", UINT, pcie_width, pcie_width,
			"PCIe current link width."),
		      V(DCGM("PCIE_MAX_LINK_WIDTH"), NULL, UINT, pcie_width_max, pcie_width,
			"PCIe maximum link width."),
		      V(DCGM("PCIE_REPLAY_COUNTER"), NULL, UINT, pcie_replay, replay,
			"Total number of PCIe retries.") } },
	{ .name = "NVLink",
	  .evaluate = check_nvlink,
	  .nvml = "nvmlDeviceGetNvLinkState",
	  .fault = "nvlinks_down = 2;",
	  .reason = "2 of 18 NVLink links down",
	  .values = { V(DCGM("NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"), NULL, U64,
			nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT], nvlink,
			"Total number of NVLink flow-control CRC errors."),
		      V(DCGM("NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"), NULL, U64,
			nvlink_err[NVML_NVLINK_ERROR_DL_CRC_DATA], nvlink,
			"Total number of NVLink data CRC errors."),
		      V(DCGM("NVLINK_REPLAY_ERROR_COUNT_TOTAL"), NULL, U64,
			nvlink_err[NVML_NVLINK_ERROR_DL_REPLAY], nvlink,
			"Total number of NVLink retries."),
		      V(DCGM("NVLINK_RECOVERY_ERROR_COUNT_TOTAL"), NULL, U64,
			nvlink_err[NVML_NVLINK_ERROR_DL_RECOVERY], nvlink,
			"Total number of NVLink recovery errors."),
		      V("kiln_gpu_nvlink_down", "nvlink_down", INT, nvlink_down, nvlink,
			"NVLink links that are down.") } },
	/* XIDs arrive as events (hd_gpu_add_xid): no sample rule, the reasons
	 * are sticky; tests/healthd drive them with the fake's `xid` events */
	{ .name = "XID",
	  .values = { { .metric = DCGM("XID_ERRORS"),
			.help = "Value of the last XID error encountered.",
			.json = "last_xid",
			.type = HD_VALUE_INT,
			.off = offsetof(hd_gpu, last_xid),
			.has = HD_VALUE_ALWAYS } } },
	/* shown, not judged: the active checks size their memtest from it */
	{ .name = "memory",
	  .values = { V(DCGM("FB_USED"), NULL, MIB, mem_used, mem,
			"Framebuffer memory used (in MiB)."),
		      V(DCGM("FB_FREE"), NULL, MIB, mem_free, mem,
			"Framebuffer memory free (in MiB).") } },
	{ .name = "persistence mode",
	  .evaluate = check_persistence,
	  .nvml = "nvmlDeviceGetPersistenceMode",
	  .fault = "persistence = false;",
	  .reason = "persistence mode is off",
	  .values = { V("kiln_gpu_persistence_mode", "persistence_mode", BOOL, persistence,
			persistence, "Persistence mode on (1) or off (0).") } },
};
#undef V
#undef DCGM

const hd_check *hd_checks(size_t *ret_n)
{
	*ret_n = ARRAY_SIZE(checks);
	return checks;
}

const hd_value *hd_check_values_end(const hd_check *c)
{
	const hd_value *v = c->values;
	while (v < c->values + HD_CHECK_VALUES_MAX && (v->metric || v->json))
		v++;
	return v;
}

void hd_evaluate(const hd_settings *s, const hd_sample *prev, const hd_sample *cur, hd_reasons *out)
{
	for (size_t i = 0; i < ARRAY_SIZE(checks); i++) {
		if (!checks[i].evaluate)
			continue;
		int before = out->n;
		checks[i].evaluate(s, prev, cur, out);
		if (checks[i].gate && out->n > before)
			return;
	}
}

/* Reads a value of type T at p (memcpy: p is only a char pointer here). */
#define LOAD(T, p)                            \
	({                                    \
		T _x;                         \
		memcpy(&_x, (p), sizeof(_x)); \
		_x;                           \
	})

bool hd_value_get(const hd_value *v, const hd_gpu *g, double *ret)
{
	const char *p = (const char *) g + v->off;
	if (v->has != HD_VALUE_ALWAYS && !LOAD(bool, (const char *) g + v->has))
		return false;
	switch (v->type) {
	case HD_VALUE_UINT:
		*ret = LOAD(unsigned, p);
		break;
	case HD_VALUE_INT:
		*ret = LOAD(int, p);
		break;
	case HD_VALUE_U64:
		*ret = (double) LOAD(uint64_t, p);
		break;
	case HD_VALUE_MIB:
		*ret = (double) (LOAD(uint64_t, p) >> 20);
		break;
	case HD_VALUE_DOUBLE:
		*ret = LOAD(double, p);
		break;
	case HD_VALUE_BOOL:
		*ret = LOAD(bool, p);
		break;
	}
	return true;
}
#undef LOAD

kiln_cfg_action hd_gpu_add_xid(const hd_settings *s, hd_gpu *g, int xid)
{
	kiln_cfg_action a = hd_xid_action(s, xid);
	g->last_xid = xid;
	int i;
	for (i = 0; i < g->n_xids; i++)
		if (g->xids[i].xid == xid)
			break;
	if (i < g->n_xids)
		g->xids[i].count++;
	else if (g->n_xids < HD_XIDS_MAX)
		g->xids[g->n_xids++] = (hd_xid_count){ xid, 1 };
	else
		g->xid_other++;
	hd_gpu_add_sticky_xid(g, xid, a);
	return a;
}

void hd_gpu_add_sticky_xid(hd_gpu *g, int xid, kiln_cfg_action a)
{
	if (action_severity(a) != HD_UNHEALTHY)
		return;
	/* one reason per XID number */
	char prefix[32];
	snprintf(prefix, sizeof(prefix), "XID %d ", xid);
	for (int k = 0; k < g->sticky.n; k++)
		if (startswith(g->sticky.v[k].text, prefix))
			return;
	hd_reasons_add(&g->sticky, HD_UNHEALTHY, "XID %d %s (%s needed)", xid, hd_xid_what(xid),
		       a == KILN_ACTION_REBOOT	? "reboot"
		       : a == KILN_ACTION_RESET ? "reset"
						: "drain");
}

void hd_node_evaluate(const hd_settings *s, hd_node *n, uint64_t now_usec)
{
	n->reasons.n = 0;
	/* The count first: the first unhealthy reason is Slurm's drain reason,
	 * and "0 GPUs found, the cluster file says 8" is what the admin must
	 * see of a GPU node whose driver did not load; why NVML is down
	 * follows it. */
	if (s->expected_gpus >= 0 && n->n_gpus < s->expected_gpus)
		hd_reasons_add(&n->reasons, HD_UNHEALTHY, "%d GPUs found, the cluster file says %d",
			       n->n_gpus, s->expected_gpus);
	/* without NVML nothing can be checked: unhealthy where GPUs are expected */
	if (n->nvml_down[0] && s->expected_gpus != 0)
		hd_reasons_add(&n->reasons, s->expected_gpus > 0 ? HD_UNHEALTHY : HD_DEGRADED,
			       "NVML unavailable (%s)", n->nvml_down);
	/* an unreadable XID state file may hide a GPU that needs a reset: stay drained */
	if (n->xid_state_error[0])
		hd_reasons_add(&n->reasons, HD_UNHEALTHY, "%s", n->xid_state_error);
	/* a required shared mount missing (mounts.c): jobs would fail on it */
	for (int i = 0; i < n->mounts.n; i++)
		hd_reasons_add(&n->reasons, n->mounts.v[i].severity, "%s", n->mounts.v[i].text);
	if (s->expected_gpus >= 0 && n->n_gpus > s->expected_gpus)
		hd_reasons_add(&n->reasons, HD_DEGRADED, "%d GPUs found, the cluster file says %d",
			       n->n_gpus, s->expected_gpus);
	hd_state st = hd_reasons_state(&n->reasons);
	for (int i = 0; i < n->n_gpus; i++) {
		hd_gpu *g = &n->gpus[i];
		g->reasons = g->sticky;
		for (int k = 0; k < g->active.n; k++)
			hd_reasons_add(&g->reasons, g->active.v[k].severity, "%s",
				       g->active.v[k].text);
		hd_evaluate(s, g->have_prev ? &g->prev : NULL, &g->cur, &g->reasons);
		g->state = hd_reasons_state(&g->reasons);
		st = MAX(st, g->state);
	}
	n->state = st;
	/* Recovery counts from the moment every GPU is fully healthy: a
	 * degraded GPU keeps a kiln-drained node drained. */
	if (st != HD_HEALTHY)
		n->healthy_since_usec = 0;
	else if (n->healthy_since_usec == 0)
		n->healthy_since_usec = now_usec;
}

int hd_node_drain_reason(const hd_node *n, char *buf, size_t len)
{
	for (int i = 0; i < n->reasons.n; i++)
		if (n->reasons.v[i].severity == HD_UNHEALTHY)
			return snprintf(buf, len, "kiln: %s", n->reasons.v[i].text), 1;
	for (int i = 0; i < n->n_gpus; i++)
		for (int k = 0; k < n->gpus[i].reasons.n; k++)
			if (n->gpus[i].reasons.v[k].severity == HD_UNHEALTHY)
				return snprintf(buf, len, "kiln: gpu%d %s", i,
						n->gpus[i].reasons.v[k].text),
				       1;
	if (len)
		buf[0] = 0;
	return 0;
}

void hd_node_summary(const hd_node *n, char *buf, size_t len)
{
	int c[3] = { 0, 0, 0 };
	for (int i = 0; i < n->n_gpus; i++)
		c[n->gpus[i].state]++;
	char why[HD_SLURM_REASON_MAX] = "";
	if (n->state == HD_UNHEALTHY)
		hd_node_drain_reason(n, why, sizeof(why));
	snprintf(buf, len, "%s: %d GPU%s, %d healthy, %d degraded, %d unhealthy%s%s%s",
		 hd_state_to_string(n->state), n->n_gpus, n->n_gpus == 1 ? "" : "s", c[0], c[1],
		 c[2], why[0] ? " (" : "", why[0] ? why + strlen("kiln: ") : "", why[0] ? ")" : "");
}
