/* main.c - the `rlai` command: one binary with subcommands.
 *
 * serve runs the engine daemon; run, chat and stats are clients of a
 * running engine (run and chat take --local to load the model in-process);
 * tokenize and info read a model file directly; call and plugins are
 * clients for plugin commands (cli_call.c); fit estimates memory and
 * speed through the fit plugin, in-process (fit_cli.c); bench measures speed
 * in-process (bench_cli.c); the chat loop is chat_repl.c. */
#include "rlai/client.h"
#include "rlai/engine.h"
#include "rlai/vocab.h"
#include "bench_cli.h"
#include "chat_repl.h"
#include "cli_call.h"
#include "fit_cli.h"
#include "gassist_manifest.h"
#include "config.h"
#include "sampling_limits.h"
#include "daemon.h"
#include "serve_lock.h"
#include "json_msgpack.h"

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <pthread.h>
#include <signal.h>

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static const char *run_options(void);

static void usage(FILE *f)
{
    fprintf(f,
        "usage: rlai <command> [options]\n"
        "\n"
        "commands:\n"
        "  serve [options]              run the engine daemon (see rlai serve --help)\n"
        "  run [options] \"prompt\"      ask the running engine and stream the answer\n"
        "  chat [options]               interactive multi-turn chat with the running engine\n"
        "  stats [--endpoint E]         engine statistics\n"
        "  tokenize -m FILE \"text\"     print token ids (no BOS, special tokens not parsed)\n"
        "  info [-m FILE]               print model hyperparameters and kernel choice\n"
        "  call plugin.verb '{json}'    call a plugin command of the running engine\n"
        "  plugins                      list loaded plugins and their commands\n"
        "  fit MODEL --gpu NAME         can it run? memory and speed estimate (rlai fit --help)\n"
        "  gassist manifest [-o FILE]   G-Assist plugin manifest.json from the engine's commands\n"
        "  bench [-m FILE] [-p N -n N -b N -r N]  llama-bench style speed table (rlai bench --help)\n"
        "\n"
        "COMMAND --help prints the options of that command.\n"
        "\n"
        "run options:\n%s", run_options());
}

/* The usage of run, chat or info (COMMAND --help). */
static void run_usage(FILE *f, const char *cmd)
{
    if (!strcmp(cmd, "chat"))
        fprintf(f, "usage: rlai chat [options]\n"
                   "interactive multi-turn chat: /help lists the commands (/reset, /system TEXT, /save FILE);\n"
                   "Ctrl-C stops a reply, Ctrl-C at an empty prompt or Ctrl-D quits\n");
    else if (!strcmp(cmd, "info"))
        fprintf(f, "usage: rlai info [-m FILE] [--device D] [--isa I] [-t N] [-c N]\n"
                   "print model hyperparameters and kernel choice (loads the model in-process)\n");
    else
        fprintf(f, "usage: rlai run [options] PROMPT\n"
                   "       rlai run [options] -          (or piped stdin: the prompt is read from stdin)\n");
    fprintf(f, "\noptions:\n%s", run_options());
}

static const char *run_options(void)
{
    return
        "  -m, --model FILE      GGUF model (default: $RLAI_MODEL, ./models/" DEFAULT_MODEL_FILE ")\n"
        "  -t, --threads N       CPU threads (default: all online CPUs)\n"
        "  -n, --max-tokens N    tokens to generate (default 256)\n"
        "  -c, --ctx N           context length (default: model's, at most 8192)\n"
        "      --temp X          temperature (default 0.8; 0 = greedy)\n"
        "      --top-k N, --top-p X, --min-p X, --repeat-penalty X, --seed N\n"
        "                        (defaults 40, 0.95, 0.05, off, fresh per run: docs/DEFAULTS.md)\n"
        "      --system TEXT     system prompt (default: the model template's own)\n"
        "      --raw             send the prompt as is, without the chat template\n"
        "      --ignore-eos      keep generating past end-of-generation tokens\n"
        "      --device D        compute device: auto|cpu|cuda|cuda:N (in-process; default auto)\n"
        "      --spec MODE       speculative decoding: off|ngram|draft|auto (auto = the engine's setting)\n"
        "      --spec-max-draft N  longest draft per step, 1..16\n"
        "      --prediction FILE  run only: text the answer is expected to repeat (e.g. the file\n"
        "                        an edit returns); drafted from, the answer is the same\n"
        "      --draft-model FILE  a small GGUF with the model's tokenizer that drafts (in-process)\n"
        "      --isa auto|scalar|avx2|avx512  CPU kernels (in-process)\n"
        "      --precise         f32 activations (reference mode, slower)\n"
        "      --kv-type f16|q8_0  KV cache element type (in-process; default f16)\n"
        "      --local           load the model in this process instead of using the engine\n"
        "      --endpoint E      engine endpoint: ipc://PATH, tcp://HOST:PORT or unix://PATH\n"
        "                        (default: the private ZeroMQ socket of `rlai serve`)\n";
}

/* Default plugin folder: $RLAI_PLUGIN_DIR, else plugins/ next to the
 * binary's folder (<exe>/../plugins: build/plugins in the build tree),
 * else the install folder (<libdir>/rlai/plugins). Returns buf, or NULL
 * when there is none. */
