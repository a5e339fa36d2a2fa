/* apply.c — `kiln apply`: bring a running cluster to what the cluster file
 * says, without rebooting its nodes.
 *
 * Slurm runs configless (slurm.conf: SlurmctldParameters=enable_configless;
 * the nodes' slurmd runs with --conf-server, written by kiln-node-init), so
 * the head node's Slurm directory is the only copy of slurm.conf, gres.conf,
 * cgroup.conf and topology.conf.  apply:
 *
 *   1. renders those files into memory;
 *   2. validates them with the real slurmctld: a throw-away slurmctld -D on
 *      a copy whose host, ports, user, state directory and authentication
 *      are replaced (127.0.0.1, free ports, this user, a scratch directory,
 *      auth/none), until it logs "Running as primary controller" or dies;
 *   3. compares them with the live files line by line, and the cluster file
 *      with the published copy the nodes fetch (kiln_cfg_diff_keys()), and
 *      says for each change what it needs:
 *        partitions, timeouts, most parameters -> scontrol reconfigure (the
 *          configless slurmds get the new files pushed; jobs keep running);
 *        gres.conf, cgroup.conf                 -> restart every slurmd;
 *        nodes added, removed or changed, and the parameters slurm.conf(5)
 *          says need a restart                  -> restart slurmctld, then
 *          every slurmd (jobs keep running; state is in StateSaveLocation);
 *        kiln-only keys (health, inference, launcher) -> publish cluster.cfg,
 *          re-run kiln-node-init on the nodes and restart the daemon that
 *          reads them (kiln-healthd reads its settings only when it starts:
 *          SIGHUP only polls);
 *        image, network, monitoring            -> what to run by hand;
 *   4. unless --dry-run, writes the files, publishes the cluster file with
 *      its signature (PUBLISH.sig, by image.signing_key: kiln-node-init
 *      refuses a file without it), and runs the reconfigure and restarts.
 *      Commands for the nodes go through --on-nodes CMD (`CMD HOSTLIST
 *      COMMAND`, e.g. 'pdsh -w'); without it apply prints them.  The plan
 *      is printed before anything runs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kiln-verbs.h"
#include "kiln/config.h"
#include "kiln/hostlist.h"
#include "kiln/log.h"
#include "kiln/parse.h"
#include "kiln/strbuf.h"

/* How long the validating slurmctld may take to reach "Running as primary
 * controller": it reads the files and opens its state in well under a
 * second; 20 s covers a loaded head node. */
#define VALIDATE_TIMEOUT_MS 20000
/* How long apply waits for a restarted slurmctld to answer scontrol ping. */
#define CTLD_WAIT_S    60
#define SLURM_FILE_MAX (16u * 1024 * 1024)

enum {
	ARG_DRY_RUN = KILN_OPT_FIRST,
	ARG_SLURM_DIR,
	ARG_PUBLISH,
	ARG_RESTART_CTLD,
	ARG_ON_NODES,
	ARG_NO_VALIDATE,
	ARG_SYSUSERS_CONF,
	ARG_SYSUSERS,
};

static bool arg_dry_run, arg_no_validate;
static const char *arg_config, *arg_slurm_dir = "/etc/slurm", *arg_publish,
			       *arg_restart_ctld = "systemctl restart slurmctld", *arg_on_nodes;
/* the head node's copy of the cluster's accounts (kiln render sysusers) */
static const char *arg_sysusers_conf = "/etc/sysusers.d/kiln-users.conf",
		  *arg_sysusers = "systemd-sysusers";

static const kiln_option apply_options[] = {
	KILN_OPTION_CONFIG_INTO(&arg_config),
	{ "dry-run", ARG_DRY_RUN, NULL, "validate and say what each change needs; change nothing",
	  NULL, .flag = &arg_dry_run },
	{ "slurm-dir", ARG_SLURM_DIR, "DIR",
	  "the live Slurm configuration slurmctld serves (default /etc/slurm)", "dir",
	  .str = &arg_slurm_dir },
	{ "publish", ARG_PUBLISH, "FILE",
	  "where the nodes fetch cluster.cfg (default image.output_dir/cluster.cfg)", "file",
	  .str = &arg_publish },
	{ "restart-slurmctld", ARG_RESTART_CTLD, "CMD",
	  "how to restart slurmctld (default 'systemctl restart slurmctld')", NULL,
	  .str = &arg_restart_ctld },
	{ "on-nodes", ARG_ON_NODES, "CMD",
	  "run node commands as CMD HOSTLIST COMMAND (e.g. 'pdsh -w');\n"
	  "without it they are printed",
	  NULL, .str = &arg_on_nodes },
	{ "no-validate", ARG_NO_VALIDATE, NULL,
	  "skip the slurmctld check (a head node without slurmctld)", NULL,
	  .flag = &arg_no_validate },
	{ "sysusers-conf", ARG_SYSUSERS_CONF, "FILE",
	  "the head node's users and groups (default /etc/sysusers.d/kiln-users.conf)", "file",
	  .str = &arg_sysusers_conf },
	{ "sysusers", ARG_SYSUSERS, "CMD", "how to apply them (default 'systemd-sysusers')", NULL,
	  .str = &arg_sysusers },
	KILN_OPTIONS_COMMON,
	{},
};

const kiln_prog kiln_apply_prog = {
	.name = "kiln apply",
	.summary = "bring the running cluster to what the cluster file says",
	.usage = "kiln [-c FILE] apply [--dry-run] [--slurm-dir DIR] [--publish FILE]\n"
		 "                    [--restart-slurmctld CMD] [--on-nodes CMD]\n"
		 "                    [--sysusers-conf FILE] [--sysusers CMD]",
	.options = apply_options,
	.args_complete = "",
	.epilog =
		"Renders slurm.conf, gres.conf, cgroup.conf (and topology.conf), validates them\n"
		"with a throw-away slurmctld, compares them with the live files in --slurm-dir\n"
		"and the cluster file with the published copy, and says what each change needs:\n"
		"  scontrol reconfigure        partitions, timeouts, most parameters\n"
		"  restart every slurmd        gres.conf, cgroup.conf\n"
		"  restart slurmctld + slurmds nodes added, removed or changed; restart-only "
		"parameters\n"
		"  kiln-node-init + restart    health.* (kiln-healthd), inference.* (kiln-inferd)\n"
		"  systemd-sysusers (head)     users and groups, before slurmctld reads them\n"
		"Then, unless --dry-run, writes the files, publishes the cluster file with its\n"
		"signature (FILE.sig, by image.signing_key; kiln-node-init refuses an unsigned\n"
		"file) and runs them.  Running jobs survive all of these except the removal of\n"
		"their node.  Without a usable signing key nothing is changed (exit 2).\n"
		"Exit status: 0 applied (or nothing to do), 1 a step failed, 2 usage, invalid\n"
		"cluster file or slurmctld refused the new configuration.\n",
};

