/* sampler.h - token sampling: penalties, temperature, top-k, top-p, min-p,
 * seeded RNG, greedy. Deterministic for a given seed. */
#ifndef RLAI_SAMPLER_H
#define RLAI_SAMPLER_H

#include <stdint.h>
#include "rlai/engine.h"

typedef struct rlai_sampler rlai_sampler;

/* params is copied. *out owned by caller. */
int rlai_sampler_new(const rlai_sampler_params *params, int n_vocab, rlai_sampler **out);
void rlai_sampler_free(rlai_sampler *s);
/* Resets history and re-seeds the RNG. */
void rlai_sampler_reset(rlai_sampler *s);
/* Records a token as part of the history (prompt or generated) for penalties. */
void rlai_sampler_accept(rlai_sampler *s, int32_t tok);
/* Picks a token from logits[n_vocab]. The logits array may be modified.
 * Takes one uniform from the RNG, or none (greedy, or one candidate left):
 * speculative verification relies on it (below). */
int32_t rlai_sampler_sample(rlai_sampler *s, float *logits);
/* Speculative verification samples every row with rlai_sampler_sample:
 * a deterministic draft token (q = 1 on it) is accepted iff the token
 * sampled at its position equals it. That is the standard rejection rule
 * for such a draft, coupled: P(accept) = p(draft), and a rejected row's
 * token is distributed as p without the draft, renormalised. Each emitted
 * token takes exactly the one uniform draw plain decoding takes at that
 * position (rejected rows are not sampled), so with a seed and the
 * batch-invariant logits the output is token for token the output
 * without drafts, at any temperature. */

/* Log-probabilities of `tok` and of the n_top most probable ids under the
 * log-softmax of raw[n_vocab] (unmodified model logits; see
 * rlai_token_logprobs in engine.h). n_top is clamped to
 * [0, RLAI_MAX_TOP_LOGPROBS] and to n_vocab. NaN counts as -inf; if every
 * logit is -inf all logprobs are -inf. Does not allocate. */
void rlai_logprobs_compute(const float *raw, int n_vocab, int32_t tok, int n_top, rlai_token_logprobs *out);

#endif
