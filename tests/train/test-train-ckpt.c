/* tests/train/test-train-ckpt.c — kmt_save / kmt_load.
 *
 * Round trip (parameters, both AdamW moments, step, cursor, RNG bit for
 * bit); the file is plain safetensors with the canonical names and loads
 * into an inference model (km_model_new) with the same logits; truncated,
 * corrupted (NaN), foreign and wrong-config files are refused with a clear
 * error and leave the model untouched; and resume is exact: N steps
 * straight equal k steps, save, then N - k steps in a fresh process that
 * loads the checkpoint and restarts the sampler from its cursor. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kk.h"
#include "kmf.h"
#include "kmodel.h"
#include "kmtrain.h"

#include "../lib/model-test.h"

static kk_backend *be;
static char dir[64], ckpt[128], shard[128];

enum { B = 2, T = 8 };

static km_config cfg; /* set in main(): kiln_test_config */

static const kmt_optim optim = KILN_TEST_OPTIM(1e-2f, 1e-3f, 2, 8, 1.0f);

static kmt_model *new_model(kk_backend *b, uint64_t seed)
{
	kmt_opts o = { .batch = B, .seq_len = T, .init_seed = seed };
	kmt_model *m = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_model_new(b, &cfg, &o, NULL, &m, &err), 0);
	return m;
}

/* Parameters, m and v of the whole model, concatenated. */
static float *snapshot(kmt_model *m)
{
	size_t n = kmt_param_count(m), off = 0;
	float *h = malloc(3 * n * sizeof(float));
	for (int w = 0; w < 3; w++)
		for (size_t i = 0; i < kmt_tensor_count(m); i++) {
			size_t k = kmt_tensor_numel(m, i);
			assert_int_equal(kmt_tensor_get(m,
							(kmt_which[]){ KMT_PARAM, KMT_ADAM_M,
								       KMT_ADAM_V }[w],
							kmt_tensor_name(m, i), h + off, k),
					 0);
			off += k;
		}
	return h;
}

/* Trains n steps from the sampler. */
static void train(kmt_model *m, kmt_sampler *s, int n)
{
	int32_t tok[B * T], tgt[B * T];
	kiln_error err = { 0 };
	for (int i = 0; i < n; i++) {
		assert_int_equal(kmt_sampler_next(s, tok, tgt, NULL), 0);
		kmt_batch b = { .tokens = tok, .targets = tgt, .n_seqs = B };
		assert_int_equal(kmt_step(m, &b, NULL, &optim, NULL, &err), 0);
	}
}

static kmt_shard *open_shard(void)
{
	kmt_shard *s = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_shard_open(shard, cfg.vocab_size, &s, &err), 0);
	return s;
}

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/kmt-ckpt-XXXXXX");
	if (!mkdtemp(dir) || kk_backend_open("cpu", &be) < 0)
		return -1;
	snprintf(ckpt, sizeof(ckpt), "%s/model.safetensors", dir);
	snprintf(shard, sizeof(shard), "%s/data.tok", dir);
	uint32_t ids[600];
	uint64_t z = 3;
	for (int i = 0; i < 600; i++) {
		z = z * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (uint32_t) ((z >> 33) % (uint64_t) cfg.vocab_size);
	}
	kiln_error err = { 0 };
	return kmt_shard_write(shard, ids, 600, cfg.vocab_size, 2, &err);
}

static int teardown(void **state)
{
	unlink(ckpt);
	unlink(shard);
	rmdir(dir);
	kk_backend_free(be);
	return 0;
}

