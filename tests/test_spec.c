/* test_spec.c - speculative decoding: the n-gram drafter and the adaptive
 * draft length as pure functions; the verification rule keeps the
 * sampling distribution (chi-square on a fixed seed) and takes exactly the
 * draws of plain decoding; and on the real default model, greedy and
 * seeded sampled output with speculation is token-for-token the output
 * without it, alone and under continuous batching, with drafts actually
 * accepted, max_tokens honoured exactly and every KV block returned; and
 * randomized requests that end mid-draft (stop string, max_tokens, EOS,
 * context end, a cancelling client) end exactly as without drafts; and
 * penalties see each accepted draft token before the next row. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlai/engine.h"
#include "sampler.h"
#include "spec.h"
#include "gen_capture.h"
#include "spec_endings.h"

#define MODEL RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ------------------------------------------------------------ drafter */

START_TEST(ngram_prefers_longest_suffix_and_most_recent_match)
{
    int32_t out[RLAI_SPEC_MAX_DRAFT];
    int g = -1;
    /* suffix "1 2 3" occurred at 0: the draft is what followed it */
    const int32_t a[] = { 1, 2, 3, 4, 5, 6, 9, 1, 2, 3 };
    int from = -2;
    int n = rlai_spec_ngram_draft(a, 10, 4, -1, out, &g, &from);
    ck_assert_int_eq(g, 3);
    ck_assert_int_eq(from, 3);
    /* no copy in progress: a 3-token match drafts at most 3 tokens */
    ck_assert_int_eq(n, 3);
    ck_assert(out[0] == 4 && out[1] == 5 && out[2] == 6);
    /* continuing the passage an accepted lookup came from (near = the
     * index where that copy goes on): up to max_draft */
    for (int near = 0; near <= 3 + RLAI_SPEC_NEAR_BEFORE; near++) {   /* from 3 - NEAR_AFTER < 0 */
        n = rlai_spec_ngram_draft(a, 10, 4, near, out, &g, NULL);
        ck_assert_int_eq(n, 4);
        ck_assert(out[0] == 4 && out[1] == 5 && out[2] == 6 && out[3] == 9);
    }
    /* a copy left off elsewhere does not count */
    ck_assert_int_eq(rlai_spec_ngram_draft(a, 10, 4, 3 + RLAI_SPEC_NEAR_BEFORE + 1, out, &g, NULL), 3);
    /* where the copy goes on: past the accepted tokens and the one the
     * model wrote after them; unchanged when nothing was accepted */
    ck_assert_int_eq(rlai_spec_near_after(-1, 3, 2), 6);
    ck_assert_int_eq(rlai_spec_near_after(17, 3, 0), 17);
    ck_assert_int_eq(rlai_spec_near_after(17, -1, 2), 17);
    /* the 3-token suffix beats a more recent 1-token match */
    const int32_t b[] = { 7, 8, 9, 50, 9, 60, 7, 8, 9 };
    n = rlai_spec_ngram_draft(b, 9, 2, -1, out, &g, NULL);
    ck_assert_int_eq(g, 3);
    ck_assert_int_eq(n, 2);
    ck_assert(out[0] == 50 && out[1] == 9);
    /* of two 2-token matches the most recent one wins; they are followed
     * by different tokens (10, 20), so only one token is drafted */
    const int32_t c[] = { 4, 5, 10, 1, 4, 5, 20, 2, 4, 5 };
    n = rlai_spec_ngram_draft(c, 10, 4, -1, out, &g, NULL);
    ck_assert_int_eq(g, 2);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(out[0], 20);
    /* two 2-token matches that agree on what follows: drafted in full */
    const int32_t c2[] = { 4, 5, 10, 11, 4, 5, 10, 12, 4, 5 };
    n = rlai_spec_ngram_draft(c2, 10, 2, -1, out, &g, NULL);
    ck_assert_int_eq(g, 2);
    ck_assert_int_eq(n, 2);
    ck_assert(out[0] == 10 && out[1] == 12);
    /* a 1-token match drafts nothing */
    const int32_t d[] = { 3, 7, 9, 3 };
    ck_assert_int_eq(rlai_spec_ngram_draft(d, 4, 8, -1, out, &g, NULL), 0);
    ck_assert_int_eq(g, 0);
    const int32_t d2[] = { 3, 3 };
    ck_assert_int_eq(rlai_spec_ngram_draft(d2, 2, 8, -1, out, &g, NULL), 0);
    /* the longest suffix is compared up to RLAI_SPEC_NGRAM_MAX tokens: a
     * 6-token match beats a more recent 3-token one */
    const int32_t l[] = { 1, 2, 3, 4, 5, 6, 70, 71, 9, 4, 5, 6, 80, 81, 1, 2, 3, 4, 5, 6 };
    n = rlai_spec_ngram_draft(l, 20, 2, -1, out, &g, NULL);
    ck_assert_int_eq(g, 6);
    ck_assert_int_eq(n, 2);
    ck_assert(out[0] == 70 && out[1] == 71);
    /* the draft stops at the end of the sequence */
    const int32_t f[] = { 5, 6, 5, 6 };
    n = rlai_spec_ngram_draft(f, 4, 8, -1, out, &g, NULL);
    ck_assert_int_eq(g, 2);
    ck_assert_int_eq(n, 2);
    ck_assert(out[0] == 5 && out[1] == 6);
    /* no earlier occurrence: nothing */
    const int32_t e[] = { 1, 2, 3, 4 };
    ck_assert_int_eq(rlai_spec_ngram_draft(e, 4, 8, -1, out, &g, &from), 0);
    ck_assert_int_eq(g, 0);
    ck_assert_int_eq(from, -1);
    ck_assert_int_eq(rlai_spec_ngram_draft(a, 10, 0, -1, out, NULL, NULL), 0);
    ck_assert_int_eq(rlai_spec_ngram_draft(a, 1, 4, -1, out, NULL, NULL), 0);
    /* max_draft is capped at RLAI_SPEC_MAX_DRAFT */
    int32_t rep[43];
    for (int i = 0; i < 43; i++)
        rep[i] = i % 40;   /* 0..39 then 0 1 2: the match at 0 has 40 tokens after it */
    ck_assert_int_eq(rlai_spec_ngram_draft(rep, 43, 1000, -1, out, NULL, NULL), 3);   /* 3-token match */
    ck_assert_int_eq(rlai_spec_ngram_draft(rep, 43, 1000, 3, out, NULL, NULL), RLAI_SPEC_MAX_DRAFT);
    ck_assert(out[0] == 3 && out[RLAI_SPEC_MAX_DRAFT - 1] == 18);
}
END_TEST

