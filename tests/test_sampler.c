/* test_sampler.c - unit tests for engine/sampler.c */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sampler.h"

static rlai_sampler_params defaults(void)
{
    rlai_sampler_params p;
    memset(&p, 0, sizeof(p));
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 42;
    return p;
}

static rlai_sampler *mk(const rlai_sampler_params *p, int n_vocab)
{
    rlai_sampler *s = NULL;
    ck_assert_int_eq(rlai_sampler_new(p, n_vocab, &s), RLAI_OK);
    ck_assert_ptr_nonnull(s);
    return s;
}

/* Sample from a copy of logits (sample may modify its input). */
static int32_t draw(rlai_sampler *s, const float *logits, int n, float *scratch)
{
    memcpy(scratch, logits, (size_t)n * sizeof(float));
    return rlai_sampler_sample(s, scratch);
}

/* Deterministic test RNG (independent of the sampler's). */
static uint64_t trng_state;
static uint32_t trng(void)
{
    trng_state = trng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(trng_state >> 33);
}
static float trng_f(float lo, float hi)
{
    return lo + (hi - lo) * (float)(trng() % 1000000) / 1000000.0f;
}

START_TEST(test_create_invalid)
{
    rlai_sampler_params p = defaults();
    rlai_sampler *s = (rlai_sampler *)1;
    ck_assert_int_eq(rlai_sampler_new(NULL, 10, &s), RLAI_ERR_INVALID_ARG);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(rlai_sampler_new(&p, 0, &s), RLAI_ERR_INVALID_ARG);
    ck_assert_int_eq(rlai_sampler_new(&p, 10, NULL), RLAI_ERR_INVALID_ARG);
    p.repeat_penalty = 0.0f;
    ck_assert_int_eq(rlai_sampler_new(&p, 10, &s), RLAI_ERR_INVALID_ARG);
    p = defaults();
    p.repeat_last_n = -1;
    ck_assert_int_eq(rlai_sampler_new(&p, 10, &s), RLAI_ERR_INVALID_ARG);
    p = defaults();
    p.temperature = NAN;
    ck_assert_int_eq(rlai_sampler_new(&p, 10, &s), RLAI_ERR_INVALID_ARG);
    rlai_sampler_free(NULL);
    rlai_sampler_reset(NULL);
    rlai_sampler_accept(NULL, 1);
}
END_TEST

START_TEST(test_greedy)
{
    rlai_sampler_params p = defaults();
    rlai_sampler *s = mk(&p, 6);
    float l1[6] = {0.1f, 2.0f, -3.0f, 5.5f, 5.4f, 0.0f};
    ck_assert_int_eq(rlai_sampler_sample(s, l1), 3);
    float l2[6] = {1.0f, 7.0f, 7.0f, 2.0f, 7.0f, 0.0f}; /* ties -> lowest id */
    ck_assert_int_eq(rlai_sampler_sample(s, l2), 1);
    float l3[6] = {-5.0f, -4.0f, -9.0f, -4.5f, -8.0f, -7.0f};
    ck_assert_int_eq(rlai_sampler_sample(s, l3), 1);
    rlai_sampler_free(s);

    /* negative temperature is greedy too */
    p.temperature = -1.0f;
    s = mk(&p, 6);
    float l4[6] = {0.1f, 2.0f, -3.0f, 5.5f, 9.4f, 0.0f};
    ck_assert_int_eq(rlai_sampler_sample(s, l4), 4);
    rlai_sampler_free(s);
}
END_TEST

START_TEST(test_topk1_is_greedy)
{
    enum { N = 5000 };
    static float logits[N], scratch[N];
    const float temps[] = {0.1f, 0.7f, 1.0f, 3.0f, 100.0f};
    trng_state = 7;
    for (size_t ti = 0; ti < sizeof(temps) / sizeof(temps[0]); ti++) {
        rlai_sampler_params p = defaults();
        p.temperature = temps[ti];
        p.top_k = 1;
        p.seed = 1000 + ti;
        rlai_sampler *s = mk(&p, N);
        rlai_sampler_params pg = defaults();
        rlai_sampler *g = mk(&pg, N);
        for (int round = 0; round < 20; round++) {
            for (int i = 0; i < N; i++)
                logits[i] = trng_f(-10.0f, 10.0f);
            if (round % 5 == 0) /* plant a tie at the max */
                logits[N - 1] = logits[round] = 50.0f;
            int32_t a = draw(s, logits, N, scratch);
            int32_t b = draw(g, logits, N, scratch);
            ck_assert_int_eq(a, b);
            if (round % 5 == 0)
                ck_assert_int_eq(a, round);
        }
        rlai_sampler_free(s);
        rlai_sampler_free(g);
    }
}
END_TEST

