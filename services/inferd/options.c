/* options.c — kiln-inferd's settings: the command line (options[],
 * --model PATH[,KEY=VALUE...]) over the cluster file's inference section
 * over the schema's defaults, into inferd_arg.
 *
 * It exists apart from main.c because the three sources and their merge
 * (a flag wins over the file, the file over the schema; several models
 * from --model or inference.models) are one concern with many cases, and
 * the daemon's life in main.c does not depend on where a setting came
 * from. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <inttypes.h>
#include <unistd.h>
#include <strings.h>
#include <sys/stat.h>

#include "program.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

#define CHAT_TEMPLATES "chatml llama2 llama3 mistral gemma phi3 zephyr"

static const kiln_option options[] = {
	{ "model", 'm', "FILE[,KEY=VALUE...]",
	  "a model to serve: llama2.c, safetensors (kiln-train's,\n"
	  "or Hugging Face with config.json beside it), GGUF\n"
	  "llama; repeat it to serve several (each routed by its\n"
	  "name).  KEYs: name, tokenizer, dtype, context-length,\n"
	  "kv-blocks, kv-cache-mb, chat-template (default: the\n"
	  "options of the same name)",
	  "file" },
	{ "name", OPT_NAME, "NAME",
	  "model name in the API (default: the file's base name;\none --model only)", NULL },
	{ "api-keys-file", OPT_API_KEYS, "FILE",
	  "API keys, one a line ('#' comments): every request\n"
	  "but /health and /metrics needs \"Authorization:\n"
	  "Bearer KEY\" (401 otherwise); refused when others may\n"
	  "read the file",
	  "file" },
	{ "metrics-auth", OPT_METRICS_AUTH, NULL, "GET /metrics needs a key too (/health never)",
	  NULL },
	{ "memory-budget", OPT_MEMORY_BUDGET, "SIZE",
	  "memory the models may take together (weights + KV\n"
	  "cache, estimated per model; more is refused at\n"
	  "start); default: the cgroup's or the machine's memory\n"
	  "on cpu, no check on cuda",
	  NULL },
	{ "listen", 'l', "ADDR", "address to listen on (inference.address, default 127.0.0.1)",
	  "host" },
	{ "port", 'p', "N", "port (inference.port, default 8000; 0: an ephemeral one, logged)",
	  NULL },
	{ "backend", OPT_BACKEND, "NAME", "kk backend: cpu, cuda or auto (default cpu)",
	  "cpu cuda auto" },
	{ "dtype", OPT_DTYPE, "NAME",
	  "weights: auto, f32, bf16, f16, i8 or q4 (default auto:\n"
	  "as the file stores them, Q8_0 as i8, Q4_0 as q4;\n"
	  "the choice and why are logged)",
	  "auto f32 bf16 f16 i8 q4" },
	{ "context-length", OPT_CONTEXT, "N",
	  "longest sequence served, at most the model's\n(default 0: the model's own)", NULL },
	{ "max-running", OPT_RUNNING, "N", "sequences per step (default 64)", NULL },
	{ "max-step-tokens", OPT_STEP, "N", "tokens per step (default 512)", NULL },
	{ "kv-blocks", OPT_BLOCKS, "N", "KV cache blocks of 16 tokens (default 1024)", NULL },
	{ "max-waiting", OPT_WAITING, "N", "queued requests before 429 (default 1024)", NULL },
	{ "drain-grace", OPT_DRAIN_GRACE, "TIME",
	  "after SIGTERM, time in-flight requests get to\nfinish before they are cancelled "
	  "(default 30s)",
	  NULL },
	{ "eos", OPT_EOS, "ID", "end-of-sequence token, -1 for none (default 2)", NULL },
	{ "prefix-caching", OPT_PREFIX, NULL, "share prompt-prefix KV blocks between requests",
	  NULL },
	{ "threads", OPT_THREADS, "N", "HTTP worker threads (default 4)", NULL },
	{ "cpu-threads", OPT_CPU_THREADS, "N",
	  "cpu backend compute threads, 0 = the CPUs of the affinity mask and cgroup quota "
	  "(default 0)",
	  NULL },
	{ "tokenizer", OPT_TOKENIZER, "FILE",
	  "tokenizer for text prompts and replies: GGUF,\n"
	  "tokenizer.json or llama2.c tokenizer.bin (default:\n"
	  "the model's own when --model is a GGUF holding one)",
	  "file" },
	{ "chat-template", OPT_CHAT_TEMPLATE, "NAME",
	  "chatml, llama2, llama3, mistral, gemma, phi3 or\n"
	  "zephyr (default: detected from the tokenizer's\n"
	  "template, else chatml)",
	  CHAT_TEMPLATES },
	{ "max-connections", OPT_MAX_CONNECTIONS, "N",
	  "open connections; more are refused (default 1024)", NULL },
	{ "max-connections-per-client", OPT_PER_CLIENT, "N",
	  "open connections from one address (default 64)", NULL },
	{ "idle-timeout", OPT_IDLE_TIMEOUT, "SECONDS",
	  "close a connection that sends and reads nothing\n"
	  "for this long (default 30)",
	  NULL },
	{ "max-body-bytes", OPT_MAX_BODY, "N",
	  "request body limit; larger gets 413 before it is\n"
	  "read (default 4194304)",
	  NULL },
	KILN_OPTION_CONFIG,
	KILN_OPTION_NODE,
	KILN_OPTIONS_COMMON,
	{}
};

const kiln_prog inferd_prog = {
	.name = "kiln-inferd",
	.summary = "OpenAI-compatible completions and chat completions on the kiln inference "
		   "engine",
	.usage = "kiln-inferd [-c FILE] [--node NAME] [--model FILE[,name=NAME]]... [OPTIONS]",
	.options = options,
	.epilog = "Serves POST /v1/completions (text or token-id prompts), POST\n"
		  "/v1/chat/completions (\"stream\": true for SSE on both), GET /v1/models,\n"
		  "GET /v1/models/ID, GET /metrics and GET /health.  Without a tokenizer:\n"
		  "token ids only.  Several models: one engine each, a request goes to the\n"
		  "one its \"model\" names (404 model_not_found otherwise).\n"
		  "The cluster file's inference section gives the defaults of every option\n"
		  "above (same names: inference.kv_blocks is --kv-blocks, inference.address\n"
		  "--listen) when this node is one of inference.nodes; a flag wins over the\n"
		  "file.  Without a file the defaults are the schema's (kiln show --defaults).\n"
		  "SIGTERM/SIGINT drain: new requests get 503, those running get\n"
		  "--drain-grace to finish, then the rest are cancelled.  Under systemd\n"
		  "(Type=notify): READY=1 once every model is loaded, WATCHDOG=1 while the\n"
		  "engines make progress.\n"
		  "Exit status: 0 after SIGTERM/SIGINT, 1 failure, 2 usage error.\n",
};

inferd_settings inferd_arg = { .eos = 2, .max_step = 512, .chat = -1 };

/* The weight dtypes --dtype takes (kk_dtype_name spells them), and auto
 * (INFERD_DTYPE_AUTO: decided per model file at load, dtype.c). */
