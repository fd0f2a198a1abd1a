/* rlai_gpucheck.c - the GPU check of tests/gpu/run.sh: CUDA backend against
 * the CPU backend on a real model, then CUDA timings.
 *
 *   rlai-gpucheck MODEL [--device cuda[:N]] [--threads N] [--cpu-only] [--checks-only]
 *
 * Correctness (exit status 1 when a check fails):
 *   1. logits at every position of three prompts, CUDA vs CPU, same mode:
 *        default mode (CPU: 8-bit activations; CUDA: f32 activations; both
 *        f16 KV): relative L2 per position ||cuda - cpu|| / ||cpu|| <= 2e-2;
 *        precise mode (f32 activations, f32 KV on both): <= 1e-3;
 *      top-1 agreement wherever the CPU's top-1/top-2 gap is >= 0.05
 *      (near ties may flip legitimately; the raw agreement is printed).
 *   2. 64 greedy tokens (EOS ignored) from one prompt: identical in precise
 *      mode; in default mode the count of matching leading tokens is
 *      printed (the CPU's 8-bit activations may diverge legitimately).
 *   3. speculative decoding on the device, default mode: 96 greedy tokens
 *      of a quoting prompt with prompt-lookup drafts (spec ngram) identical
 *      to the same request without drafts, and drafts accepted; then the
 *      same request again with three long-prompt requests submitted once
 *      it decodes (their prefill chunks and decode rows share its
 *      verification steps), identical too. These compare tokens, which a
 *      last-bit difference seldom flips: the bit-level batch invariance
 *      of matmul and attention is test_backend_ops's check.
 *   4. structured output with drafts on the device: an extraction under a
 *      JSON schema with top-3 logprobs, greedy, spec ngram against off:
 *      the same tokens and the same logprobs bit for bit, valid JSON of
 *      the schema, drafts accepted (prompt lookup and the grammar's
 *      forced keys).
 * Timings (CUDA, default mode, printed as a markdown table): prefill tok/s
 * of a 512-token prompt, TTFT of a 22-token prompt (best of 5), decode
 * tok/s over 128 tokens at batch 1 and batch 8 (continuous batching,
 * prefill excluded). Timings are not checks.
 * --cpu-only runs everything against the CPU twice (a dry run of the tool
 * on a machine without a GPU; the meson test `gpucheck` runs it so with
 * --checks-only, which skips the timings). */
#include "rlai/engine.h"
#include "rlai/grammar.h"

#include <math.h>
#include <stdbool.h>
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

static const char *model_path;
static int n_threads;

static rlai_engine *open_engine(const char *device, bool precise)
{
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.device = device;
    ep.precise = precise;
    ep.n_threads = n_threads;
    ep.n_ctx = 2048;
    ep.kv_blocks = 8 * 2048 / 16;
    rlai_engine *e;
    char err[768];
    if (rlai_engine_open(model_path, &ep, &e, err, sizeof(err)) < 0) {
        fprintf(stderr, "rlai-gpucheck: open (%s%s): %s\n", device, precise ? ", precise" : "", err);
        return NULL;
    }
    return e;
}

static const char *prompts[3] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    ("The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away, there lived a "
     "keeper of lighthouses who counted ships every night and wrote their names in a book."),
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(10))\n",
};

static int failures;

