/* bench_attn.c - the CPU backend's attention over the paged f16 KV cache
 * at the shapes of speculative verification (build in release).
 *
 *   bench_attn [--threads N] [--reps R] [--heads H] [--kv-heads HKV] [--head-dim D]
 *
 * One layer shaped like SmolLM2-135M by default (9 query heads, 3 KV heads,
 * head_dim 64, f16 cache in 16-token pages scattered over the pool). For
 * each context length and each number of rows R of one sequence (the
 * pending token plus R-1 draft tokens at the last R positions, as a
 * verification step feeds them), it times
 *   - one attention call with the R rows (what the engine does), against
 *   - R one-row calls at the same positions (the baseline: what the R rows
 *     would cost if nothing were shared between them),
 * in the same run, and checks that both give bit-identical outputs (the
 * kernels are batch-invariant; exit status 1 if not). Figures are the best
 * of --reps passes of 30 calls (30 layers' worth). */
#include "backend.h"
#include "dtype.h"
#include "kernels.h"
#include "kv_cache.h"
#include "threadpool.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALLS 30

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float frand(void) { return (float)((next() >> 40) & 0xFFFFFF) / (float)0x1000000 * 2.0f - 1.0f; }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_attn: out of memory\n");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 7, H = 9, HKV = 3, D = 64;
    static const struct option opts[] = {
        { "threads", required_argument, NULL, 't' }, { "reps", required_argument, NULL, 'r' },
        { "heads", required_argument, NULL, 'H' },   { "kv-heads", required_argument, NULL, 'K' },
        { "head-dim", required_argument, NULL, 'D' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int o;
    while ((o = getopt_long(argc, argv, "t:r:H:K:D:h", opts, NULL)) != -1) {
        switch (o) {
        case 't': threads = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'H': H = atoi(optarg); break;
        case 'K': HKV = atoi(optarg); break;
        case 'D': D = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: bench_attn [--threads N] [--reps R] [--heads H] [--kv-heads HKV] [--head-dim D]\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (threads < 1 || reps < 1 || H < 1 || HKV < 1 || H % HKV || D < 8 || D > 256 || D % 8) {
        fprintf(stderr, "bench_attn: bad shape or counts\n");
        return 2;
    }
    static const int ctxs[] = { 128, 600, 2000 };
    static const int nrows[] = { 1, 2, 4, 6, 8 };
    const int max_ctx = 2048, nblocks = max_ctx / RLAI_KV_BLOCK;
    const int KVD = HKV * D;

    rlai_isa isa;
    rlai_kernels *k = NULL;
    rlai_threadpool *tp = NULL;
    rlai_backend *be = NULL;
    if (rlai_kernels_resolve(RLAI_ISA_AUTO, &isa) < 0 || rlai_kernels_new(isa, false, &k) < 0 ||
        rlai_threadpool_new(threads, &tp) < 0 || rlai_backend_cpu_new(k, tp, max_ctx, &be) < 0) {
        fprintf(stderr, "bench_attn: cannot set up the CPU backend\n");
        return 1;
    }

    /* The pool: twice the blocks the sequence needs, the sequence's blocks
     * a random permutation of them (pages are scattered in a real pool). */
    size_t row_bytes = (size_t)KVD * sizeof(uint16_t);
    size_t pool_rows = (size_t)2 * nblocks * RLAI_KV_BLOCK;
    uint16_t *kp = xmalloc(pool_rows * row_bytes), *vp = xmalloc(pool_rows * row_bytes);
    float *tmp = xmalloc(sizeof(float) * (size_t)KVD);
    for (size_t r = 0; r < pool_rows; r++) {
        for (int j = 0; j < KVD; j++)
            tmp[j] = frand();
        rlai_f32_to_f16_row(k, tmp, kp + r * (size_t)KVD, KVD);
        for (int j = 0; j < KVD; j++)
            tmp[j] = frand();
        rlai_f32_to_f16_row(k, tmp, vp + r * (size_t)KVD, KVD);
    }
    int32_t *perm = xmalloc(sizeof(int32_t) * (size_t)2 * nblocks);
    for (int i = 0; i < 2 * nblocks; i++)
        perm[i] = i;
    for (int i = 2 * nblocks - 1; i > 0; i--) {
        int j = (int)(next() % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t *table = perm;
    rlai_kv_layer_view kv = { kp, vp, row_bytes, RLAI_DT_F16, KVD };

    const int maxR = 8;
    float *q = xmalloc(sizeof(float) * (size_t)maxR * H * D);
    float *out_b = xmalloc(sizeof(float) * (size_t)maxR * H * D);
    float *out_1 = xmalloc(sizeof(float) * (size_t)maxR * H * D);
    for (int i = 0; i < maxR * H * D; i++)
        q[i] = frand();
    int32_t pos[8];
    const int32_t *tables[8];
    for (int i = 0; i < maxR; i++)
        tables[i] = table;

    printf("bench_attn: CPU attention, f16 KV in %d-token pages, %d query heads / %d KV heads, head_dim %d, "
           "%d threads, isa %s\n",
           RLAI_KV_BLOCK, H, HKV, D, threads, rlai_isa_name(isa));
    printf("times: %d calls (one per layer of a 30-layer model), best of %d passes\n\n", CALLS, reps);
    printf("%7s %5s %14s %17s %9s %14s %10s\n", "context", "rows", "R rows, 1 call", "R one-row calls",
           "shared", "per extra row", "outputs");
    int bad = 0;
    for (size_t ci = 0; ci < sizeof ctxs / sizeof *ctxs; ci++) {
        double one_row = 0;
        for (size_t ri = 0; ri < sizeof nrows / sizeof *nrows; ri++) {
            int R = nrows[ri], ctx = ctxs[ci];
            for (int i = 0; i < R; i++)
                pos[i] = ctx - R + i;
            rlai_paged_rows rows = { R, pos, tables };
            double best_b = 1e30, best_1 = 1e30;
            for (int rep = 0; rep < reps; rep++) {
                double t0 = now_ns();
                for (int c = 0; c < CALLS; c++)
                    be->iface->attention(be, &kv, &rows, H, HKV, D, q, out_b);
                double t1 = now_ns();
                for (int c = 0; c < CALLS; c++)
                    for (int i = 0; i < R; i++) {
                        rlai_paged_rows one = { 1, pos + i, tables };
                        be->iface->attention(be, &kv, &one, H, HKV, D, q + (size_t)i * H * D,
                                             out_1 + (size_t)i * H * D);
                    }
                double t2 = now_ns();
                best_b = t1 - t0 < best_b ? t1 - t0 : best_b;
                best_1 = t2 - t1 < best_1 ? t2 - t1 : best_1;
            }
            bool same = memcmp(out_b, out_1, sizeof(float) * (size_t)R * H * D) == 0;
            bad |= !same;
            if (R == 1)
                one_row = best_1;
            printf("%7d %5d %11.1f us %14.1f us %8.2fx %11.2f row %10s\n", ctx, R, best_b / 1e3,
                   best_1 / 1e3, best_1 / best_b, R > 1 ? (best_b - one_row) / one_row / (R - 1) : 0.0,
                   same ? "IDENTICAL" : "DIFFER");
        }
    }
    printf("\nshared = R one-row calls / one R-row call. per extra row = (one R-row call - one\n"
           "one-row call) / one-row call / (R - 1): what each draft row adds, in one-row calls.\n");
    be->iface->free(be);
    rlai_threadpool_free(tp);
    rlai_kernels_free(k);
    free(kp);
    free(vp);
    free(tmp);
    free(perm);
    free(q);
    free(out_b);
    free(out_1);
    return bad ? 1 : 0;
}
