/* test_backend_ops.c - every op of every backend against a reference (the
 * idea of llama.cpp's test-backend-ops).
 *
 * Backends under test: the CPU backend at every instruction-set level this
 * machine has (scalar, avx2, avx512) in both precision modes, plus the CUDA
 * backend when rlai_backend_open("cuda") succeeds here (it does not on a
 * machine without the module, a driver and a GPU; the test says so). The
 * CUDA backend runs every op under the precise-mode bounds below and on
 * every KV cache type; get_rows must be bit-identical there too.
 *
 * References: a double-precision implementation of each op written here,
 * and, for the quantized matmul, the scalar CPU backend of the same mode.
 * Bounds (stated, checked):
 *   elementwise ops (add, add_row, swiglu, rope, get_rows, rmsnorm):
 *       |y - ref| <= 1e-5 * (|ref| + 1)       (f32 rounding of one op)
 *   matmul, precise mode vs double ref:       |y - ref| <= 1e-5 * sum|w x|
 *       (CUDA, f32 activations, float accumulation: 3e-5 * sum|w x|)
 *   matmul, 8-bit-activation mode: <= 2e-2 * sum|w x| of the exact product
 *       (activation rounding); quantized weights, CPU ISA vs scalar:
 *       bit-identical (the kernels' batch/ISA invariance); float weights
 *       (f32/f16/bf16), CPU ISA vs scalar: <= 2e-5 * sum|w x|
 *   kv_store: the stored row read back equals the input rounded to the
 *       cache type (f32 exact; f16 <= 2^-11 relative; q8_0 <= amax/127)
 *   attention vs double softmax over the stored rows (cache rounding
 *       excluded): |y - ref| <= 1e-4 * max|v| + 1e-6
 *   argmax: exact, lowest index on ties.
 *   batch invariance (matmul on every backend, attention on the f16 cache
 *       on the CPU's default mode and CUDA): a row computed in a batch is
 *       bit-identical to the row computed alone.
 * Shapes are random (seeded, printed on failure) over all weight types. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "kernels.h"
#include "kv_cache.h"
#include "threadpool.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static float frand(void) { return (float)((rnd64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }
static int irand(int lo, int hi) { return lo + (int)(rnd64() % (uint64_t)(hi - lo + 1)); }

static const uint32_t wtypes[] = { RLAI_DT_F32, RLAI_DT_F16, RLAI_DT_BF16, RLAI_DT_Q4_0, RLAI_DT_Q4_1,
                                   RLAI_DT_Q5_0, RLAI_DT_Q5_1, RLAI_DT_Q8_0 };
#define N_WTYPES (int)(sizeof(wtypes) / sizeof(wtypes[0]))

/* ---------------------------------------------------------------- fixture */

typedef struct bk {
    char name[48];
    rlai_isa isa;
    bool precise;
    rlai_kernels *k;
    rlai_threadpool *tp;
    rlai_backend *be;
    bool gpu;               /* the CUDA backend (k and tp are not its own) */
} bk;

#define MAX_BK 8
static bk bks[MAX_BK];
static int n_bk;
static const int MAX_CTX = 160;

static void open_all(void)
{
    n_bk = 0;
    unsigned avail = rlai_kernels_available();
    const rlai_isa isas[] = { RLAI_ISA_SCALAR, RLAI_ISA_AVX2, RLAI_ISA_AVX512 };
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < 3; i++) {
            if (!(avail & (1u << isas[i])))
                continue;
            bk *b = &bks[n_bk];
            memset(b, 0, sizeof(*b));
            b->isa = isas[i];
            b->precise = p == 1;
            snprintf(b->name, sizeof(b->name), "cpu/%s/%s", rlai_isa_name(b->isa), b->precise ? "precise" : "q8");
            ck_assert_int_eq(rlai_kernels_new(b->isa, b->precise, &b->k), 0);
            ck_assert_int_eq(rlai_threadpool_new(2, &b->tp), 0);
            ck_assert_int_eq(rlai_backend_cpu_new(b->k, b->tp, MAX_CTX, &b->be), 0);
            n_bk++;
        }
    }
    ck_assert_int_ge(n_bk, 2);   /* scalar in both modes at least */
    /* The CUDA backend, when it opens here (module built, found through
     * RLAI_BACKEND_DIR, a driver and a device). It computes with f32
     * activations, so it is checked against the precise-mode bounds, and on
     * every KV cache type. Without it the test says why and goes on. */
    rlai_backend_options o = { .device = "cuda", .kernels = bks[0].k, .pool = bks[0].tp, .max_ctx = MAX_CTX };
    char err[512];
    rlai_backend *cu = NULL;
    int rc = rlai_backend_open(&o, &cu, err, sizeof(err), NULL, 0);
    static bool said;
    if (rc == 0 && n_bk < MAX_BK) {
        bk *b = &bks[n_bk++];
        memset(b, 0, sizeof(*b));
        b->isa = RLAI_ISA_SCALAR;   /* not a CPU level; gpu marks it */
        b->precise = true;
        b->gpu = true;
        b->be = cu;
        snprintf(b->name, sizeof(b->name), "cuda");
        if (!said)
            printf("backend_ops: testing the CUDA backend: %s\n", cu->iface->describe(cu));
    } else {
        ck_assert_int_eq(rc, RLAI_ERR_UNSUPPORTED);
        ck_assert_ptr_null(cu);
        if (!said)
            printf("backend_ops: CUDA backend not tested: %s\n", err);
    }
    said = true;
}

