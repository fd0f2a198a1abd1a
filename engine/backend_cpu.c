/* backend_cpu.c - the CPU backend: the reference implementation of the
 * backend interface (backend.h) on the run-time dispatched SIMD kernels
 * (kernels.h) and the engine's thread pool. Backend memory is host memory
 * and weights are used in place in the GGUF mapping, with the kernels'
 * load-time packed copy beside them where the level has one. */
#include "backend.h"
#include "dtype.h"
#include "kv_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_backend {
    rlai_backend base;
    rlai_kernels *k;
    rlai_threadpool *tp;
    int n_threads;
    int max_ctx;
    float *scores;          /* n_threads * ATTN_QMAX * max_ctx, attention scratch */
    struct attn_unit *units; /* attention work plan, grown as needed */
    size_t units_cap;
    /* RoPE's cos/sin of the last call's positions: the q and k rotations of
     * every layer of one forward ask for the same ones (2 x n_layer calls) */
    float *rope_cs;         /* rope_n rows of rope_rot floats: cos, sin per pair */
    int32_t *rope_pos;      /* rope_n positions */
    float *rope_freq;       /* rope_rot / 2 frequencies they were made with */
    int rope_n, rope_rot;
    size_t rope_cap;        /* rows allocated */
    char desc[64];
} cpu_backend;

static cpu_backend *cpu(rlai_backend *be) { return (cpu_backend *)be; }

static void cpu_free(rlai_backend *be)
{
    cpu_backend *c = cpu(be);
    if (!c)
        return;
    free(c->scores);
    free(c->units);
    free(c->rope_cs);
    free(c->rope_pos);
    free(c->rope_freq);
    free(c);
}

static const char *cpu_describe(rlai_backend *be) { return cpu(be)->desc; }

static int cpu_buffer_alloc(rlai_backend *be, size_t size, void **out)
{
    (void)be;
    *out = calloc(1, size ? size : 1);
    return *out ? 0 : RLAI_ERR_NOMEM;
}

static void cpu_buffer_free(rlai_backend *be, void *buf)
{
    (void)be;
    free(buf);
}

static int cpu_upload(rlai_backend *be, void *buf, size_t off, const void *src, size_t n)
{
    (void)be;
    memcpy((char *)buf + off, src, n);
    return 0;
}

/* Weights stay in the GGUF mapping (dev->data = host->data: get_rows and
 * every level read it); where the kernels have a load-time layout for the
 * weight (AVX-512, Q4_0 / Q4_1 / Q8_0), a packed copy is added for the
 * matmuls. Without memory for it the weight is used unpacked, which gives
 * the same results, only slower. */
static int cpu_weight_upload(rlai_backend *be, const rlai_weight *host, rlai_weight *dev)
{
    cpu_backend *c = cpu(be);
    *dev = *host;
    dev->packed = NULL;
    size_t n = rlai_kernels_packed_bytes(c->k, host);
    if (n == 0)
        return 0;
    void *p = aligned_alloc(64, (n + 63u) & ~(size_t)63u);
    if (!p)
        return 0;
    if (rlai_kernels_pack(c->k, c->tp, host, p, n) < 0) {
        free(p);
        return 0;
    }
    dev->packed = p;
    dev->packed_isa = rlai_kernels_isa(c->k);
    return 0;
}

static void cpu_weight_free(rlai_backend *be, rlai_weight *dev)
{
    (void)be;
    free((void *)dev->packed);
    dev->packed = NULL;
}

static int cpu_download(rlai_backend *be, const void *buf, size_t off, void *dst, size_t n)
{
    (void)be;
    memcpy(dst, (const char *)buf + off, n);
    return 0;
}

static void cpu_get_rows(rlai_backend *be, const rlai_weight *w, const int32_t *ids, int n, float *dst)
{
    (void)be;
    for (int i = 0; i < n; i++)
        rlai_weight_get_row(w, ids[i], dst + (size_t)i * (size_t)w->cols);
}

/* ---- element-wise ops over many rows (prefill, verification) run on the
 * pool: each row's or element's arithmetic is the serial loop's, so the
 * results do not depend on the split. */

typedef void (*range_fn)(void *arg, size_t i0, size_t i1);

