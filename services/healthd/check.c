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

void hd_evaluate(const hd_settings *s, const hd_sample *prev, const hd_sample *cur, hd_reasons *out)
{
	const kiln_cfg_thresholds *th = &s->th;

	if (cur->lost) {
		hd_reasons_add(out, HD_UNHEALTHY, "fell off the bus (GPU_IS_LOST)");
		return;
	}
	if (cur->hung_call[0]) {
		hd_reasons_add(out, HD_UNHEALTHY, "NVML call %s hung", cur->hung_call);
		return;
	}
	if (!cur->present) {
		hd_reasons_add(out, HD_UNHEALTHY, "not accessible through NVML");
		return;
	}

	if (cur->has_temp) {
		unsigned max = th->temp_max_c > 0  ? (unsigned) th->temp_max_c
			       : cur->has_slowdown ? cur->slowdown_c
						   : 0;
		if (max > 0 && cur->temp_c >= max)
			hd_reasons_add(out, HD_UNHEALTHY,
				       "temperature %u C at or above the %s %u C", cur->temp_c,
				       th->temp_max_c > 0 ? "limit" : "slowdown limit", max);
		else if (th->temp_warn_c > 0 && cur->temp_c >= (unsigned) th->temp_warn_c)
			hd_reasons_add(out, HD_DEGRADED,
				       "temperature %u C above the warning threshold %d C",
				       cur->temp_c, th->temp_warn_c);
	}
	if (cur->has_power && cur->has_power_limit && cur->power_limit_w > 0 &&
	    th->power_warn_pct > 0 &&
	    cur->power_w > cur->power_limit_w * th->power_warn_pct / 100.0)
		hd_reasons_add(out, HD_DEGRADED, "power %.0f W above %d%% of the %.0f W limit",
			       cur->power_w, th->power_warn_pct, cur->power_limit_w);

	if (cur->has_clocks) {
		if (cur->clock_reasons & nvmlClocksThrottleReasonHwSlowdown)
			hd_reasons_add(out, HD_UNHEALTHY,
				       "clocks slowed by hardware (HW slowdown)");
		if (cur->clock_reasons & nvmlClocksThrottleReasonHwThermalSlowdown)
			hd_reasons_add(out, HD_UNHEALTHY,
				       "clocks slowed by hardware thermal protection");
		if (cur->clock_reasons & nvmlClocksThrottleReasonHwPowerBrakeSlowdown)
			hd_reasons_add(out, HD_UNHEALTHY,
				       "clocks slowed by the external power brake");
		if (cur->clock_reasons & nvmlClocksEventReasonSwThermalSlowdown)
			hd_reasons_add(out, HD_DEGRADED,
				       "clocks slowed by software thermal control");
	}

	if (cur->has_ecc) {
		if (cur->dbe_vol > 0)
			hd_reasons_add(out, HD_UNHEALTHY,
				       "%llu double-bit ECC errors since the last reset",
				       (unsigned long long) cur->dbe_vol);
		else if (cur->dbe_agg > 0)
			hd_reasons_add(out, HD_DEGRADED,
				       "%llu double-bit ECC errors over the GPU's lifetime",
				       (unsigned long long) cur->dbe_agg);
		if (th->ecc_sbe_warn > 0 && cur->sbe_vol >= (uint64_t) th->ecc_sbe_warn)
			hd_reasons_add(out, HD_DEGRADED,
				       "%llu single-bit ECC errors since the last reset",
				       (unsigned long long) cur->sbe_vol);
	}
	/* NVIDIA's RMA criterion for page retirement: 60 or more retired pages. */
	if (cur->has_retired && cur->retired_sbe + cur->retired_dbe >= 60)
		hd_reasons_add(out, HD_UNHEALTHY, "%u retired pages (RMA threshold 60)",
			       cur->retired_sbe + cur->retired_dbe);
	if (cur->has_retired_pending && cur->retired_pending)
		hd_reasons_add(out, HD_UNHEALTHY, "page retirement pending, reset needed");
	if (cur->has_remap) {
		if (cur->remap_failure)
			hd_reasons_add(out, action_severity(th->remap_failure),
				       "row remapping failed");
		else if (cur->remap_pending)
			hd_reasons_add(out, action_severity(th->remap_pending),
				       "row remapping pending, reset needed");
	}

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
	if (prev && prev->has_replay && cur->has_replay && th->pcie_replay_warn_per_min > 0 &&
	    cur->at_usec > prev->at_usec && cur->pcie_replay >= prev->pcie_replay) {
		double per_min = (cur->pcie_replay - prev->pcie_replay) * 60.0 * KILN_USEC_PER_SEC /
				 (double) (cur->at_usec - prev->at_usec);
		if (per_min >= th->pcie_replay_warn_per_min)
			hd_reasons_add(out, HD_DEGRADED, "PCIe replay rate %.0f/min above %d/min",
				       per_min, th->pcie_replay_warn_per_min);
	}

	if (cur->has_nvlink) {
		if (cur->nvlink_down > 0)
			hd_reasons_add(out, HD_UNHEALTHY, "%d of %d NVLink links down",
				       cur->nvlink_down, cur->nvlink_total);
		if (prev && prev->has_nvlink) {
			static const char *const names[NVML_NVLINK_ERROR_COUNT] = {
				"replay", "recovery", "CRC flit", "CRC data"
			};
			for (int k = 0; k < NVML_NVLINK_ERROR_COUNT; k++)
				if (cur->nvlink_err[k] > prev->nvlink_err[k])
					hd_reasons_add(out, HD_DEGRADED,
						       "%llu new NVLink %s errors",
						       (unsigned long long) (cur->nvlink_err[k] -
									     prev->nvlink_err[k]),
						       names[k]);
		}
	}
	if (cur->has_persistence && !cur->persistence)
		hd_reasons_add(out, HD_DEGRADED, "persistence mode is off");
}

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
	/* without NVML nothing can be checked: unhealthy where GPUs are expected */
	if (n->nvml_down[0] && s->expected_gpus != 0)
		hd_reasons_add(&n->reasons, s->expected_gpus > 0 ? HD_UNHEALTHY : HD_DEGRADED,
			       "NVML unavailable (%s)", n->nvml_down);
	/* an unreadable XID state file may hide a GPU that needs a reset: stay drained */
	if (n->xid_state_error[0])
		hd_reasons_add(&n->reasons, HD_UNHEALTHY, "%s", n->xid_state_error);
	if (s->expected_gpus >= 0 && n->n_gpus < s->expected_gpus)
		hd_reasons_add(&n->reasons, HD_UNHEALTHY, "%d GPUs found, the cluster file says %d",
			       n->n_gpus, s->expected_gpus);
	else if (s->expected_gpus >= 0 && n->n_gpus > s->expected_gpus)
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
