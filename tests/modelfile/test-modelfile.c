/* test-modelfile.c — libkmf unit tests (cmocka).
 *
 * Readers against files generated independently by tests/modelfile/data/gen.py
 * (numpy + struct from the specs; expected values in *.expect.safetensors),
 * conversions to kk layouts against float64 references and against
 * kk_quantize itself on random data, writer round trips, a SIGKILL-mid-write
 * crash test, and a table of hostile files each refused with its exact
 * error.  Run from the repository root (tests/run-tests.sh does). */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

#include "kiln/macro.h"
#include "kiln/strbuf.h"
#include "kk.h"
#include "kmf.h"

#include "../lib/fixture.h"
#include "../lib/model-test.h"

#define DATA "tests/modelfile/data/"

DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_file *, kmf_close);
DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_writer *, kmf_writer_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(kk_backend *, kk_backend_free);

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	return kiln_test_xorshift(&rng_state);
}
static float frnd(void)
{
	/* roughly normal: sum of uniforms, with occasional large values */
	float s = 0;
	for (int i = 0; i < 4; i++)
		s += (float) (rnd() >> 40) / (float) (1 << 24) - 0.5f;
	return (rnd() % 97 == 0) ? s * 40 : s;
}

static kmf_file *open_ok(const char *path)
{
	kmf_file *f = NULL;
	kiln_error e;
	KILN_ASSERT_OK(kmf_open(path, &f, &e), &e);
	return f;
}

/* Every float tensor of `f` named in `expect` equals the expected values. */
static void check_values(kmf_file *f, const char *expect_path, double tol)
{
	_cleanup_(kmf_closep) kmf_file *e = open_ok(expect_path);
	size_t n = kmf_tensor_count(e);
	assert_true(n > 0);
	for (size_t i = 0; i < n; i++) {
		const kmf_tensor *et = kmf_tensor_at(e, i), *t = kmf_tensor_find(f, et->name);
		_cleanup_free_ float *got = NULL, *want = NULL;
		assert_non_null(t);
		assert_int_equal(t->nelem, et->nelem);
		assert_int_equal(t->ndim, et->ndim);
		for (int d = 0; d < t->ndim; d++)
			assert_int_equal(t->shape[d], et->shape[d]);
		got = malloc(t->nelem * sizeof(float));
		want = malloc(t->nelem * sizeof(float));
		assert_int_equal(kmf_tensor_to_float(t, KK_F32, got, t->nelem), 0);
		assert_int_equal(kmf_tensor_to_float(et, KK_F32, want, et->nelem), 0);
		for (int64_t j = 0; j < t->nelem; j++)
			if (fabs((double) got[j] - want[j]) > tol * (1 + fabs(want[j]))) {
				print_error("%s[%lld]: got %.9g want %.9g\n", t->name,
					    (long long) j, got[j], want[j]);
				fail();
			}
	}
}

/* ------------------------------------------------------------------------ */
/* Readers                                                                   */

static void test_safetensors_basic(void **state)
{
	_cleanup_(kmf_closep) kmf_file *f = open_ok(DATA "basic.safetensors");
	const kmf_tensor *t;
	const char *s;
	assert_int_equal(kmf_file_format(f), KMF_FORMAT_SAFETENSORS);
	assert_int_equal(kmf_tensor_count(f), 8);
	t = kmf_tensor_find(f, "model.embed.weight");
	assert_non_null(t);
	assert_int_equal(t->dtype, KMF_F32);
	assert_int_equal(t->ndim, 2);
	assert_int_equal(t->shape[0], 3);
	assert_int_equal(t->shape[1], 4);
	assert_int_equal(t->nbytes, 48);
	t = kmf_tensor_find(f, "ids");
	assert_int_equal(t->dtype, KMF_I32);
	{
		int32_t last; /* gen.py does not align: read with memcpy */
		memcpy(&last, (const uint8_t *) t->data + 12, 4);
		assert_int_equal(last, 2147483647);
	}
	float tmp[4];
	assert_int_equal(kmf_tensor_to_float(t, KK_F32, tmp, 4), -EOPNOTSUPP);
	t = kmf_tensor_find(f, "flag");
	assert_int_equal(t->dtype, KMF_BOOL);
	assert_int_equal(t->ndim, 0);
	assert_int_equal(t->nelem, 1);
	assert_int_equal(*(const uint8_t *) t->data, 1);
	t = kmf_tensor_find(f, "empty");
	assert_int_equal(t->nelem, 0);
	assert_int_equal(t->nbytes, 0);
	assert_null(kmf_tensor_find(f, "nope"));
	/* file order is data order: offsets increase */
	for (size_t i = 1; i < kmf_tensor_count(f); i++)
		assert_true(kmf_tensor_at(f, i)->offset >= kmf_tensor_at(f, i - 1)->offset);
	assert_int_equal(kmf_meta_count(f), 3);
	assert_int_equal(kmf_meta_get_str(f, "kiln.step", &s), 0);
	assert_string_equal(s, "42");
	assert_int_equal(kmf_meta_get_str(f, "note", &s), 0);
	assert_string_equal(s, "h\xc3\xa9llo");
	assert_int_equal(kmf_meta_get_str(f, "missing", &s), -ENOENT);
	check_values(f, DATA "basic.expect.safetensors", 0);
}

