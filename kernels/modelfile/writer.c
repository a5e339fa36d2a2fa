/* writer.c — crash-safe safetensors writer for checkpoints.
 *
 * A checkpoint must never be half there: kiln-train may be killed (node
 * loss, preemption, OOM) at any instant while writing one.  The file is
 * built in an unnamed O_TMPFILE in the target's directory (so a crash
 * leaves nothing behind), fsynced, given a temporary name, renamed over the
 * target and the directory is fsynced: at every instant the target name
 * points at either the old complete file or the new complete file.  Where
 * O_TMPFILE is not supported a named ".NAME.kmf-XXXXXX" temp file is used
 * instead (a crash before the rename can then leave it behind).
 *
 * The header is padded with spaces (the format allows trailing whitespace
 * in the JSON) so that the data section starts at a multiple of
 * KMF_WRITE_ALIGN; tensors whose byte size is a multiple of it go first. */
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "kiln/strbuf.h"
#include "kmf_internal.h"

struct wtensor {
	char *name;
	kmf_dtype dtype;
	int ndim;
	int64_t shape[KMF_MAX_DIMS];
	const void *data;
	uint64_t nbytes, offset;
};

struct kmf_writer {
	struct wtensor *t;
	size_t n, cap;
	json_t *meta; /* object of strings */
};

kmf_writer *kmf_writer_free(kmf_writer *w)
{
	if (!w)
		return NULL;
	for (size_t i = 0; i < w->n; i++)
		free(w->t[i].name);
	json_decref(w->meta);
	FREE_ALL(w->t, w);
	return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(kmf_writer *, kmf_writer_free);

int kmf_writer_new(kmf_writer **ret)
{
	assert_return(ret, -EINVAL);
	_cleanup_(kmf_writer_freep) kmf_writer *w = calloc(1, sizeof(*w));
	if (!w || !(w->meta = json_object()))
		return -ENOMEM;
	*ret = TAKE_PTR(w);
	return 0;
}

int kmf_writer_add(kmf_writer *w, const char *name, kmf_dtype dtype, int ndim, const int64_t *shape,
		   const void *data, uint64_t nbytes)
{
	kmf_tensor t = { .name = name, .dtype = dtype, .ndim = ndim };
	size_t nl;
	struct wtensor *wt;
	assert_return(w && name, -EINVAL);
	nl = strlen(name);
	assert_return(nl > 0 && nl <= KMF_MAX_NAME && kmf__utf8_valid(name, nl), -EINVAL);
	assert_return(!startswith(name, "__"), -EINVAL);
	assert_return((unsigned) dtype < KMF_DTYPE_MAX && kmf_dtype_block_elems(dtype) == 1,
		      -EINVAL);
	assert_return(ndim >= 0 && ndim <= KMF_MAX_DIMS && (ndim == 0 || shape), -EINVAL);
	assert_return(data || nbytes == 0, -EINVAL);
	for (int d = 0; d < ndim; d++)
		t.shape[d] = shape[d];
	if (kmf__tensor_size(&t, -1, true, NULL) < 0 || t.nbytes != nbytes)
		return -EINVAL;
	for (size_t i = 0; i < w->n; i++)
		if (streq(w->t[i].name, name))
			return -EEXIST;
	if (w->n >= KMF_MAX_TENSORS)
		return -E2BIG;
	if (GROW(w->t, w->cap, w->n) < 0)
		return -ENOMEM;
	wt = &w->t[w->n];
	*wt = (struct wtensor){ .dtype = dtype, .ndim = ndim, .data = data, .nbytes = nbytes };
	memcpy(wt->shape, t.shape, sizeof(wt->shape));
	wt->name = strdup(name);
	if (!wt->name)
		return -ENOMEM;
	w->n++;
	return 0;
}

int kmf_writer_set_meta(kmf_writer *w, const char *key, const char *value)
{
	assert_return(w && key && value, -EINVAL);
	assert_return(*key && strlen(key) <= KMF_MAX_NAME && strlen(value) <= KMF_MAX_STRING,
		      -EINVAL);
	assert_return(kmf__utf8_valid(key, strlen(key)) && kmf__utf8_valid(value, strlen(value)),
		      -EINVAL);
	if (!json_object_get(w->meta, key) && json_object_size(w->meta) >= KMF_MAX_META)
		return -E2BIG;
	return json_object_set_new(w->meta, key, json_string(value)) < 0 ? -ENOMEM : 0;
}

static void json_freep(json_t **j)
{
	json_decref(*j);
}

/* The padded header (length prefix included) in *ret, its size in *len. */
static int build_header(kmf_writer *w, size_t *order, char **ret, size_t *len)
{
	_cleanup_(json_freep) json_t *root = json_object();
	_cleanup_free_ char *js = NULL;
	char *buf;
	uint64_t off = 0;
	size_t jl, total;
	if (!root)
		return -ENOMEM;
	if (json_object_size(w->meta) > 0 && json_object_set(root, "__metadata__", w->meta) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < w->n; i++) {
		struct wtensor *t = &w->t[order[i]];
		json_t *shape = json_array(), *e;
		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->shape[d]));
		t->offset = off;
		e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", kmf_dtype_name(t->dtype), "shape",
			      shape, "data_offsets", (json_int_t) off,
			      (json_int_t) (off + t->nbytes));
		if (!e || json_object_set_new(root, t->name, e) < 0)
			return -ENOMEM;
		off += t->nbytes;
	}
	js = json_dumps(root, JSON_COMPACT);
	if (!js)
		return -ENOMEM;
	jl = strlen(js);
	total = (8 + jl + KMF_WRITE_ALIGN - 1) / KMF_WRITE_ALIGN * KMF_WRITE_ALIGN;
	if (total - 8 > KMF_MAX_HEADER_BYTES)
		return -E2BIG;
	buf = malloc(total);
	if (!buf)
		return -ENOMEM;
	for (int i = 0; i < 8; i++)
		buf[i] = (char) (((uint64_t) (total - 8) >> (8 * i)) & 0xff);
	memcpy(buf + 8, js, jl);
	memset(buf + 8 + jl, ' ', total - 8 - jl);
	*ret = buf;
	*len = total;
	return 0;
}

