/* net.h — blocking-free socket steps bounded by a deadline, for clients
 * that must never hang on a dead peer (kiln status, kiln-run's store
 * client).  Deadlines are absolute kiln_now_usec() times. */
#pragma once

#include <stdint.h>
#include <sys/socket.h>

/* Waits until fd is ready for events (POLLIN/POLLOUT), retrying EINTR.
 * Returns 0; -ETIMEDOUT past deadline; -errno from poll. */
int kiln_wait_fd(int fd, short events, uint64_t deadline);

/* connect() of a non-blocking fd to sa, finished before deadline.
 * Returns 0; the connection's error (-ECONNREFUSED ...); -ETIMEDOUT. */
int kiln_connect_deadline(int fd, const struct sockaddr *sa, socklen_t len, uint64_t deadline);
