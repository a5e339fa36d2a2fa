/* test-metrics.c — kiln/metrics.h: exact exposition text, escaping,
 * cumulative histograms, errors, a histogram observed from threads, and
 * `promtool check metrics` on the output (skipped without promtool). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/metrics.h"

static const double bounds[] = { 0.005, 0.1, 1, 2.5 };

static void build(kiln_strbuf *b)
{
	kiln_metrics m;
	kiln_metrics_init(&m, b);
	kiln_metrics_family(&m, "kiln_requests_total", KILN_METRIC_COUNTER,
			    "HTTP requests by route and code.");
	kiln_metrics_sample(&m, (const char *[]){ "route", "/v1/completions", "code", "200", NULL },
			    12);
	kiln_metrics_sample(&m, (const char *[]){ "route", "/v1/completions", "code", "429", NULL },
			    3);
	kiln_metrics_family(&m, "kiln_model_info", KILN_METRIC_GAUGE,
			    "Loaded model (value 1).\nSecond line with a \\ backslash.");
	kiln_metrics_sample(
		&m, (const char *[]){ "model", "a \"quoted\"\nname\\x", "path", "/m", NULL }, 1);
	kiln_metrics_family(&m, "kiln_temp_celsius", KILN_METRIC_GAUGE, "Odd values.");
	kiln_metrics_sample(&m, (const char *[]){ "k", "nan", NULL }, NAN);
	kiln_metrics_sample(&m, (const char *[]){ "k", "inf", NULL }, INFINITY);
	kiln_metrics_sample(&m, (const char *[]){ "k", "-inf", NULL }, -INFINITY);
	kiln_metrics_sample(&m, (const char *[]){ "k", "frac", NULL }, 0.1);
	kiln_metrics_sample(&m, (const char *[]){ "k", "big", NULL }, 1e20);
	kiln_metrics_sample(&m, (const char *[]){ "k", "neg", NULL }, -42);
	kiln_metrics_family(&m, "kiln_latency_seconds", KILN_METRIC_HISTOGRAM, "Request latency.");
	uint64_t counts[] = { 1, 2, 0, 3, 4 };
	kiln_metrics_histogram(&m, (const char *[]){ "route", "/a", NULL }, bounds, counts, 4,
			       21.5);
	kiln_metrics_histogram(&m, NULL, bounds, (uint64_t[]){ 0, 0, 0, 0, 0 }, 4, 0);
	kiln_metrics_family(&m, "kiln_up", KILN_METRIC_GAUGE, "Whether the server is up.");
	kiln_metrics_sample(&m, NULL, 1);
	assert_int_equal(kiln_metrics_finish(&m), 0);
}

static const char expected[] =
	"# HELP kiln_requests_total HTTP requests by route and code.\n"
	"# TYPE kiln_requests_total counter\n"
	"kiln_requests_total{route=\"/v1/completions\",code=\"200\"} 12\n"
	"kiln_requests_total{route=\"/v1/completions\",code=\"429\"} 3\n"
	"# HELP kiln_model_info Loaded model (value 1).\\nSecond line with a \\\\ backslash.\n"
	"# TYPE kiln_model_info gauge\n"
	"kiln_model_info{model=\"a \\\"quoted\\\"\\nname\\\\x\",path=\"/m\"} 1\n"
	"# HELP kiln_temp_celsius Odd values.\n"
	"# TYPE kiln_temp_celsius gauge\n"
	"kiln_temp_celsius{k=\"nan\"} NaN\n"
	"kiln_temp_celsius{k=\"inf\"} +Inf\n"
	"kiln_temp_celsius{k=\"-inf\"} -Inf\n"
	"kiln_temp_celsius{k=\"frac\"} 0.1\n"
	"kiln_temp_celsius{k=\"big\"} 1e+20\n"
	"kiln_temp_celsius{k=\"neg\"} -42\n"
	"# HELP kiln_latency_seconds Request latency.\n"
	"# TYPE kiln_latency_seconds histogram\n"
	"kiln_latency_seconds_bucket{route=\"/a\",le=\"0.005\"} 1\n"
	"kiln_latency_seconds_bucket{route=\"/a\",le=\"0.1\"} 3\n"
	"kiln_latency_seconds_bucket{route=\"/a\",le=\"1\"} 3\n"
	"kiln_latency_seconds_bucket{route=\"/a\",le=\"2.5\"} 6\n"
	"kiln_latency_seconds_bucket{route=\"/a\",le=\"+Inf\"} 10\n"
	"kiln_latency_seconds_sum{route=\"/a\"} 21.5\n"
	"kiln_latency_seconds_count{route=\"/a\"} 10\n"
	"kiln_latency_seconds_bucket{le=\"0.005\"} 0\n"
	"kiln_latency_seconds_bucket{le=\"0.1\"} 0\n"
	"kiln_latency_seconds_bucket{le=\"1\"} 0\n"
	"kiln_latency_seconds_bucket{le=\"2.5\"} 0\n"
	"kiln_latency_seconds_bucket{le=\"+Inf\"} 0\n"
	"kiln_latency_seconds_sum 0\n"
	"kiln_latency_seconds_count 0\n"
	"# HELP kiln_up Whether the server is up.\n"
	"# TYPE kiln_up gauge\n"
	"kiln_up 1\n";

static void test_text(void **state)
{
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	build(&b);
	assert_string_equal(b.s, expected);
}

static void test_errors(void **state)
{
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;

	kiln_metrics_init(&m, &b);
	assert_int_equal(kiln_metrics_sample(&m, NULL, 1), -EINVAL); /* no family */
	assert_int_equal(kiln_metrics_finish(&m), -EINVAL);

	kiln_metrics_init(&m, &b);
	assert_int_equal(kiln_metrics_family(&m, "1bad", KILN_METRIC_GAUGE, "x"), -EINVAL);
	assert_int_equal(kiln_metrics_family(&m, "ok", KILN_METRIC_GAUGE, "x"),
			 -EINVAL); /* sticky */
	assert_int_equal(kiln_metrics_finish(&m), -EINVAL);

	kiln_metrics_init(&m, &b);
	assert_int_equal(kiln_metrics_family(&m, "a", KILN_METRIC_GAUGE, NULL), -EINVAL);
	kiln_metrics_finish(&m);

	kiln_metrics_init(&m, &b);
	assert_int_equal(kiln_metrics_family(&m, "a", KILN_METRIC_GAUGE, "x"), 0);
	assert_int_equal(kiln_metrics_family(&m, "a", KILN_METRIC_GAUGE, "x"), 0); /* no-op */
	assert_int_equal(kiln_metrics_family(&m, "b", KILN_METRIC_GAUGE, "x"), 0);
	assert_int_equal(kiln_metrics_family(&m, "a", KILN_METRIC_GAUGE, "x"), -EEXIST);
	assert_int_equal(kiln_metrics_finish(&m), -EEXIST);

	kiln_metrics_init(&m, &b);
	kiln_metrics_family(&m, "a", KILN_METRIC_GAUGE, "x");
	assert_int_equal(kiln_metrics_sample(&m, (const char *[]){ "bad-name", "v", NULL }, 1),
			 -EINVAL);
	kiln_metrics_finish(&m);

	kiln_metrics_init(&m, &b);
	kiln_metrics_family(&m, "h", KILN_METRIC_HISTOGRAM, "x");
	assert_int_equal(kiln_metrics_sample(&m, NULL, 1), -EINVAL); /* wrong kind */
	kiln_metrics_finish(&m);

	kiln_metrics_init(&m, &b);
	kiln_metrics_family(&m, "h", KILN_METRIC_HISTOGRAM, "x");
	static const double unsorted[] = { 1, 0.5 };
	assert_int_equal(kiln_metrics_histogram(&m, NULL, unsorted, (uint64_t[]){ 0, 0, 0 }, 2, 0),
			 -EINVAL);
	kiln_metrics_finish(&m);

	kiln_metrics_init(&m, &b);
	kiln_metrics_family(&m, "h", KILN_METRIC_HISTOGRAM, "x");
	assert_int_equal(kiln_metrics_histogram(&m, (const char *[]){ "le", "1", NULL }, bounds,
						(uint64_t[]){ 0, 0, 0, 0, 0 }, 4, 0),
			 -EINVAL); /* le is ours */
	kiln_metrics_finish(&m);

	kiln_histogram h;
	assert_int_equal(kiln_histogram_init(&h, unsorted, 2), -EINVAL);
	assert_int_equal(kiln_histogram_init(&h, bounds, 0), -EINVAL);
}