START_TEST(lookup_drafts_from_a_prediction)
{
    int32_t out[RLAI_SPEC_MAX_DRAFT];
    int g = -1, from = -2;
    /* the prediction starts with the prompt's tail (7 8 9): right after
     * the prompt, its text is drafted */
    const int32_t prompt[] = { 1, 2, 7, 8, 9 };
    const int32_t pred[] = { 7, 8, 9, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49 };
    int n = rlai_spec_lookup_draft(prompt, 5, pred, 13, 6, -1, out, &g, &from);
    ck_assert_int_eq(g, 3);
    ck_assert_int_eq(from, RLAI_SPEC_PRED_BASE + 3);
    ck_assert_int_eq(n, 3);                    /* no copy yet: at most the match length */
    ck_assert(out[0] == 40 && out[1] == 41 && out[2] == 42);
    int near = rlai_spec_near_after(-1, from, 3);   /* all 3 accepted, then 43 emitted */
    ck_assert_int_eq(near, RLAI_SPEC_PRED_BASE + 7);
    const int32_t s1[] = { 1, 2, 7, 8, 9, 40, 41, 42, 43 };
    n = rlai_spec_lookup_draft(s1, 9, pred, 13, 6, near, out, &g, &from);
    ck_assert_int_eq(from, RLAI_SPEC_PRED_BASE + 7);
    ck_assert_int_eq(n, 6);                    /* copying: up to max_draft */
    ck_assert(out[0] == 44 && out[5] == 49);
    /* the model wrote 99 instead of 44 (nothing accepted: the copy's place
     * stays) and met the prediction again at 45 46: a 2-token match near
     * that place drafts on to the prediction's end... */
    near = rlai_spec_near_after(near, from, 0);
    ck_assert_int_eq(near, RLAI_SPEC_PRED_BASE + 7);
    const int32_t s2[] = { 1, 2, 7, 8, 9, 40, 41, 42, 43, 99, 45, 46 };
    n = rlai_spec_lookup_draft(s2, 12, pred, 13, 6, near, out, &g, &from);
    ck_assert_int_eq(g, 2);
    ck_assert_int_eq(from, RLAI_SPEC_PRED_BASE + 10);
    ck_assert(n == 3 && out[0] == 47 && out[2] == 49);
    /* ... where far from a copy it drafts no more than it matched */
    ck_assert_int_eq(rlai_spec_lookup_draft(s2, 12, pred, 13, 6, -1, out, &g, NULL), 2);
    /* no prediction: the same calls are plain prompt lookup */
    ck_assert_int_eq(rlai_spec_lookup_draft(prompt, 5, NULL, 0, 6, -1, out, &g, &from), 0);
    ck_assert_int_eq(from, -1);
    ck_assert_int_eq(rlai_spec_lookup_draft(s2, 12, NULL, 13, 6, near, out, &g, NULL), 0);
    /* a tie of 2 whose sources disagree on the next token drafts one, the
     * sequence's own (the more recent text) */
    const int32_t t[] = { 5, 6, 7, 10, 11, 12, 30, 6, 7 };
    const int32_t tp[] = { 5, 6, 7, 20, 21 };
    n = rlai_spec_lookup_draft(t, 9, tp, 5, 4, -1, out, &g, &from);
    ck_assert_int_eq(g, 2);
    ck_assert(n == 1 && out[0] == 10 && from == 3);
    /* a tie of 3: the sequence's occurrence ... */
    const int32_t t2[] = { 5, 6, 7, 10, 11, 12, 5, 6, 7 };
    n = rlai_spec_lookup_draft(t2, 9, tp, 5, 4, -1, out, &g, &from);
    ck_assert_int_eq(g, 3);
    ck_assert_int_eq(from, 3);
    ck_assert(n == 3 && out[0] == 10 && out[2] == 12);
    /* ... unless the prediction's continues the copy in progress */
    n = rlai_spec_lookup_draft(t2, 9, tp, 5, 4, RLAI_SPEC_PRED_BASE + 3, out, &g, &from);
    ck_assert_int_eq(from, RLAI_SPEC_PRED_BASE + 3);
    ck_assert(n == 2 && out[0] == 20 && out[1] == 21);
    /* the longer match wins, in either source */
    const int32_t t3[] = { 1, 2, 3, 4, 9, 9, 9, 1, 2, 3, 4 };
    const int32_t tp3[] = { 2, 3, 4, 50 };
    n = rlai_spec_lookup_draft(t3, 11, tp3, 4, 4, -1, out, &g, &from);
    ck_assert_int_eq(g, 4);
    ck_assert(n == 4 && from == 4 && out[0] == 9);
    const int32_t t4[] = { 9, 1, 2, 3, 4 };
    const int32_t tp4[] = { 1, 2, 3, 4, 50 };
    n = rlai_spec_lookup_draft(t4, 5, tp4, 5, 4, -1, out, &g, &from);
    ck_assert_int_eq(g, 4);                    /* only the prediction has it */
    ck_assert(n == 1 && out[0] == 50 && from == RLAI_SPEC_PRED_BASE + 4);
    /* a prediction over the limit is ignored */
    ck_assert_int_eq(rlai_spec_lookup_draft(t4, 5, tp4, RLAI_SPEC_MAX_PREDICTION + 1, 4, -1, out, &g, NULL), 0);
}
END_TEST

