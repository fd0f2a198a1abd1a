/* json_msgpack.c - cJSON to msgpack (see json_msgpack.h). */
#include "json_msgpack.h"
#include "rlai/error.h"
#include "rlai/protocol.h"
#include "rlai/strbuf.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static int pack(const cJSON *v, msgpack_packer *pk, int depth)
{
    if (!v)
        return RLAI_ERR_INVALID_ARG;
    if (cJSON_IsNull(v))
        return msgpack_pack_nil(pk);
    if (cJSON_IsTrue(v))
        return msgpack_pack_true(pk);
    if (cJSON_IsFalse(v))
        return msgpack_pack_false(pk);
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (isfinite(d) && d == floor(d) && d >= -9.2e18 && d <= 9.2e18)
            return msgpack_pack_int64(pk, (int64_t)d);
        return msgpack_pack_double(pk, d);
    }
    if (cJSON_IsString(v) || cJSON_IsRaw(v)) {
        const char *s = v->valuestring ? v->valuestring : "";
        size_t n = strlen(s);
        msgpack_pack_str(pk, n);
        return msgpack_pack_str_body(pk, s, n);
    }
    if (depth >= RLAI_PROTO_MAX_DEPTH)
        return RLAI_ERR_TOO_LARGE;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        size_t n = 0;
        for (const cJSON *c = v->child; c; c = c->next)
            n++;
        if (cJSON_IsArray(v))
            msgpack_pack_array(pk, n);
        else
            msgpack_pack_map(pk, n);
        for (const cJSON *c = v->child; c; c = c->next) {
            if (cJSON_IsObject(v)) {
                const char *k = c->string ? c->string : "";
                size_t kn = strlen(k);
                msgpack_pack_str(pk, kn);
                msgpack_pack_str_body(pk, k, kn);
            }
            int rc = pack(c, pk, depth + 1);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    return RLAI_ERR_INVALID_ARG;
}

int rlai_json_to_msgpack(const cJSON *v, msgpack_packer *pk)
{
    int rc = pack(v, pk, 0);
    return rc < 0 ? rc : 0;
}

/* ---- msgpack -> JSON ------------------------------------------------------
 *
 * cJSON keeps numbers as doubles (printed with 15 digits) and strings as C
 * strings, so three kinds of value would change on the way through it:
 * integers of more than 15 digits, strings
 * holding NUL and maps with a key holding NUL. Those become cJSON "raw"
 * nodes carrying their exact JSON text (printed as is), written by the small
 * writer below; everything else is an ordinary cJSON value. Keys have no
 * length limit. */

static void jb_str(rlai_strbuf *b, const char *s, size_t n)
{
    rlai_strbuf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            rlai_strbuf_add(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            rlai_strbuf_add(b, esc, 6);
        } else {
            rlai_strbuf_add(b, (const char *)&c, 1);
        }
    }
    rlai_strbuf_add(b, "\"", 1);
}

/* Exact JSON text of o (what a raw node carries). */
static void jb_value(rlai_strbuf *b, const msgpack_object *o)
{
    char num[40];
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: rlai_strbuf_add(b, "null", 4); break;
    case MSGPACK_OBJECT_BOOLEAN: o->via.boolean ? rlai_strbuf_add(b, "true", 4) : rlai_strbuf_add(b, "false", 5); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        rlai_strbuf_add(b, num, (size_t)snprintf(num, sizeof(num), "%llu", (unsigned long long)o->via.u64));
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        rlai_strbuf_add(b, num, (size_t)snprintf(num, sizeof(num), "%lld", (long long)o->via.i64));
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isfinite(o->via.f64))
            rlai_strbuf_add(b, num, (size_t)snprintf(num, sizeof(num), "%.17g", o->via.f64));
        else
            rlai_strbuf_add(b, "null", 4);
        break;
    case MSGPACK_OBJECT_STR: jb_str(b, o->via.str.ptr, o->via.str.size); break;
    case MSGPACK_OBJECT_ARRAY:
        rlai_strbuf_add(b, "[", 1);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                rlai_strbuf_add(b, ",", 1);
            jb_value(b, &o->via.array.ptr[i]);
        }
        rlai_strbuf_add(b, "]", 1);
        break;
    case MSGPACK_OBJECT_MAP:
        rlai_strbuf_add(b, "{", 1);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (i)
                rlai_strbuf_add(b, ",", 1);
            if (kv->key.type == MSGPACK_OBJECT_STR) {
                jb_value(b, &kv->key);
            } else {
                rlai_strbuf k = { 0 };
                jb_value(&k, &kv->key);
                jb_str(b, k.p ? k.p : "", k.len);
                b->oom |= k.oom;
                rlai_strbuf_free(&k);
            }
            rlai_strbuf_add(b, ":", 1);
            jb_value(b, &kv->val);
        }
        rlai_strbuf_add(b, "}", 1);
        break;
    case MSGPACK_OBJECT_BIN:
        rlai_strbuf_add(b, num, (size_t)snprintf(num, sizeof(num), "\"<%u bytes>\"", o->via.bin.size));
        break;
    default: rlai_strbuf_add(b, "\"<ext>\"", 7); break;
    }
}

