/* tests/peer/peer-kiln.c — kiln's side of the llama.cpp comparison
 * (tests/peer/bench-peer.py runs it and tests/peer/peer-llamacpp.py on the
 * same GGUF files, interleaved).  One process per measurement row, so its
 * peak RSS is the row's alone.
 *
 * usage: peer-kiln --model FILE.gguf --prompt IDS [--dtype DT] [--decode N]
 *                  [--seqs S] [--batch-prompt N] [--reps R] [--greedy N]
 *   IDS  comma-separated prompt token ids (the prefill prompt; the single
 *        stream decodes after it; the S sequences each take a slice)
 *   DT   kiln's weight dtype: f32, bf16, f16, i8, q4 (default f32)
 * Threads: KK_CPU_THREADS and OPENBLAS_NUM_THREADS, set by the driver.
 * Clock: wall time, or process CPU time with KILN_PEER_CLOCK=cpu.
 *
 * Prints one JSON object on stdout:
 *   {"engine":"kiln","load_s":..,"prefill_tps":..,"decode_tps":..,
 *    "batch_tps":..,"rss_mb":..,"weight_mb":..,"greedy":[ids]}
 * prefill_tps: prompt tokens / the median time of one km_forward over the
 * whole prompt (an empty cache each rep); decode_tps: tokens / time of N
 * greedy steps after the prompt; batch_tps: S*N / time of N steps that
 * each decode one token of every sequence; greedy: the first ids of that
 * single-stream decode.  Exit 1 on any error (message on stderr).
 *
 * peer-kiln --bandwidth THREADS: this machine's copy bandwidth, memcpy of
 * 256 MiB split over THREADS threads, best of 5, counted as STREAM does
 * (bytes read + bytes written per second): {"copy_gbs": ...}.
 *
 * peer-kiln --blas-core: the OpenBLAS kernels kiln's sgemm (its f32 and
 * 16-bit prefill) runs with here, as OpenBLAS names them, and whether
 * $OPENBLAS_CORETYPE chose them: {"blas_core": "...", "forced": true}. */
#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/error.h"
#include "kiln/macro.h"
#include "kk.h"
#include "kmodel.h"

#define PROMPT_MAX 4096

/* Seconds on the benchmark's clock: wall time, or this process's CPU
 * time (all its threads) when KILN_PEER_CLOCK=cpu (bench-peer --cpu-time:
 * rates per CPU-second, what a busy shared machine disturbs least). */
static double wall(void)
{
	static int cpu = -1;
	struct timespec ts;
	if (cpu < 0) {
		const char *c = getenv("KILN_PEER_CLOCK");
		cpu = c && streq(c, "cpu");
	}
	clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;
	return x < y ? -1 : x > y;
}

static _noreturn_ void die(const char *what, const char *msg)
{
	fprintf(stderr, "peer-kiln: %s: %s\n", what, msg);
	exit(1);
}

static void check(int r, const char *what, const kiln_error *err)
{
	if (r < 0)
		die(what, err && err->msg[0] ? err->msg : strerror(-r));
}

static int parse_ids(const char *s, int32_t *ids, int max)
{
	int n = 0;
	while (*s) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 0 || v > INT32_MAX || n == max)
			return -1;
		ids[n++] = (int32_t) v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

static kk_dtype parse_dtype(const char *s)
{
	static const struct {
		const char *name;
		kk_dtype dt;
	} t[] = { { "f32", KK_F32 },
		  { "bf16", KK_BF16 },
		  { "f16", KK_F16 },
		  { "i8", KK_I8 },
		  { "q4", KK_Q4 } };
	for (size_t i = 0; i < ARRAY_SIZE(t); i++)
		if (streq(s, t[i].name))
			return t[i].dt;
	die("--dtype", "expected f32, bf16, f16, i8 or q4");
}

/* Greedy token of logits row `row` of the last step. */
static int32_t greedy(km_model *m, int row)
{
	kk_sampling g = { .temperature = 0 };
	int32_t tok;
	int r = km_sample(m, row, 1, &g, &tok);
	check(r, "km_sample", NULL);
	return tok;
}

/* This process's peak resident memory (VmHWM), MiB.  Not getrusage's
 * ru_maxrss: Linux carries that across exec, so a child of a big parent
 * (the Python driver) would report the parent's peak. */
