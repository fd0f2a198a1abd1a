/* kernels.c - CPU feature detection, ISA dispatch, the kernel context
 * (per-thread scratch, quantized-activation buffer), work splitting for
 * rlai_matmul, and the portable scalar reference kernels.
 *
 * Two numeric modes (see kernels.h):
 *  - f32 path: used when precise = true or the weights are F32/F16/BF16.
 *    Weight rows are dequantized to f32 and dotted with f32 activations
 *    (scalar: double accumulation).
 *  - quantized path: activations are quantized once per call (layout in
 *    kernels_impl.h) and blocks are dotted in integers; the per-block
 *    result is sum_b d_w*d_x*sum(q_w*q_x) + m_w*s_x, where Q4_0/Q5_0 use
 *    unsigned nibbles with m_w = -8 d_w / -16 d_w, Q8_0 signed values and
 *    m_w = 0.
 * Batch invariance (every ISA, both modes): y[t][r] depends only on row r
 * and token t's activations, never on T, t's position, the work split or
 * the thread count. Activations are quantized per token row with the same
 * function whatever T; the scalar kernels compute each (row, token) dot
 * product on its own in a fixed order; kernels_avx2.c documents its
 * canonical order, which the AVX-512 VNNI kernels (kernels_avx512.c) follow
 * too, so quantized results are bit-identical across ISAs. Work items only
 * choose which outputs a thread computes, never split one output. */
#include "kernels.h"
#include "kernels_impl.h"
#include "dtype.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define RLAI_X86 1
#endif

/* ------------------------------------------------------------------ */
/* CPU detection                                                       */

static unsigned g_isa_mask;
static bool g_vnni;
static pthread_once_t g_detect_once = PTHREAD_ONCE_INIT;

#ifdef RLAI_X86
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}
#endif

static void detect(void)
{
    unsigned mask = 1u << RLAI_ISA_SCALAR;
#ifdef RLAI_X86
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        bool osxsave = c & (1u << 27);
        bool avx = c & (1u << 28), fma = c & (1u << 12), f16c = c & (1u << 29);
        uint64_t xcr0 = osxsave ? read_xcr0() : 0;
        bool os_avx = (xcr0 & 0x6) == 0x6;            /* XMM + YMM state */
        bool os_avx512 = (xcr0 & 0xE6) == 0xE6;       /* + opmask, ZMM_Hi256, Hi16_ZMM */
        unsigned b7 = 0, c7 = 0;
        if (__get_cpuid_max(0, NULL) >= 7) {
            unsigned a7, d7;
            __cpuid_count(7, 0, a7, b7, c7, d7);
            (void)a7; (void)d7;
        }
        bool avx2 = b7 & (1u << 5);
        if (os_avx && avx && avx2 && fma && f16c) {
            mask |= 1u << RLAI_ISA_AVX2;
            bool f = b7 & (1u << 16), dq = b7 & (1u << 17);
            bool bw = b7 & (1u << 30), vl = b7 & (1u << 31);
            bool vnni = c7 & (1u << 11);   /* AVX512_VNNI: kernels_avx512.c uses vpdpbusd */
            if (os_avx512 && f && dq && bw && vl && vnni) {
                mask |= 1u << RLAI_ISA_AVX512;
                g_vnni = true;
            }
        }
    }
#endif
    g_isa_mask = mask;
}

unsigned rlai_kernels_available(void)
{
    pthread_once(&g_detect_once, detect);
    return g_isa_mask;
}

int rlai_kernels_resolve(rlai_isa want, rlai_isa *got)
{
    unsigned m = rlai_kernels_available();
    rlai_isa r;
    if (want == RLAI_ISA_AUTO) {
        r = (m & (1u << RLAI_ISA_AVX512)) ? RLAI_ISA_AVX512 :
            (m & (1u << RLAI_ISA_AVX2)) ? RLAI_ISA_AVX2 : RLAI_ISA_SCALAR;
    } else if (want == RLAI_ISA_SCALAR || want == RLAI_ISA_AVX2 || want == RLAI_ISA_AVX512) {
        if (!(m & (1u << want)))
            return RLAI_ERR_UNSUPPORTED;
        r = want;
    } else {
        return RLAI_ERR_INVALID_ARG;
    }
    if (got)
        *got = r;
    return RLAI_OK;
}