static void compare_logits(rlai_engine *ref, rlai_engine *dev, const char *mode, double tol)
{
    rlai_model_info mi;
    rlai_engine_info(ref, &mi);
    int V = mi.n_vocab;
    for (int p = 0; p < 3; p++) {
        rlai_token ids[512];
        int n = rlai_engine_tokenize(ref, prompts[p], strlen(prompts[p]), true, true, ids, 512);
        if (n <= 0) {
            fprintf(stderr, "tokenize failed\n");
            failures++;
            return;
        }
        float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
        if (!a || !b || rlai_engine_eval_logits(ref, ids, n, a) < 0 || rlai_engine_eval_logits(dev, ids, n, b) < 0) {
            fprintf(stderr, "eval_logits failed\n");
            failures++;
            free(a);
            free(b);
            return;
        }
        double worst = 0;
        int agree = 0, must = 0, must_agree = 0, worst_pos = 0;
        for (int i = 0; i < n; i++) {
            const float *x = a + (size_t)i * V, *y = b + (size_t)i * V;
            double num = 0, den = 0;
            int t1 = 0, t2 = -1, d1 = 0;
            for (int j = 0; j < V; j++) {
                double d = (double)y[j] - x[j];
                num += d * d;
                den += (double)x[j] * x[j];
                if (x[j] > x[t1]) { t2 = t1; t1 = j; }
                else if (j != t1 && (t2 < 0 || x[j] > x[t2])) t2 = j;
                if (y[j] > y[d1]) d1 = j;
            }
            double rel = sqrt(num / (den > 0 ? den : 1));
            if (!(rel <= worst)) { worst = rel; worst_pos = i; }
            agree += t1 == d1;
            if (t2 >= 0 && x[t1] - x[t2] >= 0.05f) {
                must++;
                must_agree += t1 == d1;
            }
        }
        bool ok = worst <= tol && must_agree == must;
        printf("logits %-8s prompt %d (%3d positions): worst rel L2 %.3e at %d (bound %.0e), top-1 %d/%d, "
               "clear top-1 %d/%d  %s\n", mode, p + 1, n, worst, worst_pos, tol, agree, n, must_agree, must,
               ok ? "ok" : "FAIL");
        failures += !ok;
        free(a);
        free(b);
    }
}

typedef struct toks { int n; rlai_token t[128]; } toks;

static int collect(void *user, rlai_token tok, const char *text, size_t len)
{
    (void)text;
    (void)len;
    toks *g = user;
    if (tok >= 0 && g->n < 128)
        g->t[g->n++] = tok;
    return 0;
}

static int greedy(rlai_engine *e, int n_tok, toks *out, rlai_gen_metrics *m)
{
    rlai_token ids[64];
    int n = rlai_engine_tokenize(e, prompts[0], strlen(prompts[0]), true, true, ids, 64);
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.max_tokens = n_tok;
    gp.ignore_eos = true;
    out->n = 0;
    return n > 0 ? rlai_engine_generate_tokens(e, ids, n, &gp, collect, out, m) : -1;
}

static void compare_greedy(rlai_engine *ref, rlai_engine *dev, const char *mode, bool must_match)
{
    toks a, b;
    rlai_gen_metrics m;
    if (greedy(ref, 64, &a, &m) < 0 || greedy(dev, 64, &b, &m) < 0) {
        printf("greedy %s: generation failed  FAIL\n", mode);
        failures++;
        return;
    }
    int same = 0;
    while (same < a.n && same < b.n && a.t[same] == b.t[same])
        same++;
    bool ok = !must_match || (same == 64 && a.n == 64 && b.n == 64);
    printf("greedy %-8s 64 tokens: %d leading tokens identical%s  %s\n", mode, same,
           must_match ? " (must be 64)" : " (reported)", ok ? "ok" : "FAIL");
    failures += !ok;
}

typedef struct res { bool done; int status; rlai_gen_metrics m; } res;

static const char *quote_prompt =
    "<|im_start|>user\nCopy this notice word for word:\n\nThe harbour is closed to all boats from "
    "sunset on Friday until the tide turns on Sunday morning, while the north wall is repaired. "
    "Nets left on the quay will be moved to the fish market. Questions go to the harbour master "
    "at the Lantern Inn.<|im_end|>\n<|im_start|>assistant\n";

/* 96 greedy tokens of quote_prompt with drafting `spec`, alone. */
static int quote(rlai_engine *e, rlai_spec_mode spec, toks *out, rlai_gen_metrics *m)
{
    rlai_token ids[256];
    int n = rlai_engine_tokenize(e, quote_prompt, strlen(quote_prompt), true, true, ids, 256);
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.max_tokens = 96;
    gp.ignore_eos = true;
    gp.spec = spec;
    out->n = 0;
    return n > 0 ? rlai_engine_generate_tokens(e, ids, n, &gp, collect, out, m) : -1;
}

