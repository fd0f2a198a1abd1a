/* fit_cli.c - `rlai fit` (see fit_cli.h). */
#include "fit_cli.h"
#include "plugin_host.h"
#include "rlai/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: rlai fit MODEL.gguf --gpu NAME [options]\n"
        "       rlai fit --params JSON --gpu NAME [options]\n"
        "       rlai fit --list-gpus [--json]\n"
        "\n"
        "Estimates whether a model fits in a GPU's memory and how fast it decodes.\n"
        "Only the GGUF header is read (any file, also types this engine cannot run).\n"
        "\n"
        "options:\n"
        "  -g, --gpu NAME          GPU from the table (rlai fit --list-gpus), e.g. \"RTX 4060\"\n"
        "      --vram-gb X         GPU memory in GiB (instead of, or overriding, --gpu)\n"
        "      --bandwidth-gbs Y   memory bandwidth in GB/s (instead of, or overriding, --gpu)\n"
        "  -c, --context N         tokens of context held in the KV cache (default 8192)\n"
        "      --kv-type T         KV cache type: f16 (default), q8_0, f32\n"
        "      --params JSON       parameter counts instead of a file: {\"params_b\":8.03,\n"
        "                          \"n_layer\":32,\"n_head_kv\":8,\"head_dim\":128,\"bits_per_weight\":4.5}\n"
        "      --json              print the plugin's JSON answer\n"
        "      --list-gpus         print the GPU table\n");
}

/* ------------------------------------------------------------------ */
/* finding and calling the plugin                                      */

static bool has_manifest(const char *dir)
{
    char p[PATH_MAX];
    int w = snprintf(p, sizeof p, "%s/manifest.json", dir);
    return w > 0 && (size_t)w < sizeof p && access(p, R_OK) == 0;
}

/* The fit plugin's folder into buf; false (with the places tried in
 * `tried`) when there is none. */
static bool find_plugin(char *buf, size_t cap, char *tried, size_t tried_cap)
{
    size_t tl = 0;
    tried[0] = '\0';
    const char *env = getenv("RLAI_PLUGIN_DIR");
    if (env && *env) {
        int w = snprintf(buf, cap, "%s/fit", env);
        if (w > 0 && (size_t)w < cap && has_manifest(buf))
            return true;
        tl += (size_t)snprintf(tried + tl, tried_cap - tl, "%s", buf);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            int w = snprintf(buf, cap, "%s/../plugins/fit", exe);
            if (w > 0 && (size_t)w < cap && has_manifest(buf))
                return true;
            if (tl < tried_cap)
                tl += (size_t)snprintf(tried + tl, tried_cap - tl, "%s%s", tl ? ", " : "", buf);
        }
    }
#ifdef RLAI_PLUGIN_INSTALL_DIR
    int wi = snprintf(buf, cap, "%s/fit", RLAI_PLUGIN_INSTALL_DIR);
    if (wi > 0 && (size_t)wi < cap && has_manifest(buf))
        return true;
    if (tl < tried_cap)
        snprintf(tried + tl, tried_cap - tl, "%s%s", tl ? ", " : "", buf);
#endif
    return false;
}

/* What one call produced; filled by the sink on a worker thread. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ended;
    int code;                   /* 0 or the error */
    char msg[1024];
    cJSON *result;              /* the last result value (owned) */
} call_state;

static int sink_token(void *user, const char *text, size_t len)
{
    (void)user;
    fwrite(text, 1, len, stderr);  /* fit.check streams nothing; keep stdout clean */
    return 0;
}

static int sink_result(void *user, const cJSON *value)
{
    call_state *s = user;
    cJSON *dup = cJSON_Duplicate(value, true);
    pthread_mutex_lock(&s->mu);
    cJSON_Delete(s->result);
    s->result = dup;
    pthread_mutex_unlock(&s->mu);
    return dup ? 0 : 1;
}

