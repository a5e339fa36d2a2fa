/* check-nodes.c — node groups into nodes, across keys.
 *
 * Each group's hostlist is expanded, its addresses (a range or a list) and
 * MACs are matched to its hosts one for one, and the groups are flattened
 * into cfg->nodes.  Then what no group alone can show: the same host name,
 * MAC or address twice (or the head's), names that differ only in case
 * (DNS and /etc/hosts would take them for one), and host names that are not
 * DNS labels.  Sorted indexes keep this O(n log n) up to KILN_HOSTLIST_MAX
 * nodes, and kiln_cfg__node_index() looks names up for the partition and
 * inference checks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config-internal.h"
#include "kiln/hostlist.h"
#include "kiln/parse.h"

/* qsort_r comparators over node indexes; ties by index keep file order. */
static int cmp_index(size_t a, size_t b)
{
	return a < b ? -1 : a > b;
}
/* Host name order: case-insensitive, then exact (a total order, so that
 * kiln_cfg__node_index() can still look up an exact name). */
static int name_cmp(const char *a, const char *b)
{
	int r = strcasecmp(a, b);
	return r ? r : strcmp(a, b);
}
static int cmp_name(const void *x, const void *y, void *ctx)
{
	const kiln_cfg_node *n = ctx;
	size_t a = *(const size_t *) x, b = *(const size_t *) y;
	int r = name_cmp(n[a].name, n[b].name);
	return r ? r : cmp_index(a, b);
}
static int cmp_mac(const void *x, const void *y, void *ctx)
{
	const kiln_cfg_node *n = ctx;
	size_t a = *(const size_t *) x, b = *(const size_t *) y;
	int r = memcmp(n[a].mac, n[b].mac, 6);
	return r ? r : cmp_index(a, b);
}
static int cmp_addr(const void *x, const void *y, void *ctx)
{
	const kiln_cfg_node *n = ctx;
	size_t a = *(const size_t *) x, b = *(const size_t *) y;
	if (n[a].address != n[b].address)
		return n[a].address < n[b].address ? -1 : 1;
	return cmp_index(a, b);
}