typedef struct range_task {
    range_fn fn;
    void *arg;
    size_t n;
} range_task;

static void range_worker(void *arg, int ith, int nth)
{
    range_task *t = arg;
    size_t i0 = t->n * (size_t)ith / (size_t)nth, i1 = t->n * (size_t)(ith + 1) / (size_t)nth;
    if (i1 > i0)
        t->fn(t->arg, i0, i1);
}

/* fn over [0, n): split over the pool's threads when n >= par_min, else
 * here (a hand-off costs a few microseconds). */
static void run_ranges(cpu_backend *c, range_fn fn, void *arg, size_t n, size_t par_min)
{
    if (n >= par_min && c->n_threads > 1) {
        range_task t = { fn, arg, n };
        rlai_threadpool_run(c->tp, range_worker, &t);
    } else if (n > 0) {
        fn(arg, 0, n);
    }
}

/* Rows from which a row-wise op is split: an RMSNorm row of 576 is about
 * 1 us (its sum of squares is one dependent chain, in double). */
#define ROWS_PAR_MIN 8
/* Elements from which an add or SwiGLU is split: one row of SmolLM2's
 * 1536 takes under 1 us with the SIMD expf, less than a hand-off. */
#define ELEMS_PAR_MIN 16384

typedef struct rmsnorm_args {
    float *dst;
    const float *x, *w;
    int d;
    float eps;
} rmsnorm_args;

static void rmsnorm_rows(void *arg, size_t r0, size_t r1)
{
    const rmsnorm_args *a = arg;
    int d = a->d;
    for (size_t r = r0; r < r1; r++) {
        const float *xr = a->x + r * (size_t)d;
        float *yr = a->dst + r * (size_t)d;
        double ss = 0.0;
        for (int i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / d + a->eps));
        for (int i = 0; i < d; i++)
            yr[i] = xr[i] * scale * a->w[i];
    }
}

static void cpu_rmsnorm(rlai_backend *be, float *dst, const float *x, const float *w, int n, int d, float eps)
{
    rmsnorm_args a = { dst, x, w, d, eps };
    run_ranges(cpu(be), rmsnorm_rows, &a, n > 0 ? (size_t)n : 0, ROWS_PAR_MIN);
}

static void cpu_matmul(rlai_backend *be, const rlai_weight *w, const float *x, int64_t ldx, int T,
                       float *y, int64_t ldy)
{
    rlai_matmul(cpu(be)->k, cpu(be)->tp, w, x, ldx, T, y, ldy);
}

static void cpu_matmul_n(rlai_backend *be, const rlai_weight *const *w, int n, const float *x, int64_t ldx, int T,
                         float *const *y, const int64_t *ldy)
{
    rlai_matmul_n(cpu(be)->k, cpu(be)->tp, w, n, x, ldx, T, y, ldy);
}

static void cpu_add_row(rlai_backend *be, float *x, const float *b, int n, int d)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * d;
        for (int j = 0; j < d; j++)
            xr[j] += b[j];
    }
}

typedef struct add_args {
    float *x;
    const float *y;
} add_args;

static void add_elems(void *arg, size_t j0, size_t j1)
{
    const add_args *a = arg;
    for (size_t j = j0; j < j1; j++)
        a->x[j] += a->y[j];
}

static void cpu_add(rlai_backend *be, float *x, const float *y, size_t n)
{
    add_args a = { x, y };
    run_ranges(cpu(be), add_elems, &a, n, ELEMS_PAR_MIN);
}

typedef struct swiglu_args {
    rlai_kernels *k;
    float *gate;
    const float *up;
} swiglu_args;

static void swiglu_elems(void *arg, size_t j0, size_t j1)
{
    const swiglu_args *a = arg;
    rlai_vec_swiglu(a->k, j1 - j0, a->gate + j0, a->up + j0);
}

static void cpu_swiglu(rlai_backend *be, float *gate, const float *up, size_t n)
{
    swiglu_args a = { cpu(be)->k, gate, up };
    run_ranges(cpu(be), swiglu_elems, &a, n, ELEMS_PAR_MIN);
}