static void test_gguf_v3(void **state)
{
	_cleanup_(kmf_closep) kmf_file *f = open_ok(DATA "types-v3.gguf");
	const kmf_meta *m;
	const kmf_tensor *t;
	int64_t v;
	assert_int_equal(kmf_file_format(f), KMF_FORMAT_GGUF);
	assert_int_equal(kmf_file_version(f), 3);
	assert_int_equal(kmf_tensor_count(f), 8);
	assert_int_equal(kmf_meta_count(f), 16);
	assert_int_equal(kmf_meta_get_int(f, "test.u8", &v), 0);
	assert_int_equal(v, 200);
	assert_int_equal(kmf_meta_get_int(f, "test.i8", &v), 0);
	assert_int_equal(v, -100);
	assert_int_equal(kmf_meta_get_int(f, "test.u16", &v), 0);
	assert_int_equal(v, 65000);
	assert_int_equal(kmf_meta_get_int(f, "test.i16", &v), 0);
	assert_int_equal(v, -32000);
	assert_int_equal(kmf_meta_get_int(f, "test.u32", &v), 0);
	assert_int_equal(v, 4000000000LL);
	assert_int_equal(kmf_meta_get_int(f, "test.i32", &v), 0);
	assert_int_equal(v, -2000000000LL);
	assert_int_equal(kmf_meta_get_int(f, "test.u64", &v), -ERANGE);
	assert_int_equal(kmf_meta_find(f, "test.u64")->u, (1ULL << 63) + 5);
	assert_int_equal(kmf_meta_get_int(f, "test.i64", &v), 0);
	assert_int_equal(v, -(1LL << 62));
	assert_true(kmf_meta_find(f, "test.f32")->f == 0.5);
	assert_true(kmf_meta_find(f, "test.f64")->f == 3.25);
	assert_true(kmf_meta_find(f, "test.bool")->b);
	assert_int_equal(kmf_meta_get_int(f, "general.architecture", &v), -EINVAL);
	m = kmf_meta_find(f, "tokenizer.ggml.tokens");
	assert_non_null(m);
	assert_int_equal(m->type, KMF_V_ARRAY);
	assert_int_equal(m->arr.etype, KMF_V_STRING);
	assert_int_equal(m->arr.n, 7);
	{
		const kmf_str *tok = m->arr.items;
		assert_string_equal(tok[3].s, "\xe2\x96\x81the");
		assert_string_equal(tok[5].s, "<0x0A>");
		assert_int_equal(tok[6].len, 0);
	}
	m = kmf_meta_find(f, "tokenizer.ggml.scores");
	assert_int_equal(m->arr.etype, KMF_V_F32);
	assert_true(((const float *) m->arr.items)[2] == 2.25f);
	m = kmf_meta_find(f, "test.i32s");
	assert_int_equal(((const int32_t *) m->arr.items)[1], -2);
	/* GGUF ne = [64, 3] is the row-major [3, 64] */
	t = kmf_tensor_find(f, "blk.0.attn_q.weight");
	assert_int_equal(t->dtype, KMF_Q8_0);
	assert_int_equal(t->shape[0], 3);
	assert_int_equal(t->shape[1], 64);
	assert_int_equal(t->nbytes, 3 * 2 * 34);
	for (size_t i = 0; i < kmf_tensor_count(f); i++)
		assert_int_equal((uintptr_t) kmf_tensor_at(f, i)->data % 64, 0);
	/* dequantizers vs numpy; f32 both ways, but allow FMA contraction */
	check_values(f, DATA "types-v3.expect.safetensors", 1e-6);
}

static void test_gguf_v2(void **state)
{
	_cleanup_(kmf_closep) kmf_file *f = open_ok(DATA "small-v2.gguf");
	const kmf_tensor *t = kmf_tensor_find(f, "cube");
	int64_t v;
	assert_int_equal(kmf_file_version(f), 2);
	assert_int_equal(t->ndim, 3);
	assert_int_equal(t->shape[0], 2);
	assert_int_equal(t->shape[1], 3);
	assert_int_equal(t->shape[2], 4);
	assert_int_equal((uintptr_t) kmf_tensor_find(f, "blk.0.attn_k.weight")->data % 32, 0);
	assert_int_equal(kmf_meta_get_int(f, "llama.block_count", &v), 0);
	assert_int_equal(v, 1);
	check_values(f, DATA "small-v2.expect.safetensors", 0);
}

static void test_llama2c_tiny(void **state)
{
	_cleanup_(kmf_closep) kmf_file *f = open_ok(DATA "tiny.llama2c.bin");
	/* dim 8, hidden 12, 2 layers, 4 heads, 2 kv heads, vocab 10 (unshared), seq 4 */
	const int64_t dim = 8, hid = 12, L = 2, kv = 4, voc = 10, seq = 4, hs = 2;
	const kmf_meta *m;
	int64_t v;
	struct {
		const char *name;
		int64_t rows, cols, first; /* first float index */
	} want[] = {
		{ "model.embed_tokens.weight", voc, dim, 0 },
		{ "model.layers.1.input_layernorm.weight", dim, 0, voc * dim + dim },
		{ "model.layers.0.self_attn.q_proj.weight", dim, dim, voc * dim + L * dim },
		{ "model.layers.1.self_attn.k_proj.weight", kv, dim,
		  voc * dim + L * dim + L * dim * dim + kv * dim },
		{ "model.layers.0.self_attn.v_proj.weight", kv, dim,
		  voc * dim + L * dim + L * dim * dim + L * kv * dim },
		{ "model.layers.0.self_attn.o_proj.weight", dim, dim,
		  voc * dim + L * dim + L * dim * dim + 2 * L * kv * dim },
		{ "model.layers.0.post_attention_layernorm.weight", dim, 0,
		  voc * dim + L * dim + 2 * L * dim * dim + 2 * L * kv * dim },
		{ "model.layers.1.mlp.gate_proj.weight", hid, dim,
		  voc * dim + 2 * L * dim + 2 * L * dim * dim + 2 * L * kv * dim + hid * dim },
		{ "model.layers.0.mlp.down_proj.weight", dim, hid,
		  voc * dim + 2 * L * dim + 2 * L * dim * dim + 2 * L * kv * dim + L * hid * dim },
		{ "model.layers.0.mlp.up_proj.weight", hid, dim,
		  voc * dim + 2 * L * dim + 2 * L * dim * dim + 2 * L * kv * dim +
			  2 * L * hid * dim },
		{ "model.norm.weight", dim, 0,
		  voc * dim + 2 * L * dim + 2 * L * dim * dim + 2 * L * kv * dim +
			  3 * L * hid * dim },
		{ "lm_head.weight", voc, dim,
		  voc * dim + 2 * L * dim + 2 * L * dim * dim + 2 * L * kv * dim +
			  3 * L * hid * dim + dim + seq * hs },
	};
	assert_int_equal(kmf_file_format(f), KMF_FORMAT_LLAMA2C);
	assert_int_equal(kmf_tensor_count(f), 3 + L * 9);
	for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
		const kmf_tensor *t = kmf_tensor_find(f, want[i].name);
		const float *p;
		assert_non_null(t);
		assert_int_equal(t->shape[0], want[i].rows);
		if (want[i].cols)
			assert_int_equal(t->shape[1], want[i].cols);
		assert_int_equal(t->offset, 28 + 4 * want[i].first);
		p = t->data;
		assert_float_equal(p[0], (float) (want[i].first * 1e-3), 1e-6);
		assert_float_equal(p[t->nelem - 1], (float) ((want[i].first + t->nelem - 1) * 1e-3),
				   1e-6);
	}
	assert_int_equal(kmf_meta_get_int(f, "vocab_size", &v), 0);
	assert_int_equal(v, 10);
	assert_int_equal(kmf_meta_get_int(f, "n_kv_heads", &v), 0);
	assert_int_equal(v, 2);
	m = kmf_meta_find(f, "shared_classifier");
	assert_int_equal(m->type, KMF_V_BOOL);
	assert_false(m->b);
}

