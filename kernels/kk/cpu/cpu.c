/* kernels/kk/cpu/cpu.c — the cpu backend's vtable, memory, streams and its
 * thread pool.
 *
 * Buffers are 64-byte aligned host memory; streams exist only so code
 * written for cuda runs unchanged (every op completes before it returns).
 * The thread count: kk_backend_set_threads, else KK_CPU_THREADS, else the
 * CPUs of the process's affinity mask capped by its cgroup v2 cpu.max
 * quota.  Ops split their work over a pool of persistent workers (below). */
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cpu.h"
#include "kiln/macro.h"

/* Alignment of every cpu buffer (cache line; AVX-512 loads). */
#define KK_CPU_ALIGN 64

/* ---- thread count ------------------------------------------------------ */

/* Threads asked for through kk_backend_set_threads (0: the default). */
static int threads_set;
/* The default, worked out once. */
static int threads_default;

/* The quota of one group directory: CPUs rounded up, 0 for none. */
static int cpu_max(const char *dir)
{
	char path[600];
	long long quota, period;
	int n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/cpu.max", dir);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fscanf(f, "%lld %lld", &quota, &period);
	fclose(f);
	if (n != 2 || quota <= 0 || period <= 0)
		return 0;
	return (int) MAX((quota + period - 1) / period, 1LL);
}

int kk__cpu_cgroup_cpus(const char *proc_cgroup, const char *root)
{
	char dir[512] = "", line[256], *nl, *slash;
	size_t root_len = strlen(root);
	int best = 0;
	FILE *f;

	if (root_len >= sizeof(dir))
		return 0;
	f = fopen(proc_cgroup, "re");
	if (!f)
		return 0;
	/* v2: the one line "0::/some/group". */
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "0::", 3) == 0) {
			if ((nl = strchr(line, '\n')))
				*nl = 0;
			if (root_len + strlen(line + 3) < sizeof(dir))
				snprintf(dir, sizeof(dir), "%s%s", root, line + 3);
			break;
		}
	fclose(f);
	/* The group and every ancestor below the root: the tightest quota. */
	while (strlen(dir) > root_len) {
		int q = cpu_max(dir);
		if (q > 0 && (best == 0 || q < best))
			best = q;
		slash = strrchr(dir, '/');
		if (!slash)
			break;
		*slash = 0;
	}
	return best;
}

int kk__cpu_default_threads(void)
{
	const char *e = getenv("KK_CPU_THREADS");
	cpu_set_t set;
	long c = 0;

	if (e && *e) {
		char *end;
		c = strtol(e, &end, 10);
		if (*end || c < 1)
			c = 0; /* not a count: ignored, the machine decides */
	}
	if (c == 0) {
		int q = kk__cpu_cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup");
		c = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
								 : sysconf(_SC_NPROCESSORS_ONLN);
		if (q > 0 && q < c)
			c = q;
	}
	return (int) CLAMP(c, 1L, (long) KK_CPU_THREADS_MAX);
}

int kk__cpu_threads(void)
{
	int v = __atomic_load_n(&threads_set, __ATOMIC_RELAXED);
	if (v > 0)
		return v;
	v = __atomic_load_n(&threads_default, __ATOMIC_RELAXED);
	if (v > 0)
		return v;
	v = kk__cpu_default_threads();
	__atomic_store_n(&threads_default, v, __ATOMIC_RELAXED);
	return v;
}

static int cpu_set_threads(kk_backend *be, int n)
{
	if (n == 0) /* the default, as the process's CPUs and environment are now */
		__atomic_store_n(&threads_default, kk__cpu_default_threads(), __ATOMIC_RELAXED);
	__atomic_store_n(&threads_set, n, __ATOMIC_RELAXED);
	return 0;
}

static int cpu_get_threads(const kk_backend *be)
{
	return kk__cpu_threads();
}

int kk__parallel_chunks(int64_t n, double cost_per_item)
{
	double work = (double) n * cost_per_item;
	int t = kk__cpu_threads();
	if (n <= 1 || t == 1 || work < KK_CPU_PAR_MIN_WORK)
		return 1;
	t *= KK_CPU_CHUNKS_PER_THREAD;
	if (work < (double) KK_CPU_PAR_MIN_WORK * t)
		t = (int) (work / KK_CPU_PAR_MIN_WORK) + 1;
	return (int) MIN((int64_t) t, n);
}