/* ---- the Slurm files ----------------------------------------------------- */

/* Every file slurmctld serves in configless mode that kiln renders: the
 * KILN_CFG_RENDER_SLURM rows of the render table, in its order (slurm.conf
 * first); filled before main() runs. */
enum { N_SLURM_FILES = KILN_CFG_RENDER_TARGETS_MAX };
static const char *slurm_files[N_SLURM_FILES];
static size_t n_slurm_files;

__attribute__((constructor)) static void slurm_files_init(void)
{
	for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++)
		if (t->flags & KILN_CFG_RENDER_SLURM)
			slurm_files[n_slurm_files++] = t->name;
}

/* What a change needs, in increasing order: a level includes those below. */
typedef enum {
	NEED_NOTHING,
	NEED_RECONFIGURE,
	NEED_SLURMD_RESTART,
	NEED_FULL_RESTART,
} slurm_need;

static const char *need_text(slurm_need n)
{
	static const char *const text[] = {
		[NEED_NOTHING] = "nothing",
		[NEED_RECONFIGURE] = "scontrol reconfigure",
		[NEED_SLURMD_RESTART] = "restart every slurmd",
		[NEED_FULL_RESTART] = "restart slurmctld, then every slurmd",
	};
	return (unsigned) n < ARRAY_SIZE(text) ? text[n] : "nothing";
}

/* slurm.conf parameters that `scontrol reconfigure` does not change
 * (slurm.conf(5) of 22.05: "A restart of slurmctld is required ..."), and
 * those kiln renders that change what both daemons loaded. */
static const char *const restart_keys[] = {
	"AccountingStorageEnforce",
	"AccountingStorageHost",
	"AccountingStoragePort",
	"AccountingStorageType",
	"AuthType",
	"ClusterName",
	"CoreSpecPlugin",
	"CredType",
	"CryptoType",
	"GresTypes",
	"JobAcctGatherType",
	"JobContainerType",
	"MaxJobCount",
	"PluginDir",
	"ProctrackType",
	"SchedulerType",
	"SelectType",
	"SelectTypeParameters",
	"SlurmctldHost",
	"SlurmctldParameters",
	"SlurmctldPort",
	"SlurmdPort",
	"SlurmdSpoolDir",
	"SlurmUser",
	"StateSaveLocation",
	"SwitchType",
	"TaskPlugin",
	"TopologyPlugin",
};

static bool needs_restart(const char *key)
{
	for (size_t i = 0; i < ARRAY_SIZE(restart_keys); i++)
		if (strcasecmp(restart_keys[i], key) == 0)
			return true;
	return false;
}

/* One meaningful line of a Slurm file: its key ("NodeName", "ClusterName"),
 * for NodeName/PartitionName lines the name, and the whole line. */
typedef struct {
	char key[64];
	char name[128];
	const char *line; /* into the text, NUL-terminated by split_lines() */
} conf_line;

/* Splits text (modified in place) into its non-comment, non-blank lines. */
static int split_lines(char *text, conf_line **ret, size_t *ret_n)
{
	conf_line *v = NULL;
	size_t n = 0;
	for (char *p = text, *next; p && *p; p = next) {
		next = strchr(p, '\n');
		if (next)
			*next++ = 0;
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p || *p == '#')
			continue;
		conf_line *nv = realloc(v, (n + 1) * sizeof(*v));
		if (!nv) {
			free(v);
			return -ENOMEM;
		}
		v = nv;
		conf_line *l = &v[n++];
		memset(l, 0, sizeof(*l));
		l->line = p;
		size_t kl = strcspn(p, "= \t");
		snprintf(l->key, sizeof(l->key), "%.*s", (int) kl, p);
		if ((strcasecmp(l->key, "NodeName") == 0 ||
		     strcasecmp(l->key, "PartitionName") == 0 ||
		     strcasecmp(l->key, "SwitchName") == 0) &&
		    p[kl] == '=') {
			const char *nm = p + kl + 1;
			snprintf(l->name, sizeof(l->name), "%.*s", (int) strcspn(nm, " \t"), nm);
		}
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

static const conf_line *find_line(const conf_line *v, size_t n, const char *key, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcasecmp(v[i].key, key) == 0 && streq(v[i].name, name))
			return &v[i];
	return NULL;
}

static bool has_line(const conf_line *v, size_t n, const char *line)
{
	for (size_t i = 0; i < n; i++)
		if (streq(v[i].line, line))
			return true;
	return false;
}

/* The plan: every change with what it needs, and the union of the needs. */
typedef struct {
	slurm_need slurm;
	bool slurm_files_changed;
	char **removed_nodes;
	char **added_nodes; /* not booted yet: no node command reaches them */
	bool refresh_nodes; /* the published cluster.cfg changed: re-run kiln-node-init */
	bool restart_healthd, restart_inferd;
	char **by_hand; /* what apply does not do itself, one line each */
	size_t n_changes;
	char *ctld_note;     /* why slurmctld needs a restart, for ClusterName */
	char *head_accounts; /* kiln render sysusers, when --sysusers-conf differs */
} plan;

static void plan_free(plan *p)
{
	free(p->head_accounts);
	strv_free(p->removed_nodes);
	strv_free(p->added_nodes);
	strv_free(p->by_hand);
	free(p->ctld_note);
}

static slurm_need max_need(slurm_need a, slurm_need b)
{
	return a > b ? a : b;
}

static void change(plan *p, const char *what, const char *needs)
{
	printf("change: %s -> %s\n", what, needs);
	p->n_changes++;
}

static void slurm_change(plan *p, slurm_need n, const char *fmt, ...) _printf_(3, 4);
static void slurm_change(plan *p, slurm_need n, const char *fmt, ...)
{
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	change(p, what, need_text(n));
	p->slurm = max_need(p->slurm, n);
}

