/* store-peer.h — who is at the other end of a TCP connection, when that end
 * is on this machine.
 *
 * TCP has no SO_PEERCRED; the kernel's sock_diag interface (NETLINK_SOCK_DIAG,
 * the one ss(8) uses) finds the socket at the other end of an accepted
 * connection by its four-tuple and reports the uid that created it.  The
 * store server and the relay use this to refuse a process of another user on
 * the same node (docs/store.md, "Who may connect").
 *
 * Private to libkilnstore (server, relay, tests). */
#pragma once

#include <sys/types.h>

/* Looks up the local socket at the other end of the connected IPv4 TCP
 * socket fd.  Returns 1 with *ret_uid set when it is a live socket of a
 * process on this machine (this network namespace), 0 when no local socket
 * matches (the peer is another machine), or:
 * -EPERM     a local end that no process holds any more (closed before we
 *            looked: its uid no longer says who sent the bytes), or that is
 *            not an established connection;
 * -EAFNOSUPPORT  fd is not IPv4;
 * -errno     of socket(2)/sendto/recv on the netlink socket (a kernel
 *            without CONFIG_INET_DIAG answers -ENOENT or -EPROTONOSUPPORT
 *            when the socket is opened). */
int kiln_store_peer_uid(int fd, uid_t *ret_uid);
