/* tok-tool.c — the C side of the live comparison and of the benchmark.
 *
 *   tok-tool encode FILE [hf|sp]    stdin: one JSON string per line;
 *                                   stdout: one JSON object per line,
 *                                   {"ids": [...], "ids_special": [...], "decoded": "..."}
 *                                   (hf: special tokens parsed, as HF does)
 *   tok-tool bench FILE TEXT [naive] encode and decode TEXT in 64 KiB chunks
 *                                   (cut at newlines); prints MB/s; with
 *                                   "naive", the O(n^2) reference BPE below
 *
 * The naive encoder is the textbook loop (scan every adjacent pair for the
 * best merge, merge it, repeat) over ktok's own vocabulary and merges:
 * the baseline the benchmark names when HF tokenizers is not installed. */
#include <jansson.h>
#include <stdio.h>
#include <time.h>

#include "../../kernels/tokenizer/ktok_internal.h"
#include "kiln/strbuf.h"

#define CHUNK (64 * 1024)

static json_t *ids_json(const int32_t *ids, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer(ids[i]));
	return a;
}

static int cmd_encode(const ktok *t, bool hf)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	unsigned base = hf ? KTOK_ENC_PARSE_SPECIAL : 0;
	while ((len = getline(&line, &cap, stdin)) > 0) {
		json_error_t je;
		json_t *s = json_loadb(line, (size_t) len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		if (!json_is_string(s)) {
			fprintf(stderr, "tok-tool: not a JSON string: %s\n", line);
			return 2;
		}
		int32_t *ids, *ids_sp;
		size_t n, n_sp;
		char *dec;
		size_t dlen;
		if (ktok_encode(t, json_string_value(s), json_string_length(s), base, &ids, &n) <
			    0 ||
		    ktok_encode(t, json_string_value(s), json_string_length(s),
				base | KTOK_ENC_ADD_SPECIAL, &ids_sp, &n_sp) < 0 ||
		    ktok_decode(t, ids, n, KTOK_DEC_SKIP_SPECIAL, &dec, &dlen) < 0)
			return 1;
		json_t *o = json_pack("{s:o, s:o, s:s%}", "ids", ids_json(ids, n), "ids_special",
				      ids_json(ids_sp, n_sp), "decoded", dec, dlen);
		char *out = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
		puts(out);
		free(out);
		json_decref(o);
		json_decref(s);
		free(ids);
		free(ids_sp);
		free(dec);
	}
	free(line);
	return 0;
}

/* ---- the naive O(n^2) reference (rank-merge BPE only) ---- */

struct naive {
	const ktok *t;
	int32_t *out;
	size_t n;
};

static int32_t merge_rank(const ktok *t, int32_t a, int32_t b, int32_t *res)
{
	if (!t->mh)
		return -1;
	for (uint32_t i = ((uint32_t) (((uint64_t) (uint32_t) a << 32 | (uint32_t) b) *
					       0x9e3779b97f4a7c15ull >>
				       32)) &
			  t->mh_mask;
	     ; i = (i + 1) & t->mh_mask) {
		const struct ktok_merge *m = &t->mh[i];
		if (m->rank < 0)
			return -1;
		if (m->a == a && m->b == b) {
			*res = m->result;
			return m->rank;
		}
	}
}

static int naive_piece(void *ud, const char *s, size_t len)
{
	struct naive *w = ud;
	const ktok *t = w->t;
	int32_t *sym = malloc(len * sizeof(*sym));
	if (!sym)
		return -ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < len; i++)
		sym[n++] = t->byte_id[(unsigned char) s[i]];
	for (;;) {
		int32_t best = INT32_MAX, best_res = -1;
		size_t at = 0;
		for (size_t i = 0; i + 1 < n; i++) {
			int32_t res, r = merge_rank(t, sym[i], sym[i + 1], &res);
			if (r >= 0 && r < best)
				best = r, best_res = res, at = i;
		}
		if (best_res < 0)
			break;
		sym[at] = best_res;
		memmove(sym + at + 1, sym + at + 2, (n - at - 2) * sizeof(*sym));
		n--;
	}
	memcpy(w->out + w->n, sym, n * sizeof(*sym));
	w->n += n;
	free(sym);
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmd_bench(const ktok *t, const char *path, bool naive)
{
	_cleanup_free_ char *text = NULL;
	size_t len;
	if (kiln_read_file(path, 1u << 30, &text, &len) < 0) {
		fprintf(stderr, "tok-tool: cannot read %s\n", path);
		return 1;
	}
	if (naive && !t->byte_level) {
		fprintf(stderr, "tok-tool: the naive baseline handles byte-level BPE only\n");
		return 2;
	}
	size_t total_ids = 0;
	double t_enc = 0, t_dec = 0;
	_cleanup_free_ int32_t *buf = malloc((CHUNK + 1) * sizeof(int32_t));
	for (size_t off = 0; off < len;) {
		size_t end = MIN(len, off + CHUNK);
		while (end < len && end > off + 1 && text[end - 1] != '\n')
			end--;
		int32_t *ids = NULL;
		size_t n;
		double t0 = now();
		if (naive) {
			struct naive w = { .t = t, .out = buf };
			ktok__pretokenize(t->pre, text + off, end - off, naive_piece, &w);
			ids = buf, n = w.n;
		} else if (ktok_encode(t, text + off, end - off, 0, &ids, &n) < 0) {
			return 1;
		}
		double t1 = now();
		char *dec;
		size_t dlen;
		if (ktok_decode(t, ids, n, 0, &dec, &dlen) < 0)
			return 1;
		t_dec += now() - t1;
		t_enc += t1 - t0;
		if (dlen != end - off || memcmp(dec, text + off, dlen) != 0) {
			fprintf(stderr, "tok-tool: round trip differs at byte %zu\n", off);
			return 1;
		}
		free(dec);
		if (!naive)
			free(ids);
		total_ids += n;
		off = end;
	}
	printf("%.2f %.2f %zu\n", (double) len / t_enc / 1e6, (double) len / t_dec / 1e6,
	       total_ids);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: tok-tool encode FILE [hf|sp] | bench FILE TEXT [naive]\n");
		return 2;
	}
	_cleanup_(ktok_freep) ktok *t = NULL;
	kiln_error err;
	if (ktok_load(argv[2], &t, &err) < 0) {
		char line[800];
		fprintf(stderr, "%s\n", kiln_error_format(&err, line, sizeof(line)));
		return 1;
	}
	if (streq(argv[1], "encode"))
		return cmd_encode(t, argc > 3 && streq(argv[3], "hf"));
	if (streq(argv[1], "bench") && argc > 3)
		return cmd_bench(t, argv[3], argc > 4 && streq(argv[4], "naive"));
	return 2;
}
