/* test_kernels.c - rlai_matmul for every weight type x {precise, quantized}
 * x every available ISA x T in {1,3,17,64} x rows {37,200} x cols
 * {32,64,576}, single-threaded and with a 2-thread pool, against a
 * double-precision reference; SIMD vs scalar agreement; activation
 * quantizer bit-identity; f16 vector helpers; API edge cases; the AVX-512
 * VNNI kernels bitwise against the scalar reference; SwiGLU's SIMD expf
 * bitwise against libm's.
 *
 * Error measure: for an output y = sum_c w_c x_c we compare against
 * norm = sum_c |w_c x_c| (the condition-aware scale of a dot product).
 * Bounds (stated, checked):
 *   precise / float weights:  |y - ref| <= 1e-5 * norm
 *   quantized vs reference with the same quantized activations:
 *                             |y - ref_q| <= 2e-5 * norm_q
 *   quantized vs exact f32 reference: activation rounding is at most
 *   d_x/2 = amax_block(x)/254 per element, so
 *        |y - ref| <= sum_b (amax_b(x)/254) * sum_{c in b} |w_c| + 2e-5 * norm
 *   SIMD vs scalar of the same mode: |y_simd - y_scalar| <= 2e-5 * norm
 *   (i.e. well inside the 1e-4 relative agreement asked for).
 * Batch invariance (test_matmul_batch_invariance): bitwise equality of
 * each output across T, position in the batch, batch split and threads. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "kernels.h"
#include "kernels_impl.h"
#include "threadpool.h"

static uint64_t rng_state;
static uint64_t rnd64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static float rndf(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rnd64() >> 40) * (1.0 / 16777216.0));
}

static const uint32_t all_types[] = { RLAI_DT_F32, RLAI_DT_F16, RLAI_DT_BF16, RLAI_DT_Q4_0,
                                      RLAI_DT_Q4_1, RLAI_DT_Q5_0, RLAI_DT_Q5_1, RLAI_DT_Q8_0 };
#define N_TYPES (int)(sizeof all_types / sizeof all_types[0])

static int isa_list(rlai_isa out[3])
{
    unsigned m = rlai_kernels_available();
    int n = 0;
    const rlai_isa all[3] = { RLAI_ISA_SCALAR, RLAI_ISA_AVX2, RLAI_ISA_AVX512 };
    for (int i = 0; i < 3; i++)
        if (m & (1u << all[i]))
            out[n++] = all[i];
    return n;
}

/* Weights: random rows (some offset, one all-zero) quantized to type.
 * The data pointer is deliberately misaligned by one byte. */
typedef struct {
    uint8_t *alloc;
    rlai_weight w;
    float *deq;      /* rows x cols, dequantized */
} test_weight;

static void make_weight(test_weight *tw, uint32_t type, int64_t rows, int64_t cols)
{
    size_t rb = rlai_dtype_row_bytes(type, cols);
    tw->alloc = malloc(rb * (size_t)rows + 64);
    tw->deq = malloc(sizeof(float) * (size_t)(rows * cols));
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    ck_assert(tw->alloc && tw->deq && tmp);
    uint8_t *data = tw->alloc + 1;
    for (int64_t r = 0; r < rows; r++) {
        float off = r % 5 == 1 ? 0.7f : 0.0f;
        float sc = r % 7 == 3 ? 5.0f : 1.0f;
        for (int64_t c = 0; c < cols; c++)
            tmp[c] = r == 2 ? 0.0f : off + sc * rndf(-1.0f, 1.0f);
        rlai_quantize_row(type, tmp, data + (size_t)r * rb, cols);
        rlai_dequantize_row(type, data + (size_t)r * rb, tw->deq + r * cols, cols);
    }
    free(tmp);
    tw->w = (rlai_weight){ .type = type, .rows = rows, .cols = cols, .data = data };
}

static void free_weight(test_weight *tw)
{
    free(tw->alloc);
    free(tw->deq);
}

typedef struct {
    int T;
    int64_t cols, ldx;
    float *x;        /* T x ldx */
    float *xq;       /* T x cols: dequantized quantized activations */
    float *amax;     /* T x cols/32: block amax of x */
} test_act;

static void make_act(test_act *a, int T, int64_t cols)
{
    a->T = T;
    a->cols = cols;
    a->ldx = cols + 3;
    a->x = malloc(sizeof(float) * (size_t)(T * a->ldx));
    a->xq = malloc(sizeof(float) * (size_t)(T * cols));
    a->amax = malloc(sizeof(float) * (size_t)(T * (cols / 32 + 1)));
    int8_t *q = malloc((size_t)cols);
    float *ds = malloc(sizeof(float) * (size_t)(cols / 32 + 1) * 2);
    ck_assert(a->x && a->xq && a->amax && q && ds);
    for (int t = 0; t < T; t++) {
        float sc = t % 3 == 0 ? 1.0f : t % 3 == 1 ? 10.0f : 0.01f;
        float *xt = a->x + t * a->ldx;
        for (int64_t c = 0; c < a->ldx; c++)
            xt[c] = (t == 5) ? 0.0f : sc * rndf(-1.0f, 1.0f);   /* token 5: all zero */
        if (cols % 32 == 0) {
            rlai__quant_act_scalar(xt, cols, q, ds);
            for (int64_t c = 0; c < cols; c++)
                a->xq[t * cols + c] = ds[2 * (c / 32)] * (float)q[c];
            for (int64_t b = 0; b < cols / 32; b++) {
                float m = 0;
                for (int j = 0; j < 32; j++)
                    m = fmaxf(m, fabsf(xt[32 * b + j]));
                a->amax[t * (cols / 32) + b] = m;
            }
        }
    }
    free(q);
    free(ds);
}

static void free_act(test_act *a)
{
    free(a->x);
    free(a->xq);
    free(a->amax);
}

#define SENTINEL 12345.0f