const char *rlai_isa_name(rlai_isa isa)
{
    switch (isa) {
    case RLAI_ISA_AUTO: return "auto";
    case RLAI_ISA_SCALAR: return "scalar";
    case RLAI_ISA_AVX2: return "avx2";
    case RLAI_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------ */
/* kernel context                                                      */

struct rlai_kernels {
    rlai_isa isa;
    bool precise;
    rlai_mm_fn mm;
    rlai_qact_fn qact;
    float (*dot_f16)(int, const uint16_t *, const float *);
    void (*mad_f16)(int, float *, const uint16_t *, float);
    void (*to_f16)(const float *, uint16_t *, int);
    void (*attn_dot)(int, int, const uint16_t *, size_t, const float *, float, float *);
    void (*attn_mad)(int, int, const uint16_t *, size_t, const float *, float *);
    void (*attn_dot_multi)(int, int, const uint16_t *, size_t, int, const float *const *, float, float *const *);
    void (*attn_mad_multi)(int, int, const uint16_t *, size_t, int, const int *, const float *const *,
                           float *const *);
    float (*exp_sum)(int, float *, float);
    void (*swiglu)(size_t, float *, const float *);

    unsigned char *scratch;   /* n threads * scratch_per, 64-aligned */
    size_t scratch_cap;
    unsigned char *actbuf;    /* quantized activations, 64-aligned */
    size_t act_cap;
};

/* The scalar level shares nothing between queries: each is the one-query
 * reference. */
static void attn_dot_multi_scalar(int m, int d, const uint16_t *k, size_t stride, int nq, const float *const *q,
                                  float scale, float *const *out)
{
    for (int qi = 0; qi < nq; qi++)
        rlai__attn_dot_f16_scalar(m, d, k, stride, q[qi], scale, out[qi]);
}

static void attn_mad_multi_scalar(int m, int d, const uint16_t *v, size_t stride, int nq, const int *mq,
                                  const float *const *p, float *const *y)
{
    for (int qi = 0; qi < nq; qi++)
        rlai__attn_mad_f16_scalar(mq[qi] < m ? mq[qi] : m, d, v, stride, p[qi], y[qi]);
}

static void set_ops(rlai_kernels *k, rlai_isa isa)
{
    k->isa = isa;
    switch (isa) {
    case RLAI_ISA_AVX512:
        k->mm = rlai__mm_avx512;
        k->qact = rlai__quant_act_avx512;
        k->dot_f16 = rlai__dot_f16_f32_avx2;
        k->mad_f16 = rlai__mad_f16_avx2;
        k->to_f16 = rlai__f32_to_f16_avx2;
        k->attn_dot = rlai__attn_dot_f16_avx512;
        k->attn_mad = rlai__attn_mad_f16_avx512;
        k->attn_dot_multi = rlai__attn_dot_f16_multi_avx512;
        k->attn_mad_multi = rlai__attn_mad_f16_multi_avx512;
        k->exp_sum = rlai__exp_sum_avx2;
        k->swiglu = rlai__swiglu_avx512;
        break;
    case RLAI_ISA_AVX2:
        k->mm = rlai__mm_avx2;
        k->qact = rlai__quant_act_avx2;
        k->dot_f16 = rlai__dot_f16_f32_avx2;
        k->mad_f16 = rlai__mad_f16_avx2;
        k->to_f16 = rlai__f32_to_f16_avx2;
        k->attn_dot = rlai__attn_dot_f16_avx2;
        k->attn_mad = rlai__attn_mad_f16_avx2;
        k->attn_dot_multi = rlai__attn_dot_f16_multi_avx2;
        k->attn_mad_multi = rlai__attn_mad_f16_multi_avx2;
        k->exp_sum = rlai__exp_sum_avx2;
        k->swiglu = rlai__swiglu_avx2;
        break;
    default:
        k->isa = RLAI_ISA_SCALAR;
        k->mm = rlai__mm_scalar;
        k->qact = rlai__quant_act_scalar;
        k->dot_f16 = rlai__dot_f16_f32_scalar;
        k->mad_f16 = rlai__mad_f16_scalar;
        k->to_f16 = rlai__f32_to_f16_scalar;
        k->attn_dot = rlai__attn_dot_f16_scalar;
        k->attn_mad = rlai__attn_mad_f16_scalar;
        k->attn_dot_multi = attn_dot_multi_scalar;
        k->attn_mad_multi = attn_mad_multi_scalar;
        k->exp_sum = rlai__exp_sum_scalar;
        k->swiglu = rlai__swiglu_scalar;
        break;
    }
}

int rlai_kernels_new(rlai_isa isa, bool precise, rlai_kernels **out)
{
    if (!out)
        return RLAI_ERR_INVALID_ARG;
    *out = NULL;
    rlai_isa got;
    int rc = rlai_kernels_resolve(isa, &got);
    if (rc < 0)
        return rc;
    rlai_kernels *k = calloc(1, sizeof *k);
    if (!k)
        return RLAI_ERR_NOMEM;
    k->precise = precise;
    set_ops(k, got);
    *out = k;
    return RLAI_OK;
}

void rlai_kernels_free(rlai_kernels *k)
{
    if (!k)
        return;
    free(k->scratch);
    free(k->actbuf);
    free(k);
}

static size_t align64(size_t n)
{
    return (n + 63u) & ~(size_t)63u;
}

/* Grows a 64-aligned buffer (contents not kept). */
static int grow(unsigned char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return RLAI_OK;
    need = align64(need + need / 4);
    unsigned char *p = aligned_alloc(64, need);
    if (!p)
        return RLAI_ERR_NOMEM;
    free(*buf);
    *buf = p;
    *cap = need;
    return RLAI_OK;
}

static int tok_pad(int T)
{
    return T == 1 ? 1 : (T + RLAI_TOK_PAD - 1) / RLAI_TOK_PAD * RLAI_TOK_PAD;
}

static size_t act_bytes(int T, int64_t cols)
{
    size_t Tp = (size_t)tok_pad(T), nb = (size_t)cols / RLAI_QK;
    return align64(Tp * (size_t)cols) + 3 * align64(Tp * nb * 2 * sizeof(float)) +
           align64(Tp * nb * sizeof(int32_t)) + 64;
}

int rlai_kernels_reserve(rlai_kernels *k, int n_threads, int64_t max_cols, int max_T)
{
    if (!k || n_threads < 1 || max_cols < 0 || max_T < 0)
        return RLAI_ERR_INVALID_ARG;
    int rc = grow(&k->scratch, &k->scratch_cap,
                  (size_t)n_threads * align64(rlai__scratch_bytes(max_cols)));
    if (rc == RLAI_OK && max_T > 0 && max_cols >= RLAI_QK)
        rc = grow(&k->actbuf, &k->act_cap, act_bytes(max_T, max_cols));
    return rc;
}

/* ------------------------------------------------------------------ */
/* rlai_matmul: activation quantization and work splitting             */

struct qact_task {
    rlai_kernels *k;
    const float *x;
    int64_t ldx;
    rlai_act *act;
};

static void qact_token(const struct qact_task *q, int t)
{
    rlai_act *a = q->act;
    int64_t nb = a->nb;
    int8_t *qr = a->q + (size_t)t * (size_t)a->cols;
    float *ds = a->ds + (size_t)t * (size_t)nb * 2;
    if (t < a->T) {
        q->k->qact(q->x + (size_t)t * (size_t)q->ldx, a->cols, qr, ds);
    } else {
        memset(qr, 0, (size_t)a->cols);
        memset(ds, 0, (size_t)nb * 2 * sizeof(float));
    }
    if (a->dv) {
        int g = t / 8, i = t % 8;
        for (int64_t b = 0; b < nb; b++) {
            size_t o = ((size_t)g * (size_t)nb + (size_t)b) * 8 + (size_t)i;
            a->dv[o] = ds[2 * b];
            a->sv[o] = ds[2 * b + 1];
        }
    }
    if (a->qsum) {
        int32_t *qs = a->qsum + (size_t)t * (size_t)nb;
        for (int64_t b = 0; b < nb; b++) {
            int32_t sum = 0;
            for (int e = 0; e < RLAI_QK; e++)
                sum += qr[b * RLAI_QK + e];
            qs[b] = sum;
        }
    }
}

/* Each thread quantizes its share of the real tokens and clears its share
 * of the padding ones (a split of the padded count gave one thread all the
 * real tokens of a 9-row verification, while the other cleared padding). */
static void qact_task_fn(void *arg, int ith, int nth)
{
    const struct qact_task *q = arg;
    int T = q->act->T, pad = q->act->Tpad - T;
    int t0 = (int)((int64_t)T * ith / nth), t1 = (int)((int64_t)T * (ith + 1) / nth);
    for (int t = t0; t < t1; t++)
        qact_token(q, t);
    t0 = T + (int)((int64_t)pad * ith / nth);
    t1 = T + (int)((int64_t)pad * (ith + 1) / nth);
    for (int t = t0; t < t1; t++)
        qact_token(q, t);
}

struct mm_task {
    const rlai_mm_job *job;
    rlai_mm_fn mm;
    unsigned char *scratch;
    size_t scratch_per;
    int64_t rows_per_item;
    int64_t n_rc;         /* row chunks */
    int n_tc;             /* token chunks */
    int tok_chunk;
    int64_t n_items;
    atomic_llong next;
};

static void run_item(struct mm_task *m, int64_t i, void *scr)
{
    const rlai_mm_job *j = m->job;
    int64_t rc = i / m->n_tc;
    int tc = (int)(i % m->n_tc);
    int64_t r0 = rc * m->rows_per_item;
    int64_t r1 = r0 + m->rows_per_item < j->rows ? r0 + m->rows_per_item : j->rows;
    int t0 = tc * m->tok_chunk;
    int t1 = t0 + m->tok_chunk < j->T ? t0 + m->tok_chunk : j->T;
    m->mm(j, r0, r1, t0, t1, scr);
}

static void mm_task_fn(void *arg, int ith, int nth)
{
    struct mm_task *m = arg;
    (void)nth;
    void *scr = m->scratch + (size_t)ith * m->scratch_per;
    for (;;) {
        long long i = atomic_fetch_add_explicit(&m->next, 1, memory_order_relaxed);
        if (i >= m->n_items)
            break;
        run_item(m, i, scr);
    }
}

static void fill_nan(float *y, int64_t ldy, int T, int64_t rows)
{
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++)
            y[(size_t)t * (size_t)ldy + (size_t)r] = NAN;
}

/* Checks one product's arguments: its weight's row bytes, or 0 when the
 * product is not computed (rlai_matmul's silent refusals). */
static size_t mm_row_bytes(const rlai_weight *w, const float *x, int64_t ldx, int T, const float *y, int64_t ldy)
{
    if (!w || !x || !y || T <= 0 || w->rows <= 0 || w->cols <= 0 || !w->data)
        return 0;
    if (!rlai_dtype_supported(w->type) || ldx < w->cols || ldy < w->rows)
        return 0;
    return rlai_dtype_row_bytes(w->type, w->cols);
}

/* Quantizes the T rows of x for weights of w's type and width into
 * k->actbuf (grown by the caller) and describes them in *act. */
static void act_quantize(rlai_kernels *k, rlai_threadpool *tp, int nth, const rlai_weight *w, const float *x,
                         int64_t ldx, int T, rlai_act *act)
{
    int Tp = tok_pad(T);
    size_t nb = (size_t)(w->cols / RLAI_QK);
    unsigned char *p = k->actbuf;
    act->T = T;
    act->Tpad = Tp;
    act->cols = w->cols;
    act->nb = w->cols / RLAI_QK;
    act->q = (int8_t *)p;
    p += align64((size_t)Tp * (size_t)w->cols);
    act->ds = (float *)p;
    p += align64((size_t)Tp * nb * 2 * sizeof(float));
    act->dv = act->sv = NULL;
    act->qsum = NULL;
    if (T > RLAI_MV_MAX_T && k->isa != RLAI_ISA_SCALAR) {   /* tile layout */
        act->dv = (float *)p;
        p += align64((size_t)Tp * nb * sizeof(float));
        act->sv = (float *)p;
        p += align64((size_t)Tp * nb * sizeof(float));
    }
    if (k->isa == RLAI_ISA_AVX512 && w->type == RLAI_DT_Q8_0)   /* VNNI bias term */
        act->qsum = (int32_t *)(void *)p;
    struct qact_task qt = { .k = k, .x = x, .ldx = ldx, .act = act };
    if (Tp <= 2 || nth == 1)
        qact_task_fn(&qt, 0, 1);
    else
        rlai_threadpool_run(tp, qact_task_fn, &qt);
}

/* One product's job and work split: row chunks (multiple of
 * RLAI_ROW_TILE) x token chunks. */
static void mm_plan(const rlai_kernels *k, int nth, const rlai_weight *w, size_t row_bytes, const float *x,
                    int64_t ldx, int T, float *y, int64_t ldy, const rlai_act *act, size_t scratch_per,
                    rlai_mm_job *job, struct mm_task *m)
{
    *job = (rlai_mm_job){
        .type = w->type, .rows = w->rows, .cols = w->cols, .nb = w->cols / RLAI_QK,
        .w = w->data, .row_bytes = row_bytes, .x = x, .ldx = ldx, .act = act,
        .y = y, .ldy = ldy, .T = T, .vnni = g_vnni,
        /* a packed copy exists only for the types and mode its level packs (act: the quantized mode) */
        .wp = act && w->packed && w->packed_isa == k->isa ? w->packed : NULL,
    };
    memset(m, 0, sizeof(*m));
    m->job = job;
    m->mm = k->mm;
    m->scratch = k->scratch;
    m->scratch_per = scratch_per;
    int64_t tiles = (w->rows + RLAI_ROW_TILE - 1) / RLAI_ROW_TILE;
    bool mv = T == 1 || (T <= RLAI_MV_MAX_T && k->isa != RLAI_ISA_SCALAR);
    if (mv) {
        /* matvec (also the small-batch one, T <= RLAI_MV_MAX_T): about two
         * chunks per thread (at most 256 rows each), large enough to
         * stream well: the AVX2 matvec prefetches one 8-row group ahead,
         * so the first group of each chunk is not prefetched. Tokens are
         * not split: every token shares the weight rows streamed once. */
        int64_t per = tiles / ((int64_t)nth * 2);
        if (per < 1) per = 1;
        if (per > 16) per = 16;
        m->rows_per_item = per * RLAI_ROW_TILE;
    } else {
        m->rows_per_item = RLAI_ROW_TILE;
    }
    m->n_rc = (w->rows + m->rows_per_item - 1) / m->rows_per_item;
    m->n_tc = 1;
    m->tok_chunk = T;
    if (!mv && nth > 1 && m->n_rc < 4 * (int64_t)nth) {
        /* few rows: also split tokens, in multiples of RLAI_TOK_PAD */
        int64_t want = (4 * (int64_t)nth + m->n_rc - 1) / m->n_rc;
        int64_t tc = ((int64_t)T + want - 1) / want;
        tc = (tc + RLAI_TOK_PAD - 1) / RLAI_TOK_PAD * RLAI_TOK_PAD;
        m->tok_chunk = (int)tc;
        m->n_tc = (int)(((int64_t)T + tc - 1) / tc);
    }
    m->n_items = m->n_rc * m->n_tc;
    atomic_init(&m->next, 0);
}

void rlai_matmul(rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *w,
                 const float *x, int64_t ldx, int T, float *y, int64_t ldy)
{
    size_t row_bytes = k ? mm_row_bytes(w, x, ldx, T, y, ldy) : 0;
    if (row_bytes == 0)
        return;
    int nth = rlai_threadpool_size(tp);
    bool quant = !k->precise && rlai__is_quant(w->type);
    size_t scratch_per = align64(rlai__scratch_bytes(w->cols));
    if (grow(&k->scratch, &k->scratch_cap, (size_t)nth * scratch_per) < 0 ||
        (quant && grow(&k->actbuf, &k->act_cap, act_bytes(T, w->cols)) < 0)) {
        fill_nan(y, ldy, T, w->rows);   /* out of memory: poison, never crash */
        return;
    }
    rlai_act act;
    if (quant)
        act_quantize(k, tp, nth, w, x, ldx, T, &act);
    rlai_mm_job job;
    struct mm_task m;
    mm_plan(k, nth, w, row_bytes, x, ldx, T, y, ldy, quant ? &act : NULL, scratch_per, &job, &m);
    if (nth == 1 || m.n_items == 1) {
        for (int64_t i = 0; i < m.n_items; i++)
            run_item(&m, i, k->scratch);
    } else {
        rlai_threadpool_run(tp, mm_task_fn, &m);
    }
}

/* The work items of several products, numbered one after another. */
struct mm_multi {
    struct mm_task *t;
    int n;
    int64_t n_items;
    atomic_llong next;
};

static void mm_multi_fn(void *arg, int ith, int nth)
{
    struct mm_multi *mm = arg;
    (void)nth;
    void *scr = mm->t[0].scratch + (size_t)ith * mm->t[0].scratch_per;
    for (;;) {
        long long i = atomic_fetch_add_explicit(&mm->next, 1, memory_order_relaxed);
        if (i >= mm->n_items)
            break;
        int p = 0;
        while (i >= mm->t[p].n_items)
            i -= mm->t[p++].n_items;
        run_item(&mm->t[p], i, scr);
    }
}

void rlai_matmul_n(rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *const *w, int n,
                   const float *x, int64_t ldx, int T, float *const *y, const int64_t *ldy)
{
    if (!k || !w || !y || !ldy || n <= 0)
        return;
    size_t row_bytes[RLAI_MATMUL_N_MAX];
    bool shared = n <= RLAI_MATMUL_N_MAX;
    for (int i = 0; shared && i < n; i++) {
        row_bytes[i] = mm_row_bytes(w[i], x, ldx, T, y[i], ldy[i]);
        shared = row_bytes[i] > 0 && w[i]->type == w[0]->type && w[i]->cols == w[0]->cols;
    }
    if (!shared) {
        for (int i = 0; i < n; i++)
            rlai_matmul(k, tp, w[i], x, ldx, T, y[i], ldy[i]);
        return;
    }
    int nth = rlai_threadpool_size(tp);
    bool quant = !k->precise && rlai__is_quant(w[0]->type);
    size_t scratch_per = align64(rlai__scratch_bytes(w[0]->cols));
    if (grow(&k->scratch, &k->scratch_cap, (size_t)nth * scratch_per) < 0 ||
        (quant && grow(&k->actbuf, &k->act_cap, act_bytes(T, w[0]->cols)) < 0)) {
        for (int i = 0; i < n; i++)
            fill_nan(y[i], ldy[i], T, w[i]->rows);
        return;
    }
    rlai_act act;
    if (quant)
        act_quantize(k, tp, nth, w[0], x, ldx, T, &act);
    rlai_mm_job jobs[RLAI_MATMUL_N_MAX];
    struct mm_task tasks[RLAI_MATMUL_N_MAX];
    struct mm_multi mm = { .t = tasks, .n = n, .n_items = 0 };
    for (int i = 0; i < n; i++) {
        mm_plan(k, nth, w[i], row_bytes[i], x, ldx, T, y[i], ldy[i], quant ? &act : NULL, scratch_per,
                &jobs[i], &tasks[i]);
        mm.n_items += tasks[i].n_items;
    }
    atomic_init(&mm.next, 0);
    if (nth == 1)
        mm_multi_fn(&mm, 0, 1);
    else
        rlai_threadpool_run(tp, mm_multi_fn, &mm);
}

rlai_isa rlai_kernels_isa(const rlai_kernels *k)
{
    return k ? k->isa : RLAI_ISA_SCALAR;
}

size_t rlai_kernels_packed_bytes(const rlai_kernels *k, const rlai_weight *w)
{
    if (!k || !w || !w->data || k->precise || k->isa != RLAI_ISA_AVX512 || !rlai__pk_type(w->type) ||
        w->rows <= 0 || w->cols <= 0 || w->cols % RLAI_QK != 0)
        return 0;
    size_t groups = (size_t)((w->rows + RLAI_PK_ROWS - 1) / RLAI_PK_ROWS);
    return groups * rlai__pk_group_bytes(w->type, w->cols / RLAI_QK);
}

/* Where row r's block b lives in a packed copy at base (layout in
 * kernels_impl.h): its planes (the row's bytes at lane * 4 of each 64),
 * its headers (f16 d at lane * 2, Q4_1's m 32 bytes on) and its lane.
 * One place for the layout's arithmetic: packing and reading back. */
typedef struct pk_at {
    uint8_t *pl, *hd;
    size_t lane, nplanes, qoff;   /* qoff: the quants' offset in a GGUF block */
} pk_at;

static pk_at pk_locate(const rlai_weight *w, const void *base, int64_t r, int64_t b)
{
    const uint32_t t = w->type;
    const int64_t nb = w->cols / RLAI_QK;
    const size_t pb = rlai__pk_plane_bytes(t);
    uint8_t *G = (uint8_t *)(uintptr_t)base + (size_t)(r / RLAI_PK_ROWS) * rlai__pk_group_bytes(t, nb);
    return (pk_at){
        .pl = G + (size_t)b * pb,
        .hd = G + (size_t)nb * pb + (size_t)b * rlai__pk_hdr_bytes(t),
        .lane = (size_t)(r % RLAI_PK_ROWS),
        .nplanes = pb / 64,
        .qoff = t == RLAI_DT_Q4_1 ? 4 : 2,
    };
}

/* Groups [ith * G / nth, (ith + 1) * G / nth) of the weight: plain C,
 * run once per weight at load. The last group's missing rows repeat the
 * weight's last row. */
struct pack_task {
    const rlai_weight *w;
    uint8_t *dst;
};

static void pack_fn(void *arg, int ith, int nth)
{
    const struct pack_task *pt = arg;
    const rlai_weight *w = pt->w;
    const int64_t nb = w->cols / RLAI_QK, groups = (w->rows + RLAI_PK_ROWS - 1) / RLAI_PK_ROWS;
    const int64_t g0 = groups * ith / nth, g1 = groups * (ith + 1) / nth;
    const size_t rb = rlai_dtype_row_bytes(w->type, w->cols), bb = rb / (size_t)nb;
    const size_t gb = rlai__pk_group_bytes(w->type, nb);
    memset(pt->dst + (size_t)g0 * gb, 0, (size_t)(g1 - g0) * gb);
    for (int64_t s = g0 * RLAI_PK_ROWS; s < g1 * RLAI_PK_ROWS; s++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)(s < w->rows ? s : w->rows - 1) * rb;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * bb;
            pk_at at = pk_locate(w, pt->dst, s, b);
            for (size_t q = 0; q < at.nplanes; q++)
                memcpy(at.pl + q * 64 + 4 * at.lane, blk + at.qoff + 4 * q, 4);
            memcpy(at.hd + 2 * at.lane, blk, 2);
            if (w->type == RLAI_DT_Q4_1)
                memcpy(at.hd + 32 + 2 * at.lane, blk + 2, 2);
        }
    }
}

