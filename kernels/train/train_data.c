/* train_data.c — token shards (kmt_shard) and the batch sampler
 * (kmt_sampler) of kmtrain.h.
 *
 * A shard is a 32-byte header and little-endian u16/u32 token ids (the
 * format is in kmtrain.h and docs/train.md), read through mmap so a large
 * corpus costs no copy; every id is checked against the model's
 * vocabulary once, at open, so a step never meets a bad id.  The sampler is
 * a pure function of (seed, epoch, batch, rank, world): it keeps the
 * epoch's permutation of windows and nothing else, so a cursor saved in a
 * checkpoint reproduces the same batches after a restart. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kiln/strbuf.h"
#include "kmtrain.h"

#include "train-internal.h"

struct kmt_shard {
	void *map;
	size_t map_len;
	const uint8_t *ids;
	int width;
	int64_t n;
};

kmt_shard *kmt_shard_free(kmt_shard *s)
{
	if (!s)
		return NULL;
	if (s->map)
		munmap(s->map, s->map_len);
	free(s);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(kmt_shard *, kmt_shard_free);

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
	       (uint32_t) p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
	return (uint64_t) rd32(p) | (uint64_t) rd32(p + 4) << 32;
}

int64_t kmt_shard_tokens(const kmt_shard *s)
{
	return s ? s->n : 0;
}

int32_t kmt_shard_token(const kmt_shard *s, int64_t i)
{
	const uint8_t *p = s->ids + i * s->width;
	return s->width == 2 ? (int32_t) (p[0] | p[1] << 8) : (int32_t) rd32(p);
}

int kmt_shard_open(const char *path, int vocab, kmt_shard **ret, kiln_error *err)
{
	if (!path || !ret || vocab < 1)
		return km_errorf(err, -EINVAL, "kmt_shard_open: missing argument");
	_cleanup_(closep) int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return km_errorf(err, -errno, "%s: cannot open the token shard: %m", path);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return km_errorf(err, -errno, "%s: cannot stat the token shard: %m", path);
	if (!S_ISREG(st.st_mode))
		return km_errorf(err, -EBADMSG, "%s: not a regular file", path);
	if (st.st_size < KMT_SHARD_HEADER_BYTES)
		return km_errorf(err, -EBADMSG,
				 "%s: %lld bytes, shorter than the %d-byte token shard header "
				 "(truncated, or not a token shard)",
				 path, (long long) st.st_size, KMT_SHARD_HEADER_BYTES);
	uint8_t h[KMT_SHARD_HEADER_BYTES];
	ssize_t got = pread(fd, h, sizeof(h), 0);
	if (got != (ssize_t) sizeof(h))
		return km_errorf(err, got < 0 ? -errno : -EIO, "%s: cannot read the header", path);
	if (memcmp(h, KMT_SHARD_MAGIC, 8) != 0)
		return km_errorf(err, -EBADMSG,
				 "%s: byte 0: bad magic, not a token shard (expected \"%s\"; "
				 "make one with kmt_shard_write)",
				 path, KMT_SHARD_MAGIC);
	uint32_t version = rd32(h + 8), width = rd32(h + 12), hvocab = rd32(h + 24);
	uint64_t n = rd64(h + 16);
	if (version != KMT_SHARD_VERSION)
		return km_errorf(err, -EBADMSG,
				 "%s: byte 8: token shard version %u, this build reads version %d",
				 path, version, KMT_SHARD_VERSION);
	if (width != 2 && width != 4)
		return km_errorf(err, -EBADMSG,
				 "%s: byte 12: %u bytes per token id, must be 2 or 4", path, width);
	if (rd32(h + 28) != 0)
		return km_errorf(err, -EBADMSG, "%s: byte 28: reserved field is not 0", path);
	if (n > (uint64_t) KMT_SHARD_MAX_TOKENS)
		return km_errorf(err, -EBADMSG,
				 "%s: byte 16: %llu tokens, more than the %lld accepted", path,
				 (unsigned long long) n, (long long) KMT_SHARD_MAX_TOKENS);
	uint64_t want = KMT_SHARD_HEADER_BYTES + n * width;
	if ((uint64_t) st.st_size != want)
		return km_errorf(err, -EBADMSG,
				 "%s: %lld bytes, the header (%llu tokens of %u bytes) says %llu: "
				 "%s",
				 path, (long long) st.st_size, (unsigned long long) n, width,
				 (unsigned long long) want,
				 (uint64_t) st.st_size < want ? "truncated" : "trailing garbage");
	if (hvocab < 1 || hvocab > (uint32_t) vocab)
		return km_errorf(err, -ERANGE,
				 "%s: byte 24: the shard was made for a vocabulary of %u, the "
				 "model has %d: tokenize for this model",
				 path, hvocab, vocab);
	void *map = mmap(NULL, (size_t) want, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED)
		return km_errorf(err, -errno, "%s: cannot map the token shard: %m", path);
	_cleanup_(kmt_shard_freep) kmt_shard *s = calloc(1, sizeof(*s));
	if (!s) {
		munmap(map, (size_t) want);
		return km_errorf(err, -ENOMEM, "%s: out of memory", path);
	}
	s->map = map;
	s->map_len = (size_t) want;
	s->ids = (const uint8_t *) s->map + KMT_SHARD_HEADER_BYTES;
	s->width = (int) width;
	s->n = (int64_t) n;
	for (int64_t i = 0; i < s->n; i++) {
		int32_t id = kmt_shard_token(s, i);
		if (id < 0 || (uint32_t) id >= hvocab)
			return km_errorf(err, -ERANGE,
					 "%s: byte %lld: token %lld is id %u, outside the "
					 "vocabulary of %u the header declares",
					 path, (long long) (KMT_SHARD_HEADER_BYTES + i * width),
					 (long long) i, (uint32_t) id, hvocab);
	}
	*ret = TAKE_PTR(s);
	return 0;
}

int kmt_shard_write(const char *path, const uint32_t *ids, int64_t n, int vocab, int width,
		    kiln_error *err)
{
	if (!path || (!ids && n) || n < 0 || n > KMT_SHARD_MAX_TOKENS || vocab < 1 ||
	    (width != 2 && width != 4) || (width == 2 && vocab > 65536))
		return km_errorf(err, -EINVAL,
				 "kmt_shard_write: bad arguments (n %lld, vocab %d, width %d; "
				 "width 2 needs vocab <= 65536)",
				 (long long) n, vocab, width);
	for (int64_t i = 0; i < n; i++)
		if (ids[i] >= (uint32_t) vocab)
			return km_errorf(err, -ERANGE, "%s: token %lld is id %u, vocabulary is %d",
					 path, (long long) i, ids[i], vocab);
	_cleanup_free_ char *tmp = NULL;
	if (asprintf(&tmp, "%s.tmp.%d", path, (int) getpid()) < 0)
		return km_errorf(err, -ENOMEM, "%s: out of memory", path);
	_cleanup_(closep) int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return km_errorf(err, -errno, "%s: cannot create: %m", tmp);
	uint8_t h[KMT_SHARD_HEADER_BYTES] = { 0 };
	memcpy(h, KMT_SHARD_MAGIC, 8);
	uint64_t words[] = { KMT_SHARD_VERSION, (uint64_t) width, (uint64_t) n, (uint64_t) vocab };
	for (int b = 0; b < 4; b++) {
		h[8 + b] = (uint8_t) (words[0] >> (8 * b));
		h[12 + b] = (uint8_t) (words[1] >> (8 * b));
		h[24 + b] = (uint8_t) (words[3] >> (8 * b));
	}
	for (int b = 0; b < 8; b++)
		h[16 + b] = (uint8_t) (words[2] >> (8 * b));
	int r = kiln_write_all(fd, h, sizeof(h));
	/* In chunks, little-endian whatever the host. */
	enum { CHUNK = 4096 };
	uint8_t buf[CHUNK * 4];
	for (int64_t i = 0; r >= 0 && i < n; i += CHUNK) {
		int64_t k = MIN(n - i, (int64_t) CHUNK);
		for (int64_t j = 0; j < k; j++)
			for (int b = 0; b < width; b++)
				buf[j * width + b] = (uint8_t) (ids[i + j] >> (8 * b));
		r = kiln_write_all(fd, buf, (size_t) (k * width));
	}
	if (r >= 0 && fsync(fd) < 0)
		r = -errno;
	if (r >= 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		return km_errorf(err, r, "%s: writing the token shard failed: %s", path,
				 strerror(-r));
	}
	return 0;
}