/* Runs one configuration on every ISA with and without a pool. */
static void check_config(uint32_t type, bool precise, int T, int64_t rows, int64_t cols,
                         rlai_threadpool *tp2)
{
    test_weight tw;
    test_act a;
    make_weight(&tw, type, rows, cols);
    make_act(&a, T, cols);
    const bool quant = !precise && rlai__is_quant(type);
    const int64_t ldy = rows + 5;
    const int64_t nb = cols / 32;

    double *ref = malloc(sizeof(double) * (size_t)(T * rows));
    double *norm = malloc(sizeof(double) * (size_t)(T * rows));
    double *qbound = malloc(sizeof(double) * (size_t)(T * rows));
    float *y = malloc(sizeof(float) * (size_t)(T * ldy));
    float *yscalar = malloc(sizeof(float) * (size_t)(T * ldy));
    ck_assert(ref && norm && qbound && y && yscalar);

    for (int t = 0; t < T; t++) {
        for (int64_t r = 0; r < rows; r++) {
            const float *wr = tw.deq + r * cols;
            const float *xt = quant ? a.xq + t * cols : a.x + t * a.ldx;
            double s = 0, n = 0, qb = 0;
            for (int64_t c = 0; c < cols; c++) {
                s += (double)wr[c] * xt[c];
                n += fabs((double)wr[c] * xt[c]);
            }
            if (quant) {
                for (int64_t b = 0; b < nb; b++) {
                    double sw = 0;
                    for (int j = 0; j < 32; j++)
                        sw += fabs((double)wr[32 * b + j]);
                    qb += sw * a.amax[t * nb + b] / 254.0;
                }
            }
            ref[t * rows + r] = s;
            norm[t * rows + r] = n;
            qbound[t * rows + r] = qb * 1.001;
        }
    }

    rlai_isa isas[3];
    int n_isa = isa_list(isas);
    const double tol = quant ? 2e-5 : 1e-5;
    for (int ii = 0; ii < n_isa; ii++) {
        rlai_kernels *k = NULL;
        ck_assert_int_eq(rlai_kernels_new(isas[ii], precise, &k), RLAI_OK);
        for (int pi = 0; pi < 2; pi++) {
            rlai_threadpool *tp = pi ? tp2 : NULL;
            for (int64_t i = 0; i < T * ldy; i++)
                y[i] = SENTINEL;
            rlai_matmul(k, tp, &tw.w, a.x, a.ldx, T, y, ldy);
            for (int t = 0; t < T; t++) {
                for (int64_t r = 0; r < ldy; r++) {
                    float v = y[t * ldy + r];
                    if (r >= rows) {
                        ck_assert_msg(v == SENTINEL, "wrote past rows");
                        continue;
                    }
                    double rf = ref[t * rows + r], nm = norm[t * rows + r];
                    double err = fabs((double)v - rf);
                    ck_assert_msg(err <= tol * nm + 1e-30,
                                  "%s %s %s pool=%d T=%d rows=%ld cols=%ld t=%d r=%ld: y=%.9g ref=%.9g norm=%.3g",
                                  rlai_dtype_name(type), precise ? "precise" : "quant",
                                  rlai_isa_name(isas[ii]), pi, T, (long)rows, (long)cols, t, (long)r,
                                  (double)v, rf, nm);
                    if (quant) {
                        /* against the exact f32 product */
                        const float *wr = tw.deq + r * cols;
                        const float *xt = a.x + t * a.ldx;
                        double exact = 0, en = 0;
                        for (int64_t c = 0; c < cols; c++) {
                            exact += (double)wr[c] * xt[c];
                            en += fabs((double)wr[c] * xt[c]);
                        }
                        ck_assert_msg(fabs((double)v - exact) <= qbound[t * rows + r] + 2e-5 * en + 1e-30,
                                      "%s quant vs f32: y=%g exact=%g bound=%g", rlai_dtype_name(type),
                                      (double)v, exact, qbound[t * rows + r]);
                    }
                    if (ii == 0 && pi == 0) {
                        yscalar[t * ldy + r] = v;
                    } else {
                        double d = fabs((double)v - yscalar[t * ldy + r]);
                        ck_assert_msg(d <= tol * nm + 1e-30, "%s %s vs scalar: %g vs %g",
                                      rlai_dtype_name(type), rlai_isa_name(isas[ii]),
                                      (double)v, (double)yscalar[t * ldy + r]);
                    }
                }
            }
        }
        rlai_kernels_free(k);
    }
    free(ref);
    free(norm);
    free(qbound);
    free(y);
    free(yscalar);
    free_act(&a);
    free_weight(&tw);
}

/* One loop iteration per weight type (tcase_add_loop_test). */
START_TEST(test_matmul_type)
{
    uint32_t type = all_types[_i];
    rng_state = 0x1234567ull + (uint64_t)_i;
    rlai_threadpool *tp2 = NULL;
    ck_assert_int_eq(rlai_threadpool_new(2, &tp2), RLAI_OK);
    const int Ts[] = { 1, 3, 17, 64 };
    const int64_t rows_l[] = { 37, 200 };
    const int64_t cols_l[] = { 32, 64, 576 };
    for (int p = 0; p < 2; p++)
        for (int ti = 0; ti < 4; ti++)
            for (int ri = 0; ri < 2; ri++)
                for (int ci = 0; ci < 3; ci++)
                    check_config(type, p == 0, Ts[ti], rows_l[ri], cols_l[ci], tp2);
    rlai_threadpool_free(tp2);
}
END_TEST

/* Batch invariance: every output must be bit-identical whether its token
 * is computed alone (T = 1), inside a batch at any position, in batches
 * split differently, and with any thread count. For one (type, mode,
 * rows, cols) and every available ISA: a T = 13 batch, 13 separate T = 1
 * calls, 5 + 8 split, and the batch in reverse token order, each with a
 * 1-thread pool, a 2-thread pool and no pool; all memcmp-equal. In
 * quantized mode the results must also be equal across ISAs. T = 13 (and
 * 5, 8) take the AVX2 small-batch matvec; INV_T_BIG (and its 5 + 35
 * split) exceeds RLAI_MV_MAX_T and takes the tiled kernel. */
enum { INV_T = 13, INV_T_BIG = 40 };
_Static_assert(INV_T <= RLAI_MV_MAX_T && INV_T_BIG > RLAI_MV_MAX_T, "invariance T vs kernel ranges");

static void run_batch(rlai_kernels *k, rlai_threadpool *tp, const rlai_weight *w, const float *x,
                      int64_t ldx, int T, float *y, int64_t ldy)
{
    for (int64_t i = 0; i < (int64_t)T * ldy; i++)
        y[i] = SENTINEL;
    rlai_matmul(k, tp, w, x, ldx, T, y, ldy);
}

