/* source.c — km_file: any model file libkmf reads, as a km_weight_source.
 *
 * km_model only knows canonical (Meta) tensor names and a km_config; real
 * model files come in four dialects.  This file recognises the dialect,
 * derives the km_config from the file's own metadata, checks up front that
 * every tensor the config needs is present with the right shape and a float
 * (or GGUF block) dtype, and then serves tensors by canonical name,
 * converting to f32 with kmf_tensor_to_float.  Checking everything at open
 * means a bad file fails before any device memory is touched, with one
 * message naming the file, the tensor or key, and expected vs found.
 *
 * Nothing in a file that could change the math is ignored: every tensor is
 * one the loader maps, and every model key (GGUF llama.*, config.json,
 * kiln.config.*) is read, known not to change the math (checked where it
 * repeats something read), or refused by name.  A Llama 3.1 GGUF whose
 * rope_freqs.weight were skipped would run with the wrong positions,
 * silently: it is read into the config's RoPE frequency divisors, as
 * config.json's rope_scaling "llama3" and "linear" are; the scalings kiln
 * does not implement (YaRN, LongRoPE, dynamic NTK) are refused by name.
 *
 * Dialects (docs/model.md, "Model files"):
 *   llama2.c          kmf names its arrays with HF names but keeps Meta's
 *                     row order (interleaved RoPE); config from the header;
 *   kiln safetensors  canonical names, config in __metadata__ kiln.config.*
 *                     (what kmt_save writes; optim.* tensors are ignored);
 *   Hugging Face      LlamaForCausalLM names, config.json beside the file,
 *                     half-split RoPE (KK_ROPE_HALF), no permutation;
 *   GGUF "llama"      llama.* metadata, blk.N.* names; llama.cpp's converter
 *                     undoes the HF q/k permutation, so these tensors use
 *                     the interleaved (Meta) convention. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "kiln/macro.h"
#include "kmf.h"
#include "kmodel.h"

#include "model-internal.h"

/* llama.cpp's converter stores Llama 3.1's rope_scaling as this tensor:
 * F32 [rope.dimension_count / 2], the divisor of each pair's frequency
 * (its ggml_rope_ext freq_factors). */
#define GGUF_ROPE_FREQS "rope_freqs.weight"

struct km_file {
	int refs; /* the opener's, plus one per model holding the mapping */
	char *path;
	km_file_kind kind;
	km_config cfg;
	kmf_file *kf;
};

const char *km_file_kind_name(km_file_kind k)
{
	static const char *const names[] = {
		[KM_FILE_LLAMA2C] = "llama2.c",
		[KM_FILE_KILN] = "kiln safetensors",
		[KM_FILE_HF] = "Hugging Face safetensors",
		[KM_FILE_GGUF] = "GGUF llama",
	};
	return (unsigned) k < ARRAY_SIZE(names) ? names[k] : NULL;
}

km_file *km_file_free(km_file *f)
{
	if (!f || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return NULL;
	kmf_close(f->kf);
	free(f->path);
	free(f);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(km_file *, km_file_free);

const km_config *km_file_config(const km_file *f)
{
	return f ? &f->cfg : NULL;
}

km_file_kind km_file_kind_of(const km_file *f)
{
	return f ? f->kind : KM_FILE_LLAMA2C;
}

/* ---- names and shapes --------------------------------------------------- */

/* A tensor's names: canonical, GGUF's, Hugging Face's. */
typedef struct {
	const char *canon, *gguf, *hf;
} tensor_names;

/* Per-layer tensors (suffixes). */
static const tensor_names layer_names[] = {
	{ "attention_norm.weight", "attn_norm.weight", "input_layernorm.weight" },
	{ "attention.wq.weight", "attn_q.weight", "self_attn.q_proj.weight" },
	{ "attention.wk.weight", "attn_k.weight", "self_attn.k_proj.weight" },
	{ "attention.wv.weight", "attn_v.weight", "self_attn.v_proj.weight" },
	{ "attention.wo.weight", "attn_output.weight", "self_attn.o_proj.weight" },
	{ "ffn_norm.weight", "ffn_norm.weight", "post_attention_layernorm.weight" },
	{ "feed_forward.w1.weight", "ffn_gate.weight", "mlp.gate_proj.weight" },
	{ "feed_forward.w2.weight", "ffn_down.weight", "mlp.down_proj.weight" },
	{ "feed_forward.w3.weight", "ffn_up.weight", "mlp.up_proj.weight" },
};

static const tensor_names global_names[] = {
	{ "tok_embeddings.weight", "token_embd.weight", "model.embed_tokens.weight" },
	{ "norm.weight", "output_norm.weight", "model.norm.weight" },
	{ "output.weight", "output.weight", "lm_head.weight" },
};

/* The file's name for a canonical name into buf; -ENOENT if not a name the
 * model uses (so a kiln file's optim.* tensors are never served). */
static int map_name(const km_file *f, const char *canon, char *buf, size_t len)
{
	/* HF and llama2.c (kmf gives it HF names) share the last column. */
	bool gguf = f->kind == KM_FILE_GGUF, same = f->kind == KM_FILE_KILN;
	for (size_t i = 0; i < ARRAY_SIZE(global_names); i++)
		if (streq(canon, global_names[i].canon)) {
			snprintf(buf, len, "%s",
				 same	? canon
				 : gguf ? global_names[i].gguf
					: global_names[i].hf);
			return 0;
		}
	const char *p = startswith(canon, "layers.");
	if (!p)
		return -ENOENT;
	char *end;
	long l = strtol(p, &end, 10);
	if (end == p || *end != '.' || l < 0 || l >= f->cfg.n_layers)
		return -ENOENT;
	for (size_t i = 0; i < ARRAY_SIZE(layer_names); i++)
		if (streq(end + 1, layer_names[i].canon)) {
			if (same)
				snprintf(buf, len, "%s", canon);
			else if (gguf)
				snprintf(buf, len, "blk.%ld.%s", l, layer_names[i].gguf);
			else
				snprintf(buf, len, "model.layers.%ld.%s", l, layer_names[i].hf);
			return 0;
		}
	return -ENOENT;
}

/* The shape (rows, cols; cols 0 for a vector) of a canonical tensor. */
static void canon_shape(const km_config *c, const char *canon, int64_t *rows, int64_t *cols)
{
	int64_t d = c->dim, h = c->hidden_dim, kv = (int64_t) c->n_kv_heads * c->head_dim;
	const char *s = strrchr(canon, '.');
	/* The tensor kind is the component before ".weight". */
	const char *k = canon;
	for (const char *p = canon; p < s; p++)
		if (*p == '.')
			k = p + 1;
	size_t kl = (size_t) (s - k);
#define IS(x) (kl == strlen(x) && strncmp(k, x, kl) == 0)
	*cols = d;
	if (IS("tok_embeddings") || IS("output"))
		*rows = c->vocab_size;
	else if (IS("wq") || IS("wo"))
		*rows = d;
	else if (IS("wk") || IS("wv"))
		*rows = kv;
	else if (IS("w1") || IS("w3"))
		*rows = h;
	else if (IS("w2"))
		*rows = d, *cols = h;
	else
		*rows = d, *cols = 0;
#undef IS
}

static void shape_str(const int64_t *s, int n, char *buf, size_t len)
{
	size_t at = 0;
	at += (size_t) snprintf(buf, len, "[");
	for (int i = 0; i < n && at < len; i++)
		at += (size_t) snprintf(buf + at, len - at, "%s%lld", i ? ", " : "",
					(long long) s[i]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
}

/* Checks one canonical tensor in the file: present, float, right shape. */
static int check_tensor(const km_file *f, const char *canon, kiln_error *err)
{
	char name[KMF_MAX_NAME];
	map_name(f, canon, name, sizeof(name));
	const kmf_tensor *t = kmf_tensor_find(f->kf, name);
	if (!t)
		return km_errorf(err, -ENOENT, "%s: missing tensor '%s' (%s) in a %s file", f->path,
				 name, canon, km_file_kind_name(f->kind));
	if (!kmf_dtype_is_float(t->dtype))
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: tensor '%s' has dtype %s; expected a float or GGUF block "
				 "type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)",
				 f->path, name, kmf_dtype_name(t->dtype));
	int64_t want[2];
	canon_shape(&f->cfg, canon, &want[0], &want[1]);
	int nd = want[1] ? 2 : 1;
	if (t->ndim != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1])) {
		char ws[64], fs[160];
		shape_str(want, nd, ws, sizeof(ws));
		shape_str(t->shape, t->ndim, fs, sizeof(fs));
		return km_errorf(err, -EINVAL, "%s: tensor '%s' has shape %s, expected %s", f->path,
				 name, fs, ws);
	}
	return 0;
}

