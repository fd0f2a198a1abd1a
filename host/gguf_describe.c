/* gguf_describe.c - a GGUF header as JSON (see gguf_describe.h). */
#include "gguf_describe.h"

#include "rlai/gguf.h"
#include "rlai/error.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Adds "<arch>.<suffix>" as a number when it is an integer key that fits
 * u32 and is > 0. Returns the value, 0 when absent or invalid, -1 on
 * allocation failure. */
static int64_t add_u32(cJSON *o, const rlai_gguf *g, const char *arch, const char *suffix,
                       const char *field, int *rc_out)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v = 0;
    *rc_out = rlai_gguf_get_u32(g, key, &v);
    if (*rc_out < 0 || v == 0)
        return 0;
    if (field && !cJSON_AddNumberToObject(o, field, v))
        return -1;
    return v;
}

static bool add_str(cJSON *o, const rlai_gguf *g, const char *key, const char *field, char *copy,
                    size_t cap)
{
    rlai_gguf_str s;
    if (rlai_gguf_get_str(g, key, &s) < 0)
        return true;
    char buf[256];
    size_t n = s.len < sizeof buf - 1 ? s.len : sizeof buf - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = '\0';
    if (memchr(buf, '\0', n))        /* embedded NUL: not a usable name */
        return true;
    if (copy && snprintf(copy, cap, "%s", buf) >= (int)cap)
        copy[0] = '\0';                /* too long to be a key prefix: treated as unknown */
    return cJSON_AddStringToObject(o, field, buf) != NULL;
}

static int describe(const rlai_gguf *g, cJSON *o, char *err, size_t errlen)
{
    char arch[128] = "";
    if (!add_str(o, g, "general.architecture", "arch", arch, sizeof arch) ||
        !add_str(o, g, "general.name", "name", NULL, 0))
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");

    int64_t n_embd = 0, n_head = 0, v;
    int rc;
    if (arch[0]) {
        if ((v = add_u32(o, g, arch, "block_count", "n_layer", &rc)) < 0 ||
            (n_embd = add_u32(o, g, arch, "embedding_length", "n_embd", &rc)) < 0 ||
            (n_head = add_u32(o, g, arch, "attention.head_count", "n_head", &rc)) < 0)
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
        v = add_u32(o, g, arch, "attention.head_count_kv", "n_head_kv", &rc);
        if (v < 0)
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
        if (rc == RLAI_ERR_NOT_FOUND && n_head > 0 && !cJSON_AddNumberToObject(o, "n_head_kv", (double)n_head))
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
        v = add_u32(o, g, arch, "attention.key_length", "head_dim", &rc);
        if (v < 0)
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
        if (rc == RLAI_ERR_NOT_FOUND && n_embd > 0 && n_head > 0 && n_embd % n_head == 0 &&
            !cJSON_AddNumberToObject(o, "head_dim", (double)(n_embd / n_head)))
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
        if (add_u32(o, g, arch, "feed_forward_length", "n_ff", &rc) < 0 ||
            add_u32(o, g, arch, "context_length", "n_ctx_train", &rc) < 0)
            return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    }

    /* Vocabulary: <arch>.vocab_size, else the tokenizer's token list, else
     * the rows of the embedding matrix. */
    uint64_t n_vocab = 0;
    if (arch[0]) {
        int64_t vs = add_u32(NULL, g, arch, "vocab_size", NULL, &rc);
        n_vocab = vs > 0 ? (uint64_t)vs : 0;
    }
    uint32_t et;
    uint64_t nt;
    const void *data;
    if (!n_vocab && rlai_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &nt, &data) == 0 &&
        et == RLAI_GGUF_STRING)
        n_vocab = nt;
    const rlai_gguf_tensor *emb = rlai_gguf_find_tensor(g, "token_embd.weight");
    if (!n_vocab && emb && emb->n_dims == 2)
        n_vocab = emb->ne[1];
    if (n_vocab && !cJSON_AddNumberToObject(o, "n_vocab", (double)n_vocab))
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");

    /* Tensors, by type. */
    uint64_t n_params = 0, weight_bytes = 0;
    cJSON *types = cJSON_CreateObject();
    if (!types || !cJSON_AddItemToObject(o, "tensor_types", types)) {
        cJSON_Delete(types);
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    }
    uint64_t n = rlai_gguf_n_tensors(g);
    for (uint64_t i = 0; i < n; i++) {
        const rlai_gguf_tensor *t = rlai_gguf_tensor_at(g, i);
        const char *tn = rlai_gguf_type_name(t->type);
        if (!tn) /* the reader refuses ids it cannot size, so this is a new id */
            return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "tensor '%.*s': type id %" PRIu32 " unknown",
                        (int)t->name.len, t->name.ptr, t->type);
        uint64_t nel = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            nel *= t->ne[d];              /* validated by the reader to fit int64 */
        if (nel > UINT64_MAX - n_params || t->nbytes > UINT64_MAX - weight_bytes)
            return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "tensor sizes overflow");
        n_params += nel;
        weight_bytes += t->nbytes;
        cJSON *e = cJSON_GetObjectItemCaseSensitive(types, tn);
        if (!e) {
            e = cJSON_AddObjectToObject(types, tn);
            if (!e || !cJSON_AddNumberToObject(e, "count", 0) || !cJSON_AddNumberToObject(e, "params", 0) ||
                !cJSON_AddNumberToObject(e, "bytes", 0))
                return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
        }
        cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "count");
        cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "params");
        cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes");
        cJSON_SetNumberValue(c, c->valuedouble + 1);
        cJSON_SetNumberValue(p, p->valuedouble + (double)nel);
        cJSON_SetNumberValue(b, b->valuedouble + (double)t->nbytes);
    }
    if (!cJSON_AddNumberToObject(o, "n_params", (double)n_params) ||
        !cJSON_AddNumberToObject(o, "weight_bytes", (double)weight_bytes) ||
        !cJSON_AddNumberToObject(o, "file_bytes", (double)rlai_gguf_file_size(g)))
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    return 0;
}

int rlai_host_gguf_describe(const char *path, cJSON **out, char *err, size_t errlen)
{
    if (!out)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "NULL output pointer");
    *out = NULL;
    if (!path)
        return rlai_errf(err, errlen, RLAI_ERR_INVALID_ARG, "NULL path");
    rlai_gguf *g = NULL;
    int rc = rlai_gguf_open_file(path, &g, err, errlen);
    if (rc < 0)
        return rc;
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        rlai_gguf_close(g);
        return rlai_errf(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    }
    rc = describe(g, o, err, errlen);
    rlai_gguf_close(g);
    if (rc < 0) {
        cJSON_Delete(o);
        return rc;
    }
    *out = o;
    return 0;
}
