/* logprobs.h - OpenAI "logprobs" objects from the engine's per-token
 * log-probabilities (rlai_token_logprobs, engine.h), for the HTTP front.
 *
 * Token text is the token's own bytes (special tokens as their text);
 * "token" strings are those bytes with invalid UTF-8 (a token that ends
 * mid-character) replaced by U+FFFD, "bytes" the exact bytes. A logprob of
 * -inf is written as -9999.0 (OpenAI's convention; JSON has no -inf). */
#ifndef RLAI_HOST_LOGPROBS_H
#define RLAI_HOST_LOGPROBS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include "rlai/engine.h"
#include "rlai/protocol.h"

/* Appends one chat entry per token to `content` (a cJSON array, borrowed):
 * {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}. Returns
 * 0 or RLAI_ERR_NOMEM. */
int rlai_logprobs_chat_append(const rlai_engine *e, const rlai_token_logprobs *lp, int n, cJSON *content);

/* A legacy-completions object for n tokens: {tokens, token_logprobs,
 * top_logprobs: [{token: logprob}], text_offset}. *offset is the character
 * offset of the first token in the choice's text and is advanced past the
 * n tokens. An entry without a distribution (the first prompt token of an
 * "echo", logprob NaN) gets null in token_logprobs and top_logprobs, as
 * OpenAI's. Returns a new object (caller owns) or NULL when out of memory. */
cJSON *rlai_logprobs_completion_json(const rlai_engine *e, const rlai_token_logprobs *lp, int n, size_t *offset);

/* The same legacy-completions object from chat entries {token, logprob,
 * top_logprobs: [{token, logprob}]} (a remote model's, host/upstream.h):
 * tokens and top_logprobs keyed by the entries' "token" strings (the
 * first of equal strings stays). entries is borrowed; *offset as above
 * (advanced by each token's characters). Returns a new object (caller
 * owns) or NULL when out of memory. */
cJSON *rlai_logprobs_completion_from_entries(const cJSON *entries, size_t *offset);

/* Wire entries (PROTOCOL.md 6.1, rlai_msg_text_logprob) from a remote
 * model's chat entries {token, logprob, bytes, top_logprobs: [{token,
 * logprob}]} (host/upstream.h): texts are borrowed from `entries`, which
 * must outlive *out; each entry's "bytes" (ints 0..255; absent or invalid
 * = not sent) are copied into *pool. Non-object entries are skipped, at
 * most RLAI_PROTO_MAX_TOP_LOGPROBS alternatives are kept. *out and *pool
 * are malloc'd (the caller frees both; NULL when there are none). Returns
 * the number of entries (>= 0) or RLAI_ERR_NOMEM. */
int rlai_logprobs_wire_entries(const cJSON *entries, rlai_msg_text_logprob **out, uint8_t **pool);

/* The number of UTF-8 characters (non-continuation bytes) in s[0..n). */
size_t rlai_utf8_chars(const char *s, size_t n);

#endif