static int parse_dtype(const char *s, int *ret)
{
	static const kk_dtype dts[] = { KK_F32, KK_BF16, KK_F16, KK_I8, KK_Q4 };
	if (s && streq(s, "auto")) {
		*ret = INFERD_DTYPE_AUTO;
		return 0;
	}
	for (size_t i = 0; s && i < ARRAY_SIZE(dts); i++)
		if (streq(s, kk_dtype_name(dts[i]))) {
			*ret = (int) dts[i];
			return 0;
		}
	return -EINVAL;
}

static const char *option_name(int key)
{
	for (const kiln_option *o = options; o->name; o++)
		if (o->key == key)
			return o->name;
	return "?";
}

/* --model PATH[,KEY=VALUE...]: s is argv's own string, split in place.
 * Returns 0 or a usage error (kiln_usage_error's value). */
static int parse_model_spec(char *s, model_spec *m)
{
	char *save = NULL, *kv;
	*m = (model_spec) MODEL_SPEC_UNSET;
	m->path = strtok_r(s, ",", &save);
	if (!m->path || s[0] == ',')
		return kiln_usage_error(&inferd_prog,
					"--model: give the model's file first (--model "
					"FILE[,name=NAME,...]).");
	while ((kv = strtok_r(NULL, ",", &save))) {
		char *v = strchr(kv, '=');
		int r = 0;
		if (!v || v == kv || !v[1])
			return kiln_usage_error(&inferd_prog,
						"--model %s: '%s' is not KEY=VALUE (keys: name, "
						"tokenizer, dtype, context-length, kv-blocks, "
						"kv-cache-mb, chat-template).",
						m->path, kv);
		*v++ = '\0';
		int dt = KK_F32;
		if (streq(kv, "name"))
			m->name = v;
		else if (streq(kv, "tokenizer"))
			m->tokenizer = v;
		else if (streq(kv, "dtype"))
			r = parse_dtype(v, &dt), m->dtype = dt;
		else if (streq(kv, "context-length"))
			r = kiln_parse_int(v, 0, 1 << 24, &m->ctx);
		else if (streq(kv, "kv-blocks"))
			r = kiln_parse_int(v, 1, KM_KV_BLOCKS_MAX, &m->blocks);
		else if (streq(kv, "kv-cache-mb"))
			r = kiln_parse_size(v, 1024 * 1024, &m->kv_bytes) < 0 || !m->kv_bytes
				    ? -EINVAL
				    : 0;
		else if (streq(kv, "chat-template"))
			r = (m->chat = ktok_chat_from_name(v)) < 0 ? -EINVAL : 0;
		else
			return kiln_usage_error(&inferd_prog,
						"--model %s: unknown key '%s' (keys: name, "
						"tokenizer, dtype, context-length, kv-blocks, "
						"kv-cache-mb, chat-template).",
						m->path, kv);
		if (r < 0)
			return kiln_usage_error(&inferd_prog,
						"--model %s: invalid %s '%s' (as --%s takes).",
						m->path, kv, v, kv);
	}
	if (m->blocks && m->kv_bytes)
		return kiln_usage_error(&inferd_prog,
					"--model %s: give kv-blocks or kv-cache-mb, not both.",
					m->path);
	return 0;
}

