/* spec_endings.h - randomized requests that end mid-draft, run with and
 * without speculative drafts on the same engines and compared: the
 * harness of test_spec.c (prompt-lookup drafts) and test_draft.c (a draft
 * model). Header-only test helper (include <check.h> and gen_capture.h
 * first).
 *
 * spec_endings_check() draws N requests from a fixed seed, N / 5 for
 * each way a request ends: a stop string taken from the second half of
 * the plain output, max_tokens, the end of the small engine's context, a
 * client whose on_token cancels after a random token, and EOS (or
 * max_tokens); greedy or seeded sampling with the product's filters,
 * repetition, presence and frequency penalties or none, any draft cap
 * 1..16. The plain runs go one at a time, the drafted ones four
 * at a time. With drafts each request must give the plain run's ids,
 * streamed text, stop reason and status. */
#ifndef RLAI_TESTS_SPEC_ENDINGS_H
#define RLAI_TESTS_SPEC_ENDINGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rlai/engine.h"

/* One request: its ids and streamed text, and the token count after
 * which its on_token cancels it (0 = never). */
typedef struct spec_ending_req {
    result r;   /* first: done_cb takes the same user pointer */
    char text[4096];
    size_t tlen;
    int cancel_at;
} spec_ending_req;

static inline int spec_endings_collect(void *user, rlai_token tok, const char *text, size_t len)
{
    spec_ending_req *q = user;
    collect(&q->r, tok, text, len);
    ck_assert_uint_lt(q->tlen + len, sizeof(q->text));
    memcpy(q->text + q->tlen, text, len);
    q->tlen += len;
    q->text[q->tlen] = '\0';
    return q->cancel_at > 0 && q->r.n >= q->cancel_at;
}

/* What one request asks (the same with and without drafts). */
typedef struct spec_ending_case {
    int prompt, max_tokens, max_draft, cancel_at;
    bool ignore_eos, hot, small_ctx, penalties;
    char stop[8];   /* "" = none */
} spec_ending_case;

static inline void spec_endings_submit(rlai_engine *e, const rlai_token *p, int n, const spec_ending_case *c,
                                       rlai_spec_mode spec, int i, spec_ending_req *q)
{
    memset(q, 0, sizeof(*q));
    q->cancel_at = c->cancel_at;
    const char *stops[2] = { c->stop, NULL };
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = p;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = c->max_tokens;
    rp.gen.ignore_eos = c->ignore_eos;
    rp.gen.stop = c->stop[0] ? stops : NULL;   /* copied by submit */
    rp.gen.spec = spec;
    rp.gen.spec_max_draft = spec == RLAI_SPEC_OFF ? 0 : c->max_draft;
    if (c->hot)
        rlai_sampler_params_product(&rp.gen.sampling, 100 + (uint64_t)i);
    if (c->penalties) {   /* they read the tokens accepted before each verification row */
        rp.gen.sampling.repeat_penalty = 1.3f;
        rp.gen.sampling.presence_penalty = 0.8f;
        rp.gen.sampling.frequency_penalty = 0.5f;
        rp.gen.sampling.repeat_last_n = 16 + i % 3 * 24;
    }
    rp.on_token = spec_endings_collect;
    rp.on_done = done_cb;
    rp.user = q;
    uint64_t id = 0;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), 0);
}

#define SPEC_ENDINGS_N 15
#define SPEC_ENDINGS_SMALL_CTX 112   /* the prompts take 40-90 tokens */

/* The small engine of spec_endings_check: `model` with a context of
 * SPEC_ENDINGS_SMALL_CTX tokens, 2 threads, every decoding sequence
 * drafting, with `spec` and `draft_model` (NULL = none) as engine
 * settings. Owned by the caller (rlai_engine_close). */
static inline rlai_engine *spec_endings_small_engine(const char *model, rlai_spec_mode spec, const char *draft_model)
{
    rlai_engine_params sp;
    rlai_engine_params_init(&sp);
    sp.n_threads = 2;
    sp.n_ctx = SPEC_ENDINGS_SMALL_CTX;
    sp.spec = spec;
    sp.spec_max_batch = -1;
    sp.draft_model = draft_model;
    rlai_engine *e = NULL;
    char err[768];
    ck_assert_msg(rlai_engine_open(model, &sp, &e, err, sizeof(err)) == 0, "%s", err);
    return e;
}

/* big and small: engines of the same model with drafting on for every
 * decoding sequence (spec_max_batch -1), small from
 * spec_endings_small_engine; prompts p[0..4) of n[i] tokens; spec: the
 * mode the drafted runs ask for; run_idle steps an engine until it is
 * idle (and checks what the caller's file checks then). Returns the
 * drafted tokens of all requests. */
