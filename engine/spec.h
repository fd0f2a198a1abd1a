/* spec.h - prompt-lookup (n-gram) drafting for speculative decoding, and
 * the per-sequence adaptive draft length.
 *
 * The drafter looks for the longest suffix of a sequence's tokens (prompt
 * followed by generated), up to RLAI_SPEC_NGRAM_MAX tokens, that occurred
 * earlier in the same sequence, most recent occurrence first, and proposes
 * the tokens that followed it. No second model: names, lore text, quoted
 * passages and code repeat within a prompt and answer. A request may also
 * bring a prediction of its output (rlai_gen_params.prediction), searched
 * the same way (rlai_spec_lookup_draft). Weak matches are not drafted
 * (why: spec.c).
 *
 * rlai_spec_state decides how many tokens to draft (gamma) from the
 * sequence's recent acceptance: it grows while whole drafts are accepted,
 * shrinks on rejections, and after repeated drafts with nothing accepted
 * it pauses drafting for a number of steps that doubles on each failed
 * probe. It also weighs what a verification costs: rlai_spec_cost learns,
 * from the engine's own step times, how many plain decode steps a step
 * with extra draft rows costs on this machine, and a sequence whose recent
 * verifications gave fewer tokens than they cost pauses the same way (on a
 * GPU extra rows are nearly free and this never triggers; on a small CPU
 * they are not). The engine verifies drafts (scheduler.c) and reports the
 * counts.
 */
#ifndef RLAI_SPEC_H
#define RLAI_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#define RLAI_SPEC_NGRAM_MAX 8      /* longest suffix compared */
#define RLAI_SPEC_NGRAM_MIN 2      /* shorter matches draft nothing */
#define RLAI_SPEC_MAX_DRAFT 16     /* hard cap on one draft */
#define RLAI_SPEC_SEARCH_WINDOW 8192 /* tokens searched back from the end */
#define RLAI_SPEC_LOOKUP_MIN 4     /* with a draft model: prompt lookup from this match length */

#define RLAI_SPEC_MAX_PREDICTION (8192 + RLAI_SPEC_NGRAM_MAX) /* longest prediction searched (tokens) */
#define RLAI_SPEC_PRED_BASE (1 << 30)  /* positions in a prediction: base + index */

#define RLAI_SPEC_NEAR_BEFORE 8     /* a match continues the copy from this far before... */
#define RLAI_SPEC_NEAR_AFTER 32     /* ...to this far after where it left off */
/* Writes up to max_draft (<= RLAI_SPEC_MAX_DRAFT) tokens into out that
 * followed the most recent earlier occurrence of the longest suffix of
 * toks[0..n) (at most NGRAM_MAX tokens compared). Returns the count: 0
 * when the longest match is shorter than NGRAM_MIN tokens; at most 1 when
 * it is exactly NGRAM_MIN tokens and its occurrences are followed by
 * different tokens; at most the match's length unless its continuation
 * starts within [near - RLAI_SPEC_NEAR_BEFORE, near + RLAI_SPEC_NEAR_AFTER]
 * (near: the index in toks where the sequence's last accepted lookup
 * draft's source continues, see rlai_spec_near_after; -1 = none).
 * toks and out are caller-owned; *ngram_out (may be NULL) receives the
 * length of the matched suffix (0 when nothing is drafted), *from_out (may
 * be NULL) the index in toks of the first drafted token (-1 when nothing).
 * Searches the last RLAI_SPEC_SEARCH_WINDOW tokens, one pass. Pure
 * function. */
int rlai_spec_ngram_draft(const int32_t *toks, int n, int max_draft, int near, int32_t *out, int *ngram_out,
                          int *from_out);

/* Prompt lookup with a second source: pred[0..n_pred) (may be NULL), a
 * prediction of the output (OpenAI's "prediction"; the engine puts the
 * prompt's last tokens before the predicted text, so the first generated
 * token already matches its start). Occurrences in toks (last
 * RLAI_SPEC_SEARCH_WINDOW tokens) and in pred (at most
 * RLAI_SPEC_MAX_PREDICTION tokens, else pred is ignored) are matched
 * against toks's suffix alike; the longer match wins, of equal ones the one
 * that continues the copy in progress (near), else toks's. A draft from
 * pred runs at most to pred's end. Positions in pred are reported (and
 * compared with near) as RLAI_SPEC_PRED_BASE + index, so one near value
 * follows a copy in either source. Otherwise as rlai_spec_ngram_draft
 * (which is this with no pred). Pure function. */
int rlai_spec_lookup_draft(const int32_t *toks, int n, const int32_t *pred, int n_pred, int max_draft, int near,
                           int32_t *out, int *ngram_out, int *from_out);

/* Where the copy goes on after a lookup draft taken from toks[from..]
 * had `accepted` tokens accepted: the source index past the accepted
 * tokens and the token the model emitted instead of (or after) them.
 * Returns `near` unchanged when nothing was accepted. */
int rlai_spec_near_after(int near, int from, int accepted);

/* Per-sequence adaptive state (plain value, zero-initialise then
 * rlai_spec_state_init). */
typedef struct rlai_spec_state {
    int max_draft;      /* upper bound for gamma (0 = drafting off) */
    int gamma;          /* draft length for the next verification */
    int misses;         /* consecutive verifications with nothing accepted */
    int pause;          /* steps left without drafting */
    int backoff;        /* next pause length */
    float gain;         /* recent tokens per verification over its cost (EWMA) */
    uint64_t drafted, accepted, verifications, gamma_sum;
} rlai_spec_state;

/* max_draft is clamped to [0, RLAI_SPEC_MAX_DRAFT]. */
void rlai_spec_state_init(rlai_spec_state *s, int max_draft);

/* Draft length to try this step (0 = do not draft now). Advances the pause
 * counter, so call it once per decode step. */
int rlai_spec_next_gamma(rlai_spec_state *s);

/* Records one verification: `drafted` tokens proposed, `accepted` of them
 * matched the target, and what the step cost in plain decode steps
 * (rlai_spec_cost_of; <= 0 = unknown, then only acceptance counts). Adapts
 * gamma; pauses when recent verifications emitted fewer tokens than they
 * cost (1 + accepted tokens per step against `step_cost`). */
void rlai_spec_feedback(rlai_spec_state *s, int drafted, int accepted, double step_cost);

/* True once the pauses have grown to their longest: drafting kept failing
 * or kept costing more than it gave. A draft model's sequence then stops
 * (its catch-up after every pause is a cost of its own). */
bool rlai_spec_gave_up(const rlai_spec_state *s);

/* What a decode step with extra rows costs, learned from step times of one
 * decoding sequence (plain value, zero-initialise). Until it has samples
 * it assumes RLAI_SPEC_COST_PRIOR per extra row. */
#define RLAI_SPEC_COST_PRIOR 0.25
typedef struct rlai_spec_cost {
    double t1_ms;       /* a plain one-row decode step (EWMA) */
    double per_row;     /* extra cost of one more row, in plain steps (EWMA) */
    int n_t1, n_rows;   /* samples seen */
} rlai_spec_cost;

/* One step of a single decoding sequence: `rows` rows (1 = no draft) took
 * `ms`. */
void rlai_spec_cost_observe(rlai_spec_cost *c, int rows, double ms);

/* Cost of a step of `rows` rows in plain decode steps (>= 1). */
double rlai_spec_cost_of(const rlai_spec_cost *c, int rows);

#endif
