/* main.c — kiln-inferd, an OpenAI-compatible completions and chat
 * completions server on the inference engine (kiln/engine.h), libktok and
 * kiln/http.h.
 *
 *   kiln-inferd [-c FILE] [--node NAME] [--model FILE] [options]
 *
 * This file is the program: options and the cluster file's inference
 * section (flags win over the file, the file over the schema's defaults),
 * the model (any file km_file_open
 * reads: a llama2.c checkpoint, safetensors from kiln-train or Hugging
 * Face, a GGUF llama) on the cpu or cuda backend, the tokenizer and chat
 * template, the engine, the HTTP routes, systemd's notify protocol (READY,
 * STATUS, WATCHDOG pings while the engine's scheduler makes progress) and
 * the drain on SIGTERM/SIGINT: new requests get 503 + Retry-After, those
 * in flight get inference.drain_grace to finish, then the server stops
 * (streams are cancelled) and the engine cancels what is left.  The request layer is openai.c, the
 * streaming and stop-string layer stream.c (inferd.h says which does what).  Exit codes: 0 ok, 1
 * failure, 2 usage error (a tokenizer larger than the model's vocabulary included).
 * docs/kiln-inferd.md. */
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
	{ "model", 'm', "FILE",
	  "model: llama2.c, safetensors (kiln-train's, or Hugging\n"
	  "Face with config.json beside it), GGUF llama (required)",
	  "file" },
	{ "name", OPT_NAME, "NAME", "model name in the API (default: the file's base name)", NULL },
	{ "listen", 'l', "ADDR", "address to listen on (inference.address, default 127.0.0.1)",
	  "host" },
	{ "port", 'p', "N", "port (inference.port, default 8000; 0: an ephemeral one, logged)",
	  NULL },
	{ "backend", OPT_BACKEND, "NAME", "kk backend: cpu or cuda (default cpu)", "cpu cuda" },
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
	.usage = "kiln-inferd [-c FILE] [--node NAME] [--model FILE] [OPTIONS]",
	.options = options,
	.epilog = "Serves POST /v1/completions (text or token-id prompts), POST\n"
		  "/v1/chat/completions (\"stream\": true for SSE on both), GET /v1/models,\n"
		  "GET /v1/models/ID, GET /metrics and GET /health.  Without a tokenizer:\n"
		  "token ids only.\n"
		  "The cluster file's inference section gives the defaults of every option\n"
		  "above (same names: inference.kv_blocks is --kv-blocks, inference.address\n"
		  "--listen) when this node is one of inference.nodes; a flag wins over the\n"
		  "file.  Without a file the defaults are the schema's (kiln show --defaults).\n"
		  "SIGTERM/SIGINT drain: new requests get 503, those running get\n"
		  "--drain-grace to finish, then the rest are cancelled.  Under systemd\n"
		  "(Type=notify): READY=1 once the model is loaded, WATCHDOG=1 while the\n"
		  "engine makes progress.\n"
		  "Exit status: 0 after SIGTERM/SIGINT, 1 failure, 2 usage error.\n",
};

/* The settings.  The defaults of those the cluster file has (listen, port,
 * backend, dtype, ...) are not written here: they come from the schema
 * (kiln_cfg_defaults()) or the file, in settings_from_cfg(), for every
 * option the command line did not give (given[]). */