/* ---- sampler ------------------------------------------------------------ */

/* Most windows one shard may be cut into: the permutation holds one int64
 * per window (8 GiB at this bound). */
#define KMT_SAMPLER_MAX_WINDOWS (INT64_C(1) << 30)

struct kmt_sampler {
	const kmt_shard *shard;
	int batch, seq_len, rank, world;
	int64_t n_windows, per_epoch;
	kmt_cursor cur;
	int64_t perm_epoch; /* the epoch perm holds, -1 none */
	int64_t *perm;
};

kmt_sampler *kmt_sampler_free(kmt_sampler *s)
{
	if (!s)
		return NULL;
	free(s->perm);
	free(s);
	return NULL;
}

int kmt_sampler_new(const kmt_shard *sh, int batch, int seq_len, int rank, int world,
		    const kmt_cursor *start, kmt_sampler **ret, kiln_error *err)
{
	if (!sh || !ret || batch < 1 || seq_len < 1 || world < 1 || world > KK_COMM_WORLD_MAX ||
	    rank < 0 || rank >= world)
		return km_errorf(err, -EINVAL,
				 "sampler: batch %d, seq_len %d, rank %d of %d: batch and seq_len "
				 "must be >= 1, 0 <= rank < world <= %d",
				 batch, seq_len, rank, world, KK_COMM_WORLD_MAX);
	if (start && (start->epoch < 0 || start->batch < 0))
		return km_errorf(err, -EINVAL, "sampler: cursor epoch %lld batch %lld is negative",
				 (long long) start->epoch, (long long) start->batch);
	int64_t W = sh->n > 0 ? (sh->n - 1) / seq_len : 0;
	int64_t need = (int64_t) world * batch;
	if (W < need)
		return km_errorf(err, -ERANGE,
				 "sampler: the shard's %lld tokens make %lld windows of %d + 1; "
				 "%d ranks x batch %d need %lld windows (%lld tokens): use a "
				 "bigger shard or a smaller batch",
				 (long long) sh->n, (long long) W, seq_len, world, batch,
				 (long long) need, (long long) (need * seq_len + 1));
	if (W > KMT_SAMPLER_MAX_WINDOWS)
		return km_errorf(err, -ERANGE,
				 "sampler: %lld windows, more than the %lld one sampler takes: "
				 "split the shard",
				 (long long) W, (long long) KMT_SAMPLER_MAX_WINDOWS);
	/* Nothing can fail after these two. */
	kmt_sampler *s = calloc(1, sizeof(*s));
	int64_t *perm = malloc((size_t) W * sizeof(int64_t));
	if (!s || !perm) {
		free(s);
		free(perm);
		return km_errorf(err, -ENOMEM, "sampler: out of memory for %lld windows",
				 (long long) W);
	}
	s->perm = perm;
	s->shard = sh;
	s->batch = batch;
	s->seq_len = seq_len;
	s->rank = rank;
	s->world = world;
	s->n_windows = W;
	s->per_epoch = W / need;
	s->perm_epoch = -1;
	if (start)
		s->cur = *start;
	/* A cursor saved at the end of an epoch moves on to the next one. */
	s->cur.epoch += s->cur.batch / s->per_epoch;
	s->cur.batch %= s->per_epoch;
	*ret = s;
	return 0;
}