static void test_roundtrip(void **state)
{
	kmt_shard *sh = open_shard();
	kmt_sampler *s = NULL;
	kiln_error err = { 0 };
	kmt_cursor c0 = { .seed = UINT64_MAX - 3 };
	assert_int_equal(kmt_sampler_new(sh, B, T, 0, 1, &c0, &s, &err), 0);
	kmt_model *m = new_model(be, 1);
	train(m, s, 3);
	kmt_ckpt_state st = { .rng = 0xDEADBEEFCAFEF00Dull };
	kmt_sampler_cursor(s, &st.cursor);
	assert_int_equal(kmt_save(m, ckpt, &st, &err), 0);

	kmt_model *m2 = new_model(be, 2);
	kmt_ckpt_state got = { { 0 }, 0 };
	assert_int_equal(kmt_load(m2, ckpt, &got, &err), 0);
	assert_int_equal(kmt_model_step(m2), 3);
	assert_memory_equal(&got, &st, sizeof(st));
	float *a = snapshot(m), *b = snapshot(m2);
	assert_memory_equal(a, b, 3 * kmt_param_count(m) * sizeof(float));
	/* The moments are not zero: the comparison covers real state. */
	double msum = 0;
	for (size_t i = kmt_param_count(m); i < 3 * kmt_param_count(m); i++)
		msum += fabs(a[i]);
	assert_true(msum > 0);
	free(a);
	free(b);

	/* A plain safetensors file: canonical names, prefixed moments, the
	 * metadata strings. */
	kmf_file *f = NULL;
	kiln_error ke;
	assert_int_equal(kmf_open(ckpt, &f, &ke), 0);
	const kmf_tensor *t = kmf_tensor_find(f, "tok_embeddings.weight");
	assert_non_null(t);
	assert_int_equal(t->dtype, KMF_F32);
	assert_int_equal(t->ndim, 2);
	assert_int_equal(t->shape[0], 37);
	assert_int_equal(t->shape[1], 16);
	assert_non_null(kmf_tensor_find(f, "optim.m.layers.1.feed_forward.w2.weight"));
	assert_non_null(kmf_tensor_find(f, "optim.v.norm.weight"));
	assert_int_equal(kmf_tensor_count(f), 3 * kmt_tensor_count(m));
	const char *v = NULL;
	assert_int_equal(kmf_meta_get_str(f, "kiln.step", &v), 0);
	assert_string_equal(v, "3");
	assert_int_equal(kmf_meta_get_str(f, "kiln.data.seed", &v), 0);
	assert_string_equal(v, "18446744073709551612");
	kmf_close(f);

	/* The inference side loads the trained weights by name. */
	km_weight_source src = kmt_weight_source(m2);
	km_model_opts mo = { .weight_dtype = KK_F32, .max_tokens = 8, .max_seqs = 1 };
	km_model *im = NULL;
	assert_int_equal(km_model_new(be, &cfg, &mo, &src, &im, &err), 0);
	km_model_free(im);

	kmt_model_free(m);
	kmt_model_free(m2);
	kmt_sampler_free(s);
	kmt_shard_free(sh);
}

/* Loading must fail with `code` and a message containing `msg`, leaving the
 * model as it was. */
static void expect_refused(const char *path, const km_config *c, int code, const char *msg)
{
	kmt_opts o = { .batch = B, .seq_len = T, .init_seed = 42 };
	kmt_model *m = NULL;
	kiln_error err = { 0 };
	assert_int_equal(kmt_model_new(be, c, &o, NULL, &m, &err), 0);
	float *before = snapshot(m);
	kmt_ckpt_state st = { .rng = 7 };
	int r = kmt_load(m, path, &st, &err);
	if (r != code || !strstr(err.msg, msg))
		fail_msg("load: %d '%s', wanted %d '%s'", r, err.msg, code, msg);
	float *after = snapshot(m);
	assert_memory_equal(before, after, 3 * kmt_param_count(m) * sizeof(float));
	assert_int_equal(kmt_model_step(m), 0);
	assert_int_equal(st.rng, 7);
	free(before);
	free(after);
	kmt_model_free(m);
}

static void copy_file(const char *from, const char *to, long len)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	assert_non_null(a);
	assert_non_null(b);
	int ch;
	for (long i = 0; (len < 0 || i < len) && (ch = fgetc(a)) != EOF; i++)
		fputc(ch, b);
	fclose(a);
	fclose(b);
}

static void test_bad_checkpoints(void **state)
{
	kmt_model *m = new_model(be, 1);
	kiln_error err = { 0 };
	assert_int_equal(kmt_save(m, ckpt, NULL, &err), 0);
	struct stat sb;
	assert_int_equal(stat(ckpt, &sb), 0);
	char bad[160];
	snprintf(bad, sizeof(bad), "%s/bad.safetensors", dir);

	/* Truncated anywhere: in the header length, the JSON, the data. */
	const long cuts[] = { 4, 100, (long) sb.st_size / 2, (long) sb.st_size - 1 };
	for (size_t i = 0; i < 4; i++) {
		copy_file(ckpt, bad, cuts[i]);
		expect_refused(bad, &cfg, -EBADMSG, bad);
	}
	/* A NaN in the last tensor's data. */
	copy_file(ckpt, bad, -1);
	int fd = open(bad, O_WRONLY);
	float nan = NAN;
	assert_int_equal(pwrite(fd, &nan, 4, sb.st_size - 4), 4);
	close(fd);
	expect_refused(bad, &cfg, -EBADMSG, "the checkpoint is damaged");
	/* Another config. */
	km_config c2 = cfg;
	c2.hidden_dim = 32;
	expect_refused(ckpt, &c2, -EINVAL,
		       "the checkpoint's hidden_dim is 24, the model's 32: load it into a model "
		       "of the same config");
	c2 = cfg;
	c2.rope_theta = 500000.0f;
	expect_refused(ckpt, &c2, -EINVAL, "rope_theta is 10000, the model has 500000");
	/* A safetensors file that is not a kmtrain checkpoint. */
	kmf_writer *w = NULL;
	assert_int_equal(kmf_writer_new(&w), 0);
	float x[4] = { 0 };
	assert_int_equal(kmf_writer_add(w, "x", KMF_F32, 1, (int64_t[]){ 4 }, x, sizeof(x)), 0);
	kiln_error ke;
	assert_int_equal(kmf_writer_commit(w, bad, 0644, &ke), 0);
	kmf_writer_free(w);
	expect_refused(bad, &cfg, -EBADMSG, "not a kmtrain checkpoint");
	unlink(bad);
	expect_refused(bad, &cfg, -ENOENT, bad);
	kmt_model_free(m);
}