typedef struct streamed { res r; toks t; } streamed;   /* r first: on_done's user */

static int on_tok(void *user, rlai_token tok, const char *text, size_t len)
{
    return collect(&((streamed *)user)->t, tok, text, len);
}

static void on_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m);

static void compare_spec(rlai_engine *dev)
{
    toks off, on;
    rlai_gen_metrics m_off, m_on;
    if (quote(dev, RLAI_SPEC_OFF, &off, &m_off) < 0 || quote(dev, RLAI_SPEC_NGRAM, &on, &m_on) < 0) {
        printf("speculative: generation failed  FAIL\n");
        failures++;
        return;
    }
    bool same = off.n == 96 && on.n == 96 && !memcmp(off.t, on.t, sizeof(rlai_token) * 96);
    bool ok = same && m_on.accepted_tokens > 0;
    printf("speculative (ngram) 96 tokens: %s, %d drafted, %d accepted  %s\n",
           same ? "identical to plain decoding" : "DIFFERENT from plain decoding", m_on.drafted_tokens,
           m_on.accepted_tokens, ok ? "ok" : "FAIL");
    failures += !ok;

    /* the same request again, and once it decodes (drafting) three others
     * with long prompts: their prefill chunks and then their decode rows
     * share steps (and matmuls) with its verification rows */
    rlai_token ids[256], other[512];
    int n = rlai_engine_tokenize(dev, quote_prompt, strlen(quote_prompt), true, true, ids, 256);
    streamed s[4];
    memset(s, 0, sizeof(s));
    bool sub = n > 0;
    for (int i = 0; i < 4 && sub; i++) {
        rlai_request_params rp;
        memset(&rp, 0, sizeof(rp));
        rlai_gen_params_init(&rp.gen);
        rp.gen.ignore_eos = true;
        rp.gen.spec = RLAI_SPEC_NGRAM;
        rp.on_token = on_tok;
        rp.on_done = on_done;
        rp.user = &s[i];
        if (i == 0) {
            rp.prompt = ids;
            rp.n_prompt = n;
            rp.gen.max_tokens = 96;
        } else {
            for (int k = 0; k < 512; k++)
                other[k] = (rlai_token)(100 + (k * 53 + i * 7) % 4000);
            rp.prompt = other;
            rp.n_prompt = 200 + 100 * i;   /* 900 prompt tokens: prefill over several steps */
            rp.gen.max_tokens = 24;
        }
        sub = rlai_engine_submit(dev, &rp, NULL) >= 0;
        while (i == 0 && sub && s[0].t.n < 4 && rlai_engine_step(dev) > 0) {
        }
    }
    while (sub && rlai_engine_step(dev) > 0) {
    }
    bool same_b = sub && s[0].r.done && s[0].r.status == 0 && s[0].t.n == 96 &&
                  !memcmp(s[0].t.t, off.t, sizeof(rlai_token) * 96);
    if (!sub)
        printf("  (a request was refused at submit)\n");
    else if (!same_b) {
        int k = 0;
        while (k < s[0].t.n && k < 96 && s[0].t.t[k] == off.t[k])
            k++;
        printf("  (done %d, status %d, %d tokens, first %d identical)\n", s[0].r.done, s[0].r.status, s[0].t.n, k);
    }
    printf("speculative (ngram) beside 3 others: %s, %d drafted, %d accepted  %s\n",
           same_b ? "identical to plain decoding alone" : "DIFFERENT from plain decoding alone",
           s[0].r.m.drafted_tokens, s[0].r.m.accepted_tokens, same_b ? "ok" : "FAIL");
    failures += !same_b;
}

typedef struct lps { int n; rlai_token_logprobs e[128]; } lps;

static void on_lp(void *user, const rlai_token_logprobs *lp)
{
    lps *l = user;
    if (l->n < 128)
        l->e[l->n++] = *lp;
}

typedef struct jtext { toks t; char s[2048]; size_t len; } jtext;