/* ---- accounting: nothing that changes the math is ignored ----------------- */

/* The end of every refusal of something kiln would otherwise ignore. */
#define REFUSE_RULE \
	"refused, not ignored: use a model without it (docs/model.md, \"What a file may hold\")"

/* What a tensor the loader does not map is, as far as its name tells. */
static const char *tensor_meaning(const char *name)
{
	static const struct {
		const char *part, *what;
	} meanings[] = {
		{ "rope_freqs",
		  "RoPE frequency factors, read only as the global rope_freqs.weight" },
		{ ".bias", "a bias, not implemented (Llama has none)" },
		{ "q_norm", "Q/K norm, not implemented" },
		{ "k_norm", "Q/K norm, not implemented" },
		{ "exps", "mixture-of-experts weights, not implemented" },
		{ "gate_inp", "a mixture-of-experts router, not implemented" },
		{ "experts", "mixture-of-experts weights, not implemented" },
		{ "rot_embd", "a stored RoPE table, not checked" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(meanings); i++)
		if (strstr(name, meanings[i].part))
			return meanings[i].what;
	return "not a Llama tensor kiln knows";
}

/* The canonical name of a file's tensor name (the inverse of map_name for
 * the names it makes), into buf: 0, or -ENOENT.  *layer: the layer of a
 * per-layer name, -1 for a global one; a layer >= n_layers is returned
 * too, for the caller to name. */
static int canon_of(const km_file *f, const char *name, char *buf, size_t len, long *layer)
{
	bool gguf = f->kind == KM_FILE_GGUF, same = f->kind == KM_FILE_KILN;
	*layer = -1;
	for (size_t i = 0; i < ARRAY_SIZE(global_names); i++)
		if (streq(name, same   ? global_names[i].canon
				: gguf ? global_names[i].gguf
				       : global_names[i].hf)) {
			snprintf(buf, len, "%s", global_names[i].canon);
			return 0;
		}
	const char *p = startswith(name, same ? "layers." : gguf ? "blk." : "model.layers.");
	if (!p || *p < '0' || *p > '9')
		return -ENOENT;
	char *end;
	errno = 0;
	long l = strtol(p, &end, 10);
	if (errno || *end != '.' || l > INT32_MAX)
		return -ENOENT;
	for (size_t i = 0; i < ARRAY_SIZE(layer_names); i++)
		if (streq(end + 1, same	  ? layer_names[i].canon
				   : gguf ? layer_names[i].gguf
					  : layer_names[i].hf)) {
			snprintf(buf, len, "layers.%ld.%s", l, layer_names[i].canon);
			*layer = l;
			return 0;
		}
	return -ENOENT;
}

static const char *n_layers_key(km_file_kind k)
{
	return k == KM_FILE_GGUF ? "llama.block_count"
	       : k == KM_FILE_HF ? "num_hidden_layers"
				 : "kiln.config.n_layers";
}

/* Older transformers saved each layer's rotary_emb.inv_freq,
 * 1 / rope_theta^(2i / head_dim) (divided by rope_scaling's divisors): a
 * buffer derived from config.json that the model recomputes.  Accepted
 * only when it is exactly that to the rounding of its dtype (other
 * frequencies would be another scaling or another theta: refused by
 * name).  1: not such a name. */
static int check_inv_freq(const km_file *f, const kmf_tensor *t, kiln_error *err)
{
	const char *p = startswith(t->name, "model.layers.");
	if (p && *p >= '0' && *p <= '9') {
		char *end;
		long l = strtol(p, &end, 10);
		if (*end != '.' || l >= f->cfg.n_layers)
			return 1;
		p = end + 1;
	} else if (!(p = startswith(t->name, "model.")))
		return 1;
	if (!streq(p, "self_attn.rotary_emb.inv_freq") && !streq(p, "rotary_emb.inv_freq"))
		return 1;
	int d = f->cfg.head_dim, half = d / 2;
	double rtol = t->dtype == KMF_F32 ? 1e-5 : t->dtype == KMF_F16 ? 1e-3 : 8e-3;
	if (t->dtype != KMF_F32 && t->dtype != KMF_F16 && t->dtype != KMF_BF16)
		rtol = -1;
	if (t->ndim != 1 || t->shape[0] != half || rtol < 0)
		return km_errorf(err, -EINVAL,
				 "%s: tensor '%s' (RoPE inverse frequencies) is %s [%lld...], "
				 "expected F32, F16 or BF16 [%d]",
				 f->path, t->name, kmf_dtype_name(t->dtype),
				 (long long) (t->ndim ? t->shape[0] : 0), half);
	_cleanup_free_ float *v = malloc((size_t) half * sizeof(float));
	if (!v)
		return km_errorf(err, -ENOMEM, "%s: out of memory", f->path);
	int r = kmf_tensor_to_float(t, KK_F32, v, (size_t) half);
	if (r < 0)
		return km_errorf(err, r, "%s: converting tensor '%s': %s", f->path, t->name,
				 strerror(-r));
	for (int i = 0; i < half; i++) {
		double div = f->cfg.rope_scaled ? (double) f->cfg.rope_freq_div[i] : 1.0;
		double want = pow((double) f->cfg.rope_theta, -2.0 * i / d) / div;
		char by[48] = "";
		if (div != 1.0)
			snprintf(by, sizeof(by), " / %g", div);
		if (!(fabs(v[i] - want) <= 1e-7 + rtol * want))
			return km_errorf(
				err, -EOPNOTSUPP,
				"%s: tensor '%s' [%d] = %g, not rope_theta^(-%d/%d)%s = %g: other "
				"RoPE frequencies (scaled?), not implemented; " REFUSE_RULE,
				f->path, t->name, i, (double) v[i], 2 * i, d, by, want);
	}
	return 0;
}

/* Every tensor in the file is one the model uses (or kmtrain's optimizer
 * state for one, in a kiln file); anything else is refused by name.  The
 * llama2.c reader names its arrays from the header: nothing else is in
 * such a file (its stored RoPE tables are skipped, as llama2.c's run.c
 * does: they are theta 10000's). */
static int check_names(const km_file *f, kiln_error *err)
{
	if (f->kind == KM_FILE_LLAMA2C)
		return 0;
	for (size_t i = 0; i < kmf_tensor_count(f->kf); i++) {
		const kmf_tensor *t = kmf_tensor_at(f->kf, i);
		const char *name = t->name, *s;
		if (f->kind == KM_FILE_KILN &&
		    ((s = startswith(name, "optim.m.")) || (s = startswith(name, "optim.v."))))
			name = s;
		char canon[KMF_MAX_NAME], back[KMF_MAX_NAME];
		long layer;
		int r = canon_of(f, name, canon, sizeof(canon), &layer);
		if (r == 0 && layer >= f->cfg.n_layers)
			return km_errorf(err, -EOPNOTSUPP,
					 "%s: tensor '%s': layer %ld, but %s = %d; " REFUSE_RULE,
					 f->path, t->name, layer, n_layers_key(f->kind),
					 f->cfg.n_layers);
		if (r == 0 && streq(canon, "output.weight") && f->cfg.shared_classifier)
			return km_errorf(
				err, -EOPNOTSUPP,
				"%s: tensor '%s': a classifier, but kiln.config.shared_classifier "
				"= 1 (the embedding is the classifier); " REFUSE_RULE,
				f->path, t->name);
		/* map_name gives each canonical name one spelling: "blk.01." is
		 * not "blk.1.". */
		if (r == 0 && map_name(f, canon, back, sizeof(back)) == 0 && streq(back, name))
			continue;
		/* read into the config's RoPE divisors by config_gguf */
		if (f->kind == KM_FILE_GGUF && streq(name, GGUF_ROPE_FREQS))
			continue;
		if (f->kind == KM_FILE_HF && (r = check_inv_freq(f, t, err)) <= 0) {
			if (r < 0)
				return r;
			continue;
		}
		return km_errorf(err, -EOPNOTSUPP, "%s: tensor '%s': %s; " REFUSE_RULE, f->path,
				 t->name, tensor_meaning(t->name));
	}
	return 0;
}

/* What a model key (GGUF llama.*, config.json) is to kiln.  A key that
 * does not change the math is accepted at the value that leaves Llama as
 * kiln runs it ("neutral"); anything else is refused with `what`. */
typedef enum key_rule {
	K_READ,	    /* the config reader reads it */
	K_ANY,	    /* does not change the math, whatever its value */
	K_VOCAB,    /* neutral when equal to the vocabulary size */
	K_HEAD_DIM, /* neutral when equal to head_dim */
	K_ONE,	    /* neutral when 1 (a scale) */
	K_ZERO,	    /* neutral when 0 (off) */
	K_TRUE,
	K_FALSE,
	K_STR,	  /* neutral when the string `want` */
	K_NULL,	  /* neutral when JSON null */
	K_REFUSE, /* changes the math at any value */
} key_rule;

typedef struct model_key {
	const char *key;
	key_rule rule;
	const char *want; /* K_STR */
	const char *what; /* what it is, for a refusal */
} model_key;

static const model_key *key_find(const model_key *keys, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (streq(keys[i].key, key))
			return &keys[i];
	return NULL;
}

/* The accepted value of a conditional rule, for a refusal. */
static const char *key_want(const model_key *k, const km_config *c, char *buf, size_t len)
{
	switch (k->rule) {
	case K_VOCAB:
		snprintf(buf, len, "%d", c->vocab_size);
		break;
	case K_HEAD_DIM:
		snprintf(buf, len, "%d", c->head_dim);
		break;
	case K_STR:
		snprintf(buf, len, "\"%s\"", k->want);
		break;
	default:
		snprintf(buf, len, "%s",
			 k->rule == K_ONE    ? "1"
			 : k->rule == K_ZERO ? "0"
			 : k->rule == K_TRUE ? "true"
			 : k->rule == K_NULL ? "null"
					     : "false");
	}
	return buf;
}

/* key: quoted as the dialect's other messages quote it. */
static int refuse_key(const char *where, const char *kind, const char *key, const char *value,
		      const model_key *k, const km_config *c, kiln_error *err)
{
	char want[64] = "";
	if (k && k->rule != K_REFUSE)
		key_want(k, c, want, sizeof(want));
	return km_errorf(err, -EOPNOTSUPP, "%s: %s %s = %s%s%s%s: %s; " REFUSE_RULE, where, kind,
			 key, value, *want ? " (only " : "", want, *want ? " accepted)" : "",
			 k ? k->what : "an unknown key, which may change the math");
}

/* GGUF llama.* keys (GGUF spec, "LLM" and "LLaMA" keys). */
static const model_key gguf_keys[] = {
	{ "embedding_length", K_READ, NULL, NULL },
	{ "feed_forward_length", K_READ, NULL, NULL },
	{ "block_count", K_READ, NULL, NULL },
	{ "attention.head_count", K_READ, NULL, NULL },
	{ "attention.head_count_kv", K_READ, NULL, NULL },
	{ "context_length", K_READ, NULL, NULL },
	{ "expert_count", K_READ, NULL, NULL },
	{ "rope.dimension_count", K_READ, NULL, NULL },
	{ "attention.layer_norm_rms_epsilon", K_READ, NULL, NULL },
	{ "rope.freq_base", K_READ, NULL, NULL },
	{ "vocab_size", K_VOCAB, NULL, "a vocabulary size other than the token list's" },
	/* Only used with experts, which expert_count > 0 refuses. */
	{ "expert_used_count", K_ANY, NULL, NULL },
	{ "attention.key_length", K_HEAD_DIM, NULL,
	  "a key head size other than dim / heads, not implemented" },
	{ "attention.value_length", K_HEAD_DIM, NULL,
	  "a value head size other than dim / heads, not implemented" },
	{ "tensor_data_layout", K_STR, "Meta AI original pth",
	  "a tensor layout other than Meta's, unknown to kiln" },
	/* Read by gguf_rope_scaling; type "yarn" and "longrope" refused there. */
	{ "rope.scaling.type", K_READ, NULL, NULL },
	{ "rope.scaling.factor", K_READ, NULL, NULL },
	{ "rope.scale_linear", K_READ, NULL, NULL },
	/* Whether the model was fine-tuned at its scaling (llama.cpp only
	 * reports it); the context YaRN's ramp starts from (YaRN is refused). */
	{ "rope.scaling.finetuned", K_ANY, NULL, NULL },
	{ "rope.scaling.original_context_length", K_ANY, NULL, NULL },
	{ "rope.scaling.attn_factor", K_ONE, NULL,
	  "a scale on RoPE's sin and cos (YaRN's mscale), not implemented" },
	{ "attention.causal", K_TRUE, NULL, "non-causal attention, not implemented" },
	{ "use_parallel_residual", K_FALSE, NULL,
	  "parallel attention and FFN residuals, not implemented" },
	{ "attention.max_alibi_bias", K_ZERO, NULL, "ALiBi, not implemented" },
	{ "attention.clamp_kqv", K_ZERO, NULL, "clamping of Q, K and V, not implemented" },
	{ "attention.layer_norm_epsilon", K_REFUSE, NULL,
	  "LayerNorm (Llama's norms are RMSNorm), not implemented" },
	{ "attention.sliding_window", K_REFUSE, NULL, "sliding-window attention, not implemented" },
	{ "attn_logit_softcapping", K_REFUSE, NULL,
	  "attention logit soft-capping, not implemented" },
	{ "final_logit_softcapping", K_REFUSE, NULL, "final logit soft-capping, not implemented" },
};

static bool meta_num(const kmf_meta *m, double *v)
{
	switch (m->type) {
	case KMF_V_U8:
	case KMF_V_U16:
	case KMF_V_U32:
	case KMF_V_U64:
		*v = (double) m->u;
		return true;
	case KMF_V_I8:
	case KMF_V_I16:
	case KMF_V_I32:
	case KMF_V_I64:
		*v = (double) m->i;
		return true;
	case KMF_V_F32:
	case KMF_V_F64:
		*v = m->f;
		return true;
	default:
		return false;
	}
}

static const char *meta_value(const kmf_meta *m, char *buf, size_t len)
{
	double v;
	if (m->type == KMF_V_STRING)
		snprintf(buf, len, "\"%.64s%s\"", m->str.s, m->str.len > 64 ? "..." : "");
	else if (m->type == KMF_V_BOOL)
		snprintf(buf, len, "%s", m->b ? "true" : "false");
	else if (m->type == KMF_V_ARRAY)
		snprintf(buf, len, "[%llu x %s]", (unsigned long long) m->arr.n,
			 kmf_vtype_name(m->arr.etype));
	else if (meta_num(m, &v))
		snprintf(buf, len, "%.9g", v);
	else
		snprintf(buf, len, "(%s)", kmf_vtype_name(m->type));
	return buf;
}

static bool gguf_neutral(const model_key *k, const kmf_meta *m, const km_config *c)
{
	double v;
	bool num = meta_num(m, &v);
	switch (k->rule) {
	case K_READ:
	case K_ANY:
		return true;
	case K_VOCAB:
		return num && v == c->vocab_size;
	case K_HEAD_DIM:
		return num && v == c->head_dim;
	case K_ONE:
		return num && v == 1;
	case K_ZERO:
		return num && v == 0;
	case K_TRUE:
	case K_FALSE:
		return m->type == KMF_V_BOOL && m->b == (k->rule == K_TRUE);
	case K_STR:
		return m->type == KMF_V_STRING && streq(m->str.s, k->want);
	default:
		return false;
	}
}

/* Every "<arch>." key accounted for (arch: general.architecture).
 * general.* and tokenizer.* describe the file and the tokenizer (which
 * reads its own); other namespaces (quantize.imatrix.* ...) describe how
 * the file was made, except a split GGUF's split.count, refused: kiln
 * reads one file. */
static int check_gguf_keys(const km_file *f, const char *arch, kiln_error *err)
{
	char val[96];
	for (size_t i = 0; i < kmf_meta_count(f->kf); i++) {
		const kmf_meta *m = kmf_meta_at(f->kf, i);
		const char *s = startswith(m->key, arch);
		double n;
		if (streq(m->key, "split.count") && meta_num(m, &n) && n > 1)
			return km_errorf(
				err, -EOPNOTSUPP,
				"%s: GGUF metadata 'split.count' = %s: one shard of a split GGUF; "
				"merge the shards into one file (llama.cpp's gguf-split --merge)",
				f->path, meta_value(m, val, sizeof(val)));
		if (!s || *s != '.')
			continue;
		const model_key *k = key_find(gguf_keys, ARRAY_SIZE(gguf_keys), s + 1);
		if (!k || !gguf_neutral(k, m, &f->cfg)) {
			char quoted[KMF_MAX_NAME + 2];
			snprintf(quoted, sizeof(quoted), "'%s'", m->key);
			return refuse_key(f->path, "GGUF metadata", quoted,
					  meta_value(m, val, sizeof(val)), k, &f->cfg, err);
		}
	}
	return 0;
}

static int check_all(const km_file *f, kiln_error *err)
{
	char canon[96];
	int r;
	for (size_t i = 0; i < ARRAY_SIZE(global_names); i++) {
		if (streq(global_names[i].canon, "output.weight") && f->cfg.shared_classifier)
			continue;
		if ((r = check_tensor(f, global_names[i].canon, err)) < 0)
			return r;
	}
	for (int l = 0; l < f->cfg.n_layers; l++)
		for (size_t i = 0; i < ARRAY_SIZE(layer_names); i++) {
			snprintf(canon, sizeof(canon), "layers.%d.%s", l, layer_names[i].canon);
			if ((r = check_tensor(f, canon, err)) < 0)
				return r;
		}
	return check_names(f, err);
}

/* ---- the weight source -------------------------------------------------- */

static int file_read(void *userdata, const char *name, float *dst, size_t count, kiln_error *err)
{
	km_file *f = userdata;
	char fname[KMF_MAX_NAME];
	if (map_name(f, name, fname, sizeof(fname)) < 0 ||
	    (streq(name, "output.weight") && f->cfg.shared_classifier))
		return km_errorf(err, -ENOENT, "%s: no tensor '%s' in a %s file", f->path, name,
				 km_file_kind_name(f->kind));
	const kmf_tensor *t = kmf_tensor_find(f->kf, fname);
	if (!t)
		return km_errorf(err, -ENOENT, "%s: missing tensor '%s' (%s)", f->path, fname,
				 name);
	if ((size_t) t->nelem != count)
		return km_errorf(err, -EINVAL, "%s: tensor '%s' has %lld elements, %zu asked for",
				 f->path, fname, (long long) t->nelem, count);
	int r = kmf_tensor_to_float(t, KK_F32, dst, count);
	if (r < 0)
		return km_errorf(err, r, "%s: converting tensor '%s' (%s) to f32 failed: %s",
				 f->path, fname, kmf_dtype_name(t->dtype), strerror(-r));
	return 0;
}

/* The tensor in place: a float dtype kk has, in the mapping, aligned to
 * its element size (GGUF aligns data to 32 bytes by default; safetensors
 * offsets need not be aligned: those tensors are copied).  The pages are
 * asked for ahead (MADV_WILLNEED), so the first forward pass does not
 * fault them in one by one. */
static const void *file_view(void *userdata, const char *name, size_t count, kk_dtype *dtype)
{
	km_file *f = userdata;
	char fname[KMF_MAX_NAME];
	if (map_name(f, name, fname, sizeof(fname)) < 0 ||
	    (streq(name, "output.weight") && f->cfg.shared_classifier))
		return NULL;
	const kmf_tensor *t = kmf_tensor_find(f->kf, fname);
	if (!t || (size_t) t->nelem != count || !t->data)
		return NULL;
	switch (t->dtype) {
	case KMF_F32:
		*dtype = KK_F32;
		break;
	case KMF_F16:
		*dtype = KK_F16;
		break;
	case KMF_BF16:
		*dtype = KK_BF16;
		break;
	default:
		return NULL;
	}
	size_t esize = *dtype == KK_F32 ? 4 : 2; /* not kk_dtype_size: kiln links no kk */
	if ((uintptr_t) t->data % esize || t->nbytes != count * esize)
		return NULL;
	uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t) t->data & ~(page - 1);
	(void) madvise((void *) lo, (uintptr_t) t->data + t->nbytes - lo, MADV_WILLNEED);
	return t->data;
}