static cJSON *raw_of(const msgpack_object *o)
{
    rlai_strbuf b = { 0 };
    jb_value(&b, o);
    cJSON *v = b.oom ? NULL : cJSON_CreateRaw(b.p ? b.p : "");
    rlai_strbuf_free(&b);
    return v;
}

/* cJSON prints numbers with 15 significant digits: integers of at most 15
 * digits print exactly, larger ones go raw. */
#define EXACT_PRINT_INT 999999999999999ull

cJSON *rlai_msgpack_to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return cJSON_CreateNull();
    case MSGPACK_OBJECT_BOOLEAN: return cJSON_CreateBool(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return o->via.u64 <= EXACT_PRINT_INT ? cJSON_CreateNumber((double)o->via.u64) : raw_of(o);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return o->via.i64 >= -(int64_t)EXACT_PRINT_INT ? cJSON_CreateNumber((double)o->via.i64) : raw_of(o);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return cJSON_CreateNumber(o->via.f64);
    case MSGPACK_OBJECT_STR: {
        if (memchr(o->via.str.ptr, 0, o->via.str.size))
            return raw_of(o);
        char *s = malloc(o->via.str.size + 1);
        if (!s)
            return NULL;
        memcpy(s, o->via.str.ptr, o->via.str.size);
        s[o->via.str.size] = 0;
        cJSON *v = cJSON_CreateString(s);
        free(s);
        return v;
    }
    case MSGPACK_OBJECT_ARRAY: {
        cJSON *a = cJSON_CreateArray();
        for (uint32_t i = 0; a && i < o->via.array.size; i++) {
            cJSON *v = rlai_msgpack_to_json(&o->via.array.ptr[i]);
            if (!v) {
                cJSON_Delete(a);
                return NULL;
            }
            cJSON_AddItemToArray(a, v);
        }
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && memchr(k->via.str.ptr, 0, k->via.str.size))
                return raw_of(o);       /* a cJSON key cannot hold NUL */
        }
        cJSON *m = cJSON_CreateObject();
        for (uint32_t i = 0; m && i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            rlai_strbuf key = { 0 };
            if (kv->key.type == MSGPACK_OBJECT_STR)
                rlai_strbuf_add(&key, kv->key.via.str.ptr, kv->key.via.str.size);
            else
                jb_value(&key, &kv->key);   /* a non-string key: its JSON text */
            if (!key.p && !key.oom)
                rlai_strbuf_add(&key, "", 0);
            cJSON *v = key.oom ? NULL : rlai_msgpack_to_json(&kv->val);
            if (!v) {
                free(key.p);
                cJSON_Delete(m);
                return NULL;
            }
            cJSON_AddItemToObject(m, key.p, v);
            free(key.p);
        }
        return m;
    }
    case MSGPACK_OBJECT_BIN: {
        char buf[64];
        snprintf(buf, sizeof(buf), "<%u bytes>", o->via.bin.size);
        return cJSON_CreateString(buf);
    }
    default:
        return cJSON_CreateString("<ext>");
    }
}
