/* check-topology.c — topology.switches, the switch tree of topology.conf.
 *
 * Slurm's topology/tree wants a tree: every switch named once, a leaf
 * listing nodes, a higher switch listing switches that exist, no switch
 * under two parents, no loop (slurmctld refuses or loops on all of these,
 * far from the line that caused them).  Errors for those; warnings for a
 * tree Slurm accepts but schedules badly: nodes under no switch and more
 * than one top switch (a job cannot span nodes with no common switch). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"

#define LIST "topology.switches"
/* SwitchName: what slurm.conf/topology.conf can hold in a name */
#define SWITCH_NAME_MAX 63

static bool valid_switch_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > SWITCH_NAME_MAX)
		return false;
	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
			return false;
	return true;
}

static ssize_t find_switch(const kiln_cfg *c, const char *name)
{
	for (size_t i = 0; i < c->n_switches; i++)
		if (c->switches[i].name && streq(c->switches[i].name, name))
			return (ssize_t) i;
	return -1;
}

void kiln_cfg__check_topology(loader *L)
{
	kiln_cfg *c = L->cfg;
	size_t n = c->n_switches;
	if (n == 0)
		return;
	_cleanup_free_ ssize_t *parent = malloc(n * sizeof(ssize_t));
	_cleanup_free_ ssize_t *leaf_of = malloc((c->n_nodes + 1) * sizeof(ssize_t));
	if (!parent || !leaf_of) {
		L->oom = 1;
		return;
	}
	for (size_t i = 0; i < n; i++)
		parent[i] = -1;
	for (size_t i = 0; i <= c->n_nodes; i++)
		leaf_of[i] = -1;

	for (size_t i = 0; i < n; i++) {
		const kiln_cfg_switch *sw = &c->switches[i];
		config_setting_t *e = L->switch_set[i];
		if (!e || !sw->name)
			continue;
		if (!valid_switch_name(sw->name))
			kiln_cfg__member_error(L, LIST, i, e, "name",
					       "1 to 63 letters, digits, '-', '_' and '.'",
					       "invalid switch name \"%s\"", sw->name);
		ssize_t first = find_switch(c, sw->name);
		if (first >= 0 && (size_t) first < i)
			kiln_cfg__member_error(
				L, LIST, i, e, "name", "give each switch its own name",
				"duplicate switch \"%s\" (also " LIST "[%zd], line %d)", sw->name,
				first, c->switches[first].line);
		if (!sw->nodes && !sw->switches)
			kiln_cfg__member_error(L, LIST, i, e, "name",
					       "a leaf switch lists nodes = \"...\", a higher one "
					       "switches = \"...\"",
					       "switch \"%s\" has neither nodes nor switches",
					       sw->name);
	}

	for (size_t i = 0; i < n; i++) {
		const kiln_cfg_switch *sw = &c->switches[i];
		config_setting_t *e = L->switch_set[i];
		if (!e || !sw->name)
			continue;
		char path[96];
		if (sw->nodes) {
			snprintf(path, sizeof(path), LIST "[%zu].nodes", i);
			int line = kiln_cfg__member_line(e, "nodes");
			_cleanup_strv_free_ char **v = NULL;
			size_t nv = 0;
			if (kiln_cfg__expand_hostlist(L, line, path, sw->nodes, &v, &nv) >= 0)
				for (size_t j = 0; j < nv; j++) {
					ssize_t ni =
						kiln_cfg__listed_node(L, v[j], line, path, "node");
					if (ni < 0)
						continue;
					if (leaf_of[ni] >= 0 && (size_t) leaf_of[ni] != i)
						kiln_cfg__add_error(
							L, line, path,
							"a node is cabled to one leaf switch",
							"node %s is under switch \"%s\" and \"%s\"",
							v[j], c->switches[leaf_of[ni]].name,
							sw->name);
					leaf_of[ni] = (ssize_t) i;
				}
		}
		if (sw->switches) {
			snprintf(path, sizeof(path), LIST "[%zu].switches", i);
			int line = kiln_cfg__member_line(e, "switches");
			_cleanup_strv_free_ char **v = NULL;
			size_t nv = 0;
			if (kiln_cfg__expand_hostlist(L, line, path, sw->switches, &v, &nv) < 0)
				continue;
			for (size_t j = 0; j < nv; j++) {
				ssize_t si = find_switch(c, v[j]);
				if (si < 0)
					kiln_cfg__add_error(L, line, path,
							    "every switch named here needs its own "
							    "entry in " LIST,
							    "unknown switch \"%s\"", v[j]);
				else if ((size_t) si == i)
					kiln_cfg__add_error(L, line, path, NULL,
							    "switch \"%s\" lists itself", v[j]);
				else if (parent[si] >= 0 && (size_t) parent[si] != i)
					kiln_cfg__add_error(
						L, line, path,
						"a tree: each switch under one parent",
						"switch \"%s\" is under \"%s\" and \"%s\"", v[j],
						c->switches[parent[si]].name, sw->name);
				else
					parent[si] = (ssize_t) i;
			}
		}
	}

	/* a loop: following parents from any switch must end within n steps */
	for (size_t i = 0; i < n; i++) {
		ssize_t s = (ssize_t) i;
		size_t steps = 0;
		while (s >= 0 && steps <= n) {
			s = parent[s];
			steps++;
		}
		if (s >= 0) {
			/* after n steps up, s is on the loop itself */
			kiln_cfg__add_error(L, c->switches[s].line, LIST, "a tree has no loops",
					    "switch \"%s\" is in a loop of switches, under itself",
					    c->switches[s].name);
			return;
		}
	}

	size_t unplaced = 0, first_unplaced = 0;
	for (size_t ni = 0; ni < c->n_nodes; ni++)
		if (leaf_of[ni] < 0 && unplaced++ == 0)
			first_unplaced = ni;
	if (unplaced > 0)
		kiln_cfg__add_warning(L, c->switches[0].line, LIST,
				      "add them to a leaf switch's nodes",
				      "%zu node%s under no switch (the first: %s): Slurm runs no "
				      "job across %s and the others",
				      unplaced, unplaced == 1 ? " is" : "s are",
				      c->nodes[first_unplaced].name, unplaced == 1 ? "it" : "them");
	ssize_t root = -1;
	for (size_t i = 0; i < n; i++) {
		if (parent[i] >= 0 || !c->switches[i].name)
			continue;
		if (root >= 0) {
			kiln_cfg__add_warning(
				L, c->switches[i].line, LIST,
				"add a switch above them (switches = \"...\")",
				"switches \"%s\" and \"%s\" have no common parent: no job spans "
				"nodes under both",
				c->switches[root].name, c->switches[i].name);
			break;
		}
		root = (ssize_t) i;
	}
}
