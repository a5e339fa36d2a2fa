/* ktok.c — the libktok core: vocabulary building and validation (shared by
 * every loader), BPE encoding, decoding and the streaming decoder.
 *
 * Encoding: text -> runs between special tokens -> (SentencePiece: dummy
 * prefix) -> pre-tokenizer pieces -> BPE per piece.  BPE keeps the
 * piece's symbols in a doubly linked list and every mergeable adjacent
 * pair in a binary heap keyed by (priority, position): merge rank for
 * GPT-2/HF BPE, minus the merged piece's score for SentencePiece; ties go
 * to the leftmost pair as in HF tokenizers, sentencepiece and llama.cpp.
 * A merge pushes at most two new pairs, and stale heap entries are
 * recognised by the symbol lengths they were made for, so a piece of n
 * bytes costs O(n log n).
 *
 * Decoding maps each id to bytes (byte tokens to their byte, the space
 * marker already stored as ' '), drops one leading space after the
 * SentencePiece dummy prefix, and makes the bytes valid UTF-8 with one
 * U+FFFD per maximal invalid subsequence — through the same streaming
 * state machine the streaming decoder uses, so both agree by construction. */
#include <math.h>

#include "ktok_internal.h"

/* ------------------------------------------------------------------------ */
/* Errors and building                                                       */

int ktok__err(kiln_error *err, const char *name, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_error_vset(err, name && *name ? name : "(input)", code, KTOK_MSG_MAX, fmt, ap);
	va_end(ap);
	return code;
}

int ktok__new(const char *name, uint32_t n_vocab, ktok **ret)
{
	if (n_vocab == 0 || n_vocab > KTOK_MAX_VOCAB)
		return -E2BIG;
	_cleanup_(ktok_freep) ktok *t = calloc(1, sizeof(*t));
	if (!t || !(t->tok = calloc(n_vocab, sizeof(*t->tok))))
		return -ENOMEM;
	snprintf(t->name, sizeof(t->name), "%s", name ? name : "");
	t->n = n_vocab;
	t->bos = t->eos = t->pad = t->unk = -1;
	for (int b = 0; b < 256; b++)
		t->byte_id[b] = -1;
	*ret = TAKE_PTR(t);
	return 0;
}

ktok *ktok_free(ktok *t)
{
	if (!t)
		return NULL;
	for (uint32_t i = 0; i < t->n; i++)
		free(t->tok[i].text);
	FREE_ALL(t->tok, t->vh, t->mh, t->special, t->chat_template, t);
	return NULL;
}

int ktok__set(ktok *t, uint32_t id, const char *text, size_t len, float score, int type,
	      bool allow_bytes, kiln_error *err)
{
	if (id >= t->n)
		return ktok__err(err, t->name, -EBADMSG,
				 "token id %u is outside the vocabulary of %u", id, t->n);
	if (len > KTOK_MAX_TOKEN_LEN)
		return ktok__err(
			err, t->name, -E2BIG,
			"token %u is %zu bytes long, over the limit of %d (KTOK_MAX_TOKEN_LEN); "
			"the file is corrupt",
			id, len, KTOK_MAX_TOKEN_LEN);
	if (!allow_bytes && !ktok__utf8_valid(text, len))
		return ktok__err(err, t->name, -EBADMSG,
				 "token %u is not valid UTF-8; the vocabulary is corrupt", id);
	if (type < KTOK_NORMAL || type > KTOK_BYTE)
		return ktok__err(err, t->name, -EBADMSG,
				 "token %u has type %d; known types are 1 (normal) to 6 (byte)", id,
				 type);
	if (!isfinite(score))
		return ktok__err(err, t->name, -EBADMSG, "token %u has a score that is not finite",
				 id);
	if (t->tok[id].text)
		return ktok__err(err, t->name, -EBADMSG, "token id %u is defined twice", id);
	char *s = malloc(len + 1);
	if (!s)
		return -ENOMEM;
	memcpy(s, text, len);
	s[len] = 0;
	t->tok[id] = (struct ktok_tok){
		.text = s, .len = (uint32_t) len, .score = score, .type = (uint8_t) type
	};
	return 0;
}

static uint64_t hash_bytes(const char *s, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char) s[i]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