/* The first node called name (binary search of name_idx), or -1. */
ssize_t kiln_cfg__node_index(loader *L, const char *name)
{
	const kiln_cfg *c = L->cfg;
	size_t lo = 0, hi = c->n_nodes;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (name_cmp(c->nodes[L->name_idx[mid]].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < c->n_nodes && streq(c->nodes[L->name_idx[lo]].name, name))
		return (ssize_t) L->name_idx[lo];
	return -1;
}

ssize_t kiln_cfg__listed_node(loader *L, const char *name, int line, const char *path,
			      const char *what)
{
	ssize_t ni = kiln_cfg__node_index(L, name);
	if (ni >= 0 || L->nodes_incomplete || kiln_cfg__errors_full(L))
		return ni;
	_cleanup_free_ char *h = kiln_cfg__hint_from(name, L->node_names);
	kiln_cfg__add_error(L, line, path, h, "unknown %s \"%s\"", what, name);
	return ni;
}

/* Expands a hostlist, reporting why it cannot be. */
int kiln_cfg__expand_hostlist(loader *L, int line, const char *path, const char *s, char ***ret,
			      size_t *ret_n)
{
	size_t pos = 0;
	int r = kiln_hostlist_expand(s, ret, ret_n, &pos);
	if (r == -ENOMEM)
		L->oom = 1;
	else if (r == -E2BIG)
		kiln_cfg__add_error(L, line, path, NULL,
				    "hostlist \"%s\" expands to more than %d names", s,
				    KILN_HOSTLIST_MAX);
	else if (r < 0 || *ret_n == 0) {
		kiln_cfg__add_error(L, line, path, "write it like \"node[01-16,20]\"",
				    "malformed hostlist \"%s\" at offset %zu", s, pos);
		strv_free(*ret);
		*ret = NULL;
		r = -EINVAL;
	}
	return r;
}

/* node_groups[].addresses written as a range "FIRST-LAST" for n_hosts
 * hosts: its first address and length, or -EINVAL (reported). */
static int address_range(loader *L, const char *str, int line, const char *path, size_t n_hosts,
			 uint32_t *ret_lo, size_t *ret_n)
{
	const char *dash = strchr(str, '-');
	char first[64];
	uint32_t lo, hi;
	if (!dash || (size_t) (dash - str) >= sizeof(first))
		goto bad_range;
	memcpy(first, str, (size_t) (dash - str));
	first[dash - str] = 0;
	if (kiln_parse_ipv4(first, &lo) < 0 || kiln_parse_ipv4(dash + 1, &hi) < 0)
		goto bad_range;
	if (hi < lo) {
		kiln_cfg__add_error(L, line, path, NULL, "range \"%s\" ends before it starts", str);
		return -EINVAL;
	}
	size_t n = (size_t) (hi - lo) + 1;
	if (n != n_hosts) {
		kiln_cfg__add_error(L, line, path, NULL,
				    "range \"%s\" has %zu addresses for %zu hosts", str, n,
				    n_hosts);
		return -EINVAL;
	}
	*ret_lo = lo;
	*ret_n = n;
	return 0;
bad_range:
	kiln_cfg__add_error(
		L, line, path,
		"write a range \"10.0.0.11-10.0.0.42\" or a list [ \"10.0.0.11\", ... ]",
		"malformed address range \"%s\"", str);
	return -EINVAL;
}

/* Reads node_groups[gi].addresses into g->addresses (n_hosts of them). */
static void group_addresses(loader *L, kiln_cfg_group *g, config_setting_t *s, const char *path)
{
	int line = kiln_cfg__setting_line(s);
	_cleanup_strv_free_ char **v = NULL; /* the list form; NULL for a range */
	uint32_t lo = 0;
	size_t n;
	if (config_setting_type(s) == CONFIG_TYPE_STRING) {
		if (address_range(L, config_setting_get_string(s), line, path, g->n_hosts, &lo,
				  &n) < 0)
			return;
	} else {
		if (kiln_cfg__read_string_array(L, s, path, KILN_CFG_ADDRESSES, &v) < 0)
			return;
		n = strv_length(v);
		if (n != g->n_hosts) {
			kiln_cfg__add_error(L, line, path, NULL, "%zu addresses for %zu hosts", n,
					    g->n_hosts);
			return;
		}
	}
	_cleanup_free_ uint32_t *a = calloc(n ? n : 1, sizeof(uint32_t));
	if (!a) {
		L->oom = 1;
		return;
	}
	if (!v) {
		/* A range: one error, for its first address that is not usable. */
		for (size_t i = 0; i < n; i++)
			a[i] = lo + (uint32_t) i;
		for (size_t i = 0; i < n; i++)
			if (!L->cfg->network.prefix || !kiln_cfg__usable_address(L->cfg, a[i])) {
				kiln_cfg__check_address(L, a[i], line, path);
				break;
			}
		g->addresses = TAKE_PTR(a);
		return;
	}
	bool ok = true;
	for (size_t i = 0; i < n; i++) {
		if (kiln_parse_ipv4(v[i], &a[i]) < 0) {
			kiln_cfg__elem_error(L, s, path, i, NULL, "malformed IPv4 address \"%s\"",
					     v[i]);
			ok = false;
			continue;
		}
		if (L->cfg->network.prefix && !kiln_cfg__usable_address(L->cfg, a[i])) {
			char p[640];
			snprintf(p, sizeof(p), "%s[%zu]", path, i);
			kiln_cfg__check_address(L, a[i], kiln_cfg__elem_line(s, i), p);
		}
	}
	if (ok)
		g->addresses = TAKE_PTR(a);
}

/* Reads node_groups[gi].macs into g->macs (n_hosts of them). */
static void group_macs(loader *L, kiln_cfg_group *g, config_setting_t *s, const char *path)
{
	_cleanup_strv_free_ char **v = NULL;
	if (kiln_cfg__read_string_array(L, s, path, KILN_CFG_MACS, &v) < 0)
		return;
	size_t n = strv_length(v);
	uint8_t(*m)[6] = calloc(n ? n : 1, 6);
	if (!m) {
		L->oom = 1;
		return;
	}
	bool ok = true;
	for (size_t i = 0; i < n; i++)
		if (kiln_parse_mac(v[i], m[i]) < 0) {
			kiln_cfg__elem_error(L, s, path, i, "write it like \"52:54:00:12:34:56\"",
					     "malformed MAC address \"%s\"", v[i]);
			ok = false;
		} else if ((m[i][0] & 1) || !memcmp(m[i], (const uint8_t[6]){ 0 }, 6)) {
			/* A NIC never has a multicast/broadcast or all-zero
			 * address: DHCP would never match it. */
			kiln_cfg__elem_error(L, s, path, i,
					     "give the node's boot NIC address (ip link shows it)",
					     "MAC address \"%s\" is %s, not a NIC's", v[i],
					     (m[i][0] & 1) ? "multicast or broadcast" : "all zero");
			ok = false;
		}
	if (ok && n != g->n_hosts)
		kiln_cfg__add_error(L, kiln_cfg__setting_line(s), path,
				    "give exactly one MAC per host, in host order",
				    "%zu MACs for %zu hosts", n, g->n_hosts);
	if (!ok || n != g->n_hosts) {
		free(m);
		return;
	}
	g->macs = m;
}

void kiln_cfg__check_group_words(loader *L)
{
	kiln_cfg *c = L->cfg;
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		config_setting_t *gs = L->group_set[gi];
		char p[96];
		if (!gs)
			continue;
		if (g->name && !kiln_cfg__valid_name(g->name))
			kiln_cfg__member_error(L, "node_groups", gi, gs, "name", KILN_CFG_NAME_HINT,
					       "invalid group name \"%s\"", g->name);
		snprintf(p, sizeof(p), "node_groups[%zu].gpus.type", gi);
		config_setting_t *gp = config_setting_get_member(gs, "gpus");
		kiln_cfg__check_word(L, kiln_cfg__member_line(gp ? gp : gs, "type"), p, g->gpu_type,
				     "_.-");
		for (size_t j = 0; g->features && g->features[j]; j++) {
			snprintf(p, sizeof(p), "node_groups[%zu].features[%zu]", gi, j);
			kiln_cfg__check_word(
				L,
				kiln_cfg__elem_line(config_setting_get_member(gs, "features"), j),
				p, g->features[j], "_.-");
		}
	}
}

