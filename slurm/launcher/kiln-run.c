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
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "kiln/config.h"
#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "launcher.h"

#define KR_DEFAULT_PORT	   29500
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

static void help(void)
{
	printf("Usage: kiln-run [OPTIONS] -- PROGRAM [ARGS...]\n"
	       "\n"
	       "Elastic, Slurm-integrated launcher for distributed training (torchrun-compatible\n"
	       "worker environment).  Run one per node: srun --ntasks-per-node=1 kiln-run ...\n"
	       "\n"
	       "  -n, --nnodes MIN[:MAX]        nodes the job needs / can use (default: cluster\n"
	       "                                file, else all nodes of the allocation)\n"
	       "  -p, --nproc-per-node N|gpu    workers per node (gpu = one per GPU)\n"
	       "  -r, --max-restarts K          failed rounds allowed (default 3)\n"
	       "      --port P                  store port (default 29500; 0 = any, standalone)\n"
	       "      --run-id ID               TORCHELASTIC_RUN_ID (default: Slurm job id)\n"
	       "      --heartbeat DURATION      agent heartbeat interval (default 1s)\n"
	       "      --dead-after DURATION     silent agent is dead after (default 5s)\n"
	       "      --last-call DURATION      wait for more nodes after MIN joined (default "
	       "10s)\n"
	       "      --join-timeout DURATION   give up below MIN after (default 300s)\n"
	       "      --grace DURATION          SIGTERM to SIGKILL for workers (default 120s)\n"
	       "      --exclude-after K         exclude a node after K failures (default 2)\n"
	       "      --backoff DURATION        first restart delay, doubling (default 1s)\n"
	       "      --prefix-output / --no-prefix-output   \"host:rank: \" line prefixes\n"
	       "      --health-check / --no-health-check     run kiln-healthd --check first\n"
	       "      --healthd PATH            kiln-healthd to run (default: next to kiln-run, "
	       "else " KR_HEALTHD_DEFAULT ")\n"
	       "      --requeue                 requeue the job through Slurm on SIGUSR1\n"
	       "      --standalone              single node on this machine, even inside Slurm\n"
	       "  -c, --config FILE             cluster file (default $KILN_CONFIG or "
	       "/etc/kiln/cluster.cfg)\n"
	       "      --make-secret             print a fresh job secret for " KR_ENV_SECRET
	       " and exit\n"
	       "  -v, --verbose / -q, --quiet   more / less logging\n"
	       "  -h, --help, --version\n"
	       "\n"
	       "Exit status: 0 when every worker of the final round exited 0; else the first\n"
	       "failing worker's code; 1 launcher failure; 2 usage or config error;\n"
	       "75 rendezvous timeout (fewer than MIN nodes); 76 rendezvous closed before this\n"
	       "node got a round.  See kiln-run(1).\n");
}