/* Compares the live slurm.conf with the new one, change by change. */
static int diff_slurm_conf(plan *p, const char *old_text, const char *new_text)
{
	_cleanup_free_ char *a = strdup(old_text), *b = strdup(new_text);
	_cleanup_free_ conf_line *ov = NULL, *nv = NULL;
	size_t on = 0, nn = 0;
	if (!a || !b || split_lines(a, &ov, &on) < 0 || split_lines(b, &nv, &nn) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < on; i++) {
		const conf_line *o = &ov[i];
		const conf_line *n = find_line(nv, nn, o->key, o->name);
		bool node = strcasecmp(o->key, "NodeName") == 0;
		bool part = strcasecmp(o->key, "PartitionName") == 0;
		if (node && !n) {
			slurm_change(p, NEED_FULL_RESTART, "slurm.conf: node %s removed", o->name);
			if (strv_extend(&p->removed_nodes, o->name) < 0)
				return -ENOMEM;
		} else if (node && !streq(o->line, n->line))
			slurm_change(p, NEED_FULL_RESTART,
				     "slurm.conf: node %s changed (was: %s; now: %s)", o->name,
				     o->line, n->line);
		else if (part && !n)
			slurm_change(p, NEED_RECONFIGURE, "slurm.conf: partition %s removed",
				     o->name);
		else if (part && !streq(o->line, n->line))
			slurm_change(p, NEED_RECONFIGURE,
				     "slurm.conf: partition %s changed (now: %s)", o->name,
				     n->line);
		else if (!node && !part && !has_line(nv, nn, o->line)) {
			slurm_need need =
				needs_restart(o->key) ? NEED_FULL_RESTART : NEED_RECONFIGURE;
			if (n)
				slurm_change(p, need, "slurm.conf: %s (was: %s)", n->line, o->line);
			else
				slurm_change(p, need, "slurm.conf: %s removed", o->line);
			if (strcasecmp(o->key, "ClusterName") == 0 && !p->ctld_note)
				p->ctld_note = strdup(
					"ClusterName changed: slurmctld refuses to start on the "
					"old StateSaveLocation (its clustername file); move that "
					"directory aside first, which loses the queue");
		}
	}
	for (size_t i = 0; i < nn; i++) {
		const conf_line *n = &nv[i];
		const conf_line *o = find_line(ov, on, n->key, n->name);
		if (strcasecmp(n->key, "NodeName") == 0) {
			if (!o) {
				slurm_change(p, NEED_FULL_RESTART, "slurm.conf: node %s added",
					     n->name);
				if (strv_extend(&p->added_nodes, n->name) < 0)
					return -ENOMEM;
			}
		} else if (strcasecmp(n->key, "PartitionName") == 0) {
			if (!o)
				slurm_change(p, NEED_RECONFIGURE, "slurm.conf: partition %s added",
					     n->name);
		} else if (!o && !has_line(ov, on, n->line))
			slurm_change(p,
				     needs_restart(n->key) ? NEED_FULL_RESTART : NEED_RECONFIGURE,
				     "slurm.conf: %s added", n->line);
	}
	return 0;
}

/* Renders the Slurm files; a target that has nothing to say for this
 * cluster (topology.conf without switches) is NULL. */
static int render_slurm(const kiln_cfg *c, char *out[N_SLURM_FILES])
{
	for (size_t i = 0; i < n_slurm_files; i++) {
		out[i] = NULL;
		int r = kiln_cfg_render(c, slurm_files[i], NULL, &out[i]);
		if (r == -ENODATA) {
			out[i] = NULL;
			continue;
		}
		if (r < 0)
			return log_error_errno(r, "Failed to render %s: %m", slurm_files[i]);
	}
	return 0;
}

/* The live file, or NULL when there is none. */
static int read_live(const char *name, char **ret)
{
	_cleanup_free_ char *path = NULL;
	if (asprintf(&path, "%s/%s", arg_slurm_dir, name) < 0)
		return log_error_errno(-ENOMEM, "Out of memory: %m");
	int r = kiln_read_file(path, SLURM_FILE_MAX, ret, NULL);
	if (r == -ENOENT) {
		*ret = NULL;
		return 0;
	}
	if (r < 0)
		return log_error_errno(r, "Failed to read the live '%s': %m", path);
	return 0;
}

/* The "generated by kiln from FILE" header names the file the render came
 * from; a different path alone is not a change. */
static bool same_but_header(const char *a, const char *b)
{
	const char *ea, *eb;
	while (*a && *b) {
		ea = strchrnul(a, '\n');
		eb = strchrnul(b, '\n');
		bool gen = strstr(a, "generated by kiln from ") &&
			   strstr(b, "generated by kiln from ") &&
			   strstr(a, "generated by kiln from ") < ea &&
			   strstr(b, "generated by kiln from ") < eb;
		if (!gen && (ea - a != eb - b || memcmp(a, b, (size_t) (ea - a)) != 0))
			return false;
		a = *ea ? ea + 1 : ea;
		b = *eb ? eb + 1 : eb;
	}
	return !*a && !*b;
}

static int diff_slurm(plan *p, char *const rendered[N_SLURM_FILES], char *live[N_SLURM_FILES])
{
	for (size_t i = 0; i < n_slurm_files; i++) {
		int r = read_live(slurm_files[i], &live[i]);
		if (r < 0)
			return r;
		const char *f = slurm_files[i];
		if (!rendered[i] && !live[i])
			continue;
		if (rendered[i] && live[i] && same_but_header(rendered[i], live[i]))
			continue;
		p->slurm_files_changed = true;
		if (streq(f, "slurm.conf")) {
			if (!live[i]) {
				slurm_change(p, NEED_FULL_RESTART,
					     "slurm.conf: none in %s yet (first apply)",
					     arg_slurm_dir);
				continue;
			}
			r = diff_slurm_conf(p, live[i], rendered[i]);
			if (r < 0)
				return log_error_errno(r, "Out of memory: %m");
		} else if (streq(f, "topology.conf")) {
			/* slurmctld rebuilds its switch table on reconfigure; the
			 * TopologyPlugin line itself is a slurm.conf change */
			slurm_change(p, NEED_RECONFIGURE, "%s %s", f,
				     !live[i]	    ? "added"
				     : !rendered[i] ? "removed"
						    : "changed");
		} else
			/* slurmd reads gres.conf and cgroup.conf when it starts */
			slurm_change(p, NEED_SLURMD_RESTART, "%s %s", f,
				     !live[i]	    ? "added"
				     : !rendered[i] ? "removed"
						    : "changed");
	}
	return 0;
}