static void check_invariance_T(uint32_t type, bool precise, int64_t rows, int64_t cols, int T,
                               rlai_threadpool *tp1, rlai_threadpool *tp2)
{
    test_weight tw;
    make_weight(&tw, type, rows, cols);
    const int64_t ldx = cols + 3, ldy = rows + 5;
    float *x = malloc(sizeof(float) * (size_t)(T * ldx));
    float *xr = malloc(sizeof(float) * (size_t)(T * ldx));
    float *ref = malloc(sizeof(float) * (size_t)(T * ldy));
    float *y = malloc(sizeof(float) * (size_t)(T * ldy));
    ck_assert(x && xr && ref && y);
    for (int t = 0; t < T; t++) {
        float sc = t % 4 == 0 ? 1.0f : t % 4 == 1 ? 30.0f : t % 4 == 2 ? 0.003f : 2.5f;
        for (int64_t c = 0; c < ldx; c++)
            x[t * ldx + c] = t == 6 ? 0.0f : sc * rndf(-1.0f, 1.0f) + (t % 3 == 1 ? 0.2f * sc : 0.0f);
    }
    for (int t = 0; t < T; t++)   /* reversed token order */
        memcpy(xr + t * ldx, x + (T - 1 - t) * ldx, sizeof(float) * (size_t)ldx);

    rlai_isa isas[3];
    int n_isa = isa_list(isas);
    rlai_threadpool *pools[3] = { tp1, tp2, NULL };
    const bool quant = !precise && rlai__is_quant(type);
    float *yscalar = malloc(sizeof(float) * (size_t)(T * ldy));
    ck_assert(yscalar);
    for (int ii = 0; ii < n_isa; ii++) {
        rlai_kernels *k = NULL;
        ck_assert_int_eq(rlai_kernels_new(isas[ii], precise, &k), RLAI_OK);
        /* reference: the batch with the 1-thread pool */
        run_batch(k, tp1, &tw.w, x, ldx, T, ref, ldy);
        for (int t = 0; t < T; t++)
            for (int64_t r = 0; r < rows; r++)
                ck_assert(isfinite(ref[t * ldy + r]));
        /* quantized mode: every ISA follows the same canonical order, so
         * the results are also bit-identical across ISAs */
        if (quant && isas[ii] == RLAI_ISA_SCALAR)
            memcpy(yscalar, ref, sizeof(float) * (size_t)(T * ldy));
        else if (quant)
            for (int t = 0; t < T; t++)
                ck_assert_msg(memcmp(ref + t * ldy, yscalar + t * ldy, sizeof(float) * (size_t)rows) == 0,
                              "%s quant %s differs from scalar: rows=%ld cols=%ld t=%d",
                              rlai_dtype_name(type), rlai_isa_name(isas[ii]), (long)rows, (long)cols, t);
        for (int pi = 0; pi < 3; pi++) {
            rlai_threadpool *tp = pools[pi];
            for (int mode = 0; mode < 4; mode++) {
                if (mode == 0) {                 /* the whole batch */
                    run_batch(k, tp, &tw.w, x, ldx, T, y, ldy);
                } else if (mode == 1) {          /* one token at a time */
                    for (int t = 0; t < T; t++)
                        run_batch(k, tp, &tw.w, x + t * ldx, ldx, 1, y + t * ldy, ldy);
                } else if (mode == 2) {          /* 5 + (T - 5) */
                    run_batch(k, tp, &tw.w, x, ldx, 5, y, ldy);
                    run_batch(k, tp, &tw.w, x + 5 * ldx, ldx, T - 5, y + 5 * ldy, ldy);
                } else {                         /* reversed positions */
                    float *yr = malloc(sizeof(float) * (size_t)(T * ldy));
                    ck_assert(yr);
                    run_batch(k, tp, &tw.w, xr, ldx, T, yr, ldy);
                    for (int t = 0; t < T; t++)
                        memcpy(y + t * ldy, yr + (T - 1 - t) * ldy, sizeof(float) * (size_t)ldy);
                    free(yr);
                }
                for (int t = 0; t < T; t++) {
                    if (memcmp(y + t * ldy, ref + t * ldy, sizeof(float) * (size_t)rows) == 0)
                        continue;
                    int64_t r = 0;
                    while (memcmp(&y[t * ldy + r], &ref[t * ldy + r], sizeof(float)) == 0)
                        r++;
                    ck_abort_msg("batch invariance: %s %s %s pool=%d mode=%d rows=%ld cols=%ld t=%d r=%ld: "
                                 "%a vs batch %a", rlai_dtype_name(type), precise ? "precise" : "quant",
                                 rlai_isa_name(isas[ii]), pi, mode, (long)rows, (long)cols, t, (long)r,
                                 (double)y[t * ldy + r], (double)ref[t * ldy + r]);
                }
            }
        }
        rlai_kernels_free(k);
    }
    free(x);
    free(xr);
    free(ref);
    free(y);
    free(yscalar);
    free_weight(&tw);
}

static void check_invariance(uint32_t type, bool precise, int64_t rows, int64_t cols,
                             rlai_threadpool *tp1, rlai_threadpool *tp2)
{
    check_invariance_T(type, precise, rows, cols, INV_T, tp1, tp2);
}

/* One loop iteration per weight type. */
START_TEST(test_matmul_batch_invariance)
{
    uint32_t type = all_types[_i];
    rng_state = 0xBA7C4ull + (uint64_t)_i;
    rlai_threadpool *tp1 = NULL, *tp2 = NULL;
    ck_assert_int_eq(rlai_threadpool_new(1, &tp1), RLAI_OK);
    ck_assert_int_eq(rlai_threadpool_new(2, &tp2), RLAI_OK);
    const int64_t rows_l[] = { 37, 200 };
    const int64_t cols_l[] = { 576, 1536, 64 };
    for (int p = 0; p < 2; p++)
        for (int ri = 0; ri < 2; ri++)
            for (int ci = 0; ci < 3; ci++)
                check_invariance(type, p == 0, rows_l[ri], cols_l[ci], tp1, tp2);
    /* several matvec row chunks per thread; odd float-type columns */
    check_invariance(type, false, 1000, 576, tp1, tp2);
    /* the tiled T > 1 kernel (T above the small-batch range) */
    check_invariance_T(type, false, 37, 576, INV_T_BIG, tp1, tp2);
    if (!rlai__is_quant(type))
        check_invariance(type, true, 21, 37, tp1, tp2);
    rlai_threadpool_free(tp1);
    rlai_threadpool_free(tp2);
}
END_TEST

/* Shapes that stress the work split: many rows (several matvec chunks),
 * few rows with many tokens (token split), odd float-type columns. */
START_TEST(test_matmul_shapes)
{
    rng_state = 42;
    rlai_threadpool *tp2 = NULL;
    ck_assert_int_eq(rlai_threadpool_new(2, &tp2), RLAI_OK);
    check_config(RLAI_DT_Q4_1, false, 1, 1000, 576, tp2);
    check_config(RLAI_DT_Q8_0, false, 1, 1000, 576, tp2);
    check_config(RLAI_DT_Q4_1, false, 40, 20, 96, tp2);
    check_config(RLAI_DT_Q8_0, false, 9, 5, 64, tp2);
    check_config(RLAI_DT_Q5_1, false, 2, 3, 32, tp2);
    check_config(RLAI_DT_Q4_0, false, 8, 16, 1536, tp2);
    check_config(RLAI_DT_F32, false, 5, 7, 37, tp2);
    check_config(RLAI_DT_F16, true, 3, 9, 13, tp2);
    check_config(RLAI_DT_BF16, false, 1, 33, 1, tp2);
    check_config(RLAI_DT_Q4_1, true, 2, 1, 64, tp2);
    rlai_threadpool_free(tp2);
}
END_TEST

/* The SIMD activation quantizers (AVX2, AVX-512) must be bit-identical to
 * the scalar one (roundf ties away from zero, NaN -> 0, infinities, zero
 * blocks). */
START_TEST(test_quant_act_bitexact)
{
    rng_state = 7;
    if (!(rlai_kernels_available() & (1u << RLAI_ISA_AVX2)))
        return;
    enum { N = 32 * 40 };
    static float x[N];
    static int8_t q1[N], q2[N];
    static float ds1[N / 16], ds2[N / 16];
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < N; i++)
            x[i] = rndf(-1, 1) * (rep % 4 == 0 ? 1e-20f : rep % 4 == 1 ? 1e20f : 3.0f);
        /* ties: amax 127 gives id = 1, so k + 0.5 is an exact tie */
        for (int j = 0; j < 32; j++)
            x[j] = j == 0 ? 127.0f : (float)(j - 16) + 0.5f;
        for (int j = 32; j < 64; j++)
            x[j] = 0.0f;
        x[70] = NAN;
        x[100] = INFINITY;
        x[130] = -0.0f;
        /* the same past the AVX-512 level's groups of 16 blocks (40 = 2 x 16 + 8) */
        x[32 * 33 + 5] = NAN;
        x[32 * 35 + 9] = -INFINITY;
        for (int j = 32 * 37; j < 32 * 38; j++)
            x[j] = 0.0f;
        rlai__quant_act_scalar(x, N, q1, ds1);
        rlai__quant_act_avx2(x, N, q2, ds2);
        ck_assert(memcmp(q1, q2, N) == 0);
        ck_assert(memcmp(ds1, ds2, sizeof(float) * (N / 32) * 2) == 0);
        if (rlai_kernels_available() & (1u << RLAI_ISA_AVX512)) {
            memset(q2, 0x55, sizeof(q2));
            rlai__quant_act_avx512(x, N, q2, ds2);
            ck_assert(memcmp(q1, q2, N) == 0);
            ck_assert(memcmp(ds1, ds2, sizeof(float) * (N / 32) * 2) == 0);
        }
    }
    /* the tie handling itself */
    ck_assert_int_eq(q1[1], -15);   /* -14.5 -> -15 (away from zero) */
    ck_assert_int_eq(q1[20], 5);    /* 4.5 -> 5 */
}
END_TEST