/* Groups: expand hosts, addresses, MACs; *ret_total is the node count.
 * -E2BIG (reported) when the cluster has too many nodes.  Derived values
 * (gpus.type, cpus) come later, in derive.c. */
/* gpus.socket_map "0,0,0,0,1,1,1,1": one socket per GPU, each below
 * sockets, into g->gpu_socket (derive.c fills the default). */
static void parse_socket_map(loader *L, kiln_cfg_group *g, config_setting_t *gp, const char *gpath)
{
	char p[96];
	snprintf(p, sizeof(p), "%s.gpus.socket_map", gpath);
	int line = kiln_cfg__member_line(gp, "socket_map"), n = 0;
	const char *s = g->gpu_socket_map;
	while (*s) {
		size_t l = strcspn(s, ",");
		char w[16];
		int v;
		snprintf(w, sizeof(w), "%.*s", (int) MIN(l, sizeof(w) - 1), s);
		if (l == 0 || l >= sizeof(w) || kiln_parse_int(w, 0, g->sockets - 1, &v) < 0) {
			kiln_cfg__add_error(L, line, p,
					    "give one socket number per GPU, comma separated, e.g. "
					    "\"0,0,0,0,1,1,1,1\"",
					    "\"%.*s\" is not a socket of this group (0..%d)",
					    (int) l, s, g->sockets - 1);
			return;
		}
		if (n < KILN_CFG_GPUS_MAX)
			g->gpu_socket[n] = v;
		n++;
		s += l;
		if (*s == ',')
			s++;
	}
	if (n != g->gpu_count)
		kiln_cfg__add_error(L, line, p, "give one socket number per GPU, in GPU order",
				    "%d socket(s) for %d GPUs", n, g->gpu_count);
}

