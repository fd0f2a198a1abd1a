/* sse.c - incremental text/event-stream parser (see sse.h). */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

struct rlai_sse {
    rlai_sse_event_cb cb;
    void *user;
    size_t max;
    buf line;             /* the line being read (without its end) */
    buf data;             /* data lines of the current event, joined with \n */
    buf event;            /* event name of the current event */
    int has_data;         /* a data line was seen in this event */
    int after_cr;         /* the last byte was CR: a following LF belongs to it */
    int started;          /* a byte was seen (the BOM check is done) */
    int bom;              /* bytes of a BOM matched so far */
    int err;              /* sticky error */
};

static int buf_add(buf *b, const char *s, size_t n, size_t max)
{
    if (b->len + n > max)
        return RLAI_ERR_TOO_LARGE;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return RLAI_ERR_NOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int rlai_sse_new(size_t max_bytes, rlai_sse_event_cb cb, void *user, rlai_sse **out)
{
    if (!cb || !out)
        return RLAI_ERR_INVALID_ARG;
    rlai_sse *p = calloc(1, sizeof(*p));
    if (!p)
        return RLAI_ERR_NOMEM;
    p->cb = cb;
    p->user = user;
    p->max = max_bytes ? max_bytes : (size_t)1 << 20;
    *out = p;
    return 0;
}

void rlai_sse_free(rlai_sse *p)
{
    if (!p)
        return;
    free(p->line.p);
    free(p->data.p);
    free(p->event.p);
    free(p);
}

void rlai_sse_reset(rlai_sse *p)
{
    if (!p)
        return;
    p->line.len = p->data.len = p->event.len = 0;
    p->has_data = p->after_cr = p->started = p->bom = p->err = 0;
}

int rlai_sse_pending(const rlai_sse *p)
{
    return p && (p->line.len > 0 || p->has_data || p->event.len > 0 || p->bom > 0);
}

/* One complete line (p->line). Returns 0 or an error; *stop receives the
 * callback's value when an event was dispatched. */
static int take_line(rlai_sse *p, int *stop)
{
    const char *l = p->line.p ? p->line.p : "";
    size_t n = p->line.len;
    int rc = 0;
    if (n == 0) {                                  /* dispatch */
        if (p->has_data) {
            static const char empty[1] = "";
            *stop = p->cb(p->user, p->event.len ? p->event.p : empty, p->data.p ? p->data.p : empty,
                          p->data.len);
        }
        p->data.len = 0;
        p->event.len = 0;
        if (p->data.p)
            p->data.p[0] = 0;
        p->has_data = 0;
        return 0;
    }
    if (l[0] == ':') {                             /* comment */
        p->line.len = 0;
        return 0;
    }
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    size_t vl = (size_t)(l + n - v);
    if (vl && *v == ' ') {
        v++;
        vl--;
    }
    if (fl == 4 && !memcmp(l, "data", 4)) {
        if (p->has_data)
            rc = buf_add(&p->data, "\n", 1, p->max);
        if (rc == 0)
            rc = buf_add(&p->data, v, vl, p->max);
        p->has_data = 1;
    } else if (fl == 5 && !memcmp(l, "event", 5)) {
        p->event.len = 0;
        rc = buf_add(&p->event, v, vl, p->max);
    }                                              /* id, retry, others: ignored */
    p->line.len = 0;
    return rc;
}

int rlai_sse_feed(rlai_sse *p, const char *b, size_t n)
{
    if (!p || (!b && n))
        return RLAI_ERR_INVALID_ARG;
    if (p->err)
        return p->err;
    size_t i = 0;
    static const unsigned char bom[3] = { 0xEF, 0xBB, 0xBF };
    while (!p->started && i < n) {                 /* a BOM, possibly split across feeds */
        if ((unsigned char)b[i] == bom[p->bom]) {
            p->bom++;
            i++;
            if (p->bom == 3) {
                p->started = 1;
                p->bom = 0;
            }
            continue;
        }
        /* not a BOM: whatever was matched of one is ordinary text */
        p->started = 1;
        if (p->bom) {
            int rc = buf_add(&p->line, (const char *)bom, (size_t)p->bom, p->max);
            p->bom = 0;
            if (rc < 0)
                return p->err = rc;
        }
    }
    while (i < n) {
        char c = b[i];
        if (p->after_cr) {
            p->after_cr = 0;
            if (c == '\n') {
                i++;
                continue;
            }
        }
        if (c == '\n' || c == '\r') {
            p->after_cr = c == '\r';
            i++;
            int stop = 0;
            int rc = take_line(p, &stop);
            if (rc < 0)
                return p->err = rc;
            if (stop) {
                p->line.len = 0;
                p->after_cr = 0;
                return stop;
            }
            continue;
        }
        /* the run of ordinary bytes up to the next line end */
        size_t j = i;
        while (j < n && b[j] != '\n' && b[j] != '\r')
            j++;
        int rc = buf_add(&p->line, b + i, j - i, p->max);
        if (rc < 0)
            return p->err = rc;
        i = j;
    }
    return 0;
}
