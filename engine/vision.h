/* vision.h - the vision encoder of a vision-language model: a SigLIP/CLIP
 * ViT and an Idefics3 projector loaded from a llama.cpp-style `mmproj` GGUF
 * (what llama.cpp's convert_hf_to_gguf.py --mmproj writes for SmolVLM /
 * Idefics3). It turns one RGB image into rows of the language model's input
 * embedding width, which the forward pass uses in place of the token
 * embeddings of the prompt's image placeholder tokens.
 *
 * The file (GGUF key and tensor names as llama.cpp's clip loader reads them;
 * ggml shapes, ne[0] first):
 *   clip.projector_type or clip.vision.projector_type = "idefics3"
 *   clip.vision.image_size S, patch_size P (S % P == 0, G = S / P),
 *   embedding_length E, feed_forward_length F, block_count L,
 *   attention.head_count H (E % H == 0), attention.layer_norm_epsilon,
 *   projector.scale_factor s (G % s == 0), image_mean / image_std (3 f32
 *   each; absent: 0.5 / 0.5, SigLIP's values)
 *   v.patch_embd.weight [P, P, 3, E] (+ optional v.patch_embd.bias [E])
 *   v.position_embd.weight [E, G*G]
 *   v.blk.N.{attn_q,attn_k,attn_v,attn_out}.weight [E, E] (+ .bias [E])
 *   v.blk.N.{ln1,ln2}.{weight,bias} [E]
 *   v.blk.N.ffn_up.weight [E, F] (+ .bias [F]), ffn_down.weight [F, E] (+ .bias [E])
 *   v.post_ln.{weight,bias} [E] (optional)
 *   mm.model.fc.weight [E*s*s, n_out] (no bias)
 * Matrices may be f32, f16, bf16, q4_0, q4_1, q5_0, q5_1 or q8_0; norms,
 * biases and the position embedding are copied to f32 at load.
 *
 * The computation (float32, matrices through rlai_matmul on the given pool):
 *   1. preprocess: bilinear resize to S x S (half-pixel centres, edge
 *      clamp, no antialias), value/255, (v - mean[c]) / std[c]; planar CHW.
 *   2. patches: patch n = py*G + px is the vector of its 3*P*P values in
 *      (channel, row, column) order; x_n = W_pe x_n + b_pe + pos_n.
 *   3. L pre-norm layers: LayerNorm (with bias), non-causal multi-head
 *      attention over all G*G patches (scale 1/sqrt(E/H), biases), residual;
 *      LayerNorm, up, GELU (tanh approximation, as SigLIP's
 *      gelu_pytorch_tanh), down, residual.
 *   4. post LayerNorm (when present).
 *   5. pixel shuffle by s: output token t = i*(G/s) + j gathers the s*s
 *      patches (i*s + b, j*s + a), feature (b*s + a)*E + e (Idefics3).
 *   6. projection: out_t = W_fc y_t, n_out wide.
 * The result is n_tokens = (G/s)^2 rows of n_out floats.
 *
 * Threading: an rlai_vision is immutable after load and may be shared; an
 * encode call uses the kernel context and pool it is given, which must not
 * be used by another thread during the call.
 */
#ifndef RLAI_VISION_H
#define RLAI_VISION_H

#include <stddef.h>
#include <stdint.h>
#include "rlai/gguf.h"
#include "kernels.h"
#include "threadpool.h"

typedef struct rlai_vision_hparams {
    int image_size, patch_size, grid;        /* grid = image_size / patch_size */
    int n_embd, n_ff, n_layer, n_head, head_dim;
    int scale_factor;
    int n_patches;                           /* grid * grid */
    int n_tokens;                            /* (grid / scale_factor)^2: rows of the output */
    int n_out;                               /* projection width (the LM's n_embd) */
    float eps;
    float mean[3], std[3];
    bool has_post_ln;
} rlai_vision_hparams;

typedef struct rlai_vision rlai_vision;

/* Reads the hyperparameters and binds every tensor of an mmproj GGUF,
 * checking names, types and shapes. The gguf must outlive the encoder
 * (matrices point into it). On error returns RLAI_ERR_FORMAT (missing or
 * malformed key or tensor, inconsistent sizes), RLAI_ERR_UNSUPPORTED
 * (another projector type, a tensor type the engine cannot compute) or
 * RLAI_ERR_NOMEM, with a message naming the key or tensor in err.
 * *out owned by the caller, freed with rlai_vision_free. */
int rlai_vision_load(const rlai_gguf *g, rlai_vision **out, char *err, size_t errlen);
/* Frees the encoder (accepts NULL); not the gguf. */
void rlai_vision_free(rlai_vision *v);
/* The encoder's hyperparameters; owned by v. */
const rlai_vision_hparams *rlai_vision_get_hparams(const rlai_vision *v);

/* Floats rlai_vision_preprocess writes: 3 * image_size^2. */
size_t rlai_vision_pixels_len(const rlai_vision *v);
/* Floats rlai_vision_encode writes: n_tokens * n_out. */
size_t rlai_vision_output_len(const rlai_vision *v);

/* Step 1: an 8-bit image of width x height pixels of `channels` bytes each
 * (3 = RGB, 4 = RGBA, alpha ignored), rows `stride` bytes apart (caller-
 * owned, read only) -> out (caller-owned, rlai_vision_pixels_len floats).
 * Returns 0 or RLAI_ERR_INVALID_ARG (NULL, size 0 or above 16384 per side,
 * stride too small, channels not 3 or 4). */
int rlai_vision_preprocess(const rlai_vision *v, const uint8_t *img, int width, int height,
                           size_t stride, int channels, float *out);

/* Steps 2-6 on preprocessed pixels (rlai_vision_pixels_len floats, caller-
 * owned) -> out (caller-owned, rlai_vision_output_len floats). Uses k and
 * tp (not owned; tp may be NULL for one thread) and allocates its scratch
 * per call. Returns 0, RLAI_ERR_INVALID_ARG, RLAI_ERR_NOMEM, or
 * RLAI_ERR_FORMAT when an output is not finite (inf/NaN weights, or the
 * kernels could not allocate their scratch and poisoned the result). */
int rlai_vision_encode(const rlai_vision *v, rlai_kernels *k, rlai_threadpool *tp,
                       const float *pixels, float *out);

/* Opens an mmproj GGUF file and loads the encoder from it; the encoder
 * then owns the mapping (rlai_vision_free closes it). Errors as
 * rlai_gguf_open_file and rlai_vision_load, the message in err. */
int rlai_vision_open_file(const char *path, rlai_vision **out, char *err, size_t errlen);

/* Preprocess + encode in one call (arguments as the two functions); the
 * pixel buffer is allocated and freed inside. out: rlai_vision_output_len
 * floats, caller-owned. */
int rlai_vision_embed_image(const rlai_vision *v, rlai_kernels *k, rlai_threadpool *tp,
                            const uint8_t *img, int width, int height, size_t stride, int channels,
                            float *out);

/* 64-bit content hash (FNV-1a over the bytes) of n floats: the image key
 * the prefix cache mixes into the blocks holding image rows. */
uint64_t rlai_vision_hash_rows(const float *rows, size_t n);

/* Bytes of the matrices in the file and parameter count (for logs). */
uint64_t rlai_vision_weight_bytes(const rlai_vision *v);

#endif
