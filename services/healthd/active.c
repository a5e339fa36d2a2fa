/* active.c — runs the active GPU checks (kiln-healthd-active) for one GPU.
 *
 * The checks live in their own program (see active-main.c for why); this
 * side starts it next to our own binary with CUDA_VISIBLE_DEVICES naming the
 * GPU (CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA's numbering is NVML's), reads its
 * result lines, and kills it when it overruns its budget.  Without a GPU, or
 * without the helper, every check reports "skipped", never "passed". */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "healthd.h"

/* GEMM burn + bandwidth + memtest setup time on top of gemm_seconds. */
#define HD_ACTIVE_SLACK_USEC (120 * KILN_USEC_PER_SEC)

static const char *const names[HD_ACTIVE_CHECKS] = { "gemm", "bandwidth", "memtest" };

static void all(hd_active_result out[HD_ACTIVE_CHECKS], const char *status, const char *detail)
{
	for (int i = 0; i < HD_ACTIVE_CHECKS; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].name = names[i];
		out[i].status = status;
		snprintf(out[i].detail, sizeof(out[i].detail), "%s", detail);
	}
}

static int helper_path(char *buf, size_t len)
{
	const char *env = getenv("KILN_HEALTHD_ACTIVE");
	if (env && *env)
		return snprintf(buf, len, "%s", env), 0;
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return -errno;
	self[n] = 0;
	char *slash = strrchr(self, '/');
	if (!slash)
		return -ENOENT;
	*slash = 0;
	if (strlen(self) + sizeof("/kiln-healthd-active") > len)
		return -ENAMETOOLONG;
	strcpy(buf, self);
	strcat(buf, "/kiln-healthd-active");
	return access(buf, X_OK) == 0 ? 0 : -ENOENT;
}

static void parse_line(char *line, hd_active_result out[HD_ACTIVE_CHECKS])
{
	char *f[5], *rest = line;
	int n = 0;
	while (n < 4 && rest)
		f[n++] = strsep(&rest, "\t");
	if (rest)
		f[n++] = rest;
	if (n < 4)
		return;
	for (int i = 0; i < HD_ACTIVE_CHECKS; i++) {
		if (!streq(f[0], names[i]))
			continue;
		out[i].status = streq(f[1], "passed")	? "passed"
				: streq(f[1], "failed") ? "failed"
							: "skipped";
		out[i].value = strtod(f[2], NULL);
		out[i].expected = strtod(f[3], NULL);
		snprintf(out[i].detail, sizeof(out[i].detail), "%s", n > 4 ? f[4] : "");
	}
}

int hd_active_run(const hd_settings *s, int gpu, const char *model, uint64_t mem_free,
		  hd_active_result out[HD_ACTIVE_CHECKS])
{
	if (gpu < 0) {
		all(out, "skipped", "no GPU present");
		return 0;
	}
	char path[4096];
	if (helper_path(path, sizeof(path)) < 0) {
		all(out, "skipped", "kiln-healthd-active is not installed next to kiln-healthd");
		return 0;
	}
	all(out, "failed", "the check program ended without a result");
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	char gpus[16], secs[16], bytes[32];
	snprintf(gpus, sizeof(gpus), "%d", gpu);
	snprintf(secs, sizeof(secs), "%d", s->gemm_seconds > 0 ? s->gemm_seconds : 10);
	snprintf(bytes, sizeof(bytes), "%llu",
		 (unsigned long long) (mem_free ? (uint64_t) (mem_free * s->memtest_fraction)
						: (1ULL << 30)));
	pid_t pid = fork();
	if (pid < 0) {
		close(p[0]), close(p[1]);
		return -errno;
	}
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
		setenv("CUDA_VISIBLE_DEVICES", gpus, 1);
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the daemon */
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execl(path, path, "--model", model ? model : "", "--gemm-seconds", secs,
		      "--memtest-bytes", bytes, (char *) NULL);
		_exit(127);
	}
	close(p[1]);
	char buf[4096];
	size_t len = 0;
	uint64_t deadline =
		kiln_now_usec() +
		(uint64_t) (s->gemm_seconds > 0 ? s->gemm_seconds : 10) * KILN_USEC_PER_SEC +
		HD_ACTIVE_SLACK_USEC;
	bool timed_out = false;
	for (;;) {
		uint64_t now = kiln_now_usec();
		if (now >= deadline) {
			timed_out = true;
			break;
		}
		struct pollfd pfd = { .fd = p[0], .events = POLLIN };
		int r = poll(&pfd, 1, (int) MIN((deadline - now) / 1000 + 1, 1000));
		if (r < 0 && errno != EINTR)
			break;
		if (r <= 0)
			continue;
		ssize_t n = read(p[0], buf + len, sizeof(buf) - 1 - len);
		if (n <= 0)
			break;
		len += (size_t) n;
		if (len >= sizeof(buf) - 1)
			break;
	}
	close(p[0]);
	if (timed_out)
		kill(pid, SIGKILL);
	int status = 0;
	waitpid(pid, &status, 0);
	if (timed_out) {
		all(out, "failed", "the active checks did not finish in time: the GPU may be hung");
		return 0;
	}
	buf[len] = 0;
	char *save = NULL;
	for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
		parse_line(l, out);
	if (WIFSIGNALED(status))
		for (int i = 0; i < HD_ACTIVE_CHECKS; i++)
			if (streq(out[i].status, "failed") &&
			    streq(out[i].detail, "the check program ended without a result"))
				snprintf(out[i].detail, sizeof(out[i].detail),
					 "the check program died (signal %d)", WTERMSIG(status));
	return 0;
}
