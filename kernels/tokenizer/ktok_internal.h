/* ktok_internal.h — what the libktok sources share: the vocabulary
 * structure the loaders fill and the encoder/decoder read, the builder
 * calls that every loader goes through (so validation lives in one place),
 * and the Unicode helpers of the pre-tokenizers.  Not installed. */
#pragma once

#include <stdarg.h>

#include "kiln/macro.h"
#include "ktok.h"

struct ktok_tok {
	char *text;		/* lookup form: raw bytes, U+2581 shown as ' ' */
	uint32_t len;		/* bytes */
	float score;		/* SentencePiece score (SPM merges), else 0 */
	uint8_t type;		/* ktok_type */
	uint8_t byte;		/* the byte of a KTOK_BYTE token */
	uint8_t lstrip, rstrip; /* HF added token: eat whitespace around it */
};

struct ktok_merge {
	int32_t a, b;	/* the pair, as ids */
	int32_t rank;	/* lower merges first; -1 marks an empty slot */
	int32_t result; /* id of a+b */
};

struct ktok {
	char name[256];
	ktok_model model;
	ktok_pre pre;
	bool byte_level;	  /* GPT-2 bytes<->unicode: every byte has a token */
	bool byte_fallback;	  /* unknown characters become <0xNN> tokens */
	bool add_space_prefix;	  /* SentencePiece dummy prefix before each text run */
	bool prefix_first_only;	  /* Metaspace prepend_scheme "first" */
	bool prefix_unless_space; /* Metaspace: no prefix if the text starts with one */
	bool ignore_merges;	  /* a whole pre-token in the vocabulary wins (Llama 3) */
	bool fuse_unk;
	bool add_bos, add_eos;
	int32_t bos, eos, pad, unk;

	uint32_t n;
	struct ktok_tok *tok;
	int32_t *vh; /* open-addressing hash of ids by text; -1 empty */
	uint32_t vh_mask;

	struct ktok_merge *mh; /* open-addressing hash of merges by pair */
	uint32_t mh_mask, n_merges;

	int32_t byte_id[256]; /* token of each raw byte (byte-level or <0xNN>), -1 */

	int32_t *special; /* tokens matched in text, CONTROL and USER */
	size_t n_special;
	uint32_t special_first[256 / 32]; /* bitmap of their first bytes */

	char *chat_template;
};

/* Builder used by every loader. */
int ktok__new(const char *name, uint32_t n_vocab, ktok **ret);
/* Sets token id; text copied.  -EBADMSG on bad UTF-8 (unless allow_bytes),
 * -E2BIG over KTOK_MAX_TOKEN_LEN. */
int ktok__set(ktok *t, uint32_t id, const char *text, size_t len, float score, int type,
	      bool allow_bytes, kiln_error *err);
/* After all tokens: builds the hash, finds duplicates (-EBADMSG), byte
 * tokens, specials. */
int ktok__finish_vocab(ktok *t, kiln_error *err);
/* Adds merge a b with rank (result = lookup of a+b).  -EBADMSG when the
 * result is not a token. */
int ktok__add_merge(ktok *t, int32_t a, int32_t b, int32_t rank, kiln_error *err);
int ktok__reserve_merges(ktok *t, uint32_t n);
int32_t ktok__lookup(const ktok *t, const char *s, size_t len);
/* The longest message ktok__err writes, with its NUL. */
#define KTOK_MSG_MAX 512
/* Fills err (if not NULL) for the file called name (NULL or "": "(input)")
 * and returns code. */
int ktok__err(kiln_error *err, const char *name, int code, const char *fmt, ...) _printf_(4, 5);
int ktok__check_ids(ktok *t, kiln_error *err);

/* GPT-2 byte<->unicode map: decodes byte-level text (each char one byte)
 * into out (at most len bytes); -EBADMSG if a char is outside the map. */
int ktok__bytelevel_decode(const char *s, size_t len, char *out, size_t *out_len);
/* Replaces U+2581 by ' ' in place; returns the new length. */
size_t ktok__unescape_spaces(char *s, size_t len);

/* Unicode. */
struct ktok_urange {
	uint32_t lo, hi;
};
extern const struct ktok_urange ktok__letters[];
extern const size_t ktok__letters_n;
extern const struct ktok_urange ktok__numbers[];
extern const size_t ktok__numbers_n;

/* Decodes one UTF-8 character at s[0..len): its code point in *cp and
 * length returned; an invalid or truncated sequence yields one byte with
 * *cp = 0xFFFD | (1u << 31) so it never classifies as a letter. */
size_t ktok__utf8_next(const unsigned char *s, size_t len, uint32_t *cp);
/* Length of the maximal valid UTF-8 prefix at s: 0 when s[0] starts an
 * invalid sequence, -1 when s holds an incomplete but so-far valid
 * sequence (more bytes may complete it). */
int ktok__utf8_valid_len(const unsigned char *s, size_t len);
bool ktok__utf8_valid(const char *s, size_t len);

/* Pre-tokenizer: calls fn for each piece of s[0..len). */
typedef int (*ktok_piece_fn)(void *ud, const char *s, size_t len);
int ktok__pretokenize(ktok_pre pre, const char *s, size_t len, ktok_piece_fn fn, void *ud);

/* ktok_encode, with the byte ranges lit[2k]..lit[2k+1] (sorted, not
 * overlapping; n_lit of them) taken as literal text: a control token is
 * matched (KTOK_ENC_PARSE_SPECIAL) only where it lies wholly outside
 * them.  What keeps a chat message from writing the template's markers. */
int ktok__encode_spans(const ktok *t, const char *text, size_t len, const size_t *lit,
		       size_t n_lit, unsigned flags, int32_t **ids, size_t *n);