/* cs[0], cs[1] = cos, sin of pos * freq. */
static void rope_angle(int pos, float freq, float *cs)
{
    double ang = (double)pos * freq;
    cs[0] = (float)cos(ang);
    cs[1] = (float)sin(ang);
}

/* cs[2i], cs[2i + 1] = cos, sin of pos * inv_freq[i] for i < n_rot / 2. */
static void rope_angles(int n_rot, const float *inv_freq, int pos, float *cs)
{
    for (int i = 0; i < n_rot / 2; i++)
        rope_angle(pos, inv_freq[i], cs + 2 * i);
}

/* Rotates pair i of every head of row v by (c, s). */
static void rope_pair(float *v, int n_heads, int head_dim, int n_rot, rlai_rope_mode mode, int i, float c, float s)
{
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        int i0 = mode == RLAI_ROPE_NEOX ? i : 2 * i;
        int i1 = mode == RLAI_ROPE_NEOX ? i + half : 2 * i + 1;
        float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

static void rope_row(float *v, int n_heads, int head_dim, int n_rot, rlai_rope_mode mode, const float *cs)
{
    for (int i = 0; i < n_rot / 2; i++)
        rope_pair(v, n_heads, head_dim, n_rot, mode, i, cs[2 * i], cs[2 * i + 1]);
}

/* The cos/sin rows for pos[0..n) (rope_cs), made once per set of
 * positions and frequencies; NULL when out of memory. */
static const float *rope_table(cpu_backend *c, int n, int n_rot, const float *inv_freq, const int32_t *pos)
{
    size_t half = (size_t)(n_rot / 2);
    if (c->rope_cs && n == c->rope_n && n_rot == c->rope_rot &&
        !memcmp(pos, c->rope_pos, sizeof(int32_t) * (size_t)n) &&
        !memcmp(inv_freq, c->rope_freq, sizeof(float) * half))
        return c->rope_cs;
    if ((size_t)n > c->rope_cap || n_rot != c->rope_rot) {
        size_t cap = (size_t)n > c->rope_cap ? (size_t)n : c->rope_cap;
        float *cs = malloc(sizeof(float) * cap * (size_t)(n_rot > 0 ? n_rot : 1));
        int32_t *ps = malloc(sizeof(int32_t) * cap);
        float *fr = malloc(sizeof(float) * (half ? half : 1));
        if (!cs || !ps || !fr) {
            free(cs);
            free(ps);
            free(fr);
            return NULL;
        }
        free(c->rope_cs);
        free(c->rope_pos);
        free(c->rope_freq);
        c->rope_cs = cs;
        c->rope_pos = ps;
        c->rope_freq = fr;
        c->rope_cap = cap;
    }
    for (int i = 0; i < n; i++)
        rope_angles(n_rot, inv_freq, pos[i], c->rope_cs + (size_t)i * (size_t)n_rot);
    memcpy(c->rope_pos, pos, sizeof(int32_t) * (size_t)n);
    memcpy(c->rope_freq, inv_freq, sizeof(float) * half);
    c->rope_n = n;
    c->rope_rot = n_rot;
    return c->rope_cs;
}

typedef struct rope_args {
    float *x;
    size_t stride;
    int n_heads, head_dim, n_rot;
    rlai_rope_mode mode;
    const float *cs;
} rope_args;

static void rope_rows(void *arg, size_t i0, size_t i1)
{
    const rope_args *a = arg;
    for (size_t i = i0; i < i1; i++)
        rope_row(a->x + i * a->stride, a->n_heads, a->head_dim, a->n_rot, a->mode, a->cs + i * (size_t)a->n_rot);
}

static void cpu_rope(rlai_backend *be, float *x, int n, int n_heads, int head_dim, int n_rot,
                     rlai_rope_mode mode, const float *inv_freq, const int32_t *pos)
{
    size_t stride = (size_t)n_heads * head_dim;
    const float *cs = rope_table(cpu(be), n, n_rot, inv_freq, pos);
    if (cs) {
        rope_args a = { x, stride, n_heads, head_dim, n_rot, mode, cs };
        run_ranges(cpu(be), rope_rows, &a, n > 0 ? (size_t)n : 0, ROWS_PAR_MIN);
        return;
    }
    /* out of memory for the table: the same angles, a pair at a time */
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_rot / 2; k++) {
            float cs1[2];
            rope_angle(pos[i], inv_freq[k], cs1);
            rope_pair(x + (size_t)i * stride, n_heads, head_dim, n_rot, mode, k, cs1[0], cs1[1]);
        }
}

