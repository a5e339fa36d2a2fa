/* kiln-store-bench — load generator for the kiln store (and any TCPStore
 * 2.x-dialect server), used by tests/store/bench-store.sh.
 *
 *   kiln-store-bench ops  --port P [--host H] [--clients N] [--seconds S] [--value-size B]
 *   kiln-store-bench rdzv --port P [--host H] [--clients N] [--rounds R]
 *
 * ops:  N threads, one connection each, alternate SET and GET of their own
 *       key for S seconds; prints "ops clients=N ops=... ops_per_sec=...
 *       p50_us=... p99_us=...".
 * rdzv: N threads connect, then all start together: ADD a round counter, the
 *       one that reads N SETs the round's "go" key, everyone WAITs on it.
 *       Prints "rdzv clients=N round=i ms=..." per round (time from the
 *       common start to the last waiter woken) and "rdzv ... connect_ms=...".
 * Exit: 0, 1 when a client call fails, 2 on bad usage. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>

#include "kiln/log.h"
#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/store.h"

#define THREAD_STACK (256u * 1024u)
#define LAT_SAMPLES  4096
#define CLIENTS_MAX  8192

typedef struct bench {
	const char *host;
	uint16_t port;
	int clients;
	double seconds;
	int rounds;
	size_t value_size;
	pthread_barrier_t start, round_start, round_end;
	_Atomic uint64_t ops;
	_Atomic int failed;
	_Atomic uint64_t last_woke;
	uint64_t t_start;
	volatile bool stop;
} bench;

typedef struct worker {
	bench *b;
	int id;
	uint64_t ops;
	uint32_t lat[LAT_SAMPLES];
	size_t n_lat;
} worker;

static int fail(bench *b, int r, const char *what)
{
	if (b->failed++ == 0)
		log_error_errno(r, "%s failed: %m", what);
	return r;
}

/* Every worker connects, then waits for the others at the start line;
 * NULL when it could not connect (counted as a failure). */
static kiln_store_client *connect_and_start(bench *b, uint64_t timeout_usec)
{
	kiln_store_client *c = NULL;
	int r = kiln_store_client_connect(b->host, b->port, NULL, timeout_usec, &c);
	if (r < 0)
		fail(b, r, "connect");
	pthread_barrier_wait(&b->start);
	return c;
}

static void *ops_thread(void *p)
{
	worker *w = p;
	bench *b = w->b;
	int r;
	kiln_store_client *c = connect_and_start(b, 30 * 1000000ull);
	if (!c)
		return NULL;
	char key[64];
	snprintf(key, sizeof(key), "/bench/ops/%d", w->id);
	_cleanup_free_ char *val = malloc(b->value_size + 1);
	memset(val, 'v', b->value_size);
	while (!b->stop) {
		uint64_t t0 = kiln_now_usec();
		if (w->ops % 2 == 0) {
			r = kiln_store_client_set(c, key, val, b->value_size);
			/* SET has no reply; pair it with the GET for latency */
		} else {
			void *v = NULL;
			size_t n;
			r = kiln_store_client_try_get(c, key, &v, &n);
			free(v);
			if (r >= 0 && n != b->value_size)
				r = -EPROTO;
		}
		if (r < 0) {
			fail(b, r, "SET/GET");
			break;
		}
		if (w->ops % 2 == 1 && w->n_lat < LAT_SAMPLES)
			w->lat[w->n_lat++] =
				(uint32_t) MIN(kiln_now_usec() - t0, (uint64_t) UINT32_MAX);
		w->ops++;
	}
	kiln_store_client_free(c);
	return NULL;
}