START_TEST(adaptive_gamma_grows_shrinks_and_pauses)
{
    rlai_spec_state s;
    rlai_spec_state_init(&s, 8);
    ck_assert_int_eq(rlai_spec_next_gamma(&s), 4);
    rlai_spec_feedback(&s, 4, 4, 0);
    ck_assert_int_eq(rlai_spec_next_gamma(&s), 6);
    rlai_spec_feedback(&s, 6, 6, 0);
    rlai_spec_feedback(&s, 8, 8, 0);
    ck_assert_int_eq(rlai_spec_next_gamma(&s), 8);   /* capped at max_draft */
    rlai_spec_feedback(&s, 8, 2, 0);
    int g = rlai_spec_next_gamma(&s);
    ck_assert(g >= 3 && g < 8);                       /* shrinks towards accepted + 1 */
    /* three verifications with nothing accepted: a pause, then a probe */
    for (int i = 0; i < 3; i++)
        rlai_spec_feedback(&s, 1, 0, 0);
    int paused = 0;
    while (rlai_spec_next_gamma(&s) == 0)
        ck_assert_int_lt(++paused, 1000);
    ck_assert_int_ge(paused, 4);
    /* a further failure pauses again, for longer */
    rlai_spec_feedback(&s, 1, 0, 0);
    int paused2 = 0;
    while (rlai_spec_next_gamma(&s) == 0)
        ck_assert_int_lt(++paused2, 1000);
    ck_assert_int_gt(paused2, paused);
    /* off */
    rlai_spec_state_init(&s, 0);
    ck_assert_int_eq(rlai_spec_next_gamma(&s), 0);
}
END_TEST

/* Verifications that accept tokens but cost more than they give pause
 * drafting; the same acceptance at a low cost (a GPU) does not. */
START_TEST(adaptive_gamma_weighs_the_step_cost)
{
    rlai_spec_state s;
    rlai_spec_state_init(&s, 8);
    int steps = 0;
    while (rlai_spec_next_gamma(&s) > 0) {
        rlai_spec_feedback(&s, 4, 1, 3.0);      /* 2 tokens for 3 steps' cost */
        ck_assert_int_lt(++steps, 10);
    }
    int paused = 1;
    while (rlai_spec_next_gamma(&s) == 0)
        ck_assert_int_lt(++paused, 1000);
    ck_assert_int_ge(paused, 4);
    /* the probe after the pause fails the same way: a longer pause */
    rlai_spec_feedback(&s, 4, 1, 3.0);
    int paused2 = 0;
    while (rlai_spec_next_gamma(&s) == 0)
        ck_assert_int_lt(++paused2, 1000);
    ck_assert_int_gt(paused2, paused - 1);
    /* cheap rows: the same acceptance keeps drafting */
    rlai_spec_state_init(&s, 8);
    for (int i = 0; i < 200; i++) {
        int g = rlai_spec_next_gamma(&s);
        ck_assert_int_gt(g, 0);
        rlai_spec_feedback(&s, g, 1, 1.0 + 0.05 * g);
    }
    /* unknown cost (<= 0): acceptance alone decides, as before */
    rlai_spec_state_init(&s, 8);
    for (int i = 0; i < 50; i++) {
        ck_assert_int_gt(rlai_spec_next_gamma(&s), 0);
        rlai_spec_feedback(&s, 4, 1, 0);
    }
}
END_TEST

START_TEST(step_cost_is_learned_from_step_times)
{
    rlai_spec_cost c;
    memset(&c, 0, sizeof c);
    ck_assert(fabs(rlai_spec_cost_of(&c, 1) - 1.0) < 1e-12);
    ck_assert(fabs(rlai_spec_cost_of(&c, 5) - (1.0 + 4 * RLAI_SPEC_COST_PRIOR)) < 1e-12);  /* the prior */
    rlai_spec_cost_observe(&c, 5, 30.0);            /* no plain step yet: ignored */
    ck_assert_int_eq(c.n_rows, 0);
    for (int i = 0; i < 10; i++)
        rlai_spec_cost_observe(&c, 1, 10.0);
    for (int i = 0; i < 10; i++)
        rlai_spec_cost_observe(&c, 5, 30.0);        /* 3 plain steps for 4 extra rows */
    ck_assert(fabs(c.per_row - 0.5) < 1e-9);
    ck_assert(fabs(rlai_spec_cost_of(&c, 5) - 3.0) < 1e-9);
    ck_assert(fabs(rlai_spec_cost_of(&c, 2) - 1.5) < 1e-9);
    /* nonsense samples are dropped; an outlier is clamped and averaged in */
    rlai_spec_cost_observe(&c, 0, 5.0);
    rlai_spec_cost_observe(&c, 3, -1.0);
    ck_assert_int_eq(c.n_rows, 10);
    rlai_spec_cost_observe(&c, 2, 1000.0);
    ck_assert(c.per_row > 0.5 && c.per_row <= 0.9 * 0.5 + 0.1 * 2 + 1e-9);
}
END_TEST

/* ------------------------------------------------------- verification rule */

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* One verified row (sampler.h): the row is sampled as plain decoding
 * samples it, and the draft is accepted iff the token equals it. */
static int32_t verify_row(rlai_sampler *s, float *logits, int32_t draft, int *accepted)
{
    int32_t tok = rlai_sampler_sample(s, logits);
    *accepted += tok == draft;
    return tok;
}

/* Verifies `draft` on the same logits `trials` times and returns Pearson's
 * chi-square of the emitted tokens against the expected p; *acc counts
 * the accepted drafts. */