/* The model fixture the build trains (tests/fixtures): llama2.c's
 * stories260K shape, written by tests/fixtures/st2llama2c.py. */
static void test_llama2c_fixture(void **state)
{
	const char *path = kiln_test_model_fixture();
	const kmf_tensor *emb, *head;
	int64_t v;
	KILN_NEED_FIXTURE(path);
	_cleanup_(kmf_closep) kmf_file *f = open_ok(path);
	assert_int_equal(kmf_file_format(f), KMF_FORMAT_LLAMA2C);
	assert_int_equal(kmf_tensor_count(f), 3 + 5 * 9);
	assert_int_equal(kmf_meta_get_int(f, "dim", &v), 0);
	assert_int_equal(v, 64);
	assert_int_equal(kmf_meta_get_int(f, "hidden_dim", &v), 0);
	assert_int_equal(v, 172);
	assert_true(kmf_meta_find(f, "shared_classifier")->b);
	emb = kmf_tensor_find(f, "model.embed_tokens.weight");
	head = kmf_tensor_find(f, "lm_head.weight");
	assert_ptr_equal(emb->data, head->data);
	assert_int_equal(kmf_tensor_find(f, "model.layers.4.self_attn.k_proj.weight")->shape[0],
			 32);
	assert_int_equal(kmf_tensor_find(f, "model.layers.4.mlp.down_proj.weight")->shape[1], 172);
	/* The RMSNorm weights of a trained model are O(1) and positive-ish:
	 * a misplaced offset would land in a matrix. */
	{
		const kmf_tensor *n = kmf_tensor_find(f, "model.norm.weight");
		const float *p = n->data;
		double mean = 0;
		for (int i = 0; i < 64; i++)
			mean += p[i] / 64;
		assert_true(mean > 0.2 && mean < 10);
	}
}

/* ------------------------------------------------------------------------ */
/* Conversions                                                               */

/* The f64 value of an f16 / bf16. */
static double half_to_f64(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
	return h & 0x8000 ? -v : v;
}
/* Half the spacing of format (mantissa bits mb, min normal exponent emin)
 * around x: the most a round-to-nearest may move x. */
static double half_ulp(double x, int mb, int emin)
{
	int e;
	frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
	e = MAX(e - 1, emin);
	return ldexp(1.0, e - mb - 1);
}

/* Writes a checkpoint of one f32 [n, k] tensor to dir and opens it. */
static kmf_file *float_file(const char *dir, const float *w, int64_t n, int64_t k)
{
	_cleanup_(kmf_writer_freep) kmf_writer *wr = NULL;
	char path[512];
	int64_t shape[2] = { n, k };
	kiln_error e;
	snprintf(path, sizeof(path), "%s/w.safetensors", dir);
	assert_int_equal(kmf_writer_new(&wr), 0);
	assert_int_equal(kmf_writer_add(wr, "w", KMF_F32, 2, shape, w, n * k * 4), 0);
	assert_int_equal(kmf_writer_commit(wr, path, 0644, &e), 0);
	return open_ok(path);
}

static char tmpdir[256];

static int setup_tmp(void **state)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kmf-test-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}
static int teardown_tmp(void **state)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_to_float_rounding(void **state)
{
	const int64_t n = 37, k = 129;
	_cleanup_free_ float *w = malloc(n * k * 4);
	_cleanup_free_ uint16_t *h = malloc(n * k * 2), *b = malloc(n * k * 2);
	for (int64_t i = 0; i < n * k; i++)
		w[i] = frnd() * (i % 7 == 0 ? 1e-3f : 1.0f);
	_cleanup_(kmf_closep) kmf_file *f = float_file(tmpdir, w, n, k);
	const kmf_tensor *t = kmf_tensor_find(f, "w");
	assert_int_equal(kmf_tensor_to_float(t, KK_F16, h, n * k), 0);
	assert_int_equal(kmf_tensor_to_float(t, KK_BF16, b, n * k), 0);
	assert_int_equal(kmf_tensor_to_float(t, KK_F16, h, n * k - 1), -EINVAL);
	for (int64_t i = 0; i < n * k; i++) {
		double x = w[i];
		double hv = half_to_f64(h[i]), bv;
		uint32_t u = (uint32_t) b[i] << 16;
		float bf;
		memcpy(&bf, &u, 4);
		bv = bf;
		/* round to nearest: within half an ulp of the target format */
		assert_true(fabs(hv - x) <= half_ulp(x, 10, -14) * (1 + 1e-12));
		assert_true(fabs(bv - x) <= half_ulp(x, 7, -126) * (1 + 1e-12));
	}
}

/* kk's own quantizer on the cpu backend: kmf must produce the same bits. */
static void kk_quant(kk_dtype qt, int group, kk_dtype sdt, const float *w, int64_t n, int64_t k,
		     void *q, void *scales)
{
	_cleanup_(kk_backend_freep) kk_backend *be = NULL;
	kk_qmatrix *qm = NULL;
	kk_buffer *wb = NULL;
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	assert_int_equal(kk_buffer_alloc(be, KK_F32, n * k, &wb), 0);
	assert_int_equal(kk_buffer_upload(be, NULL, wb, 0, w, n * k * 4), 0);
	assert_int_equal(kk_qmatrix_alloc(be, qt, n, k, group, sdt, &qm), 0);
	assert_int_equal(kk_quantize(be, NULL, qm, wb), 0);
	assert_int_equal(kk_buffer_download(be, NULL, qm->data, 0, q, kk_buffer_bytes(qm->data)),
			 0);
	assert_int_equal(
		kk_buffer_download(be, NULL, qm->scales, 0, scales, kk_buffer_bytes(qm->scales)),
		0);
	kk_qmatrix_free(qm);
	kk_buffer_free(wb);
}

