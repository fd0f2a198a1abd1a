/* textstream.h - turns a stream of token byte pieces into UTF-8 text that
 * never splits a character, and watches for stop strings.
 *
 * Bytes are held back while they could be (a) the start of an incomplete
 * UTF-8 character or (b) a prefix of a stop string; everything else is
 * released. When a stop string completes, the text before it is released
 * and the stop string itself is dropped. Invalid UTF-8 bytes are released
 * as U+FFFD so output is always valid UTF-8. */
#ifndef RLAI_TEXTSTREAM_H
#define RLAI_TEXTSTREAM_H

#include <stddef.h>
#include <stdbool.h>

typedef struct rlai_textstream rlai_textstream;

/* stops: NULL-terminated list (copied), may be NULL. *out owned by caller. */
int rlai_textstream_new(const char *const *stops, rlai_textstream **out);
void rlai_textstream_free(rlai_textstream *ts);
void rlai_textstream_reset(rlai_textstream *ts);

/* Feeds bytes. Sets *out and *out_len to text that may be emitted now (valid
 * until the next call; owned by ts). Returns true if a stop string matched
 * (generation should end; *out holds the text before it). */
bool rlai_textstream_push(rlai_textstream *ts, const char *bytes, size_t len,
                          const char **out, size_t *out_len);
/* At the end of generation: releases whatever is held (incomplete UTF-8
 * becomes U+FFFD). */
void rlai_textstream_flush(rlai_textstream *ts, const char **out, size_t *out_len);

#endif
