/* slurmenv.c — the job as Slurm describes it.
 *
 * The node list comes from SLURM_JOB_NODELIST, expanded with libslurm's
 * hostlist (the same code slurmctld uses, through libkiln-slurm), so node order is Slurm's node
 * order and no host name is guessed.  This node's id is its position in
 * that list (SLURMD_NODENAME), not the step-relative SLURM_NODEID, so that
 * agents started by different job steps (a node added later) agree.  Node
 * addresses come from slurmctld (NodeAddr), falling back to DNS. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/hostlist.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/slurm.h"
#include "kiln/strbuf.h"
#include "launcher.h"

void kr_job_done(kr_job *j)
{
	if (!j)
		return;
	free(j->job_id);
	strv_free(j->nodes);
	strv_free(j->addrs);
	*j = (kr_job){ 0 };
}

static int resolve(const char *name, char buf[static 16])
{
	uint32_t a;
	if (kiln_parse_ipv4(name, &a) == 0) {
		kiln_format_ipv4(buf, a);
		return 0;
	}
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
	if (getaddrinfo(name, NULL, &hints, &res) != 0 || !res)
		return -EHOSTUNREACH;
	inet_ntop(AF_INET, &((struct sockaddr_in *) res->ai_addr)->sin_addr, buf, 16);
	freeaddrinfo(res);
	return 0;
}

int kr_job_from_slurm(kr_job *ret, kiln_error *err)
{
	kiln_slurm_env env;
	int r = kiln_slurm_env_read(&env, err);
	if (r < 0)
		return r;
	kr_job j = { 0 };
	r = kiln_slurm_hostlist_expand(env.nodelist, &j.nodes, &j.n);
	if (r < 0)
		return kiln_error_setf(err, r, "cannot expand SLURM_JOB_NODELIST '%s'",
				       env.nodelist);
	j.self = SIZE_MAX;
	for (size_t i = 0; i < j.n; i++)
		if (streq(j.nodes[i], env.node))
			j.self = i;
	if (j.self == SIZE_MAX) {
		kr_job_done(&j);
		return kiln_error_setf(err, -ENOENT,
				       "this node (%s) is not in SLURM_JOB_NODELIST '%s'", env.node,
				       env.nodelist);
	}
	j.job_id = strdup(env.job_id);
	j.addrs = calloc(j.n + 1, sizeof(char *));
	if (!j.job_id || !j.addrs) {
		kr_job_done(&j);
		return -ENOMEM;
	}
	/* NodeAddr when slurmctld answers; DNS for the rest */
	kiln_slurm_nodes *ni = NULL;
	if (kiln_slurm_nodes_load(NULL, &ni, NULL) < 0)
		ni = NULL;
	for (size_t i = 0; i < j.n && r >= 0; i++) {
		char buf[16] = "";
		const kiln_slurm_node *k = kiln_slurm_nodes_find(ni, j.nodes[i]);
		r = resolve(k && k->addr ? k->addr : j.nodes[i], buf);
		if (r < 0)
			kiln_error_setf(err, r,
					"cannot find the address of node %s (NodeAddr or DNS)",
					j.nodes[i]);
		else if (!(j.addrs[i] = strdup(buf)))
			r = -ENOMEM;
	}
	kiln_slurm_nodes_free(ni);
	if (r < 0) {
		kr_job_done(&j);
		return r;
	}
	*ret = j;
	return 0;
}

int kr_job_standalone(kr_job *ret)
{
	kr_job j = { .n = 1, .self = 0 };
	char host[256] = "localhost";
	gethostname(host, sizeof(host) - 1);
	if (strv_extend(&j.nodes, host) < 0 || strv_extend(&j.addrs, "127.0.0.1") < 0) {
		kr_job_done(&j);
		return -ENOMEM;
	}
	*ret = j;
	return 0;
}

int kr_job_sim(const char *hostlist, const char *id, kr_job *ret, kiln_error *err)
{
	kr_job j = { .sim = true };
	size_t pos = 0;
	int r = kiln_hostlist_expand(hostlist, &j.nodes, &j.n, &pos);
	if (r < 0)
		return kiln_error_setf(err, r, "bad %s '%s'", KR_ENV_SIM_NODES, hostlist);
	int v;
	r = kiln_parse_int(id ? id : "", 0, (int) j.n - 1, &v);
	if (r < 0) {
		kiln_error_setf(err, r, "bad %s '%s' (0..%zu)", KR_ENV_SIM_NODE_ID, strempty(id),
				j.n - 1);
		kr_job_done(&j);
		return r;
	}
	j.self = (size_t) v;
	for (size_t i = 0; i < j.n; i++)
		if (strv_extend(&j.addrs, "127.0.0.1") < 0) {
			kr_job_done(&j);
			return -ENOMEM;
		}
	char buf[64];
	snprintf(buf, sizeof(buf), "sim-%d", (int) getuid());
	j.job_id = strdup(buf);
	*ret = j;
	return 0;
}

int kr_count_gpus(void)
{
	DIR *d = opendir("/dev");
	if (!d)
		return 0;
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		const char *p = startswith(de->d_name, "nvidia");
		if (p && *p >= '0' && *p <= '9')
			n++;
	}
	closedir(d);
	return n;
}

int kr_ifname_for_addr(const char *addr, char *buf, size_t len)
{
	struct in_addr want;
	if (inet_pton(AF_INET, addr, &want) != 1)
		return -EINVAL;
	struct ifaddrs *ifa = NULL;
	if (getifaddrs(&ifa) < 0)
		return -errno;
	int r = -ENOENT;
	for (struct ifaddrs *i = ifa; i; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *) i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
			snprintf(buf, len, "%s", i->ifa_name);
			r = 0;
			break;
		}
	freeifaddrs(ifa);
	return r;
}
