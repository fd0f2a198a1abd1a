/* model.c - llama-family weights and forward pass (see model.h). */
#include "model.h"
#include "rlai/error.h"
#include "dtype.h"
#include "rlai/engine.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct rlai_layer {
    float *attn_norm, *ffn_norm;            /* owned, n_embd */
    float *bq, *bk, *bv;                    /* owned or NULL */
    rlai_weight wq, wk, wv, wo, w_gate, w_up, w_down;
} rlai_layer;

struct rlai_model {
    rlai_hparams hp;
    rlai_weight tok_embd;
    rlai_weight output;                     /* == tok_embd when tied */
    float *output_norm;                     /* owned */
    float *inv_freq;                        /* owned, n_rot/2 */
    rlai_layer *layers;
    uint64_t n_params;
    uint64_t weight_bytes;
    bool mapped;                            /* weights point into a mapped file */
};

/* ------------------------------------------------------------------ load */

static int get_u32_key(const rlai_gguf *g, const char *arch, const char *suffix, bool required,
                       uint32_t dflt, uint32_t *out, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = rlai_gguf_get_u32(g, key, out);
    if (rc == RLAI_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return 0;
    }
    if (rc == RLAI_ERR_NOT_FOUND)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: required key '%s' missing", key);
    if (rc < 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: key '%s' has a wrong type or value", key);
    return 0;
}

static int get_f32_key(const rlai_gguf *g, const char *arch, const char *suffix, bool required,
                       float dflt, float *out, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = rlai_gguf_get_f32(g, key, out);
    if (rc == RLAI_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return 0;
    }
    if (rc == RLAI_ERR_NOT_FOUND)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: required key '%s' missing", key);
    if (rc < 0 || !isfinite(*out))
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: key '%s' has a wrong type or value", key);
    return 0;
}

/* Finds a tensor and checks its shape {ne0, ne1} (ne1 = 1 for vectors). */
static int find_tensor(const rlai_gguf *g, const char *name, int64_t ne0, int64_t ne1, bool required,
                       const rlai_gguf_tensor **out, char *err, size_t errlen)
{
    const rlai_gguf_tensor *t = rlai_gguf_find_tensor(g, name);
    *out = t;
    if (!t) {
        if (!required)
            return 0;
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: tensor '%s' missing", name);
    }
    bool ok = (int64_t)t->ne[0] == ne0 && (int64_t)t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1;
    if (!ok)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                    "model: tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld]",
                    name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                    (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                    (long long)ne0, (long long)ne1);
    if (!rlai_dtype_supported(t->type))
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "model: tensor '%s' has type %s (id %u), which this engine cannot compute "
                    "(supported: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0)",
                    name, rlai_dtype_name(t->type), t->type);
    return 0;
}

static int bind_matrix(rlai_model *m, const rlai_gguf *g, const char *name, int64_t cols, int64_t rows,
                       rlai_weight *w, char *err, size_t errlen)
{
    const rlai_gguf_tensor *t;
    int rc = find_tensor(g, name, cols, rows, true, &t, err, errlen);
    if (rc < 0)
        return rc;
    if (t->type == RLAI_DT_Q8_1)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "model: tensor '%s': q8_1 weights unsupported", name);
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    m->n_params += (uint64_t)(rows * cols);
    m->weight_bytes += t->nbytes;
    return 0;
}

/* Copies a vector tensor (any supported type) to a new f32 array. */
static int load_vector(rlai_model *m, const rlai_gguf *g, const char *name, int64_t n, bool required,
                       float **out, char *err, size_t errlen)
{
    const rlai_gguf_tensor *t;
    *out = NULL;
    int rc = find_tensor(g, name, n, 1, required, &t, err, errlen);
    if (rc < 0 || !t)
        return rc;
    if (n % (int64_t)rlai_dtype_block_elems(t->type) != 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: tensor '%s' length not a block multiple", name);
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v)
        return RLAI_ERR_NOMEM;
    rlai_dequantize_row(t->type, t->data, v, n);
    *out = v;
    m->n_params += (uint64_t)n;
    m->weight_bytes += t->nbytes;
    return 0;
}

