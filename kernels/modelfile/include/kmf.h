/* kmf.h — model and checkpoint files: safetensors, GGUF and llama2.c behind one API.
 *
 * kiln-train writes its checkpoints with it and kiln-inferd loads weights
 * with it.  A file is opened read-only with mmap (zero copy); its format is
 * recognised by content, never by name: safetensors by its 8-byte header
 * length followed by '{', GGUF by its "GGUF" magic, and llama2.c legacy
 * checkpoints (which have no magic) by the exact file size their 7-int
 * header implies.  Every format yields the same thing: a list of named
 * tensors {dtype, row-major shape, bytes, data pointer} plus typed metadata.
 *
 * Untrusted input: every length, count and offset read from a file is
 * checked against the file size and the named limits below before use; a
 * file that breaks a rule is refused with a kiln_error saying which file,
 * which byte offset, which tensor and what is wrong.  The library never
 * prints and never exits.
 *
 * Conversions (kmf_tensor_to_float, kmf_tensor_to_i8, kmf_tensor_to_q4)
 * produce host arrays in the kk layouts of kk.h (kk_convert_host rounding,
 * kk_qmatrix int8 per-channel and int4 grouped), ready for kk_buffer_upload.
 *
 * kmf_writer writes safetensors checkpoints crash-safely: temp file in the
 * target directory, fsync, rename over the target, fsync the directory.
 *
 * Errors are negative errno values:
 *   -EINVAL      a bad argument (NULL, wrong dtype for the call ...);
 *   -EBADMSG     the file breaks its format (truncated, offsets out of range,
 *                overlapping tensors, bad JSON, bad UTF-8 ...);
 *   -E2BIG       a count or length is above one of the KMF_MAX_* limits;
 *   -EOPNOTSUPP  a valid file using something kmf does not handle (an
 *                unknown dtype, big-endian GGUF, nested GGUF arrays) or a
 *                file that is none of the three formats;
 *   -ENOENT      a name that is not in the file (lookups);
 *   -ENOMEM, and the errno of open/fstat/mmap/write/fsync/rename. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/error.h"
#include "kk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Limits on untrusted input                                                 */

/* Largest safetensors JSON header: the reference implementation refuses
 * headers above 100 MB; a model with 100k tensors needs ~10 MB. */
#define KMF_MAX_HEADER_BYTES (UINT64_C(100) * 1000 * 1000)
/* Most tensors in one file (the largest public checkpoints hold < 10^5). */
#define KMF_MAX_TENSORS 1000000
/* Most metadata entries (GGUF key-values, safetensors __metadata__ keys). */
#define KMF_MAX_META 65536
/* Longest tensor name or metadata key, in bytes (GGUF's own rule is 64 for
 * names; Hugging Face names stay far below 1 KiB). */
#define KMF_MAX_NAME 1024
/* Longest metadata string value (chat templates run to ~10 KiB; 16 MiB
 * leaves room for embedded tokenizer JSON while stopping 2^63 lengths). */
#define KMF_MAX_STRING (UINT64_C(16) << 20)
/* Most elements in one GGUF metadata array (vocabularies reach ~256k). */
#define KMF_MAX_ARRAY (UINT64_C(16) << 20)
/* Most dimensions of a tensor (GGUF's GGML_MAX_DIMS is 4; 8 leaves room). */
#define KMF_MAX_DIMS 8
/* Most bytes and elements of one tensor: larger than any single weight of
 * today's models, small enough that sizes never overflow int64. */
#define KMF_MAX_TENSOR_BYTES (UINT64_C(1) << 40)
/* Tensor data alignment kmf_writer uses (cache line and AVX-512 width). */
#define KMF_WRITE_ALIGN 64

/* ------------------------------------------------------------------------ */
/* Formats, dtypes, errors                                                   */

typedef enum kmf_format {
	KMF_FORMAT_SAFETENSORS = 0,
	KMF_FORMAT_GGUF = 1,
	KMF_FORMAT_LLAMA2C = 2,
	KMF_FORMAT_MAX
} kmf_format;

