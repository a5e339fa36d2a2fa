/* bench-modelfile.c — timing helper for tests/modelfile/bench-modelfile.sh.
 *
 *   bench-modelfile write PATH TENSORS BYTES_EACH   write a checkpoint with kmf_writer
 *   bench-modelfile open PATH REPEAT                 open + index + look every tensor up
 *
 * Prints one line "seconds=S" (write: the whole commit, fsyncs included;
 * open: the median of REPEAT runs) and exits 0, or says what failed and
 * exits 1; usage errors exit 2.  open also prints cpu=S, the median CPU
 * time, steadier than wall time on a shared machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kmf.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;
	return (x > y) - (x < y);
}

static int do_write(const char *path, long n, long each)
{
	kmf_writer *w = NULL;
	kiln_error e;
	char line[1024], name[64];
	unsigned char *buf = malloc((size_t) each);
	int64_t shape[1] = { each / 4 };
	double t0;
	int r;
	if (!buf || kmf_writer_new(&w) < 0) {
		fprintf(stderr, "bench-modelfile: out of memory\n");
		return 1;
	}
	for (long i = 0; i < each; i++)
		buf[i] = (unsigned char) (i * 2654435761u >> 13);
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "model.layers.%ld.weight", i);
		/* every tensor points at the same buffer: the bench measures the
		 * writer and the disk, not filling memory */
		if (kmf_writer_add(w, name, KMF_F32, 1, shape, buf, (uint64_t) each) < 0) {
			fprintf(stderr, "bench-modelfile: cannot add tensor %ld\n", i);
			return 1;
		}
	}
	t0 = now();
	r = kmf_writer_commit(w, path, 0644, &e);
	if (r < 0) {
		fprintf(stderr, "bench-modelfile: %s\n", kiln_error_format(&e, line, sizeof(line)));
		return 1;
	}
	printf("seconds=%.4f\n", now() - t0);
	kmf_writer_free(w);
	free(buf);
	return 0;
}

static int do_open(const char *path, int repeat)
{
	double *t = calloc((size_t) repeat, sizeof(double));
	double *c = calloc((size_t) repeat, sizeof(double));
	char line[1024];
	size_t n = 0;
	for (int i = 0; i < repeat; i++) {
		kmf_file *f = NULL;
		kiln_error e;
		double t0 = now(), c0 = cpu();
		if (kmf_open(path, &f, &e) < 0) {
			fprintf(stderr, "bench-modelfile: %s\n",
				kiln_error_format(&e, line, sizeof(line)));
			return 1;
		}
		n = kmf_tensor_count(f);
		for (size_t j = 0; j < n; j++)
			if (!kmf_tensor_find(f, kmf_tensor_at(f, j)->name))
				return 1;
		kmf_close(f);
		t[i] = now() - t0;
		c[i] = cpu() - c0;
	}
	qsort(t, (size_t) repeat, sizeof(double), cmp_double);
	qsort(c, (size_t) repeat, sizeof(double), cmp_double);
	printf("seconds=%.6f cpu=%.6f tensors=%zu\n", t[repeat / 2], c[repeat / 2], n);
	free(t);
	free(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "write") == 0)
		return do_write(argv[2], atol(argv[3]), atol(argv[4]));
	if (argc == 4 && strcmp(argv[1], "open") == 0)
		return do_open(argv[2], atoi(argv[3]) > 0 ? atoi(argv[3]) : 1);
	fprintf(stderr,
		"usage: bench-modelfile write PATH TENSORS BYTES_EACH | open PATH REPEAT\n");
	return 2;
}
