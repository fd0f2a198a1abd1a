/* bench_kernels.c - kernel throughput table (build in release).
 *
 *   bench_kernels [seconds_per_case] [--quick]     (default 0.3)
 *
 * Every ISA the CPU has (scalar, avx2, avx512) is measured in the same
 * run, so the scalar and avx2 rows are the baselines of the avx512 ones;
 * "avx512p" rows are the AVX-512 kernels on weights in their load-time
 * packed layout (rlai_kernels_pack, what the CPU backend runs on), with
 * the "avx512" rows (the GGUF rows, transposed on every call) as their
 * baseline.
 * Times are the best call of each case (the machine is shared: the best
 * call is the one least disturbed by other processes). --quick skips the
 * scalar rows and T = 512.
 *
 * Prints, for 1 and 2 threads:
 *  - a memory bandwidth baseline (read-only sum and memcpy over 256 MiB),
 *  - matvec (T=1) GB/s of weight bytes for Q4_1 576x1536, Q4_1 1536x576,
 *    Q8_0 576x49152, streaming enough distinct copies that the weights come
 *    from DRAM as in real decode,
 *  - matmul GFLOP/s for T=8 and T=16 (batched decode: one token of each of
 *    8 or 16 streams), T=64 and T=512 (scalar only where it finishes),
 *  - a SmolLM2-135M-shaped estimate: all 30x7 Q4_1 matrices plus the Q8_0
 *    LM head as distinct buffers (~96 MB), decode tok/s (T=1, and T=8/16
 *    batched streams with the LM head for every token) and prefill tok/s
 *    (matmuls only, no attention).
 * Shapes are written cols x rows (ggml ne0 x ne1). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "kernels.h"
#include "threadpool.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random block bytes with sane f16 scales (d in [0.004, 0.02], m ~ -0.1). */
static void fill_weights(uint32_t type, uint8_t *p, size_t bytes)
{
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, 8);
    }
    size_t bb = rlai_dtype_block_bytes(type);
    if (rlai_dtype_block_elems(type) != 32) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            float f = (float)(rnd() % 2000) / 1000.0f - 1.0f;
            uint16_t h = type == RLAI_DT_BF16 ? rlai_f32_to_bf16(f) : rlai_f32_to_fp16(f);
            if (type == RLAI_DT_F32)
                break;
            memcpy(p + i, &h, 2);
        }
        return;
    }
    for (size_t off = 0; off + bb <= bytes; off += bb) {
        uint16_t d = rlai_f32_to_fp16(0.004f + (float)(rnd() % 1000) * 1.6e-5f);
        uint16_t m = rlai_f32_to_fp16(-0.1f);
        memcpy(p + off, &d, 2);
        if (type == RLAI_DT_Q4_1 || type == RLAI_DT_Q5_1)
            memcpy(p + off + 2, &m, 2);
    }
}

typedef struct {
    rlai_weight *w;
    rlai_weight *wp;    /* the same copies with the packed layout, or NULL */
    int n;
    uint8_t *mem, *pmem;
} weight_set;

/* n distinct copies of a (cols x rows) matrix; with kp (the AVX-512
 * kernels), also each copy in their load-time packed layout (wp), as the
 * CPU backend makes at model load. */
static int make_set(weight_set *s, uint32_t type, int64_t cols, int64_t rows, int n, const rlai_kernels *kp)
{
    size_t bytes = rlai_dtype_row_bytes(type, cols) * (size_t)rows;
    memset(s, 0, sizeof *s);
    s->n = n;
    s->mem = malloc(bytes * (size_t)n + 64);
    s->w = calloc((size_t)n, sizeof *s->w);
    if (!s->mem || !s->w)
        return -1;
    fill_weights(type, s->mem, bytes * (size_t)n);
    for (int i = 0; i < n; i++)
        s->w[i] = (rlai_weight){ .type = type, .rows = rows, .cols = cols,
                                 .data = s->mem + (size_t)i * bytes };
    size_t pb = kp ? rlai_kernels_packed_bytes(kp, &s->w[0]) : 0;
    if (pb == 0)
        return 0;
    s->pmem = aligned_alloc(64, pb * (size_t)n);   /* pb is a multiple of 64 */
    s->wp = calloc((size_t)n, sizeof *s->wp);
    if (!s->pmem || !s->wp)
        return -1;
    for (int i = 0; i < n; i++) {
        s->wp[i] = s->w[i];
        if (rlai_kernels_pack(kp, NULL, &s->w[i], s->pmem + (size_t)i * pb, pb) < 0)
            return -1;
        s->wp[i].packed = s->pmem + (size_t)i * pb;
        s->wp[i].packed_isa = rlai_kernels_isa(kp);
    }
    return 0;
}

