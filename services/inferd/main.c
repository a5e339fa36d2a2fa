/* main.c — kiln-inferd, a minimal OpenAI-compatible completion server on the
 * inference engine (kiln/engine.h) and kiln/http.h.
 *
 *   kiln-inferd --model FILE [--port N] [--listen ADDR] [options]
 *
 * Serves POST /v1/completions with the prompt as token ids (no tokenizer
 * yet: the reply carries token ids and an empty text), streaming over SSE
 * or not, GET /v1/models, GET /metrics (Prometheus) and GET /health.  It
 * loads a llama2.c checkpoint onto the cpu or cuda backend, starts the
 * engine, listens, and stops on SIGTERM/SIGINT: the server stops first
 * (streams are cancelled), then the engine cancels what is left.  Exit
 * codes: 0 ok, 1 failure, 2 usage error.  docs/inferd-engine.md. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/engine.h"
#include "kiln/http.h"
#include "kiln/json.h"
#include "kiln/log.h"
#include "kiln/metrics.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

#define EXIT_USAGE 2
/* Token ids in a prompt array; the engine refuses prompts longer than the
 * model's context anyway, this bounds the JSON walk first. */
#define INFERD_PROMPT_MAX (1 << 20)
/* max_tokens accepted (OpenAI's own ceiling is in this range). */
#define INFERD_MAX_TOKENS_MAX 65536
/* The served model's name, in replies and checked against "model". */
#define INFERD_NAME_MAX 128

static struct {
	const char *model, *listen, *name, *backend, *dtype;
	int port, max_running, max_step, blocks, max_waiting, eos, threads;
	bool prefix;
} arg = { .listen = "127.0.0.1",
	  .port = 8000,
	  .backend = "cpu",
	  .dtype = "f32",
	  .eos = 2,
	  .max_running = 64,
	  .max_step = 512,
	  .blocks = 1024,
	  .max_waiting = 1024 };

typedef struct app {
	kiln_engine *engine;
	char name[INFERD_NAME_MAX + 1];
	int vocab, ctx;
	atomic_uint_fast64_t next_id;
	time_t started;
} app;

/* One completion in flight.  The engine's callback may fire before the
 * handler has its stream (the handler submits first so a full queue is a
 * real 429): it waits on `ready` until the handler says how it went. */
typedef struct job {
	app *a;
	uint64_t id;
	char rid[80]; /* "cmpl-" + the HTTP request id */
	bool stream;
	int n_prompt;
	int32_t *out; /* non-streaming: the tokens so far */
	int n_out, cap;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum { JOB_PENDING, JOB_READY, JOB_FAILED } state;
	kiln_http_stream *s; /* the SSE stream or the deferred reply */
} job;

static void job_free(job *j)
{
	if (!j)
		return;
	pthread_mutex_destroy(&j->lock);
	pthread_cond_destroy(&j->cond);
	free(j->out);
	free(j);
}

static json_t *choice(const int32_t *toks, int n, const char *finish)
{
	json_t *ids = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(ids, json_integer(toks[i]));
	return json_pack("{s:i, s:s, s:o, s:n, s:s?}", "index", 0, "text", "", "token_ids", ids,
			 "logprobs", "finish_reason", finish);
}

static json_t *completion(const job *j, json_t *ch)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->rid, "object", "text_completion",
			 "created", (json_int_t) time(NULL), "model", j->a->name, "choices", ch);
}

static const char *finish_word(const kiln_engine_event *ev)
{
	return ev->reason == KILN_ENGINE_FINISH_STOP ? "stop" : "length";
}