START_TEST(test_get_row)
{
    rng_state = 99;
    for (int ti = 0; ti < N_TYPES; ti++) {
        test_weight tw;
        make_weight(&tw, all_types[ti], 5, 64);
        float row[64];
        for (int r = 0; r < 5; r++) {
            rlai_weight_get_row(&tw.w, r, row);
            ck_assert(memcmp(row, tw.deq + r * 64, sizeof row) == 0);
        }
        free_weight(&tw);
    }
}
END_TEST

START_TEST(test_api)
{
    unsigned m = rlai_kernels_available();
    ck_assert(m & (1u << RLAI_ISA_SCALAR));
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    ck_assert_int_eq(!!(m & (1u << RLAI_ISA_AVX2)), avx2);
    if (!__builtin_cpu_supports("avx512f"))
        ck_assert(!(m & (1u << RLAI_ISA_AVX512)));
    /* the AVX-512 level runs vpdpbusd: it must never be offered without VNNI */
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vnni");
    ck_assert_int_eq(!!(m & (1u << RLAI_ISA_AVX512)), avx512 && avx2);
#endif
    rlai_isa got = RLAI_ISA_AUTO;
    ck_assert_int_eq(rlai_kernels_resolve(RLAI_ISA_AUTO, &got), RLAI_OK);
    ck_assert(got != RLAI_ISA_AUTO && (m & (1u << got)));
    ck_assert_int_eq(rlai_kernels_resolve(RLAI_ISA_SCALAR, &got), RLAI_OK);
    ck_assert_int_eq(got, RLAI_ISA_SCALAR);
    if (!(m & (1u << RLAI_ISA_AVX512))) {
        ck_assert_int_eq(rlai_kernels_resolve(RLAI_ISA_AVX512, &got), RLAI_ERR_UNSUPPORTED);
        rlai_kernels *k = (rlai_kernels *)&got;
        ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_AVX512, false, &k), RLAI_ERR_UNSUPPORTED);
        ck_assert_ptr_null(k);
    }
    ck_assert_int_eq(rlai_kernels_resolve((rlai_isa)17, &got), RLAI_ERR_INVALID_ARG);
    ck_assert_str_eq(rlai_isa_name(RLAI_ISA_AVX2), "avx2");
    ck_assert_str_eq(rlai_isa_name(RLAI_ISA_SCALAR), "scalar");
    ck_assert_str_eq(rlai_isa_name(RLAI_ISA_AVX512), "avx512");
    ck_assert_str_eq(rlai_isa_name(RLAI_ISA_AUTO), "auto");
    ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_AUTO, false, NULL), RLAI_ERR_INVALID_ARG);
    rlai_kernels_free(NULL);

    rlai_kernels *k = NULL;
    ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_AUTO, false, &k), RLAI_OK);
    ck_assert_int_eq(rlai_kernels_reserve(k, 2, 1536, 512), RLAI_OK);
    ck_assert_int_eq(rlai_kernels_reserve(k, 0, 1536, 512), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_kernels_reserve(NULL, 1, 1, 1), RLAI_ERR_INVALID_ARG);
    /* invalid calls are ignored without touching y */
    float y[4] = { 1, 2, 3, 4 }, x[64] = { 0 };
    uint8_t wd[2 * 64 * 4] = { 0 };
    rlai_weight w = { .type = RLAI_DT_Q4_1, .rows = 2, .cols = 48, .data = wd };   /* 48 % 32 != 0 */
    rlai_matmul(k, NULL, &w, x, 64, 1, y, 4);
    w = (rlai_weight){ .type = 12, .rows = 2, .cols = 64, .data = wd };            /* unsupported */
    rlai_matmul(k, NULL, &w, x, 64, 1, y, 4);
    w = (rlai_weight){ .type = RLAI_DT_F32, .rows = 2, .cols = 64, .data = wd };
    rlai_matmul(k, NULL, &w, x, 32, 1, y, 4);                                      /* ldx < cols */
    rlai_matmul(k, NULL, &w, x, 64, 0, y, 4);                                      /* T = 0 */
    ck_assert(y[0] == 1 && y[1] == 2 && y[2] == 3 && y[3] == 4);
    rlai_matmul(k, NULL, &w, x, 64, 1, y, 4);                                      /* valid */
    ck_assert(y[0] == 0 && y[1] == 0 && y[2] == 3);
    rlai_kernels_free(k);

    /* the load-time packed layout exists only on the AVX-512 level, in the
     * quantized mode, for Q4_0 / Q4_1 / Q8_0 */
    w = (rlai_weight){ .type = RLAI_DT_Q4_1, .rows = 2, .cols = 64, .data = wd };
    ck_assert_uint_eq(rlai_kernels_packed_bytes(NULL, &w), 0);
    ck_assert_int_eq(rlai_kernels_pack(NULL, NULL, &w, wd, sizeof wd), RLAI_ERR_INVALID_ARG);
    for (int isa = RLAI_ISA_SCALAR; isa <= RLAI_ISA_AVX512; isa++) {
        if (!(m & (1u << isa)))
            continue;
        for (int precise = 0; precise < 2; precise++) {
            ck_assert_int_eq(rlai_kernels_new((rlai_isa)isa, precise, &k), RLAI_OK);
            ck_assert_int_eq(rlai_kernels_isa(k), isa);
            bool has = isa == RLAI_ISA_AVX512 && !precise;
            w.type = RLAI_DT_Q4_1;
            ck_assert_uint_eq(rlai_kernels_packed_bytes(k, &w), has ? 16 * 20 * 2 : 0);   /* 1 group of 16 rows x 2 blocks */
            w.type = RLAI_DT_Q5_1;
            ck_assert_uint_eq(rlai_kernels_packed_bytes(k, &w), 0);
            ck_assert_int_eq(rlai_kernels_pack(k, NULL, &w, NULL, 0), RLAI_ERR_UNSUPPORTED);
            rlai_kernels_free(k);
        }
    }
}
END_TEST

