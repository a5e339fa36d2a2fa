/* lookup.c — finding things in a loaded cluster file.
 *
 * Nodes by name or MAC, partitions by name, the action configured for an
 * XID.  Linear scans: a cluster file holds at most KILN_HOSTLIST_MAX nodes
 * and programs look up a handful of names. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kiln/config.h"

const kiln_cfg_node *kiln_cfg_find_node(const kiln_cfg *cfg, const char *name)
{
	if (!cfg || !name)
		return NULL;
	for (size_t i = 0; i < cfg->n_nodes; i++)
		if (streq(cfg->nodes[i].name, name))
			return &cfg->nodes[i];
	return NULL;
}

const kiln_cfg_node *kiln_cfg_find_node_by_mac(const kiln_cfg *cfg, const uint8_t mac[6])
{
	if (!cfg || !mac)
		return NULL;
	for (size_t i = 0; i < cfg->n_nodes; i++)
		if (memcmp(cfg->nodes[i].mac, mac, 6) == 0)
			return &cfg->nodes[i];
	return NULL;
}

const kiln_cfg_partition *kiln_cfg_find_partition(const kiln_cfg *cfg, const char *name)
{
	if (!cfg || !name)
		return NULL;
	for (size_t i = 0; i < cfg->slurm.n_partitions; i++)
		if (cfg->slurm.partitions[i].name && streq(cfg->slurm.partitions[i].name, name))
			return &cfg->slurm.partitions[i];
	return NULL;
}

kiln_cfg_action kiln_cfg_xid_action(const kiln_cfg *cfg, int xid, kiln_cfg_action def)
{
	if (!cfg)
		return def;
	for (size_t i = 0; i < cfg->health.n_xids; i++)
		if (cfg->health.xids[i].xid == xid)
			return cfg->health.xids[i].action;
	return def;
}

/* slurm.conf keys whose value is a program slurmd runs (as root, or as the
 * job's user for the Task ones): a user who can change it runs code as
 * them.  slurm.conf keys are case-insensitive. */
static const char *const slurm_program_keys[] = {
	"Prolog",
	"Epilog",
	"TaskProlog",
	"TaskEpilog",
	"HealthCheckProgram",
	"RebootProgram",
	"UnkillableStepProgram",
	NULL,
};

int kiln_cfg_for_each_code_path(const kiln_cfg *cfg,
				int (*fn)(const char *key, const char *path, void *userdata),
				void *userdata)
{
	if (!cfg || !fn)
		return -EINVAL;
	int r = 0;
	const char *lib = cfg->health.nvml_library;
	if (lib && strchr(lib, '/') && (r = fn("health.nvml_library", lib, userdata)) < 0)
		return r;
	if (cfg->health.enabled) {
		if (cfg->health.check_program &&
		    (r = fn("health.check_program", cfg->health.check_program, userdata)) < 0)
			return r;
		if (cfg->health.prolog &&
		    (r = fn("health.prolog", cfg->health.prolog, userdata)) < 0)
			return r;
		if (cfg->health.epilog &&
		    (r = fn("health.epilog", cfg->health.epilog, userdata)) < 0)
			return r;
	}
	if (cfg->slurm.reboot_program &&
	    (r = fn("slurm.reboot_program", cfg->slurm.reboot_program, userdata)) < 0)
		return r;
	for (size_t i = 0; cfg->slurm.extra && cfg->slurm.extra[i]; i++) {
		const char *line = cfg->slurm.extra[i], *eq = strchr(line, '=');
		if (!eq)
			continue;
		size_t kl = (size_t) (eq - line);
		bool program = false;
		for (const char *const *k = slurm_program_keys; *k && !program; k++)
			program = strlen(*k) == kl && strncasecmp(line, *k, kl) == 0;
		if (!program)
			continue;
		char key[48];
		snprintf(key, sizeof(key), "slurm.extra[%zu]", i);
		/* a comma-separated list of programs is allowed for Prolog/Epilog */
		for (const char *p = eq + 1; *p;) {
			size_t n = strcspn(p, ", \t");
			if (n > 0) {
				char path[4096];
				snprintf(path, sizeof(path), "%.*s", (int) n, p);
				if ((r = fn(key, path, userdata)) < 0)
					return r;
			}
			p += n;
			p += strspn(p, ", \t");
		}
	}
	return 0;
}
