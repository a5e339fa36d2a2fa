/* test-store-map.c — the store's hash map (slurm/store/store-map.c) on
 * its own: insert, find, delete, growth, iteration with removal, keys with
 * NUL bytes, and hostile keys (a set built to share one bucket of one map
 * spreads out in a map with another seed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store-map.h"

typedef struct item {
	int value;
	kiln_store_map_node node;
	char key[40];
} item;

static int freed;

static void free_item(kiln_store_map_node *n)
{
	freed++;
	free(KILN_STORE_MAP_ENTRY(n, item, node));
}

static item *add(kiln_store_map *m, const void *key, size_t klen, int value)
{
	uint64_t h;
	assert_null(kiln_store_map_find(m, key, klen, &h));
	assert_true(h == kiln_store_map_hash(m, key, klen));
	item *it = calloc(1, sizeof(*it));
	assert_non_null(it);
	assert_true(klen <= sizeof(it->key));
	memcpy(it->key, key, klen);
	it->value = value;
	it->node =
		(kiln_store_map_node){ .hash = h, .key = (const uint8_t *) it->key, .klen = klen };
	kiln_store_map_add(m, &it->node);
	return it;
}

static item *find(kiln_store_map *m, const void *key, size_t klen)
{
	kiln_store_map_node *n = kiln_store_map_find(m, key, klen, NULL);
	return n ? KILN_STORE_MAP_ENTRY(n, item, node) : NULL;
}

static size_t longest_chain(const kiln_store_map *m)
{
	size_t most = 0;
	for (size_t b = 0; b < m->n_buckets; b++) {
		size_t l = 0;
		for (kiln_store_map_node *n = m->buckets[b]; n; n = n->next)
			l++;
		if (l > most)
			most = l;
	}
	return most;
}

static void test_insert_find_delete(void **state)
{
	kiln_store_map m;
	assert_int_equal(kiln_store_map_init(&m, 0), 0);
	assert_int_equal(m.n_buckets, KILN_STORE_MAP_BUCKETS_MIN);
	add(&m, "a", 1, 1);
	add(&m, "ab", 2, 2);
	add(&m, "", 0, 3);
	/* keys are bytes: a NUL inside is part of the key */
	add(&m, "a\0b", 3, 4);
	add(&m, "a\0c", 3, 5);
	assert_int_equal(m.n, 5);
	assert_int_equal(find(&m, "a", 1)->value, 1);
	assert_int_equal(find(&m, "ab", 2)->value, 2);
	assert_int_equal(find(&m, "", 0)->value, 3);
	assert_int_equal(find(&m, "a\0b", 3)->value, 4);
	assert_int_equal(find(&m, "a\0c", 3)->value, 5);
	assert_null(find(&m, "a\0", 2));
	assert_null(find(&m, "b", 1));

	item *it = find(&m, "ab", 2);
	kiln_store_map_remove(&m, &it->node);
	free(it);
	assert_int_equal(m.n, 4);
	assert_null(find(&m, "ab", 2));
	assert_int_equal(find(&m, "a", 1)->value, 1);
	add(&m, "ab", 2, 6);
	assert_int_equal(find(&m, "ab", 2)->value, 6);

	freed = 0;
	kiln_store_map_done(&m, free_item);
	assert_int_equal(freed, 5);
	assert_null(m.buckets);
	kiln_store_map_done(&m, free_item); /* twice is harmless */
	kiln_store_map_done(NULL, NULL);
}

static void test_grow(void **state)
{
	kiln_store_map m;
	assert_int_equal(kiln_store_map_init(&m, 100), 0);
	assert_int_equal(m.n_buckets, 128); /* rounded up to a power of two */
	enum { N = 50000 };
	char key[40];
	for (int i = 0; i < N; i++) {
		int l = snprintf(key, sizeof(key), "/kiln/hb/%d", i);
		add(&m, key, (size_t) l, i);
		assert_true(m.n <= m.n_buckets); /* grown at load factor 1 */
	}
	assert_int_equal(m.n, N);
	assert_true(m.n_buckets >= N && m.n_buckets < 2 * (size_t) N);
	assert_true(longest_chain(&m) <= 12);
	for (int i = 0; i < N; i++) {
		int l = snprintf(key, sizeof(key), "/kiln/hb/%d", i);
		item *it = find(&m, key, (size_t) l);
		assert_non_null(it);
		assert_int_equal(it->value, i);
	}
	/* Delete the even ones while iterating (the iterator allows removing
	 * the node it returned). */
	kiln_store_map_iter iter = { 0 };
	size_t seen = 0;
	for (kiln_store_map_node *n; (n = kiln_store_map_next(&m, &iter));) {
		item *it = KILN_STORE_MAP_ENTRY(n, item, node);
		seen++;
		if (it->value % 2 == 0) {
			kiln_store_map_remove(&m, n);
			free(it);
		}
	}
	assert_int_equal(seen, N);
	assert_int_equal(m.n, N / 2);
	for (int i = 0; i < N; i++) {
		int l = snprintf(key, sizeof(key), "/kiln/hb/%d", i);
		item *it = find(&m, key, (size_t) l);
		if (i % 2)
			assert_true(it && it->value == i);
		else
			assert_null(it);
	}
	freed = 0;
	kiln_store_map_done(&m, free_item);
	assert_int_equal(freed, N / 2);
}

/* An attacker who learned one map's bucket function can pick keys that all
 * share a bucket there; the seed makes that knowledge worthless for the
 * next map (every store has its own).  Keys differ only in their last
 * three bytes, the weakest pattern for an unfinalised FNV. */
static void test_hostile_keys(void **state)
{
	kiln_store_map a, b;
	assert_int_equal(kiln_store_map_init(&a, 0), 0);
	assert_int_equal(kiln_store_map_init(&b, 0), 0);
	assert_true(a.seed != b.seed);
	enum { K = 64 };
	char keys[K][24];
	int n = 0;
	uint64_t target = kiln_store_map_hash(&a, "/kiln/x/\0\0\0", 11) & 1023;
	for (int i = 0; i < (1 << 24) && n < K; i++) {
		char k[24] = "/kiln/x/";
		k[8] = (char) (i >> 16);
		k[9] = (char) (i >> 8);
		k[10] = (char) i;
		if ((kiln_store_map_hash(&a, k, 11) & 1023) == target)
			memcpy(keys[n++], k, 11);
	}
	assert_int_equal(n, K); /* 1/1024 a try: ~65536 tries */
	for (int i = 0; i < K; i++)
		add(&b, keys[i], 11, i);
	/* In b they spread: 64 keys over >= 64 buckets. */
	assert_true(longest_chain(&b) <= 8);
	for (int i = 0; i < K; i++)
		assert_int_equal(find(&b, keys[i], 11)->value, i);
	kiln_store_map_done(&b, free_item);
	kiln_store_map_done(&a, free_item);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_insert_find_delete),
		cmocka_unit_test(test_grow),
		cmocka_unit_test(test_hostile_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
