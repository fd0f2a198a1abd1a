/* main.c - the `rlai` command: one binary with subcommands.
 *
 * Implemented in this build: run (in-process generation, streamed),
 * tokenize, info. The daemon-side subcommands (serve, chat, call, plugins,
 * stats, fit, bench) answer with a clear "not implemented" error. */
#include "rlai/engine.h"
#include "gguf.h"
#include "tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: rlai <command> [options]\n"
        "\n"
        "commands:\n"
        "  run [options] \"prompt\"      generate an answer in-process and stream it\n"
        "  tokenize -m FILE \"text\"     print token ids (no BOS, special tokens not parsed)\n"
        "  info [-m FILE]               print model hyperparameters and kernel choice\n"
        "  serve chat call plugins stats fit bench   (not implemented in this build)\n"
        "\n"
        "run options:\n"
        "  -m, --model FILE      GGUF model (default: $RLAI_MODEL, ./models/" DEFAULT_MODEL_FILE ")\n"
        "  -t, --threads N       CPU threads (default: all online CPUs)\n"
        "  -n, --max-tokens N    tokens to generate (default 256)\n"
        "  -c, --ctx N           context length (default: model's, at most 8192)\n"
        "      --temp X          temperature (default 0 = greedy)\n"
        "      --top-k N, --top-p X, --min-p X, --repeat-penalty X, --seed N\n"
        "      --system TEXT     system prompt (default: the model template's own)\n"
        "      --raw             send the prompt as is, without the chat template\n"
        "      --isa auto|scalar|avx2|avx512\n"
        "      --precise         f32 activations (reference mode, slower)\n"
        "      --local           run in this process (the only mode in this build)\n");
}

/* Finds the default model: $RLAI_MODEL, ./models/, or models/ next to the
 * source tree the binary was built in (<exe>/../../models). */
static const char *default_model(char *buf, size_t cap)
{
    const char *env = getenv("RLAI_MODEL");
    if (env && *env)
        return env;
    snprintf(buf, cap, "models/%s", DEFAULT_MODEL_FILE);
    if (access(buf, R_OK) == 0)
        return buf;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = 0;
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash)
                break;
            *slash = 0;
            int w = snprintf(buf, cap, "%s/models/%s", exe, DEFAULT_MODEL_FILE);
            if (w > 0 && (size_t)w < cap && access(buf, R_OK) == 0)
                return buf;
        }
    }
    snprintf(buf, cap, "models/%s", DEFAULT_MODEL_FILE);
    return buf;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s)
        return -1;
    *out = v;
    return 0;
}

static int stream_cb(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)user;
    (void)tok;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

static int parse_isa(const char *s, rlai_isa *isa)
{
    if (!strcmp(s, "auto")) *isa = RLAI_ISA_AUTO;
    else if (!strcmp(s, "scalar")) *isa = RLAI_ISA_SCALAR;
    else if (!strcmp(s, "avx2")) *isa = RLAI_ISA_AVX2;
    else if (!strcmp(s, "avx512")) *isa = RLAI_ISA_AVX512;
    else return -1;
    return 0;
}

enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REP, OPT_SEED, OPT_SYSTEM, OPT_RAW,
       OPT_ISA, OPT_PRECISE, OPT_LOCAL };

