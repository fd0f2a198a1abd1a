/* gassist_msgpack.c - a small, bounds-checked msgpack to cJSON reader. */
#include "gassist_msgpack.h"

#include "rlai/error.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader {
    const unsigned char *p, *end;
    const char *why;
    int nomem;
} reader;

static int need(reader *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n) {
        r->why = "truncated value";
        return 0;
    }
    return 1;
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Reads an n-byte big-endian length after the type byte. */
static int read_len(reader *r, int n, size_t *out)
{
    if (!need(r, (size_t)n))
        return 0;
    *out = (size_t)be(r->p, n);
    r->p += n;
    return 1;
}

static cJSON *value(reader *r, int depth);

static char *str_copy(reader *r, size_t n)
{
    if (!need(r, n))
        return NULL;
    if (memchr(r->p, 0, n)) {
        r->why = "string with a NUL byte";
        return NULL;
    }
    char *s = malloc(n + 1);
    if (!s) {
        r->nomem = 1;
        return NULL;
    }
    memcpy(s, r->p, n);
    s[n] = 0;
    r->p += n;
    return s;
}

static cJSON *string(reader *r, size_t n)
{
    char *s = str_copy(r, n);
    if (!s)
        return NULL;
    cJSON *j = cJSON_CreateString(s);
    free(s);
    if (!j)
        r->nomem = 1;
    return j;
}

static cJSON *array(reader *r, size_t n, int depth)
{
    if (n > (size_t)(r->end - r->p)) {     /* every element takes a byte at least */
        r->why = "array longer than the data";
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    if (!a) {
        r->nomem = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        cJSON *v = value(r, depth + 1);
        if (!v || !cJSON_AddItemToArray(a, v)) {
            cJSON_Delete(v);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static char *key(reader *r)
{
    if (!need(r, 1))
        return NULL;
    unsigned c = *r->p++;
    size_t n = 0;
    if ((c & 0xe0) == 0xa0)
        n = c & 0x1f;
    else if (c == 0xd9 || c == 0xda || c == 0xdb) {
        if (!read_len(r, c == 0xd9 ? 1 : c == 0xda ? 2 : 4, &n))
            return NULL;
    } else if (c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3)) {
        r->p--;
        cJSON *v = value(r, GASSIST_MSGPACK_MAX_DEPTH);
        if (!v)
            return NULL;
        char *s = malloc(32);
        if (s)
            snprintf(s, 32, "%.0f", v->valuedouble);
        else
            r->nomem = 1;
        cJSON_Delete(v);
        return s;
    } else {
        r->why = "map key that is not a string or an integer";
        return NULL;
    }
    return str_copy(r, n);
}

static cJSON *map(reader *r, size_t n, int depth)
{
    if (n > (size_t)(r->end - r->p) / 2) {
        r->why = "map longer than the data";
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        r->nomem = 1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        char *k = key(r);
        cJSON *v = k ? value(r, depth + 1) : NULL;
        if (!v || !cJSON_AddItemToObject(o, k, v)) {
            free(k);
            cJSON_Delete(v);
            cJSON_Delete(o);
            return NULL;
        }
        free(k);
    }
    return o;
}

static cJSON *number(reader *r, double d)
{
    cJSON *j = cJSON_CreateNumber(d);
    if (!j)
        r->nomem = 1;
    return j;
}

static cJSON *value(reader *r, int depth)
{
    if (depth > GASSIST_MSGPACK_MAX_DEPTH) {
        r->why = "nested too deeply";
        return NULL;
    }
    if (!need(r, 1))
        return NULL;
    unsigned c = *r->p++;
    size_t n = 0;
    if (c <= 0x7f)
        return number(r, (double)c);
    if (c >= 0xe0)
        return number(r, (double)(int8_t)c);
    if ((c & 0xf0) == 0x80)
        return map(r, c & 0x0f, depth);
    if ((c & 0xf0) == 0x90)
        return array(r, c & 0x0f, depth);
    if ((c & 0xe0) == 0xa0)
        return string(r, c & 0x1f);
    switch (c) {
    case 0xc0: return cJSON_CreateNull();
    case 0xc2: return cJSON_CreateFalse();
    case 0xc3: return cJSON_CreateTrue();
    case 0xca: {
        if (!need(r, 4))
            return NULL;
        uint32_t u = (uint32_t)be(r->p, 4);
        float f;
        memcpy(&f, &u, 4);
        r->p += 4;
        return number(r, (double)f);
    }
    case 0xcb: {
        if (!need(r, 8))
            return NULL;
        uint64_t u = be(r->p, 8);
        double d;
        memcpy(&d, &u, 8);
        r->p += 8;
        return number(r, d);
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        int w = 1 << (c - 0xcc);
        if (!need(r, (size_t)w))
            return NULL;
        uint64_t u = be(r->p, w);
        r->p += w;
        return number(r, (double)u);
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int w = 1 << (c - 0xd0);
        if (!need(r, (size_t)w))
            return NULL;
        uint64_t u = be(r->p, w);
        r->p += w;
        int64_t s;
        if (w == 8) {
            memcpy(&s, &u, 8);
        } else {
            uint64_t sign = (uint64_t)1 << (8 * w - 1);
            s = (int64_t)(u ^ sign) - (int64_t)sign;
        }
        return number(r, (double)s);
    }
    case 0xd9: case 0xda: case 0xdb:
        if (!read_len(r, c == 0xd9 ? 1 : c == 0xda ? 2 : 4, &n))
            return NULL;
        return string(r, n);
    case 0xdc: case 0xdd:
        if (!read_len(r, c == 0xdc ? 2 : 4, &n))
            return NULL;
        return array(r, n, depth);
    case 0xde: case 0xdf:
        if (!read_len(r, c == 0xde ? 2 : 4, &n))
            return NULL;
        return map(r, n, depth);
    default:
        r->why = c >= 0xc4 && c <= 0xc6 ? "binary value (no JSON equivalent)"
                                          : "extension or reserved type";
        return NULL;
    }
}

int gassist_msgpack_to_json(const void *data, size_t len, cJSON **out, char *err, size_t errlen)
{
    *out = NULL;
    reader r = { data, (const unsigned char *)data + len, NULL, 0 };
    cJSON *v = len ? value(&r, 0) : NULL;
    if (v && r.p != r.end) {
        cJSON_Delete(v);
        v = NULL;
        r.why = "bytes after the value";
    }
    if (!v) {
        if (err && errlen)
            snprintf(err, errlen, "msgpack: %s", r.nomem ? "out of memory" : r.why ? r.why : "empty data");
        return r.nomem ? RLAI_ERR_NOMEM : RLAI_ERR_FORMAT;
    }
    *out = v;
    return 0;
}
