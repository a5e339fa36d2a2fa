/* kiln/metrics.h — a Prometheus text-exposition (0.0.4) builder.
 *
 * kiln-healthd and kiln-inferd serve /metrics with it.  It writes each
 * family's "# HELP" and "# TYPE" once, escapes label values (\\, \" and
 * \n) and HELP text (\\ and \n), formats values the way Prometheus parses
 * them (NaN, +Inf, -Inf, integers without an exponent), and expands
 * histograms into cumulative _bucket{le=...} samples ending in +Inf, then
 * _sum and _count.  The output passes `promtool check metrics`.
 *
 * Usage:
 *     kiln_metrics m;
 *     kiln_metrics_init(&m, &buf);
 *     kiln_metrics_family(&m, "kiln_requests_total", KILN_METRIC_COUNTER, "Requests.");
 *     kiln_metrics_sample(&m, (const char *[]) { "code", "200", NULL }, 12);
 *     ...
 *     r = kiln_metrics_finish(&m);
 *
 * Errors stick: after the first one (-EINVAL for a bad metric or label
 * name, a sample outside a family or of the wrong kind, -EEXIST for a family
 * started twice, -ENOMEM), calls do nothing and kiln_metrics_finish()
 * returns it. */
#pragma once

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/strbuf.h"

/* Metric and label names longer than this are refused (they are ours, not
 * the client's, but a fixed bound keeps the family bookkeeping simple). */
#define KILN_METRIC_NAME_MAX 128
/* Buckets per histogram (Prometheus' own defaults use 11). */
#define KILN_METRIC_BUCKETS_MAX 64

typedef enum kiln_metric_type {
	KILN_METRIC_COUNTER,
	KILN_METRIC_GAUGE,
	KILN_METRIC_HISTOGRAM,
	KILN_METRIC_UNTYPED,
} kiln_metric_type;

typedef struct kiln_metrics {
	kiln_strbuf *out;
	char family[KILN_METRIC_NAME_MAX + 1];
	kiln_metric_type type;
	char **done; /* families already written */
	int error;
} kiln_metrics;

void kiln_metrics_init(kiln_metrics *m, kiln_strbuf *out);
/* Frees the bookkeeping; returns the first error (or out's), else 0. */
int kiln_metrics_finish(kiln_metrics *m);

/* Starts a family: HELP (required, non-empty) and TYPE.  Starting the current
 * family again is a no-op; one seen earlier is -EEXIST (Prometheus wants
 * a family's samples together). */
int kiln_metrics_family(kiln_metrics *m, const char *name, kiln_metric_type type, const char *help);
/* One sample of the current (counter, gauge or untyped) family.  labels:
 * NULL, or name, value, name, value ..., NULL. */
int kiln_metrics_sample(kiln_metrics *m, const char *const *labels, double value);
/* One histogram of the current (histogram) family.  bounds: n strictly
 * increasing upper bounds (without +Inf); counts: n + 1 per-bucket
 * (not cumulative) counts, the last for values above the highest bound. */
int kiln_metrics_histogram(kiln_metrics *m, const char *const *labels, const double *bounds,
			   const uint64_t *counts, size_t n, double sum);

/* Appends a value as Prometheus writes it. */
void kiln_metrics_value(kiln_strbuf *b, double v);
/* Appends a label value escaped (\\, \", \n). */
void kiln_metrics_label_escape(kiln_strbuf *b, const char *s);

/* A histogram to observe into from many threads. */
typedef struct kiln_histogram {
	pthread_mutex_t lock;
	size_t n;
	double bounds[KILN_METRIC_BUCKETS_MAX];
	uint64_t counts[KILN_METRIC_BUCKETS_MAX + 1];
	double sum;
} kiln_histogram;

/* -EINVAL unless 1 <= n <= KILN_METRIC_BUCKETS_MAX and strictly increasing. */
int kiln_histogram_init(kiln_histogram *h, const double *bounds, size_t n);
void kiln_histogram_destroy(kiln_histogram *h);
/* Counts v in the first bucket whose bound is >= v (NaN is ignored). */
void kiln_histogram_observe(kiln_histogram *h, double v);
/* Writes a consistent snapshot of h as one histogram of the current family. */
int kiln_metrics_histogram_from(kiln_metrics *m, const char *const *labels, kiln_histogram *h);
