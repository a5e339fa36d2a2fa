/* tests/model/test-model-files.c — km_file: real model files into km_model.
 *
 * The model fixture (tiny260K.bin, built by tests/fixtures) is rewritten here in every dialect
 * km_file_open reads — a kiln-style canonical safetensors (kiln.config.* metadata), a Hugging Face
 * LlamaForCausalLM safetensors with config.json and q/k rows permuted to HF's half-split RoPE
 * layout (the permutation is written out below, independently of the library), and GGUF llama files
 * written by the small GGUF writer below with F32, F16 and Q8_0 tensors — and each must give the
 * llama2.c path's logits (teacher-forced over its greedy tokens) and its greedy tokens: bit for bit
 * where the weights are the same f32 values, to a stated tolerance where they were rounded.  A real
 * kiln-train checkpoint (kmt_save) loads to the trained model's exact
 * logits.  Broken and mismatched files are refused with exact messages.  Scaled RoPE
 * (Llama 3.1's rope_scaling / rope_freqs.weight, linear) is checked on a random model
 * written the same ways, against the float64 reference (ref.c) on log-probabilities.
 * Without the fixture the tests fail, naming it (the build makes it). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kk.h"
#include "kmf.h"
#include "kmodel.h"
#include "kmtrain.h"

#include "../lib/fixture.h"
#include "../lib/model-test.h"
#include "ref.h"

/* Teacher-forced decode steps compared with the llama2.c path. */
#define N_STEPS 48
/* Half-split RoPE rotates the same pairs by the same angles as the
 * interleaved one, only at other indices; kk computes the angles of the
 * two modes in a different order: measured max |dlogit| 5e-5. */
#define TOL_HF 5e-4
/* Rounded weights against the llama2.c path's f32 (teacher-forced, so
 * errors compound over 48 positions of a 5-layer model with |logits| <
 * 20).  F16: measured max |dlogit| 0.056, 47/48 argmaxes agree (one near
 * tie).  Q8_0: measured 2.1 and 44/48.  These bounds only say "close";
 * the exact check is against f32 weights rounded the same way in this
 * file (round_read), which must match bit for bit. */
#define TOL_F16	  0.2
#define F16_AGREE 0.95
#define TOL_Q8	  4.0
#define Q8_AGREE  0.85

static const char *fixture;
static kk_backend *be;
static km_config cfg; /* the fixture's, from km_file */
static int V;
static int32_t toks[N_STEPS + 1]; /* BOS then the llama2.c path's greedy tokens */
static float *ref_logits;	  /* [N_STEPS][V] */
static char tmpdir[] = "/tmp/test-model-files-XXXXXX";

/* the fixture is the build's own: missing is a failure, not a skip */
#define NEED_FIXTURE() KILN_NEED_FIXTURE(fixture)

static char *tpath(const char *name)
{
	static char p[8][512];
	static int i;
	char *s = p[i++ % 8];
	snprintf(s, 512, "%s/%s", tmpdir, name);
	return s;
}

static km_model *model_from(const km_config *c, km_weight_source src)
{
	kiln_error err = {};
	km_model_opts o = { .weight_dtype = KK_F32, .max_tokens = 64, .max_seqs = 1 };
	km_model *m = NULL;
	if (km_model_new(be, c, &o, &src, &m, &err) < 0)
		fail_msg("km_model_new: %s", err.msg);
	return m;
}

/* Feeds toks[0..N_STEPS) one at a time; logits [N_STEPS][V].  greedy:
 * toks[i+1] is set to the argmax of step i (the reference run). */
static void forced(km_model *m, float *logits, bool greedy)
{
	km_kvcache *c = NULL;
	assert_int_equal(km_kvcache_new(be, km_model_config(m), km_model_act_dtype(m),
					N_STEPS / 16 + 2, 1, &c),
			 0);
	int seq = km_kvcache_seq_new(c);
	assert_true(seq >= 0);
	for (int i = 0; i < N_STEPS; i++) {
		kiln_error err = {};
		km_seq_input in = { .seq = seq, .tokens = &toks[i], .n_tokens = 1 };
		if (km_forward(m, c, &in, 1, logits + (size_t) i * V, &err) < 0)
			fail_msg("km_forward: %s", err.msg);
		if (greedy)
			toks[i + 1] = kiln_test_argmax(logits + (size_t) i * V, V);
	}
	km_kvcache_free(c);
}

/* Logits of the model in path against the llama2.c path's: max |diff|
 * and the fraction of steps whose argmax is the reference's token. */
static void compare_file(const char *path, km_file_kind kind, double *max_abs, double *agree)
{
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(path, &f, &err) < 0)
		fail_msg("km_file_open: %s", err.msg);
	assert_int_equal(km_file_kind_of(f), kind);
	const km_config *c = km_file_config(f);
	assert_int_equal(c->dim, cfg.dim);
	assert_int_equal(c->hidden_dim, cfg.hidden_dim);
	assert_int_equal(c->n_layers, cfg.n_layers);
	assert_int_equal(c->n_heads, cfg.n_heads);
	assert_int_equal(c->n_kv_heads, cfg.n_kv_heads);
	assert_int_equal(c->head_dim, cfg.head_dim);
	assert_int_equal(c->vocab_size, cfg.vocab_size);
	assert_int_equal(c->max_seq_len, cfg.max_seq_len);
	assert_true(c->norm_eps == cfg.norm_eps);
	assert_true(c->rope_theta == cfg.rope_theta);
	assert_int_equal(c->rope_mode, kind == KM_FILE_HF ? KK_ROPE_HALF : KK_ROPE_INTERLEAVED);
	km_model *m = model_from(c, km_file_source(f));
	float *lg = malloc((size_t) N_STEPS * V * sizeof(float));
	assert_non_null(lg);
	forced(m, lg, false);
	double mx = 0;
	int same = 0;
	for (int i = 0; i < N_STEPS; i++) {
		for (int j = 0; j < V; j++)
			mx = fmax(mx, fabs((double) lg[(size_t) i * V + j] -
					   ref_logits[(size_t) i * V + j]));
		same += kiln_test_argmax(lg + (size_t) i * V, V) == toks[i + 1];
	}
	*max_abs = mx;
	*agree = (double) same / N_STEPS;
	free(lg);
	km_model_free(m);
	km_file_free(f);
}

/* ---- the fixture's tensors ----------------------------------------------- */

/* Canonical tensors in file order with their shapes. */
typedef struct tens {
	char name[96];
	int ndim;
	int64_t shape[2];
	float *data;
} tens;

static tens *T;
static int NT;

static const char *const layer_canon[] = {
	"attention_norm.weight",  "attention.wq.weight",    "attention.wk.weight",
	"attention.wv.weight",	  "attention.wo.weight",    "ffn_norm.weight",
	"feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
};

static void add_tensor(km_weight_source *src, const char *name, int64_t rows, int64_t cols)
{
	tens *t = &T[NT++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->ndim = cols ? 2 : 1;
	t->shape[0] = rows;
	t->shape[1] = cols;
	size_t n = (size_t) (rows * (cols ? cols : 1));
	t->data = malloc(n * sizeof(float));
	assert_non_null(t->data);
	kiln_error err = {};
	if (src->read(src->userdata, name, t->data, n, &err) < 0)
		fail_msg("%s", err.msg);
}

static const tens *find_t(const char *name)
{
	for (int i = 0; i < NT; i++)
		if (!strcmp(T[i].name, name))
			return &T[i];
	return NULL;
}

/* cfg, V and T (NT tensors) from the model file l: what the writers below
 * write. */
static void read_all(km_file *l)
{
	cfg = *km_file_config(l);
	V = cfg.vocab_size;
	km_weight_source src = km_file_source(l);
	int64_t d = cfg.dim, h = cfg.hidden_dim, kv = (int64_t) cfg.n_kv_heads * cfg.head_dim;
	T = calloc(3 + 9 * (size_t) cfg.n_layers, sizeof(*T));
	assert_non_null(T);
	NT = 0;
	add_tensor(&src, "tok_embeddings.weight", V, d);
	add_tensor(&src, "norm.weight", d, 0);
	const int64_t rows[9] = { d, d, kv, kv, d, d, h, d, h };
	const int64_t cols[9] = { 0, d, d, d, d, 0, d, h, d };
	for (int L = 0; L < cfg.n_layers; L++)
		for (int k = 0; k < 9; k++) {
			char name[96];
			snprintf(name, sizeof(name), "layers.%d.%s", L, layer_canon[k]);
			add_tensor(&src, name, rows[k], cols[k]);
		}
}

static int group_setup(void **state)
{
	assert_int_equal(kk_backend_open("cpu", &be), 0);
	assert_non_null(mkdtemp(tmpdir));
	fixture = kiln_test_model_fixture();
	if (!fixture)
		return 0;
	kiln_error err = {};
	km_file *l = NULL;
	if (km_file_open(fixture, &l, &err) < 0)
		fail_msg("%s", err.msg);
	read_all(l);
	km_weight_source src = km_file_source(l);
	ref_logits = malloc((size_t) N_STEPS * V * sizeof(float));
	assert_non_null(ref_logits);
	km_model *m = model_from(&cfg, src);
	toks[0] = 1;
	forced(m, ref_logits, true);
	km_model_free(m);
	km_file_free(l);
	return 0;
}

static int group_teardown(void **state)
{
	for (int i = 0; i < NT; i++)
		free(T[i].data);
	free(T);
	free(ref_logits);
	kk_backend_free(be);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* ---- kiln-style canonical safetensors ------------------------------------ */

/* skip / bad_dtype: a tensor left out / stored as I32; extra_meta: one
 * more kiln.config.* key (error tests). */
static void write_kiln(const char *path, const char *skip_meta, const char *bad_dtype,
		       const char *extra_meta)
{
	kmf_writer *w = NULL;
	assert_int_equal(kmf_writer_new(&w), 0);
	for (int i = 0; i < NT; i++) {
		const tens *t = &T[i];
		uint64_t nb = (uint64_t) t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1) * 4;
		bool bad = bad_dtype && !strcmp(bad_dtype, t->name);
		assert_int_equal(kmf_writer_add(w, t->name, bad ? KMF_I32 : KMF_F32, t->ndim,
						t->shape, t->data, nb),
				 0);
	}
	char v[64];
	const struct {
		const char *k;
		long long v;
	} ints[] = {
		{ "kiln.config.dim", cfg.dim },
		{ "kiln.config.hidden_dim", cfg.hidden_dim },
		{ "kiln.config.n_layers", cfg.n_layers },
		{ "kiln.config.n_heads", cfg.n_heads },
		{ "kiln.config.n_kv_heads", cfg.n_kv_heads },
		{ "kiln.config.vocab_size", cfg.vocab_size },
		{ "kiln.config.max_seq_len", cfg.max_seq_len },
		{ "kiln.config.rope_mode", 0 },
		{ "kiln.config.shared_classifier", 1 },
	};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		if (skip_meta && !strcmp(skip_meta, ints[i].k))
			continue;
		snprintf(v, sizeof(v), "%lld", ints[i].v);
		assert_int_equal(kmf_writer_set_meta(w, ints[i].k, v), 0);
	}
	snprintf(v, sizeof(v), "%a", (double) cfg.norm_eps);
	assert_int_equal(kmf_writer_set_meta(w, "kiln.config.norm_eps", v), 0);
	snprintf(v, sizeof(v), "%a", (double) cfg.rope_theta);
	assert_int_equal(kmf_writer_set_meta(w, "kiln.config.rope_theta", v), 0);
	if (extra_meta)
		assert_int_equal(kmf_writer_set_meta(w, extra_meta, "1"), 0);
	kiln_error ke = {};
	assert_int_equal(kmf_writer_commit(w, path, 0644, &ke), 0);
	kmf_writer_free(w);
}

