/* main.c — kiln-inferd, an OpenAI-compatible completions and chat
 * completions server on the inference engine (kiln/engine.h), libktok and
 * kiln/http.h.
 *
 *   kiln-inferd [-c FILE] [--node NAME] [--model FILE] [options]
 *
 * This file is the program: options and the cluster file's inference
 * section (flags win over the file, the file over the schema's defaults),
 * the models (--model repeated, or inference.models; each any file
 * km_file_open reads: a llama2.c checkpoint, safetensors from kiln-train or
 * Hugging Face, a GGUF llama), each with its own backend (cpu or cuda),
 * tokenizer, chat template and engine after a memory budget check, the API
 * keys, the HTTP routes (a request goes to the model its "model" names), systemd's notify protocol
 * (READY, STATUS, WATCHDOG pings while the engine's scheduler makes progress) and the drain on
 * SIGTERM/SIGINT: new requests get 503 + Retry-After, those in flight get inference.drain_grace to
 * finish, then the server stops (streams are cancelled) and the engine cancels what is left.  The
 * request layer is openai.c, the streaming and stop-string layer stream.c (inferd.h says which does
 * what).  Exit codes: 0 ok, 1 failure, 2 usage error (a tokenizer larger than the model's
 * vocabulary included). docs/kiln-inferd.md. */
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

#include "inferd.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/strbuf.h"

enum {
	OPT_NAME = KILN_OPT_FIRST,
	OPT_BACKEND,
	OPT_DTYPE,
	OPT_RUNNING,
	OPT_STEP,
	OPT_BLOCKS,
	OPT_WAITING,
	OPT_EOS,
	OPT_PREFIX,
	OPT_THREADS,
	OPT_TOKENIZER,
	OPT_CHAT_TEMPLATE,
	OPT_MAX_CONNECTIONS,
	OPT_PER_CLIENT,
	OPT_IDLE_TIMEOUT,
	OPT_MAX_BODY,
	OPT_CONTEXT,
	OPT_DRAIN_GRACE,
	OPT_MEMORY_BUDGET,
	OPT_API_KEYS,
	OPT_METRICS_AUTH,
	OPT_CPU_THREADS,
	OPT_MAX_, /* the size of arg.given[] */
};

/* What a stream cut by SIGTERM ends with (then [DONE]): OpenAI's error
 * shape, which the openai client raises as an APIError mid-stream, rather
 * than a silent end with finish_reason null. */
#define SHUTDOWN_EVENT                                                                        \
	"{\"error\":{\"message\":\"kiln-inferd is shutting down; this stream was cut short. " \
	"Retry the request.\",\"type\":\"server_error\",\"param\":null,\"code\":"             \
	"\"server_shutdown\"}}"

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
	{ "dtype", OPT_DTYPE, "NAME", "weights: f32, bf16, f16, i8 or q4 (default f32)",
	  "f32 bf16 f16 i8 q4" },
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