static int on_jtok(void *user, rlai_token tok, const char *text, size_t len)
{
    jtext *j = user;
    if (j->len + len < sizeof(j->s)) {
        memcpy(j->s + j->len, text, len);
        j->len += len;
    }
    return collect(&j->t, tok, text, len);
}

static void compare_structured(rlai_engine *dev)
{
    static const char schema[] =
        "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"first_sentence\":{\"type\":"
        "\"string\"}},\"required\":[\"title\",\"first_sentence\"],\"additionalProperties\":false}";
    rlai_chat_message msgs[] = {
        { "system", "You reply with JSON only." },
        { "user", "Copy the title and the first sentence of this notice into JSON.\n\nTitle: Harbour closing hours\n"
                  "The harbour gates of Port Elsmere close at nine in the evening from the first of October until "
                  "the end of March. Boats that arrive later must wait at the outer buoy." },
    };
    rlai_grammar *g = NULL;
    rlai_token *ids = NULL;
    int n = 0;
    if (rlai_grammar_from_json_schema(schema, strlen(schema), &g, NULL, 0) < 0 ||
        rlai_engine_tokenize_chat(dev, msgs, 2, true, &ids, &n) < 0) {
        printf("structured: setup failed  FAIL\n");
        failures++;
        rlai_grammar_unref(g);
        return;
    }
    static jtext out[2];
    static lps lp[2];
    rlai_gen_metrics m[2];
    int rc = 0;
    for (int on = 0; on < 2 && rc == 0; on++) {
        memset(&out[on], 0, sizeof(out[on]));
        lp[on].n = 0;
        rlai_gen_params gp;
        rlai_gen_params_init(&gp);
        gp.max_tokens = 120;
        gp.grammar = g;
        gp.top_logprobs = 3;
        gp.on_logprobs = on_lp;
        gp.logprobs_user = &lp[on];
        gp.spec = on ? RLAI_SPEC_NGRAM : RLAI_SPEC_OFF;
        rc = rlai_engine_generate_tokens(dev, ids, n, &gp, on_jtok, &out[on], &m[on]);
    }
    bool same = rc == 0 && out[0].t.n == out[1].t.n && out[0].t.n > 0 && lp[0].n == lp[1].n &&
                lp[0].n == out[0].t.n && !memcmp(out[0].t.t, out[1].t.t, sizeof(rlai_token) * (size_t)out[0].t.n);
    for (int i = 0; same && i < lp[0].n; i++) {
        const rlai_token_logprobs *a = &lp[0].e[i], *b = &lp[1].e[i];
        same = a->token == b->token && !memcmp(&a->logprob, &b->logprob, sizeof(float)) && a->n_top == b->n_top &&
               !memcmp(a->top_ids, b->top_ids, sizeof(rlai_token) * (size_t)a->n_top) &&
               !memcmp(a->top_logprobs, b->top_logprobs, sizeof(float) * (size_t)a->n_top);
    }
    bool valid = rc == 0 && m[0].stop == RLAI_STOP_EOG && rlai_grammar_accepts(g, out[0].s, out[0].len);
    bool ok = same && valid && m[1].accepted_tokens > 0;
    printf("structured (JSON schema, logprobs) %d tokens: %s%s, %d drafted, %d accepted  %s\n", out[0].t.n,
           same ? "tokens and logprobs identical with drafts" : "DIFFERENT with drafts",
           valid ? "" : ", NOT valid under the schema", m[1].drafted_tokens, m[1].accepted_tokens, ok ? "ok" : "FAIL");
    failures += !ok;
    free(ids);
    rlai_grammar_unref(g);
}

static void on_done(void *user, uint64_t id, int status, const rlai_gen_metrics *m)
{
    (void)id;
    res *r = user;
    r->done = true;
    r->status = status;
    r->m = *m;
}

