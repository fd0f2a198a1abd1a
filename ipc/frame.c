/* frame.c - incremental reader for 4-byte big-endian length-prefixed
 * frames (the named-pipe transport). See frame.h. */
#include "frame.h"

#include <stdlib.h>
#include <string.h>

#include "rlai/error.h"
#include "rlai/protocol.h"

/* Body buffers above this size are released once a small frame follows,
 * so an idle connection does not keep a multi-megabyte buffer. */
#define FRAME_KEEP_CAP (1u << 20)
/* First allocation for a body: grown as bytes actually arrive, so a peer
 * announcing a large frame and sending nothing costs little memory. */
#define FRAME_FIRST_CAP (64u << 10)

void rlai_frame_reader_init(rlai_frame_reader *r, size_t max_frame)
{
    memset(r, 0, sizeof *r);
    if (max_frame == 0)
        max_frame = RLAI_PROTO_MAX_FRAME;
    if (max_frame > UINT32_MAX)
        max_frame = UINT32_MAX;
    r->max_frame = max_frame;
}

void rlai_frame_reader_free(rlai_frame_reader *r)
{
    if (!r)
        return;
    free(r->body);
    r->body = NULL;
    r->body_len = r->body_cap = 0;
    r->hdr_len = 0;
    r->want = 0;
}

void rlai_frame_header(uint32_t len, unsigned char out[4])
{
    out[0] = (unsigned char)(len >> 24);
    out[1] = (unsigned char)(len >> 16);
    out[2] = (unsigned char)(len >> 8);
    out[3] = (unsigned char)len;
}

static uint32_t read_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Makes room for at least `need` body bytes (need <= r->want). */
static int body_reserve(rlai_frame_reader *r, size_t need)
{
    if (need <= r->body_cap)
        return 0;
    size_t cap = r->body_cap ? r->body_cap : FRAME_FIRST_CAP;
    while (cap < need)
        cap *= 2;
    if (cap > r->want)
        cap = r->want;
    unsigned char *nb = realloc(r->body, cap);
    if (!nb)
        return RLAI_ERR_NOMEM;
    r->body = nb;
    r->body_cap = cap;
    return 0;
}

static int check_len(const rlai_frame_reader *r, uint32_t n)
{
    if (n == 0)
        return RLAI_ERR_PROTOCOL;
    if (n > r->max_frame)
        return RLAI_ERR_TOO_LARGE;
    return 0;
}

int rlai_frame_reader_feed(rlai_frame_reader *r, const void *data, size_t len, size_t *used,
                           const void **frame, size_t *frame_len)
{
    const unsigned char *p = data;
    size_t off = 0;
    *used = 0;

    /* Fast path: a whole frame lies in the input and nothing is buffered;
     * hand it out in place (valid as long as the caller's data is). */
    if (r->hdr_len == 0 && r->want == 0 && len >= 4) {
        uint32_t n = read_be32(p);
        int rc = check_len(r, n);
        if (rc < 0)
            return rc;
        if (len - 4 >= n) {
            *frame = p + 4;
            *frame_len = n;
            *used = 4 + (size_t)n;
            return 1;
        }
    }

    while (off < len) {
        if (r->want == 0) {
            size_t take = 4 - r->hdr_len;
            if (take > len - off)
                take = len - off;
            memcpy(r->hdr + r->hdr_len, p + off, take);
            r->hdr_len += take;
            off += take;
            if (r->hdr_len < 4)
                break;
            uint32_t n = read_be32(r->hdr);
            int rc = check_len(r, n);
            if (rc < 0) {
                *used = off;
                return rc;
            }
            r->want = n;
            r->body_len = 0;
            if (r->body_cap > FRAME_KEEP_CAP && n <= FRAME_FIRST_CAP) {
                free(r->body);
                r->body = NULL;
                r->body_cap = 0;
            }
        }
        size_t take = r->want - r->body_len;
        if (take > len - off)
            take = len - off;
        int rc = body_reserve(r, r->body_len + take);
        if (rc < 0) {
            *used = off;
            return rc;
        }
        if (take) {
            memcpy(r->body + r->body_len, p + off, take);
            r->body_len += take;
            off += take;
        }
        if (r->body_len == r->want) {
            *frame = r->body;
            *frame_len = r->want;
            *used = off;
            r->hdr_len = 0;
            r->want = 0;
            r->body_len = 0;
            return 1;
        }
    }
    *used = off;
    return 0;
}
