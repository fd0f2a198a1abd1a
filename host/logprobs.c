/* logprobs.c - OpenAI logprobs objects (see logprobs.h). */
#include "logprobs.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The token's bytes (malloc'd, NUL-terminated, *len set) or NULL. */
static char *token_bytes(const rlai_engine *e, rlai_token tok, size_t *len)
{
    char small[128];
    int n = rlai_engine_detokenize(e, &tok, 1, true, small, sizeof(small));
    if (n < 0)
        n = 0;
    char *p = malloc((size_t)n + 1);
    if (!p)
        return NULL;
    if ((size_t)n < sizeof(small))
        memcpy(p, small, (size_t)n + 1);
    else if (rlai_engine_detokenize(e, &tok, 1, true, p, (size_t)n + 1) < 0)
        n = 0;
    p[n] = 0;
    *len = (size_t)n;
    return p;
}

/* Length of a valid UTF-8 sequence at s (1..4) or 0. */
static size_t utf8_valid_at(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : (c & 0xF0) == 0xE0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!k || k > n)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if (k == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F)))
        return 0;
    if (k == 4 && ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F)))
        return 0;
    return k;
}

/* s with invalid sequences replaced by U+FFFD (malloc'd) or NULL. */
static char *clean_utf8(const char *s, size_t n)
{
    char *o = malloc(n * 3 + 1);
    if (!o)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_valid_at((const unsigned char *)s + i, n - i);
        if (k && !(k == 1 && s[i] == 0)) {
            memcpy(o + j, s + i, k);
            j += k;
            i += k;
        } else {
            memcpy(o + j, "\xEF\xBF\xBD", 3);
            j += 3;
            i++;
        }
    }
    o[j] = 0;
    return o;
}

cJSON *rlai_logprobs_completion_from_entries(const cJSON *entries, size_t *offset)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    bool ok = toks && lps && tops && offs;
    for (const cJSON *e = cJSON_IsArray(entries) ? entries->child : NULL; ok && e; e = e->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "token");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(e, "logprob");
        const char *ts = cJSON_IsString(t) ? t->valuestring : "";
        cJSON *top = cJSON_CreateObject();
        ok = top && cJSON_AddItemToArray(toks, cJSON_CreateString(ts)) &&
             cJSON_AddItemToArray(lps, cJSON_CreateNumber(cJSON_IsNumber(l) ? l->valuedouble : -9999.0)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += rlai_utf8_chars(ts, strlen(ts));
        const cJSON *alts = cJSON_GetObjectItemCaseSensitive(e, "top_logprobs");
        for (const cJSON *a = cJSON_IsArray(alts) ? alts->child : NULL; ok && a; a = a->next) {
            const cJSON *at = cJSON_GetObjectItemCaseSensitive(a, "token");
            const cJSON *al = cJSON_GetObjectItemCaseSensitive(a, "logprob");
            if (cJSON_IsString(at) && cJSON_IsNumber(al) && !cJSON_GetObjectItemCaseSensitive(top, at->valuestring))
                ok = cJSON_AddNumberToObject(top, at->valuestring, al->valuedouble) != NULL;
        }
        if (top && !(ok && cJSON_AddItemToArray(tops, top))) {
            cJSON_Delete(top);
            ok = false;
        }
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The byte values of a "bytes" array, or -1 when it is not one (absent,
 * not an array, an element that is not an integer 0..255). */
static int bytes_count(const cJSON *b)
{
    if (!cJSON_IsArray(b))
        return -1;
    int n = 0;
    for (const cJSON *x = b->child; x; x = x->next, n++)
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 255 || x->valuedouble != (int)x->valuedouble)
            return -1;
    return n;
}

