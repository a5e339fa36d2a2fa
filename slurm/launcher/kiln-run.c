/* kiln-run.c — the elastic launcher's command line and main().
 *
 *   srun --ntasks-per-node=1 kiln-run [--nnodes MIN:MAX] [--nproc-per-node N|gpu]
 *        [--max-restarts K] [--port P] ... -- PROGRAM ARGS...
 *
 * Defaults come from the cluster file's launcher section (when a cluster file
 * exists) and Slurm's environment; options override both.  Outside Slurm
 * (no SLURM_JOB_ID) it runs a single-node job on this machine, like
 * `torchrun --standalone`. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "kiln/config.h"
#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "launcher.h"

#define KR_HEALTHD_DEFAULT "/usr/local/bin/kiln-healthd"

/* kiln-healthd installed next to this kiln-run (same bin directory), else
 * KR_HEALTHD_DEFAULT. */
static const char *default_healthd(char *buf, size_t len)
{
	ssize_t l = readlink("/proc/self/exe", buf, len - 1);
	if (l > 0) {
		buf[l] = 0;
		char *slash = strrchr(buf, '/');
		if (slash && (size_t) (slash - buf) + sizeof("/kiln-healthd") <= len) {
			strcpy(slash, "/kiln-healthd");
			if (access(buf, X_OK) == 0)
				return buf;
		}
	}
	return KR_HEALTHD_DEFAULT;
}

enum {
	OPT_NPROC = KILN_OPT_FIRST,
	OPT_MAX_RESTARTS,
	OPT_PORT,
	OPT_RUN_ID,
	OPT_HEARTBEAT,
	OPT_DEAD_AFTER,
	OPT_LAST_CALL,
	OPT_JOIN_TIMEOUT,
	OPT_GRACE,
	OPT_EXCLUDE,
	OPT_BACKOFF,
	OPT_PREFIX,
	OPT_NO_PREFIX,
	OPT_HEALTH,
	OPT_NO_HEALTH,
	OPT_HEALTHD,
	OPT_REQUEUE,
	OPT_STANDALONE,
	OPT_SECRET,
};

/* The command line, before the cluster file's defaults are merged in. */
static const char *arg_config;
static unsigned arg_min_nodes, arg_max_nodes; /* 0: not given */
static int arg_nproc = -1;		      /* -1: not given, 0: gpu */
static int arg_max_restarts = -1;
static int arg_port = -1;
static const char *arg_run_id;
/* The duration options: each, when given, overrides one uint64_t of
 * kr_opts (the cluster file's value or the default). */
static const struct {
	int key;
	const char *flag;
	size_t offset;
} durations[] = {
	{ OPT_HEARTBEAT, "--heartbeat", offsetof(kr_opts, heartbeat_usec) },
	{ OPT_DEAD_AFTER, "--dead-after", offsetof(kr_opts, rdzv.dead_after_usec) },
	{ OPT_LAST_CALL, "--last-call", offsetof(kr_opts, rdzv.last_call_usec) },
	{ OPT_JOIN_TIMEOUT, "--join-timeout", offsetof(kr_opts, rdzv.join_timeout_usec) },
	{ OPT_GRACE, "--grace", offsetof(kr_opts, grace_usec) },
	{ OPT_BACKOFF, "--backoff", offsetof(kr_opts, rdzv.backoff_base_usec) },
};
static uint64_t arg_duration[ARRAY_SIZE(durations)];
static bool arg_duration_set[ARRAY_SIZE(durations)];
static int arg_exclude_after = -1;
static int arg_prefix_output = -1, arg_health_check = -1; /* -1: not given */
static const char *arg_healthd;
static bool arg_requeue, arg_standalone, arg_make_secret;
static char **arg_argv; /* the worker command line */

