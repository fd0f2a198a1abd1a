/* tokenizer.h - tokenizers read from GGUF metadata.
 *
 * tokenizer.ggml.model "gpt2": byte-level BPE with the pre-tokenizer named
 * by tokenizer.ggml.pre (smollm/starcoder & co: digits split then GPT-2
 * regex; gpt-2; llama3 family; qwen2 family; missing pre -> default with a
 * warning). "llama": SentencePiece (score-driven merges, byte fallback,
 * "▁" for spaces, add_space_prefix). Special tokens (control,
 * user-defined) are matched longest-first before pre-tokenization.
 * Semantics follow llama.cpp's llama-vocab (see shared/reference §4).
 */
#ifndef RLAI_TOKENIZER_H
#define RLAI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "rlai/gguf.h"

typedef struct rlai_tokenizer rlai_tokenizer;

enum rlai_token_attr {
    RLAI_TOKEN_NORMAL = 1, RLAI_TOKEN_UNKNOWN = 2, RLAI_TOKEN_CONTROL = 3,
    RLAI_TOKEN_USER_DEFINED = 4, RLAI_TOKEN_UNUSED = 5, RLAI_TOKEN_BYTE = 6,
};

/* Builds a tokenizer from the GGUF's tokenizer.* keys (copies what it needs,
 * so the gguf may be closed afterwards). Unknown model or pre names and
 * inconsistent arrays are RLAI_ERR_UNSUPPORTED / RLAI_ERR_FORMAT with a
 * message in err. *out owned by caller. */
int rlai_tokenizer_load(const rlai_gguf *g, rlai_tokenizer **out, char *err, size_t errlen);
void rlai_tokenizer_free(rlai_tokenizer *t);

int rlai_tokenizer_n_vocab(const rlai_tokenizer *t);
int32_t rlai_tokenizer_bos(const rlai_tokenizer *t);   /* -1 if none */
int32_t rlai_tokenizer_eos(const rlai_tokenizer *t);   /* -1 if none */
bool rlai_tokenizer_add_bos(const rlai_tokenizer *t);
bool rlai_tokenizer_add_eos(const rlai_tokenizer *t);
/* End-of-generation: eos, eot, eom and auto-detected <|im_end|>, <|eot_id|>,
 * <|endoftext|>, <end_of_turn>, ... */
bool rlai_tokenizer_is_eog(const rlai_tokenizer *t, int32_t id);
int rlai_tokenizer_attr(const rlai_tokenizer *t, int32_t id);
/* Id of a token whose text is exactly `text`, or -1. */
int32_t rlai_tokenizer_find(const rlai_tokenizer *t, const char *text, size_t len);

/* Same contract as rlai_engine_tokenize: writes up to cap ids, returns the
 * total count (may exceed cap) or a negative error. */
int rlai_tokenizer_encode(const rlai_tokenizer *t, const char *text, size_t len,
                          bool add_special, bool parse_special, int32_t *out, int cap);

/* A span of text for rlai_tokenizer_encode_spans. */
typedef struct rlai_tok_span {
    size_t off, len;
    bool parse_special;    /* special-token text in this span becomes its id */
} rlai_tok_span;

/* As rlai_tokenizer_encode, but special-token text is parsed only inside
 * the spans that ask for it (user-defined tokens, as always, everywhere).
 * The spans (caller-owned) must cover text[0..len) in order without gaps
 * or overlap (else RLAI_ERR_INVALID_ARG). Raw text is pre-tokenized across
 * span boundaries as one piece, so the result equals rlai_tokenizer_encode
 * with parse_special=true whenever the special-token text of the whole
 * string lies exactly in the parsed spans. */
int rlai_tokenizer_encode_spans(const rlai_tokenizer *t, const char *text, size_t len,
                                const rlai_tok_span *spans, int n_spans, bool add_special,
                                int32_t *out, int cap);

/* Raw bytes of one token after decoding (GPT-2 byte map inverted / SPM "▁"
 * -> " " / <0xXX> byte tokens -> the byte). Control tokens give their text
 * if render_special, else 0 bytes. Writes up to cap bytes (no NUL) and
 * returns the full length, or a negative error for an invalid id. */
int rlai_tokenizer_token_to_piece(const rlai_tokenizer *t, int32_t id, bool render_special,
                                  char *buf, size_t cap);

/* Decodes a sequence (handles SPM leading-space removal like llama.cpp's
 * detokenize). Returns the length needed excluding NUL; writes NUL-terminated
 * output when cap > 0. */
int rlai_tokenizer_decode(const rlai_tokenizer *t, const int32_t *ids, int n,
                          bool render_special, char *buf, size_t cap);

#endif