START_TEST(test_seed_determinism)
{
    enum { N = 1000, D = 100 };
    static float logits[N], scratch[N];
    for (int i = 0; i < N; i++)
        logits[i] = (float)(i % 7) * 0.01f; /* nearly flat */
    rlai_sampler_params p = defaults();
    p.temperature = 1.0f;
    p.seed = 12345;
    rlai_sampler *a = mk(&p, N), *b = mk(&p, N);
    p.seed = 12346;
    rlai_sampler *c = mk(&p, N);
    int32_t sa[D];
    int differ = 0;
    for (int i = 0; i < D; i++) {
        sa[i] = draw(a, logits, N, scratch);
        int32_t xb = draw(b, logits, N, scratch);
        int32_t xc = draw(c, logits, N, scratch);
        ck_assert_int_eq(sa[i], xb);
        if (xc != sa[i])
            differ++;
    }
    ck_assert_int_gt(differ, 50);
    /* reset re-seeds: the same sequence again */
    rlai_sampler_reset(a);
    for (int i = 0; i < D; i++)
        ck_assert_int_eq(draw(a, logits, N, scratch), sa[i]);
    rlai_sampler_free(a);
    rlai_sampler_free(b);
    rlai_sampler_free(c);
}
END_TEST

/* Chi-square of counts against expected probabilities. */
static double chi2(const int *counts, const double *prob, int n, int total)
{
    double x = 0.0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * total;
        double d = counts[i] - e;
        x += d * d / e;
    }
    return x;
}

static void check_distribution(float temp, uint64_t seed)
{
    enum { N = 8, DRAWS = 20000 };
    const float logits[N] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.2f};
    float scratch[N];
    double prob[N], z = 0.0;
    for (int i = 0; i < N; i++)
        z += prob[i] = exp((double)logits[i] / temp);
    for (int i = 0; i < N; i++)
        prob[i] /= z;
    rlai_sampler_params p = defaults();
    p.temperature = temp;
    p.seed = seed;
    rlai_sampler *s = mk(&p, N);
    int counts[N] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = draw(s, logits, N, scratch);
        ck_assert(t >= 0 && t < N);
        counts[t]++;
    }
    /* 7 degrees of freedom: p = 0.001 critical value is 24.3 */
    double x = chi2(counts, prob, N, DRAWS);
    ck_assert_msg(x < 24.3, "chi2 = %f at T=%f", x, (double)temp);
    rlai_sampler_free(s);
}

START_TEST(test_distribution)
{
    check_distribution(1.0f, 1);
    check_distribution(1.0f, 99);
    check_distribution(0.5f, 3);
    check_distribution(2.0f, 4);
}
END_TEST

START_TEST(test_top_k_excludes)
{
    enum { N = 10 };
    const float logits[N] = {0.0f, 1.0f, 0.5f, 3.0f, 2.9f, 0.1f, 2.95f, -1.0f, 0.0f, 2.0f};
    float scratch[N];
    rlai_sampler_params p = defaults();
    p.temperature = 1.5f;
    p.top_k = 3;
    rlai_sampler *s = mk(&p, N);
    int counts[N] = {0};
    for (int i = 0; i < 10000; i++)
        counts[draw(s, logits, N, scratch)]++;
    for (int i = 0; i < N; i++) {
        if (i == 3 || i == 4 || i == 6)
            ck_assert_int_gt(counts[i], 2000);
        else
            ck_assert_int_eq(counts[i], 0);
    }
    rlai_sampler_free(s);
}
END_TEST

