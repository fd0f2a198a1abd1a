/* kernels_impl.h - private interface between kernels.c (dispatch, threads,
 * scratch) and the per-ISA kernel files kernels_avx2.c / kernels_avx512.c.
 * Not part of the engine's public contract; tests may include it to check
 * the activation quantizers directly.
 *
 * Quantized activations ("act"): every token row of x is quantized per
 * 32-element block to int8 with the Q8_0 reference rule (d = amax/127,
 * q = roundf(x/d) clamped to [-127, 127]) but the block scale d and the
 * block sum s = d * sum(q) are kept as f32, not f16 (more accurate than
 * ggml's Q8_0/Q8_1 and free of per-block half conversions). s is what
 * Q8_1 carries; it serves the min term of Q4_1/Q5_1 and the -8/-16 offset
 * of Q4_0/Q5_0, whose nibbles the SIMD code uses as unsigned values. */
#ifndef RLAI_KERNELS_IMPL_H
#define RLAI_KERNELS_IMPL_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "dtype.h"
#include "kernels.h"

#define RLAI_ROW_TILE   16   /* rows per work unit; multiple of the 4-row tile */
#define RLAI_TOK_PAD    8    /* activations are padded to this many tokens */
#ifndef RLAI_MV_MAX_T
#define RLAI_MV_MAX_T   32   /* T up to this: small-batch matvec (no tiles) */
#endif
#ifndef RLAI_MV_NT
#define RLAI_MV_NT      8    /* tokens per small-batch matvec pass */
#endif

typedef struct rlai_act {
    int T;           /* valid tokens */
    int Tpad;        /* T rounded up to RLAI_TOK_PAD; padding rows are zero */
    int64_t cols;    /* elements per token (multiple of 32) */
    int64_t nb;      /* cols / 32 */
    int8_t *q;       /* [Tpad][cols] */
    float *ds;       /* [Tpad][nb][2]: {d, s = d * sum(q)} per block */
    /* Tile layout used by the AVX2 T>1 kernels, for token group g of 8:
     * dv[(g*nb + b)*8 + i] = d of token 8g+i, sv[...] = its s (padding
     * tokens: 0). NULL when not built. */
    float *dv;
    float *sv;
    /* Integer block sums of q, qsum[t*nb + b] = sum_e q[t][b][e] (padding
     * tokens: 0): built for the AVX-512 level with Q8_0 weights, whose
     * VNNI kernel biases the weights to unsigned (see kernels_avx512.c).
     * NULL when not built. */
    int32_t *qsum;
} rlai_act;

typedef struct rlai_mm_job {
    uint32_t type;          /* weight dtype */
    int64_t rows, cols, nb; /* nb = cols/32 for quant types */
    const uint8_t *w;       /* weight rows, row_bytes apart */
    size_t row_bytes;
    const uint8_t *wp;      /* the rows in the packed layout (below), or
                             * NULL; set only for the level that packed them
                             * and the quantized path */
    const float *x;         /* f32 activations (f32 path) */
    int64_t ldx;
    const rlai_act *act;    /* quantized activations; NULL = f32 path */
    float *y;
    int64_t ldy;
    int T;
    bool vnni;              /* AVX-512 VNNI usable (always true on the
                             * AVX-512 level, which requires it) */
} rlai_mm_job;

/* Packed weights (rlai_kernels_pack; the AVX-512 level's load-time
 * layout of Q4_0 / Q4_1 / Q8_0 rows). Rows are taken 16 at a time; group
 * g (rows 16g..16g+15, the last group's missing rows repeat its last row)
 * starts at g * rlai__pk_group_bytes(type, nb), a multiple of 64, and
 * holds, for its nb blocks of 32 columns:
 *  - planes, at b * rlai__pk_plane_bytes(type): nplanes x 64 bytes; byte
 *    4i + e of plane q = byte 4q + e of row i's block b quants (Q4: the
 *    16 nibble-pair bytes, 4 planes; Q8_0: the 32 int8, 8 planes), i.e.
 *    the dword-transposed "raw planes" the AVX-512 kernel otherwise builds
 *    on every call;
 *  - headers, at nb * plane_bytes + b * rlai__pk_hdr_bytes(type): the 16
 *    rows' f16 d (32 bytes), then for Q4_1 their f16 m (32 bytes);
 *  - zero padding up to the next multiple of 64.
 * The same bytes per block as the GGUF rows (16 x 18, 20 or 34). */