static kiln_histogram shared;
enum { THREADS = 4, PER_THREAD = 100000 };

static void *observer(void *arg)
{
	/* values cycle over 0.001, 0.05, 0.5, 2, 10: one per bucket */
	static const double vals[] = { 0.001, 0.05, 0.5, 2, 10 };
	for (int i = 0; i < PER_THREAD; i++)
		kiln_histogram_observe(&shared, vals[i % 5]);
	return NULL;
}

static void test_histogram_threads(void **state)
{
	assert_int_equal(kiln_histogram_init(&shared, bounds, 4), 0);
	kiln_histogram_observe(&shared, 0.005); /* on a bound: that bucket (le is <=) */
	kiln_histogram_observe(&shared, NAN);	/* ignored */
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, observer, NULL), 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	kiln_metrics m;
	kiln_metrics_init(&m, &b);
	kiln_metrics_family(&m, "x_seconds", KILN_METRIC_HISTOGRAM, "x");
	kiln_metrics_histogram_from(&m, NULL, &shared);
	assert_int_equal(kiln_metrics_finish(&m), 0);
	char want[1024];
	uint64_t per = THREADS * PER_THREAD / 5;
	double sum = 0.005 + (double) per * (0.001 + 0.05 + 0.5 + 2 + 10);
	kiln_strbuf ws;
	kiln_strbuf_init(&ws);
	kiln_metrics_value(&ws, sum);
	snprintf(want, sizeof(want),
		 "# HELP x_seconds x\n# TYPE x_seconds histogram\n"
		 "x_seconds_bucket{le=\"0.005\"} %llu\n"
		 "x_seconds_bucket{le=\"0.1\"} %llu\n"
		 "x_seconds_bucket{le=\"1\"} %llu\n"
		 "x_seconds_bucket{le=\"2.5\"} %llu\n"
		 "x_seconds_bucket{le=\"+Inf\"} %llu\n"
		 "x_seconds_sum %s\nx_seconds_count %llu\n",
		 (unsigned long long) per + 1, (unsigned long long) 2 * per + 1,
		 (unsigned long long) 3 * per + 1, (unsigned long long) 4 * per + 1,
		 (unsigned long long) 5 * per + 1, ws.s, (unsigned long long) 5 * per + 1);
	/* the sum is accumulated in another order: compare it with tolerance */
	const char *got_sum = strstr(b.s, "x_seconds_sum ");
	assert_non_null(got_sum);
	double gs = strtod(got_sum + 14, NULL);
	assert_true(fabs(gs - sum) <= 1e-9 * sum);
	const char *want_sum = strstr(want, "x_seconds_sum ");
	assert_int_equal(got_sum - b.s, want_sum - want); /* everything before matches */
	assert_memory_equal(b.s, want, (size_t) (want_sum - want));
	kiln_strbuf_free(&ws);
	kiln_histogram_destroy(&shared);
}

static int promtool(const char *text, char *out, size_t size)
{
	char path[] = "/tmp/kiln-metrics-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t) strlen(text));
	close(fd);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, size - 1, p);
	out[n] = 0;
	int st = pclose(p);
	unlink(path);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_promtool(void **state)
{
	if (system("command -v promtool >/dev/null 2>&1") != 0)
		skip();
	_cleanup_strbuf_ kiln_strbuf b;
	kiln_strbuf_init(&b);
	build(&b);
	char out[4096];
	int rc = promtool(b.s, out, sizeof(out));
	if (rc != 0 || out[0])
		fail_msg("promtool check metrics: rc %d: %s", rc, out);
	/* and promtool does catch what we refuse to write: a broken family */
	rc = promtool("# TYPE a counter\na{x=\"1} 1\n", out, sizeof(out));
	assert_int_not_equal(rc, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_histogram_threads),
		cmocka_unit_test(test_promtool),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