static void test_kiln_safetensors(void **state)
{
	NEED_FIXTURE();
	write_kiln(tpath("kiln.safetensors"), NULL, NULL, NULL);
	double mx, agree;
	compare_file(tpath("kiln.safetensors"), KM_FILE_KILN, &mx, &agree);
	assert_true(mx == 0.0); /* the same f32 weights, the same kernels */
	assert_true(agree == 1.0);
}

/* The llama2.c file itself through km_file (kmf's llama2.c reader underneath). */
static void test_llama2c(void **state)
{
	NEED_FIXTURE();
	double mx, agree;
	compare_file(fixture, KM_FILE_LLAMA2C, &mx, &agree);
	assert_true(mx == 0.0);
	assert_true(agree == 1.0);
}

/* ---- Hugging Face safetensors -------------------------------------------- */

/* HF's checkpoint converter reorders each head's q/k rows so that the
 * pairs RoPE rotates are (i, i + hd/2) instead of (2i, 2i+1): HF row
 * h*hd + j holds Meta row h*hd + 2j for j < hd/2, h*hd + 2(j - hd/2) + 1
 * after. */
static float *to_hf_rows(const tens *t, int heads)
{
	int64_t cols = t->shape[1], hd = t->shape[0] / heads;
	float *o = malloc((size_t) (t->shape[0] * cols) * sizeof(float));
	assert_non_null(o);
	for (int h = 0; h < heads; h++)
		for (int64_t j = 0; j < hd; j++) {
			int64_t src = h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
			memcpy(o + (h * hd + j) * cols, t->data + src * cols,
			       (size_t) cols * sizeof(float));
		}
	return o;
}

/* How a dialect names the canonical tensors: the embedding, the final
 * norm, and layer L's tensor k (layer_canon's order) as layer, L, '.',
 * names[k]. */
typedef struct dialect {
	const char *what, *embedding, *norm, *layer;
	const char *const *names;
} dialect;

static const char *dialect_name(const dialect *d, const char *canon, char *buf, size_t len)
{
	if (!strcmp(canon, "tok_embeddings.weight"))
		return d->embedding;
	if (!strcmp(canon, "norm.weight"))
		return d->norm;
	int L;
	char rest[64];
	assert_int_equal(sscanf(canon, "layers.%d.%63s", &L, rest), 2);
	for (int k = 0; k < 9; k++)
		if (!strcmp(rest, layer_canon[k])) {
			snprintf(buf, len, "%s%d.%s", d->layer, L, d->names[k]);
			return buf;
		}
	fail_msg("no %s name for %s", d->what, canon);
	return NULL;
}

static const char *hf_name(const char *canon, char *buf, size_t len)
{
	static const char *const hf[] = {
		"input_layernorm.weight",  "self_attn.q_proj.weight",
		"self_attn.k_proj.weight", "self_attn.v_proj.weight",
		"self_attn.o_proj.weight", "post_attention_layernorm.weight",
		"mlp.gate_proj.weight",	   "mlp.down_proj.weight",
		"mlp.up_proj.weight",
	};
	static const dialect d = { "HF", "model.embed_tokens.weight", "model.norm.weight",
				   "model.layers.", hf };
	return dialect_name(&d, canon, buf, len);
}

/* A tensor write_hf adds to the fixture's (1-D f32). */
typedef struct hf_extra {
	const char *name;
	const float *data;
	int64_t n;
} hf_extra;

static void write_hf_x(const char *dir, const char *config_json, bool permute,
		       const hf_extra *extra, int n_extra)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	kmf_writer *w = NULL;
	assert_int_equal(kmf_writer_new(&w), 0);
	float *own[64] = { 0 };
	int nown = 0;
	for (int i = 0; i < NT; i++) {
		const tens *t = &T[i];
		const float *data = t->data;
		if (permute && strstr(t->name, "attention.wq."))
			data = own[nown++] = to_hf_rows(t, cfg.n_heads);
		else if (permute && strstr(t->name, "attention.wk."))
			data = own[nown++] = to_hf_rows(t, cfg.n_kv_heads);
		assert_true(nown < 64);
		char nb[128];
		uint64_t bytes = (uint64_t) t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1) * 4;
		assert_int_equal(kmf_writer_add(w, hf_name(t->name, nb, sizeof(nb)), KMF_F32,
						t->ndim, t->shape, data, bytes),
				 0);
	}
	for (int i = 0; i < n_extra; i++)
		assert_int_equal(kmf_writer_add(w, extra[i].name, KMF_F32, 1, &extra[i].n,
						extra[i].data, (uint64_t) extra[i].n * 4),
				 0);
	kiln_error ke = {};
	assert_int_equal(kmf_writer_commit(w, path, 0644, &ke), 0);
	kmf_writer_free(w);
	for (int i = 0; i < nown; i++)
		free(own[i]);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	unlink(path);
	if (config_json) {
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs(config_json, f);
		fclose(f);
	}
}

static void write_hf(const char *dir, const char *config_json, bool permute)
{
	write_hf_x(dir, config_json, permute, NULL, 0);
}

/* A config.json as transformers writes one for a Llama (every key of
 * Llama 3.2's but rope_scaling's value), plus `more` (", \"k\": v" ...)
 * when not NULL: an extra key is taken as the last one written. */
static char *hf_config_with(int heads, const char *more)
{
	static char s[2048];
	snprintf(s, sizeof(s),
		 "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
		 "\"attention_dropout\": 0.0, \"bos_token_id\": 1, \"eos_token_id\": [2, 3], "
		 "\"head_dim\": %d, \"hidden_act\": \"silu\", \"hidden_size\": %d, "
		 "\"initializer_range\": 0.02, \"intermediate_size\": %d, "
		 "\"max_position_embeddings\": %d, \"mlp_bias\": false, \"model_type\": "
		 "\"llama\", \"num_attention_heads\": %d, \"num_hidden_layers\": %d, "
		 "\"num_key_value_heads\": %d, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
		 "\"rope_scaling\": null, \"rope_theta\": 10000.0, \"tie_word_embeddings\": "
		 "true, \"torch_dtype\": \"float32\", \"transformers_version\": \"4.45.0\", "
		 "\"use_cache\": true, \"vocab_size\": %d%s}\n",
		 cfg.dim / heads, cfg.dim, cfg.hidden_dim, cfg.max_seq_len, heads, cfg.n_layers,
		 cfg.n_kv_heads, cfg.vocab_size, more ? more : "");
	return s;
}

static char *hf_config(int heads)
{
	return hf_config_with(heads, NULL);
}

static void test_hf_safetensors(void **state)
{
	NEED_FIXTURE();
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/hf", tmpdir);
	assert_int_equal(mkdir(dir, 0755), 0);
	write_hf(dir, hf_config(cfg.n_heads), true);
	double mx, agree;
	char path[700];
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	compare_file(path, KM_FILE_HF, &mx, &agree);
	print_message("# HF (half-split RoPE, permuted q/k): max |dlogit| %.3g\n", mx);
	assert_true(mx <= TOL_HF);
	assert_true(agree == 1.0);
	/* Older transformers stored every layer's rotary_emb.inv_freq: equal
	 * to 1 / theta^(2i / head_dim), it is accepted, the logits the same. */
	float inv[64];
	hf_extra ex[16];
	char names[16][64];
	assert_true(cfg.n_layers <= 16 && cfg.head_dim / 2 <= 64);
	for (int i = 0; i < cfg.head_dim / 2; i++)
		inv[i] = (float) (1.0 / pow(cfg.rope_theta, 2.0 * i / cfg.head_dim));
	for (int L = 0; L < cfg.n_layers; L++) {
		snprintf(names[L], sizeof(names[L]),
			 "model.layers.%d.self_attn.rotary_emb.inv_freq", L);
		ex[L] = (hf_extra){ names[L], inv, cfg.head_dim / 2 };
	}
	write_hf_x(dir, hf_config(cfg.n_heads), true, ex, cfg.n_layers);
	double mx2;
	compare_file(path, KM_FILE_HF, &mx2, &agree);
	assert_true(mx2 == mx);
	/* Without the permutation the same weights must NOT match: the test
	 * sees the RoPE convention. */
	write_hf(dir, hf_config(cfg.n_heads), false);
	compare_file(path, KM_FILE_HF, &mx, &agree);
	print_message("# HF without the permutation: max |dlogit| %.3g\n", mx);
	assert_true(mx > 0.1);
}

/* ---- GGUF ---------------------------------------------------------------- */

typedef struct gbuf {
	uint8_t *p;
	size_t n, cap;
} gbuf;

static void gput(gbuf *b, const void *d, size_t n)
{
	if (!n) /* padding of nothing, maybe into a still empty buffer */
		return;
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 4096;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}
static void gput32(gbuf *b, uint32_t v)
{
	gput(b, &v, 4);
}
static void gput64(gbuf *b, uint64_t v)
{
	gput(b, &v, 8);
}
static void gputf(gbuf *b, float v)
{
	gput(b, &v, 4);
}
static void gstr(gbuf *b, const char *s)
{
	gput64(b, strlen(s));
	gput(b, s, strlen(s));
}
static void gpad(gbuf *b, size_t a)
{
	static const uint8_t z[64];
	gput(b, z, (a - b->n % a) % a);
}

enum {
	GGML_F32 = 0,
	GGML_F16 = 1,
	GGML_Q4_0 = 2,
	GGML_Q8_0 = 8,
	GGUF_U32 = 4,
	GGUF_F32 = 6,
	GGUF_STR = 8
};

/* The GGML type write_gguf gives a tensor of `cols` columns. */
static int gguf_type(int mat_type, int64_t cols)
{
	if (cols && cols % 32 == 0)
		return mat_type;
	return cols && mat_type != GGML_F32 ? GGML_F16 : GGML_F32;
}

