/* config.c — km_config validation and the llama2.c checkpoint reader.
 *
 * A llama2.c "legacy" checkpoint is 7 little-endian int32 (dim, hidden_dim,
 * n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size
 * means an unshared classifier stored at the end), then f32 arrays in a
 * fixed order.  The reader checks the header and that the file size is
 * exactly what the header implies, then serves tensors by canonical name
 * (km_weight_source) with pread, so nothing is held in memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kmodel.h"

#include "model-internal.h"

int km_errorf(kiln_error *err, int r, const char *fmt, ...)
{
	if (err) {
		kiln_error_reset(err, NULL);
		err->code = r;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, KM_ERROR_MAX, fmt, ap);
		va_end(ap);
	}
	return r;
}

#define BAD(field, val, rule) \
	km_errorf(err, -EINVAL, "model config: %s = %d, " rule, field, (int) (val))

int km_config_validate(const km_config *c, kiln_error *err)
{
	if (!c)
		return km_errorf(err, -EINVAL, "model config: missing");
	if (c->dim < 1 || c->dim > KM_DIM_MAX)
		return BAD("dim", c->dim, "must be 1..65536");
	if (c->hidden_dim < 1 || c->hidden_dim > KM_HIDDEN_MAX)
		return BAD("hidden_dim", c->hidden_dim, "must be 1..262144");
	if (c->n_layers < 1 || c->n_layers > KM_LAYERS_MAX)
		return BAD("n_layers", c->n_layers, "must be 1..1024");
	if (c->n_heads < 1 || c->n_heads > KM_HEADS_MAX)
		return BAD("n_heads", c->n_heads, "must be 1..1024");
	if (c->dim % c->n_heads)
		return km_errorf(err, -EINVAL,
				 "model config: n_heads = %d does not divide dim = %d", c->n_heads,
				 c->dim);
	if (c->n_kv_heads < 1 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
		return km_errorf(err, -EINVAL,
				 "model config: n_kv_heads = %d must divide n_heads = %d",
				 c->n_kv_heads, c->n_heads);
	if (c->head_dim != c->dim / c->n_heads)
		return km_errorf(err, -EINVAL,
				 "model config: head_dim = %d, must be dim / n_heads = %d",
				 c->head_dim, c->dim / c->n_heads);
	if (c->head_dim % 2 || c->head_dim > KK_ATTN_HEAD_DIM_MAX)
		return BAD("head_dim", c->head_dim, "must be even and at most 256 (RoPE, kk)");
	if (c->vocab_size < 1 || c->vocab_size > KM_VOCAB_MAX)
		return BAD("vocab_size", c->vocab_size, "must be 1..2097152");
	if (c->max_seq_len < 1 || c->max_seq_len > KM_SEQ_LEN_MAX)
		return BAD("max_seq_len", c->max_seq_len, "must be 1..1048576");
	if (!(c->norm_eps > 0 && c->norm_eps < 1))
		return km_errorf(err, -EINVAL, "model config: norm_eps = %g, must be in (0, 1)",
				 (double) c->norm_eps);
	if (!(c->rope_theta > 1 && c->rope_theta < 1e12f))
		return km_errorf(err, -EINVAL,
				 "model config: rope_theta = %g, must be in (1, 1e12)",
				 (double) c->rope_theta);
	if (c->rope_mode != KK_ROPE_INTERLEAVED && c->rope_mode != KK_ROPE_HALF)
		return BAD("rope_mode", c->rope_mode, "must be interleaved (0) or half (1)");
	if (km_param_count(c) > KM_PARAMS_MAX)
		return km_errorf(err, -EINVAL,
				 "model config: %lld parameters, more than the %lld accepted",
				 (long long) km_param_count(c), (long long) KM_PARAMS_MAX);
	return 0;
}

int64_t km_param_count(const km_config *c)
{
	int64_t d = c->dim, h = c->hidden_dim, kv = (int64_t) c->n_kv_heads * c->head_dim;
	int64_t layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * h * d;
	int64_t emb = (int64_t) c->vocab_size * d * (c->shared_classifier ? 1 : 2);
	return emb + c->n_layers * layer + d;
}

/* ---- llama2.c checkpoints ---------------------------------------------- */

#define L2C_HEADER_INTS 7

struct km_l2c {
	int fd;
	char *path;
	km_config cfg;
	int64_t size;
};

km_l2c *km_l2c_free(km_l2c *f)
{
	if (!f)
		return NULL;
	if (f->fd >= 0)
		close(f->fd);
	free(f->path);
	free(f);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(km_l2c *, km_l2c_free);

const km_config *km_l2c_config(const km_l2c *f)
{
	return f ? &f->cfg : NULL;
}

/* Element offset (in floats after the header) and count of a tensor. */
static int l2c_locate(const km_config *c, const char *name, int64_t *off, int64_t *count)
{
	int64_t d = c->dim, h = c->hidden_dim, L = c->n_layers, v = c->vocab_size;
	int64_t kv = (int64_t) c->n_kv_heads * c->head_dim;
	/* The arrays in file order, each [L][per-layer] or whole. */
	const struct {
		const char *name; /* suffix after "layers.N." or a whole name */
		bool layered;
		int64_t n;
	} t[] = {
		{ "tok_embeddings.weight", false, v * d },
		{ "attention_norm.weight", true, d },
		{ "attention.wq.weight", true, d * d },
		{ "attention.wk.weight", true, kv * d },
		{ "attention.wv.weight", true, kv * d },
		{ "attention.wo.weight", true, d * d },
		{ "ffn_norm.weight", true, d },
		{ "feed_forward.w1.weight", true, h * d },
		{ "feed_forward.w2.weight", true, d * h },
		{ "feed_forward.w3.weight", true, h * d },
		{ "norm.weight", false, d },
		{ "(rope tables)", false, (int64_t) c->max_seq_len * c->head_dim },
		{ "output.weight", false, v * d },
	};
	int layer = -1;
	const char *suffix = name;
	if (strncmp(name, "layers.", 7) == 0) {
		char *end;
		long l = strtol(name + 7, &end, 10);
		if (end == name + 7 || *end != '.' || l < 0 || l >= L)
			return -ENOENT;
		layer = (int) l;
		suffix = end + 1;
	}
	int64_t pos = 0;
	for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
		if (streq(t[i].name, suffix) && t[i].layered == (layer >= 0) &&
		    !(streq(suffix, "output.weight") && c->shared_classifier) &&
		    !streq(suffix, "(rope tables)")) {
			*off = pos + (t[i].layered ? layer * t[i].n : 0);
			*count = t[i].n;
			return 0;
		}
		pos += t[i].layered ? L * t[i].n : t[i].n;
	}
	return -ENOENT;
}