static void *file_hold(void *userdata)
{
	km_file *f = userdata;
	__atomic_add_fetch(&f->refs, 1, __ATOMIC_ACQ_REL);
	return f;
}

static void file_drop(void *handle)
{
	km_file_free(handle);
}

/* Gives back the resident pages wholly inside [p, p + n) of the file's
 * read-only mapping (they stay in the page cache; a later read faults them
 * in again): a tensor converted into kiln's own copy would otherwise count
 * twice in the process's RSS. */
static void drop_pages(const void *p, size_t n)
{
	uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
	uintptr_t lo = ((uintptr_t) p + page - 1) & ~(page - 1);
	uintptr_t hi = ((uintptr_t) p + n) & ~(page - 1);
	if (hi > lo)
		(void) madvise((void *) lo, hi - lo, MADV_DONTNEED);
}

/* GGUF Q8_0 / Q4_0 weights as KK_I8 / KK_Q4 blocks of 32 with their own
 * f16 scales: the same values, no requantization.  The tensor's pages of
 * the mapping are given back once copied (drop_pages). */
static int file_read_quant(void *userdata, const char *name, kk_dtype qt, int64_t n, int64_t k,
			   void *data, uint16_t *scales, kiln_error *err)
{
	km_file *f = userdata;
	char fname[KMF_MAX_NAME];
	if (map_name(f, name, fname, sizeof(fname)) < 0)
		return km_errorf(err, -ENOENT, "%s: no tensor '%s'", f->path, name);
	const kmf_tensor *t = kmf_tensor_find(f->kf, fname);
	if (!t)
		return km_errorf(err, -ENOENT, "%s: no tensor '%s'", f->path, fname);
	if (t->ndim != 2 || t->shape[0] != n || t->shape[1] != k)
		return km_errorf(err, -EINVAL, "%s: tensor '%s' is not [%lld, %lld]", f->path,
				 fname, (long long) n, (long long) k);
	bool exact = false;
	int r;
	if (qt == KK_I8 && t->dtype == KMF_Q8_0)
		r = kmf_tensor_to_i8_g32(t, KK_F16, data, scales, &exact);
	else if (qt == KK_Q4 && t->dtype == KMF_Q4_0)
		r = kmf_tensor_to_q4(t, 32, KK_F16, data, scales, &exact);
	else
		return 0;
	if (r < 0)
		return km_errorf(err, r, "%s: converting '%s' (%s): %s", f->path, fname,
				 kmf_dtype_name(t->dtype), strerror(-r));
	if (exact && t->data)
		drop_pages(t->data, t->nbytes);
	return exact ? 1 : 0;
}

