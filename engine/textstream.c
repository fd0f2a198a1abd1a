/* textstream.c - UTF-8-safe streaming with stop strings (see textstream.h).
 *
 * Two stages:
 *   1. A streaming UTF-8 decoder (WHATWG rules: overlongs, surrogates and
 *      code points above U+10FFFF are invalid; each maximal invalid
 *      subsequence becomes one U+FFFD) turns the raw bytes into valid UTF-8.
 *      Up to 3 bytes of an incomplete character are kept in its state.
 *   2. A stop matcher over that valid text. It keeps the longest suffix that
 *      is a proper prefix of some stop string and releases the rest. When
 *      stop strings complete, the one that ends first wins (ties: the one
 *      that starts first), so the result does not depend on how the input
 *      is split into pushes.
 *
 * Stop strings are themselves passed through the decoder at creation (so an
 * invalid stop string matches the U+FFFD text it would produce); empty stop
 * strings are ignored. Because both the text and the stop strings are valid
 * UTF-8, released text always ends on a character boundary.
 *
 * After a stop matched the stream stays stopped until reset: push returns
 * true with empty output and flush releases nothing.
 *
 * If memory for the internal buffers cannot be obtained (they grow only when
 * one push delivers more bytes than ever before), push drops the input,
 * returns true with empty output and the stream stays stopped, so a caller
 * ends generation cleanly. */
#include "textstream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/engine.h"

typedef struct utf8dec {
    unsigned char part[4];
    int npart;           /* bytes of the current incomplete character */
    int need;            /* continuation bytes still needed */
    unsigned char lo, hi;/* allowed range of the next continuation byte */
} utf8dec;

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

struct rlai_textstream {
    char **stops;
    size_t *stop_len;
    int n_stops;
    utf8dec dec;
    buf hold;            /* decoded text not yet released */
    buf out;             /* text returned by the last call */
    bool stopped;
};

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

static bool buf_reserve(buf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return false;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

/* Caller reserved room. */
static void buf_put(buf *b, const void *s, size_t n)
{
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* ---- stage 1: UTF-8 decoding --------------------------------------------- */

/* Decodes one byte into b (which has room for at least 6 more bytes). */
static void dec_byte(utf8dec *d, buf *b, unsigned char c)
{
    for (;;) {
        if (d->need == 0) {
            if (c < 0x80) {
                b->p[b->len++] = (char)c;
                return;
            }
            d->lo = 0x80;
            d->hi = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) {
                d->need = 1;
            } else if (c >= 0xE0 && c <= 0xEF) {
                d->need = 2;
                if (c == 0xE0)
                    d->lo = 0xA0;
                else if (c == 0xED)
                    d->hi = 0x9F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                d->need = 3;
                if (c == 0xF0)
                    d->lo = 0x90;
                else if (c == 0xF4)
                    d->hi = 0x8F;
            } else {
                buf_put(b, REPL, 3);
                return;
            }
            d->part[0] = c;
            d->npart = 1;
            return;
        }
        if (c >= d->lo && c <= d->hi) {
            d->part[d->npart++] = c;
            d->lo = 0x80;
            d->hi = 0xBF;
            if (--d->need == 0) {
                buf_put(b, d->part, (size_t)d->npart);
                d->npart = 0;
            }
            return;
        }
        /* invalid continuation: replace what we have, then retry c afresh */
        buf_put(b, REPL, 3);
        d->need = 0;
        d->npart = 0;
    }
}

static void dec_flush(utf8dec *d, buf *b)
{
    if (d->need > 0)
        buf_put(b, REPL, 3);
    d->need = 0;
    d->npart = 0;
}

/* Worst case growth of decoding n bytes: every byte becomes U+FFFD, plus
 * a pending partial being replaced. */
static size_t dec_bound(size_t n)
{
    return n > (SIZE_MAX - 8) / 3 ? SIZE_MAX : 3 * n + 6;
}

/* ---- stage 2: stop matching ---------------------------------------------- */

static const char *find_bytes(const char *h, size_t hlen, const char *n, size_t nlen)
{
    if (hlen < nlen)
        return NULL;
    for (size_t i = 0; i + nlen <= hlen; i++)
        if (h[i] == n[0] && memcmp(h + i, n, nlen) == 0)
            return h + i;
    return NULL;
}

/* Finds the stop match that ends first (then starts first) in hold. */
static bool find_stop(const rlai_textstream *ts, size_t *start)
{
    bool found = false;
    size_t best_end = 0, best_start = 0;
    for (int i = 0; i < ts->n_stops; i++) {
        const char *m = find_bytes(ts->hold.p, ts->hold.len, ts->stops[i], ts->stop_len[i]);
        if (!m)
            continue;
        size_t s = (size_t)(m - ts->hold.p);
        size_t e = s + ts->stop_len[i];
        if (!found || e < best_end || (e == best_end && s < best_start)) {
            found = true;
            best_end = e;
            best_start = s;
        }
    }
    *start = best_start;
    return found;
}

/* Length of the longest suffix of hold that is a proper prefix of a stop. */
static size_t held_suffix(const rlai_textstream *ts)
{
    size_t best = 0;
    const size_t hl = ts->hold.len;
    for (int i = 0; i < ts->n_stops; i++) {
        size_t sl = ts->stop_len[i];
        size_t L = sl - 1 < hl ? sl - 1 : hl;
        for (; L > best; L--) {
            if (memcmp(ts->hold.p + hl - L, ts->stops[i], L) == 0) {
                best = L;
                break;
            }
        }
    }
    return best;
}

/* Moves the first n bytes of hold to out (out has room). */
static void release(rlai_textstream *ts, size_t n)
{
    buf_put(&ts->out, ts->hold.p, n);
    memmove(ts->hold.p, ts->hold.p + n, ts->hold.len - n);
    ts->hold.len -= n;
}

/* Releases what can be released; returns true on a stop match. If `final`,
 * nothing is kept for a possible later match. */
static bool process(rlai_textstream *ts, bool final)
{
    size_t start;
    if (find_stop(ts, &start)) {
        release(ts, start);
        ts->hold.len = 0;
        ts->stopped = true;
        return true;
    }
    size_t keep = final ? 0 : held_suffix(ts);
    release(ts, ts->hold.len - keep);
    return false;
}

/* ---- public -------------------------------------------------------------- */

/* Frees ts and everything it owns (pointers returned by push/flush become
 * invalid). Accepts NULL. */
void rlai_textstream_free(rlai_textstream *ts)
{
    if (!ts)
        return;
    for (int i = 0; i < ts->n_stops; i++)
        free(ts->stops[i]);
    free(ts->stops);
    free(ts->stop_len);
    free(ts->hold.p);
    free(ts->out.p);
    free(ts);
}

/* Returns 0, RLAI_ERR_INVALID_ARG (out NULL) or RLAI_ERR_NOMEM. On success
 * *out owns a new stream freed with rlai_textstream_free(); the stop strings
 * are copied (stops and its strings stay owned by the caller). */
int rlai_textstream_new(const char *const *stops, rlai_textstream **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    rlai_textstream *ts = calloc(1, sizeof(*ts));
    if (!ts)
        return RLAI_ERR_NOMEM;
    int n = 0;
    if (stops)
        while (stops[n])
            n++;
    if (n > 0) {
        ts->stops = calloc((size_t)n, sizeof(*ts->stops));
        ts->stop_len = calloc((size_t)n, sizeof(*ts->stop_len));
        if (!ts->stops || !ts->stop_len)
            goto nomem;
    }
    for (int i = 0; i < n; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0)
            continue;
        buf b = {0};
        if (!buf_reserve(&b, dec_bound(sl)))
            goto nomem;
        utf8dec d = {0};
        for (size_t j = 0; j < sl; j++)
            dec_byte(&d, &b, (unsigned char)stops[i][j]);
        dec_flush(&d, &b);
        b.p[b.len] = '\0';
        ts->stops[ts->n_stops] = b.p;
        ts->stop_len[ts->n_stops] = b.len;
        ts->n_stops++;
    }
    if (!buf_reserve(&ts->hold, 256) || !buf_reserve(&ts->out, 256))
        goto nomem;
    *out = ts;
    return RLAI_OK;
nomem:
    rlai_textstream_free(ts);
    return RLAI_ERR_NOMEM;
}

