/* kiln/list.h — intrusive doubly-linked lists: an item carries its own
 * prev and next pointers, so unlinking needs no search and no allocation.
 * One unlink, so that each list (the HTTP server's streams, the engine's
 * waiting queue ...) does not write its own.  Header only. */
#pragma once

#include <stddef.h>

/* Unlinks item from the list whose first item is head (an lvalue), through
 * the item's prev and next fields, and clears them.  A list with a tail
 * too sets it first: if (!item->next) tail = item->prev. */
#define LIST_UNLINK(head, item)                            \
	do {                                               \
		if ((item)->prev)                          \
			(item)->prev->next = (item)->next; \
		else                                       \
			(head) = (item)->next;             \
		if ((item)->next)                          \
			(item)->next->prev = (item)->prev; \
		(item)->prev = (item)->next = NULL;        \
	} while (0)
