/* kernels/kk/cuda/nccl.cu — collectives of the CUDA backend over NCCL.
 *
 * kk_comm_get_id() is ncclGetUniqueId() on rank 0 (its 128 bytes are
 * KK_COMM_ID_BYTES; kiln-run hands them to every rank through its
 * rendezvous store), kk_comm_init() is ncclCommInitRank() on the backend's
 * device.  Each collective is one NCCL call queued on the caller's stream;
 * KK_AVG maps to ncclAvg.  NCCL reduces in the buffer's dtype (bf16 sums are
 * rounded per step), unlike the cpu backend which reduces in f32.
 *
 * A dead peer must end the step with an error, not hang it: communicators
 * are non-blocking (ncclConfig_t.blocking = 0), every NCCL call is settled by
 * polling ncclCommGetAsyncError, and while a communicator of the backend is
 * open, the backend's blocking waits (kk_sync, kk_stream_sync, upload,
 * download: kc_wait_stream) poll the stream and every open communicator
 * instead of blocking in cudaStreamSynchronize.  An asynchronous error or a
 * wait longer than KILN_NCCL_TIMEOUT seconds (default 600, 0: no limit)
 * aborts the communicators (ncclCommAbort, which also stops their kernels)
 * and returns -ECONNRESET / -EIO or -ETIMEDOUT; kk_comm_free() is then all
 * that is left to do (kiln-run starts a new round).  Needs NCCL >= 2.14
 * (NCCL_CONFIG_INITIALIZER); without it (the emulator's single-rank shim)
 * calls block as before.
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "kc.h"

static int kc_nccl_type(kk_dtype t, ncclDataType_t *ret)
{
	if (t != KK_F32 && t != KK_BF16 && t != KK_F16)
		return -EOPNOTSUPP;
	*ret = t == KK_F32 ? ncclFloat32 : t == KK_BF16 ? ncclBfloat16 : ncclFloat16;
	return 0;
}

static int kc_nccl_op(kk_reduce_op op, ncclRedOp_t *ret)
{
	switch (op) {
	case KK_SUM:
		*ret = ncclSum;
		return 0;
	case KK_AVG:
		*ret = ncclAvg;
		return 0;
	case KK_MAX:
		*ret = ncclMax;
		return 0;
	}
	return -EINVAL;
}

static ncclComm_t kc_comm(kk_comm *c)
{
	return (ncclComm_t) c->impl;
}

#if defined(NCCL_CONFIG_INITIALIZER)
#define KC_NCCL_ASYNC 1
/* Open communicators of all cuda backends, for the waits to poll.  Fixed
 * size: a process holds a handful (one per parallel group); more than
 * KC_MAX_COMMS is refused with -ENOSPC rather than left unwatched. */
#define KC_MAX_COMMS 16
static kk_comm *kc_comms[KC_MAX_COMMS];
static pthread_mutex_t kc_comms_lock = PTHREAD_MUTEX_INITIALIZER;

/* KILN_NCCL_TIMEOUT in seconds (default 600, as torch's NCCL watchdog; 0
 * or negative: wait forever, still ending on an asynchronous error). */
static double kc_nccl_timeout(void)
{
	const char *e = getenv("KILN_NCCL_TIMEOUT");
	if (!e || !*e)
		return 600.0;
	char *end;
	double v = strtod(e, &end);
	return end != e ? v : 600.0;
}

static double kc_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static void kc_nap(void)
{
	struct timespec t = { 0, 50 * 1000 }; /* 50 us: well under a step, cheap on a core */
	nanosleep(&t, NULL);
}

/* Aborts c's communicator (idempotent); its kernels stop, the handle is gone. */
static void kc_nccl_abort(kk_comm *c)
{
	if (c->impl)
		(void) ncclCommAbort(kc_comm(c));
	c->impl = NULL;
}

/* Settles the NCCL call that returned r on c: polls while it is in progress
 * (non-blocking communicator), aborts c on an error or after the timeout. */
