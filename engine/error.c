/* error.c - everything generated from the error tables of rlai/error.h:
 * messages, names and the wire / HTTP mappings. Built as its own small
 * library (rlai_error) so the codec and the transports need not link the
 * engine. */
#include "rlai/error.h"

#include <stdarg.h>
#include <stdio.h>

#include <stddef.h>

const char *rlai_strerror(int code)
{
    switch (code) {
    case RLAI_OK: return "success";
#define X(name, c, wire, http, oai, msg) case c: return msg;
    RLAI_ERROR_MAP(X)
#undef X
    default: return "unknown error";
    }
}

const char *rlai_err_name(int code)
{
    switch (code) {
    case RLAI_OK: return "OK";
#define X(name, c, wire, http, oai, msg) case c: return #name;
    RLAI_ERROR_MAP(X)
#undef X
    default: return "UNKNOWN";
    }
}

int rlai_err_wire_code(int code)
{
    switch (code) {
    case RLAI_OK: return RLAI_PE_INTERNAL;
#define X(name, c, wire, http, oai, msg) case c: return RLAI_PE_##wire;
    RLAI_ERROR_MAP(X)
#undef X
    default: return RLAI_PE_ENGINE;
    }
}

int rlai_err_http_status(int code, const char **oai_code)
{
    const char *oc = NULL;
    int status = 500;
    switch (code) {
#define X(name, c, wire, http, oai, msg) case c: status = http; oc = oai; break;
    RLAI_ERROR_MAP(X)
#undef X
    default: break;
    }
    if (oai_code)
        *oai_code = oc;
    return status;
}

const char *rlai_wire_code_name(int wire_code)
{
    switch (wire_code) {
#define X(name, c, meaning) case c: return #name;
    RLAI_WIRE_CODE_MAP(X)
#undef X
    default: return "UNKNOWN";
    }
}

const char *rlai_wire_code_meaning(int wire_code)
{
    switch (wire_code) {
#define X(name, c, meaning) case c: return meaning;
    RLAI_WIRE_CODE_MAP(X)
#undef X
    default: return "";
    }
}

int rlai_errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
