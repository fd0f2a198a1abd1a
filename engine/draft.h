/* draft.h - a draft model for speculative decoding: a second, smaller GGUF
 * with the target's tokenizer (checked token for token at load), run
 * greedily on the target's backend to propose the next tokens, which the
 * target then verifies in one batched forward (scheduler.c).
 *
 * The proposal is deterministic (the draft's argmax), so the verification
 * rule of prompt-lookup drafts applies unchanged: the output equals
 * non-speculative decoding token for token, greedy or sampled with a seed
 * (the coupled rejection rule, sampler.h).
 *
 * Each request has its own draft sequence (rlai_draft_seq): the draft's
 * K/V of the tokens it has been fed, in the draft's own paged cache with its
 * own prefix cache (a lore prompt shared by many requests is prefilled on
 * the draft once). Before proposing, the sequence is cut back to the prefix
 * that still agrees with the request's tokens (rejected drafts are dropped
 * by truncating the block table, no copy) and fed the rest.
 *
 * Not thread-safe: one thread (the engine's stepping thread) uses it.
 */
#ifndef RLAI_DRAFT_H
#define RLAI_DRAFT_H

#include <stdint.h>
#include <stddef.h>
#include "backend.h"
#include "kv_cache.h"
#include "model.h"
#include "tokenizer.h"

typedef struct rlai_draft rlai_draft;

/* One request's state in the draft model. Zero-initialise; release with
 * rlai_draft_seq_release. */
typedef struct rlai_draft_seq {
    rlai_kv_seq seq;    /* draft K/V of fed[0..seq.n_tokens) */
    int32_t *fed;       /* the tokens those K/V belong to (cap entries) */
    int cap;
} rlai_draft_seq;

/* Opens the draft GGUF at `path` for a target whose tokenizer is `target`
 * (the draft's must have the same tokens, byte for byte, and the same
 * BOS/EOS; else RLAI_ERR_INVALID_ARG naming the first difference). The
 * draft runs on `be` (used, not owned: it and `target` must outlive the
 * draft) with forwards of up to max_batch tokens, sequences of up to n_ctx
 * tokens and a K/V pool of kv_blocks blocks of kv_dtype (RLAI_DT_*).
 * *out owned by the caller (rlai_draft_free). On error writes a message
 * into err. */
int rlai_draft_open(const char *path, const rlai_tokenizer *target, rlai_backend *be, int max_batch,
                    int n_ctx, int kv_blocks, uint32_t kv_dtype, rlai_draft **out, char *err,
                    size_t errlen);
/* Frees the draft (its sequences must have been released). Accepts NULL. */
void rlai_draft_free(rlai_draft *d);

const rlai_hparams *rlai_draft_hparams(const rlai_draft *d);
const char *rlai_draft_path(const rlai_draft *d);          /* owned by d */
uint64_t rlai_draft_weight_bytes(const rlai_draft *d);

/* Proposes up to `gamma` (1..RLAI_SPEC_MAX_DRAFT) tokens that follow
 * toks[0..n) (n >= 1; the last token is the one the target feeds next),
 * writing them to out. Feeds the draft what it has not seen of toks, then
 * gamma - 1 single-token steps; stops early after an end-of-generation
 * token. Returns the number proposed (>= 1), or a negative code
 * (RLAI_ERR_KV_FULL when the draft's pool is exhausted, RLAI_ERR_CONTEXT_FULL
 * past n_ctx, RLAI_ERR_NOMEM); after an error s stays valid. */
int rlai_draft_propose(rlai_draft *d, rlai_draft_seq *s, const int32_t *toks, int n, int gamma,
                       int32_t *out);

/* Feeds the draft what it has not seen of toks[0..n) (n >= 1), without
 * proposing: the engine calls it when a request's prompt is prefilled, so
 * the draft's prompt prefill counts there and not in decode. Returns 0 or
 * a negative code as rlai_draft_propose. */
int rlai_draft_sync(rlai_draft *d, rlai_draft_seq *s, const int32_t *toks, int n);

/* Drops s's K/V references (its full, accepted blocks stay in the draft's
 * prefix cache) and frees its arrays; s is zeroed. Accepts a zeroed s. */
void rlai_draft_seq_release(rlai_draft *d, rlai_draft_seq *s);

/* The draft cache's block counts and prefix-cache reuse. */
void rlai_draft_kv_stats(const rlai_draft *d, rlai_kv_stats *out);

/* The draft cache's invariant check (rlai_kv_cache_check) over the given
 * sequences, for tests. */
int rlai_draft_check(const rlai_draft *d, rlai_draft_seq *const *seqs, int n_seqs, char *err,
                     size_t errlen);

#endif
