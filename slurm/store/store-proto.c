/* store-proto.c — the TCPStore request parser (see store-proto.h).
 *
 * A cursor walks the buffer; each read first checks that the bytes are there
 * (else "need more") and each length is compared with its limit before it is
 * used to skip ahead, so no arithmetic on a hostile length can overflow. */
#include <errno.h>
#include <string.h>

#include "kiln/macro.h"
#include "kiln/store.h"
#include "store-proto.h"

#define MAGIC 0x3C85F7CEu

typedef struct cursor {
	const uint8_t *p;
	size_t len;
	size_t off;
	const kiln_store_limits *lim;
} cursor;

/* 1 ok, 0 need more, <0 error */
static int need(cursor *c, size_t n)
{
	if (n > c->lim->max_msg || c->off > c->lim->max_msg - n)
		return -EMSGSIZE;
	return c->len - c->off >= n ? 1 : 0;
}

/* n bytes as they are on the wire (host order, as torch's TCPStore). */
static int rd_raw(cursor *c, void *ret, size_t n)
{
	int r = need(c, n);
	if (r <= 0)
		return r;
	memcpy(ret, c->p + c->off, n);
	c->off += n;
	return 1;
}

static int rd_u64(cursor *c, uint64_t *ret)
{
	return rd_raw(c, ret, sizeof(*ret));
}

static int rd_u32(cursor *c, uint32_t *ret)
{
	return rd_raw(c, ret, sizeof(*ret));
}

/* A length-prefixed string or vector of at most max bytes. */
static int rd_bytes(cursor *c, size_t max, kiln_store_slice *ret)
{
	uint64_t n;
	int r = rd_u64(c, &n);
	if (r <= 0)
		return r;
	if (n > max)
		return -E2BIG;
	r = need(c, (size_t) n);
	if (r <= 0)
		return r;
	ret->p = c->p + c->off;
	ret->len = (size_t) n;
	c->off += (size_t) n;
	return 1;
}

static int rd_items(cursor *c, kiln_store_msg *msg, bool pairs)
{
	int r = rd_u64(c, &msg->n);
	if (r <= 0)
		return r;
	if (msg->n > c->lim->max_multi)
		return -E2BIG;
	size_t start = c->off;
	for (uint64_t i = 0; i < msg->n; i++) {
		kiln_store_slice s;
		r = rd_bytes(c, c->lim->max_key, &s);
		if (r <= 0)
			return r;
		if (pairs) {
			r = rd_bytes(c, c->lim->max_value, &s);
			if (r <= 0)
				return r;
		}
	}
	msg->items = c->p + start;
	msg->items_len = c->off - start;
	return 1;
}

/* torch 1.13 query numbers -> ours; -1 = not served. */
static const int v1_ops[] = {
	KILN_STORE_OP_SET,	  KILN_STORE_OP_COMPARE_SET, KILN_STORE_OP_GET,
	KILN_STORE_OP_ADD,	  KILN_STORE_OP_CHECK,	     KILN_STORE_OP_WAIT,
	KILN_STORE_OP_GETNUMKEYS, -1 /* WATCH_KEY */,	     KILN_STORE_OP_DELETE_KEY,
};