static const kiln_prog prog = {
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

/* The settings.  The defaults of those the cluster file has (listen, port,
 * backend, dtype, ...) are not written here: they come from the schema
 * (kiln_cfg_defaults()) or the file, in settings_from_cfg(), for every
 * option the command line did not give (given[]). */
/* One model to serve: a --model PATH[,KEY=VALUE...] or an element of
 * inference.models (the flat inference.model keys are one).  Unset: name
 * NULL, tokenizer NULL, dtype -1, chat -2, ctx -1, blocks 0, kv_bytes 0. */
typedef struct model_spec {
	const char *path, *name, *tokenizer;
	int dtype; /* a kk_dtype */
	int chat;  /* a ktok_chat, -1 from the tokenizer */
	int ctx, blocks;
	uint64_t kv_bytes; /* the KV cache's size instead of blocks */
} model_spec;

#define MODEL_SPEC_UNSET                           \
	{                                          \
		.dtype = -1, .chat = -2, .ctx = -1 \
	}

static struct {
	const char *config, *node;
	const char *listen, *name, *backend, *tokenizer, *api_keys;
	bool metrics_auth;
	model_spec models[INFERD_MODELS_MAX];
	int n_models;
	uint64_t memory_budget; /* bytes; 0: the default */
	int port, max_running, max_step, blocks, max_waiting, eos, threads, ctx;
	int max_conns, per_client, idle_timeout, max_body; /* 0: kiln/http.h's defaults */
	int cpu_threads;				   /* 0: kk's default */
	kk_dtype dtype;
	int chat; /* a ktok_chat, or -1: from the tokenizer */
	bool prefix;
	uint64_t drain_grace_usec;
	bool given[OPT_MAX_];
} arg = { .eos = 2, .max_step = 512, .chat = -1 };

DEFINE_TRIVIAL_CLEANUP_FUNC(kk_backend *, kk_backend_free)
DEFINE_TRIVIAL_CLEANUP_FUNC(km_file *, km_file_free)
DEFINE_TRIVIAL_CLEANUP_FUNC(kiln_engine *, kiln_engine_free)

/* The weight dtypes --dtype takes (kk_dtype_name spells them). */
static int parse_dtype(const char *s, kk_dtype *ret)
{
	static const kk_dtype dts[] = { KK_F32, KK_BF16, KK_F16, KK_I8, KK_Q4 };
	for (size_t i = 0; i < ARRAY_SIZE(dts); i++)
		if (streq(s, kk_dtype_name(dts[i]))) {
			*ret = dts[i];
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
		return kiln_usage_error(&prog, "--model: give the model's file first (--model "
					       "FILE[,name=NAME,...]).");
	while ((kv = strtok_r(NULL, ",", &save))) {
		char *v = strchr(kv, '=');
		int r = 0;
		if (!v || v == kv || !v[1])
			return kiln_usage_error(&prog,
						"--model %s: '%s' is not KEY=VALUE (keys: name, "
						"tokenizer, dtype, context-length, kv-blocks, "
						"kv-cache-mb, chat-template).",
						m->path, kv);
		*v++ = '\0';
		kk_dtype dt = KK_F32;
		if (streq(kv, "name"))
			m->name = v;
		else if (streq(kv, "tokenizer"))
			m->tokenizer = v;
		else if (streq(kv, "dtype"))
			r = parse_dtype(v, &dt), m->dtype = (int) dt;
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
			return kiln_usage_error(&prog,
						"--model %s: unknown key '%s' (keys: name, "
						"tokenizer, dtype, context-length, kv-blocks, "
						"kv-cache-mb, chat-template).",
						m->path, kv);
		if (r < 0)
			return kiln_usage_error(&prog,
						"--model %s: invalid %s '%s' (as --%s takes).",
						m->path, kv, v, kv);
	}
	if (m->blocks && m->kv_bytes)
		return kiln_usage_error(
			&prog, "--model %s: give kv-blocks or kv-cache-mb, not both.", m->path);
	return 0;
}

static int parse_argv(int argc, char **argv)
{
	int c;
	while ((c = kiln_getopt(&prog, argc, argv)) >= 0) {
		int r = 0;
		if (c >= 0 && c < OPT_MAX_)
			arg.given[c] = true;
		switch (c) {
		case 'c':
			arg.config = optarg;
			break;
		case KILN_OPT_NODE:
			arg.node = optarg;
			break;
		case OPT_CONTEXT:
			r = kiln_parse_int(optarg, 0, 1 << 24, &arg.ctx);
			break;
		case OPT_DRAIN_GRACE:
			r = kiln_parse_duration(optarg, KILN_USEC_PER_SEC, &arg.drain_grace_usec);
			if (r >= 0 && arg.drain_grace_usec > 86400 * KILN_USEC_PER_SEC)
				r = -ERANGE;
			break;
		case 'm':
			if (arg.n_models == INFERD_MODELS_MAX)
				return kiln_usage_error(&prog, "At most %d --model options.",
							INFERD_MODELS_MAX);
			if ((r = parse_model_spec(optarg, &arg.models[arg.n_models++])) < 0)
				return r;
			break;
		case OPT_API_KEYS:
			arg.api_keys = optarg;
			break;
		case OPT_METRICS_AUTH:
			arg.metrics_auth = true;
			break;
		case OPT_MEMORY_BUDGET:
			r = kiln_parse_size(optarg, 1024 * 1024, &arg.memory_budget);
			break;
		case OPT_NAME:
			arg.name = optarg;
			break;
		case 'l':
			arg.listen = optarg;
			break;
		case 'p':
			r = kiln_parse_int(optarg, 0, 65535, &arg.port);
			break;
		case OPT_BACKEND:
			arg.backend = optarg;
			break;
		case OPT_DTYPE:
			if (parse_dtype(optarg, &arg.dtype) < 0)
				return kiln_usage_error(
					&prog,
					"--dtype %s: expected f32, bf16, f16, i8 or "
					"q4.",
					optarg);
			break;
		case OPT_RUNNING:
			r = kiln_parse_int(optarg, 1, KM_KV_SEQS_MAX, &arg.max_running);
			break;
		case OPT_STEP:
			r = kiln_parse_int(optarg, 1, 1 << 20, &arg.max_step);
			break;
		case OPT_BLOCKS:
			r = kiln_parse_int(optarg, 1, KM_KV_BLOCKS_MAX, &arg.blocks);
			break;
		case OPT_WAITING:
			r = kiln_parse_int(optarg, 1, KILN_ENGINE_WAITING_MAX, &arg.max_waiting);
			break;
		case OPT_EOS:
			r = kiln_parse_int(optarg, -1, KM_VOCAB_MAX, &arg.eos);
			break;
		case OPT_PREFIX:
			arg.prefix = true;
			break;
		case OPT_THREADS:
			r = kiln_parse_int(optarg, 1, 256, &arg.threads);
			break;
		case OPT_CPU_THREADS:
			r = kiln_parse_int(optarg, 0, KK_THREADS_MAX, &arg.cpu_threads);
			break;
		case OPT_MAX_CONNECTIONS:
			r = kiln_parse_int(optarg, 1, 1 << 20, &arg.max_conns);
			break;
		case OPT_PER_CLIENT:
			r = kiln_parse_int(optarg, 1, 1 << 20, &arg.per_client);
			break;
		case OPT_IDLE_TIMEOUT:
			r = kiln_parse_int(optarg, 1, 3600, &arg.idle_timeout);
			break;
		case OPT_MAX_BODY:
			r = kiln_parse_int(optarg, 1024, 1 << 30, &arg.max_body);
			break;
		case OPT_TOKENIZER:
			arg.tokenizer = optarg;
			break;
		case OPT_CHAT_TEMPLATE:
			if ((arg.chat = ktok_chat_from_name(optarg)) < 0)
				return kiln_usage_error(
					&prog,
					"--chat-template %s: expected chatml, llama2, "
					"llama3, mistral, gemma, phi3 or zephyr.",
					optarg);
			break;
		default:
			if ((r = kiln_prog_option(&prog, c)) <= 0)
				return r;
			r = 0;
		}
		if (r < 0)
			return kiln_usage_error(&prog, "Invalid value '%s' for --%s.", optarg,
						option_name(c));
	}
	if (optind < argc)
		return kiln_usage_error(&prog, "Unexpected argument '%s'.", argv[optind]);
	if (arg.name && arg.n_models > 1)
		return kiln_usage_error(&prog, "--name names one model; with several --model, "
					       "name each: --model FILE,name=NAME.");
	return 1;
}

/* Copies token id's text into buf (NUL-terminated); false when the
 * vocabulary has no such token. */
static bool token_text(const ktok *t, int32_t id, char *buf, size_t size)
{
	size_t len = 0;
	const char *s = id >= 0 ? ktok_token_text(t, id, &len) : NULL;
	if (!s || len >= size)
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	return true;
}

/* The tokenizer: --tokenizer FILE, else the model's own when the model is
 * a GGUF file with tokenizer.ggml.* metadata, else none (token ids only:
 * *ret stays NULL).  Then the chat template: --chat-template, else the one
 * the tokenizer's chat_template string is recognised as, else ChatML.
 * Returns 0 or the exit code: KILN_EXIT_FAILURE (an unreadable tokenizer),
 * KILN_EXIT_USAGE (a tokenizer that does not fit the model). */
static int load_tokenizer(const model_spec *spec, inferd_model *m, ktok **ret)
{
	kiln_error te = {};
	char buf[sizeof(te.file) + sizeof(te.msg) + 4];
	const char *path = spec->tokenizer;
	if (!path) {
		char magic[4] = { 0 };
		/* Plain fclose: cppcheck cannot see cleanup attributes. */
		FILE *fp = fopen(spec->path, "re");
		size_t got = fp ? fread(magic, 1, 4, fp) : 0;
		if (fp)
			fclose(fp);
		if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
			log_notice("%s: no --tokenizer: prompts and replies are token ids only",
				   m->name);
			return 0;
		}
		path = spec->path;
	}
	_cleanup_(ktok_freep) ktok *tok = NULL;
	int r = ktok_load(path, &tok, &te);
	if (r < 0 && !spec->tokenizer) {
		log_notice("%s holds no usable tokenizer (%s): prompts and replies are token ids "
			   "only; pass --tokenizer FILE for text",
			   path, kiln_error_format(&te, buf, sizeof(buf)));
		return 0;
	}
	if (r < 0) {
		log_error("--tokenizer: %s", kiln_error_format(&te, buf, sizeof(buf)));
		return KILN_EXIT_FAILURE;
	}
	if (ktok_n_vocab(tok) > (uint32_t) m->vocab) {
		log_error("%s has %u tokens but the model %s only %d: they do not belong together "
			  "(the model could never produce, or read, the extra ids); pass the "
			  "model's own tokenizer",
			  path, ktok_n_vocab(tok), spec->path, m->vocab);
		return KILN_EXIT_USAGE;
	}
	if (!token_text(tok, ktok_bos(tok), m->bos, sizeof(m->bos)))
		snprintf(m->bos, sizeof(m->bos), "<s>");
	if (!token_text(tok, ktok_eos(tok), m->eos, sizeof(m->eos)))
		snprintf(m->eos, sizeof(m->eos), "</s>");
	const char *tmpl = ktok_chat_template(tok);
	if (spec->chat >= 0) {
		m->chat = (ktok_chat) spec->chat;
	} else if (tmpl && (r = ktok_chat_detect(tmpl)) >= 0) {
		m->chat = (ktok_chat) r;
	} else {
		m->chat = KTOK_CHAT_CHATML;
		log_notice("%s: %s; chat completions use ChatML (choose another with "
			   "--chat-template)",
			   path,
			   tmpl ? "its chat template is not one kiln knows" : "no chat template");
	}
	log_info("%s: tokenizer %s, %u tokens, chat template %s", m->name, path, ktok_n_vocab(tok),
		 ktok_chat_name(m->chat));
	m->max_piece = inferd_max_piece(tok);
	m->tok = *ret = TAKE_PTR(tok);
	return 0;
}

/* POST /v1/completions and /v1/chat/completions: the request layer
 * validates, the streaming layer runs it. */
/* Set by the first SIGTERM/SIGINT: new requests get 503 + Retry-After
 * while those in flight finish (drain_step()). */
static atomic_bool draining;

/* What a client refused during the drain is told to wait: about what a
 * restart under systemd takes (RestartSec plus loading a model). */
#define DRAIN_RETRY_AFTER_S 10

/* ---- API keys ------------------------------------------------------------ */

/* Longest key accepted (OpenAI's are ~170 characters), and most keys in a
 * file: bounds the constant-time walk over them. */
#define API_KEY_MAX  256
#define API_KEYS_MAX 4096

/* The keys of --api-keys-file, each NUL-padded to API_KEY_MAX + 1 bytes so
 * every comparison reads the same number of bytes; n 0: no keys, every
 * request is served. */
static struct {
	char (*key)[API_KEY_MAX + 1];
	size_t *len;
	int n;
} keys;

static void keys_free(void)
{
	if (keys.key)
		explicit_bzero(keys.key, (size_t) keys.n * sizeof(*keys.key));
	free(keys.key);
	free(keys.len);
	keys.key = NULL;
	keys.len = NULL;
	keys.n = 0;
}

/* Reads path: one key a line, blank lines and '#' comments skipped,
 * surrounding spaces dropped.  A file other users may read or write is
 * refused (the keys are secrets; chmod o-rwx), as is one without a key.
 * Returns 0 or an exit status. */
static int load_api_keys(const char *path)
{
	_cleanup_fclose_ FILE *f = fopen(path, "re");
	if (!f)
		return log_error_errno(-errno, "--api-keys-file %s: %m", path), KILN_EXIT_FAILURE;
	struct stat st;
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		log_error("--api-keys-file %s: not a regular file", path);
		return KILN_EXIT_FAILURE;
	}
	if (st.st_mode & (S_IROTH | S_IWOTH)) {
		log_error("--api-keys-file %s: other users may read or write it (mode %04o); the "
			  "keys are secrets: chmod o-rwx %s",
			  path, (unsigned) (st.st_mode & 07777), path);
		return KILN_EXIT_FAILURE;
	}
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;
	ssize_t got;
	int lineno = 0, n_alloc = 0;
	while ((got = getline(&line, &cap, f)) >= 0) {
		lineno++;
		char *k = line;
		while (*k == ' ' || *k == '\t')
			k++;
		size_t len = strcspn(k, "\r\n");
		while (len && (k[len - 1] == ' ' || k[len - 1] == '\t'))
			len--;
		k[len] = '\0';
		if (!len || k[0] == '#')
			continue;
		if (len > API_KEY_MAX || k[strcspn(k, " \t")] || keys.n == API_KEYS_MAX) {
			log_error("%s:%d: %s", path, lineno,
				  keys.n == API_KEYS_MAX ? "more than 4096 keys"
				  : len > API_KEY_MAX	 ? "a key longer than 256 characters"
						      : "a key with a space in it (one key a line, "
							"nothing else)");
			explicit_bzero(line, cap);
			return KILN_EXIT_FAILURE;
		}
		if (keys.n == n_alloc) {
			int m = n_alloc ? 2 * n_alloc : 16;
			void *nk = realloc(keys.key, (size_t) m * sizeof(*keys.key));
			if (nk)
				keys.key = nk;
			void *nl = realloc(keys.len, (size_t) m * sizeof(*keys.len));
			if (nl)
				keys.len = nl;
			if (!nk || !nl)
				return log_error_errno(-ENOMEM, "%s: %m", path), KILN_EXIT_FAILURE;
			n_alloc = m;
		}
		memset(keys.key[keys.n], 0, sizeof(*keys.key));
		memcpy(keys.key[keys.n], k, len);
		keys.len[keys.n++] = len;
	}
	if (line)
		explicit_bzero(line, cap);
	if (keys.n == 0) {
		log_error("--api-keys-file %s holds no key: no client could be served; add one a "
			  "line, or drop the setting to serve without keys",
			  path);
		return KILN_EXIT_FAILURE;
	}
	log_info("API keys: %d from %s; every request but /health%s needs one", keys.n, path,
		 arg.metrics_auth ? "" : " and /metrics");
	return 0;
}