static int check_groups(loader *L, size_t *ret_total)
{
	kiln_cfg *c = L->cfg;
	size_t total = 0;
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		config_setting_t *gs = L->group_set[gi];
		char gpath[64];
		snprintf(gpath, sizeof(gpath), "node_groups[%zu]", gi);
		if (!gs) {
			L->nodes_incomplete = true;
			continue;
		}
		if (g->hosts && total >= KILN_HOSTLIST_MAX) {
			kiln_cfg__member_error(L, "node_groups", gi, gs, "hosts", NULL,
					       "the cluster has more than %d nodes",
					       KILN_HOSTLIST_MAX);
		} else if (g->hosts) {
			char p[96];
			size_t nh = 0;
			snprintf(p, sizeof(p), "%s.hosts", gpath);
			if (kiln_cfg__expand_hostlist(L, kiln_cfg__member_line(gs, "hosts"), p,
						      g->hosts, &g->hostnames, &nh) < 0)
				g->hostnames = NULL;
			g->n_hosts = g->hostnames ? nh : 0;
		}
		if (!g->hostnames) {
			L->nodes_incomplete = true;
			continue;
		}
		/* Missing addresses or MACs were reported by the walk. */
		char p[96];
		snprintf(p, sizeof(p), "%s.addresses", gpath);
		if (L->addr_set[gi])
			group_addresses(L, g, L->addr_set[gi], p);
		snprintf(p, sizeof(p), "%s.macs", gpath);
		if (L->mac_set[gi])
			group_macs(L, g, L->mac_set[gi], p);
		if (g->memory_mb < 1)
			kiln_cfg__member_error(L, "node_groups", gi, gs, "memory_mb", NULL,
					       "must be at least 1 MiB");
		else if (g->memory_mb > KILN_CFG_MEMORY_MB_MAX)
			kiln_cfg__member_error(
				L, "node_groups", gi, gs, "memory_mb",
				"memory_mb is in MiB (2 TiB is 2097152 or \"2T\"); no server has "
				"more than 64 TiB",
				"%llu MiB is more than the limit of %llu MiB (64 TiB)",
				(unsigned long long) g->memory_mb,
				(unsigned long long) KILN_CFG_MEMORY_MB_MAX);
		/* model without count: count defaults to 0, so the nodes would have no
		 * GPU in Slurm and the health check would expect none */
		config_setting_t *gp = config_setting_get_member(gs, "gpus");
		if (g->gpu_model && gp && !config_setting_get_member(gp, "count")) {
			char cp[96];
			snprintf(cp, sizeof(cp), "%s.gpus.count", gpath);
			kiln_cfg__add_error(L, kiln_cfg__member_line(gp, "model"), cp,
					    "set count to the GPUs per node (e.g. count = 8;), or "
					    "remove gpus for nodes without GPUs",
					    "gpus.model \"%s\" is set but gpus.count is not: the "
					    "nodes would have 0 GPUs",
					    g->gpu_model);
		}
		if (g->gpu_socket_map && gp)
			parse_socket_map(L, g, gp, gpath);
		int prod = g->sockets * g->cores_per_socket * g->threads_per_core;
		if (g->cpus != 0 && g->cpus != prod && g->cpus != g->sockets * g->cores_per_socket)
			kiln_cfg__member_error(
				L, "node_groups", gi, gs, "cpus",
				"Slurm needs cpus = sockets x cores_per_socket x threads_per_core",
				"%d CPUs do not match %d sockets x %d cores x %d threads", g->cpus,
				g->sockets, g->cores_per_socket, g->threads_per_core);
		for (size_t j = 0; j < gi; j++)
			if (c->groups[j].name && g->name && streq(c->groups[j].name, g->name))
				kiln_cfg__member_error(
					L, "node_groups", gi, gs, "name", NULL,
					"duplicate group name \"%s\" (first at line %d)", g->name,
					c->groups[j].line);
		total += g->n_hosts;
	}
	if (total > KILN_HOSTLIST_MAX) {
		kiln_cfg__root_error(L, "node_groups", NULL, "more than %d nodes",
				     KILN_HOSTLIST_MAX);
		return -E2BIG;
	}
	*ret_total = total;
	return 0;
}