static double decode_batch(rlai_engine *e, int N)
{
    rlai_token ids[64];
    int n = rlai_engine_tokenize(e, prompts[0], strlen(prompts[0]), true, true, ids, 64);
    rlai_token base = ids[1];
    res r[8];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < N; i++) {
        rlai_request_params rp;
        memset(&rp, 0, sizeof(rp));
        ids[1] = (rlai_token)(base + i);   /* distinct prompts: no prefix reuse */
        rp.prompt = ids;
        rp.n_prompt = n;
        rlai_gen_params_init(&rp.gen);
        rp.gen.max_tokens = 128;
        rp.gen.ignore_eos = true;
        rp.on_done = on_done;
        rp.user = &r[i];
        if (rlai_engine_submit(e, &rp, NULL) < 0)
            return -1;
    }
    rlai_engine_step(e);   /* prefill (and the first token) */
    double t0 = now_ms();
    while (rlai_engine_step(e) > 0) {
    }
    double dt = (now_ms() - t0) / 1e3;
    int gen = 0;
    for (int i = 0; i < N; i++)
        gen += r[i].m.gen_tokens - 1;
    return dt > 0 ? gen / dt : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: rlai-gpucheck MODEL [--device cuda[:N]] [--threads N] [--cpu-only] [--checks-only]\n");
        return 2;
    }
    model_path = argv[1];
    const char *device = "cuda";
    bool timings = true;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-only")) device = "cpu";
        else if (!strcmp(argv[i], "--checks-only")) timings = false;
        else { fprintf(stderr, "rlai-gpucheck: bad argument '%s'\n", argv[i]); return 2; }
    }
    rlai_engine *cpu = open_engine("cpu", false), *dev = open_engine(device, false);
    if (!cpu || !dev)
        return 1;
    rlai_model_info mi;
    rlai_engine_info(dev, &mi);
    printf("device under test: %s\n", mi.device);
    compare_logits(cpu, dev, "default", 2e-2);
    compare_greedy(cpu, dev, "default", false);
    compare_spec(dev);
    compare_structured(dev);
    rlai_engine *cpu_p = open_engine("cpu", true), *dev_p = open_engine(device, true);
    if (!cpu_p || !dev_p)
        return 1;
    compare_logits(cpu_p, dev_p, "precise", 1e-3);
    compare_greedy(cpu_p, dev_p, "precise", true);
    rlai_engine_close(cpu_p);
    rlai_engine_close(dev_p);
    if (!timings) {
        rlai_engine_close(cpu);
        rlai_engine_close(dev);
        printf("\nrlai-gpucheck: %s (%d failed check%s; timings skipped)\n", failures ? "FAIL" : "ok", failures,
               failures == 1 ? "" : "s");
        return failures ? 1 : 0;
    }

    /* timings on the device, default mode */
    rlai_token long_p[512];
    for (int i = 0; i < 512; i++)
        long_p[i] = (rlai_token)(100 + (i * 37) % 4000);
    rlai_gen_params gp;
    rlai_gen_params_init(&gp);
    gp.max_tokens = 1;
    toks sink;
    rlai_gen_metrics m;
    double prefill = 0;
    for (int rep = 0; rep < 3; rep++) {
        long_p[0] = (rlai_token)(100 + rep);   /* defeat the prefix cache */
        sink.n = 0;
        if (rlai_engine_generate_tokens(dev, long_p, 512, &gp, collect, &sink, &m) == 0 && m.prefill_tps > prefill)
            prefill = m.prefill_tps;
    }
    double ttft = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        long_p[0] = (rlai_token)(200 + rep);
        sink.n = 0;
        if (rlai_engine_generate_tokens(dev, long_p, 22, &gp, collect, &sink, &m) == 0 && m.ttft_ms < ttft)
            ttft = m.ttft_ms;
    }
    double d1 = decode_batch(dev, 1), d8 = decode_batch(dev, 8);
    printf("\n| device | prefill tok/s (512) | TTFT ms (22 tok) | decode tok/s b1 | decode tok/s b8 | CUDA graphs |\n");
    printf("|---|---|---|---|---|---|\n");
    printf("| %s | %.0f | %.2f | %.0f | %.0f | not implemented |\n", mi.device, prefill, ttft, d1, d8);
    rlai_engine_close(cpu);
    rlai_engine_close(dev);
    printf("\nrlai-gpucheck: %s (%d failed check%s)\n", failures ? "FAIL" : "ok", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
