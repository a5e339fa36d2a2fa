/* train_ckpt.c — kmt_save / kmt_load: training checkpoints as safetensors.
 *
 * One file holds everything a resumed run needs: the parameters under
 * their canonical names (so kiln-inferd and any safetensors reader load a
 * trained model as it is), the AdamW moments under "optim.m." / "optim.v."
 * prefixes, and in __metadata__ (strings, as the format wants) the config,
 * the step, the data cursor and the caller's RNG state.  Writing goes
 * through kmf_writer (temp file, fsync, rename, directory fsync), so a
 * crash never leaves a half-written checkpoint under the name.  Loading
 * reads and checks the whole file into host memory before the model is
 * touched: a bad file fails and the model keeps its state. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/macro.h"
#include "kmf.h"
#include "kmtrain.h"

#include "train-internal.h"

#define KMT_CKPT_FORMAT "kmtrain-1"

DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_writer *, kmf_writer_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_file *, kmf_close);

/* The integer-valued config fields, by metadata key. */
typedef struct cfg_field {
	const char *key;
	int64_t val;
} cfg_field;

static size_t cfg_fields(const km_config *c, cfg_field *f)
{
	size_t n = 0;
	f[n++] = (cfg_field){ "kiln.config.dim", c->dim };
	f[n++] = (cfg_field){ "kiln.config.hidden_dim", c->hidden_dim };
	f[n++] = (cfg_field){ "kiln.config.n_layers", c->n_layers };
	f[n++] = (cfg_field){ "kiln.config.n_heads", c->n_heads };
	f[n++] = (cfg_field){ "kiln.config.n_kv_heads", c->n_kv_heads };
	f[n++] = (cfg_field){ "kiln.config.vocab_size", c->vocab_size };
	f[n++] = (cfg_field){ "kiln.config.max_seq_len", c->max_seq_len };
	f[n++] = (cfg_field){ "kiln.config.rope_mode", c->rope_mode };
	f[n++] = (cfg_field){ "kiln.config.shared_classifier", c->shared_classifier };
	return n;
}
#define CFG_FIELDS_MAX 16

/* Downloads the three flat buffers (params, m, v) into one host array. */
static int download_state(kmt_model *m, float **ret, kiln_error *err)
{
	size_t n = kmt_param_count(m);
	_cleanup_free_ float *h = malloc(3 * n * sizeof(float));
	if (!h)
		return km_errorf(err, -ENOMEM, "checkpoint: out of memory for %zu parameters", n);
	const kmt_which w[3] = { KMT_PARAM, KMT_ADAM_M, KMT_ADAM_V };
	for (int i = 0; i < 3; i++) {
		int r = kk_buffer_download(kmt__backend(m), NULL, kmt__flat(m, w[i]), 0, h + i * n,
					   n * sizeof(float));
		if (r < 0)
			return km_errorf(err, r, "checkpoint: downloading the model failed: %s",
					 strerror(-r));
	}
	*ret = TAKE_PTR(h);
	return 0;
}

static const char *const prefixes[3] = { "", "optim.m.", "optim.v." };

int kmt_save(kmt_model *m, const char *path, const kmt_ckpt_state *st, kiln_error *err)
{
	if (!m || !path)
		return km_errorf(err, -EINVAL, "kmt_save: missing argument");
	_cleanup_free_ float *h = NULL;
	int r = download_state(m, &h, err);
	if (r < 0)
		return r;
	_cleanup_(kmf_writer_freep) kmf_writer *w = NULL;
	if ((r = kmf_writer_new(&w)) < 0)
		return km_errorf(err, r, "checkpoint: out of memory");
	const size_t n = kmt_param_count(m), nt = kmt_tensor_count(m);
	const kmt_tensor *t = kmt__tensors(m);
	/* Names take at most the prefix and KMT_NAME_MAX. */
	char name[KMT_NAME_MAX + 16];
	for (int p = 0; p < 3; p++)
		for (size_t i = 0; i < nt; i++) {
			snprintf(name, sizeof(name), "%s%s", prefixes[p], t[i].name);
			r = kmf_writer_add(w, name, KMF_F32, t[i].ndim, t[i].shape,
					   h + p * n + t[i].off, t[i].n * sizeof(float));
			if (r < 0)
				return km_errorf(err, r, "checkpoint: adding '%s' failed: %s", name,
						 strerror(-r));
		}
	cfg_field f[CFG_FIELDS_MAX];
	size_t nf = cfg_fields(kmt_model_config(m), f);
	char val[64];
	const km_config *c = kmt_model_config(m);
	kmt_ckpt_state zero = { 0 };
	if (!st)
		st = &zero;
#define META(k, ...)                                                                        \
	do {                                                                                \
		snprintf(val, sizeof(val), __VA_ARGS__);                                    \
		if ((r = kmf_writer_set_meta(w, k, val)) < 0)                               \
			return km_errorf(err, r, "checkpoint: metadata '%s' failed: %s", k, \
					 strerror(-r));                                     \
	} while (0)
	META("kiln.format", "%s", KMT_CKPT_FORMAT);
	for (size_t i = 0; i < nf; i++)
		META(f[i].key, "%" PRId64, f[i].val);
	/* %a: the exact float, so a resumed model compares equal. */
	META("kiln.config.norm_eps", "%a", (double) c->norm_eps);
	META("kiln.config.rope_theta", "%a", (double) c->rope_theta);
	if (c->rope_scaled) { /* the divisors, which source.c reads back */
		char div[KM_ROPE_PAIRS_MAX * 24] = "";
		size_t at = 0;
		for (int i = 0; i < c->head_dim / 2; i++)
			at += (size_t) snprintf(div + at, sizeof(div) - at, "%s%a", i ? " " : "",
						(double) c->rope_freq_div[i]);
		if ((r = kmf_writer_set_meta(w, "kiln.config.rope_freq_div", div)) < 0)
			return km_errorf(err, r, "checkpoint: metadata '%s' failed: %s",
					 "kiln.config.rope_freq_div", strerror(-r));
	}
	META("kiln.step", "%" PRId64, kmt_model_step(m));
	META("kiln.data.seed", "%" PRIu64, st->cursor.seed);
	META("kiln.data.epoch", "%" PRId64, st->cursor.epoch);
	META("kiln.data.batch", "%" PRId64, st->cursor.batch);
	META("kiln.rng", "%" PRIu64, st->rng);
#undef META
	kiln_error ke = { 0 };
	if ((r = kmf_writer_commit(w, path, 0644, &ke)) < 0) {
		char line[800];
		return km_errorf(err, r, "checkpoint: %s",
				 kiln_error_format(&ke, line, sizeof(line)));
	}
	return 0;
}