km_weight_source km_file_source(km_file *f)
{
	return (km_weight_source){ .userdata = f,
				   .read = file_read,
				   .view = file_view,
				   .hold = file_hold,
				   .drop = file_drop,
				   .read_quant = file_read_quant };
}

/* ---- llama2.c: the header, as kmf's metadata ------------------------------ */

/* kmf checked the header (every field positive, sizes consistent with the
 * file size) before it recognised the file; what llama2.c does not store
 * is fixed by its run.c: eps 1e-5, theta 10000, interleaved RoPE. */
static int config_l2c(km_file *f, kiln_error *err)
{
	static const char *const keys[] = { "dim",	  "hidden_dim", "n_layers", "n_heads",
					    "n_kv_heads", "vocab_size", "seq_len" };
	km_config *c = &f->cfg;
	int *fields[] = { &c->dim,	  &c->hidden_dim, &c->n_layers,	  &c->n_heads,
			  &c->n_kv_heads, &c->vocab_size, &c->max_seq_len };
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		int64_t v;
		if (kmf_meta_get_int(f->kf, keys[i], &v) < 0 || v < 0 || v > INT32_MAX)
			return km_errorf(err, -EINVAL, "%s: llama2.c header field '%s' is missing",
					 f->path, keys[i]);
		*fields[i] = (int) v;
	}
	const kmf_meta *shared = kmf_meta_find(f->kf, "shared_classifier");
	c->shared_classifier = shared && shared->type == KMF_V_BOOL && shared->b;
	c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
	c->norm_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	c->rope_mode = KK_ROPE_INTERLEAVED;
	return 0;
}

