/* vision.c - SigLIP ViT + Idefics3 projector from an mmproj GGUF (see vision.h). */
#include "vision.h"
#include "dtype.h"
#include "rlai/error.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vit_layer {
    rlai_weight wq, wk, wv, wo, up, down;
    float *bq, *bk, *bv, *bo, *bup, *bdown;   /* owned, NULL = zero */
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;     /* owned */
} vit_layer;

struct rlai_vision {
    rlai_vision_hparams hp;
    rlai_weight patch;                        /* rows E, cols 3*P*P */
    float *patch_b;                           /* owned or NULL */
    float *pos;                               /* owned, n_patches * E */
    vit_layer *layers;                        /* owned, n_layer */
    float *post_w, *post_b;                   /* owned or NULL */
    rlai_weight fc;                           /* rows n_out, cols E*s*s */
    uint64_t weight_bytes;
    rlai_gguf *owned;                         /* from rlai_vision_open_file, or NULL */
};

/* ------------------------------------------------------------------ load */

static int key_u32(const rlai_gguf *g, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
                   char *err, size_t errlen)
{
    int rc = rlai_gguf_get_u32(g, key, out);
    if (rc == RLAI_ERR_NOT_FOUND)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: required key '%s' missing", key);
    if (rc < 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: key '%s' has a wrong type or value", key);
    if (*out < lo || *out > hi)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: key '%s' = %u is outside [%u, %u]",
                    key, *out, lo, hi);
    return 0;
}

/* A 3-element f32 array key (image_mean / image_std); absent = dflt. */
static int key_vec3(const rlai_gguf *g, const char *key, float dflt, bool positive, float out[3],
                    char *err, size_t errlen)
{
    uint32_t et;
    uint64_t n;
    const void *data;
    int rc = rlai_gguf_get_array(g, key, &et, &n, &data);
    if (rc == RLAI_ERR_NOT_FOUND) {
        out[0] = out[1] = out[2] = dflt;
        return 0;
    }
    if (rc < 0 || et != RLAI_GGUF_F32 || n != 3)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: key '%s' is not an array of 3 f32", key);
    memcpy(out, data, 3 * sizeof(float));
    for (int i = 0; i < 3; i++)
        if (!isfinite(out[i]) || (positive && !(out[i] > 0)) || fabsf(out[i]) > 1e6f)
            return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: key '%s' has a bad value %g",
                        key, (double)out[i]);
    return 0;
}

/* Finds `name` and checks ne = {ne0, ne1, ne2, ne3} and the type. */
static int find4(const rlai_gguf *g, const char *name, const int64_t ne[4], bool required,
                 const rlai_gguf_tensor **out, char *err, size_t errlen)
{
    const rlai_gguf_tensor *t = rlai_gguf_find_tensor(g, name);
    *out = t;
    if (!t)
        return required ? rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: tensor '%s' missing", name) : 0;
    for (int i = 0; i < 4; i++)
        if ((int64_t)t->ne[i] != ne[i])
            return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                        "vision: tensor '%s' has shape [%llu, %llu, %llu, %llu], expected "
                        "[%lld, %lld, %lld, %lld]", name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                        (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                        (long long)ne[0], (long long)ne[1], (long long)ne[2], (long long)ne[3]);
    if (!rlai_dtype_supported(t->type) || t->type == RLAI_DT_Q8_1)
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED,
                    "vision: tensor '%s' has type %s (id %u), which this engine cannot compute "
                    "(supported: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0)",
                    name, rlai_dtype_name(t->type), t->type);
    if (ne[0] % (int64_t)rlai_dtype_block_elems(t->type) != 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: tensor '%s': %lld columns are not a "
                    "multiple of the %s block", name, (long long)ne[0], rlai_dtype_name(t->type));
    return 0;
}

/* A matrix of `rows` x `cols` (ggml [cols, rows]) viewed as an rlai_weight;
 * ne2/ne3 let the 4-D patch kernel be checked with its real shape. */
