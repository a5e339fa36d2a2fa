/* pretok.c — UTF-8 helpers and the pre-tokenizer splits of libktok.
 *
 * BPE vocabularies trained with a pre-tokenizer only hold pieces inside
 * its splits, so the encoder must split text exactly as the trainer did.
 * The GPT-2 and Llama 3 splits are regular expressions in Hugging Face
 * tokenizers and llama.cpp; here each is a hand-written scanner that
 * follows the regex's leftmost-first alternation and backtracking rules
 * (written out next to each branch), which is linear in the text and
 * needs no regex engine.  \p{L} and \p{N} come from unicode.c. */
#include "ktok_internal.h"

size_t ktok__utf8_next(const unsigned char *s, size_t len, uint32_t *cp)
{
	unsigned char c = s[0];
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	size_t n;
	uint32_t v, min;
	if (c >= 0xC2 && c <= 0xDF) {
		n = 2, v = c & 0x1F, min = 0x80;
	} else if (c >= 0xE0 && c <= 0xEF) {
		n = 3, v = c & 0x0F, min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4, v = c & 0x07, min = 0x10000;
	} else {
		goto bad;
	}
	if (len < n)
		goto bad;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			goto bad;
		v = (v << 6) | (s[i] & 0x3F);
	}
	if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
		goto bad;
	*cp = v;
	return n;
bad:
	*cp = 0xFFFDu | (1u << 31);
	return 1;
}

int ktok__utf8_valid_len(const unsigned char *s, size_t len)
{
	/* The Unicode "maximal subpart" rule (as Rust's from_utf8_lossy):
	 * the second byte's range depends on the first. */
	unsigned char c = s[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xBF;
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		n = 2;
	else if (c >= 0xE0 && c <= 0xEF)
		n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
	else if (c >= 0xF0 && c <= 0xF4)
		n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if (i >= len)
			return -1;
		unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
		if (s[i] < l || s[i] > h)
			return -(int) (i + 1); /* invalid after i bytes: -(i+1), i >= 1 */
	}
	return (int) n;
}

bool ktok__utf8_valid(const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *) s;
	for (size_t i = 0; i < len;) {
		int r = ktok__utf8_valid_len(u + i, len - i);
		if (r <= 0)
			return false;
		i += (size_t) r;
	}
	return true;
}

static bool in_ranges(const struct ktok_urange *r, size_t n, uint32_t cp)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t m = (lo + hi) / 2;
		if (cp < r[m].lo)
			hi = m;
		else if (cp > r[m].hi)
			lo = m + 1;
		else
			return true;
	}
	return false;
}

static bool is_letter(uint32_t cp)
{
	if (cp < 0x80)
		return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
	return in_ranges(ktok__letters, ktok__letters_n, cp);
}

static bool is_number(uint32_t cp)
{
	if (cp < 0x80)
		return cp >= '0' && cp <= '9';
	return in_ranges(ktok__numbers, ktok__numbers_n, cp);
}

/* \s of the Rust regex crate: the Unicode White_Space property. */
static bool is_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
	       cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
	       cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* The text decoded once into code points with their byte offsets. */
struct cps {
	uint32_t *cp;
	size_t *off; /* n + 1 entries */
	size_t n;
};

enum cls { C_L = 1, C_N = 2, C_S = 4, C_NL = 8 };

static int cls_of(uint32_t cp)
{
	if (is_letter(cp))
		return C_L;
	if (is_number(cp))
		return C_N;
	if (is_space(cp))
		return C_S | ((cp == '\r' || cp == '\n') ? C_NL : 0);
	return 0;
}

/* 's 't 're 've 'm 'll 'd (case-insensitive when ci); length in chars. */
static size_t contraction(const uint32_t *cp, size_t i, size_t n, bool ci)
{
	if (cp[i] != '\'' || i + 1 >= n)
		return 0;
	uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
	if (ci) {
		a = a < 0x80 ? (uint32_t) (a | 0x20) : a;
		b = b < 0x80 ? (uint32_t) (b | 0x20) : b;
	}
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return 2;
	if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
		return 3;
	return 0;
}