typedef struct gguf_opts {
	int mat_type;		       /* GGML type of the 2-D weights whose rows split in 32s */
	const char *arch;	       /* general.architecture */
	const char *drop;	       /* a GGUF tensor name left out */
	const char *wide;	       /* a GGUF tensor written with dim rows instead of its own */
	bool with_output;	       /* output.weight (a copy of the embedding) */
	bool no_tokens;		       /* no tokenizer.ggml.tokens: vocab from token_embd */
	int tokens_delta;	       /* tokens in the list minus vocab */
	bool neutral;		       /* keys that leave the math as it is (vocab_size ...) */
	const char *extra_tensor;      /* one more tensor (1-D f32 [head_dim / 2] of 1s) */
	const float *extra_data;       /* its values instead of 1s */
	const char *str_key, *str_val; /* one more string key */
	const char *u32_key;	       /* one more u32 key (= 7) */
	const char *f32_key;	       /* one more f32 key (= f32_val) */
	float f32_val;
} gguf_opts;

static const char *gguf_name(const char *canon, char *buf, size_t len)
{
	static const char *const gg[] = {
		"attn_norm.weight", "attn_q.weight",	  "attn_k.weight",
		"attn_v.weight",    "attn_output.weight", "ffn_norm.weight",
		"ffn_gate.weight",  "ffn_down.weight",	  "ffn_up.weight",
	};
	static const dialect d = { "GGUF", "token_embd.weight", "output_norm.weight", "blk.", gg };
	return dialect_name(&d, canon, buf, len);
}

/* Encodes n floats as ggml type `type` into b. */
static void gencode(gbuf *b, int type, const float *x, size_t n)
{
	if (type == GGML_F32) {
		gput(b, x, n * 4);
	} else if (type == GGML_F16) {
		for (size_t i = 0; i < n; i++) {
			uint16_t h = kk_f32_to_f16(x[i]);
			gput(b, &h, 2);
		}
	} else if (type == GGML_Q4_0) {
		/* Q4_0: d = max|x| / 7 as f16, q = round(x / d) + 8; element j
		 * in the low nibble of byte j, element j + 16 in its high one. */
		for (size_t i = 0; i < n; i += 32) {
			float amax = 0;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(x[i + j]));
			uint16_t dh = kk_f32_to_f16(amax / 7.0f);
			float d = kk_f16_to_f32(dh), id = d ? 1.0f / d : 0;
			uint8_t q[32], pk[16];
			for (int j = 0; j < 32; j++)
				q[j] = (uint8_t) (fminf(fmaxf(rintf(x[i + j] * id), -8), 7) + 8);
			for (int j = 0; j < 16; j++)
				pk[j] = (uint8_t) (q[j] | (q[j + 16] << 4));
			gput(b, &dh, 2);
			gput(b, pk, 16);
		}
	} else { /* Q8_0: d = max|x| / 127 as f16, q = round(x / d) */
		for (size_t i = 0; i < n; i += 32) {
			float amax = 0;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(x[i + j]));
			float d = amax / 127.0f;
			uint16_t dh = kk_f32_to_f16(d);
			gput(b, &dh, 2);
			float id = d ? 1.0f / d : 0;
			for (int j = 0; j < 32; j++) {
				int8_t q = (int8_t) lrintf(x[i + j] * id);
				gput(b, &q, 1);
			}
		}
	}
}

static void write_gguf(const char *path, const gguf_opts *o)
{
	gbuf kv = { 0 }, info = { 0 }, data = { 0 };
	uint64_t nkv = 0, nt = 0;
#define KV_U32(k, v) (gstr(&kv, k), gput32(&kv, GGUF_U32), gput32(&kv, (uint32_t) (v)), nkv++)
#define KV_F32(k, v) (gstr(&kv, k), gput32(&kv, GGUF_F32), gputf(&kv, v), nkv++)
	gstr(&kv, "general.architecture"), gput32(&kv, GGUF_STR);
	gstr(&kv, o->arch ? o->arch : "llama"), nkv++;
	KV_U32("llama.embedding_length", cfg.dim);
	KV_U32("llama.feed_forward_length", cfg.hidden_dim);
	KV_U32("llama.block_count", cfg.n_layers);
	KV_U32("llama.attention.head_count", cfg.n_heads);
	KV_U32("llama.attention.head_count_kv", cfg.n_kv_heads);
	KV_U32("llama.context_length", cfg.max_seq_len);
	KV_U32("llama.rope.dimension_count", cfg.head_dim);
	KV_F32("llama.attention.layer_norm_rms_epsilon", cfg.norm_eps);
	KV_F32("llama.rope.freq_base", cfg.rope_theta);
#define KV_STR(k, v) (gstr(&kv, k), gput32(&kv, GGUF_STR), gstr(&kv, v), nkv++)
	if (o->neutral) {
		KV_STR("general.name", "tiny260K");
		KV_U32("general.file_type", 0);
		KV_STR("quantize.imatrix.file", "none.dat");
		KV_U32("llama.vocab_size", V);
		KV_U32("llama.attention.key_length", cfg.head_dim);
		KV_U32("llama.attention.value_length", cfg.head_dim);
		KV_U32("llama.expert_count", 0);
		KV_U32("llama.expert_used_count", 0);
		KV_STR("llama.rope.scaling.type", "none");
		KV_F32("llama.rope.scaling.factor", 1.0f);
		KV_STR("llama.tensor_data_layout", "Meta AI original pth");
	}
	if (o->str_key)
		KV_STR(o->str_key, o->str_val);
	if (o->u32_key)
		KV_U32(o->u32_key, 7);
	if (o->f32_key)
		KV_F32(o->f32_key, o->f32_val);
	if (!o->no_tokens) {
		gstr(&kv, "tokenizer.ggml.tokens"), gput32(&kv, 9), gput32(&kv, GGUF_STR);
		int n = V + o->tokens_delta;
		gput64(&kv, (uint64_t) n);
		for (int i = 0; i < n; i++) {
			char t[16];
			snprintf(t, sizeof(t), "<t%d>", i);
			gstr(&kv, t);
		}
		nkv++;
	}
	float ones[64];
	for (int i = 0; i < 64; i++)
		ones[i] = 1.0f;
	assert_true(cfg.head_dim / 2 <= 64);
	tens extra = { .ndim = 1,
		       .shape = { cfg.head_dim / 2 },
		       .data = o->extra_data ? (float *) o->extra_data : ones };
	for (int i = 0; i <= NT + 1; i++) {
		const tens *t = i < NT ? &T[i] : NULL;
		char nb[128];
		const char *name;
		if (t)
			name = gguf_name(t->name, nb, sizeof(nb));
		else if (i == NT && o->with_output)
			t = &T[0], name = "output.weight";
		else if (i == NT + 1 && o->extra_tensor)
			t = &extra, name = o->extra_tensor;
		else
			continue;
		if (o->drop && !strcmp(o->drop, name))
			continue;
		int64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 0;
		if (o->wide && !strcmp(o->wide, name))
			rows = cfg.dim; /* more rows than the data: pad with the next tensor's */
		int type = gguf_type(o->mat_type, cols);
		gpad(&data, 32);
		gstr(&info, name);
		gput32(&info, cols ? 2 : 1);
		gput64(&info, (uint64_t) (cols ? cols : rows));
		if (cols)
			gput64(&info, (uint64_t) rows);
		gput32(&info, (uint32_t) type);
		gput64(&info, data.n);
		size_t n = (size_t) (rows * (cols ? cols : 1));
		float *src = t->data;
		float *tmp = NULL;
		if ((size_t) (t->shape[0] * (cols ? cols : 1)) < n) {
			tmp = calloc(n, sizeof(float));
			memcpy(tmp, t->data, (size_t) (t->shape[0] * cols) * sizeof(float));
			src = tmp;
		}
		gencode(&data, type, src, n);
		free(tmp);
		nt++;
	}
	gbuf out = { 0 };
	gput(&out, "GGUF", 4);
	gput32(&out, 3);
	gput64(&out, nt);
	gput64(&out, nkv);
	gput(&out, kv.p, kv.n);
	gput(&out, info.p, info.n);
	gpad(&out, 32);
	gput(&out, data.p, data.n);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(out.p, 1, out.n, f), out.n);
	fclose(f);
	free(kv.p), free(info.p), free(data.p), free(out.p);
#undef KV_U32
#undef KV_F32
#undef KV_STR
}

/* A weight source of the fixture's f32 weights rounded as write_gguf
 * stores them (f16, or Q8_0 with the f16-rounded block scale), computed
 * here without kmf: the model from it must equal the GGUF file's. */
static int round_read(void *ud, const char *name, float *dst, size_t count, kiln_error *err)
{
	int mat_type = *(const int *) ud;
	const tens *t = find_t(name);
	if (!t)
		return -ENOENT;
	int64_t cols = t->ndim == 2 ? t->shape[1] : 0;
	assert_int_equal(count, (size_t) (t->shape[0] * (cols ? cols : 1)));
	int type = gguf_type(mat_type, cols);
	for (size_t i = 0; i < count; i++)
		dst[i] = type == GGML_F16 ? kk_f16_to_f32(kk_f32_to_f16(t->data[i])) : t->data[i];
	if (type == GGML_Q8_0)
		for (size_t i = 0; i < count; i += 32) {
			float amax = 0;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(t->data[i + j]));
			float d = amax / 127.0f, dd = kk_f16_to_f32(kk_f32_to_f16(d));
			float id = d ? 1.0f / d : 0;
			for (int j = 0; j < 32; j++)
				dst[i + j] = dd * (float) (int8_t) lrintf(t->data[i + j] * id);
		}
	return 0;
}

/* The GGUF file's logits equal those of round_read's weights exactly. */
static void check_rounded_exact(const char *path, int mat_type)
{
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(path, &f, &err) < 0)
		fail_msg("%s", err.msg);
	km_model *a = model_from(km_file_config(f), km_file_source(f));
	km_model *b =
		model_from(&cfg, (km_weight_source){ .userdata = &mat_type, .read = round_read });
	float *la = malloc((size_t) N_STEPS * V * sizeof(float));
	float *lb = malloc((size_t) N_STEPS * V * sizeof(float));
	assert_non_null(la);
	assert_non_null(lb);
	forced(a, la, false);
	forced(b, lb, false);
	assert_memory_equal(la, lb, (size_t) N_STEPS * V * sizeof(float));
	free(la);
	free(lb);
	km_model_free(a);
	km_model_free(b);
	km_file_free(f);
}

