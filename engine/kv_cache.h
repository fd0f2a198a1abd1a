/* kv_cache.h - paged KV cache: a pool of fixed 16-token blocks shared by
 * all sequences, one block table per sequence, reference-counted blocks.
 *
 * Storage is one K and one V array per layer, each n_blocks * 16 * kv_dim
 * elements of the cache's element type (f16 by default, f32 for the
 * reference-precise mode); block b, slot s of layer l lives at element
 * (b * 16 + s) * kv_dim of that layer's array. Allocation and free are O(1) (free-list
 * stack). Reference counts exist so that later prefix sharing can map one
 * physical block into several block tables. Not thread-safe: the engine's
 * scheduler thread owns it. Memory is reserved up front but only pages that
 * are written become resident.
 */
#ifndef RLAI_KV_CACHE_H
#define RLAI_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define RLAI_KV_BLOCK 16

typedef struct rlai_kv_cache rlai_kv_cache;

/* A sequence's block table. Zero-initialise before first use; owned by the
 * caller, its blocks are references into the cache until released. */
typedef struct rlai_kv_seq {
    int32_t *blocks;   /* physical block ids, logical order */
    int n_blocks;      /* entries used */
    int cap;           /* entries allocated */
    int n_tokens;      /* tokens whose K/V are stored */
} rlai_kv_seq;

/* Creates a pool of n_blocks blocks for n_layer layers of kv_dim values
 * per token for K and for V; dtype is RLAI_DT_F16 or RLAI_DT_F32 (else
 * RLAI_ERR_UNSUPPORTED). *out owned by caller. */
int rlai_kv_cache_create(int n_layer, int kv_dim, int n_blocks, uint32_t dtype,
                         rlai_kv_cache **out);
uint32_t rlai_kv_cache_dtype(const rlai_kv_cache *kv);
/* Frees the pool. Sequences must have been released. Accepts NULL. */
void rlai_kv_cache_destroy(rlai_kv_cache *kv);

int rlai_kv_cache_n_blocks(const rlai_kv_cache *kv);
int rlai_kv_cache_n_free(const rlai_kv_cache *kv);
size_t rlai_kv_cache_bytes(const rlai_kv_cache *kv);     /* total reserved */

/* Takes a free block (refcount 1); returns its id or RLAI_ERR_KV_FULL. */
int rlai_kv_block_alloc(rlai_kv_cache *kv);
/* Adds a reference to an allocated block. */
void rlai_kv_block_ref(rlai_kv_cache *kv, int32_t block);
/* Drops a reference; the block returns to the free list at zero. */
void rlai_kv_block_unref(rlai_kv_cache *kv, int32_t block);
int rlai_kv_block_refcount(const rlai_kv_cache *kv, int32_t block);

/* Makes the sequence's table hold enough blocks for n_tokens tokens,
 * allocating what is missing. On RLAI_ERR_KV_FULL / RLAI_ERR_NOMEM nothing
 * already in the table is touched (blocks taken by this call are returned). */
int rlai_kv_seq_reserve(rlai_kv_cache *kv, rlai_kv_seq *seq, int n_tokens);
/* Drops every block reference and frees the table's array; seq is zeroed. */
void rlai_kv_seq_release(rlai_kv_cache *kv, rlai_kv_seq *seq);

/* Pointers to the K / V rows (kv_dim values of the cache dtype) of token
 * position `pos` of a sequence (pos < reserved capacity). */
void *rlai_kv_k_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos);
void *rlai_kv_v_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos);

#endif