static int kc_nccl_settle(kk_comm *c, ncclResult_t r)
{
	double limit = kc_nccl_timeout(), t0 = kc_now();
	while (r == ncclInProgress) {
		if (limit > 0 && kc_now() - t0 > limit) {
			kc_nccl_abort(c);
			return -ETIMEDOUT;
		}
		kc_nap();
		if (ncclCommGetAsyncError(kc_comm(c), &r) != ncclSuccess)
			r = ncclInternalError;
	}
	if (r != ncclSuccess) {
		kc_nccl_abort(c);
		return kc_errno_nccl(r);
	}
	return 0;
}

/* Checks every open communicator of be: 0, or the error after aborting them
 * all (a collective that lost one peer leaves the others waiting too). */
static int kc_comms_check(kk_backend *be, bool timed_out)
{
	int err = timed_out ? -ETIMEDOUT : 0;
	pthread_mutex_lock(&kc_comms_lock);
	for (int i = 0; i < KC_MAX_COMMS && !err; i++) {
		ncclResult_t a = ncclSuccess;
		kk_comm *c = kc_comms[i];
		if (!c || c->be != be || !c->impl)
			continue;
		if (ncclCommGetAsyncError(kc_comm(c), &a) != ncclSuccess)
			a = ncclInternalError;
		if (a != ncclSuccess && a != ncclInProgress)
			err = kc_errno_nccl(a);
	}
	if (err)
		for (int i = 0; i < KC_MAX_COMMS; i++)
			if (kc_comms[i] && kc_comms[i]->be == be)
				kc_nccl_abort(kc_comms[i]);
	pthread_mutex_unlock(&kc_comms_lock);
	return err;
}

static bool kc_comms_open(kk_backend *be)
{
	bool any = false;
	pthread_mutex_lock(&kc_comms_lock);
	for (int i = 0; i < KC_MAX_COMMS; i++)
		any |= kc_comms[i] && kc_comms[i]->be == be && kc_comms[i]->impl;
	pthread_mutex_unlock(&kc_comms_lock);
	return any;
}
#else
#define KC_NCCL_ASYNC 0
#endif

extern "C" int kc_wait_stream(kk_backend *be, cudaStream_t s)
{
#if KC_NCCL_ASYNC
	if (kc_comms_open(be)) {
		double limit = kc_nccl_timeout(), t0 = kc_now();
		for (;;) {
			cudaError_t q = cudaStreamQuery(s);
			if (q != cudaErrorNotReady)
				return kc_errno_cuda(q);
			int r = kc_comms_check(be, limit > 0 && kc_now() - t0 > limit);
			if (r < 0)
				return r;
			kc_nap();
		}
	}
#endif
	return kc_errno_cuda(cudaStreamSynchronize(s));
}

extern "C" int kc_op_comm_get_id(kk_backend *be, void *id, size_t len)
{
	ncclUniqueId u;
	(void) be; /* the id is host data: no device needed */
	if (len < sizeof(u.internal) || sizeof(u) > KK_COMM_ID_BYTES)
		return -EINVAL;
	int r = kc_errno_nccl(ncclGetUniqueId(&u));
	if (r < 0)
		return r;
	memset(id, 0, len);
	memcpy(id, &u, sizeof(u));
	return 0;
}

extern "C" int kc_op_comm_init(kk_comm *c, const void *id, size_t id_len)
{
	ncclUniqueId u;
	ncclComm_t comm = NULL;
	if (id_len < sizeof(u))
		return -EINVAL;
	memcpy(&u, id, sizeof(u));
	int r = kc_bind(c->be); /* the communicator is made on the current device */
	if (r < 0)
		return r;
#if KC_NCCL_ASYNC
	int slot = -1;
	pthread_mutex_lock(&kc_comms_lock);
	for (int i = 0; i < KC_MAX_COMMS && slot < 0; i++)
		if (!kc_comms[i]) {
			slot = i;
			kc_comms[i] = c;
		}
	pthread_mutex_unlock(&kc_comms_lock);
	if (slot < 0)
		return -ENOSPC;
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0; /* init and calls return ncclInProgress: we poll */
	ncclResult_t nr = ncclCommInitRankConfig(&comm, c->world, u, c->rank, &cfg);
	c->impl = comm;
	r = comm ? kc_nccl_settle(c, nr) : kc_errno_nccl(nr);
	if (r < 0) {
		kc_nccl_abort(c); /* a peer that never came: do not leave it half made */
		pthread_mutex_lock(&kc_comms_lock);
		kc_comms[slot] = NULL;
		pthread_mutex_unlock(&kc_comms_lock);
	}
	return r;
#else
	r = kc_errno_nccl(ncclCommInitRank(&comm, c->world, u, c->rank));
	if (r < 0)
		return r;
	c->impl = comm;
	return 0;
#endif
}