static void test_gguf_f32(void **state)
{
	NEED_FIXTURE();
	double mx, agree;
	write_gguf(tpath("f32.gguf"), &(gguf_opts){ .mat_type = GGML_F32 });
	compare_file(tpath("f32.gguf"), KM_FILE_GGUF, &mx, &agree);
	assert_true(mx == 0.0);
	assert_true(agree == 1.0);
	/* Vocabulary from token_embd rows when there is no token list. */
	write_gguf(tpath("f32-notok.gguf"),
		   &(gguf_opts){ .mat_type = GGML_F32, .no_tokens = true });
	compare_file(tpath("f32-notok.gguf"), KM_FILE_GGUF, &mx, &agree);
	assert_true(mx == 0.0);
	/* Keys that leave the math as it is (llama.vocab_size equal to the
	 * vocabulary, rope.scaling.type "none" ...): the same logits. */
	write_gguf(tpath("f32-neutral.gguf"),
		   &(gguf_opts){ .mat_type = GGML_F32, .neutral = true });
	compare_file(tpath("f32-neutral.gguf"), KM_FILE_GGUF, &mx, &agree);
	assert_true(mx == 0.0);
}

/* output.weight present: an unshared classifier, the same logits. */
static void test_gguf_unshared(void **state)
{
	NEED_FIXTURE();
	write_gguf(tpath("out.gguf"), &(gguf_opts){ .mat_type = GGML_F32, .with_output = true });
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(tpath("out.gguf"), &f, &err) < 0)
		fail_msg("%s", err.msg);
	assert_false(km_file_config(f)->shared_classifier);
	km_file_free(f);
	double mx, agree;
	compare_file(tpath("out.gguf"), KM_FILE_GGUF, &mx, &agree);
	assert_true(mx == 0.0);
}

static void test_gguf_f16(void **state)
{
	NEED_FIXTURE();
	double mx, agree;
	write_gguf(tpath("f16.gguf"), &(gguf_opts){ .mat_type = GGML_F16 });
	compare_file(tpath("f16.gguf"), KM_FILE_GGUF, &mx, &agree);
	print_message("# GGUF F16: max |dlogit| %.3g, greedy agreement %.3f\n", mx, agree);
	assert_true(mx > 0); /* the weights were rounded: not the f32 file */
	assert_true(mx <= TOL_F16);
	assert_true(agree >= F16_AGREE);
	check_rounded_exact(tpath("f16.gguf"), GGML_F16);
}

static void test_gguf_q8_0(void **state)
{
	NEED_FIXTURE();
	double mx, agree;
	write_gguf(tpath("q8.gguf"), &(gguf_opts){ .mat_type = GGML_Q8_0 });
	compare_file(tpath("q8.gguf"), KM_FILE_GGUF, &mx, &agree);
	print_message("# GGUF Q8_0 (w2: F16): max |dlogit| %.3g, greedy agreement %.3f\n", mx,
		      agree);
	assert_true(mx > 0);
	assert_true(mx <= TOL_Q8);
	assert_true(agree >= Q8_AGREE);
	check_rounded_exact(tpath("q8.gguf"), GGML_Q8_0);
}

/* A file source with read_quant hidden: every weight through f32. */
static km_file *detour_file;
static int detour_read(void *ud, const char *name, float *dst, size_t count, kiln_error *err)
{
	km_weight_source s = km_file_source(detour_file);
	return s.read(s.userdata, name, dst, count, err);
}

/* The file source with read_quant counted (tensors served as stored). */
static int native_served;
static int count_read_quant(void *ud, const char *name, kk_dtype qt, int64_t n, int64_t k,
			    void *data, uint16_t *scales, kiln_error *err)
{
	km_weight_source s = km_file_source(detour_file);
	int r = s.read_quant(s.userdata, name, qt, n, k, data, scales, err);
	native_served += r == 1;
	return r;
}

static km_model *model_dt(const km_config *c, km_weight_source src, kk_dtype dt)
{
	kiln_error err = {};
	km_model_opts o = { .weight_dtype = dt, .max_tokens = 64, .max_seqs = 1 };
	km_model *m = NULL;
	if (km_model_new(be, c, &o, &src, &m, &err) < 0)
		fail_msg("km_model_new: %s", err.msg);
	return m;
}

static void logit_diff(const float *a, const float *b, double *mx, double *agree)
{
	int same = 0;
	*mx = 0;
	for (int i = 0; i < N_STEPS; i++) {
		for (int j = 0; j < V; j++)
			*mx = fmax(*mx,
				   fabs((double) a[(size_t) i * V + j] - b[(size_t) i * V + j]));
		same += kiln_test_argmax(a + (size_t) i * V, V) ==
			kiln_test_argmax(b + (size_t) i * V, V);
	}
	*agree = (double) same / N_STEPS;
}

/* GGUF Q8_0 / Q4_0 weights served as they are (KK_I8 / KK_Q4 blocks of 32,
 * the file's codes and f16 scales) to an i8 / q4 model: its logits stay
 * within the int8-activation bounds (test-model's, bf16's) of the f32
 * model of the same file (Q8_0) and of the model that reads every weight through
 * f32 and requantizes it (the path before); every tensor whose blocks fit
 * kk's shape is served so. */
static void native_case(int type, kk_dtype dt, const char *name)
{
	kiln_error err = {};
	km_file *f = NULL;
	write_gguf(tpath(name), &(gguf_opts){ .mat_type = type });
	if (km_file_open(tpath(name), &f, &err) < 0)
		fail_msg("%s", err.msg);
	detour_file = f;
	km_model *mf = model_dt(km_file_config(f), km_file_source(f), KK_F32);
	native_served = 0;
	km_model *mn = model_dt(km_file_config(f),
				(km_weight_source){ .userdata = NULL,
						    .read = detour_read,
						    .read_quant = count_read_quant },
				dt);
	km_model *md = model_dt(km_file_config(f),
				(km_weight_source){ .userdata = NULL, .read = detour_read }, dt);
	float *lf = malloc((size_t) N_STEPS * V * sizeof(float));
	float *ln = malloc((size_t) N_STEPS * V * sizeof(float));
	float *ld = malloc((size_t) N_STEPS * V * sizeof(float));
	assert_true(lf && ln && ld);
	forced(mf, lf, false);
	forced(mn, ln, false);
	forced(md, ld, false);
	double mx_f, ag_f, mx_d, ag_d;
	logit_diff(ln, lf, &mx_f, &ag_f);
	logit_diff(ln, ld, &mx_d, &ag_d);
	/* Served as stored: the embedding, q/k/v/o, and (int8) w1/w3: w2's
	 * rows (FFN 172) are no multiple of 32, so the file has it in F16; q4
	 * pads w1/w3 to 192 rows, which the file's blocks cannot give. */
	int want = 1 + cfg.n_layers * (dt == KK_I8 ? 6 : 4);
	print_message("# GGUF %s as %s, %d tensors served as stored: max |dlogit| %.3g vs the "
		      "f32 model (agreement %.3f), %.3g vs the f32 detour (%.3f)\n",
		      type == GGML_Q8_0 ? "Q8_0" : "Q4_0", kk_dtype_name(dt), native_served, mx_f,
		      ag_f, mx_d, ag_d);
	assert_int_equal(native_served, want);
	/* Against the f32 model only for Q8_0: the F16 w2 becomes int4 in a q4
	 * model (int4 on this dim-64 model: test-model's 17.5). */
	assert_true(type != GGML_Q8_0 || (mx_f < 4.0 && ag_f >= 0.85));
	assert_true(mx_d < 4.0 && ag_d >= 0.85);
	free(lf), free(ln), free(ld);
	km_model_free(mf), km_model_free(mn), km_model_free(md);
	km_file_free(f);
}

static void test_gguf_native(void **state)
{
	NEED_FIXTURE();
	native_case(GGML_Q8_0, KK_I8, "native-q8.gguf");
	native_case(GGML_Q4_0, KK_Q4, "native-q4.gguf");
}

/* ---- a real kiln-train checkpoint ------------------------------------------ */

static void test_kmtrain_checkpoint(void **state)
{
	NEED_FIXTURE();
	kiln_error err = {};
	kmt_model *tm = NULL;
	kmt_opts o = { .batch = 1, .seq_len = 16, .init_seed = 7 };
	if (kmt_model_new(be, &cfg, &o, NULL, &tm, &err) < 0)
		fail_msg("kmt_model_new: %s", err.msg);
	if (kmt_save(tm, tpath("trained.safetensors"), NULL, &err) < 0)
		fail_msg("kmt_save: %s", err.msg);
	km_file *f = NULL;
	if (km_file_open(tpath("trained.safetensors"), &f, &err) < 0)
		fail_msg("km_file_open: %s", err.msg);
	assert_int_equal(km_file_kind_of(f), KM_FILE_KILN);
	assert_memory_equal(km_file_config(f), kmt_model_config(tm), sizeof(km_config));
	/* the optimizer state is in the file but never served as weights */
	km_weight_source fs = km_file_source(f);
	float one[64];
	assert_int_equal(fs.read(fs.userdata, "optim.m.norm.weight", one, 64, &err), -ENOENT);
	km_model *a = model_from(km_file_config(f), km_file_source(f));
	km_model *b = model_from(kmt_model_config(tm), kmt_weight_source(tm));
	float *la = malloc((size_t) N_STEPS * V * sizeof(float));
	float *lb = malloc((size_t) N_STEPS * V * sizeof(float));
	assert_non_null(la);
	assert_non_null(lb);
	forced(a, la, false);
	forced(b, lb, false);
	assert_memory_equal(la, lb, (size_t) N_STEPS * V * sizeof(float));
	/* and a random init really differs from the fixture */
	assert_true(fabsf(la[5] - ref_logits[5]) > 1e-6f);
	free(la);
	free(lb);
	km_model_free(a);
	km_model_free(b);
	km_file_free(f);
	kmt_model_free(tm);
}

/* ---- refused files ---------------------------------------------------------- */

/* path does not open: code, and the message is "NAMED: msg_after" (named
 * is the file the message blames: path itself, or an HF model's
 * config.json beside it). */
static void expect_refused_as(const char *path, const char *named, int code, const char *msg_after)
{
	kiln_error err = {};
	km_file *f = NULL;
	int r = km_file_open(path, &f, &err);
	if (r != code)
		fail_msg("%s: got %d (%s), want %d", path, r, err.msg, code);
	assert_null(f);
	char want[1600];
	snprintf(want, sizeof(want), "%s: %s", named, msg_after);
	assert_string_equal(err.msg, want);
}

static void expect_refused(const char *path, int code, const char *msg_after_path)
{
	expect_refused_as(path, path, code, msg_after_path);
}

