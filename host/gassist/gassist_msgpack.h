/* gassist_msgpack.h - converts one msgpack value (the "data" of a protocol
 * `result` frame, kept encoded by rlai/protocol.h) into cJSON, so the
 * bridge and the manifest generator need no msgpack library.
 *
 * Maps must have string (or integer, converted to decimal text) keys; bin
 * and ext values are refused, as JSON has no equivalent. Nesting is
 * bounded by GASSIST_MSGPACK_MAX_DEPTH. Never reads outside data[0..len).
 */
#ifndef GASSIST_MSGPACK_H
#define GASSIST_MSGPACK_H

#include <stddef.h>

#include <cjson/cJSON.h>

#define GASSIST_MSGPACK_MAX_DEPTH 32

/* Decodes exactly one value filling data[0..len). Returns 0 and sets *out
 * (caller deletes), or RLAI_ERR_FORMAT (truncated, trailing bytes, an
 * unsupported type, too deep) / RLAI_ERR_NOMEM with a message in err. */
int gassist_msgpack_to_json(const void *data, size_t len, cJSON **out, char *err, size_t errlen);

#endif
