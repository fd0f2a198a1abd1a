/* json_msgpack.c - cJSON to msgpack (see json_msgpack.h). */
#include "json_msgpack.h"
#include "rlai/error.h"
#include "rlai/protocol.h"

#include <math.h>
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

cJSON *rlai_msgpack_to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return cJSON_CreateNull();
    case MSGPACK_OBJECT_BOOLEAN: return cJSON_CreateBool(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return cJSON_CreateNumber((double)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return cJSON_CreateNumber((double)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return cJSON_CreateNumber(o->via.f64);
    case MSGPACK_OBJECT_STR: {
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
        cJSON *m = cJSON_CreateObject();
        for (uint32_t i = 0; m && i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            char key[256];
            if (kv->key.type == MSGPACK_OBJECT_STR) {
                size_t n = kv->key.via.str.size < sizeof(key) - 1 ? kv->key.via.str.size : sizeof(key) - 1;
                memcpy(key, kv->key.via.str.ptr, n);
                key[n] = 0;
            } else {
                msgpack_object_print_buffer(key, sizeof(key), kv->key);
            }
            cJSON *v = rlai_msgpack_to_json(&kv->val);
            if (!v) {
                cJSON_Delete(m);
                return NULL;
            }
            cJSON_AddItemToObject(m, key, v);
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