/* ---- kiln safetensors: kiln.config.* ------------------------------------ */

/* kiln.config.KEY as a number: a whole int32 (integer), or any. */
static int kiln_num(const km_file *f, const char *key, bool integer, double *ret, kiln_error *err)
{
	_cleanup_free_ char *full = NULL;
	const char *s = NULL;
	char *end;
	if (asprintf(&full, "kiln.config.%s", key) < 0)
		return km_errorf(err, -ENOMEM, "%s: out of memory", f->path);
	if (kmf_meta_get_str(f->kf, full, &s) < 0)
		return km_errorf(err, -EINVAL, "%s: kiln metadata '%s' is missing", f->path, full);
	errno = 0;
	double v = integer ? (double) strtoll(s, &end, 10) : strtod(s, &end);
	if (end == s || *end || (integer && (errno || v < INT32_MIN || v > INT32_MAX)))
		return km_errorf(err, -EINVAL, "%s: kiln metadata '%s' = \"%s\", expected %s",
				 f->path, full, s, integer ? "an integer" : "a number");
	*ret = v;
	return 0;
}

/* kiln.config.rope_freq_div (kmt_save writes it for a scaled RoPE): the
 * divisors of km_config, head_dim / 2 numbers separated by spaces.  Read
 * after head_dim is known; absent: plain RoPE. */
static int kiln_rope_div(km_file *f, kiln_error *err)
{
	const char *s = NULL;
	km_config *c = &f->cfg;
	if (kmf_meta_get_str(f->kf, "kiln.config.rope_freq_div", &s) < 0)
		return 0;
	int half = c->n_heads > 0 ? c->dim / c->n_heads / 2 : 0, n = 0;
	if (half > KM_ROPE_PAIRS_MAX)
		return 0; /* km_config_validate refuses the head size */
	const char *p = s;
	for (char *end;; n++, p = end) {
		double v = strtod(p, &end);
		if (end == p)
			break;
		if (n < half)
			c->rope_freq_div[n] = (float) v;
	}
	p += strspn(p, " ");
	if (n != half || *p)
		return km_errorf(err, -EINVAL,
				 "%s: kiln metadata 'kiln.config.rope_freq_div' = \"%.64s\", "
				 "expected head_dim / 2 = %d numbers",
				 f->path, s, half);
	c->rope_scaled = true;
	return 0;
}

/* Every kiln.config.* key is one of these; an unknown one (a kmtrain newer
 * than this reader, a hand-made file) is refused by name.  The other
 * kiln.* keys kmt_save writes (kiln.step, kiln.data.*, kiln.rng) are
 * training state, not the model; so is optim.* (check_names). */
static int config_kiln(km_file *f, kiln_error *err)
{
	const char *fmt = NULL;
	if (kmf_meta_get_str(f->kf, "kiln.format", &fmt) == 0 && !streq(fmt, "kmtrain-1"))
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: kiln metadata 'kiln.format' = \"%s\", expected \"kmtrain-1\"",
				 f->path, fmt);
	km_config *c = &f->cfg;
	int mode = 0, shared = 0, r;
	double v = 0;
	/* The kiln.config.* keys kiln reads: integers, then numbers. */
	const struct {
		const char *key;
		int *i;	  /* an integer key */
		float *f; /* else a number */
	} keys[] = {
		{ "dim", &c->dim, NULL },
		{ "hidden_dim", &c->hidden_dim, NULL },
		{ "n_layers", &c->n_layers, NULL },
		{ "n_heads", &c->n_heads, NULL },
		{ "n_kv_heads", &c->n_kv_heads, NULL },
		{ "vocab_size", &c->vocab_size, NULL },
		{ "max_seq_len", &c->max_seq_len, NULL },
		{ "rope_mode", &mode, NULL },
		{ "shared_classifier", &shared, NULL },
		{ "norm_eps", NULL, &c->norm_eps },
		{ "rope_theta", NULL, &c->rope_theta },
	};
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		if ((r = kiln_num(f, keys[i].key, keys[i].i != NULL, &v, err)) < 0)
			return r;
		if (keys[i].i)
			*keys[i].i = (int) v;
		else
			*keys[i].f = (float) v;
	}
	if ((r = kiln_rope_div(f, err)) < 0)
		return r;
	/* ...and no other kiln.config.* key. */
	for (size_t i = 0; i < kmf_meta_count(f->kf); i++) {
		const kmf_meta *m = kmf_meta_at(f->kf, i);
		const char *k = startswith(m->key, "kiln.config.");
		bool known = !k || streq(k, "rope_freq_div");
		for (size_t j = 0; j < ARRAY_SIZE(keys) && !known; j++)
			known = streq(k, keys[j].key);
		if (!known)
			return km_errorf(err, -EOPNOTSUPP,
					 "%s: kiln metadata '%s' = \"%.64s\": an unknown model "
					 "setting, which may change the math; " REFUSE_RULE,
					 f->path, m->key, m->type == KMF_V_STRING ? m->str.s : "");
	}
	if (shared != 0 && shared != 1)
		return km_errorf(err, -EINVAL,
				 "%s: kiln metadata 'kiln.config.shared_classifier' = %d, expected "
				 "0 or 1",
				 f->path, shared);
	c->rope_mode = (kk_rope_mode) mode;
	c->shared_classifier = shared;
	c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
	return 0;
}

/* ---- Hugging Face: config.json beside the file -------------------------- */

static int json_int(const km_file *f, const char *cpath, json_t *root, const char *key, bool need,
		    int dflt, int *ret, kiln_error *err)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		if (need)
			return km_errorf(err, -EINVAL, "%s: key \"%s\" is missing (needed for %s)",
					 cpath, key, f->path);
		*ret = dflt;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
		return km_errorf(err, -EINVAL, "%s: key \"%s\" must be a non-negative integer",
				 cpath, key);
	*ret = (int) json_integer_value(v);
	return 0;
}

static int json_float(const char *cpath, json_t *root, const char *key, double dflt, float *ret,
		      kiln_error *err)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		*ret = (float) dflt;
		return 0;
	}
	if (!json_is_number(v))
		return km_errorf(err, -EINVAL, "%s: key \"%s\" must be a number", cpath, key);
	*ret = (float) json_number_value(v);
	return 0;
}

/* config.json keys of a LlamaForCausalLM (transformers' LlamaConfig and
 * PretrainedConfig).  The neutral ones: names and versions, token ids (the
 * tokenizer's business), training-only settings (initializer_range,
 * attention_dropout: dropout acts in training only), use_cache, and
 * pretraining_tp (transformers splits the projections into that many
 * slices and adds them up: the same sums). */
static const model_key hf_keys[] = {
	{ "model_type", K_READ, NULL, NULL },
	{ "rope_scaling", K_READ, NULL, NULL },
	{ "rope_parameters", K_READ, NULL, NULL },
	{ "hidden_size", K_READ, NULL, NULL },
	{ "intermediate_size", K_READ, NULL, NULL },
	{ "num_hidden_layers", K_READ, NULL, NULL },
	{ "num_attention_heads", K_READ, NULL, NULL },
	{ "num_key_value_heads", K_READ, NULL, NULL },
	{ "vocab_size", K_READ, NULL, NULL },
	{ "max_position_embeddings", K_READ, NULL, NULL },
	{ "head_dim", K_READ, NULL, NULL },
	{ "rms_norm_eps", K_READ, NULL, NULL },
	{ "rope_theta", K_READ, NULL, NULL },
	{ "tie_word_embeddings", K_READ, NULL, NULL },
	{ "architectures", K_ANY, NULL, NULL },
	{ "_name_or_path", K_ANY, NULL, NULL },
	{ "torch_dtype", K_ANY, NULL, NULL },
	{ "dtype", K_ANY, NULL, NULL },
	{ "transformers_version", K_ANY, NULL, NULL },
	{ "bos_token_id", K_ANY, NULL, NULL },
	{ "eos_token_id", K_ANY, NULL, NULL },
	{ "pad_token_id", K_ANY, NULL, NULL },
	{ "use_cache", K_ANY, NULL, NULL },
	{ "initializer_range", K_ANY, NULL, NULL },
	{ "attention_dropout", K_ANY, NULL, NULL },
	{ "pretraining_tp", K_ANY, NULL, NULL },
	{ "hidden_act", K_STR, "silu", "an FFN activation other than SiLU, not implemented" },
	{ "attention_bias", K_FALSE, NULL, "biases on the attention projections, not implemented" },
	{ "mlp_bias", K_FALSE, NULL, "biases on the FFN projections, not implemented" },
	{ "sliding_window", K_NULL, NULL, "sliding-window attention, not implemented" },
	{ "quantization_config", K_NULL, NULL,
	  "a quantization method (GPTQ, AWQ ...), not implemented" },
};