static double chi_square(const rlai_sampler_params *sp, const float *logits, int nv, int32_t draft,
                         const double *p, int trials, int *counts, int *acc)
{
    rlai_sampler *s = NULL;
    ck_assert_int_eq(rlai_sampler_new(sp, nv, &s), 0);
    float buf[16];
    memset(counts, 0, sizeof(int) * (size_t)nv);
    *acc = 0;
    for (int t = 0; t < trials; t++) {
        memcpy(buf, logits, sizeof(float) * (size_t)nv);
        int32_t tok = verify_row(s, buf, draft, acc);
        ck_assert(tok >= 0 && tok < nv);
        counts[tok]++;
    }
    rlai_sampler_free(s);
    double x2 = 0.0;
    for (int i = 0; i < nv; i++) {
        double e = p[i] * trials;
        if (e == 0.0) {
            ck_assert_msg(counts[i] == 0, "token %d has probability 0 but was drawn %d times", i, counts[i]);
            continue;
        }
        x2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x2;
}

/* The emitted token follows p whatever the draft, and a draft is accepted
 * with probability p(draft): the standard rejection rule for a
 * deterministic draft. */
START_TEST(verification_rule_keeps_the_distribution)
{
    enum { NV = 6, TRIALS = 60000 };
    const float logits[NV] = { 2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f };
    rlai_sampler_params sp;
    memset(&sp, 0, sizeof(sp));
    sp.temperature = 0.8f;
    sp.top_p = 1.0f;
    sp.repeat_penalty = 1.0f;
    sp.seed = 1234;
    double p[NV], z = 0.0;
    for (int i = 0; i < NV; i++)
        z += p[i] = exp(logits[i] / 0.8);
    for (int i = 0; i < NV; i++)
        p[i] /= z;
    int counts[NV], acc;
    /* 5 degrees of freedom: 20.5 is the 0.1% critical value. Drafting the
     * likeliest, a middling and the least likely token; acceptance within
     * 4.5 standard deviations of p(draft). */
    const int32_t drafts[3] = { 0, 2, 5 };
    for (int d = 0; d < 3; d++) {
        double x2 = chi_square(&sp, logits, NV, drafts[d], p, TRIALS, counts, &acc);
        ck_assert_msg(x2 < 20.5, "draft %d: chi-square %.2f (counts %d %d %d %d %d %d)", drafts[d], x2,
                      counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]);
        double pd = p[drafts[d]], sd = sqrt(pd * (1 - pd) / TRIALS);
        ck_assert_msg(fabs((double)acc / TRIALS - pd) < 4.5 * sd, "draft %d accepted %.4f, p %.4f", drafts[d],
                      (double)acc / TRIALS, pd);
    }
    /* top_k = 3: a draft outside the kept set is never accepted and the
     * result follows the truncated, renormalised distribution. */
    sp.top_k = 3;
    double q[NV] = { 0 }, zq = p[0] + p[1] + p[2];
    for (int i = 0; i < 3; i++)
        q[i] = p[i] / zq;
    double x2 = chi_square(&sp, logits, NV, 5, q, TRIALS, counts, &acc);
    ck_assert_msg(x2 < 20.5, "top_k 3, draft outside: chi-square %.2f", x2);
    ck_assert_int_eq(counts[5], 0);
    ck_assert_int_eq(acc, 0);
    x2 = chi_square(&sp, logits, NV, 1, q, TRIALS, counts, &acc);
    ck_assert_msg(x2 < 20.5, "top_k 3, draft inside: chi-square %.2f", x2);
    /* greedy: the argmax whatever the draft */
    sp.top_k = 0;
    sp.temperature = 0.0f;
    rlai_sampler *s = NULL;
    ck_assert_int_eq(rlai_sampler_new(&sp, NV, &s), 0);
    float buf[NV];
    memcpy(buf, logits, sizeof(buf));
    acc = 0;
    ck_assert_int_eq(verify_row(s, buf, 4, &acc), 0);
    ck_assert_int_eq(acc, 0);
    rlai_sampler_free(s);
}
END_TEST

/* A seeded sampler decoding row by row, and the same seed verifying drafts
 * over the same rows (the scheduler's loop: sample, record, stop at the
 * first miss; rejected rows are not sampled), emit the same tokens: each
 * emitted token takes the draw plain decoding takes at its position. With
 * penalties, top-k/top-p and drafts that are partly right, partly random. */
START_TEST(verification_takes_the_draws_of_plain_decoding)
{
    enum { NV = 12, ROWS = 3000 };
    static float rows[ROWS][NV];
    static int32_t plain[ROWS];
    rng_state = 99;
    for (int t = 0; t < ROWS; t++)
        for (int v = 0; v < NV; v++)
            rows[t][v] = (float)((int)(rnd() % 4000) - 2000) / 700.0f;
    rlai_sampler_params sp;
    memset(&sp, 0, sizeof(sp));
    sp.temperature = 0.9f;
    sp.top_k = 8;
    sp.top_p = 0.95f;
    sp.repeat_penalty = 1.3f;
    sp.presence_penalty = 0.2f;
    sp.repeat_last_n = 16;
    sp.seed = 777;
    rlai_sampler *a = NULL, *b = NULL;
    ck_assert_int_eq(rlai_sampler_new(&sp, NV, &a), 0);
    ck_assert_int_eq(rlai_sampler_new(&sp, NV, &b), 0);
    float buf[NV];
    for (int t = 0; t < ROWS; t++) {
        memcpy(buf, rows[t], sizeof(buf));
        plain[t] = rlai_sampler_sample(a, buf);
        rlai_sampler_accept(a, plain[t]);
    }
    int t = 0, accepted = 0, rejected = 0, steps = 0;
    while (t < ROWS) {
        int32_t draft[8];
        int nd = (int)(rnd() % 6);
        for (int k = 0; k < nd; k++)   /* the true continuation, or a guess */
            draft[k] = (rnd() % 3 && t + k < ROWS) ? plain[t + k] : (int32_t)(rnd() % NV);
        for (int j = 0; t < ROWS; j++) {
            memcpy(buf, rows[t], sizeof(buf));
            int hit = 0;
            int32_t tok = verify_row(b, buf, j < nd ? draft[j] : -1, &hit);
            rlai_sampler_accept(b, tok);
            ck_assert_msg(tok == plain[t], "position %d: %d with drafts, %d without", t, tok, plain[t]);
            t++;
            if (!hit) {
                rejected += j < nd;
                break;
            }
            accepted++;
        }
        steps++;
    }
    /* both outcomes happened many times */
    ck_assert_int_gt(accepted, 500);
    ck_assert_int_gt(rejected, 300);
    ck_assert_int_lt(steps, ROWS);
    rlai_sampler_free(a);
    rlai_sampler_free(b);
}
END_TEST

