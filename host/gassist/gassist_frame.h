/* gassist_frame.h - G-Assist protocol V2 framing: a 4-byte big-endian
 * unsigned length N, then N bytes of UTF-8 JSON, in both directions
 * (shared/reference/g-assist-protocol.md section 3). A length of 0 is
 * rejected and a payload is at most GASSIST_FRAME_MAX bytes.
 *
 * The reader belongs to one thread (the bridge's reader). The writer may be
 * used from any thread: each frame is written whole under a mutex, so
 * frames of different threads never interleave.
 */
#ifndef GASSIST_FRAME_H
#define GASSIST_FRAME_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest payload accepted or sent: 10 MiB, the engine's limit. */
#define GASSIST_FRAME_MAX (10u << 20)

/* An announced length above the limit is skipped (its payload read and
 * thrown away) when it is at most this, so the stream stays in step. A
 * larger one cannot be a frame at all (a V1 engine writing bare JSON text
 * gives "{\"to" = 2065855599 bytes): the stream is lost. */
#define GASSIST_FRAME_DRAIN_MAX (64u << 20)

/* Soft outcomes of gassist_frame_read (>= 0); fatal ones are negative
 * rlai_error codes. */
enum gassist_frame_status {
    GASSIST_FRAME_OK = 0,        /* *payload holds a frame */
    GASSIST_FRAME_EOF = 1,       /* clean end of input at a frame boundary */
    GASSIST_FRAME_EMPTY = 2,     /* a length of 0 (rejected; nothing to skip) */
    GASSIST_FRAME_OVERSIZE = 3,  /* over GASSIST_FRAME_MAX: payload skipped */
};

typedef struct gassist_frame_reader {
    int fd;
    uint32_t last_length;        /* the length of the last header read */
} gassist_frame_reader;

void gassist_frame_reader_init(gassist_frame_reader *r, int fd);

/* Reads one frame. On GASSIST_FRAME_OK, *payload is a malloc'd buffer of
 * *len bytes plus a terminating NUL (caller frees). Other outcomes leave
 * *payload NULL. Negative returns: RLAI_ERR_PROTOCOL when the input ended
 * inside a frame or announced a length over GASSIST_FRAME_DRAIN_MAX (the
 * stream cannot be resynchronised), RLAI_ERR_IO on a read error,
 * RLAI_ERR_NOMEM. Blocks until a whole frame is in. */
int gassist_frame_read(gassist_frame_reader *r, char **payload, size_t *len);

typedef struct gassist_frame_writer {
    int fd;
    pthread_mutex_t mu;
    bool broken;                 /* a write failed: the peer is gone */
    uint64_t frames, bytes;      /* counters, under mu */
} gassist_frame_writer;

int gassist_frame_writer_init(gassist_frame_writer *w, int fd);
void gassist_frame_writer_destroy(gassist_frame_writer *w);

/* Writes header + payload as one frame, whole, under the mutex. Returns 0,
 * RLAI_ERR_INVALID_ARG for len 0, RLAI_ERR_TOO_LARGE over
 * GASSIST_FRAME_MAX, RLAI_ERR_DISCONNECTED when the peer has gone (then and
 * for every later call). Any thread. */
int gassist_frame_write(gassist_frame_writer *w, const void *payload, size_t len);

/* True once a write failed. */
bool gassist_frame_writer_broken(gassist_frame_writer *w);

#endif