/* Whether the bearer token is one of the keys: every key is compared, over
 * all API_KEY_MAX + 1 bytes, whichever matches, so the time taken says
 * nothing about how much of a key a guess got right, or which. */
static bool key_matches(const char *token)
{
	unsigned char buf[API_KEY_MAX + 1] = { 0 };
	size_t len = strnlen(token, API_KEY_MAX + 1);
	memcpy(buf, token, MIN(len, (size_t) API_KEY_MAX));
	unsigned found = 0;
	for (int i = 0; i < keys.n; i++) {
		unsigned d = (unsigned) (len ^ keys.len[i]);
		for (size_t j = 0; j < sizeof(buf); j++)
			d |= (unsigned) (buf[j] ^ (unsigned char) keys.key[i][j]);
		/* 1 when d is 0, without a branch */
		found |= 1u & (((d | (0u - d)) >> (sizeof(d) * 8 - 1)) ^ 1u);
	}
	explicit_bzero(buf, sizeof(buf));
	return found;
}

/* With keys: 0 when the request carries "Authorization: Bearer KEY" with
 * one of them, else OpenAI's 401 (type invalid_request_error, code
 * invalid_api_key), never echoing what was sent.  Without keys: 0.
 * Returns 0 to go on, else what the reply returned (> 0 never). */
static int authorize(kiln_http_request *r, bool *refused)
{
	*refused = false;
	if (keys.n == 0)
		return 0;
	const char *h = kiln_http_request_header(r, "Authorization");
	*refused = true;
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return kiln_http_reply_error(
			r, 401, "invalid_request_error", NULL, "invalid_api_key",
			"You didn't provide an API key. Send it in an Authorization header: "
			"\"Authorization: Bearer KEY\" (the keys are in %s on the server).",
			arg.api_keys);
	h += 7;
	while (*h == ' ')
		h++;
	if (!key_matches(h))
		return kiln_http_reply_error(
			r, 401, "invalid_request_error", NULL, "invalid_api_key",
			"Incorrect API key provided. Use one of the keys of %s "
			"on the server.",
			arg.api_keys);
	*refused = false;
	return 0;
}