/* Every key of config.json accounted for; JSON null means "not set". */
static int check_hf_keys(const char *cpath, json_t *root, const km_config *c, kiln_error *err)
{
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v)
	{
		const model_key *k = key_find(hf_keys, ARRAY_SIZE(hf_keys), key);
		bool ok = k && (k->rule == K_READ || k->rule == K_ANY || json_is_null(v) ||
				(k->rule == K_STR && json_is_string(v) &&
				 streq(json_string_value(v), k->want)) ||
				(k->rule == K_FALSE && json_is_false(v)));
		if (ok)
			continue;
		_cleanup_free_ char *val =
			json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(9));
		char shown[72];
		snprintf(shown, sizeof(shown), "%.64s%s", strna(val),
			 val && strlen(val) > 64 ? "..." : "");
		char quoted[KMF_MAX_NAME + 2];
		snprintf(quoted, sizeof(quoted), "\"%s\"", key);
		return refuse_key(cpath, "key", quoted, shown, k, c, err);
	}
	return 0;
}

/* The number `key` of rope_scaling (what) into *ret: present, a number,
 * > 0 (and > above when above > 0). */
static int hf_rope_num(const char *cpath, const char *what, json_t *rs, const char *type,
		       const char *key, double above, double *ret, kiln_error *err)
{
	json_t *v = json_object_get(rs, key);
	if (!v || json_is_null(v))
		return km_errorf(err, -EINVAL,
				 "%s: %s type \"%s\" needs \"%s\" (a number), which is missing",
				 cpath, what, type, key);
	double d = json_is_number(v) ? json_number_value(v) : NAN;
	if (!(d > 0 && d > above && d < 1e9))
		return km_errorf(err, -EINVAL,
				 "%s: %s \"%s\" must be a number above %g and below 1e9", cpath,
				 what, key, above > 0 ? above : 0);
	*ret = d;
	return 0;
}

/* config.json's rope_scaling (transformers' modeling_rope_utils; null or
 * absent: none) into c's frequency divisors.  "llama3" (Llama 3.1-3.3):
 * with wavelength w = 2 pi / f of each pair's frequency f = theta^(-2i/d)
 * and L = original_max_position_embeddings, a pair with w < L /
 * high_freq_factor keeps f, one with w > L / low_freq_factor gets f /
 * factor, and between them the blend (1 - s) f / factor + s f with s = (L /
 * w - low_freq_factor) / (high_freq_factor - low_freq_factor): divisor 1
 * / ((1 - s) / factor + s).  "linear": every f / factor.  "default": none.
 * The other types are refused by name, and so is a key none of these
 * reads.  what: "rope_scaling", or transformers 5's "rope_parameters" (the
 * same keys and rope_theta, which the caller reads). */
static int hf_rope_scaling(const char *cpath, const char *what, json_t *rs, km_config *c,
			   kiln_error *err)
{
	static const char *const known[] = { "rope_type",	 "type",
					     "factor",		 "low_freq_factor",
					     "high_freq_factor", "original_max_position_embeddings",
					     "rope_theta" };
	static const struct {
		const char *type, *what;
	} refused[] = {
		{ "dynamic", "dynamic NTK scaling" },
		{ "yarn", "YaRN" },
		{ "longrope", "LongRoPE" },
		{ "su", "LongRoPE (\"su\")" },
	};
	if (!rs || json_is_null(rs))
		return 0;
	if (!json_is_object(rs))
		return km_errorf(err, -EINVAL, "%s: key \"%s\" must be an object or null", cpath,
				 what);
	/* transformers reads rope_type, and type where rope_type is absent. */
	json_t *tv = json_object_get(rs, "rope_type");
	if (!tv || json_is_null(tv))
		tv = json_object_get(rs, "type");
	if (!json_is_string(tv))
		return km_errorf(err, -EINVAL, "%s: %s has no \"rope_type\" (or \"type\") string",
				 cpath, what);
	const char *type = json_string_value(tv);
	for (size_t i = 0; i < ARRAY_SIZE(refused); i++)
		if (streq(type, refused[i].type))
			return km_errorf(err, -EOPNOTSUPP,
					 "%s: %s type \"%s\": %s, not implemented (kiln has "
					 "\"llama3\" and \"linear\"); " REFUSE_RULE,
					 cpath, what, type, refused[i].what);
	if (!streq(type, "llama3") && !streq(type, "linear") && !streq(type, "default"))
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: %s type \"%.64s\": a RoPE scaling unknown to kiln (it has "
				 "\"llama3\" and \"linear\"); " REFUSE_RULE,
				 cpath, what, type);
	const char *key;
	json_t *v;
	json_object_foreach(rs, key, v)
	{
		bool ok = false;
		for (size_t i = 0; i < ARRAY_SIZE(known) && !ok; i++)
			ok = streq(key, known[i]) &&
			     (!streq(key, "rope_theta") || streq(what, "rope_parameters"));
		if (!ok)
			return km_errorf(err, -EOPNOTSUPP,
					 "%s: %s key \"%.64s\": unknown to kiln, which may change "
					 "the math; " REFUSE_RULE,
					 cpath, what, key);
	}
	if (streq(type, "default"))
		return 0;
	double factor, lo = 0, hi = 0, L = 0;
	int r = hf_rope_num(cpath, what, rs, type, "factor", 0, &factor, err);
	if (r >= 0 && streq(type, "llama3") &&
	    ((r = hf_rope_num(cpath, what, rs, type, "low_freq_factor", 0, &lo, err)) < 0 ||
	     (r = hf_rope_num(cpath, what, rs, type, "high_freq_factor", lo, &hi, err)) < 0 ||
	     (r = hf_rope_num(cpath, what, rs, type, "original_max_position_embeddings", 0, &L,
			      err)) < 0))
		return r;
	if (r < 0)
		return r;
	if (factor > KM_ROPE_DIV_MAX)
		return km_errorf(err, -EINVAL, "%s: %s \"factor\" = %g, above %g", cpath, what,
				 factor, KM_ROPE_DIV_MAX);
	int d = c->head_dim;
	if (d / 2 > KM_ROPE_PAIRS_MAX)
		return 0; /* km_config_validate refuses the head size */
	c->rope_scaled = true;
	for (int i = 0; i < d / 2; i++) {
		double div = factor;
		if (streq(type, "llama3")) {
			double w = 2 * M_PI / pow((double) c->rope_theta, -2.0 * i / d);
			if (w < L / hi)
				div = 1;
			else if (w <= L / lo) {
				double sm = (L / w - lo) / (hi - lo);
				div = 1 / ((1 - sm) / factor + sm);
			}
		}
		c->rope_freq_div[i] = (float) div;
	}
	return 0;
}

/* RoPE of config.json: rope_theta and rope_scaling (transformers 4), or
 * rope_parameters holding both (transformers 5); not both forms, and a
 * top-level rope_theta beside rope_parameters must agree with it. */
static int hf_rope(const char *cpath, json_t *root, km_config *c, kiln_error *err)
{
	json_t *rs = json_object_get(root, "rope_scaling"),
	       *rp = json_object_get(root, "rope_parameters");
	if (!rp || json_is_null(rp))
		return hf_rope_scaling(cpath, "rope_scaling", rs, c, err);
	if (rs && !json_is_null(rs))
		return km_errorf(err, -EINVAL,
				 "%s: both \"rope_scaling\" and \"rope_parameters\" are set; keep "
				 "one (transformers 5 writes rope_parameters only)",
				 cpath);
	if (!json_is_object(rp))
		return km_errorf(err, -EINVAL,
				 "%s: key \"rope_parameters\" must be an object or null", cpath);
	float theta;
	json_t *top = json_object_get(root, "rope_theta");
	int r = json_float(cpath, rp, "rope_theta", c->rope_theta, &theta, err);
	if (r < 0)
		return r;
	if (top && !json_is_null(top) && theta != c->rope_theta)
		return km_errorf(err, -EINVAL,
				 "%s: rope_theta = %g but rope_parameters.rope_theta = %g; keep "
				 "one",
				 cpath, (double) c->rope_theta, (double) theta);
	c->rope_theta = theta;
	return hf_rope_scaling(cpath, "rope_parameters", rp, c, err);
}