static int cmd_run(int argc, char **argv, bool info_only)
{
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "threads", required_argument, 0, 't' },
        { "max-tokens", required_argument, 0, 'n' }, { "ctx", required_argument, 0, 'c' },
        { "temp", required_argument, 0, OPT_TEMP }, { "top-k", required_argument, 0, OPT_TOPK },
        { "top-p", required_argument, 0, OPT_TOPP }, { "min-p", required_argument, 0, OPT_MINP },
        { "repeat-penalty", required_argument, 0, OPT_REP }, { "seed", required_argument, 0, OPT_SEED },
        { "system", required_argument, 0, OPT_SYSTEM }, { "raw", no_argument, 0, OPT_RAW },
        { "isa", required_argument, 0, OPT_ISA }, { "precise", no_argument, 0, OPT_PRECISE },
        { "local", no_argument, 0, OPT_LOCAL }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
    };
    char pathbuf[PATH_MAX];
    const char *model = NULL, *system = NULL;
    bool raw = false;
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    int c, bad = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:n:c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': bad |= parse_int(optarg, 1, 256, &ep.n_threads); break;
        case 'n': bad |= parse_int(optarg, 1, 1 << 20, &gp.max_tokens); break;
        case 'c': bad |= parse_int(optarg, 16, 1 << 20, &ep.n_ctx); break;
        case OPT_TEMP: bad |= parse_float(optarg, &gp.sampling.temperature); break;
        case OPT_TOPK: bad |= parse_int(optarg, 0, 1 << 24, &gp.sampling.top_k); break;
        case OPT_TOPP: bad |= parse_float(optarg, &gp.sampling.top_p); break;
        case OPT_MINP: bad |= parse_float(optarg, &gp.sampling.min_p); break;
        case OPT_REP: bad |= parse_float(optarg, &gp.sampling.repeat_penalty); break;
        case OPT_SEED: gp.sampling.seed = strtoull(optarg, NULL, 10); break;
        case OPT_SYSTEM: system = optarg; break;
        case OPT_RAW: raw = true; break;
        case OPT_ISA: bad |= parse_isa(optarg, &ep.isa); break;
        case OPT_PRECISE: ep.precise = true; break;
        case OPT_LOCAL: break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (bad) {
        fprintf(stderr, "rlai: invalid option value\n");
        return 2;
    }
    if (!info_only && optind != argc - 1) {
        fprintf(stderr, "rlai run: expected exactly one prompt argument\n");
        usage(stderr);
        return 2;
    }
    if (!model)
        model = default_model(pathbuf, sizeof(pathbuf));
    rlai_engine *e;
    char err[768];
    int rc = rlai_engine_open(model, &ep, &e, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai: cannot load model: %s\n", err);
        if (rc == RLAI_ERR_IO)
            fprintf(stderr, "rlai: run scripts/setup.sh to fetch the default model, or pass -m FILE\n");
        return 1;
    }
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    if (info_only) {
        printf("model      %s (%s)\n", mi.name, mi.arch);
        printf("params     %llu (%.1f MiB of weights)\n", (unsigned long long)mi.n_params,
               mi.weight_bytes / 1048576.0);
        printf("layers %d  embd %d  ff %d  heads %d/%d kv  head_dim %d  vocab %d  ctx %d (trained %d)\n",
               mi.n_layer, mi.n_embd, mi.n_ff, mi.n_head, mi.n_head_kv, mi.head_dim, mi.n_vocab,
               mi.n_ctx, mi.n_ctx_train);
        printf("kernels    %s, %d threads\n", mi.isa, mi.n_threads);
        rlai_engine_close(e);
        return 0;
    }
    const char *prompt = argv[optind];
    char *formatted = NULL;
    if (!raw) {
        rlai_chat_message msgs[2];
        int n = 0;
        if (system)
            msgs[n++] = (rlai_chat_message){ "system", system };
        msgs[n++] = (rlai_chat_message){ "user", prompt };
        if ((rc = rlai_engine_apply_chat(e, msgs, n, true, &formatted)) < 0) {
            fprintf(stderr, "rlai: chat template: %s\n", rlai_strerror(rc));
            rlai_engine_close(e);
            return 1;
        }
        prompt = formatted;
    }
    rlai_gen_metrics m;
    rc = rlai_engine_generate(e, prompt, &gp, stream_cb, NULL, &m);
    free(formatted);
    printf("\n");
    fflush(stdout);
    if (rc < 0) {
        fprintf(stderr, "rlai: generation failed: %s\n", rlai_strerror(rc));
        rlai_engine_close(e);
        return 1;
    }
    fprintf(stderr, "[prompt %d tok | TTFT %.1f ms | prefill %.1f tok/s | decode %.1f tok/s | %d tok | %s, %d threads]\n",
            m.prompt_tokens, m.ttft_ms, m.prefill_tps, m.decode_tps, m.gen_tokens, mi.isa, mi.n_threads);
    rlai_engine_close(e);
    return 0;
}

/* tokenize works on vocabulary-only files, so it uses the GGUF reader and
 * tokenizer directly rather than loading a model. */
static int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL;
    char pathbuf[PATH_MAX];
    int c;
    optind = 1;
    static const struct option opts[] = { { "model", required_argument, 0, 'm' }, { 0, 0, 0, 0 } };
    while ((c = getopt_long(argc, argv, "m:", opts, NULL)) != -1) {
        if (c == 'm')
            model = optarg;
        else
            return 2;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: rlai tokenize -m FILE.gguf \"text\"\n");
        return 2;
    }
    if (!model)
        model = default_model(pathbuf, sizeof(pathbuf));
    char err[512];
    rlai_gguf *g;
    int rc = rlai_gguf_open_file(model, &g, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai: %s: %s\n", model, err);
        return 1;
    }
    rlai_tokenizer *t;
    rc = rlai_tokenizer_load(g, &t, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai: %s: %s\n", model, err);
        rlai_gguf_close(g);
        return 1;
    }
    const char *text = argv[optind];
    size_t len = strlen(text);
    int n = rlai_tokenizer_encode(t, text, len, false, false, NULL, 0);
    int32_t *ids = n > 0 ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
    if (n > 0 && ids)
        n = rlai_tokenizer_encode(t, text, len, false, false, ids, n);
    if (n < 0 || (n > 0 && !ids)) {
        fprintf(stderr, "rlai: tokenize failed: %s\n", rlai_strerror(n < 0 ? n : RLAI_ERR_NOMEM));
        free(ids);
        rlai_tokenizer_free(t);
        rlai_gguf_close(g);
        return 1;
    }
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    rlai_tokenizer_free(t);
    rlai_gguf_close(g);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run"))
        return cmd_run(argc - 1, argv + 1, false);
    if (!strcmp(cmd, "info"))
        return cmd_run(argc - 1, argv + 1, true);
    if (!strcmp(cmd, "tokenize"))
        return cmd_tokenize(argc - 1, argv + 1);
    static const char *const later[] = { "serve", "chat", "call", "plugins", "stats", "fit", "bench" };
    for (size_t i = 0; i < sizeof(later) / sizeof(later[0]); i++) {
        if (!strcmp(cmd, later[i])) {
            fprintf(stderr, "rlai %s: not implemented in this build (%s)\n", cmd,
                    rlai_strerror(RLAI_ERR_NOT_IMPLEMENTED));
            return 2;
        }
    }
    fprintf(stderr, "rlai: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