/* The integer options: each one's range and where it goes. */
static const struct int_option {
	int opt;
	int min, max;
	int *dst;
} int_options[] = {
	{ OPT_CONTEXT, 0, 1 << 24, &inferd_arg.ctx },
	{ 'p', 0, 65535, &inferd_arg.port },
	{ OPT_RUNNING, 1, KM_KV_SEQS_MAX, &inferd_arg.max_running },
	{ OPT_STEP, 1, 1 << 20, &inferd_arg.max_step },
	{ OPT_BLOCKS, 1, KM_KV_BLOCKS_MAX, &inferd_arg.blocks },
	{ OPT_WAITING, 1, KILN_ENGINE_WAITING_MAX, &inferd_arg.max_waiting },
	{ OPT_EOS, -1, KM_VOCAB_MAX, &inferd_arg.eos },
	{ OPT_THREADS, 1, 256, &inferd_arg.threads },
	{ OPT_CPU_THREADS, 0, KK_THREADS_MAX, &inferd_arg.cpu_threads },
	{ OPT_MAX_CONNECTIONS, 1, 1 << 20, &inferd_arg.max_conns },
	{ OPT_PER_CLIENT, 1, 1 << 20, &inferd_arg.per_client },
	{ OPT_IDLE_TIMEOUT, 1, 3600, &inferd_arg.idle_timeout },
	{ OPT_MAX_BODY, 1024, 1 << 30, &inferd_arg.max_body },
};