/* Engine callback (scheduler thread). */
static void on_event(void *ud, const kiln_engine_event *ev)
{
	job *j = ud;
	pthread_mutex_lock(&j->lock);
	while (j->state == JOB_PENDING)
		pthread_cond_wait(&j->cond, &j->lock);
	bool failed = j->state == JOB_FAILED;
	pthread_mutex_unlock(&j->lock);
	const bool fin = ev->type == KILN_ENGINE_EVENT_FINISH;
	if (failed) {
		if (fin)
			job_free(j);
		return;
	}
	if (!fin) {
		if (j->stream) {
			_cleanup_json_ json_t *c = completion(j, choice(&ev->token, 1, NULL));
			/* Never block the batch on one client: a client 64 KiB
			 * behind, or gone, loses its request. */
			int r = c ? kiln_http_stream_send_json(j->s, c, 0) : -ENOMEM;
			if (r < 0) {
				log_debug_errno(r, "%s: stream send failed (%m), cancelling",
						j->rid);
				kiln_engine_cancel(j->a->engine, j->id);
			}
		} else if (j->n_out < j->cap) {
			j->out[j->n_out++] = ev->token;
		}
		return;
	}
	if (ev->reason == KILN_ENGINE_FINISH_CANCELLED) {
		log_debug("%s: cancelled", j->rid);
		kiln_http_stream_close(j->s, false);
	} else if (ev->reason == KILN_ENGINE_FINISH_ERROR) {
		log_error("%s: generation failed: %s", j->rid, ev->message);
		if (j->stream)
			kiln_http_stream_close(j->s, false);
		else
			kiln_http_later_error(j->s, 500, NULL, NULL, NULL, "Generation failed: %s",
					      ev->message);
	} else {
		json_t *usage = json_pack("{s:i, s:i, s:i}", "prompt_tokens", j->n_prompt,
					  "completion_tokens", ev->n_generated, "total_tokens",
					  j->n_prompt + ev->n_generated);
		if (j->stream) {
			_cleanup_json_ json_t *c = completion(j, choice(NULL, 0, finish_word(ev)));
			if (c)
				json_object_set_new(c, "usage", usage);
			else
				json_decref(usage);
			if (c)
				kiln_http_stream_send_json(j->s, c, 0);
			kiln_http_stream_close(j->s, true);
		} else {
			_cleanup_json_ json_t *c =
				completion(j, choice(j->out, j->n_out, finish_word(ev)));
			if (c) {
				json_object_set_new(c, "usage", usage);
				kiln_http_later_json(j->s, 200, c);
			} else {
				json_decref(usage);
				kiln_http_later_error(j->s, 500, NULL, NULL, NULL, "out of memory");
			}
		}
	}
	job_free(j);
}

/* HTTP cancel (server thread): the client left or the server is stopping. */
static void on_http_cancel(kiln_http_stream *s, void *ud)
{
	job *j = ud;
	kiln_engine_cancel(j->a->engine, j->id);
}

/* "prompt": an array of token ids. */
static int get_prompt(const json_t *req, int vocab, int32_t **ret, int *ret_n, kiln_json_error *err)
{
	json_t *p = json_object_get(req, "prompt");
	if (!p)
		return kiln_json_fail(err, "prompt", "required field is missing");
	if (json_is_string(p) ||
	    (json_is_array(p) && json_array_size(p) > 0 && json_is_string(json_array_get(p, 0))))
		return kiln_json_fail(err, "prompt",
				      "text prompts need a tokenizer, which this server does not "
				      "have yet; send an array of token ids");
	if (!json_is_array(p))
		return kiln_json_fail(err, "prompt", "expected an array of token ids, got %s",
				      kiln_json_type_name(p));
	size_t n = json_array_size(p);
	if (n < 1 || n > INFERD_PROMPT_MAX)
		return kiln_json_fail(err, "prompt", "expected 1 to %d token ids, got %zu",
				      INFERD_PROMPT_MAX, n);
	int32_t *ids = malloc(n * sizeof(int32_t));
	if (!ids)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(p, i);
		char where[KILN_JSON_PATH_MAX];
		kiln_json_path(where, sizeof(where), "prompt", NULL, i);
		if (!json_is_integer(v)) {
			free(ids);
			return kiln_json_fail(err, where, "expected a token id, got %s",
					      kiln_json_type_name(v));
		}
		json_int_t t = json_integer_value(v);
		if (t < 0 || t >= vocab) {
			free(ids);
			return kiln_json_fail(err, where,
					      "token id %lld is outside the vocabulary (0..%d)",
					      (long long) t, vocab - 1);
		}
		ids[i] = (int32_t) t;
	}
	*ret = ids;
	*ret_n = (int) n;
	return 0;
}

/* "stop_token_ids" (vLLM's extension): an array of token ids. */
static int get_stop(const json_t *req, int vocab, int32_t *stop, int *ret_n, kiln_json_error *err)
{
	json_t *p = json_object_get(req, "stop_token_ids");
	*ret_n = 0;
	if (!p || json_is_null(p))
		return 0;
	if (!json_is_array(p) || json_array_size(p) > KILN_ENGINE_STOP_MAX)
		return kiln_json_fail(err, "stop_token_ids", "expected at most %d token ids",
				      KILN_ENGINE_STOP_MAX);
	for (size_t i = 0; i < json_array_size(p); i++) {
		json_t *v = json_array_get(p, i);
		char where[KILN_JSON_PATH_MAX];
		kiln_json_path(where, sizeof(where), "stop_token_ids", NULL, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= vocab)
			return kiln_json_fail(err, where, "expected a token id in 0..%d",
					      vocab - 1);
		stop[i] = (int32_t) json_integer_value(v);
	}
	*ret_n = (int) json_array_size(p);
	return 0;
}