#define AUTHORIZE(r)                              \
	do {                                      \
		bool refused_;                    \
		int q_ = authorize(r, &refused_); \
		if (refused_)                     \
			return q_;                \
	} while (0)

/* The served models, routed by name; set up by run() before the HTTP
 * server starts, read-only after. */
static struct {
	inferd_app apps[INFERD_MODELS_MAX];
	int n;
	char names[INFERD_MODELS_MAX * (INFERD_NAME_MAX + 4)]; /* "'a', 'b'" for messages */
} served;

static inferd_app *find_app(const char *name)
{
	for (int i = 0; i < served.n; i++)
		if (streq(served.apps[i].model.name, name))
			return &served.apps[i];
	return NULL;
}

/* OpenAI's 404 for a model this server does not have, naming those it has. */
static int reply_no_model(kiln_http_request *r, const char *id)
{
	return kiln_http_reply_error(r, 404, NULL, "model", "model_not_found",
				     "The model '%.*s' does not exist (this server has %s)",
				     INFERD_NAME_MAX, id, served.names);
}

static int on_request(kiln_http_request *r, void *u, bool chat)
{
	AUTHORIZE(r);
	if (atomic_load(&draining))
		return kiln_http_reply_retry(r, 503, DRAIN_RETRY_AFTER_S, "server_shutting_down",
					     "kiln-inferd is shutting down and takes no new "
					     "requests; retry in %d s (or on another server)",
					     DRAIN_RETRY_AFTER_S);
	kiln_error jerr;
	_cleanup_json_ json_t *body = NULL;
	if (kiln_http_request_json(r, &body, &jerr) < 0)
		return kiln_http_reply_json_error(r, &jerr);
	/* Routed by "model"; a missing or non-string one goes to the first
	 * model, whose parser refuses it with the usual 400. */
	inferd_app *a = &served.apps[0];
	const json_t *jm = json_is_object(body) ? json_object_get(body, "model") : NULL;
	if (json_is_string(jm) && !(a = find_app(json_string_value(jm))))
		return reply_no_model(r, json_string_value(jm));
	_cleanup_(inferd_request_done) inferd_request q = {};
	inferd_error e;
	int k = inferd_request_parse(&a->model, body, chat, &q, &e);
	if (k == -ENOMEM)
		return k;
	if (k < 0)
		return kiln_http_reply_error(r, e.status, NULL,
					     e.json.where[0] ? e.json.where : NULL, e.code, "%s",
					     e.json.msg);
	return inferd_submit(r, a, &q);
}

static int on_completions(kiln_http_request *r, void *u)
{
	return on_request(r, u, false);
}

static int on_chat(kiln_http_request *r, void *u)
{
	return on_request(r, u, true);
}

/* GET /v1/models: every served model, in the order they were given. */
static int on_models(kiln_http_request *r, void *u)
{
	AUTHORIZE(r);
	_cleanup_json_ json_t *data = json_array();
	for (int i = 0; data && i < served.n; i++) {
		const inferd_app *a = &served.apps[i];
		if (json_array_append_new(
			    data, inferd_model_json(a->model.name, a->started, a->model.ctx)) < 0)
			return -ENOMEM;
	}
	_cleanup_json_ json_t *o =
		data ? json_pack("{s:s, s:O}", "object", "list", "data", data) : NULL;
	if (!o)
		return -ENOMEM;
	return kiln_http_reply_json(r, 200, o);
}

/* GET /v1/models/{id}: the model, or OpenAI's 404. */
static int on_model(kiln_http_request *r, void *u)
{
	AUTHORIZE(r);
	const char *id = kiln_http_request_path(r) + strlen("/v1/models/");
	const inferd_app *a = find_app(id);
	if (!a)
		return reply_no_model(r, id);
	_cleanup_json_ json_t *o = inferd_model_json(a->model.name, a->started, a->model.ctx);
	if (!o)
		return -ENOMEM;
	return kiln_http_reply_json(r, 200, o);
}

/* Replies by HTTP status, counted by the server's access_log hook (every
 * finished request: 200s, 400s, 401s, 404s, 429s, 503s ...). */
#define HTTP_STATUS_MAX 600
static _Atomic uint64_t http_status[HTTP_STATUS_MAX];

static void on_access(const kiln_http_access *a, void *u)
{
	if (a->status < HTTP_STATUS_MAX)
		atomic_fetch_add(&http_status[a->status], 1);
}

static int on_metrics(kiln_http_request *r, void *u)
{
	if (arg.metrics_auth)
		AUTHORIZE(r);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;
	kiln_metrics_init(&m, &b);
	kiln_engine *engines[INFERD_MODELS_MAX];
	const char *names[INFERD_MODELS_MAX];
	for (int i = 0; i < served.n; i++) {
		engines[i] = served.apps[i].engine;
		names[i] = served.apps[i].model.name;
	}
	kiln_engine_metrics(engines, names, served.n, &m);
	kiln_metrics_family(&m, "kiln_inferd_http_responses_total", KILN_METRIC_COUNTER,
			    "HTTP replies by status code (429: queue full, 401: no or a wrong "
			    "key, 503: draining).");
	for (unsigned c = 100; c < HTTP_STATUS_MAX; c++) {
		uint64_t v = atomic_load(&http_status[c]);
		char code[8];
		snprintf(code, sizeof(code), "%u", c);
		if (v)
			kiln_metrics_sample(&m, (const char *[]){ "code", code, NULL }, (double) v);
	}
	int q = kiln_metrics_finish(&m);
	if (q < 0)
		return q;
	return kiln_http_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.s, b.len);
}

static int on_health(kiln_http_request *r, void *u)
{
	return kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", "ok\n", 3);
}

/* SIGTERM/SIGINT reach the event loop through sd-event's signalfd, which
 * sees a signal only while no thread would take it.  The threads kiln
 * starts inherit the mask run() sets first, but OpenBLAS starts its pool in
 * a library constructor, before main(), with the signals unblocked, and the
 * kernel may hand a process-directed signal to one of those threads (the
 * default action would then kill the process, exit 143, without the
 * orderly stop).  There this handler passes it on to the main thread, where
 * it stays pending for the signalfd. */
static pthread_t main_thread;

static void forward_signal(int sig)
{
	int saved = errno;
	(void) pthread_kill(main_thread, sig);
	errno = saved;
}

static void block_stop_signals(void)
{
	static const int sigs[] = { SIGTERM, SIGINT };
	sigset_t ss;
	sigemptyset(&ss);
	main_thread = pthread_self();
	for (size_t i = 0; i < ARRAY_SIZE(sigs); i++) {
		struct sigaction sa = { .sa_handler = forward_signal }, old;
		sigaddset(&ss, sigs[i]);
		sigfillset(&sa.sa_mask);
		/* An ignored SIGINT (a background job of a script) stays ignored. */
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
			(void) sigaction(sigs[i], &sa, NULL);
	}
	pthread_sigmask(SIG_BLOCK, &ss, NULL);
}

/* ---- the drain and the watchdog ---------------------------------------- */

/* How often the drain looks whether the engines are empty. */
#define DRAIN_POLL_USEC (50 * KILN_USEC_PER_MSEC)