/* ------------------------------------------------------- real model */

static rlai_engine *open_engine(rlai_spec_mode spec, int spec_max_batch)
{
    rlai_engine_params p;
    rlai_engine_params_init(&p);
    p.n_threads = 2;
    p.n_ctx = 1024;
    p.spec = spec;
    p.spec_max_batch = spec_max_batch;
    rlai_engine *e = NULL;
    char err[512];
    ck_assert_msg(rlai_engine_open(MODEL, &p, &e, err, sizeof(err)) == 0, "%s", err);
    return e;
}

/* sp: the request's sampling, NULL = the default (greedy); prediction:
 * rlai_gen_params.prediction (NULL = none) */
static void submit_sp(rlai_engine *e, const rlai_token *p, int n, int max_tokens, rlai_spec_mode spec,
                      const rlai_sampler_params *sp, const char *prediction, result *r)
{
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    memset(r, 0, sizeof(*r));
    rp.prompt = p;
    rp.n_prompt = n;
    rlai_gen_params_init(&rp.gen);
    rp.gen.max_tokens = max_tokens;
    rp.gen.ignore_eos = true;
    rp.gen.spec = spec;
    rp.gen.prediction = prediction;
    if (sp)
        rp.gen.sampling = *sp;
    rp.on_token = collect;
    rp.on_done = done_cb;
    rp.user = r;
    uint64_t id = 0;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), 0);
}

static void submit_s(rlai_engine *e, const rlai_token *p, int n, int max_tokens, rlai_spec_mode spec,
                     const rlai_sampler_params *sp, result *r)
{
    submit_sp(e, p, n, max_tokens, spec, sp, NULL, r);
}

static void submit(rlai_engine *e, const rlai_token *p, int n, int max_tokens, rlai_spec_mode spec,
                   result *r)
{
    submit_s(e, p, n, max_tokens, spec, NULL, r);
}

/* The product's default sampling (docs/DEFAULTS.md: temperature 0.8,
 * top-k 40, top-p 0.95, min-p 0.05), seeded per prompt. */
static rlai_sampler_params hot_sampling(int i)
{
    rlai_sampler_params sp;
    memset(&sp, 0, sizeof(sp));
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    sp.repeat_penalty = 1.0f;
    sp.repeat_last_n = 64;
    sp.seed = 4242u + (uint64_t)i;
    return sp;
}

static void run_until_idle(rlai_engine *e)
{
    int guard = 0;
    while (rlai_engine_step(e) > 0)
        ck_assert_int_lt(++guard, 100000);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq(st.running + st.queued, 0);
    ck_assert_int_eq(st.kv_blocks_used, 0);   /* rejected drafts left no block behind */
}

/* Text that repeats, as lore, quotes and code do. */
static const char *prompts[4] = {
    "<|im_start|>user\nRepeat this sentence three times: The keeper of Harrow Bay lighthouse counted "
    "forty ships every night and wrote their names in a red book.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nRename the variable x to count:\nint f(int *a, int n) {\n    int x = 0;\n"
    "    for (int i = 0; i < n; i++)\n        x += a[i];\n    return x;\n}<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nQuote exactly: \"Mira the smith of Oakvale forged the silver key that opens the "
    "north gate.\"<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTell me about your favourite season.<|im_end|>\n<|im_start|>assistant\n",
};

#define NTOK 64

/* The four prompts tokenized into p[i] (n[i] tokens each). */
static void tokenize_prompts(rlai_engine *e, rlai_token p[4][256], int n[4])
{
    for (int i = 0; i < 4; i++) {
        n[i] = rlai_engine_tokenize(e, prompts[i], strlen(prompts[i]), true, true, p[i], 256);
        ck_assert_int_gt(n[i], 0);
    }
}

START_TEST(greedy_output_is_identical_with_and_without_speculation)
{
    rlai_engine *e = open_engine(RLAI_SPEC_NGRAM, 0);
    rlai_token p[4][256];
    int n[4];
    tokenize_prompts(e, p, n);
    result off[4], on;
    long drafted = 0, accepted = 0;
    for (int i = 0; i < 4; i++) {
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_OFF, &off[i]);
        run_until_idle(e);
        ck_assert(off[i].done && off[i].status == 0);
        ck_assert_int_eq(off[i].n, NTOK);
        ck_assert_int_eq(off[i].m.drafted_tokens, 0);
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_AUTO, &on);   /* AUTO = the engine's NGRAM */
        run_until_idle(e);
        ck_assert(on.done && on.status == 0);
        ck_assert_int_eq(on.n, NTOK);
        ck_assert_int_eq(on.m.gen_tokens, NTOK);
        for (int k = 0; k < NTOK; k++)
            ck_assert_msg(on.toks[k] == off[i].toks[k], "prompt %d: token %d differs (%d vs %d)", i, k,
                          on.toks[k], off[i].toks[k]);
        ck_assert_int_le(on.m.accepted_tokens, on.m.drafted_tokens);
        drafted += on.m.drafted_tokens;
        accepted += on.m.accepted_tokens;
    }
    /* the copy tasks must actually have used speculation */
    ck_assert_int_gt(drafted, 0);
    ck_assert_int_gt(accepted, NTOK / 2);
    rlai_engine_stats st;
    rlai_engine_get_stats(e, &st);
    ck_assert_int_eq((long)st.spec_drafted_total, drafted);
    ck_assert_int_eq((long)st.spec_accepted_total, accepted);

    /* max_tokens is exact even when a draft reaches past it */
    for (int mt = 1; mt <= 5; mt++) {
        submit(e, p[0], n[0], mt, RLAI_SPEC_NGRAM, &on);
        run_until_idle(e);
        ck_assert_int_eq(on.n, mt);
        ck_assert_int_eq(on.m.stop, RLAI_STOP_MAX_TOKENS);
        ck_assert(memcmp(on.toks, off[0].toks, sizeof(rlai_token) * (size_t)mt) == 0);
    }
    rlai_engine_close(e);
}
END_TEST

