/* model.h - llama-family transformer: hyperparameters and weights from a
 * GGUF file, and the batched forward pass over the paged KV cache.
 *
 * Supported architectures: llama (SmolLM2, Llama 2/3, Mistral: RoPE on
 * adjacent pairs), qwen2 (Q/K/V biases, NEOX RoPE on half-split pairs).
 * Weights stay in the mapping; norms and biases are copied to f32.
 */
#ifndef RLAI_MODEL_H
#define RLAI_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "rlai/gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "threadpool.h"
#include "backend.h"


typedef struct rlai_hparams {
    char arch[32];
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx_train;
    int n_rot;
    float rope_base, rope_freq_scale, norm_eps;
    rlai_rope_mode rope_mode;
    bool tied_output;
    bool has_qkv_bias;
} rlai_hparams;

typedef struct rlai_model rlai_model;

/* Reads hyperparameters and binds every tensor, checking names, types and
 * shapes. The gguf must outlive the model (weights point into it).
 * On error writes a message naming the tensor or key. *out owned by caller. */
int rlai_model_load(const rlai_gguf *g, rlai_model **out, char *err, size_t errlen);
void rlai_model_free(rlai_model *m);
const rlai_hparams *rlai_model_hparams(const rlai_model *m);
uint64_t rlai_model_n_params(const rlai_model *m);
uint64_t rlai_model_weight_bytes(const rlai_model *m);

/* Per-engine forward state on one backend: the weights as the backend sees
 * them (uploaded once when the backend has weight_upload, else the host
 * mapping), and activation scratch in backend memory for up to max_batch
 * tokens and max_ctx positions. Uses (does not own) the backend, which must
 * outlive it; the model must too. *out owned by the caller, freed with
 * rlai_model_ctx_free (accepts NULL). */
typedef struct rlai_model_ctx rlai_model_ctx;
int rlai_model_ctx_new(const rlai_model *m, rlai_backend *be, int max_batch, int max_ctx,
                          rlai_model_ctx **out);
void rlai_model_ctx_free(rlai_model_ctx *c);
rlai_backend *rlai_model_ctx_backend(const rlai_model_ctx *c);

/* A batch of tokens from one or more sequences. Token i sits at position
 * pos[i] of sequence seqs[seq[i]]; its K/V are written there (the block
 * table must already cover pos[i]). Attention of token i sees positions
 * 0..pos[i] of its own sequence (earlier tokens of the batch included).
 * logits: for each i with want[i] (want NULL = only the last token), the
 * next row of n_vocab floats is written, in batch order. */
typedef struct rlai_batch {
    int n;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *seq;      /* NULL = all in seqs[0] */
    const bool *want;        /* NULL = last token only */
    bool hidden;             /* output the final-norm hidden state (n_embd floats per
                                wanted row) instead of logits */
    const float *const *embd; /* NULL, or per token NULL or n_embd floats (host memory):
                                the input row used instead of the token's embedding
                                (a VLM's image rows, engine/vision.h); the token id is
                                still range-checked but not looked up */
} rlai_batch;

/* Runs the forward pass (splitting into chunks of max_batch) as a walk over
 * the layers calling the backend's ops; the KV cache's pages must be in the
 * same backend's memory. logits is host memory. Returns 0 or
 * RLAI_ERR_INVALID_ARG for out-of-range tokens/positions. */
int rlai_model_forward(rlai_model_ctx *c, rlai_kv_cache *kv, rlai_kv_seq *const *seqs,
                       const rlai_batch *b, float *logits);

#endif
