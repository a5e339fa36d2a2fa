/* kernels/cuda/nccl.cu — collectives of the CUDA backend over NCCL.
 *
 * kk_comm_get_id() is ncclGetUniqueId() on rank 0 (its 128 bytes are
 * KK_COMM_ID_BYTES; kiln-run hands them to every rank through its
 * rendezvous store), kk_comm_init() is ncclCommInitRank() on the backend's
 * device.  Each collective is one NCCL call queued on the caller's stream;
 * KK_AVG maps to ncclAvg.  NCCL reduces in the buffer's dtype (bf16 sums are
 * rounded per step), unlike the cpu backend which reduces in f32.
 * UNVERIFIED on a GPU. */
#include <errno.h>
#include <string.h>

#include <nccl.h>

#include "kc.h"

static int kc_nccl_type(kk_dtype t, ncclDataType_t *ret)
{
	switch (t) {
	case KK_F32:
		*ret = ncclFloat32;
		return 0;
	case KK_BF16:
		*ret = ncclBfloat16;
		return 0;
	case KK_F16:
		*ret = ncclFloat16;
		return 0;
	default:
		return -EOPNOTSUPP;
	}
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
	r = kc_errno_nccl(ncclCommInitRank(&comm, c->world, u, c->rank));
	if (r < 0)
		return r;
	c->impl = comm;
	return 0;
}

extern "C" void kc_op_comm_free(kk_comm *c)
{
	if (c->impl)
		ncclCommDestroy(kc_comm(c));
	c->impl = NULL;
}

extern "C" int kc_op_all_reduce(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
				size_t count, kk_reduce_op op)
{
	ncclDataType_t t;
	ncclRedOp_t o;
	int r = kc_nccl_type(send->dtype, &t);
	if (r < 0)
		return r;
	r = kc_nccl_op(op, &o);
	if (r < 0)
		return r;
	return kc_errno_nccl(
		ncclAllReduce(send->ptr, recv->ptr, count, t, o, kc_comm(c), kc_stream(c->be, st)));
}

extern "C" int kc_op_reduce_scatter(kk_comm *c, kk_stream *st, kk_buffer *recv,
				    const kk_buffer *send, size_t count, kk_reduce_op op)
{
	ncclDataType_t t;
	ncclRedOp_t o;
	int r = kc_nccl_type(send->dtype, &t);
	if (r < 0)
		return r;
	r = kc_nccl_op(op, &o);
	if (r < 0)
		return r;
	return kc_errno_nccl(ncclReduceScatter(send->ptr, recv->ptr, count, t, o, kc_comm(c),
					       kc_stream(c->be, st)));
}

extern "C" int kc_op_all_gather(kk_comm *c, kk_stream *st, kk_buffer *recv, const kk_buffer *send,
				size_t count)
{
	ncclDataType_t t;
	int r = kc_nccl_type(send->dtype, &t);
	if (r < 0)
		return r;
	return kc_errno_nccl(
		ncclAllGather(send->ptr, recv->ptr, count, t, kc_comm(c), kc_stream(c->be, st)));
}

extern "C" int kc_op_broadcast(kk_comm *c, kk_stream *st, kk_buffer *buf, size_t count, int root)
{
	ncclDataType_t t;
	int r = kc_nccl_type(buf->dtype, &t);
	if (r < 0)
		return r;
	return kc_errno_nccl(ncclBroadcast(buf->ptr, buf->ptr, count, t, root, kc_comm(c),
					   kc_stream(c->be, st)));
}