/* Storage dtypes of every format; the quantized ones are GGUF block types. */
typedef enum kmf_dtype {
	KMF_F32 = 0,
	KMF_F16,
	KMF_BF16,
	KMF_F64,
	KMF_F8_E4M3,
	KMF_F8_E5M2,
	KMF_BOOL,
	KMF_U8,
	KMF_I8,
	KMF_U16,
	KMF_I16,
	KMF_U32,
	KMF_I32,
	KMF_U64,
	KMF_I64,
	KMF_Q8_0, /* blocks of 32: f16 scale d, 32 x int8; w = d * q */
	KMF_Q4_0, /* blocks of 32: f16 d, 16 bytes of nibbles; w = d * (q - 8) */
	KMF_Q4_1, /* blocks of 32: f16 d, f16 m, 16 bytes of nibbles; w = d * q + m */
	KMF_Q4_K, /* super-blocks of 256: f16 d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes */
	KMF_Q6_K, /* super-blocks of 256: 128 bytes low nibbles, 64 high bits, 16 scales, f16 d */
	KMF_DTYPE_MAX
} kmf_dtype;

/* "F32", "BF16", "Q4_K" ... (safetensors spelling, GGML names for blocks); NULL if invalid. */
const char *kmf_dtype_name(kmf_dtype dt);
/* Elements per block (1 for plain dtypes, 32 or 256 for GGUF blocks) and
 * bytes per block; 0 for an invalid dtype. */
unsigned kmf_dtype_block_elems(kmf_dtype dt);
unsigned kmf_dtype_block_bytes(kmf_dtype dt);
/* Whether kmf_tensor_to_float accepts the dtype (floats and GGUF blocks). */
bool kmf_dtype_is_float(kmf_dtype dt);
const char *kmf_format_name(kmf_format f); /* "safetensors", "gguf", "llama2.c" */

/* What the opener (or the writer) says about a refused file, a kiln_error
 * (kiln/error.h): file the path or name given ("(memory)" when none),
 * offset the byte offset in the file where the fault was found (-1 if
 * none), where the tensor involved ("" if none), msg what is wrong and what
 * to do, starting "tensor 'T': " when there is a tensor.
 * kiln_error_format() gives the line for a user,
 * "FILE: byte N: tensor 'T': MSG". */

/* ------------------------------------------------------------------------ */
/* Opening and listing                                                       */

typedef struct kmf_file kmf_file;

/* Block quantization of a GGUF tensor (block_elems 1 for plain dtypes). */
typedef struct kmf_tensor {
	const char *name;
	kmf_dtype dtype;
	int ndim;		     /* 0 (a scalar) .. KMF_MAX_DIMS */
	int64_t shape[KMF_MAX_DIMS]; /* row-major: shape[ndim-1] varies fastest */
	int64_t nelem;		     /* product of shape (1 for a scalar) */
	uint64_t offset;	     /* byte offset of the data in the file */
	uint64_t nbytes;	     /* bytes of data */
	const void *data;	     /* into the mapping; may be unaligned in
				      * files not written by kmf_writer */
	unsigned block_elems;	     /* 1, or 32/256 for GGUF blocks */
	unsigned block_bytes;	     /* bytes per block (per element if 1) */
} kmf_tensor;

/* Opens and validates path.  On failure *err (if not NULL) says why and
 * *ret is untouched.  Errors: see the top of this file. */
int kmf_open(const char *path, kmf_file **ret, kiln_error *err);
/* The same over a caller's buffer (not copied; it must outlive the file).
 * `name` is only used in errors. */
int kmf_open_mem(const void *buf, size_t len, const char *name, kmf_file **ret, kiln_error *err);
/* Unmaps and frees; accepts NULL; returns NULL. */
kmf_file *kmf_close(kmf_file *f);