START_TEST(test_top_p_small)
{
    enum { N = 5 };
    /* probabilities 0.5, 0.25, 0.15, 0.1, 0 (id 4 is -inf) */
    const float logits[N] = {logf(0.5f), logf(0.25f), logf(0.15f), logf(0.1f), -INFINITY};
    float scratch[N];
    rlai_sampler_params p = defaults();
    p.temperature = 1.0f;
    p.top_p = 0.7f; /* {0,1} reach 0.75 */
    rlai_sampler *s = mk(&p, N);
    int counts[N] = {0};
    for (int i = 0; i < 10000; i++)
        counts[draw(s, logits, N, scratch)]++;
    ck_assert_int_eq(counts[2] + counts[3] + counts[4], 0);
    /* renormalised: 2/3 vs 1/3 */
    ck_assert_int_gt(counts[0], 6300);
    ck_assert_int_lt(counts[0], 7000);
    rlai_sampler_free(s);

    /* tiny p keeps exactly one token even at high temperature */
    p.top_p = 0.01f;
    p.temperature = 50.0f;
    s = mk(&p, N);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(draw(s, logits, N, scratch), 0);
    rlai_sampler_free(s);
}
END_TEST

typedef struct idl {
    double l;
    int id;
} idl;
static int idl_cmp(const void *a, const void *b)
{
    const idl *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return x->id - y->id;
}

/* Large vocabulary, shuffled logits: the allowed set is computed here with
 * a full sort; with flat logits the lazy top-256 path must fall back. */
static void check_top_p_large(float top_p, float spread, int top_k)
{
    enum { N = 49152 };
    static float logits[N], scratch[N];
    static idl sorted[N];
    static unsigned char allowed[N];
    trng_state = (uint64_t)(top_p * 1000) + (uint64_t)spread;
    for (int i = 0; i < N; i++)
        logits[i] = trng_f(-spread, spread);
    for (int i = 0; i < N; i++) {
        sorted[i].l = logits[i];
        sorted[i].id = i;
    }
    qsort(sorted, N, sizeof(sorted[0]), idl_cmp);
    int n = top_k > 0 ? top_k : N;
    double mx = sorted[0].l, z = 0.0;
    for (int i = 0; i < n; i++)
        z += exp(sorted[i].l - mx);
    double cum = 0.0;
    int keep = n;
    for (int i = 0; i < n; i++) {
        cum += exp(sorted[i].l - mx);
        if (cum >= top_p * z) {
            keep = i + 1;
            break;
        }
    }
    memset(allowed, 0, sizeof(allowed));
    /* allow a couple of boundary tokens for summation-order rounding */
    for (int i = 0; i < keep + 2 && i < n; i++)
        allowed[sorted[i].id] = 1;

    rlai_sampler_params p = defaults();
    p.temperature = 1.0f;
    p.top_p = top_p;
    p.top_k = top_k;
    rlai_sampler *s = mk(&p, N);
    int distinct = 0;
    static unsigned char hit[N];
    memset(hit, 0, sizeof(hit));
    for (int i = 0; i < 600; i++) {
        int32_t t = draw(s, logits, N, scratch);
        ck_assert_msg(allowed[t], "token %d outside the top-p set (keep=%d)", t, keep);
        if (!hit[t]++)
            distinct++;
    }
    if (keep > 100)
        ck_assert_int_gt(distinct, 100);
    rlai_sampler_free(s);
}

START_TEST(test_top_p_large)
{
    check_top_p_large(0.9f, 0.5f, 0);   /* flat: needs ~40k tokens, full sort */
    check_top_p_large(0.9f, 20.0f, 0);  /* peaked: top 256 suffice */
    check_top_p_large(0.5f, 5.0f, 40);  /* after top-k */
}
END_TEST