static const struct int_option *int_option(int opt)
{
	for (size_t i = 0; i < ARRAY_SIZE(int_options); i++)
		if (int_options[i].opt == opt)
			return &int_options[i];
	return NULL;
}

int inferd_parse_argv(int argc, char **argv)
{
	int c;
	while ((c = kiln_getopt(&inferd_prog, argc, argv)) >= 0) {
		const struct int_option *io;
		int r = 0;
		if (c >= 0 && c < OPT_MAX_)
			inferd_arg.given[c] = true;
		switch (c) {
		case 'c':
			inferd_arg.config = optarg;
			break;
		case KILN_OPT_NODE:
			inferd_arg.node = optarg;
			break;
		case OPT_DRAIN_GRACE:
			r = kiln_parse_duration(optarg, KILN_USEC_PER_SEC,
						&inferd_arg.drain_grace_usec);
			if (r >= 0 && inferd_arg.drain_grace_usec > 86400 * KILN_USEC_PER_SEC)
				r = -ERANGE;
			break;
		case 'm':
			if (inferd_arg.n_models == INFERD_MODELS_MAX)
				return kiln_usage_error(&inferd_prog, "At most %d --model options.",
							INFERD_MODELS_MAX);
			if ((r = parse_model_spec(optarg,
						  &inferd_arg.models[inferd_arg.n_models++])) < 0)
				return r;
			break;
		case OPT_API_KEYS:
			inferd_arg.api_keys = optarg;
			break;
		case OPT_METRICS_AUTH:
			inferd_arg.metrics_auth = true;
			break;
		case OPT_MEMORY_BUDGET:
			r = kiln_parse_size(optarg, 1024 * 1024, &inferd_arg.memory_budget);
			break;
		case OPT_NAME:
			inferd_arg.name = optarg;
			break;
		case 'l':
			inferd_arg.listen = optarg;
			break;
		case OPT_BACKEND:
			inferd_arg.backend = optarg;
			break;
		case OPT_DTYPE:
			if (parse_dtype(optarg, &inferd_arg.dtype) < 0)
				return kiln_usage_error(
					&inferd_prog,
					"--dtype %s: expected auto, f32, bf16, f16, "
					"i8 or q4.",
					optarg);
			break;
		case OPT_PREFIX:
			inferd_arg.prefix = true;
			break;
		case OPT_TOKENIZER:
			inferd_arg.tokenizer = optarg;
			break;
		case OPT_CHAT_TEMPLATE:
			if ((inferd_arg.chat = ktok_chat_from_name(optarg)) < 0)
				return kiln_usage_error(
					&inferd_prog,
					"--chat-template %s: expected chatml, llama2, "
					"llama3, mistral, gemma, phi3 or zephyr.",
					optarg);
			break;
		default:
			if ((io = int_option(c))) {
				r = kiln_parse_int(optarg, io->min, io->max, io->dst);
				break;
			}
			if ((r = kiln_prog_option(&inferd_prog, c)) <= 0)
				return r;
			r = 0;
		}
		if (r < 0)
			return kiln_usage_error(&inferd_prog, "Invalid value '%s' for --%s.",
						optarg, option_name(c));
	}
	if (optind < argc)
		return kiln_usage_error(&inferd_prog, "Unexpected argument '%s'.", argv[optind]);
	if (inferd_arg.name && inferd_arg.n_models > 1)
		return kiln_usage_error(&inferd_prog,
					"--name names one model; with several --model, "
					"name each: --model FILE,name=NAME.");
	return 1;
}

/* ---- settings: the command line over the cluster file over the schema -- */

/* inference.dtype as a kk dtype or INFERD_DTYPE_AUTO; the older
 * inference.quant says int8/int4 where dtype stays f32 or auto (kiln check
 * refuses the two disagreeing). */