static void close_all(void)
{
    for (int i = 0; i < n_bk; i++) {
        rlai_backend_free(bks[i].be);
        if (bks[i].gpu)
            continue;
        rlai_threadpool_free(bks[i].tp);
        rlai_kernels_free(bks[i].k);
    }
    n_bk = 0;
}

/* Backend memory holding a copy of host floats. */
static float *dev_copy(rlai_backend *be, const float *src, size_t n)
{
    void *p;
    ck_assert_int_eq(be->iface->buffer_alloc(be, n * sizeof(float), &p), 0);
    ck_assert_int_eq(be->iface->upload(be, p, 0, src, n * sizeof(float)), 0);
    return p;
}

static float *dev_zeros(rlai_backend *be, size_t n)
{
    void *p;
    ck_assert_int_eq(be->iface->buffer_alloc(be, n * sizeof(float), &p), 0);
    return p;
}

static void dev_read(rlai_backend *be, const float *d, float *host, size_t n)
{
    ck_assert_int_eq(be->iface->download(be, d, 0, host, n * sizeof(float)), 0);
}

static void check_close(const char *what, const char *bname, const float *y, const double *ref, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)y[i] - ref[i]);
        ck_assert_msg(err <= tol * (fabs(ref[i]) + 1.0), "%s on %s: element %zu = %.9g, reference %.9g",
                      what, bname, i, (double)y[i], ref[i]);
    }
}

/* ---------------------------------------------------------------- ops */

START_TEST(test_elementwise)
{
    open_all();
    for (int iter = 0; iter < 20; iter++) {
        int n = irand(1, 9), d = 32 * irand(1, 6);
        size_t N = (size_t)n * d;
        float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *b = malloc(d * sizeof(float));
        float *out = malloc(N * sizeof(float));
        double *ref = malloc(N * sizeof(double));
        for (size_t i = 0; i < N; i++) { x[i] = frand() * 4; y[i] = frand() * 4; }
        for (int j = 0; j < d; j++) b[j] = frand();
        for (int bi = 0; bi < n_bk; bi++) {
            rlai_backend *be = bks[bi].be;
            const rlai_backend_i *I = be->iface;
            /* add */
            float *dx = dev_copy(be, x, N), *dy = dev_copy(be, y, N), *db = dev_copy(be, b, d);
            I->add(be, dx, dy, N);
            dev_read(be, dx, out, N);
            for (size_t i = 0; i < N; i++) ref[i] = (double)x[i] + y[i];
            check_close("add", bks[bi].name, out, ref, N, 1e-6);
            /* add_row */
            I->upload(be, dx, 0, x, N * sizeof(float));
            I->add_row(be, dx, db, n, d);
            dev_read(be, dx, out, N);
            for (size_t i = 0; i < N; i++) ref[i] = (double)x[i] + b[i % d];
            check_close("add_row", bks[bi].name, out, ref, N, 1e-6);
            /* swiglu */
            I->upload(be, dx, 0, x, N * sizeof(float));
            I->swiglu(be, dx, dy, N);
            dev_read(be, dx, out, N);
            for (size_t i = 0; i < N; i++) ref[i] = (double)x[i] / (1.0 + exp(-(double)x[i])) * y[i];
            check_close("swiglu", bks[bi].name, out, ref, N, 1e-5);
            /* rmsnorm, out of place */
            float *dn = dev_zeros(be, N);
            I->rmsnorm(be, dn, dy, db, n, d, 1e-5f);
            dev_read(be, dn, out, N);
            for (int r = 0; r < n; r++) {
                double ss = 0;
                for (int j = 0; j < d; j++) ss += (double)y[r * d + j] * y[r * d + j];
                double sc = 1.0 / sqrt(ss / d + 1e-5);
                for (int j = 0; j < d; j++) ref[r * d + j] = y[r * d + j] * sc * b[j];
            }
            check_close("rmsnorm", bks[bi].name, out, ref, N, 1e-5);
            I->buffer_free(be, dn);
            I->buffer_free(be, dx);
            I->buffer_free(be, dy);
            I->buffer_free(be, db);
        }
        free(x); free(y); free(b); free(out); free(ref);
    }
    close_all();
}
END_TEST