static struct {
	const char *config, *node;
	const char *model, *listen, *name, *backend, *tokenizer;
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
DEFINE_TRIVIAL_CLEANUP_FUNC(ktok *, ktok_free)
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
			arg.model = optarg;
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
static int load_tokenizer(inferd_model *m, ktok **ret)
{
	kiln_error te = {};
	char buf[sizeof(te.file) + sizeof(te.msg) + 4];
	const char *path = arg.tokenizer;
	if (!path) {
		char magic[4] = { 0 };
		/* Plain fclose: cppcheck cannot see cleanup attributes. */
		FILE *fp = fopen(arg.model, "re");
		size_t got = fp ? fread(magic, 1, 4, fp) : 0;
		if (fp)
			fclose(fp);
		if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
			log_notice("No --tokenizer: prompts and replies are token ids only");
			return 0;
		}
		path = arg.model;
	}
	_cleanup_(ktok_freep) ktok *tok = NULL;
	int r = ktok_load(path, &tok, &te);
	if (r < 0 && !arg.tokenizer) {
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
			  path, ktok_n_vocab(tok), arg.model, m->vocab);
		return KILN_EXIT_USAGE;
	}
	if (!token_text(tok, ktok_bos(tok), m->bos, sizeof(m->bos)))
		snprintf(m->bos, sizeof(m->bos), "<s>");
	if (!token_text(tok, ktok_eos(tok), m->eos, sizeof(m->eos)))
		snprintf(m->eos, sizeof(m->eos), "</s>");
	const char *tmpl = ktok_chat_template(tok);
	if (arg.chat >= 0) {
		m->chat = (ktok_chat) arg.chat;
	} else if (tmpl && (r = ktok_chat_detect(tmpl)) >= 0) {
		m->chat = (ktok_chat) r;
	} else {
		m->chat = KTOK_CHAT_CHATML;
		log_notice("%s: %s; chat completions use ChatML (choose another with "
			   "--chat-template)",
			   path,
			   tmpl ? "its chat template is not one kiln knows" : "no chat template");
	}
	log_info("Tokenizer %s: %u tokens, chat template %s", path, ktok_n_vocab(tok),
		 ktok_chat_name(m->chat));
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