extern "C" void kc_op_comm_free(kk_comm *c)
{
#if KC_NCCL_ASYNC
	pthread_mutex_lock(&kc_comms_lock);
	for (int i = 0; i < KC_MAX_COMMS; i++)
		if (kc_comms[i] == c)
			kc_comms[i] = NULL;
	pthread_mutex_unlock(&kc_comms_lock);
#endif
	(void) kc_bind(c->be);
	if (c->impl)
		ncclCommDestroy(kc_comm(c));
	c->impl = NULL;
}

/* The result of enqueuing a collective on c. */
static int kc_nccl_done(kk_comm *c, ncclResult_t r)
{
#if KC_NCCL_ASYNC
	return kc_nccl_settle(c, r);
#else
	(void) c;
	return kc_errno_nccl(r);
#endif
}

/* What every collective checks first: the dtype as NCCL's, the reduction
 * (op NULL: none), then the communicator alive (-ECONNRESET once aborted
 * after an error or timeout). */
static int kc_coll_prep(kk_comm *c, kk_dtype dt, const kk_reduce_op *op, ncclDataType_t *t,
			ncclRedOp_t *o)
{
	int r = kc_nccl_type(dt, t);
	if (r < 0)
		return r;
	if (op && (r = kc_nccl_op(*op, o)) < 0)
		return r;
	return c->impl ? 0 : -ECONNRESET;
}

/* all_reduce, or (scatter) reduce_scatter: the same checks and arguments. */
static int kc_reduce(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
		     size_t count, kk_reduce_op op, bool scatter)
{
	ncclDataType_t t;
	ncclRedOp_t o;
	int r = kc_coll_prep(c, send->dtype, &op, &t, &o);
	if (r < 0)
		return r;
	cudaStream_t s = kc_stream(c->be, st);
	return kc_nccl_done(
		c, scatter ? ncclReduceScatter(send->ptr, recv->ptr, count, t, o, kc_comm(c), s)
			   : ncclAllReduce(send->ptr, recv->ptr, count, t, o, kc_comm(c), s));
}

extern "C" int kc_op_all_reduce(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
				size_t count, kk_reduce_op op)
{
	return kc_reduce(c, st, recv, send, count, op, false);
}

extern "C" int kc_op_reduce_scatter(kk_comm *c, kk_stream *st, kk_buffer *recv,
				    const kk_buffer *send, size_t count, kk_reduce_op op)
{
	return kc_reduce(c, st, recv, send, count, op, true);
}

extern "C" int kc_op_all_gather(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
				size_t count)
{
	ncclDataType_t t;
	int r = kc_coll_prep(c, send->dtype, NULL, &t, NULL);
	if (r < 0)
		return r;
	return kc_nccl_done(
		c, ncclAllGather(send->ptr, recv->ptr, count, t, kc_comm(c), kc_stream(c->be, st)));
}

extern "C" int kc_op_broadcast(kk_comm *c, kk_stream *st, kk_buffer *buf, size_t count, int root)
{
	ncclDataType_t t;
	int r = kc_coll_prep(c, buf->dtype, NULL, &t, NULL);
	if (r < 0)
		return r;
	return kc_nccl_done(c, ncclBroadcast(buf->ptr, buf->ptr, count, t, root, kc_comm(c),
					     kc_stream(c->be, st)));
}