START_TEST(speculation_under_continuous_batching)
{
    rlai_token p[4][256];
    int n[4];
    result alone[4], r[4];
    /* no batch limit: four sequences draft in the same steps */
    rlai_engine *e = open_engine(RLAI_SPEC_NGRAM, -1);
    tokenize_prompts(e, p, n);
    for (int i = 0; i < 4; i++) {
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_OFF, &alone[i]);
        run_until_idle(e);
    }
    for (int i = 0; i < 4; i++)
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_AUTO, &r[i]);
    run_until_idle(e);
    int drafted = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert(r[i].done && r[i].status == 0);
        ck_assert_int_eq(r[i].n, NTOK);
        ck_assert_msg(memcmp(r[i].toks, alone[i].toks, sizeof(rlai_token) * NTOK) == 0,
                      "prompt %d: batched speculative output differs from the lone plain run", i);
        drafted += r[i].m.drafted_tokens;
    }
    ck_assert_int_gt(drafted, 0);
    /* sampled, seeded: the same again */
    static result alone_hot[4], r_hot[4];
    rlai_sampler_params hot[4];
    for (int i = 0; i < 4; i++) {
        hot[i] = hot_sampling(i);
        submit_s(e, p[i], n[i], NTOK, RLAI_SPEC_OFF, &hot[i], &alone_hot[i]);
        run_until_idle(e);
    }
    for (int i = 0; i < 4; i++)
        submit_s(e, p[i], n[i], NTOK, RLAI_SPEC_NGRAM, &hot[i], &r_hot[i]);
    run_until_idle(e);
    drafted = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert(r_hot[i].done && r_hot[i].status == 0 && r_hot[i].n == NTOK);
        ck_assert_msg(memcmp(r_hot[i].toks, alone_hot[i].toks, sizeof(rlai_token) * NTOK) == 0,
                      "prompt %d: batched sampled speculative output differs from the lone plain run", i);
        drafted += r_hot[i].m.drafted_tokens;
    }
    ck_assert_int_gt(drafted, 0);
    rlai_engine_close(e);

    /* the default batch limit (2): with four sequences decoding no one drafts */
    e = open_engine(RLAI_SPEC_NGRAM, 0);
    for (int i = 0; i < 4; i++)
        submit(e, p[i], n[i], NTOK, RLAI_SPEC_AUTO, &r[i]);
    run_until_idle(e);
    for (int i = 0; i < 4; i++) {
        ck_assert(memcmp(r[i].toks, alone[i].toks, sizeof(rlai_token) * NTOK) == 0);
        ck_assert_int_eq(r[i].m.drafted_tokens, 0);
    }
    rlai_engine_close(e);
}
END_TEST

/* The built-in default (engine AUTO) drafts for greedy and sampled
 * requests alike, and neither output changes: a seed gives the same text
 * with and without drafts. */
START_TEST(auto_drafts_and_keeps_every_output)
{
    rlai_engine *e = open_engine(RLAI_SPEC_AUTO, 0);
    rlai_token p[256];
    int n = rlai_engine_tokenize(e, prompts[0], strlen(prompts[0]), true, true, p, 256);
    ck_assert_int_gt(n, 0);
    static result off, on;
    submit(e, p, n, NTOK, RLAI_SPEC_OFF, &off);
    run_until_idle(e);
    submit(e, p, n, NTOK, RLAI_SPEC_AUTO, &on);
    run_until_idle(e);
    ck_assert(on.done && on.status == 0 && on.n == NTOK);
    ck_assert(memcmp(on.toks, off.toks, sizeof(rlai_token) * NTOK) == 0);
    ck_assert_int_eq(off.m.drafted_tokens, 0);
    ck_assert_int_gt(on.m.drafted_tokens, 0);
    ck_assert_int_gt(on.m.accepted_tokens, 0);

    /* sampled: every prompt, seeded, with and without */
    long drafted = 0, accepted = 0;
    for (int i = 0; i < 4; i++) {
        rlai_sampler_params hot = hot_sampling(i);
        n = rlai_engine_tokenize(e, prompts[i], strlen(prompts[i]), true, true, p, 256);
        submit_s(e, p, n, NTOK, RLAI_SPEC_OFF, &hot, &off);
        run_until_idle(e);
        submit_s(e, p, n, NTOK, RLAI_SPEC_AUTO, &hot, &on);
        run_until_idle(e);
        ck_assert(off.done && off.status == 0 && off.n == NTOK);
        ck_assert(on.done && on.status == 0 && on.n == NTOK);
        ck_assert_int_eq(off.m.drafted_tokens, 0);
        for (int k = 0; k < NTOK; k++)
            ck_assert_msg(on.toks[k] == off.toks[k], "sampled prompt %d: token %d differs (%d vs %d)", i, k,
                          on.toks[k], off.toks[k]);
        drafted += on.m.drafted_tokens;
        accepted += on.m.accepted_tokens;
    }
    ck_assert_int_gt(drafted, 0);
    ck_assert_int_gt(accepted, NTOK / 4);
    rlai_engine_close(e);
}
END_TEST

/* Penalties see every accepted draft token before the next row is
 * sampled: with strong repeat, presence and frequency penalties over
 * windows of 1-3 tokens (so the tokens that enter and leave the window at
 * each step decide the argmax) and over the whole history, greedy output
 * with drafts equals plain output on the four prompts, decoded together.
 * A verification row sampled before the token of the row above joined the
 * penalty history (an off-by-one that no other test here catches) changes
 * the output under four of these five settings (2026-12-07). */
