/* store-map.c — the store's seeded, chained hash map (store-map.h).
 *
 * FNV-1a over the key bytes starting from a random seed, then the
 * splitmix64 finaliser so that the low bits (the bucket index) depend on
 * every input bit. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "store-map.h"

int kiln_store_map_init(kiln_store_map *m, size_t n_buckets)
{
	assert_return(m, -EINVAL);
	size_t nb = KILN_STORE_MAP_BUCKETS_MIN;
	while (nb < n_buckets && nb <= SIZE_MAX / 4 / sizeof(*m->buckets))
		nb *= 2;
	*m = (kiln_store_map){ .buckets = calloc(nb, sizeof(*m->buckets)), .n_buckets = nb };
	if (!m->buckets)
		return -ENOMEM;
	if (getrandom(&m->seed, sizeof(m->seed), GRND_NONBLOCK) != sizeof(m->seed))
		m->seed = (uint64_t) (uintptr_t) m ^ (uint64_t) getpid() << 32;
	return 0;
}

void kiln_store_map_done(kiln_store_map *m, void (*free_node)(kiln_store_map_node *n))
{
	if (!m)
		return;
	kiln_store_map_iter it = { 0 };
	kiln_store_map_node *n;
	while (free_node && m->buckets && (n = kiln_store_map_next(m, &it)))
		free_node(n);
	free(m->buckets);
	*m = (kiln_store_map){ 0 };
}

uint64_t kiln_store_map_hash(const kiln_store_map *m, const void *key, size_t klen)
{
	const uint8_t *p = key;
	uint64_t h = 0xcbf29ce484222325ull ^ m->seed;
	for (size_t i = 0; i < klen; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	h ^= h >> 30;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 27;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 31;
	return h;
}

kiln_store_map_node *kiln_store_map_find(const kiln_store_map *m, const void *key, size_t klen,
					 uint64_t *ret_hash)
{
	uint64_t h = kiln_store_map_hash(m, key, klen);
	if (ret_hash)
		*ret_hash = h;
	for (kiln_store_map_node *n = m->buckets[h & (m->n_buckets - 1)]; n; n = n->next)
		if (n->hash == h && n->klen == klen && memcmp(n->key, key, klen) == 0)
			return n;
	return NULL;
}

static void grow(kiln_store_map *m)
{
	size_t nb = m->n_buckets * 2;
	kiln_store_map_node **b = calloc(nb, sizeof(*b));
	if (!b)
		return; /* keep the longer chains; still correct */
	for (size_t i = 0; i < m->n_buckets; i++)
		for (kiln_store_map_node *n = m->buckets[i], *next; n; n = next) {
			next = n->next;
			n->next = b[n->hash & (nb - 1)];
			b[n->hash & (nb - 1)] = n;
		}
	free(m->buckets);
	m->buckets = b;
	m->n_buckets = nb;
}

void kiln_store_map_add(kiln_store_map *m, kiln_store_map_node *n)
{
	kiln_store_map_node **b = &m->buckets[n->hash & (m->n_buckets - 1)];
	n->next = *b;
	*b = n;
	if (++m->n > m->n_buckets)
		grow(m);
}

void kiln_store_map_remove(kiln_store_map *m, kiln_store_map_node *n)
{
	kiln_store_map_node **pp = &m->buckets[n->hash & (m->n_buckets - 1)];
	while (*pp != n)
		pp = &(*pp)->next;
	*pp = n->next;
	n->next = NULL;
	m->n--;
}

kiln_store_map_node *kiln_store_map_next(const kiln_store_map *m, kiln_store_map_iter *it)
{
	while (!it->next && it->bucket < m->n_buckets)
		it->next = m->buckets[it->bucket++];
	kiln_store_map_node *n = it->next;
	if (n)
		it->next = n->next;
	return n;
}