static int bind_matrix(rlai_vision *v, const rlai_gguf *g, const char *name, const int64_t ne[4],
                       int64_t rows, int64_t cols, rlai_weight *w, char *err, size_t errlen)
{
    const rlai_gguf_tensor *t;
    int rc = find4(g, name, ne, true, &t, err, errlen);
    if (rc < 0)
        return rc;
    if (cols % (int64_t)rlai_dtype_block_elems(t->type) != 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: tensor '%s': row length not a block multiple", name);
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    v->weight_bytes += t->nbytes;
    return 0;
}

/* A tensor of n x m values (ggml [n, m]) copied to f32; NULL if absent and
 * not required. */
static int load_f32(rlai_vision *v, const rlai_gguf *g, const char *name, int64_t n, int64_t m,
                    bool required, float **out, char *err, size_t errlen)
{
    *out = NULL;
    const int64_t ne[4] = { n, m, 1, 1 };
    const rlai_gguf_tensor *t;
    int rc = find4(g, name, ne, required, &t, err, errlen);
    if (rc < 0 || !t)
        return rc;
    float *p = malloc(sizeof(float) * (size_t)(n * m));
    if (!p)
        return RLAI_ERR_NOMEM;
    size_t rb = rlai_dtype_row_bytes(t->type, n);
    for (int64_t r = 0; r < m; r++)
        rlai_dequantize_row(t->type, (const unsigned char *)t->data + (size_t)r * rb, p + r * n, n);
    *out = p;
    v->weight_bytes += t->nbytes;
    return 0;
}

static bool str_is(rlai_gguf_str s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

static int load_hparams(const rlai_gguf *g, rlai_vision_hparams *hp, char *err, size_t errlen)
{
    rlai_gguf_str pt;
    int rc = rlai_gguf_get_str(g, "clip.projector_type", &pt);
    if (rc == RLAI_ERR_NOT_FOUND)
        rc = rlai_gguf_get_str(g, "clip.vision.projector_type", &pt);
    if (rc == RLAI_ERR_NOT_FOUND)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: key 'clip.projector_type' missing "
                    "(is this an mmproj file?)");
    if (rc < 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: key 'clip.projector_type' is not a string");
    if (!str_is(pt, "idefics3"))
        return rlai_errf(err, errlen, RLAI_ERR_UNSUPPORTED, "vision: projector type '%.*s' is not "
                    "supported (supported: idefics3)", (int)(pt.len > 64 ? 64 : pt.len), pt.ptr);
    bool has_v = true;
    rc = rlai_gguf_get_bool(g, "clip.has_vision_encoder", &has_v);
    if ((rc < 0 && rc != RLAI_ERR_NOT_FOUND) || !has_v)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: 'clip.has_vision_encoder' is not true");

    uint32_t S, P, E, F, L, H, s;
    if ((rc = key_u32(g, "clip.vision.image_size", 1, 4096, &S, err, errlen)) < 0 ||
        (rc = key_u32(g, "clip.vision.patch_size", 1, 64, &P, err, errlen)) < 0 ||
        (rc = key_u32(g, "clip.vision.embedding_length", 1, 8192, &E, err, errlen)) < 0 ||
        (rc = key_u32(g, "clip.vision.feed_forward_length", 1, 65536, &F, err, errlen)) < 0 ||
        (rc = key_u32(g, "clip.vision.block_count", 1, 256, &L, err, errlen)) < 0 ||
        (rc = key_u32(g, "clip.vision.attention.head_count", 1, 256, &H, err, errlen)) < 0 ||
        (rc = key_u32(g, "clip.vision.projector.scale_factor", 1, 16, &s, err, errlen)) < 0)
        return rc;
    rc = rlai_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &hp->eps);
    if (rc == RLAI_ERR_NOT_FOUND)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                    "vision: required key 'clip.vision.attention.layer_norm_epsilon' missing");
    if (rc < 0 || !isfinite(hp->eps) || !(hp->eps > 0) || hp->eps > 1.0f)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT,
                    "vision: key 'clip.vision.attention.layer_norm_epsilon' has a wrong type or value");
    if (S % P != 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: image_size %u is not a multiple of "
                    "patch_size %u", S, P);
    uint32_t G = S / P;
    if (G % s != 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: the %ux%u patch grid is not divisible "
                    "by the projector scale_factor %u", G, G, s);
    if (E % H != 0)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: embedding_length %u is not a multiple "
                    "of head_count %u", E, H);
    if ((uint64_t)G * G > 65536)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: %u patches (more than 65536)", G * G);
    if ((uint64_t)E * s * s > 1u << 20)
        return rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: projector input width %llu too large",
                    (unsigned long long)E * s * s);
    if ((rc = key_vec3(g, "clip.vision.image_mean", 0.5f, false, hp->mean, err, errlen)) < 0 ||
        (rc = key_vec3(g, "clip.vision.image_std", 0.5f, true, hp->std, err, errlen)) < 0)
        return rc;
    hp->image_size = (int)S;
    hp->patch_size = (int)P;
    hp->grid = (int)G;
    hp->n_embd = (int)E;
    hp->n_ff = (int)F;
    hp->n_layer = (int)L;
    hp->n_head = (int)H;
    hp->head_dim = (int)(E / H);
    hp->scale_factor = (int)s;
    hp->n_patches = (int)(G * G);
    hp->n_tokens = (int)((G / s) * (G / s));
    return 0;
}