static inline char *page_row(void *base, const rlai_kv_layer_view *kv, const int32_t *table, int pos)
{
    size_t b = (size_t)table[pos / RLAI_KV_BLOCK];
    return (char *)base + (b * RLAI_KV_BLOCK + (size_t)(pos % RLAI_KV_BLOCK)) * kv->row_bytes;
}

static void cpu_kv_store(rlai_backend *be, const rlai_kv_layer_view *kv, const rlai_paged_rows *rows,
                         const float *k, const float *v)
{
    rlai_kernels *kern = cpu(be)->k;
    int KVD = kv->kv_dim;
    for (int i = 0; i < rows->n; i++) {
        const float *kr = k + (size_t)i * KVD, *vr = v + (size_t)i * KVD;
        void *kd = page_row(kv->k, kv, rows->tables[i], rows->pos[i]);
        void *vd = page_row(kv->v, kv, rows->tables[i], rows->pos[i]);
        if (kv->dtype == RLAI_DT_F16) {
            rlai_f32_to_f16_row(kern, kr, kd, KVD);
            rlai_f32_to_f16_row(kern, vr, vd, KVD);
        } else if (kv->dtype == RLAI_DT_Q8_0) {
            rlai_quantize_row(RLAI_DT_Q8_0, kr, kd, KVD);
            rlai_quantize_row(RLAI_DT_Q8_0, vr, vd, KVD);
        } else {
            memcpy(kd, kr, sizeof(float) * (size_t)KVD);
            memcpy(vd, vr, sizeof(float) * (size_t)KVD);
        }
    }
}

/* Work units of the f16 attention: queries of one sequence that read the
 * same KV head. Rows row0.. of the batch share one block table (the rows
 * of a speculative verification, or one row); query q of the run is row
 * row0 + q / G at head kvh * G + q % G (G = n_head / n_head_kv). A unit's
 * queries share every conversion of a K/V block; each query's arithmetic
 * is the one-query kernel's, so results do not depend on the plan. */
#define ATTN_QMAX 24   /* queries per unit: scores scratch per thread */

typedef struct attn_unit {
    int row0, kvh, q0, nq;
} attn_unit;

typedef struct attn_task {
    cpu_backend *c;
    const rlai_kv_layer_view *kv;
    const rlai_paged_rows *rows;
    int H, HKV, D;
    const float *q;
    float *out;
    const attn_unit *units;   /* NULL: one job per (row, head) */
    int n_units;
    int next;                 /* next unit to take (atomic) */
} attn_task;

/* max(mx, x[0..n)). Eight independent running maxima instead of one
 * chain of dependent compares (a score row is up to max_ctx long); the
 * value is the sequential loop's, up to the sign of a zero maximum, which
 * no later use can tell apart (s - mx and exp(s - mx) are the same). */
static float max_of(const float *x, int n, float mx)
{
    float m[8];
    for (int l = 0; l < 8; l++)
        m[l] = mx;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    for (; j < n; j++)
        m[0] = x[j] > m[0] ? x[j] : m[0];
    for (int l = 1; l < 8; l++)
        m[0] = m[l] > m[0] ? m[l] : m[0];
    return m[0];
}

/* One query (row i, head h) over its sequence, any cache type: sc is
 * max_ctx floats of scratch. */
