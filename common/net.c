/* net.c — socket steps bounded by a deadline (kiln/net.h). */
#include <errno.h>
#include <poll.h>
#include <stdint.h>

#include "kiln/macro.h"
#include "kiln/net.h"
#include "kiln/parse.h"

int kiln_wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		uint64_t now = kiln_now_usec();
		if (now >= deadline)
			return -ETIMEDOUT;
		uint64_t left = deadline - now;
		struct pollfd p = { .fd = fd, .events = events };
		int r = poll(&p, 1, (int) MIN(DIV_ROUND_UP(left, 1000), (uint64_t) INT32_MAX));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r > 0)
			return 0;
	}
}

int kiln_connect_deadline(int fd, const struct sockaddr *sa, socklen_t len, uint64_t deadline)
{
	if (connect(fd, sa, len) == 0)
		return 0;
	if (errno != EINPROGRESS)
		return -errno;
	int r = kiln_wait_fd(fd, POLLOUT, deadline);
	if (r < 0)
		return r;
	int err = 0;
	socklen_t l = sizeof(err);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
		return -errno;
	return -err;
}