START_TEST(test_f16_helpers)
{
    rng_state = 3;
    rlai_isa isas[3];
    int n_isa = isa_list(isas);
    const int ns[] = { 1, 7, 8, 15, 16, 33, 100, 1000 };
    enum { MAXN = 1000 };
    static uint16_t h[MAXN], h2[MAXN];
    static float b[MAXN], f[MAXN], y1[MAXN], y2[MAXN];
    for (int ii = 0; ii < n_isa + 1; ii++) {
        rlai_kernels *k = NULL;   /* ii == n_isa: NULL context (auto) */
        if (ii < n_isa)
            ck_assert_int_eq(rlai_kernels_new(isas[ii], true, &k), RLAI_OK);
        for (int ni = 0; ni < 8; ni++) {
            int n = ns[ni];
            for (int i = 0; i < n; i++) {
                h[i] = rlai_f32_to_fp16(rndf(-2, 2));
                b[i] = rndf(-3, 3);
            }
            double ref = 0, nm = 0;
            for (int i = 0; i < n; i++) {
                ref += (double)rlai_fp16_to_f32(h[i]) * b[i];
                nm += fabs((double)rlai_fp16_to_f32(h[i]) * b[i]);
            }
            float d = rlai_vec_dot_f16_f32(k, n, h, b);
            ck_assert_msg(fabs(d - ref) <= 1e-5 * nm, "dot n=%d: %g vs %g", n, (double)d, ref);

            for (int i = 0; i < n; i++)
                y1[i] = y2[i] = rndf(-1, 1);
            rlai_vec_mad_f16(k, n, y1, h, 0.37f);
            for (int i = 0; i < n; i++)
                y2[i] = fmaf(0.37f, rlai_fp16_to_f32(h[i]), y2[i]);
            ck_assert(memcmp(y1, y2, sizeof(float) * (size_t)n) == 0);
        }
        /* conversion: bit-exact with the scalar reference, incl. specials */
        for (int i = 0; i < MAXN; i++) {
            uint32_t u = (uint32_t)rnd64();
            float v;
            switch (i % 5) {
            case 0: v = rndf(-70000, 70000); break;
            case 1: v = rndf(-1e-4f, 1e-4f); break;      /* subnormal halves */
            case 2: v = (float)(int)(rnd64() % 2048) * 0x1p-25f; break;   /* ties */
            case 3: memcpy(&v, &u, 4); if (v != v) v = 1.0f; break;
            default: v = rndf(-1, 1); break;
            }
            f[i] = v;
        }
        f[0] = INFINITY;
        f[1] = -INFINITY;
        f[2] = 65520.0f;
        f[3] = -0.0f;
        f[4] = NAN;
        rlai_f32_to_f16_row(k, f, h2, MAXN);
        for (int i = 0; i < MAXN; i++) {
            uint16_t want = rlai_f32_to_fp16(f[i]);
            if (isnan(f[i]))
                ck_assert((h2[i] & 0x7C00) == 0x7C00 && (h2[i] & 0x3FF));
            else
                ck_assert_msg(h2[i] == want, "f=%a: %04x vs %04x", (double)f[i], h2[i], want);
        }
        rlai_kernels_free(k);
    }
}
END_TEST

/* Attention helpers: every ISA agrees with a double-precision reference,
 * and exp_sum matches expf to 1e-6 relative over the softmax input range. */
START_TEST(test_attn_helpers)
{
    enum { N = 37, D = 64, STRIDE = 3 * 64 };
    uint16_t rows[N * STRIDE];
    float q[D], p[N];
    uint32_t s = 7;
    for (int i = 0; i < N * STRIDE; i++) {
        s = s * 1664525u + 1013904223u;
        rows[i] = rlai_f32_to_fp16(((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f);
    }
    for (int i = 0; i < D; i++)
        q[i] = sinf((float)i);
    for (int j = 0; j < N; j++)
        p[j] = 1.0f / (1.0f + (float)j);
    double ref_dot[N], ref_y[D] = { 0 };
    for (int j = 0; j < N; j++) {
        double a = 0;
        for (int i = 0; i < D; i++) {
            double v = rlai_fp16_to_f32(rows[j * STRIDE + i]);
            a += v * q[i];
            ref_y[i] += p[j] * v;
        }
        ref_dot[j] = 0.125 * a;
    }
    rlai_isa isas[3] = { RLAI_ISA_SCALAR, RLAI_ISA_AVX2, RLAI_ISA_AVX512 };
    for (int k = 0; k < 3; k++) {
        if (!(rlai_kernels_available() & (1u << isas[k])))
            continue;
        rlai_kernels *kc;
        ck_assert_int_eq(rlai_kernels_new(isas[k], false, &kc), 0);
        float out[N], y[D];
        rlai_attn_dot_f16(kc, N, D, rows, STRIDE, q, 0.125f, out);
        for (int j = 0; j < N; j++)
            ck_assert_msg(fabs(out[j] - ref_dot[j]) < 1e-4 * (1 + fabs(ref_dot[j])), "dot %d isa %d", j, k);
        for (int i = 0; i < D; i++)
            y[i] = 0;
        rlai_attn_mad_f16(kc, N, D, rows, STRIDE, p, y);
        for (int i = 0; i < D; i++)
            ck_assert_msg(fabs(y[i] - ref_y[i]) < 1e-4 * (1 + fabs(ref_y[i])), "mad %d isa %d", i, k);
        float x[203], x0[203];
        for (int i = 0; i < 203; i++)
            x0[i] = x[i] = -90.0f + 0.45f * (float)i;   /* -90 .. 1 */
        float sum = rlai_vec_exp_sum(kc, 203, x, 1.0f);
        double ref_sum = 0;
        for (int i = 0; i < 203; i++) {
            double e = exp((double)(x0[i] - 1.0f));   /* same float subtraction */
            ref_sum += e;
            ck_assert_msg(fabs(x[i] - e) <= 1e-6 * e + 1e-37, "exp(%g) = %g, want %g", (double)x0[i] - 1, (double)x[i], e);
        }
        ck_assert(fabs(sum - ref_sum) < 1e-5 * ref_sum);
        rlai_kernels_free(kc);
    }
}
END_TEST

/* The several-query attention helpers share a block's conversion between
 * queries, but each query's results are bit-identical to the one-query
 * helper's (and so to the scalar reference), for every ISA, head size,
 * block length (above 16 too), query count and per-query row limit. */
START_TEST(test_attn_multi_identical)
{
    enum { MAXD = 272, NR = 21, NQ = 5 };
    static uint16_t rows[NR * MAXD];
    static float q[NQ][MAXD], o1[NR], om[NQ][NR], y1[MAXD], ym[NQ][MAXD], p[NQ][NR];
    rng_state = 23;
    for (int i = 0; i < NR * MAXD; i++)
        rows[i] = rlai_f32_to_fp16(rndf(-2, 2));
    for (int a = 0; a < NQ; a++) {
        for (int i = 0; i < MAXD; i++)
            q[a][i] = rndf(-3, 3);
        for (int j = 0; j < NR; j++)
            p[a][j] = rndf(0, 1);
    }
    rlai_kernels *ref = NULL;
    ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_SCALAR, false, &ref), RLAI_OK);
    const rlai_isa isas[3] = { RLAI_ISA_SCALAR, RLAI_ISA_AVX2, RLAI_ISA_AVX512 };
    const int ds[] = { 8, 16, 24, 40, 64, 100, 128, 136, 256 };
    const int ms[] = { 1, 3, 4, 5, 16, 21 };
    for (int ii = 0; ii < 3; ii++) {
        if (!(rlai_kernels_available() & (1u << isas[ii])))
            continue;
        rlai_kernels *k = NULL;
        ck_assert_int_eq(rlai_kernels_new(isas[ii], false, &k), RLAI_OK);
        for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
                for (int nq = 1; nq <= NQ; nq++) {
                    int d = ds[di], m = ms[mi];
                    const float *qs[NQ], *ps[NQ];
                    float *outs[NQ], *ys[NQ];
                    int mq[NQ];
                    for (int a = 0; a < nq; a++) {
                        qs[a] = q[a];
                        ps[a] = p[a];
                        outs[a] = om[a];
                        ys[a] = ym[a];
                        mq[a] = a == 0 ? m : (a * 7 + m) % (m + 1);   /* 0..m rows per query */
                        for (int i = 0; i < d; i++)
                            ym[a][i] = q[a][i];
                    }
                    rlai_attn_dot_f16_multi(k, m, d, rows, MAXD, nq, qs, 0.125f, outs);
                    rlai_attn_mad_f16_multi(k, m, d, rows, MAXD, nq, mq, ps, ys);
                    for (int a = 0; a < nq; a++) {
                        rlai_attn_dot_f16(ref, m, d, rows, MAXD, q[a], 0.125f, o1);
                        ck_assert_msg(memcmp(o1, om[a], sizeof(float) * (size_t)m) == 0,
                                      "dot_multi %s d=%d m=%d nq=%d query %d", rlai_isa_name(isas[ii]), d, m, nq, a);
                        for (int i = 0; i < d; i++)
                            y1[i] = q[a][i];
                        rlai_attn_mad_f16(ref, mq[a], d, rows, MAXD, p[a], y1);
                        ck_assert_msg(memcmp(y1, ym[a], sizeof(float) * (size_t)d) == 0,
                                      "mad_multi %s d=%d m=%d nq=%d query %d (%d rows)", rlai_isa_name(isas[ii]), d,
                                      m, nq, a, mq[a]);
                    }
                }
        rlai_kernels_free(k);
    }
    rlai_kernels_free(ref);
}
END_TEST

