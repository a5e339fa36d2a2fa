/* workers.c — one round's worker processes on this node.
 *
 * Each worker gets the environment a torchrun worker gets (RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_NAME,
 * ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
 * TORCHELASTIC_USE_AGENT_STORE) plus CUDA_VISIBLE_DEVICES (one GPU per local
 * rank), OMP_NUM_THREADS, kiln's own KILN_* variables, and a CPU/NUMA
 * binding through hwloc (when built with it).  Each runs in its own process
 * group so that signals reach its children too.  With prefixing, its stdout
 * and stderr go through pipes and come out line by line as "host:rank: ". */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/epoll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KILN_HAVE_HWLOC
#include <hwloc.h>
#endif

#include "kiln/log.h"
#include "kiln/macro.h"
#include "launcher.h"

/* A worker line longer than this is cut into pieces (keeps memory bounded
 * for programs that print without newlines). */
#define KR_LINE_MAX 65536

static void setenv_u(const char *k, uint64_t v)
{
	char buf[32];
	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	setenv(k, buf, 1);
}

/* Picks the GPU for local_rank: the local_rank-th entry of an inherited
 * CUDA_VISIBLE_DEVICES (Slurm sets it with --gres), else local_rank itself
 * when the node has GPUs.  Returns false when no GPU applies. */
static bool pick_gpu(int local_rank, int gpus, char *buf, size_t len)
{
	const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
	if (cvd && *cvd) {
		int i = 0;
		const char *p = cvd;
		while (p && *p) {
			const char *comma = strchr(p, ',');
			size_t l = comma ? (size_t) (comma - p) : strlen(p);
			if (i == local_rank) {
				snprintf(buf, len, "%.*s", (int) MIN(l, len - 1), p);
				return true;
			}
			i++;
			p = comma ? comma + 1 : NULL;
		}
		return false;
	}
	if (gpus > 0 && local_rank < gpus) {
		snprintf(buf, len, "%d", local_rank);
		return true;
	}
	return false;
}

static void bind_worker(int local_rank, int local_world)
{
#ifdef KILN_HAVE_HWLOC
	hwloc_topology_t topo;
	if (hwloc_topology_init(&topo) < 0)
		return;
	if (hwloc_topology_load(topo) == 0) {
		hwloc_cpuset_t *sets = calloc((size_t) local_world, sizeof(*sets));
		hwloc_obj_t root = hwloc_get_root_obj(topo);
		if (sets &&
		    hwloc_distrib(topo, &root, 1, sets, (unsigned) local_world, INT_MAX, 0) == 0) {
			/* Bind CPUs and memory to the NUMA node(s) of this slice. */
			hwloc_set_cpubind(topo, sets[local_rank], 0);
			hwloc_set_membind(topo, sets[local_rank], HWLOC_MEMBIND_BIND, 0);
			char *s = NULL;
			hwloc_bitmap_list_asprintf(&s, sets[local_rank]);
			if (s)
				setenv("KILN_CPU_BIND", s, 1);
			free(s);
		}
		if (sets)
			for (int i = 0; i < local_world; i++)
				hwloc_bitmap_free(sets[i]);
		free(sets);
	}
	hwloc_topology_destroy(topo);
#else
	(void) local_rank;
	(void) local_world;
#endif
}

