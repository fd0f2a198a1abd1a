/* kv_cache.h - paged KV cache: a pool of fixed 16-token blocks shared by
 * all sequences, one block table per sequence, reference-counted blocks.
 *
 * Storage is one K and one V array per layer, each n_blocks * 16 * kv_dim
 * values of the cache's element type (f16 by default, q8_0 as an option,
 * f32 for the reference-precise mode); block b, slot s of layer l is the
 * token row at byte (b * 16 + s) * row_bytes of that layer's array, where
 * row_bytes is kv_dim * 2 (f16), kv_dim * 4 (f32) or kv_dim / 32 * 34
 * (q8_0: 32-value blocks of an f16 scale and 32 int8). Allocation and free are O(1) (free-list
 * stack). Reference counts exist so that later prefix sharing can map one
 * physical block into several block tables. Not thread-safe: the engine's
 * scheduler thread owns it. Memory is reserved up front but only pages that
 * are written become resident.
 */
#ifndef RLAI_KV_CACHE_H
#define RLAI_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define RLAI_KV_BLOCK 16

typedef struct rlai_kv_cache rlai_kv_cache;

/* A sequence's block table. Zero-initialise before first use; owned by the
 * caller, its blocks are references into the cache until released. */
typedef struct rlai_kv_seq {
    int32_t *blocks;   /* physical block ids, logical order */
    int n_blocks;      /* entries used */
    int cap;           /* entries allocated */
    int n_tokens;      /* tokens whose K/V are stored */
    int n_committed;   /* leading full blocks registered in the prefix cache */
    uint64_t last_key; /* prefix-cache key of block n_committed-1 (0 if none) */
} rlai_kv_seq;

/* Creates a pool of n_blocks blocks for n_layer layers of kv_dim values
 * per token for K and for V; dtype is RLAI_DT_F16, RLAI_DT_F32 or
 * RLAI_DT_Q8_0 (kv_dim a multiple of 32), else RLAI_ERR_UNSUPPORTED.
 * *out owned by caller. */
int rlai_kv_cache_new(int n_layer, int kv_dim, int n_blocks, uint32_t dtype,
                         rlai_kv_cache **out);
/* As rlai_kv_cache_new, with the K/V page arrays in the backend's memory
 * (be used, not owned; it must outlive the cache; NULL = host memory).
 * Copy-on-write then copies pages with the backend's copy op. */
struct rlai_backend;
int rlai_kv_cache_new_on(struct rlai_backend *be, int n_layer, int kv_dim, int n_blocks,
                            uint32_t dtype, rlai_kv_cache **out);
uint32_t rlai_kv_cache_dtype(const rlai_kv_cache *kv);
/* Frees the pool. Sequences must have been released. Accepts NULL. */
void rlai_kv_cache_free(rlai_kv_cache *kv);

int rlai_kv_cache_n_blocks(const rlai_kv_cache *kv);
/* Blocks an allocation can still obtain: those on the free list plus the
 * cached (registered, refcount 0) unpinned blocks that rlai_kv_block_alloc
 * evicts on demand. */
int rlai_kv_cache_n_free(const rlai_kv_cache *kv);
size_t rlai_kv_cache_bytes(const rlai_kv_cache *kv);     /* total reserved */

/* Takes a free block (refcount 1), evicting the least recently used cached
 * unpinned block when the free list is empty; returns its id or
 * RLAI_ERR_KV_FULL. */
int rlai_kv_block_alloc(rlai_kv_cache *kv);
/* Adds a reference to an allocated block. */
void rlai_kv_block_ref(rlai_kv_cache *kv, int32_t block);
/* Drops a reference; at zero the block returns to the free list, or, if
 * registered in the prefix cache, becomes cached (see below). */
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
/* The page arrays of one layer (backend memory) and the bytes of one token
 * row: block b, slot s is at byte (b * 16 + s) * row_bytes. */
void rlai_kv_cache_layer_view(rlai_kv_cache *kv, int layer, void **k, void **v, size_t *row_bytes);
/* Host pointers (host-memory caches only): */
void *rlai_kv_k_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos);
void *rlai_kv_v_at(rlai_kv_cache *kv, const rlai_kv_seq *seq, int layer, int pos);

/* ------------------------------------------------------------------
 * Prefix cache.
 *
 * A full block can be registered under a key that chains its parent
 * block's key with its 16 token ids (key = H(parent_key, tokens)); the
 * block then becomes immutable and shareable. Lookups verify the stored
 * tokens and parent key, so a hash collision never yields another
 * prompt's KV. A registered block whose reference count drops to zero is
 * not freed: it stays "cached" on an LRU list, reusable by a later match,
 * and is evicted (least recently used first, never when pinned) only when
 * rlai_kv_block_alloc finds the free list empty. Partial last blocks are
 * never registered (private to their sequence); rlai_kv_seq_prepare_write
 * copies any shared or registered block before it is written (copy-on-
 * write), e.g. after a fork.
 */

