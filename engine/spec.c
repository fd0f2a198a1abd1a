/* spec.c - prompt-lookup drafting and adaptive draft length (see spec.h).
 *
 * Why suffixes of 3 down to 1 tokens: a 3-token context match is a strong
 * predictor in repeated text (a name, a quoted line, an identifier in code)
 * while longer suffixes rarely add precision for subword tokens and miss
 * more often; falling back to 2 and 1 tokens still finds continuations of
 * rare tokens (the first piece of a name). Weak (1-token) matches are
 * tried because the adaptive state pauses drafting when drafts keep being
 * rejected; note that a verification is not free: on a 2-core AVX2 CPU
 * each extra token costs about half a decode step (bench_spec,
 * docs/SPECULATIVE.md), so gamma does not yet weigh that cost. The most recent occurrence is preferred: it
 * is the likeliest to be continued the same way. */
#include "spec.h"

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

void rlai_spec_feedback(rlai_spec_state *s, int drafted, int accepted)
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
    if (accepted > 0) {
        s->misses = 0;
        s->backoff = SPEC_PAUSE_MIN;
    } else if (++s->misses >= SPEC_MISS_LIMIT) {
        /* keeps failing: stop drafting for a while, longer each time */
        s->pause = s->backoff;
        s->backoff = s->backoff * 2 < SPEC_PAUSE_MAX ? s->backoff * 2 : SPEC_PAUSE_MAX;
        s->misses = SPEC_MISS_LIMIT - 1; /* one more failure after the pause pauses again */
    }
}