static void sink_done(void *user, const char *stop, const rlai_call_metrics *m)
{
    (void)stop;
    (void)m;
    call_state *s = user;
    pthread_mutex_lock(&s->mu);
    s->ended = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void sink_error(void *user, int code, const char *msg)
{
    call_state *s = user;
    pthread_mutex_lock(&s->mu);
    s->code = code < 0 ? code : RLAI_ERR_PROTOCOL;
    snprintf(s->msg, sizeof s->msg, "%s", msg && *msg ? msg : rlai_strerror(s->code));
    s->ended = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Loads the plugin, runs `command` with params_json and returns its result
 * (owned by the caller), or NULL after printing the error. */
static cJSON *call_plugin(const char *command, const char *params_json)
{
    char dir[PATH_MAX], tried[2 * PATH_MAX + 64], err[1024];
    if (!find_plugin(dir, sizeof dir, tried, sizeof tried)) {
        fprintf(stderr, "rlai fit: the fit plugin was not found (looked in %s); set RLAI_PLUGIN_DIR "
                "to the folder holding fit/\n", tried[0] ? tried : "nowhere");
        return NULL;
    }
    rlai_plugin_host_params hp = { .engine = NULL, .workers = 1, .quiet = true };
    rlai_plugin_host *h = NULL;
    int rc = rlai_plugin_host_new(&hp, &h);
    if (rc < 0) {
        fprintf(stderr, "rlai fit: cannot start the plugin host: %s\n", rlai_strerror(rc));
        return NULL;
    }
    if ((rc = rlai_plugin_host_load(h, dir, err, sizeof err)) < 0) {
        fprintf(stderr, "rlai fit: cannot load the fit plugin: %s\n", err);
        rlai_plugin_host_free(&h);
        return NULL;
    }
    call_state s = { .code = 0 };
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    rlai_call_sink sink = { sink_token, sink_result, sink_done, sink_error, &s };
    rc = rlai_plugin_host_call(h, command, params_json, &sink, NULL, err, sizeof err);
    if (rc < 0) {
        s.code = rc;
        snprintf(s.msg, sizeof s.msg, "%s", err);
    } else {
        pthread_mutex_lock(&s.mu);
        while (!s.ended)
            pthread_cond_wait(&s.cv, &s.mu);
        pthread_mutex_unlock(&s.mu);
    }
    rlai_plugin_host_free(&h);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    if (s.code < 0) {
        fprintf(stderr, "rlai fit: %s\n", s.msg);
        cJSON_Delete(s.result);
        return NULL;
    }
    if (!s.result)
        fprintf(stderr, "rlai fit: %s returned no result\n", command);
    return s.result;
}

/* ------------------------------------------------------------------ */
/* printing                                                            */

static double jnum(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b)
        x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

static const char *jstr(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b)
        x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* "1.27 GiB", "180.00 MiB", "512 B"; negative values keep their sign. */
static const char *human(double b, char *buf, size_t cap)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double a = b < 0 ? -b : b;
    int u = 0;
    while (a >= 1024 && u < 4) {
        a /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%s%.0f B", b < 0 ? "-" : "", a);
    else
        snprintf(buf, cap, "%s%.2f %s", b < 0 ? "-" : "", a, units[u]);
    return buf;
}

/* 134515008 -> "134,515,008". */
static const char *grouped(double v, char *buf, size_t cap)
{
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v < 0 ? -v : v);
    size_t n = strlen(digits), k = 0;
    if (v < 0 && k + 1 < cap)
        buf[k++] = '-';
    for (size_t i = 0; i < n && k + 2 < cap; i++) {
        buf[k++] = digits[i];
        if ((n - i - 1) % 3 == 0 && i + 1 < n)
            buf[k++] = ',';
    }
    buf[k] = '\0';
    return buf;
}

static void print_check(const cJSON *r)
{
    char a[32], b[32], c[32], d[32];
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "model");
    const char *name = jstr(m, "name", NULL), *arch = jstr(m, "arch", NULL), *path = jstr(m, "path", NULL);
    printf("model          %s%s%s%s\n", name ? name : path ? path : "(parameter counts)",
           arch ? " (" : "", arch ? arch : "", arch ? ")" : "");
    if (path && name)
        printf("file           %s\n", path);
    printf("               %s params, %.0f layers", grouped(jnum(m, "n_params", NULL), a, sizeof a),
           jnum(m, "n_layer", NULL));
    if (jnum(m, "n_embd", NULL) > 0)
        printf(", n_embd %.0f", jnum(m, "n_embd", NULL));
    if (jnum(m, "n_head", NULL) > 0)
        printf(", %.0f heads", jnum(m, "n_head", NULL));
    printf(", %.0f KV heads of %.0f", jnum(m, "n_head_kv", NULL), jnum(m, "head_dim", NULL));
    if (jnum(m, "n_vocab", NULL) > 0)
        printf(", vocab %.0f", jnum(m, "n_vocab", NULL));
    if (jnum(m, "n_ctx_train", NULL) > 0)
        printf(", trained context %.0f", jnum(m, "n_ctx_train", NULL));
    printf("\n");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(r, "gpu");
    printf("GPU            %s: %g GiB%s, %g GB/s\n\n", jstr(g, "name", NULL) ? jstr(g, "name", NULL) : "?",
           jnum(g, "vram_gb", NULL), cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(g, "unified")) ?
           " unified" : "", jnum(g, "bandwidth_gbs", NULL));

    const cJSON *w = cJSON_GetObjectItemCaseSensitive(r, "weights");
    const cJSON *bt = cJSON_GetObjectItemCaseSensitive(w, "by_type");
    printf("%-14s %8s %16s %12s %12s\n", "weights", "tensors", "params", "size", "bits/weight");
    double tensors = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, bt) {
        printf("  %-12s %8.0f %16s %12s %12.3f\n", jstr(e, "type", NULL) ? jstr(e, "type", NULL) : "?",
               jnum(e, "count", NULL), grouped(jnum(e, "params", NULL), a, sizeof a),
               human(jnum(e, "bytes", NULL), b, sizeof b), jnum(e, "bits_per_weight", NULL));
        tensors += jnum(e, "count", NULL);
    }
    if (tensors > 0)
        printf("  %-12s %8.0f %16s %12s %12.3f\n", "total", tensors,
               grouped(jnum(w, "params", NULL), a, sizeof a), human(jnum(w, "bytes", NULL), b, sizeof b),
               jnum(w, "bits_per_weight", NULL));
    else
        printf("  %-12s %8s %16s %12s %12.3f\n", "total", "-", grouped(jnum(w, "params", NULL), a, sizeof a),
               human(jnum(w, "bytes", NULL), b, sizeof b), jnum(w, "bits_per_weight", NULL));
    printf("\n");

    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(r, "kv");
    char label[32];
    snprintf(label, sizeof label, "KV (%s)", jstr(kv, "type", NULL) ? jstr(kv, "type", NULL) : "?");
    printf("%-15s%s per 1k tokens; %s at %.0f tokens\n", label,
           human(jnum(kv, "bytes_per_1k_tokens", NULL), a, sizeof a),
           human(jnum(kv, "bytes_at_context", NULL), b, sizeof b), jnum(kv, "context", NULL));
    const cJSON *ac = cJSON_GetObjectItemCaseSensitive(r, "activations");
    printf("activations    %s estimated (batch %.0f: hidden %s + logits %s + workspace %s)\n",
           human(jnum(ac, "bytes", NULL), a, sizeof a), jnum(ac, "batch", NULL),
           human(jnum(ac, "hidden_bytes", NULL), b, sizeof b), human(jnum(ac, "logits_bytes", NULL), c, sizeof c),
           human(jnum(ac, "workspace_bytes", NULL), d, sizeof d));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "verdict");
    printf("needed         %s = weights %s + KV %s + %s overhead\n",
           human(jnum(v, "need_bytes", NULL), a, sizeof a), human(jnum(w, "bytes", NULL), b, sizeof b),
           human(jnum(kv, "bytes_at_context", NULL), c, sizeof c),
           human(jnum(v, "overhead_bytes", NULL), d, sizeof d));
    printf("usable (95%%)   %s of %s\n", human(jnum(v, "budget_bytes", NULL), a, sizeof a),
           human(jnum(g, "vram_bytes", NULL), b, sizeof b));
    bool fits = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "fits"));
    double head = jnum(v, "headroom_bytes", NULL);
    printf("verdict        %s, %s %s\n", fits ? "FITS" : "DOES NOT FIT", human(head < 0 ? -head : head, a, sizeof a),
           fits ? "headroom" : "short");
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(r, "decode");
    printf("decode (est.)  %.1f tok/s at %.0f tokens of context, %.1f tok/s at an empty context\n"
           "               (%.0f%% of %g GB/s over %s read per token)\n",
           jnum(dc, "tok_s", NULL), jnum(kv, "context", NULL), jnum(dc, "tok_s_empty_context", NULL),
           jnum(dc, "bandwidth_efficiency", NULL) * 100, jnum(g, "bandwidth_gbs", NULL),
           human(jnum(dc, "bytes_per_token", NULL), a, sizeof a));
    const cJSON *notes = cJSON_GetObjectItemCaseSensitive(r, "notes");
    cJSON_ArrayForEach(e, notes) {
        if (cJSON_IsString(e))
            printf("note           %s\n", e->valuestring);
    }
}