/* ---- the cluster file's own keys ------------------------------------------ */

static bool has_prefix(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int by_hand(plan *p, const char *what)
{
	if (strv_contains(p->by_hand, what))
		return 0;
	return strv_extend(&p->by_hand, what);
}

/* What a changed key of the cluster file needs beyond the Slurm files. */
static int diff_keys(plan *p, const kiln_cfg *old, const kiln_cfg *new)
{
	_cleanup_strv_free_ char **keys = NULL;
	int r = kiln_cfg_diff_keys(old, new, &keys);
	if (r < 0)
		return log_error_errno(r, "Out of memory: %m");
	for (size_t i = 0; keys && keys[i]; i++) {
		const char *k = keys[i];
		char what[256];
		snprintf(what, sizeof(what), "cluster file: %s", k);
		p->refresh_nodes = true;
		if (streq(k, "inference.allow_groups")) {
			/* only AllowGroups= in slurm.conf, compared above */
			p->n_changes++;
		} else if (streq(k, "users") || streq(k, "groups")) {
			change(p, what,
			       "publish cluster.cfg and re-run kiln-node-init on every node "
			       "(systemd-sysusers adds accounts; a removed one stays until the "
			       "node reboots)");
		} else if (streq(k, "mounts")) {
			change(p, what,
			       "publish cluster.cfg and re-run kiln-node-init on every node (it "
			       "installs and starts the mount units; a dropped share stays "
			       "mounted until the node reboots)");
		} else if (has_prefix(k, "health.")) {
			p->restart_healthd = true;
			change(p, what,
			       "publish cluster.cfg, re-run kiln-node-init and restart "
			       "kiln-healthd "
			       "on every node");
		} else if (has_prefix(k, "inference.")) {
			p->restart_inferd = true;
			change(p, what,
			       "publish cluster.cfg, re-run kiln-node-init and restart kiln-inferd "
			       "on the inference nodes");
		} else if (has_prefix(k, "launcher.")) {
			change(p, what,
			       "publish cluster.cfg and re-run kiln-node-init (kiln-run reads it "
			       "when a job starts)");
		} else if (has_prefix(k, "logging.") || has_prefix(k, "time.")) {
			change(p, what,
			       "publish cluster.cfg and re-run kiln-node-init (it restarts "
			       "systemd-journal-upload and systemd-timesyncd)");
		} else if (has_prefix(k, "slurm.")) {
			/* what it changes is in the Slurm files, compared above */
			p->n_changes++;
		} else if (has_prefix(k, "monitoring.")) {
			change(p, what,
			       "by hand: kiln render prometheus -o DIR; reload Prometheus");
			r = by_hand(p, "kiln render prometheus -o /etc/prometheus && systemctl "
				       "reload prometheus");
		} else if (has_prefix(k, "image.")) {
			change(p, what,
			       "by hand: make image and systemctl reload kiln-serve; the nodes get "
			       "it when they reboot (kiln reboot)");
			r = by_hand(p, "make image CLUSTER=FILE, systemctl reload kiln-serve, then "
				       "a rolling reboot");
		} else {
			change(p, what,
			       "by hand: render dnsmasq.conf, boot.ipxe and hosts again, reload "
			       "dnsmasq and kiln-serve; the nodes see it when they reboot");
			r = by_hand(p,
				    "kiln render dnsmasq.conf / boot.ipxe / hosts again, systemctl "
				    "reload dnsmasq kiln-serve, then a rolling reboot");
		}
		if (r < 0)
			return log_error_errno(r, "Out of memory: %m");
	}
	return 0;
}

/* The head node's accounts: slurmctld resolves AllowGroups= (and users'
 * groups) on this host, so the cluster's users and groups are applied here
 * too, whenever the rendered sysusers file differs from --sysusers-conf (a
 * file that was never written counts only when the cluster has accounts).
 * Compared like the Slurm files, so an apply that failed after it is
 * finished by the next one. */
static int diff_accounts(plan *p, const kiln_cfg *c)
{
	_cleanup_free_ char *text = NULL, *live = NULL;
	int r = kiln_cfg_render(c, "sysusers", NULL, &text);
	if (r < 0)
		return log_error_errno(r, "Failed to render sysusers: %m");
	r = kiln_read_file(arg_sysusers_conf, SLURM_FILE_MAX, &live, NULL);
	if (r < 0 && r != -ENOENT)
		return log_error_errno(r, "Failed to read '%s': %m", arg_sysusers_conf);
	if (r == -ENOENT && c->n_users == 0 && c->n_unix_groups == 0)
		return 0;
	if (live && same_but_header(live, text))
		return 0;
	char what[512];
	snprintf(what, sizeof(what), "users and groups: %s", arg_sysusers_conf);
	change(p, what,
	       "write it and run systemd-sysusers on this head node (slurmctld resolves "
	       "AllowGroups= with it)");
	p->head_accounts = TAKE_PTR(text);
	return 0;
}

/* The renders that are neither Slurm files nor node-env: the boot chain and
 * the name service (MACs and addresses live only there). */
static int diff_boot(plan *p, const kiln_cfg *old, const kiln_cfg *new)
{
	for (const kiln_cfg_render_target *t = kiln_cfg_render_targets; t->name; t++) {
		if (!(t->flags & KILN_CFG_RENDER_BOOT))
			continue;
		_cleanup_free_ char *a = NULL, *b = NULL;
		if (kiln_cfg_render(old, t->name, NULL, &a) < 0 ||
		    kiln_cfg_render(new, t->name, NULL, &b) < 0)
			return log_error_errno(-ENOMEM, "Failed to render %s: %m", t->name);
		if (same_but_header(a, b))
			continue;
		char what[128];
		snprintf(what, sizeof(what), "%s (node addresses, MACs or names)", t->name);
		change(p, what, "by hand: kiln render it again, reload dnsmasq and kiln-serve");
		p->refresh_nodes = true;
		if (by_hand(p, "kiln render dnsmasq.conf / boot.ipxe / hosts again, systemctl "
			       "reload dnsmasq kiln-serve") < 0)
			return log_error_errno(-ENOMEM, "Out of memory: %m");
	}
	return 0;
}

/* ---- running things ------------------------------------------------------- */

/* Runs argv (argv[0] looked up in PATH); returns its exit status, or -errno
 * when it could not run.  Output goes where ours goes; quiet sends it to
 * /dev/null. */
static int run_argv(char *const argv[], bool quiet)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		if (quiet) {
			int fd = open("/dev/null", O_WRONLY);
			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
			}
		}
		execvp(argv[0], argv);
		fprintf(stderr, "kiln apply: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* sh -c CMD with the extra words as "$@". */
static int run_shell(const char *cmd, const char *arg1, const char *arg2)
{
	_cleanup_free_ char *script = NULL;
	if (asprintf(&script, "%s%s%s", cmd, arg1 ? " \"$1\"" : "", arg2 ? " \"$2\"" : "") < 0)
		return -ENOMEM;
	char *argv[] = {
		"/bin/sh", "-c", script, "kiln-apply", (char *) arg1, (char *) arg2, NULL
	};
	return run_argv(argv, false);
}

static int step(const char *what, int r)
{
	if (r == 0) {
		printf("done: %s\n", what);
		return 0;
	}
	if (r < 0)
		log_error_errno(r, "Failed: %s: %m", what);
	else
		log_error("Failed: %s (exit status %d)", what, r);
	return -EIO;
}

/* COMMAND on the nodes of hostlist: through --on-nodes, or printed. */
static int on_nodes(const char *hostlist, const char *command)
{
	if (!arg_on_nodes) {
		printf("to do: on %s run: %s\n", hostlist, command);
		return 0;
	}
	char what[512];
	snprintf(what, sizeof(what), "on %s: %s", hostlist, command);
	return step(what, run_shell(arg_on_nodes, hostlist, command));
}

static int wait_ctld(void)
{
	char *argv[] = { "scontrol", "ping", NULL };
	for (int i = 0; i < CTLD_WAIT_S * 4; i++) {
		if (run_argv(argv, true) == 0)
			return 0;
		usleep(250 * 1000);
	}
	log_error("slurmctld does not answer scontrol ping %d s after its restart; see its log "
		  "(SlurmctldLogFile) and systemctl status slurmctld",
		  CTLD_WAIT_S);
	return -ETIMEDOUT;
}

/* ---- validation with the real slurmctld ---------------------------------- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void) st;
	(void) flag;
	(void) ftw;
	(void) remove(path);
	return 0;
}

static void rm_rf(const char *dir)
{
	(void) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A TCP port nobody listens on now (the kernel's pick). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int r = 0;
	if (bind(fd, (struct sockaddr *) &a, sizeof(a)) < 0 ||
	    getsockname(fd, (struct sockaddr *) &a, &l) < 0)
		r = -errno;
	close(fd);
	return r < 0 ? r : ntohs(a.sin_port);
}

/* Keys the validating copy replaces: where it runs, not what it checks. */
static const char *const validate_keys[] = {
	"SlurmctldHost",
	"ControlMachine",
	"ControlAddr",
	"BackupController",
	"BackupAddr",
	"SlurmctldPort",
	"SlurmdPort",
	"SlurmUser",
	"StateSaveLocation",
	"SlurmctldPidFile",
	"SlurmctldLogFile",
	"AuthType",
	"AuthInfo",
	"CryptoType",
	"CredType",
	"SlurmSchedLogFile",
	/* slurmdbd: the controller would wait on the real one (or its name) */
	"AccountingStorageHost",
	"AccountingStoragePort",
	"AccountingStorageType",
};

static bool is_validate_key(const char *line)
{
	size_t kl = strcspn(line, "= \t");
	for (size_t i = 0; i < ARRAY_SIZE(validate_keys); i++)
		if (strlen(validate_keys[i]) == kl && strncasecmp(validate_keys[i], line, kl) == 0)
			return true;
	return false;
}

static int write_in(const char *dir, const char *name, const char *text)
{
	_cleanup_free_ char *p = NULL;
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return -ENOMEM;
	return kiln_write_file_atomic(p, text, strlen(text), 0644);
}

/* The error lines of a failed slurmctld's log, without the noise every
 * fresh state directory produces. */
static size_t print_ctld_errors(const char *log)
{
	static const char *const noise[] = {
		"Could not open", "to recover", "Trying backup", "MailProg",
		"mpi/pmix",	  "MPI:",	"PMIx"
	};
	size_t shown = 0;
	for (const char *p = log; *p && shown < 20;) {
		const char *e = strchrnul(p, '\n');
		bool err = false, quiet = false;
		for (const char *q = p; q + 5 < e; q++)
			if (strncmp(q, "error", 5) == 0 || strncmp(q, "fatal", 5) == 0)
				err = true;
		for (size_t i = 0; i < ARRAY_SIZE(noise); i++)
			for (const char *q = p; q < e && !quiet; q++)
				quiet = strncmp(q, noise[i], strlen(noise[i])) == 0;
		if (err && !quiet) {
			fprintf(stderr, "  slurmctld: %.*s\n", (int) (e - p), p);
			shown++;
		}
		p = *e ? e + 1 : e;
	}
	return shown;
}

/* Starts slurmctld -D on a scratch copy of the rendered files.  Returns 0
 * when it ran as primary controller, -EINVAL when it refused the files (its
 * errors printed), another -errno when it could not be tried. */
static int validate(char *const rendered[N_SLURM_FILES])
{
	char dir[] = "/tmp/kiln-apply.XXXXXX";
	if (!mkdtemp(dir))
		return log_error_errno(-errno, "Failed to create a scratch directory: %m");
	int r;
	_cleanup_free_ char *conf = NULL, *state = NULL, *logf = NULL, *errf = NULL;
	_cleanup_free_ char *log = NULL, *out = NULL;
	_cleanup_(kiln_strbuf_freep) kiln_strbuf b;
	kiln_strbuf_init(&b);
	char host[256] = "localhost";
	(void) gethostname(host, sizeof(host) - 1);
	host[strcspn(host, ".")] = 0;
	struct passwd *pw = getpwuid(geteuid());
	int cport = free_port(), dport = free_port(), aport = free_port();
	if (asprintf(&conf, "%s/slurm.conf", dir) < 0 || asprintf(&state, "%s/state", dir) < 0 ||
	    asprintf(&logf, "%s/slurmctld.log", dir) < 0 ||
	    asprintf(&errf, "%s/slurmctld.out", dir) < 0) {
		r = log_error_errno(-ENOMEM, "Out of memory: %m");
		goto out;
	}
	if (cport < 0 || dport < 0 || aport < 0 || !pw) {
		r = log_error_errno(cport < 0 ? cport : -ESRCH, "Failed to find free ports: %m");
		goto out;
	}
	for (const char *p = rendered[0]; *p;) {
		const char *e = strchrnul(p, '\n');
		const char *s = p;
		while (*s == ' ' || *s == '\t')
			s++;
		if (!is_validate_key(s))
			kiln_strbuf_printf(&b, "%.*s\n", (int) (e - p), p);
		p = *e ? e + 1 : e;
	}
	kiln_strbuf_printf(&b,
			   "\n# kiln apply: a throw-away controller to validate the files above\n"
			   "SlurmctldHost=%s(127.0.0.1)\nSlurmctldPort=%d\nSlurmdPort=%d\n"
			   "SlurmUser=%s\nStateSaveLocation=%s\nSlurmctldPidFile=%s/slurmctld.pid\n"
			   "SlurmctldLogFile=%s\nAuthType=auth/none\nCredType=cred/none\n"
			   /* a fresh controller with slurmdbd accounting refuses to start
			    * until slurmdbd answers: the copy keeps no accounting */
			   "AccountingStorageType=accounting_storage/none\n"
			   "AccountingStorageHost=127.0.0.1\nAccountingStoragePort=%d\n",
			   host, cport, dport, pw->pw_name, state, dir, logf, aport);
	r = kiln_strbuf_error(&b);
	if (r >= 0)
		r = kiln_write_file_atomic(conf, b.s, strlen(b.s), 0644);
	for (size_t i = 1; r >= 0 && i < n_slurm_files; i++)
		if (rendered[i])
			r = write_in(dir, slurm_files[i], rendered[i]);
	if (r >= 0 && mkdir(state, 0700) < 0)
		r = -errno;
	if (r < 0) {
		r = log_error_errno(r, "Failed to write the scratch configuration in %s: %m", dir);
		goto out;
	}

	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0) {
		r = log_error_errno(-errno, "Failed to fork: %m");
		goto out;
	}
	if (pid == 0) {
		int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (chdir(dir) < 0)
			_exit(127);
		unsetenv("SLURM_CONF");
		execlp("slurmctld", "slurmctld", "-D", "-f", conf, (char *) NULL);
		fprintf(stderr, "cannot run slurmctld: %s\n", strerror(errno));
		_exit(127);
	}
	bool ok = false, exited = false;
	int st = 0;
	for (int waited = 0; waited < VALIDATE_TIMEOUT_MS; waited += 50) {
		_cleanup_free_ char *sofar = NULL;
		if (kiln_read_file(logf, SLURM_FILE_MAX, &sofar, NULL) >= 0 &&
		    strstr(sofar, "Running as primary controller")) {
			ok = true;
			break;
		}
		if (waitpid(pid, &st, WNOHANG) == pid) {
			exited = true;
			break;
		}
		usleep(50 * 1000);
	}
	if (!exited) {
		kill(pid, SIGTERM);
		for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) != pid; i++)
			usleep(50 * 1000);
		kill(pid, SIGKILL);
		(void) waitpid(pid, &st, 0);
	}
	if (ok) {
		printf("validated: slurmctld accepts the new configuration (a throw-away "
		       "controller on 127.0.0.1:%d%s)\n",
		       cport,
		       strstr(rendered[0], "accounting_storage/slurmdbd")
			       ? "; slurmdbd itself not contacted"
			       : "");
		r = 0;
		goto out;
	}
	(void) kiln_read_file(logf, SLURM_FILE_MAX, &log, NULL);
	(void) kiln_read_file(errf, SLURM_FILE_MAX, &out, NULL);
	if (exited && WIFEXITED(st) && WEXITSTATUS(st) == 127 && out && strstr(out, "cannot run")) {
		log_error("Cannot validate: slurmctld is not installed here (apt install "
			  "slurmctld, or --no-validate on a head node without it)");
		r = -ENOENT;
		goto out;
	}
	log_error("slurmctld refuses the new configuration (%s); nothing was changed:",
		  exited ? "it exited" : "no \"Running as primary controller\" in time");
	/* the log, or what it printed before it had one (a parse error) */
	if (print_ctld_errors(log ? log : "") == 0 && print_ctld_errors(out ? out : "") == 0)
		fprintf(stderr, "  (slurmctld said nothing about why; run slurmctld -D -f on "
				"the rendered files to see)\n");
	r = -EINVAL;