static int cfg_dtype(const kiln_cfg_inference *in)
{
	kiln_cfg_dtype dt = in->dtype;
	const bool plain = dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_AUTO;
	if (plain && in->quant == KILN_QUANT_INT8)
		dt = KILN_DTYPE_I8;
	else if (plain && in->quant == KILN_QUANT_INT4)
		dt = KILN_DTYPE_Q4;
	int k;
	return parse_dtype(kiln_cfg_dtype_to_string(dt), &k) < 0 ? -EINVAL : k;
}

static int cfg_chat(kiln_cfg_chat c)
{
	return c == KILN_CHAT_AUTO ? -1 : ktok_chat_from_name(kiln_cfg_chat_to_string(c));
}

/* Fills what spec m leaves unset: a flag given on the command line first,
 * then fb (the file's value, or the schema's default). */
static int spec_fill(model_spec *m, const model_spec *fb)
{
	if (!m->name && inferd_arg.given[OPT_NAME])
		m->name = inferd_arg.name;
	if (!m->name)
		m->name = fb->name;
	if (!m->tokenizer)
		m->tokenizer =
			inferd_arg.given[OPT_TOKENIZER] ? inferd_arg.tokenizer : fb->tokenizer;
	if (m->dtype == -1)
		m->dtype = inferd_arg.given[OPT_DTYPE] ? inferd_arg.dtype : fb->dtype;
	if (m->chat == -2)
		m->chat = inferd_arg.given[OPT_CHAT_TEMPLATE] ? inferd_arg.chat : fb->chat;
	if (m->ctx < 0)
		m->ctx = inferd_arg.given[OPT_CONTEXT] ? inferd_arg.ctx : fb->ctx;
	if (!m->blocks && !m->kv_bytes) {
		m->blocks = inferd_arg.given[OPT_BLOCKS] ? inferd_arg.blocks : fb->blocks;
		m->kv_bytes = inferd_arg.given[OPT_BLOCKS] ? 0 : fb->kv_bytes;
	}
	if ((m->dtype < 0 && m->dtype != INFERD_DTYPE_AUTO) || m->chat < -1)
		return log_error_errno(-EINVAL,
				       "%s: a dtype or chat template kiln-inferd does not "
				       "know",
				       m->path);
	return 0;
}

/* The cluster file (-c, $KILN_CONFIG, /etc/kiln/cluster.cfg; none is fine)
 * and this node (--node, $SLURMD_NODENAME, the hostname).  On a node of
 * inference.nodes the file's inference section fills every option the
 * command line left out, its models (inference.models, or the flat
 * inference.model) unless --model is given; elsewhere, or without a file,
 * the schema's defaults do (so the program never writes a default twice).
 * *ret keeps the strings arg points to.  Returns 0 or an exit status. */
