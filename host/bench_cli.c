/* bench_cli.c - `rlai bench` (see bench_cli.h). */
#include "bench_cli.h"
#include "rlai/clock.h"
#include "rlai/engine.h"
#include "rlai/error.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char bench_usage[] =
    "usage: rlai bench [-m FILE] [-p N] [-n N] [-b N] [-r N] [-t N] [--device D] [--kv-type T]\n"
    "                  [--spec MODE]\n"
    "end-to-end speed of a GGUF model, loaded in this process, as a llama-bench style table\n"
    "(mean ± standard deviation over the repetitions)\n"
    "  -m, --model FILE     GGUF model (default: the default model)\n"
    "  -p, --n-prompt N     prompt tokens of the pp and ttft rows (default 512; 0 = no pp/ttft rows)\n"
    "  -n, --n-gen N        generated tokens of the tg rows (default 128; 0 = no tg rows)\n"
    "  -b, --batch N        sequences decoding together in the batch row (default 4; 1 = no batch row)\n"
    "  -r, --repetitions N  repetitions of each test (default 5)\n"
    "  -t, --threads N      CPU threads (default: all online CPUs)\n"
    "      --device D       auto|cpu|cuda|cuda:N (default auto)\n"
    "      --kv-type T      f16|q8_0 (default f16)\n"
    "      --spec MODE      off|ngram|auto: speculative decoding in the tg rows (default off, as\n"
    "                       llama-bench: plain decoding; the runs are greedy, so auto = ngram)\n"
    "rows: ppP (prompt tokens/s), tgN (decode tokens/s), ttft pP (ms to the first token),\n"
    "      tgN xB (B sequences at once: all generated tokens / wall time, tokens/s)\n";

static int opt_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s) {
        fprintf(stderr, "rlai bench: %s: '%s' is not an integer\n", opt, s);
        return -1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "rlai bench: %s: %ld is out of range [%d, %d]\n", opt, v, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Random prompt ids away from the ends of the vocabulary (where special
 * tokens usually sit); a fresh sequence per call. */
static void random_prompt(rlai_token *t, int n, int n_vocab, uint64_t *state)
{
    int lo = n_vocab > 400 ? 200 : 0, span = n_vocab > 400 ? n_vocab - 400 : n_vocab;
    for (int i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (rlai_token)(lo + (int)((*state >> 33) % (uint64_t)span));
    }
}

typedef struct stat_acc { double v[64]; int n; } stat_acc;

static void acc_add(stat_acc *a, double v)
{
    if (a->n < 64)
        a->v[a->n++] = v;
}

static void acc_get(const stat_acc *a, double *mean, double *sd)
{
    double s = 0;
    for (int i = 0; i < a->n; i++)
        s += a->v[i];
    *mean = a->n ? s / a->n : 0;
    double q = 0;
    for (int i = 0; i < a->n; i++)
        q += (a->v[i] - *mean) * (a->v[i] - *mean);
    *sd = a->n > 1 ? sqrt(q / (a->n - 1)) : 0;
}

typedef struct batch_state { int done; int gen; int failed; } batch_state;

static void batch_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    batch_state *b = user;
    b->done++;
    if (status < 0)
        b->failed = status;
    else if (m)
        b->gen += m->gen_tokens;
}

/* B sequences of n_gen tokens each, submitted together. Returns the
 * aggregate tokens/s, or a negative error. */
static double run_batch(rlai_engine *e, int B, int n_gen, int n_vocab, uint64_t *rng)
{
    enum { BATCH_PROMPT = 8 };
    batch_state st = { 0, 0, 0 };
    rlai_token toks[BATCH_PROMPT];
    double t0 = rlai_clock_s();
    for (int i = 0; i < B; i++) {
        random_prompt(toks, BATCH_PROMPT, n_vocab, rng);
        rlai_request_params rp;
        memset(&rp, 0, sizeof(rp));
        rp.prompt = toks;
        rp.n_prompt = BATCH_PROMPT;
        rlai_gen_params_init(&rp.gen);
        rp.gen.max_tokens = n_gen;
        rp.gen.ignore_eos = true;
        rp.on_done = batch_done;
        rp.user = &st;
        uint64_t id;
        int rc = rlai_engine_submit(e, &rp, &id);
        if (rc < 0)
            return rc;
    }
    while (st.done < B) {
        int rc = rlai_engine_step(e);
        if (rc < 0)
            return rc;
        if (rc == 0 && st.done < B)
            return RLAI_ERR_PROTOCOL;
    }
    double dt = rlai_clock_s() - t0;
    if (st.failed < 0)
        return st.failed;
    return dt > 0 ? st.gen / dt : 0;
}

typedef struct row { char test[32]; char value[48]; } row;