out:
	rm_rf(dir);
	return r;
}

/* ---- an apply that did not finish ------------------------------------------ */

/* Between writing the files and the last restart, the plan is kept in
 * SLURM_DIR/.kiln-apply-pending: the files then already match, so a second
 * apply after a failed restart learns from it what is still owed. */
#define PENDING_NAME ".kiln-apply-pending"

static int pending_path(char **ret)
{
	return asprintf(ret, "%s/" PENDING_NAME, arg_slurm_dir) < 0 ? -ENOMEM : 0;
}

static void pending_load(plan *p)
{
	_cleanup_free_ char *path = NULL, *text = NULL;
	int slurm = 0, refresh = 0, healthd = 0, inferd = 0;
	if (pending_path(&path) < 0 || kiln_read_file(path, 4096, &text, NULL) < 0)
		return;
	if (sscanf(text, "slurm=%d refresh=%d healthd=%d inferd=%d", &slurm, &refresh, &healthd,
		   &inferd) != 4 ||
	    slurm < NEED_NOTHING || slurm > NEED_FULL_RESTART)
		return;
	printf("change: a previous kiln apply did not finish (%s) -> %s%s\n", path,
	       need_text((slurm_need) slurm), refresh ? ", then the node commands" : "");
	p->n_changes++;
	p->slurm = max_need(p->slurm, (slurm_need) slurm);
	p->refresh_nodes |= refresh;
	p->restart_healthd |= healthd;
	p->restart_inferd |= inferd;
}