static void test_bad_files(void **state)
{
	NEED_FIXTURE();
	const char *p = tpath("bad.gguf");
	write_gguf(p, &(gguf_opts){ .arch = "gpt2" });
	expect_refused(p, -EOPNOTSUPP,
		       "GGUF general.architecture is \"gpt2\"; only \"llama\" is supported");
	write_gguf(p, &(gguf_opts){ .drop = "blk.4.ffn_up.weight" });
	expect_refused(p, -ENOENT,
		       "missing tensor 'blk.4.ffn_up.weight' (layers.4.feed_forward.w3.weight) in "
		       "a GGUF llama file");
	write_gguf(p, &(gguf_opts){ .wide = "blk.0.attn_k.weight" });
	expect_refused(p, -EINVAL,
		       "tensor 'blk.0.attn_k.weight' has shape [64, 64], expected [32, 64]");
	write_gguf(p, &(gguf_opts){ .tokens_delta = 3 });
	expect_refused(p, -EINVAL,
		       "tensor 'token_embd.weight' has 512 rows, but tokenizer.ggml.tokens has "
		       "515 tokens");

	p = tpath("bad.safetensors");
	write_kiln(p, "kiln.config.n_layers", NULL, NULL);
	expect_refused(p, -EINVAL, "kiln metadata 'kiln.config.n_layers' is missing");
	write_kiln(p, NULL, "layers.2.ffn_norm.weight", NULL);
	expect_refused(p, -EOPNOTSUPP,
		       "tensor 'layers.2.ffn_norm.weight' has dtype I32; expected a float or GGUF "
		       "block type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)");

	/* safetensors with names nobody maps */
	kmf_writer *w = NULL;
	assert_int_equal(kmf_writer_new(&w), 0);
	assert_int_equal(kmf_writer_add(w, "transformer.wte.weight", KMF_F32, 1, (int64_t[]){ 4 },
					T[0].data, 16),
			 0);
	kiln_error ke = {};
	assert_int_equal(kmf_writer_commit(w, p, 0644, &ke), 0);
	kmf_writer_free(w);
	expect_refused(p, -EOPNOTSUPP,
		       "a safetensors file with neither kiln metadata (kiln.config.*) nor Hugging "
		       "Face Llama tensor names (model.embed_tokens.weight); cannot tell the "
		       "model's layout");

	/* HF: no config.json, then one whose heads do not divide the width */
	char dir[600], path[700], want[1600];
	snprintf(dir, sizeof(dir), "%s/hfbad", tmpdir);
	assert_int_equal(mkdir(dir, 0755), 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	write_hf(dir, NULL, true);
	kiln_error err = {};
	km_file *f = NULL;
	assert_int_equal(km_file_open(path, &f, &err), -EINVAL);
	snprintf(want, sizeof(want),
		 "%s: Hugging Face weights need their config.json beside them: %s/config.json: ",
		 path, dir);
	assert_memory_equal(err.msg, want, strlen(want));
	write_hf(dir, hf_config(7), true);
	expect_refused(path, -EINVAL,
		       "inconsistent Hugging Face safetensors metadata: n_heads = 7 does not "
		       "divide dim = 64");
	write_hf(dir, "{\"model_type\": \"mistral\"}", true);
	snprintf(want, sizeof(want),
		 "%s/config.json: model_type is \"mistral\", only \"llama\" is supported", dir);
	assert_int_equal(km_file_open(path, &f, &err), -EOPNOTSUPP);
	assert_string_equal(err.msg, want);

	/* not a model file at all: kmf's own message */
	p = tpath("junk.bin");
	FILE *j = fopen(p, "w");
	assert_non_null(j);
	fputs("hello", j);
	fclose(j);
	assert_int_equal(km_file_open(p, &f, &err), -EOPNOTSUPP);
	assert_null(f);
	assert_non_null(strstr(err.msg, p));
	assert_int_equal(km_file_open(tpath("absent"), &f, &err), -ENOENT);
}

/* ---- nothing that changes the math is ignored ------------------------------- */

#define RULE \
	"refused, not ignored: use a model without it (docs/model.md, \"What a file may hold\")"

/* HF files whose config.json (in dir) or tensors hold something kiln
 * would ignore: refused, naming it. */
static void hf_refused(const char *dir, const char *config, const hf_extra *extra, const char *file,
		       const char *msg_after)
{
	char path[700], named[700];
	write_hf_x(dir, config, true, extra, extra ? 1 : 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	snprintf(named, sizeof(named), "%s/%s", dir, file);
	expect_refused_as(path, named, -EOPNOTSUPP, msg_after);
}

static char *hf_config_rope(const char *scaling);
static char *hf_config_params(const char *params);

/* Every tensor is one the model uses and every key is read, known not to
 * change the math, or refused by name: the Llama 3.1 frequency factors,
 * RoPE scaling, unknown keys, biases, a layer past the count. */
static void test_refused_unimplemented(void **state)
{
	NEED_FIXTURE();
	const char *p = tpath("refused.gguf");
	/* RoPE scaling kiln does not implement, or factors where llama.cpp
	 * never reads them */
	write_gguf(p, &(gguf_opts){ .extra_tensor = "blk.0.rope_freqs.weight" });
	expect_refused(p, -EOPNOTSUPP,
		       "tensor 'blk.0.rope_freqs.weight': RoPE frequency factors, read only as "
		       "the global rope_freqs.weight; " RULE);
	write_gguf(p, &(gguf_opts){ .str_key = "llama.rope.scaling.type", .str_val = "yarn" });
	expect_refused(p, -EOPNOTSUPP,
		       "GGUF metadata 'llama.rope.scaling.type' = \"yarn\" (only \"none\" and "
		       "\"linear\" accepted): YaRN RoPE scaling, not implemented; " RULE);
	write_gguf(p, &(gguf_opts){ .str_key = "llama.rope.scaling.type", .str_val = "longrope" });
	expect_refused(p, -EOPNOTSUPP,
		       "GGUF metadata 'llama.rope.scaling.type' = \"longrope\" (only \"none\" and "
		       "\"linear\" accepted): LongRoPE scaling, not implemented; " RULE);
	write_gguf(p, &(gguf_opts){ .f32_key = "llama.rope.scaling.attn_factor", .f32_val = 1.5f });
	expect_refused(p, -EOPNOTSUPP,
		       "GGUF metadata 'llama.rope.scaling.attn_factor' = 1.5 (only 1 accepted): a "
		       "scale on RoPE's sin and cos (YaRN's mscale), not implemented; " RULE);
	/* a rope_freqs.weight that cannot be Llama 3.1's */
	float bad[64];
	for (int i = 0; i < 64; i++)
		bad[i] = 1.0f;
	bad[2] = 0;
	write_gguf(p, &(gguf_opts){ .extra_tensor = "rope_freqs.weight", .extra_data = bad });
	expect_refused(p, -EINVAL,
		       "tensor 'rope_freqs.weight' [2] = 0: a RoPE frequency factor must be in (0, "
		       "1e+06]");
	write_gguf(p, &(gguf_opts){ .extra_tensor = "blk.5.attn_q.weight" });
	expect_refused(p, -EOPNOTSUPP,
		       "tensor 'blk.5.attn_q.weight': layer 5, but llama.block_count = 5; " RULE);
	write_gguf(p, &(gguf_opts){ .extra_tensor = "blk.0.attn_q.bias" });
	expect_refused(
		p, -EOPNOTSUPP,
		"tensor 'blk.0.attn_q.bias': a bias, not implemented (Llama has none); " RULE);
	write_gguf(p, &(gguf_opts){ .extra_tensor = "blk.01.attn_q.weight" });
	expect_refused(p, -EOPNOTSUPP,
		       "tensor 'blk.01.attn_q.weight': not a Llama tensor kiln knows; " RULE);
	write_gguf(p, &(gguf_opts){ .str_key = "llama.rope.scaling.type", .str_val = "llama3" });
	expect_refused(
		p, -EOPNOTSUPP,
		"GGUF metadata 'llama.rope.scaling.type' = \"llama3\" (only \"none\" and "
		"\"linear\" accepted): a RoPE scaling unknown to kiln, not implemented; " RULE);
	write_gguf(p, &(gguf_opts){ .u32_key = "llama.foo" });
	expect_refused(
		p, -EOPNOTSUPP,
		"GGUF metadata 'llama.foo' = 7: an unknown key, which may change the math; " RULE);
	write_gguf(p, &(gguf_opts){ .u32_key = "llama.attention.sliding_window" });
	expect_refused(p, -EOPNOTSUPP,
		       "GGUF metadata 'llama.attention.sliding_window' = 7: sliding-window "
		       "attention, not implemented; " RULE);
	write_gguf(p, &(gguf_opts){ .u32_key = "llama.vocab_size" });
	expect_refused(p, -EOPNOTSUPP,
		       "GGUF metadata 'llama.vocab_size' = 7 (only 512 accepted): a vocabulary "
		       "size other than the token list's; " RULE);
	/* other namespaces are not the model's */
	write_gguf(p, &(gguf_opts){ .u32_key = "general.foo" });
	km_file *f = NULL;
	kiln_error err = {};
	if (km_file_open(p, &f, &err) < 0)
		fail_msg("%s", err.msg);
	km_file_free(f);

	p = tpath("refused.safetensors");
	write_kiln(p, NULL, NULL, "kiln.config.qk_norm");
	expect_refused(p, -EOPNOTSUPP,
		       "kiln metadata 'kiln.config.qk_norm' = \"1\": an unknown model setting, "
		       "which may change the math; " RULE);

	char dir[600];
	snprintf(dir, sizeof(dir), "%s/hfref", tmpdir);
	assert_int_equal(mkdir(dir, 0755), 0);
	char cfgbuf[2048];
	snprintf(cfgbuf, sizeof(cfgbuf), "%s", hf_config(cfg.n_heads));
	/* rope_scaling types kiln does not implement, keys it does not read */
	hf_refused(dir, hf_config_rope("{\"rope_type\": \"yarn\", \"factor\": 4.0}"), NULL,
		   "config.json",
		   "rope_scaling type \"yarn\": YaRN, not implemented (kiln has \"llama3\" and "
		   "\"linear\"); " RULE);
	hf_refused(dir, hf_config_rope("{\"type\": \"dynamic\", \"factor\": 2.0}"), NULL,
		   "config.json",
		   "rope_scaling type \"dynamic\": dynamic NTK scaling, not implemented (kiln has "
		   "\"llama3\" and \"linear\"); " RULE);
	hf_refused(dir,
		   hf_config_rope("{\"rope_type\": \"longrope\", \"short_factor\": [1.0], "
				  "\"long_factor\": [2.0]}"),
		   NULL, "config.json",
		   "rope_scaling type \"longrope\": LongRoPE, not implemented (kiln has "
		   "\"llama3\" and \"linear\"); " RULE);
	hf_refused(dir, hf_config_rope("{\"rope_type\": \"ntk\", \"factor\": 2.0}"), NULL,
		   "config.json",
		   "rope_scaling type \"ntk\": a RoPE scaling unknown to kiln (it has \"llama3\" "
		   "and \"linear\"); " RULE);
	hf_refused(
		dir,
		hf_config_rope("{\"rope_type\": \"linear\", \"factor\": 2.0, \"mscale\": "
			       "1.2}"),
		NULL, "config.json",
		"rope_scaling key \"mscale\": unknown to kiln, which may change the math; " RULE);
	/* rope_type wins over type, as in transformers */
	hf_refused(dir,
		   hf_config_rope("{\"rope_type\": \"yarn\", \"type\": \"linear\", "
				  "\"factor\": 2.0}"),
		   NULL, "config.json",
		   "rope_scaling type \"yarn\": YaRN, not implemented (kiln has \"llama3\" and "
		   "\"linear\"); " RULE);
	hf_refused(dir,
		   hf_config_params("{\"rope_theta\": 10000.0, \"rope_type\": \"yarn\", "
				    "\"factor\": 4.0}"),
		   NULL, "config.json",
		   "rope_parameters type \"yarn\": YaRN, not implemented (kiln has \"llama3\" and "
		   "\"linear\"); " RULE);
	hf_refused(dir,
		   hf_config_rope("{\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": "
				  "5.0}"),
		   NULL, "config.json",
		   "rope_scaling key \"rope_theta\": unknown to kiln, which may change the "
		   "math; " RULE);
	/* a llama3 rope_scaling without its numbers is broken, not refused */
	char path[700];
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	char named[700];
	snprintf(named, sizeof(named), "%s/config.json", dir);
	write_hf(dir, hf_config_rope("{\"rope_type\": \"llama3\", \"factor\": 8.0}"), true);
	expect_refused_as(path, named, -EINVAL,
			  "rope_scaling type \"llama3\" needs \"low_freq_factor\" (a number), "
			  "which is missing");
	write_hf(dir,
		 hf_config_rope("{\"rope_type\": \"llama3\", \"factor\": 8.0, "
				"\"low_freq_factor\": 4.0, \"high_freq_factor\": 1.0, "
				"\"original_max_position_embeddings\": 8192}"),
		 true);
	expect_refused_as(
		path, named, -EINVAL,
		"rope_scaling \"high_freq_factor\" must be a number above 4 and below 1e9");
	write_hf(dir, hf_config_rope("1234"), true);
	expect_refused_as(path, named, -EINVAL, "key \"rope_scaling\" must be an object or null");
	char both[2600];
	snprintf(both, sizeof(both), "%s",
		 hf_config_rope("{\"rope_type\": \"linear\", \"factor\": 2.0}"));
	char *end = strrchr(both, '}');
	snprintf(end, sizeof(both) - (size_t) (end - both),
		 ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": "
		 "500000.0}}\n");
	write_hf(dir, both, true);
	expect_refused_as(path, named, -EINVAL,
			  "both \"rope_scaling\" and \"rope_parameters\" are set; keep one "
			  "(transformers 5 writes rope_parameters only)");
	snprintf(both, sizeof(both), "%s", hf_config(cfg.n_heads));
	end = strrchr(both, '}');
	snprintf(end, sizeof(both) - (size_t) (end - both),
		 ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": "
		 "500000.0}}\n");
	write_hf(dir, both, true);
	expect_refused_as(path, named, -EINVAL,
			  "rope_theta = 10000 but rope_parameters.rope_theta = 500000; keep one");
	snprintf(cfgbuf, sizeof(cfgbuf), "%s", hf_config(cfg.n_heads));
	char *at = strstr(cfgbuf, "\"attention_bias\": false");
	assert_non_null(at);
	memcpy(at, "\"attention_bias\": true ", strlen("\"attention_bias\": true "));
	hf_refused(dir, cfgbuf, NULL, "config.json",
		   "key \"attention_bias\" = true (only false accepted): biases on the attention "
		   "projections, not implemented; " RULE);
	hf_refused(dir, hf_config_with(cfg.n_heads, ", \"qk_layernorm\": {\"eps\": 0.5}"), NULL,
		   "config.json",
		   "key \"qk_layernorm\" = {\"eps\":0.5}: an unknown key, which may change the "
		   "math; " RULE);
	float zeros[64] = { 0 };
	hf_refused(dir, hf_config(cfg.n_heads),
		   &(hf_extra){ "model.layers.0.self_attn.q_proj.bias", zeros, cfg.dim },
		   "model.safetensors",
		   "tensor 'model.layers.0.self_attn.q_proj.bias': a bias, not implemented (Llama "
		   "has none); " RULE);
	/* inv_freq of another theta: scaled or other frequencies */
	float inv[64];
	for (int i = 0; i < cfg.head_dim / 2; i++)
		inv[i] = (float) (1.0 / pow(500000.0, 2.0 * i / cfg.head_dim));
	hf_refused(dir, hf_config(cfg.n_heads),
		   &(hf_extra){ "model.layers.1.self_attn.rotary_emb.inv_freq", inv,
				cfg.head_dim / 2 },
		   "model.safetensors",
		   "tensor 'model.layers.1.self_attn.rotary_emb.inv_freq' [1] = 0.037606, not "
		   "rope_theta^(-2/8) = 0.1: other RoPE frequencies (scaled?), not "
		   "implemented; " RULE);
}

/* ---- scaled RoPE: Llama 3.1 (rope_scaling "llama3", GGUF rope_freqs), linear --- */

/* A random GQA model (head_dim 32: 16 RoPE pairs; Wq, Wk x3 for attention
 * that sees positions), teacher-forced over ROPE_STEPS random tokens. */
#define ROPE_STEPS 160
/* kiln's f32 model against the float64 reference, max |dlogprob| over
 * every position and vocabulary entry.  Measured on the cpu backend:
 * 1.4e-5 (HF llama3), 1.3e-5 (GGUF rope_freqs), 1.7e-5 (HF linear), 1.6e-5
 * (GGUF linear). */
#define TOL_ROPE 1e-4
/* Scaled against the same model unscaled (same theta): measured 14.1 nats
 * (llama3, 7.1 on the prompt's own tokens) and 13.9 (linear); a loader
 * that ignored the scaling would be that far off. */
#define ROPE_MATTERS 1.0

/* Llama 3.1's scaling with a context the test reaches: at theta 500000
 * the 16 pairs' wavelengths 2 pi / f run 6.3, 14.3, 32.4, 73.6, 167 ...
 * 2.9e5, so with L = 128, low_freq_factor 1 and high_freq_factor 8, pairs
 * 0-1 keep their frequency (wavelength < L / 8), 2-3 blend and 4-15 are
 * divided by the factor 4: every branch of the formula. */
static const ref_rope rope_llama3 = { .theta = 500000,
				      .kind = REF_ROPE_LLAMA3,
				      .factor = 4,
				      .low_freq_factor = 1,
				      .high_freq_factor = 8,
				      .original_max_pos = 128 };
static const ref_rope rope_linear = { .theta = 500000, .kind = REF_ROPE_LINEAR, .factor = 4 };
static const ref_rope rope_plain = { .theta = 500000 };

/* log-softmax of lg[n] into lp */
static void log_softmax(const double *lg, int n, double *lp)
{
	double mx = -INFINITY, z = 0;
	for (int j = 0; j < n; j++)
		mx = fmax(mx, lg[j]);
	for (int j = 0; j < n; j++)
		z += exp(lg[j] - mx);
	for (int j = 0; j < n; j++)
		lp[j] = lg[j] - mx - log(z);
}

/* The float64 reference's log-probabilities [ROPE_STEPS][V] of the
 * llama2.c file l2c over tk, with RoPE r. */
static void ref_logprobs(const char *l2c, const ref_rope *r, const int32_t *tk, double *lp)
{
	ref_model *m = ref_load(l2c);
	assert_non_null(m);
	ref_set_rope(m, r);
	double *lg = malloc(sizeof(double) * (size_t) V);
	assert_non_null(lg);
	for (int i = 0; i < ROPE_STEPS; i++) {
		assert_int_equal(ref_step(m, tk[i], lg), 0);
		log_softmax(lg, V, lp + (size_t) i * V);
	}
	free(lg);
	ref_free(m);
}

/* kiln's log-probabilities of the model file path over tk, on the cpu
 * backend in f32; *c receives its config. */
static void kiln_logprobs(const char *path, const int32_t *tk, double *lp, km_config *c)
{
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(path, &f, &err) < 0)
		fail_msg("km_file_open: %s", err.msg);
	*c = *km_file_config(f);
	km_model *m = model_from(c, km_file_source(f));
	km_file_free(f);
	km_kvcache *kc = NULL;
	assert_int_equal(km_kvcache_new(be, c, KK_F32, ROPE_STEPS / 16 + 2, 1, &kc), 0);
	int seq = km_kvcache_seq_new(kc);
	float *lg = malloc(sizeof(float) * (size_t) V);
	double *lgd = malloc(sizeof(double) * (size_t) V);
	assert_true(lg && lgd);
	for (int i = 0; i < ROPE_STEPS; i++) {
		km_seq_input in = { .seq = seq, .tokens = &tk[i], .n_tokens = 1 };
		if (km_forward(m, kc, &in, 1, lg, &err) < 0)
			fail_msg("km_forward: %s", err.msg);
		for (int j = 0; j < V; j++)
			lgd[j] = lg[j];
		log_softmax(lgd, V, lp + (size_t) i * V);
	}
	free(lg);
	free(lgd);
	km_kvcache_free(kc);
	km_model_free(m);
}

/* max |a - b| over every entry, and over the prompt's own tokens only
 * (the echo logprobs of a completion API: log p(tk[i + 1] | tk[..i])) */
static double lp_diff(const double *a, const double *b, const int32_t *tk, double *prompt)
{
	double mx = 0;
	*prompt = 0;
	for (int i = 0; i < ROPE_STEPS; i++) {
		for (int j = 0; j < V; j++)
			mx = fmax(mx, fabs(a[(size_t) i * V + j] - b[(size_t) i * V + j]));
		if (i + 1 < ROPE_STEPS) {
			size_t at = (size_t) i * V + (size_t) tk[i + 1];
			*prompt = fmax(*prompt, fabs(a[at] - b[at]));
		}
	}
	return mx;
}

/* config.json of the current model with rope_theta 500000 and rope_scaling
 * `scaling` (JSON) */
static char *hf_config_rope(const char *scaling)
{
	static char s[2600];
	const char *base = hf_config(cfg.n_heads);
	const char *at = strstr(base, "\"rope_scaling\": null, \"rope_theta\": 10000.0");
	assert_non_null(at);
	snprintf(s, sizeof(s), "%.*s\"rope_scaling\": %s, \"rope_theta\": 500000.0%s",
		 (int) (at - base), base, scaling,
		 at + strlen("\"rope_scaling\": null, \"rope_theta\": 10000.0"));
	return s;
}

/* the same in transformers 5's form: rope_parameters `params` (JSON, with
 * rope_theta), no rope_theta or rope_scaling beside it */
static char *hf_config_params(const char *params)
{
	static char s[2600];
	const char *base = hf_config(cfg.n_heads);
	const char *old = "\"rope_scaling\": null, \"rope_theta\": 10000.0";
	const char *at = strstr(base, old);
	assert_non_null(at);
	snprintf(s, sizeof(s), "%.*s\"rope_parameters\": %s%s", (int) (at - base), base, params,
		 at + strlen(old));
	return s;
}

/* Llama 3.1's rope_freqs.weight as llama.cpp's converter computes it from
 * config.json (convert_hf_to_gguf.py, LlamaModel): per pair, 1 below the
 * high-frequency wavelength, factor above the low one, else 1 / ((1 -
 * smooth) / factor + smooth); written here from that description, not
 * from kiln's code. */
static void llama3_factors(const ref_rope *r, int d, float *out)
{
	for (int i = 0; i < d / 2; i++) {
		double freq = 1.0 / pow(r->theta, 2.0 * i / d), wavelen = 2 * M_PI / freq;
		double L = r->original_max_pos;
		if (wavelen < L / r->high_freq_factor)
			out[i] = 1;
		else if (wavelen > L / r->low_freq_factor)
			out[i] = (float) r->factor;
		else {
			double smooth = (L / wavelen - r->low_freq_factor) /
					(r->high_freq_factor - r->low_freq_factor);
			out[i] = (float) (1 / ((1 - smooth) / r->factor + smooth));
		}
	}
}

/* Training a scaled model (kiln-train --model FILE): kmtrain's forward
 * loss over the first 64 tokens of tk is the served model's (lp, its
 * log-probabilities), a kmt_save checkpoint keeps the scaling (its config
 * and logits are the file's exactly), and loading it into an unscaled
 * model is refused. */
static void rope_train(const char *path, const km_config *c, const int32_t *tk, const double *lp)
{
	enum { S = 64 };
	kiln_error err = {};
	km_file *f = NULL;
	if (km_file_open(path, &f, &err) < 0)
		fail_msg("km_file_open: %s", err.msg);
	kmt_model *tm = NULL;
	kmt_opts o = { .batch = 1, .seq_len = S, .init_seed = 1 };
	km_weight_source src = km_file_source(f);
	if (kmt_model_new(be, c, &o, &src, &tm, &err) < 0)
		fail_msg("kmt_model_new: %s", err.msg);
	km_file_free(f);
	kmt_stats st = {};
	kmt_batch b = { .tokens = tk, .targets = tk + 1, .n_seqs = 1 };
	if (kmt_forward(tm, &b, &st, &err) < 0)
		fail_msg("kmt_forward: %s", err.msg);
	double want = 0;
	for (int i = 0; i < S; i++)
		want -= lp[(size_t) i * V + (size_t) tk[i + 1]] / S;
	print_message("# kmtrain forward loss %.7f, the served model's %.7f\n", st.loss, want);
	assert_true(fabs(st.loss - want) < 1e-4);
	const char *ck = tpath("rope-ckpt.safetensors");
	if (kmt_save(tm, ck, NULL, &err) < 0)
		fail_msg("kmt_save: %s", err.msg);
	double *back = malloc(sizeof(double) * (size_t) ROPE_STEPS * V);
	assert_non_null(back);
	km_config cc;
	kiln_logprobs(ck, tk, back, &cc);
	assert_true(cc.rope_scaled);
	assert_memory_equal(cc.rope_freq_div, c->rope_freq_div, sizeof(cc.rope_freq_div));
	assert_memory_equal(back, lp, sizeof(double) * (size_t) ROPE_STEPS * V);
	free(back);
	kmt_model *plain = NULL;
	km_config pc = *c;
	pc.rope_scaled = false;
	if (kmt_model_new(be, &pc, &o, NULL, &plain, &err) < 0)
		fail_msg("kmt_model_new: %s", err.msg);
	char want_msg[800];
	snprintf(want_msg, sizeof(want_msg),
		 "%s: the checkpoint's RoPE scaling (kiln.config.rope_freq_div) is not the "
		 "model's (none): load it into a model of the same config",
		 ck);
	assert_int_equal(kmt_load(plain, ck, NULL, &err), -EINVAL);
	assert_string_equal(err.msg, want_msg);
	kmt_model_free(plain);
	kmt_model_free(tm);
}

static void test_rope_scaling(void **state)
{
	/* The fixture's tensors and config step aside for a random model. */
	km_config keep_cfg = cfg;
	tens *keep_t = T;
	int keep_nt = NT, keep_v = V;
	const char *l2c = tpath("rope-rand.bin");
	assert_int_equal(ref_write_random_qk(l2c, 128, 256, 2, 4, 2, 256, 512, 11, 3.0), 0);
	kiln_error err = {};
	km_file *l = NULL;
	if (km_file_open(l2c, &l, &err) < 0)
		fail_msg("%s", err.msg);
	read_all(l);
	km_file_free(l);
	cfg.rope_theta = 500000.0f; /* what write_gguf writes as freq_base */
	assert_int_equal(cfg.head_dim, 32);

	int32_t tk[ROPE_STEPS];
	uint64_t rs = 0x5eed;
	for (int i = 0; i < ROPE_STEPS; i++)
		tk[i] = (int32_t) (kiln_test_xorshift(&rs) % (uint64_t) V);
	size_t n = (size_t) ROPE_STEPS * V;
	double *want = malloc(n * sizeof(double)), *plain = malloc(n * sizeof(double)),
	       *got = malloc(n * sizeof(double));
	assert_true(want && plain && got);
	ref_logprobs(l2c, &rope_plain, tk, plain);

	char dir[600], hf[700];
	snprintf(dir, sizeof(dir), "%s/hfrope", tmpdir);
	assert_int_equal(mkdir(dir, 0755), 0);
	snprintf(hf, sizeof(hf), "%s/model.safetensors", dir);
	const char *gg = tpath("rope.gguf");
	double mx, pmx, off, poff;
	km_config c;

	/* (a) Hugging Face: config.json's rope_scaling "llama3" (Llama 3.1's
	 * own config.json, with the test's numbers) */
	ref_logprobs(l2c, &rope_llama3, tk, want);
	write_hf(dir,
		 hf_config_rope("{\"factor\": 4.0, \"high_freq_factor\": 8.0, \"low_freq_factor\": "
				"1.0, \"original_max_position_embeddings\": 128, \"rope_type\": "
				"\"llama3\"}"),
		 true);
	kiln_logprobs(hf, tk, got, &c);
	assert_true(c.rope_scaled && c.rope_theta == 500000.0f);
	mx = lp_diff(got, want, tk, &pmx);
	off = lp_diff(got, plain, tk, &poff);
	print_message("# HF rope_scaling llama3: max |dlogprob| %.3g (prompt tokens %.3g) vs the "
		      "float64 reference; %.3g (%.3g) vs the unscaled model\n",
		      mx, pmx, off, poff);
	assert_true(mx <= TOL_ROPE);
	assert_true(off > ROPE_MATTERS);
	rope_train(hf, &c, tk, got);
	/* older transformers' saved inv_freq buffers, scaled: accepted when
	 * they are the scaled frequencies, refused when unscaled */
	float ff[16], inv[16];
	llama3_factors(&rope_llama3, 32, ff);
	for (int i = 0; i < 16; i++)
		inv[i] = (float) (pow(500000.0, -i / 16.0) / ff[i]);
	const char *llama3_json = "{\"factor\": 4.0, \"high_freq_factor\": 8.0, "
				  "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": "
				  "128, \"rope_type\": \"llama3\"}";
	write_hf_x(dir, hf_config_rope(llama3_json), true,
		   &(hf_extra){ "model.rotary_emb.inv_freq", inv, 16 }, 1);
	kiln_logprobs(hf, tk, want, &c);
	assert_memory_equal(want, got, n * sizeof(double));
	for (int i = 0; i < 16; i++)
		inv[i] = (float) pow(500000.0, -i / 16.0);
	char named[700], msg[400];
	snprintf(named, sizeof(named), "%s", hf);
	snprintf(msg, sizeof(msg),
		 "tensor 'model.rotary_emb.inv_freq' [2] = %g, not rope_theta^(-4/32) / %g = %g: "
		 "other RoPE frequencies (scaled?), not implemented; " RULE,
		 (double) inv[2], (double) ff[2], pow(500000.0, -0.125) / ff[2]);
	write_hf_x(dir, hf_config_rope(llama3_json), true,
		   &(hf_extra){ "model.rotary_emb.inv_freq", inv, 16 }, 1);
	expect_refused_as(hf, named, -EOPNOTSUPP, msg);
	/* transformers 5 writes the same as rope_parameters: the same model */
	write_hf(dir,
		 hf_config_params("{\"factor\": 4.0, \"high_freq_factor\": 8.0, "
				  "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": "
				  "128, \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}"),
		 true);
	kiln_logprobs(hf, tk, want, &c);
	assert_memory_equal(want, got, n * sizeof(double));
	write_hf(dir, hf_config_params("{\"rope_theta\": 500000.0, \"rope_type\": \"default\"}"),
		 true);
	kiln_logprobs(hf, tk, want, &c);
	mx = lp_diff(want, plain, tk, &pmx);
	assert_true(!c.rope_scaled && c.rope_theta == 500000.0f && mx <= TOL_ROPE);

	/* (b) GGUF: rope_freqs.weight as llama.cpp's converter writes it */
	ref_logprobs(l2c, &rope_llama3, tk, want);
	assert_true(ff[0] == 1 && ff[1] == 1 && ff[2] > 1 && ff[3] < 4 && ff[4] == 4);
	write_gguf(gg, &(gguf_opts){ .extra_tensor = "rope_freqs.weight", .extra_data = ff });
	kiln_logprobs(gg, tk, got, &c);
	mx = lp_diff(got, want, tk, &pmx);
	off = lp_diff(got, plain, tk, &poff);
	print_message("# GGUF rope_freqs.weight, freq_base 500000: max |dlogprob| %.3g (prompt "
		      "tokens %.3g) vs the reference; %.3g (%.3g) vs the unscaled model\n",
		      mx, pmx, off, poff);
	assert_true(mx <= TOL_ROPE);
	assert_true(off > ROPE_MATTERS);
	/* the same file without the tensor is the unscaled model */
	write_gguf(gg, &(gguf_opts){ 0 });
	kiln_logprobs(gg, tk, got, &c);
	mx = lp_diff(got, plain, tk, &pmx);
	print_message("# GGUF without rope_freqs: max |dlogprob| %.3g vs the unscaled reference\n",
		      mx);
	assert_true(!c.rope_scaled && mx <= TOL_ROPE);

	/* linear: config.json rope_scaling "linear", GGUF rope.scaling.type
	 * "linear" with its factor */
	ref_logprobs(l2c, &rope_linear, tk, want);
	write_hf(dir, hf_config_rope("{\"factor\": 4.0, \"type\": \"linear\"}"), true);
	kiln_logprobs(hf, tk, got, &c);
	mx = lp_diff(got, want, tk, &pmx);
	off = lp_diff(got, plain, tk, &poff);
	print_message("# HF rope_scaling linear: max |dlogprob| %.3g vs the reference; %.3g vs "
		      "unscaled\n",
		      mx, off);
	assert_true(mx <= TOL_ROPE && off > ROPE_MATTERS);
	write_gguf(gg, &(gguf_opts){ .str_key = "llama.rope.scaling.type",
				     .str_val = "linear",
				     .f32_key = "llama.rope.scaling.factor",
				     .f32_val = 4.0f });
	kiln_logprobs(gg, tk, got, &c);
	mx = lp_diff(got, want, tk, &pmx);
	print_message("# GGUF rope.scaling.type linear: max |dlogprob| %.3g vs the reference\n",
		      mx);
	assert_true(mx <= TOL_ROPE);
	/* type "none": llama.cpp never scales, whatever the factor */
	write_gguf(gg, &(gguf_opts){ .str_key = "llama.rope.scaling.type",
				     .str_val = "none",
				     .f32_key = "llama.rope.scaling.factor",
				     .f32_val = 4.0f });
	kiln_logprobs(gg, tk, got, &c);
	assert_false(c.rope_scaled);

	free(want), free(plain), free(got);
	for (int i = 0; i < NT; i++)
		free(T[i].data);
	free(T);
	cfg = keep_cfg, T = keep_t, NT = keep_nt, V = keep_v;
}

/* ---- weights computed on in the file's mapping ------------------------------ */

/* A source that never offers views: the model copies every tensor. */
static km_weight_source copying(km_file *f)
{
	km_weight_source s = km_file_source(f);
	s.view = NULL;
	return s;
}

/* view() handing out a misaligned pointer: kk refuses to wrap it and the
 * model reads the tensor instead. */
static const void *odd_view(void *ud, const char *name, size_t count, kk_dtype *dt)
{
	km_weight_source s = km_file_source(ud);
	const char *p = s.view(ud, name, count, dt);
	return p ? p + 1 : NULL;
}

/* The file's f32 (and f16) tensors are used in place: the model's logits
 * are bit for bit those of a model that copied them, after km_file_free
 * (the model holds the mapping), and the mapping is read-only (a write
 * faults in a child).  A misaligned tensor is copied. */
static void test_mapped_weights(void **state)
{
	NEED_FIXTURE();
	write_gguf(tpath("map32.gguf"), &(gguf_opts){ .mat_type = GGML_F32 });
	write_gguf(tpath("map16.gguf"), &(gguf_opts){ .mat_type = GGML_F16 });
	const char *paths[] = { tpath("map32.gguf"), tpath("map16.gguf") };
	const kk_dtype dts[] = { KK_F32, KK_F16 };
	float *la = malloc((size_t) N_STEPS * V * sizeof(float));
	float *lb = malloc((size_t) N_STEPS * V * sizeof(float));
	assert_non_null(la);
	assert_non_null(lb);
	for (int i = 0; i < 2; i++) {
		kiln_error err = {};
		km_file *f = NULL;
		if (km_file_open(paths[i], &f, &err) < 0)
			fail_msg("%s", err.msg);
		km_config c = *km_file_config(f);
		km_model *a = model_dt(&c, km_file_source(f), dts[i]);
		km_model *b = model_dt(&c, copying(f), dts[i]);
		assert_int_equal(km_model_mapped_bytes(b), 0);
		assert_true(km_model_mapped_bytes(a) > 0);
		if (dts[i] == KK_F32) /* everything; f16: the f32 norms are converted */
			assert_int_equal(km_model_mapped_bytes(a), km_model_weight_bytes(a));
		else
			assert_true(km_model_mapped_bytes(a) < km_model_weight_bytes(a));
		print_message("# %s as %s: %zu of %zu weight bytes on the mapping\n", paths[i],
			      kk_dtype_name(dts[i]), km_model_mapped_bytes(a),
			      km_model_weight_bytes(a));

		/* read-only: a stray write faults instead of changing the file */
		kk_dtype vdt;
		km_weight_source s = km_file_source(f);
		float *w = (float *) s.view(f, "layers.0.attention.wq.weight",
					    (size_t) c.dim * c.dim, &vdt);
		assert_non_null(w);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL); /* not cmocka's handler */
			w[0] = 1.0f;
			_exit(0);
		}
		int st;
		assert_int_equal(waitpid(pid, &st, 0), pid);
		assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);

		km_weight_source odd = km_file_source(f);
		odd.view = odd_view;
		km_model *o = model_dt(&c, odd, dts[i]);
		assert_int_equal(km_model_mapped_bytes(o), 0);

		km_file_free(f); /* a and o hold the mapping now */
		forced(a, la, false);
		forced(b, lb, false);
		assert_memory_equal(la, lb, (size_t) N_STEPS * V * sizeof(float));
		forced(o, la, false);
		assert_memory_equal(la, lb, (size_t) N_STEPS * V * sizeof(float));
		km_model_free(a);
		km_model_free(b);
		km_model_free(o);
	}
	free(la);
	free(lb);
}