/* The scalar attention helpers compute exactly what the SIMD ones do
 * (same lane order, same exp polynomial), so fast-mode logits do not
 * depend on the ISA. */
START_TEST(test_helpers_isa_identical)
{
    if (!(rlai_kernels_available() & (1u << RLAI_ISA_AVX2)))
        return;
    const rlai_isa simd[2] = { RLAI_ISA_AVX2, RLAI_ISA_AVX512 };
    for (int si = 0; si < 2; si++) {
        if (!(rlai_kernels_available() & (1u << simd[si])))
            continue;
        rng_state = 11;
        rlai_kernels *ks = NULL, *ka = NULL;
        ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_SCALAR, false, &ks), RLAI_OK);
        ck_assert_int_eq(rlai_kernels_new(simd[si], false, &ka), RLAI_OK);
        enum { MAXD = 272, NR = 21 };
        static uint16_t rows[NR * MAXD];
        static float q[MAXD], o1[NR], o2[NR], e1[300], e2[300], m1[MAXD], m2[MAXD], pj[NR];
        for (int i = 0; i < NR * MAXD; i++)
            rows[i] = rlai_f32_to_fp16(rndf(-2, 2));
        for (int i = 0; i < MAXD; i++)
            q[i] = rndf(-3, 3);
        for (int j = 0; j < NR; j++)
            pj[j] = rndf(0, 1);
        const int ds[] = { 1, 7, 8, 16, 24, 40, 64, 100, 128, 136, 256, 272 };
        for (int di = 0; di < 12; di++) {
            int d = ds[di];
            rlai_attn_dot_f16(ks, NR, d, rows, MAXD, q, 0.125f, o1);
            rlai_attn_dot_f16(ka, NR, d, rows, MAXD, q, 0.125f, o2);
            ck_assert_msg(memcmp(o1, o2, sizeof o1) == 0, "attn_dot %s d=%d", rlai_isa_name(simd[si]), d);
            float a = rlai_vec_dot_f16_f32(ks, d, rows, q), b = rlai_vec_dot_f16_f32(ka, d, rows, q);
            ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "dot d=%d", d);
            for (int i = 0; i < d; i++)
                m1[i] = m2[i] = q[i];
            rlai_attn_mad_f16(ks, NR, d, rows, MAXD, pj, m1);
            rlai_attn_mad_f16(ka, NR, d, rows, MAXD, pj, m2);
            ck_assert_msg(memcmp(m1, m2, sizeof(float) * (size_t)d) == 0, "attn_mad %s d=%d",
                          rlai_isa_name(simd[si]), d);
        }
        const int ns[] = { 1, 7, 8, 9, 64, 203, 300 };
        for (int ni = 0; ni < 7; ni++) {
            int n = ns[ni];
            for (int i = 0; i < n; i++)
                e1[i] = e2[i] = i % 17 == 3 ? -100.0f : rndf(-30, 0.5f);
            float s1 = rlai_vec_exp_sum(ks, n, e1, 0.5f), s2 = rlai_vec_exp_sum(ka, n, e2, 0.5f);
            ck_assert_msg(memcmp(&s1, &s2, sizeof s1) == 0 && memcmp(e1, e2, sizeof(float) * (size_t)n) == 0,
                          "exp_sum n=%d", n);
        }
        rlai_kernels_free(ks);
        rlai_kernels_free(ka);
    }
}
END_TEST

/* The AVX-512 VNNI kernels (kernels_avx512.c) against the scalar
 * reference, bitwise: every T across the matvec, small-batch and prefill
 * ranges (and the 8-token passes' remainders), row counts around the
 * 16-row groups, rows whose byte length is not a multiple of 16 (the
 * masked tail chunk), weights that end exactly at the end of their
 * allocation (ASan catches a read past it), extreme values (Q8_0 -128 and
 * 127, nibbles 0 and 15, saturated activations), no pool and a 2-thread
 * pool. On a CPU without AVX-512 VNNI the test checks that the level is
 * refused. */
/* Changes the quants of row 0, block 0 in a packed group (every byte of
 * its lane in the first 4 planes: 16 or 32 weights), or undoes that. */
static void flip_row0_block0(void *pk)
{
    for (int q = 0; q < 4; q++)
        for (int e = 0; e < 4; e++)
            ((uint8_t *)pk)[q * 64 + e] ^= 0x11;
}