/* A metadata value as a signed or unsigned integer, all of the string. */
static int meta_i64(const kmf_file *f, const char *path, const char *key, int64_t *ret,
		    kiln_error *err)
{
	const char *s = NULL;
	if (kmf_meta_get_str(f, key, &s) < 0)
		return km_errorf(
			err, -EBADMSG,
			"%s: metadata '%s' is missing: not a kmtrain checkpoint, or damaged", path,
			key);
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || *end)
		return km_errorf(err, -EBADMSG, "%s: metadata '%s' = \"%s\" is not an integer",
				 path, key, s);
	*ret = v;
	return 0;
}

static int meta_u64(const kmf_file *f, const char *path, const char *key, uint64_t *ret,
		    kiln_error *err)
{
	const char *s = NULL;
	if (kmf_meta_get_str(f, key, &s) < 0)
		return km_errorf(err, -EBADMSG, "%s: metadata '%s' is missing", path, key);
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-')
		return km_errorf(err, -EBADMSG,
				 "%s: metadata '%s' = \"%s\" is not an unsigned integer", path, key,
				 s);
	*ret = v;
	return 0;
}

static int meta_float(const kmf_file *f, const char *path, const char *key, float want,
		      kiln_error *err)
{
	const char *s = NULL;
	if (kmf_meta_get_str(f, key, &s) < 0)
		return km_errorf(err, -EBADMSG, "%s: metadata '%s' is missing", path, key);
	char *end;
	double v = strtod(s, &end);
	if (end == s || *end)
		return km_errorf(err, -EBADMSG, "%s: metadata '%s' = \"%s\" is not a number", path,
				 key, s);
	if ((float) v != want)
		return km_errorf(err, -EINVAL, "%s: %s is %g, the model has %g", path, key + 12, v,
				 (double) want);
	return 0;
}

/* kiln.config.rope_freq_div: present exactly when c's RoPE is scaled, with
 * c's divisors. */
static int meta_rope_div(const kmf_file *f, const char *path, const km_config *c, kiln_error *err)
{
	const char *s = NULL;
	bool have = kmf_meta_get_str(f, "kiln.config.rope_freq_div", &s) == 0, same = have;
	const char *p = s;
	for (int i = 0; same && i < c->head_dim / 2; i++) {
		char *end;
		double v = strtod(p, &end);
		same = end != p && (float) v == c->rope_freq_div[i];
		p = end;
	}
	if (have == c->rope_scaled && (!have || (same && !p[strspn(p, " ")])))
		return 0;
	return km_errorf(err, -EINVAL,
			 "%s: the checkpoint's RoPE scaling (%s) is not the model's (%s): load it "
			 "into a model of the same config",
			 path, have ? "kiln.config.rope_freq_div" : "none",
			 c->rope_scaled ? "scaled" : "none");
}

