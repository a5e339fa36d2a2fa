/* metrics.c — the Prometheus text-exposition builder (see kiln/metrics.h).
 *
 * Format reference: Prometheus "Exposition formats", text format 0.0.4. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kiln/metrics.h"

void kiln_metrics_init(kiln_metrics *m, kiln_strbuf *out)
{
	*m = (kiln_metrics){ .out = out };
}

int kiln_metrics_finish(kiln_metrics *m)
{
	strv_free(m->done);
	m->done = NULL;
	if (m->error < 0)
		return m->error;
	return kiln_strbuf_error(m->out);
}

static bool name_ok(const char *s, bool colon)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0 || n > KILN_METRIC_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
			  (colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
		if (!ok)
			return false;
	}
	return true;
}

static int fail(kiln_metrics *m, int r)
{
	if (m->error == 0)
		m->error = r;
	return r;
}

/* Backslash-escapes each of `special` (a subset of backslash, '"' and
 * newline) in s. */
static void escape(kiln_strbuf *b, const char *s, const char *special)
{
	while (s && *s) {
		size_t n = strcspn(s, special);
		kiln_strbuf_append_n(b, s, n);
		s += n;
		if (!*s)
			break;
		kiln_strbuf_append(b, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\");
		s++;
	}
}

void kiln_metrics_label_escape(kiln_strbuf *b, const char *s)
{
	escape(b, s, "\\\"\n");
}

/* HELP text escapes only backslash and newline. */
static void help_escape(kiln_strbuf *b, const char *s)
{
	escape(b, s, "\\\n");
}

void kiln_metrics_value(kiln_strbuf *b, double v)
{
	char buf[40];
	if (isnan(v))
		kiln_strbuf_append(b, "NaN");
	else if (isinf(v))
		kiln_strbuf_append(b, v > 0 ? "+Inf" : "-Inf");
	else if (v == floor(v) && fabs(v) < 1e15) {
		/* integers (counters, most gauges): no printf */
		long long x = (long long) v;
		unsigned long long u =
			x < 0 ? 0ull - (unsigned long long) x : (unsigned long long) x;
		char *e = buf + sizeof(buf), *q = e;
		do
			*--q = (char) ('0' + u % 10);
		while (u /= 10);
		if (x < 0)
			*--q = '-';
		kiln_strbuf_append_n(b, q, (size_t) (e - q));
	} else {
		/* The shortest form that reads back as the same double.  %g drops
		 * trailing zeros, and a double is exact to ~16 digits, so when a
		 * form of 15 digits or fewer reads back, %.15g prints exactly
		 * it: start there (one snprintf for nearly every value instead
		 * of up to 17). */
		for (int p = 15; p <= 17; p++) {
			snprintf(buf, sizeof(buf), "%.*g", p, v);
			if (strtod(buf, NULL) == v)
				break;
		}
		kiln_strbuf_append(b, buf);
	}
}

/* # TYPE words, by kiln_metric_type (checked by kiln_metrics_family()). */
static const char *const type_names[] = {
	[KILN_METRIC_COUNTER] = "counter",
	[KILN_METRIC_GAUGE] = "gauge",
	[KILN_METRIC_HISTOGRAM] = "histogram",
	[KILN_METRIC_UNTYPED] = "untyped",
};

int kiln_metrics_family(kiln_metrics *m, const char *name, kiln_metric_type type, const char *help)
{
	if (m->error < 0)
		return m->error;
	/* HELP is required: promtool's lint (and people) want it */
	if (!name_ok(name, true) || (unsigned) type >= ARRAY_SIZE(type_names) || !help || !*help)
		return fail(m, -EINVAL);
	if (streq(m->family, name)) {
		if (type != m->type)
			return fail(m, -EINVAL);
		return 0;
	}
	if (strv_contains(m->done, name))
		return fail(m, -EEXIST);
	if (m->family[0] && strv_extend(&m->done, m->family) < 0)
		return fail(m, -ENOMEM);
	snprintf(m->family, sizeof(m->family), "%s", name);
	m->type = type;
	kiln_strbuf_printf(m->out, "# HELP %s ", name);
	help_escape(m->out, help);
	kiln_strbuf_append(m->out, "\n");
	kiln_strbuf_printf(m->out, "# TYPE %s %s\n", name, type_names[type]);
	return kiln_strbuf_error(m->out) < 0 ? fail(m, -ENOMEM) : 0;
}

/* name{labels[,le="x"]} value\n */
static int line(kiln_metrics *m, const char *suffix, const char *const *labels, const char *le,
		double v)
{
	kiln_strbuf *b = m->out;
	kiln_strbuf_append(b, m->family);
	kiln_strbuf_append(b, suffix);
	bool any = false;
	for (const char *const *l = labels; l && l[0]; l += 2) {
		if (!name_ok(l[0], false) || !l[1] || (le && streq(l[0], "le")))
			return fail(m, -EINVAL);
		kiln_strbuf_append(b, any ? "," : "{");
		kiln_strbuf_append(b, l[0]);
		kiln_strbuf_append(b, "=\"");
		kiln_metrics_label_escape(b, l[1]);
		kiln_strbuf_append(b, "\"");
		any = true;
	}
	if (le)
		kiln_strbuf_printf(b, "%sle=\"%s\"", any ? "," : "{", le);
	if (any || le)
		kiln_strbuf_append(b, "}");
	kiln_strbuf_append(b, " ");
	kiln_metrics_value(b, v);
	kiln_strbuf_append(b, "\n");
	return kiln_strbuf_error(b) < 0 ? fail(m, -ENOMEM) : 0;
}

int kiln_metrics_sample(kiln_metrics *m, const char *const *labels, double value)
{
	if (m->error < 0)
		return m->error;
	if (!m->family[0] || m->type == KILN_METRIC_HISTOGRAM)
		return fail(m, -EINVAL);
	return line(m, "", labels, NULL, value);
}

int kiln_metrics_histogram(kiln_metrics *m, const char *const *labels, const double *bounds,
			   const uint64_t *counts, size_t n, double sum)
{
	if (m->error < 0)
		return m->error;
	if (!m->family[0] || m->type != KILN_METRIC_HISTOGRAM || n > KILN_METRIC_BUCKETS_MAX ||
	    (n && (!bounds || !counts)))
		return fail(m, -EINVAL);
	for (size_t i = 0; i < n; i++)
		if (isnan(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
			return fail(m, -EINVAL);
	uint64_t cum = 0;
	for (size_t i = 0; i < n; i++) {
		kiln_strbuf le;
		kiln_strbuf_init(&le);
		kiln_metrics_value(&le, bounds[i]);
		cum += counts[i];
		int r = kiln_strbuf_error(&le) < 0 ? fail(m, -ENOMEM)
						   : line(m, "_bucket", labels, le.s, (double) cum);
		kiln_strbuf_free(&le);
		if (r < 0)
			return r;
	}
	cum += counts ? counts[n] : 0;
	int r = line(m, "_bucket", labels, "+Inf", (double) cum);
	if (r >= 0)
		r = line(m, "_sum", labels, NULL, sum);
	if (r >= 0)
		r = line(m, "_count", labels, NULL, (double) cum);
	return r;
}

int kiln_histogram_init(kiln_histogram *h, const double *bounds, size_t n)
{
	assert_return(h && bounds && n >= 1 && n <= KILN_METRIC_BUCKETS_MAX, -EINVAL);
	for (size_t i = 0; i < n; i++)
		if (isnan(bounds[i]) || isinf(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
			return -EINVAL;
	memset(h, 0, sizeof(*h));
	pthread_mutex_init(&h->lock, NULL);
	h->n = n;
	memcpy(h->bounds, bounds, n * sizeof(*bounds));
	return 0;
}

void kiln_histogram_destroy(kiln_histogram *h)
{
	if (h)
		pthread_mutex_destroy(&h->lock);
}

void kiln_histogram_observe(kiln_histogram *h, double v)
{
	if (isnan(v))
		return;
	size_t i = 0;
	while (i < h->n && v > h->bounds[i])
		i++;
	pthread_mutex_lock(&h->lock);
	h->counts[i]++;
	h->sum += v;
	pthread_mutex_unlock(&h->lock);
}

int kiln_metrics_histogram_from(kiln_metrics *m, const char *const *labels, kiln_histogram *h)
{
	uint64_t counts[KILN_METRIC_BUCKETS_MAX + 1];
	pthread_mutex_lock(&h->lock);
	memcpy(counts, h->counts, (h->n + 1) * sizeof(*counts));
	double sum = h->sum;
	pthread_mutex_unlock(&h->lock);
	return kiln_metrics_histogram(m, labels, h->bounds, counts, h->n, sum);
}