static double scale_at(kk_dtype sdt, const void *scales, size_t i)
{
	if (sdt == KK_F16)
		return half_to_f64(((const uint16_t *) scales)[i]);
	return ((const float *) scales)[i];
}

static void test_to_i8_random(void **state)
{
	const int64_t n = 19, k = 200;
	_cleanup_free_ float *w = malloc(n * k * 4);
	_cleanup_free_ int8_t *q = malloc(n * k), *kq = malloc(n * k);
	float s[19], ks[19];
	for (int64_t i = 0; i < n * k; i++)
		w[i] = frnd();
	for (int64_t j = 0; j < k; j++)
		w[5 * k + j] = 0; /* an all-zero row gets scale 0 */
	_cleanup_(kmf_closep) kmf_file *f = float_file(tmpdir, w, n, k);
	const kmf_tensor *t = kmf_tensor_find(f, "w");
	assert_int_equal(kmf_tensor_to_i8(t, KK_F32, q, s), 0);
	for (int64_t r = 0; r < n; r++) {
		double amax = 0;
		for (int64_t j = 0; j < k; j++)
			amax = fmax(amax, fabs((double) w[r * k + j]));
		assert_true(fabs(s[r] - amax / 127) <= 1e-6 * amax / 127);
		for (int64_t j = 0; j < k; j++) {
			assert_true(q[r * k + j] >= -127 && q[r * k + j] <= 127);
			assert_true(fabs(q[r * k + j] * (double) s[r] - w[r * k + j]) <=
				    s[r] * 0.5 * (1 + 1e-5));
		}
	}
	assert_true(s[5] == 0);
	kk_quant(KK_I8, 0, KK_F32, w, n, k, kq, ks);
	assert_memory_equal(q, kq, n * k);
	assert_memory_equal(s, ks, sizeof(s));
	/* f16 scales: quantized against the rounded scale, as kk does */
	uint16_t hs[19], khs[19];
	assert_int_equal(kmf_tensor_to_i8(t, KK_F16, q, hs), 0);
	kk_quant(KK_I8, 0, KK_F16, w, n, k, kq, khs);
	assert_memory_equal(q, kq, n * k);
	assert_memory_equal(hs, khs, sizeof(hs));
}

static void test_to_q4_random(void **state)
{
	const int64_t n = 7, k = 256;
	_cleanup_free_ float *w = malloc(n * k * 4);
	_cleanup_free_ uint8_t *q = malloc(n * k / 2), *kq = malloc(n * k / 2);
	float s[7 * 8], ks[7 * 8];
	for (int64_t i = 0; i < n * k; i++)
		w[i] = frnd();
	_cleanup_(kmf_closep) kmf_file *f = float_file(tmpdir, w, n, k);
	const kmf_tensor *t = kmf_tensor_find(f, "w");
	const int groups[] = { 32, 64, 128 };
	for (size_t gi = 0; gi < 3; gi++) {
		int g = groups[gi];
		for (int sd = 0; sd < 2; sd++) {
			kk_dtype sdt = sd ? KK_F16 : KK_F32;
			bool exact = true;
			assert_int_equal(kmf_tensor_to_q4(t, g, sdt, q, s, &exact), 0);
			assert_false(exact);
			for (int64_t r = 0; r < n; r++)
				for (int64_t j = 0; j < k; j++) {
					size_t e = (size_t) (r * k + j);
					int code = ((q[e / 2] >> (e & 1 ? 4 : 0)) & 15) - 8;
					double sc =
						scale_at(sdt, s, (size_t) (r * (k / g) + j / g));
					double amax = 0;
					for (int64_t jj = j / g * g; jj < (j / g + 1) * g; jj++)
						amax = fmax(amax, fabs((double) w[r * k + jj]));
					/* f64 reference: scale = amax / 7 (rounded if f16),
					 * error within half a step (+ f16 scale rounding
					 * moves the top code by < 7 * half an f16 ulp) */
					assert_true(fabs(sc - amax / 7) <=
						    amax / 7 * (sd ? 1e-3 : 1e-6));
					assert_true(fabs(code * sc - w[e]) <=
						    sc * 0.5 + amax * (sd ? 4e-3 : 1e-6));
				}
			kk_quant(KK_Q4, g, sdt, w, n, k, kq, ks);
			assert_memory_equal(q, kq, n * k / 2);
			assert_memory_equal(s, ks, (size_t) (n * k / g) * (sd ? 2 : 4));
		}
	}
	assert_int_equal(kmf_tensor_to_q4(t, 48, KK_F32, q, s, NULL), -EINVAL);
}

/* Q4_0 -> kk int4 group 32 is exact; kk_dequantize gives back the GGUF values. */
static void test_q4_0_exact(void **state)
{
	_cleanup_(kmf_closep) kmf_file *f = open_ok(DATA "types-v3.gguf");
	_cleanup_(kk_backend_freep) kk_backend *be = NULL;
	const kmf_tensor *t = kmf_tensor_find(f, "blk.0.attn_k.weight"); /* Q4_0 [4, 64] */
	uint8_t q[4 * 32];
	uint16_t hs[4 * 2];
	float s[4 * 2], want[4 * 64], got[4 * 64], s2[4];
	bool exact = false;
	kk_qmatrix *qm = NULL;
	kk_buffer *wb = NULL;
	assert_int_equal(kmf_tensor_to_float(t, KK_F32, want, 256), 0);
	assert_int_equal(kmf_tensor_to_q4(t, 32, KK_F16, q, hs, &exact), 0);
	assert_true(exact);
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	assert_int_equal(kk_qmatrix_alloc(be, KK_Q4, 4, 64, 32, KK_F16, &qm), 0);
	assert_int_equal(kk_buffer_upload(be, NULL, qm->data, 0, q, sizeof(q)), 0);
	assert_int_equal(kk_buffer_upload(be, NULL, qm->scales, 0, hs, sizeof(hs)), 0);
	assert_int_equal(kk_buffer_alloc(be, KK_F32, 256, &wb), 0);
	assert_int_equal(kk_dequantize(be, NULL, wb, qm), 0);
	assert_int_equal(kk_buffer_download(be, NULL, wb, 0, got, sizeof(got)), 0);
	assert_memory_equal(got, want, sizeof(got));
	kk_buffer_free(wb);
	kk_qmatrix_free(qm);
	/* f32 scales: same values */
	assert_int_equal(kmf_tensor_to_q4(t, 32, KK_F32, q, s, &exact), 0);
	assert_true(exact);
	for (int i = 0; i < 8; i++)
		assert_true(s[i] == (float) half_to_f64(hs[i]));
	/* group 64 requantizes: within half a step of the GGUF values */
	assert_int_equal(kmf_tensor_to_q4(t, 64, KK_F32, q, s2, &exact), 0);
	assert_false(exact);
	for (int e = 0; e < 256; e++) {
		int code = ((q[e / 2] >> (e & 1 ? 4 : 0)) & 15) - 8;
		assert_true(fabs(code * (double) s2[e / 64] - want[e]) <=
			    s2[e / 64] * 0.5 * (1 + 1e-5));
	}
}