static const kiln_option options[] = {
	{ "nnodes", 'n', "MIN[:MAX]",
	  "nodes the job needs / can use (default: cluster file,\nelse all nodes of the "
	  "allocation)",
	  NULL },
	{ "nproc-per-node", OPT_NPROC, "N|gpu", "workers per node (gpu = one per GPU)", "gpu" },
	{ "nproc_per_node", OPT_NPROC, "N|gpu", NULL, NULL }, /* torchrun's spelling */
	{ "max-restarts", OPT_MAX_RESTARTS, "K", "failed rounds allowed (default 3)", NULL },
	{ "max_restarts", OPT_MAX_RESTARTS, "K", NULL, NULL },
	{ "port", OPT_PORT, "P", "store port (default 29500; 0 = any, standalone)", NULL },
	{ "run-id", OPT_RUN_ID, "ID", "TORCHELASTIC_RUN_ID (default: Slurm job id)", NULL,
	  .str = &arg_run_id },
	{ "heartbeat", OPT_HEARTBEAT, "DURATION", "agent heartbeat interval (default 1s)", NULL },
	{ "dead-after", OPT_DEAD_AFTER, "DURATION", "silent agent is dead after (default 5s)",
	  NULL },
	{ "last-call", OPT_LAST_CALL, "DURATION",
	  "wait for more nodes after MIN joined (default 10s)", NULL },
	{ "join-timeout", OPT_JOIN_TIMEOUT, "DURATION", "give up below MIN after (default 300s)",
	  NULL },
	{ "grace", OPT_GRACE, "DURATION", "SIGTERM to SIGKILL for workers (default 120s)", NULL },
	{ "exclude-after", OPT_EXCLUDE, "K", "exclude a node after K failures (default 2)", NULL },
	{ "backoff", OPT_BACKOFF, "DURATION", "first restart delay, doubling (default 1s)", NULL },
	{ "prefix-output", OPT_PREFIX, NULL, "\"host:rank: \" line prefixes (default)", NULL },
	{ "no-prefix-output", OPT_NO_PREFIX, NULL, "no line prefixes", NULL },
	{ "health-check", OPT_HEALTH, NULL, "run kiln-healthd --check first", NULL },
	{ "no-health-check", OPT_NO_HEALTH, NULL, "do not (default, unless the cluster file says)",
	  NULL },
	{ "healthd", OPT_HEALTHD, "PATH",
	  "kiln-healthd to run (default: next to kiln-run,\nelse " KR_HEALTHD_DEFAULT ")", "file",
	  .str = &arg_healthd },
	{ "requeue", OPT_REQUEUE, NULL, "requeue the job through Slurm on SIGUSR1", NULL,
	  .flag = &arg_requeue },
	{ "standalone", OPT_STANDALONE, NULL, "single node on this machine, even inside Slurm",
	  NULL, .flag = &arg_standalone },
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "make-secret", OPT_SECRET, NULL,
	  "print a fresh job secret for " KR_ENV_SECRET " and exit", NULL,
	  .flag = &arg_make_secret },
	KILN_OPTIONS_COMMON,
	{}
};

static int parse_option(int key, const char *arg);

static const kiln_prog prog = {
	.name = "kiln-run",
	.summary = "elastic, Slurm-integrated launcher for distributed training",
	.usage = "kiln-run [OPTIONS] -- PROGRAM [ARGS...]\n"
		 "srun --ntasks-per-node=1 kiln-run [OPTIONS] -- PROGRAM [ARGS...]",
	.options = options,
	.option = parse_option,
	.epilog =
		"Run one per node; workers get torchrun's environment (RANK, WORLD_SIZE,\n"
		"MASTER_ADDR, MASTER_PORT ...).\n"
		"\n"
		"Job secret: KILN_RUN_SECRET (export $(kiln-run --make-secret) before srun); in a\n"
		"batch script without srun, or on one node, kiln-run makes it; else MUNGE hands\n"
		"it out (munged on KILN_RUN_MUNGE_SOCKET, default libmunge's socket).\n"
		"\n"
		"Exit status: 0 when every worker of the final round exited 0; else the first\n"
		"failing worker's code; 1 launcher failure; 2 usage or config error (or no\n"
		"job secret and no MUNGE on a multi-node job);\n"
		"75 rendezvous timeout (fewer than MIN nodes); 76 rendezvous closed before this\n"
		"node got a round.  See kiln-run(1).\n",
	.stop_at_positional = true, /* the worker command line follows */
};