static void free_set(weight_set *s)
{
    free(s->mem);
    free(s->w);
    free(s->pmem);
    free(s->wp);
}

/* The copies a level variant computes on: packed ones for "avx512p". */
static const rlai_weight *set_w(const weight_set *s, bool packed)
{
    return packed && s->wp ? s->wp : s->w;
}

static float *make_x(int T, int64_t cols)
{
    float *x = malloc(sizeof(float) * (size_t)T * (size_t)cols);
    if (!x)
        return NULL;
    for (int64_t i = 0; i < (int64_t)T * cols; i++)
        x[i] = (float)(rnd() % 20001) / 10000.0f - 1.0f;
    return x;
}

/* Runs matmuls cycling over the set until `secs` elapsed (at least 3
 * calls); returns the best seconds per call. */
static double time_mm(rlai_kernels *k, rlai_threadpool *tp, const weight_set *s, bool packed,
                      const float *x, int T, float *y, double secs)
{
    const rlai_weight *w = set_w(s, packed);
    rlai_matmul(k, tp, &w[0], x, w[0].cols, T, y, w[0].rows);   /* warm-up */
    int calls = 0;
    double t0 = now(), t = t0, best = 1e30;
    do {
        double c0 = t;
        rlai_matmul(k, tp, &w[calls % s->n], x, w[0].cols, T, y, w[0].rows);
        calls++;
        t = now();
        if (t - c0 < best)
            best = t - c0;
    } while (t - t0 < secs || calls < 3);
    return best;
}

/* ------------------------------------------------------------------ */
/* bandwidth baseline                                                  */

struct bw_arg {
    const uint64_t *src;
    uint64_t *dst;
    size_t n;        /* uint64 elements */
    uint64_t sum[8];
};

static void bw_read_fn(void *p, int ith, int nth)
{
    struct bw_arg *a = p;
    size_t i0 = a->n * (size_t)ith / (size_t)nth, i1 = a->n * (size_t)(ith + 1) / (size_t)nth;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = i0; i + 4 <= i1; i += 4) {
        s0 += a->src[i];
        s1 += a->src[i + 1];
        s2 += a->src[i + 2];
        s3 += a->src[i + 3];
    }
    a->sum[ith] = s0 + s1 + s2 + s3;
}

static void bw_copy_fn(void *p, int ith, int nth)
{
    struct bw_arg *a = p;
    size_t i0 = a->n * (size_t)ith / (size_t)nth, i1 = a->n * (size_t)(ith + 1) / (size_t)nth;
    memcpy(a->dst + i0, a->src + i0, (i1 - i0) * sizeof(uint64_t));
}

static void bandwidth(rlai_threadpool *tp, int nth, double secs)
{
    const size_t bytes = (size_t)256 << 20;
    struct bw_arg a = { .n = bytes / 8 };
    uint64_t *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    a.src = src;
    a.dst = dst;
    double t0 = now(), t;
    int it = 0;
    do {
        rlai_threadpool_run(tp, bw_read_fn, &a);
        it++;
        t = now();
    } while (t - t0 < secs);
    double rd = (double)bytes * it / (t - t0) / 1e9;
    t0 = now();
    it = 0;
    do {
        rlai_threadpool_run(tp, bw_copy_fn, &a);
        it++;
        t = now();
    } while (t - t0 < secs);
    double cp = 2.0 * (double)bytes * it / (t - t0) / 1e9;
    printf("%-26s %-8s %2d %10s %9.1f %9s   (memcpy read+write: %.1f GB/s)\n",
           "baseline: read 256 MiB", "-", nth, "-", rd, "-", cp);
    free(src);
    free(dst);
}