#define RLAI_PK_ROWS 16
static inline bool rlai__pk_type(uint32_t t)
{
    return t == RLAI_DT_Q4_0 || t == RLAI_DT_Q4_1 || t == RLAI_DT_Q8_0;
}
static inline size_t rlai__pk_plane_bytes(uint32_t t) { return t == RLAI_DT_Q8_0 ? 512u : 256u; }
static inline size_t rlai__pk_hdr_bytes(uint32_t t) { return t == RLAI_DT_Q4_1 ? 64u : 32u; }
static inline size_t rlai__pk_group_bytes(uint32_t t, int64_t nb)
{
    size_t n = (size_t)nb * (rlai__pk_plane_bytes(t) + rlai__pk_hdr_bytes(t));
    return (n + 63u) & ~(size_t)63u;
}

/* Per-thread scratch bytes the mm functions may use for a job with `cols`. */
static inline size_t rlai__scratch_bytes(int64_t cols)
{
    return (size_t)cols * 64u + 4096u;   /* 16 rows of f32 */
}

/* True for the block-quantized weight types (integer path available). */
static inline bool rlai__is_quant(uint32_t t)
{
    return t == RLAI_DT_Q4_0 || t == RLAI_DT_Q4_1 || t == RLAI_DT_Q5_0 ||
           t == RLAI_DT_Q5_1 || t == RLAI_DT_Q8_0;
}

/* Computes y for rows [r0, r1) and tokens [t0, t1). r0 is a multiple of
 * RLAI_ROW_TILE, t0 a multiple of RLAI_TOK_PAD; scratch is 64-byte
 * aligned, rlai__scratch_bytes. Batch invariance: y[t][r] must not depend
 * on T, t0/t1, r0/r1 or the thread (see kernels_avx2.c). */
typedef void (*rlai_mm_fn)(const rlai_mm_job *j, int64_t r0, int64_t r1,
                           int t0, int t1, void *scratch);
/* Quantizes one token row (n % 32 == 0) into q (n bytes) and ds (n/32 pairs). */
typedef void (*rlai_qact_fn)(const float *x, int64_t n, int8_t *q, float *ds);

void rlai__mm_scalar(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch);
void rlai__mm_avx2(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch);
void rlai__mm_avx512(const rlai_mm_job *j, int64_t r0, int64_t r1, int t0, int t1, void *scratch);

void rlai__quant_act_scalar(const float *x, int64_t n, int8_t *q, float *ds);
void rlai__quant_act_avx2(const float *x, int64_t n, int8_t *q, float *ds);
void rlai__quant_act_avx512(const float *x, int64_t n, int8_t *q, float *ds);

float rlai__dot_f16_f32_scalar(int n, const uint16_t *a, const float *b);
void rlai__mad_f16_scalar(int n, float *y, const uint16_t *x, float s);
void rlai__f32_to_f16_scalar(const float *src, uint16_t *dst, int n);
float rlai__dot_f16_f32_avx2(int n, const uint16_t *a, const float *b);
void rlai__mad_f16_avx2(int n, float *y, const uint16_t *x, float s);
void rlai__f32_to_f16_avx2(const float *src, uint16_t *dst, int n);

void rlai__attn_dot_f16_scalar(int n, int d, const uint16_t *k, size_t stride, const float *q, float scale, float *out);
void rlai__attn_mad_f16_scalar(int n, int d, const uint16_t *v, size_t stride, const float *p, float *y);
float rlai__exp_sum_scalar(int n, float *x, float max);
void rlai__attn_dot_f16_avx2(int n, int d, const uint16_t *k, size_t stride, const float *q, float scale, float *out);
void rlai__attn_mad_f16_avx2(int n, int d, const uint16_t *v, size_t stride, const float *p, float *y);
void rlai__attn_dot_f16_multi_avx2(int m, int d, const uint16_t *k, size_t stride, int nq, const float *const *q,
                                   float scale, float *const *out);
