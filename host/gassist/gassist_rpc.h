/* gassist_rpc.h - JSON-RPC 2.0 messages of G-Assist protocol V2: parsing
 * and validating what the engine sends, building what the plugin sends.
 *
 * A frame payload must be UTF-8 JSON (no NUL byte, nothing after the
 * value), one object with "jsonrpc":"2.0". With a "method" it is a request
 * when it has an "id" member (a string, a number or null) and a
 * notification when it has none; without "method" it is a response (a
 * "result" or an "error"). Batches (arrays) are not part of the protocol.
 *
 * Everything here is plain data manipulation: no I/O, any thread.
 */
#ifndef GASSIST_RPC_H
#define GASSIST_RPC_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Error codes of protocol V2 (JSON-RPC's plus the engine's custom ones). */
enum gassist_rpc_code {
    GASSIST_RPC_PARSE_ERROR = -32700,      /* not JSON, not UTF-8 */
    GASSIST_RPC_INVALID_REQUEST = -32600,  /* not a JSON-RPC 2.0 message; bad frame */
    GASSIST_RPC_METHOD_NOT_FOUND = -32601, /* unknown method or function */
    GASSIST_RPC_INVALID_PARAMS = -32602,
    GASSIST_RPC_INTERNAL_ERROR = -32603,
    GASSIST_RPC_PLUGIN_ERROR = -1,
    GASSIST_RPC_TIMEOUT = -2,
    GASSIST_RPC_RATE_LIMITED = -3,
};

typedef enum gassist_rpc_kind {
    GASSIST_RPC_REQUEST = 1,
    GASSIST_RPC_NOTIFICATION,
    GASSIST_RPC_RESPONSE,
} gassist_rpc_kind;

typedef struct gassist_rpc_msg {
    gassist_rpc_kind kind;
    cJSON *root;             /* the whole message, owned */
    const cJSON *id;         /* requests: borrowed from root (may be a JSON null) */
    const char *method;      /* requests and notifications: borrowed */
    const cJSON *params;     /* an object or array, or NULL when absent; borrowed */
} gassist_rpc_msg;

/* Parses one frame payload (len bytes, need not be NUL-terminated).
 * Returns 0 and fills *m (free with gassist_rpc_msg_free), or a negative
 * gassist_rpc_code (GASSIST_RPC_PARSE_ERROR, GASSIST_RPC_INVALID_REQUEST)
 * with a message in err; then *err_id receives a copy of the message's id
 * when one could be read, for the error response (caller deletes it; NULL
 * means answer with id null). */
int gassist_rpc_parse(const char *payload, size_t len, gassist_rpc_msg *m, cJSON **err_id,
                      char *err, size_t errlen);

/* Frees what m owns. Accepts NULL. */
void gassist_rpc_msg_free(gassist_rpc_msg *m);

/* True when s[0..n) is valid UTF-8 (no overlong forms, surrogates or code
 * points above U+10FFFF) without a NUL byte. */
int gassist_rpc_utf8_valid(const char *s, size_t n);

/* Standard message of a code ("Parse error"); "Error" for others. */
const char *gassist_rpc_code_message(int code);

/* Builders. Each returns the message as compact JSON text (malloc'd,
 * caller frees), or NULL when out of memory. id is copied (NULL = null).
 * Those taking a cJSON * take ownership of it, also on failure. */
char *gassist_rpc_result(const cJSON *id, cJSON *result);
char *gassist_rpc_error(const cJSON *id, int code, const char *message);
char *gassist_rpc_notification(const char *method, cJSON *params);

#endif