int rlai_kernels_pack(const rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *w, void *dst, size_t n)
{
    size_t need = rlai_kernels_packed_bytes(k, w);
    if (need == 0)
        return k && w && w->data ? RLAI_ERR_UNSUPPORTED : RLAI_ERR_INVALID_ARG;
    if (!dst || n < need || ((uintptr_t)dst & 63u) != 0)
        return RLAI_ERR_INVALID_ARG;
    struct pack_task pt = { w, dst };
    rlai_threadpool_run(tp, pack_fn, &pt);   /* tp NULL: this thread alone */
    return 0;
}

/* Row r's block b rebuilt in GGUF bytes from the packed copy. */
static void packed_block(const rlai_weight *w, int64_t r, int64_t b, uint8_t *blk)
{
    pk_at at = pk_locate(w, w->packed, r, b);
    memcpy(blk, at.hd + 2 * at.lane, 2);
    if (w->type == RLAI_DT_Q4_1)
        memcpy(blk + 2, at.hd + 32 + 2 * at.lane, 2);
    for (size_t q = 0; q < at.nplanes; q++)
        memcpy(blk + at.qoff + 4 * q, at.pl + q * 64 + 4 * at.lane, 4);
}

void rlai_weight_get_row(const rlai_weight *w, int64_t r, float *dst)
{
    if (!w || !dst || !w->data || r < 0 || r >= w->rows)
        return;
    size_t rb = rlai_dtype_row_bytes(w->type, w->cols);
    if (rb == 0)
        return;
    if (w->packed && rlai__pk_type(w->type) && w->cols % RLAI_QK == 0) {
        /* the same bytes, from the packed copy: the mapping's pages of a
         * packed weight are not touched again (model.c drops them) */
        uint8_t blk[64];
        for (int64_t b = 0; b < w->cols / RLAI_QK; b++) {
            packed_block(w, r, b, blk);
            rlai_dequantize_row(w->type, blk, dst + b * RLAI_QK, RLAI_QK);
        }
        return;
    }
    rlai_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * rb, dst, w->cols);
}