/* cfg->nodes: every host of every group, file order (only groups whose
 * addresses and MACs are good get them). */
static int flatten_nodes(loader *L, size_t total)
{
	kiln_cfg *c = L->cfg;
	c->nodes = calloc(total ? total : 1, sizeof(*c->nodes));
	if (!c->nodes) {
		L->oom = 1;
		return -ENOMEM;
	}
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		kiln_cfg_group *g = &c->groups[gi];
		if (!g->hostnames)
			continue;
		for (size_t i = 0; i < g->n_hosts; i++) {
			kiln_cfg_node *n = &c->nodes[c->n_nodes++];
			n->name = g->hostnames[i];
			n->group = g;
			n->index_in_group = i;
			if (g->addresses)
				n->address = g->addresses[i];
			if (g->macs)
				memcpy(n->mac, g->macs[i], 6);
		}
	}
	return 0;
}

/* Duplicates: names, MACs, addresses, against each other and the head. */
/* MACs (by_mac) or addresses: the nodes whose group lists them, sorted by
 * them (ties in file order), so each node equal to the first of its run is
 * a duplicate, named in the error.  ix: room for every node. */
static void check_unique(loader *L, size_t *ix, bool by_mac)
{
	const kiln_cfg *c = L->cfg;
	size_t m = 0;
	for (size_t a = 0; a < c->n_nodes; a++)
		if (by_mac ? c->nodes[a].group->macs != NULL : c->nodes[a].group->addresses != NULL)
			ix[m++] = a;
	qsort_r(ix, m, sizeof(size_t), by_mac ? cmp_mac : cmp_addr, (void *) c->nodes);
	for (size_t k = 1, first = 0; k < m; k++) {
		const kiln_cfg_node *n = &c->nodes[ix[k]], *o = &c->nodes[ix[first]];
		if (by_mac ? memcmp(n->mac, o->mac, 6) != 0 : n->address != o->address) {
			first = k;
			continue;
		}
		size_t gi = (size_t) (n->group - c->groups);
		char p[64], b[18];
		if (by_mac) {
			snprintf(p, sizeof(p), "node_groups[%zu].macs", gi);
			kiln_cfg__elem_error(L, L->mac_set[gi], p, n->index_in_group, NULL,
					     "duplicate MAC %s (also %s)",
					     kiln_format_mac(b, n->mac), o->name);
		} else
			kiln_cfg__member_error(L, "node_groups", gi, L->group_set[gi], "addresses",
					       NULL, "duplicate address %s (%s and %s)",
					       kiln_format_ipv4(b, n->address), o->name, n->name);
	}
}

