/* embeddings.c - /v1/embeddings (see embeddings.h). */
#include "embeddings.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(rlai_embed_error *err, int status, const char *code, const char *param, const char *fmt, ...)
{
    err->code = code;
    err->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return status;
}

static bool is_token_id(const cJSON *v, int n_vocab)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < n_vocab &&
           v->valuedouble == (double)(int)v->valuedouble;
}

static bool is_id_list(const cJSON *v)
{
    return cJSON_IsArray(v) && v->child && cJSON_IsNumber(v->child);
}

/* Base64 (RFC 4648, padded) of n bytes; malloc'd or NULL. */
static char *base64(const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1);
    if (!o)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        o[j++] = tab[v >> 18 & 63];
        o[j++] = tab[v >> 12 & 63];
        o[j++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        o[j++] = i + 2 < n ? tab[v & 63] : '=';
    }
    o[j] = 0;
    return o;
}

/* Token ids of one input (malloc'd into *toks) or an HTTP status. */
static int input_tokens(rlai_engine *e, const cJSON *in, int idx, int n_vocab, int max_tokens, rlai_token **toks,
                        int *n, rlai_embed_error *err)
{
    *toks = NULL;
    *n = 0;
    if (cJSON_IsString(in)) {
        size_t len = strlen(in->valuestring);
        if (!len)
            return fail(err, 400, "invalid_value", "input", "input[%d] is an empty string", idx);
        int c = rlai_engine_tokenize(e, in->valuestring, len, true, false, NULL, 0);
        if (c < 0)
            return fail(err, 400, "invalid_value", "input", "input[%d] cannot be tokenized: %s", idx,
                        rlai_strerror(c));
        if (c > max_tokens)
            return fail(err, 400, "context_length_exceeded", "input",
                        "input[%d] has %d tokens; the limit per input is %d", idx, c, max_tokens);
        *toks = malloc(sizeof(rlai_token) * (size_t)(c > 0 ? c : 1));
        if (!*toks)
            return fail(err, 500, NULL, NULL, "out of memory");
        *n = rlai_engine_tokenize(e, in->valuestring, len, true, false, *toks, c);
        return *n > 0 ? 200 : fail(err, 400, "invalid_value", "input", "input[%d] gives no tokens", idx);
    }
    if (is_id_list(in)) {
        int c = cJSON_GetArraySize(in);
        if (c > max_tokens)
            return fail(err, 400, "context_length_exceeded", "input",
                        "input[%d] has %d tokens; the limit per input is %d", idx, c, max_tokens);
        *toks = malloc(sizeof(rlai_token) * (size_t)c);
        if (!*toks)
            return fail(err, 500, NULL, NULL, "out of memory");
        const cJSON *t;
        cJSON_ArrayForEach(t, in) {
            if (!is_token_id(t, n_vocab))
                return fail(err, 400, "invalid_value", "input", "input[%d]: token ids must be integers in [0, %d)",
                            idx, n_vocab);
            (*toks)[(*n)++] = (rlai_token)t->valuedouble;
        }
        return 200;
    }
    return fail(err, 400, "invalid_type", "input",
                "'input' must be a string, a list of strings, a list of token ids or a list of such lists");
}

