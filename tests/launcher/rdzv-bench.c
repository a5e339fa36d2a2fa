/* rdzv-bench.c — simulated kiln-run agents for the rendezvous benchmark.
 *
 * A real kiln-run (started by tests/launcher/bench-kiln-run.sh as node 0 of a
 * loopback "allocation", KILN_RUN_SIM_NODES) hosts the store and leads; this
 * tool plays nodes 1..N-1, one thread and one store connection each, doing
 * exactly what an agent does: publish its join info, append its id to the
 * join list, heartbeat, poll the round counter every KR_POLL_USEC, read the
 * round, find its ranks, pass the round's barrier, and report done.
 *
 *   kiln-run-bench PORT N
 *
 * Prints "agents N join_to_round_ms X barrier_ms Y" (max over agents,
 * measured from the moment every thread started joining). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kiln/parse.h"
#include "kiln/store.h"
#include "launcher.h"
#include "rdzv.h"

static uint16_t port;
static size_t nagents;
static const char *secret;
static pthread_barrier_t go;
static uint64_t t_start;

typedef struct sim {
	size_t id;
	uint64_t round_usec, barrier_usec;
	int err;
} sim;

static int run_agent(sim *s)
{
	kiln_store_client *c = NULL;
	int r = kiln_store_client_connect("127.0.0.1", port, secret, 30 * KILN_USEC_PER_SEC, &c);
	pthread_barrier_wait(&go);
	if (r < 0)
		return r;
	char key[64], info[128];
	snprintf(key, sizeof(key), "/kiln/node/%zu", s->id);
	snprintf(info, sizeof(info), "sim%04zu 127.0.0.1 1 0 0", s->id);
	if ((r = kiln_store_client_set(c, key, info, strlen(info))) < 0)
		goto out;
	snprintf(info, sizeof(info), "%zu\n", s->id);
	if ((r = kiln_store_client_append(c, "/kiln/joins", info, strlen(info))) < 0)
		goto out;
	uint64_t next_hb = 0;
	int64_t round = 0;
	for (;;) {
		uint64_t now = kiln_now_usec();
		if (now >= next_hb) {
			snprintf(key, sizeof(key), "/kiln/hb/%zu", s->id);
			if ((r = kiln_store_client_add(c, key, 1, NULL)) < 0)
				goto out;
			next_hb = now + KILN_USEC_PER_SEC;
		}
		if ((r = kiln_store_client_add(c, "/kiln/round", 0, &round)) < 0)
			goto out;
		if (round > 0)
			break;
		usleep(KR_POLL_USEC);
	}
	void *text = NULL;
	size_t len;
	snprintf(key, sizeof(key), "/kiln/round/%" PRId64, round);
	if ((r = kiln_store_client_get(c, key, &text, &len)) < 0)
		goto out;
	rdzv_round rd;
	r = rdzv_round_parse(text, &rd);
	free(text);
	if (r < 0)
		goto out;
	const rdzv_member *me = rdzv_round_find(&rd, (uint32_t) s->id);
	if (!me || me->rank_base != s->id) {
		r = -EBADMSG;
		rdzv_round_free(&rd);
		goto out;
	}
	uint32_t n = rd.n;
	rdzv_round_free(&rd);
	s->round_usec = kiln_now_usec() - t_start;
	snprintf(key, sizeof(key), "/kiln/round/%" PRId64 "/barrier", round);
	int64_t v = 0;
	if ((r = kiln_store_client_add(c, key, 1, &v)) < 0)
		goto out;
	while (v < (int64_t) n) {
		usleep(KR_POLL_USEC);
		if ((r = kiln_store_client_add(c, key, 0, &v)) < 0)
			goto out;
	}
	s->barrier_usec = kiln_now_usec() - t_start;
	snprintf(info, sizeof(info), "%zu %" PRId64 "\n", s->id, round);
	r = kiln_store_client_append(c, "/kiln/done", info, strlen(info));
out:
	kiln_store_client_free(c);
	return r;
}

static void *thread_main(void *p)
{
	sim *s = p;
	s->err = run_agent(s);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: kiln-run-bench PORT N  (with %s set)\n", KR_ENV_SECRET);
		return 2;
	}
	int v;
	if (kiln_parse_int(argv[1], 1, 65535, &v) < 0)
		return 2;
	port = (uint16_t) v;
	if (kiln_parse_int(argv[2], 2, 65536, &v) < 0)
		return 2;
	nagents = (size_t) v;
	secret = getenv(KR_ENV_SECRET);
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < nagents + 64) {
		rl.rlim_cur = MIN(rl.rlim_max, (rlim_t) nagents + 64);
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	size_t n = nagents - 1; /* node 0 is the real kiln-run */
	sim *s = calloc(n, sizeof(*s));
	pthread_t *t = calloc(n, sizeof(*t));
	if (!s || !t)
		return 1;
	pthread_barrier_init(&go, NULL, (unsigned) n + 1);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	for (size_t i = 0; i < n; i++) {
		s[i].id = i + 1;
		if (pthread_create(&t[i], &attr, thread_main, &s[i]) != 0) {
			fprintf(stderr, "pthread_create failed at %zu\n", i);
			return 1;
		}
	}
	/* Every thread is connected; start the clock and let them join. */
	t_start = kiln_now_usec();
	pthread_barrier_wait(&go);
	uint64_t worst_round = 0, worst_barrier = 0;
	int errs = 0;
	for (size_t i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		if (s[i].err < 0) {
			if (errs++ < 3)
				fprintf(stderr, "agent %zu: %s\n", s[i].id, strerror(-s[i].err));
			continue;
		}
		worst_round = MAX(worst_round, s[i].round_usec);
		worst_barrier = MAX(worst_barrier, s[i].barrier_usec);
	}
	printf("agents %zu join_to_round_ms %.1f barrier_ms %.1f errors %d\n", nagents,
	       (double) worst_round / 1000.0, (double) worst_barrier / 1000.0, errs);
	free(s);
	free(t);
	return errs ? 1 : 0;
}
