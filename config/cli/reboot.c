/* reboot.c — `kiln reboot`: a rolling reboot of nodes, in waves.
 *
 *   kiln [-c FILE] reboot [--wave N] [--reason TEXT] [--timeout DURATION]
 *                         [--dry-run] NODES
 *
 * NODES (a hostlist of the cluster file's nodes) are cut into waves of N
 * (--wave, default 1).  Each wave is handed to Slurm with
 *   scontrol reboot ASAP nextstate=RESUME reason="kiln reboot: TEXT" NODES
 * which drains the nodes at once (no new jobs), lets running jobs finish,
 * then has slurmd run the RebootProgram kiln renders (slurm.reboot_program)
 * and puts each node back in service when its slurmd registers again after
 * the boot.  kiln waits for the whole wave to be back (not rebooting, not
 * down, not drained, responding) before it starts the next: at most N of
 * the nodes are out of service at any time.  Reboots already pending in the
 * cluster (someone else's `scontrol reboot`, an interrupted `kiln reboot`)
 * count towards N: a wave that would take more than N nodes down is refused.
 *
 * Slurm is reached through libkiln-slurm (kiln/slurm.h): the request with
 * kiln_slurm_reboot_asap() (scontrol: slurm_reboot_nodes() is not in 22.05's
 * public header), the state with kiln_slurm_nodes_load(), as kiln status.
 *
 * Exit status: 0 every wave came back; 1 a wave did not come back within
 * --timeout (later waves are not started), scontrol failed, or the reboot
 * was refused; 2 usage or cluster-file error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln-verbs.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/prog.h"
#include "kiln/slurm.h"
#include "kiln/strbuf.h"

/* A wave waits for its running jobs (ASAP) and for the boot itself. */
#define REBOOT_TIMEOUT_DEFAULT_USEC (30 * KILN_USEC_PER_MINUTE)
/* How often slurmctld is asked for the wave's state. */
#define REBOOT_POLL_USEC (500 * KILN_USEC_PER_MSEC)
/* Slurm keeps reasons short; ours is "kiln reboot: " + TEXT. */
#define REBOOT_REASON_MAX 200

enum { ARG_WAVE = KILN_OPT_FIRST, ARG_REASON, ARG_TIMEOUT, ARG_DRY_RUN };

static const char *arg_config, *arg_reason;
static int arg_wave = 1;
static bool arg_dry_run;
static uint64_t arg_timeout = REBOOT_TIMEOUT_DEFAULT_USEC;

static const kiln_option reboot_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "wave", ARG_WAVE, "N", "nodes rebooted at once (default 1)", NULL },
	{ "reason", ARG_REASON, "TEXT",
	  "why, shown as the nodes' Slurm reason (\"kiln reboot: TEXT\")", NULL,
	  .str = &arg_reason },
	{ "timeout", ARG_TIMEOUT, "DURATION",
	  "how long one wave may take: its jobs to finish and the boot (default 30m)", NULL },
	{ "dry-run", ARG_DRY_RUN, NULL, "print the waves and the commands, change nothing", NULL,
	  .flag = &arg_dry_run },
	KILN_OPTIONS_COMMON,
	{},
};

static int parse_option(int key, const char *arg);

const kiln_prog kiln_reboot_prog = {
	.name = "kiln reboot",
	.summary = "reboot nodes in waves through Slurm, waiting for each wave to come back",
	.usage = "kiln [-c FILE] reboot [--wave N] [--reason TEXT] [--timeout DURATION] "
		 "[--dry-run] NODES",
	.options = reboot_options,
	.option = parse_option,
	.args_complete = "node",
	.epilog = "NODES: a hostlist of nodes of the cluster file (node[01-16]).\n"
		  "Each wave: scontrol reboot ASAP nextstate=RESUME reason=\"kiln reboot: TEXT\" "
		  "WAVE\n"
		  "(drained at once, rebooted by slurmd's RebootProgram = slurm.reboot_program "
		  "when\n"
		  "its jobs have ended, resumed when it registers again); the next wave starts\n"
		  "when every node of this one is back in service. Reboots already pending in "
		  "the\n"
		  "cluster count towards --wave: more than N nodes down at once is refused.\n"
		  "Exit status: 0 all waves back, 1 a wave not back within --timeout (later waves\n"
		  "not started), scontrol failed or the reboot refused, 2 usage or cluster-file\n"
		  "error.\n",
};

static bool in_list(char **v, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (streq(v[i], name))
			return true;
	return false;
}

/* A node of the wave is back: no reboot pending and in service. */
static bool node_back(const kiln_slurm_node *ni)
{
	return ni && !kiln_slurm_state_rebooting(ni->state) && kiln_slurm_state_ok(ni->state);
}