static const char *default_plugins_dir(char *buf, size_t cap)
{
    const char *env = getenv("RLAI_PLUGIN_DIR");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return buf;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = 0;
    int w = snprintf(buf, cap, "%s/../plugins", exe);
    if (w > 0 && (size_t)w < cap && access(buf, R_OK | X_OK) == 0)
        return buf;
#ifdef RLAI_PLUGIN_INSTALL_DIR
    w = snprintf(buf, cap, "%s", RLAI_PLUGIN_INSTALL_DIR);
    if (w > 0 && (size_t)w < cap && access(buf, R_OK | X_OK) == 0)
        return buf;
#endif
    return NULL;
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

/* The option being parsed ("--temp", "-n"), for the error messages of
 * the value parsers below; set by note_opt() before each value is read. */
static char g_opt[64] = "option";

static void note_opt(const struct option *opts, int longindex, int c)
{
    if (longindex >= 0)
        snprintf(g_opt, sizeof(g_opt), "--%s", opts[longindex].name);
    else if (c > 0 && c < 128)
        snprintf(g_opt, sizeof(g_opt), "-%c", c);
    else
        snprintf(g_opt, sizeof(g_opt), "option");
}

/* Value parsers: on a bad value each prints "rlai: --opt: 'abc' is not
 * a number" (or the range it must lie in) and returns -1. */
static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno == ERANGE && end != s && !*end) {
        fprintf(stderr, "rlai: %s: '%s' is out of range [%d, %d]\n", g_opt, s, lo, hi);
        return -1;
    }
    if (errno || *end || end == s) {
        fprintf(stderr, "rlai: %s: '%s' is not an integer\n", g_opt, s);
        return -1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "rlai: %s: %ld is out of range [%d, %d]\n", g_opt, v, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_float_in(const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || v != v) {
        fprintf(stderr, "rlai: %s: '%s' is not a number\n", g_opt, s);
        return -1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "rlai: %s: %s is out of range [%g, %g]\n", g_opt, s, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-' || !*s) {
        fprintf(stderr, "rlai: %s: '%s' is not a non-negative integer\n", g_opt, s);
        return -1;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || end == s) {
        fprintf(stderr, "rlai: %s: '%s' is not a non-negative integer\n", g_opt, s);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* Reads all of f into *out (malloc'd, NUL-terminated, *len bytes);
 * RLAI_ERR_TOO_LARGE past max bytes. */
static int read_stream(FILE *f, size_t max, char **out, size_t *len_out)
{
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (!buf)
        return RLAI_ERR_NOMEM;
    for (;;) {
        if (len > max) {
            free(buf);
            return RLAI_ERR_TOO_LARGE;
        }
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return RLAI_ERR_NOMEM;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                free(buf);
                return RLAI_ERR_IO;
            }
            break;
        }
    }
    buf[len] = 0;
    *out = buf;
    *len_out = len;
    return 0;
}

/* Reads all of stdin into *out (malloc'd, NUL-terminated); a trailing
 * newline is dropped. */
static int read_all_stdin(char **out)
{
    size_t len = 0;
    int rc = read_stream(stdin, (size_t)64 << 20, out, &len);
    if (rc < 0)
        return rc;
    while (len > 0 && ((*out)[len - 1] == '\n' || (*out)[len - 1] == '\r'))
        len--;
    (*out)[len] = 0;
    return 0;
}

/* Reads the file at path (at most max bytes) into *out (malloc'd). */
static int read_file_max(const char *path, size_t max, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return RLAI_ERR_IO;
    size_t len;
    int rc = read_stream(f, max, out, &len);
    fclose(f);
    return rc;
}

/* The last character streamed to stdout ('\n' before any): the metrics
 * line (stderr) must start on its own line, so end_line() adds a newline
 * only after text that does not end in one. */
static char g_last_out = '\n';

static void out_text(const char *text, size_t len)
{
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        g_last_out = text[len - 1];
    }
}

static void end_line(void)
{
    if (g_last_out != '\n')
        fputc('\n', stdout);
    fflush(stdout);
    g_last_out = '\n';
}

static int stream_cb(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)user;
    (void)tok;
    out_text(text, len);
    return 0;
}

static int parse_isa(const char *s, rlai_isa *isa)
{
    if (!strcmp(s, "auto")) *isa = RLAI_ISA_AUTO;
    else if (!strcmp(s, "scalar")) *isa = RLAI_ISA_SCALAR;
    else if (!strcmp(s, "avx2")) *isa = RLAI_ISA_AVX2;
    else if (!strcmp(s, "avx512")) *isa = RLAI_ISA_AVX512;
    else {
        fprintf(stderr, "rlai: %s: '%s' is not one of auto, scalar, avx2, avx512\n", g_opt, s);
        return -1;
    }
    return 0;
}

static int parse_kv_type(const char *s, rlai_kv_type *t)
{
    if (!strcmp(s, "f16")) *t = RLAI_KV_F16;
    else if (!strcmp(s, "q8_0")) *t = RLAI_KV_Q8_0;
    else {
        fprintf(stderr, "rlai: %s: '%s' is not one of f16, q8_0\n", g_opt, s);
        return -1;
    }
    return 0;
}

/* --spec MODE: off|ngram|draft|auto; a clear word for self (not built). */
static int parse_spec(const char *s, rlai_spec_mode *out)
{
    int m = rlai_spec_mode_parse(s);
    if (m < 0) {
        fprintf(stderr, "rlai: --spec %s (got '%s')\n", rlai_spec_mode_error(m), s);
        return -1;
    }
    *out = (rlai_spec_mode)m;
    return 0;
}

enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REP, OPT_SEED, OPT_SYSTEM, OPT_RAW,
       OPT_ISA, OPT_PRECISE, OPT_LOCAL, OPT_ENDPOINT, OPT_IGNORE_EOS, OPT_KV, OPT_DEVICE, OPT_SPEC,
       OPT_SPEC_DRAFT, OPT_DRAFT_MODEL, OPT_PREDICTION };

typedef enum { MODE_RUN, MODE_CHAT, MODE_INFO } run_mode;

/* Where generation happens: an in-process engine (--local) or a client
 * connection to `rlai serve`. */
typedef struct session {
    rlai_engine *engine;
    rlai_client *client;
    rlai_gen_params gp;
    rlai_msg_gen wire;        /* the same options as sent on the wire */
    const char *isa_name;
    int n_threads;
} session;

/* The metrics line after an answer; the speculative part only when the
 * request drafted. */
static void print_metrics(int prompt, double ttft, double pre, double dec, int gen, int drafted, int accepted,
                          const char *where)
{
    char spec[96] = "";
    if (drafted > 0)
        snprintf(spec, sizeof(spec), "drafted %d, accepted %d (%.0f%%) | ", drafted, accepted,
                 100.0 * accepted / drafted);
    fprintf(stderr, "[prompt %d tok | TTFT %.1f ms | prefill %.1f tok/s | decode %.1f tok/s | %d tok | %s%s]\n",
            prompt, ttft, pre, dec, gen, spec, where);
}

/* Streams one answer over the client connection; appends the text to
 * *reply (malloc'd) when reply != NULL. */