START_TEST(test_rope_both_modes)
{
    open_all();
    for (int iter = 0; iter < 12; iter++) {
        int n = irand(1, 7), H = irand(1, 4), D = 2 * irand(2, 16);
        int n_rot = 2 * irand(1, D / 2);
        rlai_rope_mode mode = iter % 2 ? RLAI_ROPE_NEOX : RLAI_ROPE_NORM;
        size_t N = (size_t)n * H * D;
        float *x = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float)), *out2 = malloc(N * sizeof(float));
        double *ref = malloc(N * sizeof(double));
        float inv[64], inv2[64];
        int32_t pos[8];
        for (int i = 0; i < n_rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / n_rot);
        for (int i = 0; i < n; i++) pos[i] = irand(0, 4000);
        for (size_t i = 0; i < N; i++) x[i] = frand();
        for (int i = 0; i < n; i++)
            for (int h = 0; h < H; h++) {
                const float *xr = x + ((size_t)i * H + h) * D;
                double *rr = ref + ((size_t)i * H + h) * D;
                for (int j = 0; j < D; j++) rr[j] = xr[j];
                for (int k = 0; k < n_rot / 2; k++) {
                    int i0 = mode == RLAI_ROPE_NEOX ? k : 2 * k, i1 = mode == RLAI_ROPE_NEOX ? k + n_rot / 2 : 2 * k + 1;
                    double a = (double)pos[i] * inv[k];
                    rr[i0] = xr[i0] * cos(a) - xr[i1] * sin(a);
                    rr[i1] = xr[i0] * sin(a) + xr[i1] * cos(a);
                }
            }
        for (int bi = 0; bi < n_bk; bi++) {
            rlai_backend *be = bks[bi].be;
            float *dx = dev_copy(be, x, N);
            be->iface->rope(be, dx, n, H, D, n_rot, mode, inv, pos);
            dev_read(be, dx, out, N);
            check_close(mode == RLAI_ROPE_NEOX ? "rope neox" : "rope norm", bks[bi].name, out, ref, N, 1e-5);
            /* the same positions again (the layers of one forward: the CPU
             * backend reuses its angles): bit-identical */
            be->iface->upload(be, dx, 0, x, N * sizeof(float));
            be->iface->rope(be, dx, n, H, D, n_rot, mode, inv, pos);
            dev_read(be, dx, out2, N);
            ck_assert_msg(memcmp(out, out2, N * sizeof(float)) == 0, "rope again differs on %s", bks[bi].name);
            /* the same positions with other frequencies in the same array:
             * not the old angles */
            for (int k = 0; k < n_rot / 2; k++) inv2[k] = inv[k];
            for (int k = 0; k < n_rot / 2; k++) inv[k] *= 0.5f;
            be->iface->upload(be, dx, 0, x, N * sizeof(float));
            be->iface->rope(be, dx, n, H, D, n_rot, mode, inv, pos);
            dev_read(be, dx, out2, N);
            for (int k = 0; k < n_rot / 2; k++) inv[k] = inv2[k];
            ck_assert_msg(memcmp(out, out2, N * sizeof(float)) != 0, "rope kept old angles on %s", bks[bi].name);
            be->iface->buffer_free(be, dx);
        }
        free(x); free(out); free(out2); free(ref);
    }
    close_all();
}
END_TEST

/* A random weight of `type`, rows x cols, plus its dequantized values. */
static void make_weight(uint32_t type, int rows, int cols, rlai_weight *w, float **deq)
{
    size_t rb = rlai_dtype_row_bytes(type, cols);
    char *data = malloc(rb * (size_t)rows);
    float *src = malloc(sizeof(float) * (size_t)cols);
    *deq = malloc(sizeof(float) * (size_t)rows * cols);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) src[c] = frand();
        rlai_quantize_row(type, src, data + rb * (size_t)r, cols);
        rlai_dequantize_row(type, data + rb * (size_t)r, *deq + (size_t)r * cols, cols);
    }
    free(src);
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->data = data;
}

/* The weight as backend `be` computes on it. */
static void weight_on(rlai_backend *be, const rlai_weight *host, rlai_weight *dev)
{
    if (be->iface->weight_upload)
        ck_assert_int_eq(be->iface->weight_upload(be, host, dev), 0);
    else
        *dev = *host;
}

static void weight_off(rlai_backend *be, rlai_weight *dev)
{
    if (be->iface->weight_upload && be->iface->weight_free)
        be->iface->weight_free(be, dev);
}

