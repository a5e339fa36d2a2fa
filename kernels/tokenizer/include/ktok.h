/* ktok.h — tokenizers: text <-> token ids for kiln-inferd and kiln-train.
 *
 * One opaque ktok handle per vocabulary, loaded from any of:
 *   - GGUF tokenizer metadata (tokenizer.ggml.model "llama": SentencePiece
 *     BPE over scores with <0xNN> byte fallback and the U+2581 space marker;
 *     "gpt2": byte-level BPE over merges with a pre-tokenizer split chosen
 *     by tokenizer.ggml.pre), read through libkmf;
 *   - a Hugging Face tokenizer.json with a BPE model (byte-level, or the
 *     SentencePiece-like form with byte_fallback and a Prepend+Replace
 *     normalizer or a Metaspace pre-tokenizer), added_tokens included;
 *   - a llama2.c tokenizer.bin.
 * Every loader validates the whole file against the KTOK_MAX_* limits and
 * refuses what it cannot handle with a kiln_error saying which file, what
 * is wrong and what to do; the library never prints and never exits.
 *
 * Encoding is BPE with a priority queue over a linked list of symbols, so
 * it is O(n log n) in the length of each pre-token (whole SentencePiece
 * inputs are one pre-token), never quadratic.  Special tokens (control
 * tokens such as <s>, <|im_end|>) are matched in the text only when the
 * caller asks (KTOK_ENC_PARSE_SPECIAL): user text cannot inject them.
 * User-defined tokens (HF added tokens that are not special, GGUF type 4)
 * are always matched, as Hugging Face and llama.cpp do.
 *
 * A loaded ktok is never modified: any number of threads may encode and
 * decode with it at once (each ktok_stream belongs to one thread).
 *
 * Decoding is lossy-UTF-8 like Hugging Face's (invalid bytes become one
 * U+FFFD per maximal invalid subsequence); the streaming decoder
 * (ktok_stream) emits only complete UTF-8 and its output concatenated is
 * byte-for-byte the full decode of the same ids.
 *
 * Errors are negative errno values:
 *   -EINVAL      a bad argument (NULL, id out of range);
 *   -EBADMSG     a file breaking its format (truncated, bad JSON, merges
 *                naming unknown tokens, duplicate tokens, bad UTF-8 ...);
 *   -E2BIG       a count or length above a KTOK_MAX_* limit;
 *   -EOPNOTSUPP  a valid file using something ktok does not implement (a
 *                WordPiece/Unigram model, an unknown pre-tokenizer, an
 *                unknown chat template);
 *   -ENOENT      a lookup that found nothing;
 *   -ENOMEM, and the errno of open/read. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Limits on untrusted input                                                 */

/* Most tokens in a vocabulary: the largest public ones (Gemma 3) hold
 * 262k; 4M stops absurd counts before they size allocations. */
#define KTOK_MAX_VOCAB (1 << 22)
/* Longest token text in bytes: real vocabularies stay below 256 (long
 * special tokens, runs of spaces for code models); llama2.c files declare
 * their own max_token_length, which must not exceed this either. */
#define KTOK_MAX_TOKEN_LEN 4096
/* Most BPE merges (a vocabulary has at most one merge per token). */
#define KTOK_MAX_MERGES (1 << 22)
/* Largest tokenizer.json read (Llama 3's is 9 MB, Qwen's 11 MB). */
#define KTOK_MAX_JSON_BYTES (64u << 20)
/* Most added/special tokens matched in text (real files hold < 300k,
 * Llama 3 reserves 256). */
#define KTOK_MAX_SPECIAL 1000000
/* Longest text ktok_encode accepts in one call (1 GiB: ids fit int32 and
 * the symbol arrays fit memory; split longer corpora). */
#define KTOK_MAX_TEXT (1u << 30)
/* Most messages in one chat rendered by ktok_chat_render. */
#define KTOK_MAX_CHAT_MESSAGES 100000

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

/* A refused tokenizer is described by a kiln_error (kiln/error.h, through
 * kmf.h): code, file (the path or name given; "(input)" when none) and msg
 * (what is wrong, where, and what to do; at most 511 bytes).
 * kiln_error_format() gives the line for a user, "FILE: MSG". */

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */

typedef struct ktok ktok;