/* A temporary name next to the target: ".NAME.kmf-PID-N". */
static void temp_name(char *buf, size_t len, const char *dir, const char *base, unsigned n)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(buf, len, "%s/.%s.kmf-%d-%lx-%u", dir, base, (int) getpid(),
		 (unsigned long) ts.tv_nsec, n);
}

int kmf_writer_commit(kmf_writer *w, const char *path, unsigned mode, kiln_error *err)
{
	_cleanup_free_ char *hdr = NULL, *dcopy = NULL, *bcopy = NULL, *tmp = NULL;
	_cleanup_free_ size_t *order = NULL;
	_cleanup_close_ int fd = -1, dfd = -1;
	const char *dir, *base;
	size_t hlen, k = 0, tmplen;
	bool named = false;
	int r;

	kmf__error_reset(err, path);
	if (!w || !path || !*path)
		return kmf__fail(err, -EINVAL, -1, NULL, "invalid argument");
	order = malloc((w->n ? w->n : 1) * sizeof(*order));
	dcopy = strdup(path);
	bcopy = strdup(path);
	if (!order || !dcopy || !bcopy)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	/* Aligned sizes first, each group in the order added. */
	for (size_t i = 0; i < w->n; i++)
		if (w->t[i].nbytes % KMF_WRITE_ALIGN == 0)
			order[k++] = i;
	for (size_t i = 0; i < w->n; i++)
		if (w->t[i].nbytes % KMF_WRITE_ALIGN != 0)
			order[k++] = i;
	r = build_header(w, order, &hdr, &hlen);
	if (r < 0)
		return kmf__fail(err, r, -1, NULL, "cannot build the header: %s", strerror(-r));

	dir = dirname(dcopy);
	base = basename(bcopy);
	tmplen = strlen(dir) + strlen(base) + 64;
	tmp = malloc(tmplen);
	if (!tmp)
		return kmf__fail(err, -ENOMEM, -1, NULL, "out of memory");
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return kmf__fail(err, -errno, -1, NULL,
				 "cannot open the directory '%s': %s; check that it exists and is "
				 "writable",
				 dir, strerror(errno));
	fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0) {
		if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
			return kmf__fail(err, -errno, -1, NULL,
					 "cannot create a temporary file in '%s': %s", dir,
					 strerror(errno));
		for (unsigned n = 0; fd < 0 && n < 16; n++) {
			temp_name(tmp, tmplen, dir, base, n);
			fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
			if (fd < 0 && errno != EEXIST)
				break;
		}
		if (fd < 0)
			return kmf__fail(err, -errno, -1, NULL,
					 "cannot create a temporary file in '%s': %s", dir,
					 strerror(errno));
		named = true;
	}
	if (fchmod(fd, mode & 07777) < 0) {
		r = -errno;
		goto fail;
	}
	r = kiln_write_all(fd, hdr, hlen);
	for (size_t i = 0; r >= 0 && i < w->n; i++)
		r = kiln_write_all(fd, w->t[order[i]].data, w->t[order[i]].nbytes);
	if (r >= 0 && fsync(fd) < 0)
		r = -errno;
	if (r < 0)
		goto fail;
	if (!named) {
		char proc[64];
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		for (unsigned n = 0; n < 16; n++) {
			temp_name(tmp, tmplen, dir, base, n);
			r = linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) < 0 ? -errno
											 : 0;
			if (r != -EEXIST)
				break;
		}
		if (r < 0)
			return kmf__fail(err, r, -1, NULL,
					 "cannot link the temporary file into '%s': %s (is /proc "
					 "mounted?)",
					 dir, strerror(-r));
		named = true;
	}
	if (rename(tmp, path) < 0) {
		r = -errno;
		goto fail;
	}
	named = false;
	if (fsync(dfd) < 0)
		return kmf__fail(err, -errno, -1, NULL,
				 "wrote the file but cannot fsync its directory '%s': %s; it may "
				 "not survive a power loss",
				 dir, strerror(errno));
	return 0;
fail:
	if (named)
		unlink(tmp);
	return kmf__fail(err, r, -1, NULL,
			 "cannot write the checkpoint: %s; the previous file (if any) is "
			 "unchanged; check free space and permissions",
			 strerror(-r));
}