/* y (T x rows, host) = dw x (T x cols, host) on backend be. */
static void matmul_on(rlai_backend *be, const rlai_weight *dw, const float *x, int cols, int T, int rows, float *y)
{
    size_t NX = (size_t)T * cols, NY = (size_t)T * rows;
    float *dx = dev_copy(be, x, NX), *dy = dev_zeros(be, NY);
    be->iface->matmul(be, dw, dx, cols, T, dy, rows);
    dev_read(be, dy, y, NY);
    be->iface->buffer_free(be, dx);
    be->iface->buffer_free(be, dy);
}

START_TEST(test_matmul_all_types)
{
    open_all();
    const int Ts[] = { 1, 3, 17, 40 };
    for (int ti = 0; ti < N_WTYPES; ti++) {
        uint32_t type = wtypes[ti];
        int rows = irand(20, 90), cols = 32 * irand(1, 12);
        rlai_weight w;
        float *deq;
        make_weight(type, rows, cols, &w, &deq);
        for (int tt = 0; tt < 4; tt++) {
            int T = Ts[tt];
            size_t NX = (size_t)T * cols, NY = (size_t)T * rows;
            float *x = malloc(NX * sizeof(float)), *y = malloc(NY * sizeof(float));
            float *y_scalar[2] = { malloc(NY * sizeof(float)), malloc(NY * sizeof(float)) };
            double *ref = malloc(NY * sizeof(double)), *norm = malloc(NY * sizeof(double));
            for (size_t i = 0; i < NX; i++) x[i] = frand() * 2;
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows; r++) {
                    double s = 0, a = 0;
                    for (int c = 0; c < cols; c++) {
                        double p = (double)deq[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                        s += p;
                        a += fabs(p);
                    }
                    ref[(size_t)t * rows + r] = s;
                    norm[(size_t)t * rows + r] = a;
                }
            /* scalar first (bks is ordered scalar, avx2, avx512 per mode) */
            for (int bi = 0; bi < n_bk; bi++) {
                rlai_backend *be = bks[bi].be;
                rlai_weight dw;
                weight_on(be, &w, &dw);
                if (!bks[bi].gpu) {
                    /* the CPU computes on the mapping, plus the AVX-512
                     * level's packed copy of the types it packs */
                    ck_assert_ptr_eq(dw.data, w.data);
                    bool packs = bks[bi].isa == RLAI_ISA_AVX512 && !bks[bi].precise &&
                                 (type == RLAI_DT_Q4_0 || type == RLAI_DT_Q4_1 || type == RLAI_DT_Q8_0);
                    ck_assert_int_eq(dw.packed != NULL, packs);
                }
                matmul_on(be, &dw, x, cols, T, rows, y);
                int mode = bks[bi].precise;
                if (bks[bi].isa == RLAI_ISA_SCALAR && !bks[bi].gpu)
                    memcpy(y_scalar[mode], y, NY * sizeof(float));
                for (size_t i = 0; i < NY; i++) {
                    if (mode) {
                        double tol = bks[bi].gpu ? 3e-5 : 1e-5;
                        ck_assert_msg(fabs(y[i] - ref[i]) <= tol * norm[i] + 1e-6,
                                      "matmul %s T=%d on %s: [%zu] %.9g vs %.9g", rlai_dtype_name(type), T,
                                      bks[bi].name, i, (double)y[i], ref[i]);
                    } else {
                        /* 8-bit activations: within the activation rounding of the exact product */
                        ck_assert_msg(fabs(y[i] - ref[i]) <= 2e-2 * norm[i] + 1e-5,
                                      "matmul %s T=%d on %s: [%zu] %.9g vs %.9g", rlai_dtype_name(type), T,
                                      bks[bi].name, i, (double)y[i], ref[i]);
                        bool quant = type != RLAI_DT_F32 && type != RLAI_DT_F16 && type != RLAI_DT_BF16;
                        if (!quant) {
                            ck_assert_msg(fabs(y[i] - y_scalar[0][i]) <= 2e-5 * norm[i] + 1e-6,
                                          "matmul %s T=%d on %s: [%zu] %.9g vs scalar %.9g",
                                          rlai_dtype_name(type), T, bks[bi].name, i, (double)y[i],
                                          (double)y_scalar[0][i]);
                            continue;
                        }
                        ck_assert_msg(memcmp(&y[i], &y_scalar[0][i], sizeof(float)) == 0,
                                      "matmul %s T=%d on %s: [%zu] %.9g differs from scalar %.9g",
                                      rlai_dtype_name(type), T, bks[bi].name, i, (double)y[i],
                                      (double)y_scalar[0][i]);
                    }
                }
                weight_off(be, &dw);
            }
            free(x); free(y); free(y_scalar[0]); free(y_scalar[1]); free(ref); free(norm);
        }
        /* get_rows of the same weight: exact dequantized rows */
        int32_t ids[5];
        for (int i = 0; i < 5; i++) ids[i] = irand(0, rows - 1);
        float *out = malloc(sizeof(float) * 5 * (size_t)cols);
        for (int bi = 0; bi < n_bk; bi++) {
            rlai_backend *be = bks[bi].be;
            rlai_weight dw;
            weight_on(be, &w, &dw);
            float *d = dev_zeros(be, 5 * (size_t)cols);
            be->iface->get_rows(be, &dw, ids, 5, d);
            dev_read(be, d, out, 5 * (size_t)cols);
            for (int i = 0; i < 5; i++)
                ck_assert_msg(memcmp(out + (size_t)i * cols, deq + (size_t)ids[i] * cols, sizeof(float) * cols) == 0,
                              "get_rows %s on %s: row %d differs", rlai_dtype_name(type), bks[bi].name, ids[i]);
            be->iface->buffer_free(be, d);
            weight_off(be, &dw);
        }
        free(out);
        free((void *)w.data);
        free(deq);
    }
    close_all();
}
END_TEST