static int parse_nnodes(const char *s, unsigned *min, unsigned *max)
{
	const char *colon = strchr(s, ':');
	int a, b;
	if (!colon) {
		if (kiln_parse_int(s, 1, RDZV_MAX_NODES, &a) < 0)
			return -EINVAL;
		*min = *max = (unsigned) a;
		return 0;
	}
	char buf[32];
	size_t l = (size_t) (colon - s);
	if (l >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, l);
	buf[l] = 0;
	if (kiln_parse_int(buf, 1, RDZV_MAX_NODES, &a) < 0 ||
	    kiln_parse_int(colon + 1, 1, RDZV_MAX_NODES, &b) < 0 || a > b)
		return -EINVAL;
	*min = (unsigned) a;
	*max = (unsigned) b;
	return 0;
}

static int invalid(const char *opt, const char *val, const char *what)
{
	return kiln_usage_error(&prog, "Invalid %s '%s': %s.", opt, val, what);
}

static int parse_option(int key, const char *arg)
{
	int v;
	for (size_t i = 0; i < ARRAY_SIZE(durations); i++)
		if (key == durations[i].key) {
			if (kiln_parse_duration(arg, KILN_USEC_PER_SEC, &arg_duration[i]) < 0)
				return invalid(durations[i].flag, arg,
					       "expected a duration like 5s, 1500ms, 2m");
			arg_duration_set[i] = true;
			return 0;
		}
	switch (key) {
	case 'n':
		if (parse_nnodes(arg, &arg_min_nodes, &arg_max_nodes) < 0)
			return invalid("--nnodes", arg,
				       "expected N or MIN:MAX with 1 <= MIN <= MAX");
		return 0;
	case OPT_NPROC:
		if (streq(arg, "gpu"))
			arg_nproc = 0;
		else if (kiln_parse_int(arg, 1, RDZV_MAX_NPROC, &v) == 0)
			arg_nproc = v;
		else
			return invalid("--nproc-per-node", arg, "expected 1..1024 or 'gpu'");
		return 0;
	case OPT_MAX_RESTARTS:
		if (kiln_parse_int(arg, 0, 1000000, &arg_max_restarts) < 0)
			return invalid("--max-restarts", arg, "expected a number >= 0");
		return 0;
	case OPT_PORT:
		if (kiln_parse_int(arg, 0, 65535, &arg_port) < 0)
			return invalid("--port", arg, "expected 0..65535");
		return 0;
	case OPT_EXCLUDE:
		if (kiln_parse_int(arg, 0, 1000000, &arg_exclude_after) < 0)
			return invalid("--exclude-after", arg,
				       "expected a number >= 0 (0 = never)");
		return 0;
	case OPT_PREFIX:
	case OPT_NO_PREFIX:
		arg_prefix_output = key == OPT_PREFIX;
		return 0;
	case OPT_HEALTH:
	case OPT_NO_HEALTH:
		arg_health_check = key == OPT_HEALTH;
		return 0;
	default:
		return 1;
	}
}

static int parse_argv(int argc, char **argv)
{
	int r = kiln_parse_options(&prog, argc, argv);
	if (r <= 0)
		return r;
	if (optind >= argc && !arg_make_secret)
		return kiln_usage_error(&prog, "No program to run: kiln-run [OPTIONS] -- PROGRAM "
					       "[ARGS...].");
	arg_argv = argv + optind;
	return 1;
}

/* The options: defaults, then the cluster file's launcher section (when
 * there is a cluster file), then the command line. */
