/* kiln-train — a data-parallel Llama trainer on the kk kernel library.
 *
 * Trains the model of any file km_file_open reads (--model: a llama2.c
 * checkpoint, kiln or Hugging Face safetensors, GGUF llama; its config and
 * initial weights), or a model of a given shape from seeded random weights
 * (--init, kmt_config_parse), on a token shard (--data) with kmtrain: B sequences of T tokens
 * per rank and step, AdamW with warmup + cosine decay and gradient
 * clipping, one gradient all-reduce per step.  It is a torchrun-style
 * worker: RANK and WORLD_SIZE say who it is; with WORLD_SIZE > 1 rank 0
 * creates the kk communicator id and hands it to the others through the
 * TCPStore at MASTER_ADDR:MASTER_PORT (kiln-run's store, or torchrun's),
 * under $KILN_COMM_ID_KEY (kiln-run gives a fresh key per round).
 * Rank 0 logs one line per step and writes crash-safe checkpoints
 * (--save, every --save-every steps and at the end); --resume continues
 * one exactly.  Preemption: SIGUSR1 (Slurm's warning, which kiln-run
 * forwards) asks for a checkpoint, SIGTERM/SIGINT for a checkpoint and an
 * exit; the ranks agree on it after every step (a 1-float MAX all-reduce)
 * so they all stop at the same step.  kiln-train(1) and docs/train.md have the long form. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/store.h"
#include "kk.h"
#include "kmodel.h"
#include "kmtrain.h"

/* How long a rank waits for the store and for rank 0's communicator id
 * (rank 0 may still be loading the model). */
#define STORE_TIMEOUT_USEC (UINT64_C(300) * 1000000)
/* Bounds on flags, so a typo fails fast instead of allocating terabytes. */
#define STEPS_MAX (INT64_C(1) << 40)