int rlai_model_load(const rlai_gguf *g, rlai_model **out, char *err, size_t errlen)
{
    *out = NULL;
    rlai_gguf_str archs;
    if (rlai_gguf_get_str(g, "general.architecture", &archs) < 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: 'general.architecture' missing or not a string");
    char arch[32];
    if (archs.len == 0 || archs.len >= sizeof(arch))
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "model: architecture name of %zu bytes", archs.len);
    memcpy(arch, archs.ptr, archs.len);
    arch[archs.len] = 0;
    bool is_llama = strcmp(arch, "llama") == 0;
    bool is_qwen2 = strcmp(arch, "qwen2") == 0;
    if (!is_llama && !is_qwen2)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "model: architecture '%s' is not supported (supported: llama, qwen2)", arch);

    rlai_model *m = calloc(1, sizeof(*m));
    if (!m)
        return RLAI_ERR_NOMEM;
    m->mapped = rlai_gguf_is_mapped(g);
    rlai_hparams *hp = &m->hp;
    memcpy(hp->arch, arch, archs.len + 1);
    uint32_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_rot, n_ctx;
    int rc;
    if ((rc = get_u32_key(g, arch, "embedding_length", true, 0, &n_embd, err, errlen)) < 0 ||
        (rc = get_u32_key(g, arch, "block_count", true, 0, &n_layer, err, errlen)) < 0 ||
        (rc = get_u32_key(g, arch, "feed_forward_length", true, 0, &n_ff, err, errlen)) < 0 ||
        (rc = get_u32_key(g, arch, "attention.head_count", true, 0, &n_head, err, errlen)) < 0 ||
        (rc = get_u32_key(g, arch, "attention.head_count_kv", false, n_head, &n_head_kv, err, errlen)) < 0 ||
        (rc = get_u32_key(g, arch, "context_length", false, 2048, &n_ctx, err, errlen)) < 0 ||
        (rc = get_f32_key(g, arch, "attention.layer_norm_rms_epsilon", true, 0, &hp->norm_eps, err, errlen)) < 0 ||
        (rc = get_f32_key(g, arch, "rope.freq_base", false, 10000.0f, &hp->rope_base, err, errlen)) < 0)
        goto fail;
    rc = RLAI_ERR_FORMAT;
    if (n_embd == 0 || n_embd > 65536 || n_layer == 0 || n_layer > 1024 || n_ff == 0 || n_ff > 262144 ||
        n_head == 0 || n_head > 1024 || n_head_kv == 0 || n_head_kv > n_head || n_head % n_head_kv != 0) {
        rlai_errf(err, errlen, rc, "model: inconsistent hyperparameters (n_embd %u, n_layer %u, n_ff %u, "
             "n_head %u, n_head_kv %u)", n_embd, n_layer, n_ff, n_head, n_head_kv);
        goto fail;
    }
    if ((rc = get_u32_key(g, arch, "attention.key_length", false, n_embd / n_head, &head_dim, err, errlen)) < 0)
        goto fail;
    uint32_t v_len;
    if ((rc = get_u32_key(g, arch, "attention.value_length", false, head_dim, &v_len, err, errlen)) < 0)
        goto fail;
    if ((rc = get_u32_key(g, arch, "rope.dimension_count", false, head_dim, &n_rot, err, errlen)) < 0)
        goto fail;
    rc = RLAI_ERR_FORMAT;
    if (head_dim == 0 || head_dim > 1024 || head_dim % 2 || v_len != head_dim || n_rot > head_dim || n_rot % 2 ||
        hp->norm_eps <= 0 || hp->rope_base <= 0 || n_ctx == 0) {
        rlai_errf(err, errlen, rc, "model: inconsistent attention parameters (head_dim %u, value_length %u, "
             "n_rot %u, eps %g, rope base %g, context %u)", head_dim, v_len, n_rot,
             (double)hp->norm_eps, (double)hp->rope_base, n_ctx);
        goto fail;
    }
    hp->n_embd = (int)n_embd;
    hp->n_layer = (int)n_layer;
    hp->n_ff = (int)n_ff;
    hp->n_head = (int)n_head;
    hp->n_head_kv = (int)n_head_kv;
    hp->head_dim = (int)head_dim;
    hp->n_rot = (int)n_rot;
    hp->n_ctx_train = (int)n_ctx;
    hp->rope_mode = is_qwen2 ? RLAI_ROPE_NEOX : RLAI_ROPE_NORM;
    hp->rope_freq_scale = 1.0f;

    /* RoPE scaling: linear is supported; others are refused, never ignored. */
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    rlai_gguf_str st;
    if (rlai_gguf_get_str(g, key, &st) == 0 && !(st.len == 4 && memcmp(st.ptr, "none", 4) == 0)) {
        if (st.len == 6 && memcmp(st.ptr, "linear", 6) == 0) {
            float factor;
            if ((rc = get_f32_key(g, arch, "rope.scaling.factor", true, 1, &factor, err, errlen)) < 0)
                goto fail;
            if (factor <= 0) {
                rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: rope.scaling.factor must be > 0");
                goto fail;
            }
            hp->rope_freq_scale = 1.0f / factor;
        } else {
            rc = rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "model: rope scaling type '%.*s' not supported",
                      (int)st.len, st.ptr);
            goto fail;
        }
    }

    const rlai_gguf_tensor *te = rlai_gguf_find_tensor(g, "token_embd.weight");
    if (!te) {
        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: tensor 'token_embd.weight' missing");
        goto fail;
    }
    if (te->ne[1] == 0 || te->ne[1] > (1u << 24)) {
        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "model: token_embd.weight vocabulary size %llu out of range",
                  (unsigned long long)te->ne[1]);
        goto fail;
    }
    hp->n_vocab = (int)te->ne[1];
    int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim,
            KV = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
    if ((rc = bind_matrix(m, g, "token_embd.weight", E, V, &m->tok_embd, err, errlen)) < 0)
        goto fail;
    if ((rc = load_vector(m, g, "output_norm.weight", E, true, &m->output_norm, err, errlen)) < 0)
        goto fail;
    if (rlai_gguf_find_tensor(g, "output.weight")) {
        if ((rc = bind_matrix(m, g, "output.weight", E, V, &m->output, err, errlen)) < 0)
            goto fail;
    } else {
        m->output = m->tok_embd;
        hp->tied_output = true;
    }

    m->layers = calloc((size_t)hp->n_layer, sizeof(rlai_layer));
    if (!m->layers) {
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        rlai_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof(n), "blk.%d." s, l), n)
        if ((rc = load_vector(m, g, NAME("attn_norm.weight"), E, true, &L->attn_norm, err, errlen)) < 0 ||
            (rc = load_vector(m, g, NAME("ffn_norm.weight"), E, true, &L->ffn_norm, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("attn_q.weight"), E, Q, &L->wq, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("attn_k.weight"), E, KV, &L->wk, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("attn_v.weight"), E, KV, &L->wv, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("attn_output.weight"), Q, E, &L->wo, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("ffn_gate.weight"), E, F, &L->w_gate, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("ffn_up.weight"), E, F, &L->w_up, err, errlen)) < 0 ||
            (rc = bind_matrix(m, g, NAME("ffn_down.weight"), F, E, &L->w_down, err, errlen)) < 0 ||
            (rc = load_vector(m, g, NAME("attn_q.bias"), Q, is_qwen2, &L->bq, err, errlen)) < 0 ||
            (rc = load_vector(m, g, NAME("attn_k.bias"), KV, is_qwen2, &L->bk, err, errlen)) < 0 ||
            (rc = load_vector(m, g, NAME("attn_v.bias"), KV, is_qwen2, &L->bv, err, errlen)) < 0)
            goto fail;
