/* output.c — what kiln-healthd shows: Prometheus metrics, the --check table
 * and its JSON form.
 *
 * Metric names and labels are dcgm-exporter's (DCGM_FI_DEV_* with gpu, UUID,
 * pci_bus_id, device, modelName, Hostname) so existing Grafana dashboards
 * work unchanged; kiln_* metrics add what dcgm-exporter lacks: the health
 * state, a count per XID (dcgm-exporter's gauge only holds the last one),
 * and the Slurm job on each GPU.  The per-GPU values and their names come
 * from the check table (hd_checks()); the text format from kiln/metrics.h. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "healthd.h"
#include "kiln/metrics.h"

/* The label set of one GPU, dcgm-exporter's, plus room for one more label
 * (state, xid, job) and the terminating NULL. */
typedef struct gpu_labels {
	char gpu[16], device[24];
	const char *v[6 * 2 + 2 + 1];
} gpu_labels;

static const char *const *labels(gpu_labels *l, const hd_gpu *g, const char *host,
				 const char *extra, const char *extra_value)
{
	snprintf(l->gpu, sizeof(l->gpu), "%d", g->index);
	snprintf(l->device, sizeof(l->device), "nvidia%u", g->cur.minor);
	const char *v[] = { "gpu",	 l->gpu,       "UUID",
			    g->cur.uuid, "pci_bus_id", g->cur.pci_bus_id,
			    "device",	 l->device,    "modelName",
			    g->cur.name, "Hostname",   host,
			    extra,	 extra_value,  NULL };
	memcpy(l->v, v, sizeof(v));
	return l->v;
}

/* A value of the GPU's current sample is exported only while the GPU answers. */
static bool metric_value(const hd_value *v, const hd_gpu *g, double *ret)
{
	if (v->has != HD_VALUE_ALWAYS && (!g->cur.present || g->cur.lost))
		return false;
	return hd_value_get(v, g, ret);
}

int hd_metrics_render(const hd_node *n, const char *host, kiln_strbuf *b)
{
	kiln_metrics m;
	gpu_labels l;
	size_t n_checks;
	const hd_check *checks = hd_checks(&n_checks);
	kiln_metrics_init(&m, b);
	for (size_t c = 0; c < n_checks; c++)
		for (const hd_value *v = checks[c].values; v < hd_check_values_end(&checks[c]);
		     v++) {
			if (!v->metric)
				continue;
			kiln_metrics_family(&m, v->metric, KILN_METRIC_GAUGE, v->help);
			for (int k = 0; k < n->n_gpus; k++) {
				double x;
				if (metric_value(v, &n->gpus[k], &x))
					kiln_metrics_sample(
						&m, labels(&l, &n->gpus[k], host, NULL, NULL), x);
			}
		}

	kiln_metrics_family(&m, "kiln_gpu_health", KILN_METRIC_GAUGE,
			    "GPU health state (1 for the current state).");
	for (int k = 0; k < n->n_gpus; k++)
		for (hd_state s = HD_HEALTHY; s <= HD_UNHEALTHY; s++)
			kiln_metrics_sample(
				&m, labels(&l, &n->gpus[k], host, "state", hd_state_to_string(s)),
				n->gpus[k].state == s);
	kiln_metrics_family(&m, "kiln_node_health", KILN_METRIC_GAUGE,
			    "Node health state (1 for the current state).");
	for (hd_state s = HD_HEALTHY; s <= HD_UNHEALTHY; s++)
		kiln_metrics_sample(
			&m,
			(const char *[]){ "Hostname", host, "state", hd_state_to_string(s), NULL },
			n->state == s);
	kiln_metrics_family(&m, "kiln_xid_total", KILN_METRIC_COUNTER,
			    "XID errors seen since the daemon started, by XID.");
	for (int k = 0; k < n->n_gpus; k++) {
		const hd_gpu *g = &n->gpus[k];
		for (int x = 0; x < g->n_xids; x++) {
			char xid[16];
			snprintf(xid, sizeof(xid), "%d", g->xids[x].xid);
			kiln_metrics_sample(&m, labels(&l, g, host, "xid", xid),
					    (double) g->xids[x].count);
		}
		if (g->xid_other)
			kiln_metrics_sample(&m, labels(&l, g, host, "xid", "other"),
					    (double) g->xid_other);
	}
	kiln_metrics_family(&m, "kiln_gpu_slurm_job", KILN_METRIC_GAUGE,
			    "The Slurm job running on a GPU (1 per job).");
	for (int k = 0; k < n->n_gpus; k++) {
		const hd_gpu *g = &n->gpus[k];
		char ids[sizeof(g->job_ids)];
		snprintf(ids, sizeof(ids), "%s", g->job_ids);
		char *save = NULL;
		for (char *t = strtok_r(ids, ",", &save); t; t = strtok_r(NULL, ",", &save))
			kiln_metrics_sample(&m, labels(&l, g, host, "job", t), 1);
	}
	kiln_metrics_family(&m, "kiln_healthd_polls_total", KILN_METRIC_COUNTER,
			    "Poll cycles since the daemon started.");
	kiln_metrics_sample(&m, NULL, (double) n->polls);
	return kiln_metrics_finish(&m);
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

static json_t *value_json(const hd_value *v, const hd_gpu *g)
{
	double x;
	if (!hd_value_get(v, g, &x))
		return json_null();
	switch (v->type) {
	case HD_VALUE_DOUBLE:
		return json_real(x);
	case HD_VALUE_BOOL:
		return json_boolean(x != 0);
	default:
		return json_integer((json_int_t) x);
	}
}

int hd_json_render(const hd_node *n, const char *host, kiln_strbuf *b)
{
	size_t n_checks;
	const hd_check *checks = hd_checks(&n_checks);
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
		for (size_t c = 0; c < n_checks; c++)
			for (const hd_value *v = checks[c].values;
			     v < hd_check_values_end(&checks[c]); v++)
				if (v->json)
					json_object_set_new(o, v->json, value_json(v, g));
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