DEFINE_TRIVIAL_CLEANUP_FUNC(km_file *, km_file_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(kmt_shard *, kmt_shard_free);

typedef struct args {
	const char *model, *init, *data, *save, *resume, *backend;
	int64_t steps, save_every, warmup, stop_at;
	int batch, seq, accum, threads;
	double lr, lr_min, weight_decay, clip;
	uint64_t seed;
} args;

/* The command line (defaults here; parse_argv() fills in the rest). */
static args arg = { .steps = 100,
		    .batch = 8,
		    .accum = 1,
		    .seq = 128,
		    .lr = 1e-3,
		    .lr_min = -1,
		    .warmup = 10,
		    .weight_decay = 0.1,
		    .clip = 1.0,
		    .seed = 1 };

enum {
	OPT_STEPS = KILN_OPT_FIRST,
	OPT_SEQ,
	OPT_LR,
	OPT_LR_MIN,
	OPT_WARMUP,
	OPT_WD,
	OPT_CLIP,
	OPT_SEED,
	OPT_SAVE_EVERY,
	OPT_STOP_AT,
	OPT_ACCUM,
	OPT_BACKEND,
	OPT_THREADS,
	OPT_INIT,
};

static const kiln_option options[] = {
	{ "model", 'm', "FILE",
	  "config and initial weights: llama2.c, safetensors\n(kiln-train's or Hugging Face) or "
	  "GGUF llama",
	  "file", .str = &arg.model },
	{ "init", OPT_INIT, "SPEC",
	  "instead of --model: random weights (seed --seed) of\nthe shape SPEC, e.g. "
	  "dim=64,hidden=172,layers=5,\nheads=8,kv_heads=4,vocab=512,seq=512",
	  NULL, .str = &arg.init },
	{ "data", 'd', "SHARD", "token shard (kmtrain format, docs/train.md)", "file",
	  .str = &arg.data },
	{ "steps", OPT_STEPS, "N", "optimizer steps in all (default 100)", NULL },
	{ "batch", 'b', "B", "sequences per rank and step (default 8)", NULL },
	{ "seq", OPT_SEQ, "T", "tokens per sequence (default 128)", NULL },
	{ "accum", OPT_ACCUM, "K", "micro-batches of B accumulated per step (default 1)", NULL },
	{ "lr", OPT_LR, "LR", "peak learning rate (default 1e-3)", NULL },
	{ "lr-min", OPT_LR_MIN, "LR", "final learning rate of the cosine decay (default lr/10)",
	  NULL },
	{ "warmup", OPT_WARMUP, "N", "linear warmup steps (default 10)", NULL },
	{ "weight-decay", OPT_WD, "WD", "AdamW decoupled weight decay (default 0.1)", NULL },
	{ "clip", OPT_CLIP, "C", "global gradient-norm clip, 0 = none (default 1.0)", NULL },
	{ "seed", OPT_SEED, "S", "seed of the data order and of --init's weights\n(default 1)",
	  NULL },
	{ "save", 's', "FILE", "write a checkpoint (safetensors) at the end", "file",
	  .str = &arg.save },
	{ "save-every", OPT_SAVE_EVERY, "N", "... and every N steps (default 0: only at the end)",
	  NULL },
	{ "stop-at", OPT_STOP_AT, "N",
	  "stop (and save) after step N, keeping the schedule\nof --steps (a run cut in parts; "
	  "default: --steps)",
	  NULL },
	{ "resume", 'r', "FILE", "continue from a checkpoint written by --save", "file",
	  .str = &arg.resume },
	{ "backend", OPT_BACKEND, "NAME",
	  "kk backend: cpu, cuda, auto (default auto;\nKILN_BACKEND overrides)", "cpu cuda auto",
	  .str = &arg.backend },
	{ "threads", OPT_THREADS, "N",
	  "cpu backend compute threads, 0 = the CPUs of the\naffinity mask and cgroup quota "
	  "(default 0)",
	  NULL },
	KILN_OPTIONS_COMMON,
	{}
};

static int parse_option(int key, const char *arg);

static const kiln_prog prog = {
	.name = "kiln-train",
	.summary = "train a Llama model on a token shard, data-parallel",
	.usage = "kiln-train {--model FILE | --init SPEC} --data SHARD [OPTIONS]",
	.options = options,
	.option = parse_option,
	.no_args = true,
	.epilog = "Data-parallel across the ranks a launcher starts (RANK, WORLD_SIZE,\n"
		  "MASTER_ADDR, MASTER_PORT): kiln-run or torchrun.\n"
		  "\n"
		  "--model takes a llama2.c checkpoint, a kiln-train checkpoint (--save writes\n"
		  "safetensors), Hugging Face safetensors (config.json beside it) or a GGUF\n"
		  "llama file.  --init SPEC trains from scratch instead: comma-separated\n"
		  "KEY=VALUE pairs dim, hidden, layers, heads, vocab, seq (required),\n"
		  "kv_heads (default heads), norm_eps (1e-5), rope_theta (10000), shared\n"
		  "(1: classifier = token embedding); weights N(0, 0.02), wo and w2 scaled\n"
		  "by 1/sqrt(2 layers), norm gains 1, drawn from --seed.\n"
		  "-v logs every rank's loss line.\n"
		  "\n"
		  "SIGUSR1 writes a checkpoint after the current step; SIGTERM and SIGINT\n"
		  "write one and stop (exit status 1).\n"
		  "\n"
		  "Exit status: 0 done, 1 training failed or stopped, 2 usage or input error.\n",
};

static int parse_pos_double(const char *flag, const char *s, double *ret)
{
	double v;
	if (kiln_parse_double(s, &v) < 0 || !(v >= 0) || !isfinite(v))
		return kiln_usage_error(&prog, "%s '%s': must be a number >= 0.", flag, s);
	*ret = v;
	return 0;
}

static int parse_steps(const char *flag, const char *s, int64_t min, int64_t *ret)
{
	if (kiln_parse_int64(s, min, STEPS_MAX, ret) < 0)
		return kiln_usage_error(&prog, "%s '%s': must be %" PRId64 "..%" PRId64 ".", flag,
					s, min, STEPS_MAX);
	return 0;
}

static int parse_count(const char *flag, const char *s, int max, int *ret)
{
	if (kiln_parse_int(s, 1, max, ret) < 0)
		return kiln_usage_error(&prog, "%s '%s': must be 1..%d.", flag, s, max);
	return 0;
}

static int parse_option(int key, const char *val)
{
	args *a = &arg;
	switch (key) {
	case OPT_STEPS:
		return parse_steps("--steps", val, 1, &a->steps);
	case 'b':
		return parse_count("--batch", val, KMT_MAX_TOKENS, &a->batch);
	case OPT_SEQ:
		return parse_count("--seq", val, KMT_MAX_TOKENS, &a->seq);
	case OPT_ACCUM:
		return parse_count("--accum", val, KMT_MAX_MICRO, &a->accum);
	case OPT_LR:
		return parse_pos_double("--lr", val, &a->lr);
	case OPT_LR_MIN:
		return parse_pos_double("--lr-min", val, &a->lr_min);
	case OPT_WARMUP:
		return parse_steps("--warmup", val, 0, &a->warmup);
	case OPT_WD:
		return parse_pos_double("--weight-decay", val, &a->weight_decay);
	case OPT_CLIP:
		return parse_pos_double("--clip", val, &a->clip);
	case OPT_SEED:
		if (kiln_parse_uint64(val, UINT64_MAX, &a->seed) < 0)
			return kiln_usage_error(
				&prog, "--seed '%s': must be an unsigned 64-bit integer.", val);
		return 0;
	case OPT_SAVE_EVERY:
		return parse_steps("--save-every", val, 0, &a->save_every);
	case OPT_STOP_AT:
		return parse_steps("--stop-at", val, 1, &a->stop_at);
	case OPT_THREADS:
		if (kiln_parse_int(val, 0, KK_THREADS_MAX, &a->threads) < 0)
			return kiln_usage_error(&prog, "--threads '%s': must be 0..%d.", val,
						KK_THREADS_MAX);
		return 0;
	default:
		return 1;
	}
}

static int parse_argv(int argc, char **argv)
{
	args *a = &arg;
	int r = kiln_parse_options(&prog, argc, argv);
	if (r <= 0)
		return r;
	if (!!a->model == !!a->init)
		return kiln_usage_error(&prog,
					"Give either --model FILE or --init SPEC (not both).");
	if (!a->data)
		return kiln_usage_error(&prog, "--data is required.");
	if (a->save_every && !a->save)
		return kiln_usage_error(&prog, "--save-every needs --save FILE.");
	if (a->lr_min < 0)
		a->lr_min = a->lr / 10;
	if (!a->stop_at || a->stop_at > a->steps)
		a->stop_at = a->steps;
	return 1;
}

/* RANK / WORLD_SIZE as torchrun sets them; absent means a single process. */
static int read_rank(int *rank, int *world)
{
	const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
	*rank = 0;
	*world = 1;
	if (w && *w && kiln_parse_int(w, 1, KK_COMM_WORLD_MAX, world) < 0)
		return log_error_errno(-EINVAL, "WORLD_SIZE='%s': must be 1..%d", w,
				       KK_COMM_WORLD_MAX);
	if (r && *r && kiln_parse_int(r, 0, *world - 1, rank) < 0)
		return log_error_errno(-EINVAL, "RANK='%s': must be 0..WORLD_SIZE-1 (%d)", r,
				       *world - 1);
	return 0;
}

/* The communicator of WORLD_SIZE ranks, its id passed through the store. */
static int make_comm(kk_backend *be, int rank, int world, kk_comm **ret)
{
	const char *addr = getenv("MASTER_ADDR"), *port_s = getenv("MASTER_PORT");
	const char *key = getenv("KILN_COMM_ID_KEY");
	int port;
	if (!addr || !*addr || !port_s || kiln_parse_int(port_s, 1, 65535, &port) < 0)
		return log_error_errno(
			-EINVAL,
			"WORLD_SIZE is %d but MASTER_ADDR/MASTER_PORT ('%s'/'%s') do "
			"not name the launcher's store; start kiln-train under "
			"kiln-run or torchrun",
			world, addr ? addr : "", port_s ? port_s : "");
	if (!key || !*key)
		key = "kiln-train/comm-id";
	kiln_store_client *sc = NULL;
	int r = kiln_store_client_connect(addr, (uint16_t) port, NULL, STORE_TIMEOUT_USEC, &sc);
	if (r < 0)
		return log_error_errno(r, "Cannot reach the store at %s:%d: %m", addr, port);
	char id[KK_COMM_ID_BYTES] = { 0 };
	if (rank == 0) {
		r = kk_comm_get_id(be, id, sizeof(id));
		if (r < 0) {
			kiln_store_client_free(sc);
			return log_error_errno(r, "Cannot create the communicator id: %m");
		}
		r = kiln_store_client_set(sc, key, id, sizeof(id));
	} else {
		void *v = NULL;
		size_t len = 0;
		r = kiln_store_client_get(sc, key, &v, &len);
		if (r >= 0 && len != sizeof(id))
			r = -EPROTO;
		if (r >= 0)
			memcpy(id, v, sizeof(id));
		free(v);
	}
	kiln_store_client_free(sc);
	if (r < 0)
		return log_error_errno(r, "Exchanging the communicator id under '%s' failed: %m",
				       key);
	r = kk_comm_init(be, rank, world, id, sizeof(id), ret);
	if (r < 0)
		return log_error_errno(r, "Joining %d ranks as rank %d failed: %m", world, rank);
	return 0;
}

/* What the signal handler asks for: 1 checkpoint, 2 checkpoint and stop. */
static volatile sig_atomic_t requested;

static void on_signal(int sig)
{
	int want = sig == SIGUSR1 ? 1 : 2;
	if (requested < want)
		requested = want;
}

static int install_signals(void)
{
	/* SA_RESTART: a signal must not break a collective in flight (kk's
	 * socket code also retries on EINTR). */
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0 ||
	    sigaction(SIGINT, &sa, NULL) < 0)
		return log_error_errno(-errno, "Cannot install signal handlers: %m");
	return 0;
}