int rlai_logprobs_wire_entries(const cJSON *entries, rlai_msg_text_logprob **out, uint8_t **pool)
{
    *out = NULL;
    *pool = NULL;
    size_t n = 0, nb = 0;
    for (const cJSON *e = cJSON_IsArray(entries) ? entries->child : NULL; e; e = e->next) {
        if (!cJSON_IsObject(e))
            continue;
        int k = bytes_count(cJSON_GetObjectItemCaseSensitive(e, "bytes"));
        nb += k > 0 ? (size_t)k : 0;
        n++;
    }
    if (n == 0)
        return 0;
    if (n > RLAI_PROTO_MAX_TOKENS_ARRAY)
        n = RLAI_PROTO_MAX_TOKENS_ARRAY;
    rlai_msg_text_logprob *v = calloc(n, sizeof(*v));
    uint8_t *bp = nb ? malloc(nb) : NULL;
    if (!v || (nb && !bp)) {
        free(v);
        free(bp);
        return RLAI_ERR_NOMEM;
    }
    size_t i = 0, used = 0;
    for (const cJSON *e = entries->child; e && i < n; e = e->next) {
        if (!cJSON_IsObject(e))
            continue;
        rlai_msg_text_logprob *w = &v[i++];
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "token");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(e, "logprob");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes");
        w->text = cJSON_IsString(t) ? t->valuestring : "";
        w->text_len = strlen(w->text);
        w->logprob = cJSON_IsNumber(l) ? l->valuedouble : -INFINITY;
        int k = bytes_count(b);
        if (k >= 0) {
            w->bytes = bp ? bp + used : (const uint8_t *)"";
            w->n_bytes = (size_t)k;
            for (const cJSON *x = b->child; x; x = x->next)
                bp[used++] = (uint8_t)x->valuedouble;
        }
        const cJSON *alts = cJSON_GetObjectItemCaseSensitive(e, "top_logprobs");
        for (const cJSON *a = cJSON_IsArray(alts) ? alts->child : NULL;
             a && w->n_top < RLAI_PROTO_MAX_TOP_LOGPROBS; a = a->next) {
            const cJSON *at = cJSON_GetObjectItemCaseSensitive(a, "token");
            const cJSON *al = cJSON_GetObjectItemCaseSensitive(a, "logprob");
            if (!cJSON_IsString(at))
                continue;
            w->top_text[w->n_top] = at->valuestring;
            w->top_len[w->n_top] = strlen(at->valuestring);
            w->top_logprobs[w->n_top] = cJSON_IsNumber(al) ? al->valuedouble : -INFINITY;
            w->n_top++;
        }
    }
    *out = v;
    *pool = bp;
    return (int)i;
}

size_t rlai_utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static double lp_value(float v)
{
    return isfinite(v) ? (double)v : -9999.0;
}

/* {token, logprob, bytes}; NULL when out of memory. */
static cJSON *token_entry(const rlai_engine *e, rlai_token tok, float logprob)
{
    size_t len = 0;
    char *b = token_bytes(e, tok, &len);
    char *t = b ? clean_utf8(b, len) : NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_CreateArray();
    bool ok = b && t && o && arr && cJSON_AddStringToObject(o, "token", t) &&
              cJSON_AddNumberToObject(o, "logprob", lp_value(logprob));
    for (size_t i = 0; ok && i < len; i++)
        ok = cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)b[i]));
    if (ok) {
        cJSON_AddItemToObject(o, "bytes", arr);
        arr = NULL;
    }
    cJSON_Delete(arr);
    free(b);
    free(t);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int rlai_logprobs_chat_append(const rlai_engine *e, const rlai_token_logprobs *lp, int n, cJSON *content)
{
    for (int i = 0; i < n; i++) {
        cJSON *o = token_entry(e, lp[i].token, lp[i].logprob);
        cJSON *top = o ? cJSON_AddArrayToObject(o, "top_logprobs") : NULL;
        if (!top) {
            cJSON_Delete(o);
            return RLAI_ERR_NOMEM;
        }
        for (int k = 0; k < lp[i].n_top; k++) {
            cJSON *t = token_entry(e, lp[i].top_ids[k], lp[i].top_logprobs[k]);
            if (!t) {
                cJSON_Delete(o);
                return RLAI_ERR_NOMEM;
            }
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToArray(content, o);
    }
    return 0;
}

cJSON *rlai_logprobs_completion_json(const rlai_engine *e, const rlai_token_logprobs *lp, int n, size_t *offset)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    if (!toks || !lps || !tops || !offs) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *b = token_bytes(e, lp[i].token, &len);
        char *t = b ? clean_utf8(b, len) : NULL;
        /* the first prompt token of an echo: no distribution, null */
        bool none = isnan(lp[i].logprob);
        cJSON *top = none ? cJSON_CreateNull() : cJSON_CreateObject();
        if (!t || !top) {
            free(b);
            free(t);
            cJSON_Delete(top);
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToArray(toks, cJSON_CreateString(t));
        cJSON_AddItemToArray(lps, none ? cJSON_CreateNull() : cJSON_CreateNumber(lp_value(lp[i].logprob)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += rlai_utf8_chars(b, len);
        for (int k = 0; k < lp[i].n_top; k++) {
            size_t tl = 0;
            char *tb = token_bytes(e, lp[i].top_ids[k], &tl);
            char *tt = tb ? clean_utf8(tb, tl) : NULL;
            /* two ids with the same text: the first (more probable) stays */
            if (tt && !cJSON_GetObjectItemCaseSensitive(top, tt))
                cJSON_AddNumberToObject(top, tt, lp_value(lp[i].top_logprobs[k]));
            free(tb);
            free(tt);
        }
        cJSON_AddItemToArray(tops, top);
        free(b);
        free(t);
    }
    return o;
}