START_TEST(test_min_p)
{
    enum { N = 6 };
    /* p_i / p_max = e^0, e^-1 (.368), e^-2 (.135), e^-3, ... */
    const float logits[N] = {-2.0f, 0.0f, -1.0f, -3.0f, -5.0f, -0.5f};
    float scratch[N];
    rlai_sampler_params p = defaults();
    p.temperature = 1.0f;
    p.min_p = 0.3f; /* keeps ids 1, 5, 2 */
    rlai_sampler *s = mk(&p, N);
    int counts[N] = {0};
    for (int i = 0; i < 10000; i++)
        counts[draw(s, logits, N, scratch)]++;
    ck_assert_int_eq(counts[0] + counts[3] + counts[4], 0);
    ck_assert_int_gt(counts[1], 0);
    ck_assert_int_gt(counts[2], 0);
    ck_assert_int_gt(counts[5], 0);
    rlai_sampler_free(s);

    /* min_p applies to temperature-1 probabilities, before temperature */
    p.temperature = 10.0f;
    p.min_p = 0.5f; /* keeps ids 1, 5 */
    s = mk(&p, N);
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < 10000; i++)
        counts[draw(s, logits, N, scratch)]++;
    ck_assert_int_eq(counts[0] + counts[2] + counts[3] + counts[4], 0);
    ck_assert_int_gt(counts[1], 4000);
    ck_assert_int_gt(counts[5], 4000);
    rlai_sampler_free(s);
}
END_TEST

START_TEST(test_penalties)
{
    rlai_sampler_params p = defaults();
    rlai_sampler *s;

    /* repeat penalty on a positive logit: 3.0/1.3 = 2.31 < 2.5 */
    p.repeat_penalty = 1.3f;
    s = mk(&p, 2);
    rlai_sampler_accept(s, 0);
    float a[2] = {3.0f, 2.5f};
    ck_assert_int_eq(rlai_sampler_sample(s, a), 1);
    rlai_sampler_free(s);
    /* 3.0/1.1 = 2.73 > 2.5 */
    p.repeat_penalty = 1.1f;
    s = mk(&p, 2);
    rlai_sampler_accept(s, 0);
    float b[2] = {3.0f, 2.5f};
    ck_assert_int_eq(rlai_sampler_sample(s, b), 0);
    rlai_sampler_free(s);
    /* negative logit is multiplied: -1.0*1.5 = -1.5 < -1.2 */
    p.repeat_penalty = 1.5f;
    s = mk(&p, 2);
    rlai_sampler_accept(s, 0);
    float c[2] = {-1.0f, -1.2f};
    ck_assert_int_eq(rlai_sampler_sample(s, c), 1);
    rlai_sampler_free(s);

    /* presence once per seen token: 1.0 - 0.05 = 0.95 > 0.9 */
    p = defaults();
    p.presence_penalty = 0.05f;
    s = mk(&p, 2);
    for (int i = 0; i < 3; i++)
        rlai_sampler_accept(s, 0);
    float d[2] = {1.0f, 0.9f};
    ck_assert_int_eq(rlai_sampler_sample(s, d), 0);
    rlai_sampler_free(s);
    /* frequency per occurrence: 1.0 - 3*0.05 = 0.85 < 0.9 */
    p = defaults();
    p.frequency_penalty = 0.05f;
    s = mk(&p, 2);
    for (int i = 0; i < 3; i++)
        rlai_sampler_accept(s, 0);
    float e[2] = {1.0f, 0.9f};
    ck_assert_int_eq(rlai_sampler_sample(s, e), 1);
    rlai_sampler_free(s);

    /* all three: token 0: 3.0/1.5 = 2.0, -2*0.3, -0.2 -> 1.2; token 3 seen
     * once: 2.2/1.5 = 1.467 - 0.3 - 0.2 = 0.967; winner token 1 (1.3) */
    p = defaults();
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.2f;
    s = mk(&p, 4);
    rlai_sampler_accept(s, 0);
    rlai_sampler_accept(s, 3);
    rlai_sampler_accept(s, 0);
    float f[4] = {3.0f, 1.3f, -1.0f, 2.2f};
    ck_assert_int_eq(rlai_sampler_sample(s, f), 1);
    ck_assert(fabsf(f[0] - 1.2f) < 1e-5f);
    ck_assert(fabsf(f[3] - (2.2f / 1.5f - 0.5f)) < 1e-5f);
    ck_assert(f[1] == 1.3f && f[2] == -1.0f);
    rlai_sampler_free(s);
}
END_TEST

