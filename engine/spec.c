/* spec.c - prompt-lookup drafting and adaptive draft length (see spec.h).
 *
 * Why suffixes of 3 down to 1 tokens: a 3-token context match is a strong
 * predictor in repeated text (a name, a quoted line, an identifier in code)
 * while longer suffixes rarely add precision for subword tokens and miss
 * more often; falling back to 2 and 1 tokens still finds continuations of
 * rare tokens (the first piece of a name). Weak (1-token) matches are
 * tried because the adaptive state pauses drafting when drafts keep being
 * rejected. A verification is not free: on a 2-core AVX2 CPU each extra
 * row costs a third to half of a decode step (bench_spec,
 * docs/SPECULATIVE.md), so the state also pauses when the tokens recent
 * verifications gave do not pay for what they cost (rlai_spec_cost). The
 * most recent occurrence is preferred: it is the likeliest to be continued
 * the same way. */
#include "spec.h"

#include <stdbool.h>
#include <string.h>

int rlai_spec_ngram_draft(const int32_t *toks, int n, int max_draft, int32_t *out, int *ngram_out)
{
    if (ngram_out)
        *ngram_out = 0;
    if (!toks || !out || n < 2 || max_draft <= 0)
        return 0;
    if (max_draft > RLAI_SPEC_MAX_DRAFT)
        max_draft = RLAI_SPEC_MAX_DRAFT;
    int lo = n > RLAI_SPEC_SEARCH_WINDOW ? n - RLAI_SPEC_SEARCH_WINDOW : 0;
    for (int g = RLAI_SPEC_NGRAM_MAX; g >= RLAI_SPEC_NGRAM_MIN; g--) {
        if (g >= n)
            continue;
        const int32_t *suf = toks + n - g;
        /* candidate start i: toks[i..i+g) == suffix, and i + g < n so at
         * least one continuation token exists (i + g <= n - 1). */
        for (int i = n - g - 1; i >= lo; i--) {
            if (toks[i] != suf[0] || memcmp(toks + i, suf, sizeof(int32_t) * (size_t)g) != 0)
                continue;
            int from = i + g, k = n - from;
            if (k > max_draft)
                k = max_draft;
            memcpy(out, toks + from, sizeof(int32_t) * (size_t)k);
            if (ngram_out)
                *ngram_out = g;
            return k;
        }
    }
    return 0;
}

#define SPEC_MISS_LIMIT 3      /* verifications with nothing accepted before pausing */
#define SPEC_PAUSE_MIN 4
#define SPEC_PAUSE_MAX 64
/* Gain = tokens a verification emitted (accepted + 1) over its cost in
 * plain steps, averaged with weight SPEC_GAIN_W. Below 1 speculation is
 * slower than plain decoding: pause. A fresh sequence starts optimistic;
 * after a pause the probe starts just above 1, so one bad verification
 * pauses again (for longer) and a good one continues. */
#define SPEC_GAIN_W 0.25f
#define SPEC_GAIN_START 1.25f
#define SPEC_GAIN_PROBE 1.05f
#define SPEC_GAIN_OK 1.15f     /* at or above: the pause length resets */

void rlai_spec_state_init(rlai_spec_state *s, int max_draft)
{
    memset(s, 0, sizeof(*s));
    if (max_draft < 0)
        max_draft = 0;
    if (max_draft > RLAI_SPEC_MAX_DRAFT)
        max_draft = RLAI_SPEC_MAX_DRAFT;
    s->max_draft = max_draft;
    s->gamma = max_draft < 4 ? max_draft : 4;
    s->backoff = SPEC_PAUSE_MIN;
    s->gain = SPEC_GAIN_START;
}

int rlai_spec_next_gamma(rlai_spec_state *s)
{
    if (s->max_draft <= 0)
        return 0;
    if (s->pause > 0) {
        s->pause--;
        return 0;
    }
    return s->gamma;
}

static void spec_pause(rlai_spec_state *s)
{
    s->pause = s->backoff;
    s->backoff = s->backoff * 2 < SPEC_PAUSE_MAX ? s->backoff * 2 : SPEC_PAUSE_MAX;
}

void rlai_spec_feedback(rlai_spec_state *s, int drafted, int accepted, double step_cost)
{
    if (drafted <= 0)
        return;
    s->drafted += (uint64_t)drafted;
    s->accepted += (uint64_t)accepted;
    s->verifications++;
    s->gamma_sum += (uint64_t)drafted;
    if (accepted == drafted) {
        /* whole draft taken: try longer ones */
        s->gamma = s->gamma + 2 < s->max_draft ? s->gamma + 2 : s->max_draft;
    } else {
        /* shrink towards what was accepted, at least 1 */
        int g = accepted + 1 > s->gamma - 1 ? accepted + 1 : s->gamma - 1;
        if (g > s->gamma)
            g = s->gamma;
        s->gamma = g < 1 ? 1 : g;
    }
    bool costly = false;
    if (step_cost > 0) {
        float g = (float)((1.0 + accepted) / step_cost);
        s->gain = (1 - SPEC_GAIN_W) * s->gain + SPEC_GAIN_W * g;
        costly = s->gain < 1.0f;
    }
    if (costly) {
        /* accepted tokens, but fewer than the verifications cost */
        spec_pause(s);
        s->gain = SPEC_GAIN_PROBE;
        s->misses = 0;
    } else if (accepted > 0) {
        s->misses = 0;
        if (step_cost <= 0 || s->gain >= SPEC_GAIN_OK)
            s->backoff = SPEC_PAUSE_MIN;
    } else if (++s->misses >= SPEC_MISS_LIMIT) {
        /* keeps failing: stop drafting for a while, longer each time */
        spec_pause(s);
        s->misses = SPEC_MISS_LIMIT - 1; /* one more failure after the pause pauses again */
    }
}

/* Weight of a new sample in the step-time averages. */
#define COST_W 0.1

void rlai_spec_cost_observe(rlai_spec_cost *c, int rows, double ms)
{
    if (rows < 1 || !(ms > 0))
        return;
    if (rows == 1) {
        c->t1_ms = c->n_t1 ? (1 - COST_W) * c->t1_ms + COST_W * ms : ms;
        c->n_t1++;
        return;
    }
    if (!c->n_t1)
        return;                                  /* no plain step to compare with yet */
    double per = (ms / c->t1_ms - 1.0) / (rows - 1);
    if (per < 0)
        per = 0;
    if (per > 2)
        per = 2;                                 /* one slow step (preemption) weighs little */
    c->per_row = c->n_rows ? (1 - COST_W) * c->per_row + COST_W * per : per;
    c->n_rows++;
}

double rlai_spec_cost_of(const rlai_spec_cost *c, int rows)
{
    double per = c->n_rows >= 4 ? c->per_row : RLAI_SPEC_COST_PRIOR;
    return 1.0 + per * (rows > 1 ? rows - 1 : 0);
}