START_TEST(penalties_see_each_accepted_draft_token)
{
    static const struct { float rep, pres, freq; int last_n; } cfg[] = {
        { 1.3f, 1.0f, 0.5f, 3 }, { 2.0f, 0.0f, 0.0f, 2 }, { 1.0f, 5.0f, 0.0f, 2 }, { 3.0f, 0.0f, 0.0f, 1 },
        { 1.0f, 1.0f, 1.0f, 0 },
    };
    rlai_engine *e = open_engine(RLAI_SPEC_NGRAM, -1);
    rlai_token p[4][256];
    int n[4];
    tokenize_prompts(e, p, n);
    long drafted = 0, accepted = 0;
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        rlai_sampler_params sp;
        memset(&sp, 0, sizeof(sp));
        sp.repeat_penalty = cfg[c].rep;
        sp.presence_penalty = cfg[c].pres;
        sp.frequency_penalty = cfg[c].freq;
        sp.repeat_last_n = cfg[c].last_n;
        static result off[4], on[4];
        for (int i = 0; i < 4; i++)
            submit_s(e, p[i], n[i], NTOK, RLAI_SPEC_OFF, &sp, &off[i]);
        run_until_idle(e);
        for (int i = 0; i < 4; i++)
            submit_s(e, p[i], n[i], NTOK, RLAI_SPEC_NGRAM, &sp, &on[i]);
        run_until_idle(e);
        for (int i = 0; i < 4; i++) {
            ck_assert(on[i].done && on[i].status == 0 && on[i].n == NTOK && off[i].n == NTOK);
            for (int k = 0; k < NTOK; k++)
                ck_assert_msg(on[i].toks[k] == off[i].toks[k], "penalties %zu, prompt %d: token %d differs (%d vs %d)",
                              c, i, k, on[i].toks[k], off[i].toks[k]);
            drafted += on[i].m.drafted_tokens;
            accepted += on[i].m.accepted_tokens;
        }
    }
    printf("penalties: %ld drafted, %ld accepted\n", drafted, accepted);
    ck_assert_int_gt(accepted, 0);
    rlai_engine_close(e);
}
END_TEST

/* Runs tokens p[0..n) (NTOK tokens) with `prediction` (NULL = none). */
static void submit_pred(rlai_engine *e, const rlai_token *p, int n, rlai_spec_mode spec,
                        const rlai_sampler_params *sp, const char *prediction, result *r)
{
    submit_sp(e, p, n, NTOK, spec, sp, prediction, r);
    run_until_idle(e);
    ck_assert(r->done && r->status == 0 && r->n == NTOK);
}

static void assert_same(const result *a, const result *b, const char *what)
{
    for (int k = 0; k < NTOK; k++)
        ck_assert_msg(a->toks[k] == b->toks[k], "%s: token %d differs (%d vs %d)", what, k, a->toks[k],
                      b->toks[k]);
}

/* OpenAI's predicted outputs: drafts from the prediction are verified as
 * any, so the output never changes; a right prediction is mostly
 * accepted even where prompt lookup finds nothing (free chat), an edited
 * one is met again after the edit, and oversized ones are refused. */
START_TEST(a_prediction_drafts_and_changes_nothing)
{
    rlai_engine *e = open_engine(RLAI_SPEC_NGRAM, 0);
    rlai_token p[4][256];
    int n[4];
    tokenize_prompts(e, p, n);
    static result off, plain, on;
    static char text[4096], edited[4200], wrong[4096];
    submit_pred(e, p[0], n[0], RLAI_SPEC_OFF, NULL, NULL, &off);
    ck_assert_int_gt(rlai_engine_detokenize(e, off.toks, NTOK, false, wrong, sizeof(wrong)), 0);
    /* free chat: prompt lookup alone drafts little */
    submit_pred(e, p[3], n[3], RLAI_SPEC_OFF, NULL, NULL, &off);
    submit_pred(e, p[3], n[3], RLAI_SPEC_NGRAM, NULL, NULL, &plain);
    assert_same(&plain, &off, "no prediction");
    ck_assert_int_gt(rlai_engine_detokenize(e, off.toks, NTOK, false, text, sizeof(text)), 0);
    submit_pred(e, p[3], n[3], RLAI_SPEC_NGRAM, NULL, text, &on);
    assert_same(&on, &off, "right prediction");
    fflush(stdout);
    printf("prediction: %d of %d drafted accepted (%d without it)\n", on.m.accepted_tokens,
           on.m.drafted_tokens, plain.m.accepted_tokens);
    ck_assert_int_ge(on.m.accepted_tokens, NTOK * 3 / 4);
    ck_assert_int_ge(on.m.accepted_tokens, plain.m.accepted_tokens + NTOK / 8);
    /* an edit in the middle: met again after it */
    char a[2048], b[2048];
    ck_assert_int_gt(rlai_engine_detokenize(e, off.toks, 24, false, a, sizeof(a)), 0);
    ck_assert_int_gt(rlai_engine_detokenize(e, off.toks + 28, NTOK - 28, false, b, sizeof(b)), 0);
    snprintf(edited, sizeof(edited), "%s banana split%s", a, b);
    submit_pred(e, p[3], n[3], RLAI_SPEC_NGRAM, NULL, edited, &on);
    assert_same(&on, &off, "edited prediction");
    printf("edited prediction: %d of %d drafted accepted\n", on.m.accepted_tokens, on.m.drafted_tokens);
    ck_assert_int_ge(on.m.accepted_tokens, NTOK / 2);
    /* a wrong one (another prompt's answer), or with drafting off */
    submit_pred(e, p[3], n[3], RLAI_SPEC_NGRAM, NULL, wrong, &on);
    assert_same(&on, &off, "wrong prediction");
    submit_pred(e, p[3], n[3], RLAI_SPEC_OFF, NULL, text, &on);
    assert_same(&on, &off, "drafting off");
    ck_assert_int_eq(on.m.drafted_tokens, 0);
    /* sampled: the draws of plain decoding, prediction or not */
    rlai_sampler_params hot = hot_sampling(3);
    submit_pred(e, p[3], n[3], RLAI_SPEC_OFF, &hot, NULL, &off);
    ck_assert_int_gt(rlai_engine_detokenize(e, off.toks, NTOK, false, text, sizeof(text)), 0);
    submit_pred(e, p[3], n[3], RLAI_SPEC_NGRAM, &hot, text, &on);
    assert_same(&on, &off, "sampled, right prediction");
    ck_assert_int_ge(on.m.accepted_tokens, NTOK / 2);

    /* over the limits: refused with a message, and the engine goes on */
    size_t big = (size_t)RLAI_MAX_PREDICTION_TOKENS * 2 + 3;
    char *many = malloc(big + 1);
    ck_assert_ptr_nonnull(many);
    for (size_t i = 0; i < big; i += 2)
        memcpy(many + i, " a", 2);            /* one token each */
    many[big] = 0;
    rlai_text_request rq;
    memset(&rq, 0, sizeof(rq));
    rq.prompt = prompts[3];
    rlai_gen_params_init(&rq.rp.gen);
    rq.rp.gen.prediction = many;
    char err[256] = "";
    uint64_t id = 0;
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_TOO_LARGE);
    ck_assert_msg(strstr(err, "prediction has") && strstr(err, "tokens"), "%s", err);
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = p[3];
    rp.n_prompt = n[3];
    rlai_gen_params_init(&rp.gen);
    rp.gen.prediction = many;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, NULL), RLAI_ERR_TOO_LARGE);
    rp.gen.spec = RLAI_SPEC_OFF;               /* checked even when it would not be used */
    ck_assert_int_eq(rlai_engine_submit(e, &rp, NULL), RLAI_ERR_TOO_LARGE);
    free(many);
    char *huge = malloc(RLAI_MAX_PREDICTION_BYTES + 2);
    ck_assert_ptr_nonnull(huge);
    memset(huge, 'x', RLAI_MAX_PREDICTION_BYTES + 1);
    huge[RLAI_MAX_PREDICTION_BYTES + 1] = 0;
    rq.rp.gen.prediction = huge;
    ck_assert_int_eq(rlai_engine_submit_text(e, &rq, &id, NULL, err, sizeof(err)), RLAI_ERR_TOO_LARGE);
    ck_assert_msg(strstr(err, "bytes"), "%s", err);
    free(huge);
    submit_pred(e, p[3], n[3], RLAI_SPEC_NGRAM, NULL, "", &on);   /* empty: none */
    assert_same(&on, &plain, "empty prediction");
    rlai_engine_close(e);
}
END_TEST