static int pending_save(const plan *p)
{
	_cleanup_free_ char *path = NULL;
	char text[128];
	if (pending_path(&path) < 0)
		return -ENOMEM;
	snprintf(text, sizeof(text), "slurm=%d refresh=%d healthd=%d inferd=%d\n", (int) p->slurm,
		 p->refresh_nodes, p->restart_healthd, p->restart_inferd);
	int r = kiln_write_file_atomic(path, text, strlen(text), 0644);
	return r < 0 ? log_error_errno(r, "Failed to write '%s': %m", path) : 0;
}

static void pending_done(void)
{
	_cleanup_free_ char *path = NULL;
	if (pending_path(&path) >= 0)
		(void) unlink(path);
}

/* ---- the verb ------------------------------------------------------------- */

/* The running nodes (all but those just added) as a hostlist, or NULL. */
static int all_nodes(const kiln_cfg *c, char *const *added, bool inference_only, char **ret)
{
	_cleanup_strv_free_ char **v = NULL;
	for (size_t i = 0; i < c->n_nodes; i++)
		if ((!inference_only || c->nodes[i].inference) &&
		    !strv_contains(added, c->nodes[i].name) &&
		    strv_extend(&v, c->nodes[i].name) < 0)
			return -ENOMEM;
	if (!v) {
		*ret = NULL;
		return 0;
	}
	return kiln_hostlist_compress(v, strv_length(v), ret);
}

