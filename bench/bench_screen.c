/* bench_screen.c - the screen plugin's stages on the current X display's
 * whole screen ($DISPLAY), each against the same baseline measured in the
 * same run: a plain memcpy of one 32-bit frame (what any screen copy must
 * at least cost).
 *
 *   bench_screen [ITERATIONS]       (default 10; OCR runs 3 times)
 *
 * Prints one JSON line per stage ({"stage", "ms", "runs"}, ms = median) for
 * bench/bench_screen.py, which starts Xvfb at 1920x1080 and 2560x1440, adds
 * the answer latency through a real `rlai serve` and prints the table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture.h"
#include "imgdecode.h"
#include "layout.h"
#include "ocr.h"
#include "pngenc.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *stage, double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    printf("{\"stage\": \"%s\", \"ms\": %.3f, \"runs\": %d}\n", stage, t[n / 2], n);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    if (iters < 1 || iters > 1000)
        iters = 10;
    setenv("OMP_THREAD_LIMIT", "1", 0);
    double *t = calloc((size_t)iters, sizeof *t);
    char err[1024];
    rlai_screen_image img = { 0 };
    rlai_screen_capture_info info;

    /* capture with MIT-SHM, then plain GetImage */
    for (int pass = 0; pass < 2; pass++) {
        rlai_screen_capture_opts o = { .no_shm = pass };
        for (int i = 0; i < iters; i++) {
            rlai_screen_image_free(&img);
            double t0 = now_ms();
            if (rlai_screen_capture(&o, &img, &info, err, sizeof err)) {
                fprintf(stderr, "bench_screen: %s\n", err);
                return 1;
            }
            t[i] = now_ms() - t0;
        }
        if (pass == 0 && !info.used_shm)
            fprintf(stderr, "bench_screen: MIT-SHM not used\n");
        report(pass == 0 ? "capture_shm" : "capture_getimage", t, iters);
    }
    printf("{\"stage\": \"frame\", \"width\": %d, \"height\": %d}\n", img.width, img.height);

    /* baseline: memcpy of one 32-bit frame */
    size_t frame = (size_t)img.width * (size_t)img.height * 4;
    uint8_t *a = malloc(frame), *b = malloc(frame);
    memset(a, 1, frame);
    memset(b, 2, frame);
    for (int i = 0; i < iters; i++) {
        double t0 = now_ms();
        memcpy(b, a, frame);
        t[i] = now_ms() - t0;
        a[i % frame] = b[(i * 7) % frame];
    }
    report("memcpy_baseline", t, iters);

    /* PNG encode of the capture, then decode of that PNG */
    uint8_t *png = NULL;
    size_t png_len = 0;
    for (int i = 0; i < iters; i++) {
        free(png);
        double t0 = now_ms();
        rlai_screen_png_encode(&img, 6, &png, &png_len);
        t[i] = now_ms() - t0;
    }
    report("png_encode", t, iters);
    printf("{\"stage\": \"png_bytes\", \"bytes\": %zu}\n", png_len);
    for (int i = 0; i < iters; i++) {
        rlai_screen_image d;
        double t0 = now_ms();
        if (rlai_screen_decode(png, png_len, NULL, &d, err, sizeof err)) {
            fprintf(stderr, "bench_screen: %s\n", err);
            return 1;
        }
        t[i] = now_ms() - t0;
        rlai_screen_image_free(&d);
    }
    report("png_decode", t, iters);

    /* OCR of the whole frame + the layout description */
    rlai_screen_ocr *ocr = NULL;
    double t0 = now_ms();
    if (rlai_screen_ocr_new(NULL, "eng", 1, &ocr, err, sizeof err)) {
        fprintf(stderr, "bench_screen: %s\n", err);
        return 1;
    }
    double init_ms = now_ms() - t0;
    report("ocr_init", &init_ms, 1);
    int ocr_runs = iters < 3 ? iters : 3, lines = 0;
    double lay[3];
    for (int i = 0; i < ocr_runs; i++) {
        rlai_screen_text text = { 0 };
        t0 = now_ms();
        lines = rlai_screen_ocr_run(ocr, &img, 0, 0, 50, &text, err, sizeof err);
        t[i] = now_ms() - t0;
        char *desc = NULL;
        t0 = now_ms();
        rlai_screen_layout_describe(img.width, img.height, NULL, NULL, &text, 3000, &desc, NULL);
        lay[i] = now_ms() - t0;
        free(desc);
        rlai_screen_text_free(&text);
    }
    report("ocr", t, ocr_runs);
    report("layout", lay, ocr_runs);
    printf("{\"stage\": \"ocr_lines\", \"lines\": %d}\n", lines);
    rlai_screen_ocr_free(ocr);
    free(png);
    free(a);
    free(b);
    free(t);
    rlai_screen_image_free(&img);
    return 0;
}