static int remote_generate(session *ss, const char *raw_prompt, const rlai_chat_message *msgs, int n_msgs,
                           char **reply)
{
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.version = RLAI_PROTO_VERSION;
    m.id = rlai_client_next_id(ss->client);
    rlai_msg_chat_message *cm = NULL;
    if (raw_prompt) {
        m.type = RLAI_MSG_GENERATE;
        m.u.generate.prompt = (char *)raw_prompt;
        m.u.generate.gen = ss->wire;
    } else {
        m.type = RLAI_MSG_CHAT;
        cm = calloc((size_t)n_msgs, sizeof(*cm));
        if (!cm)
            return RLAI_ERR_NOMEM;
        for (int i = 0; i < n_msgs; i++) {
            cm[i].role = (char *)msgs[i].role;
            cm[i].content = (char *)msgs[i].content;
        }
        m.u.chat.messages = cm;
        m.u.chat.n_messages = (uint32_t)n_msgs;
        m.u.chat.gen = ss->wire;
    }
    int rc = rlai_client_send(ss->client, &m);
    free(cm);
    if (rc < 0) {
        fprintf(stderr, "rlai: send failed: %s\n", rlai_strerror(rc));
        return rc;
    }
    size_t rlen = 0;
    bool cancel_sent = false;
    for (;;) {
        rlai_msg f;
        /* Short waits so that Ctrl-C in rlai chat is noticed: it cancels
         * the request, whose stream then ends with done or error. */
        if (!cancel_sent && rlai_chat_repl_interrupted()) {
            rlai_client_cancel(ss->client, m.id);
            cancel_sent = true;
        }
        rc = rlai_client_recv(ss->client, 100, &f);
        if (rc == RLAI_ERR_TIMEOUT)
            continue;
        if (rc < 0) {
            end_line();
            fprintf(stderr, "rlai: %s\n", rlai_strerror(rc));
            return rc;
        }
        if (f.id != m.id) {
            rlai_msg_free(&f);
            continue;
        }
        if (f.type == RLAI_MSG_TOKEN) {
            size_t n = f.u.token.text ? strlen(f.u.token.text) : 0;
            out_text(f.u.token.text, n);
            if (reply && n) {
                char *r = realloc(*reply, rlen + n + 1);
                if (r) {
                    memcpy(r + rlen, f.u.token.text, n);
                    rlen += n;
                    r[rlen] = 0;
                    *reply = r;
                }
            }
        } else if (f.type == RLAI_MSG_DONE) {
            end_line();
            const rlai_msg_metrics *mt = &f.u.done.metrics;
            char where[96];
            snprintf(where, sizeof(where), "engine, queued %.1f ms, stop %s", mt->queue_ms,
                     f.u.done.stop ? f.u.done.stop : "");
            print_metrics((int)mt->prompt_tokens, mt->ttft_ms, mt->prefill_tps, mt->decode_tps,
                          (int)mt->gen_tokens, (int)mt->drafted_tokens, (int)mt->accepted_tokens, where);
            rlai_msg_free(&f);
            return 0;
        } else if (f.type == RLAI_MSG_ERROR && cancel_sent) {
            /* Ctrl-C in rlai chat ended it (e.g. cancelled while queued):
             * the turn keeps what streamed so far. */
            end_line();
            fprintf(stderr, "[stopped: %s]\n", f.u.error.name ? f.u.error.name : "cancelled");
            rlai_msg_free(&f);
            return 0;
        } else if (f.type == RLAI_MSG_ERROR) {
            end_line();
            fprintf(stderr, "rlai: engine error %s: %s\n", f.u.error.name ? f.u.error.name : "?",
                    f.u.error.msg ? f.u.error.msg : "");
            rlai_msg_free(&f);
            return RLAI_ERR_PROTOCOL;
        }
        rlai_msg_free(&f);
    }
}

typedef struct local_sink { char *reply; size_t len; } local_sink;

static int local_cb(void *user, rlai_token tok, const char *text, size_t len)
{
    local_sink *ls = user;
    stream_cb(NULL, tok, text, len);
    if (rlai_chat_repl_interrupted())
        return 1;   /* Ctrl-C in rlai chat: stop this reply */
    if (ls && len) {
        char *r = realloc(ls->reply, ls->len + len + 1);
        if (r) {
            memcpy(r + ls->len, text, len);
            ls->len += len;
            r[ls->len] = 0;
            ls->reply = r;
        }
    }
    return 0;
}

static int local_generate(session *ss, const char *raw_prompt, const rlai_chat_message *msgs, int n_msgs,
                          char **reply)
{
    int rc;
    rlai_gen_metrics m;
    local_sink ls = { NULL, 0 };
    if (!raw_prompt) {
        /* Message content is never parsed for special tokens. */
        rlai_token *toks = NULL;
        int n = 0;
        if ((rc = rlai_engine_tokenize_chat(ss->engine, msgs, n_msgs, true, &toks, &n)) < 0) {
            fprintf(stderr, "rlai: chat template: %s\n", rlai_strerror(rc));
            return rc;
        }
        rc = rlai_engine_generate_tokens(ss->engine, toks, n, &ss->gp, local_cb, &ls, &m);
        free(toks);
    } else {
        rc = rlai_engine_generate(ss->engine, raw_prompt, &ss->gp, local_cb, &ls, &m);
    }
    end_line();
    if (reply)
        *reply = ls.reply;
    else
        free(ls.reply);
    if (rc < 0) {
        fprintf(stderr, "rlai: generation failed: %s\n", rlai_strerror(rc));
        return rc;
    }
    char where[64];
    snprintf(where, sizeof(where), "in-process, %s, %d threads", ss->isa_name, ss->n_threads);
    print_metrics(m.prompt_tokens, m.ttft_ms, m.prefill_tps, m.decode_tps, m.gen_tokens, m.drafted_tokens,
                  m.accepted_tokens, where);
    return 0;
}

static int session_generate(session *ss, const char *raw_prompt, const rlai_chat_message *msgs, int n_msgs,
                            char **reply)
{
    return ss->engine ? local_generate(ss, raw_prompt, msgs, n_msgs, reply)
                      : remote_generate(ss, raw_prompt, msgs, n_msgs, reply);
}

/* `rlai chat`: the loop lives in chat_repl.c; each turn comes here. */
static int chat_generate(void *user, const rlai_chat_message *msgs, int n, char **reply)
{
    return session_generate(user, NULL, msgs, n, reply);
}