typedef struct daemon_state {
	uint64_t drain_deadline; /* CLOCK_MONOTONIC usec; 0: not draining */
	uint64_t watchdog_usec;	 /* systemd's WatchdogSec; 0: off */
	bool watchdog_missed;	 /* logged once per stall */
} daemon_state;

/* Requests running and waiting, every engine together. */
static void in_flight(int *running, int *waiting)
{
	*running = *waiting = 0;
	for (int i = 0; i < served.n; i++) {
		kiln_engine_stats st;
		kiln_engine_get_stats(served.apps[i].engine, &st);
		*running += st.running;
		*waiting += st.waiting;
	}
}

/* Set by each engine's scheduler thread each turn of its loop (the
 * on_tick hook, userdata its inferd_app); read by the watchdog timer on
 * the main thread. */
static void on_engine_tick(void *userdata)
{
	inferd_app *a = userdata;
	atomic_store(&a->last_tick, kiln_now_usec());
}

/* A time source fires once (SD_EVENT_ONESHOT): again in usec. */
static int rearm(sd_event_source *s, uint64_t usec)
{
	int r = sd_event_source_set_time_relative(s, usec);
	return r < 0 ? r : sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
}

static int on_drain_poll(sd_event_source *s, uint64_t usec, void *u)
{
	daemon_state *d = u;
	int running, waiting;
	in_flight(&running, &waiting);
	sd_event *ev = sd_event_source_get_event(s);
	if (running + waiting == 0) {
		log_info("Drained: every request in flight finished");
		return sd_event_exit(ev, 0);
	}
	if (kiln_now_usec() >= d->drain_deadline) {
		log_info("Drain grace over: cancelling %d running and %d waiting requests", running,
			 waiting);
		return sd_event_exit(ev, 0);
	}
	return rearm(s, DRAIN_POLL_USEC);
}

/* The first SIGTERM/SIGINT starts the drain (no new requests, those in
 * flight get arg.drain_grace_usec); a second one, or a grace of 0, stops at
 * once (the rest is cancelled). */
static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *u)
{
	daemon_state *d = u;
	sd_event *ev = sd_event_source_get_event(s);
	const char *sig = strsignal((int) si->ssi_signo);
	if (d->drain_deadline) {
		log_info("Got %s again, stopping now: cancelling what is left", sig);
		return sd_event_exit(ev, 0);
	}
	atomic_store(&draining, true);
	int running, waiting;
	in_flight(&running, &waiting);
	char grace[32];
	kiln_format_duration(grace, sizeof(grace), arg.drain_grace_usec);
	log_info("Got %s, stopping: draining %d running and %d waiting requests (new ones get "
		 "503), up to %s",
		 sig, running, waiting, grace);
	(void) sd_notifyf(0, "STOPPING=1\nSTATUS=Draining: %d requests in flight, up to %s",
			  running + waiting, grace);
	d->drain_deadline = kiln_now_usec() + arg.drain_grace_usec;
	if (arg.drain_grace_usec == 0)
		return sd_event_exit(ev, 0);
	int r = sd_event_add_time_relative(ev, NULL, CLOCK_MONOTONIC, 0, 0, on_drain_poll, d);
	if (r < 0) {
		log_error_errno(r, "Failed to start the drain timer: %m; stopping now");
		return sd_event_exit(ev, 0);
	}
	return 0;
}

/* WATCHDOG=1 only while every engine's scheduler turns (on_engine_tick, at
 * least every watchdog/4 when idle): one scheduler wedged in a step, or a
 * main loop that no longer runs this timer, gets no pings and systemd
 * restarts the service. */
static int on_watchdog(sd_event_source *s, uint64_t usec, void *u)
{
	daemon_state *d = u;
	uint64_t now = kiln_now_usec(), since = 0;
	const char *who = NULL;
	for (int i = 0; i < served.n; i++) {
		uint64_t t = now - atomic_load(&served.apps[i].last_tick);
		if (t >= since) {
			since = t;
			who = served.apps[i].model.name;
		}
	}
	if (since < d->watchdog_usec / 2) {
		(void) sd_notify(0, "WATCHDOG=1");
		if (d->watchdog_missed)
			log_info("The engines' schedulers turn again: watchdog pings resume");
		d->watchdog_missed = false;
	} else if (!d->watchdog_missed) {
		char t[32];
		kiln_format_duration(t, sizeof(t), since);
		log_warning("The engine of %s has not turned for %s: no watchdog ping "
			    "(systemd restarts kiln-inferd at WatchdogSec)",
			    who, t);
		d->watchdog_missed = true;
	}
	return rearm(s, d->watchdog_usec / 4);
}

/* ---- settings: the command line over the cluster file over the schema -- */

/* inference.dtype as a kk dtype; the older inference.quant says int8/int4
 * where dtype stays f32 (kiln check refuses the two disagreeing). */
static int cfg_dtype(const kiln_cfg_inference *in)
{
	kiln_cfg_dtype dt = in->dtype;
	if (dt == KILN_DTYPE_F32 && in->quant == KILN_QUANT_INT8)
		dt = KILN_DTYPE_I8;
	else if (dt == KILN_DTYPE_F32 && in->quant == KILN_QUANT_INT4)
		dt = KILN_DTYPE_Q4;
	kk_dtype k;
	return parse_dtype(kiln_cfg_dtype_to_string(dt), &k) < 0 ? -EINVAL : (int) k;
}

static int cfg_chat(kiln_cfg_chat c)
{
	return c == KILN_CHAT_AUTO ? -1 : ktok_chat_from_name(kiln_cfg_chat_to_string(c));
}

/* Fills what spec m leaves unset: a flag given on the command line first,
 * then fb (the file's value, or the schema's default). */