/* ------------------------------------------------------------------ */
/* f16 vector helpers                                                  */

static rlai_kernels g_default_ops;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

static void init_default_ops(void)
{
    rlai_isa isa = RLAI_ISA_SCALAR;
    rlai_kernels_resolve(RLAI_ISA_AUTO, &isa);
    set_ops(&g_default_ops, isa);
}

static const rlai_kernels *ops_of(const rlai_kernels *k)
{
    if (k)
        return k;
    pthread_once(&g_default_once, init_default_ops);
    return &g_default_ops;
}

float rlai_vec_dot_f16_f32(rlai_kernels *k, int n, const uint16_t *a, const float *b)
{
    if (n <= 0)
        return 0.0f;
    return ops_of(k)->dot_f16(n, a, b);
}

void rlai_vec_mad_f16(rlai_kernels *k, int n, float *y, const uint16_t *x, float s)
{
    if (n > 0)
        ops_of(k)->mad_f16(n, y, x, s);
}

void rlai_f32_to_f16_row(rlai_kernels *k, const float *src, uint16_t *dst, int n)
{
    if (n > 0)
        ops_of(k)->to_f16(src, dst, n);
}

void rlai_attn_dot_f16(rlai_kernels *k, int n, int d, const uint16_t *rows, size_t stride,
                       const float *q, float scale, float *out)
{
    if (n > 0 && d > 0)
        ops_of(k)->attn_dot(n, d, rows, stride, q, scale, out);
}

