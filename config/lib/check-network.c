/* check-network.c — the cluster's identity and network, across keys.
 *
 * The cluster name and DNS domain, the head node's name and address, and
 * every address the file holds: inside network.subnet and neither its
 * network nor its broadcast address (node addresses are checked here too,
 * from check-nodes.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config-internal.h"
#include "kiln/hostlist.h"
#include "kiln/parse.h"

static bool in_subnet(const kiln_cfg *c, uint32_t a)
{
	return (a & c->network.netmask) == c->network.subnet;
}
bool kiln_cfg__usable_address(const kiln_cfg *c, uint32_t a)
{
	return in_subnet(c, a) && a != c->network.subnet &&
	       a != (c->network.subnet | ~c->network.netmask);
}

void kiln_cfg__check_address(loader *L, uint32_t a, int line, const char *path)
{
	kiln_cfg *c = L->cfg;
	char b[16], n[16];
	if (!c->network.prefix)
		return; /* subnet itself was bad: already reported */
	if (!in_subnet(c, a))
		kiln_cfg__add_error(L, line, path, NULL, "address %s is outside the subnet %s/%d",
				    kiln_format_ipv4(b, a), kiln_format_ipv4(n, c->network.subnet),
				    c->network.prefix);
	else if (!kiln_cfg__usable_address(c, a))
		kiln_cfg__add_error(L, line, path, NULL,
				    "address %s is the network or broadcast address of %s/%d",
				    kiln_format_ipv4(b, a), kiln_format_ipv4(n, c->network.subnet),
				    c->network.prefix);
}

void kiln_cfg__check_cluster_name(loader *L)
{
	kiln_cfg *c = L->cfg;
	if (c->cluster.name && !kiln_cfg__valid_name(c->cluster.name))
		kiln_cfg__root_error(L, "cluster.name", KILN_CFG_NAME_HINT,
				     "invalid cluster name \"%s\"", c->cluster.name);
}

/* Values written unquoted into generated files. */
void kiln_cfg__check_network_words(loader *L)
{
	kiln_cfg *c = L->cfg;
	kiln_cfg__check_root_word(L, "cluster.domain", ".-");
	if (c->cluster.domain && c->cluster.domain[0] &&
	    !kiln_cfg__has_bad_char(c->cluster.domain, ".-") &&
	    !kiln_cfg__valid_domain(c->cluster.domain))
		kiln_cfg__root_error(
			L, "cluster.domain",
			"use dot-separated labels of 1 to 63 letters, digits and '-', none "
			"starting or ending with '-'",
			"invalid DNS domain \"%s\"", c->cluster.domain);
	kiln_cfg__check_root_word(L, "network.boot_interface", "._:-@");
}

/* Network and head (their defaults from head.address come in derive.c). */
void kiln_cfg__check_network(loader *L)
{
	kiln_cfg *c = L->cfg;
	if (c->head.address && c->network.prefix)
		kiln_cfg__check_address(L, c->head.address, kiln_cfg__root_line(L, "head.address"),
					"head.address");
	if (c->network.gateway && c->network.prefix)
		kiln_cfg__check_address(L, c->network.gateway,
					kiln_cfg__root_line(L, "network.gateway"),
					"network.gateway");
	if (c->head.hostname) {
		char **v = NULL;
		size_t nv = 0;
		if (kiln_hostlist_expand(c->head.hostname, &v, &nv, NULL) < 0 || nv != 1 ||
		    !streq(v[0], c->head.hostname))
			kiln_cfg__root_error(L, "head.hostname", NULL, "invalid host name \"%s\"",
					     c->head.hostname);
		else if (!kiln_cfg__valid_host_name(c->head.hostname))
			kiln_cfg__root_error(L, "head.hostname", KILN_CFG_HOST_NAME_HINT,
					     "host name \"%s\" is not a valid DNS label",
					     c->head.hostname);
		strv_free(v);
	}
}
