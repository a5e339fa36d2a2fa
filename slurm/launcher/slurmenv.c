/* slurmenv.c — the job as Slurm describes it.
 *
 * The node list comes from SLURM_JOB_NODELIST, expanded with libslurm's
 * hostlist (the same code slurmctld uses), so node order is Slurm's node
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
#include <slurm/slurm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/hostlist.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
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

static int expand_slurm(const char *list, char ***ret, size_t *ret_n)
{
	hostlist_t hl = slurm_hostlist_create(list);
	if (!hl)
		return -EINVAL;
	_cleanup_strv_free_ char **v = NULL;
	size_t n = 0;
	char *h;
	int r = 0;
	while ((h = slurm_hostlist_shift(hl))) {
		if (n >= KILN_HOSTLIST_MAX)
			r = -E2BIG;
		else if (strv_extend(&v, h) < 0)
			r = -ENOMEM;
		else
			n++;
		free(h);
		if (r < 0)
			break;
	}
	slurm_hostlist_destroy(hl);
	if (r < 0)
		return r;
	if (n == 0)
		return -EINVAL;
	*ret = TAKE_PTR(v);
	*ret_n = n;
	return 0;
}

int kr_job_from_slurm(kr_job *ret, char *err, size_t errlen)
{
	const char *jobid = getenv("SLURM_JOB_ID");
	const char *list = getenv("SLURM_JOB_NODELIST");
	const char *self = getenv("SLURMD_NODENAME");
	if (!list)
		list = getenv("SLURM_NODELIST");
	if (!jobid || !list || !self) {
		snprintf(err, errlen,
			 "SLURM_JOB_ID, SLURM_JOB_NODELIST or SLURMD_NODENAME is not set");
		return -ENOENT;
	}
	slurm_init(NULL);
	kr_job j = { 0 };
	int r = expand_slurm(list, &j.nodes, &j.n);
	if (r < 0) {
		snprintf(err, errlen, "cannot expand SLURM_JOB_NODELIST '%s'", list);
		return r;
	}
	j.self = SIZE_MAX;
	for (size_t i = 0; i < j.n; i++)
		if (streq(j.nodes[i], self))
			j.self = i;
	if (j.self == SIZE_MAX) {
		snprintf(err, errlen, "this node (%s) is not in SLURM_JOB_NODELIST '%s'", self,
			 list);
		kr_job_done(&j);
		return -ENOENT;
	}
	j.job_id = strdup(jobid);
	j.addrs = calloc(j.n + 1, sizeof(char *));
	if (!j.job_id || !j.addrs) {
		kr_job_done(&j);
		return -ENOMEM;
	}
	node_info_msg_t *ni = NULL;
	if (slurm_load_node(0, &ni, SHOW_ALL) != 0)
		ni = NULL;
	for (size_t i = 0; i < j.n; i++) {
		char buf[16] = "";
		const char *addr = NULL;
		for (uint32_t k = 0; ni && k < ni->record_count; k++)
			if (ni->node_array[k].name && streq(ni->node_array[k].name, j.nodes[i]))
				addr = ni->node_array[k].node_addr;
		r = resolve(addr ? addr : j.nodes[i], buf);
		if (r < 0) {
			snprintf(err, errlen,
				 "cannot find the address of node %s (NodeAddr or DNS)",
				 j.nodes[i]);
			if (ni)
				slurm_free_node_info_msg(ni);
			kr_job_done(&j);
			return r;
		}
		j.addrs[i] = strdup(buf);
		if (!j.addrs[i]) {
			if (ni)
				slurm_free_node_info_msg(ni);
			kr_job_done(&j);
			return -ENOMEM;
		}
	}
	if (ni)
		slurm_free_node_info_msg(ni);
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

int kr_job_sim(const char *hostlist, const char *id, kr_job *ret, char *err, size_t errlen)
{
	kr_job j = { .sim = true };
	size_t pos = 0;
	int r = kiln_hostlist_expand(hostlist, &j.nodes, &j.n, &pos);
	if (r < 0) {
		snprintf(err, errlen, "bad %s '%s'", KR_ENV_SIM_NODES, hostlist);
		return r;
	}
	int v;
	r = kiln_parse_int(id ? id : "", 0, (int) j.n - 1, &v);
	if (r < 0) {
		snprintf(err, errlen, "bad %s '%s' (0..%zu)", KR_ENV_SIM_NODE_ID, strempty(id),
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

int kr_slurm_requeue(const char *job_id)
{
	uint64_t id;
	int r = kiln_parse_uint64(job_id ? job_id : "", UINT32_MAX, &id);
	if (r < 0)
		return r;
	if (slurm_requeue((uint32_t) id, 0) != 0)
		return -errno ? -errno : -EIO;
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