START_TEST(test_penalty_window)
{
    /* history 0,1,1; logits {3.0, 2.0, 1.9}; repeat penalty 2 */
    const float logits[3] = {3.0f, 2.0f, 1.9f};
    float x[3];
    const int windows[] = {2, 3, 0};
    const int expect[] = {0, 2, 2}; /* window 2 forgot token 0 */
    for (int w = 0; w < 3; w++) {
        rlai_sampler_params p = defaults();
        p.repeat_penalty = 2.0f;
        p.repeat_last_n = windows[w];
        rlai_sampler *s = mk(&p, 3);
        rlai_sampler_accept(s, 0);
        rlai_sampler_accept(s, 1);
        rlai_sampler_accept(s, 1);
        rlai_sampler_accept(s, -1);  /* out of range: ignored */
        rlai_sampler_accept(s, 3);
        ck_assert_int_eq(draw(s, logits, 3, x), expect[w]);
        rlai_sampler_reset(s); /* history cleared */
        ck_assert_int_eq(draw(s, logits, 3, x), 0);
        rlai_sampler_free(s);
    }

    /* a long run through a small ring keeps the counts consistent */
    rlai_sampler_params p = defaults();
    p.repeat_penalty = 100.0f;
    p.repeat_last_n = 5;
    rlai_sampler *s = mk(&p, 10);
    for (int i = 0; i < 1000; i++)
        rlai_sampler_accept(s, i % 7);
    /* last five: 995..999 % 7 = 1,2,3,4,5 -> tokens 0 and 6 unpenalised */
    float l[10] = {1, 1, 1, 1, 1, 1, 0.5f, 0.1f, 0.1f, 0.1f};
    ck_assert_int_eq(rlai_sampler_sample(s, l), 0);
    float l2[10] = {0.4f, 1, 1, 1, 1, 1, 0.5f, 0.1f, 0.1f, 0.1f};
    ck_assert_int_eq(rlai_sampler_sample(s, l2), 6);
    rlai_sampler_free(s);
}
END_TEST

START_TEST(test_nonfinite)
{
    enum { N = 5 };
    float scratch[N];
    for (int mode = 0; mode < 2; mode++) {
        rlai_sampler_params p = defaults();
        p.temperature = mode ? 1.0f : 0.0f;
        p.top_k = mode ? 3 : 0;
        p.top_p = mode ? 0.9f : 1.0f;
        p.min_p = mode ? 0.05f : 0.0f;
        rlai_sampler *s = mk(&p, N);
        const float all_ninf[N] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        ck_assert_int_eq(draw(s, all_ninf, N, scratch), 0);
        const float all_nan[N] = {NAN, NAN, NAN, NAN, NAN};
        ck_assert_int_eq(draw(s, all_nan, N, scratch), 0);
        /* NaN never wins */
        const float some_nan[N] = {NAN, -INFINITY, NAN, 0.0f, NAN};
        for (int i = 0; i < 200; i++)
            ck_assert_int_eq(draw(s, some_nan, N, scratch), 3);
        /* +inf wins; two +inf share */
        const float one_inf[N] = {1.0f, INFINITY, 2.0f, NAN, 3.0f};
        for (int i = 0; i < 200; i++)
            ck_assert_int_eq(draw(s, one_inf, N, scratch), 1);
        const float two_inf[N] = {1.0f, INFINITY, 2.0f, INFINITY, 3.0f};
        int c1 = 0, c3 = 0;
        for (int i = 0; i < 400; i++) {
            int32_t t = draw(s, two_inf, N, scratch);
            ck_assert(t == 1 || t == 3);
            c1 += t == 1;
            c3 += t == 3;
        }
        if (mode)
            ck_assert(c1 > 100 && c3 > 100);
        else
            ck_assert_int_eq(c1, 400);
        rlai_sampler_free(s);
    }
    /* penalties on non-finite values do not produce NaN winners */
    rlai_sampler_params p = defaults();
    p.repeat_penalty = 0.5f; /* < 1 boosts: FLT_MAX / 0.5 overflows */
    p.presence_penalty = -1e38f;
    rlai_sampler *s = mk(&p, N);
    rlai_sampler_accept(s, 2);
    rlai_sampler_accept(s, 4);
    const float big[N] = {3e38f, 1.0f, 3e38f, NAN, -INFINITY};
    int32_t t = draw(s, big, N, scratch);
    ck_assert(t == 2);
    rlai_sampler_free(s);
}
END_TEST