int rlai_vision_load(const rlai_gguf *g, rlai_vision **out, char *err, size_t errlen)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!g)
        return RLAI_ERR_INVALID_ARG;
    rlai_vision *v = calloc(1, sizeof(*v));
    if (!v)
        return RLAI_ERR_NOMEM;
    rlai_vision_hparams *hp = &v->hp;
    int rc = load_hparams(g, hp, err, errlen);
    if (rc < 0)
        goto fail;
    const int64_t E = hp->n_embd, F = hp->n_ff, P = hp->patch_size, s = hp->scale_factor;

    const rlai_gguf_tensor *fct = rlai_gguf_find_tensor(g, "mm.model.fc.weight");
    if (!fct) {
        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: tensor 'mm.model.fc.weight' missing");
        goto fail;
    }
    if (fct->ne[1] == 0 || fct->ne[1] > 65536) {
        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: tensor 'mm.model.fc.weight' has %llu "
                  "output rows", (unsigned long long)fct->ne[1]);
        goto fail;
    }
    hp->n_out = (int)fct->ne[1];
    {
        const int64_t ne[4] = { E * s * s, hp->n_out, 1, 1 };
        if ((rc = bind_matrix(v, g, "mm.model.fc.weight", ne, hp->n_out, E * s * s, &v->fc, err, errlen)) < 0)
            goto fail;
    }
    {
        const int64_t ne[4] = { P, P, 3, E };
        if ((rc = bind_matrix(v, g, "v.patch_embd.weight", ne, E, 3 * P * P, &v->patch, err, errlen)) < 0)
            goto fail;
    }
    if ((rc = load_f32(v, g, "v.patch_embd.bias", E, 1, false, &v->patch_b, err, errlen)) < 0 ||
        (rc = load_f32(v, g, "v.position_embd.weight", E, hp->n_patches, true, &v->pos, err, errlen)) < 0 ||
        (rc = load_f32(v, g, "v.post_ln.weight", E, 1, false, &v->post_w, err, errlen)) < 0 ||
        (rc = load_f32(v, g, "v.post_ln.bias", E, 1, false, &v->post_b, err, errlen)) < 0)
        goto fail;
    if (!v->post_w != !v->post_b) {
        rc = rlai_errf(err, errlen, RLAI_ERR_FORMAT, "vision: v.post_ln has a weight or a bias but not both");
        goto fail;
    }
    hp->has_post_ln = v->post_w != NULL;

    v->layers = calloc((size_t)hp->n_layer, sizeof(*v->layers));
    if (!v->layers) {
        rc = RLAI_ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < hp->n_layer; i++) {
        vit_layer *ly = &v->layers[i];
        char name[96];
        const int64_t nee[4] = { E, E, 1, 1 }, neu[4] = { E, F, 1, 1 }, ned[4] = { F, E, 1, 1 };
        struct { const char *n; rlai_weight *w; const int64_t *ne; int64_t rows, cols; float **b; int64_t nb; } mats[] = {
            { "attn_q", &ly->wq, nee, E, E, &ly->bq, E },
            { "attn_k", &ly->wk, nee, E, E, &ly->bk, E },
            { "attn_v", &ly->wv, nee, E, E, &ly->bv, E },
            { "attn_out", &ly->wo, nee, E, E, &ly->bo, E },
            { "ffn_up", &ly->up, neu, F, E, &ly->bup, F },
            { "ffn_down", &ly->down, ned, E, F, &ly->bdown, E },
        };
        for (size_t j = 0; j < sizeof(mats) / sizeof(mats[0]); j++) {
            snprintf(name, sizeof(name), "v.blk.%d.%s.weight", i, mats[j].n);
            if ((rc = bind_matrix(v, g, name, mats[j].ne, mats[j].rows, mats[j].cols, mats[j].w, err, errlen)) < 0)
                goto fail;
            snprintf(name, sizeof(name), "v.blk.%d.%s.bias", i, mats[j].n);
            if ((rc = load_f32(v, g, name, mats[j].nb, 1, false, mats[j].b, err, errlen)) < 0)
                goto fail;
        }
        struct { const char *n; float **p; } norms[] = {
            { "ln1.weight", &ly->ln1_w }, { "ln1.bias", &ly->ln1_b },
            { "ln2.weight", &ly->ln2_w }, { "ln2.bias", &ly->ln2_b },
        };
        for (size_t j = 0; j < sizeof(norms) / sizeof(norms[0]); j++) {
            snprintf(name, sizeof(name), "v.blk.%d.%s", i, norms[j].n);
            if ((rc = load_f32(v, g, name, E, 1, true, norms[j].p, err, errlen)) < 0)
                goto fail;
        }
    }
    *out = v;
    return 0;
