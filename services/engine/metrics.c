/* metrics.c — the engine's numbers: kiln_engine_get_stats (a consistent
 * copy of the counters, taken under the lock) and kiln_engine_metrics
 * (those of several engines in Prometheus text, named after vLLM's
 * metrics so a vLLM dashboard works unchanged).
 *
 * It exists apart from engine.c because the metric names, help texts and
 * buckets are a table an operator reads, not scheduling logic. */
#include <stddef.h>
#include <string.h>

#include "engine-internal.h"
#include "kiln/macro.h"

void kiln_engine_get_stats(kiln_engine *e, kiln_engine_stats *ret)
{
	if (!e || !ret)
		return;
	pthread_mutex_lock(&e->lock);
	kiln_engine_stats s = e->counters;
	s.waiting = e->n_waiting;
	s.running = e->n_running;
	s.prefix_entries = e->n_retained;
	s.prefix_blocks = e->prefix_blocks;
	s.kv_blocks_total = e->num_blocks;
	s.kv_blocks_used = e->num_blocks - e->kv_free - e->prefix_only;
	pthread_mutex_unlock(&e->lock);
	*ret = s;
}

/* The names are vLLM's (docs.vllm.ai, "Production Metrics"; v1 names
 * where v0 and v1 differ: kv_cache_usage_perc, prefix_cache_*,
 * inter_token_latency_seconds) with a model_name label, so a dashboard
 * built for vLLM works unchanged; kiln's own extras keep the vllm: prefix
 * only where vLLM has the same meaning and are kiln_inferd_* otherwise.
 * vLLM's finished_reason words are stop, length and abort (a cancel). */
static const char *finished_reason(kiln_engine_finish f)
{
	return f == KILN_ENGINE_FINISH_CANCELLED ? "abort" : kiln_engine_finish_name(f);
}

/* Where a family's value is in kiln_engine_stats: an int or a uint64_t
 * field (by offset: one table row per family, no switch to keep in step
 * with it), or one of the two values derived from the KV cache's. */
typedef enum { V_INT, V_U64, V_KV_PERC, V_KV_FREE } value_kind;
#define INT_FIELD(f) V_INT, offsetof(kiln_engine_stats, f)
#define U64_FIELD(f) V_U64, offsetof(kiln_engine_stats, f)

static double stat_value(const kiln_engine_stats *s, value_kind kind, size_t off)
{
	const char *field = (const char *) s + off;
	switch (kind) {
	case V_INT:
		return *(const int *) field;
	case V_U64:
		return (double) *(const uint64_t *) field;
	case V_KV_PERC:
		return s->kv_blocks_total ? (double) s->kv_blocks_used / s->kv_blocks_total : 0;
	default:
		return s->kv_blocks_total - s->kv_blocks_used;
	}
}