int kmt_load(kmt_model *m, const char *path, kmt_ckpt_state *st, kiln_error *err)
{
	if (!m || !path)
		return km_errorf(err, -EINVAL, "kmt_load: missing argument");
	int r;
	kiln_error ke = { 0 };
	_cleanup_(kmf_closep) kmf_file *f = NULL;
	if ((r = kmf_open(path, &f, &ke)) < 0) {
		char line[800];
		/* A file kmf does not recognise at all (a checkpoint cut
		 * short in its first bytes) is as corrupt as one it does. */
		return km_errorf(err, r == -EOPNOTSUPP ? -EBADMSG : r, "%s",
				 kiln_error_format(&ke, line, sizeof(line)));
	}
	const char *fmt = NULL;
	if (kmf_file_format(f) != KMF_FORMAT_SAFETENSORS ||
	    kmf_meta_get_str(f, "kiln.format", &fmt) < 0 || !streq(fmt, KMT_CKPT_FORMAT))
		return km_errorf(err, -EBADMSG,
				 "%s: not a kmtrain checkpoint (no __metadata__ kiln.format = "
				 "\"%s\"); to start from plain weights, build the model from a "
				 "weight source instead",
				 path, KMT_CKPT_FORMAT);
	const km_config *c = kmt_model_config(m);
	cfg_field fields[CFG_FIELDS_MAX];
	size_t nf = cfg_fields(c, fields);
	for (size_t i = 0; i < nf; i++) {
		int64_t v;
		if ((r = meta_i64(f, path, fields[i].key, &v, err)) < 0)
			return r;
		if (v != fields[i].val)
			return km_errorf(
				err, -EINVAL,
				"%s: the checkpoint's %s is %lld, the model's %lld: load it "
				"into a model of the same config",
				path, fields[i].key + 12, (long long) v, (long long) fields[i].val);
	}
	if ((r = meta_float(f, path, "kiln.config.norm_eps", c->norm_eps, err)) < 0 ||
	    (r = meta_float(f, path, "kiln.config.rope_theta", c->rope_theta, err)) < 0 ||
	    (r = meta_rope_div(f, path, c, err)) < 0)
		return r;
	int64_t step, epoch, batch;
	kmt_ckpt_state s = { 0 };
	if ((r = meta_i64(f, path, "kiln.step", &step, err)) < 0 ||
	    (r = meta_i64(f, path, "kiln.data.epoch", &epoch, err)) < 0 ||
	    (r = meta_i64(f, path, "kiln.data.batch", &batch, err)) < 0 ||
	    (r = meta_u64(f, path, "kiln.data.seed", &s.cursor.seed, err)) < 0 ||
	    (r = meta_u64(f, path, "kiln.rng", &s.rng, err)) < 0)
		return r;
	if (step < 0 || epoch < 0 || batch < 0)
		return km_errorf(err, -EBADMSG,
				 "%s: negative step (%lld), epoch (%lld) or batch (%lld)", path,
				 (long long) step, (long long) epoch, (long long) batch);
	s.cursor.epoch = epoch;
	s.cursor.batch = batch;

	const size_t n = kmt_param_count(m), nt = kmt_tensor_count(m);
	const kmt_tensor *t = kmt__tensors(m);
	_cleanup_free_ float *h = malloc(3 * n * sizeof(float));
	if (!h)
		return km_errorf(err, -ENOMEM, "%s: out of memory", path);
	char name[KMT_NAME_MAX + 16];
	for (int p = 0; p < 3; p++)
		for (size_t i = 0; i < nt; i++) {
			snprintf(name, sizeof(name), "%s%s", prefixes[p], t[i].name);
			const kmf_tensor *ft = kmf_tensor_find(f, name);
			if (!ft)
				return km_errorf(err, -EBADMSG, "%s: tensor '%s' is missing", path,
						 name);
			bool shape_ok = ft->ndim == t[i].ndim && ft->shape[0] == t[i].shape[0] &&
					(t[i].ndim == 1 || ft->shape[1] == t[i].shape[1]);
			if (ft->dtype != KMF_F32 || !shape_ok ||
			    ft->nbytes != t[i].n * sizeof(float)) {
				char want[48];
				if (t[i].ndim == 2)
					snprintf(want, sizeof(want), "[%lld, %lld]",
						 (long long) t[i].shape[0],
						 (long long) t[i].shape[1]);
				else
					snprintf(want, sizeof(want), "[%lld]",
						 (long long) t[i].shape[0]);
				return km_errorf(err, -EBADMSG,
						 "%s: tensor '%s' is %s with %d dims, the model "
						 "wants F32 %s",
						 path, name, kmf_dtype_name(ft->dtype), ft->ndim,
						 want);
			}
			float *dst = h + p * n + t[i].off;
			memcpy(dst, ft->data, ft->nbytes);
			for (size_t j = 0; j < t[i].n; j++)
				if (!isfinite(dst[j]) || (p == 2 && dst[j] < 0))
					return km_errorf(err, -EBADMSG,
							 "%s: tensor '%s' element %zu is %g: "
							 "the checkpoint is damaged",
							 path, name, j, (double) dst[j]);
		}
	const kmt_which w[3] = { KMT_PARAM, KMT_ADAM_M, KMT_ADAM_V };
	for (int p = 0; p < 3; p++) {
		r = kk_buffer_upload(kmt__backend(m), NULL, kmt__flat(m, w[p]), 0, h + p * n,
				     n * sizeof(float));
		if (r < 0)
			return km_errorf(err, r, "%s: uploading the checkpoint failed: %s", path,
					 strerror(-r));
	}
	kmt__set_step(m, step);
	if (st)
		*st = s;
	return 0;
}