static int make_opts(kr_opts *o, bool *nnodes_set, kiln_cfg **ret_cfg)
{
	*o = (kr_opts){ .prefix_output = true, .node_gpus = -1 };
	rdzv_params_default(&o->rdzv);
	*nnodes_set = false;

	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = kiln_cfg_open(arg_config, KILN_CFG_OPEN_OPTIONAL, &cfg);
	if (r < 0)
		return r;
	{
		/* Without a cluster file the port, heartbeat and grace are still
		 * the schema's defaults: the schema is the one place they are
		 * written. */
		_cleanup_(kiln_cfg_freep) kiln_cfg *d = NULL;
		if (kiln_cfg_defaults(&d) < 0)
			return log_error_errno(-ENOMEM, "Out of memory");
		const kiln_cfg_launcher *l = cfg ? &cfg->launcher : &d->launcher;
		o->port = (uint16_t) l->port;
		o->heartbeat_usec = l->heartbeat_usec;
		o->grace_usec = l->grace_usec;
	}
	if (cfg) {
		const kiln_cfg_launcher *l = &cfg->launcher;
		o->port = (uint16_t) l->port;
		o->rdzv.min_nodes = (unsigned) l->nnodes_min;
		o->rdzv.max_nodes = (unsigned) l->nnodes_max;
		*nnodes_set = true;
		o->nproc = (unsigned) l->nproc_per_node;
		o->rdzv.max_restarts = (unsigned) l->max_restarts;
		o->heartbeat_usec = l->heartbeat_usec;
		o->rdzv.dead_after_usec = l->dead_after_usec;
		o->rdzv.last_call_usec = l->last_call_usec;
		o->rdzv.join_timeout_usec = l->join_timeout_usec;
		o->grace_usec = l->grace_usec;
		o->rdzv.exclude_after = (unsigned) l->exclude_after_failures;
		o->prefix_output = l->prefix_output;
		o->health_check = l->health_check;
		char me[256];
		const kiln_cfg_node *nd = NULL;
		if (kiln_node_name(NULL, me, sizeof(me), NULL) == 0)
			nd = kiln_cfg_find_node(cfg, me);
		if (nd && nd->group)
			o->node_gpus = nd->group->gpu_count;
	} else
		o->nproc = 1;

	if (arg_min_nodes) {
		o->rdzv.min_nodes = arg_min_nodes;
		o->rdzv.max_nodes = arg_max_nodes;
		*nnodes_set = true;
	}
	if (arg_nproc >= 0)
		o->nproc = (unsigned) arg_nproc;
	if (arg_max_restarts >= 0)
		o->rdzv.max_restarts = (unsigned) arg_max_restarts;
	if (arg_port >= 0)
		o->port = (uint16_t) arg_port;
	o->run_id = arg_run_id;
	for (size_t i = 0; i < ARRAY_SIZE(durations); i++)
		if (arg_duration_set[i])
			*(uint64_t *) ((char *) o + durations[i].offset) = arg_duration[i];
	if (arg_exclude_after >= 0)
		o->rdzv.exclude_after = (unsigned) arg_exclude_after;
	if (arg_prefix_output >= 0)
		o->prefix_output = arg_prefix_output;
	if (arg_health_check >= 0)
		o->health_check = arg_health_check;
	o->healthd = arg_healthd;
	o->requeue = arg_requeue;
	o->standalone = arg_standalone;
	o->argv = arg_argv;
	*ret_cfg = TAKE_PTR(cfg);
	return 0;
}

static int print_secret(void)
{
	char secret[KR_SECRET_LEN + 1];
	int r = kr_make_secret(secret, sizeof(secret));
	if (r < 0)
		return log_error_errno(r, "getrandom failed: %m");
	printf("%s\n", secret);
	return KILN_EXIT_OK;
}

/* In a batch script (an allocation, but not inside a job step), kiln-run
 * launches itself on every node: it generates the job secret, puts it in
 * the environment srun propagates, and execs
 *   srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1 kiln-run ARGS...
 * so that one node's loss ends neither the step nor the job. */
static bool in_batch_script(void)
{
	return getenv("SLURM_JOB_ID") && !getenv("SLURM_STEP_ID") && !getenv(KR_ENV_AGENT);
}

