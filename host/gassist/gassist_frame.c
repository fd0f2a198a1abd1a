/* gassist_frame.c - length-prefixed frames on file descriptors. */
#include "gassist_frame.h"

#include "rlai/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gassist_frame_reader_init(gassist_frame_reader *r, int fd)
{
    r->fd = fd;
    r->last_length = 0;
}

/* Reads exactly n bytes. Returns n, the smaller count read before end of
 * input, or RLAI_ERR_IO. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return RLAI_ERR_IO;
        }
        if (k == 0)
            break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* Reads and discards n bytes. Returns 0, RLAI_ERR_PROTOCOL at end of input,
 * RLAI_ERR_IO. */
static int skip(int fd, size_t n)
{
    char buf[65536];
    while (n > 0) {
        size_t want = n < sizeof(buf) ? n : sizeof(buf);
        ssize_t k = read_full(fd, buf, want);
        if (k < 0)
            return (int)k;
        if ((size_t)k < want)
            return RLAI_ERR_PROTOCOL;
        n -= want;
    }
    return 0;
}

int gassist_frame_read(gassist_frame_reader *r, char **payload, size_t *len)
{
    *payload = NULL;
    *len = 0;
    unsigned char h[4];
    ssize_t k = read_full(r->fd, h, sizeof(h));
    if (k < 0)
        return (int)k;
    if (k == 0)
        return GASSIST_FRAME_EOF;
    if (k < 4)
        return RLAI_ERR_PROTOCOL;
    uint32_t n = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    r->last_length = n;
    if (n == 0)
        return GASSIST_FRAME_EMPTY;
    if (n > GASSIST_FRAME_MAX) {
        if (n > GASSIST_FRAME_DRAIN_MAX)
            return RLAI_ERR_PROTOCOL;
        int rc = skip(r->fd, n);
        return rc < 0 ? rc : GASSIST_FRAME_OVERSIZE;
    }
    char *p = malloc((size_t)n + 1);
    if (!p)
        return RLAI_ERR_NOMEM;
    k = read_full(r->fd, p, n);
    if (k < 0 || (size_t)k < n) {
        free(p);
        return k < 0 ? (int)k : RLAI_ERR_PROTOCOL;
    }
    p[n] = 0;
    *payload = p;
    *len = n;
    return GASSIST_FRAME_OK;
}

int gassist_frame_writer_init(gassist_frame_writer *w, int fd)
{
    memset(w, 0, sizeof(*w));
    w->fd = fd;
    return pthread_mutex_init(&w->mu, NULL) ? RLAI_ERR_NOMEM : 0;
}

void gassist_frame_writer_destroy(gassist_frame_writer *w)
{
    pthread_mutex_destroy(&w->mu);
}

static int write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(fd, (const char *)buf + done, n - done);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return RLAI_ERR_DISCONNECTED;
        }
        done += (size_t)k;
    }
    return 0;
}

int gassist_frame_write(gassist_frame_writer *w, const void *payload, size_t len)
{
    if (len == 0)
        return RLAI_ERR_INVALID_ARG;
    if (len > GASSIST_FRAME_MAX)
        return RLAI_ERR_TOO_LARGE;
    unsigned char h[4] = { (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                           (unsigned char)(len >> 8), (unsigned char)len };
    pthread_mutex_lock(&w->mu);
    int rc = RLAI_ERR_DISCONNECTED;
    if (!w->broken) {
        /* Small frames go out in one write so a reader never sees a header
         * without its payload for long. */
        if (len <= 4096 - 4) {
            unsigned char buf[4096];
            memcpy(buf, h, 4);
            memcpy(buf + 4, payload, len);
            rc = write_full(w->fd, buf, len + 4);
        } else {
            rc = write_full(w->fd, h, 4);
            if (rc == 0)
                rc = write_full(w->fd, payload, len);
        }
        if (rc < 0) {
            w->broken = true;
        } else {
            w->frames++;
            w->bytes += len + 4;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

bool gassist_frame_writer_broken(gassist_frame_writer *w)
{
    pthread_mutex_lock(&w->mu);
    bool b = w->broken;
    pthread_mutex_unlock(&w->mu);
    return b;
}