static void *rdzv_thread(void *p)
{
	worker *w = p;
	bench *b = w->b;
	int r;
	kiln_store_client *c = connect_and_start(b, 60 * 1000000ull);
	for (int round = 0; round < b->rounds; round++) {
		pthread_barrier_wait(&b->round_start);
		if (c && !b->failed) {
			char ck[64], gk[64];
			snprintf(ck, sizeof(ck), "/bench/rdzv/%d/count", round);
			snprintf(gk, sizeof(gk), "/bench/rdzv/%d/go", round);
			int64_t v;
			r = kiln_store_client_add(c, ck, 1, &v);
			if (r >= 0 && v == b->clients)
				r = kiln_store_client_set(c, gk, "1", 1);
			if (r >= 0) {
				const char *keys[] = { gk };
				r = kiln_store_client_wait(c, keys, 1, 60 * 1000000ull);
			}
			if (r < 0)
				fail(b, r, "rendezvous");
			uint64_t now = kiln_now_usec(), prev = b->last_woke;
			while (now > prev &&
			       !atomic_compare_exchange_weak(&b->last_woke, &prev, now))
				;
		}
		pthread_barrier_wait(&b->round_end);
	}
	kiln_store_client_free(c);
	return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = { { "host", required_argument, NULL, 'H' },
						  { "port", required_argument, NULL, 'p' },
						  { "clients", required_argument, NULL, 'n' },
						  { "seconds", required_argument, NULL, 's' },
						  { "rounds", required_argument, NULL, 'r' },
						  { "value-size", required_argument, NULL, 'v' },
						  {} };
	bench b = {
		.host = "127.0.0.1", .clients = 16, .seconds = 2, .rounds = 3, .value_size = 64
	};
	int c, port = 0, n;
	if (argc < 2 || (!streq(argv[1], "ops") && !streq(argv[1], "rdzv"))) {
		fprintf(stderr, "Usage: kiln-store-bench ops|rdzv --port P [--host H] [--clients "
				"N] [--seconds S]\n"
				"                        [--rounds R] [--value-size B]\n");
		return 2;
	}
	bool rdzv = streq(argv[1], "rdzv");
	optind = 2;
	while ((c = getopt_long(argc, argv, "H:p:n:s:r:v:", longopts, NULL)) >= 0) {
		switch (c) {
		case 'H':
			b.host = optarg;
			break;
		case 'p':
			if (kiln_parse_int(optarg, 1, 65535, &port) < 0)
				goto bad;
			b.port = (uint16_t) port;
			break;
		case 'n':
			if (kiln_parse_int(optarg, 1, CLIENTS_MAX, &b.clients) < 0)
				goto bad;
			break;
		case 's':
			if (kiln_parse_double(optarg, &b.seconds) < 0 || b.seconds <= 0)
				goto bad;
			break;
		case 'r':
			if (kiln_parse_int(optarg, 1, 1000, &b.rounds) < 0)
				goto bad;
			break;
		case 'v':
			if (kiln_parse_int(optarg, 0, (int) KILN_STORE_VALUE_MAX, &n) < 0)
				goto bad;
			b.value_size = (size_t) n;
			break;
		default:
			return 2;
		}
	}
	if (b.port == 0) {
	bad:
		log_error("Bad or missing option (%s); --port is required, --clients 1-%d.",
			  optarg ? optarg : "--port", CLIENTS_MAX);
		return 2;
	}

	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t) b.clients + 64) {
		rl.rlim_cur = MIN((rlim_t) b.clients + 64, rl.rlim_max);
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	pthread_barrier_init(&b.start, NULL, (unsigned) b.clients + 1);
	pthread_barrier_init(&b.round_start, NULL, (unsigned) b.clients + 1);
	pthread_barrier_init(&b.round_end, NULL, (unsigned) b.clients + 1);
	worker *ws = calloc((size_t) b.clients, sizeof(*ws));
	pthread_t *ts = calloc((size_t) b.clients, sizeof(*ts));
	if (!ws || !ts)
		return log_error_errno(ENOMEM, "Out of memory"), 1;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, THREAD_STACK);

	uint64_t t0 = kiln_now_usec();
	for (int i = 0; i < b.clients; i++) {
		ws[i].b = &b;
		ws[i].id = i;
		if (pthread_create(&ts[i], &attr, rdzv ? rdzv_thread : ops_thread, &ws[i]) != 0) {
			log_error("Failed to start client thread %d of %d.", i, b.clients);
			return 1;
		}
	}
	pthread_barrier_wait(&b.start);
	uint64_t connect_ms = (kiln_now_usec() - t0) / 1000;

	if (rdzv) {
		printf("rdzv clients=%d connect_ms=%" PRIu64 "\n", b.clients, connect_ms);
		for (int r = 0; r < b.rounds; r++) {
			b.last_woke = 0;
			uint64_t start = kiln_now_usec();
			pthread_barrier_wait(&b.round_start);
			pthread_barrier_wait(&b.round_end);
			if (b.failed)
				break;
			printf("rdzv clients=%d round=%d ms=%.2f\n", b.clients, r,
			       (double) (b.last_woke - start) / 1000.0);
			fflush(stdout);
		}
	} else {
		usleep((useconds_t) (b.seconds * 1e6));
		b.stop = true;
	}
	for (int i = 0; i < b.clients; i++)
		pthread_join(ts[i], NULL);
	double secs = (double) (kiln_now_usec() - t0) / 1e6 - (double) connect_ms / 1000.0;

	if (!rdzv && !b.failed) {
		uint64_t ops = 0;
		size_t nl = 0;
		for (int i = 0; i < b.clients; i++) {
			ops += ws[i].ops;
			nl += ws[i].n_lat;
		}
		uint32_t *lat = malloc(MAX(nl, (size_t) 1) * sizeof(*lat));
		size_t k = 0;
		for (int i = 0; i < b.clients; i++)
			for (size_t j = 0; j < ws[i].n_lat; j++)
				lat[k++] = ws[i].lat[j];
		qsort(lat, nl, sizeof(*lat), cmp_u32);
		printf("ops clients=%d ops=%" PRIu64 " ops_per_sec=%.0f p50_us=%u p99_us=%u\n",
		       b.clients, ops, (double) ops / secs, nl ? lat[nl / 2] : 0,
		       nl ? lat[nl * 99 / 100] : 0);
		free(lat);
	}
	free(ws);
	free(ts);
	return b.failed ? 1 : 0;
}
