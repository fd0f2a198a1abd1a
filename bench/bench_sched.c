/* bench_sched.c - prefix cache and continuous batching on a real model.
 *
 *   bench_sched [-m MODEL] [-t THREADS] [--streams-only] [--isa auto|scalar|avx2|avx512]
 *
 * 1. TTFT of a ~30-token user turn after a ~1,500-token lore prefix:
 *    cold (prefix cache off: the baseline, same run) versus cached, and
 *    with 8 different lore prefixes used in rotation.
 * 2. A burst: 4 requests with the same (uncached) lore and different
 *    turns submitted at once, prefix cache off (each prefills the lore: the
 *    baseline) versus on (the first prefills it, the others wait for its
 *    blocks): time until all 4 have their first token, mean TTFT and the
 *    prompt tokens computed.
 * 3. Aggregate decode tok/s with 1, 4, 8 and 16 concurrent streams (the
 *    1-stream figure is the baseline).
 */
#include "rlai/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct res { bool done; int status; rlai_gen_metrics m; } res;

static void on_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    res *r = user;
    r->done = true;
    r->status = status;
    r->m = *m;
}

static void run_idle(rlai_engine *e)
{
    while (rlai_engine_step(e) > 0) {
    }
}

/* Tokenizes "lore + turn" into out; returns the count. */
static int build_prompt(rlai_engine *e, int lore_id, int turn, rlai_token *out, int cap)
{
    static const char *places[8] = { "Aster", "Vell", "Morrow", "Quill", "Saffron", "Tallow", "Umber", "Wick" };
    static const char *names[8] = { "Mara", "Odo", "Lys", "Brann", "Cato", "Ilse", "Nemo", "Rhea" };
    size_t cap_text = 16384;
    char *text = malloc(cap_text);
    int len = snprintf(text, cap_text, "<|im_start|>system\nYou are %s, keeper of the archive of %s. ",
                       names[lore_id], places[lore_id]);
    for (int i = 0; len < 4400 && i < 200; i++)
        len += snprintf(text + len, cap_text - (size_t)len,
                        "In year %d of %s, the %s guild recorded trade of %d crates of amber and %d of salt. ",
                        300 + i * 7 + lore_id, places[lore_id], names[(i + lore_id) % 8], 10 + i * 3, 5 + i);
    len += snprintf(text + len, cap_text - (size_t)len,
                    "<|im_end|>\n<|im_start|>user\nTraveller %d asks: what happened in the archive this "
                    "season, and who should I speak to first about the amber trade?<|im_end|>\n"
                    "<|im_start|>assistant\n", turn);
    int n = rlai_engine_tokenize(e, text, (size_t)len, true, true, out, cap);
    free(text);
    return n;
}

/* Submits 4 prompts at once (max_tokens 1) and steps until all are done:
 * *all_ms = until the last first token, *mean_ttft, *computed = prompt
 * tokens not taken from the prefix cache. */
static void burst(rlai_engine *e, rlai_token (*p)[2048], const int *n, double *all_ms, double *mean_ttft,
                  int *computed)
{
    res r[4];
    memset(r, 0, sizeof(r));
    double t0 = now_ms();
    for (int i = 0; i < 4; i++) {
        rlai_request_params rp;
        memset(&rp, 0, sizeof(rp));
        rp.prompt = p[i];
        rp.n_prompt = n[i];
        rlai_gen_params_init(&rp.gen);
        rp.gen.max_tokens = 1;
        rp.on_done = on_done;
        rp.user = &r[i];
        rlai_engine_submit(e, &rp, NULL);
    }
    run_idle(e);
    *all_ms = now_ms() - t0;
    *mean_ttft = 0;
    *computed = 0;
    for (int i = 0; i < 4; i++) {
        *mean_ttft += r[i].m.ttft_ms / 4;
        *computed += r[i].m.prompt_tokens - r[i].m.reused_tokens;
    }
}

static double ttft(rlai_engine *e, const rlai_token *p, int n, int *reused)
{
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = p;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = 1;
    res r = { 0 };
    rp.on_done = on_done;
    rp.user = &r;
    if (rlai_engine_submit(e, &rp, NULL) < 0)
        return -1;
    run_idle(e);
    if (reused)
        *reused = r.m.reused_tokens;
    return r.m.ttft_ms;
}