/* The kinds of token, with GGUF's tokenizer.ggml.token_type codes. */
typedef enum ktok_type {
	KTOK_NORMAL = 1,
	KTOK_UNKNOWN = 2,
	KTOK_CONTROL = 3, /* special: <s>, </s>, <|im_end|> ... */
	KTOK_USER = 4,	  /* user-defined: always matched in text */
	KTOK_UNUSED = 5,
	KTOK_BYTE = 6, /* <0xNN> byte fallback */
} ktok_type;

typedef enum ktok_model {
	KTOK_MODEL_SPM = 0, /* SentencePiece BPE: merge the best-scoring pair */
	KTOK_MODEL_BPE = 1, /* merges by rank (GPT-2, HF BPE) */
} ktok_model;

typedef enum ktok_pre {
	KTOK_PRE_NONE = 0,	/* the whole text is one piece (SentencePiece) */
	KTOK_PRE_GPT2 = 1,	/* GPT-2's regex (HF ByteLevel use_regex) */
	KTOK_PRE_LLAMA3 = 2,	/* Llama 3's regex (llama.cpp "llama-bpe") */
	KTOK_PRE_METASPACE = 3, /* split before each space marker */
	KTOK_PRE_QWEN2 = 4,	/* Llama 3's regex with single digits (Qwen2) */
} ktok_pre;

/* Opens path and picks the format by content: GGUF by its magic,
 * tokenizer.json by a leading '{', else a llama2.c tokenizer.bin.  On
 * failure *err (if not NULL) says why and *ret is untouched. */
int ktok_load(const char *path, ktok **ret, kiln_error *err);
/* From an opened GGUF file's tokenizer.ggml.* metadata. */
int ktok_load_gguf(const kmf_file *f, const char *name, ktok **ret, kiln_error *err);
/* From tokenizer.json text (len bytes; `name` is used in errors). */
int ktok_load_hf_json(const char *json, size_t len, const char *name, ktok **ret, kiln_error *err);
/* From the bytes of a llama2.c tokenizer.bin.  vocab_size is the model's
 * (the file does not store it); 0 reads tokens until the end of buf. */
int ktok_load_llama2c(const void *buf, size_t len, uint32_t vocab_size, const char *name,
		      ktok **ret, kiln_error *err);
/* Frees; accepts NULL; returns NULL. */
ktok *ktok_free(ktok *t);
/* For _cleanup_(ktok_freep) (kiln/macro.h): the one definition, so the
 * programs and tests that hold a tokenizer do not each write their own. */
static inline void ktok_freep(ktok **t)
{
	ktok_free(*t);
}

/* Properties. */
uint32_t ktok_n_vocab(const ktok *t);
ktok_model ktok_model_kind(const ktok *t);
ktok_pre ktok_pre_kind(const ktok *t);
const char *ktok_pre_name(ktok_pre p); /* "none", "gpt2", "llama-bpe", "metaspace", "qwen2" */
/* Special ids, -1 when the vocabulary has none. */
int32_t ktok_bos(const ktok *t);
int32_t ktok_eos(const ktok *t);
int32_t ktok_pad(const ktok *t);
int32_t ktok_unk(const ktok *t);
/* Whether KTOK_ENC_ADD_SPECIAL adds BOS / EOS (GGUF add_bos_token ...). */
bool ktok_adds_bos(const ktok *t);
bool ktok_adds_eos(const ktok *t);
/* The text of token id (raw bytes: byte-level tokens decoded, the U+2581
 * marker shown as a space; special tokens as written), its length in
 * *len (may be NULL), or NULL if id is out of range. */
const char *ktok_token_text(const ktok *t, int32_t id, size_t *len);
/* Its ktok_type, or -EINVAL. */
int ktok_token_type(const ktok *t, int32_t id);
/* The id of the token whose text is exactly s (special tokens such as
 * "<|im_end|>" included), or -ENOENT. */
int32_t ktok_find(const ktok *t, const char *s, size_t len);
/* The chat template from the file (GGUF tokenizer.chat_template), or NULL. */
const char *ktok_chat_template(const ktok *t);

/* ------------------------------------------------------------------------ */
/* Encoding and decoding                                                     */

/* Add BOS/EOS as the vocabulary says (ktok_adds_bos/eos). */
#define KTOK_ENC_ADD_SPECIAL 1u
/* Match special (control) tokens written in the text, e.g. "<|im_end|>";
 * without it they are ordinary text.  Only for trusted text (templates). */
#define KTOK_ENC_PARSE_SPECIAL 2u