enum {
	OPT_PORT = 256,
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
	OPT_VERSION,
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

static int usage_error(const char *opt, const char *val, const char *what)
{
	log_error("Invalid %s '%s': %s (see kiln-run --help)", opt, val, what);
	return -EINVAL;
}

static int duration_arg(const char *opt, const char *val, uint64_t *ret)
{
	if (kiln_parse_duration(val, KILN_USEC_PER_SEC, ret) < 0)
		return usage_error(opt, val, "expected a duration like 5s, 1500ms, 2m");
	return 0;
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
	if (!getenv(KR_ENV_SECRET)) {
		unsigned char raw[KR_SECRET_LEN / 2];
		if (getrandom(raw, sizeof(raw), 0) != (ssize_t) sizeof(raw))
			return log_error_errno(-errno, "getrandom failed: %m"), KR_EXIT_FAILURE;
		for (size_t i = 0; i < sizeof(raw); i++)
			snprintf(secret + 2 * i, 3, "%02x", raw[i]);
		setenv(KR_ENV_SECRET, secret, 1);
	}
	setenv(KR_ENV_AGENT, "1", 1);
	char self[4096];
	ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (l <= 0)
		return log_error_errno(-errno, "Cannot find this program's path: %m"),
		       KR_EXIT_FAILURE;
	self[l] = 0;
	char **v = calloc((size_t) argc + 8, sizeof(char *));
	if (!v)
		return log_error_errno(-ENOMEM, "Out of memory"), KR_EXIT_FAILURE;
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
	log_error_errno(
		-errno,
		"Cannot run srun: %m (run kiln-run through srun yourself, or pass --standalone)");
	free(v);
	return KR_EXIT_FAILURE;
}

static int run(int argc, char **argv)
{
	kr_opts o = { .port = KR_DEFAULT_PORT,
		      .heartbeat_usec = KILN_USEC_PER_SEC,
		      .grace_usec = 120 * KILN_USEC_PER_SEC,
		      .prefix_output = true,
		      .healthd = NULL,
		      .node_gpus = -1 };
	rdzv_params_default(&o.rdzv);
	bool nnodes_set = false, nproc_set = false;
	const char *config = NULL;
	int r;

	/* First pass: find -c so that the cluster file provides defaults
	 * that the options then override. */
	for (int i = 1; i < argc && !streq(argv[i], "--"); i++) {
		if ((streq(argv[i], "-c") || streq(argv[i], "--config")) && i + 1 < argc)
			config = argv[i + 1];
		else if (startswith(argv[i], "--config="))
			config = argv[i] + strlen("--config=");
	}
	const char *cfg_path = config ? config : kiln_cfg_default_path();
	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	if (config || access(cfg_path, R_OK) == 0) {
		kiln_cfg_errors errs;
		kiln_cfg_errors_init(&errs);
		r = kiln_cfg_load(cfg_path, &cfg, &errs);
		if (r < 0) {
			if (r == -EINVAL)
				kiln_cfg_errors_print(&errs, stderr);
			else
				log_error_errno(r, "Failed to read cluster file '%s': %m",
						cfg_path);
			kiln_cfg_errors_free(&errs);
			return KR_EXIT_USAGE;
		}
		kiln_cfg_errors_free(&errs);
		const kiln_cfg_launcher *l = &cfg->launcher;
		o.port = (uint16_t) l->port;
		o.rdzv.min_nodes = (unsigned) l->nnodes_min;
		o.rdzv.max_nodes = (unsigned) l->nnodes_max;
		nnodes_set = true;
		o.nproc = (unsigned) l->nproc_per_node;
		nproc_set = true;
		o.rdzv.max_restarts = (unsigned) l->max_restarts;
		o.heartbeat_usec = l->heartbeat_usec;
		o.rdzv.dead_after_usec = l->dead_after_usec;
		o.rdzv.last_call_usec = l->last_call_usec;
		o.rdzv.join_timeout_usec = l->join_timeout_usec;
		o.grace_usec = l->grace_usec;
		o.rdzv.exclude_after = (unsigned) l->exclude_after_failures;
		o.prefix_output = l->prefix_output;
		o.health_check = l->health_check;
		const char *me = getenv("SLURMD_NODENAME");
		char host[256] = "";
		if (!me && gethostname(host, sizeof(host) - 1) == 0)
			me = host;
		const kiln_cfg_node *nd = me ? kiln_cfg_find_node(cfg, me) : NULL;
		if (nd && nd->group)
			o.node_gpus = nd->group->gpu_count;
	}

	static const struct option opts[] = {
		{ "nnodes", required_argument, NULL, 'n' },
		{ "nproc-per-node", required_argument, NULL, 'p' },
		{ "nproc_per_node", required_argument, NULL, 'p' },
		{ "max-restarts", required_argument, NULL, 'r' },
		{ "max_restarts", required_argument, NULL, 'r' },
		{ "port", required_argument, NULL, OPT_PORT },
		{ "run-id", required_argument, NULL, OPT_RUN_ID },
		{ "heartbeat", required_argument, NULL, OPT_HEARTBEAT },
		{ "dead-after", required_argument, NULL, OPT_DEAD_AFTER },
		{ "last-call", required_argument, NULL, OPT_LAST_CALL },
		{ "join-timeout", required_argument, NULL, OPT_JOIN_TIMEOUT },
		{ "grace", required_argument, NULL, OPT_GRACE },
		{ "exclude-after", required_argument, NULL, OPT_EXCLUDE },
		{ "backoff", required_argument, NULL, OPT_BACKOFF },
		{ "prefix-output", no_argument, NULL, OPT_PREFIX },
		{ "no-prefix-output", no_argument, NULL, OPT_NO_PREFIX },
		{ "health-check", no_argument, NULL, OPT_HEALTH },
		{ "no-health-check", no_argument, NULL, OPT_NO_HEALTH },
		{ "healthd", required_argument, NULL, OPT_HEALTHD },
		{ "requeue", no_argument, NULL, OPT_REQUEUE },
		{ "standalone", no_argument, NULL, OPT_STANDALONE },
		{ "make-secret", no_argument, NULL, OPT_SECRET },
		{ "config", required_argument, NULL, 'c' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, OPT_VERSION },
		{}
	};
	int c, v;
	uint64_t u;
	bool port_set = false;
	while ((c = getopt_long(argc, argv, "+n:p:r:c:vqh", opts, NULL)) >= 0) {
		switch (c) {
		case 'n':
			if (parse_nnodes(optarg, &o.rdzv.min_nodes, &o.rdzv.max_nodes) < 0)
				return usage_error("--nnodes", optarg,
						   "expected N or MIN:MAX with 1 <= MIN <= MAX"),
				       KR_EXIT_USAGE;
			nnodes_set = true;
			break;
		case 'p':
			if (streq(optarg, "gpu"))
				o.nproc = 0;
			else if (kiln_parse_int(optarg, 1, RDZV_MAX_NPROC, &v) == 0)
				o.nproc = (unsigned) v;
			else
				return usage_error("--nproc-per-node", optarg,
						   "expected 1..1024 or 'gpu'"),
				       KR_EXIT_USAGE;
			nproc_set = true;
			break;
		case 'r':
			if (kiln_parse_int(optarg, 0, 1000000, &v) < 0)
				return usage_error("--max-restarts", optarg,
						   "expected a number >= 0"),
				       KR_EXIT_USAGE;
			o.rdzv.max_restarts = (unsigned) v;
			break;
		case OPT_PORT:
			if (kiln_parse_int(optarg, 0, 65535, &v) < 0)
				return usage_error("--port", optarg, "expected 0..65535"),
				       KR_EXIT_USAGE;
			o.port = (uint16_t) v;
			port_set = true;
			break;
		case OPT_RUN_ID:
			o.run_id = optarg;
			break;
		case OPT_HEARTBEAT:
			if (duration_arg("--heartbeat", optarg, &o.heartbeat_usec) < 0)
				return KR_EXIT_USAGE;
			break;
		case OPT_DEAD_AFTER:
			if (duration_arg("--dead-after", optarg, &o.rdzv.dead_after_usec) < 0)
				return KR_EXIT_USAGE;
			break;
		case OPT_LAST_CALL:
			if (duration_arg("--last-call", optarg, &o.rdzv.last_call_usec) < 0)
				return KR_EXIT_USAGE;
			break;
		case OPT_JOIN_TIMEOUT:
			if (duration_arg("--join-timeout", optarg, &o.rdzv.join_timeout_usec) < 0)
				return KR_EXIT_USAGE;
			break;
		case OPT_GRACE:
			if (duration_arg("--grace", optarg, &o.grace_usec) < 0)
				return KR_EXIT_USAGE;
			break;
		case OPT_BACKOFF:
			if (duration_arg("--backoff", optarg, &o.rdzv.backoff_base_usec) < 0)
				return KR_EXIT_USAGE;
			break;
		case OPT_EXCLUDE:
			if (kiln_parse_int(optarg, 0, 1000000, &v) < 0)
				return usage_error("--exclude-after", optarg,
						   "expected a number >= 0 (0 = never)"),
				       KR_EXIT_USAGE;
			o.rdzv.exclude_after = (unsigned) v;
			break;
		case OPT_PREFIX:
			o.prefix_output = true;
			break;
		case OPT_NO_PREFIX:
			o.prefix_output = false;
			break;
		case OPT_HEALTH:
			o.health_check = true;
			break;
		case OPT_NO_HEALTH:
			o.health_check = false;
			break;
		case OPT_HEALTHD:
			o.healthd = optarg;
			break;
		case OPT_REQUEUE:
			o.requeue = true;
			break;
		case OPT_STANDALONE:
			o.standalone = true;
			break;
		case OPT_SECRET: {
			unsigned char raw[KR_SECRET_LEN / 2];
			if (getrandom(raw, sizeof(raw), 0) != (ssize_t) sizeof(raw))
				return log_error_errno(-errno, "getrandom failed: %m"),
				       KR_EXIT_FAILURE;
			for (size_t i = 0; i < sizeof(raw); i++)
				printf("%02x", raw[i]);
			printf("\n");
			return 0;
		}
		case 'c':
			break; /* handled above */
		case 'v':
			log_adjust_level(+1);
			break;
		case 'q':
			log_adjust_level(-1);
			break;
		case 'h':
			help();
			return 0;
		case OPT_VERSION:
			printf("kiln-run " KILN_VERSION "\n");
			return 0;
		default:
			return KR_EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		log_error(
			"No program to run: kiln-run [OPTIONS] -- PROGRAM [ARGS...] (see --help)");
		return KR_EXIT_USAGE;
	}
	o.argv = argv + optind;
	char healthd[4096];
	if (!o.healthd)
		o.healthd = default_healthd(healthd, sizeof(healthd));
	(void) u;
	if (o.heartbeat_usec == 0 || o.heartbeat_usec >= o.rdzv.dead_after_usec) {
		log_error("--heartbeat must be shorter than --dead-after");
		return KR_EXIT_USAGE;
	}

	_cleanup_(kr_job_done) kr_job job = { 0 };
	char err[512] = "";
	const char *sim = getenv(KR_ENV_SIM_NODES);
	if (!sim && !o.standalone && in_batch_script())
		return launch_step(argc, argv);
	if (sim) {
		r = kr_job_sim(sim, getenv(KR_ENV_SIM_NODE_ID), &job, err, sizeof(err));
		if (r < 0)
			return log_error("%s", err), KR_EXIT_USAGE;
	} else if (!o.standalone && getenv("SLURM_JOB_ID")) {
		r = kr_job_from_slurm(&job, err, sizeof(err));
		if (r < 0) {
			log_error("Cannot read the Slurm allocation: %s", err);
			return KR_EXIT_FAILURE;
		}
	} else {
		o.standalone = true;
		r = kr_job_standalone(&job);
		if (r < 0)
			return log_error_errno(r, "Out of memory"), KR_EXIT_FAILURE;
		if (!port_set)
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
		return KR_EXIT_USAGE;
	}
	if (!nproc_set)
		o.nproc = 1;
	if (o.port == 0 && !o.standalone) {
		log_error("--port 0 only works for a single node: other agents must know the port");
		return KR_EXIT_USAGE;
	}
	char run_id[128];
	if (!o.run_id) {
		snprintf(run_id, sizeof(run_id), "%s", job.job_id ? job.job_id : "standalone");
		o.run_id = run_id;
	}
	return kr_agent_run(&o, &job);
}

int main(int argc, char **argv)
{
	log_set_program("kiln-run");
	int r = run(argc, argv);
	return r < 0 ? KR_EXIT_FAILURE : r;
}