void rlai_attn_mad_f16(rlai_kernels *k, int n, int d, const uint16_t *rows, size_t stride,
                       const float *p, float *y)
{
    if (n > 0 && d > 0)
        ops_of(k)->attn_mad(n, d, rows, stride, p, y);
}

void rlai_attn_dot_f16_multi(rlai_kernels *k, int m, int d, const uint16_t *rows, size_t stride, int nq,
                             const float *const *q, float scale, float *const *out)
{
    if (m > 0 && d > 0 && nq > 0)
        ops_of(k)->attn_dot_multi(m, d, rows, stride, nq, q, scale, out);
}

void rlai_attn_mad_f16_multi(rlai_kernels *k, int m, int d, const uint16_t *rows, size_t stride, int nq,
                             const int *mq, const float *const *p, float *const *y)
{
    if (m > 0 && d > 0 && nq > 0)
        ops_of(k)->attn_mad_multi(m, d, rows, stride, nq, mq, p, y);
}

float rlai_vec_exp_sum(rlai_kernels *k, int n, float *x, float max)
{
    return n > 0 ? ops_of(k)->exp_sum(n, x, max) : 0.0f;
}

void rlai_vec_swiglu(rlai_kernels *k, size_t n, float *gate, const float *up)
{
    if (n > 0)
        ops_of(k)->swiglu(n, gate, up);
}