static _noreturn_ void child(char *const *argv, const kr_worker_env *e, int local_rank, int out_w,
			     int err_w)
{
	setpgid(0, 0);
	sigset_t all;
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			signal(s, SIG_DFL);
	if (out_w >= 0 && dup2(out_w, STDOUT_FILENO) < 0)
		_exit(127);
	if (err_w >= 0 && dup2(err_w, STDERR_FILENO) < 0)
		_exit(127);

	uint64_t rank = e->rank_base + (uint64_t) local_rank;
	setenv_u("RANK", rank);
	setenv_u("LOCAL_RANK", (uint64_t) local_rank);
	setenv_u("WORLD_SIZE", e->world);
	setenv_u("LOCAL_WORLD_SIZE", e->local_world);
	setenv_u("GROUP_RANK", e->group_rank);
	setenv_u("ROLE_RANK", rank);
	setenv("ROLE_NAME", "default", 1);
	setenv_u("ROLE_WORLD_SIZE", e->world);
	setenv_u("GROUP_WORLD_SIZE", e->world / MAX(e->local_world, 1u));
	setenv("MASTER_ADDR", e->master_addr, 1);
	setenv_u("MASTER_PORT", e->master_port);
	setenv_u("TORCHELASTIC_RESTART_COUNT", e->restart_count);
	setenv_u("TORCHELASTIC_MAX_RESTARTS", e->max_restarts);
	setenv("TORCHELASTIC_RUN_ID", e->run_id, 1);
	/* torch compares this with the string "True". */
	setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
	setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 0);
	if (!getenv("OMP_NUM_THREADS"))
		setenv("OMP_NUM_THREADS", "1", 1);
	setenv_u("KILN_ROUND", e->round);
	char key[128];
	snprintf(key, sizeof(key), "kiln/round_%" PRIu64 "/comm_id", e->round);
	setenv("KILN_COMM_ID_KEY", key, 1);
	setenv("KILN_CHECKPOINT_KEY", KR_CHECKPOINT_KEY, 1);
	setenv("KILN_HOST", e->host, 1);
	if (e->node_addr) {
		setenv("KILN_NODE_ADDR", e->node_addr, 1);
		/* kk's CPU collectives listen on this address. */
		setenv("KILN_COMM_ADDR", e->node_addr, 0);
	}
	/* gloo binds to the address the host name resolves to, and falls
	 * back to loopback when it does not resolve: point it at the
	 * interface of the node's Slurm address instead. */
	if (e->ifname)
		setenv("GLOO_SOCKET_IFNAME", e->ifname, 0);
	/* Workers live in the worker key space; the control secret stays
	 * with the agents. */
	unsetenv(KR_ENV_SECRET);
	unsetenv(KR_ENV_AGENT);
	char gpu[64];
	if (pick_gpu(local_rank, e->gpus, gpu, sizeof(gpu)))
		setenv("CUDA_VISIBLE_DEVICES", gpu, 1);
	bind_worker(local_rank, (int) e->local_world);

	execvp(argv[0], argv);
	fprintf(stderr, "kiln-run: cannot execute '%s': %s\n", argv[0], strerror(errno));
	_exit(errno == ENOENT ? 127 : 126);
}

/* Adds an output pipe to, or removes it from, the caller's epoll set.  A
 * pipe leaves the set before it is closed: a read end that a child forked
 * meanwhile still holds would otherwise stay registered, and report its
 * hang-up forever. */
static void watch(const kr_group *g, int fd, int op)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	if (g->epoll_fd >= 0 && fd >= 0)
		(void) epoll_ctl(g->epoll_fd, op, fd, &ev);
}

int kr_group_spawn(kr_group *g, char *const *argv, const kr_worker_env *e, bool prefix)
{
	assert_return(g && argv && argv[0] && e, -EINVAL);
	kr_group_free(g);
	g->w = calloc(e->local_world, sizeof(*g->w));
	if (!g->w)
		return -ENOMEM;
	g->n = e->local_world;
	g->round = e->round;
	g->host = e->host;
	g->prefix = prefix;
	fflush(stdout);
	fflush(stderr);
	for (size_t i = 0; i < g->n; i++) {
		kr_worker *w = &g->w[i];
		int po[2] = { -1, -1 }, pe[2] = { -1, -1 };
		w->out_fd = w->err_fd = -1;
		w->rank = (int) (e->rank_base + i);
		if (prefix && (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)) {
			int r = -errno;
			closep(&po[0]), closep(&po[1]);
			return r;
		}
		pid_t pid = fork();
		if (pid < 0) {
			int r = -errno;
			closep(&po[0]), closep(&po[1]), closep(&pe[0]), closep(&pe[1]);
			return r;
		}
		if (pid == 0)
			child(argv, e, (int) i, po[1], pe[1]);
		/* Also in the parent, so that killpg works before the child ran. */
		setpgid(pid, pid);
		w->pid = pid;
		if (prefix) {
			close(po[1]);
			close(pe[1]);
			w->out_fd = po[0];
			w->err_fd = pe[0];
			fcntl(w->out_fd, F_SETFL, O_NONBLOCK);
			fcntl(w->err_fd, F_SETFL, O_NONBLOCK);
			watch(g, w->out_fd, EPOLL_CTL_ADD);
			watch(g, w->err_fd, EPOLL_CTL_ADD);
		}
	}
	return 0;
}