static int config_hf(km_file *f, kiln_error *err)
{
	/* dirname() edits its argument: work on a copy. */
	char dir[PATH_MAX], cpath[PATH_MAX + 16];
	if (strlen(f->path) >= sizeof(dir))
		return km_errorf(err, -ENAMETOOLONG, "%s: path too long", f->path);
	snprintf(dir, sizeof(dir), "%s", f->path);
	snprintf(cpath, sizeof(cpath), "%s/config.json", dirname(dir));
	struct stat st;
	if (stat(cpath, &st) == 0 && st.st_size > KM_FILE_CONFIG_JSON_MAX)
		return km_errorf(err, -EINVAL, "%s: %lld bytes, more than the %d accepted", cpath,
				 (long long) st.st_size, KM_FILE_CONFIG_JSON_MAX);
	json_error_t je;
	_cleanup_(json_decrefp) json_t *root = json_load_file(cpath, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return km_errorf(err, -EINVAL,
				 "%s: Hugging Face weights need their config.json beside them: "
				 "%s: %s",
				 f->path, cpath, je.text);
	if (!json_is_object(root))
		return km_errorf(err, -EINVAL, "%s: not a JSON object", cpath);
	json_t *mt = json_object_get(root, "model_type");
	if (mt && (!json_is_string(mt) || !streq(json_string_value(mt), "llama")))
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: model_type is %s%s%s, only \"llama\" is supported", cpath,
				 json_is_string(mt) ? "\"" : "",
				 json_is_string(mt) ? json_string_value(mt) : "not a string",
				 json_is_string(mt) ? "\"" : "");
	km_config *c = &f->cfg;
	int r, head_dim = 0;
	if ((r = check_hf_keys(cpath, root, c, err)) < 0)
		return r;
	if ((r = json_int(f, cpath, root, "hidden_size", true, 0, &c->dim, err)) < 0 ||
	    (r = json_int(f, cpath, root, "intermediate_size", true, 0, &c->hidden_dim, err)) < 0 ||
	    (r = json_int(f, cpath, root, "num_hidden_layers", true, 0, &c->n_layers, err)) < 0 ||
	    (r = json_int(f, cpath, root, "num_attention_heads", true, 0, &c->n_heads, err)) < 0 ||
	    (r = json_int(f, cpath, root, "num_key_value_heads", false, c->n_heads, &c->n_kv_heads,
			  err)) < 0 ||
	    (r = json_int(f, cpath, root, "vocab_size", true, 0, &c->vocab_size, err)) < 0 ||
	    (r = json_int(f, cpath, root, "max_position_embeddings", true, 0, &c->max_seq_len,
			  err)) < 0 ||
	    (r = json_int(f, cpath, root, "head_dim", false, 0, &head_dim, err)) < 0 ||
	    (r = json_float(cpath, root, "rms_norm_eps", 1e-6, &c->norm_eps, err)) < 0 ||
	    (r = json_float(cpath, root, "rope_theta", 10000.0, &c->rope_theta, err)) < 0)
		return r;
	c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
	if (head_dim && head_dim != c->head_dim)
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: head_dim = %d, but hidden_size / num_attention_heads = %d; "
				 "only head_dim = hidden_size / heads is supported",
				 cpath, head_dim, c->head_dim);
	c->rope_mode = KK_ROPE_HALF;
	if ((r = hf_rope(cpath, root, c, err)) < 0)
		return r;
	/* lm_head absent = tied to the embedding (tie_word_embeddings). */
	c->shared_classifier = kmf_tensor_find(f->kf, "lm_head.weight") == NULL;
	json_t *tie = json_object_get(root, "tie_word_embeddings");
	if (tie && !json_is_null(tie) && !json_is_boolean(tie))
		return km_errorf(err, -EINVAL,
				 "%s: key \"tie_word_embeddings\" must be true or false", cpath);
	if (json_is_false(tie) && c->shared_classifier)
		return km_errorf(err, -ENOENT,
				 "%s: missing tensor 'lm_head.weight' (output.weight) while %s "
				 "says tie_word_embeddings = false",
				 f->path, cpath);
	/* Tied, transformers uses the embedding as the classifier and never
	 * reads a stored lm_head: kiln would compute with it instead. */
	const kmf_tensor *head = kmf_tensor_find(f->kf, "lm_head.weight"),
			 *emb = kmf_tensor_find(f->kf, "model.embed_tokens.weight");
	if (json_is_true(tie) && head &&
	    (head->dtype != emb->dtype || head->nbytes != emb->nbytes ||
	     (head->data != emb->data && memcmp(head->data, emb->data, head->nbytes) != 0)))
		return km_errorf(
			err, -EOPNOTSUPP,
			"%s: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' "
			"while %s says tie_word_embeddings = true (the embedding is the "
			"classifier); remove lm_head.weight or set tie_word_embeddings to false",
			f->path, cpath);
	return 0;
}

/* ---- GGUF llama ---------------------------------------------------------- */

static int gguf_int(const km_file *f, const char *key, bool need, int dflt, int *ret,
		    kiln_error *err)
{
	int64_t v;
	int r = kmf_meta_get_int(f->kf, key, &v);
	if (r == -ENOENT && !need) {
		*ret = dflt;
		return 0;
	}
	if (r == -ENOENT)
		return km_errorf(err, -EINVAL, "%s: GGUF metadata '%s' is missing", f->path, key);
	if (r < 0 || v < 0 || v > INT32_MAX)
		return km_errorf(err, -EINVAL,
				 "%s: GGUF metadata '%s' must be a non-negative integer below 2^31",
				 f->path, key);
	*ret = (int) v;
	return 0;
}

static int gguf_float(const km_file *f, const char *key, bool need, float dflt, float *ret,
		      kiln_error *err)
{
	const kmf_meta *m = kmf_meta_find(f->kf, key);
	if (!m && !need) {
		*ret = dflt;
		return 0;
	}
	if (!m)
		return km_errorf(err, -EINVAL, "%s: GGUF metadata '%s' is missing", f->path, key);
	if (m->type != KMF_V_F32 && m->type != KMF_V_F64)
		return km_errorf(err, -EINVAL, "%s: GGUF metadata '%s' is %s, expected a float",
				 f->path, key, kmf_vtype_name(m->type));
	*ret = (float) m->f;
	return 0;
}

/* RoPE scaling as llama.cpp applies it to a llama GGUF: pair i turns by
 * pos * freq_base^(-2i/d) / rope_freqs[i] * freq_scale (ggml_rope_ext's
 * freq_factors and freq_scale; yarn's ext_factor 0).  freq_scale is 1 /
 * rope.scaling.factor (or the older rope.scale_linear; absent or 0: 1),
 * and 1 whatever the factor when rope.scaling.type is "none"; an absent
 * type is llama.cpp's default, "linear".  "yarn" and "longrope" are
 * refused by name.  Both scalings become c's divisors (their product). */