const uint64_t rlai__expf_tab[32] = {
    0x3ff0000000000000u, 0x3fefd9b0d3158574u, 0x3fefb5586cf9890fu, 0x3fef9301d0125b51u,
    0x3fef72b83c7d517bu, 0x3fef54873168b9aau, 0x3fef387a6e756238u, 0x3fef1e9df51fdee1u,
    0x3fef06fe0a31b715u, 0x3feef1a7373aa9cbu, 0x3feedea64c123422u, 0x3feece086061892du,
    0x3feebfdad5362a27u, 0x3feeb42b569d4f82u, 0x3feeab07dd485429u, 0x3feea47eb03a5585u,
    0x3feea09e667f3bcdu, 0x3fee9f75e8ec5f74u, 0x3feea11473eb0187u, 0x3feea589994cce13u,
    0x3feeace5422aa0dbu, 0x3feeb737b0cdc5e5u, 0x3feec49182a3f090u, 0x3feed503b23e255du,
    0x3feee89f995ad3adu, 0x3feeff76f2fb5e47u, 0x3fef199bdd85529cu, 0x3fef3720dcef9069u,
    0x3fef5818dcfba487u, 0x3fef7c97337b9b5fu, 0x3fefa4afa2a490dau, 0x3fefd0765b6e4540u,
};