int kiln_store_parse(const uint8_t *buf, size_t len, kiln_store_dialect *dialect,
		     const kiln_store_limits *lim, kiln_store_msg *msg, size_t *consumed)
{
	cursor c = { .p = buf, .len = len, .off = 0, .lim = lim };
	int r;

	if (len == 0)
		return 0;
	memset(msg, 0, sizeof(*msg));
	uint8_t type = buf[0];

	if (*dialect == KILN_STORE_DIALECT_UNKNOWN && type == KILN_STORE_OP_WORKER_HELLO) {
		/* kiln's relay hello: the dialect stays undecided for the
		 * worker's own first request.  The caller refuses a second
		 * hello (the connection's auth state knows). */
		uint32_t magic;
		c.off = 1;
		if ((r = rd_u32(&c, &magic)) <= 0)
			return r;
		if (magic != KILN_STORE_HELLO_MAGIC)
			return -EBADMSG;
		if ((r = rd_bytes(&c, KILN_STORE_SECRET_MAX, &msg->value)) <= 0)
			return r;
		msg->op = KILN_STORE_OP_WORKER_HELLO;
		*consumed = c.off;
		return 1;
	}
	if (*dialect == KILN_STORE_DIALECT_UNKNOWN) {
		if (type == KILN_STORE_OP_VALIDATE) {
			uint32_t magic;
			if (len < 5)
				return 0;
			memcpy(&magic, buf + 1, 4);
			if (magic == MAGIC) {
				*dialect = KILN_STORE_DIALECT_V2;
				msg->op = KILN_STORE_OP_VALIDATE;
				msg->nonce = magic;
				*consumed = 5;
				return 1;
			}
		}
		*dialect = KILN_STORE_DIALECT_V1;
	}

	int op;
	if (*dialect == KILN_STORE_DIALECT_V1) {
		if (type >= ARRAY_SIZE(v1_ops) || v1_ops[type] < 0)
			return -EBADMSG;
		op = v1_ops[type];
	} else {
		/* VALIDATE only opens a 2.x connection; later it is an error, as
		 * in torch's libuv server. */
		if (type == KILN_STORE_OP_VALIDATE || type >= _KILN_STORE_OP_MAX)
			return -EBADMSG;
		op = type;
	}
	msg->op = (kiln_store_op) op;
	c.off = 1;

	switch (msg->op) {
	case KILN_STORE_OP_SET:
	case KILN_STORE_OP_APPEND:
	case KILN_STORE_OP_COMPARE_SET: /* key, expected value, desired value */
		if ((r = rd_bytes(&c, lim->max_key, &msg->key)) <= 0)
			return r;
		if ((r = rd_bytes(&c, lim->max_value, &msg->value)) <= 0)
			return r;
		if (msg->op == KILN_STORE_OP_COMPARE_SET &&
		    (r = rd_bytes(&c, lim->max_value, &msg->value2)) <= 0)
			return r;
		break;
	case KILN_STORE_OP_GET:
	case KILN_STORE_OP_DELETE_KEY:
		if ((r = rd_bytes(&c, lim->max_key, &msg->key)) <= 0)
			return r;
		break;
	case KILN_STORE_OP_ADD: {
		uint64_t d;
		if ((r = rd_bytes(&c, lim->max_key, &msg->key)) <= 0)
			return r;
		if ((r = rd_u64(&c, &d)) <= 0)
			return r;
		memcpy(&msg->delta, &d, sizeof(d));
		break;
	}
	case KILN_STORE_OP_CHECK:
	case KILN_STORE_OP_WAIT:
	case KILN_STORE_OP_MULTI_GET:
		if ((r = rd_items(&c, msg, false)) <= 0)
			return r;
		break;
	case KILN_STORE_OP_MULTI_SET:
		if ((r = rd_items(&c, msg, true)) <= 0)
			return r;
		break;
	case KILN_STORE_OP_PING:
		if ((r = rd_u32(&c, &msg->nonce)) <= 0)
			return r;
		break;
	case KILN_STORE_OP_GETNUMKEYS:
	case KILN_STORE_OP_CANCEL_WAIT:
		break;
	default:
		return -EBADMSG;
	}
	*consumed = c.off;
	return 1;
}

void kiln_store_items_init(kiln_store_items *it, const kiln_store_msg *msg)
{
	it->p = msg->items;
	it->left = msg->items_len;
	it->n = msg->n;
	it->pairs = msg->op == KILN_STORE_OP_MULTI_SET;
}

static void take(kiln_store_items *it, kiln_store_slice *s)
{
	uint64_t n;
	memcpy(&n, it->p, 8);
	s->p = it->p + 8;
	s->len = (size_t) n;
	it->p += 8 + n;
	it->left -= 8 + n;
}

bool kiln_store_items_next(kiln_store_items *it, kiln_store_slice *key, kiln_store_slice *value)
{
	if (it->n == 0)
		return false;
	take(it, key);
	if (it->pairs) {
		take(it, value);
	} else if (value) {
		value->p = NULL;
		value->len = 0;
	}
	it->n--;
	return true;
}

int kiln_store_format_worker_hello(const char *secret, uint8_t *buf, size_t len)
{
	size_t n = secret ? strlen(secret) : 0;
	if (n == 0 || n > KILN_STORE_SECRET_MAX)
		return -EINVAL;
	if (len < 1 + 4 + 8 + n)
		return -ENOBUFS;
	uint32_t magic = KILN_STORE_HELLO_MAGIC;
	uint64_t l = n;
	buf[0] = KILN_STORE_OP_WORKER_HELLO;
	memcpy(buf + 1, &magic, 4);
	memcpy(buf + 5, &l, 8);
	memcpy(buf + 13, secret, n);
	return (int) (13 + n);
}

const char *kiln_store_op_name(kiln_store_op op)
{
	if (op == KILN_STORE_OP_WORKER_HELLO)
		return "WORKER_HELLO";
	static const char *const names[] = {
		"VALIDATE",  "SET",	  "COMPARE_SET", "GET",	       "ADD",
		"CHECK",     "WAIT",	  "GETNUMKEYS",	 "DELETE_KEY", "APPEND",
		"MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",
	};
	if ((unsigned) op >= ARRAY_SIZE(names))
		return "?";
	return names[op];
}