static int64_t l2c_expected_size(const km_config *c)
{
	int64_t off, n;
	/* The end of the last array: the classifier, or the rope tables. */
	km_config shared = *c;
	shared.shared_classifier = false;
	l2c_locate(&shared, "output.weight", &off, &n);
	if (c->shared_classifier)
		n = 0;
	return (int64_t) sizeof(int32_t) * L2C_HEADER_INTS + (off + n) * (int64_t) sizeof(float);
}

static int l2c_read(void *userdata, const char *name, float *dst, size_t count, kiln_error *err)
{
	km_l2c *f = userdata;
	int64_t off, n;
	if (l2c_locate(&f->cfg, name, &off, &n) < 0)
		return km_errorf(err, -ENOENT, "%s: no tensor '%s' in a llama2.c checkpoint",
				 f->path, name);
	if ((size_t) n != count)
		return km_errorf(err, -EINVAL, "%s: tensor '%s' has %lld elements, %zu asked for",
				 f->path, name, (long long) n, count);
	size_t bytes = count * sizeof(float), done = 0;
	off_t at = (off_t) (sizeof(int32_t) * L2C_HEADER_INTS + (size_t) off * sizeof(float));
	while (done < bytes) {
		ssize_t k = pread(f->fd, (char *) dst + done, bytes - done, at + (off_t) done);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return km_errorf(err, k < 0 ? -errno : -EIO,
					 "%s: reading tensor '%s' failed: %s", f->path, name,
					 k < 0 ? strerror(errno) : "unexpected end of file");
		done += (size_t) k;
	}
	return 0;
}

km_weight_source km_l2c_source(km_l2c *f)
{
	return (km_weight_source){ .userdata = f, .read = l2c_read };
}

int km_l2c_open(const char *path, km_l2c **ret, kiln_error *err)
{
	assert_return(path && ret, km_errorf(err, -EINVAL, "km_l2c_open: no path"));
	_cleanup_(km_l2c_freep) km_l2c *f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path)))
		return km_errorf(err, -ENOMEM, "%s: out of memory", path);
	f->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0)
		return km_errorf(err, -errno, "%s: cannot open the checkpoint: %s", path,
				 strerror(errno));
	struct stat st;
	if (fstat(f->fd, &st) < 0)
		return km_errorf(err, -errno, "%s: %s", path, strerror(errno));
	f->size = st.st_size;

	int32_t h[L2C_HEADER_INTS];
	ssize_t k = pread(f->fd, h, sizeof(h), 0);
	if (k != (ssize_t) sizeof(h))
		return km_errorf(err, -EINVAL,
				 "%s: truncated: %lld bytes, a llama2.c header alone is %zu", path,
				 (long long) f->size, sizeof(h));
	f->cfg = (km_config){
		.dim = h[0],
		.hidden_dim = h[1],
		.n_layers = h[2],
		.n_heads = h[3],
		.n_kv_heads = h[4],
		.vocab_size = h[5] < 0 && h[5] != INT32_MIN ? -h[5] : h[5],
		.max_seq_len = h[6],
		.norm_eps = 1e-5f,
		.rope_theta = 10000.0f,
		.rope_mode = KK_ROPE_INTERLEAVED,
		.shared_classifier = h[5] > 0,
	};
	f->cfg.head_dim = f->cfg.n_heads > 0 ? f->cfg.dim / f->cfg.n_heads : 0;
	kiln_error cerr;
	int r = km_config_validate(&f->cfg, &cerr);
	if (r < 0)
		return km_errorf(err, r, "%s: bad llama2.c header: %s", path,
				 cerr.msg + strlen("model config: "));
	int64_t want = l2c_expected_size(&f->cfg);
	if (want > KM_L2C_MAX_BYTES)
		return km_errorf(err, -EINVAL, "%s: the header implies %lld bytes, more than %lld",
				 path, (long long) want, (long long) KM_L2C_MAX_BYTES);
	if (f->size != want)
		return km_errorf(err, -EINVAL,
				 "%s: %s: the file is %lld bytes, its header (dim %d, hidden %d, "
				 "%d layers, %d/%d heads, vocab %d, seq_len %d) implies %lld",
				 path, f->size < want ? "truncated" : "size does not match header",
				 (long long) f->size, f->cfg.dim, f->cfg.hidden_dim,
				 f->cfg.n_layers, f->cfg.n_heads, f->cfg.n_kv_heads,
				 f->cfg.vocab_size, f->cfg.max_seq_len, (long long) want);
	*ret = TAKE_PTR(f);
	return 0;
}
