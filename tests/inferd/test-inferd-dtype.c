/* test-inferd-dtype.c — --dtype auto (services/inferd/dtype.c): the dtype
 * kiln-inferd serves a model file with when told nothing.
 *
 * Real files of each type, written here (GGUF by the small writer below:
 * F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; safetensors by kmf_writer:
 * f32, bf16, f16; the tiny260K llama2.c fixture), give the stored dtype of
 * their weight matrices (a GGUF with a Q6_K classifier beside Q4_0 layers
 * is Q4_0); each stored dtype then maps to the dtype as stored on a backend
 * that computes on everything (the cpu backend, asked through kk_supports,
 * and the cuda backend's answers) and to the closest one on backends that
 * lack it, with the reason.  The kiln-inferd log line is checked in
 * test-inferd.sh. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../services/inferd/inferd.h"
#include "../lib/fixture.h"

static char dir[] = "/tmp/kiln-inferd-dtype.XXXXXX";

/* ---- files ----------------------------------------------------------------- */

static void put(FILE *f, const void *p, size_t n)
{
	assert_int_equal(fwrite(p, 1, n, f), n);
}

static void put_str(FILE *f, const char *s)
{
	uint64_t n = strlen(s);
	put(f, &n, 8);
	put(f, s, n);
}

/* GGML type ids, and bytes per block of 32 or 256. */
enum {
	G_F32 = 0,
	G_F16 = 1,
	G_Q4_0 = 2,
	G_Q4_1 = 3,
	G_Q8_0 = 8,
	G_Q4_K = 12,
	G_Q6_K = 14,
	G_BF16 = 30
};

static uint64_t gg_bytes(int type, uint64_t n)
{
	switch (type) {
	case G_F32:
		return 4 * n;
	case G_F16:
	case G_BF16:
		return 2 * n;
	case G_Q4_0:
		return n / 32 * 18;
	case G_Q4_1:
		return n / 32 * 20;
	case G_Q8_0:
		return n / 32 * 34;
	case G_Q4_K:
		return n / 256 * 144;
	default:
		return n / 256 * 210;
	}
}

/* A GGUF v3 file: a norm [256] in F32, two [256, 256] matrices of
 * `layers`, and a [512, 256] classifier of `head` (zero data). */
static void write_gguf(const char *path, int layers, int head)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	const struct {
		const char *name;
		int ndim, type;
		uint64_t ne[2];
	} t[] = {
		{ "output_norm.weight", 1, G_F32, { 256 } },
		{ "blk.0.attn_q.weight", 2, layers, { 256, 256 } },
		{ "blk.0.attn_k.weight", 2, layers, { 256, 256 } },
		{ "output.weight", 2, head, { 256, 512 } },
	};
	const uint32_t version = 3;
	const uint64_t nt = 4, nkv = 0;
	put(f, "GGUF", 4);
	put(f, &version, 4);
	put(f, &nt, 8);
	put(f, &nkv, 8);
	uint64_t off = 0, sizes[4];
	for (int i = 0; i < 4; i++) {
		const uint32_t nd = (uint32_t) t[i].ndim, ty = (uint32_t) t[i].type;
		put_str(f, t[i].name);
		put(f, &nd, 4);
		put(f, t[i].ne, 8 * nd);
		put(f, &ty, 4);
		put(f, &off, 8);
		sizes[i] = gg_bytes(t[i].type, t[i].ne[0] * (nd > 1 ? t[i].ne[1] : 1));
		off += (sizes[i] + 31) / 32 * 32;
	}
	static const char zero[4096];
	long pos = ftell(f);
	put(f, zero, (size_t) ((32 - pos % 32) % 32));
	for (int i = 0; i < 4; i++) {
		uint64_t left = (sizes[i] + 31) / 32 * 32;
		while (left) {
			size_t n = left < sizeof(zero) ? (size_t) left : sizeof(zero);
			put(f, zero, n);
			left -= n;
		}
	}
	assert_int_equal(fclose(f), 0);
}

/* A safetensors file of dtype dt: a [64] norm in f32 and two [64, 64]
 * matrices in dt. */