void rlai__attn_mad_f16_multi_avx2(int m, int d, const uint16_t *v, size_t stride, int nq, const int *mq,
                                   const float *const *p, float *const *y);
float rlai__exp_sum_avx2(int n, float *x, float max);
void rlai__attn_dot_f16_avx512(int n, int d, const uint16_t *k, size_t stride, const float *q, float scale, float *out);
void rlai__attn_mad_f16_avx512(int n, int d, const uint16_t *v, size_t stride, const float *p, float *y);
void rlai__attn_dot_f16_multi_avx512(int m, int d, const uint16_t *k, size_t stride, int nq,
                                     const float *const *q, float scale, float *const *out);
void rlai__attn_mad_f16_multi_avx512(int m, int d, const uint16_t *v, size_t stride, int nq, const int *mq,
                                     const float *const *p, float *const *y);

/* ---- SwiGLU, gate[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + e^-x).
 * The SIMD levels compute e^-x with the algorithm of glibc's expf (glibc
 * 2.28 and later; the variant x86-64 glibc selects on CPUs with FMA), in
 * double precision as it does: x * 32/ln2 = k + r (|r| <= 1/2, rounded by
 * adding 1.5 * 2^52), 2^(k/32) from a 32-entry table plus k's high bits in
 * the exponent, 2^(r/32) by a cubic, one rounding to float at the end.
 * Every float input gives glibc's expf bit for bit (all 2^32 inputs were
 * compared: tests/test_kernels.c, RLAI_TEST_EXHAUSTIVE=1), so the SIMD
 * levels, the scalar level (which calls expf) and earlier builds agree and
 * greedy outputs do not change. The scalar form below is what the SIMD
 * code does per lane; its fma() calls are instructions only in the files
 * built with -mfma (kernels_avx2.c, kernels_avx512.c). The bounds and
 * coefficients are glibc's (sysdeps/ieee754/flt-32, from Arm's optimized
 * routines); the table was generated here from exp2l and is the same. */
#define RLAI_EXPF_LO (-0x1.9fe368p6f)  /* below: 0 (glibc's underflow bound) */
#define RLAI_EXPF_HI 0x1.62e42ep6f     /* above: +inf (overflow) */
#define RLAI_EXPF_INVLN2N (0x1.71547652b82fep0 * 32)
#define RLAI_EXPF_SHIFT 0x1.8p52
#define RLAI_EXPF_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define RLAI_EXPF_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define RLAI_EXPF_C2 (0x1.62e42ff0c52d6p-1 / 32)
/* bits(2^(i/32)) - (i << 47): adding k << 47 to entry k % 32 gives the
 * bits of 2^(k/32) (k's high bits land in the exponent). */
extern const uint64_t rlai__expf_tab[32];

static inline float rlai__expf_ref(float x)
{
    if (x != x)
        return x + x;
    if (x > RLAI_EXPF_HI)
        return __builtin_inff();
    if (x < RLAI_EXPF_LO)
        return 0.0f;
    double xd = (double)x;
    double kd = __builtin_fma(RLAI_EXPF_INVLN2N, xd, RLAI_EXPF_SHIFT);
    uint64_t ki;
    __builtin_memcpy(&ki, &kd, sizeof ki);
    kd -= RLAI_EXPF_SHIFT;
    double r = __builtin_fma(RLAI_EXPF_INVLN2N, xd, -kd);
    uint64_t t = rlai__expf_tab[ki % 32] + (ki << 47);
    double s;
    __builtin_memcpy(&s, &t, sizeof s);
    double p = __builtin_fma(RLAI_EXPF_C0, r, RLAI_EXPF_C1);
    double r2 = r * r;
    double y = __builtin_fma(RLAI_EXPF_C2, r, 1.0);
    y = __builtin_fma(p, r2, y);
    return (float)(y * s);
}

/* n elements, any n; gate and up may not overlap. */
void rlai__swiglu_scalar(size_t n, float *gate, const float *up);
void rlai__swiglu_avx2(size_t n, float *gate, const float *up);
void rlai__swiglu_avx512(size_t n, float *gate, const float *up);

#endif
