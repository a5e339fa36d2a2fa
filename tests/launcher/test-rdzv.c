/* test-rdzv.c — unit tests of kiln-run's rendezvous state machine (rdzv.c).
 *
 * Drives rdzv_leader with a fake clock: MIN then last call up to MAX, ranks
 * in node order, new rounds on death / failure / new joiner, blame for
 * failures caused by a death, restart budget with exponential backoff,
 * exclusion after K failures, join timeout naming the missing nodes, and
 * the round text round trip (including malformed input). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/parse.h"
#include "rdzv.h"

#define S  KILN_USEC_PER_SEC
#define MS KILN_USEC_PER_MSEC

static void params(rdzv_params *p, unsigned min, unsigned max)
{
	rdzv_params_default(p);
	p->min_nodes = min;
	p->max_nodes = max;
}

static void join(rdzv_leader *l, size_t id, unsigned nproc, uint64_t now)
{
	char host[32];
	snprintf(host, sizeof(host), "node%02zu", id + 1);
	assert_int_equal(rdzv_leader_join(l, id, host, "10.0.0.1", nproc, now), 0);
}

/* Keep every joined node's heartbeat fresh. */
static void beat(rdzv_leader *l, uint64_t now)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->nodes[i].joined)
			rdzv_leader_heartbeat(l, i, l->nodes[i].hb + 1, now);
}

static void test_min_then_last_call(void **state)
{
	rdzv_params p;
	rdzv_leader l;
	params(&p, 2, 4);
	assert_int_equal(rdzv_leader_init(&l, &p, 4, 0), 0);
	join(&l, 2, 2, 0);
	assert_int_equal(rdzv_leader_tick(&l, 1 * S), RDZV_ACT_NONE);
	join(&l, 0, 2, 1 * S);
	/* MIN reached: last call starts, no round yet. */
	assert_int_equal(rdzv_leader_tick(&l, 1 * S), RDZV_ACT_NONE);
	assert_int_equal(l.phase, RDZV_LAST_CALL);
	beat(&l, 5 * S);
	join(&l, 3, 1, 5 * S);
	assert_int_equal(rdzv_leader_tick(&l, 5 * S), RDZV_ACT_NONE);
	beat(&l, 10 * S);
	assert_int_equal(rdzv_leader_tick(&l, 10 * S), RDZV_ACT_NONE);
	beat(&l, 11 * S);
	assert_int_equal(rdzv_leader_tick(&l, 11 * S + 1), RDZV_ACT_ROUND);
	assert_int_equal(l.round, 1);
	rdzv_round r;
	assert_int_equal(rdzv_round_from_leader(&l, &r), 0);
	/* Ranks in node order (0, 2, 3), not join order (2, 0, 3). */
	assert_int_equal(r.n, 3);
	assert_int_equal(r.world_size, 5);
	assert_int_equal(r.m[0].id, 0);
	assert_int_equal(r.m[0].rank_base, 0);
	assert_int_equal(r.m[1].id, 2);
	assert_int_equal(r.m[1].rank_base, 2);
	assert_int_equal(r.m[2].id, 3);
	assert_int_equal(r.m[2].rank_base, 4);
	assert_int_equal(r.m[2].group_rank, 2);
	rdzv_round_free(&r);
	rdzv_leader_done(&l);
}

static void test_max_ends_last_call(void **state)
{
	rdzv_params p;
	rdzv_leader l;
	params(&p, 1, 3);
	assert_int_equal(rdzv_leader_init(&l, &p, 5, 0), 0);
	for (size_t i = 0; i < 5; i++)
		join(&l, i, 1, 0);
	assert_int_equal(rdzv_leader_tick(&l, 1), RDZV_ACT_ROUND);
	/* At most MAX members: the first three in node order. */
	assert_int_equal(l.n_members, 3);
	assert_true(l.member[0] && l.member[1] && l.member[2] && !l.member[3]);
	rdzv_leader_done(&l);
}

static uint64_t start_round(rdzv_leader *l, size_t n, unsigned min, unsigned max)
{
	rdzv_params p;
	params(&p, min, max);
	p.last_call_usec = 0;
	assert_int_equal(rdzv_leader_init(l, &p, n, 0), 0);
	for (size_t i = 0; i < n; i++)
		join(l, i, 2, 0);
	assert_int_equal(rdzv_leader_tick(l, 1), RDZV_ACT_ROUND);
	return 1;
}

