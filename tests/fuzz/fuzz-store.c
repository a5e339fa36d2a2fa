/* fuzz-store.c — libFuzzer target for the store's request parser.
 *
 * Feeds arbitrary bytes to kiln_store_parse() the way the server does: in
 * one dialect-deciding stream, request after request, and checks the
 * parser's promises: a complete request never claims more bytes than it was
 * given, every key and value lies inside the buffer and within the limits,
 * item walks end exactly at the declared count, and "need more" on a prefix
 * stays consistent with the full buffer; a relay's WORKER_HELLO is taken
 * only before the dialect is decided and leaves it undecided.  Build: make fuzz-store (clang). */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kiln/store.h"
#include "store-proto.h"

static const kiln_store_limits lim = {
	.max_key = 256,
	.max_value = 4096,
	.max_multi = 64,
	.max_msg = 16384,
};

static void in_buf(const uint8_t *buf, size_t len, kiln_store_slice s, size_t max)
{
	if (!s.p) {
		assert(s.len == 0);
		return;
	}
	assert(s.p >= buf && s.p + s.len <= buf + len);
	assert(s.len <= max);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_store_dialect d = KILN_STORE_DIALECT_UNKNOWN;
	size_t off = 0;
	while (off < size) {
		kiln_store_msg m;
		size_t used = 0;
		kiln_store_dialect before = d;
		int r = kiln_store_parse(data + off, size - off, &d, &lim, &m, &used);
		if (r <= 0) {
			assert(r == 0 || r == -EBADMSG || r == -E2BIG || r == -EMSGSIZE);
			break;
		}
		assert(used > 0 && used <= size - off && used <= lim.max_msg);
		if (m.op == KILN_STORE_OP_WORKER_HELLO) {
			/* a relay's hello: only while the dialect is undecided,
			 * and it leaves it undecided */
			assert(before == KILN_STORE_DIALECT_UNKNOWN &&
			       d == KILN_STORE_DIALECT_UNKNOWN);
			in_buf(data + off, used, m.value, KILN_STORE_SECRET_MAX);
			off += used;
			continue;
		}
		assert(d != KILN_STORE_DIALECT_UNKNOWN);
		assert(m.op < _KILN_STORE_OP_MAX);
		if (m.op == KILN_STORE_OP_VALIDATE)
			assert(before == KILN_STORE_DIALECT_UNKNOWN && d == KILN_STORE_DIALECT_V2);

		/* any strict prefix of a complete request is "need more" (or,
		 * for the first request, may still decide the dialect) */
		if (used > 1) {
			kiln_store_dialect d2 = before;
			kiln_store_msg m2;
			size_t u2;
			int r2 = kiln_store_parse(data + off, used - 1, &d2, &lim, &m2, &u2);
			assert(r2 == 0 || (r2 == 1 && before == KILN_STORE_DIALECT_UNKNOWN));
		}
		in_buf(data + off, used, m.key, lim.max_key);
		in_buf(data + off, used, m.value, lim.max_value);
		in_buf(data + off, used, m.value2, lim.max_value);
		if (m.items) {
			kiln_store_items it;
			kiln_store_slice k, v;
			uint64_t n = 0;
			kiln_store_items_init(&it, &m);
			while (kiln_store_items_next(&it, &k, &v)) {
				in_buf(data + off, used, k, lim.max_key);
				in_buf(data + off, used, v, lim.max_value);
				n++;
			}
			assert(n == m.n && n <= lim.max_multi);
			assert(it.left == 0);
		}
		off += used;
	}
	return 0;
}