static void free_files(char *v[N_SLURM_FILES])
{
	for (size_t i = 0; i < n_slurm_files; i++)
		free(v[i]);
}

/* Writes PUBLISH.sig.  The file first, then its signature: a node that
 * fetches in between refuses the pair (exit 2, its previous files kept)
 * rather than taking an unsigned file; apply re-runs kiln-node-init after
 * both are in place. */
static int write_sig(const char *publish, const char *sig)
{
	_cleanup_free_ char *p = NULL;
	if (asprintf(&p, "%s.sig", publish) < 0)
		return log_error_errno(-ENOMEM, "Out of memory: %m");
	int r = kiln_write_file_atomic(p, sig, strlen(sig), 0644);
	if (r < 0)
		return log_error_errno(r, "Failed to publish the signature '%s': %m", p);
	return 0;
}

/* Writes the rendered files into --slurm-dir (removing one no longer
 * rendered) and the cluster file to --publish, with its signature sig. */
static int write_live(const kiln_cfg *c, char *const rendered[N_SLURM_FILES],
		      char *const live[N_SLURM_FILES], const char *publish, const char *cfg_text,
		      const char *sig)
{
	for (size_t i = 0; i < n_slurm_files; i++) {
		_cleanup_free_ char *p = NULL;
		if (asprintf(&p, "%s/%s", arg_slurm_dir, slurm_files[i]) < 0)
			return log_error_errno(-ENOMEM, "Out of memory: %m");
		if (!rendered[i]) {
			if (live[i] && unlink(p) < 0 && errno != ENOENT)
				return log_error_errno(-errno, "Failed to remove '%s': %m", p);
			continue;
		}
		int r = kiln_write_file_atomic(p, rendered[i], strlen(rendered[i]), 0644);
		if (r < 0)
			return log_error_errno(r, "Failed to write '%s': %m", p);
	}
	int r = kiln_write_file_atomic(publish, cfg_text, strlen(cfg_text), 0644);
	if (r < 0)
		return log_error_errno(r, "Failed to publish '%s': %m", publish);
	if (write_sig(publish, sig) < 0)
		return -EIO;
	printf("done: wrote %s into %s, published %s (signed: %s.sig)\n", "the Slurm files",
	       arg_slurm_dir, publish, publish);
	(void) c;
	return 0;
}