int rlai_embeddings_answer(rlai_engine *e, const cJSON *body, const char *model, int max_tokens, cJSON **out,
                           int *n_tokens, rlai_embed_error *err)
{
    *out = NULL;
    *n_tokens = 0;
    memset(err, 0, sizeof(*err));
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    if (max_tokens <= 0 || max_tokens > mi.n_ctx - 1)
        max_tokens = mi.n_ctx - 1;
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(body, "input");
    if (!input || cJSON_IsNull(input))
        return fail(err, 400, "invalid_value", "input", "'input' is required");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(body, "encoding_format");
    bool b64 = false;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64")))
            return fail(err, 400, "invalid_value", "encoding_format", "'encoding_format' must be float or base64");
        b64 = !strcmp(fmt->valuestring, "base64");
    }
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(body, "dimensions");
    if (dims && !cJSON_IsNull(dims) && !(cJSON_IsNumber(dims) && dims->valuedouble == mi.n_embd))
        return fail(err, 400, "unsupported_value", "dimensions",
                    "'dimensions' cannot shorten this model's embeddings: they have %d dimensions (omit it or "
                    "pass %d)", mi.n_embd, mi.n_embd);
    rlai_pooling pool = RLAI_POOL_MEAN;
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(body, "pooling");   /* extension */
    if (pl && !cJSON_IsNull(pl)) {
        if (!cJSON_IsString(pl) || (strcmp(pl->valuestring, "mean") && strcmp(pl->valuestring, "last")))
            return fail(err, 400, "invalid_value", "pooling", "'pooling' must be mean or last");
        pool = !strcmp(pl->valuestring, "last") ? RLAI_POOL_LAST : RLAI_POOL_MEAN;
    }
    /* One input, or a list of them. */
    bool many = cJSON_IsArray(input) && !is_id_list(input);
    int count = many ? cJSON_GetArraySize(input) : 1;
    if (count == 0)
        return fail(err, 400, "invalid_value", "input", "'input' is an empty list");
    if (count > RLAI_EMBED_MAX_INPUTS)
        return fail(err, 400, "invalid_value", "input", "at most %d inputs per request", RLAI_EMBED_MAX_INPUTS);
    cJSON *resp = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(resp, "data");
    float *vec = malloc(sizeof(float) * (size_t)mi.n_embd);
    double *dv = malloc(sizeof(double) * (size_t)mi.n_embd);
    int status = data && vec && dv ? 200 : fail(err, 500, NULL, NULL, "out of memory");
    int total = 0;
    const cJSON *in = many ? input->child : input;
    for (int i = 0; status == 200 && i < count; i++, in = many ? in->next : NULL) {
        rlai_token *toks = NULL;
        int n = 0;
        status = input_tokens(e, in, i, mi.n_vocab, max_tokens, &toks, &n, err);
        if (status == 200) {
            int rc = rlai_engine_embed(e, toks, n, pool, true, vec);
            if (rc == RLAI_ERR_BUSY)
                status = fail(err, 429, "rate_limit_exceeded", NULL,
                              "the KV cache is busy with running requests; retry later");
            else if (rc == RLAI_ERR_CONTEXT_FULL)
                status = fail(err, 400, "context_length_exceeded", "input", "input[%d] is longer than the context",
                              i);
            else if (rc < 0)
                status = fail(err, 500, NULL, NULL, "embedding failed: %s", rlai_strerror(rc));
            total += n;
        }
        free(toks);
        if (status != 200)
            break;
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "object", "embedding");
        cJSON_AddNumberToObject(item, "index", i);
        cJSON *emb = NULL;
        if (b64) {
            char *s = base64((const unsigned char *)vec, sizeof(float) * (size_t)mi.n_embd);
            emb = s ? cJSON_CreateString(s) : NULL;
            free(s);
        } else {
            for (int k = 0; k < mi.n_embd; k++)
                dv[k] = vec[k];
            emb = cJSON_CreateDoubleArray(dv, mi.n_embd);
        }
        if (!emb) {
            cJSON_Delete(item);
            status = fail(err, 500, NULL, NULL, "out of memory");
            break;
        }
        cJSON_AddItemToObject(item, "embedding", emb);
        cJSON_AddItemToArray(data, item);
    }
    free(vec);
    free(dv);
    if (status != 200) {
        cJSON_Delete(resp);
        return status;
    }
    cJSON_AddStringToObject(resp, "object", "list");
    cJSON_AddStringToObject(resp, "model", model ? model : "");
    cJSON *u = cJSON_AddObjectToObject(resp, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", total);
    cJSON_AddNumberToObject(u, "total_tokens", total);
    *n_tokens = total;
    *out = resp;
    return 200;
}
