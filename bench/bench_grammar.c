/* bench_grammar.c - cost of grammar-constrained sampling: decode tok/s of
 * unconstrained generation against response_format json_object and a JSON
 * Schema, measured in the same run, plus the time of one token mask.
 *
 *   bench_grammar [--model FILE] [--threads N] [--tokens N] [--reps R]
 *                 [--schema FILE] [--show]
 *
 * One chat prompt asking for a JSON description of a person (formatted with
 * the model's chat template), greedy. Modes run interleaved (free, object,
 * schema, free, ...; R runs each) after one unmeasured warm-up of each, so
 * machine noise falls on all. "free" generates exactly --tokens tokens
 * (ignore_eos); the grammar modes stop when the JSON is complete or at
 * --tokens. decode tok/s is the engine's own decode_tps (tokens after the
 * first / time after the first); the table shows the median and the ratio
 * to free. The mask columns replay the greedy tokens of each grammar mode
 * through a matcher on the same vocabulary index and time
 * rlai_grammar_matcher_mask alone at every step (mean and max µs): the
 * mask is computed on the scheduler's thread pool per request, before the
 * sampling chain. --schema FILE: the json_schema mode uses that schema
 * instead of the built-in person schema (e.g. bench/schemas/heavy128.json,
 * 128 strings of different maxLength: every open alternative costs mask
 * time). */
#include "rlai/engine.h"
#include "rlai/grammar.h"
#include "grammar.h"
#include "rlai/gguf.h"
#include "tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#define MAXTOK 1024

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"city\":{\"type\":\"string\"},\"hobbies\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"employed\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"city\",\"hobbies\",\"employed\"],"
    "\"additionalProperties\":false}";

typedef struct out {
    char text[16384];
    size_t len;
    rlai_token toks[MAXTOK];
    int n;
} out;