int kiln_engine_metrics(kiln_engine *const *engines, const char *const *names, int n,
			kiln_metrics *m)
{
	assert_return(engines && names && n >= 0 && m, -EINVAL);
	static const struct {
		const char *name;
		kiln_metric_type type;
		const char *help;
		value_kind kind;
		size_t off;
		const char *label, *value; /* an extra label, or NULL */
	} fams[] = {
		{ "vllm:num_requests_running", KILN_METRIC_GAUGE,
		  "Requests in the running batch (holding KV cache blocks).", INT_FIELD(running),
		  NULL, NULL },
		{ "vllm:num_requests_waiting", KILN_METRIC_GAUGE,
		  "Requests queued for admission (new or preempted).", INT_FIELD(waiting), NULL,
		  NULL },
		{ "vllm:kv_cache_usage_perc", KILN_METRIC_GAUGE,
		  "Fraction of KV cache blocks in use (0..1).", V_KV_PERC, 0, NULL, NULL },
		{ "kiln_inferd_kv_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks of 16 tokens, by state.", INT_FIELD(kv_blocks_used), "state",
		  "used" },
		{ "kiln_inferd_kv_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks of 16 tokens, by state.", V_KV_FREE, 0, "state", "free" },
		{ "vllm:num_preemptions_total", KILN_METRIC_COUNTER,
		  "Running requests preempted (recomputed later) for KV cache room.",
		  U64_FIELD(preemptions), NULL, NULL },
		{ "vllm:prompt_tokens_total", KILN_METRIC_COUNTER,
		  "Prompt tokens of accepted requests.", U64_FIELD(prompt_tokens), NULL, NULL },
		{ "kiln_inferd_prefill_tokens_total", KILN_METRIC_COUNTER,
		  "Tokens run through prefill, recomputation after preemption included.",
		  U64_FIELD(prefill_tokens), NULL, NULL },
		{ "vllm:generation_tokens_total", KILN_METRIC_COUNTER,
		  "Tokens generated and delivered.", U64_FIELD(generated_tokens), NULL, NULL },
		{ "kiln_inferd_engine_steps_total", KILN_METRIC_COUNTER,
		  "Forward steps run by the scheduler.", U64_FIELD(steps), NULL, NULL },
		{ "vllm:prefix_cache_queries_total", KILN_METRIC_COUNTER,
		  "Prompt tokens looked up in the prefix cache.", U64_FIELD(prefix_queries), NULL,
		  NULL },
		{ "vllm:prefix_cache_hits_total", KILN_METRIC_COUNTER,
		  "Prompt tokens shared from a running sequence or a kept prefix instead of "
		  "prefilled.",
		  U64_FIELD(prefix_hits), NULL, NULL },
		{ "kiln_inferd_prefix_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks held by finished requests' kept prefixes (freed on demand).",
		  INT_FIELD(prefix_blocks), NULL, NULL },
		{ "kiln_inferd_prefix_cache_evictions_total", KILN_METRIC_COUNTER,
		  "Kept prefixes evicted (least recently used) for room.",
		  U64_FIELD(prefix_evictions), NULL, NULL },
		{ "kiln_inferd_num_requests_rejected_total", KILN_METRIC_COUNTER,
		  "Requests refused because max_waiting requests were queued (HTTP 429).",
		  U64_FIELD(requests_rejected), NULL, NULL },
	};
	kiln_engine_stats st[n > 0 ? n : 1];
	for (int i = 0; i < n; i++)
		kiln_engine_get_stats(engines[i], &st[i]);
	for (size_t f = 0; f < ARRAY_SIZE(fams); f++) {
		kiln_metrics_family(m, fams[f].name, fams[f].type, fams[f].help);
		for (int i = 0; i < n; i++)
			kiln_metrics_sample(m,
					    (const char *[]){ "model_name", names[i], fams[f].label,
							      fams[f].value, NULL },
					    stat_value(&st[i], fams[f].kind, fams[f].off));
	}
	kiln_metrics_family(m, "vllm:request_success_total", KILN_METRIC_COUNTER,
			    "Finished requests by finish reason (stop, length, abort, error).");
	for (int i = 0; i < n; i++)
		for (int f = 0; f < 4; f++)
			kiln_metrics_sample(m,
					    (const char *[]){ "model_name", names[i],
							      "finished_reason", finished_reason(f),
							      NULL },
					    (double) st[i].requests_finished[f]);
	static const struct {
		const char *name, *help;
		size_t off;
	} hists[] = {
		{ "vllm:time_to_first_token_seconds",
		  "Time from submit to the first generated token.", offsetof(kiln_engine, ttft) },
		{ "vllm:inter_token_latency_seconds",
		  "Time between consecutive tokens of one request.", offsetof(kiln_engine, itl) },
		{ "vllm:e2e_request_latency_seconds", "Time from submit to the finish, any reason.",
		  offsetof(kiln_engine, e2e) },
		{ "vllm:request_queue_time_seconds",
		  "Time from submit to the first admission into the running batch.",
		  offsetof(kiln_engine, queue) },
	};
	for (size_t h = 0; h < ARRAY_SIZE(hists); h++) {
		kiln_metrics_family(m, hists[h].name, KILN_METRIC_HISTOGRAM, hists[h].help);
		for (int i = 0; i < n; i++)
			kiln_metrics_histogram_from(
				m, (const char *[]){ "model_name", names[i], NULL },
				(kiln_histogram *) (void *) ((char *) engines[i] + hists[h].off));
	}
	return m->error;
}