/* Anonymous resident memory (/proc/self/status RssAnon), bytes. */
static size_t rss_anon(void)
{
	FILE *fp = fopen("/proc/self/status", "r");
	char line[256];
	size_t kb = 0;
	assert_non_null(fp);
	while (fgets(line, sizeof(line), fp))
		if (sscanf(line, "RssAnon: %zu kB", &kb) == 1)
			break;
	fclose(fp);
	return kb * 1024;
}

/* A random f32 model of ~22 MB as a kiln safetensors file (kmf_writer
 * aligns every tensor). */
static void write_big(const char *path, km_config *c)
{
	*c = kiln_test_config(256, 768, 4, 4, 4, 8192, 64, KK_ROPE_INTERLEAVED, true);
	kmf_writer *w = NULL;
	assert_int_equal(kmf_writer_new(&w), 0);
	float *buf = malloc((size_t) c->vocab_size * c->dim * sizeof(float));
	assert_non_null(buf);
	uint32_t x = 12345;
	for (size_t i = 0; i < (size_t) c->vocab_size * c->dim; i++) {
		x = x * 1664525u + 1013904223u;
		buf[i] = ((float) (x >> 8) / 16777216.0f - 0.5f) * 0.1f;
	}
	const int64_t d = c->dim, h = c->hidden_dim;
	int64_t sh[2] = { c->vocab_size, d };
	assert_int_equal(kmf_writer_add(w, "tok_embeddings.weight", KMF_F32, 2, sh, buf,
					(uint64_t) (sh[0] * sh[1] * 4)),
			 0);
	sh[0] = d;
	assert_int_equal(kmf_writer_add(w, "norm.weight", KMF_F32, 1, sh, buf, (uint64_t) d * 4),
			 0);
	const int64_t rows[9] = { d, d, d, d, d, d, h, d, h };
	const int64_t cols[9] = { 0, d, d, d, d, 0, d, h, d };
	for (int L = 0; L < c->n_layers; L++)
		for (int k = 0; k < 9; k++) {
			char name[96];
			int64_t s2[2] = { rows[k], cols[k] };
			snprintf(name, sizeof(name), "layers.%d.%s", L, layer_canon[k]);
			assert_int_equal(
				kmf_writer_add(w, name, KMF_F32, cols[k] ? 2 : 1, s2,
					       buf + L * 1000 + k,
					       (uint64_t) (rows[k] * (cols[k] ? cols[k] : 1) * 4)),
				0);
		}
	char v[64];
	const struct {
		const char *k;
		long long v;
	} ints[] = {
		{ "kiln.config.dim", c->dim },
		{ "kiln.config.hidden_dim", c->hidden_dim },
		{ "kiln.config.n_layers", c->n_layers },
		{ "kiln.config.n_heads", c->n_heads },
		{ "kiln.config.n_kv_heads", c->n_kv_heads },
		{ "kiln.config.vocab_size", c->vocab_size },
		{ "kiln.config.max_seq_len", c->max_seq_len },
		{ "kiln.config.rope_mode", 0 },
		{ "kiln.config.shared_classifier", 1 },
	};
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		snprintf(v, sizeof(v), "%lld", ints[i].v);
		assert_int_equal(kmf_writer_set_meta(w, ints[i].k, v), 0);
	}
	assert_int_equal(kmf_writer_set_meta(w, "kiln.config.norm_eps", "1e-5"), 0);
	assert_int_equal(kmf_writer_set_meta(w, "kiln.config.rope_theta", "10000"), 0);
	kiln_error ke = {};
	if (kmf_writer_commit(w, path, 0644, &ke) < 0)
		fail_msg("kmf_writer_commit: %s", ke.msg);
	kmf_writer_free(w);
	free(buf);
}

