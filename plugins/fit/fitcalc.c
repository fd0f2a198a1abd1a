/* fitcalc.c - memory and speed estimates (formulas in fitcalc.h). */
#include "fitcalc.h"

#include <strings.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COUNT 9007199254740992.0 /* 2^53: integers exact in a JSON double */

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

/* ------------------------------------------------------------------ */
/* KV types                                                            */

int rlai_fit_kv_parse(const char *s, rlai_fit_kv *out)
{
    static const struct { const char *name; rlai_fit_kv kv; } names[] = {
        { "f16", RLAI_FIT_KV_F16 }, { "q8_0", RLAI_FIT_KV_Q8_0 }, { "f32", RLAI_FIT_KV_F32 },
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(s, names[i].name) == 0) {
            *out = names[i].kv;
            return 0;
        }
    }
    return RLAI_ERR_INVALID_ARG;
}

const char *rlai_fit_kv_name(rlai_fit_kv kv)
{
    switch (kv) {
    case RLAI_FIT_KV_F16: return "f16";
    case RLAI_FIT_KV_Q8_0: return "q8_0";
    case RLAI_FIT_KV_F32: return "f32";
    }
    return "?";
}

uint64_t rlai_fit_kv_row_bytes(rlai_fit_kv kv, uint64_t n)
{
    switch (kv) {
    case RLAI_FIT_KV_F16: return n * 2;
    case RLAI_FIT_KV_F32: return n * 4;
    case RLAI_FIT_KV_Q8_0: return (n + 31) / 32 * 34;
    }
    return 0;
}

static double kv_bytes_per_element(rlai_fit_kv kv)
{
    switch (kv) {
    case RLAI_FIT_KV_F16: return 2.0;
    case RLAI_FIT_KV_F32: return 4.0;
    case RLAI_FIT_KV_Q8_0: return 34.0 / 32.0;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* JSON field readers                                                  */

/* Reads a non-negative integer member. Returns 1 when present, 0 when
 * absent (or null), negative on a malformed value. */
static int get_uint(const cJSON *o, const char *key, uint64_t *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > MAX_COUNT ||
        floor(v->valuedouble) != v->valuedouble)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'%s' must be a non-negative integer", key);
    *out = (uint64_t)v->valuedouble;
    return 1;
}

/* A positive integer member (<= 2^31); required or optional (0 when absent). */
static int get_count(const cJSON *o, const char *key, bool required, int64_t *out, char *err, size_t errlen)
{
    uint64_t u = 0;
    int rc = get_uint(o, key, &u, err, errlen);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        *out = 0;
        return required ? fail(err, errlen, RLAI_ERR_INVALID_ARG, "'%s' is required", key) : 0;
    }
    if (u == 0 || u > (1u << 31))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'%s' must be an integer in 1..%u (got %llu)",
                    key, 1u << 31, (unsigned long long)u);
    *out = (int64_t)u;
    return 0;
}

/* A positive finite number member: 1 present, 0 absent, negative malformed. */
static int get_positive(const cJSON *o, const char *key, double max, double *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !(v->valuedouble <= max))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'%s' must be a number in (0, %g]", key, max);
    *out = v->valuedouble;
    return 1;
}