typedef struct rlai_kv_stats {
    int blocks_total;
    int blocks_free;      /* on the free list (never registered or evicted) */
    int blocks_used;      /* refcount > 0 */
    int blocks_cached;    /* registered with refcount 0 (reusable, evictable unless pinned) */
    int blocks_pinned;    /* registered blocks with a pin count > 0 */
    uint64_t lookups;     /* rlai_kv_prefix_attach calls */
    uint64_t tokens_reused;  /* tokens attached from the cache, in total */
    uint64_t evictions;
} rlai_kv_stats;

/* Turns prefix caching on (default) or off; off makes attach match nothing
 * and commit register nothing (existing cached blocks stay until evicted). */
void rlai_kv_cache_set_prefix_caching(rlai_kv_cache *kv, bool on);
/* Whether prefix caching is on. */
bool rlai_kv_cache_prefix_caching(const rlai_kv_cache *kv);

/* For an EMPTY sequence: attaches (with references) the longest run of
 * cached full blocks matching tokens[0..n), limited to max_tokens tokens
 * (rounded down to whole blocks). Sets seq->n_tokens, n_committed and
 * last_key accordingly and refreshes the blocks' LRU position. Returns the
 * number of tokens attached (a multiple of 16) or RLAI_ERR_NOMEM. */
int rlai_kv_prefix_attach(rlai_kv_cache *kv, rlai_kv_seq *seq, const int32_t *tokens, int n, int max_tokens);

/* Registers every full block of seq from block n_committed up to
 * n_tokens / 16 (tokens = the sequence's tokens from position 0, at least
 * n_tokens of them). If an equal block (same key and tokens) is already
 * registered, seq switches to that block and drops its own copy, so equal
 * prefixes share one physical block. */
void rlai_kv_prefix_commit(rlai_kv_cache *kv, rlai_kv_seq *seq, const int32_t *tokens, int n_tokens);

/* Makes the blocks covering positions [pos0, pos1) private and unregistered
 * (allocating them if missing, copying K/V of every layer from a shared or
 * registered block first). Returns 0, RLAI_ERR_KV_FULL or RLAI_ERR_NOMEM. */
int rlai_kv_seq_prepare_write(rlai_kv_cache *kv, rlai_kv_seq *seq, int pos0, int pos1);

/* Rolls the sequence back to its first n_tokens tokens without copying
 * (speculative decoding drops the K/V of rejected draft tokens): blocks
 * wholly past n_tokens are unreferenced (freed, or left cached if someone
 * registered them), n_tokens and the committed chain are cut to what
 * remains (a registered block that is now only partly in use stays
 * registered for its other users and is copied on the next write, see
 * prepare_write). Rejected tokens thus never reach the prefix cache as
 * long as rlai_kv_prefix_commit is given only accepted tokens. n_tokens may
 * also exceed seq->n_tokens when the K/V of those positions were written
 * (the accepted part of a draft). Returns the
 * number of blocks dropped, or RLAI_ERR_INVALID_ARG (n_tokens < 0 or more
 * than the table holds). */
int rlai_kv_seq_truncate(rlai_kv_cache *kv, rlai_kv_seq *seq, int n_tokens);

/* dst (empty) shares every block of src (references added); n_tokens,
 * n_committed, last_key copied. Returns 0 or RLAI_ERR_NOMEM. */
int rlai_kv_seq_fork(rlai_kv_cache *kv, const rlai_kv_seq *src, rlai_kv_seq *dst);

/* Pins the registered blocks of the longest cached prefix of tokens[0..n)
 * so they are never evicted (pin counts nest). Returns the number of
 * tokens now pinned (multiple of 16). unpin undoes one pin of the same
 * prefix and returns the tokens unpinned. */
int rlai_kv_prefix_pin(rlai_kv_cache *kv, const int32_t *tokens, int n);
int rlai_kv_prefix_unpin(rlai_kv_cache *kv, const int32_t *tokens, int n);

void rlai_kv_cache_stats(const rlai_kv_cache *kv, rlai_kv_stats *out);

/* Invariant check for tests: each block's refcount equals the number of
 * references in the given tables; free, used and cached sets partition the
 * pool; no pinned block is free; the hash index and LRU list agree with the
 * block states. Returns 0 or RLAI_ERR_FORMAT with a description in err. */
int rlai_kv_cache_check(const rlai_kv_cache *kv, rlai_kv_seq *const *seqs, int n_seqs,
                        char *err, size_t errlen);

#endif