/* \s+(?!\S) then \s+ at i (cls[i] is whitespace): the run minus its last
 * character when a non-space follows and the run is longer than one. */
static size_t space_run(const uint8_t *cls, size_t i, size_t n)
{
	size_t j = i;
	while (j < n && (cls[j] & C_S))
		j++;
	if (j < n && j - i > 1)
		return j - 1 - i;
	return j - i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_next(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n)
{
	size_t k = contraction(cp, i, n, false);
	if (k)
		return k;
	size_t j = i + (cp[i] == ' ' && i + 1 < n && !(cls[i + 1] & C_S));
	if (j < n && (cls[j] & (C_L | C_N))) { /* ` ?\p{L}+` or ` ?\p{N}+` */
		int c = cls[j];
		while (j < n && cls[j] == c)
			j++;
		return j - i;
	}
	if (j < n && !cls[j]) { /* ` ?[^\s\p{L}\p{N}]+` */
		while (j < n && !cls[j])
			j++;
		return j - i;
	}
	return space_run(cls, i, n);
}

/* Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Qwen2: the same with \p{N} (one digit at a time): max_digits 1. */
static size_t llama3_next(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n,
			  size_t max_digits)
{
	size_t k = contraction(cp, i, n, true);
	if (k)
		return k;
	/* [^\r\n\p{L}\p{N}]?\p{L}+ */
	size_t j = i;
	if (!(cls[j] & (C_NL | C_L | C_N)) && j + 1 < n && cls[j + 1] == C_L)
		j++;
	if (cls[j] == C_L) {
		while (j < n && cls[j] == C_L)
			j++;
		return j - i;
	}
	if (cls[i] == C_N) { /* \p{N}{1,3}, or \p{N} */
		j = i;
		while (j < n && j - i < max_digits && cls[j] == C_N)
			j++;
		return j - i;
	}
	/*  ?[^\s\p{L}\p{N}]+[\r\n]* */
	j = i + (cp[i] == ' ' && i + 1 < n && !cls[i + 1]);
	if (j < n && !cls[j]) {
		while (j < n && !cls[j])
			j++;
		while (j < n && (cls[j] & C_NL))
			j++;
		return j - i;
	}
	/* \s*[\r\n]+: up to the last newline of the whitespace run */
	size_t last = SIZE_MAX;
	for (j = i; j < n && (cls[j] & C_S); j++)
		if (cls[j] & C_NL)
			last = j;
	if (last != SIZE_MAX)
		return last + 1 - i;
	return space_run(cls, i, n);
}

int ktok__pretokenize(ktok_pre pre, const char *s, size_t len, ktok_piece_fn fn, void *ud)
{
	if (len == 0)
		return 0;
	if (pre == KTOK_PRE_NONE)
		return fn(ud, s, len);
	if (pre == KTOK_PRE_METASPACE) {
		/* Split before each space (the U+2581 marker), keeping it. */
		size_t start = 0;
		for (size_t i = 1; i < len; i++) {
			if (s[i] == ' ') {
				int r = fn(ud, s + start, i - start);
				if (r < 0)
					return r;
				start = i;
			}
		}
		return fn(ud, s + start, len - start);
	}
	_cleanup_free_ uint32_t *cp = malloc(len * sizeof(*cp));
	_cleanup_free_ size_t *off = malloc((len + 1) * sizeof(*off));
	_cleanup_free_ uint8_t *cls = malloc(len);
	if (!cp || !off || !cls)
		return -ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < len;) {
		off[n] = i;
		size_t k = ktok__utf8_next((const unsigned char *) s + i, len - i, &cp[n]);
		cls[n] = (uint8_t) cls_of(cp[n]);
		n++;
		i += k;
	}
	off[n] = len;
	for (size_t i = 0; i < n;) {
		size_t k = pre == KTOK_PRE_GPT2	   ? gpt2_next(cp, cls, i, n)
			   : pre == KTOK_PRE_QWEN2 ? llama3_next(cp, cls, i, n, 1)
						   : llama3_next(cp, cls, i, n, 3);
		int r = fn(ud, s + off[i], off[i + k] - off[i]);
		if (r < 0)
			return r;
		i += k;
	}
	return 0;
}
