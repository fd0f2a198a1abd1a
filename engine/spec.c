/* spec.c - prompt-lookup drafting and adaptive draft length (see spec.h).
 *
 * Which matches are drafted, and how far, was chosen by replaying the
 * greedy outputs of bench_spec's four cases through candidate drafters
 * with a step cost of 1 + 0.33 per extra row (what verification rows cost
 * on a 2-core AVX2 CPU, docs/SPECULATIVE.md; bench/spec_replay.py); the
 * replay gave the measured tokens per step of the previous drafter to
 * within 2 % on three cases and 12 % high on code editing, where the
 * engine's pausing (on measured step times) drafted less:
 *   - The longest suffix match, up to 8 tokens, most recent occurrence on
 *     ties. Longer contexts separate the repeats of a common phrase
 *     (replayed: quoting +3 %, code editing +7 % over a 3-token cap).
 *   - A 1-token match is not drafted: 64-94 % of such drafts had nothing
 *     accepted (mean 0.1-0.5 tokens) and their misses also shrank the
 *     draft length and paused the sequence for the good matches that
 *     followed. Dropping them helped quoting and code editing at every
 *     row cost tried (0.05 to 0.5) and cost the lore case 1 %. With both
 *     rules the replayed speedup of quoting rose from 1.51x to 1.98x and
 *     of code editing from 1.10x to 1.20x.
 *   - A 2-token match whose occurrences disagree on the next token drafts
 *     one token (79 % had nothing accepted when drafted in full); one
 *     with a single continuation drafts in full (mean 3.4 accepted).
 * The most recent occurrence is preferred: it is the likeliest to be
 * continued the same way.
 *
 * Draft length (2026-12-06, replayed at row costs 0.15-0.3 on 128- and
 * 256-token outputs): a match drafts at most as many tokens as it matched,
 * unless it continues the passage the sequence was already copying (its
 * continuation starts between RLAI_SPEC_NEAR_BEFORE tokens before and
 * RLAI_SPEC_NEAR_AFTER after where the last accepted lookup left off).
 * A short match far from the copy is weak evidence: in code editing the
 * model copies a few tokens of a line, then writes its own, and such
 * drafts were mostly rejected (replayed code editing +2-11 %, lore
 * +1-2 %, free chat -1 %). A short match right after a one-token
 * deviation from a passage being quoted is strong evidence: capping those
 * too cost quoting 1-6 %, which the exception removes (quoting +0-2 %). */
#include "spec.h"

#include <stdbool.h>
#include <string.h>

/* The longest match of the sequence's suffix (its last token suf_end[0],
 * n_suf tokens available) among the occurrences in src[lo..hi] that end at
 * i in [lo, hi], most recent (highest i) first; each occurrence's
 * continuation src[i + 1] exists. */
typedef struct lookup_match {
    int len, end;       /* match length (0 = none) and where it ends in src */
    bool ambiguous;     /* occurrences of that length disagree on the next token */
} lookup_match;

static lookup_match lookup_scan(const int32_t *src, int lo, int hi, const int32_t *suf_end, int n_suf)
{
    lookup_match m = { 0, -1, false };
    int max_len = n_suf < RLAI_SPEC_NGRAM_MAX ? n_suf : RLAI_SPEC_NGRAM_MAX;
    for (int i = hi; i >= lo; i--) {
        if (src[i] != *suf_end)
            continue;
        int L = 1;
        while (L < max_len && i - L >= 0 && src[i - L] == suf_end[-L])
            L++;
        if (L > m.len) {
            m.len = L;
            m.end = i;
            m.ambiguous = false;
        } else if (L == m.len && src[i + 1] != src[m.end + 1]) {
            m.ambiguous = true;
        }
    }
    return m;
}

static bool near_copy(int from, int near)
{
    return near >= 0 && from >= near - RLAI_SPEC_NEAR_BEFORE && from <= near + RLAI_SPEC_NEAR_AFTER;
}

int rlai_spec_lookup_draft(const int32_t *toks, int n, const int32_t *pred, int n_pred, int max_draft, int near,
                           int32_t *out, int *ngram_out, int *from_out)
{
    if (ngram_out)
        *ngram_out = 0;
    if (from_out)
        *from_out = -1;
    if (!toks || !out || n < 1 || max_draft <= 0)
        return 0;
    if (!pred || n_pred > RLAI_SPEC_MAX_PREDICTION)
        n_pred = 0;
    if (max_draft > RLAI_SPEC_MAX_DRAFT)
        max_draft = RLAI_SPEC_MAX_DRAFT;
    const int32_t *suf_end = toks + n - 1;  /* last token of the suffix */
    /* candidate ends i: the occurrence ends at i, its continuation starts
     * at i + 1 <= n - 1 (in the sequence) or <= n_pred - 1 (prediction) */
    int lo = n > RLAI_SPEC_SEARCH_WINDOW ? n - RLAI_SPEC_SEARCH_WINDOW : 0;
    lookup_match ms = lookup_scan(toks, lo, n - 2, suf_end, n);
    lookup_match mp = n_pred >= 2 ? lookup_scan(pred, 0, n_pred - 2, suf_end, n) : (lookup_match){ 0, -1, false };
    /* The longer match wins; of equal ones the occurrence that continues
     * the copy in progress, else the sequence's (the more recent text). */
    bool use_pred = mp.len > ms.len ||
                    (mp.len == ms.len && mp.len > 0 && near_copy(RLAI_SPEC_PRED_BASE + mp.end + 1, near) &&
                     !near_copy(ms.end + 1, near));
    const int32_t *src = use_pred ? pred : toks;
    int src_n = use_pred ? n_pred : n;
    lookup_match m = use_pred ? mp : ms;
    if (m.len < RLAI_SPEC_NGRAM_MIN)
        return 0;
    bool ambiguous = m.ambiguous;
    if (mp.len == ms.len && mp.len > 0 && pred[mp.end + 1] != toks[ms.end + 1])
        ambiguous = true;   /* the two sources disagree */
    int at = m.end + 1, k = src_n - at;
    int from = use_pred ? RLAI_SPEC_PRED_BASE + at : at;
    if (k > max_draft)
        k = max_draft;
    if (!near_copy(from, near) && k > m.len)
        k = m.len;
    if (m.len == RLAI_SPEC_NGRAM_MIN && ambiguous)
        k = 1;
    memcpy(out, src + at, sizeof(int32_t) * (size_t)k);
    if (ngram_out)
        *ngram_out = m.len;
    if (from_out)
        *from_out = from;
    return k;
}

int rlai_spec_ngram_draft(const int32_t *toks, int n, int max_draft, int near, int32_t *out, int *ngram_out,
                          int *from_out)
{
    return rlai_spec_lookup_draft(toks, n, NULL, 0, max_draft, near, out, ngram_out, from_out);
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

bool rlai_spec_gave_up(const rlai_spec_state *s)
{
    return s->max_draft > 0 && s->backoff >= SPEC_PAUSE_MAX;
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

int rlai_spec_near_after(int near, int from, int accepted)
{
    return accepted > 0 && from >= 0 ? from + accepted + 1 : near;
}