static int cmd_run(int argc, char **argv, run_mode mode)
{
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "threads", required_argument, 0, 't' },
        { "max-tokens", required_argument, 0, 'n' }, { "ctx", required_argument, 0, 'c' },
        { "temp", required_argument, 0, OPT_TEMP }, { "top-k", required_argument, 0, OPT_TOPK },
        { "top-p", required_argument, 0, OPT_TOPP }, { "min-p", required_argument, 0, OPT_MINP },
        { "repeat-penalty", required_argument, 0, OPT_REP }, { "seed", required_argument, 0, OPT_SEED },
        { "system", required_argument, 0, OPT_SYSTEM }, { "raw", no_argument, 0, OPT_RAW },
        { "isa", required_argument, 0, OPT_ISA }, { "precise", no_argument, 0, OPT_PRECISE },
        { "local", no_argument, 0, OPT_LOCAL }, { "endpoint", required_argument, 0, OPT_ENDPOINT },
        { "ignore-eos", no_argument, 0, OPT_IGNORE_EOS }, { "kv-type", required_argument, 0, OPT_KV },
        { "device", required_argument, 0, OPT_DEVICE }, { "spec", required_argument, 0, OPT_SPEC },
        { "spec-max-draft", required_argument, 0, OPT_SPEC_DRAFT },
        { "draft-model", required_argument, 0, OPT_DRAFT_MODEL },
        { "prediction", required_argument, 0, OPT_PREDICTION },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 }
    };
    char pathbuf[PATH_MAX];
    const char *model = NULL, *system = NULL, *endpoint = NULL, *prediction_file = NULL;
    bool raw = false, local = mode == MODE_INFO, device_set = false;
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    session ss;
    memset(&ss, 0, sizeof(ss));
    rlai_gen_params_init(&ss.gp);
    rlai_sampler_params_product(&ss.gp.sampling, rlai_fresh_seed());   /* docs/DEFAULTS.md */
    rlai_msg_gen *w = &ss.wire;
    int c, bad = 0, li = -1;
    const char *engine_only = NULL;   /* an option of the in-process engine, set without --local */
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:n:c:h", opts, &li)) != -1) {
        note_opt(opts, li, c);
        li = -1;
        switch (c) {
        case 'm': model = optarg; break;
        case 't': bad |= parse_int(optarg, 1, 256, &ep.n_threads); break;
        case 'n': bad |= parse_int(optarg, 1, 1 << 20, &ss.gp.max_tokens); w->max_tokens = ss.gp.max_tokens; w->has_max_tokens = true; break;
        case 'c': bad |= parse_int(optarg, 16, 1 << 20, &ep.n_ctx); break;
        case OPT_TEMP: bad |= parse_float_in(optarg, RLAI_LIM_TEMPERATURE_MIN, RLAI_LIM_TEMPERATURE_MAX, &ss.gp.sampling.temperature); w->temperature = ss.gp.sampling.temperature; w->has_temperature = true; break;
        case OPT_TOPK: bad |= parse_int(optarg, RLAI_LIM_TOP_K_MIN, RLAI_LIM_TOP_K_MAX, &ss.gp.sampling.top_k); w->top_k = ss.gp.sampling.top_k; w->has_top_k = true; break;
        case OPT_TOPP: bad |= parse_float_in(optarg, RLAI_LIM_TOP_P_MIN, RLAI_LIM_TOP_P_MAX, &ss.gp.sampling.top_p); w->top_p = ss.gp.sampling.top_p; w->has_top_p = true; break;
        case OPT_MINP: bad |= parse_float_in(optarg, RLAI_LIM_MIN_P_MIN, RLAI_LIM_MIN_P_MAX, &ss.gp.sampling.min_p); w->min_p = ss.gp.sampling.min_p; w->has_min_p = true; break;
        case OPT_REP: bad |= parse_float_in(optarg, RLAI_LIM_REPEAT_PENALTY_MIN, RLAI_LIM_REPEAT_PENALTY_MAX, &ss.gp.sampling.repeat_penalty); w->repeat_penalty = ss.gp.sampling.repeat_penalty; w->has_repeat_penalty = true; break;
        case OPT_SEED: bad |= parse_u64(optarg, &ss.gp.sampling.seed); w->seed = ss.gp.sampling.seed; w->has_seed = true; break;
        case OPT_SYSTEM: system = optarg; break;
        case OPT_RAW: raw = true; break;
        case OPT_ISA: bad |= parse_isa(optarg, &ep.isa); engine_only = "--isa"; break;
        case OPT_PRECISE: ep.precise = true; engine_only = "--precise"; break;
        case OPT_LOCAL: local = true; break;
        case OPT_ENDPOINT: endpoint = optarg; break;
        case OPT_IGNORE_EOS: ss.gp.ignore_eos = w->ignore_eos = true; break;
        case OPT_KV: bad |= parse_kv_type(optarg, &ep.kv_type); engine_only = "--kv-type"; break;
        case OPT_DEVICE: ep.device = optarg; device_set = true; break;
        case OPT_SPEC:
            bad |= parse_spec(optarg, &ss.gp.spec);
            w->spec = (int32_t)ss.gp.spec;
            w->has_spec = true;
            break;
        case OPT_SPEC_DRAFT:
            bad |= parse_int(optarg, RLAI_LIM_SPEC_MAX_DRAFT_MIN, RLAI_LIM_SPEC_MAX_DRAFT_MAX, &ss.gp.spec_max_draft);
            w->spec_max_draft = (uint32_t)ss.gp.spec_max_draft;
            w->has_spec_max_draft = true;
            break;
        case OPT_DRAFT_MODEL: ep.draft_model = optarg; engine_only = "--draft-model"; break;
        case OPT_PREDICTION: prediction_file = optarg; break;
        case 'h': run_usage(stdout, argv[0]); return 0;
        default: run_usage(stderr, argv[0]); return 2;
        }
    }
    if (bad)
        return 2;
    if (prediction_file && mode != MODE_RUN) {
        fprintf(stderr, "rlai: --prediction applies to rlai run (one answer)\n");
        return 2;
    }
    if (engine_only && !local) {
        fprintf(stderr, "rlai: %s applies to an in-process model: add --local (the running engine "
                        "chose it at start%s)\n", engine_only,
                !strcmp(engine_only, "--kv-type")       ? ": rlai serve --kv-type"
                : !strcmp(engine_only, "--draft-model") ? ": rlai serve --draft-model"
                                                        : "");
        return 2;
    }
    if (device_set && !local) {
        fprintf(stderr, "rlai: --device applies to an in-process model: add --local (the running engine "
                        "chose its device at start: rlai serve --device)\n");
        return 2;
    }
    /* `rlai run -`, or no prompt with stdin not a terminal: read stdin. */
    bool from_stdin = mode == MODE_RUN &&
                      ((optind == argc - 1 && !strcmp(argv[optind], "-")) || (optind == argc && !isatty(0)));
    if (mode == MODE_RUN && !from_stdin && optind != argc - 1) {
        fprintf(stderr, "rlai run: expected exactly one prompt argument (or - to read it from stdin)\n");
        run_usage(stderr, "run");
        return 2;
    }
    char *stdin_prompt = NULL;
    if (from_stdin) {
        int rr = read_all_stdin(&stdin_prompt);
        if (rr < 0) {
            fprintf(stderr, "rlai run: cannot read the prompt from stdin: %s\n", rlai_strerror(rr));
            return 1;
        }
        if (!*stdin_prompt) {
            fprintf(stderr, "rlai run: the prompt read from stdin is empty\n");
            free(stdin_prompt);
            return 2;
        }
    }
    if (mode != MODE_RUN && optind != argc) {
        fprintf(stderr, "rlai: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    int rc;
    char err[768];
    if (local) {
        if (!model)
            model = default_model(pathbuf, sizeof(pathbuf));
        rc = rlai_engine_open(model, &ep, &ss.engine, err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "rlai: cannot load model: %s\n", err);
            if (rc == RLAI_ERR_IO)
                fprintf(stderr, "rlai: run scripts/setup.sh to fetch the default model, or pass -m FILE\n");
            free(stdin_prompt);
            return 1;
        }
        rlai_model_info mi;
        rlai_engine_info(ss.engine, &mi);
        ss.isa_name = mi.isa;
        ss.n_threads = mi.n_threads;
        if (mode == MODE_INFO) {
            printf("model      %s (%s)\n", mi.name, mi.arch);
            printf("params     %llu (%.1f MiB of weights)\n", (unsigned long long)mi.n_params,
                   mi.weight_bytes / 1048576.0);
            printf("layers %d  embd %d  ff %d  heads %d/%d kv  head_dim %d  vocab %d  ctx %d (trained %d)\n",
                   mi.n_layer, mi.n_embd, mi.n_ff, mi.n_head, mi.n_head_kv, mi.head_dim, mi.n_vocab,
                   mi.n_ctx, mi.n_ctx_train);
            printf("device     %s\n", mi.device);
            printf("kernels    %s, %d threads\n", mi.isa, mi.n_threads);
            if (mi.draft_model)
                printf("draft      %s\n", mi.draft_model);
            rlai_engine_close(ss.engine);
            return 0;
        }
        if (ss.gp.spec == RLAI_SPEC_DRAFT && !mi.draft_model) {
            fprintf(stderr, "rlai: --spec draft needs a draft model: add --draft-model FILE\n");
            rlai_engine_close(ss.engine);
            free(stdin_prompt);
            return 2;
        }
    } else {
        if (model)
            fprintf(stderr, "rlai: note: -m is ignored without --local (the engine has its own model)\n");
        rc = rlai_cli_connect(endpoint, 2000, &ss.client, err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "rlai: %s\n", err);
            fprintf(stderr, "rlai: start the engine with `rlai serve`, or add --local to run in this process\n");
            free(stdin_prompt);
            return 1;
        }
    }
    if (mode == MODE_CHAT) {
        rlai_chat_repl_params cp = { .system = system, .generate = chat_generate, .user = &ss,
                                     .end_on_error = ss.client != NULL };
        rc = rlai_chat_repl_run(&cp);
    } else {
        const char *prompt = stdin_prompt ? stdin_prompt : argv[optind];
        rlai_chat_message msgs[2];
        int n = 0;
        if (system)
            msgs[n++] = (rlai_chat_message){ "system", system };
        msgs[n++] = (rlai_chat_message){ "user", prompt };
        char *pred = NULL;
        rc = 0;
        if (prediction_file) {
            int pr = read_file_max(prediction_file, RLAI_MAX_PREDICTION_BYTES, &pred);
            if (pr < 0) {
                fprintf(stderr, "rlai run: --prediction %s: %s\n", prediction_file,
                        pr == RLAI_ERR_TOO_LARGE ? "more than 1 MiB" : strerror(errno));
                rc = 1;
            }
            ss.gp.prediction = w->prediction = pred;
        }
        if (rc == 0)
            rc = session_generate(&ss, raw ? prompt : NULL, msgs, n, NULL) < 0 ? 1 : 0;
        ss.gp.prediction = w->prediction = NULL;
        free(pred);
    }
    rlai_engine_close(ss.engine);
    rlai_client_close(ss.client);
    free(stdin_prompt);
    return rc;
}