static int cmp_type_bytes(const void *a, const void *b)
{
    const rlai_fit_type *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* ------------------------------------------------------------------ */
/* models                                                              */

int rlai_fit_model_from_describe(const cJSON *d, rlai_fit_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    copy_str(m->source, sizeof m->source, "gguf");
    if (!cJSON_IsObject(d))
        return fail(err, errlen, RLAI_ERR_FORMAT, "GGUF description is not an object");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(d, "name");
    if (cJSON_IsString(s))
        copy_str(m->name, sizeof m->name, s->valuestring);
    s = cJSON_GetObjectItemCaseSensitive(d, "arch");
    if (cJSON_IsString(s))
        copy_str(m->arch, sizeof m->arch, s->valuestring);

    struct { const char *key; int64_t *dst; } counts[] = {
        { "n_layer", &m->n_layer }, { "n_embd", &m->n_embd }, { "n_head", &m->n_head },
        { "n_head_kv", &m->n_head_kv }, { "head_dim", &m->head_dim }, { "n_ff", &m->n_ff },
        { "n_vocab", &m->n_vocab }, { "n_ctx_train", &m->n_ctx_train },
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        int rc = get_count(d, counts[i].key, false, counts[i].dst, err, errlen);
        if (rc < 0)
            return RLAI_ERR_FORMAT;
    }
    if (get_uint(d, "n_params", &m->n_params, err, errlen) < 0 ||
        get_uint(d, "weight_bytes", &m->weight_bytes, err, errlen) < 0 ||
        get_uint(d, "file_bytes", &m->file_bytes, err, errlen) < 0)
        return RLAI_ERR_FORMAT;

    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(d, "tensor_types");
    const cJSON *e;
    cJSON_ArrayForEach(e, tt) {
        if (m->n_types >= RLAI_FIT_MAX_TYPES)
            return fail(err, errlen, RLAI_ERR_FORMAT, "more than %d tensor types", RLAI_FIT_MAX_TYPES);
        rlai_fit_type *t = &m->types[m->n_types];
        if (!e->string || !cJSON_IsObject(e))
            return fail(err, errlen, RLAI_ERR_FORMAT, "tensor_types entry is not an object");
        copy_str(t->name, sizeof t->name, e->string);
        if (get_uint(e, "count", &t->count, err, errlen) < 0 ||
            get_uint(e, "params", &t->params, err, errlen) < 0 ||
            get_uint(e, "bytes", &t->bytes, err, errlen) < 0)
            return RLAI_ERR_FORMAT;
        m->n_types++;
    }
    qsort(m->types, (size_t)m->n_types, sizeof m->types[0], cmp_type_bytes);

    const char *what = !m->n_layer ? "n_layer" : !m->n_head_kv ? "n_head_kv" : !m->head_dim ? "head_dim" : NULL;
    if (what)
        return fail(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "the file has no %s (a vocabulary-only file or an architecture%s%s%s whose "
                    "hyperparameters are not known): cannot estimate the KV cache",
                    what, m->arch[0] ? " '" : "", m->arch, m->arch[0] ? "'" : "");
    if (m->n_params == 0 || m->weight_bytes == 0)
        return fail(err, errlen, RLAI_ERR_UNSUPPORTED, "the file has no tensors: nothing to fit");
    return 0;
}

int rlai_fit_model_from_params(const cJSON *p, rlai_fit_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    copy_str(m->source, sizeof m->source, "params");
    if (!cJSON_IsObject(p))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "model parameters must be an object");
    double params_b = 0, bpw = 0;
    int rc = get_positive(p, "params_b", 1e5, &params_b, err, errlen);
    if (rc == 0)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'params_b' (parameters in billions) is required");
    if (rc < 0)
        return rc;
    rc = get_positive(p, "bits_per_weight", 32, &bpw, err, errlen);
    if (rc == 0)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'bits_per_weight' is required (e.g. 4.5 for Q4_0, "
                    "16 for f16)");
    if (rc < 0)
        return rc;
    if ((rc = get_count(p, "n_layer", true, &m->n_layer, err, errlen)) < 0 ||
        (rc = get_count(p, "n_head_kv", true, &m->n_head_kv, err, errlen)) < 0 ||
        (rc = get_count(p, "head_dim", true, &m->head_dim, err, errlen)) < 0 ||
        (rc = get_count(p, "n_embd", false, &m->n_embd, err, errlen)) < 0 ||
        (rc = get_count(p, "n_ff", false, &m->n_ff, err, errlen)) < 0 ||
        (rc = get_count(p, "n_vocab", false, &m->n_vocab, err, errlen)) < 0 ||
        (rc = get_count(p, "n_head", false, &m->n_head, err, errlen)) < 0 ||
        (rc = get_count(p, "n_ctx_train", false, &m->n_ctx_train, err, errlen)) < 0)
        return rc;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "name");
    if (s && !cJSON_IsNull(s) && !cJSON_IsString(s))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'name' must be a string");
    if (cJSON_IsString(s))
        copy_str(m->name, sizeof m->name, s->valuestring);
    m->n_params = (uint64_t)llround(params_b * 1e9);
    m->weight_bytes = (uint64_t)llround((double)m->n_params * bpw / 8.0);
    return 0;
}