/* Every block type requantizes to int8 and int4 within the documented bound. */
static void test_blocks_requantize(void **state)
{
	_cleanup_(kmf_closep) kmf_file *f = open_ok(DATA "types-v3.gguf");
	const char *names[] = { "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_up.weight",
				"blk.0.ffn_down.weight" };
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		const kmf_tensor *t = kmf_tensor_find(f, names[i]);
		int64_t n = t->shape[0], k = t->shape[1];
		_cleanup_free_ float *want = malloc(n * k * 4), *s = malloc(n * k * 4);
		_cleanup_free_ int8_t *q8 = malloc(n * k);
		_cleanup_free_ uint8_t *q4 = malloc(n * k);
		bool exact = true;
		assert_int_equal(kmf_tensor_to_float(t, KK_F32, want, n * k), 0);
		assert_int_equal(kmf_tensor_to_i8(t, KK_F32, q8, s), 0);
		for (int64_t e = 0; e < n * k; e++)
			assert_true(fabs(q8[e] * (double) s[e / k] - want[e]) <=
				    s[e / k] * 0.5 * (1 + 1e-5));
		assert_int_equal(kmf_tensor_to_q4(t, 32, KK_F32, q4, s, &exact), 0);
		assert_false(exact);
		for (int64_t e = 0; e < n * k; e++) {
			int code = ((q4[e / 2] >> (e & 1 ? 4 : 0)) & 15) - 8;
			assert_true(fabs(code * (double) s[e / 32] - want[e]) <=
				    s[e / 32] * 0.5 * (1 + 1e-5));
		}
	}
	/* not 2-D / integer */
	{
		_cleanup_(kmf_closep) kmf_file *b = open_ok(DATA "basic.safetensors");
		int8_t q[8];
		float s[8];
		assert_int_equal(kmf_tensor_to_i8(kmf_tensor_find(b, "brain"), KK_F32, q, s),
				 -EINVAL);
		assert_int_equal(kmf_tensor_to_i8(kmf_tensor_find(b, "ids"), KK_F32, q, s),
				 -EINVAL);
	}
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */

static void test_writer_roundtrip(void **state)
{
	_cleanup_(kmf_writer_freep) kmf_writer *w = NULL;
	struct {
		const char *name;
		kmf_dtype dt;
		int ndim;
		int64_t shape[3];
	} spec[] = {
		{ "a.odd", KMF_F32, 2, { 3, 5 } },   { "b.aligned", KMF_BF16, 2, { 4, 32 } },
		{ "c.scalar", KMF_I64, 0, { 0 } },   { "d.cube", KMF_F16, 3, { 2, 3, 32 } },
		{ "e.empty", KMF_F32, 2, { 0, 4 } }, { "f.bytes", KMF_U8, 1, { 7 } },
	};
	void *bufs[ARRAY_SIZE(spec)];
	uint64_t sizes[ARRAY_SIZE(spec)];
	char path[512];
	kiln_error e;
	snprintf(path, sizeof(path), "%s/ckpt.safetensors", tmpdir);
	assert_int_equal(kmf_writer_new(&w), 0);
	for (size_t i = 0; i < ARRAY_SIZE(spec); i++) {
		uint64_t n = 1;
		for (int d = 0; d < spec[i].ndim; d++)
			n *= spec[i].shape[d];
		sizes[i] = n * kmf_dtype_block_bytes(spec[i].dt);
		bufs[i] = malloc(sizes[i] + 1);
		for (uint64_t j = 0; j < sizes[i]; j++)
			((uint8_t *) bufs[i])[j] = (uint8_t) rnd();
		assert_int_equal(kmf_writer_add(w, spec[i].name, spec[i].dt, spec[i].ndim,
						spec[i].shape, bufs[i], sizes[i]),
				 0);
	}
	assert_int_equal(kmf_writer_add(w, "a.odd", KMF_F32, 2, spec[0].shape, bufs[0], sizes[0]),
			 -EEXIST);
	assert_int_equal(kmf_writer_add(w, "x", KMF_F32, 2, spec[0].shape, bufs[0], sizes[0] - 1),
			 -EINVAL);
	assert_int_equal(kmf_writer_add(w, "__metadata__", KMF_F32, 0, NULL, bufs[0], 4), -EINVAL);
	assert_int_equal(kmf_writer_add(w, "q", KMF_Q4_0, 1, spec[5].shape, bufs[0], 18), -EINVAL);
	assert_int_equal(kmf_writer_set_meta(w, "step", "1000"), 0);
	assert_int_equal(kmf_writer_set_meta(w, "bad", "\xff"), -EINVAL);
	assert_int_equal(kmf_writer_set_meta(w, "step", "1001"), 0);
	/* over an existing file */
	assert_int_equal(kiln_write_file_atomic(path, "old", 3, 0644), 0);
	assert_int_equal(kmf_writer_commit(w, path, 0640, &e), 0);
	{
		_cleanup_(kmf_closep) kmf_file *f = open_ok(path);
		const char *s;
		struct stat st;
		assert_int_equal(kmf_tensor_count(f), ARRAY_SIZE(spec));
		for (size_t i = 0; i < ARRAY_SIZE(spec); i++) {
			const kmf_tensor *t = kmf_tensor_find(f, spec[i].name);
			assert_non_null(t);
			assert_int_equal(t->dtype, spec[i].dt);
			assert_int_equal(t->ndim, spec[i].ndim);
			for (int d = 0; d < t->ndim; d++)
				assert_int_equal(t->shape[d], spec[i].shape[d]);
			assert_int_equal(t->nbytes, sizes[i]);
			if (sizes[i])
				assert_memory_equal(t->data, bufs[i], sizes[i]);
		}
		/* sizes that are multiples of 64 come first, aligned */
		assert_int_equal(kmf_tensor_at(f, 0)->offset % KMF_WRITE_ALIGN, 0);
		assert_int_equal((uintptr_t) kmf_tensor_find(f, "b.aligned")->data % 64, 0);
		assert_int_equal((uintptr_t) kmf_tensor_find(f, "d.cube")->data % 64, 0);
		assert_int_equal(kmf_meta_get_str(f, "step", &s), 0);
		assert_string_equal(s, "1001");
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_mode & 0777, 0640);
	}
	/* a directory that does not exist: error names it, nothing written */
	{
		char bad[600];
		snprintf(bad, sizeof(bad), "%s/no/such/dir/x.safetensors", tmpdir);
		assert_int_equal(kmf_writer_commit(w, bad, 0644, &e), -ENOENT);
		assert_non_null(strstr(e.msg, "no/such/dir"));
	}
	for (size_t i = 0; i < ARRAY_SIZE(spec); i++)
		free(bufs[i]);
}