int kiln_apply_main(int argc, char **argv)
{
	if (optind < argc)
		return kiln_usage_exit(&kiln_apply_prog, "apply takes no arguments (use -c FILE).");
	if (!arg_config)
		arg_config = kiln_cli_config();
	_cleanup_(kiln_cfg_freep) kiln_cfg *c = NULL;
	int r = kiln_cfg_open(arg_config, 0, &c);
	if (r < 0)
		return kiln_exit_for_config(r);
	_cleanup_free_ char *publish = NULL, *cfg_text = NULL;
	if (arg_publish)
		publish = strdup(arg_publish);
	else if (asprintf(&publish, "%s/cluster.cfg", c->image.output_dir) < 0)
		publish = NULL;
	if (!publish)
		return log_error_errno(-ENOMEM, "Out of memory: %m"), KILN_EXIT_FAILURE;
	r = kiln_read_file(c->path, KILN_CFG_FILE_MAX, &cfg_text, NULL);
	if (r < 0)
		return log_error_errno(r, "Failed to read '%s': %m", c->path), KILN_EXIT_FAILURE;

	char *rendered[N_SLURM_FILES] = {}, *live[N_SLURM_FILES] = {};
	_cleanup_(plan_free) plan p = {};
	_cleanup_(kiln_cfg_freep) kiln_cfg *old = NULL;
	_cleanup_free_ char *old_text = NULL, *nodes = NULL, *inference = NULL, *removed = NULL,
			    *added = NULL, *sig = NULL;
	int status = KILN_EXIT_FAILURE;
	if (render_slurm(c, rendered) < 0)
		goto out;
	printf("kiln apply: %s against the live Slurm files in %s and the published %s\n", c->path,
	       arg_slurm_dir, publish);
	if (!arg_no_validate) {
		r = validate(rendered);
		if (r < 0) {
			status = r == -EINVAL ? KILN_EXIT_USAGE : KILN_EXIT_FAILURE;
			goto out;
		}
	}
	pending_load(&p);
	if (diff_slurm(&p, rendered, live) < 0 || diff_accounts(&p, c) < 0)
		goto out;

	r = kiln_read_file(publish, KILN_CFG_FILE_MAX, &old_text, NULL);
	if (r == -ENOENT) {
		change(&p, "cluster file: not published yet (first apply)",
		       "publish cluster.cfg, re-run kiln-node-init on every node");
		p.refresh_nodes = true;
	} else if (r < 0) {
		log_error_errno(r, "Failed to read the published '%s': %m", publish);
		goto out;
	} else if (!streq(old_text, cfg_text)) {
		if (kiln_cfg_load(publish, &old, NULL) < 0) {
			change(&p, "cluster file: the published copy is not valid",
			       "publish cluster.cfg, re-run kiln-node-init and restart "
			       "kiln-healthd "
			       "and kiln-inferd on the nodes");
			p.refresh_nodes = p.restart_healthd = p.restart_inferd = true;
		} else if (diff_keys(&p, old, c) < 0 || diff_boot(&p, old, c) < 0)
			goto out;
		/* comments or layout only: the nodes get the new text anyway */
		p.refresh_nodes = true;
	}

	if (p.n_changes == 0 && !p.refresh_nodes) {
		printf("Nothing to do: the live Slurm files and the published cluster file "
		       "already say what %s says.\n",
		       c->path);
		/* published by an older kiln, or by hand: the nodes refuse it
		 * unsigned, so sign it (nothing else changes) */
		_cleanup_free_ char *sig_path = NULL;
		if (asprintf(&sig_path, "%s.sig", publish) >= 0 && access(sig_path, F_OK) < 0 &&
		    errno == ENOENT) {
			if (arg_dry_run) {
				printf("to do: %s is not signed (no %s); kiln apply signs it\n",
				       publish, sig_path);
				status = KILN_EXIT_OK;
				goto out;
			}
			status = kiln_sign_text_with(c->image.signing_key, publish, cfg_text,
						     strlen(cfg_text), &sig);
			if (status == KILN_EXIT_OK && write_sig(publish, sig) < 0)
				status = KILN_EXIT_FAILURE;
			if (status == KILN_EXIT_OK)
				printf("signed: %s (it had no signature)\n", sig_path);
			goto out;
		}
		status = KILN_EXIT_OK;
		goto out;
	}
	printf("plan: Slurm: %s", need_text(p.slurm));
	if (p.refresh_nodes)
		printf("; nodes: re-run kiln-node-init%s%s",
		       p.restart_healthd ? ", restart kiln-healthd" : "",
		       p.restart_inferd ? ", restart kiln-inferd" : "");
	printf("\n");
	if (p.ctld_note)
		printf("warning: %s\n", p.ctld_note);
	for (size_t i = 0; p.by_hand && p.by_hand[i]; i++)
		printf("by hand: %s\n", p.by_hand[i]);
	if (arg_dry_run) {
		printf("--dry-run: nothing was changed.\n");
		status = KILN_EXIT_OK;
		goto out;
	}

	/* Signed before anything is written: a missing or unusable key
	 * changes nothing (exit 2), and no node ever sees this file unsigned. */
	r = kiln_sign_text_with(c->image.signing_key, c->path, cfg_text, strlen(cfg_text), &sig);
	if (r != KILN_EXIT_OK) {
		log_error("Nothing was changed: kiln apply publishes the cluster file signed "
			  "(image.signing_key), as kiln-node-init accepts no other.");
		status = r;
		goto out;
	}
	if (pending_save(&p) < 0 || write_live(c, rendered, live, publish, cfg_text, sig) < 0)
		goto out;
	if (all_nodes(c, p.added_nodes, false, &nodes) < 0 ||
	    all_nodes(c, p.added_nodes, true, &inference) < 0 ||
	    (p.removed_nodes &&
	     kiln_hostlist_compress(p.removed_nodes, strv_length(p.removed_nodes), &removed) < 0) ||
	    (p.added_nodes &&
	     kiln_hostlist_compress(p.added_nodes, strv_length(p.added_nodes), &added) < 0)) {
		log_error_errno(-ENOMEM, "Out of memory: %m");
		goto out;
	}
	char *reconf[] = { "scontrol", "reconfigure", NULL };
	r = 0;
	if (p.head_accounts) {
		/* before slurmctld reads AllowGroups= again; /etc/sysusers.d
		 * need not exist yet (Debian ships none) */
		_cleanup_free_ char *dir = strdup(arg_sysusers_conf);
		char *slash = dir ? strrchr(dir, '/') : NULL;
		if (slash && slash != dir) {
			*slash = 0;
			if (mkdir(dir, 0755) < 0 && errno != EEXIST)
				log_warning_errno(-errno, "Failed to create '%s': %m", dir);
		}
		r = kiln_write_file_atomic(arg_sysusers_conf, p.head_accounts,
					   strlen(p.head_accounts), 0644);
		if (r < 0) {
			log_error_errno(r, "Failed to write '%s': %m", arg_sysusers_conf);
			goto out;
		}
		r = step(arg_sysusers, run_shell(arg_sysusers, NULL, NULL));
		if (r < 0) {
			/* the next apply tries again */
			unlink(arg_sysusers_conf);
			goto out;
		}
	}
	if (p.refresh_nodes && nodes) {
		/* First: kiln-node-init fetches the published file and renders
		 * the node's own copies (what slurmd reads without configless,
		 * and node.env); the daemons read them only when they start. */
		const char *cmd = p.restart_healthd
					  ? "kiln-node-init && systemctl restart kiln-healthd"
					  : "kiln-node-init";
		r = on_nodes(nodes, cmd);
	}
	if (r < 0)
		goto out;
	switch (p.slurm) {
	case NEED_FULL_RESTART:
		r = step("restart slurmctld", run_shell(arg_restart_ctld, NULL, NULL));
		if (r >= 0)
			r = wait_ctld();
		if (r >= 0 && removed)
			r = on_nodes(removed, "systemctl stop slurmd");
		if (r >= 0 && nodes)
			r = on_nodes(nodes, "systemctl restart slurmd");
		break;
	case NEED_SLURMD_RESTART:
		r = step("scontrol reconfigure", run_argv(reconf, false));
		if (r >= 0 && nodes)
			r = on_nodes(nodes, "systemctl restart slurmd");
		break;
	case NEED_RECONFIGURE:
		r = step("scontrol reconfigure", run_argv(reconf, false));
		break;
	default:
		break;
	}
	if (r >= 0 && p.restart_inferd && inference)
		r = on_nodes(inference, "systemctl restart kiln-inferd");
	if (r < 0)
		goto out;
	if (added)
		printf("to do: power on %s: %s PXE-boot%s with the new configuration and join.\n",
		       added, strv_length(p.added_nodes) == 1 ? "it" : "they",
		       strv_length(p.added_nodes) == 1 ? "s" : "");
	pending_done();
	printf("applied: %s\n", c->path);
	status = KILN_EXIT_OK;
out:
	free_files(rendered);
	free_files(live);
	return status;
}
