/* kernels/cpu/cpu.c — the cpu backend's vtable, memory, streams and its
 * fork-join thread helper.
 *
 * Buffers are 64-byte aligned host memory; streams exist only so code
 * written for cuda runs unchanged (every op completes before it returns).
 * KK_CPU_THREADS caps the helper threads (default: online cores). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"
#include "kiln/macro.h"

/* Alignment of every cpu buffer (cache line; AVX-512 loads). */
#define KK_CPU_ALIGN 64

int kk__cpu_threads(void)
{
	static int n;
	int v = __atomic_load_n(&n, __ATOMIC_RELAXED);
	if (v > 0)
		return v;
	{
		const char *e = getenv("KK_CPU_THREADS");
		long c = e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
		v = (int) CLAMP(c, 1L, (long) KK_CPU_THREADS_MAX);
	}
	__atomic_store_n(&n, v, __ATOMIC_RELAXED);
	return v;
}

int kk__parallel_chunks(int64_t n, double cost_per_item)
{
	double work = (double) n * cost_per_item;
	int t = kk__cpu_threads();
	if (n <= 1 || work < KK_CPU_PAR_MIN_WORK)
		return 1;
	if (work < (double) KK_CPU_PAR_MIN_WORK * t)
		t = (int) (work / KK_CPU_PAR_MIN_WORK) + 1;
	return (int) MIN((int64_t) t, n);
}

struct par_job {
	kk__range_fn fn;
	void *ctx;
	int64_t begin, end;
	int chunk;
	int r;
};

static void *par_main(void *p)
{
	struct par_job *j = p;
	j->r = j->fn(j->ctx, j->begin, j->end, j->chunk);
	return NULL;
}

int kk__parallel_for(int64_t n, double cost_per_item, kk__range_fn fn, void *ctx)
{
	struct par_job jobs[KK_CPU_THREADS_MAX];
	pthread_t tids[KK_CPU_THREADS_MAX];
	bool started[KK_CPU_THREADS_MAX] = { false };
	int t = kk__parallel_chunks(n, cost_per_item), r = 0;

	if (n <= 0)
		return 0;
	if (t == 1)
		return fn(ctx, 0, n, 0);
	for (int i = 0; i < t; i++) {
		jobs[i] = (struct par_job){ fn, ctx, n * i / t, n * (i + 1) / t, i, 0 };
		if (i > 0 && pthread_create(&tids[i], NULL, par_main, &jobs[i]) == 0)
			started[i] = true;
	}
	par_main(&jobs[0]);
	for (int i = 1; i < t; i++) {
		if (started[i])
			pthread_join(tids[i], NULL);
		else
			par_main(&jobs[i]); /* could not start a thread: run it here */
	}
	for (int i = 0; i < t; i++)
		if (jobs[i].r < 0 && r == 0)
			r = jobs[i].r;
	return r;
}

/* ---- memory and streams ------------------------------------------------ */

static int cpu_alloc(kk_backend *be, size_t bytes, void **ret)
{
	size_t rounded = DIV_ROUND_UP(bytes, KK_CPU_ALIGN) * KK_CPU_ALIGN;
	void *p = aligned_alloc(KK_CPU_ALIGN, rounded);
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

static const struct kk_backend_ops cpu_ops = {
	.name = "cpu",
	.available = cpu_available,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_memcpy,
	.download = cpu_memcpy,
	.memset = cpu_memset,
	.copy = cpu_memcpy,
	.stream_create = cpu_stream_create,
	.stream_sync = cpu_stream_sync,
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