/* A child rewrites a large checkpoint in a loop and is SIGKILLed after a
 * random delay; the target must always open as one complete generation. */
#define CRASH_BYTES (8u << 20)
static void write_generation(const char *path, uint8_t gen, uint8_t *buf)
{
	_cleanup_(kmf_writer_freep) kmf_writer *w = NULL;
	int64_t shape[1] = { CRASH_BYTES / 2 }, shape2[1] = { 1001 };
	char g[8];
	kiln_error e;
	memset(buf, gen, CRASH_BYTES + 1001);
	snprintf(g, sizeof(g), "%u", gen);
	if (kmf_writer_new(&w) < 0 ||
	    kmf_writer_add(w, "big", KMF_BF16, 1, shape, buf, CRASH_BYTES) < 0 ||
	    kmf_writer_add(w, "tail", KMF_U8, 1, shape2, buf + CRASH_BYTES, 1001) < 0 ||
	    kmf_writer_set_meta(w, "generation", g) < 0 || kmf_writer_commit(w, path, 0644, &e) < 0)
		_exit(3);
}

static void test_writer_sigkill(void **state)
{
	char path[512];
	_cleanup_free_ uint8_t *buf = malloc(CRASH_BYTES + 1001);
	int rounds = getenv("KILN_TEST_FULL") ? 60 : 20, seen_new = 0;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	rng_state ^= (uint64_t) ts.tv_nsec;
	snprintf(path, sizeof(path), "%s/crash.safetensors", tmpdir);
	write_generation(path, 1, buf);
	for (int round = 0; round < rounds; round++) {
		int status;
		unsigned delay_us = (unsigned) (rnd() % 120000);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			for (uint8_t g = 2;; g = (uint8_t) (g == 250 ? 2 : g + 1))
				write_generation(path, g, buf);
		}
		usleep(delay_us);
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFSIGNALED(status));
		{
			_cleanup_(kmf_closep) kmf_file *f = open_ok(path);
			const kmf_tensor *big = kmf_tensor_find(f, "big"),
					 *tail = kmf_tensor_find(f, "tail");
			const char *g;
			unsigned gen;
			assert_non_null(big);
			assert_non_null(tail);
			assert_int_equal(kmf_meta_get_str(f, "generation", &g), 0);
			gen = (unsigned) atoi(g);
			if (gen != 1)
				seen_new++;
			memset(buf, (int) gen, CRASH_BYTES + 1001);
			assert_memory_equal(big->data, buf, CRASH_BYTES);
			assert_memory_equal(tail->data, buf, 1001);
		}
	}
	print_message("# %d kills, %d found a newer complete generation\n", rounds, seen_new);
	/* O_TMPFILE leaves no temp files behind, except when killed between
	 * link and rename (microseconds): allow a few. */
	{
		DIR *d = opendir(tmpdir);
		struct dirent *de;
		int left = 0;
		while ((de = readdir(d)))
			if (strstr(de->d_name, ".kmf-"))
				left++;
		closedir(d);
		print_message("# %d temp files left behind\n", left);
		assert_true(left <= rounds / 4);
	}
}

/* ------------------------------------------------------------------------ */
/* Hostile inputs                                                            */

typedef struct bytes {
	uint8_t *p;
	size_t n, cap;
} bytes;
static void put(bytes *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}
static void put32(bytes *b, uint32_t v)
{
	put(b, &v, 4);
}
static void put64(bytes *b, uint64_t v)
{
	put(b, &v, 8);
}
static void putstr(bytes *b, const char *s)
{
	put64(b, strlen(s));
	put(b, s, strlen(s));
}
static void pad(bytes *b, size_t align)
{
	while (b->n % align)
		put(b, "", 1);
}
static void zeros(bytes *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put(b, "", 1);
}

/* A safetensors file from a header text and data size. */
static bytes st_file(const char *json, size_t data)
{
	bytes b = { 0 };
	put64(&b, strlen(json));
	put(&b, json, strlen(json));
	zeros(&b, data);
	return b;
}

/* GGUF: header + one u32 KV + one F32 [2, 8] tensor at offset 0 (64 bytes). */
enum { G_VERSION, G_NT, G_NKV, G_KEYLEN, G_VTYPE, G_NDIMS, G_NE0, G_TYPE, G_OFFSET, G_DATA, G_MAX };
static bytes gguf_file(const uint64_t *ov)
{
	bytes b = { 0 };
#define V(i, d) (ov && ov[i] != UINT64_MAX ? ov[i] : (d))
	put(&b, "GGUF", 4);
	put32(&b, (uint32_t) V(G_VERSION, 3));
	put64(&b, V(G_NT, 1));
	put64(&b, V(G_NKV, 1));
	put64(&b, V(G_KEYLEN, 14));
	put(&b, "llama.test.u32", 14);
	put32(&b, (uint32_t) V(G_VTYPE, 4));
	put32(&b, 7);
	putstr(&b, "tok");
	put32(&b, (uint32_t) V(G_NDIMS, 2));
	put64(&b, V(G_NE0, 8));
	put64(&b, 2);
	put32(&b, (uint32_t) V(G_TYPE, 0));
	put64(&b, V(G_OFFSET, 0));
	pad(&b, 32);
	zeros(&b, V(G_DATA, 64));
#undef V
	return b;
}
static uint64_t *ov1(uint64_t *ov, int i, uint64_t v)
{
	for (int j = 0; j < G_MAX; j++)
		ov[j] = UINT64_MAX;
	ov[i] = v;
	return ov;
}