static void check_avx512_exact(rlai_kernels *ks, rlai_kernels *kv, rlai_threadpool *tp2, uint32_t type,
                               int64_t rows, int64_t cols, int extreme)
{
    size_t rb = rlai_dtype_row_bytes(type, cols), bytes = rb * (size_t)rows;
    uint8_t *wd = malloc(bytes);   /* no slack: the last row ends the block */
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    ck_assert(wd && tmp);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            tmp[c] = (r % 3 == 1 ? 0.5f : 0.0f) + rndf(-1.0f, 1.0f) * (r % 5 == 2 ? 40.0f : 1.0f);
        rlai_quantize_row(type, tmp, wd + (size_t)r * rb, cols);
    }
    if (extreme) {   /* raw extreme quants, keeping the f16 scales */
        size_t bb = rlai_dtype_block_bytes(type), hdr = type == RLAI_DT_Q4_1 || type == RLAI_DT_Q5_1 ? 4 : 2;
        for (size_t o = 0; o + bb <= bytes; o += bb)
            for (size_t e = hdr; e < bb; e++)
                wd[o + e] = (uint8_t)(extreme == 1 ? (type == RLAI_DT_Q8_0 ? 0x80 : 0xFF)   /* -128 / 15,15 */
                                                   : (rnd64() & 1 ? 0x7F : 0x80));            /* 127 / -128 */
    }
    rlai_weight w = { .type = type, .rows = rows, .cols = cols, .data = wd };
    /* the same weight in the load-time packed layout (Q4_0 / Q4_1 / Q8_0),
     * allocated to its exact size (ASan catches a read past it) */
    rlai_weight wp = w;
    void *pk = NULL;
    size_t pkn = rlai_kernels_packed_bytes(kv, &w);
    bool packable = type == RLAI_DT_Q4_0 || type == RLAI_DT_Q4_1 || type == RLAI_DT_Q8_0;
    ck_assert_int_eq(pkn > 0, packable);
    if (packable) {
        size_t group = ((size_t)(cols / 32) * rlai_dtype_block_bytes(type) * 16 + 63) / 64 * 64;
        ck_assert_uint_eq(pkn, (size_t)(rows + 15) / 16 * group);
        pk = aligned_alloc(64, pkn);
        ck_assert(pk);
        ck_assert_int_eq(rlai_kernels_pack(kv, NULL, &w, pk, pkn - 1), RLAI_ERR_INVALID_ARG);
        ck_assert_int_eq(rlai_kernels_pack(kv, tp2, &w, pk, pkn), RLAI_OK);
        void *pk1 = aligned_alloc(64, pkn);   /* on one thread: the same bytes */
        ck_assert(pk1);
        ck_assert_int_eq(rlai_kernels_pack(kv, NULL, &w, pk1, pkn), RLAI_OK);
        ck_assert(memcmp(pk, pk1, pkn) == 0);
        free(pk1);
        wp.packed = pk;
        wp.packed_isa = RLAI_ISA_AVX512;
        /* rows read back from the packed copy (get_rows of a packed
         * embedding table): the same values as from the GGUF rows */
        float *ra = malloc(sizeof(float) * (size_t)cols), *rb2 = malloc(sizeof(float) * (size_t)cols);
        ck_assert(ra && rb2);
        for (int64_t r = 0; r < rows; r++) {
            rlai_weight_get_row(&w, r, ra);
            rlai_weight_get_row(&wp, r, rb2);
            ck_assert_msg(memcmp(ra, rb2, sizeof(float) * (size_t)cols) == 0, "%s get_row %ld from the packed copy",
                          rlai_dtype_name(type), (long)r);
        }
        free(ra);
        free(rb2);
    } else {
        ck_assert_int_eq(rlai_kernels_pack(kv, NULL, &w, wd, bytes), RLAI_ERR_UNSUPPORTED);
    }
    enum { MAXT = 40 };
    const int64_t ldx = cols + 1, ldy = rows + 3;
    float *x = malloc(sizeof(float) * (size_t)(MAXT * ldx));
    float *y1 = malloc(sizeof(float) * (size_t)(MAXT * ldy)), *y2 = malloc(sizeof(float) * (size_t)(MAXT * ldy));
    ck_assert(x && y1 && y2);
    for (int t = 0; t < MAXT; t++)
        for (int64_t c = 0; c < ldx; c++)
            x[t * ldx + c] = extreme && t % 2 ? (c % 2 ? 127.0f : -127.0f) * (t % 4 == 1 ? 1.0f : 1e-3f)
                                              : rndf(-1.0f, 1.0f) * (t % 3 == 2 ? 50.0f : 1.0f);
    const int Ts[] = { 1, 2, 7, 8, 9, 16, 17, 31, 32, 33, MAXT };
    for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
        int T = Ts[ti];
        rlai_matmul(ks, NULL, &w, x, ldx, T, y1, ldy);
        for (int pi = 0; pi < (pk ? 4 : 2); pi++) {   /* pool: pi odd; packed weights: pi >= 2 */
            for (int64_t i = 0; i < (int64_t)T * ldy; i++)
                y2[i] = SENTINEL;
            rlai_matmul(kv, pi % 2 ? tp2 : NULL, pi >= 2 ? &wp : &w, x, ldx, T, y2, ldy);
            for (int t = 0; t < T; t++) {
                for (int64_t r = 0; r < ldy; r++) {
                    float a = y1[t * ldy + r], b = y2[t * ldy + r];
                    if (r >= rows) {
                        ck_assert_msg(b == SENTINEL, "avx512 wrote past rows");
                        continue;
                    }
                    ck_assert_msg(memcmp(&a, &b, sizeof a) == 0,
                                  "%s avx512 vs scalar: rows=%ld cols=%ld T=%d pool=%d extreme=%d t=%d r=%ld: %a vs %a",
                                  rlai_dtype_name(type), (long)rows, (long)cols, T, pi, extreme, t, (long)r,
                                  (double)b, (double)a);
                }
            }
        }
    }
    if (pk) {
        /* the packed copy is what the kernel reads: change its first
         * block's quants and the first row's output changes with it, at
         * one token and in the prefill path */
        for (int T = 1; T <= MAXT; T += MAXT - 1) {
            rlai_matmul(kv, NULL, &wp, x, ldx, T, y1, ldy);
            flip_row0_block0(pk);
            rlai_matmul(kv, NULL, &wp, x, ldx, T, y2, ldy);
            flip_row0_block0(pk);
            ck_assert_msg(y1[0] != y2[0], "%s T=%d rows=%ld cols=%ld extreme=%d: the packed weights were not read (%a)", rlai_dtype_name(type), T, (long)rows, (long)cols, extreme, (double)y1[0]);
        }
        /* packed for another level: ignored */
        wp.packed_isa = RLAI_ISA_AVX2;
        rlai_matmul(kv, NULL, &w, x, ldx, 1, y1, ldy);
        flip_row0_block0(pk);
        rlai_matmul(kv, NULL, &wp, x, ldx, 1, y2, ldy);
        ck_assert(memcmp(y1, y2, sizeof(float) * (size_t)rows) == 0);
    }
    free(pk);
    free(x);
    free(y1);
    free(y2);
    free(tmp);
    free(wd);
}

START_TEST(test_avx512_vnni_exact)
{
    rng_state = 0x512ull;
    if (!(rlai_kernels_available() & (1u << RLAI_ISA_AVX512))) {
        rlai_kernels *k = NULL;
        ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_AVX512, false, &k), RLAI_ERR_UNSUPPORTED);
        fprintf(stderr, "test_avx512_vnni_exact: no AVX-512 VNNI on this CPU, kernels not run\n");
        return;
    }
    rlai_kernels *ks = NULL, *kv = NULL;
    rlai_threadpool *tp2 = NULL;
    ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_SCALAR, false, &ks), RLAI_OK);
    ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_AVX512, false, &kv), RLAI_OK);
    ck_assert_int_eq(rlai_threadpool_new(2, &tp2), RLAI_OK);
    const uint32_t types[] = { RLAI_DT_Q4_0, RLAI_DT_Q4_1, RLAI_DT_Q8_0, RLAI_DT_Q5_0, RLAI_DT_Q5_1 };
    const int64_t rows_l[] = { 1, 15, 16, 17, 50 };
    const int64_t cols_l[] = { 32, 64, 96, 160, 576 };
    for (int ty = 0; ty < 5; ty++) {
        for (int ri = 0; ri < 5; ri++)
            for (int ci = 0; ci < 5; ci++)
                check_avx512_exact(ks, kv, tp2, types[ty], rows_l[ri], cols_l[ci], 0);
        check_avx512_exact(ks, kv, tp2, types[ty], 33, 1536, 0);
        check_avx512_exact(ks, kv, tp2, types[ty], 300, 64, 0);   /* several groups per work item */
        check_avx512_exact(ks, kv, tp2, types[ty], 17, 96, 1);
        check_avx512_exact(ks, kv, tp2, types[ty], 17, 160, 2);
    }
    rlai_threadpool_free(tp2);
    rlai_kernels_free(ks);
    rlai_kernels_free(kv);
}
END_TEST

/* rlai_matmul_n: several weights on one input give, bit for bit, what
 * separate rlai_matmul calls give, whatever the ISA, thread count and T
 * (decode, a 9-row verification, a tiled batch), both when the input is
 * quantized once for all (same type and width) and when the types differ
 * (separate calls). Outputs are checked in full, sentinel-filled first. */