static int gguf_rope_scaling(km_file *f, kiln_error *err)
{
	km_config *c = &f->cfg;
	const char *type = "linear";
	const kmf_meta *m = kmf_meta_find(f->kf, "llama.rope.scaling.type");
	if (m && m->type != KMF_V_STRING)
		return km_errorf(err, -EINVAL,
				 "%s: GGUF metadata 'llama.rope.scaling.type' is %s, expected a "
				 "string",
				 f->path, kmf_vtype_name(m->type));
	if (m)
		type = m->str.s;
	if (!streq(type, "none") && !streq(type, "linear"))
		return km_errorf(
			err, -EOPNOTSUPP,
			"%s: GGUF metadata 'llama.rope.scaling.type' = \"%.64s\" (only "
			"\"none\" and \"linear\" accepted): %s, not implemented; " REFUSE_RULE,
			f->path, type,
			streq(type, "yarn")	  ? "YaRN RoPE scaling"
			: streq(type, "longrope") ? "LongRoPE scaling"
						  : "a RoPE scaling unknown to kiln");
	float factor = 0;
	const char *fkey = "llama.rope.scaling.factor";
	int r;
	if (!kmf_meta_find(f->kf, fkey))
		fkey = "llama.rope.scale_linear";
	if ((r = gguf_float(f, fkey, false, 0.0f, &factor, err)) < 0)
		return r;
	if (!(factor >= 0 && factor <= KM_ROPE_DIV_MAX))
		return km_errorf(err, -EINVAL, "%s: GGUF metadata '%s' = %g, must be in [0, %g]",
				 f->path, fkey, (double) factor, KM_ROPE_DIV_MAX);
	if (streq(type, "none") || factor == 0)
		factor = 1;
	int half = c->head_dim / 2;
	if (half > KM_ROPE_PAIRS_MAX)
		return 0; /* km_config_validate refuses the head size */
	for (int i = 0; i < half; i++)
		c->rope_freq_div[i] = factor;
	c->rope_scaled = factor != 1;
	const kmf_tensor *t = kmf_tensor_find(f->kf, GGUF_ROPE_FREQS);
	if (!t)
		return 0;
	if (t->ndim != 1 || t->shape[0] != half || !kmf_dtype_is_float(t->dtype))
		return km_errorf(err, -EINVAL,
				 "%s: tensor '%s' (RoPE frequency factors) is %s [%lld%s], "
				 "expected F32 [%d] (head_dim / 2)",
				 f->path, GGUF_ROPE_FREQS, kmf_dtype_name(t->dtype),
				 (long long) (t->ndim ? t->shape[0] : 0),
				 t->ndim > 1 ? ", ..." : "", half);
	float v[KM_ROPE_PAIRS_MAX];
	if ((r = kmf_tensor_to_float(t, KK_F32, v, (size_t) half)) < 0)
		return km_errorf(err, r, "%s: converting tensor '%s': %s", f->path, GGUF_ROPE_FREQS,
				 strerror(-r));
	for (int i = 0; i < half; i++) {
		if (!(v[i] > 0 && v[i] <= KM_ROPE_DIV_MAX))
			return km_errorf(err, -EINVAL,
					 "%s: tensor '%s' [%d] = %g: a RoPE frequency factor must "
					 "be in (0, %g]",
					 f->path, GGUF_ROPE_FREQS, i, (double) v[i],
					 KM_ROPE_DIV_MAX);
		c->rope_freq_div[i] *= v[i];
	}
	c->rope_scaled = true;
	return 0;
}

static int config_gguf(km_file *f, kiln_error *err)
{
	const char *arch = NULL;
	if (kmf_meta_get_str(f->kf, "general.architecture", &arch) < 0)
		return km_errorf(err, -EINVAL,
				 "%s: GGUF metadata 'general.architecture' is missing", f->path);
	if (!streq(arch, "llama"))
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: GGUF general.architecture is \"%s\"; only \"llama\" is "
				 "supported",
				 f->path, arch);
	km_config *c = &f->cfg;
	int r, experts = 0, rot = 0;
	if ((r = gguf_int(f, "llama.embedding_length", true, 0, &c->dim, err)) < 0 ||
	    (r = gguf_int(f, "llama.feed_forward_length", true, 0, &c->hidden_dim, err)) < 0 ||
	    (r = gguf_int(f, "llama.block_count", true, 0, &c->n_layers, err)) < 0 ||
	    (r = gguf_int(f, "llama.attention.head_count", true, 0, &c->n_heads, err)) < 0 ||
	    (r = gguf_int(f, "llama.attention.head_count_kv", false, c->n_heads, &c->n_kv_heads,
			  err)) < 0 ||
	    (r = gguf_int(f, "llama.context_length", true, 0, &c->max_seq_len, err)) < 0 ||
	    (r = gguf_int(f, "llama.expert_count", false, 0, &experts, err)) < 0 ||
	    (r = gguf_int(f, "llama.rope.dimension_count", false, 0, &rot, err)) < 0 ||
	    (r = gguf_float(f, "llama.attention.layer_norm_rms_epsilon", true, 0, &c->norm_eps,
			    err)) < 0 ||
	    (r = gguf_float(f, "llama.rope.freq_base", false, 10000.0f, &c->rope_theta, err)) < 0)
		return r;
	if (experts > 0)
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: GGUF llama.expert_count = %d: mixture-of-experts models are "
				 "not supported",
				 f->path, experts);
	c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
	if (rot && rot != c->head_dim)
		return km_errorf(err, -EOPNOTSUPP,
				 "%s: GGUF llama.rope.dimension_count = %d, expected the head "
				 "dimension %d (partial RoPE is not supported)",
				 f->path, rot, c->head_dim);
	c->rope_mode = KK_ROPE_INTERLEAVED;
	if ((r = gguf_rope_scaling(f, err)) < 0)
		return r;
	/* The vocabulary: the tokenizer's token list, else the embedding rows. */
	const kmf_meta *tok = kmf_meta_find(f->kf, "tokenizer.ggml.tokens");
	const kmf_tensor *emb = kmf_tensor_find(f->kf, "token_embd.weight");
	int64_t rows = emb && emb->ndim == 2 ? emb->shape[0] : -1;
	if (tok) {
		if (tok->type != KMF_V_ARRAY || tok->arr.n > INT32_MAX)
			return km_errorf(
				err, -EINVAL,
				"%s: GGUF metadata 'tokenizer.ggml.tokens' must be an array",
				f->path);
		c->vocab_size = (int) tok->arr.n;
		if (rows >= 0 && rows != c->vocab_size)
			return km_errorf(err, -EINVAL,
					 "%s: tensor 'token_embd.weight' has %lld rows, but "
					 "tokenizer.ggml.tokens has %d tokens",
					 f->path, (long long) rows, c->vocab_size);
	} else {
		if (rows < 0 || rows > INT32_MAX)
			return km_errorf(err, -ENOENT,
					 "%s: missing tensor 'token_embd.weight' (tok_embeddings."
					 "weight) in a GGUF llama file",
					 f->path);
		c->vocab_size = (int) rows;
	}
	c->shared_classifier = kmf_tensor_find(f->kf, "output.weight") == NULL;
	return check_gguf_keys(f, arch, err);
}

/* ---- opening ------------------------------------------------------------- */

int km_file_open(const char *path, km_file **ret, kiln_error *err)
{
	if (!path || !ret)
		return km_errorf(err, -EINVAL, "km_file_open: missing argument");
	_cleanup_(km_file_freep) km_file *f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path)))
		return km_errorf(err, -ENOMEM, "%s: out of memory", path);
	f->refs = 1;
	kiln_error ke = { 0 };
	int r = kmf_open(path, &f->kf, &ke);
	if (r < 0) {
		char line[800];
		return km_errorf(err, r, "%s", kiln_error_format(&ke, line, sizeof(line)));
	}
	switch (kmf_file_format(f->kf)) {
	case KMF_FORMAT_LLAMA2C:
		f->kind = KM_FILE_LLAMA2C;
		r = config_l2c(f, err);
		break;
	case KMF_FORMAT_GGUF:
		f->kind = KM_FILE_GGUF;
		r = config_gguf(f, err);
		break;
	case KMF_FORMAT_SAFETENSORS:
		if (kmf_meta_find(f->kf, "kiln.config.dim")) {
			f->kind = KM_FILE_KILN;
			r = config_kiln(f, err);
		} else if (kmf_tensor_find(f->kf, "model.embed_tokens.weight")) {
			f->kind = KM_FILE_HF;
			r = config_hf(f, err);
		} else
			return km_errorf(err, -EOPNOTSUPP,
					 "%s: a safetensors file with neither kiln metadata "
					 "(kiln.config.*) nor Hugging Face Llama tensor names "
					 "(model.embed_tokens.weight); cannot tell the model's "
					 "layout",
					 path);
		break;
	default:
		return km_errorf(err, -EOPNOTSUPP, "%s: unsupported model file format", path);
	}
	if (r < 0)
		return r;
	kiln_error cerr;
	if ((r = km_config_validate(&f->cfg, &cerr)) < 0)
		return km_errorf(err, r, "%s: inconsistent %s metadata: %s", path,
				 km_file_kind_name(f->kind), cerr.msg + strlen("model config: "));
	if ((r = check_all(f, err)) < 0)
		return r;
	*ret = TAKE_PTR(f);
	return 0;
}