#undef NAME
        if (L->bq || L->bk || L->bv)
            hp->has_qkv_bias = true;
    }

    /* Rotary frequencies, optionally divided by per-dimension factors
     * (rope_freqs.weight, Llama 3.1 style). */
    int half = hp->n_rot / 2;
    m->inv_freq = malloc(sizeof(float) * (size_t)(half > 0 ? half : 1));
    if (!m->inv_freq) {
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    float *factors = NULL;
    if ((rc = load_vector(m, g, "rope_freqs.weight", half, false, &factors, err, errlen)) < 0)
        goto fail;
    for (int i = 0; i < half; i++) {
        double f = pow((double)hp->rope_base, -2.0 * i / hp->n_rot) * hp->rope_freq_scale;
        if (factors)
            f /= factors[i];
        m->inv_freq[i] = (float)f;
    }
    free(factors);
    *out = m;
    return 0;
fail:
    rlai_model_free(m);
    return rc;
}

void rlai_model_free(rlai_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int l = 0; l < m->hp.n_layer; l++) {
            rlai_layer *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
        }
    }
    free(m->layers);
    free(m->output_norm);
    free(m->inv_freq);
    free(m);
}

const rlai_hparams *rlai_model_hparams(const rlai_model *m) { return &m->hp; }
uint64_t rlai_model_n_params(const rlai_model *m) { return m->n_params; }
uint64_t rlai_model_weight_bytes(const rlai_model *m) { return m->weight_bytes; }
/* ------------------------------------------------------------------ ctx */