fail:
    if (rc == RLAI_ERR_NOMEM)
        rlai_errf(err, errlen, rc, "vision: out of memory loading the encoder");
    rlai_vision_free(v);
    return rc;
}

void rlai_vision_free(rlai_vision *v)
{
    if (!v)
        return;
    if (v->layers) {
        for (int i = 0; i < v->hp.n_layer; i++) {
            vit_layer *ly = &v->layers[i];
            free(ly->bq); free(ly->bk); free(ly->bv); free(ly->bo); free(ly->bup); free(ly->bdown);
            free(ly->ln1_w); free(ly->ln1_b); free(ly->ln2_w); free(ly->ln2_b);
        }
        free(v->layers);
    }
    free(v->patch_b);
    free(v->pos);
    free(v->post_w);
    free(v->post_b);
    rlai_gguf_close(v->owned);
    free(v);
}

int rlai_vision_open_file(const char *path, rlai_vision **out, char *err, size_t errlen)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    if (!path)
        return RLAI_ERR_INVALID_ARG;
    rlai_gguf *g;
    int rc = rlai_gguf_open_file(path, &g, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = rlai_vision_load(g, out, err, errlen)) < 0) {
        rlai_gguf_close(g);
        return rc;
    }
    (*out)->owned = g;
    return 0;
}

const rlai_vision_hparams *rlai_vision_get_hparams(const rlai_vision *v) { return v ? &v->hp : NULL; }
uint64_t rlai_vision_weight_bytes(const rlai_vision *v) { return v ? v->weight_bytes : 0; }

size_t rlai_vision_pixels_len(const rlai_vision *v)
{
    return v ? 3u * (size_t)v->hp.image_size * (size_t)v->hp.image_size : 0;
}

size_t rlai_vision_output_len(const rlai_vision *v)
{
    return v ? (size_t)v->hp.n_tokens * (size_t)v->hp.n_out : 0;
}

/* ------------------------------------------------------------ preprocess */

/* Source coordinate of output index o for a resize of n_in -> n_out with
 * half-pixel centres: (o + 0.5) * n_in / n_out - 0.5, clamped to the
 * image; i0/i1 the neighbours, f the weight of i1. */
