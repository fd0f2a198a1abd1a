/* json_msgpack.h - cJSON value to msgpack (for `result` frames and the
 * command registry). Numbers that are whole and fit int64 become msgpack
 * integers, others floats; nesting deeper than RLAI_PROTO_MAX_DEPTH is
 * refused so a frame always decodes on the client side. */
#ifndef RLAI_HOST_JSON_MSGPACK_H
#define RLAI_HOST_JSON_MSGPACK_H

#include <cjson/cJSON.h>
#include <msgpack.h>

/* Appends the encoding of v (borrowed) to the packer. Returns 0, or
 * RLAI_ERR_TOO_LARGE when v nests deeper than RLAI_PROTO_MAX_DEPTH, or
 * RLAI_ERR_INVALID_ARG for a NULL / invalid value (the packer may then
 * hold a partial value: discard its buffer). */
int rlai_json_to_msgpack(const cJSON *v, msgpack_packer *pk);

/* The reverse, for printing: maps with non-string keys get the keys' JSON
 * text as key; binary and ext values become strings of their length.
 * Exact when printed: integers of more than 15 digits (any u64 / i64), strings holding
 * NUL and maps with a key holding NUL become cJSON raw nodes with their
 * exact JSON text (\u0000 escapes); keys of any length are kept whole.
 * Returns a new cJSON value (caller owns) or NULL when out of memory. */
cJSON *rlai_msgpack_to_json(const msgpack_object *o);

#endif
