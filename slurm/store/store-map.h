/* store-map.h — the rendezvous store's key -> entry hash map.
 *
 * Private to the store (store-server.c and its tests).  Keys are byte
 * strings (TCPStore keys may hold NULs) chosen by network peers, so the
 * hash is seeded per map from getrandom(): a client cannot precompute keys
 * that all land in one chain (hash flooding).  Chained buckets, a power of
 * two of them, doubled when the map holds more nodes than buckets.
 *
 * The map is intrusive: the caller embeds a kiln_store_map_node in its own
 * entry and owns the key bytes and the entry's memory; the map never
 * allocates per entry (only its bucket array), so adding never fails.
 * No locking: the server's mutex covers the map. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Buckets a new map starts with (grown, never shrunk). */
#define KILN_STORE_MAP_BUCKETS_MIN 16u

typedef struct kiln_store_map_node {
	struct kiln_store_map_node *next;
	uint64_t hash;
	const uint8_t *key; /* klen bytes, owned by the caller, unchanged while in the map */
	size_t klen;
} kiln_store_map_node;

typedef struct kiln_store_map {
	kiln_store_map_node **buckets;
	size_t n_buckets; /* a power of two */
	size_t n;	  /* nodes in the map */
	uint64_t seed;
} kiln_store_map;

/* The caller's struct around a node: KILN_STORE_MAP_ENTRY(n, entry, node). */
#define KILN_STORE_MAP_ENTRY(n, type, member) ((type *) ((char *) (n) -offsetof(type, member)))

/* Allocates n_buckets buckets (rounded up to a power of two, at least
 * KILN_STORE_MAP_BUCKETS_MIN) and draws the seed.  Returns 0 or -ENOMEM. */
int kiln_store_map_init(kiln_store_map *m, size_t n_buckets);

/* Frees the buckets; free_node (NULL allowed) is called on every node
 * still in the map first. */
void kiln_store_map_done(kiln_store_map *m, void (*free_node)(kiln_store_map_node *n));

/* The seeded hash of a key (what kiln_store_map_add() expects in n->hash). */
uint64_t kiln_store_map_hash(const kiln_store_map *m, const void *key, size_t klen);

/* The node holding exactly these klen bytes, or NULL.  ret_hash (NULL
 * allowed) receives the key's hash either way, for a kiln_store_map_add()
 * that follows. */
kiln_store_map_node *kiln_store_map_find(const kiln_store_map *m, const void *key, size_t klen,
					 uint64_t *ret_hash);

/* Adds n (n->key, n->klen and n->hash = kiln_store_map_hash() set by the
 * caller; the key must not be in the map yet).  Grows the bucket array
 * when the map holds more nodes than buckets; if that allocation fails
 * the chains just get longer. */
void kiln_store_map_add(kiln_store_map *m, kiln_store_map_node *n);

/* Unlinks n, which must be in the map; the caller frees it. */
void kiln_store_map_remove(kiln_store_map *m, kiln_store_map_node *n);

/* Iteration in bucket order: start with an iterator of zeros; each call
 * returns the next node or NULL at the end.  The node returned may be
 * removed (and freed) before the next call; no other change is allowed
 * during the walk. */
typedef struct kiln_store_map_iter {
	size_t bucket;
	kiln_store_map_node *next;
} kiln_store_map_iter;
kiln_store_map_node *kiln_store_map_next(const kiln_store_map *m, kiln_store_map_iter *it);