int inferd_settings_from_cfg(kiln_cfg **ret)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = kiln_cfg_open(inferd_arg.config, KILN_CFG_OPEN_OPTIONAL, &cfg);
	if (r < 0)
		return kiln_exit_for_config(r);
	bool serves = false;
	if (cfg) {
		const char *source;
		char host[KILN_HOSTNAME_MAX + 1];
		if (kiln_node_name(inferd_arg.node, host, sizeof(host), &source) < 0) {
			log_error("The node name from %s is longer than %zu characters.", source,
				  sizeof(host) - 1);
			return KILN_EXIT_USAGE;
		}
		const kiln_cfg_node *n = kiln_cfg_find_node(cfg, host);
		serves = n && n->inference;
		const char *why = !cfg->inference.enabled ? "inference.enabled is false"
				  : !n			  ? "it is not a node of the file"
							  : "it is not one of inference.nodes";
		if (!serves && inferd_arg.n_models == 0) {
			log_error("%s (%s) serves no model in %s: %s; run kiln-inferd on a node of "
				  "inference.nodes (--node NAME), or give --model FILE",
				  host, source, cfg->path, why);
			return KILN_EXIT_USAGE;
		}
		if (!serves)
			log_notice("%s serves no model in %s (%s): serving --model %s with the "
				   "built-in defaults",
				   host, cfg->path, why, inferd_arg.models[0].path);
		else
			log_info("%s: serving the inference section of %s", host, cfg->path);
	}
	if (!serves) {
		kiln_cfg_free(TAKE_PTR(cfg));
		if ((r = kiln_cfg_defaults(&cfg)) < 0)
			return log_error_errno(r, "Failed to build the default settings: %m");
	}
	const kiln_cfg_inference *in = &cfg->inference;
	/* The section's flat keys: what a --model leaves unset. */
	model_spec flat = { .name = inferd_arg.n_models == 1 ? in->name : NULL,
			    .tokenizer = in->tokenizer,
			    .dtype = cfg_dtype(in),
			    .chat = cfg_chat(in->chat_template),
			    .ctx = in->context_length,
			    .blocks = in->kv_blocks };
	if (inferd_arg.n_models == 0)
		for (size_t i = 0; i < in->n_models && i < INFERD_MODELS_MAX; i++) {
			const kiln_cfg_model *cm = &in->models[i];
			inferd_arg.models[inferd_arg.n_models++] = (model_spec) MODEL_SPEC_UNSET;
			flat = (model_spec){ .name = cm->name,
					     .tokenizer = cm->tokenizer,
					     .dtype = -1,
					     .chat = cfg_chat(cm->chat_template),
					     .ctx = cm->context_length,
					     .blocks = cm->kv_blocks,
					     .kv_bytes = cm->kv_cache_mb * 1024 * 1024 };
			if (parse_dtype(kiln_cfg_dtype_to_string(cm->dtype), &flat.dtype) < 0)
				flat.dtype = -1; /* spec_fill says so */
			inferd_arg.models[i].path = cm->path;
			if ((r = spec_fill(&inferd_arg.models[i], &flat)) < 0)
				return KILN_EXIT_USAGE;
		}
	else
		for (int i = 0; i < inferd_arg.n_models; i++)
			if ((r = spec_fill(&inferd_arg.models[i], &flat)) < 0)
				return KILN_EXIT_USAGE;
	if (in->n_models > INFERD_MODELS_MAX && inferd_arg.n_models == INFERD_MODELS_MAX) {
		log_error("%s gives %zu models; kiln-inferd serves at most %d", cfg->path,
			  in->n_models, INFERD_MODELS_MAX);
		return KILN_EXIT_USAGE;
	}
	/* The command line wins over the cluster file. */
#define FROM_FILE(opt, field, value)                \
	do {                                        \
		if (!inferd_arg.given[opt])         \
			inferd_arg.field = (value); \
	} while (0)
	FROM_FILE('l', listen, in->address);
	FROM_FILE('p', port, in->port);
	FROM_FILE(OPT_BACKEND, backend, kiln_cfg_backend_to_string(in->backend));
	FROM_FILE(OPT_RUNNING, max_running, in->max_running);
	FROM_FILE(OPT_WAITING, max_waiting, in->max_waiting);
	FROM_FILE(OPT_DRAIN_GRACE, drain_grace_usec, in->drain_grace_usec);
	FROM_FILE(OPT_MEMORY_BUDGET, memory_budget, in->memory_mb * 1024 * 1024);
	FROM_FILE(OPT_API_KEYS, api_keys, in->api_keys_file);
	FROM_FILE(OPT_METRICS_AUTH, metrics_auth, in->metrics_auth);
	FROM_FILE(OPT_CPU_THREADS, cpu_threads, in->cpu_threads);
#undef FROM_FILE
	if (inferd_arg.n_models == 0) {
		log_error("No model: give --model FILE, or set inference.models (or "
			  "inference.model) in the cluster file (-c FILE) for this node");
		return KILN_EXIT_USAGE;
	}
	*ret = TAKE_PTR(cfg);
	return 0;
}