static int on_completions(kiln_http_request *r, void *u)
{
	app *a = u;
	kiln_json_error err;
	_cleanup_json_ json_t *req = NULL;
	if (kiln_http_request_json(r, &req, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	static const char *const known[] = { "model", "prompt",		"max_tokens", "temperature",
					     "top_p", "top_k",		"seed",	      "stream",
					     "n",     "stop_token_ids", "ignore_eos", "user",
					     NULL };
	const char *model = NULL;
	int64_t max_tokens = 16, top_k = 0, seed = -1, n = 1;
	double temperature = 1.0, top_p = 1.0;
	bool stream = false, ignore_eos = false;
	int32_t stop[KILN_ENGINE_STOP_MAX];
	int n_stop = 0;
	if (kiln_json_check_keys(req, "", known, &err) < 0 ||
	    kiln_json_get_string(req, "", "model", KILN_JSON_REQUIRED, INFERD_NAME_MAX, &model,
				 &err) < 0 ||
	    kiln_json_get_int(req, "", "max_tokens", 0, 1, INFERD_MAX_TOKENS_MAX, &max_tokens,
			      &err) < 0 ||
	    kiln_json_get_number(req, "", "temperature", 0, 0, 2, &temperature, &err) < 0 ||
	    kiln_json_get_number(req, "", "top_p", 0, 0, 1, &top_p, &err) < 0 ||
	    kiln_json_get_int(req, "", "top_k", 0, 0, KK_SAMPLE_TOP_K_MAX, &top_k, &err) < 0 ||
	    kiln_json_get_int(req, "", "seed", 0, 0, INT64_MAX, &seed, &err) < 0 ||
	    kiln_json_get_int(req, "", "n", 0, 1, 1, &n, &err) < 0 ||
	    kiln_json_get_bool(req, "", "stream", 0, &stream, &err) < 0 ||
	    kiln_json_get_bool(req, "", "ignore_eos", 0, &ignore_eos, &err) < 0 ||
	    get_stop(req, a->vocab, stop, &n_stop, &err) < 0)
		return kiln_http_reply_json_error(r, &err);
	if (!streq(model, a->name))
		return kiln_http_reply_error(r, 404, NULL, "model", "model_not_found",
					     "The model '%s' does not exist (this server has '%s')",
					     model, a->name);
	_cleanup_free_ int32_t *prompt = NULL;
	int n_prompt = 0;
	int q = get_prompt(req, a->vocab, &prompt, &n_prompt, &err);
	if (q == -ENOMEM)
		return q;
	if (q < 0)
		return kiln_http_reply_json_error(r, &err);

	job *j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->a = a;
	j->id = atomic_fetch_add(&a->next_id, 1);
	snprintf(j->rid, sizeof(j->rid), "cmpl-%s", kiln_http_request_id(r));
	j->stream = stream;
	j->n_prompt = n_prompt;
	j->cap = (int) MIN(max_tokens, (int64_t) a->ctx + 1);
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->cond, NULL);
	if (!stream && !(j->out = malloc((size_t) j->cap * sizeof(int32_t)))) {
		job_free(j);
		return -ENOMEM;
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	kiln_engine_request er = {
		.id = j->id,
		.prompt = prompt,
		.n_prompt = n_prompt,
		.max_tokens = (int) max_tokens,
		.sampling = { .temperature = (float) temperature,
			      .top_k = (int) top_k,
			      .top_p = (float) top_p,
			      /* no seed: a fresh one per request */
			      .seed = seed >= 0 ? (uint64_t) seed
						: (uint64_t) now.tv_nsec * 0x9E3779B97F4A7C15u ^
							  j->id },
		.stop = stop,
		.n_stop = n_stop,
		.ignore_eos = ignore_eos,
		.cb = on_event,
		.userdata = j,
	};
	km_error kerr;
	q = kiln_engine_submit(a->engine, &er, &kerr);
	if (q < 0) {
		job_free(j); /* the engine took nothing */
		if (q == -EAGAIN)
			return kiln_http_reply_retry(r, 429, 1, "overloaded", "%s", kerr.msg);
		if (q == -ESHUTDOWN)
			return kiln_http_reply_retry(r, 503, 0, NULL, "%s", kerr.msg);
		if (q == -E2BIG || q == -EINVAL)
			return kiln_http_reply_error(r, 400, NULL, "prompt", NULL, "%s", kerr.msg);
		return q;
	}
	q = stream ? kiln_http_reply_sse(r, on_http_cancel, j, &j->s)
		   : kiln_http_reply_later(r, on_http_cancel, j, &j->s);
	pthread_mutex_lock(&j->lock);
	j->state = q < 0 ? JOB_FAILED : JOB_READY;
	pthread_cond_signal(&j->cond);
	pthread_mutex_unlock(&j->lock);
	if (q < 0) /* no reply channel: the callback frees j at the finish */
		kiln_engine_cancel(a->engine, er.id);
	return q;
}

static int on_models(kiln_http_request *r, void *u)
{
	app *a = u;
	_cleanup_json_ json_t *o =
		json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
			  a->name, "object", "model", "created", (json_int_t) a->started,
			  "owned_by", "kiln", "max_model_len", a->ctx);
	if (!o)
		return -ENOMEM;
	return kiln_http_reply_json(r, 200, o);
}

static int on_metrics(kiln_http_request *r, void *u)
{
	app *a = u;
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

static void help(void)
{
	printf("Usage: kiln-inferd --model FILE [OPTIONS]\n"
	       "\n"
	       "OpenAI-compatible completions (prompt as token ids) on the kiln inference\n"
	       "engine.  Serves POST /v1/completions (\"stream\": true for SSE), GET /v1/models,\n"
	       "GET /metrics and GET /health.\n"
	       "\n"
	       "  -m, --model FILE          llama2.c checkpoint (required)\n"
	       "      --name NAME           model name in the API (default: the file's base name)\n"
	       "  -l, --listen ADDR         address to listen on (default 127.0.0.1)\n"
	       "  -p, --port N              port (default 8000; 0: an ephemeral one, logged)\n"
	       "      --backend NAME        kk backend: cpu or cuda (default cpu)\n"
	       "      --dtype NAME          weights: f32, bf16, f16, i8 or q4 (default f32)\n"
	       "      --max-running N       sequences per step (default 64)\n"
	       "      --max-step-tokens N   tokens per step (default 512)\n"
	       "      --kv-blocks N         KV cache blocks of 16 tokens (default 1024)\n"
	       "      --max-waiting N       queued requests before 429 (default 1024)\n"
	       "      --eos ID              end-of-sequence token, -1 for none (default 2)\n"
	       "      --prefix-caching      share prompt-prefix KV blocks between requests\n"
	       "      --threads N           HTTP worker threads (default 4)\n"
	       "  -v, --verbose             more logging\n"
	       "  -q, --quiet               less logging\n"
	       "  -h, --help                this help\n"
	       "      --version             the version\n");
}

enum {
	OPT_NAME = 256,
	OPT_BACKEND,
	OPT_DTYPE,
	OPT_RUNNING,
	OPT_STEP,
	OPT_BLOCKS,
	OPT_WAITING,
	OPT_EOS,
	OPT_PREFIX,
	OPT_THREADS,
	OPT_VERSION,
};

/* 0 to run, 1 to exit 0 (help/version), -EINVAL for a usage error. */
static int parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "name", required_argument, NULL, OPT_NAME },
		{ "listen", required_argument, NULL, 'l' },
		{ "port", required_argument, NULL, 'p' },
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "dtype", required_argument, NULL, OPT_DTYPE },
		{ "max-running", required_argument, NULL, OPT_RUNNING },
		{ "max-step-tokens", required_argument, NULL, OPT_STEP },
		{ "kv-blocks", required_argument, NULL, OPT_BLOCKS },
		{ "max-waiting", required_argument, NULL, OPT_WAITING },
		{ "eos", required_argument, NULL, OPT_EOS },
		{ "prefix-caching", no_argument, NULL, OPT_PREFIX },
		{ "threads", required_argument, NULL, OPT_THREADS },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, OPT_VERSION },
		{},
	};
	int c;
	while ((c = getopt_long(argc, argv, "m:l:p:vqh", opts, NULL)) >= 0) {
		int r = 0;
		switch (c) {
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
			arg.dtype = optarg;
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
		case 'v':
			log_adjust_level(+1);
			break;
		case 'q':
			log_adjust_level(-1);
			break;
		case 'h':
			help();
			return 1;
		case OPT_VERSION:
			printf("kiln-inferd %s\n", KILN_VERSION);
			return 1;
		default:
			return -EINVAL;
		}
		if (r < 0)
			return log_error_errno(r, "Invalid value '%s' for --%s; see --help", optarg,
					       c == 'p' ? "port" : "an option");
	}
	if (optind < argc)
		return log_error_errno(-EINVAL, "Unexpected argument '%s'; see --help",
				       argv[optind]);
	if (!arg.model)
		return log_error_errno(-EINVAL, "--model FILE is required; see --help");
	return 0;
}