/* The request of any rank, the same on every rank (MAX over the ranks). */
static int agree(kk_backend *be, kk_comm *comm, kk_buffer *flag, int *ret)
{
	float f = (float) requested;
	if (comm) {
		int r = kk_buffer_upload(be, NULL, flag, 0, &f, sizeof(f));
		if (r >= 0)
			r = kk_all_reduce(comm, NULL, flag, flag, 1, KK_MAX);
		if (r >= 0)
			r = kk_buffer_download(be, NULL, flag, 0, &f, sizeof(f));
		if (r < 0)
			return log_error_errno(r, "Agreeing on a checkpoint request failed: %m");
	}
	*ret = (int) f;
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Writes the checkpoint (rank 0). */
static int save(kmt_model *m, const char *path, const kmt_sampler *s, uint64_t seed)
{
	kmt_ckpt_state st = { .rng = seed };
	kiln_error err = {};
	kmt_sampler_cursor(s, &st.cursor);
	int r = kmt_save(m, path, &st, &err);
	if (r < 0)
		return log_error_errno(r, "%s", err.msg);
	log_info("step %" PRId64 ": checkpoint %s written", kmt_model_step(m), path);
	return 0;
}

static int run(int argc, char **argv)
{
	const args *a = &arg;
	int rank, world, r;
	if ((r = read_rank(&rank, &world)) < 0)
		return KILN_EXIT_USAGE;
	kiln_error err = {};
	_cleanup_(km_file_freep) km_file *f = NULL;
	km_config cfg;
	if (a->init) {
		if ((r = kmt_config_parse(a->init, &cfg, &err)) < 0) {
			log_error("--init: %s", err.msg);
			return KILN_EXIT_USAGE;
		}
	} else {
		if ((r = km_file_open(a->model, &f, &err)) < 0) {
			log_error("%s", err.msg);
			return KILN_EXIT_USAGE;
		}
		cfg = *km_file_config(f);
	}
	if (a->seq > cfg.max_seq_len) {
		log_error("--seq %d is longer than the model's context (%d)", a->seq,
			  cfg.max_seq_len);
		return KILN_EXIT_USAGE;
	}
	_cleanup_(kmt_shard_freep) kmt_shard *sh = NULL;
	if ((r = kmt_shard_open(a->data, cfg.vocab_size, &sh, &err)) < 0) {
		log_error("%s", err.msg);
		return KILN_EXIT_USAGE;
	}
	kk_backend *be = NULL;
	kk_comm *comm = NULL;
	kk_buffer *flag = NULL;
	kmt_model *m = NULL;
	kmt_sampler *s = NULL;
	int ret = KILN_EXIT_FAILURE;
	int32_t *tok = NULL, *tgt = NULL;
	kmt_batch *mb = NULL;
	char why[KK_WHY_MAX];
	if ((r = kk_backend_open_why(a->backend, &be, why, sizeof(why))) < 0) {
		log_error("Cannot open the kk backend '%s': %s", a->backend ? a->backend : "auto",
			  why[0] ? why : strerror(-r));
		goto out;
	}
	if (why[0])
		log_notice("%s", why);
	if ((r = kk_backend_set_threads(be, a->threads)) < 0) {
		log_error_errno(r, "Cannot use %d compute threads: %m", a->threads);
		goto out;
	}
	/* --init: no source, kmt_model_new draws the weights from the seed. */
	kmt_opts o = { .batch = a->batch, .seq_len = a->seq, .init_seed = a->seed };
	km_weight_source src = f ? km_file_source(f) : (km_weight_source){ 0 };
	if ((r = kmt_model_new(be, &cfg, &o, f ? &src : NULL, &m, &err)) < 0) {
		log_error("%s", err.msg);
		ret = r == -EINVAL ? KILN_EXIT_USAGE : KILN_EXIT_FAILURE;
		goto out;
	}
	kmt_cursor cur = { .seed = a->seed };
	if (a->resume) {
		kmt_ckpt_state st;
		if ((r = kmt_load(m, a->resume, &st, &err)) < 0) {
			log_error("%s", err.msg);
			ret = KILN_EXIT_USAGE;
			goto out;
		}
		cur = st.cursor;
		if (st.cursor.seed != a->seed)
			log_notice("resuming with the checkpoint's data seed %" PRIu64
				   " (not --seed %" PRIu64 ")",
				   st.cursor.seed, a->seed);
		log_info("resumed %s at step %" PRId64 " (epoch %" PRId64 ", batch %" PRId64 ")",
			 a->resume, kmt_model_step(m), cur.epoch, cur.batch);
	}
	if ((r = kmt_sampler_new(sh, a->batch, a->seq, rank, world, &cur, &s, &err)) < 0) {
		log_error("%s", err.msg);
		ret = KILN_EXIT_USAGE;
		goto out;
	}
	if (world > 1 && make_comm(be, rank, world, &comm) < 0)
		goto out;
	/* Every rank loaded the same weights; rank 0's are made everyone's all
	 * the same (as DDP does), and a rank that resumed elsewhere is caught. */
	if (comm && (r = kmt_sync_from(m, comm, 0, &err)) < 0) {
		log_error("%s", err.msg);
		goto out;
	}
	if ((r = kk_buffer_alloc(be, KK_F32, 1, &flag)) < 0) {
		log_error_errno(r, "Cannot allocate: %m");
		goto out;
	}
	if (install_signals() < 0)
		goto out;
	const size_t per = (size_t) a->batch * a->seq;
	tok = calloc(per * a->accum, sizeof(int32_t));
	tgt = calloc(per * a->accum, sizeof(int32_t));
	mb = calloc((size_t) a->accum, sizeof(kmt_batch));
	if (!tok || !tgt || !mb) {
		log_error("Out of memory");
		goto out;
	}
	kmt_optim opt = { .lr_max = (float) a->lr,
			  .lr_min = (float) a->lr_min,
			  .warmup_steps = a->warmup,
			  .total_steps = a->steps,
			  .beta1 = 0.9f,
			  .beta2 = 0.95f,
			  .eps = 1e-8f,
			  .weight_decay = (float) a->weight_decay,
			  .clip = (float) a->clip };
	if (rank == 0)
		log_info("training %zu parameters on %d rank%s, %d x %d x %d tokens per rank and "
			 "step, backend %s, steps %" PRId64 "..%" PRId64,
			 kmt_param_count(m), world, world > 1 ? "s" : "", a->accum, a->batch,
			 a->seq, kk_backend_name(be), kmt_model_step(m) + 1, a->steps);
	while (kmt_model_step(m) < a->stop_at) {
		double t0 = now();
		/* Each micro-batch is the sampler's next batch, so the cursor
		 * moves accum batches a step. */
		for (int i = 0; i < a->accum; i++) {
			kmt_sampler_next(s, tok + i * per, tgt + i * per, NULL);
			mb[i] = (kmt_batch){ .tokens = tok + i * per,
					     .targets = tgt + i * per,
					     .n_seqs = a->batch };
		}
		kmt_stats st;
		r = kmt_forward_backward_accum(m, mb, a->accum, comm, &st, &err);
		if (r >= 0)
			r = kmt_optimizer_step(m, &opt, &st, &err);
		if (r < 0) {
			log_error("step %" PRId64 ": %s", kmt_model_step(m) + 1, err.msg);
			goto out;
		}
		double dt = now() - t0;
		log_full(rank == 0 ? LOG_INFO : LOG_DEBUG,
			 "step %" PRId64 "/%" PRId64
			 " loss %.6f lr %.3e grad_norm %.4f tokens/s %.0f",
			 st.step, a->steps, st.loss, (double) st.lr, (double) st.grad_norm,
			 (double) per * a->accum * world / dt);
		int req = 0;
		if (agree(be, comm, flag, &req) < 0)
			goto out;
		bool periodic = a->save_every && st.step % a->save_every == 0;
		if (st.step < a->stop_at && (periodic || req) && rank == 0 && a->save &&
		    save(m, a->save, s, a->seed) < 0)
			goto out;
		if (req && !a->save && rank == 0)
			log_warning("step %" PRId64 ": checkpoint requested, but there is no "
				    "--save FILE, ignoring",
				    st.step);
		if (req == 2 && st.step < a->stop_at) {
			if (rank == 0)
				log_notice("stopped by a signal after step %" PRId64 "%s", st.step,
					   a->save ? "; resume with --resume" : "");
			goto out;
		}
		/* Served; a SIGTERM that came meanwhile stays (2). */
		if (req == 1 && requested == 1)
			requested = 0;
	}
	if (rank == 0 && a->save && save(m, a->save, s, a->seed) < 0)
		goto out;
	ret = KILN_EXIT_OK;
out:
	free(tok);
	free(tgt);
	free(mb);
	kmt_sampler_free(s);
	kmt_model_free(m);
	kk_buffer_free(flag);
	kk_comm_free(comm);
	kk_backend_free(be);
	return ret;
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
