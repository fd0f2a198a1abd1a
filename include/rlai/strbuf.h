/* strbuf.h - a growing, NUL-terminated byte buffer for text the host
 * builds (HTTP bodies and SSE events, Prometheus pages). Part of
 * rlai_common; not installed.
 *
 * Zero-initialised it is empty and owns nothing. After a failed
 * allocation it keeps what it had and remembers the failure (oom): later
 * appends do nothing, so a caller can build a whole text and check once. */
#ifndef RLAI_STRBUF_H
#define RLAI_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct rlai_strbuf {
    char *p;        /* p[len] == 0 whenever p != NULL */
    size_t len, cap;
    bool oom;
} rlai_strbuf;

/* Makes room for n more bytes and the NUL (p may move). Returns 0 or
 * RLAI_ERR_NOMEM (then oom is set). */
int rlai_strbuf_grow(rlai_strbuf *b, size_t n);

/* Appends n bytes of data (copied). Returns 0 or RLAI_ERR_NOMEM. */
int rlai_strbuf_add(rlai_strbuf *b, const void *data, size_t n);

/* Appends the NUL-terminated string s. Returns 0 or RLAI_ERR_NOMEM. */
int rlai_strbuf_str(rlai_strbuf *b, const char *s);

/* Appends printf-style text. Returns 0 or RLAI_ERR_NOMEM (also for a
 * format vsnprintf refuses). */
int rlai_strbuf_printf(rlai_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Takes the text (caller frees it; NULL when nothing was ever added or
 * after a failure, which also frees it) and leaves b empty. */
char *rlai_strbuf_take(rlai_strbuf *b);

/* Frees the memory and leaves b empty (NULL is fine). */
void rlai_strbuf_free(rlai_strbuf *b);

#endif