kmf_format kmf_file_format(const kmf_file *f);
/* GGUF: 2 or 3; safetensors and llama2.c: 0. */
int kmf_file_version(const kmf_file *f);
size_t kmf_tensor_count(const kmf_file *f);
/* The i-th tensor in file order, or NULL if i is out of range. */
const kmf_tensor *kmf_tensor_at(const kmf_file *f, size_t i);
/* The tensor called name, or NULL. */
const kmf_tensor *kmf_tensor_find(const kmf_file *f, const char *name);

/* ------------------------------------------------------------------------ */
/* Metadata                                                                  */

typedef enum kmf_vtype {
	KMF_V_U8 = 0,
	KMF_V_I8 = 1,
	KMF_V_U16 = 2,
	KMF_V_I16 = 3,
	KMF_V_U32 = 4,
	KMF_V_I32 = 5,
	KMF_V_F32 = 6,
	KMF_V_BOOL = 7,
	KMF_V_STRING = 8,
	KMF_V_ARRAY = 9,
	KMF_V_U64 = 10,
	KMF_V_I64 = 11,
	KMF_V_F64 = 12, /* the values are GGUF's type codes */
	KMF_V_MAX
} kmf_vtype;

typedef struct kmf_str {
	const char *s; /* NUL-terminated copy */
	size_t len;    /* bytes, without the NUL (strings may hold NULs) */
} kmf_str;

/* A metadata value.  Scalars: integers widened into i (signed) or u
 * (unsigned), floats into f, bools into b.  Arrays: `items` holds n values
 * of etype as their C type (uint8_t ... double, bool as uint8_t, strings as
 * kmf_str).  safetensors __metadata__ values are all strings; llama2.c
 * values are I32 (and a BOOL). */
typedef struct kmf_meta {
	const char *key;
	kmf_vtype type;
	union {
		int64_t i;
		uint64_t u;
		double f;
		bool b;
		kmf_str str;
		struct {
			kmf_vtype etype;
			uint64_t n;
			const void *items;
		} arr;
	};
} kmf_meta;

size_t kmf_meta_count(const kmf_file *f);
const kmf_meta *kmf_meta_at(const kmf_file *f, size_t i);
const kmf_meta *kmf_meta_find(const kmf_file *f, const char *key);
/* Typed getters: -ENOENT missing, -EINVAL wrong type (ints of any width
 * convert when the value fits, else -ERANGE). */
int kmf_meta_get_int(const kmf_file *f, const char *key, int64_t *ret);
int kmf_meta_get_str(const kmf_file *f, const char *key, const char **ret);
const char *kmf_vtype_name(kmf_vtype t);

/* ------------------------------------------------------------------------ */
/* Conversion to kk layouts (host memory)                                    */

/* Converts all of t to dst_dt in {KK_F32, KK_BF16, KK_F16} into out, which
 * holds `count` elements (must equal t->nelem).  Accepts every dtype for
 * which kmf_dtype_is_float() is true; GGUF blocks are dequantized to f32
 * first, then rounded to nearest even as kk_convert_host does.
 * Errors: -EINVAL (dtype, count), -EOPNOTSUPP (an integer dtype). */
int kmf_tensor_to_float(const kmf_tensor *t, kk_dtype dst_dt, void *out, size_t count);

/* Converts a 2-D weight t [n, k] (nn.Linear layout) to kk's int8
 * per-channel form: q[n*k] in -127..127 and scales[n] as scale_dt (KK_F32
 * or KK_F16), w ~= q * scale[row], scale = max|row| / 127, quantized
 * against the scale as stored, exactly as kk_quantize does.  Float inputs
 * and Q8_0 are accepted; Q8_0 (one scale per 32 values) is dequantized and
 * requantized per row: the added error is at most scale[row] / 2 per
 * element.  Errors: -EINVAL (not 2-D, dtype). */
int kmf_tensor_to_i8(const kmf_tensor *t, kk_dtype scale_dt, int8_t *q, void *scales);