/* Drops held bytes and the stopped state; keeps the stop strings. */
void rlai_textstream_reset(rlai_textstream *ts)
{
    if (!ts)
        return;
    memset(&ts->dec, 0, sizeof(ts->dec));
    ts->hold.len = 0;
    ts->out.len = 0;
    ts->stopped = false;
}

/* bytes (caller-owned) may be NULL when len is 0. *out (never NULL, NUL-
 * terminated) is owned by ts and valid until the next call on ts. */
bool rlai_textstream_push(rlai_textstream *ts, const char *bytes, size_t len,
                          const char **out, size_t *out_len)
{
    static const char empty[1] = "";
    if (out)
        *out = empty;
    if (out_len)
        *out_len = 0;
    if (!ts)
        return false;
    ts->out.len = 0;
    if (ts->stopped)
        return true;
    if (!bytes)
        len = 0;

    size_t grow = dec_bound(len);
    if (!buf_reserve(&ts->hold, grow) || !buf_reserve(&ts->out, ts->hold.len + grow)) {
        ts->stopped = true;
        return true;
    }
    for (size_t i = 0; i < len; i++)
        dec_byte(&ts->dec, &ts->hold, (unsigned char)bytes[i]);
    bool stop = process(ts, false);
    ts->out.p[ts->out.len] = '\0';
    if (out)
        *out = ts->out.p;
    if (out_len)
        *out_len = ts->out.len;
    return stop;
}

/* Releases held text (a stop string that can no longer complete is text;
 * an incomplete character becomes U+FFFD). *out as for push. The stream can
 * be pushed to again afterwards. */
void rlai_textstream_flush(rlai_textstream *ts, const char **out, size_t *out_len)
{
    static const char empty[1] = "";
    if (out)
        *out = empty;
    if (out_len)
        *out_len = 0;
    if (!ts)
        return;
    ts->out.len = 0;
    if (ts->stopped)
        return;
    if (!buf_reserve(&ts->hold, 3) || !buf_reserve(&ts->out, ts->hold.len + 3))
        return;
    dec_flush(&ts->dec, &ts->hold);
    process(ts, true);
    ts->out.p[ts->out.len] = '\0';
    if (out)
        *out = ts->out.p;
    if (out_len)
        *out_len = ts->out.len;
}