/* One row per leaf: "prefix.key   value" (arrays and strings as JSON). */
static void stats_rows(const cJSON *o, const char *prefix)
{
    for (const cJSON *it = o->child; it; it = it->next) {
        char key[256];
        snprintf(key, sizeof(key), "%s%s%s", prefix, *prefix ? "." : "", it->string ? it->string : "?");
        if (cJSON_IsObject(it) && it->child) {
            stats_rows(it, key);
            continue;
        }
        char *v = NULL;
        if (cJSON_IsNumber(it)) {
            char num[64];
            if (it->valuedouble == (double)(long long)it->valuedouble && fabs(it->valuedouble) < 1e15)
                snprintf(num, sizeof(num), "%lld", (long long)it->valuedouble);
            else
                snprintf(num, sizeof(num), "%.3f", it->valuedouble);
            printf("%-40s %s\n", key, num);
            continue;
        }
        if (cJSON_IsString(it)) {
            printf("%-40s %s\n", key, it->valuestring);
            continue;
        }
        v = cJSON_PrintUnformatted(it);
        printf("%-40s %s\n", key, v ? v : "?");
        free(v);
    }
}

/* `rlai stats`: JSON (--json, pretty-printed) or a readable table. */
static void print_stats(const cJSON *j, bool json)
{
    if (json || !cJSON_IsObject(j)) {
        char *t = cJSON_Print(j);
        if (t)
            printf("%s\n", t);
        free(t);
        return;
    }
    stats_rows(j, "");
}