static int on_tok(void *user, rlai_token tok, const char *text, size_t len)
{
    out *o = user;
    if (o->len + len < sizeof(o->text)) {
        memcpy(o->text + o->len, text, len);
        o->len += len;
        o->text[o->len] = 0;
    }
    if (tok >= 0 && o->n < MAXTOK)
        o->toks[o->n++] = tok;
    return 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *schema_file = NULL;
    int threads = 2, tokens = 128, reps = 3, show = 0;
    static struct option lo[] = { { "model", 1, 0, 'm' }, { "threads", 1, 0, 't' }, { "tokens", 1, 0, 'n' },
                                  { "reps", 1, 0, 'r' }, { "show", 0, 0, 's' }, { "schema", 1, 0, 'S' },
                                  { 0, 0, 0, 0 } };
    int c;
    while ((c = getopt_long(argc, argv, "m:t:n:r:sS:", lo, NULL)) != -1) {
        switch (c) {
        case 'S': schema_file = optarg; break;
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'n': tokens = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 's': show = 1; break;
        default:
            fprintf(stderr, "usage: bench_grammar [--model F] [--threads N] [--tokens N] [--reps R] [--schema F] [--show]\n");
            return 2;
        }
    }
    if (tokens < 2 || tokens > MAXTOK || reps < 1 || reps > 50) {
        fprintf(stderr, "bench_grammar: --tokens 2..%d, --reps 1..50\n", MAXTOK);
        return 2;
    }
    char err[256];
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.n_threads = threads;
    rlai_engine *e = NULL;
    if (rlai_engine_open(model, &ep, &e, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    static char schema_buf[1 << 20];
    const char *schema = SCHEMA;
    if (schema_file) {
        FILE *f = fopen(schema_file, "rb");
        size_t got = f ? fread(schema_buf, 1, sizeof(schema_buf) - 1, f) : 0;
        if (f)
            fclose(f);
        if (!got) {
            fprintf(stderr, "bench_grammar: cannot read %s\n", schema_file);
            return 1;
        }
        schema_buf[got] = 0;
        schema = schema_buf;
    }
    rlai_grammar *g[3] = { NULL, NULL, NULL };
    if (rlai_grammar_json_object(&g[1]) < 0 ||
        rlai_grammar_from_json_schema(schema, strlen(schema), &g[2], err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_grammar: grammar: %s\n", err);
        return 1;
    }
    const char *names[3] = { "free", "json_object", "json_schema" };
    rlai_chat_message msgs[] = {
        { "system", "You are a helpful assistant. Answer in JSON." },
        { "user", "Give a JSON description of a person: name, age, city, hobbies, employed." },
    };
    rlai_token *prompt = NULL;
    int n_prompt = 0;
    if (rlai_engine_tokenize_chat(e, msgs, 2, true, &prompt, &n_prompt) < 0)
        return 1;
    static out o[3];
    double tps[3][50];
    int ntok[3] = { 0, 0, 0 };
    for (int r = -1; r < reps; r++)
        for (int k = 0; k < 3; k++) {
            rlai_gen_params gp;
            rlai_gen_params_init(&gp);
            gp.sampling.temperature = 0;
            gp.max_tokens = tokens;
            gp.ignore_eos = k == 0;
            gp.grammar = g[k];
            gp.spec = RLAI_SPEC_OFF;
            memset(&o[k], 0, sizeof(o[k]));
            rlai_gen_metrics m;
            int rc = rlai_engine_generate_tokens(e, prompt, n_prompt, &gp, on_tok, &o[k], &m);
            if (rc < 0) {
                fprintf(stderr, "bench_grammar: generate: %s\n", rlai_strerror(rc));
                return 1;
            }
            if (r >= 0)
                tps[k][r] = m.decode_tps;
            ntok[k] = m.gen_tokens;
        }
    /* mask timing: replay each grammar mode's tokens */
    double mean_us[3] = { 0, 0, 0 }, max_us[3] = { 0, 0, 0 };
    rlai_gguf *gg = NULL;
    rlai_tokenizer *tk = NULL;
    rlai_gvocab *v = NULL;
    if (rlai_gguf_open_file(model, &gg, err, sizeof(err)) < 0 || rlai_tokenizer_load(gg, &tk, err, sizeof(err)) < 0 ||
        rlai_gvocab_new(tk, &v) < 0) {
        fprintf(stderr, "bench_grammar: vocab: %s\n", err);
        return 1;
    }
    uint32_t *mk = malloc(sizeof(uint32_t) * (size_t)rlai_gvocab_mask_words(v));
    for (int k = 1; k < 3; k++) {
        rlai_grammar_matcher *m = NULL;
        rlai_grammar_matcher_new(g[k], &m);
        int steps = 0;
        for (int i = 0; i <= o[k].n; i++) {
            double t0 = now_us();
            rlai_grammar_matcher_mask(m, v, mk);
            double dt = now_us() - t0;
            mean_us[k] += dt;
            if (dt > max_us[k])
                max_us[k] = dt;
            steps++;
            if (i < o[k].n && rlai_grammar_matcher_accept_token(m, v, o[k].toks[i]) < 0)
                break;
        }
        mean_us[k] /= steps;
        rlai_grammar_matcher_free(m);
    }
    struct utsname u;
    uname(&u);
    rlai_model_info mi;
    rlai_engine_info(e, &mi);
    printf("bench_grammar: %s, %d threads, isa %s, prompt %d tokens, max %d tokens, %d reps (median)\n",
           mi.name, mi.n_threads, mi.isa, n_prompt, tokens, reps);
    printf("%-12s %8s %12s %8s %10s %10s %6s\n", "mode", "tokens", "decode tok/s", "vs free", "mask us", "mask max", "valid");
    double med[3];
    for (int k = 0; k < 3; k++) {
        qsort(tps[k], (size_t)reps, sizeof(double), cmp_d);
        med[k] = tps[k][reps / 2];
        const char *valid = k == 0 ? "-" : rlai_grammar_accepts(g[k], o[k].text, o[k].len) ? "yes" : "no";
        if (k == 0)
            printf("%-12s %8d %12.1f %8s %10s %10s %6s\n", names[k], ntok[k], med[k], "1.00", "-", "-", valid);
        else
            printf("%-12s %8d %12.1f %8.2f %10.1f %10.1f %6s\n", names[k], ntok[k], med[k], med[k] / med[0],
                   mean_us[k], max_us[k], valid);
    }
    if (show)
        for (int k = 0; k < 3; k++)
            printf("--- %s:\n%s\n", names[k], o[k].text);
    free(mk);
    rlai_gvocab_free(v);
    rlai_tokenizer_free(tk);
    rlai_gguf_close(gg);
    for (int k = 1; k < 3; k++)
        rlai_grammar_unref(g[k]);
    free(prompt);
    rlai_engine_close(e);
    return 0;
}
