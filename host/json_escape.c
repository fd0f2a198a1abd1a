/* json_escape.c - JSON string bodies from raw bytes (see json_escape.h). */
#include "json_escape.h"

size_t rlai_json_escape(const char *s, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > 31 && c != '"' && c != '\\') {
            out[o++] = (char)c;
            continue;
        }
        out[o++] = '\\';
        switch (c) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '\b': out[o++] = 'b'; break;
        case '\f': out[o++] = 'f'; break;
        case '\n': out[o++] = 'n'; break;
        case '\r': out[o++] = 'r'; break;
        case '\t': out[o++] = 't'; break;
        default:
            out[o++] = 'u';
            out[o++] = '0';
            out[o++] = '0';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
            break;
        }
    }
    return o;
}
