/* output.c — what kiln-healthd shows: Prometheus metrics, the --check table
 * and its JSON form.
 *
 * Metric names and labels are dcgm-exporter's (DCGM_FI_DEV_* with gpu, UUID,
 * pci_bus_id, device, modelName, Hostname) so existing Grafana dashboards
 * work unchanged; kiln_* metrics add what dcgm-exporter lacks: the health
 * state, a count per XID (dcgm-exporter's gauge only holds the last one),
 * and the Slurm job on each GPU. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "healthd.h"

/* Prometheus label values escape backslash, double quote and newline. */
static void label_escaped(kiln_strbuf *b, const char *s)
{
	while (s && *s) {
		size_t n = strcspn(s, "\\\"\n");
		kiln_strbuf_append_n(b, s, n);
		s += n;
		if (!*s)
			break;
		kiln_strbuf_append(b, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\");
		s++;
	}
}

static void labels(kiln_strbuf *b, const hd_gpu *g, const char *host)
{
	kiln_strbuf_printf(b, "{gpu=\"%d\",UUID=\"", g->index);
	label_escaped(b, g->cur.uuid);
	kiln_strbuf_append(b, "\",pci_bus_id=\"");
	label_escaped(b, g->cur.pci_bus_id);
	kiln_strbuf_printf(b, "\",device=\"nvidia%u\",modelName=\"", g->cur.minor);
	label_escaped(b, g->cur.name);
	kiln_strbuf_append(b, "\",Hostname=\"");
	label_escaped(b, host);
	kiln_strbuf_append(b, "\"");
}

typedef struct metric {
	const char *name, *type, *help;
	/* returns false when the GPU has no value for it */
	bool (*get)(const hd_gpu *g, double *v);
} metric;

#define GETTER(fn, cond, expr)                         \
	static bool fn(const hd_gpu *g, double *v)     \
	{                                              \
		const hd_sample *s = &g->cur;          \
		if (!s->present || s->lost || !(cond)) \
			return false;                  \
		*v = (double) (expr);                  \
		return true;                           \
	}
GETTER(m_temp, s->has_temp, s->temp_c)
GETTER(m_slowdown, s->has_slowdown, s->slowdown_c)
GETTER(m_power, s->has_power, s->power_w)
GETTER(m_power_limit, s->has_power_limit, s->power_limit_w)
GETTER(m_clocks, s->has_clocks, s->clock_reasons)
GETTER(m_sbe_vol, s->has_ecc, s->sbe_vol)
GETTER(m_dbe_vol, s->has_ecc, s->dbe_vol)
GETTER(m_sbe_agg, s->has_ecc, s->sbe_agg)
GETTER(m_dbe_agg, s->has_ecc, s->dbe_agg)
GETTER(m_ret_sbe, s->has_retired, s->retired_sbe)
GETTER(m_ret_dbe, s->has_retired, s->retired_dbe)
GETTER(m_ret_pending, s->has_retired_pending, s->retired_pending)
GETTER(m_remap_corr, s->has_remap, s->remap_corr)
GETTER(m_remap_unc, s->has_remap, s->remap_unc)
GETTER(m_remap_fail, s->has_remap, s->remap_failure)
GETTER(m_remap_pending, s->has_remap, s->remap_pending)
GETTER(m_pcie_gen, s->has_pcie_gen, s->pcie_gen)
GETTER(m_pcie_gen_max, s->has_pcie_gen, s->pcie_gen_max)
GETTER(m_pcie_width, s->has_pcie_width, s->pcie_width)
GETTER(m_pcie_width_max, s->has_pcie_width, s->pcie_width_max)
GETTER(m_replay, s->has_replay, s->pcie_replay)
GETTER(m_nvl_flit, s->has_nvlink, s->nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT])
GETTER(m_nvl_data, s->has_nvlink, s->nvlink_err[NVML_NVLINK_ERROR_DL_CRC_DATA])
GETTER(m_nvl_replay, s->has_nvlink, s->nvlink_err[NVML_NVLINK_ERROR_DL_REPLAY])
GETTER(m_nvl_recovery, s->has_nvlink, s->nvlink_err[NVML_NVLINK_ERROR_DL_RECOVERY])
GETTER(m_nvl_down, s->has_nvlink, s->nvlink_down)
GETTER(m_fb_used, s->has_mem, s->mem_used >> 20)
GETTER(m_fb_free, s->has_mem, (s->mem_total - s->mem_used) >> 20)
GETTER(m_persistence, s->has_persistence, s->persistence)
static bool m_xid(const hd_gpu *g, double *v)
{
	*v = g->last_xid;
	return true;
}