static int cmd_stats(int argc, char **argv)
{
    const char *endpoint = NULL;
    bool json = false;
    static const char stats_usage[] =
        "usage: rlai stats [--json] [--endpoint E]\n"
        "engine statistics of the running engine: a readable table, or JSON with --json\n";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) {
            endpoint = argv[++i];
        } else if (!strcmp(argv[i], "--endpoint")) {
            fprintf(stderr, "rlai stats: --endpoint needs a value (ipc://PATH, tcp://HOST:PORT or unix://PATH)\n");
            return 2;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(stats_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "rlai stats: unknown argument '%s'\n%s", argv[i], stats_usage);
            return 2;
        }
    }
    rlai_client *cl;
    char err[512];
    int rc = rlai_cli_connect(endpoint, 2000, &cl, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai: %s\n", err);
        return 1;
    }
    rlai_msg m;
    memset(&m, 0, sizeof(m));
    m.version = RLAI_PROTO_VERSION;
    m.type = RLAI_MSG_STATS;
    m.id = rlai_client_next_id(cl);
    int status = 1;
    if ((rc = rlai_client_send(cl, &m)) < 0) {
        fprintf(stderr, "rlai: %s\n", rlai_strerror(rc));
        goto out;
    }
    for (;;) {
        rlai_msg f;
        if ((rc = rlai_client_recv(cl, 5000, &f)) < 0) {
            fprintf(stderr, "rlai: %s\n", rlai_strerror(rc));
            break;
        }
        bool mine = f.id == m.id;
        if (mine && f.type == RLAI_MSG_RESULT) {
            msgpack_unpacked up;
            msgpack_unpacked_init(&up);
            cJSON *j = NULL;
            if (msgpack_unpack_next(&up, (const char *)f.u.result.data, f.u.result.len, NULL) ==
                MSGPACK_UNPACK_SUCCESS)
                j = rlai_msgpack_to_json(&up.data);
            if (j)
                print_stats(j, json);
            else
                fprintf(stderr, "rlai stats: the engine's answer is not a valid statistics object\n");
            cJSON_Delete(j);
            msgpack_unpacked_destroy(&up);
        } else if (mine && f.type == RLAI_MSG_DONE) {
            status = 0;
        } else if (mine && f.type == RLAI_MSG_ERROR) {
            fprintf(stderr, "rlai: %s\n", f.u.error.msg ? f.u.error.msg : "error");
        }
        bool end = mine && (f.type == RLAI_MSG_DONE || f.type == RLAI_MSG_ERROR);
        rlai_msg_free(&f);
        if (end)
            break;
    }
out:
    rlai_client_close(cl);
    return status;
}

/* --plugins DIR adds folders: one that names the default folder (or an
 * earlier --plugins) again is dropped, so nothing is loaded twice. */
static void drop_duplicate_plugin_dirs(rlai_config *cfg)
{
    char a[PATH_MAX], b[PATH_MAX];
    int keep = 0;
    for (int i = 0; i < cfg->n_plugin_dirs_extra; i++) {
        char *dir = cfg->plugin_dirs_extra[i];
        bool dup = false;
        if (realpath(dir, a)) {
            if (cfg->plugins_dir && realpath(cfg->plugins_dir, b) && !strcmp(a, b))
                dup = true;
            for (int k = 0; k < keep && !dup; k++)
                dup = realpath(cfg->plugin_dirs_extra[k], b) && !strcmp(a, b);
        }
        if (dup)
            free(dir);
        else
            cfg->plugin_dirs_extra[keep++] = dir;
    }
    cfg->n_plugin_dirs_extra = keep;
}

static void serve_usage(FILE *f)
{
    fprintf(f,
        "usage: rlai serve [options]\n"
        "  --config FILE              JSON configuration (see docs/SERVE.md); flags override it\n"
        "  -m, --model FILE           GGUF model (default: the default model)\n"
        "  -t, --threads N            CPU threads\n"
        "  -c, --ctx N                context length per request\n"
        "      --kv-blocks N          KV cache size in 16-token blocks\n"
        "      --kv-type f16|q8_0     KV cache element type (default f16)\n"
        "      --device D             compute device: auto|cpu|cuda|cuda:N (default auto: CUDA when\n"
        "                             a GPU and the CUDA backend are present, else the CPU)\n"
        "      --mmproj FILE          vision projector GGUF of the model (llama.cpp mmproj: SigLIP +\n"
        "                             Idefics3, as SmolVLM ships); images then go to the model\n"
        "                             (docs/SCREEN.md \"Vision\")\n"
        "      --spec MODE            speculative decoding: off|ngram|draft|auto (default auto: requests\n"
        "                             draft, with the draft model when one is loaded, else ngram; the\n"
        "                             output does not change; docs/SPECULATIVE.md); requests may ask\n"
        "                             for their own\n"
        "      --spec-max-draft N     longest draft per step, 1..16 (default 8)\n"
        "      --draft-model FILE     a smaller GGUF with the model's tokenizer that proposes drafts\n"
        "      --spec-lookup-min N    with --draft-model: text repeating an earlier passage of N tokens\n"
        "                             (1..8, default 4) is drafted by prompt lookup, not the draft\n"
        "                             model; -1 = draft model only\n"
        "      --zmq ENDPOINT         ZeroMQ endpoint (default ipc://$XDG_RUNTIME_DIR/rlai/engine.zmq; \"\" = off)\n"
        "      --zmq-tcp ENDPOINT     extra ZeroMQ TCP endpoint, e.g. tcp://127.0.0.1:5677 (default off)\n"
        "      --pipe PATH            named pipe / Unix socket (default $XDG_RUNTIME_DIR/rlai/engine.sock; \"\" = off)\n"
        "      --http ADDR:PORT       OpenAI-compatible HTTP front (default " RLAI_HTTP_DEFAULT "; \"\" = off)\n"
        "      --allow-remote         permit a non-loopback TCP address\n"
        "      --cors-origin ORIGIN   let web pages from ORIGIN (https://host[:port]) call the HTTP front;\n"
        "                             repeatable (default: none; any other Origin gets 403)\n"
        "      --max-connections N    HTTP connections at once (default 256)\n"
        "      --max-connections-per-ip N  HTTP connections per client address (default 64)\n"

        "      --max-frame-bytes N, --max-prompt-tokens N,\n"
        "      --max-inflight-client N, --max-inflight-total N\n"
        "      --plugins DIR          also load every plugin folder in DIR, after the default ones\n"
        "                             (<exe>/../plugins, or the config's plugins.dir); repeatable\n"
        "      --no-plugins           load no plugins (not even the default ones)\n"
        "      --no-default-plugins   load only the --plugins folders\n"
        "      --plugin-workers N     threads running plugin commands (default 4)\n"
        "      --no-prefix-cache      disable the prefix cache (for comparisons)\n"
        "      --api-key-file PATH    API key file for HTTP and --zmq-tcp (default $XDG_CONFIG_HOME/rlai/api_key,\n"
        "                             created 0600 on first start; RLAI_API_KEY or config auth.api_key come first)\n"
        "      --no-auth              no API key on HTTP and --zmq-tcp: then ANY local user (and any web page\n"
        "                             that reaches this port) can use the engine and its plugins\n");
}