static int on_request(kiln_http_request *r, inferd_app *a, bool chat)
{
	if (atomic_load(&draining))
		return kiln_http_reply_retry(r, 503, DRAIN_RETRY_AFTER_S, "server_shutting_down",
					     "kiln-inferd is shutting down and takes no new "
					     "requests; retry in %d s (or on another server)",
					     DRAIN_RETRY_AFTER_S);
	kiln_error jerr;
	_cleanup_json_ json_t *body = NULL;
	if (kiln_http_request_json(r, &body, &jerr) < 0)
		return kiln_http_reply_json_error(r, &jerr);
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

static int on_models(kiln_http_request *r, void *u)
{
	inferd_app *a = u;
	_cleanup_json_ json_t *o = inferd_models_json(a->model.name, a->started, a->model.ctx);
	if (!o)
		return -ENOMEM;
	return kiln_http_reply_json(r, 200, o);
}

/* GET /v1/models/{id}: the model, or OpenAI's 404. */
static int on_model(kiln_http_request *r, void *u)
{
	inferd_app *a = u;
	const char *id = kiln_http_request_path(r) + strlen("/v1/models/");
	if (!streq(id, a->model.name))
		return kiln_http_reply_error(r, 404, NULL, "model", "model_not_found",
					     "The model '%.*s' does not exist (this server has "
					     "'%s')",
					     INFERD_NAME_MAX, id, a->model.name);
	_cleanup_json_ json_t *o = inferd_model_json(a->model.name, a->started, a->model.ctx);
	if (!o)
		return -ENOMEM;
	return kiln_http_reply_json(r, 200, o);
}

static int on_metrics(kiln_http_request *r, void *u)
{
	inferd_app *a = u;
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;
	kiln_metrics_init(&m, &b);
	kiln_engine_metrics(a->engine, &m);
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

/* How often the drain looks whether the engine is empty. */
#define DRAIN_POLL_USEC (50 * KILN_USEC_PER_MSEC)

typedef struct daemon_state {
	kiln_engine *engine;
	uint64_t drain_deadline; /* CLOCK_MONOTONIC usec; 0: not draining */
	uint64_t watchdog_usec;	 /* systemd's WatchdogSec; 0: off */
	bool watchdog_missed;	 /* logged once per stall */
} daemon_state;

/* Set by the engine's scheduler thread each turn of its loop (the
 * on_tick hook); read by the watchdog timer on the main thread. */
static _Atomic uint64_t last_tick_usec;

static void on_engine_tick(void *userdata)
{
	atomic_store(&last_tick_usec, kiln_now_usec());
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
	kiln_engine_stats st;
	kiln_engine_get_stats(d->engine, &st);
	sd_event *ev = sd_event_source_get_event(s);
	if (st.running + st.waiting == 0) {
		log_info("Drained: every request in flight finished");
		return sd_event_exit(ev, 0);
	}
	if (kiln_now_usec() >= d->drain_deadline) {
		log_info("Drain grace over: cancelling %d running and %d waiting requests",
			 st.running, st.waiting);
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
	kiln_engine_stats st;
	kiln_engine_get_stats(d->engine, &st);
	char grace[32];
	kiln_format_duration(grace, sizeof(grace), arg.drain_grace_usec);
	log_info("Got %s, stopping: draining %d running and %d waiting requests (new ones get "
		 "503), up to %s",
		 sig, st.running, st.waiting, grace);
	(void) sd_notifyf(0, "STOPPING=1\nSTATUS=Draining: %d requests in flight, up to %s",
			  st.running + st.waiting, grace);
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

/* WATCHDOG=1 only while the engine's scheduler turns (on_engine_tick, at
 * least every watchdog/4 when idle): a scheduler wedged in a step, or a
 * main loop that no longer runs this timer, gets no pings and systemd
 * restarts the service. */
static int on_watchdog(sd_event_source *s, uint64_t usec, void *u)
{
	daemon_state *d = u;
	uint64_t since = kiln_now_usec() - atomic_load(&last_tick_usec);
	if (since < d->watchdog_usec / 2) {
		(void) sd_notify(0, "WATCHDOG=1");
		if (d->watchdog_missed)
			log_info("The engine's scheduler turns again: watchdog pings resume");
		d->watchdog_missed = false;
	} else if (!d->watchdog_missed) {
		char t[32];
		kiln_format_duration(t, sizeof(t), since);
		log_warning("The engine's scheduler has not turned for %s: no watchdog ping "
			    "(systemd restarts kiln-inferd at WatchdogSec)",
			    t);
		d->watchdog_missed = true;
	}
	return rearm(s, d->watchdog_usec / 4);
}

/* The cluster file (-c, $KILN_CONFIG, /etc/kiln/cluster.cfg; none is fine)
 * and this node (--node, $SLURMD_NODENAME, the hostname).  On a node of
 * inference.nodes the file's inference section fills every option the
 * command line left out; elsewhere, or without a file, the schema's
 * defaults do (so the program never writes a default twice).  *ret keeps
 * the strings arg points to.  Returns 0 or an exit status. */
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
		if (!serves && !arg.model) {
			log_error("%s (%s) serves no model in %s: %s; run kiln-inferd on a node of "
				  "inference.nodes (--node NAME), or give --model FILE",
				  host, source, cfg->path, why);
			return KILN_EXIT_USAGE;
		}
		if (!serves)
			log_notice("%s serves no model in %s (%s): serving --model %s with the "
				   "built-in defaults",
				   host, cfg->path, why, arg.model);
		else
			log_info("%s: serving the inference section of %s", host, cfg->path);
	}
	if (!serves) {
		kiln_cfg_free(TAKE_PTR(cfg));
		if ((r = kiln_cfg_defaults(&cfg)) < 0)
			return log_error_errno(r, "Failed to build the default settings: %m");
	}
	const kiln_cfg_inference *in = &cfg->inference;
	if (!arg.given['m'])
		arg.model = in->model;
	if (!arg.given[OPT_NAME])
		arg.name = in->name;
	if (!arg.given[OPT_TOKENIZER])
		arg.tokenizer = in->tokenizer;
	if (!arg.given['l'])
		arg.listen = in->address;
	if (!arg.given['p'])
		arg.port = in->port;
	if (!arg.given[OPT_BACKEND])
		arg.backend = kiln_cfg_backend_to_string(in->backend);
	if (!arg.given[OPT_DTYPE]) {
		/* the older inference.quant says int8/int4 where dtype stays f32
		 * (kiln check refuses the two disagreeing) */
		kiln_cfg_dtype dt = in->dtype;
		if (dt == KILN_DTYPE_F32 && in->quant == KILN_QUANT_INT8)
			dt = KILN_DTYPE_I8;
		else if (dt == KILN_DTYPE_F32 && in->quant == KILN_QUANT_INT4)
			dt = KILN_DTYPE_Q4;
		if (parse_dtype(kiln_cfg_dtype_to_string(dt), &arg.dtype) < 0)
			return log_error_errno(-EINVAL, "inference.dtype: no such kk dtype");
	}
	if (!arg.given[OPT_CHAT_TEMPLATE] && in->chat_template != KILN_CHAT_AUTO &&
	    (arg.chat = ktok_chat_from_name(kiln_cfg_chat_to_string(in->chat_template))) < 0)
		return log_error_errno(-EINVAL, "inference.chat_template: unknown to libktok");
	if (!arg.given[OPT_CONTEXT])
		arg.ctx = in->context_length;
	if (!arg.given[OPT_BLOCKS])
		arg.blocks = in->kv_blocks;
	if (!arg.given[OPT_RUNNING])
		arg.max_running = in->max_running;
	if (!arg.given[OPT_WAITING])
		arg.max_waiting = in->max_waiting;
	if (!arg.given[OPT_DRAIN_GRACE])
		arg.drain_grace_usec = in->drain_grace_usec;
	if (!arg.given[OPT_CPU_THREADS])
		arg.cpu_threads = in->cpu_threads;
	if (!arg.model) {
		log_error("No model: give --model FILE, or set inference.model in the cluster "
			  "file (-c FILE) for this node");
		return KILN_EXIT_USAGE;
	}
	*ret = TAKE_PTR(cfg);
	return 0;
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
	/* WatchdogSec= of the unit: pinged by on_watchdog() while the engine
	 * turns, not by sd-event's unconditional pings. */
	if (sd_watchdog_enabled(false, &d.watchdog_usec) <= 0)
		d.watchdog_usec = 0;

	inferd_app a = { .started = time(NULL) };
	atomic_init(&a.next_id, 1);
	const char *slash = strrchr(arg.model, '/');
	snprintf(a.model.name, sizeof(a.model.name), "%s",
		 arg.name ? arg.name
		 : slash  ? slash + 1
			  : arg.model);

	_cleanup_(kk_backend_freep) kk_backend *be = NULL;
	r = kk_backend_open(arg.backend, &be);
	if (r < 0)
		return log_error_errno(r, "Failed to open the %s backend: %m", arg.backend);
	r = kk_backend_set_threads(be, arg.cpu_threads);
	if (r < 0)
		return log_error_errno(r, "Failed to set %d compute threads: %m", arg.cpu_threads);
	kiln_error err = {};
	_cleanup_(km_file_freep) km_file *f = NULL;
	r = km_file_open(arg.model, &f, &err);
	if (r < 0) {
		log_error("%s", err.msg);
		return KILN_EXIT_FAILURE;
	}
	km_weight_source src = km_file_source(f);
	kiln_engine_opts o = { .weight_dtype = arg.dtype,
			       .max_running = arg.max_running,
			       .max_step_tokens = arg.max_step,
			       .num_blocks = arg.blocks,
			       .max_waiting = arg.max_waiting,
			       .eos_token = arg.eos,
			       .prefix_caching = arg.prefix };
	if (d.watchdog_usec) {
		o.on_tick = on_engine_tick;
		o.tick_usec = d.watchdog_usec / 4;
	}
	a.model.vocab = km_file_config(f)->vocab_size;
	a.model.ctx = km_file_config(f)->max_seq_len;
	if (arg.ctx > a.model.ctx) {
		log_error("--context-length %d is longer than %s's own context (%d tokens); give "
			  "at most %d, or 0 for the model's",
			  arg.ctx, arg.model, a.model.ctx, a.model.ctx);
		return KILN_EXIT_USAGE;
	}
	if (arg.ctx > 0)
		a.model.ctx = arg.ctx;
	/* Freed after the engine (declared before it): its last callbacks decode. */
	_cleanup_(ktok_freep) ktok *tok = NULL;
	if ((r = load_tokenizer(&a.model, &tok)) != 0)
		return r;
	_cleanup_(kiln_engine_freep) kiln_engine *engine = NULL;
	r = kiln_engine_new(be, km_file_config(f), &src, &o, &engine, &err);
	f = km_file_free(f);
	if (r < 0) {
		log_error("%s: %s", arg.model, err.msg);
		return KILN_EXIT_FAILURE;
	}
	a.engine = engine;
	d.engine = engine;
	atomic_store(&last_tick_usec, kiln_now_usec());

	const kiln_http_route routes[] = {
		{ "POST", "/v1/completions", false, on_completions, &a },
		{ "POST", "/v1/chat/completions", false, on_chat, &a },
		{ "GET", "/v1/models", false, on_models, &a },
		{ "GET", "/v1/models/", true, on_model, &a },
		{ "GET", "/metrics", false, on_metrics, &a },
		{ "GET", "/health", false, on_health, &a },
	};
	kiln_http_config hc = { .address = arg.listen,
				.port = (uint16_t) arg.port,
				.threads = (unsigned) arg.threads,
				.max_connections = (unsigned) arg.max_conns,
				.max_connections_per_client = (unsigned) arg.per_client,
				.idle_timeout_s = (unsigned) arg.idle_timeout,
				.max_body_bytes = (size_t) arg.max_body,
				.sse_shutdown_event = SHUTDOWN_EVENT,
				.routes = routes,
				.n_routes = ARRAY_SIZE(routes) };
	kiln_http_server *srv = NULL;
	r = kiln_http_server_start(&hc, &srv);
	if (r < 0)
		return log_error_errno(r, "Failed to listen on %s:%d: %m", arg.listen, arg.port);
	log_info("Serving %s on http://%s:%u (%s, %s, %d KV blocks)", a.model.name, arg.listen,
		 kiln_http_server_port(srv), arg.backend, kk_dtype_name(arg.dtype), arg.blocks);
	if (d.watchdog_usec) {
		r = sd_event_add_time_relative(ev, NULL, CLOCK_MONOTONIC, 0, 0, on_watchdog, &d);
		if (r < 0) {
			kiln_http_server_free(srv);
			return log_error_errno(r, "Failed to start the watchdog timer: %m");
		}
	}
	(void) sd_notifyf(0,
			  "READY=1\nSTATUS=Serving %s on http://%s:%u (%s, %s, context %d, %d "
			  "KV blocks)",
			  a.model.name, arg.listen, kiln_http_server_port(srv), arg.backend,
			  kk_dtype_name(arg.dtype), a.model.ctx, arg.blocks);

	r = sd_event_loop(ev);
	if (r < 0)
		log_error_errno(r, "Event loop failed: %m");
	/* The server first: its streams are cancelled and no new request
	 * reaches the engine; then the engine cancels what is left (every
	 * job's finish callback closes its stream and frees it); then (the
	 * cleanups) the engine, the tokenizer, the backend. */
	kiln_http_server_free(srv);
	kiln_engine_shutdown(engine, KILN_ENGINE_CANCEL);
	return r < 0 ? r : KILN_EXIT_OK;
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
