/* strbuf.c - growing text buffers (see rlai/strbuf.h). */
#include "rlai/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"

int rlai_strbuf_grow(rlai_strbuf *b, size_t n)
{
    if (b->oom)
        return RLAI_ERR_NOMEM;
    if (n > SIZE_MAX / 2 - b->len - 1) {
        b->oom = true;
        return RLAI_ERR_NOMEM;
    }
    if (b->len + n + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return RLAI_ERR_NOMEM;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

int rlai_strbuf_add(rlai_strbuf *b, const void *data, size_t n)
{
    if (rlai_strbuf_grow(b, n) < 0)
        return RLAI_ERR_NOMEM;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int rlai_strbuf_str(rlai_strbuf *b, const char *s)
{
    return rlai_strbuf_add(b, s, strlen(s));
}

int rlai_strbuf_printf(rlai_strbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return RLAI_ERR_NOMEM;
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->p ? b->cap - b->len : 0;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return RLAI_ERR_NOMEM;
    }
    if ((size_t)n < room) {
        b->len += (size_t)n;
        return 0;
    }
    if (rlai_strbuf_grow(b, (size_t)n) < 0)
        return RLAI_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

char *rlai_strbuf_take(rlai_strbuf *b)
{
    char *p = b->oom ? NULL : b->p;
    if (b->oom)
        free(b->p);
    memset(b, 0, sizeof(*b));
    return p;
}

void rlai_strbuf_free(rlai_strbuf *b)
{
    if (!b)
        return;
    free(b->p);
    memset(b, 0, sizeof(*b));
}