/* A layer's weights as the backend sees them: the host mapping on the CPU,
 * device copies on a backend with weight_upload. */
typedef struct dev_layer {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
    rlai_weight wq, wk, wv, wo, w_gate, w_up, w_down;
} dev_layer;

struct rlai_model_ctx {
    const rlai_model *m;
    rlai_backend *be;
    int max_batch, max_ctx;
    bool host;                              /* backend memory is host memory */
    dev_layer *layers;
    rlai_weight tok_embd, output;
    float *output_norm;
    /* activations, backend memory */
    float *x, *xn, *q, *kk, *vv, *att, *o, *gate, *up, *out_rows, *logits;
    /* metadata staging, host memory */
    int32_t *pos;
    const int32_t **tables;
};

/* A host-memory backend that computes on its own packed copy of a weight
 * (the CPU kernels' load-time layout; get_rows reads it too) no longer
 * reads the file's pages of it: they are dropped from the process, so
 * its resident memory holds the weights once, not twice. They stay in the
 * page cache and are read again if anything touches them (another
 * context packing the same model, a device upload). Only whole pages
 * inside the weight; only file mappings (dropping a caller's buffer's
 * pages would zero them). */
static void release_mapped(const rlai_model_ctx *c, const rlai_weight *host, const rlai_weight *dev)
{
    if (!c->host || !c->m->mapped || !dev->packed || dev->data != host->data)
        return;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0)
        return;
    size_t n = (size_t)host->rows * rlai_dtype_row_bytes(host->type, host->cols);
    uintptr_t a = ((uintptr_t)host->data + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)host->data + n) & ~((uintptr_t)ps - 1);
    if (e > a)
        (void)madvise((void *)a, e - a, MADV_DONTNEED);   /* a hint: failure changes nothing */
}

static int dev_weight(rlai_model_ctx *c, const rlai_weight *w, rlai_weight *out)
{
    const rlai_backend_i *bi = c->be->iface;
    if (!bi->weight_upload) {
        *out = *w;
        return 0;
    }
    int rc = bi->weight_upload(c->be, w, out);
    if (rc == 0)
        release_mapped(c, w, out);   /* each at once: the peak holds one weight twice, not all */
    return rc;
}

static void dev_weight_free(rlai_model_ctx *c, rlai_weight *w)
{
    const rlai_backend_i *bi = c->be->iface;
    if (bi->weight_upload && bi->weight_free && w->data)
        bi->weight_free(c->be, w);
    w->data = NULL;
}

/* A host f32 vector (norm weights, biases) in backend memory. */
static int dev_vec(rlai_model_ctx *c, const float *v, size_t n, float **out)
{
    *out = NULL;
    if (!v)
        return 0;
    if (c->host) {
        *out = (float *)v;
        return 0;
    }
    void *buf;
    int rc = c->be->iface->buffer_alloc(c->be, n * sizeof(float), &buf);
    if (rc < 0)
        return rc;
    if ((rc = c->be->iface->upload(c->be, buf, 0, v, n * sizeof(float))) < 0) {
        c->be->iface->buffer_free(c->be, buf);
        return rc;
    }
    *out = buf;
    return 0;
}