static int parse_dtype(const char *s, kk_dtype *ret)
{
	static const struct {
		const char *name;
		kk_dtype dt;
	} t[] = { { "f32", KK_F32 },
		  { "bf16", KK_BF16 },
		  { "f16", KK_F16 },
		  { "i8", KK_I8 },
		  { "q4", KK_Q4 } };
	for (size_t i = 0; i < ARRAY_SIZE(t); i++)
		if (streq(s, t[i].name)) {
			*ret = t[i].dt;
			return 0;
		}
	return -EINVAL;
}

/* Returns the exit code: 0, 1 (failure) or EXIT_USAGE. */
static int run(int argc, char **argv)
{
	int r = parse_args(argc, argv);
	if (r != 0)
		return r > 0 ? 0 : EXIT_USAGE;
	kk_dtype dt;
	if (parse_dtype(arg.dtype, &dt) < 0) {
		log_error("--dtype %s: expected f32, bf16, f16, i8 or q4", arg.dtype);
		return EXIT_USAGE;
	}
	/* Signals are taken by sigwait below; block them before any thread. */
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	pthread_sigmask(SIG_BLOCK, &ss, NULL);

	app a = { .started = time(NULL) };
	atomic_init(&a.next_id, 1);
	const char *slash = strrchr(arg.model, '/');
	snprintf(a.name, sizeof(a.name), "%s", arg.name ? arg.name : slash ? slash + 1 : arg.model);

	kk_backend *be = NULL;
	r = kk_backend_open(arg.backend, &be);
	if (r < 0) {
		log_error_errno(r, "Failed to open the %s backend: %m", arg.backend);
		return 1;
	}
	km_error err = {};
	km_l2c *f = NULL;
	r = km_l2c_open(arg.model, &f, &err);
	if (r < 0) {
		log_error("%s", err.msg);
		kk_backend_free(be);
		return 1;
	}
	km_weight_source src = km_l2c_source(f);
	kiln_engine_opts o = { .weight_dtype = dt,
			       .max_running = arg.max_running,
			       .max_step_tokens = arg.max_step,
			       .num_blocks = arg.blocks,
			       .max_waiting = arg.max_waiting,
			       .eos_token = arg.eos,
			       .prefix_caching = arg.prefix };
	a.vocab = km_l2c_config(f)->vocab_size;
	a.ctx = km_l2c_config(f)->max_seq_len;
	r = kiln_engine_new(be, km_l2c_config(f), &src, &o, &a.engine, &err);
	km_l2c_free(f);
	if (r < 0) {
		log_error("%s: %s", arg.model, err.msg);
		kk_backend_free(be);
		return 1;
	}

	const kiln_http_route routes[] = {
		{ "POST", "/v1/completions", false, on_completions, &a },
		{ "GET", "/v1/models", false, on_models, &a },
		{ "GET", "/metrics", false, on_metrics, &a },
		{ "GET", "/health", false, on_health, &a },
	};
	kiln_http_config hc = { .address = arg.listen,
				.port = (uint16_t) arg.port,
				.threads = (unsigned) arg.threads,
				.routes = routes,
				.n_routes = ARRAY_SIZE(routes) };
	kiln_http_server *srv = NULL;
	r = kiln_http_server_start(&hc, &srv);
	if (r < 0) {
		log_error_errno(r, "Failed to listen on %s:%d: %m", arg.listen, arg.port);
		kiln_engine_free(a.engine);
		kk_backend_free(be);
		return 1;
	}
	log_info("Serving %s on http://%s:%u (%s, %s, %d KV blocks)", a.name, arg.listen,
		 kiln_http_server_port(srv), arg.backend, arg.dtype, arg.blocks);
	int sig = 0;
	sigwait(&ss, &sig);
	log_info("Got %s, stopping", strsignal(sig));
	/* The server first: its streams are cancelled and no new request
	 * reaches the engine; then the engine cancels what is left (every
	 * job's finish callback closes its stream and frees it). */
	kiln_http_server_free(srv);
	kiln_engine_shutdown(a.engine, KILN_ENGINE_CANCEL);
	kiln_engine_free(a.engine);
	kk_backend_free(be);
	return 0;
}

int main(int argc, char **argv)
{
	return run(argc, argv);
}