/* Encodes len bytes of text into a malloc'd array *ids of *n ids.
 * Errors: -EINVAL, -E2BIG (len > KTOK_MAX_TEXT), -ENOMEM. */
int ktok_encode(const ktok *t, const char *text, size_t len, unsigned flags, int32_t **ids,
		size_t *n);

/* Leave control, unknown and unused tokens out of the text. */
#define KTOK_DEC_SKIP_SPECIAL 1u

/* Decodes n ids into a malloc'd NUL-terminated string *out of *len bytes
 * (valid UTF-8).  Errors: -EINVAL (an id out of range), -ENOMEM. */
int ktok_decode(const ktok *t, const int32_t *ids, size_t n, unsigned flags, char **out,
		size_t *len);

/* Streaming decoder: feed ids one by one, get back only complete UTF-8. */
typedef struct ktok_stream ktok_stream;
int ktok_stream_new(const ktok *t, unsigned flags, ktok_stream **ret);
ktok_stream *ktok_stream_free(ktok_stream *s);
/* For _cleanup_(ktok_stream_freep). */
static inline void ktok_stream_freep(ktok_stream **s)
{
	ktok_stream_free(*s);
}
/* Feeds one id; *text (valid until the next call) gets the bytes now
 * complete, *len their count (often 0 while a character is split across
 * byte tokens).  Errors: -EINVAL (id out of range), -ENOMEM. */
int ktok_stream_feed(ktok_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the stream: what is left (an incomplete character becomes U+FFFD). */
int ktok_stream_flush(ktok_stream *s, const char **text, size_t *len);

/* ------------------------------------------------------------------------ */
/* Chat templates                                                            */

/* The templates ktok renders in C (no Jinja engine): detected from a
 * model's chat_template string by their marker tokens. */
typedef enum ktok_chat {
	KTOK_CHAT_CHATML = 0, /* <|im_start|>role\n...<|im_end|>\n (Qwen, many) */
	KTOK_CHAT_LLAMA2,     /* <s>[INST] <<SYS>>\n..\n<</SYS>>\n\n.. [/INST] */
	KTOK_CHAT_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n..<|eot_id|> */
	KTOK_CHAT_MISTRAL,    /* <s>[INST] .. [/INST]..</s> (no <<SYS>>) */
	KTOK_CHAT_GEMMA,      /* <start_of_turn>user\n..<end_of_turn>\n */
	KTOK_CHAT_PHI3,	      /* <|user|>\n..<|end|>\n<|assistant|>\n */
	KTOK_CHAT_ZEPHYR,     /* <|user|>\n..</s>\n<|assistant|>\n */
	KTOK_CHAT_MAX
} ktok_chat;

typedef struct ktok_msg {
	const char *role; /* "system", "user", "assistant" */
	const char *content;
} ktok_msg;

/* The template family of a chat_template string: >= 0 a ktok_chat, or
 * -EOPNOTSUPP when none is recognised (a server may fall back to ChatML). */
int ktok_chat_detect(const char *tmpl);
/* "chatml", "llama2" ...; NULL if out of range.  And back: -EINVAL. */
const char *ktok_chat_name(ktok_chat c);
int ktok_chat_from_name(const char *name);
/* Renders messages as the model's prompt string into malloc'd *out,
 * ending with the assistant's header when add_generation_prompt.
 * bos/eos: the model's BOS and EOS texts (NULL: "<s>" and "</s>").
 * Errors: -EINVAL (an unknown role, a system message where the template
 * has none, NULL content), -E2BIG (over KTOK_MAX_CHAT_MESSAGES), -ENOMEM. */
int ktok_chat_render(ktok_chat c, const ktok_msg *msgs, size_t n, bool add_generation_prompt,
		     const char *bos, const char *eos, char **out);
/* Renders as ktok_chat_render and encodes the result (flags as
 * ktok_encode's) so that only the template's own text can become control
 * tokens: each message's content is plain text, and "<|im_end|>" typed by
 * a user is encoded as the characters it is made of, never as the marker.
 * Errors: ktok_chat_render's and ktok_encode's. */
int ktok_chat_encode(const ktok *t, ktok_chat c, const ktok_msg *msgs, size_t n,
		     bool add_generation_prompt, const char *bos, const char *eos, unsigned flags,
		     int32_t **ids, size_t *n_ids);

#ifdef __cplusplus
}
#endif