static double peak_rss_mb(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	double kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %lf kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb / 1024.0;
}

#define BW_BYTES ((size_t) 256 << 20)

struct bw_part {
	char *dst;
	const char *src;
	size_t n;
};

static void *bw_copy(void *arg)
{
	struct bw_part *p = arg;
	memcpy(p->dst, p->src, p->n);
	return NULL;
}

static int bandwidth(int threads)
{
	if (threads < 1 || threads > 256)
		die("--bandwidth", "expected a thread count in 1..256");
	char *src = malloc(BW_BYTES), *dst = malloc(BW_BYTES);
	if (!src || !dst)
		die("--bandwidth", "out of memory");
	memset(src, 1, BW_BYTES);
	memset(dst, 2, BW_BYTES);
	struct bw_part *parts = calloc((size_t) threads, sizeof(*parts));
	pthread_t *tids = calloc((size_t) threads, sizeof(*tids));
	double best = 1e30;
	for (int rep = 0; rep < 5; rep++) {
		size_t each = BW_BYTES / (size_t) threads;
		double t = wall();
		for (int i = 0; i < threads; i++) {
			parts[i] = (struct bw_part){ dst + each * i, src + each * i, each };
			if (pthread_create(&tids[i], NULL, bw_copy, &parts[i]) != 0)
				die("--bandwidth", "pthread_create failed");
		}
		for (int i = 0; i < threads; i++)
			pthread_join(tids[i], NULL);
		t = wall() - t;
		best = t < best ? t : best;
	}
	printf("{\"copy_gbs\":%.2f}\n", 2.0 * (double) BW_BYTES / best / 1e9);
	free(parts);
	free(tids);
	free(src);
	free(dst);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && streq(argv[1], "--bandwidth"))
		return bandwidth(atoi(argv[2]));
	if (argc == 2 && streq(argv[1], "--blas-core")) {
		const char *forced = getenv("OPENBLAS_CORETYPE");
		printf("{\"blas_core\":\"%s\",\"forced\":%s}\n", openblas_get_corename(),
		       forced && *forced ? "true" : "false");
		return 0;
	}
	const char *path = NULL, *prompt_s = NULL;
	kk_dtype dt = KK_F32;
	int n_decode = 64, n_seqs = 8, batch_prompt = 16, reps = 3, n_greedy = 20;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			die(a, "needs a value");
		i++;
		if (streq(a, "--model"))
			path = v;
		else if (streq(a, "--prompt"))
			prompt_s = v;
		else if (streq(a, "--dtype"))
			dt = parse_dtype(v);
		else if (streq(a, "--decode"))
			n_decode = atoi(v);
		else if (streq(a, "--seqs"))
			n_seqs = atoi(v);
		else if (streq(a, "--batch-prompt"))
			batch_prompt = atoi(v);
		else if (streq(a, "--reps"))
			reps = atoi(v);
		else if (streq(a, "--greedy"))
			n_greedy = atoi(v);
		else
			die(a, "unknown option (see the comment at the top of "
			       "tests/peer/peer-kiln.c)");
	}
	if (!path || !prompt_s)
		die("usage", "peer-kiln --model FILE --prompt IDS [...]");
	if (n_decode < 1 || n_seqs < 1 || batch_prompt < 1 || reps < 1 || n_greedy > n_decode)
		die("options", "--decode, --seqs, --batch-prompt and --reps must be >= 1, --greedy "
			       "<= --decode");
	static int32_t prompt[PROMPT_MAX];
	int n_prompt = parse_ids(prompt_s, prompt, PROMPT_MAX);
	if (n_prompt < 1)
		die("--prompt", "expected comma-separated token ids");
	if (batch_prompt * n_seqs > n_prompt)
		die("--prompt", "shorter than --seqs x --batch-prompt");

	double t0 = wall();
	kiln_error err = { 0 };
	kk_backend *be = NULL;
	km_file *f = NULL;
	check(kk_backend_open("cpu", &be), "kk_backend_open cpu", NULL);
	check(km_file_open(path, &f, &err), path, &err);
	km_config cfg_copy = *km_file_config(f); /* f is freed after the upload */
	const km_config *cfg = &cfg_copy;
	if (n_prompt + n_decode > cfg->max_seq_len)
		die("--prompt", "prompt + decode longer than the model's context");
	km_model_opts o = {
		.weight_dtype = dt,
		.max_tokens = n_prompt > n_seqs ? n_prompt : n_seqs,
		.max_seqs = n_seqs,
	};
	km_weight_source src = km_file_source(f);
	km_model *m = NULL;
	check(km_model_new(be, cfg, &o, &src, &m, &err), "km_model_new", &err);
	f = km_file_free(f); /* the weights live in the model now */
	int per_seq = (cfg->max_seq_len + KK_KV_BLOCK_SIZE - 1) / KK_KV_BLOCK_SIZE;
	km_kvcache *c = NULL;
	check(km_kvcache_new(be, cfg, km_model_act_dtype(m), per_seq * (n_seqs + 1), n_seqs, &c),
	      "km_kvcache_new", NULL);
	double load_s = wall() - t0;

	/* Prefill: the whole prompt in one step, an empty cache each rep. */
	double *tp = calloc((size_t) reps, sizeof(double));
	for (int r = 0; r < reps; r++) {
		int s = km_kvcache_seq_new(c);
		check(s, "km_kvcache_seq_new", NULL);
		km_seq_input in = { s, prompt, n_prompt };
		double t = wall();
		check(km_forward(m, c, &in, 1, NULL, &err), "km_forward (prefill)", &err);
		(void) greedy(m, 0);
		tp[r] = wall() - t;
		km_kvcache_seq_free(c, s);
	}
	qsort(tp, (size_t) reps, sizeof(double), cmp_d);
	double prefill_tps = n_prompt / tp[reps / 2];

	/* Single stream: the prompt, then n_decode greedy steps (timed). */
	int32_t *ids = calloc((size_t) n_decode, sizeof(int32_t));
	int s = km_kvcache_seq_new(c);
	check(s, "km_kvcache_seq_new", NULL);
	km_seq_input in = { s, prompt, n_prompt };
	check(km_forward(m, c, &in, 1, NULL, &err), "km_forward (prompt)", &err);
	int32_t tok = greedy(m, 0);
	double t = wall();
	for (int i = 0; i < n_decode; i++) {
		ids[i] = tok;
		in = (km_seq_input){ s, &tok, 1 };
		check(km_forward(m, c, &in, 1, NULL, &err), "km_forward (decode)", &err);
		tok = greedy(m, 0);
	}
	double decode_tps = n_decode / (wall() - t);
	km_kvcache_seq_free(c, s);

	/* S sequences, each a batch_prompt slice of the prompt, prefilled one
	 * by one, then n_decode steps of one token for each (timed). */
	km_seq_input *bin = calloc((size_t) n_seqs, sizeof(km_seq_input));
	int32_t *btok = calloc((size_t) n_seqs, sizeof(int32_t));
	for (int q = 0; q < n_seqs; q++) {
		int sq = km_kvcache_seq_new(c);
		check(sq, "km_kvcache_seq_new", NULL);
		bin[q] = (km_seq_input){ sq, prompt + q * batch_prompt, batch_prompt };
		check(km_forward(m, c, &bin[q], 1, NULL, &err), "km_forward (batch prompt)", &err);
		btok[q] = greedy(m, 0);
		bin[q] = (km_seq_input){ sq, &btok[q], 1 };
	}
	t = wall();
	for (int i = 0; i < n_decode; i++) {
		check(km_forward(m, c, bin, n_seqs, NULL, &err), "km_forward (batch decode)", &err);
		for (int q = 0; q < n_seqs; q++)
			btok[q] = greedy(m, q);
	}
	double batch_tps = (double) n_seqs * n_decode / (wall() - t);

	double rss_mb = peak_rss_mb();
	printf("{\"engine\":\"kiln\",\"load_s\":%.3f,\"prefill_tps\":%.2f,\"decode_tps\":%.2f,"
	       "\"batch_tps\":%.2f,\"rss_mb\":%.1f,\"weight_mb\":%.1f,\"greedy\":[",
	       load_s, prefill_tps, decode_tps, batch_tps, rss_mb,
	       km_model_weight_bytes(m) / 1048576.0);
	for (int i = 0; i < n_greedy; i++)
		printf("%s%d", i ? "," : "", ids[i]);
	printf("]}\n");

	free(bin);
	free(btok);
	free(ids);
	free(tp);
	km_kvcache_free(c);
	km_model_free(m);
	kk_backend_free(be);
	return 0;
}
