/* tests/train/test-train-data.c — token shards and the sampler.
 *
 * Shards: round trips in both widths, and every kind of bad file (short,
 * bad magic/version/width/reserved field, truncated, trailing bytes, ids
 * or a declared vocabulary beyond the model's) refused with the message a
 * user reads.  Sampler: determinism, seeds and epochs that differ, windows
 * disjoint across ranks within an epoch and covering what one rank of
 * world * B sees, targets = inputs shifted by one, restart from a cursor. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kmtrain.h"

static char dir[64];
static char path[128];

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/kmt-data-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/shard.tok", dir);
	return 0;
}

static int teardown(void **state)
{
	unlink(path);
	rmdir(dir);
	return 0;
}

/* ids i * 7 % vocab: every id appears, neighbours differ. */
static uint32_t *make_ids(int64_t n, int vocab)
{
	uint32_t *ids = malloc((size_t) n * sizeof(uint32_t));
	for (int64_t i = 0; i < n; i++)
		ids[i] = (uint32_t) ((i * 7 + i / 13) % vocab);
	return ids;
}

static void write_ok(int64_t n, int vocab, int width)
{
	uint32_t *ids = make_ids(n, vocab);
	kiln_error err = { 0 };
	assert_int_equal(kmt_shard_write(path, ids, n, vocab, width, &err), 0);
	free(ids);
}

static void test_roundtrip(void **state)
{
	const int widths[] = { 2, 4 };
	for (int w = 0; w < 2; w++) {
		int vocab = widths[w] == 2 ? 65536 : 100000;
		uint32_t *ids = make_ids(1000, vocab);
		ids[3] = (uint32_t) vocab - 1; /* the largest id survives */
		kiln_error err = { 0 };
		assert_int_equal(kmt_shard_write(path, ids, 1000, vocab, widths[w], &err), 0);
		kmt_shard *s = NULL;
		assert_int_equal(kmt_shard_open(path, vocab, &s, &err), 0);
		assert_int_equal(kmt_shard_tokens(s), 1000);
		for (int64_t i = 0; i < 1000; i++)
			assert_int_equal(kmt_shard_token(s, i), ids[i]);
		kmt_shard_free(s);
		/* Exactly header + n * width bytes. */
		FILE *f = fopen(path, "rb");
		fseek(f, 0, SEEK_END);
		assert_int_equal(ftell(f), KMT_SHARD_HEADER_BYTES + 1000 * widths[w]);
		fclose(f);
		free(ids);
	}
	kiln_error err = { 0 };
	uint32_t bad[2] = { 1, 70000 };
	assert_int_equal(kmt_shard_write(path, bad, 2, 70001, 2, &err), -EINVAL);
	assert_int_equal(kmt_shard_write(path, bad, 2, 70000, 4, &err), -ERANGE);
}

/* Rewrites bytes [off, off + len) of the shard. */
static void poke(long off, const void *bytes, size_t len)
{
	int fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, bytes, len, off), (ssize_t) len);
	close(fd);
}

static void expect_fail(int vocab, int code, const char *msg)
{
	kmt_shard *s = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_shard_open(path, vocab, &s, &err), code);
	assert_null(s);
	char want[512];
	snprintf(want, sizeof(want), "%s: %s", path, msg);
	assert_string_equal(err.msg, want);
}