/* ------------------------------------------------------------------ */
/* target                                                              */

int rlai_fit_target_from_params(const cJSON *p, rlai_fit_target *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(p, "gpu");
    double vram = 0, bw = 0;
    int has_vram = get_positive(p, "vram_gb", 1e6, &vram, err, errlen);
    if (has_vram < 0)
        return has_vram;
    int has_bw = get_positive(p, "bandwidth_gbs", 1e6, &bw, err, errlen);
    if (has_bw < 0)
        return has_bw;
    if (g && !cJSON_IsNull(g)) {
        if (!cJSON_IsString(g))
            return fail(err, errlen, RLAI_ERR_INVALID_ARG, "'gpu' must be a string (see fit.gpus)");
        const rlai_fit_gpu *e;
        int rc = rlai_fit_gpu_find(g->valuestring, &e, err, errlen);
        if (rc < 0)
            return rc;
        t->vram_gib = has_vram ? vram : e->vram_gib;
        t->bandwidth_gbs = has_bw ? bw : e->bandwidth_gbs;
        t->unified = e->unified;
        if (has_vram || has_bw)
            snprintf(t->name, sizeof t->name, "%s (custom %g GiB, %g GB/s)", e->name, t->vram_gib,
                     t->bandwidth_gbs);
        else
            copy_str(t->name, sizeof t->name, e->name);
    } else {
        if (!has_vram || !has_bw)
            return fail(err, errlen, RLAI_ERR_INVALID_ARG,
                        "give 'gpu' (a name from fit.gpus) or both 'vram_gb' and 'bandwidth_gbs'");
        t->vram_gib = vram;
        t->bandwidth_gbs = bw;
        copy_str(t->name, sizeof t->name, "custom");
    }
    t->vram_bytes = (uint64_t)llround(t->vram_gib * (double)(1ull << 30));
    return 0;
}

/* ------------------------------------------------------------------ */
/* the estimate                                                        */

int rlai_fit_compute(const rlai_fit_model *m, const rlai_fit_target *t, int64_t context,
                     rlai_fit_kv kv, rlai_fit_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (context < 1 || context > RLAI_FIT_MAX_CONTEXT)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "context %lld not in 1..%d",
                    (long long)context, RLAI_FIT_MAX_CONTEXT);
    if (rlai_fit_kv_row_bytes(kv, 1) == 0)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "invalid KV type");
    if (m->n_layer <= 0 || m->n_head_kv <= 0 || m->head_dim <= 0)
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "model lacks n_layer, n_head_kv or head_dim");
    if (t->vram_bytes == 0 || !(t->bandwidth_gbs > 0))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "GPU memory size and bandwidth must be > 0");
    r->context = context;
    r->kv_type = kv;
    r->bits_per_weight = m->n_params ? (double)m->weight_bytes * 8.0 / (double)m->n_params : 0;

    /* Counts are <= 2^31 each: 2 * 2^31 * row(2^62)... cannot overflow in
     * practice for real models, but keep the products in range anyway. */
    uint64_t kv_dim = (uint64_t)m->n_head_kv * (uint64_t)m->head_dim;
    r->kv_bytes_per_token = 2ull * (uint64_t)m->n_layer * rlai_fit_kv_row_bytes(kv, kv_dim);
    r->kv_bytes_per_1k = r->kv_bytes_per_token * 1024ull;
    r->kv_bytes_ctx = r->kv_bytes_per_token * (uint64_t)context;

    r->act_complete = m->n_embd > 0 && m->n_ff > 0 && m->n_vocab > 0;
    r->act_hidden_bytes = (uint64_t)RLAI_FIT_BATCH * 4ull *
                          (4ull * (uint64_t)m->n_embd + 2ull * (uint64_t)m->n_ff);
    r->act_logits_bytes = (uint64_t)RLAI_FIT_BATCH * 4ull * (uint64_t)m->n_vocab;
    r->act_workspace_bytes = RLAI_FIT_WORKSPACE_BYTES;
    r->act_bytes = r->act_hidden_bytes + r->act_logits_bytes + r->act_workspace_bytes;

    r->overhead_bytes = RLAI_FIT_OVERHEAD_BYTES;
    r->bytes_per_token = m->weight_bytes + r->kv_bytes_ctx;
    r->need_bytes = r->bytes_per_token + r->overhead_bytes;
    r->budget_bytes = t->vram_bytes / 100 * RLAI_FIT_VRAM_USABLE_PCT +
                      t->vram_bytes % 100 * RLAI_FIT_VRAM_USABLE_PCT / 100; /* = vram*95/100, no overflow */
    r->headroom_bytes = (int64_t)r->budget_bytes - (int64_t)r->need_bytes;
    r->fits = r->need_bytes <= r->budget_bytes;

    double bw = RLAI_FIT_BW_EFFICIENCY * t->bandwidth_gbs * 1e9;
    r->decode_tps = bw / (double)r->bytes_per_token;
    r->decode_tps_empty = m->weight_bytes ? bw / (double)m->weight_bytes : 0;
    return 0;
}