static void expect_refused(const char *what, bytes b, int code, const char *substr, int64_t offset,
			   const char *tensor)
{
	kmf_file *f = NULL;
	kiln_error e;
	char line[1024];
	int r = kmf_open_mem(b.p, b.n, what, &f, &e);
	kiln_error_format(&e, line, sizeof(line));
	if (r != code || !strstr(e.msg, substr) || (offset >= 0 && e.offset != offset) ||
	    (tensor && strcmp(e.where, tensor))) {
		print_error("%s: got %d '%s' (offset %lld, tensor '%s'), want %d '%s' at %lld\n",
			    what, r, line, (long long) e.offset, e.where, code, substr,
			    (long long) offset);
		kmf_close(f);
		free(b.p);
		fail();
	}
	assert_null(f);
	assert_int_equal(e.code, code);
	assert_non_null(strstr(line, what)); /* the line names the file */
	free(b.p);
}

static void test_hostile_safetensors(void **state)
{
	bytes b;
	/* a valid baseline: opens */
	b = st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
	{
		kmf_file *f = NULL;
		assert_int_equal(kmf_open_mem(b.p, b.n, "ok", &f, NULL), 0);
		kmf_close(f);
		free(b.p);
	}
	b = st_file("{}", 0);
	b.p[0] = 0, b.p[7] = 0x80; /* length 2^63 */
	expect_refused("len2^63", b, -E2BIG, "above KMF_MAX_HEADER_BYTES", 0, NULL);
	b = st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
	b.p[0] += 10; /* header length past EOF */
	expect_refused("hdr-past-eof", b, -EBADMSG, "runs past the end of the file", 0, NULL);
	expect_refused(
		"data-truncated",
		st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 15),
		-EBADMSG, "outside the data section", 9, "a");
	expect_refused(
		"trailing",
		st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 17),
		-EBADMSG, "after the last tensor", -1, NULL);
	expect_refused("overlap",
		       st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
			       "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
			       24),
		       -EBADMSG, "overlaps the previous tensor 'a'", -1, "b");
	expect_refused("hole",
		       st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
			       12),
		       -EBADMSG, "forbids holes", -1, "b");
	expect_refused(
		"size-mismatch",
		st_file("{\"a\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16),
		-EBADMSG, "need 8", 9, "a");
	expect_refused("bad-json", st_file("{\"a\":{\"dtype\":\"F32\",", 0), -EBADMSG,
		       "not valid JSON", -1, NULL);
	expect_refused("bad-utf8", st_file("{\"a\xff\":{}}", 0), -EBADMSG, "not valid JSON", -1,
		       NULL);
	expect_refused("not-object", st_file("[1,2,3]", 0), -EBADMSG, "not an object", 8, NULL);
	expect_refused("duplicate",
		       st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
			       4),
		       -EBADMSG, "duplicate", -1, NULL);
	expect_refused(
		"unknown-dtype",
		st_file("{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1),
		-EOPNOTSUPP, "unknown dtype \"F4\"", 9, "a");
	expect_refused(
		"neg-dim",
		st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
		-EBADMSG, "dimension 0 is -1", 9, "a");
	expect_refused("overflow",
		       st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
			       "\"data_offsets\":[0,4]}}",
			       4),
		       -E2BIG, "more than", 9, "a");
	expect_refused("too-many-dims",
		       st_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
			       "\"data_offsets\":[0,1]}}",
			       1),
		       -E2BIG, "9 dimensions", 9, "a");
	expect_refused("meta-not-string", st_file("{\"__metadata__\":{\"x\":1}}", 0), -EBADMSG,
		       "is not a string", -1, NULL);
	expect_refused(
		"offsets-neg",
		st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4),
		-EBADMSG, "outside the data section", -1, "a");
	expect_refused("nul-in-key", st_file("{\"a\\u0000b\":{}}", 0), -EBADMSG, "not valid JSON",
		       -1, NULL);
	expect_refused("short", st_file("", 0), -EOPNOTSUPP, "not a model file", 0, NULL);
}

