/* check-partitions.c — slurm.partitions across keys, and their members.
 *
 * Partition names (valid, unique, at most one default), then each
 * partition's members: the nodes its hostlist names, then every node of a
 * group that lists it, each once and in file order; a partition with no
 * node is an error, and so is a group joining a partition that does not
 * exist.  Each node learns the partitions it is in (cfg->nodes[].partitions,
 * what render writes into slurm.conf).  A node in no partition is a
 * warning (Slurm never schedules a job there); slurm.extra lines that
 * define a node or partition kiln renders are errors (slurmctld refuses to
 * start on a duplicate NodeName/PartitionName). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config-internal.h"
#include "kiln/hostlist.h"

/* Names, duplicates and the default; pnames gets every name (owned). */
static int check_names(loader *L, char **pnames)
{
	kiln_cfg *c = L->cfg;
	size_t np = 0;
	int default_line = 0;
	for (size_t pi = 0; pi < c->slurm.n_partitions; pi++) {
		kiln_cfg_partition *p = &c->slurm.partitions[pi];
		config_setting_t *ps = L->part_set[pi];
		if (!ps || !p->name)
			continue;
		if (!kiln_cfg__valid_name(p->name))
			kiln_cfg__member_error(L, "slurm.partitions", pi, ps, "name",
					       KILN_CFG_NAME_HINT, "invalid partition name \"%s\"",
					       p->name);
		if (strv_contains(pnames, p->name)) {
			size_t first = 0;
			while (first < pi &&
			       !(L->part_set[first] && c->slurm.partitions[first].name &&
				 streq(c->slurm.partitions[first].name, p->name)))
				first++;
			kiln_cfg__member_error(
				L, "slurm.partitions", pi, ps, "name",
				"give each partition its own name, or merge the two",
				"duplicate partition \"%s\" (also slurm.partitions[%zu], line %d)",
				p->name, first, kiln_cfg__member_line(L->part_set[first], "name"));
		}
		if (!(pnames[np++] = strdup(p->name))) {
			L->oom = 1;
			return -ENOMEM;
		}
		if (p->is_default) {
			if (default_line)
				kiln_cfg__member_error(
					L, "slurm.partitions", pi, ps, "default", NULL,
					"a second default partition (the first is at line %d)",
					default_line);
			else
				default_line = kiln_cfg__member_line(ps, "default");
		}
	}
	return 0;
}

/* Members: explicit nodes first, then groups naming the partition; each
 * node once (mark[i] == pi + 1 when node i is already in). */
static int resolve_members(loader *L, size_t *mark)
{
	kiln_cfg *c = L->cfg;
	for (size_t pi = 0; pi < c->slurm.n_partitions; pi++) {
		kiln_cfg_partition *p = &c->slurm.partitions[pi];
		if (!L->part_set[pi] || !p->name)
			continue;
		char ap[96];
		snprintf(ap, sizeof(ap), "slurm.partitions[%zu].nodes", pi);
		char **members = calloc(c->n_nodes + 1, sizeof(char *));
		if (!members) {
			L->oom = 1;
			return -ENOMEM;
		}
		size_t nmem = 0;
		if (p->nodes) {
			_cleanup_strv_free_ char **v = NULL;
			size_t nv = 0;
			int line = kiln_cfg__member_line(L->part_set[pi], "nodes");
			if (kiln_cfg__expand_hostlist(L, line, ap, p->nodes, &v, &nv) < 0) {
				free(members);
				continue;
			}
			for (size_t i = 0; i < nv; i++) {
				ssize_t ni = kiln_cfg__listed_node(L, v[i], line, ap, "node");
				if (ni < 0)
					continue;
				if (mark[ni] != pi + 1) {
					mark[ni] = pi + 1;
					members[nmem++] = c->nodes[ni].name;
				}
			}
		}
		for (size_t ni = 0; ni < c->n_nodes; ni++) {
			const kiln_cfg_group *g = c->nodes[ni].group;
			if (g->partitions && strv_contains(g->partitions, p->name) &&
			    mark[ni] != pi + 1) {
				mark[ni] = pi + 1;
				members[nmem++] = c->nodes[ni].name;
			}
		}
		/* members borrowed node names so far; now own copies, and record
		 * the partition on each member node (in partition order). */
		for (size_t i = 0; i < nmem; i++) {
			ssize_t ni = kiln_cfg__node_index(L, members[i]);
			members[i] = strdup(members[i]);
			if (!members[i] || strv_extend(&c->nodes[ni].partitions, p->name) < 0) {
				strv_free(members);
				L->oom = 1;
				return -ENOMEM;
			}
		}
		if (nmem == 0) {
			free(members);
			if (!p->nodes)
				kiln_cfg__add_error(
					L, p->line, ap,
					"set nodes, or name the partition in a node group's "
					"partitions",
					"partition \"%s\" has no nodes", p->name);
			continue;
		}
		p->n_members = nmem;
		p->members = members;
	}
	return 0;
}

/* Groups joining partitions that do not exist. */
static void check_group_partitions(loader *L, char **pnames)
{
	kiln_cfg *c = L->cfg;
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		if (!L->group_set[gi] || !g->partitions)
			continue;
		for (size_t j = 0; g->partitions[j]; j++)
			if (!strv_contains(pnames, g->partitions[j])) {
				char ap[96];
				snprintf(ap, sizeof(ap), "node_groups[%zu].partitions[%zu]", gi, j);
				_cleanup_free_ char *h =
					kiln_cfg__hint_from(g->partitions[j], pnames);
				config_setting_t *ps =
					config_setting_get_member(L->group_set[gi], "partitions");
				if (!h && asprintf(&h, "add { name = \"%s\"; } to slurm.partitions",
						   g->partitions[j]) < 0)
					h = NULL; /* no hint then */
				kiln_cfg__add_error(L, kiln_cfg__elem_line(ps, j), ap, h,
						    "unknown partition \"%s\"", g->partitions[j]);
			}
	}
}