static int launch_step(int argc, char **argv)
{
	char secret[KR_SECRET_LEN + 1];
	int r;
	if (!getenv(KR_ENV_SECRET)) {
		if ((r = kr_make_secret(secret, sizeof(secret))) < 0)
			return log_error_errno(r, "getrandom failed: %m");
		setenv(KR_ENV_SECRET, secret, 1);
	}
	setenv(KR_ENV_AGENT, "1", 1);
	char self[4096];
	ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (l <= 0)
		return log_error_errno(-errno, "Cannot find this program's path: %m");
	self[l] = 0;
	_cleanup_free_ char **v = calloc((size_t) argc + 8, sizeof(char *));
	if (!v)
		return log_error_errno(-ENOMEM, "Out of memory");
	size_t k = 0;
	v[k++] = (char *) "srun";
	v[k++] = (char *) "--no-kill";
	v[k++] = (char *) "--kill-on-bad-exit=0";
	v[k++] = (char *) "--ntasks-per-node=1";
	v[k++] = self;
	for (int i = 1; i < argc; i++)
		v[k++] = argv[i];
	log_info("Starting one agent per node: srun --no-kill --ntasks-per-node=1 %s ...", self);
	execvp("srun", v);
	return log_error_errno(
		-errno,
		"Cannot run srun: %m (run kiln-run through srun yourself, or pass --standalone)");
}

static int run(int argc, char **argv)
{
	kr_opts o;
	bool nnodes_set;
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = make_opts(&o, &nnodes_set, &cfg);
	if (r < 0)
		return kiln_exit_for_config(r);
	if (arg_make_secret)
		return print_secret();
	char healthd[4096];
	if (!o.healthd)
		o.healthd = default_healthd(healthd, sizeof(healthd));
	if (o.heartbeat_usec == 0 || o.heartbeat_usec >= o.rdzv.dead_after_usec) {
		log_error("--heartbeat must be shorter than --dead-after");
		return KILN_EXIT_USAGE;
	}

	_cleanup_(kr_job_done) kr_job job = { 0 };
	kiln_error e;
	kiln_error_reset(&e, NULL);
	const char *sim = getenv(KR_ENV_SIM_NODES);
	if (!sim && !o.standalone && in_batch_script())
		return launch_step(argc, argv);
	if (sim) {
		r = kr_job_sim(sim, getenv(KR_ENV_SIM_NODE_ID), &job, &e);
		if (r < 0)
			return log_error("%s", e.msg[0] ? e.msg : "out of memory"), KILN_EXIT_USAGE;
	} else if (!o.standalone && getenv("SLURM_JOB_ID")) {
		r = kr_job_from_slurm(&job, &e);
		if (r < 0)
			return log_error_errno(r, "Cannot read the Slurm allocation: %s",
					       e.msg[0] ? e.msg : "out of memory");
	} else {
		o.standalone = true;
		r = kr_job_standalone(&job);
		if (r < 0)
			return log_error_errno(r, "Out of memory");
		if (arg_port < 0)
			o.port = 0;
	}
	if (o.standalone) {
		o.rdzv.min_nodes = o.rdzv.max_nodes = 1;
		o.rdzv.last_call_usec = 0;
	} else if (!nnodes_set) {
		o.rdzv.min_nodes = o.rdzv.max_nodes = (unsigned) job.n;
	}
	if (o.rdzv.min_nodes > job.n) {
		log_error("--nnodes %u:%u needs more nodes than the allocation has (%zu)",
			  o.rdzv.min_nodes, o.rdzv.max_nodes, job.n);
		return KILN_EXIT_USAGE;
	}
	if (o.port == 0 && !o.standalone) {
		log_error("--port 0 only works for a single node: other agents must know the port");
		return KILN_EXIT_USAGE;
	}
	char run_id[128];
	if (!o.run_id) {
		snprintf(run_id, sizeof(run_id), "%s", job.job_id ? job.job_id : "standalone");
		o.run_id = run_id;
	}
	return kr_agent_run(&o, &job);
}

KILN_DEFINE_MAIN(prog, parse_argv, run)