static void write_st(const char *path, kmf_dtype dt)
{
	static uint8_t m[64 * 64 * 4], v[64 * 4];
	const int64_t s2[2] = { 64, 64 }, s1[1] = { 64 };
	const uint64_t mb = 64 * 64 * (dt == KMF_F32 ? 4 : 2);
	kmf_writer *w = NULL;
	kiln_error err = {};
	assert_int_equal(kmf_writer_new(&w), 0);
	assert_int_equal(kmf_writer_add(w, "norm.weight", KMF_F32, 1, s1, v, sizeof(v)), 0);
	assert_int_equal(kmf_writer_add(w, "layers.0.attention.wq.weight", dt, 2, s2, m, mb), 0);
	assert_int_equal(kmf_writer_add(w, "tok_embeddings.weight", dt, 2, s2, m, mb), 0);
	assert_int_equal(kmf_writer_commit(w, path, 0644, &err), 0);
	kmf_writer_free(w);
}

static void expect_stored(const char *path, kmf_dtype want, double share)
{
	kmf_dtype got;
	double s;
	kiln_error err = {};
	if (inferd_file_weight_dtype(path, &got, &s, &err) < 0)
		fail_msg("%s: %s", path, err.msg);
	if (got != want)
		fail_msg("%s: stored as %s, want %s", path, kmf_dtype_name(got),
			 kmf_dtype_name(want));
	assert_true(s > share - 1e-9 && s < share + 1e-9);
}

static void test_stored_dtype(void **state)
{
	(void) state;
	static const struct {
		int layers, head;
		kmf_dtype want;
	} gg[] = {
		{ G_F32, G_F32, KMF_F32 },    { G_F16, G_F16, KMF_F16 },
		{ G_BF16, G_BF16, KMF_BF16 }, { G_Q8_0, G_Q8_0, KMF_Q8_0 },
		{ G_Q4_0, G_Q4_0, KMF_Q4_0 }, { G_Q4_1, G_Q4_1, KMF_Q4_1 },
		{ G_Q4_K, G_Q4_K, KMF_Q4_K }, { G_Q6_K, G_Q6_K, KMF_Q6_K },
	};
	char path[sizeof(dir) + 32];
	for (size_t i = 0; i < sizeof(gg) / sizeof(gg[0]); i++) {
		snprintf(path, sizeof(path), "%s/m%zu.gguf", dir, i);
		write_gguf(path, gg[i].layers, gg[i].head);
		expect_stored(path, gg[i].want, 1);
	}
	/* llama.cpp's Q4_0 files keep the classifier in Q6_K: the layers
	 * hold the most (2 x 256 x 256 of 2 x 256 x 256 + 512 x 256). */
	snprintf(path, sizeof(path), "%s/mixed.gguf", dir);
	write_gguf(path, G_Q4_0, G_Q6_K);
	expect_stored(path, KMF_Q4_0, 0.5);
	static const kmf_dtype st[] = { KMF_F32, KMF_BF16, KMF_F16 };
	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/m%zu.safetensors", dir, i);
		write_st(path, st[i]);
		expect_stored(path, st[i], 1);
	}
	const char *fixture = kiln_test_model_fixture();
	if (fixture)
		expect_stored(fixture, KMF_F32, 1);
	else
		fail_msg("model fixture %s is not readable: %s", kiln_test_model_path(),
			 KILN_TEST_FIXTURE_HINT);
	/* Not a model file: kmf's error, naming it. */
	snprintf(path, sizeof(path), "%s/junk", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("not a model\n", f);
	fclose(f);
	kmf_dtype got;
	double s;
	kiln_error err = {};
	assert_true(inferd_file_weight_dtype(path, &got, &s, &err) < 0);
	assert_true(strstr(err.file, "junk") || strstr(err.msg, "junk"));
}

/* ---- the choice ------------------------------------------------------------- */

/* A backend's answers as a bit set of kk dtypes. */
static bool ok_mask(const void *ctx, kk_dtype dt)
{
	return (*(const unsigned *) ctx >> dt) & 1;
}

