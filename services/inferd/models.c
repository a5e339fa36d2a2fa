/* models.c — the models kiln-inferd serves: each one's file (its config),
 * context and KV cache size, the memory budget check over all of them
 * (km_memory_estimate, before anything is loaded), then its backend,
 * tokenizer and chat template, and engine; and their teardown in reverse.
 *
 * It exists apart from main.c because loading is the long, failure-rich
 * part of startup, and the daemon's loop does not need to know how a
 * model got there. */
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

/* ---- the memory budget -------------------------------------------------- */

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
	uint64_t budget = inferd_arg.memory_budget;
	if (!budget && !kk_backend_has(be, KK_CAP_HOST_MEMORY))
		return 0; /* no default on a GPU: kk allocates, and fails with its error */
	if (!budget)
		budget = memory_limit(&what);
	else if (!inferd_arg.given[OPT_MEMORY_BUDGET])
		what = "inference.memory_mb";
	uint64_t total = 0;
	km_memory e[INFERD_MODELS_MAX];
	for (int i = 0; i < n; i++) {
		km_model_opts o = { .weight_dtype = (kk_dtype) specs[i].dtype,
				    .max_tokens = inferd_arg.max_step,
				    .max_seqs = inferd_arg.max_running };
		int r = km_memory_estimate(cfgs[i], &o, specs[i].blocks, &e[i]);
		if (r < 0)
			return log_error_errno(r, "%s: cannot estimate its memory: %m",
					       specs[i].name);
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

/* --dtype auto for model m on backend be: what its file stores, or the
 * closest be computes on, logged with the reason.  0 or an exit status. */
static int dtype_auto(model_spec *m, const kk_backend *be)
{
	kiln_error err = {};
	kmf_dtype stored;
	double share;
	char why[160];
	if (inferd_file_weight_dtype(m->path, &stored, &share, &err) < 0) {
		log_error("%s: %s", m->path, err.msg);
		return KILN_EXIT_FAILURE;
	}
	m->dtype = (int) inferd_dtype_auto(stored, inferd_backend_computes, be, why, sizeof(why));
	/* km takes Q8_0 blocks as stored only where the backend keeps int8 in
	 * groups of 32; elsewhere it requantizes per row (kmodel.h). */
	if (stored == KMF_Q8_0 && m->dtype == KK_I8 && !kk_backend_has(be, KK_CAP_I8_GROUP32))
		snprintf(why, sizeof(why),
			 "Q8_0 requantized to per-row i8: the backend keeps no 32-block int8");
	log_info("%s: dtype auto: %s (%s holds %.0f%% of its weight matrices' elements as %s, "
		 "%s backend): %s",
		 m->name, kk_dtype_name((kk_dtype) m->dtype), m->path, 100 * share,
		 kmf_dtype_name(stored), kk_backend_name(be), why);
	return 0;
}

/* ---- run ------------------------------------------------------------------ */

/* What each served model owns, freed in reverse order of setup: engines
 * (their last callbacks decode) before tokenizers, then the backends. */
static struct {
	kk_backend *be[INFERD_MODELS_MAX];
	km_file *file[INFERD_MODELS_MAX];
	ktok *tok[INFERD_MODELS_MAX];
} owned;

void inferd_models_free(void)
{
	for (int i = INFERD_MODELS_MAX - 1; i >= 0; i--) {
		inferd_served.apps[i].engine = kiln_engine_free(inferd_served.apps[i].engine);
		owned.file[i] = km_file_free(owned.file[i]);
		ktok_free(owned.tok[i]);
		owned.tok[i] = NULL;
		owned.be[i] = kk_backend_free(owned.be[i]);
	}
}

/* Opens every model's file (its config), sizes its KV cache and context,
 * checks the memory budget, then loads each: backend, tokenizer, engine.
 * Returns 0 or an exit status. */
int inferd_models_load(daemon_state *d)
{
	const km_config *cfgs[INFERD_MODELS_MAX] = { 0 };
	inferd_served.n = inferd_arg.n_models;
	for (int i = 0; i < inferd_arg.n_models; i++) {
		model_spec *m = &inferd_arg.models[i];
		inferd_app *a = &inferd_served.apps[i];
		const char *slash = strrchr(m->path, '/');
		if (!m->name)
			m->name = slash && slash[1] ? slash + 1 : m->path;
		if (strlen(m->name) > INFERD_NAME_MAX) {
			log_error("%s: the name '%s' is longer than %d characters", m->path,
				  m->name, INFERD_NAME_MAX);
			return KILN_EXIT_USAGE;
		}
		for (int j = 0; j < i; j++)
			if (streq(inferd_arg.models[j].name, m->name)) {
				log_error("Two models are named '%s' (%s and %s): requests "
					  "pick a "
					  "model by its name; give each its own (--model "
					  "FILE,name=NAME, inference.models[].name)",
					  m->name, inferd_arg.models[j].path, m->path);
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
	}
	int r;
	/* The backends first: whether the budget has a default depends on
	 * where they keep their buffers, not on the name asked for; and
	 * --dtype auto asks them what they compute on. */
	for (int i = 0; i < inferd_arg.n_models; i++) {
		char why[KK_WHY_MAX];
		r = kk_backend_open_why(inferd_arg.backend, &owned.be[i], why, sizeof(why));
		if (r < 0) {
			log_error("Failed to open the %s backend: %s", inferd_arg.backend,
				  why[0] ? why : strerror(-r));
			return KILN_EXIT_FAILURE;
		}
		if (why[0] && i == 0) /* auto's fallback: said once, not per model */
			log_notice("%s", why);
		r = kk_backend_set_threads(owned.be[i], inferd_arg.cpu_threads);
		if (r < 0)
			return log_error_errno(r, "Failed to set %d compute threads: %m",
					       inferd_arg.cpu_threads);
	}
	for (int i = 0; i < inferd_arg.n_models; i++) {
		model_spec *m = &inferd_arg.models[i];
		const km_config *c = cfgs[i];
		if (m->dtype == INFERD_DTYPE_AUTO && (r = dtype_auto(m, owned.be[i])) != 0)
			return r;
		if (m->kv_bytes) {
			uint64_t nb = m->kv_bytes / km_kv_block_bytes(c, (kk_dtype) m->dtype);
			if (nb < 1 || nb > KM_KV_BLOCKS_MAX) {
				log_error("%s: a KV cache of %.1f MiB holds %" PRIu64 " blocks of "
					  "%.3f MiB; give between 1 and %d blocks' worth",
					  m->name, MIB(m->kv_bytes), nb,
					  MIB(km_kv_block_bytes(c, (kk_dtype) m->dtype)),
					  KM_KV_BLOCKS_MAX);
				return KILN_EXIT_USAGE;
			}
			m->blocks = (int) nb;
		}
	}
	r = check_budget(owned.be[0], inferd_arg.models, cfgs, inferd_arg.n_models);
	if (r != 0)
		return r;
	for (int i = 0; i < inferd_arg.n_models; i++) {
		model_spec *m = &inferd_arg.models[i];
		inferd_app *a = &inferd_served.apps[i];
		a->started = time(NULL);
		atomic_init(&a->next_id, 1);
		atomic_store(&a->last_tick, kiln_now_usec());
		if ((r = load_tokenizer(m, &a->model, &owned.tok[i])) != 0)
			return r;
		km_weight_source src = km_file_source(owned.file[i]);
		kiln_engine_opts o = { .weight_dtype = (kk_dtype) m->dtype,
				       .max_running = inferd_arg.max_running,
				       .max_step_tokens = inferd_arg.max_step,
				       .num_blocks = m->blocks,
				       .max_waiting = inferd_arg.max_waiting,
				       .eos_token = inferd_arg.eos,
				       .prefix_caching = inferd_arg.prefix };
		if (d->watchdog_usec) {
			o.on_tick = inferd_on_engine_tick;
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
	for (int i = 0; i < inferd_served.n; i++)
		kiln_strbuf_printf(&b, "%s'%s'", i ? ", " : "", inferd_served.apps[i].model.name);
	snprintf(inferd_served.names, sizeof(inferd_served.names), "%s", b.s ? b.s : "");
	kiln_strbuf_free(&b);
	return 0;
}

/* What the log and STATUS= say is served: one model as before ("NAME on
 * URL (backend, dtype, context N, N KV blocks)"), several as "N models on
 * URL (backend): NAME (dtype, context N, N KV blocks), ...". */
void inferd_models_describe(kiln_strbuf *b, unsigned port)
{
	if (inferd_served.n == 1) {
		kiln_strbuf_printf(b, "%s on http://%s:%u (%s, %s, context %d, %d KV blocks)",
				   inferd_served.apps[0].model.name, inferd_arg.listen, port,
				   kk_backend_name(owned.be[0]),
				   kk_dtype_name((kk_dtype) inferd_arg.models[0].dtype),
				   inferd_served.apps[0].model.ctx, inferd_arg.models[0].blocks);
		return;
	}
	kiln_strbuf_printf(b, "%d models on http://%s:%u (%s):", inferd_served.n, inferd_arg.listen,
			   port, kk_backend_name(owned.be[0]));
	for (int i = 0; i < inferd_served.n; i++)
		kiln_strbuf_printf(b, "%s %s (%s, context %d, %d KV blocks)", i ? "," : "",
				   inferd_served.apps[i].model.name,
				   kk_dtype_name((kk_dtype) inferd_arg.models[i].dtype),
				   inferd_served.apps[i].model.ctx, inferd_arg.models[i].blocks);
}
