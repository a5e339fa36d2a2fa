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
	kiln_engine_stats s = {};
	pthread_mutex_lock(&e->lock);
	s.waiting = e->n_waiting;
	s.running = e->n_running;
	memcpy(s.requests_finished, e->finished, sizeof(s.requests_finished));
	s.prompt_tokens = e->prompt_tokens;
	s.prefill_tokens = e->prefill_tokens;
	s.generated_tokens = e->generated;
	s.preemptions = e->preemptions;
	s.steps = e->steps;
	s.prefix_queries = e->prefix_queries;
	s.prefix_hits = e->prefix_hits;
	s.requests_rejected = e->rejected;
	s.prefix_entries = e->n_retained;
	s.prefix_blocks = e->prefix_blocks;
	s.prefix_evictions = e->prefix_evictions;
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

enum {
	MX_RUNNING,
	MX_WAITING,
	MX_KV_PERC,
	MX_KV_USED,
	MX_KV_FREE,
	MX_PREEMPT,
	MX_PROMPT,
	MX_PREFILL,
	MX_GEN,
	MX_STEPS,
	MX_PQ,
	MX_PH,
	MX_PBLOCKS,
	MX_PEVICT,
	MX_REJECTED
};

static double stat_value(const kiln_engine_stats *s, int what)
{
	switch (what) {
	case MX_RUNNING:
		return s->running;
	case MX_WAITING:
		return s->waiting;
	case MX_KV_PERC:
		return s->kv_blocks_total ? (double) s->kv_blocks_used / s->kv_blocks_total : 0;
	case MX_KV_USED:
		return s->kv_blocks_used;
	case MX_KV_FREE:
		return s->kv_blocks_total - s->kv_blocks_used;
	case MX_PREEMPT:
		return (double) s->preemptions;
	case MX_PROMPT:
		return (double) s->prompt_tokens;
	case MX_PREFILL:
		return (double) s->prefill_tokens;
	case MX_GEN:
		return (double) s->generated_tokens;
	case MX_STEPS:
		return (double) s->steps;
	case MX_PQ:
		return (double) s->prefix_queries;
	case MX_PH:
		return (double) s->prefix_hits;
	case MX_PBLOCKS:
		return s->prefix_blocks;
	case MX_PEVICT:
		return (double) s->prefix_evictions;
	default:
		return (double) s->requests_rejected;
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
		int what;
		const char *label, *value; /* an extra label, or NULL */
	} fams[] = {
		{ "vllm:num_requests_running", KILN_METRIC_GAUGE,
		  "Requests in the running batch (holding KV cache blocks).", MX_RUNNING, NULL,
		  NULL },
		{ "vllm:num_requests_waiting", KILN_METRIC_GAUGE,
		  "Requests queued for admission (new or preempted).", MX_WAITING, NULL, NULL },
		{ "vllm:kv_cache_usage_perc", KILN_METRIC_GAUGE,
		  "Fraction of KV cache blocks in use (0..1).", MX_KV_PERC, NULL, NULL },
		{ "kiln_inferd_kv_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks of 16 tokens, by state.", MX_KV_USED, "state", "used" },
		{ "kiln_inferd_kv_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks of 16 tokens, by state.", MX_KV_FREE, "state", "free" },
		{ "vllm:num_preemptions_total", KILN_METRIC_COUNTER,
		  "Running requests preempted (recomputed later) for KV cache room.", MX_PREEMPT,
		  NULL, NULL },
		{ "vllm:prompt_tokens_total", KILN_METRIC_COUNTER,
		  "Prompt tokens of accepted requests.", MX_PROMPT, NULL, NULL },
		{ "kiln_inferd_prefill_tokens_total", KILN_METRIC_COUNTER,
		  "Tokens run through prefill, recomputation after preemption included.",
		  MX_PREFILL, NULL, NULL },
		{ "vllm:generation_tokens_total", KILN_METRIC_COUNTER,
		  "Tokens generated and delivered.", MX_GEN, NULL, NULL },
		{ "kiln_inferd_engine_steps_total", KILN_METRIC_COUNTER,
		  "Forward steps run by the scheduler.", MX_STEPS, NULL, NULL },
		{ "vllm:prefix_cache_queries_total", KILN_METRIC_COUNTER,
		  "Prompt tokens looked up in the prefix cache.", MX_PQ, NULL, NULL },
		{ "vllm:prefix_cache_hits_total", KILN_METRIC_COUNTER,
		  "Prompt tokens shared from a running sequence or a kept prefix instead of "
		  "prefilled.",
		  MX_PH, NULL, NULL },
		{ "kiln_inferd_prefix_cache_blocks", KILN_METRIC_GAUGE,
		  "KV cache blocks held by finished requests' kept prefixes (freed on demand).",
		  MX_PBLOCKS, NULL, NULL },
		{ "kiln_inferd_prefix_cache_evictions_total", KILN_METRIC_COUNTER,
		  "Kept prefixes evicted (least recently used) for room.", MX_PEVICT, NULL, NULL },
		{ "kiln_inferd_num_requests_rejected_total", KILN_METRIC_COUNTER,
		  "Requests refused because max_waiting requests were queued (HTTP 429).",
		  MX_REJECTED, NULL, NULL },
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
					    stat_value(&st[i], fams[f].what));
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