/* One warning per group whose nodes are in no partition. */
static void check_unscheduled(loader *L)
{
	kiln_cfg *c = L->cfg;
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		const kiln_cfg_group *g = &c->groups[gi];
		size_t n = 0;
		const char *first = NULL;
		for (size_t ni = 0; ni < c->n_nodes; ni++)
			if (c->nodes[ni].group == g &&
			    (!c->nodes[ni].partitions || !c->nodes[ni].partitions[0])) {
				first = first ? first : c->nodes[ni].name;
				n++;
			}
		if (n == 0 || !L->group_set[gi])
			continue;
		char ap[64];
		snprintf(ap, sizeof(ap), "node_groups[%zu].partitions", gi);
		int line = kiln_cfg__member_line(L->group_set[gi], "partitions");
		const char *hint = "add partitions = [ \"NAME\" ] to the group, or name the nodes "
				   "in slurm.partitions[].nodes";
		if (n == g->n_hosts)
			kiln_cfg__add_warning(L, line, ap, hint,
					      "no node of group \"%s\" (%s ...) is in a partition: "
					      "Slurm never runs a job there",
					      strempty(g->name), first);
		else
			kiln_cfg__add_warning(L, line, ap, hint,
					      "%zu node(s) of group \"%s\" (first %s) are in no "
					      "partition: Slurm never runs a job there",
					      n, strempty(g->name), first);
	}
}

/* slurm.extra is passed through verbatim after what kiln renders: a line
 * defining one of kiln's nodes or partitions again stops slurmctld
 * ("Duplicated NodeName"). NodeName=DEFAULT / PartitionName=DEFAULT only set
 * defaults and are fine. */
static void check_extra(loader *L)
{
	kiln_cfg *c = L->cfg;
	config_setting_t *arr = config_lookup(L->lc, "slurm.extra");
	if (!c->slurm.extra || !arr)
		return;
	for (size_t i = 0; c->slurm.extra[i]; i++) {
		const char *s = c->slurm.extra[i];
		s += strspn(s, " \t");
		bool node = strncasecmp(s, "NodeName=", 9) == 0;
		if (!node && strncasecmp(s, "PartitionName=", 14) != 0)
			continue;
		const char *v = s + (node ? 9 : 14);
		_cleanup_free_ char *val = strndup(v, strcspn(v, " \t"));
		if (!val) {
			L->oom = 1;
			return;
		}
		if (strcasecmp(val, "DEFAULT") == 0)
			continue;
		char ap[64];
		snprintf(ap, sizeof(ap), "slurm.extra[%zu]", i);
		int line = kiln_cfg__elem_line(arr, i);
		if (!node) {
			for (size_t pi = 0; pi < c->slurm.n_partitions; pi++)
				if (c->slurm.partitions[pi].name &&
				    streq(c->slurm.partitions[pi].name, val))
					kiln_cfg__add_error(
						L, line, ap,
						"set its options in slurm.partitions[].extra "
						"instead",
						"PartitionName=%s is already rendered from "
						"slurm.partitions (line %d): slurmctld would not "
						"start "
						"on the duplicate",
						val, c->slurm.partitions[pi].line);
			continue;
		}
		_cleanup_strv_free_ char **names = NULL;
		size_t n = 0;
		if (kiln_hostlist_expand(val, &names, &n, NULL) < 0)
			continue; /* not kiln's to judge: slurmctld will say */
		for (size_t k = 0; k < n; k++) {
			ssize_t ni = kiln_cfg__node_index(L, names[k]);
			if (ni < 0)
				continue;
			kiln_cfg__add_error(L, line, ap,
					    "describe the node in node_groups (features for extra "
					    "attributes), or use NodeName=DEFAULT",
					    "NodeName %s is already rendered from node_groups "
					    "(group \"%s\", line %d): slurmctld would not start on "
					    "the duplicate",
					    names[k], strempty(c->nodes[ni].group->name),
					    c->nodes[ni].group->line);
			break;
		}
	}
}

int kiln_cfg__check_partitions(loader *L)
{
	kiln_cfg *c = L->cfg;
	_cleanup_strv_free_ char **pnames = calloc(c->slurm.n_partitions + 1, sizeof(char *));
	_cleanup_free_ size_t *mark = calloc(c->n_nodes ? c->n_nodes : 1, sizeof(size_t));
	L->node_names = calloc(c->n_nodes + 1, sizeof(char *)); /* borrowed */
	if (!pnames || !L->node_names || !mark) {
		L->oom = 1;
		return -ENOMEM;
	}
	for (size_t i = 0; i < c->n_nodes; i++)
		L->node_names[i] = c->nodes[i].name;
	int r = check_names(L, pnames);
	if (r < 0)
		return r;
	r = resolve_members(L, mark);
	if (r < 0)
		return r;
	check_group_partitions(L, pnames);
	/* after errors (a partition without a name, a missing slurm section)
	 * membership is unknown, but then the loader drops every warning
	 * (kiln_cfg__errors_drop_warnings): a failing file lists errors only */
	check_unscheduled(L);
	check_extra(L);
	/* Nodes in no partition still get an empty vector. */
	for (size_t a = 0; a < c->n_nodes; a++)
		if (!c->nodes[a].partitions &&
		    !(c->nodes[a].partitions = calloc(1, sizeof(char *)))) {
			L->oom = 1;
			return -ENOMEM;
		}
	return 0;
}
