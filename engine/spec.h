/* spec.h - prompt-lookup (n-gram) drafting for speculative decoding, and
 * the per-sequence adaptive draft length.
 *
 * The drafter looks for the longest suffix of a sequence's tokens (prompt
 * followed by generated) of RLAI_SPEC_NGRAM_MAX down to RLAI_SPEC_NGRAM_MIN
 * tokens that occurred earlier in the same sequence, most recent occurrence
 * first, and proposes the tokens that followed it. No second model: names,
 * lore text, quoted passages and code repeat within a prompt and answer.
 *
 * rlai_spec_state decides how many tokens to draft (gamma) from the
 * sequence's recent acceptance: it grows while whole drafts are accepted,
 * shrinks on rejections, and after repeated drafts with nothing accepted
 * it pauses drafting for a number of steps that doubles on each failed
 * probe. The engine verifies drafts (engine.c) and reports the counts.
 */
#ifndef RLAI_SPEC_H
#define RLAI_SPEC_H

#include <stdint.h>

#define RLAI_SPEC_NGRAM_MAX 3
#define RLAI_SPEC_NGRAM_MIN 1
#define RLAI_SPEC_MAX_DRAFT 16     /* hard cap on one draft */
#define RLAI_SPEC_SEARCH_WINDOW 8192 /* tokens searched back from the end */

/* Writes up to max_draft (<= RLAI_SPEC_MAX_DRAFT) tokens into out that
 * followed the most recent earlier occurrence of the longest suffix of
 * toks[0..n) of NGRAM_MAX..NGRAM_MIN tokens. Returns the count (0 = no
 * match). toks and out are caller-owned; *ngram_out (may be NULL)
 * receives the length of the matched suffix. Pure function. */
int rlai_spec_ngram_draft(const int32_t *toks, int n, int max_draft, int32_t *out, int *ngram_out);

/* Per-sequence adaptive state (plain value, zero-initialise then
 * rlai_spec_state_init). */
typedef struct rlai_spec_state {
    int max_draft;      /* upper bound for gamma (0 = drafting off) */
    int gamma;          /* draft length for the next verification */
    int misses;         /* consecutive verifications with nothing accepted */
    int pause;          /* steps left without drafting */
    int backoff;        /* next pause length */
    uint64_t drafted, accepted, verifications, gamma_sum;
} rlai_spec_state;

/* max_draft is clamped to [0, RLAI_SPEC_MAX_DRAFT]. */
void rlai_spec_state_init(rlai_spec_state *s, int max_draft);

/* Draft length to try this step (0 = do not draft now). Advances the pause
 * counter, so call it once per decode step. */
int rlai_spec_next_gamma(rlai_spec_state *s);

/* Records one verification: `drafted` tokens proposed, `accepted` of them
 * matched the target. Adapts gamma. */
void rlai_spec_feedback(rlai_spec_state *s, int drafted, int accepted);

#endif