static void print_plan(const kiln_cfg *cfg, char **names, size_t n, size_t wave, const char *reason,
		       uint64_t timeout)
{
	char d[32];
	size_t n_waves = (n + wave - 1) / wave;
	printf("%zu node%s in %zu wave%s of at most %zu (RebootProgram=%s, "
	       "slurm.reboot_program):\n",
	       n, n == 1 ? "" : "s", n_waves, n_waves == 1 ? "" : "s", wave,
	       cfg->slurm.reboot_program ? cfg->slurm.reboot_program : "(none)");
	for (size_t w = 0; w < n_waves; w++) {
		size_t k = MIN(wave, n - w * wave);
		_cleanup_free_ char *hl = NULL;
		if (kiln_hostlist_compress(names + w * wave, k, &hl) < 0)
			return;
		printf("wave %zu/%zu: scontrol reboot ASAP nextstate=RESUME reason=\"%s\" %s\n",
		       w + 1, n_waves, reason, hl);
		printf("           then wait up to %s for %s to be back in service\n",
		       kiln_format_duration(d, sizeof(d), timeout), hl);
	}
}

/* Waits until every node of the wave is back, printing each change.
 * Returns 0, or -ETIMEDOUT (the laggards printed). */
static int wait_wave(char **wave, size_t k, uint64_t timeout, uint64_t t0)
{
	char last[k][48];
	memset(last, 0, sizeof(last));
	uint64_t deadline = kiln_now_usec() + timeout;
	bool warned = false;
	for (;;) {
		kiln_slurm_nodes *m = NULL;
		kiln_error e;
		kiln_error_reset(&e, NULL);
		size_t back = 0;
		if (kiln_slurm_nodes_load(NULL, &m, &e) < 0) {
			/* slurmctld busy or restarting: keep trying until the deadline */
			if (!warned)
				log_warning("%s; retrying", e.msg);
			warned = true;
		} else {
			warned = false;
			for (size_t i = 0; i < k; i++) {
				const kiln_slurm_node *ni = kiln_slurm_nodes_find(m, wave[i]);
				char st[48];
				if (ni)
					kiln_slurm_state_string(ni->state, st, sizeof(st));
				else
					snprintf(st, sizeof(st), "gone");
				if (!streq(st, last[i])) {
					printf("  %6.1fs  %-12s %s\n",
					       (double) (kiln_now_usec() - t0) / 1e6, wave[i], st);
					fflush(stdout);
					snprintf(last[i], sizeof(last[i]), "%s", st);
				}
				back += node_back(ni);
			}
		}
		if (back == k) {
			kiln_slurm_nodes_free(m);
			return 0;
		}
		if (kiln_now_usec() >= deadline) {
			char d[32];
			kiln_format_duration(d, sizeof(d), timeout);
			for (size_t i = 0; i < k; i++) {
				const kiln_slurm_node *ni = kiln_slurm_nodes_find(m, wave[i]);
				if (!node_back(ni))
					log_error("%s is not back within %s (state %s%s%s%s); see "
						  "`scontrol show node %s` and the node's console",
						  wave[i], d, last[i][0] ? last[i] : "unknown",
						  ni && ni->reason ? ", reason \"" : "",
						  ni && ni->reason ? ni->reason : "",
						  ni && ni->reason ? "\"" : "", wave[i]);
			}
			kiln_slurm_nodes_free(m);
			return -ETIMEDOUT;
		}
		kiln_slurm_nodes_free(m);
		usleep(REBOOT_POLL_USEC);
	}
}

static int parse_option(int key, const char *arg)
{
	switch (key) {
	case ARG_WAVE:
		if (kiln_parse_int(arg, 1, 100000, &arg_wave) < 0)
			return kiln_usage_error(&kiln_reboot_prog,
						"--wave '%s' is not a number of nodes >= 1.", arg);
		return 0;
	case ARG_TIMEOUT:
		if (kiln_parse_duration(arg, KILN_USEC_PER_SEC, &arg_timeout) < 0 ||
		    arg_timeout == 0)
			return kiln_usage_error(&kiln_reboot_prog,
						"--timeout '%s' is not a duration (30m, 1h, 600).",
						arg);
		return 0;
	default:
		return 1;
	}
}