#define ALL ((1u << KK_F32) | (1u << KK_BF16) | (1u << KK_F16) | (1u << KK_I8) | (1u << KK_Q4))

static void expect_choice(kmf_dtype stored, unsigned mask, kk_dtype want, const char *why_has)
{
	char why[160];
	kk_dtype got = inferd_dtype_auto(stored, ok_mask, &mask, why, sizeof(why));
	if (got != want || !strstr(why, why_has))
		fail_msg("%s on %#x: %s (%s), want %s (\"%s\")", kmf_dtype_name(stored), mask,
			 kk_dtype_name(got), why, kk_dtype_name(want), why_has);
}

static void test_choice(void **state)
{
	(void) state;
	/* As stored, where the backend computes on it. */
	expect_choice(KMF_F32, ALL, KK_F32, "as stored (F32)");
	expect_choice(KMF_BF16, ALL, KK_BF16, "as stored (BF16)");
	expect_choice(KMF_F16, ALL, KK_F16, "as stored (F16)");
	expect_choice(KMF_Q8_0, ALL, KK_I8, "as stored (Q8_0)");
	expect_choice(KMF_Q4_0, ALL, KK_Q4, "as stored (Q4_0)");
	/* Types kiln computes on in no form: the closest, said so. */
	expect_choice(KMF_Q4_1, ALL, KK_Q4, "Q4_1 converted to q4");
	expect_choice(KMF_Q4_K, ALL, KK_Q4, "Q4_K converted to q4");
	expect_choice(KMF_Q6_K, ALL, KK_I8, "Q6_K converted to i8");
	expect_choice(KMF_F8_E4M3, ALL, KK_F16, "converted to f16");
	expect_choice(KMF_F64, ALL, KK_F32, "F64 converted to f32");
	/* A backend without the stored dtype: the next one that holds it. */
	expect_choice(KMF_F16, ALL & ~(1u << KK_F16), KK_F32,
		      "F16 converted to f32: the backend computes on no f16");
	expect_choice(KMF_BF16, ALL & ~(1u << KK_BF16), KK_F32, "computes on no bf16");
	expect_choice(KMF_Q4_0, ALL & ~(1u << KK_Q4), KK_I8, "Q4_0 converted to i8");
	expect_choice(KMF_Q4_0, 1u << KK_F32, KK_F32, "Q4_0 converted to f32");
	expect_choice(KMF_Q8_0, ALL & ~(1u << KK_I8), KK_F32, "computes on no i8");
	/* The real backends' answers: the cpu backend computes on all five;
	 * the cuda backend (where it opens) answers for itself. */
	kk_backend *be = NULL;
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	static const kk_dtype dts[] = { KK_F32, KK_BF16, KK_F16, KK_I8, KK_Q4 };
	for (size_t i = 0; i < 5; i++)
		assert_true(inferd_backend_computes(be, dts[i]));
	char why[160];
	assert_int_equal(inferd_dtype_auto(KMF_Q8_0, inferd_backend_computes, be, why, sizeof(why)),
			 KK_I8);
	assert_int_equal(inferd_dtype_auto(KMF_Q4_0, inferd_backend_computes, be, why, sizeof(why)),
			 KK_Q4);
	kk_backend_free(be);
	be = NULL;
	if (kk_backend_available("cuda") == 1 && kk_backend_open("cuda", &be) == 0) {
		for (size_t i = 0; i < 5; i++)
			print_message("# cuda computes on %s: %s\n", kk_dtype_name(dts[i]),
				      inferd_backend_computes(be, dts[i]) ? "yes" : "no");
		assert_int_equal(
			inferd_dtype_auto(KMF_Q8_0, inferd_backend_computes, be, why, sizeof(why)),
			KK_I8);
		kk_backend_free(be);
	}
}

static int setup(void **state)
{
	(void) state;
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void) state;
	char cmd[sizeof(dir) + 16];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stored_dtype),
		cmocka_unit_test(test_choice),
	};
	return cmocka_run_group_tests_name("inferd-dtype", tests, setup, teardown);
}