/* ---- the pool ----------------------------------------------------------
 *
 * Persistent workers, started on first use (up to the thread count less
 * the caller) and never stopped.  A job is published by bumping `gen`;
 * workers spin on it for KK_CPU_SPIN_NS (back-to-back ops of a forward pass
 * arrive well within that) and then sleep on a futex.  Chunks are claimed
 * through an atomic counter, the caller included, so a worker the kernel
 * has not scheduled yet never holds a job up: the caller takes its chunks.
 * A chunk always covers the same range, whoever runs it, so results do not
 * depend on timing.  One job at a time: a second thread (another stream)
 * or a nested call finds the pool busy and runs its chunks itself.  A
 * child forked after the pool started has no workers (they stay in the
 * parent): its caller claims every chunk, correct but single-threaded. */

struct pool {
	pthread_mutex_t busy; /* held by the thread whose job is published */
	int started;	      /* workers running */
	uint32_t gen;	      /* bumped per job (futex word) */
	int sleepers;	      /* workers in futex wait */
	/* The job of generation `gen`, written before `claim` and `gen` are
	 * published (release) and read after (acquire). */
	kk__range_fn fn;
	void *ctx;
	int64_t n;
	/* gen << 32 | chunks << 16 | next unclaimed chunk: a claim is a
	 * compare-and-swap that fails for a worker still holding an older
	 * generation, so a late worker can neither take nor waste a chunk of
	 * the next job. */
	uint64_t claim;
	int finished; /* chunks done (futex word while `waiting`) */
	int waiting;  /* the publisher sleeps on `finished` */
	int r;	      /* first error */
};

static struct pool pool = { .busy = PTHREAD_MUTEX_INITIALIZER };

static long futex(uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* Claims and runs chunks of job `gen` until none is left.  The job's
 * fields are read only after a claim succeeded: then the job is not done,
 * so its publisher has not moved on to overwrite them. */
static void pool_work(struct pool *p, uint32_t gen)
{
	uint64_t v = __atomic_load_n(&p->claim, __ATOMIC_ACQUIRE);

	for (;;) {
		int next = (int) (v & 0xffff), chunks = (int) ((v >> 16) & 0xffff);
		if ((uint32_t) (v >> 32) != gen || next >= chunks)
			return;
		if (!__atomic_compare_exchange_n(&p->claim, &v, v + 1, true, __ATOMIC_ACQ_REL,
						 __ATOMIC_ACQUIRE))
			continue; /* v reloaded */
		int64_t n = p->n;
		int r = p->fn(p->ctx, n * next / chunks, n * (next + 1) / chunks, next);
		if (r < 0) {
			int zero = 0;
			__atomic_compare_exchange_n(&p->r, &zero, r, false, __ATOMIC_RELAXED,
						    __ATOMIC_RELAXED);
		}
		/* The last chunk wakes a publisher that went to sleep on it
		 * (seq_cst pairs with its store of `waiting` and its load). */
		if (__atomic_add_fetch(&p->finished, 1, __ATOMIC_SEQ_CST) == chunks &&
		    __atomic_load_n(&p->waiting, __ATOMIC_SEQ_CST))
			futex((uint32_t *) &p->finished, FUTEX_WAKE_PRIVATE, 1);
		v = __atomic_load_n(&p->claim, __ATOMIC_ACQUIRE);
	}
}

static void *pool_main(void *arg)
{
	struct pool *p = arg;
	uint32_t seen = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE);

	for (;;) {
		uint32_t g;
		uint64_t t0 = now_ns();
		int spins = 0;
		while ((g = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE)) == seen) {
			cpu_relax();
			if (++spins % 256 == 0 && now_ns() - t0 > KK_CPU_SPIN_NS) {
				__atomic_fetch_add(&p->sleepers, 1, __ATOMIC_SEQ_CST);
				if (__atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == seen)
					futex(&p->gen, FUTEX_WAIT_PRIVATE, seen);
				__atomic_fetch_sub(&p->sleepers, 1, __ATOMIC_SEQ_CST);
				t0 = now_ns();
			}
		}
		seen = g;
		pool_work(p, g);
	}
	return NULL;
}