/* Randomized requests that end mid-draft, every way a request can end
 * (spec_endings.h), give with prompt-lookup drafts exactly what they give
 * without, several decoding at once, and every KV block comes back. */
START_TEST(random_requests_end_the_same_with_drafts)
{
    rlai_engine *big = open_engine(RLAI_SPEC_NGRAM, -1);   /* every decoding sequence drafts */
    rlai_engine *small = spec_endings_small_engine(MODEL, RLAI_SPEC_NGRAM, NULL);
    rlai_token p[4][256];
    int n[4];
    tokenize_prompts(big, p, n);
    ck_assert_int_gt(spec_endings_check(big, small, p, n, RLAI_SPEC_NGRAM, run_until_idle), 0);
    rlai_engine_close(big);
    rlai_engine_close(small);
}
END_TEST

START_TEST(spec_modes_parse_and_bad_values_are_refused)
{
    ck_assert_int_eq(rlai_spec_mode_parse("off"), RLAI_SPEC_OFF);
    ck_assert_int_eq(rlai_spec_mode_parse("ngram"), RLAI_SPEC_NGRAM);
    ck_assert_int_eq(rlai_spec_mode_parse("auto"), RLAI_SPEC_AUTO);
    ck_assert_int_eq(rlai_spec_mode_parse("draft"), RLAI_SPEC_DRAFT);
    ck_assert_int_eq(rlai_spec_mode_parse("self"), RLAI_ERR_UNSUPPORTED);
    ck_assert_int_eq(rlai_spec_mode_parse("fast"), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_spec_mode_parse(NULL), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(rlai_spec_mode_error(RLAI_ERR_UNSUPPORTED), "not implemented"));
    ck_assert_ptr_null(strstr(rlai_spec_mode_error(RLAI_ERR_INVALID_ARG), "not implemented"));
    rlai_engine *e = open_engine(RLAI_SPEC_AUTO, 0);
    rlai_token t[4] = { 1, 2, 3, 4 };
    rlai_request_params rp;
    memset(&rp, 0, sizeof(rp));
    rp.prompt = t;
    rp.n_prompt = 4;
    rlai_gen_params_init(&rp.gen);
    uint64_t id;
    rp.gen.spec = (rlai_spec_mode)7;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), RLAI_ERR_INVALID_ARG);
    rp.gen.spec = RLAI_SPEC_NGRAM;
    rp.gen.spec_max_draft = 17;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), RLAI_ERR_INVALID_ARG);
    /* a draft-model request on an engine without a draft model */
    rp.gen.spec = RLAI_SPEC_DRAFT;
    rp.gen.spec_max_draft = 0;
    ck_assert_int_eq(rlai_engine_submit(e, &rp, &id), RLAI_ERR_UNSUPPORTED);
    rlai_engine_close(e);
    /* and an engine told to draft with a model it was not given */
    rlai_engine_params ep;
    rlai_engine_params_init(&ep);
    ep.spec = RLAI_SPEC_DRAFT;
    char err[512] = "";
    ck_assert_int_eq(rlai_engine_open(MODEL, &ep, &e, err, sizeof(err)), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "needs a draft model"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("spec");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, ngram_prefers_longest_suffix_and_most_recent_match);
    tcase_add_test(tc, lookup_drafts_from_a_prediction);
    tcase_add_test(tc, adaptive_gamma_grows_shrinks_and_pauses);
    tcase_add_test(tc, adaptive_gamma_weighs_the_step_cost);
    tcase_add_test(tc, step_cost_is_learned_from_step_times);
    tcase_add_test(tc, verification_rule_keeps_the_distribution);
    tcase_add_test(tc, verification_takes_the_draws_of_plain_decoding);
    tcase_add_test(tc, spec_modes_parse_and_bad_values_are_refused);
    tcase_add_test(tc, auto_drafts_and_keeps_every_output);
    tcase_add_test(tc, greedy_output_is_identical_with_and_without_speculation);
    tcase_add_test(tc, speculation_under_continuous_batching);
    tcase_add_test(tc, random_requests_end_the_same_with_drafts);
    tcase_add_test(tc, penalties_see_each_accepted_draft_token);
    tcase_add_test(tc, a_prediction_drafts_and_changes_nothing);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
