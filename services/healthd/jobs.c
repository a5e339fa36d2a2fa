/* jobs.c — which Slurm job a GPU's processes belong to.
 *
 * kiln-healthd shows the job ids on each GPU (metrics, /health, --check) so
 * that a fault is tied to the job it hit.  A process's job comes from its
 * cgroup (proctrack/cgroup puts it under ".../job_ID/step_N"), else from
 * SLURM_JOB_ID in its environment.  Library code: logs nothing. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "healthd.h"

/* The Slurm job of a process: from its cgroup path (".../job_123/step_0"
 * with proctrack/cgroup), else from SLURM_JOB_ID in its environment. */
int hd_job_of_pid(unsigned pid, char *buf, size_t len)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%u/cgroup", pid);
	_cleanup_free_ char *text = NULL;
	if (kiln_read_file(p, 64 * 1024, &text, NULL) >= 0) {
		const char *j = strstr(text, "/job_");
		if (j) {
			j += 5;
			size_t n = strspn(j, "0123456789");
			if (n > 0 && n < len) {
				memcpy(buf, j, n);
				buf[n] = 0;
				return 0;
			}
		}
	}
	snprintf(p, sizeof(p), "/proc/%u/environ", pid);
	_cleanup_free_ char *env = NULL;
	size_t envlen = 0;
	if (kiln_read_file(p, 1024 * 1024, &env, &envlen) < 0)
		return -ENOENT;
	for (size_t off = 0; off < envlen; off += strlen(env + off) + 1) {
		const char *v = startswith(env + off, "SLURM_JOB_ID=");
		if (v && *v && strspn(v, "0123456789") == strlen(v) && strlen(v) < len) {
			snprintf(buf, len, "%s", v);
			return 0;
		}
	}
	return -ENOENT;
}

/* Slurm job ids of the processes on a GPU, comma separated. */
void hd_job_ids(const hd_sample *s, char *buf, size_t len)
{
	buf[0] = 0;
	for (unsigned i = 0; i < s->n_pids; i++) {
		char j[24];
		if (hd_job_of_pid(s->pids[i], j, sizeof(j)) < 0)
			continue;
		char pat[32];
		snprintf(pat, sizeof(pat), ",%s,", j);
		char have[80];
		snprintf(have, sizeof(have), ",%s,", buf);
		if (strstr(have, pat) || strlen(buf) + strlen(j) + 2 > len)
			continue;
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? "," : "", j);
	}
}