static void dev_vec_free(rlai_model_ctx *c, float **v)
{
    if (!c->host && *v)
        c->be->iface->buffer_free(c->be, *v);
    *v = NULL;
}

static int scratch(rlai_model_ctx *c, size_t n_floats, float **out)
{
    void *buf;
    int rc = c->be->iface->buffer_alloc(c->be, n_floats * sizeof(float), &buf);
    *out = rc < 0 ? NULL : buf;
    return rc;
}

int rlai_model_ctx_new(const rlai_model *m, rlai_backend *be, int max_batch, int max_ctx,
                          rlai_model_ctx **out)
{
    *out = NULL;
    if (!be || max_batch <= 0 || max_ctx <= 0)
        return RLAI_ERR_INVALID_ARG;
    rlai_model_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return RLAI_ERR_NOMEM;
    const rlai_hparams *hp = &m->hp;
    size_t B = (size_t)max_batch;
    size_t Q = (size_t)hp->n_head * hp->head_dim, KV = (size_t)hp->n_head_kv * hp->head_dim;
    c->m = m;
    c->be = be;
    c->host = be->iface->host_memory;
    c->max_batch = max_batch;
    c->max_ctx = max_ctx;
    int rc = RLAI_ERR_NOMEM;
    c->layers = calloc((size_t)hp->n_layer, sizeof(*c->layers));
    c->pos = malloc(sizeof(int32_t) * B);
    c->tables = malloc(sizeof(*c->tables) * B);
    if (!c->layers || !c->pos || !c->tables)
        goto fail;
    if ((rc = dev_weight(c, &m->tok_embd, &c->tok_embd)) < 0 ||
        (rc = hp->tied_output && be->iface->weight_upload ? 0 : dev_weight(c, &m->output, &c->output)) < 0 ||
        (rc = dev_vec(c, m->output_norm, (size_t)hp->n_embd, &c->output_norm)) < 0)
        goto fail;
    if (hp->tied_output && be->iface->weight_upload)
        c->output = c->tok_embd;
    for (int l = 0; l < hp->n_layer; l++) {
        const rlai_layer *L = &m->layers[l];
        dev_layer *D = &c->layers[l];
        if ((rc = dev_vec(c, L->attn_norm, (size_t)hp->n_embd, &D->attn_norm)) < 0 ||
            (rc = dev_vec(c, L->ffn_norm, (size_t)hp->n_embd, &D->ffn_norm)) < 0 ||
            (rc = dev_vec(c, L->bq, Q, &D->bq)) < 0 ||
            (rc = dev_vec(c, L->bk, KV, &D->bk)) < 0 ||
            (rc = dev_vec(c, L->bv, KV, &D->bv)) < 0 ||
            (rc = dev_weight(c, &L->wq, &D->wq)) < 0 || (rc = dev_weight(c, &L->wk, &D->wk)) < 0 ||
            (rc = dev_weight(c, &L->wv, &D->wv)) < 0 || (rc = dev_weight(c, &L->wo, &D->wo)) < 0 ||
            (rc = dev_weight(c, &L->w_gate, &D->w_gate)) < 0 || (rc = dev_weight(c, &L->w_up, &D->w_up)) < 0 ||
            (rc = dev_weight(c, &L->w_down, &D->w_down)) < 0)
            goto fail;
    }
    size_t wide = (size_t)(hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff);
    if ((rc = scratch(c, B * hp->n_embd, &c->x)) < 0 || (rc = scratch(c, B * wide, &c->xn)) < 0 ||
        (rc = scratch(c, B * Q, &c->q)) < 0 || (rc = scratch(c, B * KV, &c->kk)) < 0 ||
        (rc = scratch(c, B * KV, &c->vv)) < 0 || (rc = scratch(c, B * Q, &c->att)) < 0 ||
        (rc = scratch(c, B * hp->n_embd, &c->o)) < 0 || (rc = scratch(c, B * hp->n_ff, &c->gate)) < 0 ||
        (rc = scratch(c, B * hp->n_ff, &c->up)) < 0 || (rc = scratch(c, B * hp->n_embd, &c->out_rows)) < 0)
        goto fail;
    if (!c->host && (rc = scratch(c, B * (size_t)hp->n_vocab, &c->logits)) < 0)
        goto fail;
    *out = c;
    return 0;
fail:
    rlai_model_ctx_free(c);
    return rc;
}