/* The scalar level calls libm's expf: on x86-64 glibc 2.28 and later that
 * is the SIMD levels' function (kernels_impl.h); elsewhere the scalar
 * level may differ from them in the last bit, as its other helpers would
 * without the canonical orders. */
void rlai__swiglu_scalar(size_t n, float *gate, const float *up)
{
    for (size_t i = 0; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void rlai__attn_dot_f16_scalar(int n, int d, const uint16_t *k, size_t stride, const float *q, float scale,
                               float *out)
{
    for (int j = 0; j < n; j++)
        out[j] = scale * rlai__dot_f16_f32_scalar(d, k + (size_t)j * stride, q);
}

void rlai__attn_mad_f16_scalar(int n, int d, const uint16_t *v, size_t stride, const float *p, float *y)
{
    for (int j = 0; j < n; j++)
        rlai__mad_f16_scalar(d, y, v + (size_t)j * stride, p[j]);
}

/* The scalar helpers below compute exactly what the AVX2 ones do (same
 * 8-lane accumulation order, same horizontal sum, same exp polynomial),
 * so that, together with the canonical matmul order, fast-mode results do
 * not depend on the ISA: otherwise a last-bit difference occasionally
 * moves an activation across a quantization rounding boundary and the
 * logits of the two ISAs differ by ~1% (tests/ref, ISA_FAST_TOL). */

/* hsum8 of kernels_avx2.c: (v0+v4 + v2+v6) + (v1+v5 + v3+v7). */
static float hsum8_ref(const float v[8])
{
    float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
    return (t0 + t2) + (t1 + t3);
}

/* exp256 of kernels_avx2.c for one lane (x <= 0: softmax inputs). */
static float exp_ref(float x)
{
    const float lo = -87.3f;
    bool under = x < lo;
    x = x > lo ? x : lo;                       /* _mm256_max_ps(x, lo): NaN -> lo */
    float kf = rintf(x * 1.44269504088896341f);
    float r = fmaf(-kf, 0.693145751953125f, x);
    r = fmaf(-kf, 1.428606765330187045e-06f, r);
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    /* _mm256_cvtps_epi32: out of range -> INT32_MIN (only for x > 88) */
    int32_t ki = kf < 2147483648.0f ? (int32_t)kf : INT32_MIN;
    uint32_t e = ((uint32_t)ki + 127u) << 23;
    float two_k;
    memcpy(&two_k, &e, sizeof two_k);
    return under ? 0.0f : p * two_k;
}

float rlai__exp_sum_scalar(int n, float *x, float max)
{
    float lanes[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; l++) {
            x[i + l] = exp_ref(x[i + l] - max);
            lanes[l] += x[i + l];
        }
    }
    float sum = hsum8_ref(lanes);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    return sum;
}

float rlai__dot_f16_f32_scalar(int n, const uint16_t *a, const float *b)
{
    float s0[8] = { 0 }, s1[8] = { 0 };
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int l = 0; l < 8; l++) {
            s0[l] = fmaf(rlai_fp16_to_f32(a[i + l]), b[i + l], s0[l]);
            s1[l] = fmaf(rlai_fp16_to_f32(a[i + 8 + l]), b[i + 8 + l], s1[l]);
        }
    }
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            s0[l] = fmaf(rlai_fp16_to_f32(a[i + l]), b[i + l], s0[l]);
    for (int l = 0; l < 8; l++)
        s0[l] += s1[l];
    float s = hsum8_ref(s0);
    for (; i < n; i++)
        s = fmaf(rlai_fp16_to_f32(a[i]), b[i], s);
    return s;
}