static void test_hostile_gguf(void **state)
{
	uint64_t ov[G_MAX];
	bytes b = gguf_file(NULL);
	{
		kmf_file *f = NULL;
		kiln_error e;
		assert_int_equal(kmf_open_mem(b.p, b.n, "ok", &f, &e), 0);
		assert_int_equal(kmf_tensor_find(f, "tok")->shape[0], 2);
		kmf_close(f);
		free(b.p);
	}
	expect_refused("v1", gguf_file(ov1(ov, G_VERSION, 1)), -EOPNOTSUPP, "version 1", 4, NULL);
	expect_refused("big-endian", gguf_file(ov1(ov, G_VERSION, 0x03000000)), -EOPNOTSUPP,
		       "big-endian", 4, NULL);
	expect_refused("nt-huge", gguf_file(ov1(ov, G_NT, 1ull << 63)), -E2BIG,
		       "above KMF_MAX_TENSORS", 8, NULL);
	expect_refused("nkv-huge", gguf_file(ov1(ov, G_NKV, 1ull << 63)), -E2BIG,
		       "above KMF_MAX_META", 16, NULL);
	expect_refused("nt-nofit", gguf_file(ov1(ov, G_NT, 900000)), -EBADMSG, "cannot fit", 8,
		       NULL);
	expect_refused("keylen-huge", gguf_file(ov1(ov, G_KEYLEN, 1ull << 63)), -E2BIG,
		       "above the limit", 24, NULL);
	expect_refused("keylen-past", gguf_file(ov1(ov, G_KEYLEN, 1000)), -EBADMSG, "truncated", 32,
		       NULL);
	expect_refused("vtype-unknown", gguf_file(ov1(ov, G_VTYPE, 13)), -EBADMSG,
		       "unknown value type 13", 46, NULL);
	expect_refused("ndims-0", gguf_file(ov1(ov, G_NDIMS, 0)), -EBADMSG, "n_dims is 0", 65,
		       "tok");
	expect_refused("ndims-5", gguf_file(ov1(ov, G_NDIMS, 5)), -EBADMSG, "n_dims is 5", 65,
		       "tok");
	expect_refused("zero-dim", gguf_file(ov1(ov, G_NE0, 0)), -EBADMSG, "ne[0] is 0", 69, "tok");
	expect_refused("dim-2^63", gguf_file(ov1(ov, G_NE0, 1ull << 63)), -EBADMSG, "ne[0] is", 69,
		       "tok");
	expect_refused("type-q5_0", gguf_file(ov1(ov, G_TYPE, 6)), -EOPNOTSUPP, "ggml type 6", 85,
		       "tok");
	expect_refused("type-999", gguf_file(ov1(ov, G_TYPE, 999)), -EOPNOTSUPP, "ggml type 999",
		       85, "tok");
	expect_refused("q8-rowlen", gguf_file(ov1(ov, G_TYPE, 8)), -EBADMSG,
		       "not a multiple of the Q8_0 block size", 85, "tok");
	expect_refused("misaligned", gguf_file(ov1(ov, G_OFFSET, 4)), -EBADMSG,
		       "not a multiple of the alignment 32", 89, "tok");
	expect_refused("offset-past-eof", gguf_file(ov1(ov, G_OFFSET, 1ull << 62)), -EBADMSG,
		       "runs past the end", -1, "tok");
	expect_refused("data-short", gguf_file(ov1(ov, G_DATA, 63)), -EBADMSG, "runs past the end",
		       128, "tok");
	/* hand-built: nested array, duplicate key, overlapping tensors, bad alignment */
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 0), put64(&b, 1);
	putstr(&b, "a.b"), put32(&b, 9), put32(&b, 9), put64(&b, 1);
	expect_refused("nested", b, -EOPNOTSUPP, "array of arrays", 39, NULL);
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 0), put64(&b, 2);
	putstr(&b, "k"), put32(&b, 4), put32(&b, 1);
	putstr(&b, "k"), put32(&b, 4), put32(&b, 1);
	expect_refused("dup-key", b, -EBADMSG, "appears twice", 41, NULL);
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 0), put64(&b, 1);
	putstr(&b, "general.alignment"), put32(&b, 4), put32(&b, 3);
	expect_refused("align-3", b, -EBADMSG, "power of two", -1, NULL);
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 2), put64(&b, 0);
	putstr(&b, "x"), put32(&b, 1), put64(&b, 16), put32(&b, 0), put64(&b, 0);
	putstr(&b, "y"), put32(&b, 1), put64(&b, 16), put32(&b, 0), put64(&b, 32);
	pad(&b, 32), zeros(&b, 96);
	expect_refused("overlap", b, -EBADMSG, "overlaps tensor 'x'", 128, "y");
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 2), put64(&b, 0);
	putstr(&b, "x"), put32(&b, 1), put64(&b, 8), put32(&b, 0), put64(&b, 0);
	putstr(&b, "x"), put32(&b, 1), put64(&b, 8), put32(&b, 0), put64(&b, 32);
	pad(&b, 32), zeros(&b, 64);
	expect_refused("dup-tensor", b, -EBADMSG, "two tensors have this name", -1, "x");
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 0), put64(&b, 1);
	putstr(&b, "k"), put32(&b, 8), put64(&b, 1ull << 63);
	expect_refused("strlen-2^63", b, -E2BIG, "above the limit", 37, NULL);
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 0), put64(&b, 1);
	putstr(&b, "k"), put32(&b, 9), put32(&b, 4), put64(&b, 1ull << 62);
	expect_refused("arrlen-2^62", b, -E2BIG, "above KMF_MAX_ARRAY", 41, NULL);
	b = (bytes){ 0 };
	put(&b, "GGUF", 4), put32(&b, 3), put64(&b, 0), put64(&b, 1);
	putstr(&b, "k"), put32(&b, 9), put32(&b, 4), put64(&b, 1000);
	expect_refused("arr-past-eof", b, -EBADMSG, "truncated", 49, NULL);
}

/* Every proper prefix of every valid file is refused, never read past. */
static void test_truncated_everywhere(void **state)
{
	const char *files[] = { DATA "basic.safetensors", DATA "types-v3.gguf",
				DATA "small-v2.gguf", DATA "tiny.llama2c.bin" };
	for (size_t i = 0; i < ARRAY_SIZE(files); i++) {
		_cleanup_free_ char *data = NULL;
		size_t len;
		size_t data_end = 0;
		assert_int_equal(kiln_read_file(files[i], 1 << 20, &data, &len), 0);
		{
			/* GGUF pads after each tensor; a file cut inside the
			 * padding after the last tensor is still complete. */
			_cleanup_(kmf_closep) kmf_file *full = open_ok(files[i]);
			for (size_t t = 0; t < kmf_tensor_count(full); t++)
				data_end = MAX(data_end, kmf_tensor_at(full, t)->offset +
								 kmf_tensor_at(full, t)->nbytes);
			if (kmf_file_format(full) != KMF_FORMAT_GGUF)
				data_end = len;
		}
		for (size_t n = 0; n < len; n++) {
			/* an exact-size heap copy so ASan sees any over-read */
			_cleanup_free_ uint8_t *cp = malloc(n ? n : 1);
			kmf_file *f = NULL;
			kiln_error e;
			int r;
			memcpy(cp, data, n);
			r = kmf_open_mem(cp, n, files[i], &f, &e);
			if (r == 0 && n >= data_end) {
				kmf_close(f);
				continue;
			}
			if (r == 0) {
				print_error("%s cut at %zu bytes was accepted\n", files[i], n);
				kmf_close(f);
				fail();
			}
			if (n >= 9 && i < 3 && !strstr(e.msg, "truncated")) {
				print_error("%s cut at %zu: '%s'\n", files[i], n, e.msg);
				fail();
			}
			if (i == 3)
				assert_int_equal(r, -EOPNOTSUPP); /* no size match: not llama2.c */
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_safetensors_basic),
		cmocka_unit_test(test_gguf_v3),
		cmocka_unit_test(test_gguf_v2),
		cmocka_unit_test(test_llama2c_tiny),
		cmocka_unit_test(test_llama2c_fixture),
		cmocka_unit_test(test_to_float_rounding),
		cmocka_unit_test(test_to_i8_random),
		cmocka_unit_test(test_to_q4_random),
		cmocka_unit_test(test_q4_0_exact),
		cmocka_unit_test(test_blocks_requantize),
		cmocka_unit_test(test_writer_roundtrip),
		cmocka_unit_test(test_writer_sigkill),
		cmocka_unit_test(test_hostile_safetensors),
		cmocka_unit_test(test_hostile_gguf),
		cmocka_unit_test(test_truncated_everywhere),
	};
	return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