static void bilinear_tap(int o, int n_in, int n_out, int *i0, int *i1, float *f)
{
    double x = ((double)o + 0.5) * (double)n_in / (double)n_out - 0.5;
    if (x < 0)
        x = 0;
    double fl = floor(x);
    int a = (int)fl;
    if (a > n_in - 1)
        a = n_in - 1;
    int b = a + 1 < n_in ? a + 1 : n_in - 1;
    *i0 = a;
    *i1 = b;
    *f = (float)(x - (double)a);
    if (*f > 1.0f)
        *f = 1.0f;
}

int rlai_vision_preprocess(const rlai_vision *v, const uint8_t *img, int width, int height,
                           size_t stride, int channels, float *out)
{
    if (!v || !img || !out || width <= 0 || height <= 0 || width > 16384 || height > 16384 ||
        (channels != 3 && channels != 4) || stride < (size_t)width * (size_t)channels)
        return RLAI_ERR_INVALID_ARG;
    const int S = v->hp.image_size;
    const size_t plane = (size_t)S * (size_t)S;
    float scale[3], bias[3];
    for (int c = 0; c < 3; c++) {            /* (p/255 - mean) / std = p*scale + bias */
        scale[c] = 1.0f / (255.0f * v->hp.std[c]);
        bias[c] = -v->hp.mean[c] / v->hp.std[c];
    }
    for (int oy = 0; oy < S; oy++) {
        int y0, y1;
        float fy;
        bilinear_tap(oy, height, S, &y0, &y1, &fy);
        const uint8_t *r0 = img + (size_t)y0 * stride, *r1 = img + (size_t)y1 * stride;
        for (int ox = 0; ox < S; ox++) {
            int x0, x1;
            float fx;
            bilinear_tap(ox, width, S, &x0, &x1, &fx);
            for (int c = 0; c < 3; c++) {
                float a = r0[(size_t)x0 * channels + c], b = r0[(size_t)x1 * channels + c];
                float d = r1[(size_t)x0 * channels + c], e = r1[(size_t)x1 * channels + c];
                float top = a + (b - a) * fx, bot = d + (e - d) * fx;
                float p = top + (bot - top) * fy;
                out[(size_t)c * plane + (size_t)oy * S + ox] = p * scale[c] + bias[c];
            }
        }
    }
    return 0;
}

uint64_t rlai_vision_hash_rows(const float *rows, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)rows;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---------------------------------------------------------------- encode */

/* Rows [r0, r1) of n rows: the split of a pool run. */
static void split(int n, int ith, int nth, int *r0, int *r1)
{
    int per = (n + nth - 1) / nth;
    *r0 = ith * per < n ? ith * per : n;
    *r1 = *r0 + per < n ? *r0 + per : n;
}

struct ln_task { float *dst; const float *x; const float *w, *b; int n, d; float eps; };

static void ln_fn(void *arg, int ith, int nth)
{
    struct ln_task *t = arg;
    int r0, r1;
    split(t->n, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++) {
        const float *x = t->x + (size_t)r * t->d;
        float *y = t->dst + (size_t)r * t->d;
        double s = 0, s2 = 0;
        for (int j = 0; j < t->d; j++)
            s += x[j];
        double mean = s / t->d;
        for (int j = 0; j < t->d; j++) {
            double c = x[j] - mean;
            s2 += c * c;
        }
        float inv = (float)(1.0 / sqrt(s2 / t->d + (double)t->eps));
        float m = (float)mean;
        for (int j = 0; j < t->d; j++)
            y[j] = (x[j] - m) * inv * t->w[j] + t->b[j];
    }
}

static void layernorm(rlai_threadpool *tp, float *dst, const float *x, const float *w, const float *b,
                      int n, int d, float eps)
{
    struct ln_task t = { dst, x, w, b, n, d, eps };
    rlai_threadpool_run(tp, ln_fn, &t);
}

static void add_bias(float *x, const float *b, int n, int d)
{
    if (!b)
        return;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            x[(size_t)i * d + j] += b[j];
}

struct gelu_task { float *x; const float *b; int n, d; };

