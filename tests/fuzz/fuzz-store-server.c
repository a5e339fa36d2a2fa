/* fuzz-store-server.c — libFuzzer target for the whole store server, not
 * just its parser: requests from the input reach a real server over real
 * loopback sockets, so request handling, waiter bookkeeping, entry garbage
 * collection, buffer caps and connection teardown all run under ASan/UBSan.
 *
 * Input: records of [connection (1 byte)][length (1 byte)][bytes].  Length 0
 * closes that connection (a new one opens on its next record); the record's
 * connection byte also picks the dialect opener (VALIDATE or not) of a new
 * connection, and bit 0x40 of the input's first byte turns require_auth on
 * (records may open with a relay's WORKER_HELLO, secret "s3cret").  After
 * each record the server handles what arrived.  The store's limits are set
 * small so that the limit paths are reached. */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kiln/store.h"
#include "store-proto.h"

#define CONNS 4

static int open_conn(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	return fd;
}

static void drain(int fd)
{
	char b[65536];
	while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
		;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_store_server_opts o;
	kiln_store_server_opts_init(&o);
	o.bind_address = "127.0.0.1";
	o.secret = "s3cret";
	o.max_key = 64;
	o.max_value = 512;
	o.max_multi = 8;
	o.max_conn_buf = 2048;
	o.max_total_bytes = 4096;
	o.max_total_buf = 16384;
	/* bit 0x40 of the first byte: kiln-run's setting, where every
	 * connection must present the secret or a relay's hello */
	o.require_auth = size > 0 && (data[0] & 0x40);
	kiln_store_server *s = NULL;
	if (kiln_store_server_new(&o, &s) < 0)
		return 0;
	uint16_t port = kiln_store_server_port(s);
	int fds[CONNS];
	for (int i = 0; i < CONNS; i++)
		fds[i] = -1;

	size_t off = 0;
	while (off + 2 <= size) {
		int ci = data[off] % CONNS;
		bool v2 = data[off] & 0x80;
		size_t len = data[off + 1];
		off += 2;
		len = len < size - off ? len : size - off;
		if (len == 0) {
			if (fds[ci] >= 0)
				close(fds[ci]);
			fds[ci] = -1;
		} else {
			if (fds[ci] < 0) {
				fds[ci] = open_conn(port);
				if (v2 && fds[ci] >= 0) {
					uint8_t val[5] = { 0 };
					uint32_t magic = KILN_STORE_VALIDATE_MAGIC;
					memcpy(val + 1, &magic, 4);
					(void) !send(fds[ci], val, 5, MSG_NOSIGNAL);
				}
			}
			if (fds[ci] >= 0)
				(void) !send(fds[ci], data + off, len, MSG_NOSIGNAL | MSG_DONTWAIT);
			off += len;
		}
		/* let the server accept and handle everything sent so far */
		for (int k = 0; k < 4; k++)
			if (kiln_store_server_process(s, 0) <= 0)
				break;
		for (int i = 0; i < CONNS; i++)
			if (fds[i] >= 0)
				drain(fds[i]);
		/* the in-process API interleaved with remote traffic */
		if (off < size && data[off - 1] == 0x5a)
			kiln_store_server_set(s, "/worker/k", "1", 1);
	}
	kiln_store_server_stats st;
	kiln_store_server_get_stats(s, &st);
	assert(st.store_bytes <= o.max_total_bytes);
	assert(st.buffered_bytes <= o.max_total_buf);
	for (int i = 0; i < CONNS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	for (int k = 0; k < 4; k++)
		if (kiln_store_server_process(s, 0) <= 0)
			break;
	kiln_store_server_get_stats(s, &st);
	kiln_store_server_free(s);
	return 0;
}