static void attn_one(const attn_task *t, int i, int h, float *sc)
{
    cpu_backend *c = t->c;
    const rlai_kv_layer_view *kv = t->kv;
    int H = t->H, D = t->D, group = t->H / t->HKV;
    float scale = 1.0f / sqrtf((float)D);
    const int32_t *table = t->rows->tables[i];
    int pos = t->rows->pos[i];
    const float *q = t->q + ((size_t)i * H + h) * D;
    float *out = t->out + ((size_t)i * H + h) * D;
    int kvh = h / group;
    int n = pos + 1;
    if (kv->dtype == RLAI_DT_F16) {
        /* Block by block: rows of one block are contiguous (stride kv_dim). */
        size_t stride = (size_t)kv->kv_dim;
        float mx = -INFINITY;
        for (int j0 = 0; j0 < n; j0 += RLAI_KV_BLOCK) {
            int m = n - j0 < RLAI_KV_BLOCK ? n - j0 : RLAI_KV_BLOCK;
            const uint16_t *kr = (const uint16_t *)page_row(kv->k, kv, table, j0) + (size_t)kvh * D;
            rlai_attn_dot_f16(c->k, m, D, kr, stride, q, scale, sc + j0);
            mx = max_of(sc + j0, m, mx);
        }
        float inv = 1.0f / rlai_vec_exp_sum(c->k, n, sc, mx);
        for (int j = 0; j < n; j++)
            sc[j] *= inv;
        memset(out, 0, sizeof(float) * (size_t)D);
        for (int j0 = 0; j0 < n; j0 += RLAI_KV_BLOCK) {
            int m = n - j0 < RLAI_KV_BLOCK ? n - j0 : RLAI_KV_BLOCK;
            const uint16_t *vr = (const uint16_t *)page_row(kv->v, kv, table, j0) + (size_t)kvh * D;
            rlai_attn_mad_f16(c->k, m, D, vr, stride, sc + j0, out);
        }
        return;
    }
    if (kv->dtype == RLAI_DT_Q8_0) {
        /* q8_0 cache: each head's slice is D/32 blocks of the row;
         * dequantize a row slice, then the same math as f32. */
        size_t hoff = (size_t)kvh * (size_t)(D / RLAI_QK) * sizeof(rlai_block_q8_0);
        float row[256];
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            rlai_dequantize_row(RLAI_DT_Q8_0, page_row(kv->k, kv, table, j) + hoff, row, D);
            float s = 0;
            for (int d = 0; d < D; d++)
                s += row[d] * q[d];
            sc[j] = s * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        float inv = 1.0f / rlai_vec_exp_sum(c->k, n, sc, mx);
        memset(out, 0, sizeof(float) * (size_t)D);
        for (int j = 0; j < n; j++) {
            rlai_dequantize_row(RLAI_DT_Q8_0, page_row(kv->v, kv, table, j) + hoff, row, D);
            float p = sc[j] * inv;
            for (int d = 0; d < D; d++)
                out[d] += p * row[d];
        }
        return;
    }
    /* f32 cache (precise mode): plain loops, the reference path. */
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kf = (const float *)page_row(kv->k, kv, table, j) + (size_t)kvh * D;
        float s = 0;
        for (int d = 0; d < D; d++)
            s += kf[d] * q[d];
        s *= scale;
        sc[j] = s;
        if (s > mx)
            mx = s;
    }
    float sum = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    float inv = 1.0f / sum;
    memset(out, 0, sizeof(float) * (size_t)D);
    for (int j = 0; j < n; j++) {
        const float *vf = (const float *)page_row(kv->v, kv, table, j) + (size_t)kvh * D;
        float p = sc[j] * inv;
        for (int d = 0; d < D; d++)
            out[d] += p * vf[d];
    }
}

/* One unit of the f16 cache: every K block is read and converted once for
 * all the unit's queries, then every V block. Per query the operations are
 * attn_one's: the same dot products, maximum, softmax and accumulation. */