/* ---- resume ----------------------------------------------------------------- */

enum { N_STEPS = 7, K_STEPS = 3 };

/* The second half in a fresh process: new backend, new model (another
 * seed, so nothing is inherited but the file), load, N - K steps. */
static int resume_child(const char *out)
{
	kk_backend *b = NULL;
	if (kk_backend_open("cpu", &b) < 0)
		return 2;
	kmt_opts o = { .batch = B, .seq_len = T, .init_seed = 999 };
	kmt_model *m = NULL;
	kiln_error err = { 0 };
	kmt_ckpt_state st;
	kmt_shard *sh = NULL;
	kmt_sampler *s = NULL;
	if (kmt_model_new(b, &cfg, &o, NULL, &m, &err) < 0 || kmt_load(m, ckpt, &st, &err) < 0 ||
	    kmt_shard_open(shard, cfg.vocab_size, &sh, &err) < 0 ||
	    kmt_sampler_new(sh, B, T, 0, 1, &st.cursor, &s, &err) < 0) {
		fprintf(stderr, "resume: %s\n", err.msg);
		return 3;
	}
	int32_t tok[B * T], tgt[B * T];
	for (int i = K_STEPS; i < N_STEPS; i++) {
		kmt_sampler_next(s, tok, tgt, NULL);
		kmt_batch bt = { .tokens = tok, .targets = tgt, .n_seqs = B };
		if (kmt_step(m, &bt, NULL, &optim, NULL, &err) < 0)
			return 4;
	}
	size_t n = kmt_param_count(m), off = 0;
	float *h = malloc(3 * n * sizeof(float));
	for (int w = 0; w < 3; w++)
		for (size_t i = 0; i < kmt_tensor_count(m); i++) {
			size_t k = kmt_tensor_numel(m, i);
			kmt_tensor_get(m, (kmt_which[]){ KMT_PARAM, KMT_ADAM_M, KMT_ADAM_V }[w],
				       kmt_tensor_name(m, i), h + off, k);
			off += k;
		}
	FILE *f = fopen(out, "wb");
	if (!f || fwrite(h, sizeof(float), 3 * n, f) != 3 * n || fclose(f))
		return 5;
	if (kmt_model_step(m) != N_STEPS)
		return 6;
	free(h);
	kmt_sampler_free(s);
	kmt_shard_free(sh);
	kmt_model_free(m);
	kk_backend_free(b);
	return 0;
}

static void test_resume_exact(void **state)
{
	kmt_shard *sh = open_shard();
	kiln_error err = { 0 };
	kmt_cursor c0 = { .seed = 12 };
	/* Straight through. */
	kmt_sampler *s = NULL;
	assert_int_equal(kmt_sampler_new(sh, B, T, 0, 1, &c0, &s, &err), 0);
	/* 599 / 8 = 74 windows, 37 batches an epoch: N_STEPS stays inside
	 * one; restarts across an epoch are test-train-data's. */
	kmt_model *m = new_model(be, 1);
	train(m, s, N_STEPS);
	float *want = snapshot(m);
	kmt_model_free(m);
	kmt_sampler_free(s);

	/* K steps, save. */
	assert_int_equal(kmt_sampler_new(sh, B, T, 0, 1, &c0, &s, &err), 0);
	m = new_model(be, 1);
	train(m, s, K_STEPS);
	kmt_ckpt_state st = { 0 };
	kmt_sampler_cursor(s, &st.cursor);
	assert_int_equal(kmt_save(m, ckpt, &st, &err), 0);
	kmt_model_free(m);
	kmt_sampler_free(s);

	char out[160];
	snprintf(out, sizeof(out), "%s/resumed.bin", dir);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(60);
		_exit(resume_child(out));
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	size_t n = 3 * kmt_param_count(m = new_model(be, 1));
	float *got = malloc(n * sizeof(float));
	FILE *f = fopen(out, "rb");
	assert_non_null(f);
	assert_int_equal(fread(got, sizeof(float), n, f), n);
	fclose(f);
	unlink(out);
	assert_memory_equal(want, got, n * sizeof(float));
	/* Sanity: the weights did move away from the initial ones. */
	float *init = snapshot(m);
	assert_memory_not_equal(init, want, n / 3 * sizeof(float));
	free(init);
	free(want);
	free(got);
	kmt_model_free(m);
	kmt_shard_free(sh);
}

int main(void)
{
	cfg = kiln_test_config(16, 24, 2, 4, 2, 37, 16, KK_ROPE_INTERLEAVED, false);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_bad_checkpoints),
		cmocka_unit_test(test_resume_exact),
	};
	return cmocka_run_group_tests_name("train-ckpt", tests, setup, teardown);
}