static const metric metrics[] = {
	{ "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", m_temp },
	{ "DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature (in C).", m_slowdown },
	{ "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", m_power },
	{ "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Enforced power limit (in W).",
	  m_power_limit },
	{ "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock event reasons (bit mask).",
	  m_clocks },
	{ "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "gauge",
	  "Total number of single-bit volatile ECC errors.", m_sbe_vol },
	{ "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gauge",
	  "Total number of double-bit volatile ECC errors.", m_dbe_vol },
	{ "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "gauge",
	  "Total number of single-bit persistent ECC errors.", m_sbe_agg },
	{ "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "gauge",
	  "Total number of double-bit persistent ECC errors.", m_dbe_agg },
	{ "DCGM_FI_DEV_RETIRED_SBE", "gauge",
	  "Total number of retired pages due to single-bit errors.", m_ret_sbe },
	{ "DCGM_FI_DEV_RETIRED_DBE", "gauge",
	  "Total number of retired pages due to double-bit errors.", m_ret_dbe },
	{ "DCGM_FI_DEV_RETIRED_PENDING", "gauge",
	  "Whether a page retirement is pending (1) or not (0).", m_ret_pending },
	{ "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "gauge",
	  "Number of remapped rows for correctable errors.", m_remap_corr },
	{ "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "gauge",
	  "Number of remapped rows for uncorrectable errors.", m_remap_unc },
	{ "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed.",
	  m_remap_fail },
	{ "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge",
	  "Whether a row remapping is pending (reset needed).", m_remap_pending },
	{ "DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", m_pcie_gen },
	{ "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe maximum link generation.",
	  m_pcie_gen_max },
	{ "DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.", m_pcie_width },
	{ "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe maximum link width.",
	  m_pcie_width_max },
	{ "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "gauge", "Total number of PCIe retries.", m_replay },
	{ "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "gauge",
	  "Total number of NVLink flow-control CRC errors.", m_nvl_flit },
	{ "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "gauge",
	  "Total number of NVLink data CRC errors.", m_nvl_data },
	{ "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "gauge", "Total number of NVLink retries.",
	  m_nvl_replay },
	{ "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "gauge",
	  "Total number of NVLink recovery errors.", m_nvl_recovery },
	{ "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", m_xid },
	{ "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", m_fb_used },
	{ "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", m_fb_free },
	{ "kiln_gpu_nvlink_down", "gauge", "NVLink links that are down.", m_nvl_down },
	{ "kiln_gpu_persistence_mode", "gauge", "Persistence mode on (1) or off (0).",
	  m_persistence },
};

/* Appends a sample value: integers (most of them) without printf. */
static void value(kiln_strbuf *b, double v)
{
	char buf[32];
	if (v >= 0 && v < 1e15 && v == (double) (uint64_t) v) {
		char *p = buf + sizeof(buf);
		uint64_t x = (uint64_t) v;
		*--p = 0;
		do
			*--p = (char) ('0' + x % 10);
		while (x /= 10);
		kiln_strbuf_append(b, p);
	} else {
		snprintf(buf, sizeof(buf), "%.17g", v);
		kiln_strbuf_append(b, buf);
	}
}

int hd_metrics_render(const hd_node *n, const char *host, kiln_strbuf *b)
{
	/* the label set of each GPU, rendered once */
	kiln_strbuf lab[HD_GPUS_MAX];
	for (int k = 0; k < n->n_gpus; k++) {
		kiln_strbuf_init(&lab[k]);
		labels(&lab[k], &n->gpus[k], host);
		kiln_strbuf_append(&lab[k], "} ");
	}
	for (size_t i = 0; i < ARRAY_SIZE(metrics); i++) {
		const metric *m = &metrics[i];
		kiln_strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name,
				   m->type);
		for (int k = 0; k < n->n_gpus; k++) {
			double v;
			if (!m->get(&n->gpus[k], &v))
				continue;
			kiln_strbuf_append(b, m->name);
			if (lab[k].s)
				kiln_strbuf_append_n(b, lab[k].s, lab[k].len);
			value(b, v);
			kiln_strbuf_append_n(b, "\n", 1);
		}
	}
	for (int k = 0; k < n->n_gpus; k++)
		kiln_strbuf_free(&lab[k]);

	kiln_strbuf_append(b, "# HELP kiln_gpu_health GPU health state (1 for the current state).\n"
			      "# TYPE kiln_gpu_health gauge\n");
	for (int k = 0; k < n->n_gpus; k++)
		for (hd_state s = HD_HEALTHY; s <= HD_UNHEALTHY; s++) {
			kiln_strbuf_append(b, "kiln_gpu_health");
			labels(b, &n->gpus[k], host);
			kiln_strbuf_printf(b, ",state=\"%s\"} %d\n", hd_state_to_string(s),
					   n->gpus[k].state == s);
		}
	kiln_strbuf_append(b,
			   "# HELP kiln_node_health Node health state (1 for the current state).\n"
			   "# TYPE kiln_node_health gauge\n");
	for (hd_state s = HD_HEALTHY; s <= HD_UNHEALTHY; s++) {
		kiln_strbuf_append(b, "kiln_node_health{Hostname=\"");
		label_escaped(b, host);
		kiln_strbuf_printf(b, "\",state=\"%s\"} %d\n", hd_state_to_string(s),
				   n->state == s);
	}
	kiln_strbuf_append(
		b, "# HELP kiln_xid_total XID errors seen since the daemon started, by XID.\n"
		   "# TYPE kiln_xid_total counter\n");
	for (int k = 0; k < n->n_gpus; k++) {
		const hd_gpu *g = &n->gpus[k];
		for (int x = 0; x < g->n_xids; x++) {
			kiln_strbuf_append(b, "kiln_xid_total");
			labels(b, g, host);
			kiln_strbuf_printf(b, ",xid=\"%d\"} %llu\n", g->xids[x].xid,
					   (unsigned long long) g->xids[x].count);
		}
		if (g->xid_other) {
			kiln_strbuf_append(b, "kiln_xid_total");
			labels(b, g, host);
			kiln_strbuf_printf(b, ",xid=\"other\"} %llu\n",
					   (unsigned long long) g->xid_other);
		}
	}
	kiln_strbuf_append(b,
			   "# HELP kiln_gpu_slurm_job The Slurm job running on a GPU (1 per job).\n"
			   "# TYPE kiln_gpu_slurm_job gauge\n");
	for (int k = 0; k < n->n_gpus; k++) {
		const hd_gpu *g = &n->gpus[k];
		char ids[sizeof(g->job_ids)];
		snprintf(ids, sizeof(ids), "%s", g->job_ids);
		char *save = NULL;
		for (char *t = strtok_r(ids, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
			kiln_strbuf_append(b, "kiln_gpu_slurm_job");
			labels(b, g, host);
			kiln_strbuf_append(b, ",job=\"");
			label_escaped(b, t);
			kiln_strbuf_append(b, "\"} 1\n");
		}
	}
	kiln_strbuf_printf(
		b,
		"# HELP kiln_healthd_polls_total Poll cycles since the daemon started.\n"
		"# TYPE kiln_healthd_polls_total counter\nkiln_healthd_polls_total %llu\n",
		(unsigned long long) n->polls);
	return kiln_strbuf_error(b);
}

static void reasons_join(const hd_reasons *r, kiln_strbuf *b)
{
	for (int i = 0; i < r->n; i++)
		kiln_strbuf_printf(b, "%s%s", i ? "; " : "", r->v[i].text);
}

int hd_table_render(const hd_node *n, const char *host, kiln_strbuf *b)
{
	kiln_strbuf_printf(b, "%-4s %-26s %-14s %6s %8s  %-10s %s\n", "GPU", "MODEL", "PCI", "TEMP",
			   "POWER", "STATE", "REASONS");
	for (int i = 0; i < n->n_gpus; i++) {
		const hd_gpu *g = &n->gpus[i];
		char t[16] = "-", p[16] = "-";
		if (g->cur.has_temp)
			snprintf(t, sizeof(t), "%u C", g->cur.temp_c);
		if (g->cur.has_power)
			snprintf(p, sizeof(p), "%.0f W", g->cur.power_w);
		kiln_strbuf_printf(b, "%-4d %-26.26s %-14.14s %6s %8s  %-10s ", i,
				   g->cur.name[0] ? g->cur.name : "?",
				   g->cur.pci_bus_id[0]
					   ? g->cur.pci_bus_id +
						     (strlen(g->cur.pci_bus_id) > 12 ? 4 : 0)
					   : "?",
				   t, p, hd_state_to_string(g->state));
		reasons_join(&g->reasons, b);
		kiln_strbuf_append(b, "\n");
	}
	kiln_strbuf_printf(b, "node %s: %s", host, hd_state_to_string(n->state));
	if (n->reasons.n) {
		kiln_strbuf_append(b, " (");
		reasons_join(&n->reasons, b);
		kiln_strbuf_append(b, ")");
	}
	kiln_strbuf_append(b, "\n");
	return kiln_strbuf_error(b);
}

static json_t *reasons_json(const hd_reasons *r)
{
	json_t *a = json_array();
	for (int i = 0; i < r->n; i++)
		json_array_append_new(a, json_pack("{s:s, s:s}", "severity",
						   hd_state_to_string(r->v[i].severity), "text",
						   r->v[i].text));
	return a;
}

static void set_opt(json_t *o, const char *k, bool has, json_t *v)
{
	json_object_set_new(o, k, has ? v : json_null());
	if (!has)
		json_decref(v);
}

int hd_json_render(const hd_node *n, const char *host, kiln_strbuf *b)
{
	json_t *root = json_object(), *gpus = json_array();
	if (!root || !gpus) {
		json_decref(root);
		json_decref(gpus);
		return -ENOMEM;
	}
	json_object_set_new(root, "node", json_string(host));
	json_object_set_new(root, "state", json_string(hd_state_to_string(n->state)));
	json_object_set_new(root, "reasons", reasons_json(&n->reasons));
	char why[HD_SLURM_REASON_MAX];
	json_object_set_new(root, "drain_reason",
			    hd_node_drain_reason(n, why, sizeof(why)) ? json_string(why)
								      : json_null());
	for (int i = 0; i < n->n_gpus; i++) {
		const hd_gpu *g = &n->gpus[i];
		const hd_sample *s = &g->cur;
		json_t *o = json_pack("{s:i, s:s, s:s, s:s, s:s}", "index", i, "name", s->name,
				      "uuid", s->uuid, "pci_bus_id", s->pci_bus_id, "state",
				      hd_state_to_string(g->state));
		json_object_set_new(o, "reasons", reasons_json(&g->reasons));
		set_opt(o, "temperature_c", s->has_temp, json_integer(s->temp_c));
		set_opt(o, "slowdown_c", s->has_slowdown, json_integer(s->slowdown_c));
		set_opt(o, "power_w", s->has_power, json_real(s->power_w));
		set_opt(o, "power_limit_w", s->has_power_limit, json_real(s->power_limit_w));
		set_opt(o, "ecc_dbe_volatile", s->has_ecc, json_integer((json_int_t) s->dbe_vol));
		set_opt(o, "ecc_sbe_volatile", s->has_ecc, json_integer((json_int_t) s->sbe_vol));
		set_opt(o, "remap_pending", s->has_remap, json_boolean(s->remap_pending));
		set_opt(o, "remap_failure", s->has_remap, json_boolean(s->remap_failure));
		set_opt(o, "pcie_link_width", s->has_pcie_width, json_integer(s->pcie_width));
		set_opt(o, "pcie_link_gen", s->has_pcie_gen, json_integer(s->pcie_gen));
		set_opt(o, "nvlink_down", s->has_nvlink, json_integer(s->nvlink_down));
		set_opt(o, "persistence_mode", s->has_persistence, json_boolean(s->persistence));
		json_object_set_new(o, "last_xid", json_integer(g->last_xid));
		json_array_append_new(gpus, o);
	}
	json_object_set_new(root, "gpus", gpus);
	char *txt = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!txt)
		return -ENOMEM;
	kiln_strbuf_append(b, txt);
	kiln_strbuf_append(b, "\n");
	free(txt);
	return kiln_strbuf_error(b);
}