START_TEST(test_speed)
{
    enum { N = 49152, ITERS = 300 };
    static float logits[N], scratch[N];
    trng_state = 5;
    for (int i = 0; i < N; i++)
        logits[i] = trng_f(-8.0f, 12.0f);
    rlai_sampler_params p = defaults();
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.1f;
    rlai_sampler *s = mk(&p, N);
    clock_t t0 = clock();
    for (int i = 0; i < ITERS; i++) {
        int32_t t = draw(s, logits, N, scratch);
        rlai_sampler_accept(s, t);
    }
    double ms = (double)(clock() - t0) * 1000.0 / CLOCKS_PER_SEC / ITERS;
    /* generous: sanitizer builds are slow; plain builds are well under 1 ms */
    ck_assert_msg(ms < 50.0, "%.3f ms per sample", ms);
    rlai_sampler_free(s);
}
END_TEST


/* rlai_logprobs_compute: log-softmax of raw logits, top-N in order with
 * ties to the lower id, NaN as -inf, clamps. */
START_TEST(test_logprobs_compute)
{
    enum { N = 300 };
    float lg[N];
    double sum = 0;
    for (int i = 0; i < N; i++) {
        lg[i] = (float)((i * 37) % 101) / 10.0f - 3.0f;
        sum += exp((double)lg[i]);
    }
    lg[7] = NAN;
    sum -= exp((double)((7 * 37) % 101) / 10.0 - 3.0);
    lg[200] = lg[100] = 9.0f;          /* a tie for the best */
    sum = 0;
    for (int i = 0; i < N; i++)
        if (!isnan(lg[i]))
            sum += exp((double)lg[i]);
    double lse = log(sum);
    rlai_token_logprobs lp;
    rlai_logprobs_compute(lg, N, 42, 5, &lp);
    ck_assert_int_eq(lp.token, 42);
    ck_assert(fabs(lp.logprob - (lg[42] - lse)) < 1e-5);
    ck_assert_int_eq(lp.n_top, 5);
    ck_assert_int_eq(lp.top_ids[0], 100);
    ck_assert_int_eq(lp.top_ids[1], 200);
    for (int k = 0; k < 5; k++) {
        ck_assert(fabs(lp.top_logprobs[k] - (lg[lp.top_ids[k]] - lse)) < 1e-5);
        if (k)
            ck_assert(lp.top_logprobs[k] <= lp.top_logprobs[k - 1]);
    }
    /* the 5 best by brute force */
    for (int k = 2; k < 5; k++) {
        int better = 0;
        for (int i = 0; i < N; i++)
            if (!isnan(lg[i]) && lg[i] > lg[lp.top_ids[k]])
                better++;
        ck_assert_int_le(better, k);
    }
    rlai_logprobs_compute(lg, N, 7, 0, &lp);        /* a NaN token: -inf */
    ck_assert(isinf(lp.logprob) && lp.logprob < 0);
    ck_assert_int_eq(lp.n_top, 0);
    rlai_logprobs_compute(lg, N, 1, 99, &lp);       /* clamped to the maximum */
    ck_assert_int_eq(lp.n_top, RLAI_MAX_TOP_LOGPROBS);
    rlai_logprobs_compute(lg, 3, 1, 10, &lp);       /* and to n_vocab */
    ck_assert_int_eq(lp.n_top, 3);
    float ninf[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    rlai_logprobs_compute(ninf, 4, 2, 2, &lp);
    ck_assert(isinf(lp.logprob) && isinf(lp.top_logprobs[0]));
}
END_TEST

static Suite *sampler_suite(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_create_invalid);
    tcase_add_test(tc, test_greedy);
    tcase_add_test(tc, test_topk1_is_greedy);
    tcase_add_test(tc, test_seed_determinism);
    tcase_add_test(tc, test_distribution);
    tcase_add_test(tc, test_top_k_excludes);
    tcase_add_test(tc, test_top_p_small);
    tcase_add_test(tc, test_top_p_large);
    tcase_add_test(tc, test_min_p);
    tcase_add_test(tc, test_penalties);
    tcase_add_test(tc, test_penalty_window);
    tcase_add_test(tc, test_nonfinite);
    tcase_add_test(tc, test_speed);
    tcase_add_test(tc, test_logprobs_compute);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(sampler_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