int rlai_bench_cli_main(int argc, char **argv, const char *default_model)
{
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "n-prompt", required_argument, 0, 'p' },
        { "n-gen", required_argument, 0, 'n' }, { "batch", required_argument, 0, 'b' },
        { "repetitions", required_argument, 0, 'r' }, { "threads", required_argument, 0, 't' },
        { "device", required_argument, 0, 'D' }, { "kv-type", required_argument, 0, 'K' },
        { "spec", required_argument, 0, 'S' },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
    };
    const char *model = default_model;
    int n_prompt = 512, n_gen = 128, batch = 4, reps = 5, c, li = -1, bad = 0;
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    /* The engine's default (auto) drafts: without this the tg rows would
     * time prompt-lookup speculation, not the decoding llama-bench's rows
     * time. */
    ep.spec = RLAI_SPEC_OFF;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:b:r:t:h", opts, &li)) != -1) {
        char name[32];
        if (li >= 0)
            snprintf(name, sizeof(name), "--%s", opts[li].name);
        else
            snprintf(name, sizeof(name), "-%c", c > 0 && c < 128 ? c : '?');
        li = -1;
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': bad |= opt_int(name, optarg, 0, 1 << 16, &n_prompt); break;
        case 'n': bad |= opt_int(name, optarg, 0, 1 << 16, &n_gen); break;
        case 'b': bad |= opt_int(name, optarg, 1, 256, &batch); break;
        case 'r': bad |= opt_int(name, optarg, 1, 64, &reps); break;
        case 't': bad |= opt_int(name, optarg, 1, 256, &ep.n_threads); break;
        case 'D': ep.device = optarg; break;
        case 'K':
            if (!strcmp(optarg, "f16")) {
                ep.kv_type = RLAI_KV_F16;
            } else if (!strcmp(optarg, "q8_0")) {
                ep.kv_type = RLAI_KV_Q8_0;
            } else {
                fprintf(stderr, "rlai bench: --kv-type: '%s' is not one of f16, q8_0\n", optarg);
                bad = 1;
            }
            break;
        case 'S': {
            int sm = rlai_spec_mode_parse(optarg);
            if (sm == RLAI_SPEC_DRAFT) {
                fprintf(stderr, "rlai bench: --spec draft needs a draft model, which rlai bench does not load "
                                "(use off, ngram or auto)\n");
                bad = 1;
            } else if (sm < 0) {
                fprintf(stderr, "rlai bench: --spec %s (got '%s')\n", rlai_spec_mode_error(sm), optarg);
                bad = 1;
            } else {
                ep.spec = (rlai_spec_mode)sm;
            }
            break;
        }
        case 'h': fputs(bench_usage, stdout); return 0;
        default: fputs(bench_usage, stderr); return 2;
        }
    }
    if (bad)
        return 2;
    if (optind != argc) {
        fprintf(stderr, "rlai bench: unexpected argument '%s'\n%s", argv[optind], bench_usage);
        return 2;
    }
    if (n_prompt == 0 && n_gen == 0) {
        fprintf(stderr, "rlai bench: -p 0 and -n 0 leave nothing to measure\n");
        return 2;
    }
    /* Context and KV pool big enough for the longest test. */
    int one = n_prompt + n_gen + 16;
    int per_batch = 8 + n_gen + 16;
    ep.n_ctx = one > per_batch ? one : per_batch;
    int blocks_one = (one + 15) / 16 + 1, blocks_batch = batch * ((per_batch + 15) / 16 + 1);
    ep.kv_blocks = blocks_one > blocks_batch ? blocks_one : blocks_batch;
    ep.max_running = batch > 64 ? batch : 0;
    char err[768];
    rlai_engine *e;
    int rc = rlai_engine_open(model, &ep, &e, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai bench: cannot load model: %s\n", err);
        return 1;
    }
    rlai_engine_set_prefix_cache(e, false);
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int status = 0;
    rlai_token *prompt = malloc(sizeof(rlai_token) * (size_t)(n_prompt > 8 ? n_prompt : 8));
    if (!prompt) {
        rlai_engine_close(e);
        return 1;
    }
    stat_acc pp = { .n = 0 }, tg = { .n = 0 }, ttft = { .n = 0 }, bt = { .n = 0 };
    long long tg_drafted = 0, tg_accepted = 0;
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.ignore_eos = true;
    rlai_gen_metrics m;
    /* Warm-up: a short generation (page in the weights, spin up threads). */
    random_prompt(prompt, 8, mi.n_vocab, &rng);
    gp.max_tokens = 4;
    if ((rc = rlai_engine_generate_tokens(e, prompt, 8, &gp, NULL, NULL, &m)) < 0)
        goto fail;
    for (int r = 0; r < reps; r++) {
        if (n_prompt > 0) {
            random_prompt(prompt, n_prompt, mi.n_vocab, &rng);
            gp.max_tokens = 1;
            if ((rc = rlai_engine_generate_tokens(e, prompt, n_prompt, &gp, NULL, NULL, &m)) < 0)
                goto fail;
            acc_add(&pp, m.prefill_tps);
            acc_add(&ttft, m.ttft_ms);
        }
        if (n_gen > 0) {
            random_prompt(prompt, 1, mi.n_vocab, &rng);
            gp.max_tokens = n_gen + 1;   /* the first token comes from the prefill */
            if ((rc = rlai_engine_generate_tokens(e, prompt, 1, &gp, NULL, NULL, &m)) < 0)
                goto fail;
            acc_add(&tg, m.decode_tps);
            tg_drafted += m.drafted_tokens;
            tg_accepted += m.accepted_tokens;
            if (batch > 1) {
                double tps = run_batch(e, batch, n_gen, mi.n_vocab, &rng);
                if (tps < 0) {
                    rc = (int)tps;
                    goto fail;
                }
                acc_add(&bt, tps);
            }
        }
    }
    row rows[4];
    int nr = 0;
    double mean, sd;
    if (n_prompt > 0) {
        acc_get(&pp, &mean, &sd);
        snprintf(rows[nr].test, sizeof(rows[nr].test), "pp%d", n_prompt);
        snprintf(rows[nr++].value, sizeof(rows[0].value), "%.2f ± %.2f", mean, sd);
    }
    if (n_gen > 0) {
        acc_get(&tg, &mean, &sd);
        snprintf(rows[nr].test, sizeof(rows[nr].test), "tg%d", n_gen);
        snprintf(rows[nr++].value, sizeof(rows[0].value), "%.2f ± %.2f", mean, sd);
    }
    if (n_prompt > 0) {
        acc_get(&ttft, &mean, &sd);
        snprintf(rows[nr].test, sizeof(rows[nr].test), "ttft p%d", n_prompt);
        snprintf(rows[nr++].value, sizeof(rows[0].value), "%.2f ± %.2f ms", mean, sd);
    }
    if (n_gen > 0 && batch > 1) {
        acc_get(&bt, &mean, &sd);
        snprintf(rows[nr].test, sizeof(rows[nr].test), "tg%d x%d", n_gen, batch);
        snprintf(rows[nr++].value, sizeof(rows[0].value), "%.2f ± %.2f", mean, sd);
    }
    /* The columns of llama-bench's markdown table. */
    char mname[96], size[32], params[32], backend[48], threads[16];
    const char *base = strrchr(model, '/');
    snprintf(mname, sizeof(mname), "%s %s", mi.name && *mi.name ? mi.name : (base ? base + 1 : model), mi.arch);
    struct stat fst;
    double bytes = stat(model, &fst) == 0 ? (double)fst.st_size : (double)mi.weight_bytes;
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(size, sizeof(size), "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else
        snprintf(size, sizeof(size), "%.2f MiB", bytes / (1024.0 * 1024));
    if (mi.n_params >= 1000000000ull)
        snprintf(params, sizeof(params), "%.2f B", mi.n_params / 1e9);
    else
        snprintf(params, sizeof(params), "%.2f M", mi.n_params / 1e6);
    if (!strcmp(mi.device, "cpu"))
        snprintf(backend, sizeof(backend), "CPU (%s)", mi.isa);
    else
        snprintf(backend, sizeof(backend), "%s", mi.device);
    snprintf(threads, sizeof(threads), "%d", mi.n_threads);
    const char *head[7] = { "model", "size", "params", "backend", "threads", "test", "t/s" };
    int w[7];
    for (int k = 0; k < 7; k++)
        w[k] = (int)strlen(head[k]);
#define WIDEN(k, s) do { int l_ = (int)strlen(s); if (l_ > w[k]) w[k] = l_; } while (0)
    WIDEN(0, mname); WIDEN(1, size); WIDEN(2, params); WIDEN(3, backend); WIDEN(4, threads);
    for (int i = 0; i < nr; i++) {
        WIDEN(5, rows[i].test);
        /* "±" is two bytes, one column */
        int l = (int)strlen(rows[i].value) - 1;
        if (l > w[6])
            w[6] = l;
    }
#undef WIDEN
    printf("| %-*s | %*s | %*s | %-*s | %*s | %*s | %*s |\n", w[0], head[0], w[1], head[1], w[2], head[2],
           w[3], head[3], w[4], head[4], w[5], head[5], w[6], head[6]);
    putchar('|');
    for (int k = 0; k < 7; k++) {
        bool right = k != 0 && k != 3;   /* numbers right-aligned, as llama-bench */
        putchar(' ');
        for (int i = 0; i < w[k] - 1; i++)
            putchar('-');
        printf(right ? ": |" : "- |");
    }
    putchar('\n');
    for (int i = 0; i < nr; i++)
        printf("| %-*s | %*s | %*s | %-*s | %*s | %*s | %*s |\n", w[0], mname, w[1], size, w[2], params,
               w[3], backend, w[4], threads, w[5], rows[i].test, w[6] + 1, rows[i].value);
    printf("\n%d repetitions; prefix cache off; prompts of random token ids", reps);
    if (n_gen > 0 && batch > 1)
        printf("; batch row: %d sequences of %d tokens at once, 8-token prompts", batch, n_gen);
    printf("\nspeculative decoding: %s; tg runs: %lld tokens drafted, %lld accepted\n",
           ep.spec == RLAI_SPEC_OFF ? "off (--spec ngram to time it)" : ep.spec == RLAI_SPEC_NGRAM ? "ngram" : "auto",
           tg_drafted, tg_accepted);
    goto out;
fail:
    fprintf(stderr, "rlai bench: a run failed: %s\n", rlai_strerror(rc));
    status = 1;
out:
    free(prompt);
    rlai_engine_close(e);
    return status;
}