/* ------------------------------------------------------------------ */

static const char *isa_str(rlai_isa i, bool packed)
{
    return packed ? "avx512p" : rlai_isa_name(i);
}

int main(int argc, char **argv)
{
    double secs = 0.3;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (atof(argv[i]) > 0)
            secs = atof(argv[i]);
    }

    rlai_threadpool *pools[2] = { NULL, NULL };
    if (rlai_threadpool_new(1, &pools[0]) < 0 || rlai_threadpool_new(2, &pools[1]) < 0) {
        fprintf(stderr, "threadpool create failed\n");
        return 1;
    }
    /* levels, and "avx512p": the AVX-512 kernels on weights in their
     * load-time packed layout (what the engine runs), beside "avx512" on
     * the GGUF rows as its baseline */
    const rlai_isa all[3] = { RLAI_ISA_SCALAR, RLAI_ISA_AVX2, RLAI_ISA_AVX512 };
    rlai_isa isas[4];
    bool pk[4] = { false, false, false, false };
    rlai_kernels *ks[4] = { NULL, NULL, NULL, NULL };
    const rlai_kernels *kp = NULL;
    int n_isa = 0;
    for (int i = 0; i < 3; i++) {
        if (!(rlai_kernels_available() & (1u << all[i])))
            continue;
        isas[n_isa] = all[i];
        if (rlai_kernels_new(all[i], false, &ks[n_isa]) < 0)
            return 1;
        n_isa++;
        if (all[i] == RLAI_ISA_AVX512) {
            kp = ks[n_isa - 1];
            isas[n_isa] = all[i];
            ks[n_isa] = ks[n_isa - 1];
            pk[n_isa++] = true;
        }
    }

    printf("RTX-LocalAI kernel bench (quantized mode; %.2fs per case, best call reported)\n", secs);
    printf("%-26s %-8s %2s %10s %9s %9s\n", "case", "isa", "th", "us/call", "GB/s", "GFLOP/s");
    for (int p = 0; p < 2; p++)
        bandwidth(pools[p], p + 1, secs);

    struct { uint32_t type; int64_t cols, rows; const char *name; } shapes[] = {
        { RLAI_DT_Q4_1, 576, 1536, "q4_1 576x1536" },
        { RLAI_DT_Q4_1, 1536, 576, "q4_1 1536x576" },
        { RLAI_DT_Q4_0, 576, 1536, "q4_0 576x1536" },
        { RLAI_DT_Q8_0, 576, 49152, "q8_0 576x49152" },
    };
    const int Ts[] = { 1, 8, 16, 64, 512 };
    const int n_T = quick ? 4 : 5;
    float *y = malloc(sizeof(float) * 49152 * 512);
    if (!y)
        return 1;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        size_t bytes = rlai_dtype_row_bytes(shapes[si].type, shapes[si].cols) * (size_t)shapes[si].rows;
        int copies = (int)((256u << 20) / bytes) + 1;   /* > 8x L3: matvec streams from DRAM */
        weight_set s;
        if (make_set(&s, shapes[si].type, shapes[si].cols, shapes[si].rows, copies, kp) < 0)
            return 1;
        for (int ti = 0; ti < n_T; ti++) {
            int T = Ts[ti];
            float *x = make_x(T, shapes[si].cols);
            if (!x)
                return 1;
            double flop = 2.0 * (double)shapes[si].cols * (double)shapes[si].rows * T;
            for (int i = 0; i < n_isa; i++) {
                if (isas[i] == RLAI_ISA_SCALAR && (quick || flop > 2e9))
                    continue;   /* would take many seconds */
                for (int p = 0; p < 2; p++) {
                    weight_set one = s;
                    if (T > 16)
                        one.n = 1;   /* prefill matmul: compute-bound, reuse one copy */
                    double sec = time_mm(ks[i], pools[p], &one, pk[i], x, T, y, secs);
                    char label[64];
                    snprintf(label, sizeof label, "%s T=%d", shapes[si].name, T);
                    printf("%-26s %-8s %2d %10.1f %9.2f %9.2f\n", label, isa_str(isas[i], pk[i]), p + 1,
                           sec * 1e6, (double)bytes / sec / 1e9, flop / sec / 1e9);
                }
            }
            free(x);
        }
        free_set(&s);
    }

    /* SmolLM2-135M shaped model: 30 layers x {q,k,v,o,gate,up,down} Q4_1
     * + Q8_0 LM head 576x49152, all distinct memory. */
    {
        const int L = 30;
        struct { int64_t cols, rows; } mats[7] = {
            { 576, 576 }, { 576, 192 }, { 576, 192 }, { 576, 576 },
            { 576, 1536 }, { 576, 1536 }, { 1536, 576 },
        };
        weight_set layer[7], head;
        size_t total = 0;
        for (int m = 0; m < 7; m++) {
            if (make_set(&layer[m], RLAI_DT_Q4_1, mats[m].cols, mats[m].rows, L, kp) < 0)
                return 1;
            total += rlai_dtype_row_bytes(RLAI_DT_Q4_1, mats[m].cols) * (size_t)mats[m].rows * L;
        }
        if (make_set(&head, RLAI_DT_Q8_0, 576, 49152, 1, kp) < 0)
            return 1;
        total += rlai_dtype_row_bytes(RLAI_DT_Q8_0, 576) * 49152;
        printf("\nSmolLM2-135M shape, %.1f MB of weights (matmuls only, no attention; best pass)\n",
               total / 1e6);
        printf("decode T=8/16: one token of each of 8/16 streams, LM head for every token\n");
        float *x = make_x(512, 1536);
        float *yy = malloc(sizeof(float) * 512 * 1536);
        if (!x || !yy)
            return 1;
        const int mT[] = { 1, 8, 16, 64, 512 };
        for (int i = 0; i < n_isa; i++) {
            if (isas[i] == RLAI_ISA_SCALAR)
                continue;
            for (int p = 0; p < 2; p++) {
                double base = 0;
                for (int ti = 0; ti < n_T; ti++) {
                    int T = mT[ti];
                    bool dec = T <= 16;
                    int reps = T == 1 ? 20 : dec ? 8 : T == 64 ? 3 : 1;
                    double best = 1e30;
                    for (int r = 0; r < reps; r++) {
                        double t0 = now();
                        for (int l = 0; l < L; l++)
                            for (int m = 0; m < 7; m++)
                                rlai_matmul(ks[i], pools[p], &set_w(&layer[m], pk[i])[l], x, mats[m].cols, T,
                                            yy, mats[m].rows);
                        /* LM head: every decode token; prefill: the last token only */
                        rlai_matmul(ks[i], pools[p], set_w(&head, pk[i]), x, 576, dec ? T : 1, y, 49152);
                        double dt = now() - t0;
                        if (dt < best)
                            best = dt;
                    }
                    if (T == 1)
                        base = T / best;
                    char rel[32] = "";
                    if (dec && T > 1)
                        snprintf(rel, sizeof rel, "  %.2fx T=1", T / best / base);
                    printf("  %-6s %d thread(s) T=%-3d: %8.2f ms/call  %8.1f tok/s  (%s)%s\n",
                           isa_str(isas[i], pk[i]), p + 1, T, best * 1e3, T / best,
                           dec ? "decode" : "prefill", rel);
                }
            }
        }
        free(x);
        free(yy);
        for (int m = 0; m < 7; m++)
            free_set(&layer[m]);
        free_set(&head);
    }

    free(y);
    for (int i = 0; i < n_isa; i++)
        if (!pk[i])
            rlai_kernels_free(ks[i]);
    rlai_threadpool_free(pools[0]);
    rlai_threadpool_free(pools[1]);
    return 0;
}
