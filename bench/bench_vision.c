/* bench_vision.c - vision encoder latency (engine/vision.c), build in release.
 *
 *   bench_vision MMPROJ [--iters N] [--threads T]
 *
 * MMPROJ: any idefics3 mmproj GGUF; a random-weight one with SmolVLM-256M's
 * geometry (SigLIP-B/16 at 512 px, 12 layers, n_embd 768, n_ff 3072, scale
 * factor 4 -> 64 tokens of 576) is written by
 *   .venv/bin/python tests/ref/make_tiny_vision.py --smolvlm256 /tmp/smolvlm256-mmproj.gguf
 * (latency does not depend on the weights' values).
 *
 * Rows (median of N runs, fast kernels, T threads, the machine's best ISA):
 *  - preprocess: a 1920x1080 RGB frame -> image_size^2 normalised pixels;
 *  - encode: patches, every ViT layer, pixel shuffle, projection;
 *  - baseline measured in the same run: the encoder's matrix products alone
 *    (the same shapes and weight type as the file's layers, on the same
 *    kernels and pool), so the encode/baseline ratio is what attention,
 *    LayerNorm, GELU and the data movement add on top of the matmuls.
 * Prints a Markdown table. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "kernels.h"
#include "threadpool.h"
#include "vision.h"
#include "rlai/engine.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), cmp_d);
    return t[n / 2];
}

/* A random F16 matrix of rows x cols. */
static rlai_weight f16_matrix(int64_t rows, int64_t cols)
{
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)(rows * cols));
    if (!d) {
        fprintf(stderr, "bench_vision: out of memory\n");
        exit(1);
    }
    uint32_t s = 12345;
    for (int64_t i = 0; i < rows * cols; i++) {
        s = s * 1664525u + 1013904223u;
        d[i] = rlai_f32_to_fp16(((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f);
    }
    return (rlai_weight){ .type = RLAI_DT_F16, .rows = rows, .cols = cols, .data = d };
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_vision MMPROJ [--iters N] [--threads T]\n");
        return 2;
    }
    int iters = 3, threads = 2;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
    }
    if (iters < 1 || iters > 1000 || threads < 1 || threads > 256) {
        fprintf(stderr, "bench_vision: bad --iters or --threads\n");
        return 2;
    }
    char err[512];
    rlai_vision *v;
    if (rlai_vision_open_file(argv[1], &v, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_vision: %s\n", err);
        return 1;
    }
    const rlai_vision_hparams *hp = rlai_vision_get_hparams(v);
    rlai_isa isa;
    rlai_kernels *k;
    rlai_threadpool *tp;
    if (rlai_kernels_resolve(RLAI_ISA_AUTO, &isa) < 0 || rlai_kernels_new(isa, false, &k) < 0 ||
        rlai_threadpool_new(threads, &tp) < 0) {
        fprintf(stderr, "bench_vision: cannot create kernels / pool\n");
        return 1;
    }
    const int W = 1920, H = 1080;
    uint8_t *frame = malloc((size_t)W * H * 3);
    float *px = malloc(sizeof(float) * rlai_vision_pixels_len(v));
    float *out = malloc(sizeof(float) * rlai_vision_output_len(v));
    if (!frame || !px || !out)
        return 1;
    for (size_t i = 0; i < (size_t)W * H * 3; i++)
        frame[i] = (uint8_t)((i * 2654435761u) >> 24);

    double *tp_ms = calloc((size_t)iters, sizeof(double)), *te_ms = calloc((size_t)iters, sizeof(double));
    double *tb_ms = calloc((size_t)iters, sizeof(double));
    for (int it = 0; it < iters; it++) {
        double t0 = now_ms();
        if (rlai_vision_preprocess(v, frame, W, H, (size_t)W * 3, 3, px) < 0)
            return 1;
        double t1 = now_ms();
        int rc = rlai_vision_encode(v, k, tp, px, out);
        double t2 = now_ms();
        if (rc < 0) {
            fprintf(stderr, "bench_vision: encode failed: %d\n", rc);
            return 1;
        }
        tp_ms[it] = t1 - t0;
        te_ms[it] = t2 - t1;
    }

    /* baseline: the same matrix products on F16 weights of the same shapes */
    const int N = hp->n_patches, E = hp->n_embd, F = hp->n_ff, s = hp->scale_factor;
    rlai_weight wpe = f16_matrix(E, 3 * hp->patch_size * hp->patch_size), wee = f16_matrix(E, E);
    rlai_weight wup = f16_matrix(F, E), wdn = f16_matrix(E, F), wfc = f16_matrix(hp->n_out, (int64_t)E * s * s);
    int wide = F > E * s * s ? F : E * s * s;
    if (wide < 3 * hp->patch_size * hp->patch_size)
        wide = 3 * hp->patch_size * hp->patch_size;
    float *xa = calloc((size_t)N * (size_t)wide, sizeof(float)), *ya = calloc((size_t)N * (size_t)wide, sizeof(float));
    if (!xa || !ya)
        return 1;
    for (int it = 0; it < iters; it++) {
        double t0 = now_ms();
        rlai_matmul(k, tp, &wpe, xa, wpe.cols, N, ya, wpe.rows);
        for (int l = 0; l < hp->n_layer; l++) {
            for (int j = 0; j < 4; j++)
                rlai_matmul(k, tp, &wee, xa, E, N, ya, E);
            rlai_matmul(k, tp, &wup, xa, E, N, ya, F);
            rlai_matmul(k, tp, &wdn, xa, F, N, ya, E);
        }
        rlai_matmul(k, tp, &wfc, xa, wfc.cols, hp->n_tokens, ya, wfc.rows);
        tb_ms[it] = now_ms() - t0;
    }
    double mp = median(tp_ms, iters), me = median(te_ms, iters), mb = median(tb_ms, iters);
    printf("vision encoder: image %d, patch %d (%d patches), %d layers, n_embd %d, n_ff %d, "
           "scale %d -> %d tokens of %d; %s, %d threads, %d runs (medians)\n\n",
           hp->image_size, hp->patch_size, N, hp->n_layer, E, F, s, hp->n_tokens, hp->n_out,
           rlai_isa_name(isa), threads, iters);
    printf("| stage | ms | vs baseline |\n|---|---:|---:|\n");
    printf("| baseline: the encoder's matrix products alone (F16) | %.1f | 1.00x |\n", mb);
    printf("| preprocess 1920x1080 -> %dx%d | %.1f | %.2fx |\n", hp->image_size, hp->image_size, mp, mp / mb);
    printf("| encode (ViT + pixel shuffle + projection) | %.1f | %.2fx |\n", me, me / mb);
    free((void *)wpe.data); free((void *)wee.data); free((void *)wup.data); free((void *)wdn.data);
    free((void *)wfc.data);
    free(xa); free(ya); free(tp_ms); free(te_ms); free(tb_ms); free(frame); free(px); free(out);
    rlai_threadpool_free(tp);
    rlai_kernels_free(k);
    rlai_vision_free(v);
    return 0;
}