static void print_gpus(const cJSON *r)
{
    printf("%-24s %10s %14s\n", "GPU", "memory", "bandwidth");
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(r, "gpus")) {
        char mem[32];
        snprintf(mem, sizeof mem, "%g GiB", jnum(e, "vram_gb", NULL));
        printf("%-24s %10s %9g GB/s%s\n", jstr(e, "name", NULL) ? jstr(e, "name", NULL) : "?", mem,
               jnum(e, "bandwidth_gbs", NULL),
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "unified")) ? "  (unified memory)" : "");
    }
}

static void print_json(const cJSON *r)
{
    char *s = cJSON_Print(r);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
}

/* ------------------------------------------------------------------ */

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

int rlai_fit_cli_main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "gpu", required_argument, NULL, 'g' },
        { "context", required_argument, NULL, 'c' },
        { "kv-type", required_argument, NULL, 'k' },
        { "vram-gb", required_argument, NULL, 'V' },
        { "bandwidth-gbs", required_argument, NULL, 'B' },
        { "params", required_argument, NULL, 'p' },
        { "json", no_argument, NULL, 'j' },
        { "list-gpus", no_argument, NULL, 'l' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *gpu = NULL, *kv_type = NULL, *params_text = NULL;
    double vram = 0, bw = 0;
    bool has_vram = false, has_bw = false, json = false, list = false;
    long context = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "g:c:h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'g': gpu = optarg; break;
        case 'c':
            errno = 0;
            context = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || context < 1 || context > INT_MAX) {
                fprintf(stderr, "rlai fit: --context must be a positive integer (got '%s')\n", optarg);
                return 2;
            }
            break;
        case 'k': kv_type = optarg; break;
        case 'V':
            if (!parse_double(optarg, &vram)) {
                fprintf(stderr, "rlai fit: --vram-gb must be a number (got '%s')\n", optarg);
                return 2;
            }
            has_vram = true;
            break;
        case 'B':
            if (!parse_double(optarg, &bw)) {
                fprintf(stderr, "rlai fit: --bandwidth-gbs must be a number (got '%s')\n", optarg);
                return 2;
            }
            has_bw = true;
            break;
        case 'p': params_text = optarg; break;
        case 'j': json = true; break;
        case 'l': list = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }

    if (list) {
        if (optind != argc) {
            fprintf(stderr, "rlai fit: unexpected argument '%s'\n", argv[optind]);
            return 2;
        }
        cJSON *r = call_plugin("fit.gpus", "{}");
        if (!r)
            return 1;
        if (json)
            print_json(r);
        else
            print_gpus(r);
        cJSON_Delete(r);
        return 0;
    }

    const char *model = NULL;
    if (optind < argc)
        model = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "rlai fit: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model == !params_text) {
        fprintf(stderr, "rlai fit: give a GGUF file or --params (one of them)\n");
        usage(stderr);
        return 2;
    }
    if (!gpu && !(has_vram && has_bw)) {
        fprintf(stderr, "rlai fit: give --gpu NAME (see rlai fit --list-gpus) or both --vram-gb and "
                "--bandwidth-gbs\n");
        return 2;
    }

    cJSON *p = cJSON_CreateObject();
    bool ok = p != NULL;
    if (ok && model)
        ok = cJSON_AddStringToObject(p, "model", model) != NULL;
    if (ok && params_text) {
        cJSON *counts = cJSON_Parse(params_text);
        if (!cJSON_IsObject(counts)) {
            cJSON_Delete(counts);
            cJSON_Delete(p);
            fprintf(stderr, "rlai fit: --params must be a JSON object\n");
            return 2;
        }
        ok = cJSON_AddItemToObject(p, "model", counts);
        if (!ok)
            cJSON_Delete(counts);
    }
    if (ok && gpu)
        ok = cJSON_AddStringToObject(p, "gpu", gpu) != NULL;
    if (ok && has_vram)
        ok = cJSON_AddNumberToObject(p, "vram_gb", vram) != NULL;
    if (ok && has_bw)
        ok = cJSON_AddNumberToObject(p, "bandwidth_gbs", bw) != NULL;
    if (ok && context)
        ok = cJSON_AddNumberToObject(p, "context", (double)context) != NULL;
    if (ok && kv_type)
        ok = cJSON_AddStringToObject(p, "kv_type", kv_type) != NULL;
    char *text = ok ? cJSON_PrintUnformatted(p) : NULL;
    cJSON_Delete(p);
    if (!text) {
        fprintf(stderr, "rlai fit: out of memory\n");
        return 1;
    }
    cJSON *r = call_plugin("fit.check", text);
    free(text);
    if (!r)
        return 1;
    if (json)
        print_json(r);
    else
        print_check(r);
    cJSON_Delete(r);
    return 0;
}