static void attn_unit_f16(const attn_task *t, const attn_unit *u, int ith)
{
    cpu_backend *c = t->c;
    const rlai_kv_layer_view *kv = t->kv;
    int H = t->H, D = t->D, G = t->H / t->HKV, nq = u->nq;
    size_t ctx = (size_t)c->max_ctx;
    float *scratch = c->scores + (size_t)ith * ATTN_QMAX * ctx;
    if (nq == 1) {
        int q = u->q0;
        attn_one(t, u->row0 + q / G, u->kvh * G + q % G, scratch);
        return;
    }
    float scale = 1.0f / sqrtf((float)D);
    const int32_t *table = t->rows->tables[u->row0];
    size_t stride = (size_t)kv->kv_dim;
    const float *qs[ATTN_QMAX], *ps[ATTN_QMAX];
    float *outs[ATTN_QMAX], *sc[ATTN_QMAX], *dst[ATTN_QMAX];
    int lim[ATTN_QMAX], mq[ATTN_QMAX];
    int nmax = 0;
    for (int qi = 0; qi < nq; qi++) {
        int q = u->q0 + qi, i = u->row0 + q / G, h = u->kvh * G + q % G;
        qs[qi] = t->q + ((size_t)i * H + h) * D;
        outs[qi] = t->out + ((size_t)i * H + h) * D;
        sc[qi] = scratch + (size_t)qi * ctx;
        lim[qi] = t->rows->pos[i] + 1;
        nmax = lim[qi] > nmax ? lim[qi] : nmax;
    }
    /* Scores: queries whose positions end inside a block get scores for
     * the block's later rows too (within max_ctx); they are not used. */
    for (int j0 = 0; j0 < nmax; j0 += RLAI_KV_BLOCK) {
        int m = nmax - j0 < RLAI_KV_BLOCK ? nmax - j0 : RLAI_KV_BLOCK, na = 0;
        for (int qi = 0; qi < nq; qi++)
            if (lim[qi] > j0) {
                ps[na] = qs[qi];
                dst[na++] = sc[qi] + j0;
            }
        const uint16_t *kr = (const uint16_t *)page_row(kv->k, kv, table, j0) + (size_t)u->kvh * D;
        rlai_attn_dot_f16_multi(c->k, m, D, kr, stride, na, ps, scale, dst);
    }
    for (int qi = 0; qi < nq; qi++) {
        float *s = sc[qi];
        int n = lim[qi];
        float mx = max_of(s, n, -INFINITY);
        float inv = 1.0f / rlai_vec_exp_sum(c->k, n, s, mx);
        for (int j = 0; j < n; j++)
            s[j] *= inv;
        memset(outs[qi], 0, sizeof(float) * (size_t)D);
    }
    for (int j0 = 0; j0 < nmax; j0 += RLAI_KV_BLOCK) {
        int m = nmax - j0 < RLAI_KV_BLOCK ? nmax - j0 : RLAI_KV_BLOCK, na = 0;
        for (int qi = 0; qi < nq; qi++)
            if (lim[qi] > j0) {
                ps[na] = sc[qi] + j0;
                mq[na] = lim[qi] - j0;
                dst[na++] = outs[qi];
            }
        const uint16_t *vr = (const uint16_t *)page_row(kv->v, kv, table, j0) + (size_t)u->kvh * D;
        rlai_attn_mad_f16_multi(c->k, m, D, vr, stride, na, mq, ps, dst);
    }
}

static void attn_worker(void *arg, int ith, int nth)
{
    attn_task *t = arg;
    if (!t->units) {
        float *sc = t->c->scores + (size_t)ith * ATTN_QMAX * (size_t)t->c->max_ctx;
        int total = t->rows->n * t->H;
        for (int job = ith; job < total; job += nth)
            attn_one(t, job / t->H, job % t->H, sc);
        return;
    }
    for (;;) {
        int u = __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED);
        if (u >= t->n_units)
            break;
        attn_unit_f16(t, &t->units[u], ith);
    }
}

/* Relative cost per key of a unit of nq queries, estimated from the
 * instructions per key of the AVX2 kernels (bench/bench_attn measures the
 * outcome): a lone query runs the f16 kernels directly; a group pays one
 * f32 conversion of each block, then a cheaper pass per query. */
static double unit_cost(int nq) { return nq == 1 ? 55.0 : 48.0 + 23.0 * nq; }

/* Splits the batch into units: runs of rows with the same block table,
 * each run's queries of one KV head in nc chunks, nc chosen so the
 * threads' estimated longest share is smallest (ties: fewer chunks, so
 * fewer conversions). Returns the unit count, or -1 (out of memory: the
 * caller falls back to one job per row and head). */