/* Loading an f32 model maps its weights: the process's anonymous memory
 * grows by the activations only (under a quarter of the weights), where a
 * copying load grows by most of the weights (measured in the same run, so
 * the check can fail). */
static void test_mapped_rss(void **state)
{
	km_config c;
	write_big(tpath("big.safetensors"), &c);
	for (int copy = 0; copy < 2; copy++) {
		kiln_error err = {};
		km_file *f = NULL;
		if (km_file_open(tpath("big.safetensors"), &f, &err) < 0)
			fail_msg("%s", err.msg);
		size_t before = rss_anon();
		km_model *m =
			model_dt(km_file_config(f), copy ? copying(f) : km_file_source(f), KK_F32);
		size_t after = rss_anon(), wb = km_model_weight_bytes(m);
		size_t grew = after > before ? after - before : 0;
		print_message("# %s load: anonymous memory +%.1f MB for %.1f MB of weights\n",
			      copy ? "copying" : "mapped", grew / 1e6, wb / 1e6);
		if (copy)
			assert_true(grew >= wb / 2);
		else
			assert_true(grew < wb / 4);
		km_model_free(m);
		km_file_free(f);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_llama2c),
		cmocka_unit_test(test_kiln_safetensors),
		cmocka_unit_test(test_hf_safetensors),
		cmocka_unit_test(test_gguf_f32),
		cmocka_unit_test(test_gguf_unshared),
		cmocka_unit_test(test_gguf_f16),
		cmocka_unit_test(test_gguf_q8_0),
		cmocka_unit_test(test_gguf_native),
		cmocka_unit_test(test_kmtrain_checkpoint),
		cmocka_unit_test(test_bad_files),
		cmocka_unit_test(test_refused_unimplemented),
		cmocka_unit_test(test_rope_scaling),
		cmocka_unit_test(test_mapped_weights),
		cmocka_unit_test(test_mapped_rss),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