void rlai_model_ctx_free(rlai_model_ctx *c)
{
    if (!c)
        return;
    const rlai_backend_i *bi = c->be->iface;
    float **bufs[] = { &c->x, &c->xn, &c->q, &c->kk, &c->vv, &c->att, &c->o, &c->gate, &c->up,
                       &c->out_rows, &c->logits };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        bi->buffer_free(c->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    if (c->layers) {
        for (int l = 0; l < c->m->hp.n_layer; l++) {
            dev_layer *D = &c->layers[l];
            dev_vec_free(c, &D->attn_norm);
            dev_vec_free(c, &D->ffn_norm);
            dev_vec_free(c, &D->bq);
            dev_vec_free(c, &D->bk);
            dev_vec_free(c, &D->bv);
            rlai_weight *ws[] = { &D->wq, &D->wk, &D->wv, &D->wo, &D->w_gate, &D->w_up, &D->w_down };
            for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
                dev_weight_free(c, ws[i]);
        }
    }
    bool shared_out = c->output.data == c->tok_embd.data;
    dev_weight_free(c, &c->tok_embd);
    if (!shared_out)
        dev_weight_free(c, &c->output);
    dev_vec_free(c, &c->output_norm);
    free(c->layers);
    free(c->pos);
    free((void *)c->tables);
    free(c);
}

rlai_backend *rlai_model_ctx_backend(const rlai_model_ctx *c) { return c->be; }

/* -------------------------------------------------------------- forward */

/* Products of several weights with one input: one backend call where the
 * backend has matmul_n (the CPU backend quantizes the input once), else
 * one matmul each. */
static void matmul_n(rlai_backend *be, const rlai_weight *const *w, int n, const float *x, int64_t ldx, int T,
                     float *const *y, const int64_t *ldy)
{
    const rlai_backend_i *bi = be->iface;
    if (RLAI_BACKEND_HAS(bi, matmul_n)) {
        bi->matmul_n(be, w, n, x, ldx, T, y, ldy);
        return;
    }
    for (int i = 0; i < n; i++)
        bi->matmul(be, w[i], x, ldx, T, y[i], ldy[i]);
}

static int forward_chunk(rlai_model_ctx *c, rlai_kv_cache *kv, rlai_kv_seq *const *seqs,
                         const rlai_batch *b, int start, int n, float **logits)
{
    const rlai_model *m = c->m;
    const rlai_hparams *hp = &m->hp;
    const rlai_backend_i *bi = c->be->iface;
    rlai_backend *be = c->be;
    int E = hp->n_embd, H = hp->n_head, HKV = hp->n_head_kv, D = hp->head_dim, F = hp->n_ff;
    int Q = H * D, KVD = HKV * D;

    for (int i = 0; i < n; i++) {
        c->pos[i] = b->pos[start + i];
        c->tables[i] = seqs[b->seq ? b->seq[start + i] : 0]->blocks;
    }
    rlai_paged_rows rows = { n, c->pos, c->tables };

    bi->get_rows(be, &c->tok_embd, b->tokens + start, n, c->x);
    if (b->embd) {   /* image rows replace the embeddings of their positions */
        size_t rb = sizeof(float) * (size_t)E;
        for (int i = 0; i < n; i++) {
            const float *row = b->embd[start + i];
            if (!row)
                continue;
            if (c->host) {
                memcpy(c->x + (size_t)i * E, row, rb);
            } else {
                int rc = bi->upload(be, c->x, (size_t)i * rb, row, rb);
                if (rc < 0)
                    return rc;
            }
        }
    }

    for (int l = 0; l < hp->n_layer; l++) {
        const dev_layer *L = &c->layers[l];
        rlai_kv_layer_view view;
        rlai_kv_cache_layer_view(kv, l, &view.k, &view.v, &view.row_bytes);
        view.dtype = rlai_kv_cache_dtype(kv);
        view.kv_dim = KVD;

        bi->rmsnorm(be, c->xn, c->x, L->attn_norm, n, E, hp->norm_eps);
        {
            const rlai_weight *w[3] = { &L->wq, &L->wk, &L->wv };
            float *const y[3] = { c->q, c->kk, c->vv };
            const int64_t ldy[3] = { Q, KVD, KVD };
            matmul_n(be, w, 3, c->xn, E, n, y, ldy);
        }
        if (L->bq)
            bi->add_row(be, c->q, L->bq, n, Q);
        if (L->bk)
            bi->add_row(be, c->kk, L->bk, n, KVD);
        if (L->bv)
            bi->add_row(be, c->vv, L->bv, n, KVD);
        bi->rope(be, c->q, n, H, D, hp->n_rot, hp->rope_mode, m->inv_freq, c->pos);
        bi->rope(be, c->kk, n, HKV, D, hp->n_rot, hp->rope_mode, m->inv_freq, c->pos);
        bi->kv_store(be, &view, &rows, c->kk, c->vv);
        bi->attention(be, &view, &rows, H, HKV, D, c->q, c->att);
        bi->matmul(be, &L->wo, c->att, Q, n, c->o, E);
        bi->add(be, c->x, c->o, (size_t)n * E);

        bi->rmsnorm(be, c->xn, c->x, L->ffn_norm, n, E, hp->norm_eps);
        {
            const rlai_weight *w[2] = { &L->w_gate, &L->w_up };
            float *const y[2] = { c->gate, c->up };
            const int64_t ldy[2] = { F, F };
            matmul_n(be, w, 2, c->xn, E, n, y, ldy);
        }
        bi->swiglu(be, c->gate, c->up, (size_t)n * F);
        bi->matmul(be, &L->w_down, c->gate, F, n, c->o, E);
        bi->add(be, c->x, c->o, (size_t)n * E);
    }

    /* Final norm and LM head for the rows that want logits. */
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        int bi_ = start + i;
        bool want = b->want ? b->want[bi_] : bi_ == b->n - 1;
        if (!want)
            continue;
        bi->rmsnorm(be, c->out_rows + (size_t)n_out * E, c->x + (size_t)i * E, c->output_norm, 1, E,
                    hp->norm_eps);
        n_out++;
    }
    if (n_out > 0 && b->hidden) {
        size_t hbytes = sizeof(float) * (size_t)n_out * E;
        if (c->host) {
            memcpy(*logits, c->out_rows, hbytes);
        } else {
            int rc = bi->download(be, c->out_rows, 0, *logits, hbytes);
            if (rc < 0)
                return rc;
        }
        *logits += (size_t)n_out * E;
        return 0;
    }
    if (n_out > 0) {
        size_t bytes = sizeof(float) * (size_t)n_out * hp->n_vocab;
        if (c->host) {
            bi->matmul(be, &c->output, c->out_rows, E, n_out, *logits, hp->n_vocab);
        } else {
            bi->matmul(be, &c->output, c->out_rows, E, n_out, c->logits, hp->n_vocab);
            int rc = bi->download(be, c->logits, 0, *logits, bytes);
            if (rc < 0)
                return rc;
        }
        *logits += (size_t)n_out * hp->n_vocab;
    }
    return 0;
}

int rlai_model_forward(rlai_model_ctx *c, rlai_kv_cache *kv, rlai_kv_seq *const *seqs,
                       const rlai_batch *b, float *logits)
{
    const rlai_hparams *hp = &c->m->hp;
    for (int i = 0; i < b->n; i++) {
        const rlai_kv_seq *seq = seqs[b->seq ? b->seq[i] : 0];
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->n_vocab)
            return RLAI_ERR_INVALID_ARG;
        if (b->pos[i] < 0 || b->pos[i] >= c->max_ctx || b->pos[i] >= seq->n_blocks * RLAI_KV_BLOCK)
            return RLAI_ERR_INVALID_ARG;
    }
    for (int start = 0; start < b->n; start += c->max_batch) {
        int n = b->n - start < c->max_batch ? b->n - start : c->max_batch;
        int rc = forward_chunk(c, kv, seqs, b, start, n, &logits);
        if (rc < 0)
            return rc;
    }
    return 0;
}
