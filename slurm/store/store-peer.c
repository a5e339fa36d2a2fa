/* store-peer.c — the uid behind a local TCP peer, through sock_diag (see
 * kiln/store.h).
 *
 * One request per lookup, not a dump: SOCK_DIAG_BY_FAMILY with the exact
 * four-tuple of the peer's socket (its local end is our remote end) makes
 * the kernel look up that one socket (inet_diag_find_one_icsk) and answer
 * one inet_diag_msg, or NLMSG_ERROR -ENOENT.  The server and the relay keep
 * one netlink socket each (kiln_store_peer_uid_via(), used by one thread at
 * a time); a lookup then costs ~10 us, paid once per accepted connection. */
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "kiln/macro.h"
#include "kiln/store.h"

/* The kernel answers at once; this only bounds a kernel that does not. */
#define PEER_LOOKUP_TIMEOUT_USEC (500 * 1000)

int kiln_store_diag_open(void)
{
	int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return -errno;
	struct timeval tv = { .tv_sec = 0, .tv_usec = PEER_LOOKUP_TIMEOUT_USEC };
	setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return nl;
}

int kiln_store_peer_uid(int fd, uid_t *ret_uid)
{
	int nl = kiln_store_diag_open();
	if (nl < 0)
		return nl;
	int r = kiln_store_peer_uid_via(nl, fd, ret_uid);
	close(nl);
	return r;
}

int kiln_store_peer_uid_via(int nl, int fd, uid_t *ret_uid)
{
	struct sockaddr_in self, peer;
	socklen_t sl = sizeof(self), pl = sizeof(peer);
	if (getsockname(fd, (struct sockaddr *) &self, &sl) < 0 ||
	    getpeername(fd, (struct sockaddr *) &peer, &pl) < 0)
		return -errno;
	if (self.sin_family != AF_INET || peer.sin_family != AF_INET)
		return -EAFNOSUPPORT;

	/* a sequence number per lookup, so that a late answer to an earlier
	 * lookup that timed out on this socket is never taken for this one */
	static atomic_uint seq_next;
	unsigned seq = atomic_fetch_add(&seq_next, 1) + 1;
	struct {
		struct nlmsghdr nh;
		struct inet_diag_req_v2 r;
	} req = {
		.nh = { .nlmsg_len = sizeof(req),
			.nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST,
			.nlmsg_seq = seq },
		.r = { .sdiag_family = AF_INET,
		       .sdiag_protocol = IPPROTO_TCP,
		       .idiag_states = ~0u,
		       /* the peer's socket: its local end is our remote end */
		       .id = { .idiag_sport = peer.sin_port,
			       .idiag_dport = self.sin_port,
			       .idiag_src = { peer.sin_addr.s_addr },
			       .idiag_dst = { self.sin_addr.s_addr },
			       .idiag_cookie = { INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE } } },
	};
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	int r;
	if (sendto(nl, &req, sizeof(req), 0, (struct sockaddr *) &kernel, sizeof(kernel)) < 0) {
		r = -errno;
		goto out;
	}
	for (;;) {
		union {
			struct nlmsghdr nh;
			char b[8192];
		} buf;
		ssize_t n = recv(nl, &buf, sizeof(buf), 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = errno == EAGAIN ? -ETIMEDOUT : -errno;
			goto out;
		}
		for (struct nlmsghdr *h = &buf.nh; NLMSG_OK(h, (size_t) n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_seq != seq)
				continue;
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);
				if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*e))) {
					r = -EBADMSG;
					goto out;
				}
				/* no such socket here: a remote peer */
				r = e->error == -ENOENT ? 0 : (e->error ? e->error : -EBADMSG);
				goto out;
			}
			if (h->nlmsg_type == NLMSG_DONE) {
				r = 0;
				goto out;
			}
			if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
				continue;
			const struct inet_diag_msg *m = NLMSG_DATA(h);
			if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*m))) {
				r = -EBADMSG;
				goto out;
			}
			/* A socket that no file refers to any more (inode 0: its
			 * process closed it; a time-wait entry reports uid 0) or
			 * one that is not an established connection (a listener
			 * on the same port) says nothing about who sent the
			 * bytes: refuse rather than trust its uid. */
			if (m->idiag_inode == 0 || m->idiag_state != TCP_ESTABLISHED) {
				r = -EPERM;
				goto out;
			}
			*ret_uid = (uid_t) m->idiag_uid;
			r = 1;
			goto out;
		}
	}
out:
	return r;
}