int main(int argc, char **argv)
{
    const char *model = getenv("RLAI_MODEL");
    int threads = 2;
    bool streams_only = false;
    rlai_isa isa = RLAI_ISA_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *n = argv[++i];
            isa = !strcmp(n, "scalar") ? RLAI_ISA_SCALAR : !strcmp(n, "avx2") ? RLAI_ISA_AVX2
                : !strcmp(n, "avx512") ? RLAI_ISA_AVX512 : RLAI_ISA_AUTO;
            continue;
        }
        if (!strcmp(argv[i], "--streams-only")) {
            streams_only = true;
            continue;
        }
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
    }
    if (!model)
        model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = threads;
    ep.isa = isa;
    ep.n_ctx = 2048;
    ep.kv_blocks = 8 * 2048 / 16 + 64;
    rlai_engine *e;
    char err[512];
    if (rlai_engine_open(model, &ep, &e, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_sched: %s\n", err);
        return 1;
    }
    static rlai_token prompts[8][2048];
    int n[8];
    for (int i = 0; i < 8; i++) {
        n[i] = build_prompt(e, i, 1, prompts[i], 2048);
        if (n[i] <= 0 || n[i] >= 2000) {
            fprintf(stderr, "bench_sched: prompt %d has %d tokens\n", i, n[i]);
            return 1;
        }
    }
    rlai_model_info info;
    rlai_engine_info(e, &info);
    printf("kernels %s\n", info.isa);
    printf("model %s, %d threads; lore prompts of %d..%d tokens (lore ~%d + user turn ~30)\n\n", model, threads,
           n[0], n[7], n[0] - 30);

    /* 1. TTFT: cold (cache off) vs cached vs 8-prefix rotation. */
    if (streams_only)
        goto streams;
    rlai_engine_set_prefix_cache(e, false);
    double cold = 0;
    for (int i = 0; i < 3; i++)
        cold += ttft(e, prompts[i], n[i], NULL) / 3;
    /* 2. A burst of 4 turns on lore 7 (not cached yet): cache off, then on. */
    static rlai_token bp[4][2048];
    int bn[4];
    for (int i = 0; i < 4; i++)
        bn[i] = build_prompt(e, 7, 20 + i, bp[i], 2048);
    double b_all[2], b_ttft[2];
    int b_comp[2];
    burst(e, bp, bn, &b_all[0], &b_ttft[0], &b_comp[0]);
    rlai_engine_set_prefix_cache(e, true);
    burst(e, bp, bn, &b_all[1], &b_ttft[1], &b_comp[1]);
    for (int i = 0; i < 8; i++)   /* warm every lore once */
        ttft(e, prompts[i], n[i], NULL);
    int reused = 0;
    double warm = 0;
    for (int i = 0; i < 3; i++) {
        rlai_token q[2048];
        int nq = build_prompt(e, 0, 2 + i, q, 2048);   /* same lore, new turn */
        warm += ttft(e, q, nq, &reused) / 3;
    }
    double rot = 0;
    int rot_reused = 0, rounds = 16;
    for (int i = 0; i < rounds; i++) {
        rlai_token q[2048];
        int nq = build_prompt(e, i % 8, 10 + i, q, 2048);
        int r = 0;
        rot += ttft(e, q, nq, &r) / rounds;
        rot_reused += r / rounds;
    }
    printf("%-34s %12s %14s %10s\n", "TTFT (1,500-token lore + turn)", "ms", "tokens reused", "speed-up");
    printf("%-34s %12.1f %14d %10s\n", "cold, prefix cache off (baseline)", cold, 0, "1.0x");
    printf("%-34s %12.1f %14d %9.1fx\n", "cached, same lore", warm, reused, cold / warm);
    printf("%-34s %12.1f %14d %9.1fx\n", "cached, 8 lores in rotation", rot, rot_reused, cold / rot);
    printf("\n%-34s %12s %12s %16s %10s\n", "burst: 4 turns, one new lore", "all ms", "mean TTFT", "tokens computed",
           "speed-up");
    printf("%-34s %12.1f %12.1f %16d %10s\n", "prefix cache off (baseline)", b_all[0], b_ttft[0], b_comp[0], "1.0x");
    printf("%-34s %12.1f %12.1f %16d %9.1fx\n", "on: the others wait for its blocks", b_all[1], b_ttft[1],
           b_comp[1], b_all[0] / b_all[1]);

streams:
    /* 3. Aggregate decode throughput with N concurrent streams. */
    printf("\n%-10s %16s %12s\n", "streams", "decode tok/s", "vs 1 stream");
    double base = 0;
    int counts[4] = { 1, 4, 8, 16 };
    for (int c = 0; c < 4; c++) {
        int N = counts[c];
        res r[16];
        memset(r, 0, sizeof(r));
        rlai_token p[64];
        const char *txt = "Tell me a story about a lighthouse.";
        int np = rlai_engine_tokenize(e, txt, strlen(txt), true, true, p, 64);
        for (int i = 0; i < N; i++) {
            rlai_request_params rp;
            memset(&rp, 0, sizeof(rp));
            rp.prompt = p;
            rp.n_prompt = np;
            rlai_gen_params_init(&rp.gen);
            rp.gen.max_tokens = 64;
            rp.gen.ignore_eos = true;
            rp.gen.sampling.temperature = 0.8f;
            rp.gen.sampling.seed = (uint64_t)i + 1;
            rp.on_done = on_done;
            rp.user = &r[i];
            rlai_engine_submit(e, &rp, NULL);
        }
        /* Prefill first, then time only the decode steps. */
        rlai_engine_step(e);
        double t0 = now_ms();
        run_idle(e);
        double dt = (now_ms() - t0) / 1e3;
        int toks = 0;
        for (int i = 0; i < N; i++)
            toks += r[i].m.gen_tokens - 1;
        double tps = toks / dt;
        if (N == 1)
            base = tps;
        printf("%-10d %16.1f %11.1fx\n", N, tps, tps / base);
    }
    rlai_engine_close(e);
    return 0;
}