static int cmd_serve(int argc, char **argv)
{
    enum { S_CONFIG = 300, S_KV, S_ZMQ, S_ZMQ_TCP, S_PIPE, S_REMOTE, S_FRAME, S_PROMPT, S_CLIENT, S_TOTAL,
           S_KVTYPE, S_DEVICE, S_HTTP, S_PLUGINS, S_NO_PLUGINS, S_PLUGIN_WORKERS, S_NO_PREFIX,
           S_KEY_FILE, S_NO_AUTH, S_CORS, S_MAXCONN, S_MAXCONN_IP, S_SPEC, S_SPEC_DRAFT, S_NO_DEF_PLUGINS,
           S_MMPROJ, S_DRAFT_MODEL, S_LOOKUP_MIN };
    static const struct option opts[] = {
        { "config", required_argument, 0, S_CONFIG }, { "model", required_argument, 0, 'm' },
        { "threads", required_argument, 0, 't' }, { "ctx", required_argument, 0, 'c' },
        { "kv-blocks", required_argument, 0, S_KV }, { "zmq", required_argument, 0, S_ZMQ },
        { "zmq-tcp", required_argument, 0, S_ZMQ_TCP }, { "pipe", required_argument, 0, S_PIPE },
        { "allow-remote", no_argument, 0, S_REMOTE }, { "max-frame-bytes", required_argument, 0, S_FRAME },
        { "max-prompt-tokens", required_argument, 0, S_PROMPT },
        { "max-inflight-client", required_argument, 0, S_CLIENT },
        { "max-inflight-total", required_argument, 0, S_TOTAL }, { "kv-type", required_argument, 0, S_KVTYPE },
        { "device", required_argument, 0, S_DEVICE }, { "mmproj", required_argument, 0, S_MMPROJ },
        { "spec", required_argument, 0, S_SPEC }, { "spec-max-draft", required_argument, 0, S_SPEC_DRAFT },
        { "draft-model", required_argument, 0, S_DRAFT_MODEL }, { "spec-lookup-min", required_argument, 0, S_LOOKUP_MIN },
        { "http", required_argument, 0, S_HTTP },
        { "cors-origin", required_argument, 0, S_CORS },
        { "max-connections", required_argument, 0, S_MAXCONN },
        { "max-connections-per-ip", required_argument, 0, S_MAXCONN_IP },
        { "plugins", required_argument, 0, S_PLUGINS }, { "no-plugins", no_argument, 0, S_NO_PLUGINS },
        { "no-default-plugins", no_argument, 0, S_NO_DEF_PLUGINS },
        { "plugin-workers", required_argument, 0, S_PLUGIN_WORKERS },
        { "no-prefix-cache", no_argument, 0, S_NO_PREFIX },
        { "api-key-file", required_argument, 0, S_KEY_FILE }, { "no-auth", no_argument, 0, S_NO_AUTH },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 }
    };
    char pathbuf[PATH_MAX];
    rlai_config cfg;
    char err[768];
    if (rlai_config_defaults(&cfg, default_model(pathbuf, sizeof(pathbuf))) < 0) {
        fprintf(stderr, "rlai serve: out of memory\n");
        return 1;
    }
    /* First pass: the config file, so flags given anywhere override it. */
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:t:c:h", opts, NULL)) != -1) {
        if (c == S_CONFIG && rlai_config_load_file(&cfg, optarg, err, sizeof(err)) < 0) {
            fprintf(stderr, "rlai serve: %s\n", err);
            rlai_config_free(&cfg);
            return 2;
        }
    }
    opterr = 1;
    optind = 1;
    int bad = 0, v = 0, li = -1;
    bool cors_flag = false;            /* the first --cors-origin replaces the config file's list */
    bool no_default_plugins = false;   /* --no-default-plugins: only the --plugins folders */
    while ((c = getopt_long(argc, argv, "m:t:c:h", opts, &li)) != -1) {
        note_opt(opts, li, c);
        li = -1;
        switch (c) {
        case S_CONFIG: break;
        case 'm': bad |= rlai_config_set_str(&cfg.model, optarg); break;
        case 't': bad |= parse_int(optarg, 0, 256, &cfg.threads); break;
        case 'c': bad |= parse_int(optarg, 16, 1 << 20, &cfg.context); break;
        case S_KV: bad |= parse_int(optarg, 1, 1 << 24, &cfg.kv_blocks); break;
        case S_ZMQ: bad |= rlai_config_set_str(&cfg.zmq, optarg); break;
        case S_ZMQ_TCP: bad |= rlai_config_set_str(&cfg.zmq_tcp, optarg); break;
        case S_PIPE: bad |= rlai_config_set_str(&cfg.pipe, optarg); break;
        case S_HTTP: bad |= rlai_config_set_str(&cfg.http, optarg); break;
        case S_CORS:
            if (!cors_flag)
                rlai_config_clear_cors_origins(&cfg);
            cors_flag = true;
            bad |= rlai_config_add_cors_origin(&cfg, optarg);
            break;
        case S_MAXCONN: bad |= parse_int(optarg, 1, 65536, &cfg.http_max_connections); break;
        case S_MAXCONN_IP: bad |= parse_int(optarg, 0, 65536, &cfg.http_max_connections_per_ip); break;
        case S_REMOTE: cfg.allow_remote = true; break;
        case S_FRAME: bad |= parse_int(optarg, 64, (int)RLAI_PROTO_MAX_FRAME, &v); cfg.max_frame = (size_t)v; break;
        case S_PROMPT: bad |= parse_int(optarg, 1, 1 << 20, &cfg.max_prompt_tokens); break;
        case S_CLIENT: bad |= parse_int(optarg, 1, 4096, &cfg.max_inflight_client); break;
        case S_TOTAL: bad |= parse_int(optarg, 1, 65536, &cfg.max_inflight_total); break;
        case S_PLUGINS: bad |= rlai_config_add_plugin_dir(&cfg, optarg); cfg.plugins_off = false; break;
        case S_NO_PLUGINS: cfg.plugins_off = true; break;
        case S_NO_DEF_PLUGINS: no_default_plugins = true; break;
        case S_PLUGIN_WORKERS: bad |= parse_int(optarg, 1, 64, &cfg.plugin_workers); break;
        case S_NO_PREFIX: cfg.no_prefix_cache = true; break;
        case S_DEVICE: bad |= rlai_config_set_str(&cfg.device, optarg); break;
        case S_MMPROJ: bad |= rlai_config_set_str(&cfg.mmproj, optarg); break;
        case S_DRAFT_MODEL: bad |= rlai_config_set_str(&cfg.draft_model, optarg); break;
        case S_SPEC: {
            rlai_spec_mode sm = RLAI_SPEC_AUTO;
            bad |= parse_spec(optarg, &sm);
            cfg.spec = (int)sm;
            break;
        }
        case S_SPEC_DRAFT: bad |= parse_int(optarg, RLAI_LIM_SPEC_MAX_DRAFT_MIN, RLAI_LIM_SPEC_MAX_DRAFT_MAX, &cfg.spec_max_draft); break;
        case S_LOOKUP_MIN: bad |= parse_int(optarg, -1, 8, &cfg.spec_lookup_min); break;
        case S_KEY_FILE: bad |= rlai_config_set_str(&cfg.api_key_file, optarg); break;
        case S_NO_AUTH: cfg.auth_off = true; break;
        case S_KVTYPE: {
            rlai_kv_type kt;
            bad |= parse_kv_type(optarg, &kt);
            cfg.kv_q8_0 = kt == RLAI_KV_Q8_0;
            break;
        }
        case 'h': serve_usage(stdout); rlai_config_free(&cfg); return 0;
        default: serve_usage(stderr); rlai_config_free(&cfg); return 2;
        }
    }
    if (bad || optind != argc || rlai_config_validate(&cfg, err, sizeof(err)) < 0) {
        if (optind != argc)
            fprintf(stderr, "rlai serve: unexpected argument '%s'\n", argv[optind]);
        else if (!bad)
            fprintf(stderr, "rlai serve: %s\n", err);
        rlai_config_free(&cfg);
        return 2;
    }
    /* One engine per socket folder, checked before anything is loaded. */
    rlai_serve_lock lock;
    const char *socks[2] = { cfg.pipe, cfg.zmq };
    if (rlai_serve_lock_acquire(&lock, socks, 2, err, sizeof(err)) < 0) {
        fprintf(stderr, "rlai serve: %s\n", err);
        rlai_config_free(&cfg);
        return 1;
    }
    /* Block the stop signals in every thread; the main thread waits for them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    char plugdir[PATH_MAX];
    if (no_default_plugins)
        rlai_config_set_str(&cfg.plugins_dir, NULL);
    else if (!cfg.plugins_off && !cfg.plugins_dir && default_plugins_dir(plugdir, sizeof(plugdir)))
        bad |= rlai_config_set_str(&cfg.plugins_dir, plugdir);
    drop_duplicate_plugin_dirs(&cfg);
    rlai_daemon *d;
    if (rlai_daemon_start(&cfg, &d, err, sizeof(err)) < 0) {
        fprintf(stderr, "rlai serve: %s\n", err);
        rlai_config_free(&cfg);
        rlai_serve_lock_release(&lock);
        return 1;
    }
    fprintf(stderr, "rlai serve: model %s\n", cfg.model);
    if (cfg.zmq)
        fprintf(stderr, "rlai serve: zeromq   %s\n", cfg.zmq);
    if (cfg.zmq_tcp)
        fprintf(stderr, "rlai serve: zeromq   %s\n", cfg.zmq_tcp);
    if (cfg.pipe)
        fprintf(stderr, "rlai serve: pipe     unix://%s\n", cfg.pipe);
    fprintf(stderr, "rlai serve: ready (SIGINT/SIGTERM to stop)\n");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "rlai serve: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rlai_daemon_shutdown(d);
    rlai_config_free(&cfg);
    rlai_serve_lock_release(&lock);
    fprintf(stderr, "rlai serve: stopped\n");
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
    static const struct option opts[] = { { "model", required_argument, 0, 'm' },
                                          { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 } };
    static const char tok_usage[] = "usage: rlai tokenize [-m FILE.gguf] \"text\"\n"
                                    "print the token ids of text (no BOS, special tokens not parsed)\n";
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'm') {
            model = optarg;
        } else if (c == 'h') {
            fputs(tok_usage, stdout);
            return 0;
        } else {
            fputs(tok_usage, stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fputs(tok_usage, stderr);
        return 2;
    }
    if (!model)
        model = default_model(pathbuf, sizeof(pathbuf));
    char err[512];
    rlai_vocab *v;
    int rc = rlai_vocab_open(model, &v, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rlai: %s: %s\n", model, err);
        return 1;
    }
    const char *text = argv[optind];
    size_t len = strlen(text);
    int n = rlai_vocab_tokenize(v, text, len, false, false, NULL, 0);
    int32_t *ids = n > 0 ? malloc(sizeof(int32_t) * (size_t)n) : NULL;
    if (n > 0 && ids)
        n = rlai_vocab_tokenize(v, text, len, false, false, ids, n);
    if (n < 0 || (n > 0 && !ids)) {
        fprintf(stderr, "rlai: tokenize failed: %s\n", rlai_strerror(n < 0 ? n : RLAI_ERR_NOMEM));
        free(ids);
        rlai_vocab_close(v);
        return 1;
    }
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    rlai_vocab_close(v);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("rlai %s (protocol %d)\n", RLAI_VERSION, RLAI_PROTO_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "run"))
        return cmd_run(argc - 1, argv + 1, MODE_RUN);
    if (!strcmp(cmd, "chat"))
        return cmd_run(argc - 1, argv + 1, MODE_CHAT);
    if (!strcmp(cmd, "info"))
        return cmd_run(argc - 1, argv + 1, MODE_INFO);
    if (!strcmp(cmd, "serve"))
        return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "stats"))
        return cmd_stats(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize"))
        return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "call"))
        return rlai_cli_call_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "plugins"))
        return rlai_cli_plugins_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "fit"))
        return rlai_fit_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "gassist"))
        return rlai_gassist_manifest_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) {
        char pathbuf[PATH_MAX];
        return rlai_bench_cli_main(argc - 1, argv + 1, default_model(pathbuf, sizeof(pathbuf)));
    }
    fprintf(stderr, "rlai: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