static int attn_plan(cpu_backend *c, const rlai_paged_rows *rows, int H, int HKV)
{
    int G = H / HKV, n_runs = 0, qmax = 0;
    for (int i = 0; i < rows->n;) {
        int j = i + 1;
        while (j < rows->n && rows->tables[j] == rows->tables[i])
            j++;
        n_runs++;
        qmax = (j - i) * G > qmax ? (j - i) * G : qmax;
        i = j;
    }
    int nth = c->n_threads, best_nc = (qmax + ATTN_QMAX - 1) / ATTN_QMAX;
    double best = -1;
    for (int nc = best_nc; nc <= qmax; nc++) {
        double units = (double)n_runs * HKV * nc;
        double est = ceil(units / nth) * unit_cost((qmax + nc - 1) / nc);
        if (best < 0 || est < best) {
            best = est;
            best_nc = nc;
        }
    }
    size_t need = (size_t)n_runs * (size_t)HKV * (size_t)best_nc;
    if (need > c->units_cap) {
        attn_unit *nu = realloc(c->units, need * sizeof *nu);
        if (!nu)
            return -1;
        c->units = nu;
        c->units_cap = need;
    }
    int n = 0;
    for (int i = 0; i < rows->n;) {
        int j = i + 1;
        while (j < rows->n && rows->tables[j] == rows->tables[i])
            j++;
        int Q = (j - i) * G, qc = (Q + best_nc - 1) / best_nc;
        for (int kvh = 0; kvh < HKV; kvh++)
            for (int q0 = 0; q0 < Q; q0 += qc)
                c->units[n++] = (attn_unit){ i, kvh, q0, Q - q0 < qc ? Q - q0 : qc };
        i = j;
    }
    return n;
}

static void cpu_attention(rlai_backend *be, const rlai_kv_layer_view *kv, const rlai_paged_rows *rows,
                          int n_head, int n_head_kv, int head_dim, const float *q, float *out)
{
    cpu_backend *c = cpu(be);
    attn_task at = { c, kv, rows, n_head, n_head_kv, head_dim, q, out, NULL, 0, 0 };
    if (kv->dtype == RLAI_DT_F16 && rows->n > 0 && n_head_kv > 0 && n_head % n_head_kv == 0) {
        int n = attn_plan(c, rows, n_head, n_head_kv);
        if (n > 0) {
            at.units = c->units;
            at.n_units = n;
        }
    }
    rlai_threadpool_run(c->tp, attn_worker, &at);
}

static int cpu_argmax(rlai_backend *be, const float *logits, int n, int n_vocab, int32_t *out)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        const float *r = logits + (size_t)i * n_vocab;
        int best = 0;
        for (int j = 1; j < n_vocab; j++)
            if (r[j] > r[best])
                best = j;
        out[i] = best;
    }
    return 0;
}

static const rlai_backend_i cpu_iface = {
    .version = RLAI_BACKEND_IFACE_VERSION,
    .struct_size = sizeof(rlai_backend_i),
    .name = "cpu",
    .host_memory = true,
    .free = cpu_free,
    .describe = cpu_describe,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .weight_upload = cpu_weight_upload,   /* the mapping in place, plus a packed copy */
    .weight_free = cpu_weight_free,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add_row = cpu_add_row,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .argmax = cpu_argmax,
    .matmul_n = cpu_matmul_n,
};

int rlai_backend_cpu_new(rlai_kernels *k, rlai_threadpool *tp, int max_ctx, rlai_backend **out)
{
    *out = NULL;
    if (!k || max_ctx <= 0)
        return RLAI_ERR_INVALID_ARG;
    cpu_backend *c = calloc(1, sizeof(*c));
    if (!c)
        return RLAI_ERR_NOMEM;
    c->base.iface = &cpu_iface;
    c->k = k;
    c->tp = tp;
    c->n_threads = tp ? rlai_threadpool_size(tp) : 1;
    c->max_ctx = max_ctx;
    c->scores = malloc(sizeof(float) * (size_t)c->n_threads * ATTN_QMAX * (size_t)max_ctx);
    if (!c->scores) {
        free(c);
        return RLAI_ERR_NOMEM;
    }
    snprintf(c->desc, sizeof(c->desc), "cpu, %d thread%s", c->n_threads, c->n_threads == 1 ? "" : "s");
    *out = &c->base;
    return 0;
}