static void test_death_new_round_not_counted(void **state)
{
	rdzv_leader l;
	uint64_t t = start_round(&l, 4, 2, 4);
	t += S;
	beat(&l, t);
	/* Node 2's liveness connection closes; its peers' workers then fail. */
	rdzv_leader_lost(&l, 1, t);
	rdzv_leader_worker_failed(&l, 0, 1, 1, t + 10 * MS);
	rdzv_leader_worker_failed(&l, 2, 1, 1, t + 12 * MS);
	assert_int_equal(rdzv_leader_tick(&l, t + 20 * MS), RDZV_ACT_NONE);
	assert_int_equal(rdzv_leader_tick(&l, t + l.p.settle_usec + 1), RDZV_ACT_ROUND);
	assert_int_equal(l.round, 2);
	assert_int_equal(l.n_members, 3);
	assert_int_equal(l.restarts, 0); /* blamed on the death */
	assert_int_equal(l.nodes[0].failures, 0);
	rdzv_round r;
	assert_int_equal(rdzv_round_from_leader(&l, &r), 0);
	assert_int_equal(r.world_size, 6);
	/* Survivors keep their order: node 0, 2, 3 -> group ranks 0, 1, 2. */
	assert_int_equal(r.m[1].id, 2);
	assert_int_equal(r.m[1].group_rank, 1);
	rdzv_round_free(&r);
	rdzv_leader_done(&l);
}

static void test_heartbeat_timeout(void **state)
{
	rdzv_leader l;
	uint64_t t = start_round(&l, 3, 2, 3);
	for (int i = 1; i <= 4; i++) {
		t = (uint64_t) i * S;
		for (size_t k = 0; k < 2; k++)
			rdzv_leader_heartbeat(&l, k, i, t);
		assert_int_equal(rdzv_leader_tick(&l, t), RDZV_ACT_NONE);
	}
	/* Node 3 has been silent since 0: dead after 5 s. */
	t = 5 * S + 1;
	for (size_t k = 0; k < 2; k++)
		rdzv_leader_heartbeat(&l, k, 5, t);
	assert_int_equal(rdzv_leader_tick(&l, t), RDZV_ACT_NONE);
	assert_false(l.nodes[2].joined);
	assert_int_equal(rdzv_leader_tick(&l, t + l.p.settle_usec), RDZV_ACT_ROUND);
	assert_int_equal(l.n_members, 2);
	assert_non_null(strstr(l.reason, "node03"));
	rdzv_leader_done(&l);
}

static void test_failure_budget_backoff_exclusion(void **state)
{
	rdzv_leader l;
	uint64_t t = start_round(&l, 3, 1, 3);
	l.p.max_restarts = 2;
	l.p.exclude_after = 2;
	uint64_t settle = l.p.settle_usec, base = l.p.backoff_base_usec;

	/* Failure 1 on node 1: backoff base, then round 2. */
	t = 1 * S;
	beat(&l, t);
	rdzv_leader_worker_failed(&l, 1, 1, 3, t);
	rdzv_leader_worker_failed(&l, 0, 1, 1, t); /* a peer: counted once */
	assert_int_equal(rdzv_leader_tick(&l, t + settle), RDZV_ACT_NONE);
	assert_int_equal(l.restarts, 1);
	assert_int_equal(rdzv_leader_tick(&l, t + settle + base - 1), RDZV_ACT_NONE);
	assert_int_equal(rdzv_leader_tick(&l, t + settle + base), RDZV_ACT_ROUND);
	assert_int_equal(l.nodes[1].failures, 1);
	assert_int_equal(l.nodes[0].failures, 0);

	/* Stale report for round 1 is ignored. */
	t += 2 * S;
	beat(&l, t);
	rdzv_leader_worker_failed(&l, 1, 1, 3, t);
	assert_int_equal(rdzv_leader_tick(&l, t), RDZV_ACT_NONE);
	assert_int_equal(l.phase, RDZV_RUNNING);

	/* Failure 2 on node 1: backoff doubles, node 1 excluded. */
	rdzv_leader_worker_failed(&l, 1, 2, 3, t);
	assert_int_equal(rdzv_leader_tick(&l, t + settle), RDZV_ACT_NONE);
	assert_true(l.nodes[1].excluded);
	assert_int_equal(rdzv_leader_tick(&l, t + settle + 2 * base - 1), RDZV_ACT_NONE);
	beat(&l, t + settle + 2 * base);
	assert_int_equal(rdzv_leader_tick(&l, t + settle + 2 * base), RDZV_ACT_ROUND);
	assert_int_equal(l.n_members, 2);
	assert_false(l.member[1]);

	/* Failure 3 exceeds max_restarts 2: fail with the worker's code. */
	t += 10 * S;
	beat(&l, t);
	rdzv_leader_worker_failed(&l, 2, 3, 42, t);
	assert_int_equal(rdzv_leader_tick(&l, t + settle), RDZV_ACT_FAIL);
	assert_int_equal(l.exit_code, 42);
	rdzv_leader_done(&l);
}