static inline long spec_endings_check(rlai_engine *big, rlai_engine *small, rlai_token (*p)[256], const int *n,
                                      rlai_spec_mode spec, void (*run_idle)(rlai_engine *))
{
    enum { N = SPEC_ENDINGS_N };
    static spec_ending_case cs[N];
    static spec_ending_req off[N], on[N], probe;
    for (int i = 0; i < 4; i++)
        ck_assert_int_lt(n[i], SPEC_ENDINGS_SMALL_CTX);
    uint64_t x = 0x5EC0DE5EED1234ull;
#define SPEC_ENDINGS_NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int i = 0; i < N; i++) {
        /* the ending it is drawn for: i % 5 (the others may come first) */
        spec_ending_case *c = &cs[i];
        memset(c, 0, sizeof(*c));
        c->prompt = (int)(SPEC_ENDINGS_NEXT() % 4);
        c->max_draft = 1 + (int)(SPEC_ENDINGS_NEXT() % RLAI_SPEC_MAX_DRAFT);
        c->hot = SPEC_ENDINGS_NEXT() % 2;
        c->penalties = SPEC_ENDINGS_NEXT() % 2;
        c->ignore_eos = true;
        c->max_tokens = 48;
        switch (i % 5) {
        case 0: {   /* a stop string: a few bytes of the plain output's second half */
            c->ignore_eos = SPEC_ENDINGS_NEXT() % 2;
            spec_endings_submit(big, p[c->prompt], n[c->prompt], c, RLAI_SPEC_OFF, i, &probe);
            run_idle(big);
            if (probe.tlen > 12) {
                size_t len = 2 + SPEC_ENDINGS_NEXT() % 5;
                size_t at = probe.tlen / 2 + SPEC_ENDINGS_NEXT() % (probe.tlen / 2 - len + 1);
                memcpy(c->stop, probe.text + at, len);
                c->stop[len] = '\0';
            }
            break;
        }
        case 1: c->max_tokens = 1 + (int)(SPEC_ENDINGS_NEXT() % 48); break;
        case 2: c->small_ctx = true; c->max_tokens = 0; break;   /* until the context's end */
        case 3: c->cancel_at = 1 + (int)(SPEC_ENDINGS_NEXT() % 40); break;
        default: c->ignore_eos = false; c->max_tokens = 64; break;   /* EOS or max_tokens */
        }
    }
#undef SPEC_ENDINGS_NEXT
    for (int i = 0; i < N; i++) {   /* plain, one at a time */
        rlai_engine *e = cs[i].small_ctx ? small : big;
        spec_endings_submit(e, p[cs[i].prompt], n[cs[i].prompt], &cs[i], RLAI_SPEC_OFF, i, &off[i]);
        run_idle(e);
    }
    for (int i0 = 0; i0 < N; i0 += 4) {   /* with drafts, four at a time */
        for (int i = i0; i < i0 + 4 && i < N; i++)
            spec_endings_submit(cs[i].small_ctx ? small : big, p[cs[i].prompt], n[cs[i].prompt], &cs[i], spec, i,
                                &on[i]);
        run_idle(big);
        run_idle(small);
    }
    long drafted = 0;
    int ends[8] = { 0 };
    for (int i = 0; i < N; i++) {
        const spec_ending_case *c = &cs[i];
        ck_assert(off[i].r.done && on[i].r.done);
        ck_assert_int_eq(off[i].r.m.drafted_tokens, 0);
        ck_assert_msg(on[i].r.status == off[i].r.status && on[i].r.m.stop == off[i].r.m.stop,
                      "request %d: status %d stop %d with drafts, %d %d without", i, on[i].r.status,
                      (int)on[i].r.m.stop, off[i].r.status, (int)off[i].r.m.stop);
        ck_assert_msg(on[i].r.n == off[i].r.n &&
                          !memcmp(on[i].r.toks, off[i].r.toks, sizeof(rlai_token) * (size_t)off[i].r.n),
                      "request %d (prompt %d, max_tokens %d, draft %d, stop \"%s\", cancel %d): %d tokens with "
                      "drafts, %d without",
                      i, c->prompt, c->max_tokens, c->max_draft, c->stop, c->cancel_at, on[i].r.n, off[i].r.n);
        ck_assert_msg(on[i].tlen == off[i].tlen && !memcmp(on[i].text, off[i].text, off[i].tlen),
                      "request %d: text differs:\n%s\n%s", i, on[i].text, off[i].text);
        ck_assert_int_le(on[i].r.m.accepted_tokens, on[i].r.m.drafted_tokens);
        drafted += on[i].r.m.drafted_tokens;
        ends[on[i].r.m.stop & 7]++;
    }
    fprintf(stderr, "random endings: %ld drafted; eog %d, max_tokens %d, stop string %d, context %d, cancelled %d\n",
            drafted, ends[RLAI_STOP_EOG], ends[RLAI_STOP_MAX_TOKENS], ends[RLAI_STOP_STRING], ends[RLAI_STOP_CONTEXT],
            ends[RLAI_STOP_CANCELLED]);
    /* the draw covers what it is for */
    ck_assert_int_gt(ends[RLAI_STOP_STRING], 0);
    ck_assert_int_gt(ends[RLAI_STOP_MAX_TOKENS], 0);
    ck_assert_int_gt(ends[RLAI_STOP_CONTEXT], 0);
    ck_assert_int_gt(ends[RLAI_STOP_CANCELLED], 0);
    return drafted;
}

#endif