int kiln_reboot_main(int argc, char **argv)
{
	const int wave = arg_wave;
	const uint64_t timeout = arg_timeout;
	if (argc - optind != 1)
		return kiln_usage_exit(&kiln_reboot_prog,
				       argc == optind
					       ? "reboot needs NODES (a hostlist: node[01-04])."
					       : "Unexpected argument '%s'; NODES is one hostlist.",
				       argc == optind ? "" : argv[optind + 1]);
	char reason[REBOOT_REASON_MAX + 32];
	if (arg_reason && (strlen(arg_reason) > REBOOT_REASON_MAX || strpbrk(arg_reason, "\n\"")))
		return kiln_usage_exit(
			&kiln_reboot_prog,
			"--reason must be one line of at most %d characters without '\"'.",
			REBOOT_REASON_MAX);
	snprintf(reason, sizeof(reason), "kiln reboot%s%s", arg_reason ? ": " : "",
		 arg_reason ? arg_reason : "");

	_cleanup_(kiln_cfg_freep) kiln_cfg *cfg = NULL;
	int r = kiln_cfg_open(arg_config ?: kiln_cli_config(), 0, &cfg);
	if (r < 0)
		return kiln_exit_for_config(r);
	_cleanup_strv_free_ char **names = NULL;
	size_t n = 0, pos = 0;
	r = kiln_hostlist_expand(argv[optind], &names, &n, &pos);
	if (r < 0 || n == 0)
		return kiln_usage_exit(&kiln_reboot_prog,
				       "NODES '%s' is not a hostlist (at byte %zu).", argv[optind],
				       pos);
	for (size_t i = 0; i < n; i++) {
		if (!kiln_cfg_find_node(cfg, names[i])) {
			log_error("No node '%s' in %s; `kiln show nodes` lists them.", names[i],
				  cfg->path);
			return KILN_EXIT_USAGE;
		}
		for (size_t j = 0; j < i; j++)
			if (streq(names[i], names[j])) {
				log_error("Node '%s' is named twice in '%s'.", names[i],
					  argv[optind]);
				return KILN_EXIT_USAGE;
			}
	}
	if (!cfg->slurm.reboot_program || !*cfg->slurm.reboot_program) {
		log_error("%s sets no slurm.reboot_program, so slurmd cannot reboot nodes; set it "
			  "(default /usr/sbin/reboot) and render slurm.conf again.",
			  cfg->path);
		return KILN_EXIT_USAGE;
	}
	if (arg_dry_run) {
		print_plan(cfg, names, n, (size_t) wave, reason, timeout);
		return KILN_EXIT_OK;
	}

	kiln_error e;
	kiln_error_reset(&e, NULL);
	if (kiln_slurm_init(&e) < 0) {
		log_error("Cannot reach Slurm: %s; set SLURM_CONF.", e.msg);
		return KILN_EXIT_FAILURE;
	}
	size_t n_waves = (n + (size_t) wave - 1) / (size_t) wave;
	uint64_t t0 = kiln_now_usec();
	for (size_t w = 0; w < n_waves; w++) {
		char **wn = names + w * (size_t) wave;
		size_t k = MIN((size_t) wave, n - w * (size_t) wave);
		_cleanup_free_ char *hl = NULL;
		if (kiln_hostlist_compress(wn, k, &hl) < 0)
			return log_error_errno(-ENOMEM, "Out of memory: %m");

		/* Reboots pending elsewhere count towards the wave size. */
		_cleanup_(kiln_slurm_nodes_freep) kiln_slurm_nodes *m = NULL;
		if (kiln_slurm_nodes_load(NULL, &m, &e) < 0) {
			log_error("%s; nothing rebooted%s.", e.msg, w ? " in this wave" : "");
			return KILN_EXIT_FAILURE;
		}
		size_t pending = 0;
		_cleanup_strbuf_ kiln_strbuf others;
		kiln_strbuf_init(&others);
		for (size_t i = 0; i < k; i++)
			if (!kiln_slurm_nodes_find(m, wn[i])) {
				log_error(
					"Slurm does not know node %s: render slurm.conf again and "
					"restart slurmctld.",
					wn[i]);
				return KILN_EXIT_FAILURE;
			}
		for (size_t i = 0; i < m->n; i++) {
			const kiln_slurm_node *ni = &m->v[i];
			if (kiln_slurm_state_rebooting(ni->state) && !in_list(wn, k, ni->name)) {
				pending++;
				kiln_strbuf_printf(&others, "%s%s", pending > 1 ? "," : "",
						   ni->name);
			}
		}
		if (pending + k > (size_t) wave) {
			log_error(
				"Refusing to reboot %s: %s already %s a reboot pending, and with "
				"--wave %d at most %d node%s may be down at once. Wait for %s, "
				"cancel a reboot not yet issued with `scontrol cancel_reboot %s`, "
				"or, for a node that will not come back, clear its issued reboot "
				"with `scontrol update nodename=NODE state=resume` and then set it "
				"down (state=down reason=...).",
				hl, strempty(others.s), pending == 1 ? "has" : "have", wave, wave,
				wave == 1 ? "" : "s", pending == 1 ? "it" : "them",
				strempty(others.s));
			return KILN_EXIT_FAILURE;
		}

		printf("wave %zu/%zu: %s\n", w + 1, n_waves, hl);
		fflush(stdout);
		r = kiln_slurm_reboot_asap(hl, reason, &e);
		if (r < 0) {
			log_error("%s; nothing more done.", e.msg);
			return KILN_EXIT_FAILURE;
		}
		r = wait_wave(wn, k, timeout, t0);
		if (r < 0) {
			if (w + 1 < n_waves)
				log_error("Stopping: wave %zu/%zu not back; waves %zu..%zu not "
					  "started.",
					  w + 1, n_waves, w + 2, n_waves);
			return KILN_EXIT_FAILURE;
		}
	}
	char d[32];
	printf("rebooted %zu node%s in %zu wave%s (%s)\n", n, n == 1 ? "" : "s", n_waves,
	       n_waves == 1 ? "" : "s",
	       kiln_format_duration(d, sizeof(d),
				    (kiln_now_usec() - t0) / KILN_USEC_PER_SEC *
					    KILN_USEC_PER_SEC));
	return KILN_EXIT_OK;
}
