/* fuzz_proto.c - libFuzzer target for the wire protocol decoder.
 *
 * Decodes the input. A failure must come with a protocol code and a
 * message and leave nothing allocated. A success must re-encode; the
 * encoding must decode again to the same type, id (and result data), and
 * re-encode to the same bytes (the encoding is canonical). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exact-size copy: reads past the end are caught by ASan. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    char err[256];
    rlai_msg m;
    int rc = rlai_proto_decode(buf, size, &m, err, sizeof err);
    free(buf);
    if (rc != 0) {
        if (rc > -RLAI_PE_BAD_FRAME || rc < -RLAI_PE_NOT_IMPLEMENTED || err[0] == '\0') abort();
        rlai_msg_free(&m);
        return 0;
    }
    if (m.version != RLAI_PROTO_VERSION || rlai_msg_type_name(m.type) == NULL) abort();

    rlai_buf b1, b2;
    rlai_buf_init(&b1);
    rlai_buf_init(&b2);
    rc = rlai_proto_encode(&m, &b1);
    if (rc != 0) {
        /* only a frame at the size limit may grow past it (floats, metrics) */
        if (rc != -RLAI_PE_TOO_LARGE || size + 512 < RLAI_PROTO_MAX_FRAME) abort();
        rlai_msg_free(&m);
        rlai_buf_free(&b1);
        return 0;
    }
    rlai_msg m2;
    rc = rlai_proto_decode(b1.data, b1.len, &m2, err, sizeof err);
    if (rc != 0 || m2.type != m.type || m2.id != m.id) abort();
    if (m.type == RLAI_MSG_RESULT &&
        (m2.u.result.len != m.u.result.len ||
         memcmp(m2.u.result.data, m.u.result.data, m.u.result.len) != 0))
        abort();
    if (rlai_proto_encode(&m2, &b2) != 0 || b2.len != b1.len || memcmp(b1.data, b2.data, b1.len) != 0)
        abort();
    rlai_msg_free(&m2);
    rlai_msg_free(&m);
    rlai_buf_free(&b1);
    rlai_buf_free(&b2);
    return 0;
}
