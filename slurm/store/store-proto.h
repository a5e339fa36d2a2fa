/* store-proto.h — the TCPStore wire protocol as pure functions over bytes.
 *
 * Private to the store (server, client, fuzzer, tests).  The parser never
 * allocates and never reads past the buffer it is given: it either returns a
 * complete request whose keys and values point into that buffer, says it
 * needs more bytes, or rejects the input.  Every length is checked against
 * the limits before anything else looks at it, which is what makes a hostile
 * peer (random bytes, lengths of 2^63) cost nothing but its connection.
 *
 * Wire format (PyTorch's, native byte order = little-endian on every machine
 * kiln runs on): a request is a uint8 query type followed by its arguments;
 * strings and byte vectors are a uint64 length then the bytes; ADD carries an
 * int64; CHECK/WAIT/MULTI_GET carry a uint64 count then that many strings;
 * MULTI_SET a uint64 count then key, value pairs; PING a uint32 nonce;
 * VALIDATE a uint32 magic.  torch 1.13 numbers the queries differently and
 * sends no VALIDATE; see kiln_store_dialect. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Requests, numbered as torch 2.x numbers them on the wire. */
typedef enum kiln_store_op {
	KILN_STORE_OP_VALIDATE = 0,
	KILN_STORE_OP_SET = 1,
	KILN_STORE_OP_COMPARE_SET = 2,
	KILN_STORE_OP_GET = 3,
	KILN_STORE_OP_ADD = 4,
	KILN_STORE_OP_CHECK = 5,
	KILN_STORE_OP_WAIT = 6,
	KILN_STORE_OP_GETNUMKEYS = 7,
	KILN_STORE_OP_DELETE_KEY = 8,
	KILN_STORE_OP_APPEND = 9,
	KILN_STORE_OP_MULTI_GET = 10,
	KILN_STORE_OP_MULTI_SET = 11,
	KILN_STORE_OP_CANCEL_WAIT = 12,
	KILN_STORE_OP_PING = 13,
	_KILN_STORE_OP_MAX,
	/* kiln's own, not torch's: a relay (kiln_store_relay) opens each
	 * upstream connection with it before the worker's first byte, so that
	 * the worker's connection is authenticated for the worker key space
	 * without the worker speaking any handshake.  Accepted only as a
	 * connection's first request, and it leaves the dialect undecided:
	 * the worker's own first request (VALIDATE or not) decides it.  Wire:
	 * the byte 'K' (no torch query is numbered 75), the uint32
	 * KILN_STORE_HELLO_MAGIC, then the job secret as a string. */
	KILN_STORE_OP_WORKER_HELLO = 0x4B,
} kiln_store_op;

/* "KLNW" read as a little-endian uint32: after 'K', so that a stray 'K'
 * byte alone is not taken for a hello. */
#define KILN_STORE_HELLO_MAGIC 0x574E4C4Bu

/* CheckResponseType and WaitResponseType, one byte each on the wire. */
#define KILN_STORE_CHECK_READY	     0
#define KILN_STORE_CHECK_NOT_READY   1
#define KILN_STORE_WAIT_STOP_WAITING 0
#define KILN_STORE_WAIT_CANCELED     1

/* Which numbering a connection speaks.  torch 1.13 (no VALIDATE):
 * SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6 WATCH_KEY=7
 * DELETE_KEY=8.  torch 2.x: kiln_store_op, always opened by VALIDATE.  A
 * connection starts UNKNOWN; its first request decides: byte 0 followed by
 * the magic is a 2.x VALIDATE (a 1.13 SET would need a key of ~1 GiB to look
 * the same, far above the key limit), anything else is 1.13. */
typedef enum kiln_store_dialect {
	KILN_STORE_DIALECT_UNKNOWN = 0,
	KILN_STORE_DIALECT_V1, /* torch < 2.0 */
	KILN_STORE_DIALECT_V2, /* torch 2.x and kiln's client */
} kiln_store_dialect;

typedef struct kiln_store_limits {
	size_t max_key;
	size_t max_value;
	size_t max_multi;
	size_t max_msg; /* largest request as a whole */
} kiln_store_limits;

typedef struct kiln_store_slice {
	const uint8_t *p;
	size_t len;
} kiln_store_slice;

typedef struct kiln_store_msg {
	kiln_store_op op;
	kiln_store_slice key;	 /* SET COMPARE_SET GET ADD DELETE_KEY APPEND */
	kiln_store_slice value;	 /* SET APPEND; COMPARE_SET: expected */
	kiln_store_slice value2; /* COMPARE_SET: desired */
	int64_t delta;		 /* ADD */
	uint32_t nonce;		 /* PING, VALIDATE (the magic) */
	uint64_t n;		 /* CHECK WAIT MULTI_GET MULTI_SET: item count */
	const uint8_t *items;	 /* first item, walk with kiln_store_items_next() */
	size_t items_len;
} kiln_store_msg;

/* Parses one request from buf[0..len).  *dialect is updated when the first
 * request decides it.  Returns 1 and fills *msg and *consumed for a complete
 * request, 0 when more bytes are needed (nothing is consumed), or:
 * -EBADMSG  unknown or unsupported query type, bad VALIDATE or hello magic, a
 *           second VALIDATE, a WORKER_HELLO that is not the first request;
 * -E2BIG    a key, value or count over the limits;
 * -EMSGSIZE the request would be larger than max_msg. */
int kiln_store_parse(const uint8_t *buf, size_t len, kiln_store_dialect *dialect,
		     const kiln_store_limits *lim, kiln_store_msg *msg, size_t *consumed);

/* Writes a WORKER_HELLO carrying secret (1..KILN_STORE_SECRET_MAX bytes)
 * into buf.  Returns its length, or -ENOBUFS when len is too small,
 * -EINVAL for a bad secret. */
int kiln_store_format_worker_hello(const char *secret, uint8_t *buf, size_t len);

/* Walks the items of a parsed CHECK/WAIT/MULTI_GET (keys) or MULTI_SET (key,
 * value pairs; value may be NULL for the others).  Returns false after the
 * last item.  Only valid on a message kiln_store_parse() accepted. */
typedef struct kiln_store_items {
	const uint8_t *p;
	size_t left;
	uint64_t n;
	bool pairs;
} kiln_store_items;
void kiln_store_items_init(kiln_store_items *it, const kiln_store_msg *msg);
bool kiln_store_items_next(kiln_store_items *it, kiln_store_slice *key, kiln_store_slice *value);

/* Wire names, for debug logs ("SET" ...); "?" when out of range. */
const char *kiln_store_op_name(kiln_store_op op);