/* ------------------------------------------------------------------ */
/* JSON                                                                */

typedef struct { cJSON *o; bool ok; } jb;

static void put_num(jb *b, cJSON *o, const char *k, double v)
{
    if (!cJSON_AddNumberToObject(o, k, v))
        b->ok = false;
}

static void put_count(jb *b, cJSON *o, const char *k, int64_t v)
{
    if (v > 0)
        put_num(b, o, k, (double)v);
}

static void put_str(jb *b, cJSON *o, const char *k, const char *v)
{
    if (!cJSON_AddStringToObject(o, k, v))
        b->ok = false;
}

static void put_bool(jb *b, cJSON *o, const char *k, bool v)
{
    if (!cJSON_AddBoolToObject(o, k, v))
        b->ok = false;
}

static cJSON *put_obj(jb *b, cJSON *o, const char *k)
{
    cJSON *c = cJSON_AddObjectToObject(o, k);
    if (!c) {
        b->ok = false;
        return b->o; /* a valid target for the following calls; result discarded */
    }
    return c;
}

static void note(jb *b, cJSON *notes, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void note(jb *b, cJSON *notes, const char *fmt, ...)
{
    char buf[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cJSON *s = cJSON_CreateString(buf);
    if (!s || !cJSON_AddItemToArray(notes, s)) {
        cJSON_Delete(s);
        b->ok = false;
    }
}

cJSON *rlai_fit_result_json(const rlai_fit_model *m, const rlai_fit_target *t,
                            const rlai_fit_result *r, const char *path)
{
    jb b = { cJSON_CreateObject(), true };
    if (!b.o)
        return NULL;
    const double gib = (double)(1ull << 30);

    cJSON *mo = put_obj(&b, b.o, "model");
    put_str(&b, mo, "source", m->source);
    if (path)
        put_str(&b, mo, "path", path);
    if (m->name[0])
        put_str(&b, mo, "name", m->name);
    if (m->arch[0])
        put_str(&b, mo, "arch", m->arch);
    put_num(&b, mo, "n_params", (double)m->n_params);
    put_count(&b, mo, "n_layer", m->n_layer);
    put_count(&b, mo, "n_embd", m->n_embd);
    put_count(&b, mo, "n_head", m->n_head);
    put_count(&b, mo, "n_head_kv", m->n_head_kv);
    put_count(&b, mo, "head_dim", m->head_dim);
    put_count(&b, mo, "n_ff", m->n_ff);
    put_count(&b, mo, "n_vocab", m->n_vocab);
    put_count(&b, mo, "n_ctx_train", m->n_ctx_train);
    if (m->file_bytes)
        put_num(&b, mo, "file_bytes", (double)m->file_bytes);

    cJSON *go = put_obj(&b, b.o, "gpu");
    put_str(&b, go, "name", t->name);
    put_num(&b, go, "vram_gb", t->vram_gib);
    put_num(&b, go, "vram_bytes", (double)t->vram_bytes);
    put_num(&b, go, "bandwidth_gbs", t->bandwidth_gbs);
    put_bool(&b, go, "unified", t->unified);

    cJSON *wo = put_obj(&b, b.o, "weights");
    put_num(&b, wo, "bytes", (double)m->weight_bytes);
    put_num(&b, wo, "gib", (double)m->weight_bytes / gib);
    put_num(&b, wo, "params", (double)m->n_params);
    put_num(&b, wo, "bits_per_weight", r->bits_per_weight);
    cJSON *bt = cJSON_AddArrayToObject(wo, "by_type");
    if (!bt)
        b.ok = false;
    for (int i = 0; bt && i < m->n_types; i++) {
        const rlai_fit_type *ty = &m->types[i];
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(bt, e)) {
            cJSON_Delete(e);
            b.ok = false;
            break;
        }
        put_str(&b, e, "type", ty->name);
        put_num(&b, e, "count", (double)ty->count);
        put_num(&b, e, "params", (double)ty->params);
        put_num(&b, e, "bytes", (double)ty->bytes);
        put_num(&b, e, "bits_per_weight", ty->params ? (double)ty->bytes * 8.0 / (double)ty->params : 0);
    }

    cJSON *ko = put_obj(&b, b.o, "kv");
    put_str(&b, ko, "type", rlai_fit_kv_name(r->kv_type));
    put_num(&b, ko, "bytes_per_element", kv_bytes_per_element(r->kv_type));
    put_num(&b, ko, "bytes_per_token", (double)r->kv_bytes_per_token);
    put_num(&b, ko, "bytes_per_1k_tokens", (double)r->kv_bytes_per_1k);
    put_num(&b, ko, "context", (double)r->context);
    put_num(&b, ko, "bytes_at_context", (double)r->kv_bytes_ctx);
    put_num(&b, ko, "gib_at_context", (double)r->kv_bytes_ctx / gib);

    cJSON *ao = put_obj(&b, b.o, "activations");
    put_num(&b, ao, "batch", RLAI_FIT_BATCH);
    put_num(&b, ao, "hidden_bytes", (double)r->act_hidden_bytes);
    put_num(&b, ao, "logits_bytes", (double)r->act_logits_bytes);
    put_num(&b, ao, "workspace_bytes", (double)r->act_workspace_bytes);
    put_num(&b, ao, "bytes", (double)r->act_bytes);
    put_bool(&b, ao, "complete", r->act_complete);
    put_str(&b, ao, "formula", "512*4*(4*n_embd + 2*n_ff) + 512*4*n_vocab + 256 MiB");

    cJSON *vo = put_obj(&b, b.o, "verdict");
    put_bool(&b, vo, "fits", r->fits);
    put_num(&b, vo, "need_bytes", (double)r->need_bytes);
    put_num(&b, vo, "budget_bytes", (double)r->budget_bytes);
    put_num(&b, vo, "headroom_bytes", (double)r->headroom_bytes);
    put_num(&b, vo, "headroom_gib", (double)r->headroom_bytes / gib);
    put_num(&b, vo, "overhead_bytes", (double)r->overhead_bytes);
    put_str(&b, vo, "rule", "weights + KV at context + 1 GiB <= 95% of VRAM");

    cJSON *dec = put_obj(&b, b.o, "decode");
    put_num(&b, dec, "tok_s", r->decode_tps);
    put_num(&b, dec, "tok_s_empty_context", r->decode_tps_empty);
    put_num(&b, dec, "bytes_per_token", (double)r->bytes_per_token);
    put_num(&b, dec, "bandwidth_efficiency", RLAI_FIT_BW_EFFICIENCY);

    cJSON *notes = cJSON_AddArrayToObject(b.o, "notes");
    if (!notes) {
        b.ok = false;
    } else {
        if (!r->fits)
            note(&b, notes, "does not fit: %.2f GiB short; the speed assumes everything in GPU memory",
                 (double)-r->headroom_bytes / gib);
        if (r->act_bytes > r->overhead_bytes)
            note(&b, notes, "activation estimate (%.2f GiB) exceeds the 1 GiB allowance of the verdict",
                 (double)r->act_bytes / gib);
        if (!r->act_complete)
            note(&b, notes, "n_embd, n_ff or n_vocab unknown: activation estimate is partial");
        if (m->n_ctx_train > 0 && r->context > m->n_ctx_train)
            note(&b, notes, "context %lld exceeds the model's training context %lld",
                 (long long)r->context, (long long)m->n_ctx_train);
        if (r->kv_type == RLAI_FIT_KV_Q8_0 && (m->n_head_kv * m->head_dim) % 32 != 0)
            note(&b, notes, "q8_0 KV needs n_head_kv*head_dim divisible by 32 (the engine refuses this model)");
        if (t->unified)
            note(&b, notes, "unified memory: the OS and other programs share it, so less is usable");
    }
    if (!b.ok) {
        cJSON_Delete(b.o);
        return NULL;
    }
    return b.o;
}

/* ------------------------------------------------------------------ */
/* fit.check                                                           */

static bool has_counts(const cJSON *p)
{
    return cJSON_GetObjectItemCaseSensitive(p, "params_b") != NULL;
}

int rlai_fit_check(const cJSON *params, rlai_fit_describe_fn describe, cJSON **out,
                   char *err, size_t errlen)
{
    *out = NULL;
    if (!cJSON_IsObject(params))
        return fail(err, errlen, RLAI_ERR_INVALID_ARG, "params must be an object");
    rlai_fit_model *m = malloc(sizeof *m);
    if (!m)
        return fail(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    int rc;
    const char *path = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(params, "model");
    if (cJSON_IsString(model)) {
        path = model->valuestring;
        if (!path[0]) {
            rc = fail(err, errlen, RLAI_ERR_INVALID_ARG, "'model' is an empty path");
            goto done;
        }
        if (!describe) {
            rc = fail(err, errlen, RLAI_ERR_NOT_IMPLEMENTED, "this host cannot read GGUF headers");
            goto done;
        }
        cJSON *d = NULL;
        char derr[400] = "";
        rc = describe(path, &d, derr, sizeof derr);
        if (rc < 0) {
            fail(err, errlen, rc, "%s", derr[0] ? derr : "cannot read the GGUF header");
            goto done;
        }
        char merr[320] = "";
        rc = rlai_fit_model_from_describe(d, m, merr, sizeof merr);
        cJSON_Delete(d);
        if (rc < 0) {
            fail(err, errlen, rc, "%s: %s", path, merr);
            goto done;
        }
    } else if (cJSON_IsObject(model)) {
        if ((rc = rlai_fit_model_from_params(model, m, err, errlen)) < 0)
            goto done;
    } else if (!model && has_counts(params)) {
        if ((rc = rlai_fit_model_from_params(params, m, err, errlen)) < 0)
            goto done;
    } else {
        rc = fail(err, errlen, RLAI_ERR_INVALID_ARG,
                  "give 'model': a GGUF path or {params_b, n_layer, n_head_kv, head_dim, bits_per_weight}");
        goto done;
    }

    rlai_fit_target t;
    if ((rc = rlai_fit_target_from_params(params, &t, err, errlen)) < 0)
        goto done;

    uint64_t ctx = RLAI_FIT_DEFAULT_CONTEXT;
    rc = get_uint(params, "context", &ctx, err, errlen);
    if (rc < 0 || ctx < 1 || ctx > RLAI_FIT_MAX_CONTEXT) {
        rc = fail(err, errlen, RLAI_ERR_INVALID_ARG, "'context' must be an integer in 1..%d",
                  RLAI_FIT_MAX_CONTEXT);
        goto done;
    }
    rlai_fit_kv kv = RLAI_FIT_KV_F16;
    const cJSON *kt = cJSON_GetObjectItemCaseSensitive(params, "kv_type");
    if (kt && !cJSON_IsNull(kt) && (!cJSON_IsString(kt) || rlai_fit_kv_parse(kt->valuestring, &kv) < 0)) {
        rc = fail(err, errlen, RLAI_ERR_INVALID_ARG, "'kv_type' must be \"f16\", \"q8_0\" or \"f32\"");
        goto done;
    }
    rlai_fit_result r;
    if ((rc = rlai_fit_compute(m, &t, (int64_t)ctx, kv, &r, err, errlen)) < 0)
        goto done;
    *out = rlai_fit_result_json(m, &t, &r, path);
    rc = *out ? 0 : fail(err, errlen, RLAI_ERR_NOMEM, "out of memory");
done:
    free(m);
    return rc;
}
