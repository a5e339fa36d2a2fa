/* program.h — what the files of the kiln-inferd program share (not the
 * request and streaming layers, which inferd.h describes):
 *
 *   options.c  the command line, the cluster file's inference section
 *              under it and the schema's defaults under both
 *              (inferd_arg, the settings)
 *   keys.c     API keys: the keys file and the bearer-token check
 *   routes.c   the HTTP handlers (/v1/..., /metrics, /health)
 *   models.c   each served model: file, memory budget, backend,
 *              tokenizer, engine (inferd_served)
 *   main.c     signals, the drain, the watchdog, run()
 *
 * Not installed; only services/inferd's program files include it. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "inferd.h"
#include "kiln/config.h"
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
	OPT_MAX_, /* the size of inferd_arg.given[] */
};

/* The settings.  The defaults of those the cluster file has (listen, port,
 * backend, dtype, ...) are not written here: they come from the schema
 * (kiln_cfg_defaults()) or the file, in inferd_settings_from_cfg(), for every
 * option the command line did not give (given[]). */
/* One model to serve: a --model PATH[,KEY=VALUE...] or an element of
 * inference.models (the flat inference.model keys are one).  Unset: name
 * NULL, tokenizer NULL, dtype -1, chat -2, ctx -1, blocks 0, kv_bytes 0. */
typedef struct model_spec {
	const char *path, *name, *tokenizer;
	int dtype; /* a kk_dtype, or INFERD_DTYPE_AUTO */
	int chat;  /* a ktok_chat, -1 from the tokenizer */
	int ctx, blocks;
	uint64_t kv_bytes; /* the KV cache's size instead of blocks */
} model_spec;

#define MODEL_SPEC_UNSET                           \
	{                                          \
		.dtype = -1, .chat = -2, .ctx = -1 \
	}

typedef struct inferd_settings {
	const char *config, *node;
	const char *listen, *name, *backend, *tokenizer, *api_keys;
	bool metrics_auth;
	model_spec models[INFERD_MODELS_MAX];
	int n_models;
	uint64_t memory_budget; /* bytes; 0: the default */
	int port, max_running, max_step, blocks, max_waiting, eos, threads, ctx;
	int max_conns, per_client, idle_timeout, max_body; /* 0: kiln/http.h's defaults */
	int cpu_threads;				   /* 0: kk's default */
	int dtype; /* a kk_dtype, or INFERD_DTYPE_AUTO */
	int chat;  /* a ktok_chat, or -1: from the tokenizer */
	bool prefix;
	uint64_t drain_grace_usec;
	bool given[OPT_MAX_];
} inferd_settings;

/* The settings, filled by inferd_parse_argv() and
 * inferd_settings_from_cfg(), read-only once run() starts the models. */
extern inferd_settings inferd_arg;
extern const kiln_prog inferd_prog;

/* The served models, routed by name; set up by run() before the HTTP
 * server starts, read-only after. */
typedef struct inferd_served_models {
	inferd_app apps[INFERD_MODELS_MAX];
	int n;
	char names[INFERD_MODELS_MAX * (INFERD_NAME_MAX + 4)]; /* "'a', 'b'" for messages */
} inferd_served_models;
extern inferd_served_models inferd_served;

/* Set by the first SIGTERM/SIGINT: new requests get 503 + Retry-After
 * while those in flight finish (drain_step()). */
extern atomic_bool inferd_draining;

/* Set by run() once every model is loaded; until then the server, already
 * listening, answers 503 loading (routes.c). */
extern atomic_bool inferd_loaded;

typedef struct daemon_state {
	uint64_t drain_deadline; /* CLOCK_MONOTONIC usec; 0: not draining */
	uint64_t watchdog_usec;	 /* systemd's WatchdogSec; 0: off */
	bool watchdog_missed;	 /* logged once per stall */
} daemon_state;

/* ---- options.c */
int inferd_parse_argv(int argc, char **argv);
/* Fills what the command line left unset from the cluster file (when this
 * node serves inference) or the schema.  0 or an exit status. */
int inferd_settings_from_cfg(kiln_cfg **ret);

/* ---- keys.c */
/* Loads the API keys file (one key a line).  0, KILN_EXIT_USAGE for a file
 * others may read or change (a foreign owner, group or world write, world
 * read), else KILN_EXIT_FAILURE (unreadable, no key, a bad line). */
int inferd_keys_load(const char *path);
void inferd_keys_free(void);
/* Checks r's bearer token when keys are loaded; *refused: a 401 was sent
 * (return what this returns). */
int inferd_authorize(kiln_http_request *r, bool *refused);
#define AUTHORIZE(r)                                     \
	do {                                             \
		bool refused_;                           \
		int q_ = inferd_authorize(r, &refused_); \
		if (refused_)                            \
			return q_;                       \
	} while (0)

/* ---- routes.c */
extern const kiln_http_route inferd_routes[];
extern const size_t inferd_n_routes;
void inferd_on_access(const kiln_http_access *a, void *u);

/* ---- models.c */
/* Opens, budgets and loads every model.  0 or an exit status. */
int inferd_models_load(daemon_state *d);
void inferd_models_free(void);
/* What the log and STATUS= say is served. */
void inferd_models_describe(kiln_strbuf *b, unsigned port);

/* ---- main.c */
void inferd_on_engine_tick(void *userdata);