/* Starts workers up to `want` (best effort: fewer is still correct). */
static void pool_grow(struct pool *p, int want)
{
	while (p->started < want) {
		pthread_t t;
		pthread_attr_t a;
		sigset_t all, old;
		int r;

		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		/* Workers take no signals: a daemon's signalfd/sd-event keeps
		 * them blocked in the thread that created us, do it here too. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		r = pthread_create(&t, &a, pool_main, p);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&a);
		if (r != 0)
			return;
		p->started++;
	}
}

/* Waits for the chunks workers still run: spins for KK_CPU_JOIN_SPIN_NS
 * (a chunk of a forward pass ends within that when its worker runs), then
 * sleeps on `finished` until the last chunk's worker wakes it.  Sleeping,
 * not sched_yield: a worker preempted mid-chunk by another process sits in
 * that CPU's run queue, and only an idle CPU here pulls it over at once;
 * yielding kept this CPU busy and the job waited out the other process's
 * time slice (docs/kernels.md, "Two threads on a shared machine"). */
static void pool_wait(struct pool *p, int chunks)
{
	uint64_t t0 = 0;

	for (int spins = 0;; spins++) {
		int f = __atomic_load_n(&p->finished, __ATOMIC_ACQUIRE);
		if (f >= chunks)
			break;
		cpu_relax();
		if (spins % 64 != 63)
			continue;
		if (!t0) {
			t0 = now_ns();
			continue;
		}
		if (now_ns() - t0 < KK_CPU_JOIN_SPIN_NS)
			continue;
		__atomic_store_n(&p->waiting, 1, __ATOMIC_SEQ_CST);
		f = __atomic_load_n(&p->finished, __ATOMIC_SEQ_CST);
		if (f < chunks)
			futex((uint32_t *) &p->finished, FUTEX_WAIT_PRIVATE, (uint32_t) f);
		__atomic_store_n(&p->waiting, 0, __ATOMIC_RELAXED);
	}
	/* pairs with the workers' release of their results */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
}

static int par_run(int64_t n, int t, kk__range_fn fn, void *ctx);

int kk__parallel_for(int64_t n, double cost_per_item, kk__range_fn fn, void *ctx)
{
	return par_run(n, kk__parallel_chunks(n, cost_per_item), fn, ctx);
}

int kk__parallel_for_fine(int64_t n, double cost_per_item, double chunk_work, kk__range_fn fn,
			  void *ctx)
{
	int t = kk__parallel_chunks(n, cost_per_item);
	if (t > 1) {
		double want = (double) n * cost_per_item / chunk_work;
		if (want > t)
			t = (int) MIN((double) MIN(n, (int64_t) KK_CPU_FINE_CHUNKS_MAX), want);
	}
	return par_run(n, t, fn, ctx);
}

static int par_run(int64_t n, int t, kk__range_fn fn, void *ctx)
{
	struct pool *p = &pool;
	int r = 0;

	if (n <= 0)
		return 0;
	if (t == 1)
		return fn(ctx, 0, n, 0);
	if (pthread_mutex_trylock(&p->busy) != 0) {
		/* Busy (another stream's op, or a nested call): same chunks, here. */
		for (int i = 0; i < t; i++) {
			int ri = fn(ctx, n * i / t, n * (i + 1) / t, i);
			if (ri < 0 && r == 0)
				r = ri;
		}
		return r;
	}
	pool_grow(p, MIN(t, kk__cpu_threads()) - 1);
	uint32_t g = p->gen + 1;
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	p->r = 0;
	__atomic_store_n(&p->finished, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&p->claim, (uint64_t) g << 32 | (uint64_t) t << 16, __ATOMIC_RELEASE);
	__atomic_store_n(&p->gen, g, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0)
		futex(&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
	pool_work(p, g);
	pool_wait(p, t);
	r = p->r;
	pthread_mutex_unlock(&p->busy);
	return r;
}

/* ---- memory and streams ------------------------------------------------ */

#define KK_CPU_HUGE ((size_t) 2 << 20)
/* Buffers from this size up: a large classifier and a KV cache pool, not
 * the per-step activations (from 2 MiB up, s15m's 2-thread prefill ran
 * 2-3 % slower and its RSS grew 28 -> 45 MB; from 8 MiB up, unchanged). */
#define KK_CPU_HUGE_MIN ((size_t) 8 << 20)

/* KK_CPU_THP=0 keeps every buffer on small pages: a huge page is backed
 * whole once touched, so buffers used in part (a KV cache pool) cost more
 * resident memory (s110m's peer-kiln: 120 -> 123 MB). */
static bool thp_wanted(void)
{
	static int on = -1;
	int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
	if (v < 0) {
		const char *e = getenv("KK_CPU_THP");
		v = !(e && streq(e, "0"));
		__atomic_store_n(&on, v, __ATOMIC_RELAXED);
	}
	return v;
}

static int cpu_alloc(kk_backend *be, size_t bytes, void **ret)
{
	size_t rounded = DIV_ROUND_UP(bytes, KK_CPU_ALIGN) * KK_CPU_ALIGN;
	void *p;

	if (rounded >= KK_CPU_HUGE_MIN && thp_wanted()) {
		/* 2 MiB pages where the kernel gives them (transparent huge
		 * pages set to "madvise", Debian's default, gives none
		 * unasked): a decode step streams the classifier and reads
		 * the K/V cache in 256-byte rows 3 KiB apart, a TLB miss
		 * every 4 KiB page.  s110m q4_0 decode, 1 thread, per CPU
		 * second, 6 interleaved pairs: 388-401 -> 420-433 tok/s
		 * (every pair faster), RSS 120 -> 123 MB (docs/kernels.md,
		 * "Decode's cache reads ...").  An error (no THP in this
		 * kernel) leaves small pages: ignored. */
		rounded = DIV_ROUND_UP(bytes, KK_CPU_HUGE) * KK_CPU_HUGE;
		p = aligned_alloc(KK_CPU_HUGE, rounded);
		if (p)
			(void) madvise(p, rounded, MADV_HUGEPAGE);
	} else
		p = aligned_alloc(KK_CPU_ALIGN, rounded);
	if (!p)
		return -ENOMEM;
	*ret = p;
	return 0;
}

static void cpu_free(kk_backend *be, void *ptr)
{
	free(ptr);
}

static int cpu_memcpy(kk_backend *be, kk_stream *st, void *dst, const void *src, size_t bytes)
{
	memcpy(dst, src, bytes);
	return 0;
}

static int cpu_memset(kk_backend *be, kk_stream *st, void *dst, int byte, size_t bytes)
{
	memset(dst, byte, bytes);
	return 0;
}

static int cpu_stream_create(kk_backend *be, kk_stream *st)
{
	st->handle = NULL;
	return 0;
}

static int cpu_stream_sync(kk_backend *be, kk_stream *st)
{
	return 0;
}

static int cpu_available(void)
{
	return 1;
}

/* Ends the threads OpenBLAS started when it was loaded (one fewer than
 * $OPENBLAS_NUM_THREADS, or than the CPUs).  openblas_set_num_threads(1)
 * only stops giving them work: each still spins on sched_yield for ~0.1 s
 * (2^28 cycles) and then sleeps holding its buffers.  On a 2-core machine
 * that spin took a third of the CPU from the first prefills of a process
 * run with OPENBLAS_NUM_THREADS=2 (docs/kernels.md, "Two threads").
 * blas_thread_shutdown_ is OpenBLAS's own fork handler, exported but not
 * in cblas.h, so it is looked up: another BLAS, or an OpenBLAS without it,
 * links and runs as before.  OpenBLAS starts its threads again if a caller
 * later asks it for more than one (bench-kernels-cpu's sgemm ceiling); a
 * call with none running returns at once. */
static void openblas_stop_threads(void)
{
	int (*shutdown)(void) = (int (*)(void)) dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
	if (shutdown)
		(void) shutdown();
}

/* kk's pool splits every sgemm (gemm.c), so OpenBLAS must not run threads
 * of its own on the same cores. */
static int cpu_init(kk_backend *be)
{
	/* Only when needed: OpenBLAS 0.3.21's setter starts the threads
	 * stopped below again, whatever the count. */
	if (openblas_get_num_threads() != 1)
		openblas_set_num_threads(1);
	openblas_stop_threads();
	return 0;
}

static const struct kk_backend_ops cpu_ops = {
	.name = "cpu",
	.caps = (1u << KK_CAP_HOST_MEMORY) | (1u << KK_CAP_I8_GROUP32),
	.available = cpu_available,
	.init = cpu_init,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_memcpy,
	.download = cpu_memcpy,
	.memset = cpu_memset,
	.copy = cpu_memcpy,
	.stream_create = cpu_stream_create,
	.stream_sync = cpu_stream_sync,
	.set_threads = cpu_set_threads,
	.threads = cpu_get_threads,
	.qmatrix_pack = kk__cpu_qpack,
#define KK_OP(NAME, name, family, dtypes, params) .name = kk__cpu_##name,
#define KK_SLOT(ret, name, family, params)	  .name = kk__cpu_##name,
#include "kk_ops.def"
};

const struct kk_backend_ops *kk_cpu_ops(void)
{
	return &cpu_ops;
}

int kk__widen(const kk_buffer *b, size_t n, float **ret, float **owned)
{
	float *f;
	*owned = NULL;
	if (b->dtype == KK_F32) {
		*ret = b->ptr;
		return 0;
	}
	f = malloc(MAX(n, (size_t) 1) * sizeof(float));
	if (!f)
		return -ENOMEM;
	kk__row_f32(f, b->ptr, b->dtype, 0, n);
	*ret = *owned = f;
	return 0;
}