static int check_duplicates(loader *L)
{
	kiln_cfg *c = L->cfg;
	char b1[16];
	L->name_idx = malloc((c->n_nodes ? c->n_nodes : 1) * sizeof(size_t));
	_cleanup_free_ size_t *ix = malloc((c->n_nodes ? c->n_nodes : 1) * sizeof(size_t));
	if (!L->name_idx || !ix) {
		L->oom = 1;
		return -ENOMEM;
	}
	for (size_t a = 0; a < c->n_nodes; a++) {
		kiln_cfg_node *n = &c->nodes[a];
		size_t gi = (size_t) (n->group - c->groups);
		config_setting_t *gs = L->group_set[gi];
		L->name_idx[a] = a;
		if (c->head.hostname && strcasecmp(n->name, c->head.hostname) == 0) {
			if (streq(n->name, c->head.hostname))
				kiln_cfg__member_error(L, "node_groups", gi, gs, "hosts", NULL,
						       "host name \"%s\" is also the head node's",
						       n->name);
			else
				kiln_cfg__member_error(
					L, "node_groups", gi, gs, "hosts",
					"DNS and /etc/hosts ignore case; rename one of them",
					"host name \"%s\" differs from the head node's \"%s\" only "
					"in case",
					n->name, c->head.hostname);
		}
		if (n->group->addresses && n->address == c->head.address)
			kiln_cfg__member_error(L, "node_groups", gi, gs, "addresses", NULL,
					       "address %s of %s is also the head node's",
					       kiln_format_ipv4(b1, n->address), n->name);
	}
	/* Sorted case-insensitively first, so names DNS and /etc/hosts would
	 * take for one ("node01", "NODE01") end up next to each other. */
	qsort_r(L->name_idx, c->n_nodes, sizeof(size_t), cmp_name, c->nodes);
	for (size_t k = 1; k < c->n_nodes; k++) {
		const kiln_cfg_node *n = &c->nodes[L->name_idx[k]];
		const kiln_cfg_node *o = &c->nodes[L->name_idx[k - 1]];
		if (strcasecmp(n->name, o->name) != 0)
			continue;
		if (n < o) { /* report the one later in the file */
			const kiln_cfg_node *t = n;
			n = o;
			o = t;
		}
		size_t gi = (size_t) (n->group - c->groups);
		size_t ogi = (size_t) (o->group - c->groups);
		int oline = kiln_cfg__member_line(L->group_set[ogi], "hosts");
		if (streq(n->name, o->name))
			kiln_cfg__member_error(
				L, "node_groups", gi, L->group_set[gi], "hosts",
				"a host belongs to exactly one group, once",
				"duplicate host name \"%s\" (also in node_groups[%zu], line %d)",
				n->name, ogi, oline);
		else
			kiln_cfg__member_error(
				L, "node_groups", gi, L->group_set[gi], "hosts",
				"DNS and /etc/hosts ignore case; rename one of them",
				"host name \"%s\" differs from \"%s\" (node_groups[%zu], line %d) "
				"only in case",
				n->name, o->name, ogi, oline);
	}
	/* After the duplicate checks, so that a case-only collision is still
	 * named; one error per group, for the first bad name. */
	for (size_t gi = 0; gi < c->n_groups; gi++) {
		const kiln_cfg_group *g = &c->groups[gi];
		size_t nbad = 0;
		const char *first = NULL;
		for (size_t i = 0; g->hostnames && i < g->n_hosts; i++)
			if (!kiln_cfg__valid_host_name(g->hostnames[i]) && nbad++ == 0)
				first = g->hostnames[i];
		if (!first)
			continue;
		char more[64] = "";
		if (nbad > 1)
			snprintf(more, sizeof(more), " (and %zu more in this group)", nbad - 1);
		kiln_cfg__member_error(L, "node_groups", gi, L->group_set[gi], "hosts",
				       KILN_CFG_HOST_NAME_HINT,
				       "host name \"%s\" is not a valid DNS label%s", first, more);
	}
	check_unique(L, ix, true);
	check_unique(L, ix, false);
	return 0;
}

int kiln_cfg__check_nodes(loader *L)
{
	size_t total = 0;
	int r = check_groups(L, &total);
	if (r < 0)
		return r;
	r = flatten_nodes(L, total);
	if (r < 0)
		return r;
	return check_duplicates(L);
}