int32_t ktok__lookup(const ktok *t, const char *s, size_t len)
{
	if (!t->vh)
		return -1;
	for (uint32_t i = (uint32_t) hash_bytes(s, len) & t->vh_mask;; i = (i + 1) & t->vh_mask) {
		int32_t id = t->vh[i];
		if (id < 0)
			return -1;
		if (t->tok[id].len == len && memcmp(t->tok[id].text, s, len) == 0)
			return id;
	}
}

static int parse_byte_token(const char *s, size_t len)
{
	/* "<0xNN>" with two upper- or lower-case hex digits */
	if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	int v = 0;
	for (int i = 3; i < 5; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9'			 ? c - '0'
			: (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
								 : -1;
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

static int cmp_special(const void *a, const void *b, void *ud)
{
	const ktok *t = ud;
	uint32_t la = t->tok[*(const int32_t *) a].len, lb = t->tok[*(const int32_t *) b].len;
	return la < lb ? 1 : la > lb ? -1 : 0; /* longest first */
}

int ktok__finish_vocab(ktok *t, kiln_error *err)
{
	uint32_t cap = 16;
	while (cap < t->n * 2u)
		cap <<= 1;
	t->vh = malloc(cap * sizeof(*t->vh));
	if (!t->vh)
		return -ENOMEM;
	memset(t->vh, 0xff, cap * sizeof(*t->vh));
	t->vh_mask = cap - 1;
	size_t n_special = 0;
	for (uint32_t id = 0; id < t->n; id++) {
		struct ktok_tok *k = &t->tok[id];
		if (!k->text)
			return ktok__err(err, t->name, -EBADMSG,
					 "token id %u is missing: the vocabulary has holes", id);
		if (k->type == KTOK_BYTE) {
			int b = parse_byte_token(k->text, k->len);
			if (b < 0 && !t->byte_level)
				return ktok__err(
					err, t->name, -EBADMSG,
					"token %u has the byte type but its text is not <0xNN>",
					id);
			if (b >= 0) {
				k->byte = (uint8_t) b;
				if (t->byte_id[b] < 0)
					t->byte_id[b] = (int32_t) id;
			}
		}
		if ((k->type == KTOK_CONTROL || k->type == KTOK_USER) && k->len > 0)
			n_special++;
		uint32_t i = (uint32_t) hash_bytes(k->text, k->len) & t->vh_mask;
		for (;; i = (i + 1) & t->vh_mask) {
			int32_t o = t->vh[i];
			if (o < 0)
				break;
			if (t->tok[o].len == k->len &&
			    memcmp(t->tok[o].text, k->text, k->len) == 0) {
				/* Real vocabularies repeat control tokens (e.g.
				 * [PAD] placeholders) and SentencePiece keeps "<unk>"
				 * next to a byte token; only ordinary tokens must be
				 * unique, since encoding could not tell them apart. */
				if (k->type == KTOK_NORMAL && t->tok[o].type == KTOK_NORMAL)
					return ktok__err(
						err, t->name, -EBADMSG,
						"tokens %d and %u have the same text \"%.40s\": "
						"duplicate tokens; the vocabulary is corrupt",
						o, id, k->text);
				break;
			}
		}
		if (t->vh[i] < 0)
			t->vh[i] = (int32_t) id;
	}
	if (n_special > KTOK_MAX_SPECIAL)
		return ktok__err(err, t->name, -E2BIG, "%zu special tokens, over the limit of %d",
				 n_special, KTOK_MAX_SPECIAL);
	t->special = malloc((n_special + 1) * sizeof(*t->special));
	if (!t->special)
		return -ENOMEM;
	for (uint32_t id = 0; id < t->n; id++) {
		struct ktok_tok *k = &t->tok[id];
		if ((k->type == KTOK_CONTROL || k->type == KTOK_USER) && k->len > 0) {
			t->special[t->n_special++] = (int32_t) id;
			unsigned char c = (unsigned char) k->text[0];
			t->special_first[c / 32] |= 1u << (c % 32);
		}
	}
	qsort_r(t->special, t->n_special, sizeof(*t->special), cmp_special, t);
	if (t->byte_level) {
		for (int b = 0; b < 256; b++)
			if (t->byte_id[b] < 0) {
				char c = (char) b;
				int32_t id = ktok__lookup(t, &c, 1);
				if (id < 0)
					return ktok__err(err, t->name, -EBADMSG,
							 "byte-level vocabulary has no token for "
							 "byte 0x%02x; "
							 "every byte needs one",
							 b);
				t->byte_id[b] = id;
			}
	}
	return 0;
}

int ktok__check_ids(ktok *t, kiln_error *err)
{
	int32_t *ids[] = { &t->bos, &t->eos, &t->pad, &t->unk };
	const char *names[] = { "bos", "eos", "padding", "unknown" };
	for (size_t i = 0; i < ARRAY_SIZE(ids); i++)
		if (*ids[i] >= (int32_t) t->n)
			return ktok__err(err, t->name, -EBADMSG,
					 "the %s token id %d is outside the vocabulary of %u",
					 names[i], *ids[i], t->n);
	return 0;
}

int ktok__reserve_merges(ktok *t, uint32_t n)
{
	if (n > KTOK_MAX_MERGES)
		return -E2BIG;
	uint32_t cap = 16;
	while (cap < n * 2u)
		cap <<= 1;
	t->mh = malloc(cap * sizeof(*t->mh));
	if (!t->mh)
		return -ENOMEM;
	for (uint32_t i = 0; i < cap; i++)
		t->mh[i].rank = -1;
	t->mh_mask = cap - 1;
	return 0;
}

static uint32_t hash_pair(int32_t a, int32_t b)
{
	uint64_t h = ((uint64_t) (uint32_t) a << 32 | (uint32_t) b) * 0x9e3779b97f4a7c15ull;
	return (uint32_t) (h >> 32);
}

int ktok__add_merge(ktok *t, int32_t a, int32_t b, int32_t rank, kiln_error *err)
{
	if (t->n_merges * 2u > t->mh_mask)
		return ktok__err(err, t->name, -E2BIG, "more merges than reserved");
	const struct ktok_tok *ta = &t->tok[a], *tb = &t->tok[b];
	char buf[2 * KTOK_MAX_TOKEN_LEN];
	memcpy(buf, ta->text, ta->len);
	memcpy(buf + ta->len, tb->text, tb->len);
	int32_t r = ktok__lookup(t, buf, ta->len + tb->len);
	if (r < 0)
		return ktok__err(
			err, t->name, -EBADMSG,
			"merge %d (\"%.40s\" + \"%.40s\") makes a token that is not in the "
			"vocabulary; the merges do not belong to this vocabulary",
			rank, ta->text, tb->text);
	for (uint32_t i = hash_pair(a, b) & t->mh_mask;; i = (i + 1) & t->mh_mask) {
		struct ktok_merge *m = &t->mh[i];
		if (m->rank < 0) {
			*m = (struct ktok_merge){ .a = a, .b = b, .rank = rank, .result = r };
			t->n_merges++;
			return 0;
		}
		if (m->a == a && m->b == b)
			return 0; /* a repeated merge keeps its first (best) rank */
	}
}

static const struct ktok_merge *find_merge(const ktok *t, int32_t a, int32_t b)
{
	if (!t->mh)
		return NULL;
	for (uint32_t i = hash_pair(a, b) & t->mh_mask;; i = (i + 1) & t->mh_mask) {
		const struct ktok_merge *m = &t->mh[i];
		if (m->rank < 0)
			return NULL;
		if (m->a == a && m->b == b)
			return m;
	}
}

/* ------------------------------------------------------------------------ */
/* Properties                                                                */

uint32_t ktok_n_vocab(const ktok *t)
{
	return t ? t->n : 0;
}
ktok_model ktok_model_kind(const ktok *t)
{
	return t->model;
}
ktok_pre ktok_pre_kind(const ktok *t)
{
	return t->pre;
}
const char *ktok_pre_name(ktok_pre p)
{
	static const char *const names[] = { "none", "gpt2", "llama-bpe", "metaspace" };
	return (unsigned) p < ARRAY_SIZE(names) ? names[p] : NULL;
}
int32_t ktok_bos(const ktok *t)
{
	return t->bos;
}
int32_t ktok_eos(const ktok *t)
{
	return t->eos;
}
int32_t ktok_pad(const ktok *t)
{
	return t->pad;
}
int32_t ktok_unk(const ktok *t)
{
	return t->unk;
}
bool ktok_adds_bos(const ktok *t)
{
	return t->add_bos && t->bos >= 0;
}
bool ktok_adds_eos(const ktok *t)
{
	return t->add_eos && t->eos >= 0;
}
const char *ktok_chat_template(const ktok *t)
{
	return t ? t->chat_template : NULL;
}

const char *ktok_token_text(const ktok *t, int32_t id, size_t *len)
{
	if (!t || id < 0 || (uint32_t) id >= t->n)
		return NULL;
	if (len)
		*len = t->tok[id].len;
	return t->tok[id].text;
}

int ktok_token_type(const ktok *t, int32_t id)
{
	assert_return(t && id >= 0 && (uint32_t) id < t->n, -EINVAL);
	return t->tok[id].type;
}

int32_t ktok_find(const ktok *t, const char *s, size_t len)
{
	assert_return(t && s, -EINVAL);
	int32_t id = ktok__lookup(t, s, len);
	return id >= 0 ? id : -ENOENT;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */

struct ids {
	int32_t *v;
	size_t n, cap;
};

static int ids_push(struct ids *o, int32_t id)
{
	if (GROW(o->v, o->cap, o->n) < 0)
		return -ENOMEM;
	o->v[o->n++] = id;
	return 0;
}

struct sym {
	int32_t start, len; /* bytes of the piece; len 0: merged away */
	int32_t prev, next; /* -1 at the ends */
	int32_t id;	    /* -1: not a token (yet) */
};

struct pair {
	double prio; /* lower first */
	int32_t left, right;
	int32_t size; /* left.len + right.len when pushed: stale if changed */
	int32_t result;
};

/* Scratch reused across the pieces of one ktok_encode call. */
struct bpe {
	const ktok *t;
	struct ids *out;
	struct sym *sym;
	size_t sym_cap;
	struct pair *heap;
	size_t heap_n, heap_cap;
};

static bool pair_less(const struct pair *a, const struct pair *b)
{
	return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(struct bpe *w, struct pair p)
{
	if (GROW(w->heap, w->heap_cap, w->heap_n) < 0)
		return -ENOMEM;
	size_t i = w->heap_n++;
	while (i > 0 && pair_less(&p, &w->heap[(i - 1) / 2])) {
		w->heap[i] = w->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	w->heap[i] = p;
	return 0;
}

static struct pair heap_pop(struct bpe *w)
{
	struct pair top = w->heap[0], last = w->heap[--w->heap_n];
	size_t i = 0, n = w->heap_n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && pair_less(&w->heap[c + 1], &w->heap[c]))
			c++;
		if (!pair_less(&w->heap[c], &last))
			break;
		w->heap[i] = w->heap[c];
		i = c;
	}
	if (n)
		w->heap[i] = last;
	return top;
}

/* Whether a token may take part in SentencePiece merges (sentencepiece
 * looks pieces up among normal and user-defined ones only). */
static bool spm_mergeable(const ktok *t, int32_t id)
{
	return id >= 0 && (t->tok[id].type == KTOK_NORMAL || t->tok[id].type == KTOK_USER);
}

static int try_pair(struct bpe *w, const char *s, int32_t l, int32_t r)
{
	const ktok *t = w->t;
	const struct sym *a = &w->sym[l], *b = &w->sym[r];
	if (t->model == KTOK_MODEL_BPE) {
		if (a->id < 0 || b->id < 0)
			return 0;
		const struct ktok_merge *m = find_merge(t, a->id, b->id);
		/* Never build a control token out of text: with special
		 * parsing off, "<" "s>" must not become BOS. */
		if (!m || t->tok[m->result].type == KTOK_CONTROL)
			return 0;
		return heap_push(w, (struct pair){ .prio = m->rank,
						   .left = l,
						   .right = r,
						   .size = a->len + b->len,
						   .result = m->result });
	}
	int32_t id = ktok__lookup(t, s + a->start, (size_t) (a->len + b->len));
	if (!spm_mergeable(t, id))
		return 0;
	return heap_push(w, (struct pair){ .prio = -(double) t->tok[id].score,
					   .left = l,
					   .right = r,
					   .size = a->len + b->len,
					   .result = id });
}

static int emit_unknown(struct bpe *w, const char *s, size_t len, bool *last_unk)
{
	const ktok *t = w->t;
	if (t->byte_fallback) {
		for (size_t i = 0; i < len; i++) {
			/* A vocabulary may lack some <0xNN>: then the unknown
			 * token, or nothing when it has none (as HF drops). */
			int32_t id = t->byte_id[(unsigned char) s[i]];
			if (id < 0)
				id = t->unk;
			int r = id >= 0 ? ids_push(w->out, id) : 0;
			if (r < 0)
				return r;
		}
		*last_unk = false;
		return 0;
	}
	if (t->unk < 0)
		return 0; /* no unknown token: the text is dropped, as HF does */
	if (t->fuse_unk && *last_unk)
		return 0;
	*last_unk = true;
	return ids_push(w->out, t->unk);
}

/* BPE over one pre-token s[0..len). */
static int bpe_piece(void *ud, const char *s, size_t len)
{
	struct bpe *w = ud;
	const ktok *t = w->t;
	int r;
	if (t->ignore_merges) {
		int32_t id = ktok__lookup(t, s, len);
		if (id >= 0 && t->tok[id].type != KTOK_CONTROL)
			return ids_push(w->out, id);
	}
	if (len > w->sym_cap) {
		struct sym *p = realloc(w->sym, len * sizeof(*p));
		if (!p)
			return -ENOMEM;
		w->sym = p;
		w->sym_cap = len;
	}
	/* Initial symbols: bytes (byte-level) or UTF-8 characters. */
	int32_t n = 0;
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t k = t->byte_level
				   ? 1
				   : ktok__utf8_next((const unsigned char *) s + i, len - i, &cp);
		int32_t id = t->byte_level ? t->byte_id[(unsigned char) s[i]]
					   : ktok__lookup(t, s + i, k);
		if (!t->byte_level && id >= 0 && t->model == KTOK_MODEL_SPM &&
		    !spm_mergeable(t, id))
			id = -1;
		w->sym[n] = (struct sym){ .start = (int32_t) i,
					  .len = (int32_t) k,
					  .prev = n - 1,
					  .next = n + 1,
					  .id = id };
		n++;
		i += k;
	}
	w->sym[n - 1].next = -1;
	w->heap_n = 0;
	for (int32_t i = 0; i + 1 < n; i++)
		if ((r = try_pair(w, s, i, i + 1)) < 0)
			return r;
	while (w->heap_n) {
		struct pair p = heap_pop(w);
		struct sym *a = &w->sym[p.left], *b = &w->sym[p.right];
		if (a->len == 0 || b->len == 0 || a->next != p.right || a->len + b->len != p.size)
			continue; /* stale */
		a->len += b->len;
		a->id = p.result;
		a->next = b->next;
		b->len = 0;
		if (a->next >= 0)
			w->sym[a->next].prev = p.left;
		if (a->prev >= 0 && (r = try_pair(w, s, a->prev, p.left)) < 0)
			return r;
		if (a->next >= 0 && (r = try_pair(w, s, p.left, a->next)) < 0)
			return r;
	}
	bool last_unk = false;
	for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
		const struct sym *y = &w->sym[i];
		if (y->id >= 0) {
			last_unk = false;
			r = ids_push(w->out, y->id);
		} else {
			r = emit_unknown(w, s + y->start, (size_t) y->len, &last_unk);
		}
		if (r < 0)
			return r;
	}
	return 0;
}

static bool is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Encodes a run of ordinary text (between special tokens). */
static int encode_text(struct bpe *w, const char *s, size_t len, bool *first, char **norm,
		       size_t *norm_cap)
{
	const ktok *t = w->t;
	if (len == 0)
		return 0;
	bool prefix = t->add_space_prefix && (*first || !t->prefix_first_only);
	*first = false;
	if (t->byte_level)
		return ktok__pretokenize(t->pre, s, len, bpe_piece, w);
	/* SentencePiece-like: the marker U+2581 is stored as ' ' in the
	 * vocabulary, so spaces stay spaces and a literal U+2581 in the
	 * text becomes one too (sentencepiece cannot tell them apart either). */
	size_t need = len + 1;
	if (need > *norm_cap) {
		char *p = realloc(*norm, need);
		if (!p)
			return -ENOMEM;
		*norm = p;
		*norm_cap = need;
	}
	char *o = *norm;
	size_t m = 0;
	bool starts_space = s[0] == ' ' || (len >= 3 && memcmp(s, "\xE2\x96\x81", 3) == 0);
	if (prefix && !(t->prefix_unless_space && starts_space))
		o[m++] = ' ';
	memcpy(o + m, s, len);
	m += ktok__unescape_spaces(o + m, len);
	return ktok__pretokenize(t->pre, o, m, bpe_piece, w);
}

/* The longest special token that starts at s[0..len), or -1.  Control
 * tokens only when they fit in the first ctl_len bytes (0: none). */
static int32_t match_special(const ktok *t, const char *s, size_t len, size_t ctl_len)
{
	unsigned char c = (unsigned char) s[0];
	if (!(t->special_first[c / 32] & (1u << (c % 32))))
		return -1;
	for (size_t i = 0; i < t->n_special; i++) {
		const struct ktok_tok *k = &t->tok[t->special[i]];
		if (k->len <= len && k->text[0] == s[0] && memcmp(k->text, s, k->len) == 0 &&
		    (k->type == KTOK_USER || k->len <= ctl_len))
			return t->special[i];
	}
	return -1;
}

int ktok_encode(const ktok *t, const char *text, size_t len, unsigned flags, int32_t **ids,
		size_t *n)
{
	return ktok__encode_spans(t, text, len, NULL, 0, flags, ids, n);
}

int ktok__encode_spans(const ktok *t, const char *text, size_t len, const size_t *lit, size_t n_lit,
		       unsigned flags, int32_t **ids, size_t *n)
{
	assert_return(t && (text || !len) && ids && n && (lit || !n_lit), -EINVAL);
	if (len > KTOK_MAX_TEXT)
		return -E2BIG;
	struct ids out = { 0 };
	struct bpe w = { .t = t, .out = &out };
	_cleanup_free_ char *norm = NULL;
	size_t norm_cap = 0;
	bool first = true;
	int r = 0;
	if ((flags & KTOK_ENC_ADD_SPECIAL) && ktok_adds_bos(t))
		r = ids_push(&out, t->bos);
	bool parse = flags & KTOK_ENC_PARSE_SPECIAL;
	size_t start = 0, j = 0; /* lit[2j..2j+1]: the first literal span not behind i */
	for (size_t i = 0; r >= 0 && i < len;) {
		size_t ctl_len = 0;
		while (j < n_lit && lit[2 * j + 1] <= i)
			j++;
		if (parse && !(j < n_lit && lit[2 * j] <= i))
			ctl_len = (j < n_lit ? lit[2 * j] : len) - i;
		int32_t sp = t->n_special ? match_special(t, text + i, len - i, ctl_len) : -1;
		if (sp < 0) {
			i++;
			continue;
		}
		const struct ktok_tok *k = &t->tok[sp];
		size_t end = i, next = i + k->len;
		if (k->lstrip)
			while (end > start && is_ws(text[end - 1]))
				end--;
		if (k->rstrip)
			while (next < len && is_ws(text[next]))
				next++;
		r = encode_text(&w, text + start, end - start, &first, &norm, &norm_cap);
		if (r >= 0)
			r = ids_push(&out, sp);
		/* After a special token the next text run gets the dummy
		 * prefix again (HF Prepend, llama.cpp is_prev_special);
		 * Metaspace "first" prefixes only text at offset 0 of the input. */
		first = !t->prefix_first_only;
		start = i = next;
	}
	if (r >= 0)
		r = encode_text(&w, text + start, len - start, &first, &norm, &norm_cap);
	if (r >= 0 && (flags & KTOK_ENC_ADD_SPECIAL) && ktok_adds_eos(t))
		r = ids_push(&out, t->eos);
	free(w.sym);
	free(w.heap);
	if (r < 0) {
		free(out.v);
		return r;
	}
	if (!out.v && !(out.v = malloc(sizeof(int32_t)))) /* never hand back NULL */
		return -ENOMEM;
	*ids = out.v;
	*n = out.n;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                  */

struct ktok_stream {
	const ktok *t;
	unsigned flags;
	bool started;	       /* some text was produced (leading-space rule) */
	unsigned char pend[4]; /* an incomplete UTF-8 sequence */
	size_t npend;
	char *buf;
	size_t n, cap;
};

static int sbuf_put(struct ktok_stream *s, const void *p, size_t len)
{
	if (s->n + len + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 64;
		while (cap < s->n + len + 1)
			cap *= 2;
		char *b = realloc(s->buf, cap);
		if (!b)
			return -ENOMEM;
		s->buf = b;
		s->cap = cap;
	}
	memcpy(s->buf + s->n, p, len);
	s->n += len;
	s->buf[s->n] = 0;
	return 0;
}

static int put_fffd(struct ktok_stream *s)
{
	return sbuf_put(s, "\xEF\xBF\xBD", 3);
}

/* Adds raw bytes, keeping a trailing incomplete character pending and
 * replacing each maximal invalid subsequence by U+FFFD. */
static int stream_bytes(struct ktok_stream *s, const unsigned char *p, size_t len)
{
	int r;
	for (size_t i = 0; i < len; i++) {
		s->pend[s->npend++] = p[i];
		for (;;) {
			int v = ktok__utf8_valid_len(s->pend, s->npend);
			if (v == -1)
				break; /* incomplete: wait */
			if (v > 0) {
				if ((r = sbuf_put(s, s->pend, (size_t) v)) < 0)
					return r;
				s->npend = 0;
				break;
			}
			/* Invalid: the maximal subpart is the first byte (v ==
			 * 0) or the -v - 1 bytes before the offending one. */
			size_t bad = v == 0 ? 1 : (size_t) (-v - 1);
			if ((r = put_fffd(s)) < 0)
				return r;
			memmove(s->pend, s->pend + bad, s->npend - bad);
			s->npend -= bad;
			if (!s->npend)
				break;
		}
	}
	return 0;
}

static int stream_token(struct ktok_stream *s, int32_t id)
{
	const ktok *t = s->t;
	if (id < 0 || (uint32_t) id >= t->n)
		return -EINVAL;
	const struct ktok_tok *k = &t->tok[id];
	if (k->type == KTOK_BYTE && !t->byte_level) {
		s->started = true;
		return stream_bytes(s, &k->byte, 1);
	}
	bool special = k->type == KTOK_CONTROL || k->type == KTOK_UNKNOWN || k->type == KTOK_UNUSED;
	if (special && (s->flags & KTOK_DEC_SKIP_SPECIAL))
		return 0;
	const unsigned char *p = (const unsigned char *) k->text;
	size_t len = k->len;
	/* The SentencePiece dummy prefix: the first space of the output is
	 * not the user's (sentencepiece, HF Strip decoder, llama.cpp). */
	if (!s->started && t->add_space_prefix && len && p[0] == ' ')
		p++, len--;
	if (k->len)
		s->started = true;
	return stream_bytes(s, p, len);
}

int ktok_stream_new(const ktok *t, unsigned flags, ktok_stream **ret)
{
	assert_return(t && ret, -EINVAL);
	ktok_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->t = t;
	s->flags = flags;
	*ret = s;
	return 0;
}

ktok_stream *ktok_stream_free(ktok_stream *s)
{
	if (s) {
		free(s->buf);
		free(s);
	}
	return NULL;
}

int ktok_stream_feed(ktok_stream *s, int32_t id, const char **text, size_t *len)
{
	assert_return(s && text && len, -EINVAL);
	s->n = 0;
	int r = stream_token(s, id);
	if (r < 0)
		return r;
	*text = s->buf ? s->buf : "";
	*len = s->n;
	return 0;
}

int ktok_stream_flush(ktok_stream *s, const char **text, size_t *len)
{
	assert_return(s && text && len, -EINVAL);
	s->n = 0;
	/* What is pending is a valid prefix cut short: one U+FFFD, as
	 * from_utf8_lossy does at the end of input. */
	if (s->npend) {
		int r = put_fffd(s);
		if (r < 0)
			return r;
		s->npend = 0;
	}
	*text = s->buf ? s->buf : "";
	*len = s->n;
	return 0;
}

int ktok_decode(const ktok *t, const int32_t *ids, size_t n, unsigned flags, char **out,
		size_t *len)
{
	assert_return(t && (ids || !n) && out, -EINVAL);
	struct ktok_stream s = { .t = t, .flags = flags };
	int r = 0;
	for (size_t i = 0; i < n && r >= 0; i++)
		r = stream_token(&s, ids[i]);
	if (r >= 0 && s.npend)
		r = put_fffd(&s);
	if (r >= 0 && !s.buf)
		r = sbuf_put(&s, "", 0);
	if (r < 0) {
		free(s.buf);
		return r;
	}
	*out = s.buf;
	if (len)
		*len = s.n;
	return 0;
}