static int spec_fill(model_spec *m, const model_spec *fb)
{
	if (!m->name && arg.given[OPT_NAME])
		m->name = arg.name;
	if (!m->name)
		m->name = fb->name;
	if (!m->tokenizer)
		m->tokenizer = arg.given[OPT_TOKENIZER] ? arg.tokenizer : fb->tokenizer;
	if (m->dtype < 0)
		m->dtype = arg.given[OPT_DTYPE] ? (int) arg.dtype : fb->dtype;
	if (m->chat == -2)
		m->chat = arg.given[OPT_CHAT_TEMPLATE] ? arg.chat : fb->chat;
	if (m->ctx < 0)
		m->ctx = arg.given[OPT_CONTEXT] ? arg.ctx : fb->ctx;
	if (!m->blocks && !m->kv_bytes) {
		m->blocks = arg.given[OPT_BLOCKS] ? arg.blocks : fb->blocks;
		m->kv_bytes = arg.given[OPT_BLOCKS] ? 0 : fb->kv_bytes;
	}
	if (m->dtype < 0 || m->chat < -1)
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
static int settings_from_cfg(kiln_cfg **ret)
{
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = kiln_cfg_open(arg.config, KILN_CFG_OPEN_OPTIONAL, &cfg);
	if (r < 0)
		return kiln_exit_for_config(r);
	bool serves = false;
	if (cfg) {
		const char *source;
		char host[KILN_HOSTNAME_MAX + 1];
		if (kiln_node_name(arg.node, host, sizeof(host), &source) < 0) {
			log_error("The node name from %s is longer than %zu characters.", source,
				  sizeof(host) - 1);
			return KILN_EXIT_USAGE;
		}
		const kiln_cfg_node *n = kiln_cfg_find_node(cfg, host);
		serves = n && n->inference;
		const char *why = !cfg->inference.enabled ? "inference.enabled is false"
				  : !n			  ? "it is not a node of the file"
							  : "it is not one of inference.nodes";
		if (!serves && arg.n_models == 0) {
			log_error("%s (%s) serves no model in %s: %s; run kiln-inferd on a node of "
				  "inference.nodes (--node NAME), or give --model FILE",
				  host, source, cfg->path, why);
			return KILN_EXIT_USAGE;
		}
		if (!serves)
			log_notice("%s serves no model in %s (%s): serving --model %s with the "
				   "built-in defaults",
				   host, cfg->path, why, arg.models[0].path);
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
	model_spec flat = { .name = arg.n_models == 1 ? in->name : NULL,
			    .tokenizer = in->tokenizer,
			    .dtype = cfg_dtype(in),
			    .chat = cfg_chat(in->chat_template),
			    .ctx = in->context_length,
			    .blocks = in->kv_blocks };
	if (arg.n_models == 0)
		for (size_t i = 0; i < in->n_models && i < INFERD_MODELS_MAX; i++) {
			const kiln_cfg_model *cm = &in->models[i];
			arg.models[arg.n_models++] = (model_spec) MODEL_SPEC_UNSET;
			flat = (model_spec){ .name = cm->name,
					     .tokenizer = cm->tokenizer,
					     .dtype = parse_dtype(
							      kiln_cfg_dtype_to_string(cm->dtype),
							      &(kk_dtype){ 0 }) < 0
							      ? -1
							      : 0,
					     .chat = cfg_chat(cm->chat_template),
					     .ctx = cm->context_length,
					     .blocks = cm->kv_blocks,
					     .kv_bytes = cm->kv_cache_mb * 1024 * 1024 };
			if (flat.dtype == 0) {
				kk_dtype k;
				(void) parse_dtype(kiln_cfg_dtype_to_string(cm->dtype), &k);
				flat.dtype = (int) k;
			}
			arg.models[i].path = cm->path;
			if ((r = spec_fill(&arg.models[i], &flat)) < 0)
				return KILN_EXIT_USAGE;
		}
	else
		for (int i = 0; i < arg.n_models; i++)
			if ((r = spec_fill(&arg.models[i], &flat)) < 0)
				return KILN_EXIT_USAGE;
	if (in->n_models > INFERD_MODELS_MAX && arg.n_models == INFERD_MODELS_MAX) {
		log_error("%s gives %zu models; kiln-inferd serves at most %d", cfg->path,
			  in->n_models, INFERD_MODELS_MAX);
		return KILN_EXIT_USAGE;
	}
	if (!arg.given['l'])
		arg.listen = in->address;
	if (!arg.given['p'])
		arg.port = in->port;
	if (!arg.given[OPT_BACKEND])
		arg.backend = kiln_cfg_backend_to_string(in->backend);
	if (!arg.given[OPT_RUNNING])
		arg.max_running = in->max_running;
	if (!arg.given[OPT_WAITING])
		arg.max_waiting = in->max_waiting;
	if (!arg.given[OPT_DRAIN_GRACE])
		arg.drain_grace_usec = in->drain_grace_usec;
	if (!arg.given[OPT_MEMORY_BUDGET])
		arg.memory_budget = in->memory_mb * 1024 * 1024;
	if (!arg.given[OPT_API_KEYS])
		arg.api_keys = in->api_keys_file;
	if (!arg.given[OPT_METRICS_AUTH])
		arg.metrics_auth = in->metrics_auth;
	if (!arg.given[OPT_CPU_THREADS])
		arg.cpu_threads = in->cpu_threads;
	if (arg.n_models == 0) {
		log_error("No model: give --model FILE, or set inference.models (or "
			  "inference.model) in the cluster file (-c FILE) for this node");
		return KILN_EXIT_USAGE;
	}
	*ret = TAKE_PTR(cfg);
	return 0;
}

/* ---- the memory budget -------------------------------------------------- */

/* What one model will hold, estimated from its config before anything is
 * loaded: the weights in their dtype (i8: a f32 scale per row, q4: one per
 * 32 weights; the embedding, norms and classifier in the activation dtype),
 * the KV cache (K and V, every layer, in the activation dtype) and the
 * step's buffers (activations of max_step_tokens tokens, the logits of
 * max_running rows). */
typedef struct mem_estimate {
	uint64_t weights, kv, buffers;
} mem_estimate;

static uint64_t act_bytes(kk_dtype dt)
{
	return dt == KK_BF16 || dt == KK_F16 ? 2 : 4;
}

/* Bytes of one 16-token KV block across the layers. */
static uint64_t kv_block_bytes(const km_config *c, kk_dtype dt)
{
	return 2 * (uint64_t) c->n_layers * 16 * (uint64_t) c->n_kv_heads * (uint64_t) c->head_dim *
	       act_bytes(dt);
}

static mem_estimate estimate(const km_config *c, kk_dtype dt, int blocks)
{
	uint64_t dim = (uint64_t) c->dim, hid = (uint64_t) c->hidden_dim,
		 kv = (uint64_t) c->n_kv_heads * (uint64_t) c->head_dim, L = (uint64_t) c->n_layers,
		 V = (uint64_t) c->vocab_size, act = act_bytes(dt);
	uint64_t lin = L * (2 * dim * dim + 2 * kv * dim + 3 * hid * dim);
	uint64_t rows = L * (3 * dim + 2 * kv + 2 * hid);
	uint64_t lin_bytes = dt == KK_F32  ? lin * 4
			     : dt == KK_I8 ? lin + rows * 4
			     : dt == KK_Q4 ? lin / 2 + lin / 32 * 4
					   : lin * 2;
	uint64_t other = V * dim * (c->shared_classifier ? 1 : 2) + L * 2 * dim + dim;
	mem_estimate e = {
		.weights = lin_bytes + other * act,
		.kv = (uint64_t) blocks * kv_block_bytes(c, dt),
		.buffers = (uint64_t) arg.max_step * (4 * dim + 2 * kv + 3 * hid) * act +
			   (uint64_t) arg.max_running * V * 4,
	};
	return e;
}

/* The memory this process may use: its cgroup's memory.max (the smallest
 * on the way up, cgroup v2), else the machine's RAM.  *what says which. */
static uint64_t memory_limit(const char **what)
{
	uint64_t phys = (uint64_t) sysconf(_SC_PHYS_PAGES) * (uint64_t) sysconf(_SC_PAGESIZE);
	uint64_t best = phys;
	*what = "physical memory";
	char line[512], dir[600];
	FILE *f = fopen("/proc/self/cgroup", "re");
	bool found = false;
	while (f && fgets(line, sizeof(line), f))
		if (startswith(line, "0::")) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", line + 3);
			found = true;
			break;
		}
	if (f)
		fclose(f);
	while (found) {
		char p[640], v[64] = "";
		snprintf(p, sizeof(p), "%s/memory.max", dir);
		FILE *m = fopen(p, "re");
		uint64_t x;
		if (m && fgets(v, sizeof(v), m) && !startswith(v, "max") &&
		    kiln_parse_uint64((v[strcspn(v, "\n")] = 0, v), UINT64_MAX, &x) >= 0 &&
		    x < best) {
			best = x;
			*what = "the cgroup's memory.max";
		}
		if (m)
			fclose(m);
		char *slash = strrchr(dir, '/');
		if (!slash || slash - dir <= (ptrdiff_t) strlen("/sys/fs/cgroup"))
			break;
		*slash = '\0';
	}
	return best;
}

#define MIB(x) ((double) (x) / (1024.0 * 1024.0))

/* Refuses a model set that does not fit the budget, before any model is
 * loaded, with the numbers of each.  Returns 0 or an exit status. */
static int check_budget(const kk_backend *be, const model_spec *specs, const km_config *const *cfgs,
			int n)
{
	const char *what = "--memory-budget";
	uint64_t budget = arg.memory_budget;
	if (!budget && !kk_backend_has(be, KK_CAP_HOST_MEMORY))
		return 0; /* no default on a GPU: kk allocates, and fails with its error */
	if (!budget)
		budget = memory_limit(&what);
	else if (!arg.given[OPT_MEMORY_BUDGET])
		what = "inference.memory_mb";
	uint64_t total = 0;
	mem_estimate e[INFERD_MODELS_MAX];
	for (int i = 0; i < n; i++) {
		e[i] = estimate(cfgs[i], (kk_dtype) specs[i].dtype, specs[i].blocks);
		total += e[i].weights + e[i].kv + e[i].buffers;
	}
	if (total <= budget) {
		log_info("Memory: %.1f MiB estimated for %d model%s, of %.1f MiB (%s)", MIB(total),
			 n, n == 1 ? "" : "s", MIB(budget), what);
		return 0;
	}
	log_error("The models do not fit: %.1f MiB estimated, more than the %.1f MiB of %s:",
		  MIB(total), MIB(budget), what);
	for (int i = 0; i < n; i++)
		log_error("  %s: %.1f MiB = weights %.1f (%s) + KV cache %.1f (%d blocks) + "
			  "buffers %.1f",
			  specs[i].name, MIB(e[i].weights + e[i].kv + e[i].buffers),
			  MIB(e[i].weights), kk_dtype_name((kk_dtype) specs[i].dtype), MIB(e[i].kv),
			  specs[i].blocks, MIB(e[i].buffers));
	log_error("Serve fewer models, give them fewer KV blocks (kv_blocks, kv_cache_mb) "
		  "or a "
		  "smaller dtype, or raise the budget (--memory-budget, "
		  "inference.memory_mb)");
	return KILN_EXIT_USAGE;
}

/* ---- run ------------------------------------------------------------------ */

/* What each served model owns, freed in reverse order of setup: engines
 * (their last callbacks decode) before tokenizers, then the backends. */
static struct {
	kk_backend *be[INFERD_MODELS_MAX];
	km_file *file[INFERD_MODELS_MAX];
	ktok *tok[INFERD_MODELS_MAX];
} owned;

static void owned_free(void)
{
	for (int i = INFERD_MODELS_MAX - 1; i >= 0; i--) {
		served.apps[i].engine = kiln_engine_free(served.apps[i].engine);
		owned.file[i] = km_file_free(owned.file[i]);
		ktok_free(owned.tok[i]);
		owned.tok[i] = NULL;
		owned.be[i] = kk_backend_free(owned.be[i]);
	}
}

/* Opens every model's file (its config), sizes its KV cache and context,
 * checks the memory budget, then loads each: backend, tokenizer, engine.
 * Returns 0 or an exit status. */
static int load_models(daemon_state *d)
{
	const km_config *cfgs[INFERD_MODELS_MAX];
	served.n = arg.n_models;
	for (int i = 0; i < arg.n_models; i++) {
		model_spec *m = &arg.models[i];
		inferd_app *a = &served.apps[i];
		const char *slash = strrchr(m->path, '/');
		if (!m->name)
			m->name = slash && slash[1] ? slash + 1 : m->path;
		if (strlen(m->name) > INFERD_NAME_MAX) {
			log_error("%s: the name '%s' is longer than %d characters", m->path,
				  m->name, INFERD_NAME_MAX);
			return KILN_EXIT_USAGE;
		}
		for (int j = 0; j < i; j++)
			if (streq(arg.models[j].name, m->name)) {
				log_error("Two models are named '%s' (%s and %s): requests "
					  "pick a "
					  "model by its name; give each its own (--model "
					  "FILE,name=NAME, inference.models[].name)",
					  m->name, arg.models[j].path, m->path);
				return KILN_EXIT_USAGE;
			}
		snprintf(a->model.name, sizeof(a->model.name), "%s", m->name);
		kiln_error err = {};
		if (km_file_open(m->path, &owned.file[i], &err) < 0) {
			log_error("%s", err.msg);
			return KILN_EXIT_FAILURE;
		}
		const km_config *c = cfgs[i] = km_file_config(owned.file[i]);
		a->model.vocab = c->vocab_size;
		a->model.ctx = c->max_seq_len;
		if (m->ctx > a->model.ctx) {
			log_error("%s: --context-length %d is longer than %s's own context "
				  "(%d "
				  "tokens); give at most %d, or 0 for the model's",
				  m->name, m->ctx, m->path, a->model.ctx, a->model.ctx);
			return KILN_EXIT_USAGE;
		}
		if (m->ctx > 0)
			a->model.ctx = m->ctx;
		if (m->kv_bytes) {
			uint64_t nb = m->kv_bytes / kv_block_bytes(c, (kk_dtype) m->dtype);
			if (nb < 1 || nb > KM_KV_BLOCKS_MAX) {
				log_error("%s: a KV cache of %.1f MiB holds %" PRIu64 " blocks of "
					  "%.3f MiB; give between 1 and %d blocks' worth",
					  m->name, MIB(m->kv_bytes), nb,
					  MIB(kv_block_bytes(c, (kk_dtype) m->dtype)),
					  KM_KV_BLOCKS_MAX);
				return KILN_EXIT_USAGE;
			}
			m->blocks = (int) nb;
		}
	}
	int r;
	/* The backends first: whether the budget has a default depends on
	 * where they keep their buffers, not on the name asked for. */
	for (int i = 0; i < arg.n_models; i++) {
		char why[KK_WHY_MAX];
		r = kk_backend_open_why(arg.backend, &owned.be[i], why, sizeof(why));
		if (r < 0) {
			log_error("Failed to open the %s backend: %s", arg.backend,
				  why[0] ? why : strerror(-r));
			return KILN_EXIT_FAILURE;
		}
		if (why[0] && i == 0) /* auto's fallback: said once, not per model */
			log_notice("%s", why);
		r = kk_backend_set_threads(owned.be[i], arg.cpu_threads);
		if (r < 0)
			return log_error_errno(r, "Failed to set %d compute threads: %m",
					       arg.cpu_threads);
	}
	r = check_budget(owned.be[0], arg.models, cfgs, arg.n_models);
	if (r != 0)
		return r;
	for (int i = 0; i < arg.n_models; i++) {
		model_spec *m = &arg.models[i];
		inferd_app *a = &served.apps[i];
		a->started = time(NULL);
		atomic_init(&a->next_id, 1);
		atomic_store(&a->last_tick, kiln_now_usec());
		if ((r = load_tokenizer(m, &a->model, &owned.tok[i])) != 0)
			return r;
		km_weight_source src = km_file_source(owned.file[i]);
		kiln_engine_opts o = { .weight_dtype = (kk_dtype) m->dtype,
				       .max_running = arg.max_running,
				       .max_step_tokens = arg.max_step,
				       .num_blocks = m->blocks,
				       .max_waiting = arg.max_waiting,
				       .eos_token = arg.eos,
				       .prefix_caching = arg.prefix };
		if (d->watchdog_usec) {
			o.on_tick = on_engine_tick;
			o.tick_userdata = a;
			o.tick_usec = d->watchdog_usec / 4;
		}
		kiln_error err = {};
		r = kiln_engine_new(owned.be[i], km_file_config(owned.file[i]), &src, &o,
				    &a->engine, &err);
		owned.file[i] = km_file_free(owned.file[i]);
		if (r < 0) {
			log_error("%s: %s", m->path, err.msg);
			return KILN_EXIT_FAILURE;
		}
		log_info("%s: loaded %s (%s, context %d, %d KV blocks)", m->name, m->path,
			 kk_dtype_name((kk_dtype) m->dtype), a->model.ctx, m->blocks);
	}
	kiln_strbuf b;
	kiln_strbuf_init(&b);
	for (int i = 0; i < served.n; i++)
		kiln_strbuf_printf(&b, "%s'%s'", i ? ", " : "", served.apps[i].model.name);
	snprintf(served.names, sizeof(served.names), "%s", b.s ? b.s : "");
	kiln_strbuf_free(&b);
	return 0;
}

/* What the log and STATUS= say is served: one model as before ("NAME on
 * URL (backend, dtype, context N, N KV blocks)"), several as "N models on
 * URL (backend): NAME (dtype, context N, N KV blocks), ...". */
static void describe(kiln_strbuf *b, unsigned port)
{
	if (served.n == 1) {
		kiln_strbuf_printf(b, "%s on http://%s:%u (%s, %s, context %d, %d KV blocks)",
				   served.apps[0].model.name, arg.listen, port,
				   kk_backend_name(owned.be[0]),
				   kk_dtype_name((kk_dtype) arg.models[0].dtype),
				   served.apps[0].model.ctx, arg.models[0].blocks);
		return;
	}
	kiln_strbuf_printf(b, "%d models on http://%s:%u (%s):", served.n, arg.listen, port,
			   kk_backend_name(owned.be[0]));
	for (int i = 0; i < served.n; i++)
		kiln_strbuf_printf(b, "%s %s (%s, context %d, %d KV blocks)", i ? "," : "",
				   served.apps[i].model.name,
				   kk_dtype_name((kk_dtype) arg.models[i].dtype),
				   served.apps[i].model.ctx, arg.models[i].blocks);
}

static int run(int argc, char **argv)
{
	/* Before any thread of ours starts: they inherit the mask. */
	block_stop_signals();
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = settings_from_cfg(&cfg);
	if (r != 0)
		return r;
	daemon_state d = {};
	_cleanup_(sd_event_unrefp) sd_event *ev = NULL;
	r = sd_event_default(&ev);
	if (r < 0)
		return log_error_errno(r, "Failed to allocate the event loop: %m");
	if ((r = sd_event_add_signal(ev, NULL, SIGTERM, on_signal, &d)) < 0 ||
	    (r = sd_event_add_signal(ev, NULL, SIGINT, on_signal, &d)) < 0)
		return log_error_errno(r, "Failed to watch SIGTERM/SIGINT: %m");
	/* WatchdogSec= of the unit: pinged by on_watchdog() while the engines
	 * turn, not by sd-event's unconditional pings. */
	if (sd_watchdog_enabled(false, &d.watchdog_usec) <= 0)
		d.watchdog_usec = 0;

	if (arg.api_keys && (r = load_api_keys(arg.api_keys)) != 0) {
		keys_free();
		return r;
	}
	r = load_models(&d);
	if (r != 0) {
		keys_free();
		owned_free();
		return r;
	}

	const kiln_http_route routes[] = {
		{ "POST", "/v1/completions", false, on_completions, NULL },
		{ "POST", "/v1/chat/completions", false, on_chat, NULL },
		{ "GET", "/v1/models", false, on_models, NULL },
		{ "GET", "/v1/models/", true, on_model, NULL },
		{ "GET", "/metrics", false, on_metrics, NULL },
		{ "GET", "/health", false, on_health, NULL },
	};
	kiln_http_config hc = { .address = arg.listen,
				.port = (uint16_t) arg.port,
				.threads = (unsigned) arg.threads,
				.max_connections = (unsigned) arg.max_conns,
				.max_connections_per_client = (unsigned) arg.per_client,
				.idle_timeout_s = (unsigned) arg.idle_timeout,
				.max_body_bytes = (size_t) arg.max_body,
				.sse_shutdown_event = SHUTDOWN_EVENT,
				.access_log = on_access,
				.routes = routes,
				.n_routes = ARRAY_SIZE(routes) };
	kiln_http_server *srv = NULL;
	r = kiln_http_server_start(&hc, &srv);
	if (r < 0) {
		log_error_errno(r, "Failed to listen on %s:%d: %m", arg.listen, arg.port);
		owned_free();
		keys_free();
		return KILN_EXIT_FAILURE;
	}
	_cleanup_strbuf_ kiln_strbuf what;
	kiln_strbuf_init(&what);
	describe(&what, kiln_http_server_port(srv));
	log_info("Serving %s", what.s);
	if (d.watchdog_usec) {
		r = sd_event_add_time_relative(ev, NULL, CLOCK_MONOTONIC, 0, 0, on_watchdog, &d);
		if (r < 0) {
			kiln_http_server_free(srv);
			owned_free();
			keys_free();
			return log_error_errno(r, "Failed to start the watchdog timer: %m");
		}
	}
	(void) sd_notifyf(0, "READY=1\nSTATUS=Serving %s", what.s);

	r = sd_event_loop(ev);
	if (r < 0)
		log_error_errno(r, "Event loop failed: %m");
	/* The server first: its streams are cancelled and no new request
	 * reaches an engine; then each engine cancels what is left (every
	 * job's finish callback closes its stream and frees it); then the
	 * engines, the tokenizers, the backends. */
	kiln_http_server_free(srv);
	for (int i = 0; i < served.n; i++)
		kiln_engine_shutdown(served.apps[i].engine, KILN_ENGINE_CANCEL);
	owned_free();
	keys_free();
	return r < 0 ? r : KILN_EXIT_OK;
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