/* x = gelu_tanh(x + b), row by row. */
static void gelu_fn(void *arg, int ith, int nth)
{
    struct gelu_task *t = arg;
    int r0, r1;
    split(t->n, ith, nth, &r0, &r1);
    const float c = 0.7978845608028654f;   /* sqrt(2/pi) */
    for (int r = r0; r < r1; r++) {
        float *x = t->x + (size_t)r * t->d;
        for (int j = 0; j < t->d; j++) {
            float u = x[j] + (t->b ? t->b[j] : 0.0f);
            x[j] = 0.5f * u * (1.0f + tanhf(c * (u + 0.044715f * u * u * u)));
        }
    }
}

struct softmax_task { rlai_kernels *k; float *s; int n; float scale; };

/* Each of n rows of n scores: softmax(scale * row), exp on the kernels' SIMD
 * path (relative error < 2e-7 each). */
static void softmax_fn(void *arg, int ith, int nth)
{
    struct softmax_task *t = arg;
    int r0, r1;
    split(t->n, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++) {
        float *p = t->s + (size_t)r * t->n;
        float mx = -INFINITY;
        for (int j = 0; j < t->n; j++) {
            p[j] *= t->scale;
            if (p[j] > mx)
                mx = p[j];
        }
        float inv = 1.0f / rlai_vec_exp_sum(t->k, t->n, p, mx);
        for (int j = 0; j < t->n; j++)   /* no subnormals: they make the P.V product crawl */
            p[j] = p[j] < 1e-30f ? 0.0f : p[j] * inv;
    }
}

static void mm(rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *w, const float *x, int T, float *y)
{
    rlai_matmul(k, tp, w, x, w->cols, T, y, w->rows);
}