/* Converts a 2-D weight t [n, k] (k a multiple of 32) to kk's int8 form
 * with one scale per 32 values (KK_I8 group 32): q[n*k] and scales[n, k/32]
 * as scale_dt.  Q8_0 maps WITHOUT requantization (its codes and f16 block
 * scales as they are; a code may be -128): *exact is set to true.
 * Everything else is dequantized to f32 and quantized per 32 values with
 * scale = max|block| / 127 as kk_quantize does (*exact false).  exact may
 * be NULL.  Errors: -EINVAL (not 2-D, k % 32, dtype). */
int kmf_tensor_to_i8_g32(const kmf_tensor *t, kk_dtype scale_dt, int8_t *q, void *scales,
			 bool *exact);

/* Converts a 2-D weight t [n, k] to kk's int4 grouped form: q[n*k/2]
 * bytes (element j of a row in byte j/2, even j in the low nibble, stored
 * as value + 8) and scales[n * k/group] as scale_dt (KK_F32 or KK_F16).
 * Q4_0 with group 32 maps WITHOUT requantization (same symmetric -8..7
 * codes, one f16 scale per 32 values): *exact is set to true and the
 * result dequantizes to the same values bit for bit.  Everything else
 * (floats, Q4_0 with group 64/128, Q4_1, Q4_K, Q6_K, Q8_0) is dequantized
 * to f32 and quantized with scale = max|group| / 7 as kk_quantize does:
 * *exact is false and the added error is at most scale / 2 per element
 * (values at -max can also clamp to -7 * scale).  exact may be NULL.
 * Errors: -EINVAL (not 2-D, group not 32/64/128 or not dividing k, odd k). */
int kmf_tensor_to_q4(const kmf_tensor *t, int group, kk_dtype scale_dt, uint8_t *q, void *scales,
		     bool *exact);

/* Dequantizes `nblocks` blocks of a GGUF block dtype from src into f32 dst
 * (nblocks * kmf_dtype_block_elems(dt) values).  Errors: -EINVAL. */
int kmf_dequantize(kmf_dtype dt, const void *src, size_t nblocks, float *dst);

/* ------------------------------------------------------------------------ */
/* Writing safetensors checkpoints                                           */

typedef struct kmf_writer kmf_writer;

/* Errors: -ENOMEM. */
int kmf_writer_new(kmf_writer **ret);
kmf_writer *kmf_writer_free(kmf_writer *w);
/* Adds a tensor.  data (nbytes = element size * product of shape) is
 * borrowed: it must stay valid until kmf_writer_commit returns.  dtype: a
 * plain (non-block) dtype.  Errors: -EINVAL (name empty, too long, starting
 * with "__", dims, nbytes mismatch, block dtype), -EEXIST duplicate name,
 * -E2BIG over KMF_MAX_TENSORS, -ENOMEM. */
int kmf_writer_add(kmf_writer *w, const char *name, kmf_dtype dtype, int ndim, const int64_t *shape,
		   const void *data, uint64_t nbytes);
/* Sets a __metadata__ string (replacing an earlier value of the key).
 * Errors: -EINVAL (not UTF-8, too long), -E2BIG, -ENOMEM. */
int kmf_writer_set_meta(kmf_writer *w, const char *key, const char *value);
/* Writes the file: header (padded with spaces so that the data starts at a
 * multiple of KMF_WRITE_ALIGN), then the data, tensors whose size is a
 * multiple of KMF_WRITE_ALIGN first (so each of them stays aligned: the
 * format forbids holes between tensors), each group in the order added.
 * The data goes to an unnamed temp file in path's directory (O_TMPFILE, or
 * a ".NAME.XXXXXX" file where unsupported), is fsynced, linked and renamed
 * over path, then the directory is fsynced: after a crash at any point path
 * holds either its old or its new complete contents.  mode as for open(2).
 * Errors: the errno of open/write/fsync/rename, with err filled. */
int kmf_writer_commit(kmf_writer *w, const char *path, unsigned mode, kiln_error *err);

#ifdef __cplusplus
}
#endif
