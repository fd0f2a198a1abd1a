/* gassist_rpc.c - JSON-RPC 2.0 parse, validate and build. */
#include "gassist_rpc.h"

#include <stdio.h>
#include <string.h>

int gassist_rpc_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c == 0)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

const char *gassist_rpc_code_message(int code)
{
    switch (code) {
    case GASSIST_RPC_PARSE_ERROR: return "Parse error";
    case GASSIST_RPC_INVALID_REQUEST: return "Invalid Request";
    case GASSIST_RPC_METHOD_NOT_FOUND: return "Method not found";
    case GASSIST_RPC_INVALID_PARAMS: return "Invalid params";
    case GASSIST_RPC_INTERNAL_ERROR: return "Internal error";
    case GASSIST_RPC_PLUGIN_ERROR: return "Plugin error";
    case GASSIST_RPC_TIMEOUT: return "Timeout";
    case GASSIST_RPC_RATE_LIMITED: return "Rate limited";
    default: return "Error";
    }
}

static int fail(int code, char *err, size_t errlen, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: %s", gassist_rpc_code_message(code), what);
    return code;
}

static int valid_id(const cJSON *id)
{
    return cJSON_IsString(id) || cJSON_IsNumber(id) || cJSON_IsNull(id);
}

int gassist_rpc_parse(const char *payload, size_t len, gassist_rpc_msg *m, cJSON **err_id,
                      char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    *err_id = NULL;
    if (!gassist_rpc_utf8_valid(payload, len))
        return fail(GASSIST_RPC_PARSE_ERROR, err, errlen, "the frame is not valid UTF-8 text");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(payload, len, &end, 0);
    if (!root) {
        char what[96];
        size_t at = end && end >= payload ? (size_t)(end - payload) : 0;
        snprintf(what, sizeof(what), "invalid JSON near byte %zu", at);
        return fail(GASSIST_RPC_PARSE_ERROR, err, errlen, what);
    }
    for (const char *p = end; p && p < payload + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            return fail(GASSIST_RPC_PARSE_ERROR, err, errlen, "text after the JSON value");
        }
    }
    if (cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return fail(GASSIST_RPC_INVALID_REQUEST, err, errlen, "batch requests are not supported");
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(GASSIST_RPC_INVALID_REQUEST, err, errlen, "the message is not a JSON object");
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (id && valid_id(id))
        *err_id = cJSON_Duplicate(id, 1);
    int code = 0;
    const char *what = NULL;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "jsonrpc");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "params");
    if (!cJSON_IsString(ver) || strcmp(ver->valuestring, "2.0") != 0) {
        code = GASSIST_RPC_INVALID_REQUEST;
        what = "\"jsonrpc\" must be \"2.0\"";
    } else if (id && !valid_id(id)) {
        code = GASSIST_RPC_INVALID_REQUEST;
        what = "\"id\" must be a string, a number or null";
    } else if (method) {
        if (!cJSON_IsString(method) || !method->valuestring[0]) {
            code = GASSIST_RPC_INVALID_REQUEST;
            what = "\"method\" must be a non-empty string";
        } else if (params && !cJSON_IsObject(params) && !cJSON_IsArray(params) && !cJSON_IsNull(params)) {
            code = GASSIST_RPC_INVALID_REQUEST;
            what = "\"params\" must be an object or an array";
        }
    } else if (!cJSON_GetObjectItemCaseSensitive(root, "result") &&
               !cJSON_GetObjectItemCaseSensitive(root, "error")) {
        code = GASSIST_RPC_INVALID_REQUEST;
        what = "no \"method\", \"result\" or \"error\" member";
    }
    if (code) {
        cJSON_Delete(root);
        return fail(code, err, errlen, what);
    }
    cJSON_Delete(*err_id);
    *err_id = NULL;
    m->root = root;
    if (method) {
        m->kind = id ? GASSIST_RPC_REQUEST : GASSIST_RPC_NOTIFICATION;
        m->method = method->valuestring;
        m->id = id;
        m->params = cJSON_IsNull(params) ? NULL : params;
    } else {
        m->kind = GASSIST_RPC_RESPONSE;
        m->id = id;
    }
    return 0;
}

void gassist_rpc_msg_free(gassist_rpc_msg *m)
{
    if (!m)
        return;
    cJSON_Delete(m->root);
    memset(m, 0, sizeof(*m));
}

static cJSON *envelope(void)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "jsonrpc", "2.0")) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int add_id(cJSON *o, const cJSON *id)
{
    cJSON *c = id ? cJSON_Duplicate(id, 1) : cJSON_CreateNull();
    return c && cJSON_AddItemToObject(o, "id", c) ? 0 : (cJSON_Delete(c), -1);
}

static char *finish(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *gassist_rpc_result(const cJSON *id, cJSON *result)
{
    cJSON *o = envelope();
    if (!result)
        result = cJSON_CreateNull();
    if (!o || !result || add_id(o, id) < 0 || !cJSON_AddItemToObject(o, "result", result)) {
        cJSON_Delete(o);
        cJSON_Delete(result);
        return NULL;
    }
    return finish(o);
}

char *gassist_rpc_error(const cJSON *id, int code, const char *message)
{
    cJSON *o = envelope();
    cJSON *e = cJSON_CreateObject();
    if (!o || !e || add_id(o, id) < 0 || !cJSON_AddNumberToObject(e, "code", code) ||
        !cJSON_AddStringToObject(e, "message", message ? message : gassist_rpc_code_message(code)) ||
        !cJSON_AddItemToObject(o, "error", e)) {
        cJSON_Delete(o);
        cJSON_Delete(e);
        return NULL;
    }
    return finish(o);
}

char *gassist_rpc_notification(const char *method, cJSON *params)
{
    cJSON *o = envelope();
    if (!params)
        params = cJSON_CreateObject();
    if (!o || !params || !cJSON_AddStringToObject(o, "method", method) ||
        !cJSON_AddItemToObject(o, "params", params)) {
        cJSON_Delete(o);
        cJSON_Delete(params);
        return NULL;
    }
    return finish(o);
}
