/* rlai/error.h - the one error table of RTX-LocalAI.
 *
 * Two X-macro tables generate every error enum, name, message and mapping
 * in the project (the idea of libuv's UV_ERRNO_MAP), so the engine, the
 * wire protocol, the HTTP front and the Python SDK cannot drift apart:
 *
 *   RLAI_WIRE_CODE_MAP  the wire protocol's error codes (positive; sent in
 *                       `error` frames, proto/PROTOCOL.md section 8).
 *   RLAI_ERROR_MAP      the C API's error codes (negative; 0 is success),
 *                       each with the wire code, HTTP status and OpenAI
 *                       error code it is reported as.
 *
 * tests/test_error.c checks the tables against each other and against
 * PROTOCOL.md; sdk/python/tests/test_errors.py checks the SDK's
 * exception classes against RLAI_WIRE_CODE_MAP. */
#ifndef RLAI_ERROR_H
#define RLAI_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, code, meaning) -- wire codes, 1..2^31-1; never reuse a number. */
#define RLAI_WIRE_CODE_MAP(X)                                                                       \
    X(BAD_FRAME, 1, "not msgpack, not a map, truncated, trailing bytes, empty")                     \
    X(BAD_VERSION, 2, "`v` missing or not 1")                                                      \
    X(BAD_REQUEST, 3, "missing or ill-typed field, value out of range, unknown type, invalid UTF-8, " \
                      "duplicate field")                                                           \
    X(TOO_LARGE, 4, "frame, string, array, nesting or prompt over a limit")                        \
    X(BUSY, 5, "too many requests in flight (per client or in total)")                             \
    X(NOT_FOUND, 6, "unknown command or cancel target")                                           \
    X(CANCELLED, 7, "request cancelled or engine shutting down")                                   \
    X(CONTEXT_FULL, 8, "prompt plus generation exceed the context")                                \
    X(ENGINE, 9, "inference failed")                                                              \
    X(DUPLICATE_ID, 10, "id already in flight for this client")                                    \
    X(SHUTDOWN, 11, "engine stopping: request not run")                                            \
    X(INTERNAL, 12, "daemon bug or out of memory")                                                 \
    X(NOT_IMPLEMENTED, 13, "request type or feature not supported by this daemon")                 \
    X(TIMEOUT, 14, "the request ran past its deadline (a `call` past its `timeout_ms`)")

/* X(NAME, code, wire code NAME, HTTP status, OpenAI error code or NULL,
 *   message) -- C API codes. The HTTP front answers `status` with
 * `{"error": {"code": <OpenAI code, else the status' default>, ...}}`. */
#define RLAI_ERROR_MAP(X)                                                                           \
    X(NOMEM, -1, INTERNAL, 500, NULL, "out of memory")                                              \
    X(IO, -2, ENGINE, 500, NULL, "I/O error (file could not be opened, read or mapped)")           \
    X(FORMAT, -3, BAD_REQUEST, 400, NULL, "malformed input (file or data is corrupt or hostile)")  \
    X(UNSUPPORTED, -4, NOT_IMPLEMENTED, 501, NULL, "unsupported feature, type or architecture")     \
    X(INVALID_ARG, -5, BAD_REQUEST, 400, NULL, "invalid argument")                                 \
    X(CONTEXT_FULL, -6, CONTEXT_FULL, 400, "context_length_exceeded", "context length exceeded")   \
    X(KV_FULL, -7, CONTEXT_FULL, 400, "context_length_exceeded", "KV cache has no free blocks")    \
    X(CANCELLED, -8, CANCELLED, 503, "shutdown", "cancelled")                                      \
    X(NOT_FOUND, -9, NOT_FOUND, 404, NULL, "not found")                                            \
    X(NOT_IMPLEMENTED, -10, NOT_IMPLEMENTED, 501, NULL, "not implemented in this build")           \
    X(TOKENIZER, -11, BAD_REQUEST, 400, NULL, "text could not be tokenized")                       \
    X(TOO_LARGE, -12, TOO_LARGE, 413, NULL, "input exceeds a configured limit")                    \
    X(TIMEOUT, -13, TIMEOUT, 504, "timeout", "timed out")                                          \
    X(DISCONNECTED, -14, ENGINE, 503, NULL, "engine not reachable or connection lost")             \
    X(BUSY, -15, BUSY, 429, "rate_limit_exceeded", "engine busy: too many requests in flight")     \
    X(PROTOCOL, -16, BAD_REQUEST, 400, NULL, "protocol error: malformed or unexpected message")    \
    X(EXISTS, -17, BAD_REQUEST, 409, NULL, "already exists (name taken)")                          \
    X(ABI, -18, ENGINE, 500, NULL, "incompatible plugin ABI version or build signature")

/* Error codes: always negative. */
enum rlai_error {
    RLAI_OK = 0,
#define RLAI_X_(name, code, wire, http, oai, msg) RLAI_ERR_##name = code,
    RLAI_ERROR_MAP(RLAI_X_)
#undef RLAI_X_
};

/* Wire protocol error codes (positive), as sent in `error` frames. */
enum rlai_wire_code {
#define RLAI_X_(name, code, meaning) RLAI_PE_##name = code,
    RLAI_WIRE_CODE_MAP(RLAI_X_)
#undef RLAI_X_
};

/* Static English description of an error code; never NULL
 * ("unknown error" for a code not in the table). */
const char *rlai_strerror(int code);

/* Static name of an error code without its prefix ("KV_FULL", "OK" for 0,
 * "UNKNOWN" for a code not in the table); never NULL. */
const char *rlai_err_name(int code);

/* The wire code (RLAI_PE_*) an error is reported as; ENGINE for a code not
 * in the table, INTERNAL for 0 (success is never an error frame). */
int rlai_err_wire_code(int code);

/* The HTTP status an error is answered with (500 for a code not in the
 * table); *oai_code (may be NULL) receives the OpenAI error code or NULL
 * (then the front uses the status' default). Static strings. */
int rlai_err_http_status(int code, const char **oai_code);

/* Static name of a wire code ("BAD_REQUEST"), "UNKNOWN" if not in the
 * table; rlai_wire_code_meaning gives its PROTOCOL.md meaning ("" if not). */
const char *rlai_wire_code_name(int wire_code);
const char *rlai_wire_code_meaning(int wire_code);

/* The one error-buffer helper: formats a one-line reason into err (when
 * err is not NULL and errlen > 0; truncated to fit, always terminated) and
 * returns code, so a failure path reads
 *     return rlai_errf(err, errlen, RLAI_ERR_IO, "cannot read %s", path);
 * The caller owns err. */
int rlai_errf(char *err, size_t errlen, int code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