static void test_success(void **state)
{
	rdzv_leader l;
	start_round(&l, 2, 2, 2);
	rdzv_leader_worker_done(&l, 0, 1, 10);
	assert_int_equal(rdzv_leader_tick(&l, 20), RDZV_ACT_NONE);
	rdzv_leader_worker_done(&l, 1, 0, 30); /* wrong round */
	assert_int_equal(rdzv_leader_tick(&l, 40), RDZV_ACT_NONE);
	rdzv_leader_worker_done(&l, 1, 1, 50);
	assert_int_equal(rdzv_leader_tick(&l, 60), RDZV_ACT_SUCCESS);
	assert_int_equal(l.exit_code, 0);
	rdzv_leader_done(&l);
}

static void test_scale_up(void **state)
{
	rdzv_leader l;
	rdzv_params p;
	params(&p, 2, 4);
	p.last_call_usec = 1 * S;
	assert_int_equal(rdzv_leader_init(&l, &p, 4, 0), 0);
	for (size_t i = 0; i < 3; i++)
		join(&l, i, 1, 0);
	assert_int_equal(rdzv_leader_tick(&l, 1), RDZV_ACT_NONE);
	beat(&l, 1 * S + 1);
	assert_int_equal(rdzv_leader_tick(&l, 1 * S + 1), RDZV_ACT_ROUND);
	assert_int_equal(l.n_members, 3);
	beat(&l, 3 * S);
	join(&l, 3, 1, 3 * S);
	assert_int_equal(rdzv_leader_tick(&l, 3 * S), RDZV_ACT_NONE);
	assert_int_equal(rdzv_leader_tick(&l, 3 * S + p.settle_usec), RDZV_ACT_ROUND);
	assert_int_equal(l.n_members, 4);
	assert_int_equal(l.restarts, 0);
	rdzv_leader_done(&l);
}

static void test_join_timeout_names_missing(void **state)
{
	rdzv_params p;
	rdzv_leader l;
	params(&p, 3, 4);
	p.join_timeout_usec = 30 * S;
	assert_int_equal(rdzv_leader_init(&l, &p, 4, 0), 0);
	join(&l, 0, 1, 0);
	join(&l, 2, 1, 0);
	for (uint64_t t = 1; t < 30; t++) {
		beat(&l, t * S);
		assert_int_equal(rdzv_leader_tick(&l, t * S), RDZV_ACT_NONE);
	}
	beat(&l, 30 * S);
	assert_int_equal(rdzv_leader_tick(&l, 30 * S), RDZV_ACT_TIMEOUT);
	assert_non_null(strstr(l.reason, "2 of the required 3"));
	assert_non_null(strstr(l.reason, "node#1"));
	assert_non_null(strstr(l.reason, "node#3"));
	assert_null(strstr(l.reason, "node01"));
	rdzv_leader_done(&l);
}

static void test_below_min_after_loss(void **state)
{
	rdzv_leader l;
	uint64_t t = start_round(&l, 2, 2, 2);
	l.p.join_timeout_usec = 10 * S;
	rdzv_leader_lost(&l, 1, t);
	assert_int_equal(rdzv_leader_tick(&l, t + l.p.settle_usec), RDZV_ACT_NONE);
	assert_int_equal(l.phase, RDZV_WAIT_MIN);
	/* The node comes back: a new round at once (no last call). */
	beat(&l, 2 * S);
	join(&l, 1, 2, 2 * S);
	assert_int_equal(rdzv_leader_tick(&l, 2 * S), RDZV_ACT_ROUND);
	assert_int_equal(l.round, 2);
	/* Lost again, and nobody returns within the join timeout. */
	rdzv_leader_lost(&l, 1, 3 * S);
	uint64_t t2 = 3 * S + l.p.settle_usec;
	beat(&l, t2);
	assert_int_equal(rdzv_leader_tick(&l, t2), RDZV_ACT_NONE);
	for (uint64_t s = 4; s < 13; s++) {
		beat(&l, s * S);
		assert_int_equal(rdzv_leader_tick(&l, s * S), RDZV_ACT_NONE);
	}
	beat(&l, 14 * S);
	assert_int_equal(rdzv_leader_tick(&l, 14 * S), RDZV_ACT_TIMEOUT);
	rdzv_leader_done(&l);
}