/* Batch invariance of matmul (with the attention's below, what makes
 * speculative decoding exact and a sequence's output independent of the
 * others decoding beside it): each token of a T-token call gives the same
 * bits as the token multiplied alone (T = 1), for T shaped like a
 * verification (pending token + 8 drafts = 9, two sequences' = 18) and
 * like prefill chunks (40, 70), on every weight type and every backend:
 * the CPU at each level in both modes, and CUDA (one fixed per-output
 * instruction sequence whatever T, backend_cuda.cu k_matmul). */
START_TEST(test_matmul_batch_invariant)
{
    open_all();
    const int Ts[] = { 2, 9, 18, 40, 70 };
    for (int ti = 0; ti < N_WTYPES; ti++) {
        uint32_t type = wtypes[ti];
        int rows = irand(20, 90), cols = 32 * irand(1, 12);
        rlai_weight w;
        float *deq;
        make_weight(type, rows, cols, &w, &deq);
        for (int tt = 0; tt < (int)(sizeof(Ts) / sizeof(Ts[0])); tt++) {
            int T = Ts[tt];
            size_t NX = (size_t)T * cols;
            float *x = malloc(NX * sizeof(float)), *y = malloc((size_t)T * rows * sizeof(float));
            float *y1 = malloc((size_t)rows * sizeof(float));
            for (size_t i = 0; i < NX; i++) x[i] = frand() * 2;
            for (int bi = 0; bi < n_bk; bi++) {
                rlai_backend *be = bks[bi].be;
                rlai_weight dw;
                weight_on(be, &w, &dw);
                matmul_on(be, &dw, x, cols, T, rows, y);
                for (int t = 0; t < T; t++) {
                    matmul_on(be, &dw, x + (size_t)t * cols, cols, 1, rows, y1);
                    for (int r = 0; r < rows; r++)
                        ck_assert_msg(memcmp(&y[(size_t)t * rows + r], &y1[r], sizeof(float)) == 0,
                                      "matmul %s on %s: token %d of %d, row %d: %.9g, alone %.9g",
                                      rlai_dtype_name(type), bks[bi].name, t, T, r,
                                      (double)y[(size_t)t * rows + r], (double)y1[r]);
                }
                weight_off(be, &dw);
            }
            free(x); free(y); free(y1);
        }
        free((void *)w.data);
        free(deq);
    }
    close_all();
}
END_TEST

