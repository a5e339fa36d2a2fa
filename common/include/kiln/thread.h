/* kiln/thread.h — small pthread helpers kiln's threads share.  Header
 * only. */
#pragma once

#include <pthread.h>

/* Initialises c to time its waits on CLOCK_MONOTONIC: a watchdog's or a
 * worker's idle wake-ups must not jump with the wall clock.  Returns 0 or
 * a positive error number, as pthread_cond_init(). */
static inline int kiln_cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t ca;
	int r = pthread_condattr_init(&ca);
	if (r != 0)
		return r;
	r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (r == 0)
		r = pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
	return r;
}