int rlai_vision_encode(const rlai_vision *v, rlai_kernels *k, rlai_threadpool *tp,
                       const float *pixels, float *out)
{
    if (!v || !k || !pixels || !out)
        return RLAI_ERR_INVALID_ARG;
    const rlai_vision_hparams *hp = &v->hp;
    const int N = hp->n_patches, E = hp->n_embd, F = hp->n_ff, P = hp->patch_size, G = hp->grid;
    const int H = hp->n_head, D = hp->head_dim, s = hp->scale_factor, S = hp->image_size;
    const int PP3 = 3 * P * P;
    const size_t NE = (size_t)N * E;
    int wide = F > E ? F : E;
    if (PP3 > wide)
        wide = PP3;
    if (E * s * s > wide)
        wide = E * s * s;

    float *x = malloc(sizeof(float) * NE);               /* residual stream */
    float *h = malloc(sizeof(float) * NE);               /* normed input / attention output */
    float *q = malloc(sizeof(float) * NE);
    float *kk = malloc(sizeof(float) * NE);
    float *vv = malloc(sizeof(float) * NE);
    float *big = malloc(sizeof(float) * (size_t)N * (size_t)wide);   /* patches / ffn / shuffle */
    float *sc = malloc(sizeof(float) * (size_t)N * (size_t)N);      /* one head's scores */
    float *kh = malloc(sizeof(float) * (size_t)N * D);              /* K of a head, rows */
    float *vt = malloc(sizeof(float) * (size_t)N * D);              /* V of a head, transposed */
    int rc = 0;
    if (!x || !h || !q || !kk || !vv || !big || !sc || !kh || !vt) {
        rc = RLAI_ERR_NOMEM;
        goto done;
    }

    /* patches: (channel, row, column) within each patch, the conv kernel's order */
    const size_t plane = (size_t)S * S;
    for (int py = 0; py < G; py++)
        for (int px = 0; px < G; px++) {
            float *row = big + (size_t)(py * G + px) * PP3;
            for (int c = 0; c < 3; c++)
                for (int ky = 0; ky < P; ky++)
                    memcpy(row + (c * P + ky) * P,
                           pixels + c * plane + (size_t)(py * P + ky) * S + (size_t)px * P,
                           sizeof(float) * (size_t)P);
        }
    mm(k, tp, &v->patch, big, N, x);
    add_bias(x, v->patch_b, N, E);
    for (size_t i = 0; i < NE; i++)
        x[i] += v->pos[i];

    const float scale = 1.0f / sqrtf((float)D);
    for (int li = 0; li < hp->n_layer; li++) {
        const vit_layer *ly = &v->layers[li];
        layernorm(tp, h, x, ly->ln1_w, ly->ln1_b, N, E, hp->eps);
        mm(k, tp, &ly->wq, h, N, q);
        mm(k, tp, &ly->wk, h, N, kk);
        mm(k, tp, &ly->wv, h, N, vv);
        add_bias(q, ly->bq, N, E);
        add_bias(kk, ly->bk, N, E);
        add_bias(vv, ly->bv, N, E);
        for (int hd = 0; hd < H; hd++) {
            for (int j = 0; j < N; j++) {
                memcpy(kh + (size_t)j * D, kk + (size_t)j * E + (size_t)hd * D, sizeof(float) * (size_t)D);
                for (int d = 0; d < D; d++)
                    vt[(size_t)d * N + j] = vv[(size_t)j * E + (size_t)hd * D + d];
            }
            rlai_weight wk = { .type = RLAI_DT_F32, .rows = N, .cols = D, .data = kh };
            rlai_matmul(k, tp, &wk, q + (size_t)hd * D, E, N, sc, N);       /* q . k_j */
            struct softmax_task st = { k, sc, N, scale };
            rlai_threadpool_run(tp, softmax_fn, &st);
            rlai_weight wv = { .type = RLAI_DT_F32, .rows = D, .cols = N, .data = vt };
            rlai_matmul(k, tp, &wv, sc, N, N, h + (size_t)hd * D, E);        /* sum_j p_j v_j */
        }
        mm(k, tp, &ly->wo, h, N, q);
        add_bias(q, ly->bo, N, E);
        for (size_t i = 0; i < NE; i++)
            x[i] += q[i];

        layernorm(tp, h, x, ly->ln2_w, ly->ln2_b, N, E, hp->eps);
        mm(k, tp, &ly->up, h, N, big);
        struct gelu_task gt = { big, ly->bup, N, F };
        rlai_threadpool_run(tp, gelu_fn, &gt);
        mm(k, tp, &ly->down, big, N, q);
        add_bias(q, ly->bdown, N, E);
        for (size_t i = 0; i < NE; i++)
            x[i] += q[i];
    }
    if (hp->has_post_ln)
        layernorm(tp, x, x, v->post_w, v->post_b, N, E, hp->eps);

    /* pixel shuffle: token (i, j) of the (G/s)^2 grid, feature (b*s + a)*E + e
     * from patch (i*s + b, j*s + a) */
    const int g2 = G / s, W = E * s * s;
    for (int i = 0; i < g2; i++)
        for (int j = 0; j < g2; j++) {
            float *dst = big + (size_t)(i * g2 + j) * W;
            for (int b = 0; b < s; b++)
                for (int a = 0; a < s; a++)
                    memcpy(dst + (size_t)(b * s + a) * E,
                           x + (size_t)((i * s + b) * G + (j * s + a)) * E, sizeof(float) * (size_t)E);
        }
    mm(k, tp, &v->fc, big, hp->n_tokens, out);
    for (size_t i = 0; i < rlai_vision_output_len(v); i++)
        if (!isfinite(out[i])) {      /* inf/NaN weights, or rlai_matmul could not allocate */
            rc = RLAI_ERR_FORMAT;
            break;
        }
done:
    free(x); free(h); free(q); free(kk); free(vv); free(big); free(sc); free(kh); free(vt);
    return rc;
}

int rlai_vision_embed_image(const rlai_vision *v, rlai_kernels *k, rlai_threadpool *tp,
                            const uint8_t *img, int width, int height, size_t stride, int channels,
                            float *out)
{
    if (!v || !k || !out)
        return RLAI_ERR_INVALID_ARG;
    float *px = malloc(sizeof(float) * rlai_vision_pixels_len(v));
    if (!px)
        return RLAI_ERR_NOMEM;
    int rc = rlai_vision_preprocess(v, img, width, height, stride, channels, px);
    if (rc == 0)
        rc = rlai_vision_encode(v, k, tp, px, out);
    free(px);
    return rc;
}