static void test_bad_files(void **state)
{
	uint32_t v;
	write_ok(100, 50, 2);
	poke(0, "KILNTOX1", 8);
	expect_fail(50, -EBADMSG,
		    "byte 0: bad magic, not a token shard (expected \"KILNTOK1\"; make one with "
		    "kmt_shard_write)");
	write_ok(100, 50, 2);
	v = 2;
	poke(8, &v, 4);
	expect_fail(50, -EBADMSG, "byte 8: token shard version 2, this build reads version 1");
	write_ok(100, 50, 2);
	v = 3;
	poke(12, &v, 4);
	expect_fail(50, -EBADMSG, "byte 12: 3 bytes per token id, must be 2 or 4");
	write_ok(100, 50, 2);
	v = 1;
	poke(28, &v, 4);
	expect_fail(50, -EBADMSG, "byte 28: reserved field is not 0");
	/* The header claims more tokens than the file holds. */
	write_ok(100, 50, 2);
	assert_int_equal(truncate(path, KMT_SHARD_HEADER_BYTES + 150), 0);
	expect_fail(50, -EBADMSG,
		    "182 bytes, the header (100 tokens of 2 bytes) says 232: truncated");
	write_ok(100, 50, 2);
	assert_int_equal(truncate(path, KMT_SHARD_HEADER_BYTES + 201), 0);
	expect_fail(50, -EBADMSG,
		    "233 bytes, the header (100 tokens of 2 bytes) says 232: trailing garbage");
	assert_int_equal(truncate(path, 10), 0);
	expect_fail(50, -EBADMSG,
		    "10 bytes, shorter than the 32-byte token shard header (truncated, or not a "
		    "token shard)");
	/* A token count so large the size would overflow. */
	write_ok(100, 50, 4);
	uint64_t huge = UINT64_C(1) << 62;
	poke(16, &huge, 8);
	expect_fail(50, -EBADMSG,
		    "byte 16: 4611686018427387904 tokens, more than the "
		    "1099511627776 accepted");
	/* Ids beyond the vocabulary: the declared one, and one inside. */
	write_ok(100, 50, 2);
	expect_fail(40, -ERANGE,
		    "byte 24: the shard was made for a vocabulary of 50, the model has 40: "
		    "tokenize for this model");
	uint16_t id = 60;
	poke(KMT_SHARD_HEADER_BYTES + 2 * 17, &id, 2);
	expect_fail(50, -ERANGE,
		    "byte 66: token 17 is id 60, outside the vocabulary of 50 the header declares");
	/* A model with a larger vocabulary takes a shard made for a smaller one. */
	write_ok(100, 50, 2);
	kmt_shard *s = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_shard_open(path, 512, &s, &err), 0);
	kmt_shard_free(s);
	unlink(path);
	assert_int_equal(kmt_shard_open(path, 50, &s, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "cannot open the token shard: No such file"));
}

/* ---- sampler ------------------------------------------------------------ */

enum { T = 8, B = 3, NTOK = 1000 }; /* (1000 - 1) / 8 = 124 windows */

static kmt_shard *open_shard(void)
{
	write_ok(NTOK, 500, 2);
	kmt_shard *s = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_shard_open(path, 500, &s, &err), 0);
	return s;
}

static kmt_sampler *sampler(kmt_shard *sh, int batch, int rank, int world, const kmt_cursor *c)
{
	kmt_sampler *s = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_sampler_new(sh, batch, T, rank, world, c, &s, &err), 0);
	return s;
}

static void test_sampler_windows(void **state)
{
	kmt_shard *sh = open_shard();
	kmt_cursor c = { .seed = 5 };
	kmt_sampler *s = sampler(sh, B, 0, 1, &c);
	assert_int_equal(kmt_sampler_batches_per_epoch(s), 124 / B);
	int32_t tok[B * T], tgt[B * T];
	int64_t st[B];
	int seen[124] = { 0 };
	for (int b = 0; b < 124 / B; b++) {
		assert_int_equal(kmt_sampler_next(s, tok, tgt, st), 0);
		for (int i = 0; i < B; i++) {
			assert_int_equal(st[i] % T, 0);
			seen[st[i] / T]++;
			for (int t = 0; t < T; t++) {
				assert_int_equal(tok[i * T + t], kmt_shard_token(sh, st[i] + t));
				assert_int_equal(tgt[i * T + t],
						 kmt_shard_token(sh, st[i] + t + 1));
			}
		}
	}
	/* One epoch: no window twice; the 124 % 3 = 1 left over waits. */
	int once = 0;
	for (int w = 0; w < 124; w++) {
		assert_true(seen[w] <= 1);
		once += seen[w];
	}
	assert_int_equal(once, 123);
	kmt_cursor cur;
	kmt_sampler_cursor(s, &cur);
	assert_int_equal(cur.epoch, 1);
	assert_int_equal(cur.batch, 0);
	kmt_sampler_free(s);
	kmt_shard_free(sh);
}