int64_t kmt_sampler_batches_per_epoch(const kmt_sampler *s)
{
	return s ? s->per_epoch : 0;
}

void kmt_sampler_cursor(const kmt_sampler *s, kmt_cursor *ret)
{
	if (s && ret)
		*ret = s->cur;
}

/* The epoch's permutation of windows: Fisher-Yates over SplitMix64 seeded
 * from (seed, epoch); the bound is taken by a 128-bit multiply (Lemire),
 * whose bias is below 2^-34 for any shard this accepts. */
static void permute(kmt_sampler *s)
{
	uint64_t st = s->cur.seed ^ ((uint64_t) s->cur.epoch + 1) * UINT64_C(0xA0761D6478BD642F);
	for (int64_t i = 0; i < s->n_windows; i++)
		s->perm[i] = i;
	for (int64_t i = s->n_windows - 1; i > 0; i--) {
		uint64_t j =
			(uint64_t) (((__uint128_t) kmt__splitmix(&st) * (uint64_t) (i + 1)) >> 64);
		int64_t t = s->perm[i];
		s->perm[i] = s->perm[j];
		s->perm[j] = t;
	}
	s->perm_epoch = s->cur.epoch;
}

int kmt_sampler_next(kmt_sampler *s, int32_t *tokens, int32_t *targets, int64_t *starts)
{
	assert_return(s && tokens && targets, -EINVAL);
	if (s->perm_epoch != s->cur.epoch)
		permute(s);
	int64_t slot = (s->cur.batch * s->world + s->rank) * s->batch;
	const int T = s->seq_len;
	for (int b = 0; b < s->batch; b++) {
		int64_t w0 = s->perm[slot + b] * T;
		if (starts)
			starts[b] = w0;
		for (int t = 0; t < T; t++) {
			tokens[b * T + t] = kmt_shard_token(s->shard, w0 + t);
			targets[b * T + t] = kmt_shard_token(s->shard, w0 + t + 1);
		}
	}
	if (++s->cur.batch == s->per_epoch) {
		s->cur.batch = 0;
		s->cur.epoch++;
	}
	return 0;
}