START_TEST(test_matmul_n_identical)
{
    const int64_t cols = 96, ldx = cols + 3;
    const int64_t rows[3] = { 40, 24, 24 };
    const int Ts[] = { 1, 2, 9, 40 };
    const uint32_t sets[2][3] = { { RLAI_DT_Q4_1, RLAI_DT_Q4_1, RLAI_DT_Q4_1 },
                                  { RLAI_DT_Q4_1, RLAI_DT_Q8_0, RLAI_DT_F16 } };
    rlai_threadpool *tp2 = NULL;
    ck_assert_int_eq(rlai_threadpool_new(2, &tp2), RLAI_OK);
    rlai_isa isas[3];
    int n_isa = isa_list(isas);
    for (int si = 0; si < 2; si++) {
        test_weight tw[3];
        for (int i = 0; i < 3; i++)
            make_weight(&tw[i], sets[si][i], rows[i], cols);
        const rlai_weight *w[3] = { &tw[0].w, &tw[1].w, &tw[2].w };
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            float *x = malloc(sizeof(float) * (size_t)(T * ldx));
            ck_assert(x);
            for (int64_t i = 0; i < T * ldx; i++)
                x[i] = rndf(-2.0f, 2.0f);
            for (int ii = 0; ii < n_isa; ii++) {
                rlai_kernels *k = NULL;
                ck_assert_int_eq(rlai_kernels_new(isas[ii], false, &k), RLAI_OK);
                for (int pi = 0; pi < 2; pi++) {
                    rlai_threadpool *tp = pi ? tp2 : NULL;
                    float *ref[3], *got[3];
                    int64_t ldy[3];
                    for (int i = 0; i < 3; i++) {
                        ldy[i] = rows[i] + 2;
                        ref[i] = malloc(sizeof(float) * (size_t)(T * ldy[i]));
                        got[i] = malloc(sizeof(float) * (size_t)(T * ldy[i]));
                        ck_assert(ref[i] && got[i]);
                        for (int64_t j = 0; j < T * ldy[i]; j++)
                            ref[i][j] = got[i][j] = SENTINEL;
                        rlai_matmul(k, tp, w[i], x, ldx, T, ref[i], ldy[i]);
                    }
                    rlai_matmul_n(k, tp, w, 3, x, ldx, T, got, ldy);
                    for (int i = 0; i < 3; i++) {
                        ck_assert_msg(memcmp(ref[i], got[i], sizeof(float) * (size_t)(T * ldy[i])) == 0,
                                      "set %d weight %d (%s) T=%d isa %s threads %d differs", si, i,
                                      rlai_dtype_name(sets[si][i]), T, rlai_isa_name(isas[ii]), pi ? 2 : 1);
                        ck_assert(isfinite(got[i][0]) && got[i][rows[i]] == SENTINEL);
                        free(ref[i]);
                        free(got[i]);
                    }
                }
                rlai_kernels_free(k);
            }
            free(x);
        }
        for (int i = 0; i < 3; i++)
            free_weight(&tw[i]);
    }
    rlai_threadpool_free(tp2);
}
END_TEST

/* What the scalar level and builds before rlai_vec_swiglu computed. */
static float swiglu_libm(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

static bool same_float(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

/* rlai_vec_swiglu on every level, and its expf, bit for bit against libm
 * (glibc's expf: kernels_impl.h) over every 997th float bit pattern, the
 * special values and the edges of the polynomial range, at every start
 * offset of a 16-lane vector and with ragged tails. RLAI_TEST_EXHAUSTIVE=1
 * sweeps all 2^32 patterns instead (about a minute). */
START_TEST(test_swiglu_exact)
{
    const uint64_t stride = getenv("RLAI_TEST_EXHAUSTIVE") ? 1 : 997;
    rlai_isa isas[3];
    int n_isa = isa_list(isas);
    rlai_kernels *k[3];
    for (int ii = 0; ii < n_isa; ii++)
        ck_assert_int_eq(rlai_kernels_new(isas[ii], false, &k[ii]), RLAI_OK);
    enum { CH = 4099 };
    float *in = malloc(CH * sizeof *in), *up = malloc(CH * sizeof *up), *g = malloc(CH * sizeof *g);
    ck_assert(in && up && g);
    rng_state = 0x5117u;
    long checked = 0;
    /* the specials and edges first, then the sweep */
    const float edge[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
                           0x1p-149f, -0x1p-149f, 1.0f, -1.0f, 88.0f, -88.0f, 103.0f, -103.0f };
    int n_edge = 0;
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        in[n_edge++] = edge[i];
    const float bound[] = { RLAI_EXPF_LO, RLAI_EXPF_HI, -RLAI_EXPF_LO, -RLAI_EXPF_HI };
    for (int b = 0; b < 4; b++) {
        in[n_edge++] = bound[b];
        in[n_edge++] = nextafterf(bound[b], INFINITY);
        in[n_edge++] = nextafterf(bound[b], -INFINITY);
    }
    uint64_t pat = 0;
    bool first = true;
    while (first || pat < 0x100000000ull) {
        int n = first ? n_edge : 0;
        for (; n < CH && pat < 0x100000000ull; n++, pat += stride) {
            uint32_t b = (uint32_t)pat;
            memcpy(&in[n], &b, sizeof b);
        }
        for (int i = 0; i < n; i++) {
            /* mostly plain values for up, some zeros and negatives */
            uint64_t r = rnd64();
            up[i] = (r & 15) == 0 ? 0.0f : (float)((int64_t)(r >> 40) - (1 << 23)) / (float)(1 << 22);
            float want = expf(in[i]);
            if (!same_float(rlai__expf_ref(in[i]), want))   /* (a ck_assert per value is slow) */
                ck_abort_msg("expf(%a): %a, libm %a", (double)in[i], (double)rlai__expf_ref(in[i]),
                             (double)want);
        }
        for (int ii = 0; ii < n_isa; ii++) {
            int off = (int)(pat / stride % 16);   /* a different lane alignment each chunk */
            int len = n - off;
            memcpy(g, in + off, (size_t)len * sizeof *g);
            rlai_vec_swiglu(k[ii], (size_t)len, g, up + off);
            for (int i = 0; i < len; i++)
                if (!same_float(g[i], swiglu_libm(in[off + i], up[off + i])))
                    ck_abort_msg("%s: swiglu(%a, %a) = %a, libm gives %a", rlai_isa_name(isas[ii]),
                                 (double)in[off + i], (double)up[off + i], (double)g[i],
                                 (double)swiglu_libm(in[off + i], up[off + i]));
            checked += len;
        }
        first = false;
    }
    ck_assert_int_gt(checked, (long)n_isa * 4000000);
    free(in);
    free(up);
    free(g);
    for (int ii = 0; ii < n_isa; ii++)
        rlai_kernels_free(k[ii]);
}
END_TEST

static Suite *kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_api);
    tcase_add_test(tc, test_get_row);
    tcase_add_test(tc, test_quant_act_bitexact);
    tcase_add_test(tc, test_f16_helpers);
    tcase_add_test(tc, test_attn_helpers);
    tcase_add_test(tc, test_attn_multi_identical);
    tcase_add_test(tc, test_helpers_isa_identical);
    tcase_add_test(tc, test_swiglu_exact);
    suite_add_tcase(s, tc);
    TCase *mm = tcase_create("matmul");
    tcase_set_timeout(mm, 600);
    tcase_add_loop_test(mm, test_matmul_type, 0, N_TYPES);
    tcase_add_test(mm, test_matmul_shapes);
    tcase_add_loop_test(mm, test_matmul_batch_invariance, 0, N_TYPES);
    tcase_add_test(mm, test_avx512_vnni_exact);
    tcase_add_test(mm, test_matmul_n_identical);
    suite_add_tcase(s, mm);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(kernels_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
