/* bench_engine.c - end-to-end CPU throughput on a real model.
 *
 *   bench_engine [-m MODEL] [--quick]
 *
 * Prints one table: prefill tok/s (512-token prompt) and decode tok/s
 * (128 generated tokens, plain decoding: speculation off) for 1 and 2
 * threads, with the run-time selected SIMD kernels and, as the baseline
 * measured in the same run, the scalar kernels. Also prints the bytes of
 * weights read per decoded token, the effective bandwidth that implies, a
 * plain memory read-bandwidth baseline, and peak resident memory against
 * the file + KV + 64 MiB budget. */
#include "rlai/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct { const float *p; size_t n; double sum; } rd_arg;

static void *read_worker(void *a)
{
    rd_arg *r = a;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (size_t i = 0; i + 8 <= r->n; i += 8) {
        s0 += r->p[i]; s1 += r->p[i + 1]; s2 += r->p[i + 2]; s3 += r->p[i + 3];
        s4 += r->p[i + 4]; s5 += r->p[i + 5]; s6 += r->p[i + 6]; s7 += r->p[i + 7];
    }
    r->sum = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    return NULL;
}

/* Read bandwidth in GB/s over a 256 MiB buffer split across nt threads. */
static double read_bandwidth(int nt)
{
    size_t n = (256u << 20) / sizeof(float);
    float *buf = malloc(n * sizeof(float));
    if (!buf)
        return 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 7);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[8];
        rd_arg args[8];
        double t0 = now_s();
        for (int t = 0; t < nt; t++) {
            args[t] = (rd_arg){ buf + n / nt * t, n / nt, 0 };
            pthread_create(&th[t], NULL, read_worker, &args[t]);
        }
        for (int t = 0; t < nt; t++)
            pthread_join(th[t], NULL);
        double dt = now_s() - t0;
        double gbs = n * sizeof(float) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    free(buf);
    return best;
}

typedef struct result { double prefill, decode; } result;

static int run_case(const char *model, rlai_isa isa, int threads, int n_prefill, int n_decode, int reps,
                    result *res, rlai_model_info *mi_out)
{
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.isa = isa;
    ep.n_threads = threads;
    ep.n_ctx = 1024;
    rlai_engine *e;
    char err[512];
    int rc = rlai_engine_open(model, &ep, &e, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "bench: %s\n", err);
        return rc;
    }
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    if (mi_out)
        *mi_out = mi;
    /* A 512-token prompt made of ordinary text ids (not special tokens). */
    rlai_token *prompt = malloc(sizeof(rlai_token) * (size_t)n_prefill);
    const char *text = "The old lighthouse keeper climbed the stairs every evening, counting the "
                       "steps and listening to the sea. ";
    rlai_token chunk[64];
    int nc = rlai_engine_tokenize(e, text, strlen(text), false, false, chunk, 64);
    if (!prompt || nc <= 0 || nc > 64) {
        free(prompt);
        rlai_engine_close(e);
        return RLAI_ERR_NOMEM;
    }
    for (int i = 0; i < n_prefill; i++)
        prompt[i] = chunk[i % nc];
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.ignore_eos = true;
    /* Plain decoding: the engine's default (auto) drafts, and this prompt
     * repeats one sentence, so prompt lookup would predict most tokens and
     * the bandwidth figure below would be meaningless. bench_spec
     * measures speculation. */
    gp.spec = RLAI_SPEC_OFF;
    res->prefill = res->decode = 0;
    for (int r = 0; r < reps; r++) {
        rlai_gen_metrics m;
        gp.max_tokens = 1;
        if ((rc = rlai_engine_generate_tokens(e, prompt, n_prefill, &gp, NULL, NULL, &m)) < 0)
            break;
        if (m.prefill_tps > res->prefill)
            res->prefill = m.prefill_tps;
        gp.max_tokens = n_decode + 1;   /* first token comes from the prompt's forward */
        if ((rc = rlai_engine_generate_tokens(e, prompt, 8, &gp, NULL, NULL, &m)) < 0)
            break;
        if (m.decode_tps > res->decode)
            res->decode = m.decode_tps;
    }
    free(prompt);
    rlai_engine_close(e);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = getenv("RLAI_MODEL");
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
    }
    if (!model)
        model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    struct stat st;
    if (stat(model, &st) != 0) {
        fprintf(stderr, "bench: model %s not found (run scripts/setup.sh)\n", model);
        return 1;
    }
    int reps = quick ? 1 : 3;
    printf("model: %s (%.1f MiB)\n", model, st.st_size / 1048576.0);
    printf("%-8s %-7s %8s %14s %14s\n", "kernels", "threads", "", "prefill tok/s", "decode tok/s");
    printf("%-8s %-7s %8s %14s %14s\n", "", "", "", "(512 prompt)", "(128 tokens)");
    rlai_model_info mi;
    memset(&mi, 0, sizeof(mi));
    result base[2] = { { 0, 0 }, { 0, 0 } };
    for (int t = 1; t <= 2; t++) {
        result r;
        /* Scalar baseline: fewer tokens, it is slow; rates are per token. */
        if (run_case(model, RLAI_ISA_SCALAR, t, 128, 32, 1, &r, NULL) == 0) {
            base[t - 1] = r;
            printf("%-8s %-7d %8s %14.1f %14.1f\n", "scalar", t, "baseline", r.prefill, r.decode);
        }
    }
    const char *isa_name = "auto";
    for (int t = 1; t <= 2; t++) {
        result r;
        if (run_case(model, RLAI_ISA_AUTO, t, 512, 128, reps, &r, &mi) != 0)
            return 1;
        isa_name = mi.isa;
        printf("%-8s %-7d %8s %14.1f %14.1f   (x%.1f / x%.1f vs scalar)\n", isa_name, t, "", r.prefill,
               r.decode, base[t - 1].prefill > 0 ? r.prefill / base[t - 1].prefill : 0,
               base[t - 1].decode > 0 ? r.decode / base[t - 1].decode : 0);
        if (t == 2) {
            double bytes = (double)mi.weight_bytes;
            printf("\nweights read per decoded token: %.1f MiB -> %.1f GB/s at %.1f tok/s (2 threads)\n",
                   bytes / 1048576.0, bytes * r.decode / 1e9, r.decode);
            printf("decode FLOPs per token: %.2f GFLOP; prefill at %.1f tok/s = %.1f GFLOP/s\n",
                   2.0 * mi.n_params / 1e9, r.prefill, 2.0 * mi.n_params * r.prefill / 1e9);
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);   /* before the bandwidth buffer exists */
    printf("memory read bandwidth baseline: %.1f GB/s (1 thread), %.1f GB/s (2 threads)\n",
           read_bandwidth(1), read_bandwidth(2));
    double kv_mib = 1024.0 * 2 * mi.n_layer * mi.n_head_kv * mi.head_dim * 2 / 1048576.0;
    printf("peak RSS %.1f MiB; budget = file %.1f + KV(1024 ctx, f16) %.1f + 64 = %.1f MiB\n",
           ru.ru_maxrss / 1024.0, st.st_size / 1048576.0, kv_mib, st.st_size / 1048576.0 + kv_mib + 64);
    return 0;
}