/* All starts of n batches of a sampler. */
static void starts_of(kmt_sampler *s, int batch, int n, int64_t *out)
{
	int32_t tok[64 * T], tgt[64 * T];
	for (int b = 0; b < n; b++)
		assert_int_equal(kmt_sampler_next(s, tok, tgt, out + b * batch), 0);
}

static void test_sampler_determinism(void **state)
{
	kmt_shard *sh = open_shard();
	enum { N = 80 }; /* past the first epoch (41 batches) */
	int64_t a[N * B], b[N * B], c[N * B];
	kmt_cursor c5 = { .seed = 5 }, c6 = { .seed = 6 };
	kmt_sampler *s = sampler(sh, B, 0, 1, &c5);
	starts_of(s, B, N, a);
	kmt_sampler_free(s);
	s = sampler(sh, B, 0, 1, &c5);
	starts_of(s, B, N, b);
	kmt_sampler_free(s);
	assert_memory_equal(a, b, sizeof(a));
	s = sampler(sh, B, 0, 1, &c6);
	starts_of(s, B, N, c);
	kmt_sampler_free(s);
	assert_memory_not_equal(a, c, sizeof(a));
	/* Epoch 1 is another permutation than epoch 0. */
	assert_memory_not_equal(a, a + 41 * B, 10 * B * sizeof(int64_t));
	/* Restart from a cursor taken mid-way (and from one at an epoch's
	 * end): the same batches follow. */
	const int cuts[] = { 17, 41 };
	for (int k = 0; k < 2; k++) {
		s = sampler(sh, B, 0, 1, &c5);
		starts_of(s, B, cuts[k], b);
		kmt_cursor cur;
		kmt_sampler_cursor(s, &cur);
		kmt_sampler_free(s);
		s = sampler(sh, B, 0, 1, &cur);
		starts_of(s, B, N - cuts[k], b + cuts[k] * B);
		kmt_sampler_free(s);
		assert_memory_equal(a, b, sizeof(a));
	}
	kmt_shard_free(sh);
}

static void test_sampler_ranks(void **state)
{
	kmt_shard *sh = open_shard();
	enum { W = 3, BR = 2, N = 20 }; /* 124 / 6 = 20 batches per epoch */
	int64_t one[N * W * BR], r[W][N * BR];
	kmt_cursor c = { .seed = 9, .epoch = 2 };
	kmt_sampler *s = sampler(sh, W * BR, 0, 1, &c);
	assert_int_equal(kmt_sampler_batches_per_epoch(s), N);
	starts_of(s, W * BR, N, one);
	kmt_sampler_free(s);
	int seen[124] = { 0 };
	for (int k = 0; k < W; k++) {
		s = sampler(sh, BR, k, W, &c);
		assert_int_equal(kmt_sampler_batches_per_epoch(s), N);
		starts_of(s, BR, N, r[k]);
		kmt_sampler_free(s);
		for (int i = 0; i < N * BR; i++)
			seen[r[k][i] / T]++;
	}
	/* Disjoint within the epoch, and rank k's part of batch b is the k-th
	 * slice of the single sampler's batch b. */
	for (int w = 0; w < 124; w++)
		assert_true(seen[w] <= 1);
	for (int b = 0; b < N; b++)
		for (int k = 0; k < W; k++)
			assert_memory_equal(&r[k][b * BR], &one[(b * W + k) * BR],
					    BR * sizeof(int64_t));
	/* Too few windows for the world. */
	kmt_sampler *bad = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_sampler_new(sh, 50, T, 0, 3, NULL, &bad, &err), -ERANGE);
	assert_string_equal(err.msg, "sampler: the shard's 1000 tokens make 124 windows of 8 + 1; "
				     "3 ranks x batch 50 need 150 windows (1201 tokens): use a "
				     "bigger shard or a smaller batch");
	assert_int_equal(kmt_sampler_new(sh, 2, T, 3, 3, NULL, &bad, &err), -EINVAL);
	assert_null(bad);
	kmt_shard_free(sh);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),	cmocka_unit_test(test_bad_files),
		cmocka_unit_test(test_sampler_windows), cmocka_unit_test(test_sampler_determinism),
		cmocka_unit_test(test_sampler_ranks),
	};
	return cmocka_run_group_tests_name("train-data", tests, setup, teardown);
}
