/* sse.h - incremental parser of a text/event-stream (Server-Sent Events),
 * as an OpenAI-compatible server streams completions.
 *
 * Fed arbitrary byte chunks (a line, a field or a CR LF pair may be split
 * anywhere), it calls back once per dispatched event with the event name
 * ("" when the stream gave none) and the data: the `data:` lines of the
 * event joined with "\n" (one leading space after the colon is dropped).
 * Lines end with LF, CR LF or CR; an empty line dispatches the event;
 * comment lines (":" first) and `id:` / `retry:` fields are ignored, as are
 * unknown fields; a UTF-8 BOM at the very start is skipped. An event with
 * no data line is not dispatched. The parser never interprets the data
 * (a "[DONE]" sentinel is the caller's business).
 *
 * Limits: a line or an event's data longer than max_bytes is an error
 * (RLAI_ERR_TOO_LARGE) and the parser refuses further input. Not
 * thread-safe: one stream, one thread.
 */
#ifndef RLAI_HOST_SSE_H
#define RLAI_HOST_SSE_H

#include <stddef.h>

typedef struct rlai_sse rlai_sse;

/* Called once per event. event and data are NUL-terminated and valid
 * during the call only; len is data's length. Return 0 to go on, anything
 * else to stop (rlai_sse_feed returns it). */
typedef int (*rlai_sse_event_cb)(void *user, const char *event, const char *data, size_t len);

/* Creates a parser. max_bytes: longest line and event data (0 = 1 MiB).
 * *out owned by the caller (rlai_sse_free). Returns 0, RLAI_ERR_INVALID_ARG
 * (no callback) or RLAI_ERR_NOMEM. */
int rlai_sse_new(size_t max_bytes, rlai_sse_event_cb cb, void *user, rlai_sse **out);

/* Frees the parser (NULL is fine). */
void rlai_sse_free(rlai_sse *p);

/* Forgets everything buffered (a new stream starts; limits and callback
 * kept, an earlier error cleared). */
void rlai_sse_reset(rlai_sse *p);

/* Parses n bytes of buf (borrowed). Returns 0, the callback's non-zero
 * value when it asked to stop (the rest of buf is dropped: the caller is
 * ending the stream; a later feed starts on a fresh line), RLAI_ERR_TOO_LARGE or
 * RLAI_ERR_NOMEM (then every later feed returns the same error). */
int rlai_sse_feed(rlai_sse *p, const char *buf, size_t n);

/* True when bytes of an unfinished line or event are buffered (the stream
 * ended mid-event if it ends now). */
int rlai_sse_pending(const rlai_sse *p);

#endif