void kr_group_kill(kr_group *g, int sig)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->w[i].pid > 0 && !g->w[i].exited)
			killpg(g->w[i].pid, sig);
}

size_t kr_group_reap(kr_group *g)
{
	size_t running = 0;
	for (size_t i = 0; i < g->n; i++) {
		kr_worker *w = &g->w[i];
		if (w->pid <= 0 || w->exited)
			continue;
		int st;
		pid_t p = waitpid(w->pid, &st, WNOHANG);
		if (p == w->pid) {
			w->exited = true;
			w->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
			/* Record the order of failures for "first failing worker". */
			if (w->code != 0) {
				int seq = 0;
				for (size_t j = 0; j < g->n; j++)
					if (g->w[j].exited && g->w[j].code != 0)
						seq++;
				if (seq == 1)
					g->w[i].rank = -1 - g->w[i].rank; /* mark first failure */
			}
		} else if (p < 0 && errno == ECHILD) {
			w->exited = true;
			w->code = 1;
		} else
			running++;
	}
	return running;
}

int kr_group_result(const kr_group *g)
{
	int first = 0;
	bool running = false;
	for (size_t i = 0; i < g->n; i++) {
		const kr_worker *w = &g->w[i];
		if (!w->exited) {
			running = true;
			continue;
		}
		if (w->rank < 0 && w->code != 0)
			return w->code;
		if (w->code != 0 && first == 0)
			first = w->code;
	}
	if (first)
		return first;
	return running ? -1 : 0;
}

static int worker_rank(const kr_worker *w)
{
	return w->rank < 0 ? -1 - w->rank : w->rank;
}

static void emit(FILE *f, const kr_group *g, const kr_worker *w, const char *s, size_t n)
{
	fprintf(f, "%s:%d: %.*s\n", g->host, worker_rank(w), (int) n, s);
}

static void pump_fd(kr_group *g, kr_worker *w, int *fd, char **buf, size_t *len, FILE *f,
		    bool flush_partial)
{
	if (*fd >= 0) {
		if (!*buf) {
			*buf = malloc(KR_LINE_MAX);
			if (!*buf)
				return;
		}
		for (;;) {
			ssize_t r = read(*fd, *buf + *len, KR_LINE_MAX - *len);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
					watch(g, *fd, EPOLL_CTL_DEL);
					close(*fd);
					*fd = -1;
					flush_partial = true;
				}
				break;
			}
			*len += (size_t) r;
			char *start = *buf, *nl;
			while ((nl = memchr(start, '\n', *len - (size_t) (start - *buf)))) {
				emit(f, g, w, start, (size_t) (nl - start));
				start = nl + 1;
			}
			size_t rest = *len - (size_t) (start - *buf);
			if (rest == KR_LINE_MAX) {
				emit(f, g, w, start, rest);
				rest = 0;
			}
			memmove(*buf, start, rest);
			*len = rest;
		}
	}
	if (flush_partial && *buf && *len > 0) {
		emit(f, g, w, *buf, *len);
		*len = 0;
	}
	fflush(f);
}

void kr_group_pump(kr_group *g, bool flush_partial)
{
	for (size_t i = 0; i < g->n; i++) {
		kr_worker *w = &g->w[i];
		pump_fd(g, w, &w->out_fd, &w->out_buf, &w->out_len, stdout, flush_partial);
		pump_fd(g, w, &w->err_fd, &w->err_buf, &w->err_len, stderr, flush_partial);
	}
}

void kr_group_free(kr_group *g)
{
	for (size_t i = 0; i < g->n; i++) {
		kr_worker *w = &g->w[i];
		watch(g, w->out_fd, EPOLL_CTL_DEL);
		watch(g, w->err_fd, EPOLL_CTL_DEL);
		closep(&w->out_fd);
		closep(&w->err_fd);
		free(w->out_buf);
		free(w->err_buf);
	}
	free(g->w);
	g->w = NULL;
	g->n = 0;
}