/* Paged attention: sequences with shuffled, non-contiguous block tables. */
START_TEST(test_kv_store_attention_paged)
{
    open_all();
    const uint32_t kvtypes[] = { RLAI_DT_F32, RLAI_DT_F16, RLAI_DT_Q8_0 };
    for (int kt = 0; kt < 3; kt++) {
        for (int iter = 0; iter < 3; iter++) {
            int HKV = irand(1, 2), group = irand(1, 3), H = HKV * group, D = 32 * irand(1, 2);
            int KVD = HKV * D, n_blocks = 24;
            int n_seq = 2;
            int len[2] = { irand(1, 70), irand(17, 90) };
            /* block tables: distinct random blocks */
            int32_t perm[24];
            for (int i = 0; i < n_blocks; i++) perm[i] = i;
            for (int i = n_blocks - 1; i > 0; i--) { int j = irand(0, i); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
            int32_t tables[2][8];
            int used = 0;
            for (int s = 0; s < n_seq; s++)
                for (int b = 0; b < (len[s] + 15) / 16; b++) tables[s][b] = perm[used++];
            int total = len[0] + len[1];
            float *k = malloc(sizeof(float) * (size_t)total * KVD), *v = malloc(sizeof(float) * (size_t)total * KVD);
            float *q = malloc(sizeof(float) * (size_t)total * H * D), *out = malloc(sizeof(float) * (size_t)total * H * D);
            int32_t *pos = malloc(sizeof(int32_t) * total);
            const int32_t **tab = malloc(sizeof(*tab) * total);
            for (int i = 0, s = 0, p = 0; i < total; i++, p++) {
                if (p == len[s]) { s++; p = 0; }
                pos[i] = p;
                tab[i] = tables[s];
            }
            for (size_t i = 0; i < (size_t)total * KVD; i++) { k[i] = frand(); v[i] = frand() * 3; }
            for (size_t i = 0; i < (size_t)total * H * D; i++) q[i] = frand() * 2;
            for (int bi = 0; bi < n_bk; bi++) {
                if ((kvtypes[kt] == RLAI_DT_F32) != bks[bi].precise && !bks[bi].gpu)
                    continue;   /* the engine pairs f32 KV with precise mode only (CPU) */
                rlai_backend *be = bks[bi].be;
                rlai_kv_cache *kv;
                ck_assert_int_eq(rlai_kv_cache_new_on(be, 1, KVD, n_blocks, kvtypes[kt], &kv), 0);
                rlai_kv_layer_view view;
                rlai_kv_cache_layer_view(kv, 0, &view.k, &view.v, &view.row_bytes);
                view.dtype = kvtypes[kt];
                view.kv_dim = KVD;
                /* store everything in one batch, then attend all rows (causal per sequence) */
                rlai_paged_rows rows = { total, pos, tab };
                float *dk = dev_copy(be, k, (size_t)total * KVD), *dv = dev_copy(be, v, (size_t)total * KVD);
                float *dq = dev_copy(be, q, (size_t)total * H * D), *dout = dev_zeros(be, (size_t)total * H * D);
                be->iface->kv_store(be, &view, &rows, dk, dv);
                be->iface->attention(be, &view, &rows, H, HKV, D, dq, dout);
                dev_read(be, dout, out, (size_t)total * H * D);
                /* read the stored rows back (host view of the pages) */
                size_t pages = (size_t)n_blocks * 16 * view.row_bytes;
                char *hk = malloc(pages), *hv = malloc(pages);
                ck_assert_int_eq(be->iface->download(be, view.k, 0, hk, pages), 0);
                ck_assert_int_eq(be->iface->download(be, view.v, 0, hv, pages), 0);
                float *sk = malloc(sizeof(float) * (size_t)total * KVD), *sv = malloc(sizeof(float) * (size_t)total * KVD);
                for (int i = 0; i < total; i++) {
                    size_t off = ((size_t)tab[i][pos[i] / 16] * 16 + pos[i] % 16) * view.row_bytes;
                    rlai_dequantize_row(kvtypes[kt], hk + off, sk + (size_t)i * KVD, KVD);
                    rlai_dequantize_row(kvtypes[kt], hv + off, sv + (size_t)i * KVD, KVD);
                    float amax = 0;
                    for (int j = 0; j < KVD; j++) amax = fmaxf(amax, fabsf(k[(size_t)i * KVD + j]));
                    for (int j = 0; j < KVD; j++) {
                        double e = fabs(sk[(size_t)i * KVD + j] - k[(size_t)i * KVD + j]);
                        double bound = kvtypes[kt] == RLAI_DT_F32 ? 0 : kvtypes[kt] == RLAI_DT_F16
                                       ? fabs(k[(size_t)i * KVD + j]) / 2048.0 + 6e-8 : amax / 127.0;
                        ck_assert_msg(e <= bound, "kv_store %s on %s: row %d [%d] %g vs %g",
                                      rlai_dtype_name(kvtypes[kt]), bks[bi].name, i, j,
                                      (double)sk[(size_t)i * KVD + j], (double)k[(size_t)i * KVD + j]);
                    }
                }
                /* double reference over the stored rows */
                for (int i = 0, base = 0; i < total; i++) {
                    if (pos[i] == 0) base = i;
                    for (int h = 0; h < H; h++) {
                        int kvh = h / group;
                        const float *qi = q + ((size_t)i * H + h) * D;
                        double sc[96], mx = -INFINITY, sum = 0, vmax = 0;
                        for (int j = 0; j <= pos[i]; j++) {
                            double s = 0;
                            for (int d = 0; d < D; d++) s += (double)qi[d] * sk[(size_t)(base + j) * KVD + kvh * D + d];
                            sc[j] = s / sqrt((double)D);
                            mx = fmax(mx, sc[j]);
                        }
                        for (int j = 0; j <= pos[i]; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                        for (int d = 0; d < D; d++) {
                            double r = 0;
                            for (int j = 0; j <= pos[i]; j++) {
                                double vv = sv[(size_t)(base + j) * KVD + kvh * D + d];
                                r += sc[j] / sum * vv;
                                vmax = fmax(vmax, fabs(vv));
                            }
                            double got = out[((size_t)i * H + h) * D + d];
                            ck_assert_msg(fabs(got - r) <= 1e-4 * vmax + 1e-6,
                                          "attention kv=%s on %s: row %d head %d [%d] %.8g vs %.8g",
                                          rlai_dtype_name(kvtypes[kt]), bks[bi].name, i, h, d, got, r);
                        }
                    }
                }
                free(hk); free(hv); free(sk); free(sv);
                be->iface->buffer_free(be, dk);
                be->iface->buffer_free(be, dv);
                be->iface->buffer_free(be, dq);
                be->iface->buffer_free(be, dout);
                rlai_kv_cache_free(kv);
            }
            free(k); free(v); free(q); free(out); free(pos); free(tab);
        }
    }
    close_all();
}
END_TEST

/* Batch invariance of the attention on the f16 cache, CPU and CUDA (what
 * makes speculative decoding exact): a batch shaped like verification steps --
 * several consecutive rows of one sequence (pending token + draft), single
 * rows of other sequences -- gives bit-identical outputs to attending each
 * row alone, whatever grouping of rows and grouped-query heads the backend
 * plans for the batch. */
START_TEST(test_attention_batch_invariant)
{
    open_all();
    for (int iter = 0; iter < 6; iter++) {
        int HKV = irand(1, 3), group = irand(1, 4), H = HKV * group, D = 32 * irand(1, 2);
        int KVD = HKV * D, n_blocks = 30;
        enum { NS = 3 };
        int len[NS] = { irand(20, 150), irand(1, 40), irand(8, 100) };   /* tokens stored */
        int tail[NS] = { irand(2, 8), 1, irand(1, 5) };                  /* rows attended */
        int32_t perm[30], tables[NS][10];
        for (int i = 0; i < n_blocks; i++) perm[i] = i;
        for (int i = n_blocks - 1; i > 0; i--) { int j = irand(0, i); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
        int used = 0, total = 0, n = 0;
        for (int s = 0; s < NS; s++) {
            for (int b = 0; b < (len[s] + 15) / 16; b++) tables[s][b] = perm[used++];
            total += len[s];
            n += tail[s];
        }
        float *k = malloc(sizeof(float) * (size_t)total * KVD), *v = malloc(sizeof(float) * (size_t)total * KVD);
        float *q = malloc(sizeof(float) * (size_t)n * H * D);
        float *batch = malloc(sizeof(float) * (size_t)n * H * D), *alone = malloc(sizeof(float) * (size_t)n * H * D);
        int32_t *spos = malloc(sizeof(int32_t) * total), *pos = malloc(sizeof(int32_t) * n);
        const int32_t **stab = malloc(sizeof(*stab) * total), **tab = malloc(sizeof(*tab) * n);
        for (int s = 0, i = 0, r = 0; s < NS; s++)
            for (int p = 0; p < len[s]; p++, i++) {
                spos[i] = p;
                stab[i] = tables[s];
                if (p >= len[s] - tail[s]) {
                    pos[r] = p;
                    tab[r++] = tables[s];
                }
            }
        for (size_t i = 0; i < (size_t)total * KVD; i++) { k[i] = frand(); v[i] = frand() * 3; }
        for (size_t i = 0; i < (size_t)n * H * D; i++) q[i] = frand() * 2;
        for (int bi = 0; bi < n_bk; bi++) {
            if (bks[bi].precise && !bks[bi].gpu)
                continue;   /* the CPU's fast mode (the engine's default); CUDA has one mode */
            rlai_backend *be = bks[bi].be;
            rlai_kv_cache *kv;
            ck_assert_int_eq(rlai_kv_cache_new_on(be, 1, KVD, n_blocks, RLAI_DT_F16, &kv), 0);
            rlai_kv_layer_view view;
            rlai_kv_cache_layer_view(kv, 0, &view.k, &view.v, &view.row_bytes);
            view.dtype = RLAI_DT_F16;
            view.kv_dim = KVD;
            rlai_paged_rows all = { total, spos, stab };
            be->iface->kv_store(be, &view, &all, k, v);
            rlai_paged_rows rows = { n, pos, tab };
            be->iface->attention(be, &view, &rows, H, HKV, D, q, batch);
            for (int r = 0; r < n; r++) {
                rlai_paged_rows one = { 1, pos + r, tab + r };
                be->iface->attention(be, &view, &one, H, HKV, D, q + (size_t)r * H * D, alone + (size_t)r * H * D);
            }
            for (int r = 0; r < n; r++)
                ck_assert_msg(memcmp(batch + (size_t)r * H * D, alone + (size_t)r * H * D,
                                     sizeof(float) * (size_t)H * D) == 0,
                              "%s: H=%d HKV=%d D=%d row %d (pos %d) differs in a batch of %d", bks[bi].name, H, HKV, D,
                              r, pos[r], n);
            rlai_kv_cache_free(kv);
        }
        free(k); free(v); free(q); free(batch); free(alone); free(spos); free(pos); free(stab); free(tab);
    }
    close_all();
}
END_TEST

START_TEST(test_argmax)
{
    open_all();
    int n = 3, V = 1000;
    float *l = malloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n * V; i++) l[i] = frand();
    l[0 * V + 17] = 5; l[0 * V + 900] = 5;   /* tie: lowest index wins */
    l[1 * V + 999] = 9;
    l[2 * V + 0] = 7;
    for (int bi = 0; bi < n_bk; bi++) {
        rlai_backend *be = bks[bi].be;
        if (!be->iface->argmax)
            continue;
        float *d = dev_copy(be, l, (size_t)n * V);
        int32_t out[3];
        ck_assert_int_eq(be->iface->argmax(be, d, n, V, out), 0);
        ck_assert_int_eq(out[0], 17);
        ck_assert_int_eq(out[1], 999);
        ck_assert_int_eq(out[2], 0);
        be->iface->buffer_free(be, d);
    }
    free(l);
    close_all();
}
END_TEST

/* ---------------------------------------------------------------- devices */

START_TEST(test_device_parse)
{
    rlai_device_kind k;
    int idx;
    char err[128];
    ck_assert_int_eq(rlai_device_parse(NULL, &k, &idx, err, sizeof(err)), 0);
    ck_assert_int_eq(k, RLAI_DEVICE_AUTO);
    ck_assert_int_eq(rlai_device_parse("auto", &k, &idx, err, sizeof(err)), 0);
    ck_assert_int_eq(k, RLAI_DEVICE_AUTO);
    ck_assert_int_eq(rlai_device_parse("cpu", &k, &idx, err, sizeof(err)), 0);
    ck_assert_int_eq(k, RLAI_DEVICE_CPU);
    ck_assert_int_eq(rlai_device_parse("cuda", &k, &idx, err, sizeof(err)), 0);
    ck_assert_int_eq(k, RLAI_DEVICE_CUDA);
    ck_assert_int_eq(idx, 0);
    ck_assert_int_eq(rlai_device_parse("cuda:3", &k, &idx, err, sizeof(err)), 0);
    ck_assert_int_eq(idx, 3);
    const char *bad[] = { "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99", "cuda0", "CPU" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(rlai_device_parse(bad[i], &k, &idx, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(err, "auto, cpu, cuda"));
    }
}
END_TEST

START_TEST(test_backend_open)
{
    rlai_kernels *kern;
    rlai_threadpool *tp;
    ck_assert_int_eq(rlai_kernels_new(RLAI_ISA_SCALAR, false, &kern), 0);
    ck_assert_int_eq(rlai_threadpool_new(1, &tp), 0);
    char err[512], note[600];
    rlai_backend *be;
    rlai_backend_options o = { .device = "cpu", .kernels = kern, .pool = tp, .max_ctx = 64 };
    ck_assert_int_eq(rlai_backend_open(&o, &be, err, sizeof(err), note, sizeof(note)), 0);
    ck_assert_str_eq(be->iface->name, "cpu");
    ck_assert_uint_eq(be->iface->version, RLAI_BACKEND_IFACE_VERSION);
    ck_assert_uint_eq(be->iface->struct_size, sizeof(rlai_backend_i));
    ck_assert_str_eq(note, "");
    rlai_backend_free(be);

    o.device = "auto";
    ck_assert_int_eq(rlai_backend_open(&o, &be, err, sizeof(err), note, sizeof(note)), 0);
    ck_assert_ptr_nonnull(be);
    printf("device auto -> %s%s%s\n", be->iface->name, note[0] ? "; " : "", note);
    rlai_backend_free(be);

    o.device = "bogus";
    ck_assert_int_eq(rlai_backend_open(&o, &be, err, sizeof(err), note, sizeof(note)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(be);

    /* No CUDA module here: a clear refusal, never a crash or a silent CPU. */
    o.device = "cuda";
    int rc = rlai_backend_open(&o, &be, err, sizeof(err), note, sizeof(note));
    if (rc == 0) {
        printf("CUDA backend present: %s\n", be->iface->describe(be));
        rlai_backend_free(be);
    } else {
        ck_assert_int_eq(rc, RLAI_ERR_UNSUPPORTED);
        ck_assert_ptr_null(be);
        ck_assert_ptr_nonnull(strstr(err, "CUDA backend"));
        printf("cuda: %s\n", err);
    }
    rlai_threadpool_free(tp);
    rlai_kernels_free(kern);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("backend_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_rope_both_modes);
    tcase_add_test(tc, test_matmul_all_types);
    tcase_add_test(tc, test_matmul_batch_invariant);
    tcase_add_test(tc, test_kv_store_attention_paged);
    tcase_add_test(tc, test_attention_batch_invariant);
    tcase_add_test(tc, test_argmax);
    tcase_add_test(tc, test_device_parse);
    tcase_add_test(tc, test_backend_open);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
