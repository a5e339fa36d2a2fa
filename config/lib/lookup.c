/* lookup.c — finding things in a loaded cluster file.
 *
 * Nodes by name or MAC, partitions by name, the action configured for an
 * XID.  Linear scans: a cluster file holds at most KILN_HOSTLIST_MAX nodes
 * and programs look up a handful of names. */
#include <string.h>

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