static void test_round_text(void **state)
{
	rdzv_leader l;
	start_round(&l, 3, 1, 3);
	rdzv_round r, q;
	char *text = NULL;
	assert_int_equal(rdzv_round_from_leader(&l, &r), 0);
	assert_int_equal(rdzv_round_format(&r, &text), 0);
	assert_int_equal(rdzv_round_parse(text, &q), 0);
	assert_int_equal(q.round, r.round);
	assert_int_equal(q.world_size, 6);
	assert_int_equal(q.n, 3);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(q.m[i].id, r.m[i].id);
		assert_int_equal(q.m[i].rank_base, r.m[i].rank_base);
		assert_string_equal(q.m[i].host, r.m[i].host);
		assert_string_equal(q.m[i].addr, r.m[i].addr);
	}
	assert_non_null(rdzv_round_find(&q, 2));
	assert_null(rdzv_round_find(&q, 7));
	rdzv_round_free(&q);

	static const char *bad[] = {
		"",
		"round 1 world 2 n 1\n0 0 0 1 h 1.2.3.4\n",	   /* world mismatch */
		"round 1 world 2 n 2\n0 0 0 1 h a\n0 1 1 1 h a\n", /* ids not increasing */
		"round 1 world 2 n 2\n0 0 0 1 h a\n1 1 5 1 h a\n", /* rank gap */
		"round 1 world 0 n 0\n",
		"round 1 world 1 n 1\n0 0 0 0 h a\n", /* nproc 0 */
		"round 1 world 1 n 1\n0 0 0 1 h\n",   /* truncated */
		"round x",
		"round 1 world 1 n 1\n0 0 0 1 h a\nextra\n",	/* trailing garbage */
		"round 1 world 1 n 1\n0 0 0 1 h a b\n",		/* extra field */
		"round 1 world 1 n 1\n0 0 0 99999999999 h a\n", /* overflow */
		"round 1 world 1 n 1\n0 0 0 1 "
		"hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh a\n", /* host >
											    63 */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(rdzv_round_parse(bad[i], &q), -EINVAL);
	free(text);
	rdzv_round_free(&r);
	rdzv_leader_done(&l);
}

static void test_exclusion_below_min_fails(void **state)
{
	rdzv_leader l;
	uint64_t t = start_round(&l, 1, 1, 1);
	l.p.exclude_after = 1;
	rdzv_leader_worker_failed(&l, 0, 1, 9, t);
	assert_int_equal(rdzv_leader_tick(&l, t + l.p.settle_usec), RDZV_ACT_FAIL);
	assert_int_equal(l.exit_code, 9);
	assert_non_null(strstr(l.reason, "excluded"));
	rdzv_leader_done(&l);
}

static void test_bad_args(void **state)
{
	rdzv_params p;
	rdzv_leader l;
	params(&p, 3, 2);
	assert_int_equal(rdzv_leader_init(&l, &p, 4, 0), -EINVAL);
	params(&p, 1, 2);
	assert_int_equal(rdzv_leader_init(&l, &p, 0, 0), -EINVAL);
	assert_int_equal(rdzv_leader_init(&l, &p, 2, 0), 0);
	assert_int_equal(rdzv_leader_join(&l, 2, "h", "a", 1, 0), -EINVAL);
	assert_int_equal(rdzv_leader_join(&l, 0, "h", "a", 0, 0), -EINVAL);
	assert_int_equal(rdzv_leader_join(&l, 0, "h", "a", RDZV_MAX_NPROC + 1, 0), -EINVAL);
	rdzv_leader_done(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_min_then_last_call),
		cmocka_unit_test(test_max_ends_last_call),
		cmocka_unit_test(test_death_new_round_not_counted),
		cmocka_unit_test(test_heartbeat_timeout),
		cmocka_unit_test(test_failure_budget_backoff_exclusion),
		cmocka_unit_test(test_success),
		cmocka_unit_test(test_scale_up),
		cmocka_unit_test(test_join_timeout_names_missing),
		cmocka_unit_test(test_below_min_after_loss),
		cmocka_unit_test(test_round_text),
		cmocka_unit_test(test_exclusion_below_min_fails),
		cmocka_unit_test(test_bad_args),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
