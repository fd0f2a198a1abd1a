/* frame.h - length-prefixed framing for the named pipe: each msgpack
 * message is preceded by its length as a 4-byte big-endian integer.
 * A zero length or one above the configured maximum is a framing error
 * (the connection is then closed). The reader is incremental: feed it
 * whatever read() returned. */
#ifndef RLAI_IPC_FRAME_H
#define RLAI_IPC_FRAME_H

#include <stddef.h>
#include <stdint.h>

typedef struct rlai_frame_reader {
    size_t max_frame;
    unsigned char hdr[4];
    size_t hdr_len;
    unsigned char *body;   /* malloc'd, owned */
    size_t body_len, body_cap;
    uint32_t want;         /* body length announced by the header (0 = reading header) */
} rlai_frame_reader;

/* Initialises a caller-owned reader (max_frame 0 = RLAI_PROTO_MAX_FRAME).
 * Release its buffer with rlai_frame_reader_free (accepts NULL). After an
 * error return the reader must not be fed again. */
void rlai_frame_reader_init(rlai_frame_reader *r, size_t max_frame);
void rlai_frame_reader_free(rlai_frame_reader *r);

/* Consumes bytes from data[0..len). Returns: 1 when a whole frame is ready
 * (*frame / *frame_len valid until the next call and while data is; the
 * frame may point into data or into the reader's buffer, owned by them;
 * *used = bytes consumed, call again with the rest), 0 when all input was consumed without
 * completing a frame, or a negative rlai_error (RLAI_ERR_PROTOCOL for a
 * zero length, RLAI_ERR_TOO_LARGE for an oversize one, RLAI_ERR_NOMEM). */
int rlai_frame_reader_feed(rlai_frame_reader *r, const void *data, size_t len, size_t *used,
                           const void **frame, size_t *frame_len);

/* Writes the 4-byte big-endian header for a payload of len bytes. */
void rlai_frame_header(uint32_t len, unsigned char out[4]);

#endif
