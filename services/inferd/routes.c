/* routes.c — kiln-inferd's HTTP handlers: POST /v1/completions and
 * /v1/chat/completions (to the model the body names, 503 while draining),
 * GET /v1/models[/ID], /metrics (the engines', HTTP statuses) and /health
 * (503 "loading" until the models are in; every other route then answers
 * 503 model_loading), and the access hook that counts statuses.
 *
 * It exists apart from main.c so the endpoints a client sees are one
 * table in one file (docs/where-to-change.md: a new endpoint is a handler
 * and a row here); the request layer is openai.c, streaming stream.c. */
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

atomic_bool inferd_draining;
atomic_bool inferd_loaded;

/* What a client refused while the models load is told to wait. */
#define LOADING_RETRY_AFTER_S 5

/* Before the models are in, the port is already bound (main.c binds
 * first, so no one else can take it): every route but /health answers
 * 503 loading. */
static int reply_loading(kiln_http_request *r)
{
	return kiln_http_reply_retry(r, 503, LOADING_RETRY_AFTER_S, "model_loading",
				     "kiln-inferd is loading its models; retry in %d s",
				     LOADING_RETRY_AFTER_S);
}
#define REFUSE_WHILE_LOADING(r)                   \
	do {                                      \
		if (!atomic_load(&inferd_loaded)) \
			return reply_loading(r);  \
	} while (0)

/* What a client refused during the drain is told to wait: about what a
 * restart under systemd takes (RestartSec plus loading a model). */
#define DRAIN_RETRY_AFTER_S 10

inferd_served_models inferd_served;

static inferd_app *find_app(const char *name)
{
	for (int i = 0; i < inferd_served.n; i++)
		if (streq(inferd_served.apps[i].model.name, name))
			return &inferd_served.apps[i];
	return NULL;
}

/* OpenAI's 404 for a model this server does not have, naming those it has. */
static int reply_no_model(kiln_http_request *r, const char *id)
{
	return kiln_http_reply_error(r, 404, NULL, "model", "model_not_found",
				     "The model '%.*s' does not exist (this server has %s)",
				     INFERD_NAME_MAX, id, inferd_served.names);
}

static int on_request(kiln_http_request *r, void *u, bool chat)
{
	AUTHORIZE(r);
	REFUSE_WHILE_LOADING(r);
	if (atomic_load(&inferd_draining))
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
	inferd_app *a = &inferd_served.apps[0];
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
	REFUSE_WHILE_LOADING(r);
	_cleanup_json_ json_t *data = json_array();
	for (int i = 0; data && i < inferd_served.n; i++) {
		const inferd_app *a = &inferd_served.apps[i];
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
	REFUSE_WHILE_LOADING(r);
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

void inferd_on_access(const kiln_http_access *a, void *u)
{
	if (a->status < HTTP_STATUS_MAX)
		atomic_fetch_add(&http_status[a->status], 1);
}

static int on_metrics(kiln_http_request *r, void *u)
{
	if (inferd_arg.metrics_auth)
		AUTHORIZE(r);
	REFUSE_WHILE_LOADING(r);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;
	kiln_metrics_init(&m, &b);
	kiln_engine *engines[INFERD_MODELS_MAX];
	const char *names[INFERD_MODELS_MAX];
	for (int i = 0; i < inferd_served.n; i++) {
		engines[i] = inferd_served.apps[i].engine;
		names[i] = inferd_served.apps[i].model.name;
	}
	kiln_engine_metrics(engines, names, inferd_served.n, &m);
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

/* 200 "ok" once the models are loaded; 503 "loading" (Retry-After) before,
 * so a load balancer or `systemctl` health probe waits for the model. */
static int on_health(kiln_http_request *r, void *u)
{
	if (!atomic_load(&inferd_loaded)) {
		(void) kiln_http_set_header(r, "Retry-After", "5");
		return kiln_http_reply_text(r, 503, "text/plain; charset=utf-8", "loading\n", 8);
	}
	return kiln_http_reply_text(r, 200, "text/plain; charset=utf-8", "ok\n", 3);
}

const kiln_http_route inferd_routes[] = {
	{ "POST", "/v1/completions", false, on_completions, NULL },
	{ "POST", "/v1/chat/completions", false, on_chat, NULL },
	{ "GET", "/v1/models", false, on_models, NULL },
	{ "GET", "/v1/models/", true, on_model, NULL },
	{ "GET", "/metrics", false, on_metrics, NULL },
	{ "GET", "/health", false, on_health, NULL },
};
const size_t inferd_n_routes = ARRAY_SIZE(inferd_routes);