void rlai__mad_f16_scalar(int n, float *y, const uint16_t *x, float s)
{
    for (int i = 0; i < n; i++)
        y[i] = fmaf(s, rlai_fp16_to_f32(x[i]), y[i]);
}

void rlai__f32_to_f16_scalar(const float *src, uint16_t *dst, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = rlai_f32_to_fp16(src[i]);
}

/* ------------------------------------------------------------------ */
/* scalar reference kernels                                            */

void rlai__quant_act_scalar(const float *x, int64_t n, int8_t *q, float *ds)
{
    for (int64_t b = 0; b < n / RLAI_QK; b++, x += RLAI_QK, q += RLAI_QK) {
        float amax = 0.0f;
        for (int j = 0; j < RLAI_QK; j++) {
            float a = fabsf(x[j]);
            if (a > amax)
                amax = a;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < RLAI_QK; j++) {
            float v = x[j] * id;
            float r = v != v ? 0.0f : roundf(v);
            if (r > 127.0f) r = 127.0f;
            if (r < -127.0f) r = -127.0f;
            q[j] = (int8_t)r;
            sum += q[j];
        }
        ds[2 * b] = d;
        ds[2 * b + 1] = d * (float)sum;
    }
}

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Unpacks one weight row into integer values plus per-block d and m
 * (see the file comment for the convention). */
static void unpack_row_scalar(uint32_t type, const uint8_t *src, int64_t nb,
                              int8_t *wq, float *dw, float *mw)
{
    for (int64_t b = 0; b < nb; b++, wq += RLAI_QK) {
        float d, m = 0.0f;
        uint32_t qh = 0;
        const uint8_t *qs;
        switch (type) {
        case RLAI_DT_Q8_0:
            d = rlai_fp16_to_f32(ld16(src));
            memcpy(wq, src + 2, RLAI_QK);
            src += sizeof(rlai_block_q8_0);
            dw[b] = d;
            mw[b] = 0.0f;
            continue;
        case RLAI_DT_Q4_0:
            d = rlai_fp16_to_f32(ld16(src));
            m = -8.0f * d;
            qs = src + 2;
            src += sizeof(rlai_block_q4_0);
            break;
        case RLAI_DT_Q4_1:
            d = rlai_fp16_to_f32(ld16(src));
            m = rlai_fp16_to_f32(ld16(src + 2));
            qs = src + 4;
            src += sizeof(rlai_block_q4_1);
            break;
        case RLAI_DT_Q5_0:
            d = rlai_fp16_to_f32(ld16(src));
            m = -16.0f * d;
            qh = (uint32_t)src[2] | (uint32_t)src[3] << 8 | (uint32_t)src[4] << 16 |
                 (uint32_t)src[5] << 24;
            qs = src + 6;
            src += sizeof(rlai_block_q5_0);
            break;
        default: /* RLAI_DT_Q5_1 */
            d = rlai_fp16_to_f32(ld16(src));
            m = rlai_fp16_to_f32(ld16(src + 2));
            qh = (uint32_t)src[4] | (uint32_t)src[5] << 8 | (uint32_t)src[6] << 16 |
                 (uint32_t)src[7] << 24;
            qs = src + 8;
            src += sizeof(rlai_block_q5_1);
            break;
        }
        for (int j = 0; j < 16; j++) {
            wq[j] = (int8_t)((qs[j] & 0xF) | ((qh >> j) & 1u) << 4);
            wq[j + 16] = (int8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
        }
        dw[b] = d;
        mw[b] = m;
    }
}

void rlai__mm_scalar(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch)
{
    const int64_t cols = j->cols;

    if (!j->act) {
        float *buf = scratch;
        for (int64_t r = r0; r < r1; r++) {
            rlai_dequantize_row(j->type, j->w + (size_t)r * j->row_bytes, buf, cols);
            for (int t = t0; t < t1; t++) {
                const float *xt = j->x + (size_t)t * (size_t)j->ldx;
                double acc = 0.0;
                for (int64_t c = 0; c < cols; c++)
                    acc += (double)buf[c] * (double)xt[c];
                j->y[(size_t)t * (size_t)j->ldy + (size_t)r] = (float)acc;
            }
        }
        return;
    }

    const rlai_act *a = j->act;
    const int64_t nb = j->nb;
    const bool q8 = j->type == RLAI_DT_Q8_0;
    int8_t *wq = scratch;
    float *dw = (float *)((unsigned char *)scratch + ((size_t)cols + 63u) / 64u * 64u);
    float *mw = dw + nb;
    for (int64_t r = r0; r < r1; r++) {
        unpack_row_scalar(j->type, j->w + (size_t)r * j->row_bytes, nb, wq, dw, mw);
        for (int t = t0; t < t1; t++) {
            const int8_t *xq = a->q + (size_t)t * (size_t)cols;
            const float *ds = a->ds + (size_t)t * (size_t)nb * 2;
            /* the canonical sequence of kernels_avx2.c: bit-identical */
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t isum = 0;
                for (int e = 0; e < RLAI_QK; e++)
                    isum += (int32_t)wq[b * RLAI_QK + e] * (int32_t)xq[b * RLAI_QK + e];
                float sc = dw[b] * ds[2 * b];
                acc = fmaf((float)isum, sc, acc);
                if (!q8)
                    acc = fmaf(mw[b], ds[2 * b + 1], acc);
            }
            j->y[(size_t)t * (size_t)j->ldy + (size_t)r] = acc;
        }
    }
}
